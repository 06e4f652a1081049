"""node-check's GPU host check ("gpu-host"): what the node does to its GPUs that no GPU health
counter shows -- memory held by no live process, persistence mode off with no daemon, and,
inside a container, fewer (or more) GPUs than the container was given.

Standard library only, Python 3.8+, importable on its own (node_check.py loads it from the run's
private temp dir). Calls nvidia-smi through node-check's bounded ``run_tool`` (two queries, and
the same two once more when a leak is suspected); reads /proc, /dev and the environment.

=======================  =====  =========  ===================================================
code                     level  action     when
=======================  =====  =========  ===================================================
gpu-memory-leaked        fail   reset-gpu  a GPU with LEAK_MIB or more in use and no live
                                           process holding it, twice LEAK_RECHECK_S apart: the
                                           compute processes nvidia-smi lists for it are gone
                                           or zombies, or it lists none (judged in the host's
                                           PID namespace only: from a namespace of its own a
                                           process elsewhere is invisible, gpu-status's
                                           ``gpu-memory-unattributed``)
persistence-off          warn   monitor    persistence mode off on a datacenter GPU and no
                                           nvidia-persistenced running: the driver tears the
                                           GPU down after every job and initialises it again
                                           for the next (seconds per start, state lost)
container-gpu-mismatch   fail   app        inside a container: the GPUs the NVIDIA runtime was
                                           given (NVIDIA_VISIBLE_DEVICES, or the files of the
                                           directory it names: Kubernetes' volume-mounts list;
                                           the per-GPU /proc/driver/nvidia/gpus entries the
                                           runtime mounts), the
                                           /dev/nvidiaN device nodes present and the GPUs
                                           nvidia-smi lists (lost ones counted) do not agree,
                                           e.g. given 8, 7 device nodes; with no device node at
                                           all nvidia-smi's list is not compared (the driver
                                           answers through them: such a list is not this
                                           container's)
cuda-visible-devices     fail   app        inside a container: CUDA_VISIBLE_DEVICES names a GPU
                                           that is not there (an index past the count, "", -1;
                                           UUIDs are not judged): CUDA ignores it and every
                                           entry after it
=======================  =====  =========  ===================================================

A hung nvidia-smi is ``tool-hung`` (fail, reboot); a missing one ``not-checked`` (info).

Facts: ``gpu.persistence_mode`` (Enabled / Disabled / both). Data (``data["gpu-host"]``):
``memory`` (the GPUs holding memory or listing processes: MiB used, each process's pid, MiB and
state: alive / zombie / gone; judged where the pid namespace allows),
``pid_namespace`` ("host" | "own"), ``container`` (kind, the runtime's device list, the device
nodes, the runtime's /proc/driver/nvidia/gpus entries, CUDA_VISIBLE_DEVICES) when inside one.
"""

import os
import re
import time

import _remote

CHECK = "gpu-host"
# Memory in use worth calling held: an idle datacenter GPU reads 0 MiB, a display's desktop some
# hundreds (those GPUs are left out anyway); gpu-status's note on unattributed memory uses the same.
LEAK_MIB = _remote.HELD_MIB
LEAK_RECHECK_S = 1.0
# The inode of the initial PID namespace (the kernel's PROC_PID_INIT_INO, fixed since Linux 3.8):
# /proc/self/ns/pid of any process outside a PID namespace of its own.
INIT_PID_NS_INODE = 0xEFFFFFFC
# Not datacenter GPUs: a desktop card's driver state is kept by its display server.
DESKTOP_NAMES = ("GeForce", "TITAN", "Quadro")
GPU_FIELDS = ("index", "uuid", "name", "memory.used", "persistence_mode", "display_active")
APP_FIELDS = ("pid", "used_memory", "gpu_uuid")
DEVICE_NODE = re.compile(r"^nvidia(\d+)$")


def finding(level, code, message, action, hint=None, gpus=None):
    return _remote.check_finding(CHECK, level, code, message, action, gpus=gpus, hint=hint)


def _number(text):
    try:
        return int(float(text))
    except (TypeError, ValueError):
        return None       # "[N/A]", "[Not Supported]"


# --------------------------------------------------------------------------- nvidia-smi

def gpu_argv():
    return ["nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"]


def apps_argv():
    return ["nvidia-smi", "--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits"]


