"""node-check's DCGM module: parsers against DCGM's own JSON, check() with a fake run_tool, and
the fake ``dcgmi`` run as a real subprocess.

Expected findings were written by hand from the fixture files in tests/fixtures/dcgm/ (their
README says what each shows), not computed from them.
"""

import collections
import csv
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.programs import load_script

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "dcgm"
FAKE = ROOT / "tests" / "fakes" / "dcgmi"
PER_GPU = FIXTURES / "DCGM-TestDiagManagerStrings.PER_GPU_JSON.json"
HEALTHY = FIXTURES / "derived__dcgm4-h200x8__r1-healthy.json"
FAILING = FIXTURES / "derived__dcgm4-h200x8__r2-failing.json"
PAUSED = FIXTURES / "derived__dcgm4__runtime-error-paused.json"
SCHEMA = FIXTURES / "DCGM-dcgm_diag_schema.json"

dcgm = load_script("dcgm.py", "mldiag_test_dcgm")

Tool = collections.namedtuple("Tool", "status rc out err seconds")


def brief(findings):
    """(code, level, action, gpus) of each finding, in order."""
    return [(f["code"], f["level"], f["action"], f.get("gpus")) for f in findings]


def fake_tool(status="ok", rc=0, out="", err=""):
    calls = []

    def run_tool(argv, timeout):
        calls.append((list(argv), timeout))
        return Tool(status, rc, out, err, 0.1)
    run_tool.calls = calls
    return run_tool


# --- the parsers, on the real per-GPU JSON and the derived current-format files ---------------

def test_per_gpu_json_sm_stress_failures_one_finding_per_gpu():
    parsed = dcgm.parse_diag_json(PER_GPU.read_text())
    assert parsed["format"] == "per-gpu"
    assert parsed["version"] == "1.7"
    assert parsed["runtime_error"] is None
    findings = dcgm.diag_findings(parsed, 3)
    # sm_stress FAIL on GPUs 0, 2, 3, error_id 50 = DCGM_FR_STRESS_LEVEL -> NVSentinel RESTART_VM.
    # Different measured values: three findings, not folded. SKIPs and PASSes make none.
    assert brief(findings) == [
        ("dcgm-sm-stress", "fail", "reboot", [0]),
        ("dcgm-sm-stress", "fail", "reboot", [2]),
        ("dcgm-sm-stress", "fail", "reboot", [3]),
    ]
    assert findings[1]["message"] == (
        "dcgmi diag -r 3: sm_stress failed on GPU 2: Max stress level of 1096.5 did not exceed "
        "desired stress level of 3000.0 for GPU 2 (DCGM_FR_STRESS_LEVEL)")
    assert all(f["check"] == "dcgm" for f in findings)


def test_per_gpu_json_reads_gpu_id_lists_and_warnings():
    parsed = dcgm.parse_diag_json(PER_GPU.read_text())
    denylist = [r for r in parsed["results"] if r["test"] == "Denylist"]
    assert denylist == [{"category": "Deployment", "test": "Denylist", "status": "pass",
                         "entity": "GPU", "gpus": [0, 1, 2, 3], "entities": [0, 1, 2, 3],
                         "warnings": [], "info": []}]
    memory0 = [r for r in parsed["results"] if r["test"] == "memory" and r["gpus"] == [0]][0]
    assert memory0["status"] == "skip"
    assert memory0["warnings"][0]["error_id"] == 55
    assert memory0["warnings"][0]["code"] == "DCGM_FR_ECC_DISABLED"
    assert len(parsed["results"]) == 10 + 4 + 4 + 4 + 4 + 4 + 4 + 4


def test_current_json_healthy_has_no_findings_and_the_version_fact():
    parsed = dcgm.parse_diag_json(HEALTHY.read_text())
    assert parsed["format"] == "current"
    assert parsed["version"] == "4.2.3"
    assert [r["gpus"] for r in parsed["results"]] == [[i] for i in range(8)]
    assert {r["status"] for r in parsed["results"]} == {"pass"}
    assert dcgm.diag_findings(parsed, 1) == []


