"""nvbandwidth.py (the reader of NVIDIA nvbandwidth's text and JSON output, the per-GPU figures,
the command line) on real outputs, and gpu_perf_figures.json.

The outputs are tests/fixtures/nvbandwidth/ (README.md there: source, commit, licence; the
``constructed-*`` files are built from nvbandwidth's own format strings, and say how). Expected
figures were written by hand from the files (reading them, ``grep``), not computed by the parser.
"""
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.programs import load_script

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "nvbandwidth"
SMI = Path("/work/shared/fixtures/nvidia-smi")
SCRIPT = ROOT / "diagnostics" / "scripts" / "nvbandwidth.py"
FIGURES = ROOT / "diagnostics" / "scripts" / "gpu_perf_figures.json"

nb = load_script("nvbandwidth.py", "mldiag_test_nvbandwidth")

KEYS = {"format", "version", "git_version", "hostname", "cuda_runtime", "cuda_driver", "driver", "mpi",
        "devices", "tests", "order", "waived_unnamed", "warnings", "error", "lines"}
TEST_KEYS = {"status", "waived", "error", "matrix", "sum", "unit", "cv", "matrices"}
TEXT_FILES = sorted(p.name for p in FIX.iterdir() if p.name != "README.md" and not p.name.startswith("dcgm-"))
JSON_FILES = ["dcgm-verboseFullOutput.json", "dcgm-verboseFullOutputWithErrors.txt"]


def read(name):
    return (FIX / name).read_text(encoding="utf-8")


def parsed(name, **kw):
    return nb.parse(read(name), **kw)


# --------------------------------------------------------------------------- every file


def test_every_fixture_is_named_in_the_readme():
    readme = read("README.md")
    files = sorted(p.name for p in FIX.iterdir() if p.name != "README.md")
    assert len(files) == 10
    for name in files:
        assert "### `%s`" % name in readme, name
        if name.startswith("constructed-"):
            assert re.search(r"### `%s`\n- CONSTRUCTED" % re.escape(name), readme), name


@pytest.mark.parametrize("name", TEXT_FILES)
def test_shape_of_every_text_output(name):
    p = parsed(name)
    assert set(p) == KEYS and p["format"] == "text"
    assert p["order"] == list(p["tests"])
    for test in p["tests"].values():
        assert set(test) == TEST_KEYS
        for m in test["matrices"]:
            assert all(len(row) == len(m["cols"]) for row in m["values"])
            assert len(m["rows"]) == len(m["values"])


# --------------------------------------------------------------------------- text: real outputs


def test_superbench_full_run_with_waived_tests():
    p = parsed("superbench-nvbandwidth_results.log")
    assert (p["version"], p["git_version"], p["cuda_runtime"], p["cuda_driver"], p["driver"]) == \
        ("v0.6", "v0.6", 12040, 12040, "550.54.15")
    assert p["devices"] == [{"index": 0, "name": "NVIDIA GH200 480GB", "pci": "00000009:01:00",
                             "process": None, "host": None}]
    assert len(p["order"]) == 15 and p["waived_unnamed"] == 17        # grep -c Running / Waived:
    assert all(t["status"] == "passed" for t in p["tests"].values())
    assert p["error"] is None
    assert p["tests"]["host_to_device_memcpy_ce"]["sum"] == 1985.60
    assert p["tests"]["host_to_device_memcpy_ce"]["matrix"]["values"] == [[369.36, 269.33, 412.11],
                                                                           [323.36, 299.33, 312.11]]
    assert p["tests"]["device_to_host_memcpy_sm"]["sum"] == 351.93
    latency = p["tests"]["host_device_latency_sm"]
    assert (latency["unit"], latency["sum"], latency["matrix"]["values"]) == ("ns", 772.58, [[772.58]])
    assert p["tests"]["host_to_device_memcpy_ce"]["unit"] == "GB/s"


