"""node-check's PCIe check (diagnostics/scripts/pcie.py) on recorded sysfs dumps.

Fixtures (tests/fixtures/pcie/, README.md there): GCM's DGX A100 sysfs dumps, healthy and with
one HCA at 8 GT/s instead of 16 (``current_link_speed``/``current_link_width`` of every device),
and GCM's manifest of that machine (per PCI address: gpu/ib/net, expected speed and width).
The dumps hold no ``vendor``/``class``/``max_link_*`` files; ``dgx_a100_tree`` adds them from
the manifest (GPU -> NVIDIA 3D controller, ib -> Mellanox InfiniBand, net -> Mellanox
Ethernet; the manifest's expected speed/width as the maxima) so that ``check()`` reads a whole
tree with the recorded current links. AER files are written by the tests that need them, in the
format of the kernel's ABI document (sysfs-bus-pci-devices-aer_stats).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.programs import load_script
from tests.unit.test_ib import materialise, no_tools
from tests.programs import script_imports

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "diagnostics" / "scripts"
FIX = REPO / "tests" / "fixtures" / "pcie"

# Loaded by path, never by putting the scripts dir on sys.path: a script named like an
# installed package (as fabric.py once was) would shadow it for every later test.
pcie = load_script("pcie.py", "mldiag_test_pcie")

MANIFEST = json.loads((FIX / "gcm-DGX_A100.manifest.json").read_text())
CLASSES = {"gpu": ("0x10de", "0x030200"), "ib": ("0x15b3", "0x020700"),
           "net": ("0x15b3", "0x020000")}
GPU_BDFS = ["0000:07:00.0", "0000:0f:00.0", "0000:47:00.0", "0000:4e:00.0", "0000:87:00.0",
            "0000:90:00.0", "0000:b7:00.0", "0000:bd:00.0"]
# node_check's inventory for that machine: nvidia-smi's address form
GPUS = [{"index": i, "pci": "0000" + bdf.upper(), "name": "NVIDIA A100-SXM4-80GB"}
        for i, bdf in enumerate(GPU_BDFS)]


def dgx_a100_tree(dump, root):
    root = materialise(FIX / dump, root)
    for bdf, entry in MANIFEST["pci"].items():
        if entry["type"] not in CLASSES:
            continue
        d = root / "bus" / "pci" / "devices" / bdf
        assert (d / "current_link_speed").is_file(), bdf   # the dump has every one of them
        vendor, cls = CLASSES[entry["type"]]
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
        (d / "max_link_speed").write_text(entry["link_speed"][1] + "\n")
        (d / "max_link_width").write_text(entry["link_width"] + "\n")
    return root


def dev(root, bdf):
    return root / "bus" / "pci" / "devices" / bdf


def run(root, expect=None, gpus=GPUS, **options):
    return pcie.check(expect or {}, no_tools, sys_root=str(root), gpus=gpus,
                      kernel_log={"source": None, "text": "", "error": None}, **options)


def summary(result):
    return [(f["code"], f["level"], f["action"], f.get("gpus"), f.get("ports"))
            for f in result["findings"]]


# ---------------------------------------------------------------- parsers

def test_parsers():
    assert pcie.parse_speed("32.0 GT/s PCIe") == 32.0
    assert pcie.parse_speed("16 GT/s") == 16.0
    assert pcie.parse_speed("Unknown") is None
    assert [pcie.speed_gen(x) for x in (2.5, 5, 8, 16, 32, 64, None, 3.3)] == \
        [1, 2, 3, 4, 5, 6, None, None]
    assert pcie.parse_width("16") == 16 and pcie.parse_width("x8") == 8
    assert pcie.parse_width("") is None
    assert pcie.normalise_bdf("00000000:18:00.0") == "0000:18:00.0"
    assert pcie.normalise_bdf("00000000:BA:00.0") == "0000:ba:00.0"
    assert pcie.normalise_bdf("0000:ba:00.1") == "0000:ba:00.1"
    assert pcie.normalise_bdf("garbage") is None


AER_COR_NEW = "RxErr 0\nBadTLP 3\nBadDLLP 120\nRollover 0\nTimeout 27\nNonFatalErr 0\n" \
              "CorrIntErr 0\nHeaderOF 0\nTOTAL_ERR_COR 150\n"
# the ABI document's sample (kernels before the short names)
AER_COR_OLD = "Receiver Error 2\nBad TLP 0\nBad DLLP 0\nRELAY_NUM Rollover 0\n" \
              "Replay Timer Timeout 0\nAdvisory Non-Fatal 0\nCorrected Internal Error 0\n" \
              "Header Log Overflow 0\nTOTAL_ERR_COR 2\n"
AER_ZERO_FATAL = "Undefined 0\nDLP 0\nSDES 0\nTLP 0\nFCP 0\nCmpltTO 0\nCmpltAbrt 0\n" \
                 "UnxCmplt 0\nRxOF 0\nMalfTLP 0\nECRC 0\nUnsupReq 0\nACSViol 0\n" \
                 "UncorrIntErr 0\nBlockedTLP 0\nAtomicOpBlocked 0\nTLPBlockedErr 0\n" \
                 "TOTAL_ERR_FATAL 0\n"


def test_parse_aer_both_formats():
    counts, total = pcie.parse_aer(AER_COR_NEW)
    assert total == 150 and counts["BadDLLP"] == 120 and counts["RxErr"] == 0
    counts, total = pcie.parse_aer(AER_COR_OLD)
    assert total == 2 and counts["Receiver Error"] == 2 and counts["RELAY_NUM Rollover"] == 0
    assert pcie.parse_aer(AER_ZERO_FATAL)[1] == 0
    assert pcie.parse_aer(None) == (None, None)
    assert pcie.parse_aer("RxErr 4\nBadTLP 1\n") == ({"RxErr": 4, "BadTLP": 1}, 5)


# ---------------------------------------------------------------- GCM's DGX A100

def test_dgx_a100_healthy(tmp_path):
    root = dgx_a100_tree("gcm-compute_samsung980pro.json", tmp_path)
    devices = pcie.read_devices(str(root))
    kinds = sorted((d["kind"], d["link"]) for d in devices)
    assert kinds.count(("gpu", None)) == 8
    assert kinds.count(("nic", "InfiniBand")) == 8 and kinds.count(("nic", "Ethernet")) == 4
    r = run(root)
    assert r["findings"] == []
    f = r["facts"]
    for i in range(8):
        assert (f["pcie.gpu%d.width" % i], f["pcie.gpu%d.max_width" % i],
                f["pcie.gpu%d.max_gen" % i]) == (16, 16, 4)
        assert "pcie.gpu%d.gen" % i not in f          # idle: the current gen is no fact
    assert (f["pcie.0000:8d:00.0.width"], f["pcie.0000:8d:00.0.gen"],
            f["pcie.0000:8d:00.0.max_gen"]) == (16, 4, 4)
    assert not any(k.startswith("pcie.0000:c4") for k in f)   # NVSwitches are not checked
    assert all(isinstance(v, (int, str, float, bool, type(None))) for v in f.values())


def test_dgx_a100_hca_downgraded_to_gen3(tmp_path):
    root = dgx_a100_tree("gcm-compute_samsung980pro-downgraded.json", tmp_path)
    r = run(root)
    assert summary(r) == [("pcie-gen-low", "warn", "monitor", None, ["0000:8d:00.0"])]
    assert r["findings"][0]["message"] == "0000:8d:00.0: PCIe gen 3 (8 GT/s), expected gen 4"
    assert r["facts"]["pcie.0000:8d:00.0.gen"] == 3


def test_derived_gpu_links_narrow(tmp_path):
    root = dgx_a100_tree("gcm-compute_samsung980pro.json", tmp_path)
    (dev(root, GPU_BDFS[3]) / "current_link_width").write_text("8\n")
    r = run(root)
    assert summary(r) == [("pcie-width-low", "fail", "reboot", [3], None)]
    f = r["findings"][0]
    assert f["message"] == "GPU 3: PCIe link x8, expected x16"
    assert "reseat" in f["hint"] and "drain" in f["hint"]
    assert r["facts"]["pcie.gpu3.width"] == 8
    (dev(root, GPU_BDFS[5]) / "current_link_width").write_text("8\n")
    (dev(root, "0000:e1:00.1") / "current_link_width").write_text("4\n")
    r = run(root)
    assert summary(r) == [("pcie-width-low", "fail", "reboot", [3, 5], None),
                          ("pcie-width-low", "warn", "monitor", None, ["0000:e1:00.1"])]
    assert r["findings"][0]["message"] == "GPUs 3,5: PCIe link x8, expected x16"


def test_derived_idle_gpus_downshifted_is_info_and_fails_only_under_load(tmp_path):
    root = dgx_a100_tree("gcm-compute_samsung980pro.json", tmp_path)
    for bdf in GPU_BDFS:
        (dev(root, bdf) / "current_link_speed").write_text("2.5 GT/s PCIe\n")
    r = run(root)
    assert summary(r) == [("pcie-gen-idle", "info", "none", list(range(8)), None)]
    assert r["findings"][0]["message"].startswith("GPUs 0-7: PCIe gen 1 of 4 (an idle GPU")
    r = run(root, under_load=True)
    assert summary(r) == [("pcie-gen-low", "fail", "reboot", list(range(8)), None)]
    assert r["findings"][0]["message"] == ("GPUs 0-7: PCIe gen 1 (2.5 GT/s), expected gen 4 "
                                           "under load")
    assert r["facts"]["pcie.gpu0.gen"] == 1


def test_gpus_not_in_the_inventory_are_named_by_address(tmp_path):
    root = dgx_a100_tree("gcm-compute_samsung980pro.json", tmp_path)
    (dev(root, GPU_BDFS[0]) / "current_link_width").write_text("8\n")
    r = run(root, gpus=[])
    assert summary(r) == [("pcie-width-low", "fail", "reboot", None, ["0000:07:00.0"])]
    assert r["findings"][0]["message"] == "GPU 0000:07:00.0: PCIe link x8, expected x16"
    assert r["facts"]["pcie.0000:07:00.0.width"] == 8
    assert not any(k.startswith("pcie.gpu") for k in r["facts"])


def test_expectations_and_model_when_sysfs_has_no_maxima(tmp_path):
    root = dgx_a100_tree("gcm-compute_samsung980pro.json", tmp_path)
    for bdf in GPU_BDFS:
        os.remove(str(dev(root, bdf) / "max_link_width"))
        os.remove(str(dev(root, bdf) / "max_link_speed"))
    r = run(root)
    assert r["findings"] == []
    assert (r["facts"]["pcie.gpu0.max_width"], r["facts"]["pcie.gpu0.max_gen"]) == (16, 4)
    (dev(root, GPU_BDFS[2]) / "current_link_width").write_text("8\n")
    assert summary(run(root)) == [("pcie-width-low", "fail", "reboot", [2], None)]
    # hosts.yaml's expectation wins over the model
    r = run(root, {"pcie_width": 8, "pcie_gen": 4})
    assert r["findings"] == []
    r = run(root, {"pcie_gen": 5}, under_load=True)
    assert summary(r) == [("pcie-gen-low", "fail", "reboot", list(range(8)), None),
                          ("pcie-width-low", "fail", "reboot", [2], None)]
    assert r["findings"][0]["message"] == ("GPUs 0-7: PCIe gen 4 (16 GT/s), expected gen 5 "
                                           "under load")


# ---------------------------------------------------------------- hand-made trees (AER, VF, down)

def _device(root, bdf, vendor, cls, speed="32.0 GT/s PCIe", width="16", parent=None):
    """A device dir in devices/pci0000:00/[PARENT/]BDF with bus/pci/devices/BDF -> it."""
    base = root / "devices" / "pci0000:00"
    d = (base / parent / bdf) if parent else (base / bdf)
    d.mkdir(parents=True)
    for name, value in (("vendor", vendor), ("class", cls), ("current_link_speed", speed),
                        ("max_link_speed", "32.0 GT/s PCIe"), ("current_link_width", width),
                        ("max_link_width", "16")):
        (d / name).write_text(value + "\n")
    link = root / "bus" / "pci" / "devices" / bdf
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(d, link.parent), link)
    return d


H100 = [{"index": 0, "pci": "00000000:18:00.0", "name": "NVIDIA H100 80GB HBM3"}]


def test_aer_counters_of_the_device_and_its_upstream_port(tmp_path):
    (tmp_path / "devices/pci0000:00/0000:17:01.0").mkdir(parents=True)
    gpu = _device(tmp_path, "0000:18:00.0", "0x10de", "0x030200", parent="0000:17:01.0")
    nic = _device(tmp_path, "0000:1a:00.0", "0x15b3", "0x020700")
    (gpu / "aer_dev_fatal").write_text(AER_ZERO_FATAL.replace("SDES 0", "SDES 1")
                                       .replace("TOTAL_ERR_FATAL 0", "TOTAL_ERR_FATAL 1"))
    (gpu / "aer_dev_nonfatal").write_text("Undefined 0\nCmpltTO 2\nTOTAL_ERR_NONFATAL 2\n")
    (gpu / "aer_dev_correctable").write_text(AER_COR_OLD)          # 2: below the threshold
    (tmp_path / "devices/pci0000:00/0000:17:01.0/aer_dev_correctable").write_text(AER_COR_NEW)
    (nic / "aer_dev_correctable").write_text(AER_COR_NEW)
    r = run(tmp_path, gpus=H100)
    assert summary(r) == [
        ("pcie-aer-fatal", "fail", "reboot", [0], None),
        ("pcie-aer-nonfatal", "warn", "monitor", [0], None),
        ("pcie-aer-correctable", "warn", "monitor", [0], None),
        ("pcie-aer-correctable", "warn", "monitor", None, ["0000:1a:00.0"]),
    ]
    msgs = [f["message"] for f in r["findings"]]
    assert msgs[0] == "GPU 0: 1 (SDES 1) fatal PCIe AER errors since boot"
    assert msgs[1] == "GPU 0: 2 (CmpltTO 2) non-fatal uncorrectable PCIe AER errors since boot"
    assert msgs[2] == ("GPU 0: 150 (BadDLLP 120, BadTLP 3, Timeout 27) correctable PCIe AER "
                       "errors since boot at its upstream port 0000:17:01.0 (threshold 100)")
    assert msgs[3].startswith("0000:1a:00.0: 150 (BadDLLP 120")
    assert not any("aer" in k for k in r["facts"])
    assert r["facts"]["pcie.gpu0.max_gen"] == 5


def test_link_down_vf_skipped_and_other_devices_ignored(tmp_path):
    _device(tmp_path, "0000:18:00.0", "0x10de", "0x030200", speed="Unknown", width="0")
    vf = _device(tmp_path, "0000:1a:00.2", "0x15b3", "0x020700", width="8")
    os.symlink("../0000:1a:00.0", str(vf / "physfn"))
    _device(tmp_path, "0000:c4:00.0", "0x10de", "0x068000", width="2")      # NVSwitch
    _device(tmp_path, "0000:01:00.0", "0x8086", "0x020000", width="1")      # another NIC
    r = run(tmp_path, gpus=H100)
    assert summary(r) == [("pcie-link-down", "fail", "reboot", [0], None)]
    assert set(r["facts"]) == {"pcie.gpu0.width", "pcie.gpu0.max_width", "pcie.gpu0.max_gen"}


def test_no_pci_tree(tmp_path):
    assert run(tmp_path) == {"findings": [], "facts": {}}


def test_every_finding_has_the_contract_shape(tmp_path):
    root = dgx_a100_tree("gcm-compute_samsung980pro-downgraded.json", tmp_path)
    (dev(root, GPU_BDFS[1]) / "current_link_width").write_text("4\n")
    (dev(root, GPU_BDFS[1]) / "aer_dev_fatal").write_text("DLP 1\nTOTAL_ERR_FATAL 1\n")
    findings = run(root)["findings"]
    assert len(findings) == 3
    for f in findings:
        assert f["check"] == "pcie" and "\n" not in f["message"]
        assert f["level"] in ("info", "warn", "fail")
        assert f["action"] in ("none", "monitor", "app", "reset-gpu", "reboot", "drain", "rma")
        assert bool(f.get("gpus")) != bool(f.get("ports"))


def test_script_is_stdlib_only_python38():
    imported = script_imports(SCRIPTS / "pcie.py")
    assert imported <= {"os", "re", "_remote"}
    code = "import sys; sys.path.insert(0, %r); import pcie; print(pcie.CHECK)" % str(SCRIPTS)
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         universal_newlines=True, timeout=60, check=True).stdout
    assert out.strip() == "pcie"


# ---------------------------------------------------------------- lspci -vvv (an H100 HGX)

H100_LSPCI = FIX / "derived__lspci-vvv.h100-hgx.links"
H100_GPU_BDFS = ["19", "3b", "4c", "5d", "9b", "bb", "cb", "db"]
H100_GPUS = [{"index": i, "pci": "00000000:%s:00.0" % b.upper(), "name": "NVIDIA H100 80GB HBM3"}
             for i, b in enumerate(H100_GPU_BDFS)]


def test_lspci_h100_hgx_healthy():
    text = H100_LSPCI.read_text()
    assert len(pcie.parse_lspci_vvv(text)) == 102
    devices = pcie.devices_from_lspci(text)
    assert [d["bdf"] for d in devices if d["kind"] == "gpu"] == \
        ["0000:%s:00.0" % b for b in H100_GPU_BDFS]
    assert len([d for d in devices if d["kind"] == "nic"]) == 12   # 8 ConnectX-7, 2x2 CX-6 Dx
    findings, facts = pcie.assess(devices, H100_GPUS)
    # the PEX890xx switch ports, the BMC's Broadcom NIC and the Intel root ports that lspci
    # marks "(downgraded)" are neither GPUs nor ConnectX NICs
    assert findings == []
    for i in range(8):
        assert (facts["pcie.gpu%d.width" % i], facts["pcie.gpu%d.max_gen" % i]) == (16, 5)
    assert (facts["pcie.0000:1a:00.0.gen"], facts["pcie.0000:1b:00.0.gen"]) == (5, 4)


def test_lspci_derived_gpu_at_x8():
    text = H100_LSPCI.read_text()
    head = "19:00.0 3D controller: NVIDIA Corporation Device 2330 (rev a1)\n"
    assert head in text
    i = text.index(head) + len(head)
    j = text.index("LnkSta:", i)
    k = text.index("\n", j)
    text = text[:j] + "LnkSta:\tSpeed 32GT/s (ok), Width x8 (downgraded)" + text[k:]
    findings, facts = pcie.assess(pcie.devices_from_lspci(text), H100_GPUS)
    assert [(f["code"], f["level"], f["action"], f["gpus"]) for f in findings] == \
        [("pcie-width-low", "fail", "reboot", [0])]
    assert findings[0]["message"] == "GPU 0: PCIe link x8, expected x16"


def test_lspci_header_forms():
    text = ("0000:19:00.0 3D controller [0302]: NVIDIA Corporation GH100 [H100 SXM5 80GB] "
            "[10de:2330] (rev a1)\n"
            "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM L1, Exit Latency L1 <4us\n"
            "\t\tLnkSta:\tSpeed 16GT/s (downgraded), Width x16 (ok)\n"
            "1a:00.1 Ethernet controller [0200]: Mellanox Technologies ConnectX Family "
            "mlx5Gen Virtual Function [15b3:101e]\n"
            "\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16\n"
            "\t\tLnkSta:\tSpeed 32GT/s, Width x16\n")
    parsed = pcie.parse_lspci_vvv(text)
    assert [(d["bdf"], d["class_name"], d["speed"], d["width"], d["max_speed"]) for d in parsed] \
        == [("0000:19:00.0", "3D controller", 16.0, 16, 32.0),
            ("0000:1a:00.1", "Ethernet controller", 32.0, 16, 32.0)]
    devices = pcie.devices_from_lspci(text)
    assert [(d["kind"], d["gen"], d["max_gen"]) for d in devices] == [("gpu", 4, 5)]  # VF skipped


# ---------------------------------------------------------------- ACS between GPUs and NICs

# leptonai/gpud's real `lspci -vvv` of the H100 HGX host, cut to each device's header and its
# Bus:, ACSCtl:, LnkCap: and LnkSta: lines (README.md there): the whole tree with its bridges'
# bus numbers and every ACS control register lspci printed.
H100_ACS = FIX / "derived__lspci-vvv.h100-hgx.acs"


def with_acs(text, bridge, flags="ReqRedir+ CmpltRedir+"):
    """``text`` with the ACSCtl line of ``bridge`` (its header's first words) turned on."""
    i = text.index("\n" + bridge + " ") + 1
    j = text.index("ACSCtl:", i)
    k = text.index("\n", j)
    assert text[i:j].count("\n") <= 4, "the ACSCtl line found is another device's"
    line = text[j:k]
    for flag in flags.split():
        line = line.replace(flag[:-1] + "-", flag)
    return text[:j] + line + text[k:]


def test_lspci_h100_hgx_tree_and_acs():
    text = H100_ACS.read_text()
    chains, acs = pcie.lspci_topology(text)
    # GPU 0 (19:00.0) and its ConnectX-7 (1a:00.0) sit behind one PEX890xx switch (16:00.0, its
    # downstream ports 17:01.0 and 17:02.0) under the Intel root port 15:01.0
    assert chains["0000:19:00.0"] == ["0000:15:01.0", "0000:16:00.0", "0000:17:01.0"]
    assert chains["0000:1a:00.0"] == ["0000:15:01.0", "0000:16:00.0", "0000:17:02.0"]
    assert acs["0000:17:01.0"] == {"SrcValid": False, "TransBlk": False, "ReqRedir": False,
                                   "CmpltRedir": False, "UpstreamFwd": False, "EgressCtrl": False,
                                   "DirectTrans": False}
    assert acs["0000:16:00.0"] == {}                   # an upstream port: no ACSCtl line
    # the recording's own redirect: the PMC-Sierra bridges above the NVSwitches, no GPU or NIC
    assert [b for b, f in acs.items() if f.get("ReqRedir")] == \
        ["0000:82:00.0", "0000:82:01.0", "0000:82:02.0", "0000:82:03.0"]
    assert chains["0000:83:00.0"][-1] == "0000:82:00.0"


def test_lspci_h100_hgx_acs_healthy_and_turned_on():
    text = H100_ACS.read_text()
    # as recorded: ACS redirect only where no GPU talks to a NIC
    assert pcie.acs_from_lspci(text, H100_GPUS) == ([], {"pcie.acs_redirect_ports": 0})
    findings, facts = pcie.acs_from_lspci(with_acs(text, "17:01.0"), H100_GPUS)
    assert facts == {"pcie.acs_redirect_ports": 1}
    (f,) = findings
    assert (f["code"], f["level"], f["action"], f["gpus"]) == ("pcie-acs-redirect", "warn", "monitor", [0])
    assert f["ports"] == ["0000:17:01.0", "0000:1a:00.0", "0000:1b:00.0", "0000:1b:00.1"]
    assert f["message"] == ("PCIe switch port 0000:17:01.0 has ACS ReqRedir/CmpltRedir on, between GPU 0 "
                            "and NIC 0000:1a:00.0, 0000:1b:00.0, 0000:1b:00.1: GPUDirect RDMA goes "
                            "through the root complex")
    # the NIC's port: every GPU behind that switch (one here) crosses it
    (f,) = pcie.acs_from_lspci(with_acs(text, "17:02.0", "CmpltRedir+"), H100_GPUS)[0]
    assert "ACS CmpltRedir on, between GPU 0 and NIC 0000:1a:00.0:" in f["message"]
    # source validation alone redirects nothing; a root port above both is not crossed
    assert pcie.acs_from_lspci(with_acs(text, "17:01.0", "SrcValid+"), H100_GPUS)[0] == []
    assert pcie.acs_from_lspci(with_acs(text, "15:01.0"), H100_GPUS)[0] == []


ACS_OFFSET = 0x100


def config_space(acs_control=None, base=b""):
    """4096 bytes of config space: ``base``'s first 256 bytes (the standard header), then, with
    ``acs_control``, an ACS extended capability at 0x100 laid out as the PCIe Base Specification
    has it (header: ID 0x000D, version 1, next 0; capability register; control register at +6),
    after a Device Serial Number capability pointing at it (a chain of two, as switches have)."""
    space = bytearray(base[:256].ljust(256, b"\0") + bytes(4096 - 256))
    if acs_control is not None:
        dsn = 0x0003 | (1 << 16) | (0x140 << 20)
        space[ACS_OFFSET:ACS_OFFSET + 4] = dsn.to_bytes(4, "little")
        acs = 0x000D | (1 << 16)
        space[0x140:0x144] = acs.to_bytes(4, "little")
        space[0x144:0x146] = (0x007f).to_bytes(2, "little")          # every ACS feature there
        space[0x146:0x148] = acs_control.to_bytes(2, "little")
    return bytes(space)


def test_acs_control_from_config_space():
    assert pcie.acs_control(config_space(0b1101))["ReqRedir"] is True
    got = pcie.acs_control(config_space(0b0001))
    assert (got["SrcValid"], got["ReqRedir"], got["CmpltRedir"]) == (True, False, False)
    assert pcie.acs_control(config_space()) == {}             # no extended capability
    assert pcie.acs_control(config_space(0)[:64]) is None      # what a non-root reader gets
    assert pcie.acs_control(b"") == {}                         # conventional PCI: no extended space
    loop = bytearray(config_space())
    loop[0x100:0x104] = (0x0003 | (0x100 << 20)).to_bytes(4, "little")   # points at itself
    assert pcie.acs_control(bytes(loop)) == {}


def test_this_machines_real_config_space_as_root_and_as_nobody():
    """The config files of this machine's own PCI devices: read whole as root, 64 bytes as an
    unprivileged user (the kernel's rule), which leaves ACS unread."""
    devices = sorted(Path("/sys/bus/pci/devices").glob("*/config"))
    if not devices:
        pytest.skip("no PCI devices here")
    whole = devices[0].read_bytes()
    if os.geteuid() == 0:
        assert len(whole) >= 256
        # the extended-capability walk ends on a real device's bytes (a dict: ACS or none)
        assert isinstance(pcie.acs_control(whole), dict) if len(whole) >= 0x108 else \
            pcie.acs_control(whole) is None
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                            "-c", "import sys; sys.stdout.write(str(len(open(sys.argv[1], 'rb').read())))",
                            str(devices[0])], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        assert int(p.stdout) == 64
        assert pcie.acs_control(whole[:64]) is None
    # a conventional (256-byte) config space has no extended capability: no ACS, not "unread"
    for config in devices:
        if config.stat().st_size == 256:
            assert pcie._read_config(str(config.parent)) == b"" and pcie.acs_control(b"") == {}


