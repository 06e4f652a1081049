"""stacks (issue 13) against a real hung job: 4 torchrun ranks on the gloo backend (CPU torch),
rank 3 blocked in a function of its own, ranks 0-2 in all_reduce (the recipe of
shared/notes/test-infra.md, "A hung distributed job"; the job is
tests/fixtures/stacks/hung_gloo_job.py). py-spy is the PyPI wheel's static binary.

Through the local target, and over SSH to the lab's `main` (the same machine, user mlsh): with
`become: sudo` the job's ranks are found and dumped; without, mlsh may not read root's
processes, which is the ptrace-denied finding with its fix, not a crash."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from tests import programs

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "fixtures" / "stacks" / "hung_gloo_job.py"
mldiag = partial(programs.mldiag, timeout=120)


@pytest.fixture(scope="module")
def py_spy(lab):
    """py-spy where every lab user may run it (the checkout may sit under a 0700 home)."""
    found = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if not found:
        pytest.fail("py-spy is not installed (pip install -e '.[test]')")
    dest = lab.dir / "py-spy"
    shutil.copyfile(found, dest)
    dest.chmod(0o755)
    return dest


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory):
    """The job, started with torchrun in its own session; {rank: pid} once every rank is warm
    and the others sit in all_reduce. Ended with SIGTERM to the session in every outcome."""
    torchrun = Path(sys.executable).with_name("torchrun")
    work = tmp_path_factory.mktemp("hung-job")
    log = work / "log"
    with socket_port() as port, open(log, "wb") as out:
        proc = subprocess.Popen([str(torchrun), "--nproc-per-node", "4", "--master-port", str(port),
                                 str(JOB)], stdout=out, stderr=subprocess.STDOUT, cwd=str(work),
                                start_new_session=True)
    try:
        # four ranks importing torch at once on a busy 2-core machine: allow minutes (the job's
        # own gloo timeout is 600 s, so a slow start is not mistaken for the hang)
        end = time.monotonic() + 240
        while log.read_text(errors="replace").count("warm ") < 4:
            if proc.poll() is not None or time.monotonic() > end:
                pytest.fail(f"the hung job did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        time.sleep(1.0)                          # ranks 0-2 are inside all_reduce by now
        yield workers(proc.pid)
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:      # the session is gone already
                pass
            try:
                proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                continue


class socket_port:
    """A free TCP port on 127.0.0.1 (released just before torchrun binds it)."""
    def __enter__(self):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def __exit__(self, *exc):
        return False


def workers(torchrun_pid):
    """{rank: pid} of torchrun's children, from their environment."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) != torchrun_pid:
            continue
        for item in env:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = int(name)
    assert sorted(found) == [0, 1, 2, 3], found
    return found


@pytest.fixture(scope="module")
def hosts(lab):
    return lab.hosts_yaml("hosts:\n"
                          "  here: {local: true}\n"
                          "  box-sudo: {address: main, become: sudo, python: /usr/bin/python3}\n"
                          "  box: {address: main, python: /usr/bin/python3}\n")


def docs_of(r):
    assert "Traceback" not in r.stderr, r.stderr
    return {d["target"]: d for d in json.loads(r.stdout)}


@pytest.mark.parametrize("target", ["here", "box-sudo"])
def test_the_odd_rank_is_named_and_the_others_folded(hung_job, hosts, py_spy, target):
    r = mldiag("stacks", "--hosts-file", hosts, "-H", target, "--py-spy", py_spy, "--no-color")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[1].split()[:2] == [target, "fail"] and "4 processes (ranks 0,1,2,3), 4 stacks read" in lines[1]
    assert lines[2] == (f"  fail  stacks-odd-one-out: 1/4 ranks ({target}:3) not in the collective the "
                        "other 3 wait in (all_reduce): wait_for_data (hung_gloo_job.py:10) ← main "
                        "(hung_gloo_job.py:24)")
    width = len(f"3/4 ranks ({target}:[0-2])")
    assert f"{f'3/4 ranks ({target}:[0-2])':<{width}}  all_reduce (torch/distributed/distributed_c10d.py) " \
           "← sync (hung_gloo_job.py:14) ← main (hung_gloo_job.py:25)" in lines, r.stdout
    assert f"{f'1/4 ranks ({target}:3)':<{width}}  wait_for_data (hung_gloo_job.py:10) ← main " \
           "(hung_gloo_job.py:24)   ← the odd one out" in lines, r.stdout

    j = mldiag("stacks", "--hosts-file", hosts, "-H", target, "--py-spy", py_spy, "--json")
    doc = docs_of(j)[target]
    procs = doc["data"]["processes"]
    assert [(p["rank"], p["pid"], p["world_size"], p["found_by"]) for p in procs] == [
        (rank, hung_job[rank], 4, "torch") for rank in range(4)]
    assert all(p["threads"][0]["thread_name"] == "MainThread" and p["error"] is None for p in procs)
    assert doc["data"]["collector"] == "py-spy"


def test_the_job_still_runs_after_its_stacks_were_read(hung_job, hosts, py_spy):
    """A dump pauses a process only while it reads it: every rank is alive and where it was."""
    mldiag("stacks", "--hosts-file", hosts, "-H", "here", "--py-spy", py_spy, "--json")
    for rank, pid in hung_job.items():
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        assert state in ("S", "R"), (rank, state)


def test_another_users_processes_are_a_clear_ptrace_finding(hung_job, hosts, py_spy):
    """mlsh may not read root's processes: their environment hides the ranks, and the one named
    with --pid is refused by the kernel: a fail finding that says how to get in."""
    r = mldiag("stacks", "--hosts-file", hosts, "-H", "box", "--py-spy", py_spy, "--json",
               "--pid", str(hung_job[3]))
    doc = docs_of(r)["box"]
    assert r.returncode == 2, r.stdout + r.stderr
    assert [(f["level"], f["code"]) for f in doc["findings"]] == [("fail", "ptrace-denied")], doc
    assert doc["findings"][0]["message"] == f"reading the stack was refused for pid {hung_job[3]}"
    assert "become: sudo" in doc["findings"][0]["hint"]
    [proc] = doc["data"]["processes"]
    assert proc["found_by"] == "pid" and proc["rank"] is None and proc["threads"] is None


def test_without_py_spy_the_ranks_are_still_found_and_the_way_to_get_it_said(hung_job, hosts, lab):
    r = mldiag("stacks", "--hosts-file", hosts, "-H", "box-sudo", "--py-spy", "/nonexistent/py-spy",
               "--json")
    doc = docs_of(r)["box-sudo"]
    assert r.returncode == 1, r.stdout + r.stderr
    assert [(f["level"], f["code"]) for f in doc["findings"]] == [("warn", "py-spy-absent")]
    assert [p["rank"] for p in doc["data"]["processes"]] == [0, 1, 2, 3]
