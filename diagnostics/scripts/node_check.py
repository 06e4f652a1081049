#!/usr/bin/env python3
"""node-check: a GPU node's hardware health -- Xid with an action, NVLink, NVSwitch fabric,
PCIe links, InfiniBand/RoCE ports, DCGM -- as one result with an action per finding.

Runs on the target, standard library only, Python 3.8+. The checks are modules of their own
shipped beside this file (mldiag puts them in the run's private temp dir, which is on
sys.path; by hand, copy them next to it):

    xid.py (+ xid_catalog.json)  the kernel log's Xid / SXid lines, with NVIDIA's action
    nvlink.py                    links active per GPU, link error counters
    nvfabric.py                  nvidia-smi -q's Fabric section, the fabric manager
                                 (check "fabric"; not fabric.py, which would shadow
                                 Fabric, the SSH library, wherever this dir is on sys.path)
    pcie.py                      GPU and NIC link width/generation, AER counters (sysfs)
    ib.py                        /sys/class/infiniband ports: state, rate, counters, flaps
    dcgm.py                      dcgmi diag -r N -j, when dcgmi is installed
    host_checks.py               what breaks training silently: /dev/shm, memlock, huge
                                 pages, clock sync, stuck GPU holders, hung network mounts,
                                 GPUDirect RDMA (check "host")
    gpu_host.py                  GPU memory held by no live process, persistence mode with
                                 no daemon, inside a container the GPUs given against those
                                 there (check "gpu-host")

Each module's ``check(expect, run_tool, **options)`` returns ``{"findings", "facts"}``
(and optionally ``"data"``). This file inventories the GPUs with one nvidia-smi call, reads
the kernel log once, runs the checks side by side in threads and merges what they found.
Every tool call has its own timeout (nvidia-smi stuck in D state is a known failure): a
tool that hangs is a finding, the same binary is not called again in this run, and a check
still running at ``--budget`` is reported as hung while the others still report.

Result ``data``: ``gpus`` (the inventory), ``facts`` (flat dotted keys -> scalars: what a
baseline compares), ``checks`` ({name: {"status", "seconds"[, "error"]}}), ``kernel_log``
({"source", "error", "chars"}), ``worst_action``, ``clock`` ({"wall_s": this node's wall clock
read last, "run_s": the run's length on its monotonic clock}: the client brackets it), and each
check's own ``data`` under its name.
Every finding carries ``action``: none < monitor < app < reset-gpu < reboot < drain < rma.

Run by hand: python3 node_check.py [--expect '{"gpus": 8, "ib_rate": 400}'] [--no-dcgm]
             [--paths '[{"name": "ckpt", "path": "/ckpt", "min_free_gb": 500}]']
"""

import json
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
import time
import traceback

import _remote
from _remote import ACTIONS

CHECKS = ("xid", "nvlink", "fabric", "pcie", "ib", "dcgm", "host", "gpu-host")
# A check's module file, where its name would shadow a well-known package (or is no identifier).
MODULE_OF = {"fabric": "nvfabric", "host": "host_checks", "gpu-host": "gpu_host"}
EXPECT_KEYS = ("gpus", "ib_ports", "ib_rate", "nvlinks_per_gpu", "pcie_width", "pcie_gen")
EXTRA_TOOL_DIRS = _remote.TOOL_DIRS
DEFAULT_TOOL_TIMEOUT = 10.0
DEFAULT_BUDGET = 60.0
MAX_OUTPUT = 4 * 1024 * 1024      # a tool's stdout/stderr kept, each
MAX_FACTS = 2000
INVENTORY_FIELDS = ("index", "pci.bus_id", "name", "serial", "uuid", "vbios_version",
                    "driver_version")
