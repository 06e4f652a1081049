"""SSH hop: Fabric connections (shared per physical host), host keys verified, raw exec channels.

- One Fabric ``Connection`` per endpoint, shared by every target on that host (containers
  included) with at most ``MAX_CHANNELS`` exec channels in flight (sshd's MaxSessions is 10).
- Jump hosts: the jump's own pooled connection carries a ``direct-tcpip`` channel that becomes
  the inner connection's socket, so every target behind one jump shares its transport.
- Host keys: ssh_config's UserKnownHostsFile/GlobalKnownHostsFile (hashed entries too) are the
  only trusted source.  Fabric's default ``AutoAddPolicy`` is replaced before connecting.
- The command line is ``shlex.join`` of an argv whose every token is from the safe alphabet
  (the bootstrap constant aside), checked here, right before sending.
"""

import os
import select
import shlex
import socket
import threading
import time
from typing import Dict, Optional, Sequence

import fabric
import paramiko

from ..bundle import BOOT
from ..topology import is_safe_token
from .base import ProcessOutput, first_line, record_command
from .knownhosts import HostKeyRefused, trust_known_hosts
from .sshconfig import Endpoint

MAX_CHANNELS = 8
# New connections opened through one jump host at a time: sshd's default MaxStartups 10:30:100
# starts dropping unauthenticated connections past 10.
MAX_STARTUPS_PER_JUMP = 8



class TransportError(Exception):
    """A connection-level failure, already classified by layer."""

    def __init__(self, layer: str, message: str, stderr: Optional[str] = None):
        super().__init__(message)
        self.layer = layer
        self.message = message
        self.stderr = stderr


class UnsafeCommand(AssertionError):
    pass


def join_checked(argv: Sequence[str]) -> str:
    """The remote command line; refuses any token a remote shell could interpret."""
    for token in argv:
        if token != BOOT and not is_safe_token(token):
            raise UnsafeCommand(f"refusing to send token {token!r}: outside the safe alphabet")
    return shlex.join(argv)


class _QuickAckSocket:
    """A socket that re-arms TCP_QUICKACK before every read (Linux resets it after each ACK).
    NOTE: sshd does not set TCP_NODELAY for non-interactive sessions, so its small replies
    wait for our ACK; a delayed ACK costs ~40 ms at the first channel open."""

    def __init__(self, sock: socket.socket):
        self._sock = sock

    def recv(self, n: int) -> bytes:
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass
        return self._sock.recv(n)

    def __getattr__(self, name):
        return getattr(self._sock, name)


class PooledConnection:
    def __init__(self, endpoint: Endpoint, connection: fabric.Connection):
        self.endpoint = endpoint
        self.connection = connection
        self.slots = threading.BoundedSemaphore(MAX_CHANNELS)

    @property
    def transport(self) -> paramiko.Transport:
        return self.connection.client.get_transport()

    @property
    def alive(self) -> bool:
        t = self.transport
        return t is not None and t.is_active()


