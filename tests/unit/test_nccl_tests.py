"""nccl_tests.py (nccl-check's reader of nccl-tests output, its bus arithmetic and the per-SKU
figures) on real outputs.

The outputs are tests/fixtures/nccl/ (README.md there: source, commit, licence; one file,
``synthetic-wrong-values.log``, is a real one edited, and says how). Expected figures were
written by hand from the files (reading them, ``grep``), not computed by the parser. The
newest format (nccl-tests 2.16.7 on: ``# Collective test starting``, ``[0000:0f:00]`` bus ids,
``# nccl-tests version``) is in no fixture with a licence: ``newest_output`` below writes it
with nccl-tests' own format strings (src/util.cu, NVIDIA/nccl-tests @ a0b82b2, v2.19.6).
"""
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.programs import load_script
from tests.programs import script_imports

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "nccl"
SCRIPT = ROOT / "diagnostics" / "scripts" / "nccl_tests.py"

nt = load_script("nccl_tests.py", "mldiag_test_nccl_tests")

GIB = 1024 ** 3
KEYS = {"op", "header", "devices", "rows", "avg_busbw", "avg_check", "out_of_bounds", "wrong_total",
        "nccl_warn", "nccl_info_lines", "version", "concluded", "error", "lines"}

# fixture -> (op, ranks), from the file: its program (the superbench file names, gcm's
# all_reduce_perf command) and its Rank lines
OUTPUTS = {
    "superbench-nccl_allreduce.log": ("all_reduce", 8),
    "superbench-nccl_alltoall.log": ("alltoall", 8),
    "superbench-nccl_allgather.log": ("all_gather", 8),
    "superbench-nccl_broadcast.log": ("broadcast", 8),
    "superbench-nccl_reduce.log": ("reduce", 8),
    "superbench-nccl_reducescatter.log": ("reduce_scatter", 8),
    "gcm-sample_single_success_output.txt": ("all_reduce", 8),
    "gcm-sample_pairwise_success_output.txt": ("all_reduce", 16),
    "synthetic-wrong-values.log": ("all_reduce", 8),
}


def read(name):
    return (FIX / name).read_text(encoding="utf-8")


def parsed(name, **kw):
    return nt.parse(read(name), **kw)


def placements(p):
    return [x for r in p["rows"] for x in (r["oop"], r["ip"]) if x]


# --------------------------------------------------------------------------- the recorded outputs


def test_superbench_all_reduce():
    """Old table (before nccl-tests 2.13): Rank lines without Group, `error` (N/A: -c 0)
    instead of #wrong, no root column; an NCCL INFO line among the rows."""
    p = parsed("superbench-nccl_allreduce.log")
    assert set(p) == KEYS
    assert p["op"] == "all_reduce"     # from the table: redop sum, busbw/algbw = 2*7/8
    assert p["header"] == {"nThread": 1, "nGpus": 8, "minBytes": 1, "maxBytes": 8589934592, "step": 2,
                           "step_kind": "factor", "warmup_iters": 5, "iters": 20, "validation": 0}
    assert len(p["devices"]) == 8
    assert p["devices"][0] == {"rank": 0, "group": None, "pid": 112424, "host": "localhost", "device": 0,
                               "busid": "0x00", "name": "A100-SXM4-40GB"}
    assert [d["device"] for d in p["devices"]] == list(range(8))
    assert {d["name"] for d in p["devices"]} == {"A100-SXM4-40GB"}
    assert len(p["rows"]) == 34          # two 0-byte rows, then 4 B .. 8 GiB
    assert [r["size"] for r in p["rows"][:4]] == [0, 0, 4, 8]
    assert p["rows"][-1] == {
        "size": 8589934592, "count": 2147483648, "type": "float", "redop": "sum", "root": None,
        "oop": {"time_us": 63896.0, "algbw": 134.44, "busbw": 235.26, "wrong": None, "max_error": None},
        "ip": {"time_us": 63959.0, "algbw": 134.30, "busbw": 235.03, "wrong": None, "max_error": None}}
    assert p["rows"][22]["oop"]["time_us"] == 112.0      # 4194304: "112.0"
    assert p["avg_busbw"] == 68.4048 and p["avg_check"] is None
    assert p["out_of_bounds"] == {"count": 0, "ok": True}
    assert p["wrong_total"] is None                       # N/A everywhere
    assert p["nccl_info_lines"] == 1 and p["nccl_warn"] == []
    assert p["version"] is None and p["error"] is None and p["lines"] == 53
    assert nt.peak_busbw(p) == (8589934592, 235.26)
    assert nt.peak_busbw(p, min_size=16 * GIB) is None
    assert nt.busbw_at(p, 16 * GIB) == (8589934592, 235.26)          # the largest size below it
    assert nt.busbw_at(p, GIB) == (1073741824, 230.29)
    assert nt.busbw_at(p, 3) == (0, 0.0) and nt.busbw_at(p, -1) is None


