"""node-check's InfiniBand/RoCE check (diagnostics/scripts/ib.py) on recorded sysfs trees.

Fixtures (tests/fixtures/infiniband/, README.md there): a real ``/sys/class/infiniband`` of an
H100 host (gpud), GCM's sysfs dumps of a DGX A100 ({sysfs path: content}, materialised into a
tmp tree by ``materialise``), Azure NHC's syslog with IB link flaps. Faulty trees are derived
from the real ones in a tmp dir by the test that needs them.
"""

import json
import os
import shutil
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from tests.programs import load_script
from tests.programs import script_imports

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "diagnostics" / "scripts"
FIX = REPO / "tests" / "fixtures" / "infiniband"
H100_TREE = FIX / "sys-class-infiniband-h100"

# Loaded by path, never by putting the scripts dir on sys.path: a script named like an
# installed package (as fabric.py once was) would shadow it for every later test.
ib = load_script("ib.py", "mldiag_test_ib")

Tool = namedtuple("Tool", "status rc out err seconds")


def no_tools(argv, timeout):
    raise AssertionError("ib.check ran a tool: %r" % (argv,))


def materialise(dump, root):
    """Write a GCM sysfs dump ({"/sys/...": content}) under ``root`` (which stands for /sys) as
    a real sysfs would lay it out: ``class/pci_bus/BUS/device/BDF/...`` is the same directory as
    ``bus/pci/devices/BDF/...`` (written there), and each ``bus/pci/devices/BDF/infiniband/DEV``
    is linked from ``class/infiniband/DEV`` (a symlink, as on a node)."""
    root = Path(root)
    data = json.loads(Path(dump).read_text())
    for path, content in data.items():
        assert path.startswith("/sys/"), path
        parts = path[len("/sys/"):].split("/")
        if parts[:2] == ["class", "pci_bus"] and len(parts) > 4 and parts[3] == "device":
            parts = ["bus", "pci", "devices"] + parts[4:]
        target = root.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    devices = root / "bus" / "pci" / "devices"
    for hca in sorted(devices.glob("*/infiniband/*")):
        link = root / "class" / "infiniband" / hca.name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(hca, link.parent), link)
    return root


def h100_copy(tmp_path):
    """The real H100 tree copied to TMP/class/infiniband (the lab's bind-mount layout)."""
    dst = tmp_path / "class" / "infiniband"
    shutil.copytree(H100_TREE, dst)
    return tmp_path


def run(sys_root, expect=None, log_text=""):
    return ib.check(expect or {}, no_tools, sys_root=str(sys_root), gpus=[],
                    kernel_log={"source": "file:x", "text": log_text, "error": None})


def summary(result):
    """(code, level, action, ports) per finding: what the tests spell out by hand."""
    return [(f["code"], f["level"], f["action"], f.get("ports")) for f in result["findings"]]


def test_every_finding_has_the_contract_shape(tmp_path):
    root = h100_copy(tmp_path)
    (root / "class/infiniband/mlx5_4/ports/1/state").write_text("1: DOWN")
    for f in run(root, {"ib_ports": 8, "ib_rate": 400})["findings"]:
        assert f["check"] == "ib"
        assert f["level"] in ("info", "warn", "fail")
        assert f["action"] in ("none", "monitor", "app", "reset-gpu", "reboot", "drain", "rma")
        assert "\n" not in f["message"]


# ---------------------------------------------------------------- parsers

def test_parse_state_and_rate():
    assert ib.parse_state("4: ACTIVE") == ("ACTIVE", 4)
    assert ib.parse_state("5: LinkUp\n") == ("LinkUp", 5)
    assert ib.parse_state("2: Polling") == ("Polling", 2)
    assert ib.parse_state(None) == (None, None)
    assert ib.parse_rate("400 Gb/sec (4X NDR)") == 400
    assert ib.parse_rate("200 Gb/sec (2X NDR)") == 200
    assert ib.parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert ib.parse_rate("garbage") is None


