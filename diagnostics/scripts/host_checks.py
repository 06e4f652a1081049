"""node-check's host check ("host"): what breaks training on a node without failing anything.

Standard library only, Python 3.8+, importable on its own (node_check.py loads it from the run's
private temp dir). Reads /proc, /sys and /dev/shm; calls ``timedatectl`` or ``chronyc`` through
node-check's bounded ``run_tool``; stats each network filesystem in a child process of its own.

======================  =====  ========  =================================================
code                    level  action    when
======================  =====  ========  =================================================
shm-small               warn   app       /dev/shm under SHM_MIN_MIB (a container's 64 MB
                                         default: NCCL's shared-memory transport fails with
                                         "unhandled system error" once it is full)
shm-full                warn   app       /dev/shm with under SHM_FREE_MIN_MIB free
memlock-limited         warn   monitor   RDMA devices present and this session's
                                         RLIMIT_MEMLOCK is not unlimited (NCCL's IB transport
                                         registers memory: a limited memlock fails or falls
                                         back to sockets)
hugepages-exhausted     warn   monitor   HugePages_Total > 0 and HugePages_Free == 0
clock-unsynced          warn   monitor   timedatectl says NTPSynchronized=no, or chronyc
                                         tracking says "Not synchronised" (NCCL timeouts and
                                         cross-node log order suffer)
clock-ntp-offset        warn   monitor   the node's own measured offset from its NTP source
                                         (chronyc tracking's "System time", else timedatectl
                                         timesync-status's "Offset") over NTP_OFFSET_MAX_S:
                                         a synchronised node is within milliseconds
stuck-gpu-holder        fail   reboot    a process with a thread in D state (twice,
                                         STUCK_RECHECK_S apart) and /dev/nvidia* open -- a
                                         zombie whose live thread holds them too: its GPUs
                                         cannot be reset
stuck-processes         warn   monitor   processes in D state (twice) holding no GPU
mount-hung              fail   drain     a network filesystem (nfs, lustre, cifs, fuse, ...)
                                         whose stat did not return within MOUNT_TIMEOUT_S
path-missing            warn   monitor   a hosts.yaml ``paths:`` entry that does not exist, is
                                         not a directory or cannot be stat-ed by this user (a
                                         mount that did not come up here, its permissions)
path-hung               fail   drain     its stat/statvfs did not return within
                                         MOUNT_TIMEOUT_S (as mount-hung: a dead server)
path-low-space          warn   monitor   under the entry's ``min_free_gb`` free (to this user:
                                         statvfs f_bavail): the next checkpoint write fails
gpudirect-rdma-off      warn   monitor   NVIDIA GPUs and RDMA devices, and neither
                                         nvidia_peermem nor nv_peer_mem loaded (GPUDirect
                                         RDMA off: NCCL stages through host memory)
======================  =====  ========  =================================================

Facts (a baseline compares them): ``host.shm_mib``, ``host.memlock``, ``host.hugepages_total``,
``host.time_sync`` (yes / no / unknown), ``host.persistenced`` (whether nvidia-persistenced
runs; persistence mode itself is gpu-status's ``persistence-off``), ``host.gpudirect_rdma``,
``host.network_mounts``.

Measurements that differ from node to node by nature are ``data`` (``data.host``), never facts
(a baseline would call every node an outlier): ``clock`` (``sync``, ``ntp_offset_s`` -- system
time minus NTP time, negative when the clock is slow --, ``offset_source``) and ``paths`` (one
entry per hosts.yaml path: ``name``, ``path``, ``state`` ok / missing / not-a-directory / hung
/ error, ``free_gb``, ``total_gb``, ``min_free_gb``). The offset of the node's clock against
the machine running mldiag is measured there (node-check's judge), from node_check.py's
``data.clock``.
"""

import json
import os
import resource
import subprocess
import sys
import time

import _remote

SHM_MIN_MIB = 1024
SHM_FREE_MIN_MIB = 256
STUCK_RECHECK_S = 0.5
MOUNT_TIMEOUT_S = 5.0
NTP_OFFSET_MAX_S = 0.1
MAX_MOUNTS = 64
MAX_PROCESSES = 100000
NETWORK_FS = ("nfs", "nfs4", "lustre", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "beegfs",
              "gpfs", "9p", "fuse", "fuseblk")          # fuse.<name>: by its prefix
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")


