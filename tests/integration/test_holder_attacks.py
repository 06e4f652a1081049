"""Another local user against the connection holder (hops/held.py, holder.py; issue 29 section
4), on the real lab: the owner is this test's user, the attacker ``nobody`` (``runuser``).
Whatever the attacker does, it gets nothing (no command run, no output, no quit obeyed), the
owner's calls neither hang nor talk to the attacker's socket (they go direct, or through the
owner's own holder), and the holder removes nothing but its own socket.

Where the attacker could not get a socket to the owner's path by itself (the directory is the
owner's, 0700), the test puts it there as root: that is what a hole elsewhere would give it, and
what the client's and holder's own checks (``SO_PEERCRED``, the directory's owner and mode) are
for."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from diagnostics.inventory import topology
from diagnostics.transport import held, sshconfig
from tests.integration.test_holder import quit_holder, run, runtime_dir, sockets, wait_for  # noqa: F401
from tests.programs import ok

SYSTEM_PY = "/usr/bin/python3"   # the attacker's interpreter: readable by nobody
NOBODY = 65534

# Runs as nobody: a listener at argv[1]. "accept": takes every connection and logs how many
# bytes it was sent (a line each) to argv[2]; "full": fills its own backlog and never accepts,
# so a connect() waiting for room never returns.
LISTENER = r"""
import os, socket, sys, threading
path, log, mode = sys.argv[1:4]
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
os.chmod(path, 0o777)
server.listen(0 if mode == "full" else 16)
if mode == "full":
    fillers = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            break
        fillers.append(s)
print("listening", flush=True)

def take(conn):
    conn.settimeout(10)
    got = b""
    try:
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    with open(log, "a") as f:
        f.write(f"{len(got)}\n")

while mode == "accept":
    conn, _ = server.accept()
    threading.Thread(target=take, args=(conn,), daemon=True).start()
if mode == "full":
    threading.Event().wait()
"""

# Runs as nobody: connects to argv[1], sends the frame in the file argv[2], and prints how many
# bytes came back before the socket closed (or why it could not connect).
CALLER = r"""
import socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(20)
try:
    sock.connect(sys.argv[1])
except OSError as e:
    sys.exit(print("refused", type(e).__name__))
try:
    sock.sendall(open(sys.argv[2], "rb").read())
except OSError:
    pass                # closed on us before the whole frame went: read what came back anyway
got = b""
try:
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
except OSError:
    pass
