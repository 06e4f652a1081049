"""SSH hop: Fabric connections (shared per physical host), host keys verified, raw exec channels.

- One Fabric ``Connection`` per endpoint, shared by every target on that host (containers
  included) with at most ``MAX_CHANNELS`` exec channels in flight (sshd's MaxSessions is 10).
- Jump hosts: the jump's own pooled connection carries a ``direct-tcpip`` channel that becomes
  the inner connection's socket, so every target behind one jump shares its transport.
- Lifetimes: a connection closes when the last target planned on it is done; the connections
  holding a socket are bounded by the descriptor limit (``SshPool``).
- Every stream read is bounded (head and tail) and every write has the run's deadline.
- Host keys: ssh_config's UserKnownHostsFile/GlobalKnownHostsFile (hashed entries too) are the
  only trusted source.  Fabric's default ``AutoAddPolicy`` is replaced before connecting.
- Settings come from hosts.yaml and ssh_config only: a connection's Fabric config reads no
  Fabric config file (``fabric_config``).
- The command line is ``shlex.join`` of an argv whose every token is from the safe alphabet
  (the bootstrap constant aside), checked here, right before sending.
"""

import logging
import os
import shlex
import socket
import threading
import time
from typing import TYPE_CHECKING, Callable, Dict, Optional, Sequence

if TYPE_CHECKING:   # imported for real where a connection is opened (see _open_now)
    import fabric
    import paramiko

from ..core import wire
from ..core.lean_imports import import_paramiko
from . import held
from ..inventory.topology import is_safe_token
from .base import (OnStdout, ProcessOutput, StreamCapture, Transport, TransportError,
                   concurrent_runs_allowed, descriptors_error, first_line, out_of_descriptors,
                   record_command)
from .sshconfig import Endpoint

# NOTE: paramiko logs a failed handshake with its traceback at ERROR; with no handler
# configured, Python's last-resort handler prints that on stderr beside mldiag's own row.
# A NullHandler keeps it off the terminal (an application that configures logging still sees it).
if not logging.getLogger("paramiko").handlers:
    logging.getLogger("paramiko").addHandler(logging.NullHandler())

MAX_CHANNELS = 8
# New connections opened through one jump host at a time: sshd's default MaxStartups 10:30:100
# starts dropping unauthenticated connections past 10.
MAX_STARTUPS_PER_JUMP = 8



class UnsafeCommand(AssertionError):
    pass


def fabric_config() -> "fabric.Config":
    """A connection's Fabric config: Fabric's defaults and an empty SSHConfig (ssh_config was
    already applied through ``ssh -G``), built lazy, so that no file is read.

    Not lazy, Fabric reads ``/etc/fabric.yaml`` and ``~/.fabric.yaml`` (also .yml, .json,
    .py), and ``Connection.open`` would take from them a ``gateway`` (a ProxyCommand that
    replaces the socket mldiag opened, past its own jump hosts), more ``key_filename`` entries
    and an ``authentication.strategy_class``: settings mldiag says it never reads.
    NOTE: one per connection, never shared: ``Connection.__init__`` writes ``inline_ssh_env``
    into its config, and every write re-merges the config, emptying it meanwhile for any other
    thread reading it (Fabric 3.2)."""
    paramiko = import_paramiko()
    import fabric
    return fabric.Config(ssh_config=paramiko.SSHConfig(), lazy=True)


def join_checked(argv: Sequence[str]) -> str:
    """The remote command line; refuses any token a remote shell could interpret."""
    for token in argv:
        if token != wire.BOOT and not is_safe_token(token):
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
    def __init__(self, endpoint: Endpoint, connection: "fabric.Connection",
                 via: Optional["PooledConnection"] = None):
        self.endpoint = endpoint
        self.connection = connection
        self.slots = threading.BoundedSemaphore(MAX_CHANNELS)
        self.via = via            # the jump host's connection carrying this one's socket
        self.users = 0            # runs and puts using it now
        self.dependents = 0       # open connections tunnelled through it
        self.last_used = time.monotonic()
        self.forgotten = False    # dropped from the pool's books (closed or about to be)

    @property
    def transport(self) -> "paramiko.Transport":
        return self.connection.client.get_transport()

    @property
    def alive(self) -> bool:
        t = self.transport
        return t is not None and t.is_active()

    @property
    def idle(self) -> bool:
        return self.users == 0 and self.dependents == 0


def _endpoint_chain(ep: Optional[Endpoint]):
    while ep is not None:
        yield ep
        ep = ep.jump


