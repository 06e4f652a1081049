"""node-check's NVSwitch fabric check (diagnostics/scripts/nvfabric.py): ``nvidia-smi -q``'s
Fabric section from recorded outputs (a cut-short one too), the fabric manager's service state
and log, check() with a fake run_tool, and the fake nvidia-smi's ``-q`` for an 8-GPU H200 node
(tests/fixtures/fabric/README.md says where each file comes from and what it should give)."""

import random
import time
from pathlib import Path

import pytest

from tests.programs import (captured_section, load_script,
                            run_fake_nvidia_smi, script_imports)

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "fabric"
CAPTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
FAKE = ROOT / "tests" / "fakes" / "nvidia-smi"
SCRIPT = ROOT / "diagnostics" / "scripts" / "nvfabric.py"

fab = load_script("nvfabric.py", "mldiag_test_fabric")

H200 = "linux-x86_64__nvidia-h200__590.48.01.txt"
VALID_161 = "gpud-nvidia-smi-query.535.161.08.out.0.valid"
VALID_183 = "gpud-nvidia-smi-query.535.183.01.out.0.valid"
INVALID_183 = "gpud-nvidia-smi-query.535.183.01.out.0.invalid"
ACTIVE = "LoadState=loaded\nActiveState=active\nSubState=running\n"




def section(capture, what="query", phase="idle"):
    return captured_section(capture, what, phase)


def fake(*argv, capture=None):
    return run_fake_nvidia_smi(*argv, capture=capture)


def brief(findings):
    return sorted((f["level"], f["code"], f["action"], tuple(f.get("gpus") or ()), tuple(f.get("ports") or ()))
                  for f in findings)


def findings_of(text, fm=None, gpus=()):
    q = fab.parse_query(text)
    return fab.fabric_findings(q, fab.gpu_indices(q, list(gpus)), fm)


# --------------------------------------------------------------------------- -q, recorded