def parse_gpus(text):
    """``--query-gpu=index,uuid,name,memory.used,persistence_mode,display_active
    --format=csv,noheader,nounits`` -> [{index, uuid, name, memory_used_mib, persistence,
    display}]; a row nvidia-smi could not read (a lost GPU's message) is skipped."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) != len(GPU_FIELDS) or _number(cells[0]) is None:
            continue
        out.append({"index": int(cells[0]), "uuid": cells[1], "name": cells[2],
                    "memory_used_mib": _number(cells[3]), "persistence": cells[4],
                    "display": cells[5]})
    return out


def parse_apps(text):
    """``--query-compute-apps=pid,used_memory,gpu_uuid --format=csv,noheader,nounits`` ->
    [{pid, used_memory_mib, gpu_uuid}] (no process: no output at all)."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(", ")]
        if len(cells) != len(APP_FIELDS) or _number(cells[0]) is None:
            continue
        out.append({"pid": int(cells[0]), "used_memory_mib": _number(cells[1]), "gpu_uuid": cells[2]})
    return out


def lost_gpus(text):
    """How many GPUs nvidia-smi names as lost ("Unable to determine the device handle for GPU
    ...: GPU is lost"): on the bus and in /dev, but without a row."""
    return sum(1 for line in text.splitlines() if line.startswith("Unable to determine the device handle"))


class Query(object):
    """The two queries' answer: ``gpus`` (None when nvidia-smi did not answer), ``lost`` (GPUs
    it names as lost), ``apps`` (None when the process query failed), ``problem`` (a finding)."""

    def __init__(self, gpus=None, lost=0, apps=None, problem=None):
        self.gpus, self.lost, self.apps, self.problem = gpus, lost, apps, problem

    def listed(self):
        return None if self.gpus is None else len(self.gpus) + self.lost


def query(run_tool, timeout):
    argv = gpu_argv()
    tool = run_tool(argv, timeout)
    problem = _remote.tool_problem(CHECK, tool, argv, timeout)
    if problem:
        return Query(problem=problem)
    got = Query(parse_gpus(tool.out), lost_gpus(tool.out))
    if not got.gpus and not got.lost:
        return Query()                    # the inventory's finding says why (node_check.py)
    argv = apps_argv()
    tool = run_tool(argv, timeout)
    got.problem = _remote.tool_problem(CHECK, tool, argv, timeout)
    if got.problem is None and tool.rc in (0, 15):  # 15: a lost GPU; the others' processes listed
        got.apps = parse_apps(tool.out)
    return got


# --------------------------------------------------------------------------- processes

def pid_state(pid, proc="/proc"):
    """"alive", "zombie" or "gone" for a pid nvidia-smi names (its /proc/PID/stat state)."""
    raw = _remote.read_text(os.path.join(proc, str(pid), "stat"))
    if not raw or ")" not in raw:
        return "gone"
    rest = raw[raw.rfind(")") + 1:].split()
    return "zombie" if rest and rest[0] in ("Z", "X") else "alive"


def own_pid_namespace(proc="/proc"):
    """True when this process is in a PID namespace of its own (a container's, ``unshare -p``):
    processes of other namespaces are not in its /proc, and nvidia-smi does not list them."""
    try:
        return os.stat(os.path.join(proc, "self", "ns", "pid")).st_ino != INIT_PID_NS_INODE
    except OSError:
        return True          # cannot tell: do not call memory leaked


def leak_candidates(gpus, apps, proc="/proc"):
    """{index: (MiB used, [(pid, state)])} of the GPUs holding LEAK_MIB or more with no live
    compute process; each gpu dict gets ``processes`` (pid, MiB, state) as a side record."""
    out = {}
    for g in gpus:
        mine = [a for a in apps if a["gpu_uuid"] == g["uuid"]]
        g["processes"] = [{"pid": a["pid"], "used_memory_mib": a["used_memory_mib"],
                           "state": pid_state(a["pid"], proc)} for a in mine]
        used = g["memory_used_mib"]
        if used is None or used < LEAK_MIB or g["display"] == "Enabled":
            continue       # a display's desktop holds graphics memory nvidia-smi lists apart
        if any(p["state"] == "alive" for p in g["processes"]):
            continue
        out[g["index"]] = (used, [(p["pid"], p["state"]) for p in g["processes"]])
    return out


def memory_record(gpus):
    """What data keeps of the memory query: the GPUs holding memory or listing processes, each
    with its processes' pids, MiB and state (alive / zombie / gone)."""
    return [{"gpu": g["index"], "used_mib": g["memory_used_mib"], "processes": g.get("processes") or []}
            for g in gpus if g["memory_used_mib"] or g.get("processes")]


def fmt_mib(mib):
    return "%.1f GiB" % (mib / 1024.0) if mib >= 1024 else "%d MiB" % mib


