"""The local machine: the argv runs as a child process, no shell anywhere."""

import os
import selectors
import shlex
import subprocess
import time
from typing import Sequence

from .. import wire
from .base import (ProcessOutput, StreamCapture, descriptors_error, out_of_descriptors,
                   record_command)


class LocalTransport:
    kind = "local"

    def describe(self) -> str:
        return "local"

    def run(self, argv: Sequence[str], payload: bytes, deadline: float) -> ProcessOutput:
        """Run argv, write payload to its stdin and keep stdin open until the process ends
        (the runtime treats stdin EOF as "the client went away")."""
        record_command("local", shlex.join(argv))
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            if out_of_descriptors(exc):
                raise descriptors_error(f"cannot start {argv[0]}") from None
            return ProcessOutput(b"", f"{argv[0]}: {exc.strerror}".encode(), 127)
        try:
            return _pump(proc, payload, deadline)
        finally:
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    stream.close()
                except OSError:
                    pass
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    def put(self, data: bytes, path: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)

    def close(self):
        pass


def _pump(proc, payload: bytes, deadline: float) -> ProcessOutput:
    """Write the payload and read both streams, never blocking past ``deadline`` (a child that
    never reads its stdin costs the deadline, not a hang); each stream is kept bounded."""
    out = StreamCapture(wire.STDOUT_HEAD, wire.STDOUT_TAIL)
    err = StreamCapture(wire.STDERR_HEAD, wire.STDERR_TAIL)

    def output(code=None, timed_out=False) -> ProcessOutput:
        return ProcessOutput(out.value(), err.value(), code, timed_out=timed_out,
                             dropped=out.dropped + err.dropped)

    sel = selectors.DefaultSelector()
    try:
        os.set_blocking(proc.stdin.fileno(), False)
        view = memoryview(payload)
        if view:
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        readers = 2
        while readers:
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
                    continue
                chunk = os.read(key.fileobj.fileno(), 65536)
                if chunk:
                    key.data.feed(chunk)
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
