"""node-check's NVSwitch fabric check: ``nvidia-smi -q``'s Fabric section per GPU, the fabric
manager service, and the NVSwitch errors the fabric manager logged.

Standard library only, Python 3.8+, no import of the local package (shipped beside
node_check.py). Pure parsers (``parse_query``, ``parse_fm_state``, ``parse_fm_log``) are
what the unit tests drive with recorded outputs (tests/fixtures/fabric/); ``check()`` glues
them to the tool calls.

On an NVSwitch system (HGX/DGX A100, H100, H200, B200: the Fabric section's State is not
N/A) every GPU registers with the NVLink fabric once the fabric manager has trained it;
until then CUDA fails to initialise on it (cudaErrorSystemNotReady). So:

    State other than Completed, or Status other than Success   fail  reboot
        (hint: a fabric manager that is not running is started first; on NVLink 4 systems
        a fabric manager restart needs the GPUs reset, which on a node is a reboot)
    Fabric Health Summary other than Healthy/N/A (newer drivers)  warn  monitor
    nvidia-fabricmanager not active while the fabric is fine     warn  monitor
        (the trained fabric keeps working; a GPU reset or a new partition then fails.
        Not on GB200/GB300 nodes: their fabric is managed outside the compute tray)
    no systemd / no fabricmanager unit                           info  none
    fabricmanager.log: NVSwitch non-fatal error                  warn  monitor
        (DCGM_FR_NVSWITCH_NON_FATAL_ERROR -> NONE in NVIDIA's NVSentinel mapping)
    fabricmanager.log: NVSwitch fatal error                      fail  drain
        (DCGM_FR_NVSWITCH_FATAL_ERROR -> CONTACT_SUPPORT)
    nvidia-smi -q cut short (fewer GPUs than "Attached GPUs")    warn  monitor

Facts: ``driver`` and ``cuda`` (the -q header; node_check takes them as its own), and on
NVSwitch systems ``fabric.gpuN.state`` / ``fabric.gpuN.status``.
"""

import collections
import re
import time

import _remote

Tool = _remote.Tool

CHECK = "fabric"
DEFAULT_TIMEOUT = 10.0
QUERY_ARGV = ["nvidia-smi", "-q"]
FM_UNIT = "nvidia-fabricmanager"
FM_ARGV = ["systemctl", "show", "--property=LoadState,ActiveState,SubState", FM_UNIT]
FM_LOG = "/var/log/fabricmanager.log"
FM_LOG_TAIL = 2 * 1024 * 1024      # bytes of the log read, from its end

NOT_NVSWITCH = ("", "n/a", "not supported", "[n/a]")
# GPUs whose NVLink fabric is managed off the node (NVL72 racks): no local fabric manager
OFF_NODE_FM = re.compile(r"\bGB[23]00\b", re.I)

_KV = re.compile(r"^(\s*)([^:]*?)\s*:\s?(.*?)\s*$")
_GPU_HEAD = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_FM_ERROR = re.compile(
    r"^\[(?P<time>[A-Z][a-z]{2} +\d+ \d{4} \d\d:\d\d:\d\d)\] \[ERROR\] .*?detected NVSwitch "
    r"(?P<kind>non-fatal|fatal) error (?P<code>\d+)(?: on fid (?P<fid>\d+))? on NVSwitch pci bus id "
    r"(?P<bus>\S+)(?: physical id (?P<phys>\d+))?(?: port (?P<port>\d+))?", re.I)


# --------------------------------------------------------------------------- parsers