def test_waived_lines_are_named_by_the_requested_tests():
    # the run's order from its own file: the 4th..5th tests, then 4 Waived, then all_to_host_memcpy_ce
    requested = ["host_to_device_memcpy_ce", "device_to_host_memcpy_ce", "host_to_device_bidirectional_memcpy_ce",
                 "device_to_host_bidirectional_memcpy_ce", "device_to_device_memcpy_read_ce",
                 "device_to_device_memcpy_write_ce", "device_to_device_bidirectional_memcpy_read_ce",
                 "device_to_device_bidirectional_memcpy_write_ce", "all_to_host_memcpy_ce"]
    text = read("superbench-nvbandwidth_results.log")
    text = text[:text.index("SUM all_to_host_memcpy_ce")] + "SUM all_to_host_memcpy_ce 295.15\n"
    p = nb.parse(text, tests=requested)
    assert p["waived_unnamed"] == 0
    assert [n for n in p["order"] if p["tests"][n]["waived"]] == requested[4:8]
    assert p["tests"]["all_to_host_memcpy_ce"]["status"] == "passed"
    assert p["tests"]["device_to_device_memcpy_read_ce"]["status"] == "waived"


def test_azure_v010_output_with_coefficient_of_variation():
    p = parsed("azurehpc-nvbandwidth_v0.10_output.txt")
    assert p["error"] is None and p["version"] is None and p["devices"] == []
    assert p["order"] == ["host_to_device_memcpy_ce", "device_to_host_memcpy_ce", "device_to_device_memcpy_read_ce"]
    h2d, d2h, d2d = (p["tests"][n] for n in p["order"])
    assert (h2d["sum"], h2d["cv"], h2d["matrix"]["values"]) == (51.97, 0.01, [[26.03, 25.94]])
    assert (d2h["sum"], d2h["cv"], d2h["matrix"]["values"]) == (51.97, 0.02, [[25.97, 26.00]])
    assert (d2d["sum"], d2d["cv"]) == (552.26, 0.01)
    assert d2d["matrix"] == {"rows": ["0", "1"], "cols": ["0", "1"], "values": [[None, 276.07], [276.19, None]]}
    assert d2d["matrices"][0]["key"] == "device_to_device_memcpy_read_ce"


def test_azure_h100_eight_gpu_device_to_device():
    p = parsed("azurehpc-debugging-test-failure.h100-d2d-read.txt")
    assert (p["version"], p["git_version"], p["cuda_runtime"], p["cuda_driver"], p["driver"]) == \
        ("v0.4", "v0.4.2-12-g8857188", 12020, 12080, "570.133.20")
    assert [d["index"] for d in p["devices"]] == list(range(8))
    assert {d["name"] for d in p["devices"]} == {"NVIDIA H100 80GB HBM3"} and p["devices"][0]["pci"] is None
    t = p["tests"]["device_to_device_memcpy_read_ce"]
    assert t["status"] == "passed" and t["sum"] == 20785.58 and p["error"] is None
    values = t["matrix"]["values"]
    assert len(values) == 8 and values[2][4] == 372.96 and values[7][0] == 370.51
    assert [values[i][i] for i in range(8)] == [None] * 8


def test_readme_excerpts_without_sum_lines():
    p = parsed("nvbandwidth-README.d2d-write-ce.txt")
    t = p["tests"]["device_to_device_memcpy_write_ce"]
    assert t["status"] == "passed" and t["sum"] is None and p["error"] is None
    assert t["matrix"]["values"][6][0] == 274.89 and t["matrix"]["values"][3][3] == 0.0
    h = parsed("nvbandwidth-README.h2d-ce.txt")["tests"]["host_to_device_memcpy_ce"]
    assert h["matrix"]["values"] == [[26.03, 25.94, 25.97, 26.00, 26.19, 25.95, 26.00, 25.97]]


# --------------------------------------------------------------------------- text: failures


def test_truncated_run_is_incomplete():
    p = parsed("constructed-truncated-azurehpc-nvbandwidth_v0.10_output.txt")
    assert p["tests"]["device_to_device_memcpy_read_ce"]["status"] == "incomplete"
    assert p["tests"]["host_to_device_memcpy_ce"]["status"] == "passed"
    assert p["error"] == "incomplete output: device_to_device_memcpy_read_ce has no complete result"


def test_unknown_testcase_is_an_error():
    p = parsed("constructed-unknown-testcase.txt")
    assert p["hostname"] == "myhost"
    assert p["devices"][0] == {"index": 0, "name": "NVIDIA H100 80GB HBM3", "pci": "00000000:19:00",
                               "process": None, "host": None}
    assert p["tests"]["host_to_device_memcpy"]["status"] == "not found"
    assert p["tests"]["device_to_host_memcpy_ce"]["sum"] == 25.97
    assert p["error"] == "host_to_device_memcpy: ERROR: Testcase host_to_device_memcpy not found!"