def leak_findings(leaked):
    findings = []
    for index, (used, procs) in sorted(leaked.items()):
        if procs:
            who = "its processes are gone (%s)" % ", ".join(
                "pid %d %s" % (pid, "a zombie" if state == "zombie" else "not running")
                for pid, state in procs[:8])
        else:
            who = "nvidia-smi lists no process on it"
        rest = ": %s in use and no live process holds it: %s" % (fmt_mib(used), who)
        f = finding("fail", "gpu-memory-leaked", "GPU %d%s" % (index, rest), "reset-gpu", gpus=[index],
                    hint="memory the driver still counts for a process that is gone is freed only by "
                         "a GPU reset: `nvidia-smi -r -i N` once nothing has the GPU open (`fuser -v "
                         "/dev/nvidia*`), else reboot the node")
        f["_fold"] = ("fail", "gpu-memory-leaked", rest, "reset-gpu", "")
        findings.append(f)
    merged, first = _remote.merge_folds(findings)
    for key, f in first.items():
        if len(f["gpus"]) > 1:
            f["gpus"] = sorted(set(f["gpus"]))
            f["message"] = _remote.fmt_indices(f["gpus"]) + key[2]
    return merged


# --------------------------------------------------------------------------- persistence

def persistenced_running(proc="/proc"):
    """Whether nvidia-persistenced runs (its comm is cut to "nvidia-persiste": _remote reads
    it)."""
    return _remote.process_running("nvidia-persistenced", proc)


def persistence_findings(gpus, daemon, in_container):
    off = [g["index"] for g in gpus if g["persistence"] == "Disabled"
           and not any(word in g["name"] for word in DESKTOP_NAMES)]
    if not off or daemon:
        return []
    where = ("and this container cannot see whether nvidia-persistenced runs on its host"
             if in_container else "and nvidia-persistenced is not running")
    return [finding("warn", "persistence-off", "%s: persistence mode off %s: the driver tears the "
                    "GPU down after each job and initialises it again for the next"
                    % (_remote.fmt_indices(off), where), "monitor", gpus=off,
                    hint="run nvidia-persistenced (systemctl enable --now nvidia-persistenced): job "
                         "starts then skip the GPU's initialisation, and its state (clocks, ECC "
                         "mode) is kept between jobs")]


# --------------------------------------------------------------------------- inside a container

def device_nodes(dev="/dev"):
    """The numbers N of the /dev/nvidiaN device nodes (the GPUs' minor numbers on the host)."""
    try:
        names = os.listdir(dev)
    except OSError:
        return []
    return sorted(int(m.group(1)) for m in (DEVICE_NODE.match(n) for n in names) if m)


def runtime_gpus(proc="/proc"):
    """The PCI addresses under /proc/driver/nvidia/gpus: the NVIDIA container runtime mounts the
    given GPUs' entries only; None where the directory is absent."""
    try:
        return sorted(os.listdir(os.path.join(proc, "driver", "nvidia", "gpus")))
    except OSError:
        return None


# The device plugin's "volume-mounts" strategy (Kubernetes): NVIDIA_VISIBLE_DEVICES names this
# directory and the list is one file per device in it, named by its UUID or index
VOLUME_MOUNTS_DIR = "/var/run/nvidia-container-devices"


def given_devices(value):
    """NVIDIA_VISIBLE_DEVICES as the runtime reads it -> (the entries, or None for "all" / a MIG
    device list, where the count is not the number of GPUs; the raw value); unset -> (None,
    None). A directory (VOLUME_MOUNTS_DIR) stands for the files in it."""
    if value is None:
        return None, None
    value = value.strip()
    if value in ("", "void", "none"):
        return [], value or "void"
    if value.startswith("/"):
        try:
            entries = sorted(os.listdir(value))
        except OSError:
            entries = []
        raw = "%s: %s" % (value, ",".join(entries) or "no file")
    else:
        entries, raw = [e.strip() for e in value.split(",") if e.strip()], value
    if "all" in entries:
        return None, raw
    if any(e.startswith("MIG-") or ":" in e for e in entries):
        return None, raw
    return entries, raw


def container_environ(proc="/proc"):
    """NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES: this process's, else the container's
    init's (the runtime sets them there; an exec'd shell may not carry them)."""
    init = _remote.pid_environ(1, proc) or {}
    out = {}
    for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        if name in os.environ:
            out[name] = (os.environ[name], "this process")
        elif name in init:
            out[name] = (init[name], "PID 1")
    return out


def cuda_visible_problem(value, count):
    """The first CUDA_VISIBLE_DEVICES entry that names none of the ``count`` GPUs here (an index
    past the count, or no device at all: "", "-1", "NoDevFiles"), or None. CUDA stops at it: it
    and every entry after it are ignored. UUIDs and MIG devices are not judged."""
    for entry in [e.strip() for e in value.split(",")]:
        if entry.startswith(("GPU-", "MIG-")):
            continue
        if not re.match(r"^\d+$", entry) or int(entry) >= count:
            return entry
    return None


