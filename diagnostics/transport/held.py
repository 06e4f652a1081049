"""Held SSH connections: a per-user holder process keeps authenticated connections open between
mldiag calls, as OpenSSH's ``ControlMaster``/``ControlPersist`` does (``diagnostics/transport/holder.py``
is the holder; this is the client side and the wire both share).

- Used for an endpoint whose ``persist`` is above 0: hosts.yaml ``persist: SECONDS``, else the
  user's ssh_config (``ControlMaster auto`` with ``ControlPersist``), so mldiag keeps
  connections exactly when the user's own ssh would.
- ``HeldTransport`` wraps the direct ``SshTransport``. With no holder answering, the call goes
  direct (all its runs) and a holder is started for the next call: the first call costs what
  it always did.
  Through the holder a call imports neither paramiko nor Fabric and makes no handshake.
- The socket lives in a directory private to the user (mode 0700, owned by the user, not a
  link, and no one else able to rename or replace it or a directory above it: checked before
  every use); the holder checks each caller's uid (``SO_PEERCRED``) and each caller the
  holder's before it sends anything. A socket that does not accept at once is no holder.
  Each connection closes after ``persist`` seconds unused, and the holder exits with its last.
- A call's stdin never closes early: a caller that goes away (Ctrl-C, a crash) closes its
  socket, and the holder then closes the channel, so the runtime stops the diagnostic.
"""

import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from typing import List, Optional, Sequence

from .private import private_dir
from .base import OnStdout, ProcessOutput, StreamCapture, Transport, TransportError
from .sshconfig import Endpoint
from ..core import wire
from ..core.paths import PACKAGE_DIR, PACKAGE_PARENT

PROTOCOL = 1
# The holder's own module, named from this one's package: a move of the package moves both.
HOLDER_MODULE = __name__.rpartition(".")[0] + ".holder"
MAX_HEADER = 1 << 20          # a request's or a result's JSON
MAX_FRAME = 64 << 20          # one stream chunk or a final stream (bounded by wire.* anyway)
# A caller waits this long past its run's deadline for the holder's answer.
GRACE_S = 30.0
# A holder's socket is local: one that does not take a connection at once (a full backlog, a
# stopped holder) is treated as none, so a call goes direct instead of waiting on it.
CONNECT_S = 2.0

_HEAD = struct.Struct(">cI")   # frame: kind, length


# ------------------------------------------------------------------------------- the wire

def send_frame(sock: socket.socket, kind: bytes, body: bytes) -> None:
    sock.sendall(_HEAD.pack(kind, len(body)) + body)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the peer closed the socket")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, limit: int = MAX_FRAME):
    kind, size = _HEAD.unpack(recv_exact(sock, _HEAD.size))
    if size > limit:
        raise ValueError(f"a {kind!r} frame of {size} bytes (at most {limit})")
    return kind, recv_exact(sock, size)


def endpoint_to_dict(ep: Endpoint) -> dict:
    return asdict(ep)


def endpoint_from_dict(d) -> Endpoint:
    """The holder's one check of what a caller sent: every field of its type."""
    if not isinstance(d, dict):
        raise ValueError("endpoint: not an object")
    jump = endpoint_from_dict(d["jump"]) if d.get("jump") is not None else None
    texts = lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)  # noqa: E731
    if not (isinstance(d.get("label"), str) and isinstance(d.get("hostname"), str)
            and isinstance(d.get("user"), str) and isinstance(d.get("port"), int)
            and texts(d.get("identity_files")) and texts(d.get("known_hosts"))
            and texts(d.get("global_known_hosts")) and d.get("strict") in ("yes", "accept-new", "no")
            and isinstance(d.get("connect_timeout"), (int, float))
            and isinstance(d.get("proxy_command"), (str, type(None)))
            and isinstance(d.get("hash_known_hosts"), bool)
            and isinstance(d.get("persist", 0.0), (int, float))):
        raise ValueError("endpoint: a field is missing or of the wrong type")
    return Endpoint(label=d["label"], hostname=d["hostname"], port=d["port"], user=d["user"],
                    identity_files=tuple(d["identity_files"]), known_hosts=tuple(d["known_hosts"]),
                    global_known_hosts=tuple(d["global_known_hosts"]), strict=d["strict"],
                    connect_timeout=float(d["connect_timeout"]), jump=jump,
                    proxy_command=d["proxy_command"], hash_known_hosts=d["hash_known_hosts"],
                    persist=float(d.get("persist", 0.0)))


def holder_code(directory: Optional[str] = None) -> List[os.DirEntry]:
    """The package's modules a holder may run: every one but ``diagnostics/scripts/`` (the
    diagnostics, sent to targets as bytes, never imported on this side). All of them, not a
    list kept by hand: a module the holder imports, now or after a change, is in it."""
    directory = directory or PACKAGE_DIR
    found = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.name.endswith(".py") and entry.is_file():
            found.append(entry)
        elif entry.name not in ("scripts", "__pycache__") and entry.is_dir(follow_symlinks=False):
            found += holder_code(entry.path)
    return found