def _close_quietly(pooled: PooledConnection) -> None:
    try:
        pooled.connection.close()
    except Exception:
        pass


class SshPool:
    """Opened connections by endpoint key; each opened once even under concurrent use.

    Lifetimes (150 hosts held 150 sockets to the end of the run):
    ``plan(ep)`` says one more target will use ``ep`` (and its jump hosts), ``finished(ep)``
    that it is done; a connection whose planned targets are all done is closed at once.
    Unplanned use (``put``, tests) keeps a connection until ``close()``.  Direct connections,
    the ones holding a socket, are at most ``max_open``: past it the least recently used idle
    connection is closed (reopened if wanted later), or the opener waits for one to go idle."""

    def __init__(self, max_open: Optional[int] = None):
        self._conns: Dict[tuple, PooledConnection] = {}
        self._locks: Dict[tuple, threading.Lock] = {}
        self._guard = threading.Lock()
        self._changed = threading.Condition(self._guard)
        self._jump_slots: Dict[tuple, threading.BoundedSemaphore] = {}
        self._planned: Dict[tuple, int] = {}
        self._direct_open = 0
        self.max_open = max_open or concurrent_runs_allowed()
        self.opened = 0      # connections made (tests and the bench count them)
        self.peak_open = 0   # most direct connections open at once
        # Runs on endpoints with a persist may go through the user's connection holder
        # (held.py); the runner says when (a fan-out small enough for one holder process).
        self.hold = False
        self._holder: Optional[held.Holder] = None
        self._holder_looked = False

    def holder(self) -> Optional["held.Holder"]:
        """The user's connection holder (looked up once: its private directory made and
        checked), or None when this pool does not hold or the directory is not private."""
        with self._guard:
            if self.hold and not self._holder_looked:
                self._holder_looked = True
                self._holder = held.Holder.for_user()
            return self._holder if self.hold else None

    def _lock_for(self, key) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())

    # -- lifetimes

    def plan(self, ep: Endpoint) -> None:
        with self._guard:
            for e in _endpoint_chain(ep):
                self._planned[e.key] = self._planned.get(e.key, 0) + 1

    def finished(self, ep: Endpoint) -> None:
        """One planned target of ``ep`` is done: close what no planned target needs any more
        (the host first, then its jump hosts, which it kept busy until then)."""
        for e in _endpoint_chain(ep):
            with self._guard:
                left = self._planned.get(e.key, 0) - 1
                self._planned[e.key] = max(0, left)
                pooled = self._conns.get(e.key)
                done = left <= 0 and pooled is not None and pooled.idle
                if done:
                    self._forget(pooled)
            if done:
                _close_quietly(pooled)

    def acquire(self, ep: Endpoint) -> PooledConnection:
        """The shared connection to ``ep``, opened if needed, in use until ``release``."""
        with self._lock_for(ep.key):
            with self._guard:
                pooled = self._conns.get(ep.key)
                if pooled is not None and pooled.alive:
                    pooled.users += 1
                    pooled.last_used = time.monotonic()
                    return pooled
                dead = pooled if pooled is not None and pooled.idle else None
                if pooled is not None:
                    self._forget(pooled)
            if dead is not None:
                _close_quietly(dead)
            pooled = self._open(ep)
            with self._guard:
                self._conns[ep.key] = pooled
                pooled.users += 1
            return pooled

    def release(self, pooled: PooledConnection) -> None:
        with self._guard:
            pooled.users -= 1
            pooled.last_used = time.monotonic()
            key = pooled.endpoint.key
            close = pooled.idle and (pooled.forgotten or self._planned.get(key) == 0
                                     or not pooled.alive)
            if close:
                self._forget(pooled)
            via = pooled.via if close else None
            self._changed.notify_all()
        if close:
            _close_quietly(pooled)
            if via is not None:
                self._after_dependent_closed(via)

    def _after_dependent_closed(self, via: PooledConnection) -> None:
        with self._guard:
            close = via.idle and (via.forgotten or self._planned.get(via.endpoint.key) == 0)
            if close:
                self._forget(via)
        if close:
            _close_quietly(via)

    @property
    def open_count(self) -> int:
        with self._guard:
            return len(self._conns)

    def expire(self, stale: Callable[[PooledConnection], bool]) -> None:
        """Close every idle connection ``stale`` says is done with (the connection holder's
        ControlPersist: each closes after its time unused); the tunnelled ones first, so the
        jump host's becomes idle in the same sweep."""
        for tunnelled in (True, False):
            with self._guard:
                done = [p for p in self._conns.values()
                        if p.idle and (p.via is not None) == tunnelled and stale(p)]
                for pooled in done:
                    self._forget(pooled)
            for pooled in done:
                _close_quietly(pooled)

    def get(self, ep: Endpoint) -> PooledConnection:
        """The connection, opened if needed, not marked in use (outside the accounting)."""
        pooled = self.acquire(ep)
        with self._guard:
            pooled.users -= 1
            self._changed.notify_all()
        return pooled

    def discard(self, ep: Endpoint) -> None:
        with self._guard:
            pooled = self._conns.get(ep.key)
            if pooled is not None:
                self._forget(pooled)
        if pooled is not None:
            _close_quietly(pooled)

    def close(self) -> None:
        with self._guard:
            conns = list(self._conns.values())
            for pooled in conns:
                self._forget(pooled)
            holder = self._holder
        if holder is not None:
            holder.close()      # the runs in flight through the holder end too
        for pooled in sorted(conns, key=lambda p: p.via is None):   # tunnelled ones first
            _close_quietly(pooled)

    def _forget(self, pooled: PooledConnection) -> None:
        """Drop ``pooled`` from the books (caller holds ``_guard``, and closes it unlocked)."""
        if self._conns.get(pooled.endpoint.key) is pooled:
            del self._conns[pooled.endpoint.key]
        if not pooled.forgotten:
            pooled.forgotten = True
            if pooled.via is not None:
                pooled.via.dependents -= 1
            else:
                self._direct_open -= 1
            self._changed.notify_all()

    # -- opening

    def _take_socket_slot(self) -> None:
        """Wait until one more direct connection fits under ``max_open``, closing the least
        recently used idle connection where that makes room."""
        while True:
            evict = None
            with self._guard:
                if self._direct_open < self.max_open:
                    self._direct_open += 1
                    self.peak_open = max(self.peak_open, self._direct_open)
                    return
                idle = [p for p in self._conns.values() if p.idle]
                if idle:   # a tunnelled one may be all that keeps its jump host busy
                    evict = min(idle, key=lambda p: p.last_used)
                    self._forget(evict)
                else:
                    self._changed.wait(1.0)
            if evict is not None:
                _close_quietly(evict)

    def _give_back_socket_slot(self) -> None:
        with self._guard:
            self._direct_open -= 1
            self._changed.notify_all()

    def _socket(self, ep: Endpoint):
        # An ASCII name goes to getaddrinfo as bytes: as text, Python encodes it with the IDNA
        # codec, whose import (encodings.idna, stringprep, unicodedata) costs a run ~4 ms.
        host = ep.hostname.encode("ascii") if ep.hostname.isascii() else ep.hostname
        try:
            sock = socket.create_connection((host, ep.port), timeout=ep.connect_timeout)
        except socket.gaierror as exc:
            raise TransportError("unreachable", f"cannot resolve {ep.hostname}: {exc.strerror}")
        except socket.timeout:
            raise TransportError("unreachable", f"connect to {ep.hostname}:{ep.port} timed out "
                                 f"after {ep.connect_timeout:g} s")
        except OSError as exc:
            if out_of_descriptors(exc):
                raise descriptors_error(f"cannot open a connection to {ep.hostname}:{ep.port}")
            raise TransportError("unreachable", f"connect to {ep.hostname}:{ep.port}: "
                                 f"{exc.strerror or exc}")
        # NOTE: without TCP_NODELAY every small write waits for the peer's delayed ACK (~40 ms).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _QuickAckSocket(sock) if hasattr(socket, "TCP_QUICKACK") else sock

    def _tunnel(self, ep: Endpoint):
        """A direct-tcpip channel through the jump host's pooled connection, and that
        connection (in use until ``_open`` hands the use over to the new connection)."""
        paramiko = import_paramiko()
        try:
            jump = self.acquire(ep.jump)
        except TransportError as exc:
            raise TransportError(exc.layer, f"jump host {ep.jump.label}: {exc.message}", exc.stderr)
        try:
            chan = jump.transport.open_channel("direct-tcpip", (ep.hostname, ep.port), ("", 0),
                                               timeout=ep.connect_timeout)
        except (paramiko.ChannelException, paramiko.SSHException, OSError, EOFError) as exc:
            self.release(jump)
            raise TransportError("unreachable", f"jump host {ep.jump.label} could not reach "
                                 f"{ep.hostname}:{ep.port}: {exc or type(exc).__name__}")
        return chan, jump

    def _slots_through(self, jump: Endpoint) -> threading.BoundedSemaphore:
        with self._guard:
            return self._jump_slots.setdefault(jump.key, threading.BoundedSemaphore(MAX_STARTUPS_PER_JUMP))

    def _open(self, ep: Endpoint) -> PooledConnection:
        if ep.jump is not None:
            with self._slots_through(ep.jump):
                sock, jump = self._tunnel(ep)
                try:
                    return self._open_now(ep, sock, via=jump)
                except BaseException:
                    sock.close()
                    raise
                finally:
                    self.release(jump)   # a new connection through it counts as its dependent
        self._take_socket_slot()
        try:
            sock = self._proxy_command(ep) if ep.proxy_command else self._socket(ep)
            try:
                return self._open_now(ep, sock)
            except BaseException:
                sock.close()
                raise
        except BaseException:
            self._give_back_socket_slot()
            raise

    @staticmethod
    def _proxy_command(ep: Endpoint):
        paramiko = import_paramiko()
        try:
            return paramiko.ProxyCommand(ep.proxy_command)
        except OSError as exc:
            if out_of_descriptors(exc):
                raise descriptors_error(f"cannot start the ProxyCommand of {ep.label}")
            raise TransportError("unreachable", f"ProxyCommand of {ep.label}: {exc}")

    def _open_now(self, ep: Endpoint, sock, via: Optional[PooledConnection] = None) -> PooledConnection:
        connect_kwargs = {"sock": sock, "look_for_keys": False,
                          "allow_agent": bool(os.environ.get("SSH_AUTH_SOCK")),
                          "banner_timeout": ep.connect_timeout, "auth_timeout": ep.connect_timeout}
        if ep.identity_files:
            connect_kwargs["key_filename"] = list(ep.identity_files)
        # NOTE: imported here, not at the top: paramiko and Fabric cost a process more than
        # the rest of mldiag together (~80 ms here), and a run on this machine, `mldiag hosts`
        # or a run through the connection holder (transport/held.py) opens no SSH connection.
        paramiko = import_paramiko()
        import fabric

        from .knownhosts import HostKeyRefused, trust_known_hosts
        conn = fabric.Connection(host=ep.hostname, user=ep.user, port=ep.port,
                                 config=fabric_config(), connect_timeout=ep.connect_timeout,
                                 connect_kwargs=connect_kwargs)
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
            raise _open_failure(ep, where, exc, conn.client.get_transport()) from None
        transport = conn.client.get_transport()
        transport.set_keepalive(30)
        pooled = PooledConnection(ep, conn, via)
        with self._guard:
            self.opened += 1
            if via is not None:
                via.dependents += 1
        return pooled