@pytest.mark.parametrize("name,driver,first_bus", [
    (VALID_161, "535.161.08", "00000000:19:00.0"),
    (VALID_183, "535.183.01", "00000000:53:00.0"),
])
def test_h100x8_healthy_gpud(name, driver, first_bus):
    q = fab.parse_query((FIX / name).read_text())
    assert (q["driver"], q["cuda"], q["attached"], len(q["gpus"]), q["complete"]) == (driver, "12.2", 8, 8, True)
    assert q["gpus"][0]["bus"] == first_bus and q["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert all(g["fabric"] == {"State": "Completed", "Status": "Success"} for g in q["gpus"])
    findings, facts = findings_of((FIX / name).read_text(), {"ActiveState": "active"})
    assert findings == []
    assert facts["driver"] == driver and facts["cuda"] == "12.2"
    assert [facts["fabric.gpu%d.state" % n] for n in range(8)] == ["Completed"] * 8
    assert [facts["fabric.gpu%d.status" % n] for n in range(8)] == ["Success"] * 8
    assert len(facts) == 18


def test_cut_short_query_is_a_finding_not_a_crash():
    text = (FIX / INVALID_183).read_text()
    q = fab.parse_query(text)
    assert (q["attached"], len(q["gpus"]), q["complete"]) == (8, 1, False)
    assert q["gpus"][0]["fabric"] == {} and q["gpus"][0]["ended"] is False
    findings, facts = findings_of(text)
    assert brief(findings) == [("warn", "fabric-query-incomplete", "monitor", (), ())]
    assert findings[0]["message"] == ("`nvidia-smi -q` cut short: 1 of 8 attached GPUs in its output, "
                                      "fabric state unknown for the rest")
    assert facts == {"driver": "535.183.01", "cuda": "12.2"}


@pytest.mark.parametrize("capture", [H200, "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt",
                                     "linux-x86_64__nvidia-h200-mig__590.48.01.txt"])
def test_hopper_590_fabric_section_with_clique_and_health(capture):
    q = fab.parse_query(section(capture))
    fabric = q["gpus"][0]["fabric"]
    assert (fabric["State"], fabric["Status"], fabric["CliqueId"]) == ("Completed", "Success", "0")
    assert fabric["ClusterUUID"] == "00000000-0000-0000-0000-000000000000"
    assert q["gpus"][0]["health"]["Summary"] == "N/A" and q["complete"]
    findings, facts = findings_of(section(capture), {"ActiveState": "active"})
    assert findings == []
    assert (facts["driver"], facts["cuda"]) == ("590.48.01", "13.1")
    assert facts["fabric.gpu0.state"] == "Completed"


@pytest.mark.parametrize("capture", ["linux-x86_64__nvidia-l40s__595.80.txt",
                                     "linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt",
                                     "linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt"])
def test_no_nvswitch_no_fabric_facts(capture):
    q = fab.parse_query(section(capture))
    assert q["gpus"][0]["fabric"]["State"] == "N/A" and not fab.is_nvswitch(q)
    findings, facts = findings_of(section(capture))
    assert findings == [] and sorted(facts) == ["cuda", "driver"]


@pytest.mark.parametrize("capture", sorted(p.name for p in CAPTURES.glob("linux-*.txt")))
@pytest.mark.parametrize("phase", ["idle", "load"])
def test_every_captured_query_parses_whole(capture, phase):
    q = fab.parse_query(section(capture, phase=phase))
    assert q["complete"] and q["attached"] == len(q["gpus"]) == 1
    assert q["driver"] == capture.rsplit("__", 1)[1][:-4]
    assert q["cuda"] in ("13.1", "13.2", "13.3")
    findings, _ = findings_of(section(capture, phase=phase), {"ActiveState": "active"})
    assert findings == []


def test_gpu_index_from_the_inventory():
    text = (FIX / VALID_161).read_text()
    q = fab.parse_query(text)
    inventory = [{"index": 7 - n, "pci": g["bus"]} for n, g in enumerate(q["gpus"])]
    inventory[0]["pci"] = inventory[0]["pci"][4:]        # 0000:19:00.0 names the same GPU
    idx = fab.gpu_indices(q, inventory)
    assert idx["00000000:19:00.0"] == 7 and idx[q["gpus"][-1]["bus"].upper()] == 0


def test_garbage_never_crashes():
    rng = random.Random(7)
    base = (FIX / VALID_183).read_text().splitlines()
    for _ in range(100):
        lines = list(base)
        for _ in range(20):
            k = rng.randrange(len(lines))
            lines[k] = " " * rng.randrange(12) + "".join(rng.choice("GPU Fabric:State 0:.ABn/a") for _ in range(30))
        cut = rng.randrange(len(lines))
        fm = rng.choice([None, {}, {"ActiveState": "failed"}])
        fab.fabric_findings(fab.parse_query("\n".join(lines[:cut])), {}, fm)
    assert fab.parse_query("")["gpus"] == []


# --------------------------------------------------------------------------- -q, derived (the fake)


def test_fake_query_replicates_the_h200():
    r = fake("-q", capture="derived__h200x8__healthy")
    assert r.returncode == 0
    q = fab.parse_query(r.stdout)
    assert (q["attached"], len(q["gpus"]), q["complete"]) == (8, 8, True)
    buses = fake("--query-gpu=pci.bus_id,uuid", "--format=csv,noheader", capture="derived__h200x8__healthy")
    assert [g["bus"] + ", " + g["uuid"] for g in q["gpus"]] == buses.stdout.splitlines()
    assert len(set(g["bus"] for g in q["gpus"])) == 8
    lines = r.stdout.splitlines()
    assert lines.count("    Minor Number                                       : 7") == 1
    assert "        Bus                                            : 0xDB" in lines
    # every line is the captured GPU's, but for the ones naming the GPU
    one = section(H200).splitlines()
    differ = set(lines) - set(one)
    assert all(any(k in ln for k in ("GPU 0000", "Bus", "UUID", "Minor Number", "Module Id", "Attached GPUs"))
               for ln in differ), differ
    findings, facts = findings_of(r.stdout, {"ActiveState": "active"})
    assert findings == [] and facts["fabric.gpu7.status"] == "Success"


def test_fake_query_unreplicated_is_the_capture():
    assert fake("-q", capture=H200).stdout == section(H200)


def test_derived_fabric_in_progress():
    text = fake("-q", capture="derived__h200x8__fabric-in-progress").stdout
    findings, facts = findings_of(text, {"ActiveState": "active"})
    assert brief(findings) == [("fail", "fabric-not-initialized", "reboot", tuple(range(8)), ())]
    assert findings[0]["message"] == ("fabric not initialized — CUDA will fail to start on this node "
                                      "(State In Progress, Status N/A)")
    assert "wait a minute" in findings[0]["hint"]
    assert facts["fabric.gpu3.state"] == "In Progress"
    # with the fabric manager down, the hint says to start it first
    findings, _ = findings_of(text, {"ActiveState": "failed", "SubState": "failed"})
    assert "nvidia-fabricmanager is failed: start it" in findings[0]["hint"]


def test_derived_fabric_failed_registration():
    text = fake("-q", capture="derived__h200x8__fabric-failed").stdout
    findings, facts = findings_of(text, {"ActiveState": "active"})
    assert brief(findings) == [("fail", "fabric-not-initialized", "reboot", (1,), ())]
    assert "(State Completed, Status Unknown Error)" in findings[0]["message"]
    assert (facts["fabric.gpu1.status"], facts["fabric.gpu2.status"]) == ("Unknown Error", "Success")


def test_fabric_health_degraded():
    text = section(H200).replace("            Summary                                    : N/A",
                                 "            Summary                                    : Unhealthy") \
                        .replace("            Bandwidth                                  : N/A",
                                 "            Bandwidth                                  : Degraded")
    findings, _ = findings_of(text, {"ActiveState": "active"})
    assert brief(findings) == [("warn", "fabric-health", "monitor", (0,), ())]
    assert findings[0]["message"] == "fabric health Unhealthy (Bandwidth Degraded)"


# --------------------------------------------------------------------------- the fabric manager


def test_fm_state_and_findings():
    assert fab.parse_fm_state(ACTIVE) == {"LoadState": "loaded", "ActiveState": "active", "SubState": "running"}
    assert fab.fm_findings(fab.parse_fm_state(ACTIVE), True, ["NVIDIA H200"]) == []
    dead = fab.parse_fm_state("LoadState=loaded\nActiveState=failed\nSubState=failed\n")
    got = fab.fm_findings(dead, True, ["NVIDIA H200"])
    assert brief(got) == [("warn", "fabric-manager-inactive", "monitor", (), ())]
    assert got[0]["message"] == "nvidia-fabricmanager is failed (failed) while the fabric is up"
    assert fab.fm_findings(dead, False, ["NVIDIA H200"]) == []      # the fabric finding says it
    assert fab.fm_findings(dead, True, ["NVIDIA GB200"]) == []      # NVL72: managed off the tray
    absent = fab.parse_fm_state("LoadState=not-found\nActiveState=inactive\nSubState=dead\n")
    assert brief(fab.fm_findings(absent, True, ["NVIDIA H200"])) == [("info", "fabric-manager-absent", "none", (), ())]


def test_fm_log_gpud():
    errors = fab.parse_fm_log((FIX / "gpud-fabricmanager.log").read_text())
    assert errors == [{"time": "Feb 27 2025 15:10:02", "epoch": errors[0]["epoch"], "kind": "non-fatal",
                       "code": 12028, "bus": "00000000:86:00.0", "physical": 3, "port": 61, "fid": 0}]
    got = fab.log_findings(errors)
    assert brief(got) == [("warn", "nvswitch-error", "monitor", (), ("00000000:86:00.0/61",))]
    assert got[0]["message"] == ("NVSwitch 00000000:86:00.0 (physical id 3) port 61: 1 non-fatal error (12028) "
                                 "in fabricmanager.log, last Feb 27 2025 15:10:02")


def test_fm_log_fatal_repeats_and_since():
    line = ("[Mar 0%d 2025 10:00:0%d] [ERROR] [tid 7] detected NVSwitch %s error %d on fid 0 on NVSwitch "
            "pci bus id 00000000:05:00.0 physical id 0 port %d")
    text = "\n".join([line % (1, 1, "fatal", 12001, 8), line % (2, 2, "fatal", 12002, 8),
                      line % (3, 3, "non-fatal", 12028, 9), "garbage [ERROR] detected NVSwitch"]) + "\n"
    got = fab.log_findings(fab.parse_fm_log(text))
    assert brief(got) == [("fail", "nvswitch-fatal", "drain", (), ("00000000:05:00.0/8",)),
                          ("warn", "nvswitch-error", "monitor", (), ("00000000:05:00.0/9",))]
    fatal = [f for f in got if f["code"] == "nvswitch-fatal"][0]
    assert fatal["message"].startswith("NVSwitch 00000000:05:00.0 (physical id 0) port 8: 2 fatal errors "
                                       "(12001, 12002) in fabricmanager.log, last Mar 02 2025 10:00:02")
    since = time.mktime(time.strptime("Mar 02 2025 00:00:00", "%b %d %Y %H:%M:%S"))
    assert [e["code"] for e in fab.parse_fm_log(text, since=since)] == [12002, 12028]


def test_read_tail(tmp_path):
    p = tmp_path / "fm.log"
    p.write_text("first line\n" + "x" * 50 + "\nlast line\n")
    assert fab.read_tail(str(p), limit=30) == "last line\n"
    assert fab.read_tail(str(p)).startswith("first line")
    assert fab.read_tail(str(tmp_path / "nope")) is None


# --------------------------------------------------------------------------- check()


def tool(out="", rc=0, status="ok", err=""):
    return fab.Tool(status, rc, out, err, 0.01)


class FakeRun(object):
    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, argv, timeout):
        self.calls.append((tuple(argv), timeout))
        return self.answers.get(tuple(argv), tool(status="missing", rc=None))


