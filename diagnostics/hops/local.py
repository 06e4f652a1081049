"""The local machine: the argv runs as a child process, no shell anywhere."""

import os
import selectors
import shlex
import subprocess
import time
from typing import Sequence

from .base import ProcessOutput, record_command


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
    out, err = bytearray(), bytearray()
    sel = selectors.DefaultSelector()
    os.set_blocking(proc.stdin.fileno(), False)
    view = memoryview(payload)
    sel.register(proc.stdin, selectors.EVENT_WRITE)
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    readers = 2
    while readers:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return ProcessOutput(bytes(out), bytes(err), None, timed_out=True)
        for key, _ in sel.select(min(remaining, 1.0)):
            if key.fileobj is proc.stdin:
                try:
                    n = os.write(proc.stdin.fileno(), view[:65536])
                except BrokenPipeError:
                    n = len(view)
                view = view[n:]
                if not view:
                    sel.unregister(proc.stdin)
                continue
            chunk = os.read(key.fileobj.fileno(), 65536)
            if chunk:
                key.data.extend(chunk)
            else:
                sel.unregister(key.fileobj)
                readers -= 1
    sel.close()
    try:
        code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return ProcessOutput(bytes(out), bytes(err), None, timed_out=True)
    return ProcessOutput(bytes(out), bytes(err), code)
