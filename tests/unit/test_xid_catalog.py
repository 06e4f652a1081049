"""One Xid catalog, pinned to its source, for node-check, gpu-status and scan-log.

diagnostics/scripts/xid_catalog.json ships beside xid.py to every target; the three scripts read
it through xid.py (no second copy). Here: the shipped file is what make_xid_catalog.py makes
from the fact table tests/fixtures/xid/catalog.json (NVIDIA's Xid catalog, the Fabric Manager
SXid table), every row keeps its source's mnemonic and NVIDIA bucket, and the action rules of
xid.py's docstring hold, checked against hand-written rows.
"""
import argparse
import json
from pathlib import Path

import pytest

from tests.programs import load_module, load_script

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "diagnostics" / "scripts" / "xid_catalog.json"
SOURCE = ROOT / "tests" / "fixtures" / "xid" / "catalog.json"
DECODE = ROOT / "tests" / "fixtures" / "xid" / "nvlink5-decode.json"
MAKER = ROOT / "tests" / "fixtures" / "xid" / "make_xid_catalog.py"

xid = load_script("xid.py", "mldiag_test_xid_catalog")


def source():
    return json.loads(SOURCE.read_text(encoding="utf-8"))


def decode():
    return json.loads(DECODE.read_text(encoding="utf-8"))


def shipped():
    return xid.load_catalog(str(SHIPPED))


def test_the_shipped_catalog_is_what_the_maker_makes_and_small():
    maker = load_module(MAKER, "mldiag_test_make_xid_catalog")
    assert SHIPPED.read_text(encoding="utf-8") == maker.dump(maker.build(source(), decode()))
    assert SHIPPED.stat().st_size < 40 * 1024
    raw = json.loads(SHIPPED.read_text(encoding="utf-8"))
    assert [s["licence"] for s in raw["sources"]] == ["Apache-2.0", "Apache-2.0 (NOTICE: Copyright 2024 Lepton AI Inc)",
                                                      "MIT", "Apache-2.0 (NOTICE: Copyright 2024 Lepton AI Inc)"]


def test_every_row_keeps_its_source():
    cat, src = shipped(), source()
    assert sorted(cat["xids"]) == list(range(1, 173))
    for row in src["xids"]:
        mine = cat["xids"][row["xid"]]
        assert mine["mnemonic"] == row["mnemonic"]
        assert mine["nvidia_action"] == row["nvidia_immediate_action"]
        assert row["description"].startswith(mine["description"].rstrip("\u2026"))
        assert mine["level"] == xid.LEVEL_OF[mine["action"]]
    assert sorted(cat["sxids"]) == sorted(s["sxid"] for s in src["sxids"])
    for row in src["sxids"]:
        mine = cat["sxids"][row["sxid"]]
        assert mine["name"] == row["name"]
        assert mine["fatal"] == (row["potential_fatal"] or row["always_fatal"])
        assert mine["action"] == ("reboot" if "RebootSystem" in row["gpud_repair_actions"] else "monitor")


# Hand-written: (Xid, NVIDIA's immediate action as the sheet says, our action).
ROWS = [
    (13, "RESTART_APP", "app"), (31, "RESTART_APP", "app"), (43, "IGNORE", "app"),
    (45, "WORKFLOW_XID_45", "app"), (94, "RESTART_APP", "app"), (8, "RESTART_APP", "app"),
    (63, "IGNORE", "monitor"), (92, "IGNORE", "monitor"), (14, "IGNORE", "none"), (106, "IGNORE", "none"),
    (48, "WORKFLOW_XID_48", "reset-gpu"), (62, "RESET_GPU", "reset-gpu"), (64, "RESET_GPU", "reset-gpu"),
    (95, "RESET_GPU", "reset-gpu"), (119, "RESET_GPU", "reset-gpu"), (120, "RESET_GPU", "reset-gpu"),
    (140, "RESET_GPU", "reset-gpu"), (74, "WORKFLOW_NVLINK_ERR", "reset-gpu"),
    (145, "WORKFLOW_NVLINK5_ERR", "reset-gpu"),
    (79, "RESTART_BM", "reboot"), (151, "RESTART_VM", "reboot"),
    (54, "CHECK_MECHANICALS", "drain"), (142, "CONTACT_SUPPORT", "rma"),
    (61, "CONTACT_SUPPORT", "monitor"),          # "Unused": for no data-centre GPU
    (154, "XID_154", "monitor"),                 # the line says the action (test_xid)
    (159, "CHECK_UVM", "monitor"), (78, "UPDATE_SWFW", "monitor"),
    (162, None, "none"), (165, None, "monitor"), (167, None, "reboot"), (169, None, "reset-gpu"),
    (171, None, "reset-gpu"),
]


