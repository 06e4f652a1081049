"""node-check's NVLink check (diagnostics/scripts/nvlink.py): the parsers against recorded
``nvidia-smi nvlink -s`` outputs and derived ``nvlink -e`` ones, the thresholds, check() with a
fake run_tool, and the fake nvidia-smi's nvlink answers (tests/fixtures/nvlink/README.md says
where each file comes from and what it should give)."""

import random
from pathlib import Path

import pytest

from tests.programs import (captured_section, load_script,
                            run_fake_nvidia_smi, script_imports)

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "nvlink"
CAPTURES = ROOT / "tests" / "fixtures" / "nvidia-smi"
FAKE = ROOT / "tests" / "fakes" / "nvidia-smi"
SCRIPT = ROOT / "diagnostics" / "scripts" / "nvlink.py"

nv = load_script("nvlink.py", "mldiag_test_nvlink")

HOUR = 3600.0
UPTIME = 1000 * HOUR




def section(capture, what="nvlink", phase="capabilities"):
    """A captured section's text, as nvidia-smi printed it."""
    return captured_section(capture, what, phase)


def fake(*argv, capture=None):
    return run_fake_nvidia_smi(*argv, capture=capture)


def brief(findings):
    """(level, code, action, gpus) of each finding, sorted: what the tests spell out by hand."""
    return sorted((f["level"], f["code"], f["action"], tuple(f.get("gpus") or ())) for f in findings)


def status_of(text, expect=None, names=None):
    return nv.status_findings(nv.parse_nvlink_status(text), expect or {}, names or {})


# --------------------------------------------------------------------------- nvlink -s, recorded


def test_a100_x8_healthy_gpud():
    text = (FIX / "gpud-nvidia-smi.nvlink.status.a100").read_text()
    parsed = nv.parse_nvlink_status(text)
    assert list(parsed["gpus"]) == list(range(8))
    assert all(len(g["links"]) == 12 and set(g["links"].values()) == {25.0} for g in parsed["gpus"].values())
    assert parsed["gpus"][0]["uuid"] == "GPU-5269b708-678a-b1a8-60f0-c90406537486"
    findings, facts = status_of(text)
    assert findings == []
    assert facts == dict(kv for n in range(8) for kv in (("nvlink.gpu%d.active" % n, 12),
                                                          ("nvlink.gpu%d.speed" % n, 25.0)))


def test_a100_one_gpu_healthy_azure():
    findings, facts = status_of((FIX / "azurehpc-good_nvlink_status.txt").read_text())
    assert findings == []
    assert facts == {"nvlink.gpu7.active": 12, "nvlink.gpu7.speed": 25.0}


def test_a100_all_links_inactive_azure():
    text = (FIX / "azurehpc-bad_nvlink_status.txt").read_text()
    assert nv.parse_nvlink_status(text)["gpus"][6]["state"] == "all-inactive"
    findings, facts = status_of(text)
    assert brief(findings) == [("fail", "nvlink-down", "reboot", (6,))]
    assert findings[0]["message"] == "all NVLinks inactive: 0 of 12 active"
    assert "DCGM_FR_NVLINK_DOWN" in findings[0]["hint"]
    assert facts == {"nvlink.gpu6.active": 0, "nvlink.gpu6.speed": None}


@pytest.mark.parametrize("capture,model", [
    ("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt", "NVIDIA H100 80GB HBM3"),
    ("linux-x86_64__nvidia-h200__590.48.01.txt", "NVIDIA H200"),
])
def test_hopper_18_links_captured(capture, model):
    text = section(capture)
    gpu = nv.parse_nvlink_status(text)["gpus"][0]
    assert gpu["name"] == model and len(gpu["links"]) == 18
    findings, facts = status_of(text)
    assert findings == []
    assert facts == {"nvlink.gpu0.active": 18, "nvlink.gpu0.speed": 26.562}


@pytest.mark.parametrize("capture,state", [
    ("linux-x86_64__nvidia-l40s__595.80.txt", "no-nvlink"),
    ("linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05.txt", "no-nvlink"),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__595.71.05.txt", "all-inactive"),
    ("linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt", "all-inactive"),
])
def test_gpus_without_nvlink_make_no_finding(capture, state):
    text = section(capture)
    assert nv.parse_nvlink_status(text)["gpus"][0]["state"] == state
    findings, _ = status_of(text)
    assert findings == []


