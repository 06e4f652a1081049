"""Slurm targets against the lab's real 4-node cluster (munge + slurmctld + 4 slurmd, each with
a private /tmp): login host `main` over SSH → one srun step per node → the runtime."""

import json
import os
import re
import signal
import time
from functools import partial

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology
from tests import programs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOSTS = """\
defaults: {connect_timeout: 5, timeout: 60}
hosts:
  cluster-a:
    address: main
    slurm: {partition: debug, nodes: 4, time: "00:05:00"}
  cluster-b:
    address: main
    slurm: {nodes: 3, nodelist: "n[1-3]"}
"""


@pytest.fixture(scope="module")
def hosts_file(lab):
    lab.need("slurm")
    return lab.hosts_yaml(HOSTS)


mldiag = partial(programs.mldiag, timeout=180)


def jobs_of_mlsh(lab):
    out = lab.ssh("main", "squeue", "-h", "-u", "mlsh", "-o", "%i")
    return out.stdout.split()


def test_gpu_status_on_all_four_nodes_through_srun(lab, hosts_file):
    tmp_before = {n: set(lab.slurm_tmp(n)) for n in lab.slurm_nodes}
    r = mldiag("gpu-status", "--hosts-file", str(hosts_file), "-H", "cluster-a", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    docs = json.loads(r.stdout)
    assert [d["target"] for d in docs] == ["cluster-a:n1", "cluster-a:n2", "cluster-a:n3", "cluster-a:n4"]
    for d in docs:
        assert d["status"] == "ok", d["summary"]
        assert d["data"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    # the allocation is released and no node's private /tmp keeps anything of ours
    assert jobs_of_mlsh(lab) == []
    for n in lab.slurm_nodes:
        assert set(lab.slurm_tmp(n)) - tmp_before[n] == set()


def test_each_row_ran_on_its_own_node_and_a_node_can_be_selected(lab, hosts_file):
    topo = topology.load(str(hosts_file))
    results = runner.run_many(topo.select(["cluster-b", "cluster-a:n4"]), bundle.script_job("ping"))
    by_name = {r.target: r for r in results}
    assert sorted(by_name) == ["cluster-a:n4", "cluster-b:n1", "cluster-b:n2", "cluster-b:n3"]
    for name, r in by_name.items():
        assert r.status == "ok", r.summary
        assert r.data["hostname"] == name.split(":")[1]     # each slurmd has its own UTS name
        assert r.data["user"] == "mlsh"


def test_a_dead_node_is_reported_while_the_others_report(lab, hosts_file):
    lab.slurm_stop_node("n3", signal.SIGKILL)
    try:
        t0 = time.monotonic()
        r = mldiag("gpu-status", "--hosts-file", str(hosts_file), "-H", "cluster-a", "--json")
        elapsed = time.monotonic() - t0
    finally:
        lab.slurm_start_node("n3")
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    assert r.returncode == 3, r.stderr
    for node in ("n1", "n2", "n4"):             # the other three still report
        assert docs[f"cluster-a:{node}"]["status"] == "ok", docs[f"cluster-a:{node}"]["summary"]
    dead = docs["cluster-a:n3"]
    assert dead["status"] == "error" and dead["error"]["layer"] == "unreachable"
    assert "slurm node n3" in dead["error"]["message"]
    assert elapsed < 60 + 15
    assert jobs_of_mlsh(lab) == []


def test_a_hung_node_is_reported_within_the_timeout_while_the_others_report(lab, hosts_file):
    """n2's slurmd is SIGSTOPped (a node wedged in D state looks like this to srun): its row
    ends at the client-side bound (timeout + grace), the other three report at once."""
    lab.slurm_stop_node("n2", signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        r = mldiag("ping", "--hosts-file", str(hosts_file), "-H", "cluster-a", "--json",
                   "--timeout", "5")
        elapsed = time.monotonic() - t0
    finally:
        lab.slurm_start_node("n2")
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    assert r.returncode == 3, r.stderr
    for node in ("n1", "n3", "n4"):
        assert docs[f"cluster-a:{node}"]["status"] == "ok", docs[f"cluster-a:{node}"]["summary"]
    hung = docs["cluster-a:n2"]
    # srun gives up first here (MessageTimeout, 10 s by default: "slurm node n2: srun: error:
    # ... Socket timed out on send/recv operation", after ~15 s); with a longer MessageTimeout
    # the client's own bound (timeout + grace) ends the row as `timeout`
    assert hung["status"] == "error" and hung["error"]["layer"] in ("timeout", "unreachable"), hung
    if hung["error"]["layer"] == "unreachable":
        assert "slurm node n2" in hung["error"]["message"], hung
    assert elapsed < 5 + runner.CLIENT_GRACE_S + 15, elapsed
    end = time.monotonic() + 30       # the allocation is cancelled once n2 answers again
    while jobs_of_mlsh(lab) and time.monotonic() < end:
        time.sleep(0.5)
    assert jobs_of_mlsh(lab) == []


def test_interpreter_and_env_settings_apply_inside_the_allocation(lab, tmp_path):
    hosts_file = lab.hosts_yaml(HOSTS.replace(
        "    slurm: {nodes: 3, nodelist: \"n[1-3]\"}\n",
        "    slurm: {nodes: 3, nodelist: \"n[1-3]\"}\n"
        "    python: /usr/bin/python3\n"
        "    env: {MLDIAG_PROBE: from-hosts-yaml, HF_HOME: /dev/shm/hf}\n"))
    script = tmp_path / "probe.py"
    script.write_text("import os, socket, sys\n"
                      "print(sys.executable, socket.gethostname(), os.environ['MLDIAG_PROBE'],"
                      " os.environ['HF_HOME'])\n")
    r = mldiag("run-script", str(script), "--hosts-file", str(hosts_file), "-H", "cluster-b", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    outs = {d["target"]: d["data"]["stdout"] for d in json.loads(r.stdout)}
    assert outs == {f"cluster-b:n{i}": f"/usr/bin/python3 n{i} from-hosts-yaml /dev/shm/hf\n"
                    for i in (1, 2, 3)}


def test_node_health_runbook_on_a_slurm_cluster(lab, hosts_file, tmp_path):
    """The steps of a runbook on a Slurm login target share one allocation (one salloc, one
    scancel at the end); every node is a row of every step, and no allocation is left behind."""
    recorded = tmp_path / "commands.jsonl"
    r = mldiag("runbook", "node-health", "--hosts-file", str(hosts_file), "-H", "cluster-a",
               "--format", "json", "--save", str(tmp_path / "out"),
               env={"MLDIAG_RECORD_COMMANDS": str(recorded)})
    lines = [json.loads(line)["line"] for line in recorded.read_text().splitlines()]
    assert sum(" salloc " in f" {line} " for line in lines) == 1, lines
    assert sum(" scancel " in f" {line} " for line in lines) == 1, lines
    doc = json.loads(r.stdout)
    rows = [f"cluster-a:n{i}" for i in range(1, 5)]
    ran = {step["id"]: {res["target"]: res["status"] for res in step["results"]} for step in doc["steps"]}
    assert ran["ping"] == dict.fromkeys(rows, "ok") and ran["gpu-status"] == dict.fromkeys(rows, "ok")
    assert ran["xid"] == {}
    # the nodes' system python: env-report may warn about `pip check` (a distro package's broken
    # requirement), the same on every node; nothing else
    env = next(step for step in doc["steps"] if step["id"] == "env-report")["results"]
    assert sorted(res["target"] for res in env) == rows
    assert len({res["status"] for res in env}) == 1 and env[0]["status"] in ("ok", "warn")
    assert {f["code"] for res in env for f in res["findings"] if f["level"] != "info"} <= {"pip-check"}
    assert r.returncode == {"ok": 0, "warn": 1}[env[0]["status"]], r.stderr
    xid = next(step for step in doc["steps"] if step["id"] == "xid")
    assert [s["kind"] for s in xid["skipped"]] == ["param"], xid["skipped"]
    assert (tmp_path / "out" / "report.md").read_text().startswith("# Runbook `node-health`")
    assert jobs_of_mlsh(lab) == []


def steps_of_mlsh(lab):
    out = lab.ssh("main", "squeue", "-h", "-s", "-u", "mlsh", "-o", "%i")
    return [s for s in out.stdout.split() if "." in s and not s.endswith((".extern", ".batch"))]


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_term_and_hup_cancel_the_allocation(lab, hosts_file, tmp_path, sig, code):
    """A CI timeout (TERM) or a closed terminal (HUP) while every node runs its step: the
    allocation is cancelled, as after Ctrl-C, and the exit code is 128 + signal."""
    script = tmp_path / "sleepy.py"
    script.write_text("import time\ntime.sleep(600)\n")
    save = tmp_path / "saved"
    with programs.running_mldiag("run-script", script, "--hosts-file", hosts_file, "-H", "cluster-a",
                                "--save", save, "--timeout", "300") as proc:
        end = time.monotonic() + 60
        while len(steps_of_mlsh(lab)) < 4:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, "no allocation with 4 running steps within 60 s"
            time.sleep(0.5)
        assert len(jobs_of_mlsh(lab)) == 1
        out, err = programs.signal_and_wait(proc, sig, 60)
    assert proc.returncode == code, (proc.returncode, err)
    assert err.startswith(f"mldiag: terminated ({signal.Signals(sig).name}) (0 of 1 targets "), err
    summary = json.loads((save / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["exit_code"] == code
    end = time.monotonic() + 15       # a cancelled job may show as completing for a moment
    while jobs_of_mlsh(lab) and time.monotonic() < end:
        time.sleep(0.5)
    assert jobs_of_mlsh(lab) == []


def test_term_while_the_allocation_waits_in_the_queue_leaves_no_job(lab, hosts_file):
    """TERM while salloc still waits (every node held by another job): the pending request
    goes too, and so does an allocation granted just as the run ends."""
    blocker = lab.ssh("main", "salloc --no-shell --exclusive -N4 -J blocker -t 5")
    jobid = slurm_granted(blocker.stderr + blocker.stdout)
    try:
        with programs.running_mldiag("ping", "--hosts-file", hosts_file, "-H", "cluster-a") as proc:
            end = time.monotonic() + 60
            while not mldiag_jobs(lab):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < end, "mldiag's salloc never queued"
                time.sleep(0.5)
            _, err = programs.signal_and_wait(proc, signal.SIGTERM, 60)
        assert proc.returncode == 143, (proc.returncode, err)
        assert err.startswith("mldiag: terminated (SIGTERM)"), err
        end = time.monotonic() + 15
        while mldiag_jobs(lab) and time.monotonic() < end:
            time.sleep(0.5)
        assert mldiag_jobs(lab) == []
    finally:
        lab.ssh("main", "scancel", jobid)


def slurm_granted(text):
    match = re.search(r"Granted job allocation (\d+)", text)
    assert match, text
    return match.group(1)


def mldiag_jobs(lab):
    names = lab.ssh("main", "squeue", "-h", "-u", "mlsh", "-o", "%j").stdout.split()
    return [name for name in names if name.startswith("mldiag")]