def test_cuda_error_is_the_error():
    p = parsed("constructed-cuda-error.txt")
    assert p["version"] == "v0.8" and p["tests"] == {}
    assert p["error"].startswith("[CUDA_ERROR_NO_DEVICE] no CUDA-capable device is detected in expression cuInit(0)")


def test_error_line_of_a_running_test_and_bidirectional_matrices():
    # nvbandwidth's formats (output.cpp, inline_common.h): three matrices, then a test that threw
    text = read("azurehpc-nvbandwidth_v0.10_output.txt").replace("\r", "")
    block = ("Running device_to_device_bidirectional_memcpy_read_ce.\n"
             "memcpy CE GPU(row) <-> GPU(column) Read1 bandwidth (GB/s)\n          0         1\n"
             "0       N/A    276.07\n1    276.19       N/A\n\nSUM device_to_device_bidirectional_memcpy_read_ce_read1 552.26\n\n"
             "memcpy CE GPU(row) <-> GPU(column) Read2 bandwidth (GB/s)\n          0         1\n"
             "0       N/A    270.00\n1    271.00       N/A\n\nSUM device_to_device_bidirectional_memcpy_read_ce_read2 541.00\n\n"
             "memcpy CE GPU(row) <-> GPU(column) Total bandwidth (GB/s)\n          0         1\n"
             "0       N/A    546.07\n1    547.19       N/A\n\nSUM device_to_device_bidirectional_memcpy_read_ce_total 1093.26\n\n"
             "Running device_to_device_memcpy_write_ce.\nError: peer access is not supported\n")
    p = nb.parse(text + block)
    bi = p["tests"]["device_to_device_bidirectional_memcpy_read_ce"]
    assert [m["key"][-6:] for m in bi["matrices"]] == ["_read1", "_read2", "_total"]
    assert bi["sum"] == 1093.26 and bi["matrix"]["values"][1][0] == 547.19
    assert p["tests"]["device_to_device_memcpy_write_ce"]["status"] == "error"
    assert p["error"] == "device_to_device_memcpy_write_ce: peer access is not supported"


def test_launcher_prefixes_are_read_through():
    lines = read("azurehpc-nvbandwidth_v0.10_output.txt").splitlines()
    p = nb.parse("\n".join("0: " + line for line in lines))
    assert p["tests"]["device_to_device_memcpy_read_ce"]["sum"] == 552.26
    q = nb.parse("\n".join("[1,0]<stdout>:" + line for line in lines))
    assert q["tests"]["host_to_device_memcpy_ce"]["matrix"]["values"] == [[26.03, 25.94]]


# --------------------------------------------------------------------------- JSON


@pytest.mark.parametrize("name", JSON_FILES)
def test_dcgm_json(name):
    p = nb.parse_json(read(name))
    assert set(p) == KEYS and p["format"] == "json" and p["error"] is None
    assert (p["version"], p["cuda_runtime"], p["driver"], p["git_version"]) == ("v0.5", 12070, "565.02", None)
    statuses = [p["tests"][n]["status"] for n in p["order"]]
    assert len(statuses) == 32 and statuses.count("passed") == 15 and statuses.count("waived") == 17
    h2d = p["tests"]["host_to_device_memcpy_ce"]
    assert h2d["matrix"]["values"] == [[12.3964]] and h2d["sum"] == 12.396361291250001 and h2d["unit"] == "GB/s"
    assert p["tests"]["host_device_latency_sm"]["unit"] == "ns"
    assert p["tests"]["device_to_device_memcpy_read_ce"]["waived"] is True
    assert nb.parse_any(read(name))["format"] == "json"


