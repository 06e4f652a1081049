"""xid.py against the peers' own test vectors: GPUd's Xid matcher and NVIDIA NVSentinel's Xid
parser and fallen-off-the-bus handler (tests/fixtures/xid/peers/: the lines, the code and PCI
address each peer expects, what it says of the line, licences and commits in its README).

Every vector goes through the real parser and classifier. Where the peer names a level or an
action, mldiag must agree with it, unless the vector says why mldiag differs by design; and a
vector that says so must really differ (a stale reason fails too).
"""
import json
from pathlib import Path

import pytest

from tests.programs import load_script

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "tests" / "fixtures" / "xid" / "peers"
VECTORS = json.loads((PEERS / "vectors.json").read_text(encoding="utf-8"))["vectors"]

xid = load_script("xid.py", "mldiag_test_xid_peers")

# what a peer's word means in mldiag's terms
GPUD_LEVEL = {"Info": "info", "Warning": "warn", "Critical": "fail", "Fatal": "fail"}
NVSENTINEL_ACTIONS = {"NONE": {"none", "monitor", "app"}, "COMPONENT_RESET": {"reset-gpu"},
                      "RESTART_BM": {"reboot"}, "CONTACT_SUPPORT": {"rma"}}


def vector_id(v):
    return "%s:%s:%s" % (v["peer"], v["test"], v["case"] or v.get("line"))


def agrees_with_peer(v, finding):
    """Whether mldiag's finding says what the peer says of the line; None if the peer says
    nothing about level or action (only the code and PCI address)."""
    said = v["peer_says"]
    if "event_type" in said:
        return GPUD_LEVEL[said["event_type"]] == finding["level"]
    if "action" in said:
        return finding["action"] in NVSENTINEL_ACTIONS[said["action"]]
    if said.get("match", 0) is None:            # GPUd's Match: nil, NVSentinel: no event
        return finding is None
    return None


@pytest.mark.parametrize("v", VECTORS, ids=vector_id)
def test_every_peer_vector(v):
    events = [e for e in xid.parse_kernel_log(v["text"] + "\n") if e["kind"] == "xid"]
    if v["code"] is None:
        assert events == []
        assert v["mldiag"] is None
        return
    assert [e["code"] for e in events] == [v["code"]]
    if v["pci"]:
        assert xid.pci_key(events[0]["pci"]) == xid.pci_key(v["pci"])
    (finding,) = xid.classify(events, [])
    assert (finding["level"], finding["action"]) == (v["mldiag"]["level"], v["mldiag"]["action"])
    agrees = agrees_with_peer(v, finding)
    if "differs" in v:
        assert agrees is False, "listed as a disagreement but mldiag agrees with %s" % v["peer"]
    else:
        assert agrees in (True, None)


def test_the_vectors_cover_both_peers_and_every_form():
    """A guard on the data: both peers, every fallen-off-the-bus form and each NVLink5 Xid."""
    by_peer = {}
    for v in VECTORS:
        by_peer.setdefault(v["peer"], []).append(v)
    assert len(by_peer["gpud"]) >= 90 and len(by_peer["nvsentinel"]) >= 25
    texts = [v["text"] for v in VECTORS if v["code"] == 79]
    assert any("The NVIDIA GPU" in t and "\n" in t for t in texts)            # multi-line
    assert any(t.startswith("NVRM: GPU 18:00.0:") for t in texts)            # no PCI domain
    assert {v["code"] for v in VECTORS if v["code"] and 144 <= v["code"] <= 150} == set(range(144, 151))
    assert sum(1 for v in VECTORS if "differs" in v) == 10


def test_the_licences_are_kept():
    notice = (PEERS / "NOTICE").read_text(encoding="utf-8")
    assert "Copyright 2024 Lepton AI Inc" in notice
    assert "Copyright (c) 2025, NVIDIA CORPORATION" in notice
    assert "Apache License" in notice and "Version 2.0" in notice
    readme = (PEERS / "README.md").read_text(encoding="utf-8")
    for v in VECTORS:
        assert v["commit"] in readme and v["file"] in readme
