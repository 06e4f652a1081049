"""The lab's Slurm cluster works, checked with plain tools only: the OpenSSH client as mlsh on
the `main` host (the login node) running srun/salloc/squeue/scancel — never mldiag's transport.
Timings measured here are printed (`pytest -s`), never asserted beyond generous bounds."""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import secrets
import signal
import subprocess
import sys
import time

import pytest

from tests.lab import slurm
from tests.lab.util import all_pids, cmdline, state_of, uid_of
from tests.programs import ok

pytestmark = [pytest.mark.integration, pytest.mark.lab]   # the lab's self-tests: -m lab / -m "not lab"

NODES = list(slurm.NODES)


def report(what: str, seconds: float) -> None:
    sys.stdout.write(f"\n[slurm lab] {what}: {seconds:.2f}s\n")


@pytest.fixture
def cluster(lab):
    """The lab's cluster, all nodes idle before and after the test."""
    lab.need("slurm")
    lab.slurm.wait_idle(timeout=30)
    yield lab.slurm
    states = lab.slurm.node_states()
    for node in NODES:  # a test that failed half-way: its stopped or killed node back
        pid = lab.slurm.node_pid(node)
        if pid is None or state_of(pid) in ("T", "t") or states.get(node, "").startswith(("down", "drain")):
            lab.slurm_start_node(node)
    lab.slurm.wait_idle(timeout=30)


def timed_ssh(lab, cmd: str, **kw):
    t = time.monotonic()
    proc = lab.ssh("main", cmd, **kw)
    return proc, time.monotonic() - t


def test_srun_runs_one_task_on_each_node_as_mlsh(lab, cluster):
    out = ok(lab.ssh("main", "srun -N4 --ntasks-per-node=1 sh -c "
                             "'echo $SLURMD_NODENAME $(hostname) $(id -un) $SLURM_JOB_PARTITION'"))
    assert sorted(out.splitlines()) == [f"{n} {n} mlsh debug" for n in NODES]
    # squeue/sinfo/scontrol answer the login node's user; sudo keeps SLURM_CONF
    assert ok(lab.ssh("main", "sinfo -h -p debug -o %D")).strip() == "4"
    assert ok(lab.ssh("main", "sudo -n sinfo -h -p gpu -o %D")).strip() == "4"
    ok(lab.ssh("main", "squeue -h -u mlsh"))


def test_single_node_step_timing(lab, cluster):
    times = []
    for node in NODES:
        proc, seconds = timed_ssh(lab, f"srun -N1 -w {node} hostname")
        assert ok(proc).strip() == node
        times.append(seconds)
    times.sort()
    report("ssh + `srun -N1 -w nX hostname` (median of 4)", (times[1] + times[2]) / 2)
    _, raw = timed_ssh(lab, "hostname")
    report("ssh + `hostname` (reference)", raw)


def test_node_has_python_the_fake_nvidia_smi_and_the_session_environment(lab, cluster):
    # srun exports the submitting environment (--export=ALL): PATH from sshd's SetEnv included
    script = ("import os, shutil, socket; "
              "print(socket.gethostname(), shutil.which(\"nvidia-smi\"), os.environ[\"PATH\"], "
              "os.environ.get(\"MLDIAG_LAB_SESSION\"), os.environ.get(\"TMPDIR\"), os.getcwd())")
    out = ok(lab.ssh("main", f"srun -N1 -w n3 python3 -c '{script}'")).split()
    assert out == ["n3", str(lab.fakes_dir / "nvidia-smi"), lab.path, lab.sid, "/tmp", "/home/mlsh"]
    smi = ok(lab.ssh("main", "srun -N1 -w n3 nvidia-smi -L"))
    assert smi.startswith("GPU 0: ")


def test_gpu_partition_and_gres(lab, cluster):
    assert cluster.gpus_per_node == 8
    out = ok(lab.ssh("main", "srun -p gpu -N2 --ntasks-per-node=1 --gpus-per-node=2 sh -c "
                             "'echo $SLURM_JOB_PARTITION $CUDA_VISIBLE_DEVICES'"))
    assert out.splitlines() == ["gpu 0,1", "gpu 0,1"]