def test_read_devices_real_h100_tree():
    devs = ib.read_devices(str(H100_TREE))
    assert [d["name"] for d in devs] == ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6",
                                         "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"]
    bond = devs[-1]
    assert bond["hca_type"] == "MT41692" and bond["fw"] == "32.38.3056"
    assert bond["pci"] is None and bond["netdevs"] == {}   # a copied tree: no device link
    p = bond["ports"][0]
    assert (p["port"], p["state"], p["phys_state"], p["rate"], p["link_layer"]) == \
        ("1", "ACTIVE", "LinkUp", 200, "Ethernet")
    assert devs[1]["ports"][0]["counters"]["link_downed"] == 255
    assert devs[0]["ports"][0]["counters"]["port_rcv_errors"] == 14


# ---------------------------------------------------------------- the real H100 tree

def test_real_h100_tree_healthy_but_mlx5_1_link_downed_worth_a_look(tmp_path):
    r = run(h100_copy(tmp_path), {"ib_ports": 8, "ib_rate": 400})
    assert summary(r) == [("ib-counters", "warn", "monitor", ["mlx5_1/1"])]
    assert "link_downed at least 255" in r["findings"][0]["message"]
    f = r["facts"]
    assert f["ib.ports"] == 8
    assert f["ib.mlx5_0/1.rate"] == 400 and f["ib.mlx5_0/1.state"] == "ACTIVE"
    assert f["ib.mlx5_0/1.link_layer"] == "InfiniBand"
    assert f["ib.mlx5_0.fw"] == "28.41.1000" and f["ib.mlx5_0.hca_type"] == "MT4129"
    # the RoCE bond at 200 Gb/s is healthy: ib_rate is not applied to Ethernet ports
    assert f["ib.mlx5_bond_0/1.rate"] == 200 and f["ib.mlx5_bond_0/1.link_layer"] == "Ethernet"
    assert f["ib.mlx5_bond_0.fw"] == "32.38.3056"
    assert all(isinstance(v, (str, int, float, bool, type(None))) for v in f.values())
    assert not any("counters" in k or "link_downed" in k for k in f)


def test_real_h100_tree_without_expectations(tmp_path):
    r = run(h100_copy(tmp_path))
    assert summary(r) == [("ib-counters", "warn", "monitor", ["mlx5_1/1"])]


def test_derived_h100_tree_port_polling_and_low_rate(tmp_path):
    """Derived from the real tree: mlx5_4 DOWN/Polling (no peer), mlx5_7 trained at HDR 200."""
    root = h100_copy(tmp_path)
    ports = root / "class" / "infiniband"
    (ports / "mlx5_4/ports/1/state").write_text("1: DOWN\n")
    (ports / "mlx5_4/ports/1/phys_state").write_text("2: Polling\n")
    (ports / "mlx5_4/ports/1/rate").write_text("10 Gb/sec (4X SDR)\n")
    (ports / "mlx5_7/ports/1/rate").write_text("200 Gb/sec (4X HDR)\n")
    r = run(root, {"ib_ports": 8, "ib_rate": 400})
    assert summary(r) == [
        ("ib-counters", "warn", "monitor", ["mlx5_1/1"]),
        ("ib-port-down", "fail", "drain", ["mlx5_4/1"]),
        ("ib-rate-low", "fail", "drain", ["mlx5_7/1"]),
        ("ib-port-count", "fail", "drain", None),
    ]
    down, low, count = r["findings"][1:]
    assert down["message"] == ("mlx5_4/1: state DOWN, physical state Polling (InfiniBand), "
                               "expected ACTIVE/LinkUp")
    assert "cable" in down["hint"]
    assert low["message"] == "mlx5_7/1: rate 200 Gb/s (200 Gb/sec (4X HDR)), expected 400"
    assert count["message"] == "7 of 8 expected InfiniBand ports ACTIVE"
    assert r["facts"]["ib.ports"] == 7 and r["facts"]["ib.mlx5_4/1.state"] == "DOWN"
    # without ib_rate the slow port still stands out against its siblings, as a warning
    r = run(root)
    assert ("ib-rate-mixed", "warn", "monitor", ["mlx5_7/1"]) in summary(r)
    assert "ib-port-count" not in [f["code"] for f in r["findings"]]


