"""What mldiag's remote scripts share. Standard library only, Python 3.8+.

Shipped beside every diagnostic, mldiag's and a team's (``engine/bundle.py: script_job``), into
the run's private directory, which the runtime puts first on ``sys.path``; so a script says
``import _remote``, and one run by hand finds it beside itself (``python3 gpu_status.py``).
A team's diagnostic may import it too (docs/extending.md).

- the orders: ``STATUSES``, ``LEVEL_RANK``, ``ACTIONS``, ``STATUS_EXIT``, with the client's rule
  for a value it does not know (an unknown level ranks as error, an unknown action as none);
  tests/unit/test_order.py holds them against the client's ``core/results.py``;
- ``load_companion``: a file beside the script, loaded by path under a private module name;
- ``which``, ``find_tool``: an executable on ``PATH``, then where drivers put theirs;
- ``fmt_indices``: GPU indices as a person reads them (``GPUs 0-2,5``); ``pci_key``: one key
  for a PCI address however nvidia-smi or the kernel log wrote it;
- ``read_text``: a sysfs file's text;
- ``container_kind``: whether this process runs inside a container, and which kind;
  ``pid_environ``: a process's environment as it was exec'd (``/proc/PID/environ``);
  ``process_running``: whether a process of a given program name runs (nvidia-persistenced);
- ``check_finding``, ``fold_gpus``: a node-check check's finding, and those that say the same
  about several GPUs made one; ``merge_folds``: findings that differ in the device they name
  alone made one (gpu-status, pcie, ib word the merged one again);
- ``Tool``: what one run of an external tool came to, as the checks and xid.py's kernel-log
  reader read it; ``tool_problem``: the finding an NVIDIA tool that did not answer makes;
- ``load_xid``: xid.py beside a script, with its catalog;
- ``wait_children``, ``kill_child``: child processes (nccl-check's ranks, gpu-perf's measuring
  child) read within one deadline, and ended with everything they started.
"""

import collections
import os
import signal
import sys
import time

STATUSES = ("ok", "warn", "fail", "error")
LEVEL_RANK = {"info": 0, "ok": 0, "warn": 1, "fail": 2, "error": 3}
STATUS_EXIT = {"ok": 0, "warn": 1, "fail": 2, "error": 3}   # a script run by hand exits so
ACTIONS = ("none", "monitor", "app", "reset-gpu", "reboot", "drain", "rma")
ACTION_RANK = dict((a, i) for i, a in enumerate(ACTIONS))


def level_rank(level):
    """A finding's level as the status it makes (0 ok ... 3 error); unknown: error."""
    return LEVEL_RANK.get(level, 3) if isinstance(level, str) else 3


def worst_status(findings, status="ok"):
    """``status`` made as bad as the worst of ``findings``' levels."""
    worst = max([level_rank(status)] + [level_rank(f.get("level")) for f in findings])
    return STATUSES[worst]


def exit_code(result):
    """The exit status of a script run by hand: its result's status, an unknown one as error."""
    return STATUS_EXIT.get(result.get("status"), 3)


def load_companion(directory, file_name, module_name):
    """The module in ``directory/file_name``, loaded by path as ``module_name`` (once: later calls
    for the same file get the same module), or None when there is no such file. By path and
    under a private name: the target's environment may well have a package of the same name on
    sys.path (Fabric's ``fabric``), which must be neither shadowed nor used. What the file
    raises is the caller's."""
    path = os.path.join(directory, file_name)
    if not os.path.isfile(path):
        return None
    loaded = sys.modules.get(module_name)
    if loaded is not None and getattr(loaded, "__file__", None) == path:
        return loaded
    import importlib.util
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def which(name, path=None):
    """shutil.which for an executable file (without importing shutil: bz2, lzma and more)."""
    if os.sep in name:
        return name if _executable(name) else None
    if path is None:
        path = os.environ.get("PATH", None)
        if path is None:
            path = os.defpath
    for d in path.split(os.pathsep):
        candidate = os.path.join(d, name)
        if _executable(candidate):
            return candidate
    return None


def _executable(path):
    return os.path.exists(path) and os.access(path, os.F_OK | os.X_OK) and not os.path.isdir(path)


# Where drivers and DCGM put their tools when PATH (a non-login shell's, a container's, sudo's
# secure_path) lacks them: every check that looks for nvidia-smi, dcgmi and the like
TOOL_DIRS = ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/nvidia/bin", "/usr/lib/wsl/lib",
             "/bin", "/sbin")
# GPU memory in use with no process to show for it worth a word (gpu-status's note, gpu-host's
# leak): below it, a driver's own context or a display
HELD_MIB = 1024


