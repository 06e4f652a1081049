"""node-check's InfiniBand / RoCE check: ports, rates, error counters and link flaps.

Standard library only, Python 3.8+, importable on its own (node_check.py imports it from the
run's private temp dir). Reads sysfs, calls no tool:

- ``<sys_root>/class/infiniband/<dev>/``: ``fw_ver``, ``hca_type``, ``board_id`` and per port
  ``ports/<n>/``: ``state`` ("4: ACTIVE"), ``phys_state`` ("5: LinkUp"), ``rate``
  ("400 Gb/sec (4X NDR)"), ``link_layer`` ("InfiniBand" | "Ethernet"), ``counters/*``.
  ``<dev>`` is a symlink into ``/sys/devices/...`` on a real node and a plain directory in a
  copied tree (the lab bind-mounts one at ``/sys/class/infiniband``); both read the same.
  The HCA's PCI device dir (for its IPoIB/RoCE netdevs under ``net/``) is ``<dev>/device``, or
  the parent of the ``infiniband`` dir the symlink resolves into; neither is required.
- ``options["kernel_log"]["text"]`` for link flaps: systemd-networkd's ``ib6: lost carrier``
  (syslog; not in ``journalctl -k``) and the kernel's ``mlx5_core 0000:ba:00.0 ens1np0: Link
  down``. The text is already cut to node-check's window (``--since``, default 24 h).

Findings (``check="ib"``; ``ports`` names "mlx5_0/1", or a netdev for flaps):

======================  =====  ========  =================================================
code                    level  action    when
======================  =====  ========  =================================================
ib-port-down            fail   drain     a fabric port not ACTIVE (or its phys state not
                                         LinkUp): Down/Polling (cable, transceiver, switch
                                         port), Disabled, INIT/ARMED (no subnet manager)
eth-port-down           warn   monitor   an Ethernet (RoCE) port down on a node whose fabric
                                         is InfiniBand (a spare port; the fabric is counted
                                         apart)
ib-port-count           fail   drain     fewer ACTIVE fabric ports than ``expect["ib_ports"]``
ib-port-count           info   none      more ACTIVE fabric ports than expected
ib-no-devices           fail   drain     no RDMA device at all while ``ib_ports`` > 0
ib-rate-low             fail   drain     an ACTIVE InfiniBand port below ``expect["ib_rate"]``
                                         (Gb/s); never applied to Ethernet ports (a RoCE bond
                                         at 200 Gb/s beside NDR-400 IB ports is healthy)
ib-rate-high            info   none      an InfiniBand port above ``ib_rate``
ib-rate-mixed           warn   monitor   without ``ib_rate``: an ACTIVE IB port slower than the
                                         node's fastest IB port of the same HCA type
ib-counters             warn   monitor   error counters at or above COUNTER_THRESHOLDS
ipoib-down              warn   monitor   a port ACTIVE but its IPoIB netdev's operstate down
ib-carrier-flaps        warn   monitor   an IPoIB netdev's ``carrier_down_count`` (since boot)
                                         at or above CARRIER_DOWN_THRESHOLD
ib-link-flap            warn   monitor   one link-down of an RDMA netdev in the kernel log
ib-link-flap            fail   drain     more than FLAP_THRESHOLD link-downs of one device
======================  =====  ========  =================================================

Which ports are "the fabric": the InfiniBand link-layer ports; on a node that has none (a RoCE
cluster) every RDMA port. ``expect["ib_ports"]`` counts those.

Link flaps: Azure's NHC (azurehpc-health-checks, ``customTests/azure_ib_link_flapping.nhc``)
counts the "lost carrier" lines of each IB device in the syslog within a lookback window and
fails the node above a threshold (its tests: 24 h, threshold 1; older versions failed on a second
flap within 6 h, fault code NHC2005); Meta's GCM ``link-flaps`` check makes an IB flap critical
and an Ethernet one a warning. We fail above FLAP_THRESHOLD link-downs of one device in the
kernel log window and keep a single one (a switch reboot, a re-cabled port) a warning.

Counters are cumulative since the driver loaded or someone cleared them (``perfquery -x -r``), so
the thresholds are counts, not rates, and deliberately loose; they say "worth a look", never
drain. ``excessive_buffer_overrun_errors`` is not judged: it is a 4-bit counter that reads 15
(saturated) on every port of a healthy recorded H100 host. A counter at its width's maximum
(255 for the 8-bit link_downed) is said to be "at least" that.

Facts (configuration only, no counters): ``ib.<dev>/<port>.rate`` (Gb/s), ``.state``,
``.link_layer``; ``ib.<dev>.fw``, ``ib.<dev>.hca_type``, ``ib.<dev>.board_id``; ``ib.ports`` (the
ACTIVE fabric ports). The OFED version is not a fact of this module: node_check sets ``ofed``
from ``ofed_version()``.
"""

