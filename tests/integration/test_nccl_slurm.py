"""nccl-check's groups through Slurm: the lab's 4-node cluster (tests/lab/slurm.py), each member
its own `srun --overlap` step in the one allocation mldiag makes, all started together, their
ranks meeting at the first node's NodeAddr (`scontrol show node`) and measuring a real
all-reduce (torch.distributed, gloo). The lab's main cluster shares this machine's network
(NodeAddr 127.0.0.1); its second cluster (lab.fleet_slurm()) has each slurmd in a fleet node's
network namespace, so one Slurm node's link can be slowed (tc tbf) and the two passes must name
exactly that node, as they do over SSH (test_nccl_pairs.py)."""

import json
import subprocess

import pytest

from tests.programs import mldiag, space_free

SMALL = ["--max-bytes", str(2 ** 20), "--iters", "2", "--budget", "60", "--valid-for", "0"]


def node_python(lab):
    """This checkout's interpreter, through a wrapper the nodes see (the lab's directory is bound
    into their private /tmp; the virtualenv too: SlurmCluster's also_visible)."""
    import sys
    wrapper_dir = lab.dir / "nccl-slurm-python"
    wrapper_dir.mkdir(mode=0o755, exist_ok=True)
    wrapper = wrapper_dir / "python"
    wrapper.write_text(open(space_free(sys.executable)).read())
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture(scope="module")
def cluster_hosts(lab):
    """The cluster behind `main`, as root (become: sudo) so that its jobs run this checkout's
    virtualenv."""
    lab.need("slurm")
    wrapper = node_python(lab)
    return lab.hosts_yaml(
        "defaults: {connect_timeout: 5, timeout: 120}\n"
        "hosts:\n"
        "  cluster:\n"
        "    address: main\n"
        "    become: sudo\n"
        f"    python: {wrapper}\n"
        "    env: {GLOO_SOCKET_IFNAME: lo}\n"
        "    slurm: {partition: debug, nodes: 4, time: \"00:05:00\"}\n")


def left_on_nodes():
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "nccl_check.py" in line and "--nodes " in line]


def test_across_four_slurm_nodes_is_one_collective_over_srun(cluster_hosts):
    r = mldiag("nccl-check", "--hosts-file", cluster_hosts, "-H", "cluster", "--across", "--json", *SMALL,
               timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    assert sorted(docs) == ["cluster:n1", "cluster:n2", "cluster:n3", "cluster:n4"]
    masters = {d["data"]["group"]["master"] for d in docs.values()}
    assert len(masters) == 1 and next(iter(masters)).startswith("127.0.0.1:")     # n1's NodeAddr
    assert sorted(d["data"]["group"]["node_rank"] for d in docs.values()) == [0, 1, 2, 3]
    for d in docs.values():
        assert d["status"] == "ok" and d["data"]["rows"][-1]["busbw"] > 0, d
    assert left_on_nodes() == []


@pytest.fixture(scope="module")
def fleet_cluster(lab):
    """The lab's second cluster, s1-s6 on the fleet's network; its login node is this machine
    (a local target with slurm:, SLURM_CONF in mldiag's environment)."""
    cluster = lab.fleet_slurm()
    hosts = lab.hosts_yaml(
        "defaults: {timeout: 240}\n"
        "hosts:\n"
        "  fleet:\n"
        "    local: true\n"
        f"    python: {node_python(lab)}\n"
        "    env: {GLOO_SOCKET_IFNAME: eth0}\n"
        "    slurm: {nodes: 6, time: \"00:10:00\"}\n")
    return cluster, hosts


def test_the_slurm_node_with_the_slow_link_is_named_in_two_passes(lab, fleet_cluster):
    """s5's link slowed (tc tbf on its veth, both ends): pass 1 pairs s1-s2, s3-s4 (fast) and
    s5-s6 (slow); pass 2 tries s5 with s1 and s6 with s2; only s5 is slow again: it alone is
    named, fail, drain; s6 is cleared. (A median needs 3 pairs: 6 nodes, as over SSH.)"""
    cluster, hosts = fleet_cluster
    lab.slow_fleet_link(4)
    try:
        r = mldiag("nccl-check", "--hosts-file", hosts, "-H", "fleet", "--pairs", "--json", "--max-bytes",
                   str(2 ** 20), "--iters", "2", "--budget", "90", "--fleet-pct", "25", "--valid-for", "0",
                   env={"SLURM_CONF": str(cluster.conf)}, timeout=600)
    finally:
        lab.restore_fleet_link(4)
    assert r.returncode == 2, r.stdout + r.stderr
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    s5, s6 = docs["fleet:s5"], docs["fleet:s6"]
    assert [(p["pass"], p["with"], p["slow"]) for p in s5["data"]["pairs"]] == [
        (1, "fleet:s6", True), (2, "fleet:s1", True)]
    assert [(f["code"], f["level"], f["action"]) for f in s5["findings"]] == [("slow-node", "fail", "drain")]
    assert [(p["pass"], p["with"], p["slow"]) for p in s6["data"]["pairs"]] == [
        (1, "fleet:s5", True), (2, "fleet:s2", False)]
    assert [n for n, d in docs.items() if d["status"] != "ok"] == ["fleet:s5"]
