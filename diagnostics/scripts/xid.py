#!/usr/bin/env python3
"""xid: NVIDIA Xid and NVSwitch SXid events in a kernel log, each with an action.

Standard library only, Python 3.8+, importable on its own. Shipped beside node_check.py,
gpu_status.py and scan_log.py with its data file ``xid_catalog.json`` (one catalog for all
three; load_catalog() reads it from this file's directory).

Pure parts (the unit tests drive them with recorded kernel logs):

- ``parse_kernel_log(text) -> [event]``: every ``NVRM: Xid`` line, every NVSwitch ``SXid``
  line, and a GPU that fell off the bus in the driver's words without an Xid 79 line for that
  GPU in the 20 lines before or after it (then it is taken as Xid 79, ``derived``):
  ``NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.`` (also ``GPU 18:00.0``, no PCI
  domain: domain 0000, as GPUd's normalizePCIBDF), and NVIDIA's three-line message ``NVRM: The
  NVIDIA GPU 0000:b3:00.0`` / ``NVRM: (PCI ID: 10de:26b5) installed in this system has`` /
  ``NVRM: fallen off the bus and is not responding to commands.`` -- as kernel-log lines of
  their own (the last within 4 lines of the first; journalctl indents a multi-line entry's
  later lines, NVSentinel's gpufallen tests), joined on one line (one journal entry, a
  /dev/kmsg record whose newlines read ``\\x0a``) or shortened to ``The NVIDIA GPU ... fallen
  off the bus and is not responding to commands.``. Line formats: ``dmesg``
  (``[ 1234.567890] ...``), ``dmesg -T`` (``[Sun Feb 23 16:24:18 2025] ...``), ``dmesg
  --time-format=iso``, ``dmesg --decode`` (``kern  :warn  : <iso> ...``), ``/dev/kmsg`` records
  (``prio,seq,usec,flags;msg``), ``journalctl -k -o short-iso`` and syslog
  (``<time> host kernel: ...``). Multi-line forms: the NVRM lines an Xid drags behind it
  (Xid 119's GSP RPC history dump, the board serial) are counted on their Xid
  (``detail_lines``), never as events; an SXid's ``Severity ...`` / ``Data {...}`` lines
  belong to the ``Fatal``/``Non-fatal`` line of the same switch and SXid before them (a
  continuation line with no such head line is an event of its own, severity unknown).
- ``classify(events, gpus) -> [finding]``: repeats folded: one finding per (Xid, action) with
  ``gpus`` listing the GPU indices (the PCI bus id mapped through the nvidia-smi inventory;
  a GPU that is not in it, e.g. one that fell off the bus, is named by its PCI address in the
  message) and the count per GPU in the message; one per (SXid, action) with ``ports`` naming
  the NVSwitches (``nvswitch0``).

Live part: ``read_kernel_log(run_tool, since, path)`` (kernel_log.py's reader, shipped beside
this file) and ``check(expect, run_tool, **options)``
(the node-check module API; node_check.py reads the log once and passes it as
``kernel_log=``).

Actions (least to most severe: none < monitor < app < reset-gpu < reboot < drain < rma) and
levels (none -> info; monitor, app -> warn; reset-gpu and worse -> fail). The catalog's rows
are made from NVIDIA's Xid catalog ("Resolution Bucket (Immediate Action)") by
tests/fixtures/xid/make_xid_catalog.py with these rules:

=============================================  ==========  ==========================================
NVIDIA immediate action (Xids)                 action      why
=============================================  ==========  ==========================================
RESTART_APP (8, 11, 13, 31, 32, 94, ...)       app         the application's fault, not the node's
13, 31, 43, 45, 94 whatever the bucket         app         43 (IGNORE: "the GPU remains healthy"),
                                                           45 (preemptive cleanup after an abort)
                                                           are an application's end, as gcm and
                                                           NVIDIA's device plugin treat them
IGNORE (63, 92, 37, 38, 121, ...)              monitor     nothing to do now; repeats are a trend
14 (fake error), 106, 107 (SMBPBI test)        none        test messages
RESET_GPU (46, 62, 64, 95, 109, 119, 120,      reset-gpu   ``nvidia-smi -r -i N`` or a reboot
136, 140, 143, 155, 156, 158)
WORKFLOW_XID_48 (48), solo                     reset-gpu   NVIDIA: "Solo: RESET_GPU"
48 with 63 or 64 on the same GPU               drain       NVIDIA: "w/ 63 or 64: DRAIN_AND_RESET"
WORKFLOW_NVLINK_ERR (74)                       reset-gpu   "A GPU reset or node reboot is needed"
WORKFLOW_NVLINK5_ERR (144-150)                 per line    see "NVLink5 Xids" below; a line without
                                                           the decode fields: reset-gpu, monitor when
                                                           it says Nonfatal
XID_154 (154)                                  per line    "recovery action changed ... to 0x2 (Node
                                                           Reboot Required)": None -> none, GPU Reset
                                                           Required -> reset-gpu, Node Reboot
                                                           Required -> reboot, Drain P2P / Drain and
                                                           Reset -> drain; unreadable -> monitor
RESTART_BM (79), RESTART_VM (151)              reboot      restart the machine
CHECK_MECHANICALS (54)                         drain       hands on the board (seating, power)
CHECK_UVM (159), UPDATE_SWFW (78)              monitor     vGPU/UVM only
CONTACT_SUPPORT (142, ...)                     rma         escalate to the vendor
CONTACT_SUPPORT on an "Unused" row (61, ...)   monitor     NVIDIA marks it for none of A100/H100/
                                                           B100/GB200: no RMA on a code they do
                                                           not emit
no bucket in the sheet (162-172)               ours        162 none; 163-166, 170 monitor (power
                                                           smoothing, CC mode); 167 PCIe fatal
                                                           timeout, 168 WPR errors -> reboot; 169
                                                           micro-controller halt (as 62), 171, 172
                                                           (detail of 48) -> reset-gpu
an Xid not in the catalog                      monitor     see "An Xid the catalog does not know"
SXid whose FM guide repair is a reboot         reboot      gpud's RebootSystem (fatal SXids)
other SXids                                    monitor
an SXid line that says "Fatal" (or an          reboot      a fatal NVSwitch error takes the fabric
always-fatal SXid)                                         down until GPUs and switches are reset
an SXid line that says "Non-fatal"             monitor     (unless always fatal)
kernel log unreadable                          none        warn ``kernel-log-unreadable``
journalctl/dmesg hung                          reboot      fail ``tool-hung`` (the contract's rule)
=============================================  ==========  ==========================================

NVLink5 Xids (144-150) print their own decode fields: ``Xid (PCI:0018:01:00): 149,
NETIR_LINK_EVT Fatal XC0 i0 Link 08 (0x004505c6 0x00000000 ...)`` -- unit, ``Fatal`` or
``Nonfatal``, containment, injection, link, then intrInfo and errorStatus. NVIDIA's bucket for
them (WORKFLOW_NVLINK5_ERR) says to decode intrInfo and errorStatus with its "XID 144-150
Decode" sheet. The peers do: NVIDIA NVSentinel (syslog-health-monitor pkg/xid/parser/csv.go)
takes the resolution of the sheet's row matching intrInfo's pattern and errorStatus, ignoring
the Fatal/Nonfatal word; GPUd (components/accelerator/nvidia/xid/xid.go, detailFromNVLinkInfo)
takes the row's severity and resolution and then the worse of that severity and the line's.
mldiag, the same way as GPUd: **reset-gpu (fail) when the line says Fatal or when the sheet's
immediate action for that unit and errorStatus is RESET_GPU** (``nvlink5_reset`` in the
catalog), **monitor (warn) otherwise**: the sheet's other rows are IGNORE or XID_154_EVAL
("evaluate the Xid 154 that follows", and that line is classified by itself). intrInfo is not
matched: within one unit and errorStatus the sheet's rows differ by intrInfo pattern only for
149 NETIR_LINK_EVT errorStatus 0, all of them Fatal (RESET_GPU but for two IGNORE rows, whose
lines say Fatal anyway), so NVSentinel's choice of the pattern by driver version would change
nothing here. The unit, link, intrInfo and errorStatus are kept on the event (``nvlink``) and
quoted in the message, for the sheet's investigatory columns.

An Xid the catalog does not know (from a driver newer than the catalog: NVIDIA adds codes with
its drivers) is **monitor (warn)**, its message saying "not in the catalog" and its hint to
look it up. NVSentinel's CSV parser answers CONTACT_SUPPORT for it; GPUd drops it (Match
returns nil). mldiag's reason: a code nobody has classified yet is no evidence the node is
broken, and drain, reset or an RMA on it would take healthy nodes out of a fleet after a driver
upgrade; a warning still makes the run exit 1 and keeps the code in front of an operator, and
the catalog's next release decides.
"""

