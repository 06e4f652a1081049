"""xid.py (node-check's Xid/SXid check, shared by gpu-status and scan-log) on real kernel logs.

The logs are tests/fixtures/xid/ (README.md there: source, commit, licence). Expected events and
findings were written by hand from the files (``grep -n 'NVRM: Xid'`` and reading them), not
computed by the parser.
"""
import collections
from pathlib import Path

import pytest

from tests.programs import load_script
from tests.programs import script_imports

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "xid"

xid = load_script("xid.py", "mldiag_test_xid")

Tool = collections.namedtuple("Tool", "status rc out err seconds")

# An 8-GPU inventory as node_check passes it (options["gpus"]), PCI addresses as nvidia-smi prints them.
INVENTORY = [{"index": i, "pci": "00000000:%s:00.0" % bus, "name": "NVIDIA H100 80GB HBM3"}
             for i, bus in enumerate(["19", "2A", "38", "5D", "91", "9B", "BA", "DB"])]


def read(name):
    return (FIX / name).read_text(encoding="utf-8")


def sxid_excerpt():
    """The gpud README's block quote as the raw log it quotes: "> " and lone ">" lines stripped."""
    out = []
    for line in read("gpud-sxid-README.xid79-sxid20034.excerpt.md").splitlines():
        if line == ">":
            continue
        out.append(line[2:] if line.startswith("> ") else line)
    return "\n".join(out) + "\n"


def summary(findings):
    return [(f["code"], f["level"], f["action"], f.get("gpus"), f.get("ports")) for f in findings]


# --------------------------------------------------------------------------- the recorded logs


def test_dbe_with_row_remap_and_contained_ecc():
    """Xid 48 then 63 on 0000:19:00 (NVIDIA: 48 with 63 -> DRAIN_AND_RESET), then 9 Xid 94
    lines (contained ECC, the application's): ISO timestamps."""
    events = xid.parse_kernel_log(read("gpud-dmesg-time-format-iso.log"))
    assert [(e["code"], e["pci"]) for e in events] == [(48, "0000:19:00"), (63, "0000:19:00")] + \
        [(94, "0000:19:00")] * 9
    assert events[0]["time"] == "2024-11-15T12:02:03,470068+00:00"
    assert events[0]["line"] == 11
    findings = xid.classify(events, INVENTORY)
    assert summary(findings) == [
        ("xid-48", "fail", "drain", [0], None),
        ("xid-94", "warn", "app", [0], None),
        ("xid-63", "warn", "monitor", [0], None),
    ]
    assert findings[0]["message"].startswith("Xid 48 (Double Bit ECC Error) on GPU 0: 1 event, last at "
                                             "2024-11-15T12:02:03,470068+00:00: ")
    assert "with Xid 63 on the same GPU" in findings[0]["message"]
    assert ": 9 events," in findings[1]["message"]
    assert all(f["check"] == "xid" and f["hint"] for f in findings)


def test_dbe_alone_is_a_gpu_reset():
    text = "\n".join(l for l in read("gpud-dmesg-time-format-iso.log").splitlines() if ": 63," not in l)
    assert summary(xid.classify(xid.parse_kernel_log(text), INVENTORY))[0] == ("xid-48", "fail", "reset-gpu", [0], None)


def test_gsp_rpc_timeout_with_its_multiline_dump():
    """5 Xid 119 lines on 0000:9b:00 (dmesg -T); the 21 NVRM lines of GSP RPC history after the
    first (lines 4-24, same second) are detail of it, not events."""
    events = xid.parse_kernel_log(read("gpud-dmesg-with-xid-119.log"))
    assert [(e["code"], e["pci"], e["line"]) for e in events] == [
        (119, "0000:9b:00", 3), (119, "0000:9b:00", 38), (119, "0000:9b:00", 40),
        (119, "0000:9b:00", 42), (119, "0000:9b:00", 43)]
    assert events[0]["time"] == "Sun Feb 23 16:24:18 2025"
    assert events[0]["detail_lines"] == 21
    (f,) = xid.classify(events, INVENTORY)
    assert summary([f]) == [("xid-119", "fail", "reset-gpu", [5], None)]
    assert f["message"].startswith("Xid 119 (GSP RPC Timeout) on GPU 5: 5 events, last at Sun Feb 23 16:30:13 2025: "
                                   "pid=1240590, name=gpud, Timeout after 6s")
    assert f["message"].endswith("(NVIDIA: RESET_GPU)")