import os
import re

import _remote
from _remote import read_text

CHECK = "ib"

# counter file -> (threshold, what it means). At or above the threshold: warn, monitor.
COUNTER_THRESHOLDS = {
    "link_downed": (10, "the link went down and retrained"),
    "link_error_recovery": (10, "link error recoveries"),
    "symbol_error": (1000, "symbol errors (bit errors on the wire: cable, transceiver)"),
    "port_rcv_errors": (1000, "received packets with errors"),
    "local_link_integrity_errors": (10, "local physical errors over the limit"),
    "port_rcv_remote_physical_errors": (1000, "packets marked bad by the far end"),
}
# saturating widths of the IB PortCounters (IBA spec): said as "at least N"
COUNTER_MAX = {"link_downed": 255, "link_error_recovery": 255, "symbol_error": 65535,
               "port_rcv_errors": 65535, "local_link_integrity_errors": 15,
               "port_rcv_remote_physical_errors": 65535}

CARRIER_DOWN_THRESHOLD = 10  # an IPoIB netdev's carrier_down_count since boot: warn, monitor
FLAP_THRESHOLD = 1  # link-downs of one device in the window above which it fails (Azure NHC)

_STATE_HINTS = {
    "Polling": "the port looks for a peer and finds none: check the cable, transceiver and "
               "switch port (mlxlink -d DEV -m)",
    "Disabled": "the port is disabled (by an administrator, firmware or the switch): "
                "ibportstate / mlxlink show why",
    "INIT": "the link is up but no subnet manager has configured the port: check opensm/UFM "
            "and the switch",
    "ARMED": "the subnet manager has not activated the port yet: check opensm/UFM",
}

_FLAP_NETWORKD = re.compile(r"systemd-networkd\[\d+\]:\s+(\S+):\s+(lost carrier|gained carrier)",
                            re.I)
_FLAP_MLX5 = re.compile(r"mlx5_core\s+([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d)"
                        r"(?:\s+(\S+?))?:\s+Link (down|up)\b")
_IB_NETDEV = re.compile(r"^ib(p\d+s\d+(f\d+)?|\d+)")


def finding(level, code, message, action, hint=None, ports=None):
    f = {"level": level, "code": code, "message": message, "action": action, "check": CHECK}
    if hint:
        f["hint"] = hint
    if ports:
        f["ports"] = list(ports)
    return f


def port_finding(level, code, label, rest, action, hint=None):
    """A finding about one port, "LABEL: REST"; fold_ports merges those that say the same REST
    about several ports into one ("mlx5_0/1, mlx5_1/1: rate 100 Gb/s, expected 200")."""
    f = finding(level, code, label + rest, action, hint=hint, ports=[label])
    f["_fold"] = (level, code, rest, action, hint or "")
    return f


def fold_ports(findings):
    out, first = _remote.merge_folds(findings)
    for (_, _, rest, _, _), f in first.items():
        if len(f["ports"]) > 1:
            f["message"] = ", ".join(f["ports"]) + rest
    return out


# --------------------------------------------------------------------------- parsers


def parse_state(text):
    """"4: ACTIVE" -> ("ACTIVE", 4); "5: LinkUp" -> ("LinkUp", 5); None -> (None, None)."""
    if text is None:
        return None, None
    m = re.match(r"\s*(\d+)\s*:\s*(.+?)\s*$", text)
    if m:
        return m.group(2), int(m.group(1))
    return text.strip() or None, None


def parse_rate(text):
    """"400 Gb/sec (4X NDR)" -> 400; "2.5 Gb/sec (1X SDR)" -> 2.5; None if unreadable."""
    m = re.match(r"\s*([0-9.]+)\s*Gb/sec", text or "")
    if not m:
        return None
    try:
        v = float(m.group(1))
    except ValueError:
        return None
    return int(v) if v == int(v) else v