def test_superbench_alltoall_blank_redop():
    """alltoall's old table has a redop column it leaves blank."""
    p = parsed("superbench-nccl_alltoall.log")
    assert p["op"] == "alltoall"
    assert len(p["rows"]) == 34 and len(p["devices"]) == 8
    assert all(r["redop"] is None and r["root"] is None and r["type"] == "float" for r in p["rows"])
    assert [r["size"] for r in p["rows"][:6]] == [0, 0, 0, 0, 0, 32]
    assert p["rows"][-1]["oop"] == {"time_us": 33508.0, "algbw": 256.36, "busbw": 224.31, "wrong": None,
                                    "max_error": None}
    assert p["avg_busbw"] == 58.6481 and p["nccl_info_lines"] == 0 and p["lines"] == 52
    assert nt.peak_busbw(p) == (8589934592, 226.16)       # in-place


def test_superbench_all_gather_without_redop_column():
    p = parsed("superbench-nccl_allgather.log")
    assert p["op"] == "all_gather"       # old table without a redop column (alltoall's has one)
    assert len(p["rows"]) == 34 and all(r["redop"] is None for r in p["rows"])
    assert p["rows"][-1]["ip"]["busbw"] == 230.07
    assert p["avg_busbw"] == 58.2651
    assert nt.peak_busbw(p) == (8589934592, 230.07)


def test_superbench_broadcast_root_column():
    p = parsed("superbench-nccl_broadcast.log")
    assert p["op"] == "broadcast"        # a root, no reduction
    assert all(r["root"] == 0 and r["redop"] is None for r in p["rows"])
    assert all(x["busbw"] == x["algbw"] for x in placements(p))
    assert p["avg_busbw"] == 64.8653
    assert nt.peak_busbw(p) == (8589934592, 234.70)


def test_superbench_reduce_peaks_below_the_largest_size():
    p = parsed("superbench-nccl_reduce.log")
    assert p["op"] == "reduce"
    assert all(r["root"] == 0 and r["redop"] == "sum" for r in p["rows"])
    assert nt.peak_busbw(p) == (4294967296, 231.28)       # 8 GiB: 228.38 / 228.83
    assert nt.busbw_at(p, 8 * GIB) == (8589934592, 228.83)
    assert nt.peak_busbw(p, min_size=8 * GIB) == (8589934592, 228.83)
    assert p["avg_busbw"] == 65.018


def test_superbench_reduce_scatter_told_from_all_reduce_by_its_factor():
    p = parsed("superbench-nccl_reducescatter.log")
    assert p["op"] == "reduce_scatter"   # redop sum, no root, like all_reduce; busbw/algbw = 7/8
    assert p["rows"][-1]["oop"]["busbw"] == 231.52 and p["rows"][-1]["oop"]["algbw"] == 264.60
    assert p["avg_busbw"] == 60.168


def test_gcm_single_node():
    """nccl-tests 2.13.4-style table (Group, root, #wrong) under MPI (-g 1: nGpus 1 a process,
    8 Rank lines), an `NCCL version` line."""
    p = parsed("gcm-sample_single_success_output.txt")
    assert p["op"] == "all_reduce"
    assert p["header"] == {"nThread": 1, "nGpus": 1, "minBytes": 33554432, "maxBytes": 1073741824, "step": 2,
                           "step_kind": "factor", "warmup_iters": 5, "iters": 20, "agg_iters": 1,
                           "validation": 1, "graph": 0}
    assert p["devices"][0] == {"rank": 0, "group": 0, "pid": 66421, "host": "{hostname}", "device": 0,
                               "busid": "0x00", "name": "NVIDIA A100-SXM4-80GB"}
    assert [d["pid"] for d in p["devices"]] == [66421, 66422, 66423, 66424, 66425, 66428, 66431, 66438]
    assert p["version"] == "2.16.2+cuda11.6"
    assert [r["size"] for r in p["rows"]] == [33554432 * 2 ** i for i in range(6)]
    assert p["rows"][0] == {
        "size": 33554432, "count": 8388608, "type": "float", "redop": "sum", "root": -1,
        "oop": {"time_us": 344.8, "algbw": 97.32, "busbw": 170.31, "wrong": 0, "max_error": None},
        "ip": {"time_us": 349.5, "algbw": 95.99, "busbw": 167.99, "wrong": 0, "max_error": None}}
    assert p["wrong_total"] == 0 and p["out_of_bounds"] == {"count": 0, "ok": True}
    assert p["avg_busbw"] == 210.99 and p["error"] is None and p["lines"] == 26
    assert nt.peak_busbw(p) == (1073741824, 231.72)
    assert nt.busbw_at(p, 16 * GIB) == (1073741824, 231.72)   # ran up to 1 GiB only
    assert nt.busbw_at(p, 512 * 1024 ** 2) == (536870912, 227.02)
    assert nt.busbw_at(p, 1000) is None
    # the A100 80GB figure (228 GB/s at 16 GiB, 8 GPUs) is for this node's GPUs
    row = nt.threshold_for(p["devices"][0]["name"], gpus=len(p["devices"]))
    assert row["busbw_gbps"] == 228.0 and row["size_bytes"] == 16 * GIB


