"""gpu-perf: the plan sized to a tier's budget, the judgement of what each GPU measured (pure),
and the measurement itself on this machine's CPU (real torch: the same code as on a GPU, with
the CPU as the one device), run as the task runs it and killed at its budget."""

import json
import subprocess
import time

import pytest

from tests.programs import SCRIPTS, load_script, mldiag, space_free_python

gp = load_script("gpu_perf.py", "mldiag_test_gpu_perf")


# --------------------------------------------------------------------------- the plan

@pytest.mark.parametrize("tier", ["quick", "standard", "full"])
@pytest.mark.parametrize("gpus", [1, 8])
def test_every_tiers_plan_fits_its_budget(tier, gpus):
    """The measuring a plan asks for (each phase one slice and its warm-up, h2d and d2h a quarter
    slice per GPU) and the start-up kept aside fit the tier's budget."""
    p = gp.plan(tier, None, gpus, cuda=True)
    phases = len(p["gemm"]) + 1 + (0.5 * gpus if "h2d" in p["tests"] else 0) + (0.5 * gpus if "d2h" in p["tests"] else 0)
    kept = gp.STARTUP_S + (0.25 * p["budget"] if "nvbandwidth" in p["tests"] else 0)
    assert p["budget"] == gp.TIERS[tier]["budget"]
    assert kept + phases * p["slice"] * 1.5 <= p["budget"] + 1e-6
    assert p["slice"] == gp.TIERS[tier]["slice"] or p["slice"] < gp.TIERS[tier]["slice"]


def test_a_smaller_budget_shrinks_each_measurement_and_never_grows_a_tier():
    assert gp.plan("standard", 40, 8, cuda=True)["slice"] < gp.plan("standard", None, 8, cuda=True)["slice"]
    assert gp.plan("quick", 500, 8, cuda=True)["budget"] == 30
    assert gp.plan("quick", 1, 8, cuda=True)["slice"] == gp.MIN_SLICE_S


def test_a_node_without_gpus_measures_the_cpu_and_no_host_device_copies():
    p = gp.plan("full", None, 1, cuda=False)
    assert (p["device"], p["gemm"], p["tests"]) == ("cpu", ["fp32", "bf16"], ["gemm", "hbm"])
    assert gp.plan("standard", None, 8, cuda=True)["tests"] == ["gemm", "hbm", "h2d", "d2h"]
    assert gp.plan("full", None, 8, cuda=True)["gemm"] == ["bf16", "fp16", "tf32", "fp8"]


# --------------------------------------------------------------------------- the judgement

H100 = {"sku": "H100 SXM5 80GB", "h2d_gbps_min": 48.0, "d2h_gbps_min": 48.0, "hbm_gbps_min": 1905.0,
        "gemm_tflops_peak": {"bf16": 989.5, "fp16": 989.5}}


def node(**per_gpu):
    """{gpu: {test: value}} from gpu0={...}, gpu1={...}."""
    return {int(k[3:]): v for k, v in per_gpu.items()}


def codes(findings):
    return [(f["code"], f["level"], f.get("gpus")) for f in findings]


def test_a_healthy_h100_node_has_nothing_to_say():
    table = {g: {"gemm_bf16": 720.0 + g, "hbm": 2900.0, "h2d": 53.0, "d2h": 52.0} for g in range(8)}
    assert gp.judge(table, row=H100) == []


def test_below_the_models_figures_each_gpu_named_once():
    table = {g: {"gemm_bf16": 720.0, "hbm": 2900.0, "h2d": 53.0} for g in range(8)}
    table[3]["h2d"] = 24.0              # a PCIe link trained at half width
    table[5]["hbm"] = 1700.0
    found = gp.judge(table, row=H100)
    assert codes(found) == [("h2d-low", "fail", [3]), ("hbm-low", "fail", [5])]
    assert found[0]["action"] == "drain" and "GPU 3 24.0 GB/s, below the 48.0 GB/s (H100 SXM5 80GB)" in found[0]["message"]


def test_gemm_is_held_to_half_the_datasheets_peak():
    table = {0: {"gemm_bf16": 480.0}, 1: {"gemm_bf16": 500.0}}
    assert codes(gp.judge(table, row=H100, peer_pct=1)) == [("gemm-low", "fail", [0])]
    assert "50 % of the datasheet's 989.5 TFLOPS" in gp.judge(table, row=H100, peer_pct=1)[0]["message"]


