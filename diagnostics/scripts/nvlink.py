"""node-check's NVLink check: links active per GPU against the model, link error counters.

Standard library only, Python 3.8+, no import of the local package: shipped beside
node_check.py and imported from the run's temp dir. ``check(expect, run_tool, **options)``
glues two tool calls to the pure parsers below, which the unit tests drive with recorded
outputs (tests/fixtures/nvlink/):

    nvidia-smi nvlink -s    per GPU: each link's speed, ``<inactive>``, or one line saying
                            all links are inactive / the GPU has no NVLink / it is in MIG mode
    nvidia-smi nvlink -e    per GPU and link: error counters. Up to R5xx on Ampere/Hopper
                            ``Replay Errors``, ``Recovery Errors``, ``CRC Errors``; newer drivers
                            (seen on B300, R595) name the post-FEC counters instead
                            (``Rx Errors``, ``Symbol Errors``, ``Link recovery failed events``,
                            ...), beside FEC histogram bins, BER and raw lane counters that are
                            non-zero on healthy links and are ignored here.

Thresholds (the counters of ``nvlink -e`` count since the driver loaded, or since
``nvidia-smi nvlink -re``; one snapshot has no time window, so a rate is taken over the
uptime, which is at least that long: the rate is a lower bound):

    all links of a GPU inactive (NVLink model)     fail  reboot  DCGM_FR_NVLINK_DOWN -> RESTART_VM
    fewer links active than expected               fail  reboot  (same; persisting: drain)
    more links active than expected                warn  monitor hosts.yaml disagrees with the node
    a link slower than the node's usual speed      warn  monitor
    CRC errors >= 100/s on a link                  fail  drain   DCGM_LIMIT_MAX_NVLINK_CRC_ERROR
                                                                 (RM: CRC matters at 100+/s);
                                                                 DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD
                                                                 -> CONTACT_SUPPORT
    replay or CRC errors >= 1 per hour of uptime   warn  monitor DCGM_FR_NVLINK_ERROR_THRESHOLD
      (any, when the uptime is unknown)                          -> NONE: watch the link
    replay or CRC errors below that                info  none    a healthy link's count stays at 0,
                                                                 a few over weeks is noise
    recovery errors / recovery events >= 1         warn  monitor the link retrained (traffic
                                                                 stalled meanwhile); "Total link
                                                                 recovery events" (successful +
                                                                 failed) is not counted twice
    link recovery failed events >= 1               fail  reboot  the link stayed down: NVLINK_DOWN
    post-FEC errors (Rx, Symbol, Effective,        warn  monitor zero on healthy links
      Malformed packet, Buffer overrun, ...) >= 1
"""

import collections
import re

import _remote

Tool = _remote.Tool

CHECK = "nvlink"
DEFAULT_TIMEOUT = 10.0
STATUS_ARGV = ["nvidia-smi", "nvlink", "-s"]
ERRORS_ARGV = ["nvidia-smi", "nvlink", "-e"]

CRC_FAIL_PER_SECOND = 100.0     # DCGM_LIMIT_MAX_NVLINK_CRC_ERROR
ERRORS_WARN_PER_HOUR = 1.0

# NVLinks per GPU by model name (nvidia-smi's product name); first match wins. PCIe and NVL
# cards (NVLink bridges, if any, are a build choice) and consumer GPUs: no expectation.
MODEL_LINKS = (
    (re.compile(r"PCIe|\bNVL\b", re.I), None),
    (re.compile(r"\bG?B[23]00\b", re.I), 18),          # B200, B300, GB200, GB300: NVLink 5
    (re.compile(r"\bH200\b", re.I), 18),                # H200 SXM: NVLink 4
    (re.compile(r"\bH100\b.*\b(HBM3e?|SXM\d?)\b", re.I), 18),
    (re.compile(r"\bH800\b", re.I), 8),
    (re.compile(r"\bA100-SXM", re.I), 12),              # NVLink 3
    (re.compile(r"\bA800-SXM", re.I), 8),
    (re.compile(r"\bV100-SXM", re.I), 6),               # NVLink 2
)

