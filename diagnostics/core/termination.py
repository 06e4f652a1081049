"""SIGTERM and SIGHUP (a CI timeout, a closed terminal) take Ctrl-C's path.

Python ends a process on TERM or HUP without unwinding: no ``finally`` runs, so a Slurm
allocation is never ``scancel``ed and nothing arrived is saved. While a task runs,
``terminates_like_ctrl_c()`` turns either signal into ``Terminated``, a ``KeyboardInterrupt``:
every ``except KeyboardInterrupt`` / ``finally`` of the engine runs as for Ctrl-C
(connections closed, allocations released, what arrived saved) and the task layer exits
128 + the signal's number (143, 129), as a shell reports a process killed by it.

A second signal while that cleanup runs is ignored, a second Ctrl-C as a second TERM:
cutting ``scancel`` short is what this is here to prevent (SIGKILL still ends the process).
After the block, too: a run ended by a signal leaves TERM, HUP and INT ignored, so a second
one that lands after the cleanup, while Invoke prints the message and Python exits, cannot
end the process by that signal instead of with the first one's code.
``held()`` goes one step further for the few steps that must not be cut in half even by the
first signal (a Slurm reservation created and recorded, a node resumed and recorded, the
window closed again): the signal waits until the block ends, then takes its usual path.
"""

import contextlib
import signal
import threading
from typing import Iterator, List, Optional

from .errors import EXIT_INTERRUPTED, Interrupted

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
                if s is not None)


def _caught() -> tuple:
    """TERM, HUP, and INT unless it is ignored (a job started in the background by a
    non-interactive shell: Python then installs no Ctrl-C handler either)."""
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    return SIGNALS + (() if ignored else (signal.SIGINT,))


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
    """The first TERM/HUP/INT of a task call (later ones are ignored). ``signal``: the first
    TERM/HUP as ``Terminated``; a first Ctrl-C raises a plain ``KeyboardInterrupt``. While
    ``holding`` (``held``), a signal is kept in ``pending`` instead."""

    def __init__(self) -> None:
        self.signal: Optional[Terminated] = None
        self.interrupted = False
        self.holding = 0
        self.pending: List[int] = []

    def handler(self, signum, frame) -> None:
        if self.holding:
            self.pending.append(signum)
            return
        if self.interrupted:
            return
        self.interrupted = True
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal = Terminated(signum)
        raise self.signal


_active: Optional[_Received] = None     # the task call's, while its handlers are installed


@contextlib.contextmanager
def terminates_like_ctrl_c() -> Iterator[_Received]:
    """Within the block, TERM and HUP raise ``Terminated`` in the main thread; the previous
    handlers come back after it, unless a signal ended the block: then the process is on its
    way out with that signal's code and the three stay ignored until it exits. Outside the
    main thread (a task called from a test's thread) nothing is installed."""
    global _active
    received = _Received()
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = {s: signal.signal(s, received.handler) for s in _caught()}
    outer, _active = _active, received
    try:
        yield received
    finally:
        _active = outer
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_IGN if received.interrupted else handler)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Within the block, TERM, HUP and INT wait: the block runs to its end (each of its
    steps is bounded by its own timeout), then the first one held is raised again and takes
    the path it would have taken (``Terminated``, Ctrl-C's ``KeyboardInterrupt``, or nothing
    when it was a second one). When the block itself raises, what was held is dropped: the run
    is ending already. Outside the main thread nothing is installed.

    NOTE: inside a task call this is a counter on its handler (about 3.5 µs a block:
    ``--save`` holds every file it writes); elsewhere handlers are installed for the block
    (about 50 µs)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = _active
    if received is None:
        received = _Received()
        previous = {s: signal.signal(s, received.handler) for s in _caught()}
    else:
        previous = {}
    received.holding += 1
    first = None
    try:
        yield
    finally:
        received.holding -= 1
        if received.holding == 0:       # the outermost block: what it held, taken (or dropped)
            first = received.pending[0] if received.pending else None
            received.pending.clear()
        for s, handler in previous.items():
            signal.signal(s, handler)
    if first is not None:               # reached only when the block did not raise
        if previous:
            signal.raise_signal(first)    # to the handler that was there before the block
        else:
            received.handler(first, None)