def rdma_devices(sys_root="/sys"):
    """The RDMA devices the kernel registered (/sys/class/infiniband: mlx5_0, ...), sorted;
    where memlock, GPUDirect RDMA and ACS matter."""
    try:
        return sorted(os.listdir(os.path.join(sys_root, "class", "infiniband")))
    except OSError:
        return []


def find_tool(name, extra_dirs=TOOL_DIRS, path=None):
    """``which(name)``, else the first of ``extra_dirs`` that holds it: the places drivers put
    their tools when PATH (a non-login shell's, a container's, sudo's secure_path) lacks them."""
    found = which(name, path=path)
    if found:
        return found
    for d in extra_dirs:
        candidate = os.path.join(d, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def fmt_indices(indices):
    """[0, 1, 2, 5] -> "GPUs 0-2,5"; [3] -> "GPU 3"."""
    idx = sorted(set(i for i in indices if i is not None))
    if len(idx) == 1:
        return "GPU %d" % idx[0]
    parts = []
    start = prev = None
    for i in idx:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            parts.append(str(start) if start == prev else "%d-%d" % (start, prev))
            start = prev = i
    if start is not None:
        parts.append(str(start) if start == prev else "%d-%d" % (start, prev))
    return "GPUs " + ",".join(parts)


def pci_key(bus_id):
    """``00000000:BA:00.0`` (nvidia-smi), ``0000:ba:00`` (the kernel log) and ``ba:00.0`` (a
    fallen-off-the-bus line without the PCI domain: domain 0) -> (0, 0xba, 0)."""
    parts = str(bus_id or "").strip().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except ValueError:
        return None


def read_text(path):
    """A (sysfs) file's text, stripped; None when it cannot be read."""
    try:
        with open(path, "r") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def pid_environ(pid, proc="/proc"):
    """{name: value} of process ``pid``'s environment at exec (``/proc/PID/environ``: later
    changes are not seen); None when it cannot be read (another user's process, no such pid)."""
    try:
        with open(os.path.join(proc, str(pid), "environ"), "rb") as fh:
            raw = fh.read(1 << 20)
    except OSError:
        return None
    out = {}
    for item in raw.decode("utf-8", "replace").split("\0"):
        name, sep, value = item.partition("=")
        if sep and name:
            out.setdefault(name, value)
    return out


COMM_LEN = 15   # the kernel keeps a command name to TASK_COMM_LEN - 1 bytes in /proc/PID/comm


def process_running(name, proc="/proc", limit=100000):
    """Whether a process whose program is ``name`` runs (as far as this /proc shows). Its comm is
    the name cut to 15 bytes ("nvidia-persiste" for nvidia-persistenced), so a match there is
    confirmed by the basename of its argv[0]."""
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()][:limit]
    except OSError:
        return False
    for pid in pids:
        if read_text(os.path.join(proc, pid, "comm")) != name[:COMM_LEN]:
            continue
        try:
            with open(os.path.join(proc, pid, "cmdline"), "rb") as fh:
                argv0 = fh.read(4096).split(b"\0", 1)[0].decode("utf-8", "replace")
        except OSError:
            continue
        if os.path.basename(argv0) == name:
            return True
    return False


def container_kind(proc="/proc"):
    """docker, podman, lxc, kubernetes, ... or None (not inside a container, as far as we can
    tell): the files the runtimes leave (/.dockerenv, /run/.containerenv), then ``container=``
    in this process's or PID 1's environment (LXC, systemd-nspawn and podman set it for the
    container's init), then PID 1's cgroup path."""
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    kind = os.environ.get("container") or (pid_environ(1, proc) or {}).get("container")
    if kind:
        return kind
    cgroup = read_text(os.path.join(proc, "1", "cgroup")) or ""
    for word, name in (("kubepods", "kubernetes"), ("docker", "docker"), ("lxc", "lxc"),
                       ("libpod", "podman")):
        if word in cgroup:
            return name
    return None


def merge_folds(findings):
    """Findings that carry the same ``_fold`` key (what they say apart from the GPU or port they
    name) made one, in the place of the first, its ``gpus`` and ``ports`` extended by the
    others'; ``_fold`` is taken off every finding. Returns (the findings, {key: merged finding}):
    the caller words each merged one again for the devices it now names ("GPUs 0-3,5-7: ...")."""
    out, first = [], {}
    for f in findings:
        key = f.pop("_fold", None)
        if key is None:
            out.append(f)
        elif key in first:
            merged = first[key]
            for k in ("gpus", "ports"):
                if f.get(k):
                    merged.setdefault(k, []).extend(f[k])
        else:
            first[key] = f
            out.append(f)
    return out, first


def check_finding(check, level, code, message, action, gpus=None, hint=None, ports=None):
    """A finding of node-check's check ``check``: ``gpus`` the indices it is about (sorted),
    ``ports`` the links or ports."""
    f = {"level": level, "code": code, "message": message, "action": action, "check": check}
    if gpus is not None:
        f["gpus"] = sorted(gpus)
    if ports is not None:
        f["ports"] = list(ports)
    if hint:
        f["hint"] = hint
    return f