def parse_counter(text):
    try:
        return int((text or "").split()[0])
    except (ValueError, IndexError):
        return None


def _pci_dir(dev_path):
    """The HCA's PCI device directory, or None (copied trees have no ``device`` link)."""
    link = os.path.join(dev_path, "device")
    if os.path.isdir(link):
        return os.path.realpath(link)
    real = os.path.realpath(dev_path)
    parent = os.path.dirname(real)
    if os.path.basename(parent) == "infiniband" and real != os.path.abspath(dev_path):
        return os.path.dirname(parent)
    return None


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _port_sort_key(name):
    return (0, int(name)) if name.isdigit() else (1, name)


def _dev_sort_key(name):
    m = re.match(r"(.*?)(\d+)$", name)
    return (m.group(1), int(m.group(2)), name) if m else (name, -1, name)


def read_devices(class_dir):
    """The RDMA devices under ``class_dir`` (``/sys/class/infiniband``): a list of
    ``{"name", "fw", "hca_type", "board_id", "pci",
    "netdevs": {name: {"operstate", "carrier_down"}},
    "ports": [{"port", "state", "state_num", "phys_state", "phys_num", "rate", "rate_text",
    "link_layer", "counters": {name: int}}]}``; [] when the dir is missing."""
    devices = []
    for name in sorted(_listdir(class_dir), key=_dev_sort_key):
        path = os.path.join(class_dir, name)
        if not os.path.isdir(path):
            continue
        dev = {"name": name, "fw": read_text(os.path.join(path, "fw_ver")),
               "hca_type": read_text(os.path.join(path, "hca_type")),
               "board_id": read_text(os.path.join(path, "board_id")),
               "pci": None, "netdevs": {}, "ports": []}
        pci = _pci_dir(path)
        if pci:
            dev["pci"] = os.path.basename(pci)
            for nd in _listdir(os.path.join(pci, "net")):
                ndir = os.path.join(pci, "net", nd)
                dev["netdevs"][nd] = {
                    "operstate": read_text(os.path.join(ndir, "operstate")),
                    "carrier_down": parse_counter(read_text(os.path.join(ndir,
                                                                         "carrier_down_count")))}
        ports_dir = os.path.join(path, "ports")
        for pn in sorted(_listdir(ports_dir), key=_port_sort_key):
            pdir = os.path.join(ports_dir, pn)
            if not os.path.isdir(pdir):
                continue
            state, state_num = parse_state(read_text(os.path.join(pdir, "state")))
            phys, phys_num = parse_state(read_text(os.path.join(pdir, "phys_state")))
            rate_text = read_text(os.path.join(pdir, "rate"))
            counters = {}
            for c in COUNTER_THRESHOLDS:
                v = parse_counter(read_text(os.path.join(pdir, "counters", c)))
                if v is not None:
                    counters[c] = v
            dev["ports"].append({
                "port": pn, "state": state, "state_num": state_num, "phys_state": phys,
                "phys_num": phys_num, "rate": parse_rate(rate_text), "rate_text": rate_text,
                "link_layer": read_text(os.path.join(pdir, "link_layer")) or "InfiniBand",
                "counters": counters})
        devices.append(dev)
    return devices


def parse_link_flaps(text):
    """Link-down events per device in a kernel log / syslog text:
    ``{device: {"down": n, "up": n, "pci": bdf|None}}``; device is the netdev name (or the PCI
    address when a mlx5_core line names none). Only RDMA netdevs count: systemd-networkd lines
    for IPoIB names (ib0, ibp12s0) and every mlx5_core "Link down/up" line."""
    out = {}
    for line in (text or "").splitlines():
        m = _FLAP_NETWORKD.search(line)
        if m:
            name, what = m.group(1), m.group(2).lower()
            if not _IB_NETDEV.match(name):
                continue
            e = out.setdefault(name, {"down": 0, "up": 0, "pci": None})
            e["down" if what == "lost carrier" else "up"] += 1
            continue
        m = _FLAP_MLX5.search(line)
        if m:
            bdf, name, what = m.group(1).lower(), m.group(2), m.group(3)
            e = out.setdefault(name or bdf, {"down": 0, "up": 0, "pci": bdf})
            e["down" if what == "down" else "up"] += 1
    return out