def test_derived_h100_tree_disabled_port_and_down_bond(tmp_path):
    root = h100_copy(tmp_path)
    ports = root / "class" / "infiniband"
    (ports / "mlx5_9/ports/1/state").write_text("1: DOWN\n")
    (ports / "mlx5_9/ports/1/phys_state").write_text("3: Disabled\n")
    (ports / "mlx5_bond_0/ports/1/state").write_text("1: DOWN\n")
    (ports / "mlx5_bond_0/ports/1/phys_state").write_text("3: Disabled\n")
    r = run(root, {"ib_ports": 8})
    assert summary(r) == [
        ("ib-counters", "warn", "monitor", ["mlx5_1/1"]),
        ("ib-port-down", "fail", "drain", ["mlx5_9/1"]),
        ("eth-port-down", "warn", "monitor", ["mlx5_bond_0/1"]),
        ("ib-port-count", "fail", "drain", None),
    ]
    assert "disabled" in r["findings"][1]["hint"]


def test_derived_roce_only_node_counts_ethernet_ports_as_the_fabric(tmp_path):
    """A RoCE cluster: every port Ethernet. ib_ports then counts the RDMA ports and a down
    one fails (on an IB node it would be a spare Ethernet port, a warning)."""
    root = h100_copy(tmp_path)
    for ll in (root / "class" / "infiniband").glob("*/ports/1/link_layer"):
        ll.write_text("Ethernet\n")
    (root / "class/infiniband/mlx5_5/ports/1/state").write_text("1: DOWN\n")
    (root / "class/infiniband/mlx5_5/ports/1/phys_state").write_text("3: Disabled\n")
    r = run(root, {"ib_ports": 9, "ib_rate": 400})
    assert summary(r) == [
        ("ib-counters", "warn", "monitor", ["mlx5_1/1"]),
        ("ib-port-down", "fail", "drain", ["mlx5_5/1"]),
        ("ib-port-count", "fail", "drain", None),
    ]
    assert r["findings"][2]["message"] == "8 of 9 expected RDMA ports ACTIVE"
    assert r["facts"]["ib.ports"] == 8


def test_symlinked_tree_as_on_a_node_and_missing_device_link(tmp_path):
    """/sys/class/infiniband/DEV -> ../../devices/pci.../BDF/infiniband/DEV on a node; a dev
    whose symlink target holds no PCI parent and no ``device`` link is read all the same."""
    devices = tmp_path / "devices" / "pci0000:00" / "0000:00:01.0"
    cls = tmp_path / "class" / "infiniband"
    cls.mkdir(parents=True)
    for i, name in enumerate(["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5"]):
        bdf = devices / ("0000:%02x:00.0" % (0x18 + i))
        shutil.copytree(H100_TREE / name, bdf / "infiniband" / name)
        (bdf / "net" / ("ibp%ds0" % (0x18 + i))).mkdir(parents=True)
        (bdf / "net" / ("ibp%ds0" % (0x18 + i)) / "operstate").write_text("up\n")
        os.symlink(os.path.relpath(bdf / "infiniband" / name, cls), cls / name)
    os.symlink(os.path.relpath(bdf, bdf / "infiniband" / "mlx5_5"),
               bdf / "infiniband" / "mlx5_5" / "device")
    plain = tmp_path / "elsewhere" / "mlx5_6"
    shutil.copytree(H100_TREE / "mlx5_6", plain)
    os.symlink(os.path.relpath(plain, cls), cls / "mlx5_6")
    devs = {d["name"]: d for d in ib.read_devices(str(cls))}
    assert devs["mlx5_0"]["pci"] == "0000:18:00.0"
    assert list(devs["mlx5_0"]["netdevs"]) == ["ibp24s0"]
    assert devs["mlx5_5"]["pci"] == "0000:1b:00.0"    # through its device link
    assert devs["mlx5_6"]["pci"] is None and devs["mlx5_6"]["netdevs"] == {}
    r = run(tmp_path, {"ib_ports": 5, "ib_rate": 400})
    assert summary(r) == [("ib-counters", "warn", "monitor", ["mlx5_1/1"])]