def test_json_error_duplicate_entry_and_bidirectional_split():
    # json_output.cpp's shapes: an Error status comes as a second entry; three matrices in one list
    doc = {"nvbandwidth": {"version": "v0.8", "CUDA Runtime Version": 12040, "Driver Version": "550.54.15",
                           "GPU Device list": ["0: NVIDIA H100 80GB HBM3 (00000000:19:00): (node1)",
                                               "1: NVIDIA H100 80GB HBM3 (00000000:3b:00): (node1)"],
                           "testcases": [
                               {"name": "device_to_device_memcpy_read_ce", "status": "Running"},
                               {"name": "device_to_device_memcpy_read_ce", "status": "Error"},
                               {"name": "device_to_device_bidirectional_memcpy_write_ce", "status": "Passed",
                                "bandwidth_description": "memcpy CE GPU(row) <-> GPU(column) Total bandwidth (GB/s)",
                                "bandwidth_matrix": [["N/A", "1"], ["2", "N/A"], ["N/A", "3"], ["4", "N/A"],
                                                     ["N/A", "5"], ["6", "N/A"]], "sum": 11}]}}
    p = nb.parse_json("noise {\n" + json.dumps(doc) + "\ntrailer }")
    assert p["devices"][1] == {"index": 1, "name": "NVIDIA H100 80GB HBM3", "pci": "00000000:3b:00",
                               "process": None, "host": "node1"}
    assert p["tests"]["device_to_device_memcpy_read_ce"]["status"] == "error"
    bi = p["tests"]["device_to_device_bidirectional_memcpy_write_ce"]
    assert [m["key"] for m in bi["matrices"]] == ["device_to_device_bidirectional_memcpy_write_ce" + s
                                                   for s in ("_write1", "_write2", "_total")]
    assert bi["matrix"]["values"] == [[None, 5.0], [6.0, None]] and bi["sum"] == 11.0
    assert p["error"].startswith("device_to_device_memcpy_read_ce")


# --------------------------------------------------------------------------- per GPU


def test_per_gpu_host_and_peer_figures():
    g = nb.per_gpu(parsed("azurehpc-nvbandwidth_v0.10_output.txt"))
    assert g[0]["h2d_gbps"] == 26.03 and g[1]["h2d_gbps"] == 25.94
    assert g[0]["d2h_gbps"] == 25.97 and g[1]["d2h_gbps"] == 26.00
    assert (g[0]["d2d_read_min_gbps"], g[0]["d2d_read_min_peer"]) == (276.07, 1)
    assert (g[1]["d2d_read_min_gbps"], g[1]["d2d_read_min_peer"]) == (276.19, 0)


def test_per_gpu_eight_h100_row_minimum():
    g = nb.per_gpu(parsed("azurehpc-debugging-test-failure.h100-d2d-read.txt"))
    assert sorted(g) == list(range(8))
    assert (g[0]["d2d_read_min_gbps"], g[0]["d2d_read_min_peer"]) == (370.26, 6)
    assert g[3]["d2d_read_min_gbps"] == 370.77
    assert "h2d_gbps" not in g[0]


def test_per_gpu_zero_diagonal_is_skipped():
    g = nb.per_gpu(parsed("nvbandwidth-README.d2d-write-ce.txt"))
    assert (g[6]["d2d_write_min_gbps"], g[6]["d2d_write_min_peer"]) == (274.89, 0)
    assert all(v["d2d_write_min_gbps"] > 270 for v in g.values())


def test_per_gpu_ce_wins_over_sm():
    g = nb.per_gpu(nb.parse_json(read("dcgm-verboseFullOutput.json")))
    assert g[0]["h2d_gbps"] == g[0]["h2d_ce_gbps"] == 12.3964 and g[0]["h2d_sm_gbps"] == 12.3996
    assert g[0]["d2h_gbps"] == 13.2001 and g[0]["d2h_sm_gbps"] == 13.2027
    s = nb.per_gpu(parsed("superbench-nvbandwidth_results.log"))
    assert s[0]["h2d_gbps"] == 369.36 and s[0]["h2d_sm_gbps"] == 372.33


def test_per_gpu_of_nothing():
    assert nb.per_gpu({}) == {} and nb.per_gpu(None) == {} and nb.per_gpu(parsed("constructed-cuda-error.txt")) == {}
    assert nb.per_gpu({"tests": {"host_to_device_memcpy_ce": {"status": "passed", "matrix": "x"}}}) == {}


# --------------------------------------------------------------------------- never raises