def ofed_version(sys_root="/sys"):
    """(version, source) of the Mellanox/NVIDIA OFED stack, or (None, None): MLNX_OFED/DOCA
    writes its version into ``module/mlx5_core/version`` (``module/mlx_compat`` exists only with
    it); the kernel's own (inbox) mlx5_core has no version file: ("inbox", path)."""
    core = os.path.join(sys_root, "module", "mlx5_core")
    v = read_text(os.path.join(core, "version"))
    if v:
        return v, os.path.join(core, "version")
    compat = os.path.join(sys_root, "module", "mlx_compat")
    v = read_text(os.path.join(compat, "version"))
    if v:
        return v, os.path.join(compat, "version")
    if os.path.isdir(compat):
        return "mlnx-ofed", compat
    if os.path.isdir(core):
        return "inbox", core
    return None, None


# --------------------------------------------------------------------------- assessment


def _fmt_rate(v):
    return "%s Gb/s" % v


def _port_label(dev, port):
    return "%s/%s" % (dev["name"], port["port"])


def assess(devices, expect=None, flaps=None):
    """Findings and facts for ``devices`` (read_devices) and ``flaps`` (parse_link_flaps)."""
    expect = expect or {}
    findings, facts = [], {}
    ports = [(d, p) for d in devices for p in d["ports"]]
    has_ib = any(p["link_layer"] == "InfiniBand" for _, p in ports)

    def is_fabric(p):
        return p["link_layer"] == "InfiniBand" or not has_ib

    for d in devices:
        for key, fact in (("fw", "fw"), ("hca_type", "hca_type"), ("board_id", "board_id")):
            if d[key]:
                facts["ib.%s.%s" % (d["name"], fact)] = d[key]
    active = 0
    for d, p in ports:
        label = _port_label(d, p)
        facts["ib.%s.rate" % label] = p["rate"]
        facts["ib.%s.state" % label] = p["state"]
        facts["ib.%s.link_layer" % label] = p["link_layer"]
        up = p["state"] == "ACTIVE" and p["phys_state"] in ("LinkUp", None)
        if up and is_fabric(p):
            active += 1
        if not up:
            what = ": state %s, physical state %s" % (p["state"] or "unreadable",
                                                      p["phys_state"] or "unreadable")
            hint = _STATE_HINTS.get(p["phys_state"]) or _STATE_HINTS.get(p["state"])
            if is_fabric(p):
                findings.append(port_finding(
                    "fail", "ib-port-down", label,
                    what + " (%s), expected ACTIVE/LinkUp" % p["link_layer"], "drain", hint))
            else:
                findings.append(port_finding(
                    "warn", "eth-port-down", label,
                    what + " (an Ethernet port beside the InfiniBand fabric)", "monitor", hint))
        for nd, info in sorted(d["netdevs"].items()):
            if not _IB_NETDEV.match(nd) or p["link_layer"] != "InfiniBand":
                continue
            if up and info["operstate"] == "down":
                findings.append(port_finding(
                    "warn", "ipoib-down", label,
                    " (%s): port ACTIVE but its IPoIB interface is down" % nd, "monitor",
                    "ip link set DEV up, or check the interface's netplan/ifcfg"))
            downs = info["carrier_down"]
            if downs is not None and downs >= CARRIER_DOWN_THRESHOLD:
                findings.append(port_finding(
                    "warn", "ib-carrier-flaps", label,
                    " (%s): carrier went down %d times since boot (carrier_down_count, "
                    "threshold %d)" % (nd, downs, CARRIER_DOWN_THRESHOLD), "monitor",
                    "a link that keeps losing carrier: check the cable, transceiver and switch "
                    "port; the kernel log says when (ib-link-flap)"))
        findings.extend(_counter_findings(label, p))
    findings.extend(_rate_findings(ports, expect))
    facts["ib.ports"] = active

    want = expect.get("ib_ports")
    if isinstance(want, int) and not isinstance(want, bool):
        kind = "InfiniBand" if has_ib or not ports else "RDMA"
        if not devices and want > 0:
            findings.append(finding(
                "fail", "ib-no-devices",
                "no RDMA device in /sys/class/infiniband, expected %d %s ports" % (want, kind),
                "drain", hint="the HCA driver is not loaded (lsmod | grep mlx5_ib) or the "
                "HCAs are missing (lspci -d 15b3:)"))
        elif active < want:
            findings.append(finding(
                "fail", "ib-port-count",
                "%d of %d expected %s ports ACTIVE" % (active, want, kind), "drain"))
        elif active > want:
            findings.append(finding(
                "info", "ib-port-count",
                "%d %s ports ACTIVE, expected %d" % (active, kind, want), "none"))
    findings.extend(_flap_findings(flaps or {}, devices))
    return fold_ports(findings), facts


