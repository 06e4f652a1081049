"""The hosts file: hosts.yaml read with line numbers, checked, and resolved into targets."""
