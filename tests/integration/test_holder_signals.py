"""Signals while a connection holder starts (issue 29 §4): a TERM to mldiag right after it
spawned the holder, before the holder's socket is in place; a TERM to mldiag while the holder
authenticates the first held connection (the lab's sshd stopped: it accepts, and sends no
banner until it is continued); a TERM to the holder itself at any moment of its start.
Whatever the moment: mldiag exits 143, nothing runs on the target, and the holder is either a
working one (it answers, and is told to quit here) or gone, with nothing of it left in the
socket directory (no lock file, no temporary socket)."""

import os
import signal
import subprocess
import sys
import time
import uuid
from functools import partial

import pytest

from diagnostics.transport import held
from tests.integration.test_holder import (quit_holder, remote, run, runtime_dir,  # noqa: F401
                                           sockets)
from tests.lab.util import pids_with_marker as marked, wait_until
from tests.programs import REPO, ok, start_mldiag

wait_for = partial(wait_until, interval=0.02)


def left_in(runtime_dir) -> list:
    """What holders left in the socket directory: their sockets, lock files and temporary
    sockets (the ``ssh -G`` cache, ``sshg-*.json``, lives there too and is no holder's)."""
    d = runtime_dir / "mldiag"
    names = sorted(os.listdir(d)) if d.exists() else []
    return [n for n in names if n.startswith(("holder-", "new-"))]


def holders(runtime_dir) -> list:
    """The holder processes of this test (their argv holds the socket's path)."""
    return marked(str(runtime_dir))


def sleeper(tmp_path):
    script = tmp_path / "sleepy.py"
    script.write_text("import subprocess, sys\n"
                      "subprocess.run([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]])\n")
    return script


def sleeper_termed(tmp_path, hosts, runtime_dir, marker: str, ready, what: str):
    """A held `run-script` whose command sleeps on the target (its argv carries ``marker``),
    TERMed once ``ready()``: (the process, ended, and its stderr)."""
    proc = start_mldiag("run-script", sleeper(tmp_path), "-H", "main", "--hosts-file", hosts,
                        "--", marker, env={"XDG_RUNTIME_DIR": str(runtime_dir)})
    try:
        wait_for(ready, 30, what)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc, err


@pytest.mark.xfail(strict=True, reason="open: after a TERM right as the holder is spawned, "
                   "mldiag prints its message but its stdout/stderr stay open past 30 s "
                   "(found by this test, not yet diagnosed)")
def test_a_term_to_mldiag_as_it_starts_the_holder(lab, tmp_path, runtime_dir):
    """The first held call goes direct and spawns the holder; TERMed then, before the holder
    listens, the call ends 143 and its command stops; the holder comes up on its own and,
    told to quit, leaves nothing."""
    hosts = lab.hosts_yaml("defaults: {persist: 30}\nhosts:\n  main: {}\n")
    marker = f"mldiag-hstart-{uuid.uuid4().hex[:8]}"
    proc, err = sleeper_termed(tmp_path, hosts, runtime_dir, marker,
                               lambda: holders(runtime_dir), "the holder to be spawned")
    assert proc.returncode == 143, (proc.returncode, err)
    wait_for(lambda: not remote(marker, proc), 15, "the command to stop on the target")
    wait_for(lambda: len(sockets(runtime_dir)) == 1, 20, "the holder to listen")
    path, = sockets(runtime_dir)
    assert held.connect(path) is not None            # a working holder, not a half-made one
    quit_holder(path)
    wait_for(lambda: not holders(runtime_dir), 10, "the holder to exit")
    assert left_in(runtime_dir) == []


def test_a_term_to_mldiag_while_the_holder_authenticates(lab, tmp_path, runtime_dir):
    """The holder's first connection waits on a stopped sshd (accepted, no banner); the caller
    is TERMed then. Continued afterwards, the holder finishes the handshake for nobody: the
    command never outlives the caller, and the holder keeps working until told to quit."""
    hosts = lab.hosts_yaml("defaults: {persist: 30}\nhosts:\n  main: {}\n")
    ok(run(lab, hosts, runtime_dir, "ping", "-H", "main"))     # direct: starts the holder
    wait_for(lambda: len(sockets(runtime_dir)) == 1, 20, "the holder to listen")
    path, = sockets(runtime_dir)
    holder_pid, = holders(runtime_dir)
    sshd = lab.servers["main"]
    marker = f"mldiag-hauth-{uuid.uuid4().hex[:8]}"
    accepted = sshd.log_text().count("Accepted ")
    os.kill(sshd.pid, signal.SIGSTOP)
    try:
        proc, err = sleeper_termed(tmp_path, hosts, runtime_dir, marker,
                                   lambda: connected_to(holder_pid, sshd.port),
                                   "the holder to connect to the stopped sshd")
    finally:
        os.kill(sshd.pid, signal.SIGCONT)
    assert proc.returncode == 143, (proc.returncode, err)
    assert err.endswith("mldiag: terminated (SIGTERM) (0 of 1 targets finished)\n"), err
    wait_for(lambda: sshd.log_text().count("Accepted ") > accepted, 30,
             "the holder's handshake to end")
    seen = []                 # the command, started for a caller that left, even for a moment
    end = time.monotonic() + 3.0
    while time.monotonic() < end and not seen:
        seen = remote(marker, proc)
        time.sleep(0.01)
    assert seen == []
    assert held.connect(path) is not None and holders(runtime_dir) == [holder_pid]
    quit_holder(path)
    wait_for(lambda: not holders(runtime_dir), 10, "the holder to exit")
    assert left_in(runtime_dir) == []


def connected_to(pid: int, port: int) -> bool:
    """Does process ``pid`` hold a TCP connection to ``port`` (``ss``, as root here)?"""
    out = subprocess.run(["ss", "-tnpH", "dport", f"= :{port}"], capture_output=True,
                         text=True, check=True).stdout
    return f"pid={pid}," in out


def test_a_term_to_the_holder_at_any_moment_of_its_start_leaves_nothing(runtime_dir):
    """20 holders, each TERMed between its spawn and 1.5 times as long as a holder here takes to
    listen (the import, the lock, the bind, the rename, the first sweep): each ends, and leaves
    the directory empty. (The lock file used to stay after every holder, and a TERM between the
    bind and the rename left the temporary socket too.)"""
    directory = runtime_dir / "mldiag"
    directory.mkdir(mode=0o700)
    path = str(directory / "holder-signals.sock")
    boot = "import sys; from diagnostics.transport import holder; holder.main(sys.argv[1], 30.0)"
    spawn = partial(subprocess.Popen, [sys.executable, "-c", boot, path], cwd=REPO,
                    start_new_session=True)
    began = time.monotonic()
    first = spawn()
    wait_for(lambda: held.connect(path) is not None, 30, "a holder to listen")
    to_listen = time.monotonic() - began
    quit_holder(path)
    first.wait(timeout=10)
    outcomes = []
    for n in range(20):
        proc = spawn()
        try:
            time.sleep(1.5 * to_listen * n / 19)
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        outcomes.append((n, code, left_in(runtime_dir)))
    # killed by the TERM before the holder began (-15), or quit on it (0): nothing left either way
    assert [o for o in outcomes if o[1] not in (0, -signal.SIGTERM) or o[2]] == [], outcomes
    assert any(code == 0 for _, code, _ in outcomes), outcomes   # some were TERMed while started