def test_no_rdma_devices(tmp_path):
    assert run(tmp_path) == {"findings": [], "facts": {"ib.ports": 0}}
    r = run(tmp_path, {"ib_ports": 8})
    assert summary(r) == [("ib-no-devices", "fail", "drain", None)]
    assert r["findings"][0]["message"] == ("no RDMA device in /sys/class/infiniband, expected "
                                           "8 InfiniBand ports")


# ---------------------------------------------------------------- GCM's DGX A100 dumps

DGX_A100 = {"ib_ports": 8, "ib_rate": 200}   # the manifest's ib.link_rate "200 Gb/sec (4X HDR)"
A100_PORTS = ["mlx5_0/1", "mlx5_1/1", "mlx5_2/1", "mlx5_3/1", "mlx5_6/1", "mlx5_7/1",
              "mlx5_8/1", "mlx5_9/1"]


def test_gcm_learn_good(tmp_path):
    root = materialise(FIX / "gcm-learn_good.json", tmp_path)
    r = run(root, DGX_A100)
    assert r["findings"] == []
    assert r["facts"]["ib.ports"] == 8
    assert r["facts"]["ib.mlx5_8/1.rate"] == 200 and r["facts"]["ib.mlx5_8.fw"] == "20.31.2354"
    devs = {d["name"]: d for d in ib.read_devices(str(root / "class" / "infiniband"))}
    assert devs["mlx5_8"]["pci"] == "0000:ba:00.0"
    assert devs["mlx5_8"]["netdevs"] == {"ib6": {"operstate": "up", "carrier_down": 1}}


def test_gcm_bad_rate_all_ports_edr_instead_of_hdr(tmp_path):
    root = materialise(FIX / "gcm-learn_ib_intf_bad_rate.json", tmp_path)
    r = run(root, DGX_A100)
    assert summary(r) == [("ib-rate-low", "fail", "drain", A100_PORTS)]
    assert r["findings"][0]["message"] == (", ".join(A100_PORTS) +
                                           ": rate 100 Gb/s (100 Gb/sec (4X EDR)), expected 200")
    # every port equally slow: only an expectation can tell
    assert run(root)["findings"] == []


def test_gcm_stuck_ports_in_init(tmp_path):
    root = materialise(FIX / "gcm-learn_stuck_ib_intf.json", tmp_path)
    r = run(root, DGX_A100)
    assert summary(r) == [("ib-port-down", "fail", "drain", ["mlx5_6/1", "mlx5_8/1"]),
                          ("ib-port-count", "fail", "drain", None)]
    down = r["findings"][0]
    assert down["message"] == ("mlx5_6/1, mlx5_8/1: state INIT, physical state LinkUp "
                               "(InfiniBand), expected ACTIVE/LinkUp")
    assert "subnet manager" in down["hint"]
    assert r["findings"][1]["message"] == "6 of 8 expected InfiniBand ports ACTIVE"


def test_gcm_ipoib_interface_down_and_carrier_flaps(tmp_path):
    root = materialise(FIX / "gcm-learn_ib_intf_operstate_down.json", tmp_path)
    r = run(root, DGX_A100)
    assert summary(r) == [("ipoib-down", "warn", "monitor", ["mlx5_6/1"]),
                          ("ib-carrier-flaps", "warn", "monitor", ["mlx5_6/1"])]
    assert r["findings"][0]["message"] == ("mlx5_6/1 (ib4): port ACTIVE but its IPoIB "
                                           "interface is down")
    assert "49 times since boot" in r["findings"][1]["message"]