class SshPool:
    """Opened connections by endpoint key; each opened once even under concurrent use."""

    def __init__(self):
        self._conns: Dict[tuple, PooledConnection] = {}
        self._locks: Dict[tuple, threading.Lock] = {}
        self._guard = threading.Lock()
        self._jump_slots: Dict[tuple, threading.BoundedSemaphore] = {}
        self.opened = 0   # connections made (tests and the bench count them)

    def _lock_for(self, key) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    def get(self, ep: Endpoint) -> PooledConnection:
        with self._lock_for(ep.key):
            pooled = self._conns.get(ep.key)
            if pooled and pooled.alive:
                return pooled
            pooled = self._open(ep)
            self._conns[ep.key] = pooled
            return pooled

    def discard(self, ep: Endpoint) -> None:
        with self._guard:
            pooled = self._conns.pop(ep.key, None)
        if pooled:
            pooled.connection.close()

    def close(self) -> None:
        with self._guard:
            conns, self._conns = list(self._conns.values()), {}
        for pooled in conns:
            try:
                pooled.connection.close()
            except Exception:
                pass

    def _socket(self, ep: Endpoint):
        if ep.jump is not None:
            try:
                jump = self.get(ep.jump)
            except TransportError as exc:
                raise TransportError(exc.layer, f"jump host {ep.jump.label}: {exc.message}", exc.stderr)
            try:
                return jump.transport.open_channel("direct-tcpip", (ep.hostname, ep.port), ("", 0),
                                                   timeout=ep.connect_timeout)
            except (paramiko.ChannelException, paramiko.SSHException, OSError, EOFError) as exc:
                raise TransportError("unreachable", f"jump host {ep.jump.label} could not reach "
                                     f"{ep.hostname}:{ep.port}: {exc or type(exc).__name__}")
        if ep.proxy_command:
            return paramiko.ProxyCommand(ep.proxy_command)
        try:
            sock = socket.create_connection((ep.hostname, ep.port), timeout=ep.connect_timeout)
        except socket.gaierror as exc:
            raise TransportError("unreachable", f"cannot resolve {ep.hostname}: {exc.strerror}")
        except socket.timeout:
            raise TransportError("unreachable", f"connect to {ep.hostname}:{ep.port} timed out "
                                 f"after {ep.connect_timeout:g} s")
        except OSError as exc:
            raise TransportError("unreachable", f"connect to {ep.hostname}:{ep.port}: "
                                 f"{exc.strerror or exc}")
        # NOTE: without TCP_NODELAY every small write waits for the peer's delayed ACK (~40 ms).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _QuickAckSocket(sock) if hasattr(socket, "TCP_QUICKACK") else sock

    def _slots_through(self, jump: Endpoint) -> threading.BoundedSemaphore:
        with self._guard:
            return self._jump_slots.setdefault(jump.key, threading.BoundedSemaphore(MAX_STARTUPS_PER_JUMP))

    def _open(self, ep: Endpoint) -> PooledConnection:
        if ep.jump is None:
            return self._open_now(ep)
        with self._slots_through(ep.jump):
            return self._open_now(ep)

    def _open_now(self, ep: Endpoint) -> PooledConnection:
        sock = self._socket(ep)
        connect_kwargs = {"sock": sock, "look_for_keys": False,
                          "allow_agent": bool(os.environ.get("SSH_AUTH_SOCK")),
                          "banner_timeout": ep.connect_timeout, "auth_timeout": ep.connect_timeout}
        if ep.identity_files:
            connect_kwargs["key_filename"] = list(ep.identity_files)
        # An empty SSHConfig: ssh_config was already applied through `ssh -G`.
        config = fabric.Config(ssh_config=paramiko.SSHConfig())
        conn = fabric.Connection(host=ep.hostname, user=ep.user, port=ep.port, config=config,
                                 connect_timeout=ep.connect_timeout, connect_kwargs=connect_kwargs)
        trust_known_hosts(conn, ep)
        where = f"{ep.user}@{ep.known_hosts_name}"
        try:
            conn.open()
        except HostKeyRefused as exc:
            raise TransportError("hostkey", str(exc))
        except paramiko.AuthenticationException as exc:
            tried = ", ".join(ep.identity_files) or "no identity files"
            raise TransportError("auth", f"authentication refused for {where} ({exc}; tried {tried})")
        except (socket.timeout, TimeoutError):
            raise TransportError("unreachable", f"{where}: no SSH answer within {ep.connect_timeout:g} s")
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError("unreachable", f"{where}: {exc or type(exc).__name__}")
        transport = conn.client.get_transport()
        transport.set_keepalive(30)
        self.opened += 1
        return PooledConnection(ep, conn)