def parse_query(text):
    """``nvidia-smi -q`` -> {"driver", "cuda", "attached": int|None, "gpus": [gpu], "complete"}.

    gpu: {"bus": "00000000:18:00.0", "name", "uuid", "fabric": {"State", "Status", "CliqueId",
    "ClusterUUID", ...} (absent fields absent), "health": {...} (the Fabric/Health subsection of
    newer drivers), "ended": bool (its block reached "Processes", which every driver prints)}. Lines of unexpected
    indentation are tolerated; a block cut short just lacks what was not printed.
    """
    out = {"driver": None, "cuda": None, "attached": None, "gpus": [], "complete": False}
    cur = None
    stack = []          # [(indent, section name)] above the current line, inside a GPU block
    for raw in (text or "").splitlines():
        if not raw.strip():
            continue
        m = _GPU_HEAD.match(raw)
        if m:
            cur = {"bus": m.group(1), "name": None, "uuid": None, "fabric": {}, "health": {},
                   "ended": False}
            out["gpus"].append(cur)
            stack = []
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        kv = _KV.match(raw)
        if cur is None:
            if kv and indent == 0:
                key, value = kv.group(2), kv.group(3).split(" [")[0].strip()
                # R610 marks "Driver Version"/"CUDA Version" deprecated (a " [Deprecated; ...]"
                # suffix) and adds "KMD Version"/"CUDA UMD Version" after them
                if key in ("Driver Version", "KMD Version"):
                    out["driver"] = value or out["driver"]
                elif key in ("CUDA Version", "CUDA UMD Version"):
                    out["cuda"] = value or out["cuda"]
                elif key == "Attached GPUs":
                    try:
                        out["attached"] = int(value)
                    except ValueError:
                        pass
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not kv:              # a section heading ("    Fabric", "        Health")
            stack.append((indent, raw.strip()))
            if indent == 4 and raw.strip() == "Processes":   # a list of them follows
                cur["ended"] = True
            continue
        key, value = kv.group(2), kv.group(3)
        path = [name for _, name in stack]
        if indent == 4 and not path:
            if key == "Product Name":
                cur["name"] = value
            elif key == "GPU UUID":
                cur["uuid"] = value
        elif path == ["Fabric"]:
            cur["fabric"][key] = value
        elif path == ["Fabric", "Health"]:
            cur["health"][key] = value
        if key == "Processes" and indent == 4:      # "Processes : None"
            cur["ended"] = True
    n = len(out["gpus"])
    out["complete"] = bool(out["gpus"]) and out["gpus"][-1]["ended"] and (
        out["attached"] is None or out["attached"] == n)
    return out


def parse_fm_state(text):
    """``systemctl show --property=LoadState,ActiveState,SubState UNIT`` -> dict of those."""
    got = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("LoadState", "ActiveState", "SubState"):
            got[key.strip()] = value.strip()
    return got


def parse_fm_log(text, since=None):
    """fabricmanager.log -> [{"time": str, "epoch": float|None, "kind": "fatal"|"non-fatal",
    "code": int, "bus", "physical": int|None, "port": int|None, "fid": int|None}] for each
    ``[ERROR] detected NVSwitch ... error`` line, oldest first; with ``since`` (epoch seconds)
    only those logged at or after it (a line whose time does not parse is kept)."""
    found = []
    for line in (text or "").splitlines():
        m = _FM_ERROR.match(line.strip())
        if not m:
            continue
        try:
            epoch = time.mktime(time.strptime(" ".join(m.group("time").split()), "%b %d %Y %H:%M:%S"))
        except (ValueError, OverflowError):
            epoch = None
        if since is not None and epoch is not None and epoch < since:
            continue
        num = lambda g: int(m.group(g)) if m.group(g) is not None else None  # noqa: E731
        found.append({"time": m.group("time"), "epoch": epoch, "kind": m.group("kind").lower(),
                      "code": int(m.group("code")), "bus": m.group("bus"), "physical": num("phys"),
                      "port": num("port"), "fid": num("fid")})
    return found


