"""node-check's PCIe check: link width and generation of every GPU and NIC, and AER counters.

Standard library only, Python 3.8+, importable on its own (node_check.py imports it from the
run's private temp dir). Reads sysfs, calls no tool: for each ``<sys_root>/bus/pci/devices/<bdf>/``
(a symlink into ``/sys/devices/...`` on a node, a plain directory in a test tree) ``vendor``,
``class``, ``current_link_speed`` ("32.0 GT/s PCIe"; older kernels "16 GT/s"),
``current_link_width``, ``max_link_speed``, ``max_link_width`` and the AER counters
``aer_dev_correctable`` / ``aer_dev_nonfatal`` / ``aer_dev_fatal`` ("NAME count" lines ending in
``TOTAL_ERR_*``; the kernel's ABI document sysfs-bus-pci-devices-aer_stats). The kernel's document
warns that an endpoint's errors may be counted by its link partner instead, so the AER counters
of the device's upstream port (its parent in the sysfs device tree) are read as well.
``parse_lspci_vvv``/``devices_from_lspci`` read the same links from ``lspci -vvv`` (LnkCap,
LnkSta) for a caller that has no sysfs; ``check()`` does not run lspci.

Devices: NVIDIA (0x10de) display/3D controllers (class 0x0300xx, 0x0302xx) are GPUs, named by
their index from ``options["gpus"]`` (nvidia-smi's "00000000:18:00.0" is sysfs's "0000:18:00.0");
Mellanox/NVIDIA networking (0x15b3) InfiniBand (0x0207xx) and Ethernet (0x0200xx) controllers
are NICs, named by PCI address; SR-IOV virtual functions (a ``physfn`` link) are skipped.

Findings (``check="pcie"``; ``gpus`` for GPUs, ``ports`` with the PCI address for NICs):

====================  =====  ========  ==========================================================
code                  level  action    when
====================  =====  ========  ==========================================================
pcie-width-low        fail   reboot    a GPU's link narrower than its maximum (or
                                       ``expect["pcie_width"]``): a link that trained down at boot
                                       may come back after a reboot; if it stays narrow the GPU,
                                       riser or cable needs reseating (drain the node until then)
pcie-width-low        warn   monitor   the same for a NIC
pcie-gen-low          fail   reboot    a GPU's generation below its maximum (or
                                       ``expect["pcie_gen"]``) while ``options["under_load"]``
pcie-gen-idle         info   none      the same without load: idle GPUs lower the link speed on
                                       purpose (power saving), so it is only reported
pcie-gen-low          warn   monitor   a NIC's generation below its maximum (NICs do not
                                       downshift when idle; GCM flags it)
pcie-link-down        fail   reboot    current link width 0 (the device is not on the bus)
pcie-aer-fatal        fail   reboot    fatal uncorrectable AER errors counted since boot
pcie-aer-nonfatal     warn   monitor   non-fatal uncorrectable AER errors
pcie-aer-correctable  warn   monitor   correctable AER errors at or above AER_CORRECTABLE_THRESHOLD
pcie-acs-redirect     warn   monitor   RDMA devices present, and a PCIe switch port between a GPU
                                       and a NIC behind the same switch has ACS P2P Request or
                                       Completion Redirect on: GPUDirect RDMA traffic goes up to
                                       the root complex instead of across the switch (NCCL's docs:
                                       slow, or a hang)
pcie-acs-unread       info   none      the same GPU/NIC pairs, but the bridges' config space past
                                       its first 64 bytes is root's alone: ACS not read
====================  =====  ========  ==========================================================

ACS (Access Control Services): the PCIe extended capability 0x000D in each bridge's config space
(sysfs ``config``; its control register at +6: bit 2 P2P Request Redirect, bit 3 P2P Completion
Redirect), on the bridges below the lowest one a GPU and a NIC share (the switch's downstream
ports they sit behind); a GPU and a NIC that share no switch talk through the root complex
anyway. ``lspci -vvv``'s ``ACSCtl:`` lines (``ReqRedir+``/``CmpltRedir+``) and its bridges'
``Bus: primary=, secondary=, subordinate=`` give the same (``acs_from_lspci``), for a caller
with a recorded lspci.

Facts (configuration only, no counters): ``pcie.acs_redirect_ports`` (switch ports between a
GPU and a NIC with ACS redirect on, where read), ``pcie.gpuN.width``, ``pcie.gpuN.max_width``,
``pcie.gpuN.max_gen``, and ``pcie.gpuN.gen`` only with ``under_load`` (an idle GPU's current
generation changes from one second to the next and would make every baseline differ); NICs (and
GPUs nvidia-smi did not list) as ``pcie.<bdf>.width``, ``.max_width``, ``.gen``, ``.max_gen``.
"""