class SshTransport:
    kind = "ssh"

    def __init__(self, endpoint: Endpoint, pool: SshPool):
        self.endpoint = endpoint
        self.pool = pool

    def describe(self) -> str:
        via = []
        jump = self.endpoint.jump
        while jump is not None:
            via.append(jump.label)
            jump = jump.jump
        return self.endpoint.describe() + (f" (via {', '.join(reversed(via))})" if via else "")

    def run(self, argv: Sequence[str], payload: bytes, deadline: float, *,
            close_stdin: bool = False) -> ProcessOutput:
        """Run argv with ``payload`` on its stdin, kept open until the command ends (its EOF
        tells the runtime the client went away) unless ``close_stdin``."""
        command = join_checked(argv)
        pooled = self.pool.get(self.endpoint)
        with pooled.slots:
            try:
                chan = pooled.transport.open_session(timeout=self.endpoint.connect_timeout)
                record_command("ssh", command)
                chan.exec_command(command)
                chan.sendall(payload)
                if close_stdin:
                    chan.shutdown_write()
            except (paramiko.SSHException, EOFError, OSError) as exc:
                self.pool.discard(self.endpoint)
                raise TransportError("unreachable", f"{self.endpoint.describe()}: cannot start the "
                                     f"command: {exc or type(exc).__name__}")
            try:
                return _collect(chan, deadline)
            finally:
                chan.close()
                if not pooled.alive:
                    self.pool.discard(self.endpoint)

    def put(self, data: bytes, remote_path: str) -> None:
        """Write ``data`` to ``remote_path`` (mode 0600) over SFTP; where the host has no SFTP
        subsystem, through an exec channel's stdin into ``install -m 600 /dev/stdin PATH``
        (the path is ours and checked like every token; the data never touches a command line)."""
        pooled = self.pool.get(self.endpoint)
        with pooled.slots:
            try:
                sftp = pooled.connection.client.open_sftp()
            except paramiko.SSHException:   # "subsystem request failed": SFTP is disabled there
                sftp = None
            except (OSError, EOFError) as exc:
                raise TransportError("upload", f"{self.endpoint.describe()}: sftp put "
                                     f"{remote_path}: {exc or type(exc).__name__}")
            if sftp is not None:
                try:
                    with sftp.open(remote_path, "wx") as f:
                        sftp.chmod(remote_path, 0o600)
                        f.write(data)
                    return
                except (paramiko.SSHException, OSError, EOFError) as exc:
                    raise TransportError("upload", f"{self.endpoint.describe()}: sftp put "
                                         f"{remote_path}: {exc or type(exc).__name__}")
                finally:
                    sftp.close()
        self._put_through_exec(data, remote_path)

    def _put_through_exec(self, data: bytes, remote_path: str) -> None:
        argv = ["install", "-m", "600", "-T", "/dev/stdin", remote_path]
        failed = f"{self.endpoint.describe()}: put {remote_path} without SFTP"
        try:
            out = self.run(argv, data, time.monotonic() + 60, close_stdin=True)
        except TransportError as exc:
            raise TransportError("upload", f"{failed}: {exc.message}", exc.stderr) from None
        if out.exit_code != 0:
            stderr = out.stderr.decode("utf-8", "replace")
            raise TransportError("upload", f"{failed}: {first_line(stderr) or out.lost or out.exit_code}",
                                 stderr)

    def close(self):
        pass


def _collect(chan: paramiko.Channel, deadline: float) -> ProcessOutput:
    """Read stdout/stderr until the command ends, the link dies, or the deadline passes.
    stdin stays open throughout: its EOF would tell the runtime to stop the diagnostic."""
    out, err = bytearray(), bytearray()
    while True:
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        if chan.exit_status_ready() and chan.eof_received:
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            return ProcessOutput(bytes(out), bytes(err), chan.recv_exit_status())
        if chan.eof_received:
            # stdout is done; the exit status follows in a moment (no busy wait for it)
            chan.status_event.wait(max(0.0, min(deadline - time.monotonic(), 1.0)))
            if chan.exit_status_ready():
                continue
        if chan.closed or not chan.get_transport().is_active():
            return ProcessOutput(bytes(out), bytes(err), None, lost="the SSH connection was closed")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return ProcessOutput(bytes(out), bytes(err), None, timed_out=True)
        select.select([chan], [], [], min(remaining, 1.0))