def test_application_xids_in_dmesg_decode_format():
    """629 Xid 13 and 7 Xid 43 lines on 0000:38:00, ``kern  :warn  : <iso>`` prefixes: the
    application's fault, one finding each however many lines."""
    events = xid.parse_kernel_log(read("gpud-dmesg.decode.iso.log.0"))
    counts = collections.Counter((e["code"], e["pci"]) for e in events)
    assert counts == {(13, "0000:38:00"): 629, (43, "0000:38:00"): 7}
    assert events[0]["time"] == "2025-01-21T02:21:33,498559+00:00"
    findings = xid.classify(events, INVENTORY)
    assert summary(findings) == [("xid-13", "warn", "app", [2], None), ("xid-43", "warn", "app", [2], None)]
    assert ": 629 events," in findings[0]["message"] and ": 7 events," in findings[1]["message"]


@pytest.mark.parametrize("name", ["gpud-dmesg.decode.iso.log.1", "gpud-kmsg.1.log"])
def test_healthy_logs_give_nothing(name):
    """A full healthy H100 boot (decode format, NVSwitch and NVRM lines, no Xid) and raw
    /dev/kmsg records with nvidia-nvswitch lines."""
    text = read(name)
    assert "nvswitch" in text
    assert xid.parse_kernel_log(text) == []
    assert xid.check({}, None, kernel_log={"source": "dmesg", "text": text, "error": None},
                     gpus=INVENTORY)["findings"] == []


def test_fallen_off_the_bus_with_nvswitch_sxids():
    """gpud's README excerpt: Xid 79 on 0000:91:00 (its "GPU has fallen off the bus" line is
    the same event), then SXid 20034 Fatal on nvswitch1 (link 48), nvswitch0 (links 63, 62)
    and nvswitch2 (link 37, and a Severity line of an event whose head line is not quoted)."""
    events = xid.parse_kernel_log(sxid_excerpt())
    assert [(e["kind"], e["code"], e.get("device") or e["pci"], e.get("link")) for e in events] == [
        ("xid", 79, "0000:91:00", None),
        ("sxid", 20034, "nvswitch1", 48), ("sxid", 20034, "nvswitch0", 63),
        ("sxid", 20034, "nvswitch2", None), ("sxid", 20034, "nvswitch2", 37),
        ("sxid", 20034, "nvswitch0", 62)]
    assert [e["detail_lines"] for e in events] == [1, 0, 1, 0, 1, 1]   # the Data / Severity lines
    findings = xid.classify(events, INVENTORY)
    assert summary(findings) == [
        ("sxid-20034", "fail", "reboot", None, ["nvswitch0", "nvswitch1", "nvswitch2"]),
        ("xid-79", "fail", "reboot", [4], None),
    ]
    assert findings[0]["message"].startswith(
        "SXid 20034 (LTSSM Fault Up, fatal) on nvswitch0 \u00d72 (links 62, 63), nvswitch1 (link 48), "
        "nvswitch2 \u00d72 (link 37): 5 events, last at 6781753.408138 s after boot: Fatal, Link 62")
    assert findings[1]["message"].startswith("Xid 79 (GPU has fallen off the bus) on GPU 4: 1 event")