def test_current_json_failing_folds_identical_messages_across_gpus():
    findings = dcgm.diag_findings(dcgm.parse_diag_json(FAILING.read_text()), 2)
    assert brief(findings) == [
        # persistence mode off on all 8: one finding; NVSentinel CONTACT_SUPPORT, ours drain
        ("dcgm-software", "fail", "drain", [0, 1, 2, 3, 4, 5, 6, 7]),
        # 2 volatile DBEs on GPU 2: COMPONENT_RESET
        ("dcgm-memory", "fail", "reset-gpu", [2]),
        # low PCIe bandwidth on GPU 5: CONTACT_SUPPORT; the test_summary repeat adds nothing
        ("dcgm-pcie", "fail", "rma", [5]),
    ]
    assert findings[0]["message"] == (
        "dcgmi diag -r 2: software failed on GPUs 0-7: Persistence Mode: Persistence mode for "
        "GPU is currently disabled. The DCGM diagnostic requires peristence mode to be enabled. "
        "(DCGM_FR_PERSISTENCE_MODE)")
    assert findings[2]["message"] == (
        "dcgmi diag -r 2: pcie failed on GPU 5: Bandwidth of GPU 5 in direction h2d of 12.13 "
        "did not exceed minimum required bandwidth of 40.00. (DCGM_FR_LOW_BANDWIDTH)")
    for f in findings:
        assert "\n" not in f["message"]


def test_text_before_the_json_is_skipped():
    text = ("Error: unable to establish a connection to the specified host: localhost\n"
            + HEALTHY.read_text())
    assert dcgm.parse_diag_json(text)["version"] == "4.2.3"


@pytest.mark.parametrize("text", ["", "Error: something\n", "[1, 2]", '{"other": {}}', "{not json"])
def test_no_diag_json_is_a_value_error(text):
    with pytest.raises(ValueError):
        dcgm.parse_diag_json(text)


def test_warn_status_global_errors_other_entities_and_string_warnings():
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Stress", "tests": [
        {"name": "targeted_power", "results": [
            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Warn",
             "warnings": [{"warning": "Target power 700 W not reached on GPU 1", "error_id": 63,
                           "error_category": 14, "error_severity": 1}]},
            {"entity_group": "CPU", "entity_group_id": 7, "entity_id": 0, "status": "Fail",
             "warnings": [{"warning": "cpu trouble", "error_id": 999, "error_category": 0,
                           "error_severity": 0}]}],
         "test_summary": {"status": "Fail", "warnings": [
             {"warning": "Test-wide: no reason", "error_id": 44, "error_category": 16,
              "error_severity": 4}]}}]}]}}
    findings = dcgm.diag_findings(dcgm.parse_diag_json(json.dumps(doc)), 4)
    assert brief(findings) == [
        ("dcgm-targeted-power", "warn", "monitor", [1]),       # TARGET_POWER -> NONE -> monitor
        ("dcgm-targeted-power", "fail", "drain", None),        # unknown error_id 999 -> drain
        ("dcgm-targeted-power", "fail", "rma", None),          # INTERNAL -> CONTACT_SUPPORT
    ]
    assert findings[1]["message"] == "dcgmi diag -r 4: targeted_power failed on CPU 0: cpu trouble"
    old = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "diagnostic", "results": [{"gpu_ids": "3", "status": "FAIL",
                                            "warnings": ["GPU 3: text only\nsecond line"]}]}]}],
        "version": "1.6"}}
    assert brief(dcgm.diag_findings(dcgm.parse_diag_json(json.dumps(old)))) == [
        ("dcgm-diagnostic", "fail", "drain", [3])]


def test_fail_without_warnings_is_drain():
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memtest", "results": [{"entity_group": "GPU", "entity_group_id": 1,
                                         "entity_id": 0, "status": "Fail"}],
         "test_summary": {"status": "Fail"}}]}]}}
    [f] = dcgm.diag_findings(dcgm.parse_diag_json(json.dumps(doc)))
    assert (f["action"], f["message"]) == (
        "drain", "dcgmi diag -r 1: memtest failed on GPU 0: no reason given")