NO_KEY_HINT = ("give hosts.yaml an identity_file, load a key into ssh-agent (ssh-add), or "
               "install one on the host (ssh-copy-id)")


def _open_failure(ep: Endpoint, where: str, exc: BaseException, transport) -> TransportError:
    """The layer that failed, named from what paramiko raised and how far it got.

    paramiko says "No authentication methods available" when it had no key to offer (that is
    ``auth``, not a network failure), and "No existing session" or "Error reading SSH protocol
    banner" when the port answered but no SSH banner came (a web server, a wrong port)."""
    text = str(exc) or type(exc).__name__
    if "No authentication methods available" in text:
        return TransportError("auth", f"no key to offer {where}: no identity file exists and no "
                              f"ssh-agent is running ({NO_KEY_HINT})")
    if transport is not None and not getattr(transport, "remote_version", "x"):
        if isinstance(exc, EOFError) or "reset" in text.lower() or "EOF" in text:
            return TransportError("unreachable", f"{ep.hostname}:{ep.port} closed the connection "
                                  "before sending an SSH banner (sshd refusing new connections "
                                  "(MaxStartups), or not an SSH server)")
        return TransportError("unreachable", f"{ep.hostname}:{ep.port} answered but is not an SSH "
                              f"server (no banner in {ep.connect_timeout:g} s)")
    return TransportError("unreachable", f"{where}: {text}")


