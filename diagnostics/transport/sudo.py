"""``become: sudo`` — non-interactive ``sudo -n``; a password prompt is an error, never a hang."""

from typing import List, Sequence

from .base import Classification, Wrapper, find_line


class Sudo(Wrapper):
    kind = "sudo"

    def __init__(self, user: str = "root"):
        self.user = user

    def wrap(self, argv: Sequence[str]) -> List[str]:
        prefix = ["sudo", "-n"] + ([] if self.user == "root" else ["-u", self.user])
        return prefix + ["--"] + list(argv)

    def describe(self) -> str:
        return "sudo" if self.user == "root" else f"sudo -u {self.user}"

    def classify(self, exit_code, stderr) -> Classification:
        line = find_line(stderr, "a password is required", "a terminal is required",
                         "is not in the sudoers file", "is not allowed to execute",
                         "may not run sudo", "sudo: command not found", "sudo: not found")
        if line:
            return "become", line
        return None