# --- the action map ---------------------------------------------------------------------------

def test_embedded_nvsentinel_map_equals_the_csv():
    with open(FIXTURES / "NVSentinel-dcgmerrorsmapping.csv", newline="") as fh:
        rows = {code: action for code, action in csv.reader(fh)}
    assert dcgm.NVSENTINEL_ACTIONS == rows


def test_every_nvsentinel_action_has_ours_and_config_codes_never_rma():
    assert set(dcgm.NVSENTINEL_ACTIONS.values()) <= set(dcgm.FROM_NVSENTINEL)
    assert set(dcgm.FROM_NVSENTINEL.values()) <= set(dcgm.ACTIONS)
    assert dcgm.CONFIG_CODES <= set(dcgm.NVSENTINEL_ACTIONS)
    for code in dcgm.CONFIG_CODES:
        assert dcgm.action_for(code) == "drain"


@pytest.mark.parametrize("error_id, name, action", [
    (4, "DCGM_FR_VOLATILE_DBE_DETECTED", "reset-gpu"),
    (14, "DCGM_FR_NVLINK_DOWN", "reboot"),
    (29, "DCGM_FR_PERSISTENCE_MODE", "drain"),
    (50, "DCGM_FR_STRESS_LEVEL", "reboot"),
    (55, "DCGM_FR_ECC_DISABLED", "drain"),
    (80, "DCGM_FR_ROW_REMAP_FAILURE", "rma"),
    (85, "DCGM_FR_PENDING_ROW_REMAP", "reset-gpu"),
    (101, "DCGM_FR_XID_ERROR", "monitor"),
    (108, "DCGM_FR_CUDA_FM_NOT_INITIALIZED", "drain"),
    (112, "DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR", "rma"),
    (116, "DCGM_FR_BROKEN_P2P_NVLINK_WRITER_DEVICE", "rma"),
    (117, None, "drain"),
    (-1, None, "drain"),
    ("4", None, "drain"),
])
def test_error_ids(error_id, name, action):
    assert dcgm.fr_name(error_id) == name
    assert dcgm.action_for(name) == action


def test_fallen_off_bus_is_reboot():
    assert dcgm.action_for("DCGM_FR_FALLEN_OFF_BUS") == "reboot"   # RESTART_BM


# --- timeouts ---------------------------------------------------------------------------------

def test_timeouts_cover_the_documented_durations():
    assert dcgm.timeout_for(None) == dcgm.timeout_for(1) == 120
    assert dcgm.timeout_for(2) >= 2 * 60 * 3          # "approximately two minutes"
    assert dcgm.timeout_for(3) >= 30 * 60 * 1.5       # 15 min now, 30 in older docs
    assert dcgm.timeout_for(4) >= 2 * 3600            # "1-2 hours" in older docs


# --- check() with a fake run_tool -------------------------------------------------------------

def test_check_runs_dcgmi_diag_level_1_by_default():
    run_tool = fake_tool(out=HEALTHY.read_text())
    result = dcgm.check({}, run_tool, gpus=[], kernel_log={}, sys_root="/sys")
    assert run_tool.calls == [(["dcgmi", "diag", "-r", "1", "-j"], 120.0)]
    assert result == {"findings": [], "facts": {"dcgm.version": "4.2.3"}}


def test_check_level_2_failing():
    run_tool = fake_tool(rc=226, out=FAILING.read_text())
    result = dcgm.check({"gpus": 8}, run_tool, dcgm_level=2)
    assert run_tool.calls == [(["dcgmi", "diag", "-r", "2", "-j"], dcgm.timeout_for(2))]
    assert [f["code"] for f in result["findings"]] == ["dcgm-software", "dcgm-memory", "dcgm-pcie"]
    assert result["facts"] == {"dcgm.version": "4.2.3"}


def inventory(order):
    """node_check's ``gpus`` option: index i has the serial of DCGM GPU order[i] (README)."""
    return [{"index": i, "pci": f"00000000:{0x18 + i:02x}:00.0", "name": "NVIDIA H200",
             "serial": f"165322401{1000 + d}", "uuid": f"GPU-{i}", "vbios": "v", "driver": "570"}
            for i, d in enumerate(order)]