def _switch_tree(root, acs_on_gpu_port=0):
    """/sys/devices as a node has it for one GPU and one NIC behind a switch (root port 15:01.0,
    upstream port 16:00.0, downstream ports 17:01.0 and 17:02.0), bus/pci/devices linking in."""
    ports = {"0000:15:01.0": 0, "0000:16:00.0": None, "0000:17:01.0": acs_on_gpu_port, "0000:17:02.0": 0}
    up = "devices/pci0000:15/0000:15:01.0/0000:16:00.0"
    for bdf, control in ports.items():
        d = root / (up.rsplit("/", 1)[0] if bdf == "0000:15:01.0" else up if bdf == "0000:16:00.0"
                    else up + "/" + bdf)
        d.mkdir(parents=True, exist_ok=True)
        space = config_space(control)
        (d / "config").write_bytes(space)
    _device(root, "0000:19:00.0", "0x10de", "0x030200", parent=None)
    _device(root, "0000:1a:00.0", "0x15b3", "0x020700", parent=None)
    for bdf, port in (("0000:19:00.0", "0000:17:01.0"), ("0000:1a:00.0", "0000:17:02.0")):
        flat = root / "devices" / "pci0000:00" / bdf
        dest = root / up / port / bdf
        shutil.move(str(flat), str(dest))
        link = root / "bus" / "pci" / "devices" / bdf
        link.unlink()
        os.symlink(os.path.relpath(dest, link.parent), link)
    (root / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)