LEGACY_REPLAY = "Replay Errors"
LEGACY_RECOVERY = "Recovery Errors"
LEGACY_CRC = "CRC Errors"
RECOVERY_FAILED = "Link recovery failed events"
RECOVERY_OK = "Link recovery successful events"
POST_FEC = ("Malformed packet Errors", "Buffer overrun Errors", "Rx Errors", "Rx remote Errors",
            "Rx General Errors", "Local link integrity Errors", "Tx discards", "Effective Errors",
            "Symbol Errors")

_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]*)\))?\s*$")
_LINK = re.compile(r"^\s*Link (\d+): (.*?)\s*$")
_SPEED = re.compile(r"^([0-9]+(?:\.[0-9]+)?) GB/s$")
_COUNTER = re.compile(r"^(.*?):\s*(\S+)$")


# --------------------------------------------------------------------------- parsers


def model_links(name):
    """The NVLinks a GPU model has, or None (no NVLink, or not known to be fixed)."""
    for pattern, links in MODEL_LINKS:
        if pattern.search(name or ""):
            return links
    return None


def _per_gpu(text, link_line):
    """What ``nvidia-smi nvlink -s`` and ``-e`` share: a ``GPU N: NAME (UUID: ...)`` line opens a
    GPU ({"name", "uuid", "state": "links", "links": {}, "notes": []}); each ``Link N: ...`` line
    of it goes to ``link_line(gpu, link, rest, line)``; "all links are inactive", "does not have
    or support nvlink" and "MIG mode" set its state; any other line is a note of the GPU, or of
    the whole output before the first GPU. -> {"gpus": {index: gpu}, "notes": [...]}."""
    gpus = collections.OrderedDict()
    notes = []
    cur = None
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        m = _GPU.match(line)
        if m:
            cur = gpus[int(m.group(1))] = {"name": m.group(2).strip(), "uuid": m.group(3), "state": "links",
                                           "links": collections.OrderedDict(), "notes": []}
            continue
        if cur is None:
            notes.append(line.strip())
            continue
        m = _LINK.match(line)
        if m:
            link_line(cur, int(m.group(1)), m.group(2), line)
            continue
        low = line.lower()
        if "all links are inactive" in low:
            cur["state"] = "all-inactive"
        elif "does not have or support nvlink" in low:
            cur["state"] = "no-nvlink"
        elif "mig mode" in low:
            cur["state"] = "mig"
        else:
            cur["notes"].append(line.strip())
    return {"gpus": gpus, "notes": notes}


def parse_nvlink_status(text):
    """``nvidia-smi nvlink -s`` -> {"gpus": {index: gpu}, "notes": [lines outside a GPU]}.

    gpu: {"name", "uuid", "state", "links": {link: GB/s float, or None when inactive},
    "raw": {link: text} for a link neither a speed nor ``<inactive>``, "notes": [other lines]};
    state "links" (link lines follow, maybe none), "all-inactive", "no-nvlink" (the device has
    no NVLink), "mig" (NVLink queries are refused in MIG mode). Unknown lines become notes.
    """
    def link_line(gpu, link, value, line):
        speed = _SPEED.match(value)
        gpu["links"][link] = float(speed.group(1)) if speed else None
        if not speed and value.strip().lower() != "<inactive>":
            gpu.setdefault("raw", {})[link] = value
    return _per_gpu(text, link_line)