def test_check_maps_dcgm_gpu_ids_to_nvidia_smi_indices_by_serial():
    reverse = inventory([7, 6, 5, 4, 3, 2, 1, 0])       # nvidia-smi index 0 is DCGM GPU 7
    result = dcgm.check({}, fake_tool(rc=226, out=FAILING.read_text()), dcgm_level=2, gpus=reverse)
    assert brief(result["findings"]) == [
        ("dcgm-software", "fail", "drain", [0, 1, 2, 3, 4, 5, 6, 7]),
        ("dcgm-memory", "fail", "reset-gpu", [5]),      # DCGM GPU 2
        ("dcgm-pcie", "fail", "rma", [2]),              # DCGM GPU 5
    ]
    # DCGM's own text still says "GPU 5": the message names both
    assert result["findings"][2]["message"].startswith(
        "dcgmi diag -r 2: pcie failed on GPU 2 (DCGM's GPU 5): Bandwidth of GPU 5 ")
    assert result["findings"][0]["message"].startswith(
        "dcgmi diag -r 2: software failed on GPUs 0-7: Persistence Mode: ")


@pytest.mark.parametrize("gpus", [
    [],                                                  # no inventory (nvidia-smi absent)
    inventory([0, 1, 2, 3, 4, 5, 6]),                    # one GPU missing
    inventory([0, 0, 2, 3, 4, 5, 6, 7]),                 # a serial twice
    [dict(g, serial="[N/A]") for g in inventory(range(8))],
])
def test_check_keeps_dcgm_ids_without_a_clean_serial_match(gpus):
    result = dcgm.check({}, fake_tool(rc=226, out=FAILING.read_text()), dcgm_level=2, gpus=gpus)
    assert [f["gpus"] for f in result["findings"]] == [list(range(8)), [2], [5]]


def test_check_missing_dcgmi_is_info_with_install_hint():
    result = dcgm.check({}, fake_tool(status="missing", rc=None))
    assert brief(result["findings"]) == [("dcgm-absent", "info", "none", None)]
    assert "datacenter-gpu-manager" in result["findings"][0]["hint"]
    assert "nv-hostengine" in result["findings"][0]["hint"]
    assert result["facts"] == {}


def test_check_hung_dcgmi_is_one_tool_hung_fail():
    result = dcgm.check({}, fake_tool(status="timeout", rc=None), dcgm_level=3)
    assert brief(result["findings"]) == [("tool-hung", "fail", "reboot", None)]
    assert result["findings"][0]["message"] == "`dcgmi diag -r 3 -j` did not answer within 3600 s"


def test_check_skipped_dcgmi_is_not_checked():
    result = dcgm.check({}, fake_tool(status="skipped", rc=None))
    assert brief(result["findings"]) == [("not-checked", "info", "none", None)]
    assert result["findings"][0]["message"] == "not checked: dcgmi hung earlier in this run"


def test_check_no_hostengine_is_warn_with_hint():
    out = ("Error: unable to establish a connection to the specified host: localhost\n"
           "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n")
    result = dcgm.check({}, fake_tool(rc=235, out=out))
    assert brief(result["findings"]) == [("dcgm-no-hostengine", "warn", "monitor", None)]
    f = result["findings"][0]
    assert f["message"] == ("`dcgmi diag -r 1 -j`: Error: unable to establish a connection to the "
                            "specified host: localhost (exit 235)")
    assert "nvidia-dcgm" in f["hint"]


def test_check_runtime_error_and_garbage():
    result = dcgm.check({}, fake_tool(rc=202, out=PAUSED.read_text()))
    assert brief(result["findings"]) == [("dcgm-error", "warn", "monitor", None)]
    assert result["findings"][0]["message"] == (
        "`dcgmi diag -r 1 -j`: Error: Diagnostic could not be run while DCGM is paused.")
    assert result["facts"] == {"dcgm.version": "4.2.3"}
    result = dcgm.check({}, fake_tool(rc=1, out="", err="Segmentation fault\n"))
    assert brief(result["findings"]) == [("dcgm-error", "warn", "monitor", None)]
    assert result["findings"][0]["message"] == (
        "`dcgmi diag -r 1 -j` gave no diagnostic JSON (exit 1): Segmentation fault")