from __future__ import annotations

import json
import os
import re

import _remote
from _remote import ACTION_RANK, pci_key  # noqa: F401 (pci_key: xid.pci_key for its callers)

CATALOG_FILE = "xid_catalog.json"
LEVEL_OF = {"none": "info", "monitor": "warn", "app": "warn", "reset-gpu": "fail", "reboot": "fail",
            "drain": "fail", "rma": "fail"}
DEFAULT_TIMEOUT = 10.0
MAX_LOG_BYTES = 16 * 1024 * 1024      # the last 16 MiB of a log are read, whatever its size
MAX_TEXT = 200                         # characters of a line quoted in a message
FELL_OFF_WINDOW = 20                   # lines an Xid 79 covers its "fallen off the bus" line
NVIDIA_GPU_LINES = 4                   # "The NVIDIA GPU ..." to its "fallen off the bus" line
UNKNOWN_XID_ACTION = "monitor"         # see "An Xid the catalog does not know" above

HINTS = {
    "none": None,
    "monitor": "no action now per NVIDIA's Xid catalog; if it repeats on one GPU, look at that GPU",
    "app": "the application's fault, not the node's (NVIDIA: restart the application); the same "
           "Xid on one GPU under different programs points at the GPU",
    "reset-gpu": "reset the GPU (`nvidia-smi -r -i N`, no processes on it) or reboot; if it comes "
                 "back, drain the node and run field diagnostics",
    "reboot": "reboot the node; if it comes back, drain it and check the GPU's seating and PCIe "
              "link or the NVSwitch tray",
    "drain": "drain the node, reset the GPU so the row remap applies, then read "
             "`nvidia-smi -q -d ROW_REMAPPER`",
    "rma": "drain the node and contact the vendor (RMA)",
}
UNKNOWN_XID_HINT = ("a code newer than mldiag's Xid catalog: look it up in NVIDIA's Xid catalog "
                    "(docs.nvidia.com/deploy/xid-errors) and watch whether it repeats on one GPU")
