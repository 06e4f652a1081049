"""The node-check CTs: two H200-like GPU nodes whose sysfs, GPUs and kernel log come from
recordings, for `mldiag node-check` end to end (tests/integration/test_node_check.py).

Each CT sees, at the real paths, with no test hook in the product:
- /sys/class/infiniband: a recorded tree (leptonai/gpud's copy of an H100 host's
  /sys/class/infiniband, tests/fixtures/infiniband/) bind-mounted read-only over a tmpfs on
  /sys/class (the recipe in shared/notes/test-infra.md: this kernel has no infiniband class, and
  sysfs refuses a mount point of its own);
- /sys/bus/pci/devices: a PCI device tree made here from a small description (8 GPUs
  10de:2335 H200 and 8 ConnectX-7 15b3:1021, PCIe gen 5 x16, at the bus ids the fake nvidia-smi
  reports), likewise over a tmpfs on /sys/bus;
- /usr/bin/nvidia-smi -> tests/fakes/nvidia-smi (the capture is picked by the target's `env:`;
  the faulty CT holds its own derived capture, FAULTY_CAPTURE below);
- /usr/bin/dmesg -> tests/fakes/dmesg, and on the healthy CT also /usr/bin/journalctl and
  /usr/bin/dcgmi (tests/fakes/journalctl, tests/fakes/dcgmi): the faulty CT is a node without
  systemd's journal and without DCGM;
- /var/log/mldiag-lab/: the saved kernel logs (real ones, unchanged copies) and kernel.log, the
  one the fake journalctl/dmesg replay when the target's `env:` names none.

  CT 210 `h200-ok`   the recorded IB tree as it is; PCI links all at their maximum;
                     kernel.log: a healthy H100 HGX boot log (no Xid).
  CT 211 `h200-bad`  the IB tree with mlx5_5/1 down (DOWN / Disabled) and mlx5_7/1 at 200 Gb/s
                     (4X HDR) instead of 400 (4X NDR); GPU 5 (0000:ab:00.0) at x8 of x16;
                     kernel.log: Xid 79 (fallen off the bus) and NVSwitch SXid 20034;
                     nvidia-smi (env MLDIAG_FAKE_NVIDIA_SMI=derived__h200x8__node-check-bad): GPU 5
                     lost NVLinks 4 and 11, the fabric "In Progress" on every GPU.

Started on first use (Lab.node_check_cts), not with the lab: only the node-check tests pay.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import lxc
from .util import LabError

HEALTHY, FAULTY = 210, 211
LOG_DIR = "/var/log/mldiag-lab"

# Both under a tests/fixtures dir: the lab's copy (Lab.fixtures_dir), which LXC can bind and
# every user read whatever the checkout's path and modes.
# The recorded /sys/class/infiniband tree (tests/fixtures/infiniband/README.md names its source).
IB_TREE = Path("infiniband") / "sys-class-infiniband-h100"
# Saved kernel logs (real, unchanged; tests/fixtures/xid/README.md).
KLOG_DIR = Path("xid")
KLOGS = {
    "healthy": "gpud-dmesg.decode.iso.log.1",              # 8x H100 HGX boot, no Xid
    "xid79": "gpud-sxid-README.xid79-sxid20034.excerpt.md",  # Xid 79 + SXid 20034 (Markdown quote)
    "xid48": "gpud-dmesg-time-format-iso.log",             # Xid 48 DBE, 63 row remap, 94 contained
    "xid13": "gpud-dmesg.decode.iso.log.0",                # Xid 13/43: the application's
    "xid119": "gpud-dmesg-with-xid-119.log",               # Xid 119 GSP RPC timeout
}

# 8-GPU HGX H200: GPU bus ids as the fake nvidia-smi's `gpus 8` reports them; a ConnectX-7 on
# the next bus of each GPU's PCIe switch, as in a real H100 HGX (shared/fixtures/pcie/gpud-lspci-vvv.h100-hgx).
GPU_BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
GEN_SPEED = {3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe"}
AER_CORRECTABLE = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr",
                   "HeaderOF")
AER_UNCORRECTABLE = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt",
                     "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP",
                     "AtomicOpBlocked", "TLPBlockedErr", "PoisonTLPBlocked")


@dataclass
class PciDevice:
    bdf: str                  # 0000:18:00.0
    vendor: str               # 0x10de
    device: str               # 0x2335
    pci_class: str            # 0x030200
    driver: str
    width: int = 16           # current_link_width
    gen: int = 5              # current_link_speed as a generation
    max_width: int = 16
    max_gen: int = 5
    aer: Dict[str, int] = field(default_factory=dict)   # e.g. {"BadTLP": 3, "CmpltTO": 1}


def h200_hgx(gpu_width: Optional[Dict[int, int]] = None) -> List[PciDevice]:
    """8 H200 GPUs and 8 ConnectX-7 NICs, gen 5 x16; gpu_width: {gpu index: current width}."""
    out = []
    for i, bus in enumerate(GPU_BUSES):
        out.append(PciDevice(f"0000:{bus}:00.0", "0x10de", "0x2335", "0x030200", "nvidia",
                             width=(gpu_width or {}).get(i, 16)))
        nic_bus = "%02x" % (int(bus, 16) + 1)
        out.append(PciDevice(f"0000:{nic_bus}:00.0", "0x15b3", "0x1021", "0x020700", "mlx5_core"))
    return out


def write_pci_tree(dest: Path, devices: List[PciDevice]) -> Path:
    """/sys/bus/pci/devices as a plain tree: one directory per device (real sysfs has symlinks
    into /sys/devices/pci*; a reader that reads the files through the devices/ names sees the
    same), with the attributes a link and AER check reads, formatted as Linux 6.x prints them."""
    dest.mkdir(parents=True)
    for d in devices:
        p = dest / d.bdf
        p.mkdir()
        aer = dict.fromkeys(AER_CORRECTABLE + AER_UNCORRECTABLE, 0)
        aer.update(d.aer)
        cor = sum(aer[k] for k in AER_CORRECTABLE)
        fatal = sum(aer[k] for k in ("DLP", "SDES", "FCP", "RxOF", "MalfTLP", "UncorrIntErr"))
        nonfatal = sum(aer[k] for k in AER_UNCORRECTABLE) - fatal
        files = {
            "vendor": d.vendor, "device": d.device, "class": d.pci_class,
            "subsystem_vendor": d.vendor, "numa_node": "0" if d.bdf < "0000:80" else "1",
            "current_link_width": str(d.width), "max_link_width": str(d.max_width),
            "current_link_speed": GEN_SPEED[d.gen], "max_link_speed": GEN_SPEED[d.max_gen],
            "uevent": (f"DRIVER={d.driver}\nPCI_CLASS={int(d.pci_class, 16):X}\n"
                       f"PCI_ID={d.vendor[2:].upper()}:{d.device[2:].upper()}\nPCI_SLOT_NAME={d.bdf}"),
            "aer_dev_correctable": "\n".join([f"{k} {aer[k]}" for k in AER_CORRECTABLE]
                                             + [f"TOTAL_ERR_COR {cor}"]),
            "aer_dev_fatal": "\n".join([f"{k} {aer[k]}" for k in AER_UNCORRECTABLE]
                                       + [f"TOTAL_ERR_FATAL {fatal}"]),
            "aer_dev_nonfatal": "\n".join([f"{k} {aer[k]}" for k in AER_UNCORRECTABLE]
                                          + [f"TOTAL_ERR_NONFATAL {nonfatal}"]),
        }
        for name, text in files.items():
            (p / name).write_text(text + "\n")
    _read_only(dest)
    return dest


def ib_tree(fixtures: Path) -> Path:
    tree = fixtures / IB_TREE
    if (tree / "mlx5_0" / "ports" / "1" / "state").is_file():
        return tree
    raise LabError(f"the recorded /sys/class/infiniband tree is missing: {tree}")


# (device, port) -> {attribute: new text}: the faults of the faulty CT's IB tree
IB_FAULTS = {
    ("mlx5_5", "1"): {"state": "1: DOWN", "phys_state": "3: Disabled"},
    ("mlx5_7", "1"): {"rate": "200 Gb/sec (4X HDR)"},
}


def derive_ib_tree(src: Path, dest: Path, faults=IB_FAULTS) -> Path:
    """A copy of the recorded tree with `faults` written over it (files in sysfs's format)."""
    shutil.copytree(src, dest, symlinks=True)
    os.chmod(dest, 0o755)
    for (dev, port), attrs in faults.items():
        pdir = dest / dev / "ports" / port
        if not pdir.is_dir():
            raise LabError(f"{src} has no {dev}/ports/{port} to derive a fault from")
        for name, text in attrs.items():
            f = pdir / name
            # NOTE: the recording's files have no trailing newline (real sysfs ones do): the
            # derived ones follow the recording
            newline = "\n" if f.exists() and f.read_bytes().endswith(b"\n") else ""
            if f.exists():
                os.chmod(f, 0o644)
            f.write_text(text + newline)
    _read_only(dest)
    return dest


def _read_only(root: Path) -> None:
    for d, dirs, files in os.walk(root):
        os.chmod(d, 0o555)
        for f in files:
            os.chmod(os.path.join(d, f), 0o444)


def find_klog(fixtures: Path, name: str) -> Path:
    log = fixtures / KLOG_DIR / name
    if log.is_file():
        return log
    raise LabError(f"the saved kernel log is missing: {log}")


# The faulty CT's GPUs, as a derived capture of the fake nvidia-smi (tests/fakes/nvidia-smi,
# "Derived captures") written into the CT at /usr/local/share/mldiag/nvidia-smi/, a directory the
# fake looks captures up in.
CAPTURE_DIR = "/usr/local/share/mldiag/nvidia-smi"
FAULTY_CAPTURE = "derived__h200x8__node-check-bad"
FAULTY_CAPTURE_TEXT = """\
# mldiag lab (tests/lab/nodecheck.py): the GPUs of node-check's faulty CT 211 h200-bad.
base linux-x86_64__nvidia-h200__590.48.01.txt
gpus 8
"""
FAULTY_GPU_FAULTS = """\
# GPU 5 (also the one at PCIe x8) lost NVLinks 4 and 11; the fabric manager has not finished:
# every GPU's Fabric State "In Progress" (CUDA would fail to start here).
nvlink-down 5 4
nvlink-down 5 11
fabric * "In Progress" N/A
"""


@dataclass
class NodeCT:
    vmid: int
    name: str
    ib_tree: Path
    pci_tree: Path
    tools: Tuple[str, ...]           # fakes linked into /usr/bin
    kernel_log: str                  # key of KLOGS replayed by default
    capture: Optional[str] = None    # a derived capture written into the CT (text)


def sysfs_mounts(ib: Path, pci: Path) -> List[str]:
    ib, pci = lxc.fstab_escaped(str(ib)), lxc.fstab_escaped(str(pci))
    return [
        # NOTE: the tmpfs must be writable: LXC makes the bind's mount point in it (create=dir)
        "lxc.mount.entry = tmpfs sys/class tmpfs nosuid,nodev,noexec,mode=755 0 0",
        f"lxc.mount.entry = {ib} sys/class/infiniband none bind,ro,create=dir 0 0",
        "lxc.mount.entry = tmpfs sys/bus tmpfs nosuid,nodev,noexec,mode=755 0 0",
        f"lxc.mount.entry = {pci} sys/bus/pci/devices none bind,ro,create=dir 0 0",
    ]


def build(work: Path, fixtures: Path) -> Dict[int, NodeCT]:
    """Make the sysfs trees under `work` from the recordings in `fixtures` (a tests/fixtures
    dir) and describe the two CTs."""
    work.mkdir(parents=True, exist_ok=True)
    real_ib = ib_tree(fixtures)
    capture = FAULTY_CAPTURE_TEXT + FAULTY_GPU_FAULTS
    return {
        HEALTHY: NodeCT(HEALTHY, "h200-ok", real_ib, write_pci_tree(work / "pci-healthy", h200_hgx()),
                        ("nvidia-smi", "dmesg", "journalctl", "dcgmi"), "healthy"),
        FAULTY: NodeCT(FAULTY, "h200-bad", derive_ib_tree(real_ib, work / "ib-faulty"),
                       write_pci_tree(work / "pci-faulty", h200_hgx(gpu_width={5: 8})),
                       ("nvidia-smi", "dmesg"), "xid79", capture),
    }


def define(lxc_path: Path, base: Path, binds: List[Path], fakes_dir: Path, fixtures: Path,
           node: NodeCT) -> None:
    links = {f"/usr/bin/{tool}": str(fakes_dir / tool) for tool in node.tools}
    d = lxc.define(lxc_path, node.vmid, base, binds, links, extra_lines=sysfs_mounts(node.ib_tree, node.pci_tree),
                   hostname=node.name)
    logs = d / "delta" / LOG_DIR.lstrip("/")
    logs.mkdir(parents=True, exist_ok=True)
    for name in KLOGS.values():
        shutil.copyfile(find_klog(fixtures, name), logs / name)
    os.symlink(KLOGS[node.kernel_log], logs / "kernel.log")
    if node.capture:
        captures = d / "delta" / CAPTURE_DIR.lstrip("/")
        captures.mkdir(parents=True, exist_ok=True)
        (captures / f"{FAULTY_CAPTURE}.txt").write_text(node.capture)
