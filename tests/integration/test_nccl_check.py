"""nccl-check in the lab: real ranks (torch.distributed with gloo) started inside an LXC
container behind `ssh main → sudo → pct`, measuring a real all-reduce; a rank killed in the
middle of the run, and a run past its budget: a finding each, every other rank ended, nothing of
the run left in the container."""

import json
import os
import signal
import subprocess
import time

import pytest

from tests.integration.test_diagnostics_remote import VENV_PY, ct, hosts_file, packages_in_ct
from tests.programs import mldiag, start_mldiag


@pytest.fixture(scope="module")
def torch_hosts(lab):
    """Three targets in CT 200 whose interpreter imports this process's torch."""
    env, _ = packages_in_ct(lab, "torch")
    return hosts_file(lab, [ct(name, env=env) for name in ("n1", "n2", "n3")])


def ranks_running():
    """(pid, command line) of every rank of an nccl-check run in the CT: this machine's process
    list holds its containers' processes too (one kernel), the CT's ranks are those started by its
    interpreter (a test run elsewhere on this machine starts its ranks with another)."""
    out = subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if args.startswith(VENV_PY + " ") and "nccl_check.py" in args and "--worker" in args:
            found.append((int(pid), args))
    return found


def wait_for_ranks(proc, n, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        found = ranks_running()
        if len(found) >= n:
            return found
        time.sleep(0.1)
    said = proc.communicate(timeout=30) if proc.poll() is not None else ("", "")
    raise AssertionError(f"fewer than {n} ranks started within {timeout} s: {ranks_running()}; {said}")


def no_ranks_left(timeout=10):
    deadline = time.monotonic() + timeout
    while ranks_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    return ranks_running() == []


def docs(r):
    return {d["target"]: d for d in json.loads(r.stdout)}


def test_containers_meet_at_their_peer_address(lab):
    """Two container targets in CT 200 (its own network namespace: loopback only) as one group:
    mldiag connects to them through their host, so the first one's hosts.yaml peer_address says
    where the other's ranks reach it (here, the CT's loopback); without it the group cannot
    start and says why."""
    env, _ = packages_in_ct(lab, "torch")
    path = hosts_file(lab, [ct("c1", env=env, peer_address="127.0.0.1"), ct("c2", env=env), ct("c3", env=env)])
    small = ["--max-bytes", str(2 ** 20), "--iters", "2", "--budget", "60", "--json"]
    r = mldiag("nccl-check", "--hosts-file", path, "-H", "c1,c2", "--across", *small, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    found = docs(r)
    assert [found[n]["data"]["group"]["master"].split(":")[0] for n in ("c1", "c2")] == ["127.0.0.1"] * 2
    assert all(found[n]["status"] == "ok" and found[n]["data"]["rows"][-1]["busbw"] > 0 for n in ("c1", "c2"))
    r = mldiag("nccl-check", "--hosts-file", path, "-H", "c3,c1", "--across", *small, timeout=300)
    assert r.returncode == 3, r.stdout + r.stderr
    assert {d["error"]["message"] for d in docs(r).values()} == {
        "c3: no address its peers reach it by is known (a container: give it hosts.yaml's peer_address)"}
    assert no_ranks_left()


def test_each_node_measures_a_real_all_reduce_in_its_container(torch_hosts):
    r = mldiag("nccl-check", "--hosts-file", torch_hosts, "-H", "n1,n2,n3", "--parallel", "1",
               "--max-bytes", str(4 * 2 ** 20), "--iters", "3", "--json", "--valid-for", "0",
               # three nodes in one container on 2 shared cores measure 0.8-3.4 GB/s: the fleet
               # judgement is tests/unit's (and a slowed link's, with pairs); here, the measurement
               "--fleet-pct", "1", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for name, doc in docs(r).items():
        d = doc["data"]
        assert doc["status"] == "ok" and doc["findings"] == [], (name, doc["findings"])
        assert (d["backend"], d["ranks"], d["op"], d["judged"]) == ("torch-gloo", 2, "all_reduce", None)
        assert [row["size"] for row in d["rows"]] == [2 ** 20, 2 ** 21, 2 ** 22]
        assert all(row["busbw"] > 0 for row in d["rows"])
    assert no_ranks_left()


def test_a_rank_killed_mid_run_is_a_finding_and_ends_the_others(torch_hosts):
    proc = start_mldiag("nccl-check", "--hosts-file", torch_hosts, "-H", "n1", "--ranks", "3",
                        "--iters", "100000", "--budget", "120", "--json", "--valid-for", "0")
    try:
        ranks = wait_for_ranks(proc, 3)
        time.sleep(1.0)                                 # the ranks are in their collectives now
        victim = next(pid for pid, args in ranks if "--worker 1" in args)
        os.kill(victim, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    doc = json.loads(out)[0]
    assert doc["status"] == "fail", doc
    codes = [(f["code"], f["action"]) for f in doc["findings"]]
    assert codes == [("launch-failed", "drain")], doc["findings"]
    assert doc["findings"][0]["message"].startswith("rank 1 exited -9")
    assert no_ranks_left()


def test_a_run_past_its_budget_is_ended_on_time(torch_hosts):
    t0 = time.monotonic()
    r = mldiag("nccl-check", "--hosts-file", torch_hosts, "-H", "n2", "--ranks", "2", "--iters", "100000",
               "--budget", "5", "--json", "--valid-for", "0", timeout=120)
    took = time.monotonic() - t0
    doc = docs(r)["n2"]
    (f,) = doc["findings"]
    assert (f["code"], f["action"]) == ("rank-timeout", "drain")
    assert f["message"].startswith("ranks 0,1 did not finish within 5 s")
    assert took < 40 and r.returncode == 2
    assert no_ranks_left()
