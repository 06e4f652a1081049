"""stacks --window on a real slow job (tests/fixtures/stacks/slow_gloo_job.py): a 4-rank gloo
job over two nodes, the lab host (ranks 0-1, reached as `box-sudo`: ssh main → sudo) and LXC CT
200 (ranks 2-3, `ct`: ssh → sudo → pct), torchrun on both as in test_stacks.py. With one rank
doing extra work every step, the others wait for it in all_reduce: it is the straggler, named
with its target, pid and the frame it spends its time in. With all ranks equal, nobody is named
in 20 windows. The stacks are read with the standard-library reader (--no-upload): no py-spy,
no process paused."""

import json
import time
import uuid
from functools import partial
from pathlib import Path

import pytest

from tests import programs
from tests.integration.test_stacks import end_two_nodes, job_ranks, start_two_nodes
from tests.integration.test_diagnostics_remote import ct
from tests.lab import lxc

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "fixtures" / "stacks" / "slow_gloo_job.py"
mldiag = partial(programs.mldiag, timeout=180)
START_DEADLINE = 240


@pytest.fixture(scope="module")
def hosts(lab):
    return lab.hosts_yaml("defaults: {connect_timeout: 5, timeout: 120}\n"
                          "hosts:\n"
                          "  box-sudo: {address: main, become: sudo, python: /usr/bin/python3}\n"
                          "  pve:\n"
                          "    address: main\n"
                          "    become: sudo\n"
                          "    containers:\n" + ct("ct"))


@pytest.fixture(scope="module")
def gpu_hosts(lab):
    """The same two nodes, each with GPUs (the fake nvidia-smi: no GPU here): the host's 8 spin
    in a collective (derived__h200x8__spin-in-collective), the CT's compute (the H200 capture's
    load phase)."""
    spin = {"MLDIAG_FAKE_NVIDIA_SMI": "derived__h200x8__spin-in-collective"}
    work = {"MLDIAG_FAKE_NVIDIA_SMI": "derived__h200x8__healthy", "MLDIAG_FAKE_NVIDIA_SMI_PHASE": "load"}
    return lab.hosts_yaml("defaults: {connect_timeout: 5, timeout: 120}\n"
                          "hosts:\n"
                          f"  box-sudo: {{address: main, become: sudo, python: /usr/bin/python3, env: {json.dumps(spin)}}}\n"
                          "  pve:\n"
                          "    address: main\n"
                          "    become: sudo\n"
                          "    containers:\n" + ct("ct", env=work))


def start_job(lab, work, slow_rank, log_prefix):
    """The 4-rank job (node 0 here, node 1 in CT 200), each rank logging to log_prefix<rank>.log
    on its own node; returns (procs, logs, stop file)."""
    stop = work / "stop"
    job_env = {"SLOW_RANK": str(slow_rank), "STOP_FILE": str(stop), "LOG_PREFIX": log_prefix,
               # the slow rank's busy loop 7x its 0.05 s sleep: the frame its time goes to is
               # extra_work in 7 of 8 samples. At 0.15 s (3 of 4) a window of 18 samples once
               # showed main (its sleep) more often, in CI: about a 2 % chance a window
               "EXTRA_S": "0.35"}
    procs, logs = start_two_nodes(lab, work, JOB, job_env, job_env)
    end = time.monotonic() + START_DEADLINE
    while sum(log.read_text(errors="replace").count("warm ") for log in logs) < 4:
        if any(p.poll() is not None for p in procs) or time.monotonic() > end:
            text = "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-3000:]}" for log in logs)
            stop_job(procs, stop)
            pytest.fail(f"the slow job did not start:\n{text}")
        time.sleep(0.2)
    time.sleep(1.0)
    return procs, logs, stop


def stop_job(procs, stop):
    stop.touch()
    end = time.monotonic() + 30
    while any(p.poll() is None for p in procs) and time.monotonic() < end:
        time.sleep(0.2)
    end_two_nodes(procs, JOB)


@pytest.fixture
def job(lab, tmp_path, request):
    # the same path on both nodes, as a job's --log-dir is: each node holds its own ranks' logs
    prefix = f"/tmp/mldiag-slowjob-{uuid.uuid4().hex[:8]}-rank"
    procs, logs, stop = start_job(lab, tmp_path, request.param, prefix)
    ct_root = Path(f"/proc/{lxc.init_pid(lab.lxc_path, lab.ct_running)}/root")
    rank_logs = [Path(f"{prefix}0.log"), Path(f"{prefix}1.log"), Path(f"{ct_root}{prefix}2.log"),
                 Path(f"{ct_root}{prefix}3.log")]
    try:
        yield {"procs": procs, "logs": logs, "host": job_ranks(JOB.name, GROUP_RANK="0"),
               "ct": job_ranks(JOB.name, GROUP_RANK="1"), "pattern": prefix + "{rank}.log"}
    finally:
        stop_job(procs, stop)
        for log in rank_logs:
            try:
                log.unlink()
            except OSError:
                pass