def finding(level, code, message, action, hint=None):
    f = {"level": level, "code": code, "message": message, "action": action, "check": "host"}
    if hint:
        f["hint"] = hint
    return f


def _read(path, limit=1 << 20):
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


# --------------------------------------------------------------------------- /dev/shm, memlock, hugepages

def shm(path="/dev/shm"):
    """(total MiB, free MiB) of the filesystem at ``path``, or None."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize // (1 << 20), st.f_bavail * st.f_frsize // (1 << 20)


def memlock():
    """This session's RLIMIT_MEMLOCK soft limit: bytes, or "unlimited"."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else soft


def hugepages(proc="/proc"):
    out = {}
    for line in (_read(os.path.join(proc, "meminfo")) or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("HugePages_Total", "HugePages_Free"):
            try:
                out[key] = int(value.split()[0])
            except (ValueError, IndexError):
                pass
    return out


# --------------------------------------------------------------------------- time sync

SECONDS_OF = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def chrony_offset(text):
    """chronyc tracking's "System time : 0.000012345 seconds slow of NTP time" as system time
    minus NTP time in seconds (slow: negative), or None."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        words = value.split()
        if key.strip() == "System time" and len(words) >= 3 and words[2] in ("slow", "fast"):
            try:
                seconds = float(words[0])
            except ValueError:
                return None
            return -seconds if words[2] == "slow" else seconds
    return None


def timesyncd_offset(text):
    """timedatectl timesync-status's "Offset: -1.053ms" (systemd-timesyncd's last measurement)
    as system time minus NTP time in seconds, or None. systemd prints NTP's offset,
    ((T2 - T1) + (T3 - T4)) / 2, server minus local, signed, then format_timespan's units
    ("+870us", "-2.000104s", "+1min 3.500000s"): negated here, to read as chrony's does."""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if key.strip() != "Offset" or value[:1] not in ("+", "-"):
            continue
        total = 0.0
        for part in value[1:].split():
            number = part.rstrip("abcdefghijklmnopqrstuvwxyz")
            try:
                total += float(number) * SECONDS_OF[part[len(number):]]
            except (ValueError, KeyError):
                return None
        return -total if value[0] == "+" else total
    return None


def clock(run_tool, timeout):
    """(sync "yes" | "no" | "unknown", where the state was read, the measured offset from the
    NTP source in seconds or None, where the offset was read). timedatectl answers the state
    wherever systemd runs; the offset is chrony's (``chronyc tracking``), else timesyncd's
    (``timedatectl timesync-status``, systemd 239+; nothing where timesyncd does not run)."""
    synced, source, offset, offset_source = "unknown", None, None, None
    tool = run_tool(["timedatectl", "show", "-p", "NTPSynchronized", "--value"], timeout)
    if tool.status == "ok" and tool.rc == 0 and tool.out.strip() in ("yes", "no"):
        synced, source = tool.out.strip(), "timedatectl"
    tool = run_tool(["chronyc", "tracking"], timeout)
    if tool.status == "ok" and tool.rc == 0:
        for line in tool.out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Leap status" and source is None:
                synced, source = ("no" if "not synchronised" in value.lower() else "yes"), "chronyc"
        offset = chrony_offset(tool.out)
        offset_source = "chronyc" if offset is not None else None
    if offset is None and source == "timedatectl":
        tool = run_tool(["timedatectl", "timesync-status"], timeout)
        if tool.status == "ok" and tool.rc == 0:
            offset = timesyncd_offset(tool.out)
            offset_source = "timedatectl" if offset is not None else None
    return synced, source, offset, offset_source


# --------------------------------------------------------------------------- processes

def _state(proc, pid):
    raw = _read(os.path.join(proc, pid, "stat"), 4096)
    if not raw or ")" not in raw:
        return None, None
    name = raw[raw.find("(") + 1:raw.rfind(")")][:64]
    rest = raw[raw.rfind(")") + 1:].split()
    return (rest[0] if rest else None), name