# Each GPU's settings a fleet keeps alike (a golden config holds them): asked in the inventory's
# one call (each nvidia-smi call is an NVML start, seconds on a node without persistence mode).
# nvidia-smi --help-query-gpu names: fact suffix, kind. All are in the R470 era's field list
# (mig.mode.current came with A100, R450); a driver that refuses one makes the call fail
# whole ('Field "x" is not a valid field to query.'), so the inventory is then asked again
# without them. Locked clocks (nvidia-smi -lgc) are not a query-gpu field: not here.
SETTING_FIELDS = (("ecc.mode.current", "ecc_mode", str), ("persistence_mode", "persistence_mode", str),
                  ("mig.mode.current", "mig_mode", str), ("compute_mode", "compute_mode", str),
                  ("power.limit", "power_limit_w", float),
                  ("clocks.applications.graphics", "app_clock_graphics_mhz", int),
                  ("clocks.applications.memory", "app_clock_memory_mhz", int),
                  ("clocks.max.graphics", "max_clock_graphics_mhz", int),
                  ("clocks.max.memory", "max_clock_memory_mhz", int))

log = logging.getLogger("node-check")

Tool = _remote.Tool


def build_parser():
    import argparse   # only here: through mldiag the client parses argv (bundle.parsed_args)
    p = argparse.ArgumentParser(prog="node_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--expect", default="{}", metavar="JSON",
                   help="what a healthy node has: {gpus, ib_ports, ib_rate, nvlinks_per_gpu, "
                        "pcie_width, pcie_gen} (hosts.yaml expect:)")
    p.add_argument("--paths", default="[]", metavar="JSON",
                   help="directories whose free space the host check reads: [{name, path, "
                        "min_free_gb}] (hosts.yaml paths:)")
    p.add_argument("--kernel-log-file", metavar="FILE",
                   help="read this saved kernel log instead of journalctl -k / dmesg")
    p.add_argument("--since", default="24h", metavar="AGE",
                   help="how far back the live kernel log is read (default 24h)")
    p.add_argument("--dcgm-level", type=int, choices=(1, 2, 3), metavar="LEVEL",
                   help="dcgmi diag run level (default 1 where dcgmi is installed)")
    p.add_argument("--no-dcgm", action="store_true", help="do not run dcgmi diag")
    p.add_argument("--tool-timeout", type=float, metavar="S",
                   help="seconds each tool call may take (default %g, or a sixth of --budget "
                        "when that is less)" % DEFAULT_TOOL_TIMEOUT)
    p.add_argument("--budget", type=float, metavar="S",
                   help="seconds the whole run may take, from its start, before the checks "
                        "still running are reported as hung (default 60, or dcgm's level "
                        "time + 60)")
    p.add_argument("--only", metavar="LIST", help="run only these checks (comma list of %s)"
                   % ",".join(CHECKS))
    return p


# --------------------------------------------------------------------------- running tools