def container_findings(kind, listed, env, nodes, runtime):
    """(findings, data) of a container: the GPUs given (NVIDIA_VISIBLE_DEVICES), the device
    nodes and the GPUs nvidia-smi lists (``listed``, lost ones counted; None when it did not
    answer) against each other. With no device node at all nvidia-smi's list is not compared:
    the driver answers only through /dev/nvidiaN, so such a list is not this container's (a
    stand-in nvidia-smi)."""
    given, raw = given_devices(env.get("NVIDIA_VISIBLE_DEVICES", (None, None))[0])
    data = {"kind": kind, "nvidia_visible_devices": raw, "device_nodes": nodes,
            "runtime_gpus": runtime,
            "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES", (None, None))[0],
            "listed": listed}
    counts, parts = [], []
    if given is not None:
        counts.append(len(given))
        parts.append("the NVIDIA runtime was given %d (NVIDIA_VISIBLE_DEVICES=%s)" % (len(given), raw[:100]))
    counts.append(len(nodes))
    parts.append("%d device node%s (%s)" % (len(nodes), "" if len(nodes) == 1 else "s",
                                           ", ".join("/dev/nvidia%d" % n for n in nodes[:16]) or "none"))
    if listed is not None and nodes:
        counts.append(listed)
        parts.append("nvidia-smi lists %d" % listed)
    if runtime is not None and given is not None:
        counts.append(len(runtime))
        parts.append("%d in /proc/driver/nvidia/gpus" % len(runtime))
    findings = []
    if len(counts) > 1 and len(set(counts)) > 1:
        findings.append(finding(
            "fail", "container-gpu-mismatch", "inside this %s container the GPUs do not agree: %s"
            % (kind, "; ".join(parts)), "app",
            hint="a container's GPUs are set when it starts: recreate it (docker/podman --gpus, "
                 "the Kubernetes device plugin, the LXC device entries) and read the runtime's "
                 "log; a GPU missing on the host as well is node-check's gpu-count"))
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and listed is not None and nodes:
        bad = cuda_visible_problem(cvd[0], listed)
        if bad is not None:
            findings.append(finding(
                "fail", "cuda-visible-devices", "CUDA_VISIBLE_DEVICES=%s (%s) names %r, which is not "
                "one of the %d GPUs here: CUDA ignores it and every entry after it"
                % (cvd[0][:100], cvd[1], bad[:40], listed), "app",
                hint="inside a container GPUs are numbered from 0 whatever their host index: set "
                     "CUDA_VISIBLE_DEVICES to the container's indices (nvidia-smi -L)"))
    return findings, data


# --------------------------------------------------------------------------- the check

def check(expect, run_tool, **options):
    """The node-check module API: ``{"findings", "facts", "data"}``. Options used:
    ``tool_timeout``, ``proc_root``, ``dev_root``, ``leak_recheck`` (seconds)."""
    proc = options.get("proc_root") or "/proc"
    dev = options.get("dev_root") or "/dev"
    timeout = options.get("tool_timeout") or 10.0
    findings, facts = [], {}
    kind = _remote.container_kind(proc)
    own_ns = own_pid_namespace(proc)
    data = {"pid_namespace": "own" if own_ns else "host"}

    got = query(run_tool, timeout)
    if got.problem:
        findings.append(got.problem)
    gpus = got.gpus
    if gpus:
        facts["gpu.persistence_mode"] = " / ".join(sorted(set(g["persistence"] for g in gpus)))
        daemon = None if kind else persistenced_running(proc)
        findings.extend(persistence_findings(gpus, daemon, bool(kind)))
        if got.apps is not None and not own_ns:
            leaked = leak_candidates(gpus, got.apps, proc)
            if leaked:
                # a job that just ended may still be freeing its memory: a leak is what stays
                time.sleep(options.get("leak_recheck", LEAK_RECHECK_S))
                again = query(run_tool, timeout)
                if again.gpus and again.apps is not None:
                    still = leak_candidates(again.gpus, again.apps, proc)
                    leaked = dict((i, still[i]) for i in leaked if i in still)
                    gpus = again.gpus
                findings.extend(leak_findings(leaked))
        data["memory"] = memory_record(gpus)
    if kind:
        more, data["container"] = container_findings(kind, got.listed(), container_environ(proc),
                                                     device_nodes(dev), runtime_gpus(proc))
        findings.extend(more)
    return {"findings": findings, "facts": facts, "data": data}