@pytest.mark.parametrize("capture", ["linux-x86_64__nvidia-h100-mig__590.48.01.txt",
                                     "linux-x86_64__nvidia-h200-mig__590.48.01.txt"])
def test_mig_mode_is_not_checked(capture):
    findings, facts = status_of(section(capture))
    assert brief(findings) == [("info", "not-checked", "none", (0,))]
    assert facts == {}


def test_old_and_new_all_inactive_wordings():
    for line in ("NVML: Unable to retrieve NVLink information as all links are inactive",
                 "NVML: Unable to retrieve Nvlink information as all links are inActive"):
        parsed = nv.parse_nvlink_status("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)\n%s\n" % line)
        assert parsed["gpus"][0]["state"] == "all-inactive"


# --------------------------------------------------------------------------- nvlink -s, derived


def test_derived_h200x8_nvlink_down():
    text = (FIX / "derived__h200x8__nvlink-down.nvlink-s.txt").read_text()
    findings, facts = status_of(text)
    assert brief(findings) == [("fail", "nvlink-down", "reboot", (3,)),
                               ("fail", "nvlink-inactive", "reboot", (5,))]
    msg = {f["code"]: f["message"] for f in findings}
    assert msg["nvlink-inactive"] == "16 of 18 NVLinks active (inactive: links 4, 11)"
    assert msg["nvlink-down"] == "all NVLinks inactive: 0 of 18 active"
    assert facts["nvlink.gpu3.active"] == 0 and facts["nvlink.gpu5.active"] == 16
    assert facts["nvlink.gpu0.active"] == 18 and facts["nvlink.gpu5.speed"] == 26.562


def test_down_gpus_fold_into_one_finding():
    one = section("linux-x86_64__nvidia-h200__590.48.01.txt")
    down = "GPU %d: NVIDIA H200 (UUID: GPU-%d)\nNVML: Unable to retrieve Nvlink information as all links are inActive\n"
    text = one + down % (3, 3) + down % (6, 6)
    findings = nv.fold(status_of(text)[0])
    assert brief(findings) == [("fail", "nvlink-down", "reboot", (3, 6))]


def test_expect_overrides_the_model():
    h200 = section("linux-x86_64__nvidia-h200__590.48.01.txt")
    findings, _ = status_of(h200, {"nvlinks_per_gpu": 12})
    assert brief(findings) == [("warn", "nvlink-count", "monitor", (0,))]
    assert findings[0]["message"] == "18 NVLinks active, hosts.yaml expect.nvlinks_per_gpu says 12"
    findings, _ = status_of(h200, {"nvlinks_per_gpu": 18})
    assert findings == []
    l40s = section("linux-x86_64__nvidia-l40s__595.80.txt")
    findings, _ = status_of(l40s, {"nvlinks_per_gpu": 18})
    assert brief(findings) == [("warn", "nvlink-count", "monitor", (0,))]
    # a consumer card whose links are all inactive, where hosts.yaml says it has 4: down
    findings, _ = status_of(section("linux-x86_64__nvidia-geforce-rtx-2080-super__610.57.04.txt"),
                            {"nvlinks_per_gpu": 4})
    assert brief(findings) == [("fail", "nvlink-down", "reboot", (0,))]


def test_slow_link_and_unknown_link_text():
    text = ("GPU 0: NVIDIA H200 (UUID: GPU-0)\n"
            + "".join("\t Link %d: 26.562 GB/s\n" % n for n in range(17))
            + "\t Link 17: 13.281 GB/s\n"
            + "GPU 1: NVIDIA H200 (UUID: GPU-1)\n"
            + "".join("\t Link %d: 26.562 GB/s\n" % n for n in range(17))
            + "\t Link 17: Disabled\n")
    findings, facts = status_of(text)
    assert brief(findings) == [("fail", "nvlink-inactive", "reboot", (1,)),
                               ("info", "nvlink-unknown-state", "none", (1,)),
                               ("warn", "nvlink-slow", "monitor", (0,))]
    slow = [f for f in findings if f["code"] == "nvlink-slow"][0]
    assert slow["message"] == "NVLinks 17 at 13.281 GB/s, the node's others at 26.562 GB/s"
    assert facts["nvlink.gpu0.speed"] == 26.562 and facts["nvlink.gpu0.active"] == 18


