"""The connection holder (issue 14 goal 3; hops/held.py, holder.py) against the lab's real sshd:
a second call reuses the first's holder, a third its connection; the caller imports no
paramiko; a caller that goes away stops its command; the holder expires on its own."""

import contextlib
import glob
import json
import os
import shutil
import signal
import stat
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path

import pytest

from diagnostics.transport import held
from tests.lab.util import pids_with_marker as marked, wait_until
from tests.programs import MLDIAG, ok, run_program, start_mldiag

wait_for = partial(wait_until, interval=0.05)


@pytest.fixture
def runtime_dir():
    """A private $XDG_RUNTIME_DIR for the test's holders (a short path: pytest's tmp_path
    leaves no room for a socket's name); each holder is told to quit at the end."""
    d = Path(tempfile.mkdtemp(prefix="mldiag-t-", dir="/tmp"))
    yield d
    for path in glob.glob(str(d / "mldiag" / "holder-*.sock")):
        quit_holder(path)
    shutil.rmtree(d, ignore_errors=True)


def quit_holder(path: str) -> None:
    sock = held.connect(path)
    if sock is not None:
        with sock:
            held.send_frame(sock, b"Q", json.dumps({"op": "quit"}).encode())
            assert held.recv_frame(sock) == (b"R", b"{}")
    wait_for(lambda: not os.path.exists(path), 10, "the holder to remove its socket")


def remote(marker: str, caller) -> list:
    """The target's processes carrying ``marker`` (the caller's own argv carries it too)."""
    return [p for p in marked(marker) if p != caller.pid]


def sockets(runtime_dir):
    return glob.glob(str(runtime_dir / "mldiag" / "holder-*.sock"))


def run(lab, hosts, runtime_dir, *argv, importtime=False):
    env = {"XDG_RUNTIME_DIR": str(runtime_dir)}
    prefix = MLDIAG[:1] + (["-X", "importtime"] if importtime else []) + MLDIAG[1:]
    return run_program(prefix + [argv[0], "--hosts-file", str(hosts)] + list(argv[1:]), env=env)


def test_a_second_call_goes_through_the_holder_and_a_third_reuses_its_connection(
        lab, tmp_path, runtime_dir):
    hosts = lab.hosts_yaml("defaults: {persist: 30}\nhosts:\n  main: {}\n")
    script = tmp_path / "probe.py"
    script.write_text("import sys; print('hello', sys.argv[1:])\n")
    sshd = lab.servers["main"]
    outputs, opened = [], []
    for n in range(3):
        before = sshd.connection_count()
        proc = run(lab, hosts, runtime_dir, "run-script", script, "-H", "main", "--json",
                   "--", "a b", importtime=(n == 2))
        doc, = json.loads(ok(proc))
        outputs.append((doc["status"], doc["data"]["stdout"], doc["data"]["exit_code"]))
        opened.append(sshd.connection_count() - before)
        if n == 0:
            wait_for(lambda: len(sockets(runtime_dir)) == 1, 20, "the holder to listen")
    assert outputs == [("ok", "hello ['a b']\n", 0)] * 3
    # the first call connects itself (and starts the holder), the second through the holder's
    # new connection, the third on that same connection
    assert opened == [1, 1, 0], opened
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "diagnostics.transport.held" in imported
    assert not {"paramiko", "fabric", "cryptography"} & imported
    directory = runtime_dir / "mldiag"
    assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700
    path, = sockets(runtime_dir)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


def test_the_holder_closes_its_connection_and_exits_after_persist_unused(lab, tmp_path, runtime_dir):
    hosts = lab.hosts_yaml("hosts:\n  main: {persist: 1}\n")
    for _ in range(2):
        ok(run(lab, hosts, runtime_dir, "ping", "-H", "main"))
        wait_for(lambda: len(sockets(runtime_dir)) == 1, 20, "the holder to listen")
    path, = sockets(runtime_dir)
    assert held.connect(path) is not None
    wait_for(lambda: not os.path.exists(path), 15, "the holder to expire")
    assert held.connect(path) is None


