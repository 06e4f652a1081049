"""A GPU that fell off the bus, in the driver's words without an ``Xid`` (issue 29): NVIDIA's
three-line message, as separate kernel-log lines in every format xid.py reads and joined into one
journal entry or /dev/kmsg record, its single-line variant, and ``NVRM: GPU 18:00.0: GPU has
fallen off the bus.`` without a PCI domain. Each is Xid 79 (fail, reboot: NVIDIA's RESTART_BM)
on its GPU -- through xid.py, through node-check's run on the fake nvidia-smi's 8 H200 (GPU 6
is at 00000000:BA:00.0) and through gpu-status's kernel-log scan.

The message's lines are the ones NVIDIA NVSentinel's gpufallen tests and GPUd's Match tests
quote (tests/fixtures/xid/peers/); the PCI ID 10de:2335 is an H200's.
"""
import json

import pytest

from tests.programs import load_script

xid = load_script("xid.py", "mldiag_test_xid_fallen")
nc = load_script("node_check.py", "mldiag_test_xid_fallen_node_check")
gs = load_script("gpu_status.py", "mldiag_test_xid_fallen_gpu_status")

# node-check's inventory of the fake's 8 H200, as it passes it to xid.check
INVENTORY = [{"index": i, "pci": "00000000:%s:00.0" % bus}
             for i, bus in enumerate(["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"])]

PIECES = ["NVRM: The NVIDIA GPU 0000:ba:00.0",
          "NVRM: (PCI ID: 10de:2335) installed in this system has",
          "NVRM: fallen off the bus and is not responding to commands."]

# one kernel-log line in each format xid.py reads (its module docstring), message appended
PREFIXES = {
    "dmesg": "[ 1843.30814%d] ",
    "dmesg -T": "[Fri Dec  4 10:00:0%d 2026] ",
    "dmesg --time-format=iso": "2026-12-04T10:00:0%d,308145+00:00 ",
    "dmesg --decode": "kern  :err   : 2026-12-04T10:00:0%d,308145+00:00 ",
    "/dev/kmsg": "3,81%d,1843308145,-;",
    "journalctl -k -o short-iso": "2026-12-04T10:00:0%d+0000 gpu01 kernel: ",
    "syslog": "Dec  4 10:00:0%d gpu01 kernel: ",
}
JOURNAL = "2026-12-04T10:00:00+0000 gpu01 kernel: "

FORMS = {"%s, one line each" % name: "".join(prefix % i + p + "\n" for i, p in enumerate(PIECES))
         for name, prefix in PREFIXES.items()}
FORMS.update({
    # journalctl prints one entry's later lines indented under its first (NVSentinel's vector)
    "one journal entry, embedded newlines": JOURNAL + ("\n" + " " * len(JOURNAL)).join(PIECES) + "\n",
    "one journal entry on one line": JOURNAL + " ".join(PIECES) + "\n",
    # /dev/kmsg escapes a record's newlines
    "one /dev/kmsg record": "3,812,1843308145,-;" + "\\x0a".join(PIECES) + "\\x0a\n",
    "the single-line variant": "[ 1843.308145] NVRM: The NVIDIA GPU 0000:ba:00.0 fallen off the bus and is "
                               "not responding to commands.\n",
    "no PCI domain": "[ 1843.308145] NVRM: GPU ba:00.0: GPU has fallen off the bus.\n",
})


def summary(findings):
    return [(f["code"], f["level"], f["action"], f.get("gpus")) for f in findings]


@pytest.mark.parametrize("text", list(FORMS.values()), ids=list(FORMS))
def test_every_form_is_xid_79_on_its_gpu(text):
    events = xid.parse_kernel_log(text)
    assert [(e["code"], e["pci"], e.get("derived"), e["line"]) for e in events] == [(79, "0000:ba:00", True, 1)]
    (f,) = xid.classify(events, INVENTORY)
    assert summary([f]) == [("xid-79", "fail", "reboot", [6])]
    assert "fallen off the bus" in f["message"] and "\\x0a" not in f["message"]


def run_node_check(tmp_path, text):
    log = tmp_path / "kern.log"
    log.write_text(text, encoding="utf-8")
    return nc.run(nc.build_parser().parse_args(["--kernel-log-file", str(log), "--only", "xid", "--no-dcgm"]))


@pytest.mark.parametrize("name", ["dmesg, one line each", "one journal entry, embedded newlines",
                                  "one /dev/kmsg record", "the single-line variant", "no PCI domain"])
def test_node_check_fails_the_node_with_a_reboot(tool_dir, tmp_path, name):  # noqa: F811
    r = run_node_check(tmp_path, FORMS[name])
    assert summary(r["findings"]) == [("xid-79", "fail", "reboot", [6])]
    assert r["data"]["worst_action"] == "reboot" and r["data"]["checks"]["xid"]["status"] == "fail"
    assert r["summary"].startswith("reboot: Xid 79 (GPU has fallen off the bus) on GPU 6: 1 event")