def test_unknown_model_partial_links_is_info_only():
    text = ("GPU 0: NVIDIA A100 80GB PCIe (UUID: GPU-0)\n"
            + "".join("\t Link %d: 25 GB/s\n" % n for n in range(8))
            + "".join("\t Link %d: <inactive>\n" % n for n in range(8, 12)))
    findings, facts = status_of(text)
    assert brief(findings) == [("info", "nvlink-inactive", "none", (0,))]
    assert facts["nvlink.gpu0.active"] == 8


@pytest.mark.parametrize("name,links", [
    ("NVIDIA H100 80GB HBM3", 18), ("NVIDIA H200", 18), ("NVIDIA B200", 18), ("NVIDIA B300 SXM6 AC", 18),
    ("NVIDIA GB200", 18), ("NVIDIA A100-SXM4-80GB", 12), ("NVIDIA A100-SXM4-40GB", 12), ("NVIDIA H800", 8),
    ("Tesla V100-SXM2-32GB", 6), ("NVIDIA H100 PCIe", None), ("NVIDIA H100 NVL", None),
    ("NVIDIA H200 NVL", None), ("NVIDIA A100 80GB PCIe", None), ("NVIDIA L40S", None),
    ("NVIDIA GeForce RTX 4080 SUPER", None), ("NVIDIA H20", None), ("NVIDIA GH200 480GB", None),
    ("NVIDIA A100-PCIE-40GB", None), ("", None), (None, None),
])
def test_model_links(name, links):
    assert nv.model_links(name) == links


def test_garbage_never_crashes():
    rng = random.Random(12)
    base = (FIX / "gpud-nvidia-smi.nvlink.status.a100").read_text()
    for _ in range(200):
        lines = base.splitlines()
        for _ in range(5):
            k = rng.randrange(len(lines))
            lines[k] = "".join(rng.choice("GPU Link:0123456789 <>\t./sBinactive") for _ in range(rng.randrange(40)))
        text = "\n".join(lines)
        nv.status_findings(nv.parse_nvlink_status(text), {}, {})
        nv.error_findings(nv.parse_nvlink_errors(text), rng.choice([None, 0, 10.0, UPTIME]))
    assert nv.parse_nvlink_status("")["gpus"] == {}
    assert nv.parse_nvlink_status("No devices were found\n")["notes"] == ["No devices were found"]


# --------------------------------------------------------------------------- nvlink -e


def errors_of(text, uptime=UPTIME):
    return nv.error_findings(nv.parse_nvlink_errors(text), uptime)


def test_derived_h200x8_healthy_counters():
    text = (FIX / "derived__h200x8__healthy.nvlink-e.txt").read_text()
    parsed = nv.parse_nvlink_errors(text)
    assert list(parsed["gpus"]) == list(range(8))
    assert all(len(g["links"]) == 18 for g in parsed["gpus"].values())
    assert parsed["gpus"][7]["links"][17] == {"Replay Errors": 0, "Recovery Errors": 0, "CRC Errors": 0}
    assert errors_of(text) == []


def test_derived_h200x8_error_counters():
    text = (FIX / "derived__h200x8__nvlink-errors.nvlink-e.txt").read_text()
    findings = errors_of(text)
    assert brief(findings) == [("info", "nvlink-errors-low", "none", (6,)),
                               ("warn", "nvlink-errors", "monitor", (2,)),
                               ("warn", "nvlink-recovery", "monitor", (4,))]
    msg = {f["code"]: f["message"] for f in findings}
    assert msg["nvlink-errors"] == ("NVLink errors since driver load (1000 h uptime), >= 1/h: "
                                    "link 7: 250000 replay, 9000 CRC")
    assert msg["nvlink-recovery"] == "NVLink recoveries (link retrained) since driver load (1000 h uptime): link 0: 2"
    # the same counts without an uptime: every non-zero replay/CRC count warns
    findings = errors_of(text, uptime=None)
    assert brief(findings) == [("warn", "nvlink-errors", "monitor", (2,)),
                               ("warn", "nvlink-errors", "monitor", (6,)),
                               ("warn", "nvlink-recovery", "monitor", (4,))]


