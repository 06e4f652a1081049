"""mldiag-node-health as slurmd runs it: slurm.conf's HealthCheckProgram= and Prolog= name the
installed console script itself (no wrapper, no arguments), on a real Slurm cluster of four
nodes h1..h4 (tests/lab/slurm.py, `lab.own_slurm`).

What each node sees: its own /etc/slurm (slurm.conf there, as a real node has it: slurmd gives
the program no SLURM_CONF) and its own /usr/local/bin, which holds the node's tools: the fake
nvidia-smi (a real H100 capture), and journalctl/dmesg replaying a real saved kernel log
(tests/fakes). slurmd gives the program no PATH: the program's own default path finds them
there, as it finds the real ones in /usr/bin on a real node. A fault is a different tool in
that directory: the kernel log with Xid 48 (double-bit ECC) and its row remap (drain level), or
an nvidia-smi that never answers.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lab.util import LabError, wait_until

pytestmark = pytest.mark.integration

NODES = ("h1", "h2", "h3", "h4")
ECC_LOG = "gpud-dmesg-time-format-iso.log"      # Xid 48 with Xid 63 beside it: drain
REPO = Path(__file__).resolve().parents[2]


def console_script() -> str:
    found = shutil.which("mldiag-node-health", path=os.path.dirname(sys.executable))
    if not found:
        pytest.fail("mldiag-node-health is not installed beside this interpreter: "
                    "pip install -e . (README) installs it")
    return found


class Node:
    """One node's /usr/local/bin: the tools its health check finds."""

    def __init__(self, lab, root: Path, name: str):
        self.lab, self.name, self.root = lab, name, root
        self.bin = root / "bin" / name
        self.calls = root / f"calls-{name}.log"
        self.bin.mkdir(parents=True, mode=0o755)
        self.calls.touch(mode=0o666)

    def tools(self, klog: str = "", smi_hang: int = 0) -> None:
        """(Re)write the node's tools: ``klog`` a saved kernel log's name (empty: an empty
        log), ``smi_hang`` seconds nvidia-smi sleeps before answering."""
        env = {"MLDIAG_FAKE_NVIDIA_SMI_LOG": str(self.calls), "MLDIAG_FAKE_KLOG_LOG": str(self.calls)}
        if klog:
            env["MLDIAG_FAKE_KLOG"] = klog
            env["MLDIAG_FAKE_KLOG_DIR"] = str(self.lab.fixtures_dir / "xid")
        else:
            env["MLDIAG_FAKE_KLOG"] = str(self.root / "empty.log")
        if smi_hang:
            env["MLDIAG_FAKE_NVIDIA_SMI_HANG"] = str(smi_hang)
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
        for tool in ("nvidia-smi", "journalctl", "dmesg"):
            text = f"#!/bin/sh\nexport {exports}\nexec {shlex.quote(str(self.lab.fakes_dir / tool))} \"$@\"\n"
            part = self.bin / f".{tool}.part"
            part.write_text(text)
            part.chmod(0o755)
            os.replace(part, self.bin / tool)     # the node sees the whole new file or the old

    def calls_seen(self) -> int:
        return len(self.calls.read_text().splitlines())


@pytest.fixture(scope="module")
def hc(lab):
    """The cluster with HealthCheckProgram= and Prolog= the console script; at its start h1 has
    the ECC fault, h3 a hung nvidia-smi, h2 and h4 are healthy."""
    program = console_script()
    root = lab.dir / "node-health"
    root.mkdir(mode=0o755)
    (root / "bin").mkdir(mode=0o755)
    (root / "empty.log").write_text("")
    # a path without spaces for slurm.conf, whatever the checkout's path
    link = root / "mldiag-node-health"
    link.symlink_to(program)
    etc = root / "etc-slurm"
    etc.mkdir(mode=0o755)
    nodes = {name: Node(lab, root, name) for name in NODES}
    nodes["h1"].tools(klog=ECC_LOG)
    nodes["h2"].tools()
    nodes["h3"].tools(smi_hang=600)
    nodes["h4"].tools()
    conf_dir = lab.dir / "slurm-health"
    # the node's /etc/slurm/slurm.conf is the cluster's (written by start(), before any slurmd)
    (etc / "slurm.conf").symlink_to(conf_dir / "slurm.conf")
    binds = {name: [(etc, "/etc/slurm"), (node.bin, "/usr/local/bin")] for name, node in nodes.items()}
    cluster = lab.own_slurm("health", NODES, node_binds=binds, also_visible=[REPO],
                            extra_conf=[f"HealthCheckProgram={link}", "HealthCheckInterval=3600",
                                        f"Prolog={link}"],
                            ready=("idle", "drain"))
    assert cluster.dir == conf_dir
    cluster.program, cluster.nodes_ = link, nodes
    try:
        yield cluster
    finally:
        lab.stop_own_slurm("health")


def show(cluster, node: str) -> dict:
    """scontrol's State and Reason (with Slurm's [user@time]) of ``node``."""
    line = cluster.cmd("scontrol", "show", "node", "-o", node, check=True).stdout
    state = re.search(r"\bState=(\S+)", line).group(1)
    reason = re.search(r"\bReason=(.*?)(?=\s+\w+=|\s*$)", line)
    return {"state": state, "reason": reason.group(1) if reason else None}


