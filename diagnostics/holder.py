"""The connection holder: one background process per user that keeps SSH connections open
between mldiag calls (``ControlPersist``; the client side and the reasons are in hops/held.py).

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
from typing import Dict

from .hops import held
from .hops.base import TransportError
from .hops.ssh import SshPool, SshTransport
from .hops.sshconfig import PERSIST_FOREVER_S, Endpoint

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


def _listen(path: str):
    """The lock that makes this the only holder at ``path``, and its listening socket; None
    when another holder has it or the directory is not private."""
    directory = os.path.dirname(path)
    if not held._private(directory, os.geteuid()):
        return None
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        return None
    try:
        os.unlink(path)     # a holder that died left it; the lock says none is using it
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    os.chmod(path, 0o600)
    server.listen(64)
    server.settimeout(SWEEP_S)
    return lock, server


def serve(path: str, persist: float) -> None:
    listening = _listen(path)
    if listening is None:
        return
    lock, server = listening
    state = HolderState(persist)
    signal.signal(signal.SIGTERM, lambda *_: state.quit.set())
    me = os.geteuid()
    try:
        while not state.sweep():
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
        try:
            os.unlink(path)
        except OSError:
            pass
        server.close()
        state.close()
        os.close(lock)


def main(path: str, persist: float) -> None:
    """The holder's process (started by ``held.start_holder`` in its own session)."""
    os.umask(0o077)
    os.chdir("/")
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        serve(path, min(max(persist, 1.0), PERSIST_FOREVER_S))
    finally:
        os._exit(0)