def test_a_lost_gpu_missing_from_the_inventory_keeps_its_pci_address():
    (f,) = [f for f in xid.classify(xid.parse_kernel_log(sxid_excerpt()), INVENTORY[:4]) if f["code"] == "xid-79"]
    assert "gpus" not in f
    assert f["message"].startswith("Xid 79 (GPU has fallen off the bus) on 0000:91:00 (not in nvidia-smi's list)")
    (f,) = [f for f in xid.classify(xid.parse_kernel_log(sxid_excerpt()), []) if f["code"] == "xid-79"]
    assert f["message"].startswith("Xid 79 (GPU has fallen off the bus) on 0000:91:00: ")


# --------------------------------------------------------------------------- line forms


@pytest.mark.parametrize("line,when", [
    ("[ 1234.567890] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     "1234.567890"),
    ("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.",
     "Sun Feb 23 16:24:18 2025"),
    ("2025-02-23T16:24:18,123456+00:00 NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
     "2025-02-23T16:24:18,123456+00:00"),
    ("kern  :warn  : 2025-02-23T16:24:18,123456+00:00 NVRM: Xid (PCI:0000:18:00): 79, x",
     "2025-02-23T16:24:18,123456+00:00"),
    ("4,5121,6781741548779,-;NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, x",
     "6781741.548779"),
    ("2025-02-23T16:24:18+0000 gpu01 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, x",
     "2025-02-23T16:24:18+0000"),
    ("Feb 23 16:24:18 gpu01 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, x", "Feb 23 16:24:18"),
])
def test_every_log_format(line, when):
    (e,) = xid.parse_kernel_log(line + "\n")
    assert (e["code"], e["pci"], e["time"]) == (79, "0000:18:00", when)


def test_fallen_off_the_bus_without_an_xid_line_is_xid_79():
    text = ("[ 10.0] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.\n"
            "[ 10.1] NVRM: GPU 0000:91:00.0: GPU serial number is 1653723052734.\n"
            "[ 99.0] NVRM: GPU at PCI:0000:19:00: GPU has fallen off the bus.\n")
    events = xid.parse_kernel_log(text)
    assert [(e["code"], e["pci"], e.get("derived")) for e in events] == [(79, "0000:91:00", True),
                                                                        (79, "0000:19:00", True)]
    findings = xid.classify(events, INVENTORY)
    assert summary(findings) == [("xid-79", "fail", "reboot", [0, 4], None)]
    assert "from the driver's \"fallen off the bus\" message (no Xid line)" in findings[0]["message"]


def test_repeats_fold_per_xid_with_counts_per_gpu():
    text = "".join("[ %d.0] NVRM: Xid (PCI:0000:%s:00): 13, pid=7, name=python, Graphics Exception\n" % (i, bus)
                   for i, bus in enumerate(["19", "19", "19", "db", "77"]))
    (f,) = xid.classify(xid.parse_kernel_log(text), INVENTORY)
    assert (f["gpus"], f["action"]) == ([0, 7], "app")
    assert f["message"].startswith("Xid 13 (Graphics Engine Exception) on GPU 0 \u00d73, GPU 7, "
                                   "0000:77:00 (not in nvidia-smi's list): 5 events")


@pytest.mark.parametrize("text,action", [
    ("Xid (PCI:0000:19:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", "reboot"),
    ("Xid (PCI:0000:19:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", "reset-gpu"),
    ("Xid (PCI:0000:19:00): 154, GPU recovery action changed from 0x0 (None) to 0x3 (Drain and Reset)", "drain"),
    ("Xid (PCI:0000:19:00): 154, GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)", "none"),
    ("Xid (PCI:0000:19:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x004505c6 0x00000000 0x0)", "monitor"),
    ("Xid (PCI:0000:19:00): 145, RLW_REMAP Fatal XC0 i0 Link 00 (0x004505c6 0x00000000 0x0)", "reset-gpu"),
    ("Xid (PCI:0000:19:00): 999, a code from the future", "monitor"),
])
def test_actions_the_line_itself_decides(text, action):
    (f,) = xid.classify(xid.parse_kernel_log("[ 1.0] NVRM: " + text + "\n"), INVENTORY)
    assert (f["action"], f["level"]) == (action, xid.LEVEL_OF[action])


def test_nonfatal_sxid_is_monitored():
    (f,) = xid.classify(xid.parse_kernel_log(
        "[ 5.0] nvidia-nvswitch3: SXid (PCI:0000:08:00.0): 20034, Non-fatal, Link 2 LTSSM Fault Up\n"), [])
    assert summary([f]) == [("sxid-20034", "warn", "monitor", None, ["nvswitch3"])]


# --------------------------------------------------------------------------- reading the log


def fake_tools(answers):
    """run_tool answering from {argv[0] or full argv tuple: Tool}; unlisted tools are missing."""
    calls = []

    def run_tool(argv, timeout):
        calls.append(list(argv))
        t = answers.get(tuple(argv), answers.get(argv[0]))
        return t if t is not None else Tool("missing", None, "", "", 0.0)
    return run_tool, calls


XID_LINE = "2025-02-23T16:24:18+0000 gpu01 kernel: NVRM: Xid (PCI:0000:91:00): 79, pid=1, x\n"


def test_journalctl_first_with_the_window_systemd_time_spells():
    run_tool, calls = fake_tools({"journalctl": Tool("ok", 0, XID_LINE, "", 0.1)})
    log = xid.read_kernel_log(run_tool)
    assert calls == [["journalctl", "-k", "--since=-24h", "-o", "short-iso", "--no-pager"]]
    assert (log["source"], log["text"], log["error"]) == ("journalctl", XID_LINE, None)
    xid.read_kernel_log(run_tool, since="2h")
    assert calls[-1][2] == "--since=-2h"


def test_no_journalctl_reads_dmesg():
    run_tool, calls = fake_tools({"dmesg": Tool("ok", 0, XID_LINE, "", 0.1)})
    log = xid.read_kernel_log(run_tool)
    assert [c[0] for c in calls] == ["journalctl", "dmesg"] and calls[1] == ["dmesg", "--time-format=iso"]
    assert log["source"] == "dmesg"
    r = xid.check({}, run_tool, gpus=INVENTORY)
    assert summary(r["findings"]) == [("xid-79", "fail", "reboot", [4], None)]


def test_empty_journal_and_an_old_dmesg_fall_back_to_plain_dmesg():
    run_tool, calls = fake_tools({
        "journalctl": Tool("ok", 0, "", "No journal files were found.\n", 0.1),
        ("dmesg", "--time-format=iso"): Tool("ok", 1, "", "dmesg: unrecognized option '--time-format=iso'\n", 0.0),
        ("dmesg",): Tool("ok", 0, XID_LINE, "", 0.0)})
    log = xid.read_kernel_log(run_tool)
    assert [c for c in calls] == [calls[0], ["dmesg", "--time-format=iso"], ["dmesg"]]
    assert log["source"] == "dmesg"


def test_a_quiet_journal_window_is_the_answer_not_a_fallback():
    # journalctl -k --since=-24h on a node whose Xids are older than the window: dmesg would
    # show the whole ring buffer since boot, old Xids among it
    run_tool, calls = fake_tools({"journalctl": Tool("ok", 0, "-- No entries --\n", "", 0.1),
                                  "dmesg": Tool("ok", 0, XID_LINE, "", 0.0)})
    log = xid.read_kernel_log(run_tool)
    assert [c[0] for c in calls] == ["journalctl"]
    assert (log["source"], log["text"], log["error"]) == ("journalctl", "", None)
    assert xid.check({}, run_tool, gpus=INVENTORY)["findings"] == []


def test_no_journal_files_still_fall_back_to_dmesg():
    # no journal at all (a container without journald): the same "-- No entries --", and why
    run_tool, calls = fake_tools({
        "journalctl": Tool("ok", 0, "-- No entries --\n", "No journal files were found.\n", 0.1),
        "dmesg": Tool("ok", 0, XID_LINE, "", 0.0)})
    log = xid.read_kernel_log(run_tool)
    assert [c[0] for c in calls] == ["journalctl", "dmesg"] and log["source"] == "dmesg"


def test_no_tool_at_all_is_said():
    run_tool, _ = fake_tools({})
    log = xid.read_kernel_log(run_tool)
    assert log == {"source": None, "text": "", "error": "journalctl: not found; dmesg: not found", "hung": []}
    (f,) = xid.check({}, run_tool, gpus=INVENTORY)["findings"]
    assert (f["code"], f["level"], f["action"]) == ("kernel-log-unreadable", "warn", "none")
    assert f["message"] == "Xid/SXid not checked: kernel log unreadable (journalctl: not found; dmesg: not found)"


def test_permission_denied_is_quoted():
    run_tool, _ = fake_tools({
        "journalctl": Tool("ok", 1, "", "Hint: You are currently not seeing messages from other users\n", 0.1),
        "dmesg": Tool("ok", 1, "", "dmesg: read kernel buffer failed: Operation not permitted\n", 0.0)})
    log = xid.read_kernel_log(run_tool)
    assert log["source"] is None
    assert "dmesg --time-format=iso: dmesg: read kernel buffer failed: Operation not permitted" in log["error"]


def test_a_hung_tool_is_one_finding_and_dmesg_still_read():
    run_tool, _ = fake_tools({"journalctl": Tool("timeout", None, "", "", 10.0),
                              "dmesg": Tool("ok", 0, XID_LINE, "", 0.1)})
    r = xid.check({}, run_tool, gpus=INVENTORY)
    assert summary(r["findings"]) == [("tool-hung", "fail", "reboot", None, None),
                                      ("xid-79", "fail", "reboot", [4], None)]
    assert r["findings"][0]["message"] == "`journalctl -k` did not answer within 10 s"
    run_tool, _ = fake_tools({"journalctl": Tool("timeout", None, "", "", 10.0),
                              "dmesg": Tool("timeout", None, "", "", 10.0)})
    r = xid.check({}, run_tool, gpus=INVENTORY)
    assert [f["code"] for f in r["findings"]] == ["tool-hung", "kernel-log-unreadable"]


def test_kernel_log_file_first_and_bounded(tmp_path):
    run_tool, calls = fake_tools({})
    p = tmp_path / "kern.log"
    p.write_text("[ 1.0] NVRM: Xid (PCI:0000:19:00): 13, pid=1, x\n" * 100 + XID_LINE)
    log = xid.read_kernel_log(run_tool, path=str(p), max_bytes=200)
    assert calls == [] and log["source"] == "file:%s" % p
    assert log["text"].endswith(XID_LINE) and len(log["text"]) <= 200
    assert not log["text"].startswith("NVRM") and log["text"].startswith("[ 1.0]")   # whole lines
    r = xid.check({}, run_tool, gpus=INVENTORY, kernel_log_file=str(p))
    assert [f["code"] for f in r["findings"]] == ["xid-79", "xid-13"]
    missing = xid.read_kernel_log(run_tool, path=str(tmp_path / "nope"))
    assert missing["source"] is None and missing["error"].endswith("nope: No such file or directory")


def test_check_uses_the_log_node_check_read():
    log = {"source": "file:/x", "text": sxid_excerpt(), "error": None}
    r = xid.check({"gpus": 8}, None, kernel_log=log, gpus=INVENTORY, sys_root="/sys", dcgm_level=None)
    assert [f["code"] for f in r["findings"]] == ["sxid-20034", "xid-79"]
    assert r["facts"] == {} and r["data"] == {"source": "file:/x", "events": 6}


def test_python38_syntax_and_stdlib_only():
    import sys
    imported = script_imports(ROOT / "diagnostics" / "scripts" / "xid.py")
    assert imported == {"__future__", "_remote", "json", "os", "re"}
    if hasattr(sys, "stdlib_module_names"):
        assert imported <= set(sys.stdlib_module_names) | {"__future__", "_remote"}
