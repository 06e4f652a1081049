"""The connection holder: one background process per user that keeps SSH connections open
between mldiag calls (``ControlPersist``; the client side and the reasons are in transport/held.py).

A caller sends one request per socket connection: run a command (its stdout comes back as it
arrives, then its stderr and how it ended), put a file, or quit. The holder runs it with the
same ``SshTransport`` and ``SshPool`` a direct call uses, so host keys, bounds and deadlines
are the same code. A connection closes after its ``persist`` seconds unused; the holder exits
when it holds none and nobody has called for as long, when told to quit, or on SIGTERM.
"""

import fcntl
import json
import os
import signal
import socket
import struct
import threading
import time
import traceback
from typing import Dict, Optional

from . import held
from .base import TransportError
from .ssh import SshPool, SshTransport
from .private import is_private
from .sshconfig import PERSIST_FOREVER_S, Endpoint

MAX_PAYLOAD = 2 << 30     # a bundle with its --put files; the caller holds it in memory too
SWEEP_S = 1.0


def _chain(ep: Endpoint):
    while ep is not None:
        yield ep
        ep = ep.jump


class HolderState:
    def __init__(self, persist: float):
        # one pool: an endpoint's key holds what its connection was authenticated and
        # verified with, so a held connection serves only callers that would open it alike
        self.pool = SshPool()
        self.persist_of: Dict[tuple, float] = {}    # endpoint key → seconds held unused
        self.idle_limit = persist
        self.in_flight = 0
        self.last_activity = time.monotonic()
        self.quit = threading.Event()
        self.lock = threading.Lock()

    def pool_for(self, ep: Endpoint) -> SshPool:
        with self.lock:
            for e in _chain(ep):
                self.persist_of[e.key] = max(self.persist_of.get(e.key, 0.0), ep.persist)
            self.idle_limit = max(self.idle_limit, ep.persist)
            return self.pool

    def begin(self) -> None:
        with self.lock:
            self.in_flight += 1
            self.last_activity = time.monotonic()

    def end(self) -> None:
        with self.lock:
            self.in_flight -= 1
            self.last_activity = time.monotonic()

    def sweep(self) -> bool:
        """Close the connections unused for their persist; True when the holder should exit."""
        now = time.monotonic()
        with self.lock:
            persist_of = dict(self.persist_of)
        self.pool.expire(lambda p: now - p.last_used >= persist_of.get(p.endpoint.key, 0.0))
        held_now = self.pool.open_count
        with self.lock:
            return self.quit.is_set() or (self.in_flight == 0 and held_now == 0
                                          and now - self.last_activity >= self.idle_limit)

    def close(self) -> None:
        self.pool.close()


def _error(conn: socket.socket, layer: str, message: str, stderr=None) -> None:
    held.send_frame(conn, b"X", json.dumps({"layer": layer, "message": message,
                                            "stderr": stderr}).encode())


def handle(conn: socket.socket, state: HolderState) -> None:
    state.begin()
    try:
        conn.settimeout(30)
        kind, body = held.recv_frame(conn, held.MAX_HEADER)
        request = json.loads(body)
        if kind != b"Q" or not isinstance(request, dict):
            raise ValueError("not a request")
        op = request.get("op")
        if op == "quit":
            state.quit.set()
            held.send_frame(conn, b"R", b"{}")
            return
        size = request.get("payload")
        if not isinstance(size, int) or not 0 <= size <= MAX_PAYLOAD:
            raise ValueError("payload: not a size")
        ep = held.endpoint_from_dict(request.get("endpoint"))
        payload = held.recv_exact(conn, size)
        conn.settimeout(None)
        transport = SshTransport(ep, state.pool_for(ep))
        try:
            if op == "put":
                path = request.get("path")
                if not isinstance(path, str):
                    raise ValueError("path: not a string")
                transport.put(payload, path)
                held.send_frame(conn, b"R", b"{}")
            elif op == "run":
                _run(conn, transport, request, payload)
            else:
                raise ValueError(f"op {op!r}")
        except TransportError as exc:
            _error(conn, exc.layer, exc.message, exc.stderr)
    except (OSError, EOFError):
        pass    # the caller went away: its command was stopped (see _run)
    except Exception as exc:
        try:
            _error(conn, "internal", f"mldiag's connection holder: {type(exc).__name__}: {exc}",
                   traceback.format_exc())
        except OSError:
            pass
    finally:
        conn.close()
        state.end()