def test_the_nodes_own_figure_comes_before_the_models():
    table = {0: {"gemm_bf16": 700.0, "hbm": 2500.0, "h2d": 50.0, "d2h": 49.0}}
    found = gp.judge(table, expect={"gemm": 750, "hbm": 3000, "h2d": 50}, row=H100)
    assert codes(found) == [("d2h-low", "fail", [0]), ("gemm-low", "fail", [0]), ("hbm-low", "fail", [0])]
    assert all("this node is expected to reach" in f["message"] for f in found)


def test_expect_gemm_is_for_the_tiers_first_dtype():
    table = {0: {"gemm_fp32": 0.05, "gemm_bf16": 0.001}}
    assert codes(gp.judge(table, expect={"gemm": 1}, primary="gemm_fp32")) == [("gemm-low", "fail", [0])]
    assert "gemm_fp32" in gp.judge(table, expect={"gemm": 1}, primary="gemm_fp32")[0]["message"]


def test_a_gpu_below_its_peers_is_named_without_any_figure():
    table = {g: {"gemm_bf16": 700.0, "hbm": 2900.0} for g in range(8)}
    table[6]["gemm_bf16"] = 560.0      # 80 % of the median: throttling under load
    found = gp.judge(table)
    assert codes(found) == [("below-peers", "fail", [6])]
    assert "GPU 6 560.0 (80 %), below 85 % of the median of the node's 8 GPUs (700.0 TFLOPS)" in found[0]["message"]
    assert gp.judge(table, peer_pct=75) == []


def test_a_gpu_below_its_figure_is_not_named_twice_for_its_peers():
    table = {g: {"h2d": 53.0} for g in range(4)}
    table[2]["h2d"] = 20.0
    assert codes(gp.judge(table, row=H100)) == [("h2d-low", "fail", [2])]


def test_events_read_from_the_childs_output_anything_else_left_out():
    text = "\n".join([json.dumps({"event": "start", "names": ["cpu"]}), "UserWarning: something", "{not json",
                      json.dumps({"event": "result", "gpu": 0, "test": "hbm", "value": 12.5}),
                      json.dumps({"event": "result", "gpu": "x", "test": "hbm", "value": 1}),
                      json.dumps(["event"]), json.dumps({"event": "done"})])
    events = gp.read_events(text)
    assert [e["event"] for e in events] == ["start", "result", "result", "done"]
    assert gp.measured_table(events) == {0: {"hbm": 12.5}}


def test_the_summary_names_each_test_once_with_its_range():
    data = {"device": "cuda", "tier": "quick", "measured": {"0": {"gemm_bf16": 700.0, "hbm": 2900.0},
                                                             "1": {"gemm_bf16": 650.0, "hbm": 2900.0}}}
    found = [gp.finding("below-peers", "x", gpus=[1])]
    assert gp.summarise(data, found) == "2 GPUs, quick tier: gemm bf16 650-700 TFLOPS, hbm 2.9e+03 GB/s; below-peers"


# --------------------------------------------------------------------------- measured for real

def run_script(*argv, timeout=120):
    p = subprocess.run([space_free_python(), str(SCRIPTS / "gpu_perf.py"), *argv], capture_output=True,
                       text=True, timeout=timeout)
    return p.returncode, json.loads(p.stdout)


def test_the_quick_tier_measures_this_cpu_within_its_budget():
    code, result = run_script("--tier", "quick", "--budget", "20")
    assert code == 0, result
    measured = result["data"]["measured"]["0"]
    assert set(measured) == {"gemm_fp32", "hbm"} and all(v > 0 for v in measured.values())
    assert result["data"]["device"] == "cpu" and result["data"]["duration_s"] < 20
    assert result["summary"].startswith("1 CPU, quick tier: gemm fp32 ")


def test_a_child_still_measuring_at_the_deadline_is_killed_and_said(tmp_path):
    """A deadline shorter than torch's import: the child is killed (nothing of it left) and the
    run says the budget was spent."""
    ask = {"tier": "quick", "budget": 0.3, "device": "cpu", "marker": str(tmp_path)}
    events, found = gp.measure(ask, time.monotonic() + 0.3)
    assert [f["code"] for f in found] == ["budget-spent"]
    out = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    assert [line for line in out.splitlines() if str(tmp_path) in line] == []


