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
stuck-gpu-holder        fail   reboot    a process with a thread in D state (twice,
                                         STUCK_RECHECK_S apart) and /dev/nvidia* open -- a
                                         zombie whose live thread holds them too: its GPUs
                                         cannot be reset
stuck-processes         warn   monitor   processes in D state (twice) holding no GPU
mount-hung              fail   drain     a network filesystem (nfs, lustre, cifs, fuse, ...)
                                         whose stat did not return within MOUNT_TIMEOUT_S
gpudirect-rdma-off      warn   monitor   NVIDIA GPUs and RDMA devices, and neither
                                         nvidia_peermem nor nv_peer_mem loaded (GPUDirect
                                         RDMA off: NCCL stages through host memory)
======================  =====  ========  =================================================

Facts (a baseline compares them): ``host.shm_mib``, ``host.memlock``, ``host.hugepages_total``,
``host.time_sync`` (yes / no / unknown), ``host.persistenced`` (whether nvidia-persistenced
runs; persistence mode itself is gpu-status's ``persistence-off``), ``host.gpudirect_rdma``,
``host.network_mounts``.
"""

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

def time_sync(run_tool, timeout):
    """("yes" | "no" | "unknown", where it was read)."""
    tool = run_tool(["timedatectl", "show", "-p", "NTPSynchronized", "--value"], timeout)
    if tool.status == "ok" and tool.rc == 0 and tool.out.strip() in ("yes", "no"):
        return tool.out.strip(), "timedatectl"
    tool = run_tool(["chronyc", "tracking"], timeout)
    if tool.status == "ok" and tool.rc == 0:
        for line in tool.out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Leap status":
                return ("no" if "not synchronised" in value.lower() else "yes"), "chronyc"
    return "unknown", None


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


def persistenced_running(proc="/proc"):
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()][:MAX_PROCESSES]
    except OSError:
        return False
    for pid in pids:
        if (_read(os.path.join(proc, pid, "comm"), 64) or "").strip() == "nvidia-persistenced":
            return True
    return False


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


def hung_mounts(mounts, timeout=MOUNT_TIMEOUT_S):
    """[(mount point, fs type)] whose stat did not return within ``timeout``: each stat in a
    child process of its own, all at once (a stat stuck on a dead server is a process the
    kernel holds; ours never waits on it past the timeout, and kills it: NFS and FUSE waits
    are killable)."""
    children = []
    for point, fstype in mounts:
        try:
            p = subprocess.Popen([sys.executable, "-c", STAT_CHILD, point], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        except OSError:
            continue
        children.append((point, fstype, p))
    deadline = time.monotonic() + timeout
    hung = []
    for point, fstype, p in children:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung.append((point, fstype))
            try:
                p.kill()
            except OSError:
                pass
    for _, _, p in children:
        try:
            p.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass                      # still in the kernel's hands: left to it, not waited for
    return hung


# --------------------------------------------------------------------------- the check

def rdma_devices(sys_root="/sys"):
    try:
        return sorted(os.listdir(os.path.join(sys_root, "class", "infiniband")))
    except OSError:
        return []


def check(expect, run_tool, **options):
    """The node-check module API: ``{"findings": [...], "facts": {...}}``. Options used:
    ``gpus`` (node-check's inventory), ``sys_root``, ``proc_root``, ``shm_path``,
    ``tool_timeout``, ``mount_timeout``, ``stuck_recheck``."""
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

    rdma = rdma_devices(sys_root)
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

    synced, source = time_sync(run_tool, options.get("tool_timeout") or 10.0)
    facts["host.time_sync"] = synced
    if synced == "no":
        findings.append(finding("warn", "clock-unsynced", "the clock is not synchronised (%s)" % source,
                                "monitor", hint="chrony/systemd-timesyncd: NCCL timeouts and the order of "
                                                "log lines across nodes depend on it"))

    if gpus:
        facts["host.persistenced"] = persistenced_running(proc)
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
    for point, fstype in hung_mounts(mounts, options.get("mount_timeout", MOUNT_TIMEOUT_S)):
        findings.append(finding(
            "fail", "mount-hung", "%s (%s) did not answer a stat within %g s" % (
                point[:200], fstype[:40], options.get("mount_timeout", MOUNT_TIMEOUT_S)), "drain",
            hint="its server or the network to it: checkpoints and data loading on this node hang"))
    return {"findings": findings, "facts": facts}