def fold_gpus(findings):
    """One finding per (level, code, message, action, hint, ports): their GPUs listed together."""
    out = []
    seen = {}
    for f in findings:
        key = (f["level"], f["code"], f["message"], f["action"], f.get("hint"), tuple(f.get("ports") or ()))
        if key in seen and "gpus" in f and "gpus" in seen[key]:
            seen[key]["gpus"] = sorted(set(seen[key]["gpus"]) | set(f["gpus"]))
            continue
        seen[key] = f
        out.append(f)
    return out


# ``status``: "ok" (it ran and exited ``rc``), "missing" (not found, or could not be started),
# "timeout" (killed after its time), "skipped" (it hung earlier in this run: not called again)
Tool = collections.namedtuple("Tool", "status rc out err seconds")

WEDGED_DRIVER_HINT = ("nvidia-smi stuck (often in D state) means the driver is wedged: see the kernel "
                      "log for Xid 79/NVRM errors; a reboot clears it")


def tool_problem(check, tool, argv, timeout, what="nvidia-smi"):
    """The one finding of check ``check`` that a ``what`` call (``argv``) that did not answer
    makes, or None when it ran: hung (fail, reboot), hung earlier or missing (not checked)."""
    if tool.status == "timeout":
        return check_finding(check, "fail", "tool-hung", "`%s` did not answer within %g s" % (" ".join(argv), timeout),
                             "reboot", hint=WEDGED_DRIVER_HINT)
    if tool.status == "skipped":
        return check_finding(check, "info", "not-checked", "not checked: %s hung earlier in this run" % what, "none")
    if tool.status == "missing":
        return check_finding(check, "info", "not-checked", "not checked: %s not found" % what, "none")
    return None


def load_xid(directory, with_catalog=True):
    """xid.py from ``directory`` (shipped beside every script that reads Xids, with
    xid_catalog.json), its catalog loaded unless ``with_catalog`` is false; None when either is
    missing or unreadable. Both cached: the module by load_companion, the catalog by
    xid.load_catalog."""
    try:
        module = load_companion(directory, "xid.py", "mldiag_xid")
        if module is not None and with_catalog:
            module.load_catalog()
        return module
    except (ImportError, OSError, ValueError, SyntaxError, KeyError):
        return None


def wait_children(procs, deadline):
    """Read every child's output (each started with stdout and stderr piped) until each has
    exited or the deadline: (outputs [(out, err)] as text, the last MiB of each, [(index, exit
    code)] of those that failed, [indices still running at the deadline]). One child failing
    ends the wait: in a collective the others would wait for it until their own timeout."""
    import selectors
    outputs = [[b"", b""] for _ in procs]
    sel = selectors.DefaultSelector()
    for rank, p in enumerate(procs):
        sel.register(p.stdout, selectors.EVENT_READ, (rank, 0))
        sel.register(p.stderr, selectors.EVENT_READ, (rank, 1))
    open_pipes = 2 * len(procs)
    failed = []
    while open_pipes and not failed:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for key, _ in sel.select(timeout=min(left, 0.5)):
            rank, which = key.data
            chunk = os.read(key.fileobj.fileno(), 65536)
            if chunk:
                outputs[rank][which] = (outputs[rank][which] + chunk)[-1024 * 1024:]
            else:
                sel.unregister(key.fileobj)
                open_pipes -= 1
        failed = [(rank, p.poll()) for rank, p in enumerate(procs) if p.poll() not in (None, 0)]
    sel.close()
    for p in procs:
        if p.poll() is None and not failed and time.monotonic() < deadline:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:
                pass
    late = [rank for rank, p in enumerate(procs) if p.poll() is None] if not failed else []
    failed = failed or [(rank, p.returncode) for rank, p in enumerate(procs) if p.returncode not in (None, 0)]
    return [(o.decode("utf-8", "replace"), e.decode("utf-8", "replace")) for o, e in outputs], failed, late


def fd_targets(pid, proc="/proc", limit=65536):
    """What each open file descriptor of process ``pid`` points at (``/proc/PID/fd`` links:
    a path, ``socket:[INODE]``, ``pipe:[INODE]``), each once; [] where they cannot be read."""
    fd_dir = os.path.join(proc, str(pid), "fd")
    try:
        fds = os.listdir(fd_dir)[:limit]
    except OSError:
        return []
    out = []
    for fd in fds:
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target not in out:
            out.append(target)
    return out


def kill_child(p):
    """A child started with ``start_new_session``: its whole process group killed, its pipes
    closed."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        p.wait(timeout=5)
    except Exception:
        pass
    for f in (p.stdout, p.stderr):
        if f is not None:
            f.close()
