"""One fatal-Xid list, pinned, for both remote scripts that read kernel logs.

gpu_status.py and scan_log.py are standalone files (they cannot import each other), so each keeps
its own ``FATAL_XIDS``; this test keeps them equal to the pinned list, and the pinned list equal
to what NVIDIA's Xid catalog says (tests/fixtures/xid: the Xids whose immediate action resets the
GPU or restarts the node or VM; 74, NVLink, whose decode workflow mostly ends in a reset).
Before this test the two scripts disagreed on Xid 61, 62 and 140.
"""
import argparse
import json
from pathlib import Path

import pytest

from tests.programs import load_script

ROOT = Path(__file__).resolve().parents[2]
CATALOG = ROOT / "tests" / "fixtures" / "xid" / "immediate-actions.json"

FATAL_XIDS = [46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 151, 155, 156, 158]
# NVIDIA's "Resolution Bucket (Immediate Action)" values that take the GPU or the machine down.
RESET_OR_RESTART = {"RESET_GPU", "RESTART_BM", "RESTART_VM", "WORKFLOW_XID_48"}
ALSO_FATAL = {74}  # WORKFLOW_NVLINK_ERR


def _load(name):
    return load_script(name + ".py", "mldiag_test_xid_" + name)


def catalog():
    return {e["xid"]: e for e in json.loads(CATALOG.read_text())["xids"]}


def test_the_pinned_list_is_what_nvidias_catalog_says():
    xids = catalog()
    assert sorted(xids) == list(range(1, 173))
    derived = sorted(x for x, e in xids.items() if e["nvidia_immediate_action"] in RESET_OR_RESTART)
    assert sorted(set(derived) | ALSO_FATAL) == FATAL_XIDS
    assert xids[74]["nvidia_immediate_action"] == "WORKFLOW_NVLINK_ERR"


@pytest.mark.parametrize("script", ["gpu_status", "scan_log"])
def test_each_script_keeps_the_pinned_list(script):
    assert sorted(_load(script).FATAL_XIDS) == FATAL_XIDS


def test_the_xids_they_once_disagreed_on(tmp_path):
    """61 (PMU breakpoint: contact support, not on data-centre GPUs) is not fatal; 62 (PMU halt)
    and 140 (unrecoverable ECC escape) reset the GPU. 63, 92 (ignore) and 94 (restart the
    application) are warnings."""
    xids = catalog()
    assert [xids[x]["nvidia_immediate_action"] for x in (61, 62, 140)] == ["CONTACT_SUPPORT", "RESET_GPU",
                                                                            "RESET_GPU"]
    gs, sl = _load("gpu_status"), _load("scan_log")
    for xid, fatal in ((61, False), (62, True), (140, True), (63, False), (92, False), (94, False)):
        line = "[ 1.0] NVRM: Xid (PCI:0000:3b:00): %d, pid=1, name=python, x\n" % xid
        (found,) = gs.scan_xids(line)
        assert found["fatal"] is fatal, xid
        log = tmp_path / ("xid%d.log" % xid)
        log.write_text(line)
        r = sl.run(argparse.Namespace(path=str(log), lines=100))
        assert [(f["level"], f["code"]) for f in r["findings"]] == \
            [("fail", "xid-fatal") if fatal else ("warn", "xid")], xid