def step_times(hosts, job):
    """step-times on both nodes with one pattern: each reads its own ranks' logs, the client
    compares the four ranks across the two targets."""
    r = mldiag("step-times", "--hosts-file", hosts, "-H", "box-sudo,ct", "--log-pattern", job["pattern"],
               "--ranks", "4", "--json")
    assert "Traceback" not in r.stderr, r.stderr
    return r, {d["target"]: d for d in json.loads(r.stdout)}


def windows(r):
    assert "Traceback" not in r.stderr, r.stderr
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    shares = {p["rank"]: p["window"]["wait_share"] for d in docs.values() for p in d["data"]["processes"]}
    return docs, shares


@pytest.mark.parametrize("job", [3], indirect=True)
def test_the_rank_the_others_wait_for_is_named(hosts, gpu_hosts, job):
    """The straggler rank from the stacks, its node from the GPUs (sampled on each target over
    the same window), the rank again from the logs, and the runbook's verdict."""
    r = mldiag("stacks", "--hosts-file", gpu_hosts, "-H", "box-sudo,ct", "--no-upload", "--window", "3",
               "--rate", "5", "--json")
    docs, shares = windows(r)
    print("straggler job, wait shares:", shares, [(p["rank"], p["window"]) for d in docs.values()
                                                   for p in d["data"]["processes"]])
    assert r.returncode == 2, r.stdout + r.stderr
    straggler = [f for f in docs["ct"]["findings"] if f["code"] == "straggler"]
    assert len(straggler) == 1, (shares, [f["message"] for f in straggler])
    gpus = {t: d["data"]["gpu_window"] for t, d in docs.items()}
    assert all(g["error"] is None and g["queries"] >= 2 and len(g["gpus"]) == 8 for g in gpus.values()), gpus
    node = [f["message"] for f in docs["ct"]["findings"] if f["code"] == "straggler-node"]
    assert node == ["ct's 8 GPUs compute: util 100 %, power 90 % of limit (median GPU over the window), "
                    "while the GPUs of the other node spin in a collective (util ≥ 90 %, power ≤ 50 % of "
                    "limit): the node they wait for"], docs["ct"]["findings"]
    pid3 = next(p["pid"] for p in docs["ct"]["data"]["processes"] if p["rank"] == 3)
    assert straggler[0]["message"].startswith(f"rank 3 (pid {pid3} on ct) waited in collectives ")
    assert "its time goes to extra_work (" in straggler[0]["message"], straggler[0]["message"]
    assert not any(f["code"].startswith("straggler") for f in docs["box-sudo"]["findings"])
    assert shares[3] < 0.2 and min(shares[r] for r in (0, 1, 2)) > 0.4, shares

    r, docs = step_times(hosts, job)          # the same rank, from the logs on its own node
    assert r.returncode == 2, r.stdout + r.stderr
    assert [(t, f["code"], f["message"].split(" is ")[0]) for t, d in docs.items() for f in d["findings"]
            if f["code"] != "not-here"] == [("ct", "straggler", "rank 3 on ct")]

    r = mldiag("runbook", "slow-or-hung", "--hosts-file", hosts, "-H", "box-sudo,ct", "--param", "window=3",
               "--json")                      # the runbook's verdict: slow, the straggler its evidence
    report = json.loads(r.stdout)
    assert report["verdict"]["verdict"] == "slow", report["verdict"]
    assert [(e["step"], e["target"], e["code"]) for e in report["verdict"]["evidence"]] == [("stacks", "ct", "straggler")]


@pytest.mark.parametrize("job", [-1], indirect=True)
def test_an_equal_job_names_nobody_in_20_windows(hosts, job):
    seen = []
    for _ in range(20):
        r = mldiag("stacks", "--hosts-file", hosts, "-H", "box-sudo,ct", "--no-upload", "--window", "1",
                   "--rate", "10", "--json")
        docs, shares = windows(r)
        seen.append(shares)
        assert not any(f["code"] == "straggler" for d in docs.values() for f in d["findings"]), (shares, r.stdout)
    print("equal job, wait shares per window:", seen)
    r, docs = step_times(hosts, job)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {t: [f["code"] for f in d["findings"]] for t, d in docs.items()} == {
        "box-sudo": ["not-here"], "ct": ["not-here"]}, r.stdout