class SshTransport(Transport):
    """Commands on one endpoint through the pool's shared connection (opened on first use)."""

    kind = "ssh"

    def __init__(self, endpoint: Endpoint, pool: SshPool, shown: Optional[str] = None):
        self.endpoint = endpoint
        self.pool = pool
        self.shown = shown     # the hop as hosts.yaml writes it (``ssh alice@dgx01.lab``)

    def describe(self) -> str:
        """``ssh [user@]host[:port]``, then every jump the connection goes through, the ones
        ssh_config's ProxyJump adds included."""
        via = []
        jump = self.endpoint.jump
        while jump is not None:
            via.append(jump.label)
            jump = jump.jump
        first = self.shown or self.endpoint.describe()
        return first + (f" (via {', '.join(reversed(via))})" if via else "")

    def run(self, argv: Sequence[str], payload: bytes, deadline: float, *,
            close_stdin: bool = False, on_stdout: OnStdout = None,
            stop: Optional[threading.Event] = None) -> ProcessOutput:
        """Run argv with ``payload`` on its stdin, kept open until the command ends (its EOF
        tells the runtime the client went away) unless ``close_stdin``.  Nothing here waits
        past ``deadline``, the write of a payload the command never reads included.
        ``stop`` (the connection holder's): once set, the channel is closed within a second."""
        command = join_checked(argv)
        # NOTE: the connection is asked for before paramiko is imported (a first connection
        # imports it after its TCP connect, in _open_now): sshd accepts, starts its
        # per-connection process and sends its banner while this process imports (~40 ms).
        pooled = self.pool.acquire(self.endpoint)
        paramiko = import_paramiko()
        try:
            with pooled.slots:
                try:
                    chan = pooled.transport.open_session(timeout=self.endpoint.connect_timeout)
                    record_command("ssh", command)
                    chan.exec_command(command)
                except (paramiko.SSHException, EOFError, OSError) as exc:
                    self.pool.discard(self.endpoint)
                    if out_of_descriptors(exc):
                        raise descriptors_error(f"cannot start the command on {self.endpoint.describe()}")
                    raise TransportError("unreachable", f"{self.endpoint.describe()}: cannot start the "
                                         f"command: {exc or type(exc).__name__}")
                try:
                    return _exchange(chan, payload, deadline, close_stdin, on_stdout, stop)
                finally:
                    chan.close()
                    if not pooled.alive:
                        self.pool.discard(self.endpoint)
        finally:
            self.pool.release(pooled)

    def put(self, data: bytes, path: str) -> None:
        """Write ``data`` to ``path`` (mode 0600) over SFTP; where the host has no SFTP
        subsystem, through an exec channel's stdin into ``install -m 600 /dev/stdin PATH``
        (the path is ours and checked like every token; the data never touches a command line)."""
        pooled = self.pool.acquire(self.endpoint)   # before the import, as in run()
        paramiko = import_paramiko()
        try:
            with pooled.slots:
                try:
                    sftp = pooled.connection.client.open_sftp()
                except paramiko.SSHException:   # "subsystem request failed": SFTP is disabled there
                    sftp = None
                except (OSError, EOFError) as exc:
                    raise TransportError("upload", f"{self.endpoint.describe()}: sftp put "
                                         f"{path}: {exc or type(exc).__name__}")
                if sftp is not None:
                    try:
                        with sftp.open(path, "wx") as f:
                            sftp.chmod(path, 0o600)
                            f.write(data)
                        return
                    except (paramiko.SSHException, OSError, EOFError) as exc:
                        raise TransportError("upload", f"{self.endpoint.describe()}: sftp put "
                                             f"{path}: {exc or type(exc).__name__}")
                    finally:
                        sftp.close()
        finally:
            self.pool.release(pooled)
        self._put_through_exec(data, path)

    def _put_through_exec(self, data: bytes, path: str) -> None:
        argv = ["install", "-m", "600", "-T", "/dev/stdin", path]
        failed = f"{self.endpoint.describe()}: put {path} without SFTP"
        try:
            out = self.run(argv, data, time.monotonic() + 60, close_stdin=True)
        except TransportError as exc:
            raise TransportError("upload", f"{failed}: {exc.message}", exc.stderr) from None
        if out.exit_code != 0:
            stderr = out.stderr.decode("utf-8", "replace")
            raise TransportError("upload", f"{failed}: {first_line(stderr) or out.lost or out.exit_code}",
                                 stderr)

    def close(self) -> None:
        pass     # the connection is the pool's: it closes when its last planned target is done