class ToolRunner(object):
    """``run_tool(argv, timeout) -> Tool`` for the checks: each call bounded by its own
    timeout, its process group killed after it; a binary that hung once is not called again
    in this run (its next callers get status "skipped" at once, not another wait)."""

    def __init__(self, path=None):
        self.path = path
        self.hung = {}             # binary name -> the argv that hung
        self.calls = []            # (argv, status, seconds): what ran, for data
        self.lock = threading.Lock()

    def find(self, name):
        return _remote.find_tool(name, EXTRA_TOOL_DIRS, self.path)

    def hung_before(self, name):
        with self.lock:
            return self.hung.get(os.path.basename(name))

    def __call__(self, argv, timeout=DEFAULT_TOOL_TIMEOUT):
        argv = [str(a) for a in argv]
        name = os.path.basename(argv[0])
        t0 = time.monotonic()
        if self.hung_before(name):
            return self._done(argv, Tool("skipped", None, "", "", 0.0))
        exe = self.find(argv[0])
        if exe is None:
            return self._done(argv, Tool("missing", None, "", "%s: not found" % argv[0], 0.0))
        try:
            proc = subprocess.Popen([exe] + argv[1:], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as e:
            return self._done(argv, Tool("missing", None, "", "%s: %s" % (argv[0], e.strerror or e),
                                         time.monotonic() - t0))
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            try:
                proc.communicate(timeout=2)
            except subprocess.TimeoutExpired:   # a grandchild in D state holds the pipes
                pass
            with self.lock:
                self.hung.setdefault(name, argv)
            return self._done(argv, Tool("timeout", None, "", "", time.monotonic() - t0))
        return self._done(argv, Tool("ok", proc.returncode, _text(out), _text(err),
                                     time.monotonic() - t0))

    def _done(self, argv, tool):
        with self.lock:
            if len(self.calls) < 200:
                self.calls.append({"argv": argv[:8], "status": tool.status, "rc": tool.rc,
                                   "seconds": round(tool.seconds, 3)})
        return tool


def _text(raw):
    if len(raw) > MAX_OUTPUT:
        raw = raw[-MAX_OUTPUT:]
    return raw.decode("utf-8", "replace")


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def command_text(argv):
    return " ".join(argv)


def finding(level, code, message, action, check, hint=None, gpus=None, ports=None):
    f = {"level": level, "code": code, "message": message, "action": action, "check": check}
    if hint:
        f["hint"] = hint
    if gpus:
        f["gpus"] = list(gpus)
    if ports:
        f["ports"] = list(ports)
    return f


def tool_hung(argv, timeout, check):
    return finding("fail", "tool-hung", "`%s` did not answer within %g s" % (command_text(argv), timeout),
                   "reboot", check,
                   hint="a tool stuck on the GPU driver (D state) usually means a GPU in a bad "
                        "state: check the kernel log for Xid 79/119, then reboot the node")


# --------------------------------------------------------------------------- the GPU inventory


def parse_inventory(text, settings=False):
    """``nvidia-smi --query-gpu=index,pci.bus_id,...[,SETTING_FIELDS] --format=csv,noheader
    [,nounits]`` -> [gpu dicts]; with ``settings``, each GPU's ``settings`` {suffix: value}
    (a value nvidia-smi does not have, ``[N/A]``, ``[Not Supported]``, is left out)."""
    gpus = []
    width = len(INVENTORY_FIELDS) + (len(SETTING_FIELDS) if settings else 0)
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < width:
            continue
        try:
            index = int(cells[0])
        except ValueError:
            continue
        gpu = {"index": index, "pci": cells[1], "name": cells[2], "serial": cells[3],
               "uuid": cells[4], "vbios": cells[5], "driver": cells[6]}
        if settings:
            gpu["settings"] = parse_settings(cells[len(INVENTORY_FIELDS):width])
        gpus.append(gpu)
    return gpus


def parse_settings(cells):
    out = {}
    for (_, suffix, kind), cell in zip(SETTING_FIELDS, cells):
        if not cell or cell.startswith("[") or cell in ("N/A", "Unknown Error"):
            continue
        try:
            value = kind(cell)
        except ValueError:
            continue
        out[suffix] = value
    return out


def not_a_field(tool):
    return tool.rc not in (0, None) and "is not a valid field to query" in tool.out + tool.err


def inventory(run_tool, timeout):
    """(gpus, findings, note): the GPUs nvidia-smi lists, or why there are none. An nvidia-smi
    that does not know one of SETTING_FIELDS is asked again for the inventory alone."""
    fields = INVENTORY_FIELDS + tuple(f for f, _, _ in SETTING_FIELDS)
    argv = ["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]
    tool = run_tool(argv, timeout)
    settings = True
    if not_a_field(tool):
        settings = False
        argv = ["nvidia-smi", "--query-gpu=" + ",".join(INVENTORY_FIELDS), "--format=csv,noheader"]
        tool = run_tool(argv, timeout)
    if tool.status == "missing":
        return [], [finding("info", "no-nvidia-smi", "nvidia-smi not found: the GPU checks have "
                            "nothing to read (not an NVIDIA GPU node, or the driver is missing)",
                            "none", "gpu")], "nvidia-smi missing"
    if tool.status == "timeout":
        return [], [tool_hung(argv, timeout, "gpu")], "nvidia-smi hung"
    gpus = parse_inventory(tool.out, settings)
    if tool.rc != 0 and not gpus:
        first = (tool.out.strip() or tool.err.strip() or "no output").splitlines()[0][:300]
        return [], [finding("fail", "nvidia-smi-failed", "nvidia-smi exited %s: %s" % (tool.rc, first),
                            "reboot", "gpu",
                            hint="the driver does not answer: check the kernel log (Xid 79, "
                                 "NVRM errors); a reboot usually brings it back")], "nvidia-smi failed"
    return gpus, [], None


def gpu_count_finding(gpus, expect):
    want = expect.get("gpus")
    if want is None or len(gpus) >= want:
        return None
    return finding("fail", "gpu-count", "%d GPUs answer, expected %d" % (len(gpus), want),
                   "reboot", "gpu",
                   hint="a GPU that fell off the bus (Xid 79) comes back only after a reboot; if "
                        "it does not, drain the node and have the GPU reseated or replaced")


def inventory_facts(gpus):
    facts = {"gpu.count": len(gpus)}
    if gpus:
        facts["gpu.model"] = _one_or_many(g["name"] for g in gpus)
        facts["gpu.vbios"] = _one_or_many(g["vbios"] for g in gpus)
        facts["driver"] = _one_or_many(g["driver"] for g in gpus)
    for g in gpus:      # per GPU, as nvlink.gpuN / pcie.gpuN: a drift names its GPU
        for suffix, value in sorted((g.get("settings") or {}).items()):
            facts["gpu.gpu%d.%s" % (g["index"], suffix)] = value
    return facts


def _one_or_many(values):
    values = sorted(set(values))
    return values[0] if len(values) == 1 else " / ".join(values)


def host_facts(sys_root="/sys"):
    facts = {"kernel": platform.release()}
    ib = load_check("ib")
    if ib is not None and hasattr(ib, "ofed_version"):
        version, _ = ib.ofed_version(sys_root)
        if version:
            facts["ofed"] = version
    return facts


SPAN_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def span_seconds(text):
    """``--since``'s span ("24h", "90m", "2d", "3600") in seconds, or None when it is not one."""
    text = str(text or "").strip().lstrip("-").lower()
    unit = text[-1:] if text[-1:] in SPAN_UNITS else "s"
    number = text[:-1] if text[-1:] in SPAN_UNITS else text
    try:
        return float(number) * SPAN_UNITS[unit]
    except ValueError:
        return None


# --------------------------------------------------------------------------- running the checks


HERE = os.path.dirname(os.path.abspath(__file__))


def load_check(name):
    """The check module ``NAME.py`` beside this file, or None when it is not there
    (``_remote.load_companion``: by path, under a private module name)."""
    return _remote.load_companion(HERE, MODULE_OF.get(name, name) + ".py", "_mldiag_check_" + name)


class CheckRun(object):
    def __init__(self, name):
        self.name = name
        self.result = None
        self.error = None
        self.seconds = None
        self.thread = None
        self.t0 = time.monotonic()


def run_check(run, module, expect, run_tool, options):
    try:
        run.result = module.check(dict(expect), run_tool, **options)
    except Exception:
        run.error = traceback.format_exc()[-4000:]
    run.seconds = time.monotonic() - run.t0
    log.info("%s: %s (%.1f s)", run.name, "crashed" if run.error else "done", run.seconds)


def check_status(findings):
    if any(f.get("code") == "tool-hung" for f in findings):
        return "hung"
    return _remote.worst_status(findings)


def run_checks(names, expect, run_tool, options, budget):
    """Every check in its own thread; (findings, facts, checks, data)."""
    runs = []
    findings, facts, checks, data = [], {}, {}, {}
    for name in names:
        module = load_check(name)
        if module is None:
            checks[name] = {"status": "skipped", "seconds": 0.0}
            findings.append(finding("info", "check-not-shipped", "%s check not run: %s.py is not "
                                    "beside node_check.py" % (name, name), "none", name))
            continue
        run = CheckRun(name)
        run.thread = threading.Thread(target=run_check, name="check-" + name, daemon=True,
                                      args=(run, module, expect, run_tool, options))
        run.thread.start()
        runs.append(run)
    deadline = time.monotonic() + budget
    for run in runs:
        run.thread.join(max(0.0, deadline - time.monotonic()))
        if run.thread.is_alive():
            checks[run.name] = {"status": "hung", "seconds": round(time.monotonic() - run.t0, 3)}
            findings.append(finding("fail", "check-hung", "%s check still running after %g s "
                                    "(the node-check budget)" % (run.name, budget), "reboot", run.name,
                                    hint="something it reads does not answer (a hung driver or "
                                         "filesystem): see the kernel log"))
            continue
        if run.error is not None:
            checks[run.name] = {"status": "crashed", "seconds": round(run.seconds, 3),
                                "error": run.error}
            last = run.error.strip().splitlines()[-1][:300]
            findings.append(finding("warn", "check-crashed", "%s check crashed: %s" % (run.name, last),
                                    "none", run.name,
                                    hint="a bug of mldiag's; the traceback is in data.checks.%s.error"
                                         % run.name))
            continue
        result = run.result if isinstance(run.result, dict) else {}
        got = [f for f in result.get("findings") or [] if isinstance(f, dict)]
        for f in got:
            f.setdefault("check", run.name)
            if f.get("action") not in ACTIONS:
                f["action"] = "monitor" if f.get("level") in ("warn", "fail") else "none"
        findings.extend(got)
        for key, value in (result.get("facts") or {}).items():
            if len(facts) < MAX_FACTS and isinstance(value, (str, int, float, bool, type(None))):
                facts[str(key)] = value
        if result.get("data") is not None:
            data[run.name] = result["data"]
        checks[run.name] = {"status": check_status(got), "seconds": round(run.seconds, 3)}
    return findings, facts, checks, data


# --------------------------------------------------------------------------- the result


def action_rank(action):
    return ACTIONS.index(action) if action in ACTIONS else -1


def worst_action(findings):
    worst = None
    for f in findings:
        if action_rank(f.get("action")) > action_rank(worst):
            worst = f.get("action")
    return worst


IDLE_CODES = ("not-checked", "dcgm-absent")


def summarise(gpus, findings, checks):
    problems = [f for f in findings if f.get("level") in ("warn", "fail")]
    what = "%d× %s" % (len(gpus), gpus[0]["name"]) if gpus else "no GPU listed"
    # a check with nothing to read (no nvidia-smi, no dcgmi) did not pass anything
    idle = [n for n in checks if any(f.get("check") == n and f.get("code") in IDLE_CODES
                                     and not f.get("gpus") for f in findings)]
    ran = [n for n, c in checks.items() if c["status"] != "skipped" and n not in idle]
    if not problems:
        return "healthy: %s, %d checks passed (%s)%s" % (
            what, len(ran), ", ".join(ran), "; nothing to read for %s" % ", ".join(idle) if idle else "")
    problems.sort(key=lambda f: (-_remote.level_rank(f["level"]), -action_rank(f.get("action"))))
    top = problems[0]
    more = " (+%d more)" % (len(problems) - 1) if len(problems) > 1 else ""
    return "%s: %s%s" % (worst_action(problems) or "monitor", top["message"], more)


def json_argument(flag, text, empty, kind, wanted):
    """A flag's one JSON token (hosts.yaml's block, as the client sent it), of type ``kind``;
    bad input ends the run with the flag named (by hand: a typo on the command line)."""
    try:
        value = json.loads(text or empty)
    except ValueError as e:
        raise SystemExit("%s: not JSON: %s" % (flag, e))
    if not isinstance(value, kind):
        raise SystemExit("%s: %s" % (flag, wanted))
    return value


def parse_expect(text):
    expect = json_argument("--expect", text, "{}", dict, 'a JSON object, like {"gpus": 8}')
    return {k: v for k, v in expect.items()
            if k in EXPECT_KEYS and isinstance(v, int) and not isinstance(v, bool)}


MAX_PATHS = 32


def parse_paths(text):
    """``--paths``: [{"name", "path", "min_free_gb"}] as hosts.yaml's ``paths:`` checked them;
    by hand, an entry that is not one is left out."""
    paths = json_argument("--paths", text, "[]", list,
                          'a JSON list, like [{"name": "ckpt", "path": "/ckpt", "min_free_gb": 500}]')
    out = []
    for entry in paths[:MAX_PATHS]:
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("path"), str) and entry["path"].startswith("/")):
            continue
        least = entry.get("min_free_gb")
        if isinstance(least, bool) or not isinstance(least, (int, float)) or least < 0:
            least = None
        out.append({"name": entry["name"], "path": entry["path"], "min_free_gb": least})
    return out


