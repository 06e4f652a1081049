"""scan-log reads Xids as node-check does (issue 29, section 3): the window goes through xid.py's
parser and each event gets its line's action, so a GPU that fell off the bus in the driver's
words without an ``Xid`` (NVIDIA's three-line message, split or joined; its single-line variant;
``NVRM: GPU 18:00.0: GPU has fallen off the bus.``) is a fatal Xid 79 in ``scan-log`` too.

The lines are the peers' test vectors (tests/fixtures/xid/peers/: GPUd's matcher, NVSentinel's
parser and fallen-off-the-bus handler) and the forms of tests/unit/test_xid_fallen.py; the
expected code, level and action of each vector were written from xid.py's rules, not from
scan-log's output.
"""
import argparse
import json
from pathlib import Path

import pytest

from tests.programs import load_module, load_script
from tests.unit.test_xid_fallen import FORMS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "diagnostics" / "scripts" / "scan_log.py"
VECTORS = json.loads((ROOT / "tests" / "fixtures" / "xid" / "peers" / "vectors.json")
                     .read_text(encoding="utf-8"))["vectors"]

sl = load_script("scan_log.py", "mldiag_test_scan_log_xid")
xid = load_script("xid.py", "mldiag_test_scan_log_xid_xid")

XID_13 = "[ 1850.000001] NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python, Graphics Exception"
XID_79 = "[ 1844.000001] NVRM: Xid (PCI:0000:ba:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def scan(tmp_path, text, lines=2000, module=sl):
    log = tmp_path / "k.log"
    log.write_text(text, encoding="utf-8")
    return module.run(argparse.Namespace(path=str(log), lines=lines))


def xid_matches(r):
    """(kind, xid, device, action, line) of every Xid match, fatal ones first."""
    return [(k, e["xid"], e["device"], e["action"], e["line"])
            for k in ("xid-fatal", "xid") for e in r["data"]["matches"][k]]


def xid_findings(r):
    return [(f["code"], f["level"], f["action"]) for f in r["findings"] if f["code"].startswith("xid")]


def vector_id(v):
    return "%s:%s:%s" % (v["peer"], v["test"], v["case"] or v.get("line"))


@pytest.mark.parametrize("v", VECTORS, ids=vector_id)
def test_every_peer_vector_as_node_check_grades_it(tmp_path, v):
    """Each of the 120 vectors: the Xid, its GPU and the action node-check gives it (the
    vector's ``mldiag``), in the Xid kind its level says; a line that is no Xid: nothing."""
    r = scan(tmp_path, v["text"] + "\n")
    if v["code"] is None:
        assert xid_matches(r) == [] and xid_findings(r) == []
        return
    kind = "xid-fatal" if v["mldiag"]["level"] == "fail" else "xid"
    # an Xid line in the message is the event (NVSentinel's "XID following"); else its first line
    at = next((n for n, text in enumerate(v["text"].split("\n"), 1) if "NVRM: Xid" in text), 1)
    ((got_kind, code, device, action, line),) = xid_matches(r)
    assert (got_kind, code, action, line) == (kind, v["code"], v["mldiag"]["action"], at)
    if v["pci"]:
        assert xid.pci_key(device) == xid.pci_key(v["pci"])
    assert xid_findings(r) == [(kind, "fail" if kind == "xid-fatal" else "warn", v["mldiag"]["action"])]


# lines before the message that a careless count would misnumber: a tqdm progress line (its
# "\r" splits a line for str.splitlines()), a form feed, and a 100 KiB line (classified on its
# two ends)
BEFORE = ["epoch 1:  10%|#         | 10/100\repoch 1:  20%|##        | 20/100",
          "page\x0cbreak",
          "x" * 100 * 1024,
          XID_13]