def test_crc_rate_threshold():
    def one(crc, uptime):
        text = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\n\t Link 3: Replay Errors: 0\n"
                "\t Link 3: Recovery Errors: 0\n\t Link 3: CRC Errors: %d\n\n" % crc)
        return brief(errors_of(text, uptime))
    assert one(100 * 600, 600.0) == [("fail", "nvlink-crc-rate", "drain", (0,))]       # 100/s
    assert one(100 * 600 - 1, 600.0) == [("warn", "nvlink-errors", "monitor", (0,))]
    assert one(1000, UPTIME) == [("warn", "nvlink-errors", "monitor", (0,))]             # 1/h
    assert one(999, UPTIME) == [("info", "nvlink-errors-low", "none", (0,))]
    assert one(0, UPTIME) == []


def test_nvlink5_counters_derived_b300():
    text = (FIX / "derived__b300x2__nvlink-e-r595.txt").read_text()
    parsed = nv.parse_nvlink_errors(text)
    link = parsed["gpus"][0]["links"][0]
    assert link["FEC Errors - 0"] == 36140749276 and link["Effective BER"] == 1.5e-254
    assert link["Raw Errors Lane 0"] == 82
    findings = errors_of(text)
    # FEC bins, BER and raw lane counters, non-zero on the healthy GPU 0 too, make no finding
    assert brief(findings) == [("fail", "nvlink-recovery-failed", "reboot", (1,)),
                               ("warn", "nvlink-errors", "monitor", (1,))]
    past_fec = [f for f in findings if f["code"] == "nvlink-errors"][0]
    assert past_fec["message"].endswith("link 1: 50 Rx Errors, 2 Symbol Errors")


def test_counters_on_one_line_and_unknown_lines():
    text = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\n"
            "   Link 1: Replay Errors: 142, Recovery Errors: 3, CRC Errors: 891\n"
            "\t Link 2: Tx0/ Rx0 something odd\n"
            "\t Link 3: Replay Errors: N/A\n"
            "something else entirely\n")
    parsed = nv.parse_nvlink_errors(text)
    assert parsed["gpus"][0]["links"][1] == {"Replay Errors": 142, "Recovery Errors": 3, "CRC Errors": 891}
    assert parsed["gpus"][0]["links"][3] == {"Replay Errors": "N/A"}
    assert "something else entirely" in parsed["gpus"][0]["notes"]
    assert brief(errors_of(text, uptime=10 * HOUR)) == [("warn", "nvlink-errors", "monitor", (0,)),
                                                        ("warn", "nvlink-recovery", "monitor", (0,))]


# --------------------------------------------------------------------------- check()


def tool(out="", rc=0, status="ok", err=""):
    return nv.Tool(status, rc, out, err, 0.01)


class FakeRun(object):
    """run_tool: answers by argv from a dict; records the calls."""

    def __init__(self, answers):
        self.answers = answers
        self.calls = []

    def __call__(self, argv, timeout):
        self.calls.append((tuple(argv), timeout))
        return self.answers.get(tuple(argv), tool(status="missing", rc=None))


S = ("nvidia-smi", "nvlink", "-s")
E = ("nvidia-smi", "nvlink", "-e")


def test_check_healthy_h200x8():
    run = FakeRun({S: tool(fake("nvlink", "-s", capture="derived__h200x8__healthy").stdout),
                   E: tool((FIX / "derived__h200x8__healthy.nvlink-e.txt").read_text())})
    result = nv.check({}, run, gpus=[], uptime_s=UPTIME)
    assert result["findings"] == []
    assert result["facts"]["nvlink.gpu7.active"] == 18 and len(result["facts"]) == 16
    assert [c[0] for c in run.calls] == [S, E] and all(c[1] == 10.0 for c in run.calls)


