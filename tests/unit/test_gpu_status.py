"""gpu-status against the fake nvidia-smi answering from real captures.

The diagnostic runs in-process (its ``run(args)``), and it runs the fake as a real subprocess,
the way it runs nvidia-smi on a target. Expected values were written by hand from the capture
files in tests/fixtures/nvidia-smi/, not computed from them.
"""

import copy
import ctypes as C
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from tests.programs import load_module, load_script
from tests.programs import fake_nvidia_smi_module, level_codes, script_imports

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "diagnostics" / "scripts" / "gpu_status.py"
FAKE = ROOT / "tests" / "fakes" / "nvidia-smi"
CAPTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"

H100 = "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
H200 = "linux-x86_64__nvidia-h200__590.48.01.txt"


gs = load_script("gpu_status.py", "mldiag_test_gpu_status")


@pytest.fixture
def smi_env(tmp_path, monkeypatch):
    """PATH whose ``python3`` is this venv's interpreter without site (-S): the fake's
    ``#!/usr/bin/env python3`` runs on whatever python3 comes first, as on a target, and the
    fake needs only the standard library, so it starts in half the time."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    wrapper = bindir / "python3"
    wrapper.write_text('#!/bin/sh\nexec %s -S "$@"\n' % shlex.quote(sys.executable))  # -S: stdlib is all it needs
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", "%s%s%s" % (bindir, os.pathsep, os.environ.get("PATH", "")))
    for var in ("MLDIAG_FAKE_NVIDIA_SMI", "MLDIAG_FAKE_NVIDIA_SMI_PHASE", "MLDIAG_FAKE_NVIDIA_SMI_EXIT",
                "MLDIAG_FAKE_NVIDIA_SMI_HANG", "MLDIAG_FAKE_NVIDIA_SMI_LOG", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


_RUNS = {}


def gpu_status(*argv, capture=H100, phase="idle", exit=None, hang=None, log=None, monkeypatch=None):
    """run() on the fake with this capture; the same run twice is answered from a cache."""
    key = (capture, phase, exit, hang, argv)
    if log is None and key in _RUNS:
        return copy.deepcopy(_RUNS[key])
    env = {"MLDIAG_FAKE_NVIDIA_SMI": capture, "MLDIAG_FAKE_NVIDIA_SMI_PHASE": phase}
    if exit is not None:
        env["MLDIAG_FAKE_NVIDIA_SMI_EXIT"] = str(exit)
    if hang is not None:
        env["MLDIAG_FAKE_NVIDIA_SMI_HANG"] = str(hang)
    if log is not None:
        env["MLDIAG_FAKE_NVIDIA_SMI_LOG"] = str(log)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    # the captured pids are not processes of this machine: never look them up in /proc here
    monkeypatch.setattr(gs, "visible_command", lambda pid, name: None)
    args = gs.build_parser().parse_args(["--nvidia-smi", str(FAKE), "--no-kernel-log"] + list(argv))
    result = gs.run(args)
    json.dumps(result)  # a JSON document, nothing else
    _RUNS[key] = copy.deepcopy(result)
    return result


def codes(result):
    """The result's (level, code) pairs, sorted: what the findings are, whatever their order."""
    return sorted(level_codes(result["findings"]))


def fake(*argv, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([str(FAKE)] + list(argv), capture_output=True, text=True, env=e, timeout=30)


# --------------------------------------------------------------------------- one test per capture

# (capture, phase, name, memory total/used MiB, driver, cuda, temperature C, power W, persistence,
#  active clock-event reasons, MIG current, compute cap, processes (pid, name, MiB), findings)
CASES = [
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt", "idle", "NVIDIA GeForce RTX 2080 SUPER",
     8192, 214, "595.71.05", "13.2", 40, 39.32, False, ["sw_power_cap"], None, "7.5", [],
     [("info", "clocks-sw-power-cap"), ("warn", "persistence-off")]),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt", "load", "NVIDIA GeForce RTX 2080 SUPER",
     8192, 819, "595.71.05", "13.2", 45, 111.50, False, [], None, "7.5",
     [(5268, "ffmpeg", 370), (5267, "ffmpeg", 230)], [("info", "gpu-busy"), ("warn", "persistence-off")]),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt", "idle", "NVIDIA GeForce RTX 2080 SUPER",
     8192, 211, "610.57.04", "13.3", 33, 39.17, False, ["gpu_idle"], None, "7.5", [],
     [("warn", "persistence-off")]),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt", "load", "NVIDIA GeForce RTX 2080 SUPER",
     8192, 815, "610.57.04", "13.3", 38, 98.14, False, [], None, "7.5",
     [(28512, "ffmpeg", 370), (28511, "ffmpeg", 230)], [("info", "gpu-busy"), ("warn", "persistence-off")]),
    ("linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt", "idle", "NVIDIA GeForce RTX 4080 SUPER",
     16376, 596, "595.71.05", "13.2", 43, 26.20, False, ["gpu_idle"], None, "8.9",
     [(2165, "/usr/bin/kwin_wayland", 25)], [("info", "gpu-busy"), ("warn", "persistence-off")]),
    ("linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt", "load", "NVIDIA GeForce RTX 4080 SUPER",
     16376, 1474, "595.71.05", "13.2", 46, 84.24, False, [], None, "8.9",
     [(2165, "/usr/bin/kwin_wayland", 25), (5022, "ffmpeg", 503), (5021, "ffmpeg", 360)],
     [("info", "gpu-busy"), ("warn", "persistence-off")]),
    (H100, "idle", "NVIDIA H100 80GB HBM3", 81559, 0, "590.48.01", "13.1", 41, 69.85, True, ["gpu_idle"],
     False, "9.0", [], []),
    (H100, "load", "NVIDIA H100 80GB HBM3", 81559, 19818, "590.48.01", "13.1", 59, 631.95, True, [], False,
     "9.0", [(11327, "/root/tools/memhog", 2566), (11328, "/root/tools/memhog", 1542),
             (11345, "./gpu_burn", 15690)], [("info", "gpu-busy")]),
    ("linux-x86_64__nvidia-h100-mig__590.48.01.txt", "idle", "NVIDIA H100 80GB HBM3", 81559, 59, "590.48.01",
     "13.1", 42, 71.15, True, ["gpu_idle"], True, "9.0", [], []),
    ("linux-x86_64__nvidia-h100-mig__590.48.01.txt", "load", "NVIDIA H100 80GB HBM3", 81559, 11125,
     "590.48.01", "13.1", 53, 433.78, True, [], True, "9.0",
     [(21180, "/root/tools/memhog", 2296), (21181, "/root/tools/memhog", 1272), (21198, "./gpu_burn", 7484)],
     [("info", "gpu-busy")]),
    ("linux-x86_64__nvidia-h200-mig__590.48.01.txt", "idle", "NVIDIA H200", 143771, 55, "590.48.01", "13.1",
     28, 78.28, True, ["gpu_idle"], True, "9.0", [], []),
    ("linux-x86_64__nvidia-h200-mig__590.48.01.txt", "load", "NVIDIA H200", 143771, 16959, "590.48.01",
     "13.1", 36, 295.01, True, [], True, "9.0",
     [(12249, "/root/tools/memhog", 2194), (12250, "/root/tools/memhog", 1170), (12267, "./gpu_burn", 13526)],
     [("info", "gpu-busy")]),
    (H200, "idle", "NVIDIA H200", 143771, 0, "590.48.01", "13.1", 28, 77.71, True, ["gpu_idle"], False, "9.0",
     [], []),
    (H200, "load", "NVIDIA H200", 143771, 32362, "590.48.01", "13.1", 52, 627.40, True, [], False, "9.0",
     [(10291, "/root/tools/memhog", 2566), (10293, "/root/tools/memhog", 1542), (10309, "./gpu_burn", 28234)],
     [("info", "gpu-busy")]),
    ("linux-x86_64__nvidia-l40s__595.80.txt", "idle", "NVIDIA L40S", 46068, 0, "595.80", "13.2", 63, 144.97,
     False, [], None, "8.9", [], [("warn", "persistence-off")]),
    ("linux-x86_64__nvidia-l40s__595.80.txt", "load", "NVIDIA L40S", 46068, 1235, "595.80", "13.2", 54, 110.23,
     False, [], None, "8.9", [(20037, "ffmpeg", 538), (20038, "ffmpeg", 681)],
     [("info", "gpu-busy"), ("warn", "persistence-off")]),
]


@pytest.mark.parametrize(
    "capture,phase,name,total,used,driver,cuda,temp,power,persistence,reasons,mig,cc,procs,expected",
    CASES, ids=["%s-%s" % (c[0].split("__")[1], c[1]) for c in CASES])