RECOVERY_154 = [("node reboot", "reboot"), ("gpu reset", "reset-gpu"), ("drain", "drain"),
                ("none", "none")]

# --------------------------------------------------------------------------- catalog

_CATALOG = {}


def load_catalog(path=None):
    """{"xids": {n: row}, "sxids": {n: row}, "nvlink5_reset": {(xid, unit): {errorStatus}}}
    from xid_catalog.json beside this file (cached); row: dict of the catalog's columns; a unit
    the sheet names ``TLW_RX/TLW_RX_PIPE0`` is found by each of its names and by the whole.
    Raises OSError or ValueError."""
    path = path or os.path.join(os.path.dirname(os.path.abspath(__file__)), CATALOG_FILE)
    if path not in _CATALOG:
        with open(path, "r", encoding="utf-8") as f:
            raw = json.load(f)
        xc, sc = raw["xid_columns"], raw["sxid_columns"]
        _CATALOG[path] = {
            "xids": dict((int(k), dict(zip(xc, v))) for k, v in raw["xids"].items()),
            "sxids": dict((int(k), dict(zip(sc, v))) for k, v in raw["sxids"].items()),
            "nvlink5_reset": _unit_index(raw.get("nvlink5_reset") or {}),
        }
    return _CATALOG[path]


def _unit_index(by_xid):
    """{"145": {"RLW_REMAP": ["0x00000040"]}} -> {(145, "RLW_REMAP"): {0x40}}, each unit also
    under each of its "/"-separated names."""
    out = {}
    for xid, units in by_xid.items():
        for unit, statuses in units.items():
            for name in set(unit.split("/")) | {unit}:
                out.setdefault((int(xid), name), set()).update(int(s, 16) for s in statuses)
    return out