# ---------------------------------------------------------------- link flaps (kernel log)

def _syslog(name):
    return (FIX / name).read_text()


def test_azure_syslog_six_flaps_on_ib6():
    flaps = ib.parse_link_flaps(_syslog("azurehpc-1dev_6flap_syslog"))
    assert flaps == {"ib6": {"down": 6, "up": 6, "pci": None}}
    assert ib.parse_link_flaps(_syslog("azurehpc-0flap_syslog")) == {}


def test_flaps_without_sysfs_name_the_netdev(tmp_path):
    r = run(tmp_path, log_text=_syslog("azurehpc-1dev_6flap_syslog"))
    assert summary(r) == [("ib-link-flap", "fail", "drain", ["ib6"])]
    assert r["findings"][0]["message"] == ("ib6: link went down 6 times in the kernel log window "
                                           "(more than 1: flapping)")
    assert summary(run(tmp_path, log_text=_syslog("azurehpc-0flap_syslog"))) == []


def test_flaps_mapped_to_the_hca_port_through_sysfs(tmp_path):
    root = materialise(FIX / "gcm-learn_good.json", tmp_path)
    r = run(root, DGX_A100, log_text=_syslog("azurehpc-1dev_6flap_syslog"))
    assert summary(r) == [("ib-link-flap", "fail", "drain", ["mlx5_8/1"])]
    assert r["findings"][0]["message"].startswith("ib6 (mlx5_8/1): link went down 6 times")
    # one lost carrier (the first one of the file only): a warning
    lines = _syslog("azurehpc-1dev_6flap_syslog").splitlines()
    one = "\n".join(lines[:3] + [l for l in lines if "Gained" in l][:1])
    r = run(root, DGX_A100, log_text=one)
    assert summary(r) == [("ib-link-flap", "warn", "monitor", ["mlx5_8/1"])]


def test_kernel_mlx5_core_link_lines_and_non_rdma_netdevs_ignored(tmp_path):
    # hand-written lines in the kernel's mlx5e format (not a recorded fixture)
    text = "\n".join([
        "[  100.1] mlx5_core 0000:ba:00.0 ens9np0: Link down",
        "[  101.2] mlx5_core 0000:ba:00.0 ens9np0: Link up",
        "[  200.3] mlx5_core 0000:ba:00.0 ens9np0: Link down",
        "Aug 17 06:18:01 h systemd-networkd[5398]: eno1: lost carrier",
    ])
    assert ib.parse_link_flaps(text) == {"ens9np0": {"down": 2, "up": 1, "pci": "0000:ba:00.0"}}
    root = materialise(FIX / "gcm-learn_good.json", tmp_path)
    r = run(root, DGX_A100, log_text=text)
    assert summary(r) == [("ib-link-flap", "fail", "drain", ["mlx5_8/1"])]  # by PCI address


# ---------------------------------------------------------------- OFED, stand-alone script

def test_ofed_version(tmp_path):
    assert ib.ofed_version(str(tmp_path)) == (None, None)
    core = tmp_path / "module" / "mlx5_core"
    core.mkdir(parents=True)
    assert ib.ofed_version(str(tmp_path)) == ("inbox", str(core))
    (tmp_path / "module" / "mlx_compat").mkdir()
    assert ib.ofed_version(str(tmp_path))[0] == "mlnx-ofed"
    (core / "version").write_text("23.10-1.1.9\n")
    assert ib.ofed_version(str(tmp_path)) == ("23.10-1.1.9", str(core / "version"))


def test_script_is_stdlib_only_python38_and_runs_no_tool():
    imported = script_imports(SCRIPTS / "ib.py")
    assert imported <= {"os", "re", "_remote"}
    code = "import sys; sys.path.insert(0, %r); import ib; print(ib.CHECK)" % str(SCRIPTS)
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         universal_newlines=True, timeout=60, check=True).stdout
    assert out.strip() == "ib"