def _number(text):
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def parse_nvlink_errors(text):
    """``nvidia-smi nvlink -e`` -> {"gpus": {index: {"name", "links": {link: {counter: value}},
    "state", "notes"}}, "notes": [...]}. Every ``Link N: NAME: VALUE`` line is kept (value an
    int, a float such as ``15e-255``, or the text); a line holding several ``NAME: VALUE``
    pairs split by commas is split. Lines of no known form become notes, never an error."""
    def link_line(gpu, link, rest, line):
        counters = gpu["links"].setdefault(link, collections.OrderedDict())
        ok = False
        for part in rest.split(", "):
            c = _COUNTER.match(part.strip())
            if c and c.group(1):
                counters[c.group(1).strip()] = _number(c.group(2))
                ok = True
        if not ok:
            gpu["notes"].append(line.strip())
    return _per_gpu(text, link_line)


def read_uptime(path="/proc/uptime"):
    """Seconds since boot, or None."""
    try:
        with open(path) as f:
            return float(f.read(100).split()[0])
    except (OSError, ValueError, IndexError):
        return None


# --------------------------------------------------------------------------- findings


def finding(level, code, message, action, gpus=None, hint=None, ports=None):
    return _remote.check_finding(CHECK, level, code, message, action, gpus=gpus, hint=hint, ports=ports)


fold = _remote.fold_gpus


def tool_problem(tool, argv, timeout, what="nvidia-smi"):
    return _remote.tool_problem(CHECK, tool, argv, timeout, what)


def _links_list(links):
    return ", ".join(str(n) for n in links)


def _fmt_speed(gbps):
    return ("%.3f" % gbps).rstrip("0").rstrip(".") + " GB/s"


HINT_DOWN = ("NVIDIA maps NVLink down (DCGM_FR_NVLINK_DOWN) to a reboot (RESTART_VM): the links "
             "train when the driver loads; if they stay down after the reboot, drain the node and "
             "have the GPU baseboard/NVLink checked (DCGM_FR_GPU_EXPECTED_NVLINKS_UP: contact support)")


def status_findings(parsed, expect, names):
    """Findings and facts of a parsed ``nvlink -s``. names: {index: model name} to fall back on."""
    findings, facts = [], {}
    want = expect.get("nvlinks_per_gpu")
    speeds = collections.Counter()
    for gpu in parsed["gpus"].values():
        speeds.update(s for s in gpu["links"].values() if s is not None)
    usual = speeds.most_common(1)[0][0] if speeds else None
    for index, gpu in parsed["gpus"].items():
        name = gpu["name"] or names.get(index) or ""
        expected = want if want is not None else model_links(name)
        source = "hosts.yaml expect.nvlinks_per_gpu" if want is not None else name
        state = gpu["state"]
        if state == "mig":
            findings.append(finding("info", "not-checked", "NVLink not checked: the GPU is in MIG mode "
                                    "(nvidia-smi answers no NVLink query then)", "none", [index]))
            continue
        if state == "no-nvlink":
            if want:
                findings.append(finding("warn", "nvlink-count", "the GPU (%s) has no NVLink, %s says %d"
                                        % (name, source, want), "monitor", [index],
                                        hint="set expect.nvlinks_per_gpu for this host in hosts.yaml"))
            continue
        active = [n for n, s in gpu["links"].items() if s is not None]
        inactive = [n for n, s in gpu["links"].items() if s is None]
        facts["nvlink.gpu%d.active" % index] = len(active)
        gpu_speeds = collections.Counter(gpu["links"][n] for n in active)
        facts["nvlink.gpu%d.speed" % index] = gpu_speeds.most_common(1)[0][0] if gpu_speeds else None
        if not expected:
            if inactive and active:
                findings.append(finding("info", "nvlink-inactive", "NVLinks %s inactive, %d active "
                                        "(the model's link count is not known to mldiag)"
                                        % (_links_list(inactive), len(active)), "none", [index]))
            continue
        if not active:
            findings.append(finding("fail", "nvlink-down", "all NVLinks inactive: 0 of %d active" % expected,
                                    "reboot", [index], hint=HINT_DOWN))
        elif len(active) < expected:
            detail = " (inactive: links %s)" % _links_list(inactive) if inactive else ""
            findings.append(finding("fail", "nvlink-inactive", "%d of %d NVLinks active%s"
                                    % (len(active), expected, detail), "reboot", [index], hint=HINT_DOWN))
        elif len(active) > expected:
            findings.append(finding("warn", "nvlink-count", "%d NVLinks active, %s says %d"
                                    % (len(active), source, expected), "monitor", [index],
                                    hint="the node has more links than expected: correct "
                                         "expect.nvlinks_per_gpu in hosts.yaml"))
        slow = [n for n in active if usual is not None and gpu["links"][n] < usual]
        if slow:
            findings.append(finding("warn", "nvlink-slow", "NVLinks %s at %s, the node's others at %s"
                                    % (_links_list(slow), _fmt_speed(min(gpu["links"][n] for n in slow)),
                                       _fmt_speed(usual)), "monitor", [index],
                                    hint="a link trained at a lower speed: compare after a reboot; "
                                         "persisting, have the link checked"))
        for n, raw in sorted((gpu.get("raw") or {}).items()):
            findings.append(finding("info", "nvlink-unknown-state", "NVLink %d reads %r (not a speed): "
                                    "counted inactive" % (n, raw), "none", [index]))
    return findings, facts