@pytest.mark.parametrize("name", list(FORMS), ids=list(FORMS))
def test_every_fallen_off_form_is_a_fatal_xid_79_at_its_first_line(tmp_path, name):
    r = scan(tmp_path, "\n".join(BEFORE) + "\n" + FORMS[name] + "done\n")
    assert xid_matches(r) == [("xid-fatal", 79, "0000:ba:00", "reboot", 5),
                              ("xid", 13, "0000:3b:00", "app", 4)]
    assert xid_findings(r) == [("xid-fatal", "fail", "reboot"), ("xid", "warn", "app")]
    assert r["status"] == "fail"
    (fatal,) = [f for f in r["findings"] if f["code"] == "xid-fatal"]
    assert fatal["message"].startswith(
        "1 fatal Xid line (Xid 79 on 0000:ba:00) (1 from the driver's \"fallen off the bus\" message, "
        "no Xid line) \u2014 first at line 5: NVRM: ")
    assert "fallen off the bus" in fatal["message"].split("first at line 5:", 1)[1]
    (entry,) = r["data"]["matches"]["xid-fatal"]
    assert entry["derived"] is True and "\\x0a" not in entry["text"]
    (app,) = r["data"]["matches"]["xid"]
    assert app["text"] == XID_13 and "derived" not in app


def test_the_three_line_message_is_quoted_whole(tmp_path):
    """Its first line alone says only which GPU; the match quotes the message as xid.py joined it."""
    r = scan(tmp_path, FORMS["dmesg, one line each"])
    (entry,) = r["data"]["matches"]["xid-fatal"]
    assert entry["text"] == ("NVRM: The NVIDIA GPU 0000:ba:00.0 (PCI ID: 10de:2335) installed in this "
                             "system has fallen off the bus and is not responding to commands.")


def test_an_xid_79_line_near_the_message_is_the_same_event(tmp_path):
    """The driver prints both: one event, the Xid line's (node-check's rule, FELL_OFF_WINDOW);
    another GPU's message is its own."""
    same = scan(tmp_path, FORMS["dmesg, one line each"] + XID_79 + "\n")
    assert xid_matches(same) == [("xid-fatal", 79, "0000:ba:00", "reboot", 4)]
    assert "derived" not in same["data"]["matches"]["xid-fatal"][0]
    other = scan(tmp_path, FORMS["no PCI domain"].replace("ba:", "18:") + XID_79 + "\n")
    assert xid_matches(other) == [("xid-fatal", 79, "0000:18:00", "reboot", 1),
                                  ("xid-fatal", 79, "0000:ba:00", "reboot", 2)]
    (f,) = [f for f in other["findings"] if f["code"] == "xid-fatal"]
    assert f["message"].startswith("2 fatal Xid lines (Xid 79 on 0000:18:00, 79 on 0000:ba:00) (1 from ")


def test_a_tail_window_numbers_the_message_by_the_files_lines(tmp_path):
    """--lines: the message keeps its line number in the file; a window that starts after the
    message's first line holds no message (its GPU is not named in the rest)."""
    text = "".join("[ %d.0] usb 1-1: new device\n" % i for i in range(10)) + FORMS["dmesg, one line each"]
    assert xid_matches(scan(tmp_path, text, lines=3)) == [("xid-fatal", 79, "0000:ba:00", "reboot", 11)]
    assert xid_matches(scan(tmp_path, text, lines=2)) == []


def test_a_log_without_nvrm_lines_loads_no_xid_py(tmp_path, monkeypatch):
    """A training log (or a healthy node's kernel log) costs no load of xid.py and its catalog;
    one NVRM line loads them."""
    fresh = load_module(SCRIPT, "mldiag_test_scan_log_xid_fresh")
    loaded = []
    real_load_xid = fresh._remote.load_xid
    monkeypatch.setattr(fresh._remote, "load_xid", lambda directory: loaded.append(directory) or real_load_xid(directory))
    r = scan(tmp_path, "step 1 | loss=0.31\n[ 2.0] EXT4-fs (sda1): mounted\n", module=fresh)
    assert r["status"] == "ok" and loaded == []
    r = scan(tmp_path, FORMS["the single-line variant"], module=fresh)
    assert xid_findings(r) == [("xid-fatal", "fail", "reboot")]
    assert loaded and loaded[0] == fresh.HERE