def test_gcm_two_nodes():
    p = parsed("gcm-sample_pairwise_success_output.txt")
    assert p["op"] == "all_reduce"       # busbw/algbw = 2*15/16 over the 16 Rank lines
    assert len(p["devices"]) == 16
    assert [d["host"] for d in p["devices"]] == ["{host1}"] * 8 + ["{host2}"] * 8
    assert [d["device"] for d in p["devices"]] == list(range(8)) * 2
    assert [d["rank"] for d in p["devices"]] == list(range(16))
    assert p["header"]["nGpus"] == 1
    assert p["version"] == "2.12.12+cuda11.6"
    assert p["avg_busbw"] == 150.209 and len(p["rows"]) == 6
    assert nt.peak_busbw(p) == (1073741824, 182.80)
    assert nt.threshold_for(p["devices"][0]["name"], gpus=16) is None   # a figure for 8 GPUs


def test_gcm_failed_launch():
    p = parsed("gcm-sample_failure_output.txt")
    assert "not enough slots" in p["error"]
    assert p["error"] == ("There are not enough slots available in the system to satisfy the 16 slots "
                          "that were requested by the application")
    assert p["rows"] == [] and p["devices"] == [] and p["header"] == {}
    assert p["op"] is None and p["avg_busbw"] is None and p["out_of_bounds"] is None
    assert p["lines"] == 30
    assert parsed("gcm-sample_failure_output.txt", op="all_reduce")["op"] == "all_reduce"   # the caller's word
    assert nt.peak_busbw(p) is None and nt.busbw_at(p, GIB) is None


def test_synthetic_wrong_values():
    """The one edited file: #wrong 8192 both ways on the 256 MiB row, 16 out-of-bounds values
    (README.md there says why these numbers)."""
    p = parsed("synthetic-wrong-values.log")
    assert [(r["oop"]["wrong"], r["ip"]["wrong"]) for r in p["rows"]] == [(0, 0)] * 3 + [(8192, 8192)] + [(0, 0)] * 2
    assert p["rows"][3]["size"] == 268435456
    assert p["wrong_total"] == 16384
    assert p["out_of_bounds"] == {"count": 16, "ok": False}
    assert p["error"] is None            # the run completed: wrong values are the caller's verdict
    assert p["avg_busbw"] == 210.99


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_busbw_is_algbw_times_the_bus_factor(name):
    """Every row of every output, both placements: busbw = algbw x bus_factor(op, ranks), to
    the rounding of two printed decimals (each off by up to 0.005)."""
    op, ranks = OUTPUTS[name]
    p = parsed(name)
    assert len(p["devices"]) == ranks and p["op"] == op
    factor = nt.bus_factor(op, ranks)
    checked = 0
    for x in placements(p):
        assert abs(x["busbw"] - x["algbw"] * factor) <= 0.005 * factor + 0.005 + 1e-9, (x, factor)
        checked += 1
    assert checked == 2 * len(p["rows"]) > 0
    # and algbw = size / time (decimal GB/s), to the rounding of the printed time, where the
    # time is long enough for its 3-4 significant digits to say it
    for r in p["rows"]:
        for x in (r["oop"], r["ip"]):
            if x["time_us"] >= 100 and x["algbw"] >= 1:
                assert nt.algbw(r["size"], x["time_us"] / 1e6) == pytest.approx(x["algbw"], rel=2e-3, abs=0.006)


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_avg_bus_bandwidth_is_the_mean_of_every_busbw(name):
    """What `# Avg bus bandwidth` is (nccl-tests sums each busbw it prints and divides by
    their number): the mean over all sizes and both placements, not a large-size figure --
    so a run from 1 B (68.4 GB/s) and one from 32 MiB (211 GB/s) differ on the same GPUs."""
    p = parsed(name)
    values = [x["busbw"] for x in placements(p)]
    assert sum(values) / len(values) == pytest.approx(p["avg_busbw"], abs=0.01)


def test_bus_factors():
    assert nt.bus_factor("all_reduce", 8) == 1.75
    assert nt.bus_factor("all_reduce", 16) == 1.875
    assert nt.bus_factor("all_reduce", 2) == 1.0
    assert nt.bus_factor("all_reduce", 1) == 0.0          # one GPU: busbw 0, as nccl-tests prints
    for op in ("reduce_scatter", "all_gather", "alltoall"):
        assert nt.bus_factor(op, 8) == 0.875
    for op in ("broadcast", "reduce", "sendrecv"):
        assert nt.bus_factor(op, 8) == 1.0
    for alias in ("all-reduce", "AllReduce", "allreduce", "all_reduce_perf", " All Reduce "):
        assert nt.bus_factor(alias, 4) == 1.5
    assert nt.bus_factor("alltoall_perf", 4) == 0.75 and nt.bus_factor("all_to_all", 4) == 0.75
    for bad_op in ("gossip", "", None, 3, "all_reduce;"):
        assert nt.bus_factor(bad_op, 8) is None
    for bad_n in (0, -1, None, 8.0, True, "8"):
        assert nt.bus_factor("all_reduce", bad_n) is None
    assert set(nt.BUS_FACTORS) >= {"all_reduce", "reduce_scatter", "all_gather", "alltoall", "broadcast",
                                   "reduce", "sendrecv"}