def test_a_domainless_address_is_domain_0000():
    (e,) = xid.parse_kernel_log("NVRM: GPU 18:00.0: GPU has fallen off the bus.\n")
    assert e["pci"] == "0000:18:00"
    assert xid.pci_key("18:00.0") == xid.pci_key("00000000:18:00.0") == (0, 0x18, 0)
    assert xid.pci_key("18") is None and xid.pci_key("x:y") is None


def test_the_message_closes_within_four_lines_of_its_first():
    head = "[ 1.0] " + PIECES[0] + "\n"
    close = "[ 1.0] " + PIECES[2] + "\n"
    filler = "[ 1.0] NVRM: (PCI ID: 10de:2335) installed in this system has\n"
    at_4 = head + filler * 3 + close                # the closing line 4 lines after the first
    at_5 = head + filler * 4 + close
    assert [(e["code"], e["detail_lines"]) for e in xid.parse_kernel_log(at_4)] == [(79, 4)]
    assert xid.parse_kernel_log(at_5) == []
    assert xid.parse_kernel_log(head) == []         # no closing line: no event
    assert xid.parse_kernel_log("[ 1.0] NVRM: The NVIDIA GPU invalid-bdf.0\n" + close) == []


def test_an_xid_79_line_near_it_is_the_same_event():
    """Before it (the driver's words are detail of the Xid) or after it (the Xid line replaces
    the derived event): one Xid 79 event, not derived, either way."""
    xid_line = ("[ 1.0] NVRM: Xid (PCI:0000:ba:00): 79, pid='<unknown>', name=<unknown>, "
                "GPU has fallen off the bus.\n")
    message = FORMS["dmesg, one line each"]
    for text in (xid_line + message, message + xid_line):
        events = xid.parse_kernel_log(text)
        assert [(e["code"], e["pci"], e.get("derived")) for e in events] == [(79, "0000:ba:00", None)]
        assert events[0]["detail_lines"] == 3
    far = message + "[ 2.0] NVRM: something else\n" * 20 + xid_line
    assert [e.get("derived") for e in xid.parse_kernel_log(far)] == [True, None]


def test_another_gpus_xid_79_is_its_own_event():
    text = FORMS["dmesg, one line each"] + "[ 2.0] NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"
    (f,) = xid.classify(xid.parse_kernel_log(text), INVENTORY)
    assert summary([f]) == [("xid-79", "fail", "reboot", [0, 6])]


@pytest.mark.parametrize("name", ["dmesg, one line each", "one /dev/kmsg record", "no PCI domain"])
def test_gpu_status_reads_the_same_forms(name):
    """gpu-status classifies its kernel log through xid.py: no reader of its own to teach."""
    (x,) = gs.scan_xids(FORMS[name], INVENTORY)
    assert (x["xid"], x["fatal"], x["action"], x["count"], x["pci"]) == (79, True, "reboot", 1, ["0000:ba:00"])
    assert "0000:ba:00" in x["first"] or "ba:00.0" in x["first"]


def test_through_mldiag_on_the_local_target(tool_dir, tmp_path):  # noqa: F811
    """The whole path: mldiag ships node_check.py with xid.py and its catalog to the target
    (``local``), and the findings pass the client's validation gate into --json as they are."""
    from tests.programs import mldiag
    log = tmp_path / "kern.log"
    log.write_text(FORMS["one journal entry, embedded newlines"] + FORMS["no PCI domain"].replace("ba:", "18:"),
                   encoding="utf-8")
    proc = mldiag("node-check", "-H", "local", "--kernel-log-file", str(log), "--no-dcgm", "--json",
                  env={"PATH": str(tool_dir)})
    assert proc.returncode == 2, proc.stderr
    (result,) = json.loads(proc.stdout)
    xids = [f for f in result["findings"] if f["check"] == "xid"]
    assert summary(xids) == [("xid-79", "fail", "reboot", [0, 6])]
    assert result["status"] == "fail"


def test_a_log_of_such_pairs_parses_in_linear_time():
    """A hostile (or sick) log of message-then-Xid-79 pairs: each pair folds into one event in
    constant time (a list removal per pair was quadratic: 10 s for 30,000 pairs)."""
    import time

    def seconds(pairs):
        text = "".join("NVRM: The NVIDIA GPU 0000:%02x:00.0\n%s\nNVRM: Xid (PCI:0000:%02x:00): 79, x\n"
                       % (i % 256, PIECES[2], i % 256) for i in range(pairs))
        best = None
        for _ in range(2):
            t0 = time.perf_counter()
            assert len(xid.parse_kernel_log(text)) == pairs
            best = min(best or 1e9, time.perf_counter() - t0)
        return best

    assert seconds(20000) / seconds(5000) < 10          # linear: about 4; quadratic: about 16
