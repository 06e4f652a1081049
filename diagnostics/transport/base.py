"""The hop contract: a transport runs an argv; a wrapper rewrites an argv one level further in.

A chain is ``transport (local | ssh) → [srun] → [sudo] → [container] → interpreter``.  Wrappers
never subclass each other; they stack by wrapping the argv of the hop inside them (Mitogen's
``via``).  A transport is one small class per way of reaching a machine (pyinfra's connectors).
"""

import abc
import errno
import json
import os
import resource
from collections import deque
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

# Audit: when set, every command line sent to a hop is appended to this file as one JSON line
# ({"hop", "line", "pid"}), exactly as sent. The test suite turns it on for every test and then
# checks each line against the safe alphabet (docs/architecture.md, invariant 1).
RECORD_ENV = "MLDIAG_RECORD_COMMANDS"

Classification = Optional[Tuple[str, str]]   # (error layer, one-line reason) or None
OnStdout = Optional[Callable[[bytes], None]]  # sees each stdout chunk as it arrives


class Wrapper:
    """One hop inside a transport (srun, sudo, a container runtime): it only rewrites argv."""

    kind = "?"

    def wrap(self, argv: Sequence[str]) -> List[str]:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def classify(self, exit_code: Optional[int], stderr: str) -> Classification:
        """Name this hop's failure from the chain's exit code and stderr, if it is one."""
        return None


class TransportError(Exception):
    """A connection-level failure, already classified by layer."""

    def __init__(self, layer: str, message: str, stderr: Optional[str] = None):
        super().__init__(message)
        self.layer = layer
        self.message = message
        self.stderr = stderr


class Transport(abc.ABC):
    """How a chain reaches a machine: the outermost hop, the only one that moves bytes.

    Building one opens nothing (``inv hosts`` describes chains it never runs); the first
    ``run`` or ``put`` connects.  Failures of the link itself raise ``TransportError``; what the
    command did (its exit, its streams) comes back in the ``ProcessOutput``."""

    kind = "?"

    @abc.abstractmethod
    def run(self, argv: Sequence[str], payload: bytes, deadline: float, *,
            on_stdout: OnStdout = None) -> "ProcessOutput":
        """Run ``argv`` (no shell) with ``payload`` on its stdin, kept open until the command
        ends: its EOF tells the runtime the client went away.  Never waits past ``deadline``
        (``time.monotonic()``); streams come back bounded.  ``on_stdout``, when given, is called
        with each stdout chunk as it arrives (progress lines, ``wire.ProgressReader``), on the
        calling thread; the chunk is in the returned stdout too."""

    @abc.abstractmethod
    def put(self, data: bytes, path: str) -> None:
        """Create ``path`` (mode 0600) holding ``data`` on this transport's machine; local
        files and SFTP refuse an existing file (the exec fallback without SFTP cannot).  The bundle does not need it (it is streamed through ``run``'s
        stdin along the whole chain); it is the plain file transfer the contract offers."""

    @abc.abstractmethod
    def describe(self) -> str:
        """The hop as ``inv hosts`` prints it, without connecting."""

    @abc.abstractmethod
    def close(self) -> None:
        """Let go of what this transport holds (connections are the pool's, shared)."""


# File descriptors: kept back for the process itself (stdio, imports, known_hosts, --save),
# and what one target in flight may hold (its connection's socket, the channel's wakeup pipe,
# or a local child's three pipes and the selector).
FD_RESERVE = 24
FDS_PER_RUN = 4


def concurrent_runs_allowed() -> int:
    """How many targets may be in flight (and direct connections open) under RLIMIT_NOFILE."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(1, (soft - FD_RESERVE) // FDS_PER_RUN)


def out_of_descriptors(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE)


def descriptors_error(what: str) -> TransportError:
    """EMFILE said plainly: which limit, and what to do (never an ``internal`` row)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return TransportError("unreachable", f"out of file descriptors (ulimit -n {soft}): {what}; "
                          f"lower --parallel or raise ulimit -n")


@dataclass
class ProcessOutput:
    stdout: bytes
    stderr: bytes
    exit_code: Optional[int]      # None when the process did not end (timeout) or the link died
    timed_out: bool = False
    lost: Optional[str] = None    # why the link was lost, if it was
    dropped: int = 0              # bytes of stdout and stderr not kept (see StreamCapture)


class StreamCapture:
    """The first ``head`` and the last ``tail`` bytes of a stream; the rest is counted, not
    kept, so a target printing a gigabyte costs the client ``head + tail`` bytes.  The tail is
    a queue of chunks: dropping from its front costs no copy (a bytearray's would, per chunk)."""

    def __init__(self, head: int, tail: int):
        self.head_limit = head
        self.tail_limit = tail
        self.head = bytearray()
        self.tail: deque = deque()
        self.tail_size = 0
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self.tail_limit:
            self.tail.append(bytes(data))
            self.tail_size += len(data)
            while self.tail_size - len(self.tail[0]) >= self.tail_limit:
                self.tail_size -= len(self.tail.popleft())

    def _kept_tail(self) -> bytes:
        joined = b"".join(self.tail)
        return joined[len(joined) - self.tail_limit:] if len(joined) > self.tail_limit else joined

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - min(self.tail_size, self.tail_limit)

    def value(self) -> bytes:
        """head, a note of what was dropped (so no marker can be glued from the two ends), tail."""
        tail = self._kept_tail()
        dropped = self.total - len(self.head) - len(tail)
        note = b"\n[mldiag: %d bytes not kept]\n" % dropped if dropped else b""
        return bytes(self.head) + note + tail


def first_line(text: str, limit: int = 300) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:limit]
    return ""


def find_line(text: str, *needles: str) -> Optional[str]:
    """The first stderr line containing any needle (case-insensitive)."""
    for line in text.splitlines():
        low = line.lower()
        if any(n.lower() in low for n in needles):
            return line.strip()[:300]
    return None


def record_command(hop: str, line: str) -> None:
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    entry = (json.dumps({"hop": hop, "line": line, "pid": os.getpid()}) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, entry)   # one O_APPEND write per line: whole lines from many processes
    finally:
        os.close(fd)
