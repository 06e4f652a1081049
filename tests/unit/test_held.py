"""The connection holder's pieces that need no sshd (tests/integration/test_holder.py has the
real thing): its frames, the one check of an endpoint it is sent, where its socket may live,
and how long a connection is held (hosts.yaml ``persist``, else ssh_config's ControlPersist
as the real ``ssh -G`` prints it)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from diagnostics.transport import holder
from diagnostics.inventory import topology
from diagnostics.core.errors import InputError
from diagnostics.transport import held, private, sshconfig
from diagnostics.transport.sshconfig import Endpoint

JUMP = Endpoint("bastion", "10.0.0.1", 22, "ops", ("/k/id",), ("/k/known",), ("/etc/k",), "yes", 5.0)
EP = Endpoint("gpu01", "10.0.0.2", 2222, "ml", ("/k/id",), ("/k/known",), ("/etc/k",), "accept-new",
              10.0, jump=JUMP, hash_known_hosts=True, persist=60.0)


def wire_form(ep: Endpoint) -> dict:
    return json.loads(json.dumps(held.endpoint_to_dict(ep)))


def test_an_endpoint_crosses_to_the_holder_unchanged():
    assert held.endpoint_from_dict(wire_form(EP)) == EP


@pytest.mark.parametrize("field,value", [("port", "22"), ("strict", "maybe"), ("user", None),
                                         ("identity_files", "/k/id"), ("known_hosts", [1]),
                                         ("hash_known_hosts", "yes"), ("proxy_command", ["sh"])])
def test_an_endpoint_of_the_wrong_shape_is_refused(field, value):
    sent = wire_form(EP)
    sent[field] = value
    with pytest.raises(ValueError, match="endpoint"):
        held.endpoint_from_dict(sent)
    sent = wire_form(EP)
    sent["jump"][field] = value
    with pytest.raises(ValueError, match="endpoint"):
        held.endpoint_from_dict(sent)


def test_frames_round_trip_and_an_oversized_one_is_refused():
    a, b = socket.socketpair()
    with a, b:
        held.send_frame(a, b"O", b"x" * 70000)
        held.send_frame(a, b"R", b"{}")
        assert held.recv_frame(b) == (b"O", b"x" * 70000)
        assert held.recv_frame(b) == (b"R", b"{}")
        held.send_frame(a, b"Q", b"y" * 100)
        with pytest.raises(ValueError, match="at most 10"):
            held.recv_frame(b, limit=10)
    a, b = socket.socketpair()
    with b:
        a.sendall(b"O\0\0")
        a.close()
        with pytest.raises(EOFError):
            held.recv_frame(b)


def test_a_connection_key_holds_what_it_was_authenticated_and_verified_with():
    """Targets reaching one user@host:port share a connection only when they would open it
    alike (the holder's one pool and a direct run's pool both key by it)."""
    same = Endpoint(**{**held.endpoint_to_dict(EP), "jump": JUMP, "label": "x", "persist": 0.0,
                       "connect_timeout": 3.0})
    other_key = Endpoint(**{**held.endpoint_to_dict(EP), "jump": JUMP, "identity_files": ("/k/other",)})
    other_jump_policy = Endpoint(**{**held.endpoint_to_dict(EP), "jump": Endpoint(
        **{**held.endpoint_to_dict(JUMP), "strict": "no"})})
    other_known = Endpoint(**{**held.endpoint_to_dict(EP), "jump": JUMP, "known_hosts": ("/x",)})
    assert EP.key == same.key
    assert len({EP.key, other_key.key, other_jump_policy.key, other_known.key}) == 4


@pytest.fixture
def short_tmp():
    """A directory with a short path (pytest's tmp_path leaves no room for a socket's name)."""
    d = tempfile.mkdtemp(prefix="mldiag-t-", dir="/tmp")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def test_only_a_private_directory_of_this_user_holds(short_tmp, tmp_path, monkeypatch):
    run = short_tmp / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    assert private.private_dir() == str(run / "mldiag")
    assert oct(os.stat(run / "mldiag").st_mode & 0o777) == "0o700"
    os.chmod(run / "mldiag", 0o750)
    assert private.private_dir() is None
    shutil.rmtree(run / "mldiag")
    real = short_tmp / "elsewhere"
    real.mkdir(mode=0o700)
    os.symlink(real, run / "mldiag")          # planted: a link is never followed
    assert private.private_dir() is None
    os.unlink(run / "mldiag")
    os.chmod(run, 0o755)                      # XDG's own is not private: ours under /tmp
    assert private.private_dir() == f"/tmp/mldiag-{os.geteuid()}"
    deep = short_tmp / ("d" * 80)             # no room left for the socket's name (107 bytes)
    deep.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(deep))
    assert private.private_dir() == f"/tmp/mldiag-{os.geteuid()}"
    assert not os.path.exists(deep / "mldiag")


def test_a_holder_started_twice_at_one_path_listens_once(short_tmp):
    d = short_tmp / "h"
    d.mkdir(mode=0o700)
    path = str(d / "x.sock")
    first = holder._listen(path)
    assert first is not None
    try:
        assert holder._listen(path) is None      # the lock is taken: the second one leaves
        assert held.connect(path) is not None
    finally:
        first.close()
    assert not os.path.exists(path)              # its socket removed on the way out
    os.chmod(d, 0o711)
    assert holder._listen(path) is None          # not private: no socket there


@pytest.mark.parametrize("master,persist,held_s", [
    ("auto", "600", 600.0), ("yes", "45", 45.0), ("autoask", "yes", 3600.0), ("auto", "0", 3600.0),
    ("auto", "no", 0.0), ("false", "600", 0.0), ("no", "yes", 0.0), ("auto", "99999", 3600.0)])
def test_persist_follows_controlpersist_as_ssh_prints_it(master, persist, held_s):
    assert sshconfig.persist_seconds({"controlmaster": [master], "controlpersist": [persist]}) == held_s


@pytest.mark.skipif(shutil.which("ssh") is None, reason="OpenSSH client not installed")
def test_the_real_ssh_dash_g_gives_the_persist(tmp_path, monkeypatch):
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host held\n  HostName 127.0.0.9\n  ControlMaster auto\n  ControlPath none\n"
                   "  ControlPersist 10m\nHost plain\n  HostName 127.0.0.9\n")
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(cfg))
    sshconfig._cache.clear()
    try:
        assert sshconfig.resolve(topology.SshHost("held")).persist == 600.0
        assert sshconfig.resolve(topology.SshHost("plain")).persist == 0.0
        assert sshconfig.resolve(topology.SshHost("held", persist=0.0)).persist == 0.0
        assert sshconfig.resolve(topology.SshHost("plain", persist=5.0)).persist == 5.0
    finally:
        sshconfig._cache.clear()


@pytest.mark.parametrize("value", ["-1", "3601", "'60'", "true", ".nan"])
def test_a_bad_persist_names_its_line(value):
    with pytest.raises(InputError) as e:
        topology.loads(f"defaults:\n  persist: {value}\nhosts:\n  a: {{}}\n")
    assert str(e.value).startswith("hosts.yaml:2: defaults.persist: expected seconds from 0 "
                                   "(hold no connection) to 3600, got ")


def test_persist_is_inherited_from_defaults_and_overridden_per_host():
    topo = topology.loads("defaults: {persist: 60}\nhosts:\n  a: {}\n  b: {persist: 0}\n")
    assert topo.targets["a"].host.persist == 60.0 and topo.targets["b"].host.persist == 0.0


def test_how_the_command_ended_is_taken_only_in_its_own_types():
    from diagnostics.transport.base import StreamCapture
    out = StreamCapture(10, 10)
    out.feed(b"hi")
    ended = held._ended({"exit_code": 3, "timed_out": False, "lost": None, "dropped": 0}, out, b"e")
    assert (ended.stdout, ended.stderr, ended.exit_code, ended.timed_out) == (b"hi", b"e", 3, False)
    for bad in ({"exit_code": "3", "timed_out": False, "lost": None, "dropped": 0},
                {"exit_code": None, "timed_out": 1, "lost": None, "dropped": 0},
                {"exit_code": None, "timed_out": False, "lost": ["x"], "dropped": 0},
                {"exit_code": None, "timed_out": False, "lost": None}):
        with pytest.raises(ValueError, match="malformed"):
            held._ended(bad, out, b"")


# ------------------------------------------------------------------ attacks (issue 29 section 4)

def test_the_holders_name_changes_with_any_module_it_may_run(tmp_path, monkeypatch):
    """Not only the four modules once listed by hand: a change to core/wire.py or
    transport/base.py (which the holder runs for every request) gives a new name, so no holder of
    older code serves; a diagnostic under scripts/ (never imported on this side) does not."""
    package = Path(held.__file__).resolve().parents[1]
    copy = tmp_path / "diagnostics"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(held, "PACKAGE_DIR", str(copy))
    names = [held.holder_name()]
    for module in ("core/wire.py", "transport/base.py", "transport/sshconfig.py", "core/errors.py",
                   "views/render.py"):
        os.utime(copy / module, ns=(1, 10**18 + len(names)))
        names.append(held.holder_name())
    assert len(set(names)) == len(names), names
    os.utime(copy / "scripts" / "gpu_status.py", ns=(1, 1))
    assert held.holder_name() == names[-1]


HOLDER_LOADS = """
import json, socket, sys, threading
from diagnostics.transport import holder
from diagnostics.transport import held, knownhosts   # knownhosts: a connection's host-key step
path = sys.argv[1]