class _Streams:
    """What came back on a channel, bounded per stream (wire.STDOUT_*, wire.STDERR_*)."""

    def __init__(self, on_stdout: OnStdout = None):
        self.out = StreamCapture(wire.STDOUT_HEAD, wire.STDOUT_TAIL)
        self.err = StreamCapture(wire.STDERR_HEAD, wire.STDERR_TAIL)
        self.on_stdout = on_stdout

    def drain(self, chan: "paramiko.Channel", rounds: int = 64) -> None:
        """What has arrived, up to ``rounds`` reads per stream: a target that never stops
        writing still lets the caller look at its deadline."""
        for _ in range(rounds):
            if not chan.recv_ready():
                break
            chunk = chan.recv(65536)
            self.out.feed(chunk)
            if self.on_stdout is not None and chunk:
                self.on_stdout(chunk)
        for _ in range(rounds):
            if not chan.recv_stderr_ready():
                break
            self.err.feed(chan.recv_stderr(65536))

    def output(self, code: Optional[int] = None, **kw) -> ProcessOutput:
        return ProcessOutput(self.out.value(), self.err.value(), code,
                             dropped=self.out.dropped + self.err.dropped, **kw)


# One send waits at most this long for the peer's window, so both streams keep being read
# while a command is slow to take its stdin (it may be writing first).
_SEND_WAIT_S = 0.2


