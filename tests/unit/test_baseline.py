"""baseline.py (issue 12 item 7): node-check facts saved and compared — against a saved baseline,
or, without one, against the strict majority of the selected nodes. Results are made by hand."""

import json
import os
import stat

import pytest

from diagnostics.builtin.node_check import baseline
from diagnostics.core.errors import InputError
from diagnostics.core.results import Result

H100 = {"driver": "550.90.07", "cuda": "12.4", "kernel": "5.15.0-119-generic",
        "gpu.model": "NVIDIA H100 80GB HBM3", "gpu.count": 8,
        "nvlink.gpu3.active": 18, "pcie.gpu0.width": 16, "ib.mlx5_4/1.rate": 400,
        "ib.mlx5_4/1.state": "ACTIVE", "fabric.gpu0.state": "Completed"}


def node(target, facts=None, status="ok", **changes):
    facts = dict(H100 if facts is None else facts)
    for key, value in changes.items():
        key = key.replace("__", ".").replace("_SLASH_", "/")
        if value is baseline._MISSING:
            facts.pop(key, None)
        else:
            facts[key] = value
    return Result(diagnostic="node-check", target=target, status=status, summary="",
                  data={"facts": facts})


def unreachable(target):
    return Result.failure("node-check", target, "unreachable", "connection refused")


def messages(found):
    return {t: [f.message for f in fs] for t, fs in found.items()}


def fleet(n=8, **odd):
    """n identical nodes gpu01..; keyword `gpuNN={fact: value}` changes one node's facts."""
    out = []
    for i in range(1, n + 1):
        name = f"gpu{i:02d}"
        facts = dict(H100)
        for key, value in odd.get(name, {}).items():
            if value is baseline._MISSING:
                facts.pop(key)
            else:
                facts[key] = value
        out.append(node(name, facts))
    return out


# ------------------------------------------------------------------ majority

def test_the_outlier_driver_is_named_with_the_majority_value():
    found = baseline.deviations(fleet(gpu05={"driver": "535.129.03"}), None)
    assert messages(found) == {**{f"gpu{i:02d}": [] for i in range(1, 9)},
                               "gpu05": ["driver 535.129.03, 7 of 8 nodes: 550.90.07"]}
    f = found["gpu05"][0]
    assert (f.level, f.code) == ("warn", "majority-deviation")
    assert getattr(f, "action", "monitor") == "monitor"
    assert getattr(f, "check", "baseline") == "baseline"


def test_a_dotted_fact_reads_key_colon_value_and_names_its_gpu():
    found = baseline.deviations(fleet(gpu02={"nvlink.gpu3.active": 16}), None)
    [f] = found["gpu02"]
    assert f.message == "nvlink.gpu3.active: 16, 7 of 8 nodes: 18"
    assert f.gpus == [3]


def test_a_port_most_nodes_have_is_missing_on_the_odd_node():
    found = baseline.deviations(fleet(gpu08={"ib.mlx5_4/1.rate": baseline._MISSING,
                                              "ib.mlx5_4/1.state": baseline._MISSING}), None)
    assert messages(found)["gpu08"] == ["ib.mlx5_4/1.rate: missing, 7 of 8 nodes: 400",
                                        "ib.mlx5_4/1.state: missing, 7 of 8 nodes: ACTIVE"]
    if hasattr(found["gpu08"][0], "ports"):
        assert found["gpu08"][0].ports == ["mlx5_4/1"]
    assert all(not fs for t, fs in found.items() if t != "gpu08")


def test_a_fact_only_one_node_has_is_named_on_that_node():
    found = baseline.deviations(fleet(4, gpu01={"ib.mlx5_9/1.rate": 200}), None)
    assert messages(found)["gpu01"] == ["ib.mlx5_9/1.rate: 200, not on 3 of 4 nodes"]
    assert not found["gpu02"]


def test_no_strict_majority_no_finding():
    # 2 against 2: nobody is the odd one out
    results = fleet(4, gpu01={"driver": "535"}, gpu02={"driver": "535"})
    assert not any(baseline.deviations(results, None).values())
    # 3 values among 3 nodes: none holds more than half
    results = fleet(3, gpu01={"driver": "1"}, gpu02={"driver": "2"})
    assert not any(baseline.deviations(results, None).values())


def test_fewer_than_three_nodes_have_no_majority():
    results = fleet(2, gpu01={"driver": "535"})
    assert baseline.deviations(results, None) == {"gpu01": [], "gpu02": []}


