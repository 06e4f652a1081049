"""What an engine call hands back to the task layer: its results, the exit code, the messages.

The engine never ends the process: ``engine.execute.execute``, ``runbooks.run.execute`` and
``runbooks.run.list_runbooks`` return an ``Outcome`` (and raise ``errors.MldiagError`` for bad
input or an interrupted run); ``tasks.MldiagTask`` alone turns it into Invoke's ``Exit``.
As Fabric's GroupResult does, every target's result is collected first, then the code decided.
"""

from dataclasses import dataclass
from typing import Any, Tuple

from .errors import EXIT_OK


@dataclass(frozen=True)
class Outcome:
    results: Any = None              # the Result list; a RunbookRun; the Runbooks listed
    exit_code: int = EXIT_OK
    messages: Tuple[str, ...] = ()   # for stderr, each printed as ``mldiag: MESSAGE``

    def stderr_text(self):
        """The text the process prints on stderr before it exits; None: nothing."""
        return "\n".join(f"mldiag: {m}" for m in self.messages) or None