def xid_info(xid, catalog=None):
    """The catalog row of an Xid: name, nvidia_action, action, level; an unknown Xid:
    UNKNOWN_XID_ACTION."""
    row = (catalog or load_catalog())["xids"].get(xid)
    if row is None:
        return {"mnemonic": None, "description": None, "name": "not in the catalog",
                "nvidia_action": None, "action": UNKNOWN_XID_ACTION,
                "level": LEVEL_OF[UNKNOWN_XID_ACTION]}
    out = dict(row)
    out["name"] = row["description"] if row["description"] not in ("Unused", "") else row["mnemonic"]
    return out


def worst_action(actions):
    return max(actions, key=lambda a: ACTION_RANK.get(a, 0)) if actions else "none"


# --------------------------------------------------------------------------- parsing

_KMSG = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;(.*)$")
_DECODE = re.compile(r"^\s*[a-z]+\s*:\s*[a-z]+\s*:\s?(.*)$")
_BRACKET = re.compile(r"^\[\s*([^\]]*)\]\s?(.*)$")
_ISO = re.compile(r"^(\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[,.]\d+)?(?:Z|[+-]\d\d:?\d\d)?)\s+(.*)$")
_SYSLOG = re.compile(r"^([A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)\s+(.*)$")
_HOST_KERNEL = re.compile(r"^\S+ kernel: (.*)$")
_PCI = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(" + _PCI + r")\): (\d+)(?:,\s*(.*))?")
_SXID = re.compile(r"(nvidia-nvswitch\d+|nvswitch\d+): SXid \((?:PCI:)?(" + _PCI + r")\): (\d+)(?:,\s*(.*))?")
# a GPU that fell off the bus, in words without "Xid": the PCI domain may be left off
_BDF = r"(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?"
_FELL = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?(" + _BDF + r"): GPU has fallen off the bus")
_THE_GPU = re.compile(r"NVRM: The NVIDIA GPU (" + _BDF + r")(?![0-9A-Za-z:.])")
_NOT_RESPONDING = re.compile(r"fallen off the bus and is not responding")
# NVLink5 (Xid 144-150): "<unit> Fatal|Nonfatal XC0 i0 Link 08 (0x<intrInfo> 0x<errorStatus>"
_NVLINK5 = re.compile(r"(?:^|,\s*)([A-Z][A-Z0-9_]*(?:/[A-Z][A-Z0-9_]*)*)\s+(Fatal|Non-?fatal)\s+"
                      r"XC\d\s+i\d+\s+Link\s+(-?\d+)\s+\((0x[0-9A-Fa-f]{1,8})\s+(0x[0-9A-Fa-f]{1,8})\b")
_LINK = re.compile(r"\bLink (\d+)")


def split_line(line):
    """A kernel-log line -> (time or None, message), whatever tool printed it."""
    line = line.rstrip("\r\n")
    m = _KMSG.match(line)
    if m:
        return "%.6f" % (int(m.group(3)) / 1e6), m.group(4)
    m = _DECODE.match(line)
    if m and not line.lstrip().startswith("["):
        line = m.group(1)
    for rx in (_BRACKET, _ISO, _SYSLOG):
        m = rx.match(line)
        if m:
            when, msg = m.group(1).strip(), m.group(2)
            h = _HOST_KERNEL.match(msg)
            return when, (h.group(1) if h else msg)
    return None, line


def _short_pci(bus_id):
    k = pci_key(bus_id)
    return "%04x:%02x:%02x" % k if k else str(bus_id)