GARBAGE = ["", "\n\n", None, 42, b"\xff\xfe", [], "Running .", "Running host_to_device_memcpy_ce.\n"
           "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)\n 0 1\n0 x y\n", "SUM", "SUM a b c",
           "Waived:\nWaived:", "{", '{"nvbandwidth": 3}', '{"nvbandwidth": {"testcases": [1, {"name": 2}, '
           '{"name": "a", "bandwidth_matrix": [[1], "x"]}]}}', "COEFFICIENT_OF_VARIATION x nan",
           "Device 99999999999999999999: x", "\x00" * 10]


@pytest.mark.parametrize("value", GARBAGE)
def test_garbage_never_raises(value):
    for fn in (nb.parse, nb.parse_json, nb.parse_any):
        p = fn(value)
        assert set(p) == KEYS and isinstance(p["error"], (str, type(None)))
        nb.per_gpu(p)


def test_every_cut_of_real_outputs_never_raises():
    rng = random.Random(7)
    for name in ("superbench-nvbandwidth_results.log", "azurehpc-debugging-test-failure.h100-d2d-read.txt"):
        text = read(name)
        for _ in range(60):
            a, b = sorted(rng.randrange(len(text) + 1) for _ in range(2))
            p = nb.parse(text[a:b])
            assert set(p) == KEYS
            nb.per_gpu(p)
    text = read("dcgm-verboseFullOutput.json")
    for cut in range(0, len(text), 97):
        assert set(nb.parse_json(text[:cut])) == KEYS


def test_no_test_output_is_an_error():
    assert nb.parse("")["error"] == "no test results"
    assert nb.parse_json("nothing")["error"] == "no nvbandwidth JSON object"


# --------------------------------------------------------------------------- argv


def test_argv():
    assert nb.argv("/opt/nvbandwidth", ["host_to_device_memcpy_ce", "device_to_device_memcpy_read_ce"],
                   samples=10) == ["/opt/nvbandwidth", "-t", "host_to_device_memcpy_ce", "-t",
                                   "device_to_device_memcpy_read_ce", "-i", "10"]
    assert nb.argv("nvbandwidth", "device_local_copy", json_output=True, buffer_mib=512) == \
        ["nvbandwidth", "-t", "device_local_copy", "-b", "512", "-j"]
    for bad in (("", ["a_b"]), ("nv", []), ("nv", ["x; rm -rf /"]), ("nv", ["-j"]), (None, ["a"]),
                ("nv\nx", ["a"])):
        assert nb.argv(*bad) is None
    assert nb.argv("nv", ["a"], samples=0) is None and nb.argv("nv", ["a"], samples=True) is None


# --------------------------------------------------------------------------- gpu_perf_figures.json

FIGURE_KEYS = ("h2d_gbps_min", "d2h_gbps_min", "d2d_read_gbps_min", "hbm_gbps_min", "sm_stress_gflops",
               "sm_stress_precision", "gemm_tflops_peak")


def figure_rows():
    return json.loads(FIGURES.read_text(encoding="utf-8"))["figures"]


def test_figures_file_loads_and_every_figure_has_a_source():
    raw = json.loads(FIGURES.read_text(encoding="utf-8"))
    assert isinstance(raw["about"], str) and len(raw["figures"]) >= 6
    assert nb.load_figures(str(FIGURES)) == raw["figures"]
    for row in raw["figures"]:
        assert set(row["match"]) <= {"all", "any", "none"} and row["match"]["all"]
        figures = [k for k in FIGURE_KEYS if k in row]
        assert figures, row["sku"]
        assert set(row["sources"]) == set(figures), row["sku"]
        assert set(row) <= set(FIGURE_KEYS) | {"sku", "match", "sources", "notes"}
        for key in figures:
            src = row["sources"][key]
            if "repository" in src:
                assert {"repository", "path", "commit", "line", "text", "licence"} <= set(src)
                assert re.match(r"^[0-9a-f]{40}$", src["commit"]) and src["line"] > 0 and src["text"].strip()
            else:
                assert src["url"].startswith("https://") and src["text"] and src["footnote"]
        if "gemm_tflops_peak" in row:
            assert set(row["gemm_tflops_peak"]) <= {"bf16", "fp16", "tf32", "fp8"}
            assert len(row["sources"]["gemm_tflops_peak"]["text"]) == len(row["gemm_tflops_peak"])