def test_algbw():
    # the superbench all-reduce's last row: 8 GiB in 63896 us, printed 134.44
    assert round(nt.algbw(8589934592, 63896e-6), 2) == 134.44
    assert nt.algbw(10 ** 9, 1.0) == 1.0                   # GB/s: 1e9 bytes, not GiB
    assert nt.algbw(1024, 0) == 0.0 and nt.algbw(1024, -1) == 0.0 and nt.algbw(1024, None) == 0.0


# --------------------------------------------------------------------------- formats no fixture has

DEVICES = [(0x0f, "0"), (0x15, "0"), (0x51, "0"), (0x54, "0"), (0x8d, "0"), (0x92, "0"), (0xd6, "0"), (0xda, "0")]


def newest_output(rows, avg="%g" % 471.5, bounds=0, program="all_reduce_perf", redop="sum", per_iter=False,
                  timestamps=False, check=None):
    """An all_reduce_perf output of nccl-tests 2.19 (src/util.cu writeDeviceReport,
    writeResultHeader, writeBenchmarkLinePreamble/Body, writeResultFooter): its format strings,
    filled in. rows: (size, count, oop (time, algbw, busbw, wrong), ip (...))."""
    out = ["# nccl-tests version %s nccl-headers=%d nccl-library=%d" % ("2.17.6", 22703, 22703),
           "# Collective test starting: %s" % program,
           "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d agg iters: %d "
           "validation: %d graph: %d unalign: %d" % (1, 8, 1024, 17179869184, 2, "factor", 5, 20, 1, 1, 0, 0),
           "#", "# Using devices"]
    for i, (bus, _) in enumerate(DEVICES):
        out.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"
                   % (i, 0, 4242, "gpu-node-7", i, 0, bus, 0, "NVIDIA H100 80GB HBM3"))
    out.append("#")
    ts_lbl, ts_pad, ts_fmt = ("timestamp", 19, "%Y-%m-%d %H:%M:%S") if timestamps else ("", 0, "")
    if per_iter:
        out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  "
                   "%7s  %7s %*s" % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                                     "i_min", "i_max", "i_p99", "i_cv%", "time", "algbw", "busbw", "#wrong",
                                     "i_min", "i_max", "i_p99", "i_cv%", ts_pad, ts_lbl))
    else:
        out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
                   % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                      "busbw", "#wrong", ts_pad, ts_lbl))
        out.append("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
                   % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
                      "", ts_pad, ts_fmt))
    for size, count, oop, ip in rows:
        line = "%12li  %12li  %8s  %6s  %6s" % (size, count, "float", redop, "%6i" % -1)
        for t, a, b, w in (oop, ip):
            line += "  %7s  %6s  %6s  %6g" % ("%.2f" % t if t < 1e4 else "%.0f" % t, "%.2f" % a, "%.2f" % b, w)
            if per_iter:
                line += "  %7s  %7s  %7s  %7s" % ("%.2f" % (t * 0.98), "%.2f" % (t * 1.05), "%.2f" % (t * 1.04), "1.25")
        if timestamps:
            line += "%21s" % "2025-11-03 10:15:42"
        out.append(line)
    out.append("# %-20s : %d %s" % ("Out of bounds values", bounds, "FAILED" if bounds else "OK"))
    out.append("# %-20s : %s %s" % ("Avg bus bandwidth", avg, check or ""))
    out += ["#", "# Collective test concluded: %s" % program, ""]
    return "\n".join(out)


ROWS = [(8589934592, 2147483648, (33605.0, 255.62, 447.34, 0), (33628.0, 255.44, 447.02, 0)),
        (17179869184, 4294967296, (66132.0, 259.78, 454.62, 0), (66109.0, 259.87, 454.77, 0))]


