"""nccl-check --pairs on this machine: local targets as nodes, each pair's two runs started
together (engine/groups.py) with real ranks meeting over loopback TCP (gloo), two passes, and a
node that cannot measure named while its partner is cleared. The verdicts' logic alone is
test_nccl_pairs.py's; the rows the task makes from measured pairs, here."""

import json

import pytest

from diagnostics.builtin.nccl_check import run as nccl_run
from diagnostics.engine import groups
from diagnostics.inventory.targets import Container, SshHost, Target
from tests.programs import mldiag, result_of, space_free_python

SMALL = ["--max-bytes", str(2 ** 20), "--iters", "2", "--budget", "60", "--valid-for", "0"]   # each test measures: none skipped as passed


def hosts(tmp_path, broken=(), missing=()):
    """Local targets n1..n4 with this venv's torch; those in ``broken`` get the system python3,
    which has none; those in ``missing`` an interpreter that does not exist."""
    lines = ["hosts:"]
    for name in ("n1", "n2", "n3", "n4"):
        python = "/usr/bin/python3" if name in broken else "/nonexistent/python3" if name in missing \
            else space_free_python()
        lines.append(f"  {name}: {{local: true, python: {python}}}")
    path = tmp_path / "hosts.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def run_pairs(path, *more):
    r = mldiag("nccl-check", "--hosts-file", path, "-H", "n1,n2,n3,n4", "--pairs", "--json", *SMALL, *more,
               timeout=300)
    return r, {d["target"]: d for d in json.loads(r.stdout)}