print("received", len(got))
"""


@pytest.fixture
def public_dir():
    """A directory of nobody's, that nobody and root can reach (the attacker's files)."""
    d = Path(tempfile.mkdtemp(prefix="mldiag-atk-", dir="/tmp"))
    os.chmod(d, 0o755)
    os.chown(d, NOBODY, NOBODY)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def as_nobody(*argv) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "nobody", "--", SYSTEM_PY, *map(str, argv)],
                          capture_output=True, text=True, timeout=60)


class Listener:
    """nobody's listener (LISTENER) bound in ``public_dir``: ``.path``, ``.taken()`` (the bytes
    each connection it took was sent)."""

    def __init__(self, public_dir: Path, mode: str):
        self.path = public_dir / f"evil-{uuid.uuid4().hex[:6]}.sock"
        self.log = public_dir / f"{self.path.name}.log"
        self.proc = subprocess.Popen(["runuser", "-u", "nobody", "--", SYSTEM_PY, "-c", LISTENER,
                                      str(self.path), str(self.log), mode],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = self.proc.stdout.readline()
        assert first == "listening\n", first + self.proc.stdout.read()
        assert os.lstat(self.path).st_uid == NOBODY

    def taken(self) -> list:
        time.sleep(0.3)          # a connection closed just now: its line written
        return [int(n) for n in self.log.read_text().split()] if self.log.exists() else []

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def listener(public_dir):
    made = []

    def start(mode: str = "accept") -> Listener:
        made.append(Listener(public_dir, mode))
        return made[-1]
    yield start
    for one in made:
        one.stop()


def owned_by(path) -> int:
    try:
        return os.lstat(path).st_uid
    except FileNotFoundError:
        return -1


def held_hosts(lab):
    return lab.hosts_yaml("defaults: {persist: 30, connect_timeout: 5}\nhosts:\n  main: {}\n")


def holder_path(lab, hosts, runtime_dir) -> str:  # noqa: F811
    """The owner's holder's socket, after one call started it."""
    ok(run(lab, hosts, runtime_dir, "ping", "-H", "main"))
    wait_for(lambda: len(sockets(runtime_dir)) == 1, 20, "the holder to listen")
    path, = sockets(runtime_dir)
    return path


def timed_ping(lab, hosts, runtime_dir):  # noqa: F811
    """(the row's status, seconds the call took, connections it opened to main's sshd)."""
    sshd = lab.servers["main"]
    before, started = sshd.connection_count(), time.monotonic()
    doc, = json.loads(ok(run(lab, hosts, runtime_dir, "ping", "-H", "main", "--json")))
    return doc["status"], time.monotonic() - started, sshd.connection_count() - before


@pytest.mark.parametrize("mode", ["accept", "full"])
def test_another_users_listener_at_the_holders_path_is_sent_nothing_and_replaced(
        lab, runtime_dir, listener, mode):  # noqa: F811
    """A stale socket's place taken by nobody's listener: one that accepts (the caller reads
    its uid and sends nothing), one whose backlog is full (a caller waiting for room would
    hang). The call goes direct at once, and the holder it starts takes the place back."""
    hosts = held_hosts(lab)
    path = holder_path(lab, hosts, runtime_dir)
    quit_holder(path)
    evil = listener(mode)
    os.rename(evil.path, path)
    status, took, opened = timed_ping(lab, hosts, runtime_dir)
    assert (status, opened) == ("ok", 1)                # direct
    assert took < 20, took
    assert set(evil.taken()) <= {0}                     # connected to, maybe; sent nothing
    wait_for(lambda: owned_by(path) == os.geteuid(), 20, "the owner's holder to listen")
    assert timed_ping(lab, hosts, runtime_dir)[::2] == ("ok", 1)   # the holder's connection
    assert timed_ping(lab, hosts, runtime_dir)[::2] == ("ok", 0)   # and the same one again


def test_another_user_reaching_the_holders_socket_gets_nothing_run(lab, runtime_dir, public_dir):  # noqa: F811
    """nobody cannot reach the socket (its directory is 0700). Given a way in anyway (a hard
    link in a directory it can read, the socket made 0666), its request to run a command and its
    quit are refused unread: no byte back, no command on the target, the holder still serving.
    The same request from the owner runs, so the request itself is a working one."""
    hosts = held_hosts(lab)
    path = holder_path(lab, hosts, runtime_dir)
    marker = Path(f"/tmp/mldiag-holder-attack-{uuid.uuid4().hex[:8]}")
    endpoint = sshconfig.resolve(topology.SshHost("main", connect_timeout=5.0, persist=30.0))
    frames = {}
    for op, request in (("run", {"op": "run", "argv": ["touch", str(marker)], "timeout": 20,
                                 "payload": 0, "endpoint": held.endpoint_to_dict(endpoint)}),
                        ("quit", {"op": "quit"})):
        body = json.dumps(request).encode()
        frames[op] = public_dir / f"{op}.frame"
        frames[op].write_bytes(held._HEAD.pack(b"Q", len(body)) + body)
        os.chmod(frames[op], 0o644)
    assert as_nobody("-c", CALLER, path, frames["run"]).stdout == "refused PermissionError\n"
    link = public_dir / "way-in.sock"
    os.link(path, link)
    os.chmod(link, 0o666)
    try:
        for op in ("run", "quit"):
            assert as_nobody("-c", CALLER, link, frames[op]).stdout == "received 0\n", op
        time.sleep(1.0)
        assert not marker.exists()
        # not told to quit: the owner's same request runs the command
        sock = held.connect(path)
        assert sock is not None
        with sock:
            sock.sendall(frames["run"].read_bytes())
            while held.recv_frame(sock)[0] not in (b"R", b"X"):
                pass
        wait_for(marker.exists, 10, "the owner's command to run")
    finally:
        if marker.exists():
            subprocess.run(["rm", "-f", str(marker)], check=False)
    assert timed_ping(lab, hosts, runtime_dir)[::2] == ("ok", 0)   # served by the same holder


@pytest.mark.parametrize("planted", ["directory", "symlink"])
def test_a_directory_or_link_planted_where_the_holder_would_live_holds_nothing(
        lab, runtime_dir, public_dir, listener, planted):  # noqa: F811
    """The socket's directory is nobody's before the owner's first call (a directory of its
    own, or a link to one), with a listener at the holder's name: every call goes direct,
    never connects to that listener, and writes nothing there (no lock, no socket)."""
    hosts = held_hosts(lab)
    name = os.path.basename(holder_path(lab, hosts, runtime_dir))
    quit_holder(str(runtime_dir / "mldiag" / name))
    shutil.rmtree(runtime_dir / "mldiag")
    theirs = public_dir / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    evil = listener()
    os.rename(evil.path, theirs / name)
    if planted == "directory":
        os.rename(theirs, runtime_dir / "mldiag")
        theirs = runtime_dir / "mldiag"
    else:
        os.symlink(theirs, runtime_dir / "mldiag")
    try:
        for _ in range(2):
            status, _, opened = timed_ping(lab, hosts, runtime_dir)
            assert (status, opened) == ("ok", 1)
        time.sleep(1.0)
        assert evil.taken() == []
        assert sorted(os.listdir(theirs)) == [name]
        assert owned_by(theirs / name) == NOBODY
    finally:
        os.unlink(theirs / name)      # not a holder of ours for the fixture to quit


def test_a_directory_swapped_while_the_holder_runs_is_not_used_and_not_touched(
        lab, runtime_dir, public_dir, listener):  # noqa: F811
    """The holder's directory renamed away and one of nobody's, with nobody's listener at the
    holder's name, put in its place while the holder runs: calls go direct and never reach
    that listener; told to quit, the holder removes its own socket (in the directory it was
    moved to) and leaves nobody's where it is."""
    hosts = held_hosts(lab)
    path = holder_path(lab, hosts, runtime_dir)
    name = os.path.basename(path)
    moved = runtime_dir / "held-away"
    os.rename(runtime_dir / "mldiag", moved)
    theirs = runtime_dir / "mldiag"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    evil = listener()
    os.rename(evil.path, theirs / name)
    try:
        status, _, opened = timed_ping(lab, hosts, runtime_dir)
        assert (status, opened) == ("ok", 1)
        assert evil.taken() == []
        quit_holder(str(moved / name))
        assert owned_by(theirs / name) == NOBODY      # nobody's socket left alone
    finally:
        if owned_by(theirs / name) == NOBODY:
            os.unlink(theirs / name)  # not a holder of ours for the fixture to quit
        if (moved / name).exists():
            quit_holder(str(moved / name))
