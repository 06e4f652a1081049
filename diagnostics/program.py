"""The ``mldiag`` console script: Invoke's Program over the same namespace.

Invoke exits 1 on its own parse errors (an unknown flag); here they are bad input: exit 4.
"""

import re

from invoke import Exit, Program
from invoke.parser import ParseError

from . import __version__
from .errors import EXIT_BAD_INPUT
from .tasks import ns


# Invoke words a flag given without its value as "Flag <Argument: host (H) [list]> needed value
# and was not given one!": said here with the flag as the user typed it.
_NEEDED_VALUE = re.compile(r"Flag <Argument: ([A-Za-z0-9_]+)(?: \(([^)]*)\))?[^>]*> needed value")


def parse_error_message(exc: ParseError) -> str:
    found = _NEEDED_VALUE.search(str(exc))
    if not found:
        return f"mldiag: {exc}"
    name, short = found.group(1).replace("_", "-").strip("-"), found.group(2)
    flags = f"--{name}" + (f" (-{short})" if short and len(short) == 1 else "")
    return f"mldiag: {flags} needs a value"


class MldiagProgram(Program):
    def parse_core(self, argv):
        try:
            super().parse_core(argv)
        except ParseError as exc:
            raise Exit(parse_error_message(exc), code=EXIT_BAD_INPUT)

    def parse_tasks(self):
        try:
            super().parse_tasks()
        except ParseError as exc:
            raise Exit(parse_error_message(exc), code=EXIT_BAD_INPUT)


program = MldiagProgram(namespace=ns, version=__version__, name="mldiag", binary="mldiag")


def main():
    program.run()