@contextlib.contextmanager
def held_sleeper(lab, tmp_path, runtime_dir):
    """A held `run-script` whose command sleeps on the target (its argv carries a marker),
    running once the yield comes: (the caller's process, the marker, the hosts file). The
    caller is killed on the way out if the test left it running."""
    marker = f"mldiag-held-{uuid.uuid4().hex[:8]}"
    hosts = lab.hosts_yaml("defaults: {persist: 30}\nhosts:\n  main: {}\n")
    ok(run(lab, hosts, runtime_dir, "ping", "-H", "main"))
    wait_for(lambda: len(sockets(runtime_dir)) == 1, 20, "the holder to listen")
    script = tmp_path / "sleepy.py"
    script.write_text("import subprocess, sys\n"
                      "subprocess.run([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]])\n")
    proc = start_mldiag("run-script", script, "-H", "main", "--hosts-file", hosts, "--", marker,
                        env={"XDG_RUNTIME_DIR": str(runtime_dir)})
    try:
        wait_for(lambda: remote(marker, proc), 30, "the script to run on the target")
        yield proc, marker, hosts
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_caller_that_goes_away_stops_its_command_on_the_target(lab, tmp_path, runtime_dir):
    with held_sleeper(lab, tmp_path, runtime_dir) as (proc, marker, hosts):
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)
        wait_for(lambda: not marked(marker), 15, "the holder to stop the command")
    # and the holder still serves the next call
    assert json.loads(ok(run(lab, hosts, runtime_dir, "ping", "-H", "main", "--json")))[0][
        "status"] == "ok"


def test_a_directory_open_to_others_holds_nothing(lab, runtime_dir):
    shared = runtime_dir
    (shared / "mldiag").mkdir()
    os.chmod(shared / "mldiag", 0o755)      # as a careless umask would leave it
    hosts = lab.hosts_yaml("defaults: {persist: 30}\nhosts:\n  main: {}\n")
    sshd = lab.servers["main"]
    before = sshd.connection_count()
    for _ in range(2):
        ok(run(lab, hosts, shared, "ping", "-H", "main"))
    time.sleep(0.5)
    assert not glob.glob(str(shared / "mldiag" / "*"))     # no holder, no lock, no socket
    assert sshd.connection_count() - before == 2           # each call connected itself


def test_held_jump_chains_and_containers_share_the_holders_connections(lab, runtime_dir):
    """Hosts behind a jump host and containers of one host, through the holder: the same rows
    as a direct run, and on the holder's connections (one per host, the jump's shared)."""
    lab.need("lxc")
    hosts = lab.hosts_yaml(
        "defaults: {persist: 30, connect_timeout: 5}\nhosts:\n  jump: {}\n  inner: {}\n"
        "  pve:\n    address: main\n    become: sudo\n    containers:\n"
        '      ct1: {runtime: pct, id: "200", python: /root/venv/bin/python}\n'
        '      ct2: {runtime: pct, id: "200", python: /root/venv/bin/python}\n')
    names = ["jump", "inner", "ct1", "ct2"]
    servers = {s: lab.servers[s] for s in ("jump", "main")}
    rows, opened = [], []
    for n in range(3):
        before = {s: server.connection_count() for s, server in servers.items()}
        docs = json.loads(ok(run(lab, hosts, runtime_dir, "ping", "-H", ",".join(names), "--json")))
        rows.append([(d["target"], d["status"]) for d in docs])
        opened.append({s: server.connection_count() - before[s] for s, server in servers.items()})
        if n == 0:
            wait_for(lambda: len(sockets(runtime_dir)) == 1, 20, "the holder to listen")
    assert rows == [[(name, "ok") for name in names]] * 3
    # direct, then the holder's own connections (inner's goes through the jump's), then none
    assert opened == [{"jump": 1, "main": 1}, {"jump": 1, "main": 1}, {"jump": 0, "main": 0}], opened


def test_ctrl_c_ends_a_held_run_at_once_and_stops_its_command(lab, tmp_path, runtime_dir):
    with held_sleeper(lab, tmp_path, runtime_dir) as (proc, marker, _):
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.endswith("mldiag: interrupted (0 of 1 targets finished)\n"), err
    wait_for(lambda: not marked(marker), 15, "the holder to stop the command")


def test_a_slurm_allocation_runs_through_the_holder_alike(lab, runtime_dir):
    """The allocation's long-lived srun steps go through the holder as any command does: the
    same node rows, and the login host's connection reused by the third call."""
    lab.need("slurm")
    hosts = lab.hosts_yaml("defaults: {persist: 30, connect_timeout: 5, timeout: 60}\nhosts:\n"
                           "  cluster-a:\n    address: main\n    slurm: {nodes: 2}\n")
    sshd = lab.servers["main"]
    rows, opened = [], []
    for n in range(3):
        before = sshd.connection_count()
        docs = json.loads(ok(run(lab, hosts, runtime_dir, "ping", "-H", "cluster-a", "--json")))
        rows.append(sorted((d["target"], d["status"]) for d in docs))
        opened.append(sshd.connection_count() - before)
        if n == 0:
            wait_for(lambda: len(sockets(runtime_dir)) == 1, 20, "the holder to listen")
    assert rows == [[("cluster-a:n1", "ok"), ("cluster-a:n2", "ok")]] * 3, rows
    assert opened[1:] == [1, 0], opened