def _nvlink5_fields(rest):
    """The decode fields of an NVLink5 Xid's line (after the code), or None."""
    m = _NVLINK5.search(rest or "")
    if not m:
        return None
    return {"unit": m.group(1), "severity": "fatal" if m.group(2) == "Fatal" else "non-fatal",
            "link": int(m.group(3)), "intrinfo": int(m.group(4), 16), "err_status": int(m.group(5), 16)}


def _continuation(msg):
    """A later line of a multi-line NVRM message, without its indent and ``NVRM:``."""
    msg = msg.strip()
    return msg[len("NVRM:"):].strip() if msg.startswith("NVRM:") else msg


def parse_kernel_log(text):
    """Kernel log text -> events, in log order: ``{"kind": "xid"|"sxid", "code": int,
    "pci": "0000:91:00", "device": "nvswitch0" (SXid), "time": str|None, "line": int (1-based),
    "text": the message, "severity": "fatal"|"non-fatal"|None (SXid), "link": int|None (SXid),
    "detail_lines": int, "derived": True (Xid 79 from a "fallen off the bus" message),
    "nvlink": {"unit", "severity", "link", "intrinfo", "err_status"} (Xid 144-150 that print
    them)}``."""
    events = []
    last_xid = None                  # the Xid event the following NVRM lines belong to
    last_79 = {}                     # pci key -> line number of its last Xid 79
    derived_79 = {}                  # pci key -> its last event made from "fallen off the bus"
    superseded = set()               # id() of derived events an Xid 79 line after them replaced
    sxid_head = {}                   # (device, sxid) -> its last head event
    the_gpu = None                   # "The NVIDIA GPU ..." waiting for its "fallen off the bus"

    def fell_off(pci, n, when, msg, detail):
        """A GPU that fell off the bus in words: Xid 79, unless its Xid 79 line is near."""
        key = pci_key(pci)
        seen = last_79.get(key)
        if seen is not None and n - seen <= FELL_OFF_WINDOW:
            if last_xid is not None:
                last_xid["detail_lines"] += 1 + detail
            return last_xid
        ev = {"kind": "xid", "code": 79, "pci": _short_pci(pci), "time": when, "line": n,
              "text": " ".join(msg.replace("\\x0a", " ").split())[:MAX_TEXT * 2],
              "detail_lines": detail, "derived": True}
        events.append(ev)
        last_79[key] = n
        derived_79[key] = ev
        return ev

    for n, raw in enumerate(text.splitlines(), 1):
        if the_gpu is not None and n - the_gpu["line"] > NVIDIA_GPU_LINES:
            the_gpu = None
        if "NVRM" not in raw and "SXid" not in raw and the_gpu is None:
            continue
        when, msg = split_line(raw)
        m = _XID.search(msg)
        if m:
            code = int(m.group(2))
            ev = {"kind": "xid", "code": code, "pci": _short_pci(m.group(1)), "time": when,
                  "line": n, "text": msg[m.start():].strip()[:MAX_TEXT * 2], "detail_lines": 0}
            if 144 <= code <= 150:
                nvlink = _nvlink5_fields(m.group(3))
                if nvlink:
                    ev["nvlink"] = nvlink
            if code == 79:
                key = pci_key(m.group(1))
                early = derived_79.pop(key, None)
                if early is not None and n - early["line"] <= FELL_OFF_WINDOW:
                    # the driver's words came first (NVSentinel's gpufallen tests): one event
                    superseded.add(id(early))
                    ev["detail_lines"] += 1 + early["detail_lines"]
                last_79[key] = n
            events.append(ev)
            last_xid = ev
            continue
        m = _FELL.search(msg)
        if m:
            last_xid = fell_off(m.group(1), n, when, msg[m.start():], 0)
            continue
        m = _THE_GPU.search(msg)
        if m:
            if _NOT_RESPONDING.search(msg, m.end()):         # all of it on this line
                last_xid = fell_off(m.group(1), n, when, msg[m.start():], 0)
            else:
                the_gpu = {"pci": m.group(1), "line": n, "time": when, "pieces": [msg[m.start():].strip()]}
            continue
        m = _SXID.search(msg)
        if m:
            device = m.group(1).replace("nvidia-", "")
            code, rest = int(m.group(3)), (m.group(4) or "").strip()
            low = rest.lower()
            severity = "fatal" if low.startswith("fatal") else (
                "non-fatal" if low.startswith(("non-fatal", "nonfatal", "non fatal")) else None)
            key = (device, code)
            if severity is None and key in sxid_head:
                sxid_head[key]["detail_lines"] += 1
                continue
            link = _LINK.search(rest)
            ev = {"kind": "sxid", "code": code, "pci": _short_pci(m.group(2)), "device": device,
                  "time": when, "line": n, "text": msg[m.start():].strip()[:MAX_TEXT * 2],
                  "severity": severity, "link": int(link.group(1)) if link else None, "detail_lines": 0}
            events.append(ev)
            sxid_head[key] = ev
            last_xid = None
            continue
        if the_gpu is not None:
            the_gpu["pieces"].append(_continuation(msg))
            if _NOT_RESPONDING.search(msg):
                g, the_gpu = the_gpu, None
                last_xid = fell_off(g["pci"], g["line"], g["time"], " ".join(g["pieces"]),
                                    len(g["pieces"]) - 1)
            continue
        if last_xid is not None and "NVRM:" in msg and when == last_xid["time"]:
            last_xid["detail_lines"] += 1      # the GSP RPC dump, serial numbers, ...
    if superseded:
        events = [e for e in events if id(e) not in superseded]
    events.sort(key=lambda e: e["line"])      # a multi-line message counts at its first line
    return events