def _rate(count, uptime):
    return None if not uptime or uptime <= 0 else count / uptime


def _int(value):
    return value if isinstance(value, int) and value > 0 else 0


def error_findings(parsed, uptime):
    """Findings of a parsed ``nvlink -e``; uptime: seconds the counters had at most (or None)."""
    findings = []
    hours = uptime / 3600.0 if uptime else None
    window = ("since driver load (%.0f h uptime)" % hours) if hours else "since driver load"
    for index, gpu in parsed["gpus"].items():
        crc_fail, warn_counts, low_counts, recovery, failed, post_fec = [], [], [], [], [], []
        for link, c in gpu["links"].items():
            replay, crc = _int(c.get(LEGACY_REPLAY)), _int(c.get(LEGACY_CRC))
            crc_rate = _rate(crc, uptime)
            if crc and crc_rate is not None and crc_rate >= CRC_FAIL_PER_SECOND:
                crc_fail.append("link %d: %d CRC (%.0f/s)" % (link, crc, crc_rate))
            elif replay or crc:
                worst = max(replay, crc)
                text = "link %d: %s" % (link, ", ".join(
                    "%d %s" % (v, k) for k, v in (("replay", replay), ("CRC", crc)) if v))
                per_hour = worst / hours if hours else None
                if per_hour is None or per_hour >= ERRORS_WARN_PER_HOUR:
                    warn_counts.append(text)
                else:
                    low_counts.append(text)
            rec = _int(c.get(LEGACY_RECOVERY)) + _int(c.get(RECOVERY_OK))
            if rec:
                recovery.append("link %d: %d" % (link, rec))
            if _int(c.get(RECOVERY_FAILED)):
                failed.append("link %d: %d" % (link, c[RECOVERY_FAILED]))
            bad = ["%d %s" % (c[k], k) for k in POST_FEC if _int(c.get(k))]
            if bad:
                post_fec.append("link %d: %s" % (link, ", ".join(bad)))
        if crc_fail:
            findings.append(finding("fail", "nvlink-crc-rate", "NVLink CRC errors at >= %g/s %s: %s"
                                    % (CRC_FAIL_PER_SECOND, window, "; ".join(crc_fail)), "drain", [index],
                                    hint="DCGM fails a link at 100 CRC errors/s (DCGM_FR_NVLINK_CRC_ERROR_"
                                         "THRESHOLD, NVIDIA: contact support): drain the node and have "
                                         "the link checked"))
        if failed:
            findings.append(finding("fail", "nvlink-recovery-failed", "NVLink recovery failed %s: %s"
                                    % (window, "; ".join(failed)), "reboot", [index], hint=HINT_DOWN))
        if warn_counts:
            findings.append(finding("warn", "nvlink-errors", "NVLink errors %s, >= %g/h: %s"
                                    % (window, ERRORS_WARN_PER_HOUR, "; ".join(warn_counts)), "monitor",
                                    [index],
                                    hint="replays retransmit what a CRC check rejected: bandwidth drops "
                                         "before anything fails. Reset the counters (nvidia-smi nvlink "
                                         "-re) and watch whether they climb again"))
        if post_fec:
            findings.append(finding("warn", "nvlink-errors", "NVLink errors past FEC %s: %s"
                                    % (window, "; ".join(post_fec)), "monitor", [index],
                                    hint="these counters stay at 0 on a healthy link: watch whether "
                                         "they climb; with an Xid 144-150 for the link, drain"))
        if recovery:
            findings.append(finding("warn", "nvlink-recovery", "NVLink recoveries (link retrained) %s: %s"
                                    % (window, "; ".join(recovery)), "monitor", [index],
                                    hint="traffic on the link stalled while it retrained: watch for "
                                         "more, and for Xid 74 in the kernel log"))
        if low_counts:
            findings.append(finding("info", "nvlink-errors-low", "NVLink errors %s, < %g/h: %s"
                                    % (window, ERRORS_WARN_PER_HOUR, "; ".join(low_counts)), "none",
                                    [index]))
    return findings