def test_nodes_have_a_private_tmp(lab, cluster):
    token = secrets.token_hex(4)
    login, node = f"slurm-login-{token}", f"slurm-node-{token}"
    ok(lab.ssh("main", f"touch /tmp/{login}"))
    try:
        assert login in lab.host_tmp("mlsh")
        out = ok(lab.ssh("main", f"srun -N1 -w n2 sh -c 'test -e /tmp/{login} && echo seen || echo unseen; "
                                 f"touch /tmp/{node}; ls /tmp'"))
        assert out.splitlines()[0] == "unseen"
        assert node in out.split()
        assert node in lab.slurm_tmp("n2")
        assert node not in lab.slurm_tmp("n1")
        assert not os.path.exists(f"/tmp/{node}")
        # the login node does not see it, nor does another node
        assert ok(lab.ssh("main", f"test -e /tmp/{node} && echo seen || echo unseen")).strip() == "unseen"
        out = ok(lab.ssh("main", f"srun -N1 -w n1 sh -c 'test -e /tmp/{node} && echo seen || echo unseen'"))
        assert out.strip() == "unseen"
        # the lab's own files stay reachable on the nodes (slurm.conf, munge socket, copied fakes)
        ok(lab.ssh("main", f"srun -N1 -w n2 test -r {cluster.conf}"))
    finally:
        os.unlink(f"/tmp/{login}")
        ok(lab.ssh("main", f"srun -N1 -w n2 rm -f /tmp/{node}"))
    assert node not in lab.slurm_tmp("n2")


def test_stdin_reaches_a_single_task_step(lab, cluster):
    assert ok(lab.ssh("main", "srun -N1 -w n2 cat", input="hi\n")) == "hi\n"
    # a bundle-sized stream arrives whole
    payload = secrets.token_hex(512 * 1024) + "\n"  # 1 MiB
    script = "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"
    digest = ok(lab.ssh("main", f"srun -N1 -w n2 python3 -c '{script}'", input=payload)).strip()
    assert digest == hashlib.sha256(payload.encode()).hexdigest()


def test_stdin_is_broadcast_to_every_task_by_default(lab, cluster):
    # srun's default --input=all: each of the 4 tasks reads the whole stdin
    payload = secrets.token_hex(64 * 1024) + "\n"
    out = ok(lab.ssh("main", "srun -N4 --ntasks-per-node=1 python3 -c "
                             "'import hashlib, os, sys; print(os.environ[\"SLURMD_NODENAME\"], "
                             "hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'",
                     input=payload))
    digest = hashlib.sha256(payload.encode()).hexdigest()
    assert sorted(out.splitlines()) == [f"{n} {digest}" for n in NODES]
    # --input=0: only task 0 reads it, the others see EOF at once
    out = ok(lab.ssh("main", "srun -N2 --ntasks-per-node=1 --input=0 sh -c 'echo $SLURM_PROCID $(wc -c)'",
                     input="abc\n"))
    assert sorted(out.splitlines()) == ["0 4", "1 0"]