def caller():
    ep = held.Endpoint("x", "127.0.0.1", 1, "u", (), (), (), "yes", 2.0)
    for request in ({"op": "run", "argv": ["true"], "timeout": 5, "payload": 0,
                     "endpoint": held.endpoint_to_dict(ep)}, {"op": "quit"}):
        while True:
            sock = held.connect(path)
            if sock is not None:
                break
        held.send_frame(sock, b"Q", json.dumps(request).encode())
        while held.recv_frame(sock)[0] not in (b"R", b"X"):
            pass
        sock.close()

threading.Thread(target=caller, daemon=True).start()
holder.serve(path, 5.0)
print(json.dumps(sorted(m.__file__ for name, m in sys.modules.items()
                        if name.split(".")[0] == "diagnostics" and getattr(m, "__file__", None))))
"""


def test_every_module_a_holder_loads_is_in_its_name(short_tmp):
    """A real holder serves a run (its connection refused) and is told to quit: every module
    of the package it loaded on the way is one its name is made of."""
    d = short_tmp / "h"
    d.mkdir(mode=0o700)
    proc = subprocess.run([sys.executable, "-c", HOLDER_LOADS, str(d / "x.sock")],
                          capture_output=True, text=True, timeout=60,
                          cwd=str(Path(held.__file__).resolve().parents[2]))
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    assert {"holder.py", "ssh.py", "base.py", "wire.py"} <= {os.path.basename(p) for p in loaded}
    assert loaded <= {entry.path for entry in held.holder_code()}


def test_a_socket_that_does_not_accept_is_no_holder(short_tmp):
    """A listener whose backlog is full (a stopped holder, or one planted to hang callers):
    connect gives up at once instead of waiting."""
    d = short_tmp / "h"
    d.mkdir(mode=0o700)
    path = str(d / "x.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        server.listen(0)
        fillers = []
        for _ in range(4):      # fill the backlog (never accepted)
            filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            filler.setblocking(False)
            try:
                filler.connect(path)
            except BlockingIOError:
                filler.close()
                break
            fillers.append(filler)
        answer = []
        caller = threading.Thread(target=lambda: answer.append(held.connect(path)), daemon=True)
        caller.start()
        caller.join(5.0)                  # a connect that waits on the backlog never returns
        assert answer == [None]
        for filler in fillers:
            filler.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("parent_mode,parent_uid,used", [
    (0o755, 0, True), (0o755, 65534, False), (0o777, 0, False), (0o1777, 0, True)])
def test_a_runtime_dir_someone_else_can_swap_is_not_used(short_tmp, monkeypatch, parent_mode,
                                                         parent_uid, used):
    """$XDG_RUNTIME_DIR private itself, but under a directory another user owns or may write
    (not sticky): they could rename it away and put their own in its place after it was
    checked. Then the socket goes to /tmp/mldiag-UID (under sticky /tmp) instead."""
    parent = short_tmp / "p"
    parent.mkdir()
    run_dir = parent / "run"
    run_dir.mkdir(mode=0o700)
    os.chown(parent, parent_uid, parent_uid)
    os.chmod(parent, parent_mode)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run_dir))
    expected = str(run_dir / "mldiag") if used else f"/tmp/mldiag-{os.geteuid()}"
    assert private.private_dir() == expected


def test_a_holder_leaves_a_file_put_in_its_sockets_place_and_sees_it_is_not_reachable(short_tmp):
    d = short_tmp / "h"
    d.mkdir(mode=0o700)
    path = str(d / "x.sock")
    listening = holder._listen(path)
    assert listening is not None and listening.still_ours()
    os.unlink(path)
    Path(path).write_text("someone else's")
    assert not listening.still_ours()               # serve() ends at its next sweep
    listening.close()
    assert Path(path).read_text() == "someone else's"
