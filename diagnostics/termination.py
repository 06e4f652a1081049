"""SIGTERM and SIGHUP (a CI timeout, a closed terminal) take Ctrl-C's path.

Python ends a process on TERM or HUP without unwinding: no ``finally`` runs, so a Slurm
allocation is never ``scancel``ed and nothing arrived is saved. While a task runs,
``terminates_like_ctrl_c()`` turns either signal into ``Terminated``, a ``KeyboardInterrupt``:
every ``except KeyboardInterrupt`` / ``finally`` of the engine runs as for Ctrl-C
(connections closed, allocations released, what arrived saved) and the task layer exits
128 + the signal's number (143, 129), as a shell reports a process killed by it.

A second signal while that cleanup runs is ignored: cutting ``scancel`` short is what this is
here to prevent (SIGKILL still ends the process).
"""

import contextlib
import signal
import threading
from typing import Iterator, Optional

from .errors import EXIT_INTERRUPTED, Interrupted

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
                if s is not None)


class Terminated(KeyboardInterrupt):
    """The run was ended by ``signum``; handled wherever Ctrl-C is."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def exit_code_of(interrupt: BaseException) -> int:
    """128 + signal for TERM/HUP, 130 for Ctrl-C."""
    return interrupt.exit_code if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED


def describe(interrupt: BaseException) -> str:
    """``interrupted`` (Ctrl-C) or ``terminated (SIGTERM)``, for ``mldiag: ...`` messages."""
    return f"terminated ({interrupt.name})" if isinstance(interrupt, Terminated) else "interrupted"


def interrupted(interrupt: BaseException, detail: Optional[str] = None) -> Interrupted:
    """The error an engine raises after handling ``interrupt`` (what arrived saved), e.g.
    ``terminated (SIGTERM) (1 of 2 targets finished)`` with exit 143."""
    message = describe(interrupt) + (f" ({detail})" if detail else "")
    return Interrupted(message, exit_code_of(interrupt))


class _Received:
    """The first TERM/HUP of a task call (later ones are ignored)."""

    def __init__(self) -> None:
        self.signal: Optional[Terminated] = None

    def handler(self, signum, frame) -> None:
        if self.signal is None:
            self.signal = Terminated(signum)
            raise self.signal


@contextlib.contextmanager
def terminates_like_ctrl_c() -> Iterator[_Received]:
    """Within the block, TERM and HUP raise ``Terminated`` in the main thread; the previous
    handlers come back after it. Outside the main thread (a task called from a test's
    thread) nothing is installed."""
    received = _Received()
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {s: signal.signal(s, received.handler) for s in SIGNALS}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