def d_state(proc="/proc"):
    """{pid: (command name, the thread in D, the leader's state)} of the processes with a thread
    in uninterruptible sleep (D) now. Every thread is looked at, not only the leader: a CUDA
    thread stuck in the driver while the main thread waits, or a zombie whose main thread has
    exited while another still holds the GPU (the zombie's own fd table is gone; the live
    thread's is not)."""
    out = {}
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()][:MAX_PROCESSES]
    except OSError:
        return out
    for pid in pids:
        state, name = _state(proc, pid)
        if state == "D":
            out[pid] = (name, pid, state)
            continue
        try:
            tids = [t for t in os.listdir(os.path.join(proc, pid, "task")) if t.isdigit() and t != pid]
        except OSError:
            continue
        for tid in tids[:4096]:
            if _state(os.path.join(proc, pid, "task"), tid)[0] == "D":
                out[pid] = (name, tid, state)
                break
    return out


def gpu_files(proc, pid, tid=None):
    """The /dev/nvidia* files the process holds open (fd links; through the thread ``tid``'s
    view, which a zombie leader no longer has)."""
    where = pid if tid in (None, pid) else os.path.join(pid, "task", tid)
    return sorted(t for t in _remote.fd_targets(where, proc) if t.startswith("/dev/nvidia"))


def _who(pid, name, tid, leader):
    if tid == pid:
        return "pid %s (%s)" % (pid, name)
    return "pid %s (%s%s, thread %s)" % (pid, name, ", a zombie" if leader == "Z" else "", tid)


# --------------------------------------------------------------------------- network filesystems

def network_mounts(proc="/proc"):
    """[(mount point, fs type)] of the network and FUSE filesystems in /proc/mounts."""
    out = []
    for line in (_read(os.path.join(proc, "mounts"), 4 << 20) or "").splitlines():
        cols = line.split()
        if len(cols) < 3:
            continue
        fstype = cols[2]
        if fstype in NETWORK_FS or fstype.startswith("fuse."):
            if fstype == "fuse" and cols[0] in ("fusectl",):
                continue
            point = cols[1].replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n") \
                .replace("\\134", "\\")
            if (point, fstype) not in out:
                out.append((point, fstype))
    return out[:MAX_MOUNTS]


STAT_CHILD = "import os, sys\nos.stat(sys.argv[1])\n"
# A hosts.yaml path: what it is and, for a directory, its filesystem's free space, as one JSON
# line (os.statvfs follows the path as a checkpoint write would).
PATH_CHILD = """import errno, json, os, stat, sys
try:
    st = os.stat(sys.argv[1])
except OSError as e:
    gone = e.errno in (errno.ENOENT, errno.ENOTDIR)
    print(json.dumps({"state": "missing" if gone else "error", "error": e.strerror}))
    sys.exit()
if not stat.S_ISDIR(st.st_mode):
    print(json.dumps({"state": "not-a-directory"}))
    sys.exit()
v = os.statvfs(sys.argv[1])
print(json.dumps({"state": "ok", "free": v.f_bavail * v.f_frsize, "total": v.f_blocks * v.f_frsize}))
"""


