"""The innermost hop: the Python interpreter that runs the bootstrap.

With ``activate:`` it is two steps: the bootstrap starts under an interpreter that exists
before activation, and the runtime then runs the diagnostic under the target's ``python``
after sourcing the activation (``_runtime._spawn_argv``)."""

from typing import List, Sequence, Tuple

from ..core.wire import OLD_PYTHON_MARK, bootstrap_argv
from .base import Classification, find_line


class Interpreter:
    kind = "python"

    def __init__(self, python: str, activate: Sequence[str] = ()):
        self.activate: Tuple[str, ...] = tuple(activate)
        self.then = python                       # what the diagnostic runs under
        self.python = bootstrap_python(python, self.activate)   # what the bootstrap runs under

    def argv(self) -> List[str]:
        return bootstrap_argv(self.python)

    def describe(self) -> str:
        if not self.activate:
            return self.python
        return f"{self.python} → activate {' '.join(self.activate)} → {self.then}"

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


def bootstrap_python(python: str, activate: Sequence[str]) -> str:
    """With ``activate:``, the bootstrap runs before activation: a bare name like ``python``
    may only exist afterwards, so it starts under ``python3`` (an absolute path is kept)."""
    if activate and not python.startswith("/"):
        return "python3"
    return python