import os
import re

import _remote
from _remote import fmt_indices, read_text

CHECK = "pcie"

NVIDIA = "0x10de"
MELLANOX = "0x15b3"
GPU_CLASSES = ("0x0300", "0x0302")
NIC_CLASSES = {"0x0207": "InfiniBand", "0x0200": "Ethernet"}

# GT/s per lane -> PCIe generation
GEN_BY_GTS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}

AER_CORRECTABLE_THRESHOLD = 100

# what a GPU model's PCIe link is when sysfs has no max_link_* (gen, width)
MODEL_LINK = (("GB200", (5, 16)), ("B200", (5, 16)), ("H200", (5, 16)), ("H100", (5, 16)),
              ("H800", (5, 16)), ("A100", (4, 16)), ("A800", (4, 16)))


def finding(level, code, message, action, hint=None, gpus=None, ports=None):
    f = {"level": level, "code": code, "message": message, "action": action, "check": CHECK}
    if hint:
        f["hint"] = hint
    if gpus:
        f["gpus"] = sorted(set(gpus))
    if ports:
        f["ports"] = list(ports)
    return f


# --------------------------------------------------------------------------- parsers


def parse_speed(text):
    """"32.0 GT/s PCIe" / "16 GT/s" / "2.5 GT/s" -> GT/s as float; "Unknown"/None -> None."""
    m = re.match(r"\s*([0-9.]+)\s*GT/s", text or "")
    if not m:
        return None
    try:
        return float(m.group(1))
    except ValueError:
        return None


def speed_gen(gts):
    """8.0 -> 3, 32.0 -> 5; None for None or a rate outside the table."""
    if gts is None:
        return None
    for rate, gen in GEN_BY_GTS.items():
        if abs(gts - rate) < 0.05:
            return gen
    return None


def parse_width(text):
    """"16" -> 16 ("x16" too); None if unreadable."""
    m = re.match(r"\s*x?(\d+)\s*$", text or "")
    return int(m.group(1)) if m else None


def parse_aer(text):
    """An ``aer_dev_*`` file -> ({name: count}, total). Names as the kernel prints them ("RxErr",
    or "Receiver Error" on older kernels); total from the TOTAL_ERR_* line, else the sum.
    (None, None) if unreadable."""
    if text is None:
        return None, None
    counts, total = {}, None
    for line in text.splitlines():
        parts = line.rsplit(None, 1)
        if len(parts) != 2:
            continue
        name, value = parts[0].strip(), parts[1]
        try:
            n = int(value)
        except ValueError:
            continue
        if name.startswith("TOTAL_ERR"):
            total = n
        else:
            counts[name] = n
    if total is None:
        total = sum(counts.values())
    return counts, total


def normalise_bdf(text):
    """nvidia-smi's "00000000:18:00.0" (or "0000:18:00.0", any case) -> "0000:18:00.0"."""
    m = re.match(r"\s*([0-9a-fA-F]+):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])\s*$",
                 str(text or ""))
    if not m:
        return None
    return "%04x:%02x:%02x.%s" % (int(m.group(1), 16) & 0xffff, int(m.group(2), 16),
                                  int(m.group(3), 16), m.group(4))


_BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _read_aer(devdir):
    out = {}
    for kind, names in (("fatal", ("aer_dev_fatal", "aer/err_fatal")),
                        ("nonfatal", ("aer_dev_nonfatal", "aer/err_nonfatal")),
                        ("correctable", ("aer_dev_correctable", "aer/err_cor"))):
        for name in names:
            counts, total = parse_aer(read_text(os.path.join(devdir, name)))
            if counts is not None:
                out[kind] = {"total": total,
                             "counts": dict((k, v) for k, v in counts.items() if v)}
                break
    return out