def test_check_faults_h200x8():
    run = FakeRun({S: tool((FIX / "derived__h200x8__nvlink-down.nvlink-s.txt").read_text()),
                   E: tool((FIX / "derived__h200x8__nvlink-errors.nvlink-e.txt").read_text())})
    result = nv.check({"gpus": 8}, run, tool_timeout=4, uptime_s=UPTIME)
    assert brief(result["findings"]) == [("fail", "nvlink-down", "reboot", (3,)),
                                         ("fail", "nvlink-inactive", "reboot", (5,)),
                                         ("info", "nvlink-errors-low", "none", (6,)),
                                         ("warn", "nvlink-errors", "monitor", (2,)),
                                         ("warn", "nvlink-recovery", "monitor", (4,))]
    assert all(f["check"] == "nvlink" for f in result["findings"])
    assert all(c[1] == 4.0 for c in run.calls)


def test_check_hung_skipped_missing():
    result = nv.check({}, FakeRun({S: tool(status="timeout", rc=None)}))
    assert brief(result["findings"]) == [("fail", "tool-hung", "reboot", ())]
    assert result["findings"][0]["message"] == "`nvidia-smi nvlink -s` did not answer within 10 s"
    result = nv.check({}, FakeRun({S: tool(status="skipped", rc=None)}))
    assert brief(result["findings"]) == [("info", "not-checked", "none", ())]
    assert result["findings"][0]["message"] == "not checked: nvidia-smi hung earlier in this run"
    result = nv.check({}, FakeRun({}))
    assert brief(result["findings"]) == [("info", "not-checked", "none", ())]
    assert result["facts"] == {}


def test_check_errors_call_hangs_after_status():
    run = FakeRun({S: tool(section("linux-x86_64__nvidia-h200__590.48.01.txt")),
                   E: tool(status="timeout", rc=None)})
    result = nv.check({}, run, uptime_s=UPTIME)
    assert brief(result["findings"]) == [("fail", "tool-hung", "reboot", ())]
    assert result["findings"][0]["message"] == "`nvidia-smi nvlink -e` did not answer within 10 s"
    assert result["facts"] == {"nvlink.gpu0.active": 18, "nvlink.gpu0.speed": 26.562}


def test_check_lost_gpu_and_failed_call():
    out = fake("nvlink", "-s", capture="derived__h200x8__gpu-lost")
    assert out.returncode == 15
    errors = fake("nvlink", "-e", capture="derived__h200x8__gpu-lost")
    run = FakeRun({S: tool(out.stdout, rc=15), E: tool(errors.stdout, rc=errors.returncode)})
    result = nv.check({}, run, uptime_s=UPTIME)
    assert brief(result["findings"]) == [("warn", "nvlink-query-failed", "monitor", ())]
    assert result["findings"][0]["message"] == (
        "`nvidia-smi nvlink -s` exited 15: Unable to determine the device handle for GPU6: 0000:BA:00.0: "
        "GPU is lost.  Reboot the system to recover this GPU")
    assert "nvlink.gpu6.active" not in result["facts"] and result["facts"]["nvlink.gpu7.active"] == 18
    # a driver that does not answer at all
    msg = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    result = nv.check({}, FakeRun({S: tool(msg + "\n", rc=9)}))
    assert brief(result["findings"]) == [("warn", "nvlink-query-failed", "monitor", ())]
    assert result["findings"][0]["message"] == "`nvidia-smi nvlink -s` exited 9: " + msg


def test_check_skips_errors_without_links():
    run = FakeRun({S: tool(section("linux-x86_64__nvidia-l40s__595.80.txt"))})
    result = nv.check({}, run, gpus=[{"index": 0, "name": "NVIDIA L40S"}])
    assert result["findings"] == [] and result["facts"] == {}
    assert [c[0] for c in run.calls] == [S]


def test_check_no_gpu_listed():
    run = FakeRun({S: tool("garbage\n")})
    result = nv.check({}, run, gpus=[{"index": 0, "name": "NVIDIA H200"}])
    assert brief(result["findings"]) == [("warn", "nvlink-unparsed", "monitor", ())]


