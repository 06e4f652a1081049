"""The local machine: the argv runs as a child process, no shell anywhere."""

import os
import selectors
import shlex
import subprocess
import threading
import time
from typing import Optional, Sequence, Set

from ..core import wire
from .base import (OnStdout, ProcessOutput, StreamCapture, Transport, descriptors_error,
                   out_of_descriptors, record_command)


class Stopper:
    """The local children of one fan-out (``runner.run_many``): ``stop()`` (an interrupted run)
    tells each one running that the client is going away — its stdin is closed, which the
    runtime takes as the signal to kill its diagnostic and leave, as closing the SSH
    connections does for remote targets (a local child is in its own session, so a Ctrl-C on
    the terminal never reaches it) — and no child starts after it. A child is registered
    before it is started: a signal that lands while a worker is starting one (between the fork
    and the registration, it was never told, and the process waited for it at exit) finds its
    event, and a worker that only now reaches its target starts nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: Set[threading.Event] = set()
        self.stopped = False

    def stop(self) -> None:
        with self._lock:
            self.stopped = True
            events = list(self._events)
        for event in events:
            event.set()

    def register(self) -> Optional[threading.Event]:
        """An event for a child about to start; None once stopped (start nothing)."""
        with self._lock:
            if self.stopped:
                return None
            event = threading.Event()
            self._events.add(event)
            return event

    def unregister(self, event: threading.Event) -> None:
        with self._lock:
            self._events.discard(event)


_worker = threading.local()
_NEVER_STOPPED = Stopper()     # children started outside a fan-out's workers


def answer_to(stopper: Stopper) -> None:
    """A fan-out's worker thread (its ThreadPoolExecutor's initializer): the local children it
    starts answer to ``stopper``."""
    _worker.stopper = stopper


class LocalTransport(Transport):
    kind = "local"

    def describe(self) -> str:
        return "local"

    def run(self, argv: Sequence[str], payload: bytes, deadline: float, *,
            on_stdout: OnStdout = None) -> ProcessOutput:
        """Run argv, write payload to its stdin and keep stdin open until the process ends
        (the runtime treats stdin EOF as "the client went away")."""
        record_command("local", shlex.join(argv))
        stopper = getattr(_worker, "stopper", _NEVER_STOPPED)
        stop = stopper.register()
        if stop is None:
            return ProcessOutput(b"", b"mldiag: the run was interrupted before this target "
                                      b"started\n", None)
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            stopper.unregister(stop)
            if out_of_descriptors(exc):
                raise descriptors_error(f"cannot start {argv[0]}") from None
            return ProcessOutput(b"", f"{argv[0]}: {exc.strerror}".encode(), 127)
        try:
            return _pump(proc, payload, deadline, stop, on_stdout)
        finally:
            stopper.unregister(stop)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    stream.close()
                except OSError:
                    pass
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def put(self, data: bytes, path: str) -> None:
        # O_EXCL|O_NOFOLLOW: never through a planted file or symlink
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def close(self) -> None:
        pass


def _pump(proc, payload: bytes, deadline: float, stop: threading.Event,
          on_stdout: OnStdout = None) -> ProcessOutput:
    """Write the payload and read both streams, never blocking past ``deadline`` (a child that
    never reads its stdin costs the deadline, not a hang); each stream is kept bounded.
    ``stop`` set (an interrupted run) closes the child's stdin: its runtime then stops."""
    out = StreamCapture(wire.STDOUT_HEAD, wire.STDOUT_TAIL)
    err = StreamCapture(wire.STDERR_HEAD, wire.STDERR_TAIL)

    def output(code=None, timed_out=False) -> ProcessOutput:
        return ProcessOutput(out.value(), err.value(), code, timed_out=timed_out,
                             dropped=out.dropped + err.dropped)

    sel = selectors.DefaultSelector()
    try:
        os.set_blocking(proc.stdin.fileno(), False)
        view = memoryview(payload)
        writing = bool(view)
        if writing:
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        readers = 2
        while readers:
            if stop.is_set() and not proc.stdin.closed:
                if writing:
                    sel.unregister(proc.stdin)
                    writing = False
                proc.stdin.close()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return output(timed_out=True)
            for key, _ in sel.select(min(remaining, 1.0)):
                if key.fileobj is proc.stdin:
                    try:
                        n = os.write(proc.stdin.fileno(), view[:65536])
                    except BlockingIOError:
                        n = 0
                    except (BrokenPipeError, ConnectionResetError):
                        n = len(view)       # it stopped reading: its exit tells the rest
                    view = view[n:]
                    if not view:
                        sel.unregister(proc.stdin)
                        writing = False
                    continue
                chunk = os.read(key.fileobj.fileno(), 65536)
                if chunk:
                    key.data.feed(chunk)
                    if on_stdout is not None and key.data is out:
                        on_stdout(chunk)
                else:
                    sel.unregister(key.fileobj)
                    readers -= 1
    finally:
        sel.close()
    try:
        code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return output(timed_out=True)
    return output(code)