def children(runs, timeout):
    """[stdout text, or None where the child did not end within ``timeout``, or the OSError of
    one that could not start] of one child process per (code, argument) in ``runs``, all
    started at once: a stat stuck on a dead server is a process the kernel holds; ours never
    waits on it past the timeout, and kills it (NFS and FUSE waits are killable)."""
    started = []
    for code, argument in runs:
        try:
            # -I -S: no site-packages nor PYTHON* env read (the child needs the stdlib only):
            # 16 children took 0.24 s instead of 0.33 s on a 2-core machine
            p = subprocess.Popen([sys.executable, "-I", "-S", "-c", code, argument], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        except OSError as e:
            p = e
        started.append(p)
    deadline = time.monotonic() + timeout
    out = []
    for p in started:
        if isinstance(p, OSError):
            out.append(p)
            continue
        try:
            # a few hundred bytes at most: the pipe never fills before the child ends
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
            out.append(p.stdout.read(65536).decode("utf-8", "replace"))
        except subprocess.TimeoutExpired:
            out.append(None)
            try:
                p.kill()
            except OSError:
                pass
    for p in started:
        if isinstance(p, OSError):
            continue
        try:
            p.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass                      # still in the kernel's hands: left to it, not waited for
        p.stdout.close()
    return out


def path_states(paths, answers):
    """One ``data.host.paths`` entry per hosts.yaml path, from its PATH_CHILD answer."""
    out = []
    for entry, answer in zip(paths, answers):
        got = {"name": entry["name"], "path": entry["path"], "min_free_gb": entry.get("min_free_gb")}
        if answer is None:
            got["state"] = "hung"
        elif isinstance(answer, OSError):
            got["state"], got["error"] = "error", "its stat child did not start: %s" % (
                answer.strerror or answer)
        else:
            try:
                seen = json.loads(answer)
            except ValueError:
                seen = {"state": "error", "error": "the stat child answered nothing"}
            got["state"] = seen.get("state", "error")
            if seen.get("error"):
                got["error"] = str(seen["error"])[:200]
            if got["state"] == "ok":
                got["free_gb"] = round(seen["free"] / 1e9, 3)
                got["total_gb"] = round(seen["total"] / 1e9, 3)
        out.append(got)
    return out


def path_findings(states, timeout):
    findings = []
    for got in states:
        what = "%s (%s)" % (got["name"][:64], got["path"][:200])
        if got["state"] in ("missing", "not-a-directory", "error"):
            why = {"missing": "does not exist", "not-a-directory": "is not a directory"}.get(
                got["state"], "cannot be read: %s" % got.get("error", "?"))
            findings.append(finding(
                "warn", "path-missing", "hosts.yaml path %s %s" % (what, why), "monitor",
                hint="a mount that did not come up on this node (mount it; see /etc/fstab, "
                     "autofs); the same on every node is a typo in hosts.yaml paths:"))
        elif got["state"] == "hung":
            findings.append(finding(
                "fail", "path-hung", "hosts.yaml path %s did not answer a stat within %g s" % (
                    what, timeout), "drain",
                hint="its filesystem's server or the network to it: checkpoints and data loading "
                     "on this node hang"))
        elif got.get("min_free_gb") is not None and got["free_gb"] < got["min_free_gb"]:
            findings.append(finding(
                "warn", "path-low-space", "hosts.yaml path %s has %.1f GB free of %.1f GB, under "
                "the %g GB asked (min_free_gb)" % (what, got["free_gb"], got["total_gb"],
                                                   got["min_free_gb"]), "monitor",
                hint="the next checkpoint or dataset write there fails: free space (old "
                     "checkpoints) or point the job elsewhere"))
    return findings


# --------------------------------------------------------------------------- the check

def check(expect, run_tool, **options):
    """The node-check module API: ``{"findings": [...], "facts": {...}}``. Options used:
    ``gpus`` (node-check's inventory), ``sys_root``, ``proc_root``, ``shm_path``,
    ``tool_timeout``, ``mount_timeout``, ``stuck_recheck``, ``paths`` (hosts.yaml's:
    ``[{"name", "path", "min_free_gb"}]``, node_check.py's ``--paths``)."""
    proc = options.get("proc_root") or "/proc"
    sys_root = options.get("sys_root") or "/sys"
    gpus = options.get("gpus") or []
    findings, facts = [], {}

    got = shm(options.get("shm_path") or "/dev/shm")
    if got is not None:
        total, free = got
        facts["host.shm_mib"] = total
        if total < SHM_MIN_MIB:
            findings.append(finding(
                "warn", "shm-small", "/dev/shm is %d MiB (%d MiB free): NCCL's shared-memory transport "
                "needs more than a container's 64 MB default" % (total, free), "app",
                hint="docker/podman run --shm-size=16g (or --ipc=host); Kubernetes: an emptyDir with "
                     "medium: Memory at /dev/shm"))
        elif free < SHM_FREE_MIN_MIB:
            findings.append(finding(
                "warn", "shm-full", "/dev/shm has %d MiB free of %d MiB: a job's leftovers (or "
                "another job) hold it" % (free, total), "app",
                hint="remove stale files under /dev/shm (a crashed job's NCCL/torch segments)"))

    rdma = _remote.rdma_devices(sys_root)
    lock = memlock()
    facts["host.memlock"] = lock
    if rdma and lock != "unlimited":
        findings.append(finding(
            "warn", "memlock-limited", "RDMA devices (%s) and a locked-memory limit of %d KiB "
            "(ulimit -l): NCCL's InfiniBand transport needs it unlimited" % (",".join(rdma[:4]), lock // 1024),
            "monitor", hint="memlock unlimited in /etc/security/limits.conf, the container runtime "
                        "(--ulimit memlock=-1) or slurmd's unit (LimitMEMLOCK=infinity)"))

    pages = hugepages(proc)
    total_pages = pages.get("HugePages_Total", 0)
    facts["host.hugepages_total"] = total_pages
    if total_pages > 0 and pages.get("HugePages_Free", 0) == 0:
        findings.append(finding("warn", "hugepages-exhausted", "all %d huge pages are in use" % total_pages,
                                "monitor", hint="a job that expects huge pages falls back or fails"))

    synced, source, offset, offset_source = clock(run_tool, options.get("tool_timeout") or 10.0)
    facts["host.time_sync"] = synced
    data = {"clock": {"sync": synced, "ntp_offset_s": offset, "offset_source": offset_source}}
    if synced == "no":
        findings.append(finding("warn", "clock-unsynced", "the clock is not synchronised (%s)" % source,
                                "monitor", hint="chrony/systemd-timesyncd: NCCL timeouts and the order of "
                                                "log lines across nodes depend on it"))
    if offset is not None and abs(offset) > NTP_OFFSET_MAX_S:
        findings.append(finding(
            "warn", "clock-ntp-offset", "the clock is %.3f s %s its NTP source (%s)" % (
                abs(offset), "behind" if offset < 0 else "ahead of", offset_source), "monitor",
            hint="a synchronised clock is within milliseconds: a large offset is a clock being "
                 "slewed after a step or a bad source (chronyc sources -v; chronyc makestep)"))

    if gpus:
        facts["host.persistenced"] = _remote.process_running("nvidia-persistenced", proc=proc, limit=MAX_PROCESSES)
        if rdma:
            loaded = [m for m in PEERMEM_MODULES if os.path.isdir(os.path.join(sys_root, "module", m))]
            facts["host.gpudirect_rdma"] = bool(loaded)
            if not loaded:
                findings.append(finding(
                    "warn", "gpudirect-rdma-off", "GPUs and RDMA devices (%s) but neither %s is loaded: "
                    "GPUDirect RDMA is off" % (",".join(rdma[:4]), " nor ".join(PEERMEM_MODULES)), "monitor",
                    hint="modprobe nvidia_peermem (shipped with the driver since R470); NCCL then "
                         "reads GPU memory from the NIC directly"))

    first = d_state(proc)
    if first:
        time.sleep(options.get("stuck_recheck", STUCK_RECHECK_S))
        stuck = dict((pid, seen) for pid, seen in d_state(proc).items() if pid in first)
        holders = [(_who(pid, *seen), gpu_files(proc, pid, seen[1]))
                   for pid, seen in sorted(stuck.items(), key=lambda x: int(x[0]))]
        on_gpu = [h for h in holders if h[1]]
        if on_gpu:
            findings.append(finding(
                "fail", "stuck-gpu-holder", "%d process(es) stuck in D state holding GPUs: %s" % (
                    len(on_gpu), "; ".join("%s %s" % (who, ",".join(files[:4])) for who, files in on_gpu[:8])),
                "reboot",
                hint="a process the kernel holds cannot be killed; its GPUs cannot be reset until the "
                     "node reboots"))
        rest = [who for who, files in holders if not files]
        if rest:
            findings.append(finding(
                "warn", "stuck-processes", "%d process(es) stuck in D state: %s" % (
                    len(rest), ", ".join(rest[:8])), "monitor",
                hint="usually storage: a hung network filesystem or a dying disk (see mount-hung, the "
                     "kernel log)"))

    mounts = network_mounts(proc)
    facts["host.network_mounts"] = len(mounts)
    paths = options.get("paths") or []
    timeout = options.get("mount_timeout", MOUNT_TIMEOUT_S)
    # the mounts and the hosts.yaml paths stat-ed together: the check waits one timeout at most
    answers = children([(STAT_CHILD, point) for point, _ in mounts]
                       + [(PATH_CHILD, entry["path"]) for entry in paths], timeout)
    for (point, fstype), answer in zip(mounts, answers):
        if answer is None:
            findings.append(finding(
                "fail", "mount-hung", "%s (%s) did not answer a stat within %g s" % (
                    point[:200], fstype[:40], timeout), "drain",
                hint="its server or the network to it: checkpoints and data loading on this node hang"))
    if paths:
        data["paths"] = path_states(paths, answers[len(mounts):])
        findings.extend(path_findings(data["paths"], timeout))
    return {"findings": findings, "facts": facts, "data": data}