# --------------------------------------------------------------------------- classification


def event_action(ev, catalog=None):
    """The action one event asks for, before the rules across events (48 with 63/64)."""
    catalog = catalog or load_catalog()
    if ev["kind"] == "sxid":
        row = catalog["sxids"].get(ev["code"])
        if ev.get("severity") == "fatal" or (row and row["always_fatal"]):
            return "reboot"
        if ev.get("severity") == "non-fatal":
            return "monitor"
        return row["action"] if row else "monitor"
    info = xid_info(ev["code"], catalog)
    low = ev.get("text", "").lower()
    if ev["code"] == 154:
        tail = low.split(" to ", 1)[-1] if " to " in low else ""
        for words, action in RECOVERY_154:
            if words in tail:
                return action
        return "monitor"
    if 144 <= ev["code"] <= 150:
        return nvlink5_action(ev, catalog, low)
    return info["action"]


def nvlink5_action(ev, catalog, low):
    """Xid 144-150 (see "NVLink5 Xids" above): reset-gpu when the line says Fatal or NVIDIA's
    decode sheet resets the GPU for its unit and errorStatus, else monitor; a line without the
    decode fields: the catalog's action, monitor where it says Nonfatal. An event without
    ``nvlink`` (scan-log passes its line alone) has its text read for the fields."""
    nv = ev.get("nvlink") or _nvlink5_fields(ev.get("text"))
    if nv is None:
        return "monitor" if re.search(r"\bnon-?fatal\b", low) else xid_info(ev["code"], catalog)["action"]
    return "reset-gpu" if nv["severity"] == "fatal" or _sheet_resets(ev["code"], nv, catalog) else "monitor"


def _sheet_resets(code, nv, catalog):
    """Whether NVIDIA's decode sheet resets the GPU for an NVLink5 Xid's unit and errorStatus."""
    resets = catalog.get("nvlink5_reset") or {}
    return nv["err_status"] in resets.get((code, nv["unit"]), ())


def _where_gpus(counts, names):
    """{device: count} -> "GPU 0 ×3, GPU 5, 0000:77:00 (not in nvidia-smi's list)"."""
    parts = []
    for dev in sorted(counts, key=lambda d: (isinstance(d, str), d if isinstance(d, int) else str(d))):
        label = names(dev)
        parts.append(label + (" \u00d7%d" % counts[dev] if counts[dev] > 1 and len(counts) > 1 else ""))
    return ", ".join(parts)


