"""NVLink5 Xids (144-150) decided by their own line (issue 29): the Fatal/Nonfatal word and the
errorStatus NVIDIA's "XID 144-150 Decode" sheet resets the GPU for (xid.py's docstring, "NVLink5
Xids"); and the action for an Xid the catalog does not know. Lines as the driver prints them,
taken from GPUd's and NVSentinel's tests (tests/fixtures/xid/peers/); through xid.py, node-check
on the fake nvidia-smi (GPU 0 is at 00000000:18:00.0) and gpu-status.
"""
import pytest

from tests.programs import load_script
from tests.unit.test_xid_fallen import INVENTORY, run_node_check, summary

xid = load_script("xid.py", "mldiag_test_xid_nvlink5")
gs = load_script("gpu_status.py", "mldiag_test_xid_nvlink5_gpu_status")

NETIR_FATAL = ("[171167.620236] NVRM: Xid (PCI:0000:18:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
               "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")
BER_NONFATAL = ("[171167.620300] NVRM: Xid (PCI:0000:18:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 03 "
                "(0x00086226 0x00000001 0x00000000 0x00000000 0x00000000 0x00000000)")
# the line says Nonfatal; the sheet: RLW_REMAP errorStatus 0x40 is Fatal, RESET_GPU
REMAP_0X40 = ("[171168.0] NVRM: Xid (PCI:0000:18:00): 145, RLW_REMAP Nonfatal XC1 i0 Link 10 "
              "(0x00000082 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)")
REMAP_0X100 = ("[171168.1] NVRM: Xid (PCI:0000:18:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 "
               "(0x00000004 0x00000100 0x00000000 0x00000000)")
WITH_PID = ("[171168.2] NVRM: Xid (PCI:0018:01:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal "
            "XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)")


def one(line):
    (f,) = xid.classify(xid.parse_kernel_log(line + "\n"), INVENTORY)
    return f


def test_the_decode_fields_are_read():
    (e,) = xid.parse_kernel_log(NETIR_FATAL + "\n")
    assert e["nvlink"] == {"unit": "NETIR_LINK_EVT", "severity": "fatal", "link": 1, "intrinfo": 0x021425c6,
                           "err_status": 0}
    (e,) = xid.parse_kernel_log(WITH_PID + "\n")
    assert e["nvlink"] == {"unit": "RLW_RXPIPE", "severity": "non-fatal", "link": 13, "intrinfo": 0x0409a0c2,
                           "err_status": 8}
    (e,) = xid.parse_kernel_log("NVRM: Xid (PCI:0000:04:00): 149, NETIR Fatal XC0 i0 Link -1 "
                                "(0x000fe406 0x00000000 0x0)\n")
    assert (e["nvlink"]["unit"], e["nvlink"]["link"]) == ("NETIR", -1)
    (e,) = xid.parse_kernel_log("NVRM: Xid (PCI:0000:04:00): 146, TLW_RX/TLW_RX_PIPE0 Fatal XC0 i0 Link 00 "
                                "(0x0000000a 0x00000004 0x00000000 0x00000000)\n")
    assert e["nvlink"]["unit"] == "TLW_RX/TLW_RX_PIPE0"
    # cut short before errorStatus (GPUd's ShortMatch): no decode fields, the catalog's action
    (e,) = xid.parse_kernel_log("NVRM: Xid (PCI:0018:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406\n")
    assert "nvlink" not in e and xid.event_action(e) == "reset-gpu"


@pytest.mark.parametrize("line,code,level,action", [
    (NETIR_FATAL, "xid-149", "fail", "reset-gpu"),           # the line says Fatal
    (BER_NONFATAL, "xid-149", "warn", "monitor"),            # Nonfatal, the sheet: IGNORE
    (REMAP_0X40, "xid-145", "fail", "reset-gpu"),            # Nonfatal, the sheet: RESET_GPU for 0x40
    (REMAP_0X100, "xid-145", "warn", "monitor"),             # Nonfatal, the sheet: IGNORE for 0x100
    (WITH_PID, "xid-145", "warn", "monitor"),
])
def test_the_line_and_its_error_status_decide(line, code, level, action):
    f = one(line)
    assert (f["code"], f["level"], f["action"]) == (code, level, action)


def test_a_reset_from_the_sheet_says_why():
    why = "NVIDIA's XID 144-150 Decode resets the GPU for RLW_REMAP errorStatus 0x00000040"
    assert why in one(REMAP_0X40)["message"]
    assert "Decode resets" not in one(NETIR_FATAL)["message"]        # the line's own word


def test_one_fatal_line_among_nonfatal_ones_resets_that_gpu():
    text = "\n".join([BER_NONFATAL] * 5 + [NETIR_FATAL, BER_NONFATAL]) + "\n"
    assert summary(xid.classify(xid.parse_kernel_log(text), INVENTORY)) == [("xid-149", "fail", "reset-gpu", [0])]
    other = BER_NONFATAL.replace("0000:18:00", "0000:2a:00")
    text = "\n".join([NETIR_FATAL, other]) + "\n"
    assert summary(xid.classify(xid.parse_kernel_log(text), INVENTORY)) == [
        ("xid-149", "fail", "reset-gpu", [0]), ("xid-149", "warn", "monitor", [1])]


def test_node_check_on_nvlink5_lines(tool_dir, tmp_path):  # noqa: F811
    r = run_node_check(tmp_path, "\n".join([BER_NONFATAL, REMAP_0X40]) + "\n")
    assert summary(r["findings"]) == [("xid-145", "fail", "reset-gpu", [0]), ("xid-149", "warn", "monitor", [0])]
    assert r["data"]["worst_action"] == "reset-gpu"
    r = run_node_check(tmp_path, BER_NONFATAL + "\n")
    assert summary(r["findings"]) == [("xid-149", "warn", "monitor", [0])]
    assert r["data"]["worst_action"] == "monitor"


def test_gpu_status_grades_nvlink5_the_same():
    xids = gs.scan_xids("\n".join([BER_NONFATAL, REMAP_0X40]) + "\n", INVENTORY)
    assert [(x["xid"], x["fatal"], x["action"]) for x in xids] == [(145, True, "reset-gpu"), (149, False, "monitor")]


def test_an_xid_the_catalog_does_not_know_is_a_warning_that_says_so():
    f = one("[ 5.0] NVRM: Xid (PCI:0000:18:00): 999, pid=1234, name=test")
    assert (f["code"], f["level"], f["action"], f["gpus"]) == ("xid-999", "warn", "monitor", [0])
    assert f["message"].startswith("Xid 999 (not in the catalog) on GPU 0: 1 event")
    assert f["hint"] == xid.UNKNOWN_XID_HINT and "newer than mldiag's Xid catalog" in f["hint"]
    assert xid.UNKNOWN_XID_ACTION == "monitor"
    assert one("[ 5.0] NVRM: Xid (PCI:0000:18:00): 63, row remap")["hint"] == xid.HINTS["monitor"]


def test_scan_log_grades_nvlink5_the_same(tmp_path):
    """scan-log hands xid.py one line at a time (event_action on the line's text)."""
    sl = load_script("scan_log.py", "mldiag_test_xid_nvlink5_scan_log")
    buckets = sl.classify([REMAP_0X40, BER_NONFATAL, NETIR_FATAL])
    graded = dict((kind, [(e["xid"], e["action"]) for e in buckets[kind].entries()])
                  for kind in ("xid-fatal", "xid"))
    assert graded == {"xid-fatal": [(145, "reset-gpu"), (149, "reset-gpu")], "xid": [(149, "monitor")]}
