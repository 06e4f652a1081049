"""nccl-check: the script's measurement with torch.distributed (gloo on this machine's CPU: the
real collective, real ranks), its judgement, and the client's fleet judgement."""

import json
import subprocess
import time

import pytest

from diagnostics.builtin.nccl_check import fleet
from diagnostics.core.errors import InputError
from tests.programs import SCRIPTS, load_module, load_script, result_of, script_imports

nc = load_script("nccl_check.py", "mldiag_test_nccl_check")
SCRIPT = SCRIPTS / "nccl_check.py"


def args(*argv):
    return nc.build_parser().parse_args(list(argv))


def ranks_left(port_marker):
    """Processes of this machine still running a rank of a run (their command line names it)."""
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "nccl_check.py" in line and "--worker" in line
            and port_marker in line]


# --------------------------------------------------------------------------- pure parts

def test_sizes_double_from_min_to_max_in_whole_floats():
    assert nc.sizes(1024 ** 2, 8 * 1024 ** 2) == [1048576, 2097152, 4194304, 8388608]
    assert nc.sizes(6, 20) == [4, 8, 16]


def test_bandwidth_as_nccl_tests_computes_it():
    """superbench's 8x A100 all-reduce at 8 GiB: 63896 us -> algbw 134.44, busbw 235.26."""
    (row,) = nc.with_bandwidth([{"size": 8589934592, "count": 2147483648, "time_us": 63896.0}], "all_reduce", 8,
                               load_script("nccl_tests.py", "mldiag_test_nccl_check_nt"))
    assert (row["algbw"], row["busbw"]) == (pytest.approx(134.44, abs=0.01), pytest.approx(235.26, abs=0.01))