def test_salloc_then_overlapping_per_node_steps_then_scancel(lab, cluster):
    proc = lab.ssh("main", "salloc -N4 --no-shell")
    ok(proc)
    job = re.search(r"Granted job allocation (\d+)", proc.stderr).group(1)
    try:
        assert ok(lab.ssh("main", f"squeue -h -j {job} -o '%T %D %N'")).strip() == "RUNNING 4 n[1-4]"
        assert ok(lab.ssh("main", f"srun --jobid={job} -N1 -w n2 --overlap hostname")).strip() == "n2"
        # concurrent per-node steps inside one allocation
        procs = [subprocess.Popen(lab.ssh_argv("main", f"srun --jobid={job} -N1 -w {n} --overlap "
                                                       "sh -c 'echo $SLURMD_NODENAME $SLURM_JOB_ID'"),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for n in NODES]
        outs = [p.communicate(timeout=60) for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, outs
        assert [o.strip() for o, _ in outs] == [f"{n} {job}" for n in NODES]
    finally:
        ok(lab.ssh("main", f"scancel {job}"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = ok(lab.ssh("main", f"squeue -h -t all -j {job} -o %T")).strip()
        if state in ("CANCELLED", ""):
            break
        time.sleep(0.2)
    assert state in ("CANCELLED", "")


# signal, in an allocation?, expected message (srun's stderr)
FAULTS = {
    "stopped": (signal.SIGSTOP, False, "Socket timed out on send/recv operation"),
    "killed": (signal.SIGKILL, False, "Communication connection failure"),
    "killed-in-allocation": (signal.SIGKILL, True, "Communication connection failure"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_step_on_a_dead_node_fails_while_the_others_work(lab, cluster, fault):
    sig, in_allocation, message = FAULTS[fault]
    job_opts = ""
    if in_allocation:
        proc = lab.ssh("main", "salloc -N4 --no-shell")
        job = re.search(r"Granted job allocation (\d+)", ok(proc) + proc.stderr).group(1)
        job_opts = f"--jobid={job} --overlap "
    try:
        lab.slurm_stop_node("n3", sig)
        proc, seconds = timed_ssh(lab, f"srun {job_opts}-N1 -w n3 hostname", timeout=90)
        report(f"srun on a {fault} node fails (rc={proc.returncode}, "
               f"stderr={proc.stderr.strip()!r})", seconds)
        assert proc.returncode != 0
        assert re.search(r"Task launch for StepId=\d+\.\d+ failed on node n3: " + re.escape(message),
                         proc.stderr), proc.stderr
        assert seconds < 60
        for node in ("n1", "n2", "n4"):
            assert ok(lab.ssh("main", f"srun {job_opts}-N1 -w {node} hostname")).strip() == node
    finally:
        t = time.monotonic()
        lab.slurm_start_node("n3")
        report(f"slurm_start_node after {fault}", time.monotonic() - t)
        if in_allocation:
            lab.ssh("main", f"scancel {job}")
    cluster.wait_idle(timeout=30)
    out = ok(lab.ssh("main", "srun -N4 --ntasks-per-node=1 hostname"))
    assert sorted(out.split()) == NODES


def _on_node(cluster, node: str, program: str, marker: str):
    """PIDs on `node` running `program` (slurmstepd execs it by full path) with `marker` in argv."""
    return [p for p in cluster.node_pids(node)
            if (argv := cmdline(p)) and os.path.basename(argv[0]) == program and marker in argv[1:]]


def _wait(predicate, timeout: float = 20):
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def test_cutting_the_ssh_connection_closes_the_tasks_stdin(lab, cluster):
    """No pty, so no SIGHUP: when the client goes away, sshd closes srun's stdin and srun
    passes the EOF on to the task — a task that reads stdin ends, one that does not (sleep)
    outlives the connection until scancel. node_pids sees both from this machine."""
    marker = f"31.{os.getpid()}"
    reader = "import sys; sys.stdin.read()"
    clients = [subprocess.Popen(lab.ssh_argv("main", f"srun -N1 -w n4 --job-name=mldiag-cut-{os.getpid()} "
                                                     f"{argv}"),
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for argv in (f"sleep {marker}", f"python3 -c '{reader}' {marker}")]
    try:
        assert _wait(lambda: _on_node(cluster, "n4", "sleep", marker)
                     and _on_node(cluster, "n4", "python3", marker))
        mlsh = pwd.getpwnam("mlsh").pw_uid
        assert {uid_of(p) for p in _on_node(cluster, "n4", "sleep", marker)} == {mlsh}
        assert cluster.node_pid("n4") not in cluster.node_pids("n4")
        assert cluster.node_pid("n4") in cluster.node_pids("n4", include_slurmd=True)
        for c in clients:
            c.kill()  # the ssh client, as a user's Ctrl-C or a client-side timeout would
            c.wait()
        assert _wait(lambda: not _on_node(cluster, "n4", "python3", marker))
        time.sleep(1)
        assert _on_node(cluster, "n4", "sleep", marker)  # still running (so is its srun)
    finally:
        lab.ssh("main", f"scancel -u mlsh --name=mldiag-cut-{os.getpid()}")
    assert _wait(lambda: not cluster.node_pids("n4"))


def test_cluster_teardown_leaves_nothing_and_restarts(lab):
    """A cluster of its own (2 nodes) beside the lab's: stop() kills the daemons, slurmstepd
    and the tasks (one left running), and a new cluster in the same dir starts again."""
    lab.need("slurm")
    d = lab.dir / "slurm-teardown"
    for round_ in ("first", "second"):
        c = slurm.SlurmCluster(d, visible_root=lab.root, nodes=("n1", "n2"))
        job = None
        t = time.monotonic()
        try:
            c.start()
            report(f"2-node cluster start ({round_} in this dir)", time.monotonic() - t)
            job = subprocess.Popen(["srun", "-N1", "-w", "n2", "sleep", "300"], env={**os.environ, **c.env},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
            assert _wait(lambda: c.node_pids("n2"))
            left = c.node_pids("n2", include_slurmd=True)
            state = c.state()
        finally:
            c.stop()
            if job:
                job.kill()
                job.wait()
        assert [p for p in left if state_of(p) not in (None, "Z")] == []
        assert [p for p in all_pids() if str(d) + "/" in " ".join(cmdline(p) or [])] == []
        slurm.teardown(state)  # idempotent
    assert str(d) not in open("/proc/self/mounts").read()