def test_newest_format():
    p = nt.parse(newest_output(ROWS))
    assert p["op"] == "all_reduce" and p["concluded"] is True
    assert p["header"]["nccl_tests_version"] == "2.17.6"
    assert p["header"]["nccl_headers"] == p["header"]["nccl_library"] == 22703
    assert p["header"]["unalign"] == 0 and p["header"]["agg_iters"] == 1 and p["header"]["program"] == "all_reduce_perf"
    assert p["version"] == "2.27.3"      # no "NCCL version" line: from nccl-library=
    assert p["devices"][1] == {"rank": 1, "group": 0, "pid": 4242, "host": "gpu-node-7", "device": 1,
                               "busid": "0000:15:00", "name": "NVIDIA H100 80GB HBM3"}
    assert [r["size"] for r in p["rows"]] == [8 * GIB, 16 * GIB]
    assert p["rows"][1]["oop"] == {"time_us": 66132.0, "algbw": 259.78, "busbw": 454.62, "wrong": 0, "max_error": None}
    assert p["avg_busbw"] == 471.5 and p["avg_check"] is None and p["error"] is None
    assert nt.busbw_at(p, 16 * GIB) == (16 * GIB, 454.77)
    row = nt.threshold_for(p["devices"][0]["name"], gpus=len(p["devices"]))
    assert nt.busbw_at(p, row["size_bytes"])[1] < row["busbw_gbps"] == 460.0
    # the output's name wins over the caller's
    assert nt.parse(newest_output(ROWS), op="alltoall")["op"] == "all_reduce"


def test_newest_format_other_collectives_and_check():
    p = nt.parse(newest_output(ROWS, program="alltoall_perf", redop="none"))
    assert p["op"] == "alltoall" and all(r["redop"] is None and r["root"] == -1 for r in p["rows"])
    # without the starting line, 2.13.4 on: all_gather and alltoall print alike -- not guessed
    rows = [(s, c, (t, a, round(a * 7 / 8, 2), w), (t2, a2, round(a2 * 7 / 8, 2), w2))
            for s, c, (t, a, _, w), (t2, a2, _, w2) in ROWS]
    text = "\n".join(l for l in newest_output(rows, redop="none").splitlines() if "Collective test" not in l)
    assert nt.parse(text)["op"] is None
    assert nt.parse(text, op="all_gather")["op"] == "all_gather"
    # -c 1 with a figure to check against: the verdict after the average
    p = nt.parse(newest_output(ROWS, avg="471.5", check="FAILED"))
    assert p["avg_busbw"] == 471.5 and p["avg_check"] == "FAILED"


def test_per_iteration_columns_and_timestamps():
    p = nt.parse(newest_output(ROWS, per_iter=True, timestamps=True))
    assert len(p["rows"]) == 2
    r = p["rows"][0]
    assert r["timestamp"] == "2025-11-03 10:15:42"
    assert r["oop"]["busbw"] == 447.34 and r["ip"]["busbw"] == 447.02 and r["ip"]["wrong"] == 0
    assert r["oop"]["i_cv_pct"] == 1.25 and r["oop"]["i_min_us"] == round(33605.0 * 0.98, 2)
    p = nt.parse(newest_output(ROWS, timestamps=True))
    assert [r["timestamp"] for r in p["rows"]] == ["2025-11-03 10:15:42"] * 2 and p["rows"][1]["ip"]["busbw"] == 454.77


def test_large_wrong_counts_in_g_format():
    """#wrong is printed %6g from 2.17.3 (%5g before): a million and more read as 1.04858e+06."""
    rows = [(8589934592, 2147483648, (33605.0, 255.62, 447.34, 1048576), (33628.0, 255.44, 447.02, 1000000))]
    p = nt.parse(newest_output(rows, bounds=16))
    assert (p["rows"][0]["oop"]["wrong"], p["rows"][0]["ip"]["wrong"]) == (1048580, 1000000)
    assert p["wrong_total"] == 2048580 and p["out_of_bounds"] == {"count": 16, "ok": False}


def test_old_error_column_with_validation():
    """Before 2.13 with -c 1 the 4th column is the largest deviation (%5.0le), not a count."""
    text = read("superbench-nccl_allreduce.log").replace("   N/A", "0e+00").replace("validation: 0", "validation: 1")
    p = nt.parse(text)
    assert len(p["rows"]) == 34
    assert all(x["wrong"] is None and x["max_error"] == 0.0 for x in placements(p))
    assert p["wrong_total"] is None
    # rows alone, without the column header: the %5.0le form still reads as a deviation
    rows_only = "\n".join(l for l in text.splitlines() if not l.startswith("#"))
    assert all(x["max_error"] == 0.0 and x["wrong"] is None for x in placements(nt.parse(rows_only)))


def test_launcher_prefixes():
    """srun -l ("0: ") and mpirun --tag-output ("[1,0]<stdout>:") in front of every line."""
    plain = parsed("gcm-sample_single_success_output.txt")
    for prefix in ("0: ", "12: ", "[1,0]<stdout>:", "[1,0]<stdout>: "):
        text = "\n".join(prefix + l for l in read("gcm-sample_single_success_output.txt").splitlines())
        p = nt.parse(text)
        assert (p["rows"], p["devices"], p["avg_busbw"], p["version"]) == \
            (plain["rows"], plain["devices"], plain["avg_busbw"], plain["version"])


def test_crlf_and_bytes():
    text = read("gcm-sample_pairwise_success_output.txt")
    assert nt.parse(text.replace("\n", "\r\n"))["rows"] == parsed("gcm-sample_pairwise_success_output.txt")["rows"]
    assert nt.parse(text.encode())["avg_busbw"] == 150.209