def test_unreachable_nodes_are_skipped_never_a_deviation_nor_a_vote():
    # 2 healthy + 1 odd + 3 unreachable: the odd one is measured against the 3 that answered
    results = fleet(3, gpu03={"driver": "535"}) + [unreachable(f"gpu{i}") for i in (4, 5, 6)]
    found = baseline.deviations(results, None)
    assert set(found) == {"gpu01", "gpu02", "gpu03"}
    assert messages(found)["gpu03"] == ["driver 535, 2 of 3 nodes: 550.90.07"]
    # with only 2 nodes answering there is no majority at all
    results = fleet(2, gpu02={"driver": "535"}) + [unreachable("gpu03"), unreachable("gpu04")]
    assert not any(baseline.deviations(results, None).values())


def test_a_result_without_facts_is_skipped():
    no_facts = Result(diagnostic="node-check", target="gpu09", status="fail", summary="", data={})
    found = baseline.deviations(fleet(3) + [no_facts], None)
    assert "gpu09" not in found


def test_numbers_compare_as_numbers_but_text_and_booleans_keep_their_type():
    results = fleet(4, gpu01={"gpu.count": 8.0}, gpu02={"pcie.gpu0.width": "16"})
    found = messages(baseline.deviations(results, None))
    assert found["gpu01"] == []                       # 8.0 is 8
    assert found["gpu02"] == ['pcie.gpu0.width: "16", 3 of 4 nodes: 16']  # typed when alike
    results = fleet(4, gpu03={"gpu.count": True})
    assert messages(baseline.deviations(results, None))["gpu03"] == [
        "gpu.count: true, 3 of 4 nodes: 8"]


def test_many_differing_facts_are_bounded_with_a_count_of_the_rest():
    many = {f"pcie.gpu{i}.width": 16 for i in range(30)}
    results = [node(f"n{i}", {**many, "driver": "550"}) for i in range(3)]
    results.append(node("n3", {**{k: 8 for k in many}, "driver": "535"}))
    found = baseline.deviations(results, None)["n3"]
    assert len(found) == baseline.MAX_FINDINGS_PER_NODE + 1
    assert found[0].message == "driver 535, 3 of 4 nodes: 550"      # top-level facts first
    assert found[1].message == "pcie.gpu0.width: 8, 3 of 4 nodes: 16"
    assert found[-1].message.startswith("… 11 more facts differ from the majority: pcie.gpu")
    assert found[-1].message.endswith(", …")


def test_long_values_are_shortened_in_messages():
    results = fleet(3, gpu01={"kernel": "k" * 500})
    [f] = baseline.deviations(results, None)["gpu01"]
    assert len(f.message) < 200 and "…" in f.message


def test_non_scalar_facts_from_a_target_are_ignored():
    results = fleet(3) + [node("gpu04", {**H100, "weird": {"a": 1}, "driver": ["x"]})]
    found = baseline.deviations(results, None)
    assert messages(found)["gpu04"] == ["driver missing, 3 of 4 nodes: 550.90.07"]


# ------------------------------------------------------------------ against a baseline

def saved(results, taken="2026-11-30T09:00:00+00:00"):
    return baseline.document(results, taken=taken)


def test_every_difference_against_the_baseline_is_a_finding():
    base = saved(fleet(2))
    now = fleet(2, gpu02={"driver": "535.129.03", "nvlink.gpu3.active": 16,
                          "ib.mlx5_4/1.rate": baseline._MISSING, "ib.mlx5_5/1.rate": 400})
    found = baseline.deviations(now, base)
    assert found["gpu01"] == []
    assert [f.message for f in found["gpu02"]] == [
        "driver 535.129.03, baseline 550.90.07",
        "ib.mlx5_4/1.rate: missing, baseline 400",
        "ib.mlx5_5/1.rate: 400, not in the baseline",
        "nvlink.gpu3.active: 16, baseline 18"]
    assert {(f.level, f.code) for f in found["gpu02"]} == {("warn", "baseline-deviation")}
    assert found["gpu02"][3].gpus == [3]


def test_one_node_against_a_baseline_needs_no_majority():
    base = saved([node("solo")])
    found = baseline.deviations([node("solo", driver="1.0")], base)
    assert messages(found) == {"solo": ["driver 1.0, baseline 550.90.07"]}


def test_a_node_the_baseline_does_not_know_is_said_once():
    base = saved(fleet(2))
    [f] = baseline.deviations([node("gpu99")], base)["gpu99"]
    assert (f.level, f.code) == ("info", "not-in-baseline")
    assert f.message == "not in the baseline (taken 2026-11-30T09:00:00+00:00): its facts were not compared"