def test_read_uptime(tmp_path):
    p = tmp_path / "uptime"
    p.write_text("12345.67 98765.43\n")
    assert nv.read_uptime(str(p)) == 12345.67
    assert nv.read_uptime(str(tmp_path / "nope")) is None


# --------------------------------------------------------------------------- the fake's answers


@pytest.mark.parametrize("capture,argv,golden", [
    ("derived__h200x8__nvlink-down", ("nvlink", "-s"), "derived__h200x8__nvlink-down.nvlink-s.txt"),
    ("derived__h200x8__nvlink-errors", ("nvlink", "-e"), "derived__h200x8__nvlink-errors.nvlink-e.txt"),
    ("derived__h200x8__healthy", ("nvlink", "--errorcounters"), "derived__h200x8__healthy.nvlink-e.txt"),
])
def test_fake_prints_the_golden_answers(capture, argv, golden):
    r = fake(*argv, capture=capture)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == (FIX / golden).read_text()


def test_fake_nvlink_status_is_the_capture_for_one_gpu():
    r = fake("nvlink", "-s", capture="linux-x86_64__nvidia-h200__590.48.01")
    assert r.stdout == section("linux-x86_64__nvidia-h200__590.48.01.txt")
    r = fake("nvlink", "--status")  # the default capture, H100
    assert r.stdout == section("linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt")


def test_fake_nvlink_format():
    lines = fake("nvlink", "-e", capture="derived__h200x8__nvlink-errors").stdout.split("\n")
    assert lines[0] == "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"
    assert lines[1:5] == ["\t Link 0: Replay Errors: 0", "\t Link 0: Recovery Errors: 0",
                          "\t Link 0: CRC Errors: 0", ""]
    k = lines.index("GPU 2: NVIDIA H200 (UUID: GPU-00000002-0000-0000-0000-000000000002)")
    assert lines[k + 1 + 4 * 7: k + 1 + 4 * 8] == ["\t Link 7: Replay Errors: 250000", "\t Link 7: Recovery Errors: 0",
                                                   "\t Link 7: CRC Errors: 9000", ""]
    down = fake("nvlink", "-s", capture="derived__h200x8__nvlink-down").stdout.split("\n")
    k = down.index("GPU 5: NVIDIA H200 (UUID: GPU-00000005-0000-0000-0000-000000000005)")
    assert down[k + 5] == "\t Link 4: <inactive>" and down[k + 12] == "\t Link 11: <inactive>"
    assert down[k + 6] == "\t Link 5: 26.562 GB/s"
    k = down.index("GPU 3: NVIDIA H200 (UUID: GPU-00000003-0000-0000-0000-000000000003)")
    assert down[k + 1] == "NVML: Unable to retrieve Nvlink information as all links are inActive"
    # the GPU whose links are all down prints its message for -e as well
    e = fake("nvlink", "-e", capture="derived__h200x8__nvlink-down").stdout.split("\n")
    k = e.index("GPU 3: NVIDIA H200 (UUID: GPU-00000003-0000-0000-0000-000000000003)")
    assert e[k + 1] == "NVML: Unable to retrieve Nvlink information as all links are inActive"


def test_fake_nvlink_without_links_and_lost():
    r = fake("nvlink", "-e", capture="linux-x86_64__nvidia-l40s__595.80")
    assert r.stdout == section("linux-x86_64__nvidia-l40s__595.80.txt")
    r = fake("nvlink", "-s", capture="derived__h200x8__gpu-lost")
    assert r.returncode == 15
    assert ("Unable to determine the device handle for GPU6: 0000:BA:00.0: GPU is lost.  "
            "Reboot the system to recover this GPU") in r.stdout.split("\n")


def test_fake_rejects_a_bad_directive(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("base linux-x86_64__nvidia-h200__590.48.01.txt\ngpus 8\nnvlink-errors 1 2 replays=3\n")
    r = fake("nvlink", "-e", capture=str(bad))
    assert r.returncode != 0 and "nvlink-errors GPU LINK" in r.stderr


# --------------------------------------------------------------------------- the module itself


def test_python38_syntax_and_stdlib_only():
    imported = script_imports(SCRIPT)
    assert imported <= {"collections", "re", "_remote"}, imported