def holder_name() -> str:
    """One holder per mldiag code, Python and ssh-agent: a caller never talks to a holder of
    other code, and a held connection authenticated through one agent serves only its users."""
    stamps = []
    for entry in holder_code():
        st = entry.stat()
        stamps.append(f"{entry.path}:{st.st_size}:{st.st_mtime_ns}")
    key = "\0".join([str(PROTOCOL), sys.executable, os.environ.get("SSH_AUTH_SOCK", ""), *stamps])
    return "holder-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def connect(path: str) -> Optional[socket.socket]:
    """A socket to the holder at ``path``, or None when none answers there as this user."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_S)
        sock.connect(path)
        pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                             struct.calcsize("3i")))
        if uid != os.geteuid():
            raise OSError("the holder's socket belongs to another user")
        return sock
    except OSError:
        sock.close()
        return None


def start_holder(path: str, persist: float) -> None:
    """A holder at ``path`` in its own session, not waited for: ``sh`` puts it in the
    background and exits, so no child of ours is left to reap."""
    boot = (f"import sys; sys.path.insert(0, sys.argv[1]); import {HOLDER_MODULE} as holder; "
            "holder.main(sys.argv[2], float(sys.argv[3]))")
    try:
        subprocess.run(["/bin/sh", "-c", '"$@" </dev/null >/dev/null 2>&1 &', "sh", sys.executable,
                        "-c", boot, PACKAGE_PARENT, path, repr(persist)],
                       start_new_session=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        pass    # nothing held: the next call goes direct too


class Holder:
    """This process's view of the user's holder: where it is, and whether it was started."""

    def __init__(self, directory: str):
        self.path = os.path.join(directory, holder_name() + ".sock")
        self.started = False
        self._open: set = set()           # sockets of the requests in flight
        self._lock = threading.Lock()
        self.closed = False

    @classmethod
    def for_user(cls) -> Optional["Holder"]:
        directory = private_dir()
        return cls(directory) if directory is not None else None

    def connect(self, persist: float) -> Optional[socket.socket]:
        """The holder's socket; None when none answers (then one is started, and every run of
        this call goes direct: a call is held or not as a whole, so containers of one host
        still share one connection in the call that starts the holder)."""
        with self._lock:
            if self.started:
                return None
        sock = connect(self.path)
        if sock is None:
            with self._lock:
                first, self.started = not self.started, True
            if first:
                start_holder(self.path, persist)
        if sock is not None:
            with self._lock:
                if self.closed:      # the run is being interrupted: start nothing more
                    sock.close()
                    raise TransportError("unreachable", "the run was interrupted")
                self._open.add(sock)
        return sock

    def done(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        sock.close()

    def close(self) -> None:
        """End every request in flight, as closing a direct run's connections does (Ctrl-C): the
        holder sees its caller go and stops the command on the target."""
        with self._lock:
            self.closed = True
            socks = list(self._open)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class HeldTransport(Transport):
    """The direct transport's runs, made by the holder when it answers (else by the direct one)."""

    kind = "ssh"

    def __init__(self, direct: Transport, holder: Holder):
        self.direct = direct
        self.holder = holder
        self.endpoint: Endpoint = direct.endpoint

    def describe(self) -> str:
        return self.direct.describe()

    def close(self) -> None:
        self.direct.close()

    def put(self, data: bytes, path: str) -> None:
        sock = self.holder.connect(self.endpoint.persist)
        if sock is None:
            return self.direct.put(data, path)
        try:
            self._exchange(sock, {"op": "put", "path": path}, data, time.monotonic() + 120, None)
        finally:
            self.holder.done(sock)

    def run(self, argv: Sequence[str], payload: bytes, deadline: float, *,
            close_stdin: bool = False, on_stdout: OnStdout = None) -> ProcessOutput:
        sock = self.holder.connect(self.endpoint.persist)
        if sock is None:
            return self.direct.run(argv, payload, deadline, close_stdin=close_stdin,
                                   on_stdout=on_stdout)
        try:
            return self._exchange(sock, {"op": "run", "argv": list(argv), "close_stdin": close_stdin},
                                  payload, deadline, on_stdout)
        finally:
            self.holder.done(sock)

    def _exchange(self, sock, request: dict, payload: bytes, deadline: float,
                  on_stdout: OnStdout) -> Optional[ProcessOutput]:
        request.update(endpoint=endpoint_to_dict(self.endpoint), payload=len(payload),
                       timeout=max(0.0, deadline - time.monotonic()))
        out = StreamCapture(wire.STDOUT_HEAD, wire.STDOUT_TAIL)
        try:
            sock.settimeout(max(1.0, deadline - time.monotonic()) + GRACE_S)
            send_frame(sock, b"Q", json.dumps(request).encode())
            sock.sendall(payload)
            stderr = b""
            while True:
                kind, body = recv_frame(sock)
                if kind == b"O":
                    out.feed(body)
                    if on_stdout is not None:
                        on_stdout(body)
                elif kind == b"E":
                    stderr = body
                elif kind == b"X":
                    err = json.loads(body)
                    stderr_text = err.get("stderr")
                    raise TransportError(str(err["layer"]), str(err["message"]),
                                         stderr_text if isinstance(stderr_text, str) else None)
                elif kind == b"R":
                    return None if request["op"] == "put" else _ended(json.loads(body), out, stderr)
                else:
                    raise ValueError(f"an unknown frame {kind!r}")
        except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise TransportError("unreachable", f"{self.endpoint.describe()}: mldiag's connection "
                                 f"holder ({self.holder.path}) failed: {exc or type(exc).__name__}")


def _ended(done, out: StreamCapture, stderr: bytes) -> ProcessOutput:
    """How the command ended, as the holder said it: each field of its type, else ValueError."""
    code, lost = done.get("exit_code"), done.get("lost")
    if not (isinstance(code, (int, type(None))) and isinstance(lost, (str, type(None)))
            and isinstance(done.get("timed_out"), bool) and isinstance(done.get("dropped"), int)):
        raise ValueError("a malformed end of the command")
    return ProcessOutput(out.value(), stderr, code, timed_out=done["timed_out"], lost=lost,
                         dropped=done["dropped"])