def test_sysfs_acs_where_rdma_devices_exist(tmp_path):
    gpu = [{"index": 0, "pci": "00000000:19:00.0", "name": "NVIDIA H100 80GB HBM3"}]
    _switch_tree(tmp_path / "off")
    r = run(tmp_path / "off", gpus=gpu)
    assert r["findings"] == [] and r["facts"]["pcie.acs_redirect_ports"] == 0
    _switch_tree(tmp_path / "on", acs_on_gpu_port=0b1101)
    r = run(tmp_path / "on", gpus=gpu)
    assert summary(r) == [("pcie-acs-redirect", "warn", "monitor", [0],
                           ["0000:17:01.0", "0000:1a:00.0"])]
    shutil.rmtree(tmp_path / "on" / "class" / "infiniband")        # no RDMA device: not looked at
    assert run(tmp_path / "on", gpus=gpu)["findings"] == []


AS_NOBODY = """
import json, sys
sys.path.insert(0, sys.argv[1])
import pcie
got = pcie.check({}, None, sys_root=sys.argv[2], gpus=[{"index": 0, "pci": "00000000:19:00.0"}])
print(json.dumps(got))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the check as nobody")
def test_sysfs_acs_not_readable_by_an_unprivileged_user(nobodys_dir):
    """The bridges' config files as sysfs has them for root only past 64 bytes: here 4096 bytes
    of mode 0600, read by nobody (a real permission refusal; sysfs itself hands nobody 64
    bytes, which acs_control takes the same way)."""
    root = nobodys_dir / "sys"
    try:
        root.mkdir(mode=0o755)
        _switch_tree(root, acs_on_gpu_port=0b1101)
        for d, _, files in os.walk(root):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o600 if f == "config" else 0o644)
        # the system's python3: this one may be in a checkout nobody cannot enter (a 0700 home)
        p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                            "-c", AS_NOBODY, str(nobodys_dir / "scripts"), str(root)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        r = json.loads(p.stdout)
        assert summary(r) == [("pcie-acs-unread", "info", "none", None, None)]
        assert "pcie.acs_redirect_ports" not in r["facts"]
        assert summary(run(root, gpus=[{"index": 0, "pci": "00000000:19:00.0"}]))[0][0] == "pcie-acs-redirect"
    finally:
        shutil.rmtree(root)