def test_an_interpreter_without_torch_is_a_warning_not_a_crash():
    p = subprocess.run(["/usr/bin/python3", str(SCRIPTS / "gpu_perf.py")], capture_output=True, text=True, timeout=60)
    result = json.loads(p.stdout)
    assert (p.returncode, result["status"]) == (1, "warn")
    assert result["summary"] == ("not measured: torch could not be started here: ModuleNotFoundError: "
                                 "No module named 'torch'")


def test_the_task_judges_a_cpu_node_against_its_hosts_yaml_figures(tmp_path):
    """Through the task: the expect: block reaches the script, the CPU's real copy bandwidth
    is far below 100,000 GB/s and its fp32 GEMM below 1,000 TFLOPS: both named, exit 2."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n"
                     f"  slow: {{local: true, python: {space_free_python()}, "
                     "expect: {gemm_tflops: 1000, hbm_gbps: 100000}}\n"
                     f"  fine: {{local: true, python: {space_free_python()}}}\n")
    r = mldiag("gpu-perf", "--hosts-file", hosts, "-H", "slow,fine", "--budget", "20", "--json", timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    assert [(f["code"], f["level"], f["action"]) for f in docs["slow"]["findings"]] == [
        ("gemm-low", "fail", "drain"), ("hbm-low", "fail", "drain")]
    assert docs["fine"]["status"] == "ok" and docs["fine"]["findings"] == []


def test_bad_flags_are_bad_input():
    for flags, said in ((["--budget", "0"], "--budget"), (["--peer-pct", "150"], "--peer-pct"),
                        (["--tier", "long"], "--tier")):
        r = mldiag("gpu-perf", "-H", "local", *flags, timeout=60)
        assert r.returncode == 4 and said in r.stderr, (flags, r.stderr)


# --------------------------------------------------------------------------- nvbandwidth

FIXTURES = SCRIPTS.parents[1] / "tests" / "fixtures" / "nvbandwidth"


def test_nvbandwidths_figures_are_judged_as_the_host_device_copies(tmp_path):
    """Where nvbandwidth is installed (a GPU node), its host<->device tests are run and judged
    against the model's figure. No GPU here: a stand-in prints a real recording (Azure's 2-GPU
    v0.10 run, 26 GB/s per GPU each way) and records the arguments it was given."""
    nb = load_script("nvbandwidth.py", "mldiag_test_nvbandwidth_for_perf")
    said = tmp_path / "argv"
    fake = tmp_path / "nvbandwidth"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > '{said}'\ncat '{FIXTURES / 'azurehpc-nvbandwidth_v0.10_output.txt'}'\n")
    fake.chmod(0o755)
    per_gpu, found = gp.run_nvbandwidth(str(fake), time.monotonic() + 30, nb)
    assert found == []
    assert said.read_text().split() == ["-t", "host_to_device_memcpy_ce", "-t", "device_to_host_memcpy_ce"]
    tests = gp.nvbandwidth_tests(per_gpu)
    assert tests == {0: {"h2d_nvbandwidth": 26.03, "d2h_nvbandwidth": 25.97},
                     1: {"h2d_nvbandwidth": 25.94, "d2h_nvbandwidth": 26.0}}
    row = nb.figures_for("NVIDIA H100 80GB HBM3")
    assert codes(gp.judge(tests, row=row)) == [("d2h-low", "fail", [0, 1]), ("h2d-low", "fail", [0, 1])]


def test_an_nvbandwidth_that_fails_is_a_warning_with_its_reason(tmp_path):
    nb = load_script("nvbandwidth.py", "mldiag_test_nvbandwidth_for_perf")
    fake = tmp_path / "nvbandwidth"
    fake.write_text(f"#!/bin/sh\ncat '{FIXTURES / 'constructed-cuda-error.txt'}'\nexit 1\n")
    fake.chmod(0o755)
    per_gpu, found = gp.run_nvbandwidth(str(fake), time.monotonic() + 30, nb)
    assert per_gpu is None and [(f["code"], f["level"]) for f in found] == [("not-measured", "warn")]
    assert found[0]["message"].startswith("nvbandwidth exited 1: ")