# --------------------------------------------------------------------------- failures


HEAD = "\n".join(newest_output(ROWS).splitlines()[:16])     # up to the column headers


def test_nccl_failure_names_the_cause_not_its_trace():
    text = HEAD + "\n" + "\n".join([
        "h100-4:739788:739877 [2] misc/socket.cc:397 NCCL WARN Net : connecting to address  with family 33621 is "
        "neither AF_INET(2) nor AF_INET6(10)",
        "h100-4:739788:739877 [2] NCCL INFO bootstrap.cc:256 -> 3",
        " .. h100-4 pid 739790: Test failure common.cu:893",
        "h100-4: Test NCCL failure common.cu:1057 'internal error / '",
        " .. h100-4 pid 739788: Test failure common.cu:893"])
    p = nt.parse(text)
    assert p["error"] == "h100-4: Test NCCL failure common.cu:1057 'internal error / '"
    assert p["rows"] == [] and p["nccl_info_lines"] == 1
    assert p["nccl_warn"] == ["h100-4:739788:739877 [2] misc/socket.cc:397 NCCL WARN Net : connecting to address  "
                              "with family 33621 is neither AF_INET(2) nor AF_INET6(10)"]
    only_trace = "\n".join(l for l in text.splitlines() if "Test NCCL failure" not in l)
    assert nt.parse(only_trace)["error"] == ".. h100-4 pid 739790: Test failure common.cu:893"


def test_cuda_failure_after_some_rows():
    lines = newest_output(ROWS).splitlines()
    text = "\n".join(lines[:17] + ["gpu-node-7: Test CUDA failure common.cu:395 'an illegal memory access was "
                                   "encountered'", " .. gpu-node-7 pid 4242: Test failure common.cu:590"])
    p = nt.parse(text)
    assert len(p["rows"]) == 1
    assert p["error"] == "gpu-node-7: Test CUDA failure common.cu:395 'an illegal memory access was encountered'"


def test_nccl_warn_without_rows_is_the_error():
    text = HEAD + "\ngpu-node-7:4242:4300 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer " \
                  "10.0.0.2<4134> with error 12, opcode 0, len 0, vendor err 129 (Recv)\n"
    p = nt.parse(text)
    assert p["error"].startswith("NCCL WARN: gpu-node-7:4242:4300 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB")
    # the same line in a run that completed: kept, no error
    lines = newest_output(ROWS).splitlines()
    p = nt.parse("\n".join(lines[:17] + [text.splitlines()[-1]] + lines[17:]))
    assert p["error"] is None and len(p["nccl_warn"]) == 1 and len(p["rows"]) == 2


def test_warn_lines_are_bounded():
    text = "\n".join("host:1:%d [0] init.cc:1 NCCL WARN message %d" % (i, i) for i in range(500))
    p = nt.parse(text)
    assert len(p["nccl_warn"]) == 50 and p["nccl_warn"][0].endswith("message 0")
    assert p["error"] == "NCCL WARN: host:1:0 [0] init.cc:1 NCCL WARN message 0"


def test_incomplete_and_empty_outputs():
    lines = newest_output(ROWS).splitlines()
    assert nt.parse("\n".join(lines[:17]))["error"].startswith("incomplete output: no summary after 1 result rows")
    assert nt.parse("\n".join(lines[:16]))["error"] == "no result rows"
    for empty in ("", "\n", None, 42, ["x"]):
        p = nt.parse(empty)
        assert set(p) == KEYS and p["error"] == "no result rows" and p["rows"] == []
    assert nt.parse("")["lines"] == 0 and nt.parse("a\nb\n")["lines"] == 2


@pytest.mark.parametrize("line, cause", [
    ("Invalid number of GPUs: 8 requested but only 4 were found.", "Invalid number of GPUs"),
    ("./all_reduce_perf: error while loading shared libraries: libnccl.so.2: cannot open shared object file",
     "error while loading shared libraries"),
    ("srun: error: gpu-3: task 5: Exited with exit code 2", "srun: error:"),
    ("mpirun was unable to launch the specified application as it could not access", "unable to launch"),
    ("gpu-3: Test timeout (1800s) common.cu:523", "Test timeout"),
])
def test_other_launch_failures(line, cause):
    assert cause in nt.parse("some banner\n" + line + "\n")["error"]


# --------------------------------------------------------------------------- never raises

VOCAB = ["#", "# nThread", "nGpus", "Rank", "Group", "Pid", "on", "device", "[0x00]", "[0000:0f:00]", "size", "count",
         "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "error", "i_min", "float", "sum", "none", "-1",
         "0", "1", "8", "N/A", "nan", "-nan", "inf", "1e+06", "0e+00", "3.5", "99999999999999999999999", "-", ":",
         "Out of bounds values :", "Avg bus bandwidth :", "OK", "FAILED", "NCCL WARN", "NCCL INFO",
         "Test NCCL failure", "Collective test starting:", "_perf", "nccl-tests version", "nccl-library=99",
         "NCCL version", "2025-01-01", "12:00:00", "\t", "\x00", "\u00e9", "12:", "[1,0]<stdout>:"]