def read_device(devdir):
    """One PCI device directory -> a dict (values None where a file is missing)."""
    cls = (read_text(os.path.join(devdir, "class")) or "").lower()
    speed = parse_speed(read_text(os.path.join(devdir, "current_link_speed")))
    max_speed = parse_speed(read_text(os.path.join(devdir, "max_link_speed")))
    dev = {
        "bdf": os.path.basename(os.path.normpath(devdir)),
        "vendor": (read_text(os.path.join(devdir, "vendor")) or "").lower() or None,
        "device": (read_text(os.path.join(devdir, "device")) or "").lower() or None,
        "class": cls or None,
        "speed": speed, "gen": speed_gen(speed),
        "max_speed": max_speed, "max_gen": speed_gen(max_speed),
        "width": parse_width(read_text(os.path.join(devdir, "current_link_width"))),
        "max_width": parse_width(read_text(os.path.join(devdir, "max_link_width"))),
        "is_vf": os.path.lexists(os.path.join(devdir, "physfn")),
        "aer": _read_aer(devdir),
        "upstream": None, "upstream_aer": {},
    }
    parent = os.path.dirname(os.path.realpath(devdir))
    if _BDF.match(os.path.basename(parent)):
        dev["upstream"] = os.path.basename(parent)
        dev["upstream_aer"] = _read_aer(parent)
    return dev


def kind_of(dev):
    """"gpu", ("nic", link type) or None."""
    cls = dev.get("class") or ""
    if dev.get("vendor") == NVIDIA and cls[:6] in GPU_CLASSES:
        return "gpu", None
    if dev.get("vendor") == MELLANOX and cls[:6] in NIC_CLASSES and not dev.get("is_vf"):
        return "nic", NIC_CLASSES[cls[:6]]
    return None, None