def test_capture(smi_env, monkeypatch, capture, phase, name, total, used, driver, cuda, temp, power,
                 persistence, reasons, mig, cc, procs, expected):
    r = gpu_status("--expect-gpus", "1", capture=capture, phase=phase, monkeypatch=monkeypatch)
    d = r["data"]
    assert d["source"] == "nvidia-smi"
    assert d["gpu_count"] == 1 and len(d["gpus"]) == 1
    assert (d["driver_version"], d["cuda_version"]) == (driver, cuda)
    g = d["gpus"][0]
    assert g["index"] == 0
    assert g["name"] == name
    assert g["uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert (g["memory_total_mib"], g["memory_used_mib"]) == (total, used)
    assert g["temperature_c"] == temp
    assert g["power_draw_w"] == pytest.approx(power)
    assert g["persistence_mode"] is persistence
    assert g["clocks_event_reasons"]["names"] == reasons
    assert g["mig_mode"]["current"] is mig
    assert g["compute_cap"] == cc
    assert [(p["pid"], p["name"], p["used_memory_mib"]) for p in d["processes"]] == procs
    assert all(p["gpu"] == 0 for p in d["processes"])
    assert codes(r) == sorted(expected)
    worst = max([gs._remote.level_rank(lvl) for lvl, _ in expected] + [0])
    assert r["status"] == ["ok", "warn", "fail"][worst]
    assert r["summary"].startswith("1\u00d7 %s, driver %s: " % (name, driver))
    assert "error" not in g and "unreadable" not in g


def test_capture_details_h100_idle(smi_env, monkeypatch):
    """Fields beyond the table above, read by hand from the H100 idle row."""
    r = gpu_status("--expect-gpus", "1", capture=H100, monkeypatch=monkeypatch)
    g = r["data"]["gpus"][0]
    assert g["pci_bus_id"] == "00000000:00:09.0"
    assert g["power_limit_w"] == 700.0
    assert g["pstate"] == "P0"
    assert g["ecc_mode"] is True
    assert g["ecc_errors"] == {"uncorrected_volatile": 0, "uncorrected_aggregate": 0,
                               "corrected_volatile": 0, "corrected_aggregate": 0}
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
    assert g["retired_pages"] == {"sbe": None, "dbe": None, "pending": None}  # [N/A] on Hopper
    assert g["clocks_event_reasons"]["active"] == "0x0000000000000001"
    assert g["mig_mode"] == {"current": False, "pending": False}
    assert (g["utilization_gpu_pct"], g["utilization_memory_pct"]) == (0, 0)
    assert r["summary"] == "1\u00d7 NVIDIA H100 80GB HBM3, driver 590.48.01: all healthy"
    assert r["status"] == "ok"


def test_mig_capture_lists_instances_and_na_utilisation(smi_env, monkeypatch):
    r = gpu_status("--expect-gpus", "1", capture="linux-x86_64__nvidia-h100-mig__590.48.01.txt",
                   monkeypatch=monkeypatch)
    g = r["data"]["gpus"][0]
    assert g["utilization_gpu_pct"] is None  # [N/A] under MIG
    assert g["remapped_rows"]["pending"] is None
    assert [(m["profile"], m["device"]) for m in g["mig_devices"]] == [
        ("3g.40gb", 0), ("2g.20gb", 1), ("1g.10gb", 2), ("1g.10gb", 3)]
    assert g["mig_devices"][1]["uuid"] == "MIG-00000001-0000-0000-0000-000000000001"


def test_sw_power_cap_is_information_not_a_problem(smi_env, monkeypatch):
    r = gpu_status("--expect-gpus", "1", capture="linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt",
                   monkeypatch=monkeypatch)
    cap = [f for f in r["findings"] if f["code"] == "clocks-sw-power-cap"][0]
    assert cap["level"] == "info"
    assert "39 W of 250 W" in cap["message"]
    assert r["status"] == "warn"  # from persistence mode, not from the power cap


# --------------------------------------------------------------------------- "not available"


@pytest.mark.parametrize("cell", ["[N/A]", "N/A", "[Not Supported]", "[Requested functionality has been deprecated]",
                                  "[Function Not Found]", "", "  ", " [N/A] ", "Not Supported"])
@pytest.mark.parametrize("kind", ["str", "int", "float", "bool", "hex"])
def test_not_available_forms_parse_as_none(cell, kind):
    assert gs.parse_value(cell, kind) is None


@pytest.mark.parametrize("cell,kind,value", [
    ("81559", "int", 81559), ("81559 MiB", "int", 81559), ("69.85", "float", 69.85), ("69.85 W", "float", 69.85),
    ("Enabled", "bool", True), ("Disabled", "bool", False), ("Yes", "bool", True), ("No", "bool", False),
    ("Active", "bool", True), ("Not Active", "bool", False), ("0x0000000000000048", "hex", 0x48),
    ("9.0", "str", "9.0"), ("[Unknown Error]", "int", None),
])
def test_values_parse(cell, kind, value):
    assert gs.parse_value(cell, kind) == value


def test_unknown_error_cell_is_kept_as_unreadable():
    keys = ["index", "name", "memory_used_mib", "temperature_c"]
    gpus, lost, other = gs.parse_gpu_rows("0, NVIDIA H200, [Unknown Error], abc\n", keys)
    assert gpus[0]["memory_used_mib"] is None and gpus[0]["temperature_c"] is None
    assert gpus[0]["unreadable"] == {"memory_used_mib": "[Unknown Error]", "temperature_c": "abc"}


def test_row_that_does_not_parse_becomes_an_error_row():
    keys = ["index", "name", "memory_used_mib"]
    gpus, lost, other = gs.parse_gpu_rows("0, NVIDIA H200, 5\n1, NVIDIA H200\nx, NVIDIA H200, 5\n", keys)
    assert gpus[0]["index"] == 0 and "error" not in gpus[0]
    assert gpus[1]["error"].startswith("expected 3 columns") and gpus[1]["raw"] == "1, NVIDIA H200"
    assert gpus[2]["error"] and gpus[2]["index"] is None


@pytest.mark.parametrize("line,index,bus", [
    ("Unable to determine the device handle for GPU 0000:05:00.0: GPU is lost.  Reboot the system to "
     "recover this GPU", None, "0000:05:00.0"),
    ("Unable to determine the device handle for GPU1: 0000:0A:00.0: GPU is lost.  Reboot the system to "
     "recover this GPU", 1, "0000:0A:00.0"),
    ("Unable to determine the device handle for gpu 0000:3B:00.0: Unknown Error", None, "0000:3B:00.0"),
])
def test_lost_gpu_lines_between_rows(line, index, bus):
    """Real nvidia-smi prints these among the healthy rows (forms seen in public reports)."""
    keys = ["index", "name"]
    gpus, lost, other = gs.parse_gpu_rows("0, NVIDIA GeForce RTX 3060\n%s\n" % line, keys, 15)
    assert [g["index"] for g in gpus] == [0]
    assert [(l["index"], l["pci_bus_id"]) for l in lost] == [(index, bus)]


def test_clock_reason_bits_are_nvmls():
    assert gs.decode_clock_reasons(0x1FF) == [
        "gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "sync_boost",
        "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "display_clock_setting"]
    assert gs.decode_clock_reasons(0x0) == []
    assert gs.decode_clock_reasons(0x1000) == ["0x1000"]
    assert gs.decode_clock_reasons(None) is None


def test_command_line_of_a_visible_process():
    with open("/proc/self/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    assert gs.visible_command(os.getpid(), argv[0]) == " ".join(argv)[:300]
    assert gs.visible_command(os.getpid(), "not-this-program") is None  # pid reused / other namespace
    assert gs.visible_command(2 ** 22 + 1, "python") is None


# --------------------------------------------------------------------------- derived fault captures


def test_eight_healthy_h200(smi_env, monkeypatch):
    r = gpu_status("--expect-gpus", "8", capture="derived__h200x8__healthy.txt", monkeypatch=monkeypatch)
    assert r["status"] == "ok" and r["findings"] == []
    assert r["summary"] == "8\u00d7 NVIDIA H200, driver 590.48.01: all healthy"
    assert [g["index"] for g in r["data"]["gpus"]] == list(range(8))
    assert len(set(g["uuid"] for g in r["data"]["gpus"])) == 8


def test_uncorrectable_ecc(smi_env, monkeypatch):
    r = gpu_status(capture="derived__h200x8__ecc-uncorrectable.txt", monkeypatch=monkeypatch)
    assert codes(r) == [("fail", "ecc-uncorrectable"), ("warn", "ecc-uncorrectable-history")]
    f = [f for f in r["findings"] if f["code"] == "ecc-uncorrectable"][0]
    assert f["message"].startswith("GPU 5: 2 uncorrectable ECC errors since the driver loaded")
    assert r["status"] == "fail"
    assert r["data"]["gpus"][5]["remapped_rows"]["uncorrectable"] == 1


def test_pending_row_remap(smi_env, monkeypatch):
    r = gpu_status(capture="derived__h100__remap-pending.txt", monkeypatch=monkeypatch)
    assert codes(r) == [("warn", "remap-pending")]
    assert "nvidia-smi -r" in r["findings"][0]["hint"]
    assert r["status"] == "warn"


def test_row_remap_failure(smi_env, monkeypatch):
    r = gpu_status(capture="derived__h100__remap-failure.txt", monkeypatch=monkeypatch)
    assert codes(r) == [("fail", "remap-failure")]
    assert r["status"] == "fail"


def test_hw_thermal_slowdown_under_load(smi_env, monkeypatch):
    r = gpu_status(capture="derived__h200x8__hw-thermal-slowdown.txt", phase="load", monkeypatch=monkeypatch)
    g2 = r["data"]["gpus"][2]
    assert g2["clocks_event_reasons"] == {"active": "0x0000000000000048",
                                          "names": ["hw_slowdown", "hw_thermal_slowdown"]}
    hot = [f for f in r["findings"] if f["level"] != "info"]
    assert [(f["level"], f["code"]) for f in hot] == [("fail", "clocks-hw-thermal")]  # not also hw-slowdown
    assert hot[0]["message"] == ("GPU 2: HW thermal slowdown active at 93 C, SM clock 810 of 1980 MHz; "
                                 "engaged 3.1 s in all")
    assert hot[0]["hint"] == ("the GPU is too hot; the hardware cut its clocks to half or less: check fans, "
                              "airflow and inlet temperature")
    assert hot[0]["gpus"] == [2]
    assert r["data"]["gpus"][2]["clocks_event_counters_us"] == {"hw_thermal_slowdown": 3120000,
                                                               "hw_power_brake_slowdown": 0}
    assert r["summary"] == "8\u00d7 NVIDIA H200, driver 590.48.01: GPU 2: HW thermal slowdown; GPUs 0-7 busy"


def test_hw_thermal_slowdown_said_true_to_a_full_clock(smi_env, monkeypatch):
    """Issue 11 item 15: the reason can be set while the SM clock reads full (the reasons and
    the clocks are two readings): no "half speed or less" beside "1980 of 1980 MHz"."""
    r = gpu_status(capture="derived__h200x8__hw-thermal-full-clocks.txt", phase="load", monkeypatch=monkeypatch)
    (hot,) = [f for f in r["findings"] if f["level"] != "info"]
    assert (hot["level"], hot["code"], hot["gpus"]) == ("fail", "clocks-hw-thermal", [4])
    assert hot["message"] == ("GPU 4: HW thermal slowdown reported at 88 C, yet the SM clock read 1980 of "
                              "1980 MHz; engaged 40 ms in all")
    assert hot["hint"] == ("the GPU is too hot; while engaged the hardware cuts the clocks by half or more, "
                           "and this reading caught them at 100%, so it comes and goes: check fans, airflow "
                           "and inlet temperature, and read again under load")
    assert "half speed" not in hot["hint"] and "half or less" not in hot["hint"]


@pytest.mark.parametrize("g, message, hint_part", [
    # no clock reading (NVML here asks for none; an old driver may not answer)
    ({"index": 1, "clocks_event_reasons": {"names": ["hw_slowdown", "hw_thermal_slowdown"]}},
     "GPU 1: HW thermal slowdown reported (no SM clock reading beside it)",
     "while engaged the hardware cuts the clocks by half or more"),
    # exactly half is "half or less"
    ({"index": 0, "temperature_c": 90, "clocks_sm_mhz": 990, "clocks_max_sm_mhz": 1980,
      "clocks_event_reasons": {"names": ["hw_thermal_slowdown"]}},
     "GPU 0: HW thermal slowdown active at 90 C, SM clock 990 of 1980 MHz",
     "the hardware cut its clocks to half or less"),
    ({"index": 0, "temperature_c": 90, "clocks_sm_mhz": 991, "clocks_max_sm_mhz": 1980,
      "clocks_event_reasons": {"names": ["hw_slowdown"]}},
     "GPU 0: HW slowdown reported at 90 C, yet the SM clock read 991 of 1980 MHz",
     "caught them at 50%, so it comes and goes"),
    ({"index": 3, "temperature_c": 40, "clocks_sm_mhz": 1980, "clocks_max_sm_mhz": 1980,
      "clocks_event_counters_us": {"hw_power_brake_slowdown": 90 * 60 * 10 ** 6},
      "clocks_event_reasons": {"names": ["hw_slowdown", "hw_power_brake_slowdown"]}},
     "GPU 3: HW power brake slowdown reported, yet the SM clock read 1980 of 1980 MHz; engaged 1.5 h in all",
     "the power supply asserted the external power brake; while engaged"),
])
def test_hw_slowdown_messages_say_what_the_clock_read(g, message, hint_part):
    (f,) = gs.clock_findings(g)
    assert f["message"] == message and hint_part in f["hint"]


def test_identical_per_gpu_findings_fold_into_one_naming_its_gpus(smi_env, monkeypatch):
    """Issue 11 item 3: eight GPUs with the same finding are one "GPUs 0-7: ..." finding, and
    --json still says which GPUs (``gpus``)."""
    r = gpu_status(capture="derived__h200x8__pid-namespace.txt", monkeypatch=monkeypatch)
    assert r["findings"] == [{
        "level": "info", "code": "gpu-memory-unattributed", "gpus": [0, 1, 2, 3, 4, 5, 6, 7],
        "message": "GPUs 0-7: 60 GiB in use and no process visible: memory held by processes not "
                   "visible in this PID namespace",
        "hint": "run gpu-status on the host (or a container sharing its PID namespace) to see them",
        "action": "none"}]


def test_folding_keeps_gpus_apart_where_their_findings_differ():
    gpus = [{"index": i, "memory_used_mib": 61440 if i != 4 else 2048, "display_active": False}
            for i in range(8)]
    data = {"gpus": gpus, "processes": []}
    findings = gs.judge(data)
    data["gpu_count"] = len(gs.answering(data))
    folded = gs.fold_gpu_findings(findings)
    assert [(f["message"].split(":")[0], f["gpus"]) for f in folded] == [
        ("GPUs 0-3,5-7", [0, 1, 2, 3, 5, 6, 7]), ("GPU 4", [4])]
    assert all("_fold" not in f for f in folded)
    summary = gs.summarise(data, [dict(f, _short="x") for f in folded])
    assert summary == "8\u00d7 unknown GPU: healthy; GPUs 0-7: memory held by processes not visible here"


def test_folded_remap_hint_names_each_gpu():
    gpus = [{"index": i, "remapped_rows": {"pending": i in (1, 3), "correctable": 1, "uncorrectable": 0}}
            for i in range(4)]
    (f,) = gs.fold_gpu_findings(gs.judge({"gpus": gpus, "processes": None}))
    assert f["message"] == "GPUs 1,3: row remapping pending (1 correctable, 0 uncorrectable rows remapped)"
    assert f["hint"] == ("reset the GPU (`nvidia-smi -r -i N` for N in 1,3, no processes on it) or reboot "
                         "to apply the remap")
    one = gs.judge({"gpus": gpus[:2], "processes": None})
    assert "`nvidia-smi -r -i 1`" in gs.fold_gpu_findings(one)[0]["hint"]


def test_busy_gpu(smi_env, monkeypatch):
    r = gpu_status("--expect-gpus", "8", capture="derived__h200x8__busy-pid-4242.txt", monkeypatch=monkeypatch)
    assert r["findings"] == [{"level": "info", "code": "gpu-busy",
                              "message": "GPU 3 busy: 71 GiB held by pid 4242 (python)", "gpus": [3],
                              "action": "none"}]
    assert r["status"] == "ok"
    assert r["summary"] == "8\u00d7 NVIDIA H200, driver 590.48.01: healthy; GPU 3 busy (71 GiB, pid 4242)"
    assert r["data"]["processes"] == [{"gpu": 3, "pid": 4242, "name": "python", "used_memory_mib": 72704,
                                       "gpu_uuid": "GPU-00000003-0000-0000-0000-000000000003"}]
    strict = gpu_status("--expect-idle", capture="derived__h200x8__busy-pid-4242.txt", monkeypatch=monkeypatch)
    assert codes(strict) == [("warn", "gpu-busy")] and strict["status"] == "warn"


def test_memory_held_in_another_pid_namespace(smi_env, monkeypatch):
    r = gpu_status(capture="derived__h200x8__pid-namespace.txt", monkeypatch=monkeypatch)
    assert codes(r) == [("info", "gpu-memory-unattributed")]
    assert r["findings"][0]["message"] == ("GPUs 0-7: 60 GiB in use and no process visible: memory held by "
                                           "processes not visible in this PID namespace")
    assert r["summary"].endswith("healthy; GPUs 0-7: memory held by processes not visible here")


def test_persistence_off(smi_env, monkeypatch):
    r = gpu_status("--expect-gpus", "1", capture="linux-x86_64__nvidia-l40s__595.80.txt", monkeypatch=monkeypatch)
    f = r["findings"][0]
    assert (f["level"], f["code"], f["message"]) == ("warn", "persistence-off", "GPU 0: persistence mode off")
    assert "nvidia-smi -pm 1" in f["hint"] and "nvidia-persistenced" in f["hint"]


def test_fewer_gpus_than_expected(smi_env, monkeypatch):
    r = gpu_status("--expect-gpus", "8", capture=H200, monkeypatch=monkeypatch)
    assert codes(r) == [("fail", "gpu-count-low")]
    assert r["findings"][0]["message"] == "1 of 8 GPUs visible"
    more = gpu_status("--expect-gpus", "4", capture="derived__h200x8__healthy.txt", monkeypatch=monkeypatch)
    assert codes(more) == [("warn", "gpu-count-high")]


def test_lost_gpu(smi_env, monkeypatch):
    r = gpu_status("--expect-gpus", "8", capture="derived__h200x8__gpu-lost.txt", monkeypatch=monkeypatch)
    assert codes(r) == [("fail", "gpu-count-low"), ("fail", "gpu-lost")]
    assert r["summary"] == "7\u00d7 NVIDIA H200, driver 590.48.01: GPU 6 lost; 7 of 8 GPUs visible"
    assert [g["index"] for g in r["data"]["gpus"]] == [0, 1, 2, 3, 4, 5, 7]
    assert r["data"]["lost_gpus"][0]["index"] == 6
    assert r["data"]["lost_gpus"][0]["pci_bus_id"] == "0000:BA:00.0"
    assert [f["gpus"] for f in r["findings"] if f["code"] == "gpu-lost"] == [[6]]
    # under load the other seven keep their processes, though nvidia-smi exits 15
    busy = gpu_status(capture="derived__h200x8__gpu-lost.txt", phase="load", monkeypatch=monkeypatch)
    assert sorted(set(p["gpu"] for p in busy["data"]["processes"])) == [0, 1, 2, 3, 4, 5, 7]


def test_mig_change_pending(smi_env, monkeypatch):
    r = gpu_status(capture="derived__h100-mig__mig-pending.txt", monkeypatch=monkeypatch)
    assert codes(r) == [("warn", "mig-pending")]


def test_retired_pages_pending(smi_env, monkeypatch):
    r = gpu_status(capture="derived__l40s__retired-pages-pending.txt", monkeypatch=monkeypatch)
    assert ("warn", "retired-pages-pending") in codes(r)
    assert r["data"]["gpus"][0]["retired_pages"] == {"sbe": 1, "dbe": 2, "pending": True}


def calls_of(log):
    """nvidia-smi's argv per call, without the format flag: ['--query-gpu', '--version', ...]."""
    return [json.loads(line) for line in log.read_text().splitlines()]


def known_of(result):
    """What the client remembers of a run (diagnostics/builtin/gpu_status/smi_memory.py keeps the same three)."""
    return json.dumps({"driver": result["data"]["driver_version"], "cuda": result["data"]["cuda_version"],
                       "fields": result["data"]["nvidia_smi"]["fields_asked"]})


def test_a_current_driver_is_asked_twice_when_remembered_three_times_when_new(smi_env, monkeypatch):
    first_log, second_log = smi_env / "first.log", smi_env / "second.log"
    first = gpu_status(capture=H200, log=first_log, monkeypatch=monkeypatch)
    # first sight: the newest field names, the processes and the CUDA version, all at once
    assert sorted(c[0].split("=")[0] for c in calls_of(first_log)) == [
        "--query-compute-apps", "--query-gpu", "--version"]
    assert first["data"]["nvidia_smi"]["calls"] == 3
    # remembered: two calls; the same answer
    second = gpu_status("--known=" + known_of(first), capture=H200, log=second_log, monkeypatch=monkeypatch)
    assert sorted(c[0].split("=")[0] for c in calls_of(second_log)) == ["--query-compute-apps", "--query-gpu"]
    assert second["data"]["nvidia_smi"]["calls"] == 2
    for key in ("driver_version", "cuda_version", "gpus", "processes"):
        assert second["data"][key] == first["data"][key], key
    assert second["findings"] == first["findings"]


def test_a_remembered_driver_that_changed_asks_the_cuda_version_again(smi_env, monkeypatch):
    log = smi_env / "argv.log"
    known = json.dumps({"driver": "535.104.05", "cuda": "12.2", "fields": ["index", "name", "driver_version"]})
    r = gpu_status("--known=" + known, capture=H200, log=log, monkeypatch=monkeypatch)
    assert [c[0].split("=")[0] for c in calls_of(log)][-1] == "--version"
    assert r["data"]["nvidia_smi"]["calls"] == 3
    assert (r["data"]["driver_version"], r["data"]["cuda_version"]) == ("590.48.01", "13.1")
    assert r["data"]["nvidia_smi"]["fields_asked"] == ["index", "name", "driver_version"]


@pytest.mark.parametrize("known", ["not json", "[]", '{"fields": ["index; rm -rf /", "name"]}',
                                   '{"driver": "590.48.01\\nx", "cuda": "13.1", "fields": ["name"]}'])
def test_a_malformed_memory_is_ignored(smi_env, monkeypatch, known):
    r = gpu_status("--known=" + known, capture=H200, monkeypatch=monkeypatch)
    assert r["data"]["nvidia_smi"]["calls"] == 3 and r["data"]["cuda_version"] == "13.1"
    assert r["data"]["nvidia_smi"]["fields_asked"][0] == "index"


def test_old_driver_asks_only_for_fields_its_help_lists(smi_env, monkeypatch):
    """R470 refuses the newest names (memory.reserved): it is asked --help-query-gpu, then only
    for what it lists -- right the first time it is seen; remembered, one query."""
    log = smi_env / "argv.log"
    r = gpu_status(capture="derived__h100__driver-470.txt", log=log, monkeypatch=monkeypatch)
    calls = calls_of(log)
    query = [c for c in calls if c[0].startswith("--query-gpu=")]
    assert len(query) == 2 and ["--help-query-gpu"] in calls
    fields = query[1][0][len("--query-gpu="):].split(",")
    assert "compute_cap" not in fields and "clocks_throttle_reasons.active" in fields
    assert "clocks_event_reasons.active" not in fields
    assert r["data"]["nvidia_smi"]["fields_refused"] == ["memory.reserved"]
    g = r["data"]["gpus"][0]
    assert g["compute_cap"] is None and g["clocks_event_reasons"]["names"] == ["gpu_idle"]
    assert r["data"]["driver_version"] == "470.256.02" and r["data"]["cuda_version"] is None
    assert r["status"] == "ok"
    again_log = smi_env / "again.log"
    again = gpu_status("--known=" + known_of(r), capture="derived__h100__driver-470.txt", log=again_log,
                       monkeypatch=monkeypatch)
    assert [c[0].split("=")[0] for c in calls_of(again_log)].count("--query-gpu") == 1
    assert again["data"]["gpus"] == r["data"]["gpus"]


def test_old_driver_without_help_learns_from_refusals(smi_env, monkeypatch):
    r = gpu_status(capture="derived__h100__driver-470-no-help.txt", monkeypatch=monkeypatch)
    smi = r["data"]["nvidia_smi"]
    assert smi["fields_refused"] == ["memory.reserved", "compute_cap"]
    assert smi["help_query_gpu"].startswith("unavailable: Invalid combination of input arguments")
    g = r["data"]["gpus"][0]
    assert (g["name"], g["memory_total_mib"], g["clocks_event_reasons"]["names"]) == (
        "NVIDIA H100 80GB HBM3", 81559, ["gpu_idle"])
    assert r["status"] == "ok"


# --------------------------------------------------------------------------- nvidia-smi failures


@pytest.mark.parametrize("code,meaning,said", [
    (9, "the NVIDIA driver is not loaded", "NVIDIA-SMI has failed because it couldn't communicate"),
    (12, "the NVML shared library couldn't be found or loaded", "NVIDIA-SMI couldn't find libnvidia-ml.so"),
])
def test_exit_codes(smi_env, monkeypatch, code, meaning, said):
    r = gpu_status("--expect-gpus", "8", exit=code, monkeypatch=monkeypatch)
    assert codes(r) == [("fail", "gpu-count-low"), ("fail", "nvidia-smi-failed")]
    f = [f for f in r["findings"] if f["code"] == "nvidia-smi-failed"][0]
    assert f["message"].startswith("nvidia-smi exited with %d (%s): %s" % (code, meaning, said))
    assert f["hint"]
    assert r["data"]["gpus"] == [] and r["data"]["processes"] is None
    assert r["findings"][1]["message"] == "0 of 8 GPUs visible"


def test_exit_15_gpu_lost(smi_env, monkeypatch):
    r = gpu_status(exit=15, monkeypatch=monkeypatch)
    assert codes(r) == [("fail", "gpu-lost")]
    assert "GPU is lost" in r["findings"][0]["message"] and "Xid 79" in r["findings"][0]["hint"]


def test_exit_14_infrom_keeps_the_data(smi_env, monkeypatch):
    r = gpu_status(exit=14, monkeypatch=monkeypatch)
    assert codes(r) == [("fail", "nvidia-smi-failed")]
    assert "infoROM is corrupted" in r["findings"][0]["message"]
    assert r["data"]["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"


def test_hang_is_a_timeout(smi_env, monkeypatch):
    t0 = time.monotonic()
    r = gpu_status("--timeout", "0.5", hang=60, monkeypatch=monkeypatch)
    assert time.monotonic() - t0 < 4
    assert codes(r) == [("fail", "nvidia-smi-timeout")]
    assert r["findings"][0]["message"].startswith("nvidia-smi hung for 0.5 s")
    assert r["summary"] == "nvidia-smi hung for 0.5 s"


def test_no_nvidia_tools_at_all(smi_env, monkeypatch):
    empty = smi_env / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(gs, "EXTRA_TOOL_DIRS", [])
    monkeypatch.setattr(gs, "load_nvml", lambda mode="auto": (None, "libnvidia-ml.so.1: not found"))
    r = gs.run(gs.build_parser().parse_args(["--no-kernel-log"]))
    assert r["findings"][0]["message"] == "no NVIDIA driver tools found (nvidia-smi, libnvidia-ml.so.1)"
    assert codes(r) == [("warn", "no-nvidia-tools")] and r["status"] == "warn"
    assert r["summary"] == "no NVIDIA driver tools found (nvidia-smi, libnvidia-ml.so.1)"
    # where hosts.yaml says GPUs should be there, it is a failure
    r8 = gs.run(gs.build_parser().parse_args(["--no-kernel-log", "--expect-gpus", "8"]))
    assert codes(r8) == [("fail", "no-nvidia-tools")]


@pytest.mark.parametrize("tool,code,message", [
    ("amd-smi", "amd-unsupported", "AMD GPUs: not supported yet (found amd-smi)"),
    ("rocm-smi", "amd-unsupported", "AMD GPUs: not supported yet (found rocm-smi)"),
    ("hl-smi", "gaudi-unsupported", "Gaudi: not supported yet (found hl-smi)"),
])
def test_other_vendors(smi_env, monkeypatch, tool, code, message):
    bindir = smi_env / "vendor"
    bindir.mkdir()
    (bindir / tool).write_text("#!/bin/sh\nexit 0\n")
    (bindir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setattr(gs, "EXTRA_TOOL_DIRS", [])
    monkeypatch.setattr(gs, "load_nvml", lambda mode="auto": (None, "libnvidia-ml.so.1: not found"))
    r = gs.run(gs.build_parser().parse_args(["--no-kernel-log", "--expect-gpus", "8"]))
    assert [(f["level"], f["code"], f["message"]) for f in r["findings"]] == [("warn", code, message)]
    assert "no GPU" not in r["summary"]


def test_missing_explicit_nvidia_smi(smi_env, monkeypatch):
    monkeypatch.setattr(gs, "load_nvml", lambda mode="auto": (None, "libnvidia-ml.so.1: not found"))
    r = gs.run(gs.build_parser().parse_args(["--no-kernel-log", "--nvidia-smi", str(smi_env / "nope")]))
    assert codes(r) == [("warn", "no-nvidia-tools")]
    assert "nvidia-smi not found at" in r["findings"][0]["message"]


def test_unstartable_nvidia_smi(smi_env, monkeypatch):
    bad = smi_env / "nvidia-smi"
    bad.write_text("not executable")
    r = gs.run(gs.build_parser().parse_args(["--no-kernel-log", "--nvidia-smi", str(bad)]))
    assert codes(r) == [("fail", "nvidia-smi-unusable")]


# --------------------------------------------------------------------------- NVML


def nvml_module():
    """nvml.py, gpu_status.py's companion, as gpu_status loads it (the same module)."""
    return gs._remote.load_companion(str(SCRIPT.parent), "nvml.py", "mldiag_nvml")


def test_nvml_fallback_decision(monkeypatch):
    fake_pynvml = types.ModuleType("pynvml")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    assert gs.load_nvml("auto") == (fake_pynvml, "pynvml")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError

    def no_lib(name):
        raise OSError("%s: cannot open shared object file: No such file or directory" % name)

    api, why = gs.load_nvml("auto", cdll_loader=no_lib)
    assert api is None and "pynvml" in why and "libnvidia-ml.so.1" in why
    api, how = gs.load_nvml("auto", cdll_loader=lambda name: FakeNvmlLib())
    assert isinstance(api, nvml_module().CtypesNvml) and how == "ctypes:libnvidia-ml.so.1"
    assert gs.load_nvml("off")[0] is None


@pytest.fixture
def nvml_only(smi_env, monkeypatch):
    """No nvidia-smi on PATH nor in the extra tool dirs, no pynvml: run() finds NVML through the
    ctypes binding, on the C-level fake returned here (tests may change its GPUs first)."""
    empty = smi_env / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(gs, "EXTRA_TOOL_DIRS", [])
    monkeypatch.setitem(sys.modules, "pynvml", None)
    lib = FakeNvmlLib()
    real_load = gs.load_nvml
    monkeypatch.setattr(gs, "load_nvml", lambda mode="auto": real_load(mode, cdll_loader=lambda name: lib))
    return lib


def test_nvidia_smi_missing_uses_nvml(nvml_only):
    """Through run(): no nvidia-smi anywhere -> the ctypes binding on a C-level fake of NVML."""
    lib = nvml_only
    r = gs.run(gs.build_parser().parse_args(["--no-kernel-log", "--expect-gpus", "2"]))
    d = r["data"]
    assert d["source"] == "nvml" and d["nvml"] == {"binding": "ctypes:libnvidia-ml.so.1"}
    assert (d["driver_version"], d["cuda_version"]) == ("590.48.01", "13.1")
    assert d["gpu_count"] == 2
    g0, g1 = d["gpus"]
    assert (g0["name"], g0["uuid"], g0["pci_bus_id"]) == ("NVIDIA H200", "GPU-aaaa", "00000000:18:00.0")
    assert (g0["memory_total_mib"], g0["memory_used_mib"]) == (143771, 72704)
    assert (g0["utilization_gpu_pct"], g0["utilization_memory_pct"], g0["temperature_c"]) == (97, 40, 61)
    assert (g0["power_draw_w"], g0["power_limit_w"]) == (612.5, 700.0)
    assert g0["persistence_mode"] is True and g0["compute_cap"] == "9.0"
    assert g0["clocks_event_reasons"]["names"] == ["sw_power_cap"]  # through the old "Throttle" symbol
    assert g0["mig_mode"] == {"current": False, "pending": False}
    assert g0["ecc_mode"] is True
    assert g0["ecc_errors"] == {"uncorrected_volatile": 0, "uncorrected_aggregate": 4,
                                "corrected_volatile": 7, "corrected_aggregate": 11}
    assert g0["remapped_rows"] == {"correctable": None, "uncorrectable": None, "pending": None, "failure": None}
    assert g1["persistence_mode"] is False
    assert g1["ecc_errors"] == {"uncorrected_volatile": 3, "uncorrected_aggregate": 9,
                                "corrected_volatile": 1, "corrected_aggregate": 20}
    assert g1["remapped_rows"] == {"correctable": 5, "uncorrectable": 2, "pending": True, "failure": False}
    assert d["processes"] == [
        {"gpu": 0, "pid": 4242, "name": "python", "used_memory_mib": 72704, "gpu_uuid": "GPU-aaaa"},
        {"gpu": 0, "pid": 4243, "name": "python", "used_memory_mib": None, "gpu_uuid": "GPU-aaaa"}]
    assert ("fail", "ecc-uncorrectable") in codes(r) and ("warn", "persistence-off") in codes(r)
    assert ("info", "gpu-busy") in codes(r)
    assert lib.calls["nvmlShutdown"] == 1
    by_code = dict((f["code"], f) for f in r["findings"])
    # volatile (since the driver loaded) fails; aggregate alone (GPU 0) is history, a warning
    assert by_code["ecc-uncorrectable"]["message"].startswith(
        "GPU 1: 3 uncorrectable ECC errors since the driver loaded (9 in its lifetime)")
    assert by_code["ecc-uncorrectable-history"]["message"].startswith(
        "GPU 0: 4 uncorrectable ECC errors in its lifetime")
    assert by_code["remap-pending"]["message"].startswith(
        "GPU 1: row remapping pending (5 correctable, 2 uncorrectable rows remapped)")
    assert "remap-failure" not in by_code


def test_nvml_row_remap_failure_and_aggregate_only(nvml_only):
    """Each out-parameter of the remapped-rows call lands in its own field: a failure without a
    pending remap fails, and no pending finding appears; an aggregate-only count is history."""
    nvml_only.gpus[1]["rows"] = (0, 7, 0, 1)
    nvml_only.gpus[1]["ecc"] = (0, 2, 5, 6)
    r = gs.run(gs.build_parser().parse_args(["--no-kernel-log"]))
    g1 = r["data"]["gpus"][1]
    assert g1["remapped_rows"] == {"correctable": 0, "uncorrectable": 7, "pending": False, "failure": True}
    assert g1["ecc_errors"] == {"uncorrected_volatile": 0, "uncorrected_aggregate": 2,
                                "corrected_volatile": 5, "corrected_aggregate": 6}
    mine = sorted((f["level"], f["code"]) for f in r["findings"] if f["message"].startswith("GPU 1:"))
    assert mine == [("fail", "remap-failure"), ("warn", "ecc-uncorrectable-history"), ("warn", "persistence-off")]


def test_gathering_returns_facts_that_the_judge_reads_alone(smi_env, monkeypatch):
    """Facts first, judged after: the gatherer fills no caller's dict; what it returns is
    judged by the pure judge exactly as run() judges it."""
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", H200)
    monkeypatch.setattr(gs, "visible_command", lambda pid, name: None)
    facts, findings = gs.collect_nvidia_smi(str(FAKE), 20)
    assert findings == [] and facts["source"] == "nvidia-smi" and facts["nvidia_smi"]["path"] == str(FAKE)
    assert (facts["driver_version"], len(facts["gpus"])) == ("590.48.01", 1)
    ran = gs.run(gs.build_parser().parse_args(["--nvidia-smi", str(FAKE), "--no-kernel-log"]))
    data = dict(ran["data"], **facts)
    assert sorted(level_codes(gs.judge(data))) == codes(ran)


def test_nvml_init_failure(smi_env, monkeypatch):
    lib = FakeNvmlLib(init_rc=9)
    facts, findings = gs.collect_nvml(nvml_module().CtypesNvml(lib), "ctypes")
    assert facts == {"source": "nvml", "nvml": {"binding": "ctypes"}}
    assert [(f["level"], f["code"]) for f in findings] == [("fail", "nvml-failed")]
    assert "Driver Not Loaded" in findings[0]["message"]


def test_nvml_through_a_pynvml_like_module(smi_env, monkeypatch):
    class NVMLError(Exception):
        pass

    def not_supported(*a):
        raise NVMLError("Not Supported")

    mem = types.SimpleNamespace(total=81559 * 2 ** 20, used=0, free=81559 * 2 ** 20)
    api = types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"535.104.05", nvmlSystemGetCudaDriverVersion_v2=lambda: 12020,
        nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: object(),
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3", nvmlDeviceGetUUID=lambda h: "GPU-1",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=b"00000000:00:09.0"),
        nvmlDeviceGetMemoryInfo=lambda h: mem, nvmlDeviceGetTemperature=lambda h, s: 41,
        nvmlDeviceGetUtilizationRates=not_supported, nvmlDeviceGetPowerUsage=lambda h: 69850,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [])
    data, findings = gs.collect_nvml(api, "pynvml")
    g = data["gpus"][0]
    assert (data["driver_version"], data["cuda_version"]) == ("535.104.05", "12.2")
    assert (g["name"], g["pci_bus_id"], g["memory_total_mib"], g["power_draw_w"]) == (
        "NVIDIA H100 80GB HBM3", "00000000:00:09.0", 81559, 69.85)
    assert g["utilization_gpu_pct"] is None and g["compute_cap"] is None
    assert findings == []


# A C-level stand-in for libnvidia-ml.so.1: every symbol is a ctypes callback with nvml.h's
# signature, so the binding's argument marshalling, buffers and structs are exercised for real.
class _PciInfo(C.Structure):
    _fields_ = [("busIdLegacy", C.c_char * 16), ("domain", C.c_uint), ("bus", C.c_uint), ("device", C.c_uint),
                ("pciDeviceId", C.c_uint), ("pciSubSystemId", C.c_uint), ("busId", C.c_char * 32)]


class _Memory(C.Structure):
    _fields_ = [("total", C.c_ulonglong), ("free", C.c_ulonglong), ("used", C.c_ulonglong)]


class _Util(C.Structure):
    _fields_ = [("gpu", C.c_uint), ("memory", C.c_uint)]


class _ProcInfo(C.Structure):
    _fields_ = [("pid", C.c_uint), ("usedGpuMemory", C.c_ulonglong), ("gpuInstanceId", C.c_uint),
                ("computeInstanceId", C.c_uint)]


class FakeNvmlLib(object):
    ERRORS = {3: b"Not Supported", 7: b"Insufficient Size", 9: b"Driver Not Loaded"}

    def __init__(self, init_rc=0):
        GIB = 2 ** 30
        self.gpus = [
            dict(name=b"NVIDIA H200", uuid=b"GPU-aaaa", bus=b"00000000:18:00.0", mem=(143771 * 2 ** 20, 71 * GIB),
                 util=(97, 40), temp=61, power=612500, limit=700000, pm=1, reasons=0x4,
                 # uncorrected volatile/aggregate, corrected volatile/aggregate: four different
                 # counts, so a swapped error type or counter type lands in the wrong field
                 ecc=(0, 4, 7, 11), rows=None,  # rows: remapped-rows call not supported
                 procs=[(4242, 71 * GIB, b"python"), (4243, 0xFFFFFFFFFFFFFFFF, b"python")]),
            dict(name=b"NVIDIA H200", uuid=b"GPU-bbbb", bus=b"00000000:2A:00.0", mem=(143771 * 2 ** 20, 0),
                 util=(0, 0), temp=30, power=80000, limit=700000, pm=0, reasons=0x1,
                 ecc=(3, 9, 1, 20),
                 rows=(5, 2, 1, 0),  # correctable, uncorrectable, pending, failure (nvml.h order)
                 procs=[]),
        ]
        self.calls = {}
        self._keep = []
        self._strings = dict((rc, C.create_string_buffer(s)) for rc, s in self.ERRORS.items())
        P = C.POINTER
        f = self._def
        f("nvmlInit_v2", [], lambda: init_rc)
        f("nvmlShutdown", [], lambda: 0)
        self._def("nvmlErrorString", [C.c_int], lambda rc: C.addressof(self._strings.get(rc, self._strings[3])),
                  restype=C.c_void_p)
        f("nvmlSystemGetDriverVersion", [P(C.c_char), C.c_uint], lambda buf, n: self._put(buf, n, b"590.48.01"))
        f("nvmlSystemGetCudaDriverVersion_v2", [P(C.c_int)], lambda p: self._set(p, 13010))
        f("nvmlDeviceGetCount_v2", [P(C.c_uint)], lambda p: self._set(p, len(self.gpus)))
        f("nvmlDeviceGetHandleByIndex_v2", [C.c_uint, P(C.c_void_p)], lambda i, p: self._set(p, 0x1000 + i))
        f("nvmlDeviceGetName", [C.c_void_p, P(C.c_char), C.c_uint], lambda h, b, n: self._put(b, n, self._g(h)["name"]))
        f("nvmlDeviceGetUUID", [C.c_void_p, P(C.c_char), C.c_uint], lambda h, b, n: self._put(b, n, self._g(h)["uuid"]))
        f("nvmlDeviceGetPciInfo_v3", [C.c_void_p, P(_PciInfo)], self._pci)
        f("nvmlDeviceGetMemoryInfo", [C.c_void_p, P(_Memory)], self._mem)
        f("nvmlDeviceGetUtilizationRates", [C.c_void_p, P(_Util)], self._util)
        f("nvmlDeviceGetTemperature", [C.c_void_p, C.c_int, P(C.c_uint)],
          lambda h, sensor, p: self._set(p, self._g(h)["temp"]) if sensor == 0 else 3)
        f("nvmlDeviceGetPowerUsage", [C.c_void_p, P(C.c_uint)], lambda h, p: self._set(p, self._g(h)["power"]))
        f("nvmlDeviceGetEnforcedPowerLimit", [C.c_void_p, P(C.c_uint)], lambda h, p: self._set(p, self._g(h)["limit"]))
        f("nvmlDeviceGetPersistenceMode", [C.c_void_p, P(C.c_uint)], lambda h, p: self._set(p, self._g(h)["pm"]))
        # an older library: only the "Throttle" name of the clock-event-reasons call
        f("nvmlDeviceGetCurrentClocksThrottleReasons", [C.c_void_p, P(C.c_ulonglong)],
          lambda h, p: self._set(p, self._g(h)["reasons"]))
        f("nvmlDeviceGetCudaComputeCapability", [C.c_void_p, P(C.c_int), P(C.c_int)],
          lambda h, a, b: self._set(a, 9) or self._set(b, 0))
        f("nvmlDeviceGetMigMode", [C.c_void_p, P(C.c_uint), P(C.c_uint)], lambda h, a, b: self._set(a, 0) or self._set(b, 0))
        f("nvmlDeviceGetEccMode", [C.c_void_p, P(C.c_uint), P(C.c_uint)], lambda h, a, b: self._set(a, 1) or self._set(b, 1))
        f("nvmlDeviceGetTotalEccErrors", [C.c_void_p, C.c_int, C.c_int, P(C.c_ulonglong)], self._ecc)
        f("nvmlDeviceGetRemappedRows", [C.c_void_p, P(C.c_uint), P(C.c_uint), P(C.c_uint), P(C.c_uint)],
          self._rows)
        f("nvmlDeviceGetComputeRunningProcesses_v3", [C.c_void_p, P(C.c_uint), P(_ProcInfo)], self._procs)
        f("nvmlSystemGetProcessName", [C.c_uint, P(C.c_char), C.c_uint], self._pname)

    def _def(self, name, argtypes, impl, restype=C.c_int):
        def counted(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return impl(*args)
        fn = C.CFUNCTYPE(restype, *argtypes)(counted)
        self._keep.append(fn)
        setattr(self, name, fn)

    def _g(self, handle):
        return self.gpus[handle - 0x1000]

    @staticmethod
    def _set(ptr, value):
        ptr[0] = value
        return 0

    @staticmethod
    def _put(buf, n, data):
        if len(data) + 1 > n:
            return 7
        C.memmove(buf, data + b"\0", len(data) + 1)
        return 0

    def _pci(self, h, p):
        p[0].busId = self._g(h)["bus"]
        p[0].busIdLegacy = self._g(h)["bus"][4:]
        return 0

    def _mem(self, h, p):
        total, used = self._g(h)["mem"]
        p[0].total, p[0].used, p[0].free = total, used, total - used
        return 0

    def _util(self, h, p):
        p[0].gpu, p[0].memory = self._g(h)["util"]
        return 0

    def _ecc(self, h, error_type, counter, p):
        # nvmlMemoryErrorType_t: 0 corrected, 1 uncorrected; nvmlEccCounterType_t: 0 volatile, 1 aggregate
        order = [(1, 0), (1, 1), (0, 0), (0, 1)]
        if (error_type, counter) not in order:
            return 2  # NVML_ERROR_INVALID_ARGUMENT
        return self._set(p, self._g(h)["ecc"][order.index((error_type, counter))])

    def _rows(self, h, corr, unc, pending, failure):
        rows = self._g(h)["rows"]
        if rows is None:
            return 3  # NVML_ERROR_NOT_SUPPORTED
        for ptr, value in zip((corr, unc, pending, failure), rows):
            ptr[0] = value
        return 0

    def _procs(self, h, count, infos):
        procs = self._g(h)["procs"]
        if not infos or count[0] < len(procs):
            count[0] = len(procs)
            return 7 if procs else 0
        for i, (pid, used, _) in enumerate(procs):
            infos[i].pid, infos[i].usedGpuMemory = pid, used
        count[0] = len(procs)
        return 0

    def _pname(self, pid, buf, n):
        for g in self.gpus:
            for p, _, name in g["procs"]:
                if p == pid:
                    return self._put(buf, n, name)
        return 3


# --------------------------------------------------------------------------- kernel log


def test_xids_from_a_kernel_log(smi_env, monkeypatch, tmp_path):
    log = tmp_path / "dmesg.txt"
    log.write_text(
        "[ 100.1] NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics Exception: ESR 0x2cf\n"
        "[ 200.2] something else\n"
        "[ 300.3] NVRM: Xid (PCI:0000:ba:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        "[ 301.0] NVRM: Xid (PCI:0000:ba:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", H100)
    r = gs.run(gs.build_parser().parse_args(["--nvidia-smi", str(FAKE), "--kernel-log-file", str(log)]))
    assert codes(r) == [("fail", "xid-fatal"), ("warn", "xid")]
    fatal = [f for f in r["findings"] if f["code"] == "xid-fatal"][0]
    assert fatal["message"].startswith("Xid 79 (GPU has fallen off the bus) seen 2 times in the kernel log (0000:ba:00)")
    xids = r["data"]["kernel_log"]["xids"]
    assert [(x["xid"], x["count"], x["fatal"], x["action"]) for x in xids] == [(13, 1, False, "app"),
                                                                            (79, 2, True, "reboot")]
    assert [f["action"] for f in r["findings"]] == ["reboot", "app"]
    assert r["status"] == "fail"


def test_xids_name_the_gpus_at_their_pci_addresses(smi_env, monkeypatch, tmp_path):
    """The kernel log's ``0000:ba:00`` is nvidia-smi's ``00000000:BA:00.0``: a lost GPU's too."""
    log = tmp_path / "dmesg.txt"
    log.write_text(
        "[ 300.3] NVRM: Xid (PCI:0000:ba:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        "[ 310.0] NVRM: Xid (PCI:0000:18:00): 13, pid=4242, name=python, Graphics Exception\n"
        "[ 311.0] NVRM: Xid (PCI:0000:ab:00): 13, pid=4242, name=python, Graphics Exception\n"
        "[ 312.0] NVRM: Xid (PCI:0000:77:00): 13, pid=4242, name=python, Graphics Exception\n")
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", "derived__h200x8__gpu-lost.txt")
    r = gs.run(gs.build_parser().parse_args(["--nvidia-smi", str(FAKE), "--kernel-log-file", str(log)]))
    by_code = {f["code"]: f for f in r["findings"]}
    assert by_code["xid-fatal"]["gpus"] == [6] and by_code["gpu-lost"]["gpus"] == [6]
    assert by_code["xid"]["gpus"] == [0, 5]          # 0000:77:00 is no GPU of this machine
    assert (by_code["gpu-lost"]["action"], by_code["xid-fatal"]["action"], by_code["xid"]["action"]) == \
        ("reboot", "reboot", "app")
    assert gs.pci_key("00000000:BA:00.0") == gs.pci_key("0000:ba:00") == (0, 0xBA, 0)
    assert gs.pci_key("junk") is None and gs.pci_key("x:y:z") is None


# Hand-written from xid_catalog.json's rows (tests/unit/test_xid_catalog.py pins them to NVIDIA's
# catalog): (Xid, fatal, action).
XID_GRADES = [(79, True, "reboot"), (48, True, "reset-gpu"), (119, True, "reset-gpu"), (64, True, "reset-gpu"),
              (142, True, "rma"), (13, False, "app"), (43, False, "app"), (94, False, "app"),
              (63, False, "monitor"), (61, False, "monitor")]


@pytest.mark.parametrize("xid,fatal,action", XID_GRADES)
def test_xids_graded_by_the_shared_catalog(xid, fatal, action):
    (x,) = gs.scan_xids("NVRM: Xid (PCI:0000:01:00): %d, pid=1, something\n" % xid)
    assert (x["xid"], x["fatal"], x["action"]) == (xid, fatal, action)


def test_dbe_with_a_row_remap_on_the_same_gpu_drains(smi_env, monkeypatch):
    """The recorded ISO-format log (tests/fixtures/xid): Xid 48 then 63 on 0000:19:00 -> NVIDIA's
    DRAIN_AND_RESET; 94 (contained ECC) is the application's."""
    log = ROOT / "tests" / "fixtures" / "xid" / "gpud-dmesg-time-format-iso.log"
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", H100)
    r = gs.run(gs.build_parser().parse_args(["--nvidia-smi", str(FAKE), "--kernel-log-file", str(log)]))
    xids = [(x["xid"], x["count"], x["fatal"], x["action"]) for x in r["data"]["kernel_log"]["xids"]]
    assert xids == [(48, 1, True, "drain"), (63, 1, False, "monitor"), (94, 9, False, "app")]
    fatal = [f for f in r["findings"] if f["code"] == "xid-fatal"]
    assert [(f["level"], f["action"]) for f in fatal] == [("fail", "drain")]
    assert fatal[0]["message"].startswith("Xid 48 (Double Bit ECC Error) seen 1 time in the kernel log (0000:19:00)")


def test_without_kernel_log_py_beside_it_the_kernel_log_is_not_read(tmp_path):
    """Run by hand from a directory without kernel_log.py (the kernel log's one reader):
    ``kernel_log`` says so, no crash, no Xid finding."""
    alone = tmp_path / "gpu_status.py"
    alone.write_text(SCRIPT.read_text())
    lone = load_module(alone, "mldiag_test_gpu_status_alone")
    log = tmp_path / "k.log"
    log.write_text("[ 3.0] NVRM: Xid (PCI:0000:ba:00): 79, pid=1, GPU has fallen off the bus.\n")
    for kernel_log in (["--kernel-log-file", str(log)], []):
        r = lone.run(lone.build_parser().parse_args(["--nvidia-smi", str(tmp_path / "none"), "--nvml", "off"]
                                                    + kernel_log))
        assert r["data"]["kernel_log"] == {"source": None, "error": lone.NO_READER}
        assert not [f for f in r["findings"] if f["code"].startswith("xid")]


def test_without_the_catalog_the_xids_are_listed_unclassified(tmp_path):
    """xid.py beside it without xid_catalog.json: "Xid N (catalog not shipped)", monitor."""
    for name in ("gpu_status.py", "kernel_log.py", "xid.py"):
        (tmp_path / name).write_text((SCRIPT.parent / name).read_text())
    lone = load_module(tmp_path / "gpu_status.py", "mldiag_test_gpu_status_no_catalog")
    log = tmp_path / "k.log"
    log.write_text("[ 3.0] NVRM: Xid (PCI:0000:ba:00): 79, pid=1, GPU has fallen off the bus.\n")
    try:
        r = lone.run(lone.build_parser().parse_args(["--nvidia-smi", str(tmp_path / "none"), "--nvml", "off",
                                                     "--kernel-log-file", str(log)]))
    finally:
        for companion in ("mldiag_xid", "mldiag_kernel_log"):   # the next script loads the shipped ones
            sys.modules.pop(companion, None)
    assert r["data"]["kernel_log"]["source"] == str(log)
    (f,) = [f for f in r["findings"] if f["code"].startswith("xid")]
    assert (f["code"], f["level"], f["action"]) == ("xid", "warn", "monitor")
    assert f["message"].startswith("Xid 79 (catalog not shipped) seen 1 time in the kernel log (0000:ba:00)")


def test_live_kernel_log_is_bounded():
    t0 = time.monotonic()
    got = gs.read_kernel_log(budget_s=2)
    assert time.monotonic() - t0 < 4
    assert got["source"] in ("/dev/kmsg", "dmesg", "journalctl", None)
    text = got["text"]
    gs.scan_xids(text)  # whatever this machine logged, it parses


# --------------------------------------------------------------------------- the fake itself


def test_fake_answers_like_nvidia_smi(smi_env):
    r = fake("--query-gpu=gpu_name,memory.total,clocks_throttle_reasons.active,power.draw", "--format=csv")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout == ("name, memory.total [MiB], clocks_event_reasons.active, power.draw [W]\n"
                        "NVIDIA H100 80GB HBM3, 81559 MiB, 0x0000000000000001, 69.85 W\n")
    r = fake("--query-gpu=name,memory.total,power.draw", "--format=csv,noheader,nounits")
    assert r.stdout == "NVIDIA H100 80GB HBM3, 81559, 69.85\n"
    r = fake("--query-gpu=name,memory.total", "--format=csv,nounits")
    assert r.stdout.splitlines()[0] == "name, memory.total"
    r = fake("--query-gpu=name,not.a.field", "--format=csv")
    assert (r.returncode, r.stdout) == (2, 'Field "not.a.field" is not a valid field to query.\n\n')
    r = fake("--query-compute-apps=pid,used_memory", "--format=csv,noheader")
    assert (r.returncode, r.stdout) == (0, "")  # no processes: nothing at all
    r = fake("--query-compute-apps=pid,used_memory", "--format=csv")
    assert r.stdout == "pid, used_gpu_memory [MiB]\n"
    r = fake("--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader",
             env={"MLDIAG_FAKE_NVIDIA_SMI_PHASE": "load"})
    assert r.stdout.splitlines()[-1] == "11345, ./gpu_burn, 15690 MiB"
    r = fake("--help-query-gpu")
    assert r.stdout.startswith('List of valid properties to query for the switch "--query-gpu":\n\n"timestamp"\n')
    r = fake("--version")
    assert r.stdout.splitlines()[-1] == "CUDA Version        : 13.1"
    r = fake("-x")
    assert r.returncode == 2 and "Invalid combination of input arguments" in r.stdout
    r = fake("-i", "3", "--query-gpu=index", "--format=csv,noheader")
    assert (r.returncode, r.stdout) == (6, "No devices were found\n")


def test_fake_without_env_uses_the_h100_capture(smi_env):
    r = fake("-L")
    assert r.stdout == "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)\n"


def test_fake_faults(smi_env):
    r = fake("--query-gpu=name", "--format=csv", env={"MLDIAG_FAKE_NVIDIA_SMI_EXIT": "9"})
    assert r.returncode == 9
    assert r.stdout == ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                        "Make sure that the latest NVIDIA driver is installed and running.\n")
    r = fake("--help-query-gpu", env={"MLDIAG_FAKE_NVIDIA_SMI_EXIT": "9"})  # help needs no driver
    assert r.returncode == 0
    r = fake("-L", env={"MLDIAG_FAKE_NVIDIA_SMI": "derived__h200x8__gpu-lost"})
    assert r.returncode == 15
    assert r.stdout.splitlines()[6] == ("Unable to determine the device handle for GPU6: 0000:BA:00.0: "
                                        "GPU is lost.  Reboot the system to recover this GPU")


def test_every_capture_parses():
    """The fake reads every capture (in-process: it is a module too): all rows have all columns."""
    fake_mod = fake_nvidia_smi_module()
    for path in sorted(CAPTURES.glob("*.txt")):
        cap = fake_mod.Capture(str(path))
        for phase in ("idle", "load"):
            gpus, apps = cap.gpus[phase], cap.apps[phase]
            assert gpus.rows, path.name
            assert all(len(r) == len(gpus.header) for r in gpus.rows), path.name
            assert all(len(r) == len(apps.header) for r in apps.rows), path.name
            assert set(gpus.names()) <= set(cap.help_gpu.aliases()), path.name


# --------------------------------------------------------------------------- the script as a program


def test_main_prints_json_and_exits_by_status(smi_env):
    env = dict(os.environ, MLDIAG_FAKE_NVIDIA_SMI="derived__h200x8__ecc-uncorrectable.txt")
    p = subprocess.run([sys.executable, str(SCRIPT), "--nvidia-smi", str(FAKE), "--no-kernel-log"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2, p.stderr
    doc = json.loads(p.stdout)
    assert doc["status"] == "fail" and doc["data"]["gpu_count"] == 8
    assert not any(k.startswith("_") for f in doc["findings"] for k in f)


def test_help_works_standalone():
    # -E -s: no environment, no user site; the script's directory stays first on sys.path, as for
    # `python3 gpu_status.py` on a target with _remote.py beside it
    p = subprocess.run([sys.executable, "-E", "-s", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30,
                       cwd="/")
    assert p.returncode == 0
    for opt in ("--expect-gpus", "--nvidia-smi", "--timeout", "--nvml", "--expect-idle", "--no-kernel-log"):
        assert opt in p.stdout


def test_the_live_kernel_log_is_read_while_nvidia_smi_answers(smi_env, monkeypatch):
    """No timing: nvidia-smi is asked only once the kernel-log reader has started, which
    happens in time only if the two run at once (read after nvidia-smi, it would never start)."""
    import threading
    reading = threading.Event()
    real_collect = gs.collect_nvidia_smi

    def collect(*a, **kw):
        assert reading.wait(timeout=10), "the kernel log was not being read while nvidia-smi was asked"
        return real_collect(*a, **kw)

    def read_log():
        reading.set()
        return {"source": "dmesg", "error": None, "hung": [],
                "text": "[ 5.0] NVRM: Xid (PCI:0000:19:00): 79, pid=1, GPU has fallen off the bus.\n"}

    monkeypatch.setattr(gs, "collect_nvidia_smi", collect)
    monkeypatch.setattr(gs, "read_kernel_log", read_log)
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", H200)
    monkeypatch.setattr(gs, "visible_command", lambda pid, name: None)
    r = gs.run(gs.build_parser().parse_args(["--nvidia-smi", str(FAKE)]))
    assert r["data"]["kernel_log"]["source"] == "dmesg" and r["data"]["gpu_count"] >= 1
    assert ("fail", "xid-fatal") in codes(r)


def test_a_kernel_log_reader_that_crashes_is_a_crash_of_the_diagnostic(smi_env, monkeypatch):
    def read_log():
        raise RuntimeError("broken reader")
    monkeypatch.setattr(gs, "read_kernel_log", read_log)
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", H200)
    with pytest.raises(RuntimeError, match="broken reader"):
        gs.run(gs.build_parser().parse_args(["--nvidia-smi", str(FAKE)]))


@pytest.mark.parametrize("path", [SCRIPT, SCRIPT.parent / "nvml.py", FAKE],
                         ids=["gpu_status.py", "nvml.py", "fake-nvidia-smi"])
def test_python38_syntax_and_stdlib_only(path):
    src = path.read_text(encoding="utf-8")
    imported = script_imports(path)
    allowed = {"__future__", "_remote", "argparse", "errno", "json", "os", "re", "select", "shutil", "signal", "subprocess", "sys",
               "time", "ctypes", "pynvml", "importlib", "threading"}
    assert imported <= allowed, imported - allowed
    assert "diagnostics" not in imported
    for newer in ("removeprefix", "removesuffix", "functools.cache", "zoneinfo", "graphlib"):
        assert newer not in src


def test_runs_on_python38(smi_env, tmp_path):
    """The script and the fake on a real 3.8 (pyenv's build on this machine kind)."""
    from tests.pythons import require_python
    py38 = require_python("3.8")
    env = dict(os.environ, MLDIAG_FAKE_NVIDIA_SMI="derived__h200x8__busy-pid-4242.txt")
    (tmp_path / "bin" / "python3").write_text('#!/bin/sh\nexec "%s" "$@"\n' % py38)  # the fake on 3.8 too
    env["PATH"] = "%s%s%s" % (tmp_path / "bin", os.pathsep, env["PATH"])
    p = subprocess.run([py38, str(SCRIPT), "--nvidia-smi", str(FAKE), "--no-kernel-log"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["summary"] == "8\u00d7 NVIDIA H200, driver 590.48.01: healthy; GPU 3 busy (71 GiB, pid 4242)"


def test_one_gpu_is_said_in_the_singular():
    """Issue 11 item 15: "0 of 1 GPU visible", not "1 GPUs"."""
    gs = load_script("gpu_status.py", "gpu_status_plural")
    assert [gs.count_gpus(n) for n in (0, 1, 2, 8)] == ["0 GPUs", "1 GPU", "2 GPUs", "8 GPUs"]
    from diagnostics.views import render
    assert render.count(1, "GPU") == "1 GPU" and render.count(80, "GPU") == "80 GPUs"


def test_every_finding_code_has_the_action_its_docstring_table_says():
    """The module docstring's table (code, level, action) is CODE_ACTION; every action is on
    node-check's scale."""
    rows = {}
    for line in gs.__doc__.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in ("fail", "warn", "info") and re.match(r"^[a-z-]+$", parts[0]):
            rows[parts[0]] = parts[2]
    assert set(rows) == set(gs.CODE_ACTION)
    for code, action in rows.items():
        if action not in ("by", "catalog"):
            assert gs.CODE_ACTION[code] == action, code
    scale = ["none", "monitor", "app", "reset-gpu", "reboot", "drain", "rma"]
    assert set(gs.CODE_ACTION.values()) | set(gs.NVIDIA_SMI_ACTION.values()) <= set(scale)


@pytest.mark.parametrize("code,action", [(15, "reboot"), (14, "rma"), (8, "drain"), (9, "reboot"),
                                         (4, "none"), (12, "none"), (255, "monitor"), (2, "monitor")])
def test_nvidia_smi_exit_codes_have_their_action(code, action):
    run = types.SimpleNamespace(start_error=None, timed_out=False, returncode=code, output="", argv=["nvidia-smi"])
    f = gs.smi_failure(run, "--query-gpu", 10)
    assert (f["code"], f["action"]) == ("nvidia-smi-failed", action)


def reader():
    """The kernel_log.py gpu-status reads the kernel log through (its state is patched there)."""
    return gs._remote.load_companion(gs.HERE, "kernel_log.py", "mldiag_kernel_log")


@pytest.mark.parametrize("kmsg_errno,setuid,called", [
    (1, False, ["journalctl"]),            # EPERM: dmesg_restrict; dmesg would be refused alike
    (13, False, ["journalctl"]),           # EACCES
    (2, False, ["dmesg", "journalctl"]),   # no /dev/kmsg (a container): dmesg may still read it
    (1, True, ["dmesg", "journalctl"]),    # a setuid dmesg may read what we may not
])
def test_dmesg_is_not_run_where_dmesg_restrict_refused_the_kernel_log(
        tmp_path, monkeypatch, kmsg_errno, setuid, called):
    """The fake tools (tests/fakes/dmesg, one script for both names) log each call; their saved
    log is empty, so the reader goes on to the next source and every call made is seen."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = ROOT / "tests" / "fakes" / "dmesg"
    for name in ("dmesg", "journalctl"):
        (bindir / name).write_bytes(fake.read_bytes())
        (bindir / name).chmod(0o4755 if setuid and name == "dmesg" else 0o755)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("MLDIAG_FAKE_KLOG_LOG", str(calls))
    monkeypatch.setenv("MLDIAG_FAKE_KLOG", str(tmp_path / "empty.log"))
    (tmp_path / "empty.log").write_text("")

    def kmsg(deadline, max_bytes):
        raise OSError(kmsg_errno, os.strerror(kmsg_errno))
    monkeypatch.setattr(reader(), "read_kmsg", kmsg)
    monkeypatch.setattr(reader(), "system_journal_readable", lambda: True)
    got = gs.read_kernel_log(budget_s=20)
    source, why = got["source"], got["error"]
    made = [json.loads(line)[0] for line in calls.read_text().splitlines()]
    assert made == called and source is None
    assert why.startswith(f"/dev/kmsg: {os.strerror(kmsg_errno)}; dmesg: ")
    assert ("dmesg: not run (dmesg_restrict" in why) == ("dmesg" not in called)


def test_journalctl_is_not_run_without_a_system_journal_this_user_may_read(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("dmesg", "journalctl"):
        (bindir / name).write_bytes((ROOT / "tests" / "fakes" / "dmesg").read_bytes())
        (bindir / name).chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("MLDIAG_FAKE_KLOG_LOG", str(calls))
    monkeypatch.setenv("MLDIAG_FAKE_KLOG", str(tmp_path / "empty.log"))
    (tmp_path / "empty.log").write_text("")
    monkeypatch.setattr(reader(), "read_kmsg", lambda deadline, max_bytes: (_ for _ in ()).throw(OSError(1, "no")))
    monkeypatch.setattr(reader(), "JOURNAL_DIRS", (str(tmp_path / "none"),))
    got = gs.read_kernel_log(budget_s=20)
    source, why = got["source"], got["error"]
    assert source is None and not calls.exists()
    assert why.endswith(f"journalctl: not run (no system journal readable by this user in "
                        f"{tmp_path / 'none'})")


# --------------------------------------------------------------------------- the tool runner
# posix_spawnp where the C library starts a session that way, subprocess elsewhere: both paths
# must give the same ToolRun.

@pytest.fixture(params=["posix_spawnp", "subprocess"])
def runner(request, monkeypatch):
    if request.param == "subprocess":
        monkeypatch.setattr(gs, "_SPAWN_FALLBACK", [True])
    else:
        monkeypatch.setattr(gs, "_SPAWN_FALLBACK", [])
    return request.param


def test_a_tool_runs_in_a_session_of_its_own_with_stdin_from_dev_null(runner):
    # SIGPIPE and SIGXFSZ, which Python ignores, are not ignored in the tool (as subprocess
    # restores them): SigIgn's bits 12 and 24
    code = ("import os, sys; print(os.getsid(0) == os.getpid(), os.getsid(0) != %d); "
            "print(sys.stdin.read() == ''); sys.stderr.write('err line'); sys.exit(3)" % os.getsid(0))
    run = gs.run_tools([[sys.executable, "-S", "-c", code],
                        ["/bin/sh", "-c", "grep SigIgn /proc/$$/status"]], 10)
    assert (run[0].returncode, run[0].timed_out, run[0].start_error) == (3, False, None)
    assert run[0].stdout.split() == ["True", "True", "True"] and run[0].stderr == "err line"
    assert run[0].output == "True True\nTrue\n\nerr line"
    ignored = int(run[1].stdout.split()[1], 16)
    assert run[1].ok and not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))
    assert run[0]._pid is None and run[0]._proc is None


def test_a_missing_tool_is_a_start_error_not_a_crash(runner, tmp_path):
    run = gs.run_tools([[str(tmp_path / "nvidia-smi")]], 5)[0]
    assert run.start_error.startswith("FileNotFoundError") and not run.ok and run.returncode is None
    not_exec = tmp_path / "tool"
    not_exec.write_text("#!/bin/sh\necho hi\n")
    run = gs.run_tools([[str(not_exec)]], 5)[0]
    assert run.start_error.startswith("PermissionError")


def test_a_killed_tool_has_minus_the_signal_as_returncode(runner):
    run = gs.run_tools([[sys.executable, "-S", "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]], 10)[0]
    assert run.returncode == -signal.SIGTERM and not run.timed_out


def test_a_tool_that_outlives_its_deadline_is_killed_with_its_group(runner, tmp_path):
    # the grandchild keeps running in the tool's session after the tool closed its pipes:
    # neither the open pipes of one nor the exit of the other may hold the run past its deadline
    marker = tmp_path / "grandchild.pid"
    code = ("import os, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-S', '-c', "
            "'import time; time.sleep(60)']); open(%r, 'w').write(str(p.pid)); "
            "print('started', flush=True); os.close(1); os.close(2); time.sleep(60)" % str(marker))
    t0 = time.monotonic()
    run = gs.run_tools([[sys.executable, "-S", "-c", code]], 1.0)[0]
    assert time.monotonic() - t0 < 5
    assert run.timed_out and run.returncode == -signal.SIGKILL and run.stdout == "started\n"
    grandchild = int(marker.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        with open("/proc/%d/stat" % grandchild) as f:
            if f.read().rpartition(")")[2].split()[0] == "Z":   # killed, awaiting its parent
                break
        time.sleep(0.05)
    else:
        pytest.fail("the tool's grandchild outlived the run")


def test_tools_run_side_by_side_and_keep_their_order(runner):
    slow = [sys.executable, "-S", "-c", "import time; time.sleep(0.6); print('slow')"]
    fast = [sys.executable, "-S", "-c", "print('fast')"]
    t0 = time.monotonic()
    runs = gs.run_tools([slow, slow, fast], 10)
    assert time.monotonic() - t0 < 1.5
    assert [r.stdout for r in runs] == ["slow\n", "slow\n", "fast\n"] and all(r.ok for r in runs)


def test_a_c_library_without_posix_spawn_setsid_falls_back_to_subprocess(monkeypatch):
    def no_setsid(*a, **kw):
        raise NotImplementedError("setsid")
    monkeypatch.setattr(gs, "_SPAWN_FALLBACK", [])
    monkeypatch.setattr(gs.os, "posix_spawnp", no_setsid)
    run = gs.run_tools([[sys.executable, "-S", "-c", "print('via subprocess')"]], 10)[0]
    assert run.stdout == "via subprocess\n" and run.ok and gs._SPAWN_FALLBACK == [True]


def test_which_finds_what_shutil_which_finds(tmp_path, monkeypatch):
    import shutil
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for d, mode in (("a", 0o644), ("b", 0o755)):
        tool = tmp_path / d / "nvidia-smi"
        tool.write_text("#!/bin/sh\n")
        tool.chmod(mode)
    (tmp_path / "a" / "dcgmi").mkdir()   # a directory is never the tool
    path = os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")])
    for name in ("nvidia-smi", "dcgmi", "missing", str(tmp_path / "b" / "nvidia-smi"), str(tmp_path / "a" / "nvidia-smi")):
        assert gs.which(name, path=path) == shutil.which(name, path=path), name
    monkeypatch.setenv("PATH", path)
    assert gs.which("nvidia-smi") == str(tmp_path / "b" / "nvidia-smi")


def test_a_log_without_nvrm_lines_loads_no_xid_catalog(smi_env, monkeypatch, tmp_path):
    """Every Xid line, and "fallen off the bus", is an NVRM line: a healthy node's kernel log
    is read (by kernel_log.py) without loading xid.py or its catalog; one NVRM line loads them."""
    fresh = load_module(SCRIPT, "mldiag_test_gpu_status_no_nvrm")
    asked = []
    real_load_xid = fresh._remote.load_xid

    def load_xid(directory, with_catalog=True):
        asked.append(with_catalog)
        return real_load_xid(directory, with_catalog)
    monkeypatch.setattr(fresh._remote, "load_xid", load_xid)
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", H100)
    quiet = tmp_path / "quiet.log"
    quiet.write_text("[ 1.0] usb 1-1: new high-speed USB device\n[ 2.0] EXT4-fs (sda1): mounted\n")
    args = ["--nvidia-smi", str(FAKE), "--kernel-log-file"]
    r = fresh.run(fresh.build_parser().parse_args(args + [str(quiet)]))
    assert r["data"]["kernel_log"] == {"source": str(quiet), "xids": []}
    assert not [f for f in r["findings"] if f["code"].startswith("xid")]
    assert asked == []
    loud = tmp_path / "loud.log"
    loud.write_text("[ 3.0] NVRM: GPU at PCI:0000:ba:00: GPU has fallen off the bus.\n")
    r = fresh.run(fresh.build_parser().parse_args(args + [str(loud)]))
    assert [(x["xid"], x["fatal"]) for x in r["data"]["kernel_log"]["xids"]] == [(79, True)]
    assert True in asked


# --------------------------------------------------------------------------- the judge alone

RECORDED = ROOT / "tests" / "integration" / "data" / "json_recorded.json"


def test_the_judge_gives_the_recorded_findings_from_the_recorded_facts():
    """gpu-status's --json of three lab targets (tests/integration/test_json_unchanged.py: the fake
    nvidia-smi answering real H200 and RTX 2080 captures, one with a lost GPU): judging their
    recorded ``data`` alone, with no binary run, gives each of their findings about the GPUs that
    answered; what it does not give is what gathering found (the lost GPU's own finding)."""
    import json as jsonlib
    docs = jsonlib.loads(RECORDED.read_text())["gpu-status"]["stdout"]
    assert {d["target"] for d in docs} == {"trainbox", "sickbox", "consumer"}
    for doc in docs:
        data = doc["data"]
        judged = gs.fold_gpu_findings(gs.judge(data, data["expected_gpus"]))
        recorded = {f["code"]: f for f in doc["findings"]}
        for f in judged:
            f.pop("_short", None)
            assert dict(recorded[f["code"]], action=None) == dict(f, action=None), doc["target"]
        assert set(recorded) - {f["code"] for f in judged} <= {"gpu-lost"}, doc["target"]
    sick = next(d for d in docs if d["target"] == "sickbox")
    assert [f["code"] for f in gs.judge(sick["data"], 8)] == ["gpu-count-low"]
    assert gs.judge(sick["data"], 7) == []            # the expectation is the judge's input