def _send(chan: "paramiko.Channel", payload: bytes, deadline: float, streams: _Streams,
          stop: Optional[threading.Event] = None) -> bool:
    """Write ``payload`` before ``deadline`` (False if it passed first).  paramiko's
    ``sendall`` blocks for as long as the peer's window stays shut: a command that never
    reads its stdin held a large ``--put`` far past ``--timeout``."""
    offset = 0
    try:
        while offset < len(payload):
            streams.drain(chan)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (stop is not None and stop.is_set()):
                return False
            chan.settimeout(min(remaining, _SEND_WAIT_S))
            try:
                sent = chan.send(payload[offset:offset + 32768])
            except socket.timeout:
                continue
            if sent == 0:       # the channel reached EOF: nobody will read the rest
                break
            offset += sent
    except (OSError, EOFError):
        pass    # the command ended without reading it all: its exit status tells the rest
    finally:
        chan.settimeout(None)
    return True


def _exchange(chan: "paramiko.Channel", payload: bytes, deadline: float,
              close_stdin: bool, on_stdout: OnStdout = None,
              stop: Optional[threading.Event] = None) -> ProcessOutput:
    streams = _Streams(on_stdout)
    if not _send(chan, payload, deadline, streams, stop):
        return streams.output(timed_out=stop is None or not stop.is_set(), lost=_gone(stop))
    if close_stdin:
        try:
            chan.shutdown_write()
        except (OSError, EOFError):
            pass
    return _collect(chan, deadline, streams, stop)


def _gone(stop: Optional[threading.Event]) -> Optional[str]:
    return "mldiag's caller went away" if stop is not None and stop.is_set() else None


def _collect(chan: "paramiko.Channel", deadline: float, streams: _Streams,
             stop: Optional[threading.Event] = None) -> ProcessOutput:
    """Read stdout/stderr until the command ends, the link dies, or the deadline passes.
    stdin stays open throughout: its EOF would tell the runtime to stop the diagnostic."""
    # NOTE: a threading.Event that paramiko sets when data or EOF arrives -- not select() on
    # the channel. Channel.fileno() makes an OS pipe, and paramiko's transport thread can write
    # its wake-up byte after Channel.close() has released the pipe's descriptors (PosixPipe's
    # close/set race, paramiko#692): with descriptors reused at once (150 targets under
    # `ulimit -n 100`), that byte landed in another connection's SSH stream, which then failed
    # with "Invalid packet blocking".
    ready = threading.Event()
    chan.in_buffer.set_event(ready)
    chan.in_stderr_buffer.set_event(ready)
    while True:
        streams.drain(chan)
        if chan.exit_status_ready() and chan.eof_received and not (
                chan.recv_ready() or chan.recv_stderr_ready()):
            return streams.output(chan.recv_exit_status())
        if chan.eof_received:
            # stdout is done; the exit status follows in a moment (no busy wait for it)
            chan.status_event.wait(max(0.0, min(deadline - time.monotonic(), 1.0)))
            if chan.exit_status_ready():
                continue
        if chan.closed or not chan.get_transport().is_active():
            return streams.output(lost="the SSH connection was closed")
        if _gone(stop):
            return streams.output(lost=_gone(stop))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return streams.output(timed_out=True)
        # both buffers share the event and a read that empties one clears it: clear, look, wait
        ready.clear()
        if chan.recv_ready() or chan.recv_stderr_ready() or chan.eof_received:
            continue
        ready.wait(min(remaining, 1.0))