def _run(conn: socket.socket, transport: SshTransport, request: dict, payload: bytes) -> None:
    argv, timeout = request.get("argv"), request.get("timeout")
    if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv)
            and isinstance(timeout, (int, float)) and timeout >= 0):
        raise ValueError("argv or timeout")
    gone = threading.Event()

    def watch_caller():
        # The caller sends nothing more: its socket's EOF means it went away.
        try:
            conn.recv(1)
        except OSError:
            pass
        gone.set()

    threading.Thread(target=watch_caller, daemon=True).start()
    out = transport.run(argv, payload, time.monotonic() + timeout,
                        close_stdin=bool(request.get("close_stdin")),
                        on_stdout=lambda chunk: held.send_frame(conn, b"O", chunk), stop=gone)
    held.send_frame(conn, b"E", out.stderr)
    held.send_frame(conn, b"R", json.dumps({"exit_code": out.exit_code, "timed_out": out.timed_out,
                                            "lost": out.lost, "dropped": out.dropped}).encode())


class Listening:
    """The holder's place: its directory held open, the lock that makes it the only holder
    there, and its listening socket. The directory is used through the open descriptor, so the
    lock, the socket's mode and its removal stay in the directory that was checked, whatever
    is later renamed onto its path."""

    def __init__(self, dir_fd: int, name: str, lock: int, server: socket.socket):
        self.dir_fd, self.name, self.lock, self.server = dir_fd, name, lock, server
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        self.socket_id = (st.st_dev, st.st_ino)

    def still_ours(self) -> bool:
        """Is our socket still at our name? (Removed or replaced: no caller can reach us.)"""
        try:
            st = os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self.socket_id

    def close(self) -> None:
        if self.still_ours():     # another file there now is not ours to remove
            try:
                os.unlink(self.name, dir_fd=self.dir_fd)
            except OSError:
                pass
        self.server.close()
        # the lock file goes while still locked: a holder starting now either locked it before
        # (and sees the file gone from the name: _locked) or makes a new one
        try:
            os.unlink(self.name + ".lock", dir_fd=self.dir_fd)
        except OSError:
            pass
        os.close(self.lock)
        os.close(self.dir_fd)


def _locked(dir_fd: int, name: str) -> Optional[int]:
    """The lock of ``name`` in the directory, held (a descriptor), or None when another holder
    has it. A lock file is removed by its holder as it exits (no file left in the user's
    directory): one locked after that removal is no longer the one at the name, and is none."""
    lock = os.open(name + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                   dir_fd=dir_fd)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        st, there = os.fstat(lock), os.stat(name + ".lock", dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        os.close(lock)
        return None
    if (st.st_dev, st.st_ino) != (there.st_dev, there.st_ino):
        os.close(lock)
        return None
    return lock


def _listen(path: str) -> Optional[Listening]:
    """This holder's place at ``path``; None when another holder has it or the directory is
    not private."""
    directory, name = os.path.split(path)
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not is_private(os.fstat(dir_fd), os.geteuid()):
            raise OSError("not a private directory")
        lock = _locked(dir_fd, name)
        if lock is None:
            raise OSError("another holder has the lock")
    except OSError:
        os.close(dir_fd)
        return None
    try:
        # bound and listening under a name of its own first, then renamed into place: a caller
        # never finds a socket that does not listen yet (it would go direct, and a quit sent
        # then would be lost)
        temp = f"new-{os.getpid()}.sock"
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(os.path.join(directory, temp))
            # the bind goes by path: it must have landed in the directory checked, not in one
            # renamed onto the path meanwhile
            bound = os.stat(os.path.join(directory, temp), follow_symlinks=False)
            here = os.stat(temp, dir_fd=dir_fd, follow_symlinks=False)
            if (bound.st_dev, bound.st_ino) != (here.st_dev, here.st_ino):
                raise OSError("the directory was replaced during the bind")
            os.chmod(temp, 0o600, dir_fd=dir_fd)
            server.listen(64)
            server.settimeout(SWEEP_S)
            os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return Listening(dir_fd, name, lock, server)
        except OSError:
            server.close()
            try:
                os.unlink(temp, dir_fd=dir_fd)     # no half-made holder's name left behind
            except OSError:
                pass
            raise
    except OSError:
        os.close(lock)
        os.close(dir_fd)
        return None


def serve(path: str, persist: float) -> None:
    listening = _listen(path)
    if listening is None:
        return
    server = listening.server
    state = HolderState(persist)
    signal.signal(signal.SIGTERM, lambda *_: state.quit.set())
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})   # one sent meanwhile: quit
    me = os.geteuid()
    try:
        while not state.sweep() and listening.still_ours():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            if struct.unpack("3i", creds)[1] != me:
                conn.close()
                continue
            threading.Thread(target=handle, args=(conn, state), daemon=True).start()
    finally:
        listening.close()
        state.close()


def main(path: str, persist: float) -> None:
    """The holder's process (started by ``held.start_holder`` in its own session)."""
    os.umask(0o077)
    os.chdir("/")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a TERM while the holder makes its place waits until it can quit cleanly (serve): else it
    # would die between the bind and the rename and leave its temporary socket and lock behind
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        serve(path, min(max(persist, 1.0), PERSIST_FOREVER_S))
    finally:
        os._exit(0)