def test_azure_figures_match_the_shared_conf_copies():
    # the conf copies in /work/shared/fixtures/nccl (same commit): "check_gpu_bw H2D_D2H P2P"
    rows = {r["sku"]: r for r in figure_rows()}
    for sku, conf in (("H100 SXM5 80GB", "azurehpc-nd96isr_h100_v5.conf"), ("H200 SXM 141GB", "azurehpc-nd96isr_h200_v5.conf"),
                      ("A100 SXM4 80GB", "azurehpc-nd96amsr_a100_v4.conf")):
        path = Path("/work/shared/fixtures/nccl") / conf
        if not path.exists():
            pytest.skip("shared fixtures not here")
        lines = path.read_text().splitlines()
        src = rows[sku]["sources"]["h2d_gbps_min"]
        assert lines[src["line"] - 1] == src["text"]
        first, second = re.search(r"check_gpu_bw (\S+) (\S+)", src["text"]).groups()
        assert rows[sku]["h2d_gbps_min"] == rows[sku]["d2h_gbps_min"] == float(first)
        assert rows[sku]["d2d_read_gbps_min"] == float(second)


def test_dcgm_figures_are_their_lines_converted():
    for row in figure_rows():
        if "hbm_gbps_min" in row:
            src = row["sources"]["hbm_gbps_min"]
            value = float(src["text"].split(":")[1])
            assert row["hbm_gbps_min"] in (value / 1000.0, value)     # H200 2335: already GB/s (its note)
            assert src["text"].strip().startswith("minimum_bandwidth:")
        if "sm_stress_gflops" in row:
            assert float(row["sources"]["sm_stress_gflops"]["text"].split(":")[1]) == row["sm_stress_gflops"]
            dgemm = row["sources"]["sm_stress_precision"]["text"].split(":")[1].strip()
            assert row["sm_stress_precision"] == {"true": "fp64", "false": "fp32"}[dgemm]
    rows = {r["sku"]: r for r in figure_rows()}
    assert rows["H100 SXM5 80GB"]["hbm_gbps_min"] == 1905.0 and rows["H100 SXM5 80GB"]["sm_stress_gflops"] == 29250.0
    assert rows["H100 SXM5 80GB"]["gemm_tflops_peak"] == {"tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0}
    assert "fp8" not in rows["A100 SXM4 80GB"]["gemm_tflops_peak"]


def smi_names():
    names = set()
    for path in SMI.glob("*.txt"):
        names |= set(re.findall(r"Product Name\s+:\s+(.+?)\s*$", path.read_text(errors="replace"), re.M))
    return names


def test_matching_picks_the_row_for_real_nvidia_smi_names():
    names = smi_names()
    if not names:
        pytest.skip("shared nvidia-smi captures not here")
    assert {"NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA L40S"} <= names
    table = figure_rows()
    expected = {"NVIDIA H100 80GB HBM3": "H100 SXM5 80GB", "NVIDIA H200": "H200 SXM 141GB", "NVIDIA L40S": "L40S",
                "NVIDIA GeForce RTX 2080 SUPER": None, "NVIDIA GeForce RTX 4080 SUPER": None}
    for name in names:
        row = nb.figures_for(name, table)
        assert (row and row["sku"]) == expected[name], name
        assert row is None or "match" not in row


def test_matching_other_names():
    table = figure_rows()
    for name, sku in (("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"), ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB"),
                      ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB"), ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB"),
                      ("NVIDIA H100 PCIe", "H100 PCIe 80GB"), ("NVIDIA H100 NVL", "H100 NVL 94GB"),
                      ("NVIDIA H200 NVL", "H200 NVL 141GB"), ("NVIDIA GH200 480GB", None), (None, None), ("", None)):
        row = nb.figures_for(name, table)
        assert (row and row["sku"]) == sku, name
    assert nb.figures_for("NVIDIA H200")["hbm_gbps_min"] == 2333.0       # the file beside the script


# --------------------------------------------------------------------------- by hand


def test_run_by_hand():
    done = subprocess.run([sys.executable, str(SCRIPT), str(FIX / "azurehpc-nvbandwidth_v0.10_output.txt")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert json.loads(done.stdout)["tests"]["device_to_device_memcpy_read_ce"]["sum"] == 552.26
    done = subprocess.run([sys.executable, str(SCRIPT)], input=read("dcgm-verboseFullOutputWithErrors.txt"),
                          capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout)["format"] == "json"