def _counter_findings(label, p):
    over = []
    for name, (limit, meaning) in sorted(COUNTER_THRESHOLDS.items()):
        v = p["counters"].get(name)
        if v is None or v < limit:
            continue
        at_max = COUNTER_MAX.get(name) == v
        over.append("%s %s%d (%s; threshold %d)"
                    % (name, "at least " if at_max else "", v, meaning, limit))
    if not over:
        return []
    return [port_finding("warn", "ib-counters", label, ": " + ", ".join(over), "monitor",
                         "counted since the driver loaded or the counters were cleared; watch "
                         "whether they grow (perfquery -x, or read them again) and check the "
                         "cable and switch port if they do")]


def _rate_findings(ports, expect):
    out = []
    ib_up = [(d, p) for d, p in ports
             if p["link_layer"] == "InfiniBand" and p["state"] == "ACTIVE" and p["rate"]]
    want = expect.get("ib_rate")
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        for d, p in ib_up:
            label = _port_label(d, p)
            if p["rate"] < want:
                out.append(port_finding(
                    "fail", "ib-rate-low", label,
                    ": rate %s (%s), expected %s" % (_fmt_rate(p["rate"]), p["rate_text"], want),
                    "drain", "the link trained below its speed: a degraded cable, transceiver "
                    "or switch port (mlxlink -d DEV -m shows the lanes and the cable)"))
            elif p["rate"] > want:
                out.append(port_finding(
                    "info", "ib-rate-high", label,
                    ": rate %s, expected %s" % (_fmt_rate(p["rate"]), want), "none"))
        return out
    by_type = {}
    for d, p in ib_up:
        by_type.setdefault(d["hca_type"], []).append((d, p))
    for group in by_type.values():
        top = max(p["rate"] for _, p in group)
        for d, p in group:
            if p["rate"] < top:
                out.append(port_finding(
                    "warn", "ib-rate-mixed", _port_label(d, p),
                    ": rate %s, the node's other %s ports run at %s"
                    % (_fmt_rate(p["rate"]), d["hca_type"] or "InfiniBand", top), "monitor",
                    "set expect: ib_rate in hosts.yaml to make this a check"))
    return out


def _flap_findings(flaps, devices):
    by_netdev, by_pci = {}, {}
    for d in devices:
        fabric_port = "%s/%s" % (d["name"], d["ports"][0]["port"]) if d["ports"] else d["name"]
        for nd in d["netdevs"]:
            by_netdev[nd] = fabric_port
        if d["pci"]:
            by_pci[d["pci"]] = fabric_port
    out = []
    for name in sorted(flaps):
        e = flaps[name]
        downs = e["down"]
        if downs < 1:
            continue
        port = by_netdev.get(name) or by_pci.get(e.get("pci") or "")
        where = "%s (%s)" % (name, port) if port else name
        ports = [port] if port else [name]
        if downs > FLAP_THRESHOLD:
            out.append(finding(
                "fail", "ib-link-flap",
                "%s: link went down %d times in the kernel log window (more than %d: flapping)"
                % (where, downs, FLAP_THRESHOLD), "drain",
                hint="a flapping link stalls or kills collective jobs: check the cable, "
                "transceiver and switch port", ports=ports))
        else:
            out.append(finding(
                "warn", "ib-link-flap",
                "%s: link went down once in the kernel log window" % where, "monitor",
                hint="one link-down can be a switch reboot or a re-cabled port; more make it "
                "a fail", ports=ports))
    return out


# --------------------------------------------------------------------------- entry point


def check(expect, run_tool, **options):
    """The node-check module API: ``{"findings": [...], "facts": {...}}``. Uses
    ``options["sys_root"]`` (default "/sys") and ``options["kernel_log"]["text"]``; no tools."""
    sys_root = options.get("sys_root") or "/sys"
    devices = read_devices(os.path.join(sys_root, "class", "infiniband"))
    log = options.get("kernel_log") or {}
    flaps = parse_link_flaps(log.get("text") or "")
    findings, facts = assess(devices, expect or {}, flaps)
    return {"findings": findings, "facts": facts}