def dcgm_budget(level):
    """The node-check budget for a dcgmi diag run at ``level``: dcgm.py's own timeout for that
    level (one table, in dcgm.py) and a minute for the other checks. A level-3 run that takes
    50 minutes must end as dcgm.py's verdict, not as "hung" at node-check's budget."""
    if not level:
        return DEFAULT_BUDGET
    dcgm = load_check("dcgm")
    return max(DEFAULT_BUDGET, dcgm.timeout_for(level) + 60.0) if dcgm else DEFAULT_BUDGET


def tool_timeout_for(given, budget):
    """Each tool call's timeout: ``--tool-timeout`` when given, else the default, lowered to a
    sixth of a ``--budget`` given below six times it (a Slurm health check's 30 s: 5 s each),
    so that a hung nvidia-smi and a hung kernel-log reader still leave the checks their time."""
    if given:
        return given
    return max(1.0, min(DEFAULT_TOOL_TIMEOUT, budget / 6.0)) if budget else DEFAULT_TOOL_TIMEOUT


def run(args):
    # this run's length on the node's own monotonic clock: the client brackets the node's wall
    # clock at the end of it between its own clock at the job's start and at the answer
    # (builtin/node_check/clock.py): the shorter the unknown part, the tighter the bound; the
    # --budget counts from here too
    began = time.monotonic()
    expect = parse_expect(args.expect)
    run_tool = ToolRunner()
    names = [n.strip() for n in args.only.split(",")] if args.only else list(CHECKS)
    names = [n for n in names if n in CHECKS]
    dcgm_level = None if args.no_dcgm else args.dcgm_level
    if args.no_dcgm and "dcgm" in names:
        names.remove("dcgm")
    budget = args.budget or dcgm_budget(dcgm_level)
    args.tool_timeout = tool_timeout_for(args.tool_timeout, args.budget)

    gpus, findings, inventory_note = inventory(run_tool, args.tool_timeout)
    count = gpu_count_finding(gpus, expect)
    if count:
        findings.append(count)
    facts = dict(host_facts())
    facts.update(inventory_facts(gpus))

    kernel_log = read_kernel_log(run_tool, args, findings)
    span = span_seconds(args.since)
    options = {"gpus": gpus, "kernel_log": kernel_log, "sys_root": "/sys",
               "dcgm_level": dcgm_level, "tool_timeout": args.tool_timeout,
               # the fabric manager's log is read over the same window as the kernel's
               "log_since": time.time() - span if span is not None else None,
               "under_load": False, "paths": parse_paths(args.paths)}
    # the budget counts from the start: what the inventory and the kernel log took is spent
    left = max(1.0, budget - (time.monotonic() - began))
    more, check_facts, checks, check_data = run_checks(names, expect, run_tool, options, left)
    findings.extend(more)
    facts.update(check_facts)

    # each GPU's settings are facts (gpu.gpuN.*), not repeated in the inventory
    shown = [dict((k, v) for k, v in g.items() if k != "settings") for g in gpus]
    data = {"gpus": shown, "expect": expect, "facts": facts, "checks": checks,
            "kernel_log": {"source": kernel_log.get("source"), "error": kernel_log.get("error"),
                           "chars": len(kernel_log.get("text") or "")},
            "tools": run_tool.calls}
    if inventory_note:
        data["inventory"] = inventory_note
    data.update(check_data)
    data["worst_action"] = worst_action(findings)
    summary = summarise(gpus, findings, checks)
    data["clock"] = {"wall_s": time.time(), "run_s": round(time.monotonic() - began, 6)}
    return {"summary": summary, "findings": findings, "data": data}


def read_kernel_log(run_tool, args, findings):
    """The kernel log once for every check (xid reads Xids, ib link flaps): xid.py knows the
    sources (--kernel-log-file, journalctl -k, dmesg)."""
    xid = load_check("xid")
    if xid is None or not hasattr(xid, "read_kernel_log"):
        return {"source": None, "text": "", "error": "xid.py is not beside node_check.py"}
    try:
        got = xid.read_kernel_log(run_tool, since=args.since, path=args.kernel_log_file,
                                  timeout=args.tool_timeout)
    except Exception:
        last = traceback.format_exc().strip().splitlines()[-1][:300]
        findings.append(finding("warn", "check-crashed", "reading the kernel log crashed: %s" % last,
                                "none", "xid"))
        return {"source": None, "text": "", "error": last}
    for f in got.pop("findings", None) or []:
        findings.append(f)
    return got


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    result = run(build_parser().parse_args())
    print(json.dumps(result, indent=2))
    levels = [f.get("level") for f in result["findings"]]
    sys.exit(2 if "fail" in levels else 1 if "warn" in levels else 0)