def test_without_xid_py_the_drivers_words_are_not_read(tmp_path):
    """Run by hand without xid.py beside it: Xid lines are unclassified (monitor), the driver's
    words need xid.py's parser and are not read (the module docstring says so)."""
    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "scan_log.py").write_text(SCRIPT.read_text())
    lone = load_module(alone / "scan_log.py", "mldiag_test_scan_log_xid_alone")
    r = scan(tmp_path, FORMS["dmesg, one line each"] + XID_13 + "\n", module=lone)
    assert xid_matches(r) == [("xid", 13, "0000:3b:00", "monitor", 4)]
    (f,) = r["findings"]
    assert f["message"].startswith("1 Xid line (Xid 13 on 0000:3b:00) (catalog not shipped)")


def test_through_mldiag_on_the_local_target(tmp_path):
    """The whole path: mldiag ships scan_log.py with xid.py and its catalog to the target, and
    the finding passes the client's validation gate into --json."""
    from tests.programs import mldiag
    log = tmp_path / "job.log"
    log.write_text("step 12 | loss=0.3120\n" + FORMS["one journal entry, embedded newlines"], encoding="utf-8")
    proc = mldiag("scan-log", "--path", str(log), "--json", timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)
    assert result["status"] == "fail"
    assert [(f["code"], f["level"], f["action"]) for f in result["findings"]] == [
        ("xid-fatal", "fail", "reboot")]
    assert result["findings"][0]["message"].startswith(
        "1 fatal Xid line (Xid 79 on 0000:ba:00) (1 from the driver's \"fallen off the bus\" message")
    (entry,) = result["data"]["matches"]["xid-fatal"]
    assert (entry["line"], entry["derived"]) == (2, True)


def test_the_fallen_off_fixture_gpu_by_gpu(tmp_path):
    """tests/fixtures/logs/dmesg_fallen_off_bus.log (its README table): the node-check CT
    h200-fallen replays the same log, read there by node-check (tests/integration)."""
    log = ROOT / "tests" / "fixtures" / "logs" / "dmesg_fallen_off_bus.log"
    r = sl.run(argparse.Namespace(path=str(log), lines=2000))
    assert xid_matches(r) == [
        ("xid-fatal", 79, "0000:ba:00", "reboot", 4), ("xid-fatal", 79, "0000:18:00", "reboot", 7),
        ("xid-fatal", 79, "0000:db:00", "reboot", 8), ("xid-fatal", 79, "0000:9a:00", "reboot", 10),
        ("xid-fatal", 149, "0000:2a:00", "reset-gpu", 11), ("xid-fatal", 145, "0000:5d:00", "reset-gpu", 13),
        ("xid", 149, "0000:3a:00", "monitor", 12), ("xid", 145, "0000:ab:00", "monitor", 14)]
    assert xid_findings(r) == [("xid-fatal", "fail", "reboot"), ("xid", "warn", "monitor")]
    assert r["findings"][0]["message"].startswith(
        "6 fatal Xid lines (Xid 79 on 0000:ba:00, 79 on 0000:18:00, 79 on 0000:db:00, 79 on 0000:9a:00, "
        "149 on 0000:2a:00, 145 on 0000:5d:00) (3 from the driver's \"fallen off the bus\" message, "
        "no Xid line) \u2014 first at line 4: NVRM: The NVIDIA GPU 0000:ba:00.0 (PCI ID: 10de:2335)")


def test_a_nonfatal_nvlink5_line_stays_a_warning_beside_a_fatal_one(tmp_path):
    """Xid 149 Fatal on one GPU, Nonfatal on another: the warning's action is its line's
    (monitor), not the fatal line's reset-gpu (the actions were once looked up by Xid alone)."""
    r = scan(tmp_path,
             "[ 2010.1] NVRM: Xid (PCI:0000:2a:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
             "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)\n"
             "[ 2011.6] NVRM: Xid (PCI:0000:3a:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 "
             "(0x00086226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)\n")
    assert xid_findings(r) == [("xid-fatal", "fail", "reset-gpu"), ("xid", "warn", "monitor")]