@pytest.mark.parametrize("code,bucket,action", ROWS)
def test_rows(code, bucket, action):
    row = shipped()["xids"][code]
    assert (row["nvidia_action"], row["action"]) == (bucket, action)


def test_the_fail_set():
    """The Xids that fail a node (reset-gpu or worse): the old FATAL_XIDS of gpu_status/scan_log
    (RESET_GPU, RESTART_BM/VM, 48, 74) plus 54 (check mechanicals), 142 (contact support),
    144-150 (NVLink5, fatal unless the line says Nonfatal) and 167-172 (ours, no bucket)."""
    fail = sorted(x for x, r in shipped()["xids"].items() if r["level"] == "fail")
    assert fail == [46, 48, 54, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 142, 143, 144, 145,
                    146, 147, 148, 149, 150, 151, 155, 156, 158, 167, 168, 169, 171, 172]


def test_sxid_rows():
    s = shipped()["sxids"]
    assert (s[20034]["name"], s[20034]["fatal"], s[20034]["action"]) == ("LTSSM Fault Up", True, "reboot")
    assert (s[11012]["name"], s[11012]["fatal"], s[11012]["action"]) == ("Single bit ECC errors", False, "monitor")
    assert (s[22003]["always_fatal"], s[22003]["action"]) == (True, "reboot")


def test_the_three_scripts_agree(tmp_path):
    """gpu-status and scan-log name and grade an Xid as node-check does, from the same catalog."""
    gs, sl = load_script("gpu_status.py", "mldiag_test_cat_gs"), load_script("scan_log.py", "mldiag_test_cat_sl")
    for code, fatal in ((61, False), (62, True), (140, True), (63, False), (92, False), (94, False), (79, True)):
        line = "[ 1.0] NVRM: Xid (PCI:0000:3b:00): %d, pid=1, name=python, x\n" % code
        (found,) = gs.scan_xids(line)
        row = shipped()["xids"][code]
        assert (found["fatal"], found["action"]) == (fatal, row["action"]), code
        log = tmp_path / ("xid%d.log" % code)
        log.write_text(line)
        r = sl.run(argparse.Namespace(path=str(log), lines=100))
        assert [(f["level"], f["code"], f["action"]) for f in r["findings"]] == \
            [("fail", "xid-fatal", row["action"]) if fatal else ("warn", "xid", row["action"])], code


def test_the_nvlink5_decode_sheet_rows():
    """94 rows of NVIDIA's "XID 144-150 Decode" (tests/fixtures/xid/nvlink5-decode.json); the
    catalog keeps the errorStatus values whose immediate action is RESET_GPU, by unit and by
    each of a unit's names. Expected sets read off the sheet by hand."""
    rows = decode()["rows"]
    assert len(rows) == 94 and {r["xid"] for r in rows} == {144, 145, 146, 147, 148, 149, 150}
    resets = shipped()["nvlink5_reset"]
    assert resets[(144, "SAW_MVB")] == {0x2, 0x10}
    assert resets[(145, "RLW_REMAP")] == {0x40, 0x80}          # 0x1-0x20: XID_154_EVAL
    assert resets[(145, "RLW_SRC_TRACK")] == {0x1, 0x10, 0x20}
    assert resets[(146, "TLW_RX")] == resets[(146, "TLW_RX_PIPE0")] == {0x4}
    assert resets[(149, "NETIR_LINK_EVT")] == resets[(149, "NETIR")] == {0x0}
    assert resets[(149, "NETIR_MFDE_EVENT")] == {0x1, 0x4, 0x5, 0x7}
    assert resets[(150, "MSE_WATCHDOG")] == {0x0}
    assert (145, "RLW_RXPIPE") not in resets and (147, "TREX") not in resets   # IGNORE only
    assert (149, "NETIR_BER_EVENT") not in resets and (148, "NVLPW") not in resets
