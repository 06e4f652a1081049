"""The ground every layer stands on: errors and exit codes, the result document and its one
status and action order, the wire format (the one place a target's answer is let in),
redaction, node sets, the files mldiag writes for itself and signals. Imports nothing of mldiag
outside this package."""