def log_of(cluster, node: str) -> str:
    return (cluster.log_dir / f"slurmd-{node}.log").read_text(errors="replace")


def restart(cluster, node: str, timeout: float = 60) -> None:
    """A new slurmd on ``node``: slurmd runs the health check once before it registers."""
    def started() -> int:   # slurmd's registration line: logged after the health check
        return log_of(cluster, node).count(" CPUSpecList=")

    before = started()
    cluster.stop_node(node, signal.SIGKILL)
    cluster._start_node(node)
    wait_until(lambda: started() > before, timeout, f"slurmd {node} to run its health check and register")


def test_slurmds_own_health_check_drains_the_faulty_node_with_mldiags_reason(hc):
    h1, h2 = show(hc, "h1"), show(hc, "h2")
    assert "DRAIN" in h1["state"]
    assert re.fullmatch(r"mldiag: xid-48 \(node-check by root \d{4}-\d\d-\d\dT\d\d:\d\dZ\) \[root@\S+\]",
                        h1["reason"]), h1
    assert h2["state"] == "IDLE" and h2["reason"] is None
    assert "health_check failed" not in log_of(hc, "h2")     # exit 0: nothing found
    # the check ran on the healthy node too (it read nvidia-smi and the kernel log there)
    assert hc.nodes_["h2"].calls_seen() >= 2
    # slurmd logged the failed health check with what mldiag printed
    assert re.search(r"health_check failed: rc:2 output:.*xid-48.*drained", log_of(hc, "h1"), re.S)


def test_a_hung_tool_is_a_finding_and_the_run_ends_within_its_budget(hc):
    h3 = show(hc, "h3")
    assert h3["state"] == "IDLE" and h3["reason"] is None   # a reboot-level finding drains nothing
    assert re.search(r"health_check failed: rc:2 output:.*tool-hung", log_of(hc, "h3"), re.S)
    # by hand, as slurmd runs it (its namespaces, no environment but SLURMD_NODENAME), timed
    pid = hc.node_pid("h3")
    for budget in (30, 12):
        t0 = time.monotonic()
        run = subprocess.run(["nsenter", "-t", str(pid), "-m", "-u", "--", "env", "-i",
                              "SLURMD_NODENAME=h3", str(hc.program), "--budget", str(budget)],
                             capture_output=True, text=True, timeout=budget + 30)
        took = time.monotonic() - t0
        assert run.returncode == 2, run.stdout + run.stderr
        assert "tool-hung" in run.stdout and took <= budget, (took, run.stdout)
    # the hung nvidia-smi was killed with its process group: nothing of the runs is left there
    assert hc.node_pids("h3") == []


def test_a_node_someone_else_drained_is_left_alone(hc):
    hc.cmd("scontrol", "update", "nodename=h4", "state=drain", "reason=cable swap", check=True)
    hc.nodes_["h4"].tools(klog=ECC_LOG)
    restart(hc, "h4")
    h4 = show(hc, "h4")
    assert "DRAIN" in h4["state"] and h4["reason"].startswith("cable swap [root@"), h4
    assert re.search(r"left alone: drained by someone else", log_of(hc, "h4"))
    # healthy again, it stays drained: the drain is not mldiag's
    hc.nodes_["h4"].tools()
    restart(hc, "h4")
    assert show(hc, "h4")["reason"].startswith("cable swap [root@")


def test_a_node_that_passes_again_is_resumed_from_mldiags_own_drain(hc):
    assert show(hc, "h1")["reason"].startswith("mldiag: xid-48")
    hc.nodes_["h1"].tools()
    restart(hc, "h1")
    h1 = show(hc, "h1")
    assert h1["state"] == "IDLE" and h1["reason"] is None, h1


def test_a_prolog_that_finds_a_fault_drains_the_node_and_requeues_the_job(hc):
    def submit():
        out = hc.cmd("sbatch", "--parsable", "-w", "h2", "-o", "/dev/null", "--wrap", "true",
                     check=True).stdout
        return out.strip().split(";")[0]

    def job(jobid):
        return hc.cmd("scontrol", "show", "job", "-o", jobid).stdout

    # healthy: the prolog passes and the job runs
    first = submit()
    wait_until(lambda: "JobState=COMPLETED" in job(first), 60, "the first job to complete")
    # the fault: the prolog drains the node, Slurm requeues the job
    hc.nodes_["h2"].tools(klog=ECC_LOG)
    second = submit()
    try:
        wait_until(lambda: "DRAIN" in show(hc, "h2")["state"], 60, "h2 to be drained")
        wait_until(lambda: "JobState=PENDING" in job(second), 60, "the job to be requeued")
    except LabError:
        raise AssertionError(f"{show(hc, 'h2')}\n{job(second)}\n{log_of(hc, 'h2')[-3000:]}")
    h2 = show(hc, "h2")
    assert h2["reason"].startswith("mldiag: xid-48 (node-check by root "), h2
    # requeued and held, as slurm.conf(5) says of a failed prolog
    assert re.search(r"\bRestarts=1\b", job(second)) and "Reason=launch_failed_requeued_held" in job(second), job(second)
    hc.cmd("scancel", second)
