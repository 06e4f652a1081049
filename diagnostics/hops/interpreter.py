"""The innermost hop: the Python interpreter that runs the bootstrap."""

from typing import List, Sequence

from ..wire import OLD_PYTHON_MARK, bootstrap_argv
from .base import Classification, find_line


class Interpreter:
    kind = "python"

    def __init__(self, python: str):
        self.python = python

    def argv(self) -> List[str]:
        return bootstrap_argv(self.python)

    def describe(self) -> str:
        return self.python

    def classify(self, exit_code, stderr: str, stdout: str = "") -> Classification:
        if OLD_PYTHON_MARK in stdout:
            version = stdout.split(OLD_PYTHON_MARK, 1)[1].split("@@", 1)[0].strip()
            return "interpreter", f"{self.python} is Python {version}; mldiag needs 3.8 or newer"
        if find_line(stderr, "has no attribute 'buffer'", "SyntaxError"):
            return "interpreter", f"{self.python} is too old for mldiag (needs Python 3.8+)"
        line = find_line(stderr, f"{self.python}: not found", f"{self.python}: command not found",
                         f"{self.python}: No such file", "executable file not found",
                         f'exec "{self.python}"', f"exec {self.python}", "No such file or directory",
                         "Permission denied")
        if line or exit_code in (126, 127):
            return "interpreter", f"cannot run {self.python}" + (f" ({line})" if line else
                                                                  f" (exit {exit_code})")
        return None


def describe_chain(parts: Sequence[str]) -> str:
    return " → ".join(parts)