def read_devices(sys_root="/sys"):
    """The GPUs and NICs under ``<sys_root>/bus/pci/devices``: read_device() dicts with
    ``kind`` ("gpu" | "nic") and ``link`` (a NIC's "InfiniBand" | "Ethernet") added."""
    base = os.path.join(sys_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(base, name)
        vendor = (read_text(os.path.join(path, "vendor")) or "").lower()
        if vendor not in (NVIDIA, MELLANOX):
            continue
        dev = read_device(path)
        kind, link = kind_of(dev)
        if kind:
            dev["kind"], dev["link"] = kind, link
            out.append(dev)
    return out


_LSPCI_HEAD = re.compile(r"^((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
                         r"([^:]+?)(?:\s+\[[0-9a-fA-F]{4}\])?:\s*(.*)$")
_LNK = re.compile(r"Speed\s+([0-9.]+)\s*GT/s.*?Width\s+x(\d+)")


def parse_lspci_vvv(text):
    """``lspci -vvv`` (or ``-vvv -nn``/``-D``) -> one dict per device that has a PCIe link:
    ``{"bdf", "class_name", "desc", "speed", "width", "max_speed", "max_width"}`` from its
    LnkSta (current) and LnkCap (maximum) lines. An alternative source where sysfs has no link
    files; check() itself reads sysfs."""
    out, cur = [], None
    for line in (text or "").splitlines():
        m = _LSPCI_HEAD.match(line)
        if m:
            bdf = m.group(1).lower()
            cur = {"bdf": bdf if bdf.count(":") == 2 else "0000:" + bdf,
                   "class_name": m.group(2).strip(), "desc": m.group(3).strip(),
                   "speed": None, "width": None, "max_speed": None, "max_width": None}
            out.append(cur)
            continue
        stripped = line.strip()
        if cur is None or not stripped.startswith(("LnkCap:", "LnkSta:")):
            continue
        lm = _LNK.search(stripped)
        if not lm:
            continue
        which = ("max_speed", "max_width") if stripped.startswith("LnkCap:") else \
            ("speed", "width")
        cur[which[0]], cur[which[1]] = float(lm.group(1)), int(lm.group(2))
    return [d for d in out if d["width"] is not None or d["max_width"] is not None]


def devices_from_lspci(text):
    """parse_lspci_vvv's GPUs and NICs in read_devices()'s shape (no AER: lspci -vvv shows the
    AER status bits, not counts)."""
    out = []
    for d in parse_lspci_vvv(text):
        cls, desc = d["class_name"].lower(), d["desc"]
        if cls in ("3d controller", "vga compatible controller") and "NVIDIA" in desc:
            kind, link = "gpu", None
        elif cls in ("ethernet controller", "infiniband controller") and \
                ("Mellanox" in desc or "ConnectX" in desc) and "Virtual Function" not in desc:
            kind, link = "nic", "InfiniBand" if cls.startswith("infiniband") else "Ethernet"
        else:
            continue
        out.append({"bdf": d["bdf"], "kind": kind, "link": link,
                    "speed": d["speed"], "gen": speed_gen(d["speed"]),
                    "max_speed": d["max_speed"], "max_gen": speed_gen(d["max_speed"]),
                    "width": d["width"], "max_width": d["max_width"],
                    "aer": {}, "upstream": None, "upstream_aer": {}})
    return out


# --------------------------------------------------------------------------- ACS

ACS_CAP_ID = 0x000D
ACS_BITS = (("SrcValid", 0), ("TransBlk", 1), ("ReqRedir", 2), ("CmpltRedir", 3),
            ("UpstreamFwd", 4), ("EgressCtrl", 5), ("DirectTrans", 6))
REDIRECT = ("ReqRedir", "CmpltRedir")
EXT_CAP_START, CONFIG_SIZE = 0x100, 4096


def acs_control(config):
    """The ACS control register of a device's config space (``config``: bytes, as sysfs's
    ``config`` file reads; b"" for a device without extended space) as {flag: bool}; {} when the
    device has no ACS capability; None when the extended space is there but not readable (a
    non-root reader gets the first 64 bytes only)."""
    if config == b"":
        return {}
    if config is None or len(config) < EXT_CAP_START + 8:
        return None
    offset, seen = EXT_CAP_START, set()
    while EXT_CAP_START <= offset <= CONFIG_SIZE - 8 and offset not in seen:
        seen.add(offset)
        header = int.from_bytes(config[offset:offset + 4], "little")
        if header in (0, 0xffffffff):
            return {}
        if header & 0xffff == ACS_CAP_ID:
            ctl = int.from_bytes(config[offset + 6:offset + 8], "little")
            return dict((name, bool(ctl >> bit & 1)) for name, bit in ACS_BITS)
        offset = (header >> 20) & 0xffc
    return {}


def _read_config(devdir):
    """A device's config space as this reader may read it; b"" for a conventional PCI device
    (sysfs's file is 256 bytes: no extended capabilities, so no ACS), None when unreadable."""
    path = os.path.join(devdir, "config")
    try:
        if os.path.getsize(path) <= EXT_CAP_START:
            return b""
        with open(path, "rb") as fh:
            return fh.read(CONFIG_SIZE)
    except OSError:
        return None


def sysfs_topology(devices, sys_root="/sys"):
    """({bdf: [the bridges above it, the root port first]}, {bridge bdf: acs_control()}) for
    ``devices`` (read_devices), from each device's place under /sys/devices (its realpath)."""
    chains, acs = {}, {}
    base = os.path.join(sys_root, "bus", "pci", "devices")
    for dev in devices:
        real = os.path.realpath(os.path.join(base, dev["bdf"]))
        parts = real.split(os.sep)
        bridges = [p for p in parts[:-1] if _BDF.match(p)]
        chains[dev["bdf"]] = bridges
        path = real
        for _ in bridges:
            path = os.path.dirname(path)
            name = os.path.basename(path)
            if name not in acs:
                acs[name] = acs_control(_read_config(path))
    return chains, acs


_BUS_LINE = re.compile(r"^\s+Bus: primary=([0-9a-fA-F]+), secondary=([0-9a-fA-F]+), "
                       r"subordinate=([0-9a-fA-F]+)")
_FLAG = re.compile(r"(\w+)([+-])")


def lspci_topology(text):
    """``lspci -vvv``'s bridges -> ({bdf: [the bridges above it, top first]} for every device,
    {bridge bdf: ACSCtl flags, or {} without an ACSCtl line}). A device's parent is the bridge
    whose secondary bus is its bus (same PCI domain)."""
    heads, secondary, acs = [], {}, {}
    cur = None
    for line in (text or "").splitlines():
        m = _LSPCI_HEAD.match(line)
        if m:
            bdf = m.group(1).lower()
            cur = bdf if bdf.count(":") == 2 else "0000:" + bdf
            heads.append(cur)
            continue
        if cur is None:
            continue
        b = _BUS_LINE.match(line)
        if b:
            secondary[(cur[:4], int(b.group(2), 16))] = cur
            acs.setdefault(cur, {})
        elif line.strip().startswith("ACSCtl:"):
            acs[cur] = dict((k, v == "+") for k, v in _FLAG.findall(line.split(":", 1)[1]))
    chains = {}
    for bdf in heads:
        chain, at = [], bdf
        while len(chain) < 16:
            parent = secondary.get((at[:4], int(at[5:7], 16)))
            if parent is None or parent == at:
                break
            chain.insert(0, parent)
            at = parent
        chains[bdf] = chain
    return chains, dict((k, v) for k, v in acs.items() if k in secondary.values())


def assess_acs(devices, chains, acs):
    """(findings, facts) of ACS redirect between each GPU and each NIC that share a switch:
    the bridges below the lowest one they share (the ports the peer traffic crosses)."""
    gpus = [d for d in devices if d["kind"] == "gpu"]
    nics = [d for d in devices if d["kind"] == "nic"]
    on, unread = {}, []
    for g in gpus:
        for n in nics:
            a, b = chains.get(g["bdf"]) or [], chains.get(n["bdf"]) or []
            shared = 0
            while shared < min(len(a), len(b)) and a[shared] == b[shared]:
                shared += 1
            if not shared:
                continue                  # no common bridge: through the root complex anyway
            for bridge in a[shared:] + b[shared:]:
                flags = acs.get(bridge)
                if flags is None:
                    unread.append((g, n))
                elif any(flags.get(k) for k in REDIRECT):
                    on.setdefault(bridge, (flags, []))[1].append((g, n))
    findings, facts = [], {}
    if on:
        facts["pcie.acs_redirect_ports"] = len(on)
        for bridge, (flags, pairs) in sorted(on.items()):
            gpu_ids = sorted(set(g["gpu_index"] for g, _ in pairs if g.get("gpu_index") is not None))
            what = sorted(set(_label(g) if g.get("gpu_index") is None else "GPU %d" % g["gpu_index"]
                              for g, _ in pairs))
            nic_bdfs = sorted(set(n["bdf"] for _, n in pairs))
            findings.append(finding(
                "warn", "pcie-acs-redirect", "PCIe switch port %s has ACS %s on, between %s and NIC %s: "
                "GPUDirect RDMA goes through the root complex" % (
                    bridge, "/".join(k for k in REDIRECT if flags.get(k)), ", ".join(what),
                    ", ".join(nic_bdfs)), "monitor",
                hint="turn ACS off on the switch ports (the BIOS's ACS/IOMMU setting, or at boot "
                     "`setpci -s BDF ECAP_ACS+0x6.w=0000`; NCCL's troubleshooting guide): with it on, "
                     "NIC<->GPU traffic is slow or hangs",
                gpus=gpu_ids or None, ports=[bridge] + nic_bdfs))
    elif unread:
        who = sorted(set(_label(g) if g.get("gpu_index") is None else "GPU %d" % g["gpu_index"]
                                  for g, _ in unread))
        findings.append(finding(
            "info", "pcie-acs-unread", "ACS of the PCIe switch ports between %s and their NICs not "
            "read: the config space past 64 bytes is root's" % ", ".join(who), "none",
            hint="run node-check as root (hosts.yaml become: sudo) to check ACS"))
    elif any(acs.get(b) is not None for c in chains.values() for b in c):
        facts["pcie.acs_redirect_ports"] = 0
    return findings, facts


def acs_from_lspci(text, gpus=None):
    """assess_acs on a recorded ``lspci -vvv``: its GPUs and NICs (devices_from_lspci), named by
    ``gpus`` (node_check's inventory)."""
    devices = devices_from_lspci(text)
    _name_gpus(devices, gpus)
    chains, acs = lspci_topology(text)
    return assess_acs(devices, chains, acs)


# --------------------------------------------------------------------------- assessment


def model_link(name):
    """(gen, width) a GPU model implies, or (None, None)."""
    up = (name or "").upper()
    for key, link in MODEL_LINK:
        if key in up:
            return link
    return None, None


def _int_expect(expect, key):
    v = expect.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _fold(findings):
    """One finding per (level, code, text after the device label): GPUs folded into "GPUs 0-7",
    NICs into "0000:0c:00.0, 0000:12:00.0"."""
    out, first = _remote.merge_folds(findings)
    for (_, _, rest, _, _), f in first.items():
        if len(f.get("gpus") or []) > 1:
            f["gpus"] = sorted(set(f["gpus"]))
            f["message"] = fmt_indices(f["gpus"]) + rest
        elif len(f.get("ports") or []) > 1:
            f["message"] = ", ".join(f["ports"]) + rest
    return out


def _dev_finding(level, code, dev, rest, action, hint=None):
    if dev.get("gpu_index") is not None:
        f = finding(level, code, "GPU %d" % dev["gpu_index"] + rest, action, hint=hint,
                    gpus=[dev["gpu_index"]])
    else:
        f = finding(level, code, _label(dev) + rest, action, hint=hint, ports=[dev["bdf"]])
    f["_fold"] = (level, code, rest, action, hint or "")
    return f


def _label(dev):
    if dev["kind"] == "gpu":
        return "GPU %s" % dev["bdf"]
    return dev["bdf"]


def _what(dev):
    return "GPU" if dev["kind"] == "gpu" else "%s NIC" % dev.get("link", "")


def _name_gpus(devices, gpus):
    """Each GPU device's ``gpu_index`` from node_check's inventory (by PCI address); returns
    {bdf: inventory entry}."""
    by_bdf = {}
    for g in gpus or []:
        bdf = normalise_bdf(g.get("pci"))
        if bdf and isinstance(g.get("index"), int):
            by_bdf[bdf] = g
    for dev in devices:
        g = by_bdf.get(dev["bdf"]) if dev["kind"] == "gpu" else None
        dev["gpu_index"] = g["index"] if g else None
    return by_bdf


def assess(devices, gpus=None, expect=None, under_load=False):
    """Findings and facts for ``devices`` (read_devices), ``gpus`` (node_check's inventory)."""
    expect = expect or {}
    by_bdf = _name_gpus(devices, gpus)
    want_width = _int_expect(expect, "pcie_width")
    want_gen = _int_expect(expect, "pcie_gen")
    findings, facts = [], {}
    for dev in devices:
        g = by_bdf.get(dev["bdf"]) if dev["kind"] == "gpu" else None
        key = "pcie.gpu%d" % g["index"] if g else "pcie.%s" % dev["bdf"]
        max_gen, max_width = dev["max_gen"], dev["max_width"]
        if dev["kind"] == "gpu":
            m_gen, m_width = model_link(g.get("name") if g else None)
            ref_width = want_width or max_width or m_width
            ref_gen = want_gen or max_gen or m_gen
        else:
            ref_width, ref_gen = max_width, max_gen
        facts[key + ".width"] = dev["width"]
        facts[key + ".max_width"] = max_width if max_width is not None else ref_width
        facts[key + ".max_gen"] = max_gen if max_gen is not None else ref_gen
        if dev["kind"] != "gpu" or under_load:
            facts[key + ".gen"] = dev["gen"]
        findings.extend(_link_findings(dev, ref_width, ref_gen, under_load))
        findings.extend(_aer_findings(dev))
    return _fold(findings), facts


def _link_findings(dev, ref_width, ref_gen, under_load):
    out = []
    gpu = dev["kind"] == "gpu"
    width = dev["width"]
    if width == 0:
        return [_dev_finding("fail", "pcie-link-down", dev,
                             ": PCIe link down (current width 0)", "reboot",
                             "the device dropped off the bus; check the kernel log (Xid 79, "
                             "AER) and reboot; if it recurs, reseat or RMA")]
    if width is not None and ref_width and width < ref_width:
        rest = ": PCIe link x%d, expected x%d" % (width, ref_width)
        if gpu:
            out.append(_dev_finding(
                "fail", "pcie-width-low", dev, rest, "reboot",
                "a link that trained narrow at boot can come back after a reboot; if it stays "
                "narrow, reseat the GPU/riser/cable (drain the node until then): host<->GPU "
                "bandwidth is cut by the missing lanes"))
        else:
            out.append(_dev_finding(
                "warn", "pcie-width-low", dev, rest, "monitor",
                "the NIC's PCIe link is narrower than it can be: it may not reach its line rate; "
                "reseat the card or check the slot/riser"))
    gen = dev["gen"]
    if gen is not None and ref_gen and gen < ref_gen:
        rest = ": PCIe gen %d (%s GT/s), expected gen %d" % (gen, _gts(dev["speed"]), ref_gen)
        if gpu and under_load:
            out.append(_dev_finding(
                "fail", "pcie-gen-low", dev, rest + " under load", "reboot",
                "a busy GPU's link should run at full speed: reboot; if it persists, reseat the "
                "GPU/riser (drain the node until then)"))
        elif gpu:
            out.append(_dev_finding(
                "info", "pcie-gen-idle", dev,
                ": PCIe gen %d of %d (an idle GPU lowers its link speed on purpose; judged only "
                "under load)" % (gen, ref_gen), "none"))
        else:
            out.append(_dev_finding(
                "warn", "pcie-gen-low", dev, rest, "monitor",
                "the NIC's link trained below its speed (a Gen downshift): reseat the card or "
                "check the slot/riser; it may not reach its line rate"))
    return out


def _gts(v):
    return ("%g" % v) if v is not None else "?"


def _aer_text(entry):
    detail = ", ".join("%s %d" % kv for kv in sorted(entry["counts"].items()))
    return "%d%s" % (entry["total"], " (%s)" % detail if detail else "")


def _aer_findings(dev):
    out = []
    for aer, where in ((dev["aer"], ""),
                       (dev["upstream_aer"], " at its upstream port %s" % dev["upstream"])):
        fatal = (aer.get("fatal") or {}).get("total") or 0
        nonfatal = (aer.get("nonfatal") or {}).get("total") or 0
        cor = (aer.get("correctable") or {}).get("total") or 0
        if fatal:
            out.append(_dev_finding(
                "fail", "pcie-aer-fatal", dev,
                ": %s fatal PCIe AER errors since boot%s" % (_aer_text(aer["fatal"]), where),
                "reboot", "a fatal PCIe error leaves the link unusable until reset; reboot, and "
                "if it recurs reseat or RMA the device"))
        if nonfatal:
            out.append(_dev_finding(
                "warn", "pcie-aer-nonfatal", dev,
                ": %s non-fatal uncorrectable PCIe AER errors since boot%s"
                % (_aer_text(aer["nonfatal"]), where), "monitor",
                "transactions were lost and recovered; watch whether the count grows"))
        if cor >= AER_CORRECTABLE_THRESHOLD:
            out.append(_dev_finding(
                "warn", "pcie-aer-correctable", dev,
                ": %s correctable PCIe AER errors since boot%s (threshold %d)"
                % (_aer_text(aer["correctable"]), where, AER_CORRECTABLE_THRESHOLD), "monitor",
                "a marginal link (signal integrity): replays cost bandwidth; watch whether the "
                "count grows, reseat if it does"))
    return out


# --------------------------------------------------------------------------- entry point



def check(expect, run_tool, **options):
    """The node-check module API: ``{"findings": [...], "facts": {...}}``. Uses
    ``options["sys_root"]`` (default "/sys"), ``options["gpus"]`` (index <-> PCI address) and
    ``options["under_load"]`` (default False); no tools. ACS only where RDMA devices exist."""
    sys_root = options.get("sys_root") or "/sys"
    devices = read_devices(sys_root)
    findings, facts = assess(devices, options.get("gpus") or [], expect or {},
                             bool(options.get("under_load")))
    if devices and _remote.rdma_devices(sys_root):
        more, acs_facts = assess_acs(devices, *sysfs_topology(devices, sys_root))
        findings.extend(more)
        facts.update(acs_facts)
    return {"findings": findings, "facts": facts}