# --- the derived files follow DCGM's schema ---------------------------------------------------

def _validate(doc, schema, where="$"):
    """The subset of JSON Schema dcgm_diag_schema.json uses: type, properties, items, required."""
    kinds = {"object": dict, "array": list, "string": str, "integer": int}
    kind = schema.get("type")
    if kind:
        assert isinstance(doc, kinds[kind]) and not isinstance(doc, bool), f"{where}: not {kind}"
    for key in schema.get("required", []):
        assert key in doc, f"{where}: {key} missing"
    for key, sub in schema.get("properties", {}).items():
        if isinstance(doc, dict) and key in doc:
            _validate(doc[key], sub, f"{where}.{key}")
    if "items" in schema and isinstance(doc, list):
        for i, item in enumerate(doc):
            _validate(item, schema["items"], f"{where}[{i}]")


@pytest.mark.parametrize("path", [HEALTHY, FAILING, PAUSED], ids=lambda p: p.name)
def test_derived_files_follow_dcgms_schema(path):
    _validate(json.loads(path.read_text()), json.loads(SCHEMA.read_text()))


# --- the fake dcgmi, run as a subprocess, through a run_tool like node_check's ----------------

def subprocess_tool(env):
    """The contract's run_tool: run argv with a timeout, never raise."""
    def run_tool(argv, timeout):
        exe = shutil.which(argv[0], path=env["PATH"])
        if exe is None:
            return Tool("missing", None, "", "", 0.0)
        start = time.monotonic()
        try:
            p = subprocess.run([exe] + argv[1:], capture_output=True, text=True,
                               timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return Tool("timeout", None, "", "", time.monotonic() - start)
        return Tool("ok", p.returncode, p.stdout, p.stderr, time.monotonic() - start)
    return run_tool


@pytest.fixture
def fake_env(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text('#!/bin/sh\nexec %s -S "$@"\n' % shlex.quote(sys.executable))
    (bindir / "python3").chmod(0o755)
    (bindir / "dcgmi").symlink_to(FAKE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLDIAG_FAKE_DCGMI")}
    env["PATH"] = f"{bindir}:/usr/bin:/bin"
    env["MLDIAG_FAKE_DCGMI_ENVFILE"] = str(tmp_path / "no-such.env")
    return env


def test_fake_healthy_by_default(fake_env):
    result = dcgm.check({}, subprocess_tool(fake_env))
    assert result == {"findings": [], "facts": {"dcgm.version": "4.2.3"}}


def test_fake_failing(fake_env):
    fake_env["MLDIAG_FAKE_DCGMI"] = FAILING.stem       # a name, ".json" left off
    p = subprocess.run(["dcgmi", "diag", "-r", "2", "-j"], env=fake_env, capture_output=True, text=True)
    assert p.returncode == 226
    result = dcgm.check({}, subprocess_tool(fake_env), dcgm_level=2)
    assert brief(result["findings"]) == [
        ("dcgm-software", "fail", "drain", [0, 1, 2, 3, 4, 5, 6, 7]),
        ("dcgm-memory", "fail", "reset-gpu", [2]),
        ("dcgm-pcie", "fail", "rma", [5]),
    ]


def test_fake_per_gpu_json(fake_env):
    fake_env["MLDIAG_FAKE_DCGMI"] = str(PER_GPU)
    result = dcgm.check({}, subprocess_tool(fake_env), dcgm_level=3)
    assert brief(result["findings"]) == [("dcgm-sm-stress", "fail", "reboot", [g]) for g in (0, 2, 3)]
    assert result["facts"] == {"dcgm.version": "1.7"}


def test_fake_no_hostengine(fake_env):
    fake_env["MLDIAG_FAKE_DCGMI_NOHOSTENGINE"] = "1"
    p = subprocess.run(["dcgmi", "diag", "-r", "1", "-j"], env=fake_env, capture_output=True, text=True)
    assert p.returncode == 235
    assert p.stdout == ("Error: unable to establish a connection to the specified host: localhost\n"
                        "Error: Unable to connect to host engine. Host engine connection "
                        "invalid/disconnected.\n")
    result = dcgm.check({}, subprocess_tool(fake_env))
    assert brief(result["findings"]) == [("dcgm-no-hostengine", "warn", "monitor", None)]


def test_fake_hang_is_tool_hung(fake_env, monkeypatch):
    fake_env["MLDIAG_FAKE_DCGMI_HANG"] = "30"
    monkeypatch.setitem(dcgm.TIMEOUTS, 1, 1.0)
    start = time.monotonic()
    result = dcgm.check({}, subprocess_tool(fake_env))
    assert time.monotonic() - start < 10
    assert brief(result["findings"]) == [("tool-hung", "fail", "reboot", None)]
    assert result["findings"][0]["message"] == "`dcgmi diag -r 1 -j` did not answer within 1 s"


def test_fake_reads_its_env_file(fake_env, tmp_path):
    envfile = tmp_path / "fake.env"
    envfile.write_text("# lab settings\nMLDIAG_FAKE_DCGMI=derived__dcgm4-h200x8__r2-failing\n"
                       "MLDIAG_FAKE_DCGMI_NOHOSTENGINE=1\n")
    fake_env["MLDIAG_FAKE_DCGMI_ENVFILE"] = str(envfile)
    fake_env["MLDIAG_FAKE_DCGMI_NOHOSTENGINE"] = "0"          # the environment wins
    result = dcgm.check({}, subprocess_tool(fake_env), dcgm_level=2)
    assert [f["code"] for f in result["findings"]] == ["dcgm-software", "dcgm-memory", "dcgm-pcie"]


def test_fake_missing_dcgmi(fake_env):
    os.unlink(Path(fake_env["PATH"].split(":")[0]) / "dcgmi")
    result = dcgm.check({}, subprocess_tool(fake_env))
    assert brief(result["findings"]) == [("dcgm-absent", "info", "none", None)]


PY38_CHECK = """
import collections, json, subprocess, sys
sys.path.insert(0, sys.argv[1])
import dcgm
Tool = collections.namedtuple("Tool", "status rc out err seconds")
def run_tool(argv, timeout):
    p = subprocess.run(argv, capture_output=True, universal_newlines=True, timeout=timeout)
    return Tool("ok", p.returncode, p.stdout, p.stderr, 0.0)
print(json.dumps(dcgm.check({}, run_tool, dcgm_level=2)))
"""


def test_module_and_fake_run_under_python38(fake_env):
    from tests.pythons import require_python
    py = require_python("3.8")
    bindir = Path(fake_env["PATH"].split(":")[0])
    (bindir / "python3").write_text('#!/bin/sh\nexec "%s" "$@"\n' % py)   # the fake on 3.8 too
    fake_env["MLDIAG_FAKE_DCGMI"] = FAILING.name
    p = subprocess.run([py, "-c", PY38_CHECK, str(ROOT / "diagnostics" / "scripts")],
                       capture_output=True, text=True, timeout=60, env=fake_env, cwd="/")
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert brief(result["findings"]) == [
        ("dcgm-software", "fail", "drain", [0, 1, 2, 3, 4, 5, 6, 7]),
        ("dcgm-memory", "fail", "reset-gpu", [2]),
        ("dcgm-pcie", "fail", "rma", [5]),
    ]


def test_module_is_stdlib_only_and_standalone():
    source = (ROOT / "diagnostics" / "scripts" / "dcgm.py").read_text()
    assert "import diagnostics" not in source and "from diagnostics" not in source
    p = subprocess.run([sys.executable, "-S", "-c",
                        "import sys; sys.path.insert(0, sys.argv[1]); import dcgm; "
                        "print(dcgm.timeout_for(2))", str(ROOT / "diagnostics" / "scripts")],
                       capture_output=True, text=True)
    assert (p.returncode, p.stdout.strip()) == (0, "600.0")