def classify(events, gpus=None, catalog=None):
    """Events -> findings (check "xid"), folded per (code, action); see the module docstring."""
    catalog = catalog or load_catalog()
    by_pci = {}
    for g in gpus or []:
        k = pci_key(g.get("pci"))
        if k is not None and isinstance(g.get("index"), int):
            by_pci[k] = g["index"]

    def device_of(ev):
        if ev["kind"] == "sxid":
            return ev["device"]
        return by_pci.get(pci_key(ev["pci"]), ev["pci"])

    # per (kind, code, device): events and the worst action among them
    groups = {}
    for ev in events:
        key = (ev["kind"], ev["code"], device_of(ev))
        g = groups.setdefault(key, {"events": [], "action": "none"})
        g["events"].append(ev)
        g["action"] = worst_action([g["action"], event_action(ev, catalog)])
    for (kind, code, dev), g in groups.items():      # NVIDIA: 48 with 63 or 64 -> DRAIN_AND_RESET
        if kind == "xid" and code == 48 and (("xid", 63, dev) in groups or ("xid", 64, dev) in groups):
            g["action"] = worst_action([g["action"], "drain"])
            g["with"] = [x for x in (63, 64) if ("xid", x, dev) in groups]

    folded = {}
    for (kind, code, dev), g in groups.items():
        f = folded.setdefault((kind, code, g["action"]), {"devices": {}, "events": [], "with": set()})
        f["devices"][dev] = len(g["events"])
        f["events"].extend(g["events"])
        f["with"].update(g.get("with", []))

    def gpu_name(dev):
        return "GPU %d" % dev if isinstance(dev, int) else "%s (not in nvidia-smi's list)" % dev \
            if gpus else dev

    findings = []
    for (kind, code, action), f in sorted(folded.items(), key=lambda kv: (
            -ACTION_RANK[kv[0][2]], kv[0][0], kv[0][1])):
        evs = sorted(f["events"], key=lambda e: e["line"])
        last = evs[-1]
        n = len(evs)
        when = " at %s" % _when(last["time"]) if last.get("time") else ""
        if kind == "xid":
            info = xid_info(code, catalog)
            what = "Xid %d (%s)" % (code, info["name"])
            where = _where_gpus(f["devices"], gpu_name)
            msg = "%s on %s: %d event%s, last%s: %s" % (what, where, n, "" if n == 1 else "s", when,
                                                      _clip(_after_code(last["text"])))
            if f["with"]:
                msg += " (with Xid %s on the same GPU: NVIDIA's DRAIN_AND_RESET)" % \
                       "/".join(str(x) for x in sorted(f["with"]))
            elif info["nvidia_action"]:
                msg += " (NVIDIA: %s)" % info["nvidia_action"]
            if any(e.get("derived") for e in evs):
                msg += "; from the driver's \"fallen off the bus\" message (no Xid line)"
            # a Nonfatal line the decode sheet resets the GPU for: say why it is a fail
            sheet = [e["nvlink"] for e in evs if action == "reset-gpu" and e.get("nvlink")
                     and e["nvlink"]["severity"] != "fatal" and _sheet_resets(code, e["nvlink"], catalog)]
            if sheet:
                msg += "; NVIDIA's XID 144-150 Decode resets the GPU for %s errorStatus 0x%08x" % (
                    sheet[0]["unit"], sheet[0]["err_status"])
            finding = {"level": LEVEL_OF[action], "code": "xid-%d" % code, "message": msg,
                       "action": action, "check": "xid"}
            idx = sorted(d for d in f["devices"] if isinstance(d, int))
            if idx:
                finding["gpus"] = idx
            if code not in catalog["xids"]:
                finding["hint"] = UNKNOWN_XID_HINT
        else:
            row = catalog["sxids"].get(code)
            sev = sorted(set(e["severity"] for e in evs if e.get("severity")))
            what = "SXid %d (%s%s)" % (code, row["name"] if row else "not in the catalog",
                                       ", " + "/".join(sev) if sev else "")
            parts = []
            for dev in sorted(f["devices"], key=_natural):
                links = sorted(set(e["link"] for e in evs if e["device"] == dev and e.get("link") is not None))
                parts.append(dev + (" \u00d7%d" % f["devices"][dev] if f["devices"][dev] > 1 and len(f["devices"]) > 1
                                    else "")
                             + (" (link%s %s)" % ("s" if len(links) > 1 else "", ", ".join(map(str, links)))
                                if links else ""))
            msg = "%s on %s: %d event%s, last%s: %s" % (what, ", ".join(parts), n, "" if n == 1 else "s",
                                                      when, _clip(_after_code(last["text"])))
            finding = {"level": LEVEL_OF[action], "code": "sxid-%d" % code, "message": msg,
                       "action": action, "check": "xid", "ports": sorted(f["devices"], key=_natural)}
        hint = HINTS.get(action)
        if hint and "hint" not in finding:
            finding["hint"] = hint
        findings.append(finding)
    return findings