def read_tail(path, limit=FM_LOG_TAIL):
    """The last ``limit`` bytes of a file as text (from its first whole line), or None."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read(limit)
    except OSError:
        return None
    text = data.decode("utf-8", "replace")
    if size > limit:
        text = text.partition("\n")[2]
    return text


# --------------------------------------------------------------------------- findings


def finding(level, code, message, action, gpus=None, hint=None, ports=None):
    return _remote.check_finding(CHECK, level, code, message, action, gpus=gpus, hint=hint, ports=ports)


fold = _remote.fold_gpus


def tool_problem(tool, argv, timeout, what="nvidia-smi"):
    return _remote.tool_problem(CHECK, tool, argv, timeout, what)


def gpu_indices(query, gpus):
    """{bus id (upper case): GPU index}: from node_check's inventory by PCI address, else the
    order of -q (nvidia-smi lists GPUs in PCI order, as it numbers them)."""
    by_bus = {}
    for g in gpus or []:
        if g.get("pci") and g.get("index") is not None:
            by_bus[_bus_key(g["pci"])] = g["index"]
    out = {}
    for n, gpu in enumerate(query["gpus"]):
        out[_bus_key(gpu["bus"])] = by_bus.get(_bus_key(gpu["bus"]), n if not by_bus else None)
    return out


def _bus_key(bus):
    bus = (bus or "").strip().upper()
    if len(bus) == 12:          # 0000:18:00.0 -> 00000000:18:00.0
        bus = "0000" + bus
    return bus


def is_nvswitch(query):
    return any((g["fabric"].get("State") or "").strip().lower() not in NOT_NVSWITCH
               for g in query["gpus"])


def fabric_findings(query, indices, fm=None):
    """(findings, facts) of a parsed -q; fm: parse_fm_state's dict, or None (not read)."""
    findings, facts = [], {}
    if query["driver"]:
        facts["driver"] = query["driver"]
    if query["cuda"]:
        facts["cuda"] = query["cuda"]
    listed = len(query["gpus"])
    if query["gpus"] and not query["complete"]:
        attached = query["attached"]
        last = query["gpus"][-1]
        if attached is not None and attached > listed:
            message = "`nvidia-smi -q` cut short: %d of %d attached GPUs in its output" % (listed, attached)
        else:
            message = "`nvidia-smi -q` cut short: GPU %s's block ends early" % last["bus"]
        findings.append(finding("warn", "fabric-query-incomplete", message + ", fabric state unknown for "
                                "the rest", "monitor",
                                hint="nvidia-smi stopped mid-output (a crash or a GPU that stopped "
                                     "answering): run `nvidia-smi -q` by hand and see the kernel log"))
    elif not query["gpus"]:
        return findings, facts
    if not is_nvswitch(query):
        return findings, facts
    fm_active = fm.get("ActiveState") if fm else None
    bad = collections.defaultdict(list)
    for gpu in query["gpus"]:
        index = indices.get(_bus_key(gpu["bus"]))
        state, status = gpu["fabric"].get("State"), gpu["fabric"].get("Status")
        if index is not None:
            if state is not None:
                facts["fabric.gpu%d.state" % index] = state
            if status is not None:
                facts["fabric.gpu%d.status" % index] = status
        if state is None and status is None:
            continue        # no Fabric section in this (cut short) block: reported above
        if state != "Completed" or status != "Success":
            bad[(state, status)].append(index)
        summary = gpu["health"].get("Summary")
        if summary and summary.strip().lower() not in ("n/a", "healthy"):
            details = ", ".join("%s %s" % (k, v) for k, v in gpu["health"].items()
                                if k != "Summary" and v.strip().lower() not in ("n/a", "false", "no"))
            findings.append(finding("warn", "fabric-health", "fabric health %s%s" % (
                summary, " (%s)" % details if details else ""), "monitor",
                [index] if index is not None else None,
                hint="the GPU is in the fabric but NVIDIA reports it degraded: watch it, and the "
                     "fabric manager log"))
    for (state, status), idx in sorted(bad.items(), key=lambda kv: str(kv[0])):
        gpus = [i for i in idx if i is not None]
        if fm_active and fm_active != "active":
            hint = ("nvidia-fabricmanager is %s: start it (systemctl restart %s) and check again; if "
                    "the State does not reach Completed, reboot (on NVLink 4 systems the GPUs need a "
                    "reset before a fabric manager restart can train them again)" % (fm_active, FM_UNIT))
        elif state in ("In Progress", "Not Started") and status in (None, "N/A", "Success"):
            hint = ("the fabric manager has not finished training the fabric: wait a minute after "
                    "boot and check again; still so, restart %s, and if that does not help, reboot"
                    % FM_UNIT)
        else:
            hint = ("the fabric manager could not add the GPU to the fabric: see "
                    "/var/log/fabricmanager.log; reboot (a GPU reset is needed before it can be "
                    "trained again); if it persists, drain and contact support "
                    "(DCGM_FR_FABRIC_PROBE_STATE)")
        findings.append(finding("fail", "fabric-not-initialized",
                                "fabric not initialized — CUDA will fail to start on this node "
                                "(State %s, Status %s)" % (state or "missing", status or "missing"),
                                "reboot", gpus, hint=hint))
    return findings, facts


def fm_findings(fm, fabric_ok, models):
    """Findings about the fabric manager service; fm: parse_fm_state's dict."""
    if fm.get("LoadState") == "not-found":
        return [finding("info", "fabric-manager-absent", "%s: no such systemd unit" % FM_UNIT, "none",
                        hint="fine where the fabric is managed elsewhere; an HGX node needs it")]
    active = fm.get("ActiveState")
    if active is None:
        return [finding("info", "fabric-manager-unknown", "%s state not read" % FM_UNIT, "none")]
    if active == "active" or not fabric_ok:
        return []   # not ok: the fabric-not-initialized finding names the service state
    if any(OFF_NODE_FM.search(m or "") for m in models):
        return []
    return [finding("warn", "fabric-manager-inactive", "%s is %s (%s) while the fabric is up"
                    % (FM_UNIT, active, fm.get("SubState") or "?"), "monitor",
                    hint="the trained fabric keeps working, but a GPU reset or a new job "
                         "partition needs it: `systemctl restart %s`, see its log" % FM_UNIT)]