def check_shape(p):
    assert set(p) == KEYS
    assert isinstance(p["rows"], list) and isinstance(p["devices"], list) and isinstance(p["header"], dict)
    assert isinstance(p["nccl_warn"], list) and len(p["nccl_warn"]) <= 50
    assert isinstance(p["lines"], int) and isinstance(p["nccl_info_lines"], int)
    assert p["error"] is None or isinstance(p["error"], str)
    assert p["wrong_total"] is None or isinstance(p["wrong_total"], int)
    assert p["avg_busbw"] is None or math.isfinite(p["avg_busbw"])
    for r in p["rows"]:
        for x in (r["oop"], r["ip"]):
            assert x is None or all(math.isfinite(x[k]) for k in ("time_us", "algbw", "busbw"))
    json.dumps(p, allow_nan=False)       # what the result carries over the wire
    nt.peak_busbw(p), nt.peak_busbw(p, min_size=7), nt.busbw_at(p, GIB)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text(max_size=400))
def test_random_text_never_raises(text):
    check_shape(nt.parse(text))


@FUZZ
@given(st.lists(st.lists(st.sampled_from(VOCAB), max_size=20).map(" ".join), max_size=30).map("\n".join))
def test_nccl_shaped_garbage_never_raises(text):
    check_shape(nt.parse(text))


@pytest.mark.parametrize("name", sorted(OUTPUTS) + ["gcm-sample_failure_output.txt"])
def test_damaged_outputs_never_raise(name):
    """Each output cut short, lines dropped, doubled, shuffled, characters swapped (seeded)."""
    rnd = random.Random(name)
    lines = read(name).splitlines()
    for _ in range(60):
        damaged = list(lines)
        for _ in range(rnd.randint(1, 6)):
            what = rnd.randrange(5)
            i = rnd.randrange(len(damaged)) if damaged else 0
            if not damaged:
                break
            if what == 0:
                damaged = damaged[:i]
            elif what == 1:
                del damaged[i]
            elif what == 2:
                damaged.insert(i, damaged[i])
            elif what == 3:
                line = damaged[i]
                j = rnd.randrange(len(line) + 1)
                damaged[i] = line[:j] + rnd.choice(["", " ", "x", "\x00", "-", "9", "#", "e+"]) + line[j + 1:]
            else:
                rnd.shuffle(damaged)
        check_shape(nt.parse("\n".join(damaged)))


def test_figures_of_anything():
    for bad in (None, [], {}, {"rows": "x"}, {"rows": [None, 3, {}, {"size": "big", "oop": 1},
                                                      {"size": 8, "oop": {"busbw": float("nan")}, "ip": None}]}):
        assert nt.peak_busbw(bad) is None and nt.busbw_at(bad, GIB) is None
    rows = [{"size": 8, "oop": None, "ip": {"busbw": 2.0}}, {"size": 16, "oop": {"busbw": 3.0}, "ip": {"busbw": 1.0}}]
    assert nt.peak_busbw(rows) == (16, 3.0) and nt.peak_busbw({"rows": rows}, min_size=9) == (16, 3.0)
    assert nt.busbw_at(rows, 15) == (8, 2.0)
    # two rows of one size (a run over two types): the better
    assert nt.busbw_at(rows + [{"size": 16, "oop": {"busbw": 4.0}, "ip": None}], 16) == (16, 4.0)


# --------------------------------------------------------------------------- thresholds


def conf_line(name, number):
    return read(name).splitlines()[number - 1]


def test_every_threshold_is_its_sources_line():
    """Each row's figure, size and GPU count are what its conf file says (the fixture is that
    file, byte for byte, at that commit)."""
    rows = nt.load_thresholds()
    assert [r["busbw_gbps"] for r in rows] == [460.0, 431.0, 228.0]
    fixture = {"conf/nd96isr_h100_v5.conf": "azurehpc-nd96isr_h100_v5.conf",
               "conf/nd96isr_h200_v5.conf": "azurehpc-nd96isr_h200_v5.conf",
               "conf/nd96amsr_a100_v4.conf": "azurehpc-nd96amsr_a100_v4.conf"}
    for row in rows:
        src = row["source"]
        assert set(row) == {"sku", "match", "op", "busbw_gbps", "size_bytes", "gpus", "compare", "source"}
        assert src["repository"] == "Azure/azurehpc-health-checks"
        assert src["commit"] == "df20d06801dbe8461e7e5661223829109622143c"
        name = fixture[src["path"]]
        assert conf_line(name, src["line"]) == src["text"]
        words = src["text"].split()
        assert words[2] == "check_nccl_allreduce" and row["op"] == "all_reduce"
        assert float(words[3]) == row["busbw_gbps"]
        assert words[5] == "16G" and row["size_bytes"] == 16 * GIB         # nccl-tests' G is 1024^3
        [count] = re.findall(r"check_gpu_count (\d+)", read(name))
        assert int(count) == row["gpus"] == 8