def _when(t):
    """A dmesg/kmsg time (seconds since boot) said so; a date as the log printed it."""
    return "%s s after boot" % t if re.match(r"^\d+\.\d+$", t) else t


def _natural(name):
    m = re.match(r"^(.*?)(\d+)$", name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)


def _after_code(text):
    """"NVRM: Xid (PCI:0000:19:00): 48, pid=..., An uncorrectable ..." -> "pid=..., An uncorrectable ..."."""
    m = re.match(r"^.*?\): \d+,?\s*(.*)$", text)
    return m.group(1) if m and m.group(1) else text


def _clip(text, n=MAX_TEXT):
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 1] + "\u2026"


# --------------------------------------------------------------------------- live


def read_kernel_log(run_tool, since="24h", path=None, timeout=DEFAULT_TIMEOUT, max_bytes=MAX_LOG_BYTES):
    """The kernel log to classify, read by kernel_log.py beside this file (see its ``read``):
    ``{"source", "text", "error", "hung"}``; its absence is said in ``error``."""
    reader = _remote.load_companion(os.path.dirname(os.path.abspath(__file__)), "kernel_log.py",
                                    "mldiag_kernel_log")
    if reader is None:
        return {"source": None, "text": "", "error": "kernel_log.py is not beside xid.py", "hung": []}
    return reader.read(run_tool, since=since, path=path, timeout=timeout, max_bytes=max_bytes)


def check(expect, run_tool, kernel_log=None, gpus=None, since="24h", kernel_log_file=None, **options):
    """The node-check module: Xid/SXid findings from the kernel log (read here if not given)."""
    if kernel_log is None:
        kernel_log = read_kernel_log(run_tool, since=since, path=kernel_log_file)
    findings = []
    for msg in kernel_log.get("hung") or []:
        findings.append({"level": "fail", "code": "tool-hung", "message": msg, "action": "reboot",
                         "check": "xid",
                         "hint": "a tool stuck reading the kernel log points at a stuck kernel or journald"})
        break
    data = {"source": kernel_log.get("source"), "events": 0}
    if kernel_log.get("source") is None:
        findings.append({"level": "warn", "code": "kernel-log-unreadable", "action": "none", "check": "xid",
                         "message": "Xid/SXid not checked: kernel log unreadable (%s)"
                                    % (kernel_log.get("error") or "no source"),
                         "hint": "run as root (dmesg_restrict), or pass a saved log with --kernel-log-file"})
        return {"findings": findings, "facts": {}, "data": data}
    try:
        catalog = load_catalog()
    except (OSError, ValueError) as e:
        findings.append({"level": "warn", "code": "xid-catalog-missing", "action": "none", "check": "xid",
                         "message": "Xid/SXid not classified: %s not readable (%s)" % (CATALOG_FILE, e)})
        return {"findings": findings, "facts": {}, "data": data}
    events = parse_kernel_log(kernel_log.get("text") or "")
    data["events"] = len(events)
    findings.extend(classify(events, gpus or [], catalog))
    return {"findings": findings, "facts": {}, "data": data}