def log_findings(errors):
    """One finding per NVSwitch port and kind of error, with the count and the last time."""
    groups = collections.OrderedDict()
    for e in errors:
        key = (e["kind"], e["bus"], e["physical"], e["port"])
        groups.setdefault(key, []).append(e)
    out = []
    for (kind, bus, physical, port), es in groups.items():
        codes = sorted(set(e["code"] for e in es))
        where = "NVSwitch %s%s%s" % (bus, " (physical id %d)" % physical if physical is not None else "",
                                     " port %d" % port if port is not None else "")
        message = "%s: %d %s error%s (%s) in fabricmanager.log, last %s" % (
            where, len(es), kind, "" if len(es) == 1 else "s", ", ".join(str(c) for c in codes), es[-1]["time"])
        ports = ["%s/%d" % (bus, port) if port is not None else bus]
        if kind == "fatal":
            out.append(finding("fail", "nvswitch-fatal", message, "drain", ports=ports,
                               hint="NVIDIA maps an NVSwitch fatal error to contact support "
                                    "(DCGM_FR_NVSWITCH_FATAL_ERROR): drain the node; the fabric "
                                    "manager log names the switch and port"))
        else:
            out.append(finding("warn", "nvswitch-error", message, "monitor", ports=ports,
                               hint="non-fatal NVSwitch errors need no action by NVIDIA's mapping "
                                    "(DCGM_FR_NVSWITCH_NON_FATAL_ERROR -> NONE): watch whether they "
                                    "repeat on the same port"))
    return out


# --------------------------------------------------------------------------- the check


def check(expect, run_tool, **options):
    """Fabric findings; facts ``driver``, ``cuda``, ``fabric.gpuN.state|status``.

    options used: ``gpus`` (node_check's inventory: PCI address -> index), ``tool_timeout``,
    ``fabricmanager_log`` (path, default /var/log/fabricmanager.log; None: not read),
    ``log_since`` (epoch seconds: older fabric manager errors are left out).
    """
    timeout = float(options.get("tool_timeout") or DEFAULT_TIMEOUT)
    gpus = options.get("gpus") or []
    findings, facts = [], {}

    tool = run_tool(list(QUERY_ARGV), timeout)
    problem = tool_problem(tool, QUERY_ARGV, timeout)
    if problem:
        return {"findings": [problem], "facts": facts}
    query = parse_query(tool.out)
    if tool.rc != 0 and not query["gpus"]:
        first = (tool.out.strip() or tool.err.strip() or "no output").splitlines()[0][:300]
        return {"findings": [finding("warn", "fabric-query-failed", "`nvidia-smi -q` exited %s: %s"
                                     % (tool.rc, first), "monitor")], "facts": facts}
    if not query["gpus"] and gpus:
        findings.append(finding("warn", "fabric-query-incomplete", "`nvidia-smi -q` listed no GPU", "monitor"))

    fm = None
    nvswitch = is_nvswitch(query)
    if nvswitch:
        tool = run_tool(list(FM_ARGV), timeout)
        if tool.status == "ok" and tool.rc == 0:
            fm = parse_fm_state(tool.out)
        elif tool.status == "ok":
            first = (tool.err.strip() or tool.out.strip() or "no output").splitlines()[0][:200]
            findings.append(finding("info", "fabric-manager-unknown", "%s state not read: systemctl "
                                    "exited %s: %s" % (FM_UNIT, tool.rc, first), "none"))
        else:
            findings.append(finding("info", "fabric-manager-unknown", "%s state not read: systemctl %s"
                                    % (FM_UNIT, "not found" if tool.status == "missing" else tool.status),
                                    "none"))
    more, facts = fabric_findings(query, gpu_indices(query, gpus), fm)
    findings.extend(more)
    if fm is not None:
        fabric_ok = not any(f["code"] == "fabric-not-initialized" for f in more)
        models = [g["name"] for g in query["gpus"]] + [g.get("name") for g in gpus]
        findings.extend(fm_findings(fm, fabric_ok, models))

    path = options.get("fabricmanager_log", FM_LOG)
    if path:
        text = read_tail(path)
        if text is not None:
            findings.extend(log_findings(parse_fm_log(text, since=options.get("log_since"))))
    data = {"nvswitch": nvswitch, "gpus_listed": len(query["gpus"]), "attached": query["attached"],
            "fabric_manager": fm}
    return {"findings": fold(findings), "facts": facts, "data": data}