Q = tuple(fab.QUERY_ARGV)
FM = tuple(fab.FM_ARGV)


def test_check_healthy_hgx():
    run = FakeRun({Q: tool((FIX / VALID_161).read_text()), FM: tool(ACTIVE)})
    result = fab.check({}, run, gpus=[], fabricmanager_log=None)
    assert result["findings"] == []
    assert result["facts"]["cuda"] == "12.2" and result["facts"]["fabric.gpu0.state"] == "Completed"
    assert [c[0] for c in run.calls] == [Q, FM]
    assert result["data"]["fabric_manager"]["ActiveState"] == "active"


def test_check_with_the_fm_log():
    run = FakeRun({Q: tool((FIX / VALID_183).read_text()), FM: tool(ACTIVE)})
    result = fab.check({}, run, fabricmanager_log=str(FIX / "gpud-fabricmanager.log"))
    assert brief(result["findings"]) == [("warn", "nvswitch-error", "monitor", (), ("00000000:86:00.0/61",))]
    result = fab.check({}, run, fabricmanager_log=str(FIX / "gpud-fabricmanager.log"), log_since=time.time())
    assert result["findings"] == []


def test_check_not_nvswitch_asks_no_systemd():
    run = FakeRun({Q: tool(section("linux-x86_64__nvidia-l40s__595.80.txt"))})
    result = fab.check({}, run, fabricmanager_log=None)
    assert result["findings"] == [] and [c[0] for c in run.calls] == [Q]