@pytest.mark.parametrize("gpu_name, sku_figure", [
    ("NVIDIA H100 80GB HBM3", 460.0),
    ("NVIDIA H100", 460.0),
    ("NVIDIA H200", 431.0),
    ("NVIDIA A100-SXM4-80GB", 228.0),
    ("A100-SXM4-80GB", 228.0),
    ("NVIDIA A100-SXM-80GB", 228.0),
    ("  nvidia a100-sxm4-80gb ", 228.0),
    ("A100-SXM4-40GB", None),            # no published figure for the 40 GB part here
    ("NVIDIA A100 80GB PCIe", None),
    ("NVIDIA H100 PCIe", None),
    ("NVIDIA H100 NVL", None),
    ("NVIDIA H200 NVL", None),
    ("NVIDIA GH200 480GB", None),        # whole words: GH200 is no H200
    ("NVIDIA H800", None),
    ("Tesla V100-SXM2-32GB", None),
    ("NVIDIA B200", None),
    ("", None),
    (None, None),
    (42, None),
])
def test_threshold_for_nvidia_smi_names(gpu_name, sku_figure):
    row = nt.threshold_for(gpu_name)
    assert (row and row["busbw_gbps"]) == sku_figure
    if row:
        assert set(row) == {"sku", "op", "busbw_gbps", "size_bytes", "gpus", "compare", "source"}
        assert row["op"] == "all_reduce" and row["gpus"] == 8 and row["size_bytes"] == 16 * GIB
        assert nt.threshold_for(gpu_name, gpus=8) == row
        assert nt.threshold_for(gpu_name, gpus=4) is None        # measured with 8 GPUs
        assert nt.threshold_for(gpu_name, op="all-reduce") == row
        assert nt.threshold_for(gpu_name, op="all_gather") is None
        assert nt.threshold_for(gpu_name, op="alltoall") is None


def test_threshold_for_a_given_table():
    table = [{"sku": "X", "match": {"all": ["B200"]}, "op": "alltoall", "busbw_gbps": 1.0, "size_bytes": 8,
              "gpus": None, "source": {}}, "junk", {"match": None, "op": "alltoall"}]
    assert nt.threshold_for("NVIDIA B200", op="alltoall", gpus=8, table=table)["sku"] == "X"
    assert nt.threshold_for("NVIDIA B200", table=table) is None
    assert nt.threshold_for("NVIDIA H100 80GB HBM3", table=[]) is None


def test_load_thresholds_errors(tmp_path):
    with pytest.raises(OSError):
        nt.load_thresholds(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError):
        nt.load_thresholds(str(tmp_path / "bad.json"))
    (tmp_path / "empty.json").write_text('{"thresholds": 3}')
    with pytest.raises(ValueError):
        nt.load_thresholds(str(tmp_path / "empty.json"))
    assert nt.load_thresholds() is nt.load_thresholds()             # cached


# --------------------------------------------------------------------------- the script itself


def test_python38_syntax_and_stdlib_only():
    imported = script_imports(SCRIPT)
    assert imported == {"__future__", "json", "math", "os", "re", "sys"}
    assert script_imports(SCRIPT, module_level=True) == {"__future__", "json", "math", "os", "re"}
    if hasattr(sys, "stdlib_module_names"):
        assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_run_by_hand():
    r = subprocess.run([sys.executable, str(SCRIPT), str(FIX / "superbench-nccl_allreduce.log")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["avg_busbw"] == 68.4048 and doc["op"] == "all_reduce" and len(doc["rows"]) == 34
    r = subprocess.run([sys.executable, str(SCRIPT)], input=read("gcm-sample_failure_output.txt"),
                       capture_output=True, text=True, timeout=60)
    assert "not enough slots" in json.loads(r.stdout)["error"]


def test_on_a_real_python_3_8():
    """The target's oldest Python: every fixture parsed, the thresholds read, no 3.9+ API."""
    from tests.pythons import require_python
    py38 = require_python("3.8")
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import nccl_tests as nt\n"
            "out = {}\n"
            "for name in sys.argv[2:]:\n"
            "    p = nt.parse(open(name).read())\n"
            "    out[name] = [p['op'], len(p['rows']), p['avg_busbw'], p['error'], nt.peak_busbw(p)]\n"
            "out['h100'] = nt.threshold_for('NVIDIA H100 80GB HBM3', gpus=8)['busbw_gbps']\n"
            "print(json.dumps(out))\n")
    names = [str(FIX / n) for n in sorted(OUTPUTS)]
    r = subprocess.run([py38, "-c", code, str(SCRIPT.parent)] + names, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out.pop("h100") == 460.0
    for name in names:
        p = nt.parse(Path(name).read_text())
        assert out[name] == [p["op"], len(p["rows"]), p["avg_busbw"], p["error"], list(nt.peak_busbw(p))]