def test_unreachable_nodes_are_not_compared_with_the_baseline():
    base = saved(fleet(2))
    assert baseline.deviations([unreachable("gpu01")], base) == {}


def test_many_baseline_differences_are_bounded():
    base = saved([node("a", {f"k.gpu{i}.x": i for i in range(25)})])
    found = baseline.deviations([node("a", {})], base)["a"]
    assert len(found) == 21
    assert found[-1].message.startswith("… 5 more facts differ from the baseline: ")


# ------------------------------------------------------------------ the file

def test_save_then_load_round_trips_and_skips_unreachable_nodes(tmp_path):
    path = tmp_path / "base.json"
    baseline.save(str(path), fleet(2) + [unreachable("gpu03")])
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1 and doc["taken"].endswith("+00:00")
    assert sorted(doc["nodes"]) == ["gpu01", "gpu02"]
    assert doc["nodes"]["gpu01"] == H100
    loaded = baseline.load(str(path))
    assert loaded["nodes"] == doc["nodes"]
    assert baseline.deviations(fleet(2), loaded) == {"gpu01": [], "gpu02": []}
    assert [p.name for p in tmp_path.iterdir()] == ["base.json"]     # no temp file left


def test_save_replaces_a_planted_link_and_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("original\n")
    path = tmp_path / "base.json"
    path.symlink_to(victim)
    baseline.save(str(path), fleet(1))
    assert victim.read_text() == "original\n"
    assert not path.is_symlink() and json.loads(path.read_text())["nodes"]["gpu01"] == H100


def test_save_replaces_an_existing_baseline_atomically(tmp_path):
    path = tmp_path / "base.json"
    baseline.save(str(path), fleet(1))
    inode = os.stat(path).st_ino
    baseline.save(str(path), fleet(2))
    assert os.stat(path).st_ino != inode          # a new file renamed over it, not rewritten
    assert sorted(json.loads(path.read_text())["nodes"]) == ["gpu01", "gpu02"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_save_refusals_name_the_file(tmp_path):
    with pytest.raises(InputError) as exc:
        baseline.save(str(tmp_path / "base.json"), [unreachable("gpu01")])
    assert str(exc.value).startswith(f"{tmp_path}/base.json: --save-baseline: no node reported facts")
    (tmp_path / "dir").mkdir()
    with pytest.raises(InputError, match="a directory is in the way"):
        baseline.save(str(tmp_path / "dir"), fleet(1))
    with pytest.raises(InputError, match="cannot open its directory"):
        baseline.save(str(tmp_path / "missing" / "base.json"), fleet(1))


@pytest.mark.parametrize("content, problem", [
    (b"", "not JSON"),
    (b"{", "not JSON"),
    (b"\xff\xfe", "not UTF-8 text"),
    (b"[]", "expected a JSON object with schema, taken and nodes, got a list"),
    (b'{"schema": 2, "nodes": {}}', "schema 2, expected 1 (save it again with --save-baseline)"),
    (b'{"nodes": {}}', "schema None, expected 1"),
    (b'{"schema": 1}', "nodes: expected an object {target: facts}, got null"),
    (b'{"schema": 1, "nodes": []}', "nodes: expected an object {target: facts}, got a list"),
    (b'{"schema": 1, "taken": 5, "nodes": {}}', "taken: expected a time (text), got a number"),
    (b'{"schema": 1, "nodes": {"gpu01": 3}}', "nodes.gpu01: expected an object of facts, got a number"),
    (b'{"schema": 1, "nodes": {"gpu01": {"driver": [1]}}}',
     "nodes.gpu01.driver: expected a scalar (text, number, true/false, null), got a list"),
])
def test_a_bad_baseline_file_is_input_error_naming_file_and_problem(tmp_path, content, problem):
    path = tmp_path / "base.json"
    path.write_bytes(content)
    with pytest.raises(InputError) as exc:
        baseline.load(str(path))
    assert str(exc.value).startswith(f"{path}: --baseline: {problem}")
    assert exc.value.exit_code == 4


def test_a_missing_or_huge_baseline_file_is_input_error(tmp_path, monkeypatch):
    with pytest.raises(InputError, match=r"missing\.json: --baseline: No such file or directory"):
        baseline.load(str(tmp_path / "missing.json"))
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 2048)
    monkeypatch.setattr(baseline, "MAX_FILE_BYTES", 1024)
    with pytest.raises(InputError, match="larger than"):
        baseline.load(str(path))