def test_check_without_systemd():
    q = (FIX / VALID_161).read_text()
    result = fab.check({}, FakeRun({Q: tool(q)}), fabricmanager_log=None)
    assert brief(result["findings"]) == [("info", "fabric-manager-unknown", "none", (), ())]
    assert result["findings"][0]["message"] == "nvidia-fabricmanager state not read: systemctl not found"
    no_pid1 = "System has not been booted with systemd as init system (PID 1). Can't operate.\n"
    result = fab.check({}, FakeRun({Q: tool(q), FM: tool("", rc=1, err=no_pid1)}), fabricmanager_log=None)
    assert brief(result["findings"]) == [("info", "fabric-manager-unknown", "none", (), ())]
    assert "System has not been booted with systemd" in result["findings"][0]["message"]
    gone = "LoadState=not-found\nActiveState=inactive\nSubState=dead\n"
    result = fab.check({}, FakeRun({Q: tool(q), FM: tool(gone)}), fabricmanager_log=None)
    assert brief(result["findings"]) == [("info", "fabric-manager-absent", "none", (), ())]


def test_check_fabric_down_with_fm_failed():
    q = fake("-q", capture="derived__h200x8__fabric-in-progress").stdout
    failed = "LoadState=loaded\nActiveState=failed\nSubState=failed\n"
    inventory = [{"index": n, "pci": "00000000:%s:00.0" % b, "name": "NVIDIA H200"}
                 for n, b in enumerate(["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"])]
    result = fab.check({}, FakeRun({Q: tool(q), FM: tool(failed)}), gpus=inventory, fabricmanager_log=None)
    assert brief(result["findings"]) == [("fail", "fabric-not-initialized", "reboot", tuple(range(8)), ())]
    assert "systemctl restart nvidia-fabricmanager" in result["findings"][0]["hint"]
    assert result["findings"][0]["check"] == "fabric"


def test_check_tool_problems():
    result = fab.check({}, FakeRun({Q: tool(status="timeout", rc=None)}), tool_timeout=3)
    assert brief(result["findings"]) == [("fail", "tool-hung", "reboot", (), ())]
    assert result["findings"][0]["message"] == "`nvidia-smi -q` did not answer within 3 s"
    result = fab.check({}, FakeRun({Q: tool(status="skipped", rc=None)}))
    assert result["findings"][0]["message"] == "not checked: nvidia-smi hung earlier in this run"
    result = fab.check({}, FakeRun({}))
    assert brief(result["findings"]) == [("info", "not-checked", "none", (), ())]
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    result = fab.check({}, FakeRun({Q: tool(msg + "\n", rc=9)}))
    assert brief(result["findings"]) == [("warn", "fabric-query-failed", "monitor", (), ())]
    assert result["findings"][0]["message"] == "`nvidia-smi -q` exited 9: " + msg


def test_check_cut_short():
    run = FakeRun({Q: tool((FIX / INVALID_183).read_text())})
    result = fab.check({}, run, fabricmanager_log=None)
    assert brief(result["findings"]) == [("warn", "fabric-query-incomplete", "monitor", (), ())]
    assert result["facts"] == {"driver": "535.183.01", "cuda": "12.2"}


# --------------------------------------------------------------------------- the module itself


def test_python38_syntax_and_stdlib_only():
    imported = script_imports(SCRIPT)
    assert imported <= {"collections", "re", "time", "_remote"}, imported