def rows(*pairs):
    return [{"size": s, "count": s // 4, "time_us": 1.0, "algbw": b, "busbw": b} for s, b in pairs]


def test_judged_against_the_nodes_own_figure_first():
    data = {"op": "all_reduce", "rows": rows((2 ** 30, 300.0), (2 ** 34, 440.0))}
    (f,) = nc.judge(data, expect_busbw=460, threshold={"sku": "H100", "busbw_gbps": 100, "size_bytes": 2 ** 34})
    assert (f["code"], f["level"], f["action"]) == ("busbw-low", "fail", "drain")
    assert f["message"] == ("all-reduce busbw 440.0 GB/s at 16 GiB, below the 460 GB/s this node is "
                            "expected to reach")
    assert data["judged"]["against"] == "expect"
    assert nc.judge(data, expect_busbw=430) == []


def test_judged_against_the_sku_at_its_size():
    """Azure's H100 figure is at 16 GiB: a run that stopped at 1 GiB is compared there, and says so."""
    h100 = {"sku": "H100", "busbw_gbps": 460.0, "size_bytes": 16 * 2 ** 30, "source": "azurehpc"}
    data = {"op": "all_reduce", "rows": rows((2 ** 30, 350.0))}
    (f,) = nc.judge(data, threshold=h100)
    assert f["message"].endswith("below H100's 460 GB/s (measured up to 1 GiB of its 16 GiB)")
    data = {"op": "all_reduce", "rows": rows((2 ** 30, 350.0), (16 * 2 ** 30, 470.0), (32 * 2 ** 30, 300.0))}
    assert nc.judge(data, threshold=h100) == [] and data["judged"]["size"] == 16 * 2 ** 30


def test_nothing_to_compare_against_leaves_the_node_to_the_fleet():
    data = {"op": "all_reduce", "rows": rows((2 ** 20, 1.0))}
    assert nc.judge(data) == [] and data["judged"] is None
    assert nc.judge({"op": "all_reduce", "rows": []}) == []


# --------------------------------------------------------------------------- real ranks (gloo)

def test_two_ranks_measure_a_real_all_reduce():
    r = nc.run(args("--backend", "torch", "--ranks", "2", "--max-bytes", str(4 * 2 ** 20), "--warmup", "1",
                    "--iters", "3", "--budget", "60"))
    d = r["data"]
    assert (d["backend"], d["ranks"], d["op"]) == ("torch-gloo", 2, "all_reduce")
    assert [row["size"] for row in d["rows"]] == [2 ** 20, 2 ** 21, 2 ** 22]
    for row in d["rows"]:
        assert row["time_us"] > 0 and row["busbw"] == pytest.approx(row["algbw"])   # 2 ranks: factor 1
    assert r["status"] == "ok" and r["findings"] == [] and d["judged"] is None
    assert r["summary"].startswith("all-reduce over 2 ranks (torch-gloo): busbw ")
    json.dumps(r)


def test_all_gather_counts_the_gathered_buffer():
    r = nc.run(args("--backend", "torch", "--op", "all_gather", "--ranks", "3", "--min-bytes", str(3 * 2 ** 20),
                    "--max-bytes", str(3 * 2 ** 20), "--warmup", "1", "--iters", "2"))
    (row,) = r["data"]["rows"]
    assert row["busbw"] == pytest.approx(row["algbw"] * 2 / 3, rel=1e-3)


def test_a_rank_that_cannot_start_is_a_finding_and_no_rank_is_left(tmp_path, monkeypatch):
    """A broken torch on the node's path: every rank fails at its import; the finding quotes one."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('libtorch_cpu.so: cannot open shared object')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    r = nc.run(args("--backend", "torch", "--ranks", "2", "--budget", "60"))
    (f,) = r["findings"]
    assert (f["code"], f["level"], f["action"]) == ("launch-failed", "fail", "drain")
    assert "libtorch_cpu.so: cannot open shared object" in f["message"]
    assert r["status"] == "fail" and r["data"]["rows"] == []


def test_a_rank_past_the_budget_is_killed_with_every_other_rank():
    """A budget shorter than the ranks need: each is killed at the deadline, the finding names
    them, and nothing of the run is left on the machine."""
    t0 = time.monotonic()
    r = nc.run(args("--backend", "torch", "--ranks", "2", "--max-bytes", str(64 * 2 ** 20), "--iters", "1000",
                    "--budget", "3"))
    assert time.monotonic() - t0 < 15
    (f,) = r["findings"]
    assert (f["code"], f["action"]) == ("rank-timeout", "drain")
    assert f["message"].startswith("ranks 0,1 did not finish within 3 s")
    assert ranks_left("--budget 3.0") == []


def test_a_node_without_torch_or_nccl_tests_is_not_measured(tmp_path):
    """The system python3 (no torch), no GPU, no nccl-tests: a warning that says what is missing."""
    python = "/usr/bin/python3"
    p = subprocess.run([python, "-S", str(SCRIPT)], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path))
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["status"] == "warn"
    (f,) = doc["findings"]
    assert f["code"] == "not-measured" and "no torch in " + python in f["message"]


def test_without_nccl_tests_py_beside_it_nothing_is_measured(tmp_path):
    (tmp_path / "nccl_check.py").write_text(SCRIPT.read_text())
    lone = load_module(tmp_path / "nccl_check.py", "mldiag_test_nccl_check_alone")
    r = lone.run(args("--backend", "torch"))
    assert (r["status"], [f["code"] for f in r["findings"]]) == ("warn", ["not-measured"])
    assert r["summary"] == "not measured: nccl_tests.py is not beside nccl_check.py"


def test_python38_syntax_and_stdlib_only():
    imported = script_imports(SCRIPT, module_level=True)
    assert imported <= {"__future__", "_remote", "json", "os", "signal", "socket", "sys", "time"}, imported


# --------------------------------------------------------------------------- the fleet

def measured(target, busbw, status="ok", backend="torch-gloo", ranks=2):
    return result_of("nccl-check", target, status=status, data={
        "backend": backend, "op": "all_reduce", "ranks": ranks,
        "rows": [{"size": 2 ** 20, "busbw": busbw * 2}, {"size": 2 ** 26, "busbw": busbw}]})


def test_a_node_far_below_its_peers_is_named():
    results = [measured("n1", 2.0), measured("n2", 2.1), measured("n3", 1.2), measured("n4", 1.9)]
    fleet.judge({})(results)
    slow = {r.target: [(f.code, f.level, f.action) for f in r.findings] for r in results}
    assert slow == {"n1": [], "n2": [], "n3": [("busbw-below-fleet", "fail", "drain")], "n4": []}
    (f,) = results[2].findings
    assert f.message == ("all-reduce busbw 1.20 GB/s, 62 % of the median of 4 nodes measured alike "
                         "(1.95 GB/s; a node below 80 % is named)")
    assert results[2].status == "fail" and results[0].status == "ok"


def test_only_peers_measured_alike_are_compared_and_three_at_least():
    results = [measured("n1", 2.0), measured("n2", 2.0), measured("n3", 0.5, ranks=4),
               measured("g1", 400.0, backend="nccl-tests", ranks=8), measured("g2", 410.0, backend="nccl-tests", ranks=8),
               measured("g3", 100.0, backend="nccl-tests", ranks=8),
               result_of("nccl-check", "down", status="error")]
    fleet.judge({"fleet-pct": 90})(results)
    assert [r.target for r in results if r.findings] == ["g3"]


@pytest.mark.parametrize("pct", ["0", "101", "x"])
def test_the_percentage_is_checked_before_anything_runs(pct):
    with pytest.raises(InputError, match="--fleet-pct"):
        fleet.judge({"fleet-pct": pct})