# --------------------------------------------------------------------------- the check


def _failed_run(tool, argv):
    """The warning for a call that exited non-zero, quoting its first line that is not a GPU's."""
    lines = [ln.strip() for ln in (tool.out + "\n" + tool.err).splitlines()
             if ln.strip() and not _GPU.match(ln) and not _LINK.match(ln)]
    first = (lines[0] if lines else "no output")[:300]
    return finding("warn", "nvlink-query-failed", "`%s` exited %s: %s" % (" ".join(argv), tool.rc, first),
                   "monitor", hint="nvidia-smi could not read NVLink state: see its message and the "
                                   "kernel log")


def check(expect, run_tool, **options):
    """NVLink findings and facts (``nvlink.gpuN.active``, ``nvlink.gpuN.speed``)."""
    expect = expect or {}
    timeout = float(options.get("tool_timeout") or DEFAULT_TIMEOUT)
    names = dict((g.get("index"), g.get("name")) for g in options.get("gpus") or [])
    findings, facts = [], {}

    tool = run_tool(list(STATUS_ARGV), timeout)
    problem = tool_problem(tool, STATUS_ARGV, timeout)
    if problem:
        return {"findings": [problem], "facts": facts}
    status = parse_nvlink_status(tool.out)
    status_rc = tool.rc
    if tool.rc != 0:
        findings.append(_failed_run(tool, STATUS_ARGV))
    elif not status["gpus"] and names:
        text = " ".join(status["notes"])[:200] or "no output"
        findings.append(finding("warn", "nvlink-unparsed", "`nvidia-smi nvlink -s` listed no GPU: %s" % text,
                                "monitor"))
    more, facts = status_findings(status, expect, names)
    findings.extend(more)

    with_links = [i for i, g in status["gpus"].items() if g["state"] == "links" and g["links"]]
    data = {"links": dict((str(i), {"active": sum(1 for s in g["links"].values() if s is not None),
                                    "listed": len(g["links"]), "state": g["state"]})
                          for i, g in status["gpus"].items())}
    if with_links:
        tool = run_tool(list(ERRORS_ARGV), timeout)
        problem = tool_problem(tool, ERRORS_ARGV, timeout)
        if problem:
            findings.append(problem)
        else:
            errors = parse_nvlink_errors(tool.out)
            if tool.rc != 0 and (status_rc == 0 or not errors["gpus"]):
                findings.append(_failed_run(tool, ERRORS_ARGV))
            uptime = options.get("uptime_s")
            if uptime is None:
                uptime = read_uptime()
            findings.extend(error_findings(errors, uptime))
    return {"findings": fold(findings), "facts": facts, "data": data}