def test_four_nodes_measured_in_two_pairs(tmp_path):
    r, docs = run_pairs(hosts(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    partners = {name: [(p["pass"], p["with"]) for p in d["data"]["pairs"]] for name, d in docs.items()}
    assert partners == {"n1": [(1, "n2")], "n2": [(1, "n1")], "n3": [(1, "n4")], "n4": [(1, "n3")]}
    for d in docs.values():
        assert d["status"] == "ok" and d["findings"] == [] and d["data"]["pairs"][0]["busbw"] > 0
        assert d["data"]["threshold_gbps"] is None      # two pairs make no median


def test_a_node_that_cannot_measure_is_named_and_its_partner_cleared(tmp_path):
    """n4 has no torch: its pass-1 pair fails, so both n3 and n4 are tried with the known-good
    n1 and n2 in pass 2; n3 measures, n4 fails again and is the node named."""
    r, docs = run_pairs(hosts(tmp_path, broken={"n4"}))
    assert r.returncode == 2, r.stdout + r.stderr
    n3, n4 = docs["n3"], docs["n4"]
    assert [(p["pass"], p["with"], p["slow"]) for p in n3["data"]["pairs"]] == [(1, "n4", True), (2, "n1", False)]
    assert n3["status"] == "ok" and n3["findings"] == []
    assert [(p["pass"], p["with"], p["busbw"]) for p in n4["data"]["pairs"]] == [(1, "n3", None), (2, "n2", None)]
    assert [(f["code"], f["level"]) for f in n4["findings"]] == [("not-measured", "warn"), ("slow-node", "fail")]
    assert n4["findings"][1]["message"] == "slow in both passes: failed with n3 (pass 1), failed with n2 (pass 2)"
    assert docs["n1"]["status"] == docs["n2"]["status"] == "ok"
    assert ranks_left() == []     # n3's ranks, waiting for n4's, were ended with its run


def ranks_left():
    import subprocess
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "nccl_check.py" in line and "--nodes " in line]


def test_a_node_whose_interpreter_is_missing_is_its_error_row_and_ends_its_partners_run(tmp_path):
    """n2 cannot start at all: its row is the interpreter error; n1, whose ranks were waiting for
    n2's, is ended at once (not after its 60 s budget), tried again with n3, and passes."""
    r, docs = run_pairs(hosts(tmp_path, missing={"n2"}))
    assert r.returncode == 3, r.stdout + r.stderr
    assert (docs["n2"]["status"], docs["n2"]["error"]["layer"]) == ("error", "interpreter")
    n1 = docs["n1"]
    assert [(p["pass"], p["with"], p["slow"]) for p in n1["data"]["pairs"]] == [(1, "n2", True), (2, "n3", False)]
    assert n1["status"] == "ok" and n1["findings"] == []
    assert ranks_left() == []


def test_across_runs_one_collective_over_all_the_nodes(tmp_path):
    """--across: the four nodes are one group, each node one rank of a 4-rank all-reduce; every
    row reports the same group's figure and its place in it."""
    r = mldiag("nccl-check", "--hosts-file", hosts(tmp_path), "-H", "n1,n2,n3,n4", "--across", "--json", *SMALL,
               timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    assert list(docs) == ["n1", "n2", "n3", "n4"]
    groups_seen = {n: (d["data"]["group"]["node_rank"], d["data"]["group"]["nodes"]) for n, d in docs.items()}
    assert groups_seen == {"n1": (0, 4), "n2": (1, 4), "n3": (2, 4), "n4": (3, 4)}
    assert len({d["data"]["group"]["master"] for d in docs.values()}) == 1
    for d in docs.values():
        assert d["status"] == "ok" and d["data"]["rows"][-1]["busbw"] > 0
        assert d["summary"].startswith("all-reduce over 4 nodes x 1 rank (torch-gloo): busbw")
    assert ranks_left() == []


def test_across_and_pairs_together_are_bad_input(tmp_path):
    r = mldiag("nccl-check", "--hosts-file", hosts(tmp_path), "-H", "n1,n2", "--across", "--pairs", timeout=60)
    assert r.returncode == 4 and "--across and --pairs" in r.stderr, r.stdout + r.stderr


def test_the_qualify_runbook_runs_every_step_and_pairs_the_nodes(tmp_path):
    """The built-in qualify runbook on two nodes with torch (this machine's CPU): node-check,
    gpu-perf's quick tier, each node's all-reduce alone, then the pair: its step runs the nodes
    two by two as the task's --pairs does (the registry's fan_out), every step ok."""
    hosts_path = tmp_path / "hosts.yaml"
    hosts_path.write_text("hosts:\n" + "".join(f"  {n}: {{local: true, python: {space_free_python()}}}\n"
                                                for n in ("n1", "n2")))
    r = mldiag("runbook", "qualify", "--hosts-file", hosts_path, "-H", "n1,n2", "--param", "tier=quick", "--json",
               timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert [(s["id"], sorted(x["status"] for x in s["results"])) for s in report["steps"]] == [
        ("node-check", ["ok", "ok"]), ("gpu-perf", ["ok", "ok"]), ("nccl-single", ["ok", "ok"]),
        ("nccl-pairs", ["ok", "ok"])]
    perf = {x["target"]: x["data"] for x in report["steps"][1]["results"]}
    assert all(d["tier"] == "quick" and d["measured"]["0"]["gemm_fp32"] > 0 for d in perf.values())
    pairs_step = {x["target"]: x["data"]["pairs"] for x in report["steps"][3]["results"]}
    assert [(p["pass"], p["with"]) for p in pairs_step["n1"]] == [(1, "n2")] and pairs_step["n1"][0]["busbw"] > 0
    assert ranks_left() == []


# --------------------------------------------------------------------------- rows from pairs

def member(target, busbw):
    data = {"backend": "torch-gloo", "op": "all_reduce", "ranks": 1, "rows": [{"size": 2 ** 20, "busbw": busbw}]}
    return result_of("nccl-check", target, data=data)


def test_a_pair_slow_only_together_is_a_link_on_both_rows():
    pass1 = {("a", "b"): (10.0, [member("a", 10.0), member("b", 10.0)]),
             ("c", "d"): (100.0, [member("c", 100.0), member("d", 100.0)]),
             ("e", "f"): (98.0, [member("e", 98.0), member("f", 98.0)])}
    pass2 = {("a", "c"): (99.0, [member("a", 99.0), member("c", 99.0)]),
             ("b", "d"): (97.0, [member("b", 97.0), member("d", 97.0)])}
    rows = {r.target: r for r in nccl_run.node_results("abcdef", pass1, pass2, 78.4, 80)}
    (f,) = rows["a"].findings
    assert (f.code, f.level, f.action, f.ports) == ("slow-link", "warn", "monitor", ["a<->b"])
    assert f.message == "slow only with b: 10.00 GB/s with b (pass 1) (slow below 78.40 GB/s)"
    assert [x.code for x in rows["b"].findings] == ["slow-link"]
    assert rows["a"].status == "warn" and rows["c"].status == "ok"
    assert rows["a"].summary == "10.00 GB/s with b (pass 1), 99.00 GB/s with c (pass 2); slow-link"


def test_an_unreachable_member_is_its_row():
    down = result_of("nccl-check", "b", status="error")
    pass1 = {("a", "b"): (None, [member("a", 1.0), down])}
    rows = {r.target: r for r in nccl_run.node_results("ab", pass1, {}, None, 80)}
    assert rows["b"] is down
    assert [f.code for f in rows["a"].findings] == ["slow-undetermined"]


# --------------------------------------------------------------------------- where ranks meet

@pytest.mark.parametrize("target,address", [
    (Target(name="l", local=True), "127.0.0.1"),
    (Target(name="h", host=SshHost(name="h", address="10.0.0.7")), "10.0.0.7"),
    (Target(name="alias", host=SshHost(name="alias")), "alias"),
    (Target(name="c", host=SshHost(name="h", address="10.0.0.7"), container=Container("pct", "200")), None),
    (Target(name="c", host=SshHost(name="h", address="10.0.0.7"), container=Container("pct", "200"),
            peer_address="10.1.0.7"), "10.1.0.7"),
    (Target(name="h", host=SshHost(name="h", address="bastion-alias"), peer_address="10.2.0.3"), "10.2.0.3"),
])
def test_the_address_peers_reach_a_member_at(target, address):
    assert groups.peer_address(target) == address


def test_peer_address_in_hosts_yaml_pairs_with_a_node_range_and_is_never_inherited(tmp_path):
    from diagnostics.core.errors import InputError
    from diagnostics.inventory import topology
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n"
                    "  gpu[1-2]: {address: \"mgmt-[1-2]\", peer_address: \"10.9.0.[11-12]\"}\n"
                    "  pve:\n"
                    "    address: pve\n"
                    "    peer_address: 10.9.0.1\n"
                    "    containers:\n"
                    "      ct1: {runtime: pct, id: \"101\", peer_address: 10.9.1.101}\n"
                    "      ct2: {runtime: pct, id: \"102\"}\n")
    targets = topology.load(str(path)).targets
    assert {n: targets[n].peer_address for n in ("gpu1", "gpu2", "pve", "ct1", "ct2")} == {
        "gpu1": "10.9.0.11", "gpu2": "10.9.0.12", "pve": "10.9.0.1", "ct1": "10.9.1.101", "ct2": None}
    for bad, said in (('gpu[1-2]: {address: "m-[1-2]", peer_address: 10.9.0.1}', "one address for 2 hosts"),
                      ('gpu1: {peer_address: "-oProxy"}', "must not start with '-'"),
                      ('gpu1: {peer_address: "a b"}', "")):
        path.write_text(f"hosts:\n  {bad}\n")
        with pytest.raises(InputError) as exc:
            topology.load(str(path))
        assert str(exc.value).startswith(f"{path}:2: ") and said in str(exc.value), str(exc.value)
