"""The ``mldiag`` console script: Invoke's Program over the same namespace.

Invoke exits 1 on its own parse errors (an unknown flag); here they are bad input: exit 4.
"""

from invoke import Exit, Program
from invoke.parser import ParseError

from . import __version__
from .errors import EXIT_BAD_INPUT
from .tasks import ns


class MldiagProgram(Program):
    def parse_core(self, argv):
        try:
            super().parse_core(argv)
        except ParseError as exc:
            raise Exit(f"mldiag: {exc}", code=EXIT_BAD_INPUT)

    def parse_tasks(self):
        try:
            super().parse_tasks()
        except ParseError as exc:
            raise Exit(f"mldiag: {exc}", code=EXIT_BAD_INPUT)


program = MldiagProgram(namespace=ns, version=__version__, name="mldiag", binary="mldiag")


def main():
    program.run()
