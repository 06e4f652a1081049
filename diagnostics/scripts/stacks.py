"""stacks: where every rank of a distributed job is, one Python stack per process.

Runnable by hand (stdlib only): ``python3 stacks.py [--pid 123,456] [--match REGEX]``.

Finding the job's processes, without being told (``/proc/PID/environ`` is the environment at
exec; ``/proc/PID/status`` gives the parent and ``NSpid``):
- torchrun / torch elastic workers: ``RANK`` and ``WORLD_SIZE`` (with ``LOCAL_RANK``,
  ``GROUP_RANK``, ``TORCHELASTIC_RUN_ID``);
- ``mp.spawn`` workers (no RANK): Python processes started ``--multiprocessing-fork`` that
  carry ``MASTER_ADDR``/``MASTER_PORT`` or have torch loaded; their rank is their place among
  their siblings in start order, the world size the number of siblings;
- Slurm ``srun`` tasks: a Python process with ``SLURM_PROCID``;
- ``--pid`` and ``--match`` (a regular expression on the command line) for anything else.
Left out: a rank's own children with the same rank (DataLoader workers), a launcher whose
children are the ranks (torchrun under srun), and processes in a deeper pid namespace than
ours -- a container's, seen from its host -- unless ``--all-namespaces`` (they are counted:
the container is its own target).

Reading the stacks, by what the target has: ``py-spy dump --json --pid PID`` once per process
(about 15 ms each; ``--native`` adds the C frames at about 1 s and 330 MB per torch process),
py-spy from ``--py-spy``, from beside this script (the client ships it when the target has
none, ``--offer-py-spy``) or from PATH; else the standard-library reader of ``/proc/PID/mem``
beside this script (``pyframes.py``: CPython 3.11-3.13, no upload, about 45 ms). Either way the
process is paused at most for the read. Refused by the kernel (ptrace rules): a fail finding
with the fix, not a crash. Flight-recorder dumps the job wrote (``flight_recorder.py``) are
read as well.

Result data: ``processes``: [{pid, ns_pid, rank, local_rank, world_size, group_rank, run_id,
cmdline, found_by, collector, threads | error, seconds}]; ``collector``; ``py_spy``; ``left_out``
(counts); ``machine``; ``flight_recorder``; with ``--window``: ``window``, each process's
``window`` (its samples) and ``gpu_window`` (every GPU's utilisation and power over the window,
from ``nvidia-smi`` about once a second: ``GpuSampler``). The client folds the main-thread
stacks across targets and names the odd rank (diagnostics/builtin/stacks/fold.py), and over a
window the straggler rank and node (diagnostics/builtin/stacks/stragglers.py).
"""

import json
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import time

import _remote

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
             "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_JOB_ID",
             "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "HOME", "XDG_CACHE_HOME",
             "TORCH_WORKER_SERVER_SOCKET")
MAX_ENVIRON = 256 * 1024          # bytes of /proc/PID/environ read
MAX_PROCESSES = 512               # processes dumped at most
MAX_DUMP = 4 * 1024 * 1024        # bytes of one py-spy answer
DUMP_TIMEOUT = 10.0               # seconds per py-spy call
NATIVE_TIMEOUT = 30.0             # seconds per py-spy --native call (about 1 s for a torch rank)
SPAWN_FLAG = "--multiprocessing-fork"
DENIED = re.compile(r"permission denied|operation not permitted|ptrace", re.I)
PTRACE_HINT = ("run as the job's user or as root (hosts.yaml: become: sudo); in a container, "
               "start it with --cap-add SYS_PTRACE; a host with kernel.yama.ptrace_scope >= 2 "
               "needs root")


def build_parser():
    import argparse   # only here: through mldiag the client parses argv (bundle.parsed_args)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pid", default="", help="comma list of pids to dump as well")
    p.add_argument("--match", default="", help="also dump processes whose command line matches")
    p.add_argument("--py-spy", dest="py_spy", default="", help="the py-spy binary to use")
    p.add_argument("--native", action="store_true", help="py-spy --native: C frames as well")
    p.add_argument("--all-namespaces", dest="all_namespaces", action="store_true",
                   help="also dump job processes in containers below this pid namespace")
    p.add_argument("--no-upload", dest="no_upload", action="store_true",
                   help="(recorded only: the client ships nothing)")
    p.add_argument("--window", type=float, default=0.0,
                   help="sample every rank's stack for this many seconds (the straggler: the rank "
                        "that waits least in collectives)")
    p.add_argument("--rate", type=float, default=DEFAULT_RATE, help="samples per second per rank")
    p.add_argument("--offer-py-spy", dest="offer_py_spy", default="",
                   help="the client can ship py-spy for this machine type: when none is here, "
                        "stop after finding the processes and ask for it")
    return p


def companion(name):
    """The module ``NAME.py`` beside this file (pyframes, flight_recorder), or None
    (``_remote.load_companion``: by path, under a private module name)."""
    return _remote.load_companion(HERE, name + ".py", "_mldiag_stacks_" + name)


def _read(path, limit):
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def environ_of(proc, pid):
    raw = _read(os.path.join(proc, str(pid), "environ"), MAX_ENVIRON) or b""
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        name = key.decode("ascii", "replace")
        if sep and name in RANK_VARS:
            env[name] = value.decode("utf-8", "replace")[:200]
    return env


def cmdline_of(proc, pid):
    raw = _read(os.path.join(proc, str(pid), "cmdline"), 4096) or b""
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a][:64]


def status_of(proc, pid):
    """(ppid, [NSpid numbers]) from /proc/PID/status; (None, []) when unreadable."""
    raw = _read(os.path.join(proc, str(pid), "status"), 16384) or b""
    ppid, nspid = None, []
    for line in raw.decode("ascii", "replace").splitlines():
        if line.startswith("PPid:"):
            ppid = _int(line.split()[1]) if len(line.split()) > 1 else None
        elif line.startswith("NSpid:"):
            nspid = [int(n) for n in line.split()[1:] if n.isdigit()]
    return ppid, nspid


def ns_pid_of(proc, pid):
    numbers = status_of(proc, pid)[1]
    return numbers[-1] if numbers else None


def start_time_of(proc, pid):
    raw = _read(os.path.join(proc, str(pid), "stat"), 4096) or b""
    fields = raw.rpartition(b")")[2].split()
    return _int(fields[19]) if len(fields) > 19 else None


def torch_loaded(proc, pid):
    raw = _read(os.path.join(proc, str(pid), "maps"), 8 * 1024 * 1024) or b""
    return b"/libtorch" in raw


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _python(cmd):
    return bool(cmd) and "python" in os.path.basename(cmd[0])


def discover(proc, pids=(), match="", all_namespaces=False):
    """([(pid, found_by, env, cmdline)] of the job's processes in rank order, {why: count} of
    the ones left out). found_by: pid | torch | spawn | slurm | match; a spawn worker's env
    gets RANK and WORLD_SIZE from its place among its siblings."""
    pattern = re.compile(match) if match else None
    wanted = set(pids)
    me = os.getpid()
    depth = len(status_of(proc, "self")[1]) or 1
    seen = {}                         # pid -> (how, env, cmd, ppid, nspid)
    for name in os.listdir(proc):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        env = environ_of(proc, pid)
        cmd = cmdline_of(proc, pid)
        python = _python(cmd)
        if pid in wanted:
            how = "pid"
        elif "RANK" in env and "WORLD_SIZE" in env:
            how = "torch"
        elif python and SPAWN_FLAG in cmd and (
                "MASTER_ADDR" in env or "MASTER_PORT" in env or torch_loaded(proc, pid)):
            how = "spawn"
        elif "SLURM_PROCID" in env and python:
            how = "slurm"
        elif pattern is not None and cmd and pattern.search(" ".join(cmd)) and python:
            how = "match"
        else:
            continue
        ppid, nspid = status_of(proc, pid)
        seen[pid] = (how, env, cmd, ppid, nspid)
    left_out = {}

    def leave(pid, why):
        left_out[why] = left_out.get(why, 0) + 1
        del kept[pid]

    kept = dict(seen)
    for pid, (how, env, cmd, ppid, nspid) in seen.items():
        if how == "pid":
            continue
        parent = seen.get(ppid)
        if len(nspid) > depth and not all_namespaces:
            leave(pid, "in a container below this one")
        elif parent and parent[0] != "pid" and _rank_key(parent) == _rank_key((how, env)):
            leave(pid, "a rank's own child (e.g. a DataLoader worker)")
        elif how in ("slurm", "match") and any(
                other[3] == pid and other[0] in ("torch", "spawn") for other in seen.values()):
            leave(pid, "the launcher of the ranks")
    _number_spawned(proc, kept)
    found = [(pid, how, env, cmd) for pid, (how, env, cmd, _, _) in kept.items()]
    found.sort(key=lambda item: (_int(item[2].get("RANK", item[2].get("SLURM_PROCID"))) or 0, item[0]))
    return found[:MAX_PROCESSES], left_out


def _rank_key(entry):
    how, env = entry[0], entry[1]
    return (how, env.get("RANK"), env.get("SLURM_PROCID"), env.get("TORCHELASTIC_RUN_ID"))


def _number_spawned(proc, kept):
    """mp.spawn workers: rank = place among the siblings by start time (then pid)."""
    families = {}
    for pid, (how, _, _, ppid, _) in kept.items():
        if how == "spawn":
            families.setdefault(ppid, []).append(pid)
    for siblings in families.values():
        siblings.sort(key=lambda p: (start_time_of(proc, p) or 0, p))
        for rank, pid in enumerate(siblings):
            env = kept[pid][1]
            env["RANK"], env["WORLD_SIZE"] = str(rank), str(len(siblings))


def find_py_spy(given):
    bundled = os.path.join(HERE, "py-spy")
    for path in (given, bundled, shutil.which("py-spy")):
        if not path or not os.path.isfile(path):
            continue
        if path == bundled and not os.access(path, os.X_OK):
            try:                      # shipped 0600 into our own private dir
                os.chmod(path, 0o700)
            except OSError:
                continue
        if os.access(path, os.X_OK):
            return path
    return None


def dump(py_spy, pid, native=False, nonblocking=False):
    """(threads, error, seconds): py-spy's JSON for one process, or why not. error is None on
    success; OSError (py-spy cannot run at all, e.g. a noexec temp dir) is raised.
    ``nonblocking``: the process is not paused (a window's repeated samples)."""
    start = time.monotonic()
    timeout = NATIVE_TIMEOUT if native else DUMP_TIMEOUT
    argv = [py_spy, "dump", "--json", "--pid", str(pid)] + (["--native"] if native else []) + \
        (["--nonblocking"] if nonblocking else [])
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "py-spy did not answer within %g s" % timeout, time.monotonic() - start
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout).decode("utf-8", "replace").strip().splitlines()
        return None, (text[-1] if text else "py-spy exited %d" % proc.returncode)[:300], seconds
    try:
        threads = json.loads(proc.stdout[:MAX_DUMP].decode("utf-8", "replace"))
    except ValueError:
        return None, "py-spy's answer is not JSON", seconds
    return threads if isinstance(threads, list) else None, None, seconds


def read_stdlib(pid, proc):
    """The standard-library reader (pyframes.py beside this script): (threads, error, seconds)."""
    start = time.monotonic()
    pyframes = companion("pyframes")
    if pyframes is None:
        return None, "the standard-library reader (pyframes.py) is not beside this script", 0.0
    try:
        threads = pyframes.dump(pid, proc=proc)
    except PermissionError as e:
        return None, "Permission denied reading /proc/%d/mem (%s)" % (pid, e.strerror or e), \
            time.monotonic() - start
    except Exception as e:            # ReadError, or anything a broken process makes it meet
        return None, ("%s" % e)[:300] or type(e).__name__, time.monotonic() - start
    return threads, None, time.monotonic() - start


MAX_SOURCE_FRAMES = 32           # main-thread frames given their source line
MAX_SOURCE_BYTES = 4 * 1024 * 1024


def _source_lines(path, owner):
    """The lines of a Python file the process's owner may read (its own, or readable by all):
    a regular file whose last component is not a link, at most MAX_SOURCE_BYTES. Else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or not (st.st_uid == owner or st.st_mode & stat.S_IROTH):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(MAX_SOURCE_BYTES).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    finally:
        os.close(fd)


def add_source(proc, pid, threads, cache=None):
    """Give each main-thread frame its source line (``source``), read where the process sees
    the file: through /proc/PID/root (a container's process seen from its host too), a
    relative name from /proc/PID/cwd. Only ``*.py`` files the process's owner may read: a
    planted file name never makes us print a file its owner could not read. ``cache``: the
    files read for this process so far (a window's samples read each file once)."""
    if not isinstance(threads, list) or not threads:
        return
    named = [t for t in threads if isinstance(t, dict) and t.get("thread_name") == "MainThread"]
    main = named[0] if named else threads[0]
    frames = main.get("frames") if isinstance(main, dict) else None
    try:
        owner = os.stat(os.path.join(proc, str(pid))).st_uid
    except OSError:
        return
    if not isinstance(frames, list):
        return
    base = os.path.join(proc, str(pid))
    cache = {} if cache is None else cache
    for frame in frames[:MAX_SOURCE_FRAMES]:
        if not isinstance(frame, dict):
            continue
        name, line = frame.get("filename"), frame.get("line")
        if not (isinstance(name, str) and name.endswith(".py") and "\0" not in name
                and isinstance(line, int) and line > 0):
            continue
        if name not in cache:
            where = base + "/root" + name if name.startswith("/") else os.path.join(base, "cwd", name)
            cache[name] = _source_lines(where, owner)
        lines = cache[name]
        if lines and line <= len(lines):
            frame["source"] = lines[line - 1].strip()[:200]


def _entry(proc, pid, how, env, cmd):
    return {"pid": pid, "ns_pid": ns_pid_of(proc, pid), "found_by": how,
            "rank": _int(env.get("RANK", env.get("SLURM_PROCID"))),
            "local_rank": _int(env.get("LOCAL_RANK")), "world_size": _int(env.get("WORLD_SIZE")),
            "group_rank": _int(env.get("GROUP_RANK")), "run_id": env.get("TORCHELASTIC_RUN_ID"),
            "cmdline": " ".join(cmd)[:300]}


def read_all(found, proc, py_spy, native):
    """Dump every process: py-spy when there is one (falling back to the standard-library
    reader for all when it cannot run here), else the standard-library reader. Returns
    (processes, py-spy's own failure or None)."""
    processes, spy_failed = [], None
    for pid, how, env, cmd in found:
        entry = _entry(proc, pid, how, env, cmd)
        if py_spy and spy_failed is None:
            try:
                entry["threads"], entry["error"], entry["seconds"] = dump(py_spy, pid, native)
                entry["collector"] = "py-spy"
            except OSError as e:
                spy_failed = "py-spy could not run: %s" % (e.strerror or e)
        if "collector" not in entry:
            entry["threads"], entry["error"], entry["seconds"] = read_stdlib(pid, proc)
            entry["collector"] = "stdlib"
        add_source(proc, pid, entry["threads"])
        processes.append(entry)
    return processes, spy_failed


def flight_recorder(proc, found):
    """The flight recorders of the job's processes: asked of each live rank's torch worker
    server where it runs one (flight_recorder.live_dump: no file, the state now), and the
    dumps the processes name (their TORCH_FR_DUMP_TEMP_FILE, or torch's default for their
    HOME), or, with no process found, the ones our own environment names; None when there are
    none (or flight_recorder.py is not beside this script)."""
    fr = companion("flight_recorder")
    if fr is None:
        return None
    prefixes, live = [], []
    for pid, _, env, _ in found:
        try:
            asked = fr.live_dump(pid, env, _int(env.get("RANK")), proc=proc)
        except Exception as e:        # never costs the stacks
            asked = {"file": "pid %d: worker server" % pid, "rank": None, "live": True,
                     "error": ("%s" % e)[:300]}
        if asked is not None:
            live.append(asked)
        try:
            cwd = os.readlink(os.path.join(proc, str(pid), "cwd"))
        except OSError:
            cwd = None
        for prefix in fr.prefixes_from_environ(env, cwd=cwd):
            if prefix not in prefixes:
                prefixes.append(prefix)
    try:
        collected = fr.collect(prefixes or None)
    except Exception as e:            # never costs the stacks
        return {"error": ("%s" % e)[:300], "dumps": live} if live else {"error": ("%s" % e)[:300]}
    collected["dumps"] = live + collected.get("dumps", [])
    return collected if collected.get("dumps") or collected.get("more_files") else None


def run(args, proc="/proc"):
    pids = [int(p) for p in args.pid.split(",") if p.strip().isdigit()]
    found, left_out = discover(proc, pids, args.match, getattr(args, "all_namespaces", False))
    py_spy = find_py_spy(args.py_spy)
    native = getattr(args, "native", False)
    machine = platform.machine()
    offer = getattr(args, "offer_py_spy", "")
    data = {"collector": None, "py_spy": py_spy, "left_out": left_out, "machine": machine}
    if found and not py_spy and offer and offer == machine:
        data["processes"] = [_entry(proc, *item) for item in found]
        data["wants_py_spy"] = True
        return {"status": "ok", "summary": "%d processes found; asking for py-spy" % len(found),
                "findings": [], "data": data}
    findings = []
    window = min(max(float(getattr(args, "window", 0.0) or 0.0), 0.0), MAX_WINDOW)
    if window and found:
        rate = min(max(float(getattr(args, "rate", DEFAULT_RATE) or DEFAULT_RATE), 0.2), MAX_RATE)
        try:
            rules = load_wait_rules()
        except (OSError, ValueError) as e:
            rules = None
            findings.append({"level": "warn", "code": "window-not-sampled", "action": "none",
                             "message": "wait_frames.json unreadable: %s" % e})
        if rules is not None:
            t0 = time.monotonic()
            gpus = GpuSampler(_remote.find_tool("nvidia-smi"))
            try:
                per_pid, rounds = sample_window(found, proc, py_spy, window, rate, rules, also=gpus.tick)
            finally:
                data["gpu_window"] = gpus.finish()
            data["window"] = {"seconds": round(time.monotonic() - t0, 3), "asked": window, "rate": rate,
                              "rounds": rounds}
    processes, spy_failed = read_all(found, proc, py_spy, native)
    for entry in processes:
        if "window" in data and entry["pid"] in per_pid:
            entry["window"] = per_pid[entry["pid"]]
    collectors = sorted({p["collector"] for p in processes if p.get("threads")})
    data.update(processes=processes, collector="+".join(collectors) or None, py_spy_error=spy_failed)
    read = sum(1 for p in processes if p.get("threads"))
    denied = [p["pid"] for p in processes if p.get("error") and DENIED.search(p["error"])]
    failed = [p["pid"] for p in processes if p.get("error") and p["pid"] not in denied]
    if not found:
        findings.append({"level": "warn", "code": "no-job-process", "action": "none",
                         "message": "no process of a distributed job found (no RANK/WORLD_SIZE, "
                                    "mp.spawn worker or SLURM_PROCID in any environment)"
                                    + _left_out_text(left_out),
                         "hint": "name the processes with --pid or --match" + (
                             "; add the containers as targets or use --all-namespaces"
                             if left_out.get("in a container below this one") else "")})
    elif not py_spy and not read and failed:
        findings.append({"level": "warn", "code": "py-spy-absent", "action": "none",
                         "message": "py-spy not found on the target and the standard-library "
                                    "reader could not read the %d processes: %s" % (
                                        len(found), next(p["error"] for p in processes
                                                         if p["pid"] in failed)),
                         "hint": "pip install py-spy on the target (a static binary, no "
                                 "dependencies), or let mldiag ship it (pip install "
                                 "'fabric-mldiag[stacks]' here, without --no-upload)"})
        failed = []
    if denied:
        findings.append({"level": "fail", "code": "ptrace-denied", "action": "none",
                         "message": "reading the stack was refused for pid %s"
                                    % ",".join(str(p) for p in denied), "hint": PTRACE_HINT})
    if failed:
        findings.append({"level": "warn", "code": "dump-failed", "action": "none",
                         "message": "no stack for pid %s: %s" % (
                             ",".join(str(p) for p in failed),
                             next(p["error"] for p in processes if p["pid"] in failed))})
    if spy_failed:
        findings.append({"level": "info", "code": "py-spy-unusable", "action": "none",
                         "message": spy_failed + "; read with the standard-library reader"})
    fr = flight_recorder(proc, found)
    if fr is not None:
        data["flight_recorder"] = fr
    levels = [f["level"] for f in findings]
    status = "fail" if "fail" in levels else "warn" if "warn" in levels else "ok"
    ranks = sorted(p["rank"] for p in processes if p["rank"] is not None)
    summary = ("%d processes (ranks %s), %d stacks read%s%s" % (
        len(processes), ",".join(map(str, ranks)) or "-", read,
        " (%s)" % data["collector"] if data["collector"] and data["collector"] != "py-spy" else "",
        _left_out_text(left_out)) if processes else findings[0]["message"])
    return {"status": status, "summary": summary, "findings": findings, "data": data}


# --------------------------------------------------------------------------- a window of samples

WAIT_FRAMES_FILE = "wait_frames.json"
MAX_WINDOW = 600.0                # seconds
MAX_RATE = 20.0                   # samples per second per process
DEFAULT_RATE = 4.0


def load_wait_rules(path=None):
    """wait_frames.json's rules, each (file, function, code) compiled regular expressions (None
    where the rule gives none). Raises OSError or ValueError."""
    import re as _re
    with open(path or os.path.join(HERE, WAIT_FRAMES_FILE), "r", encoding="utf-8") as f:
        raw = json.load(f)
    rules = []
    for rule in raw.get("rules") or []:
        rules.append(tuple(_re.compile(rule[k]) if isinstance(rule.get(k), str) else None
                           for k in ("file", "function", "code")))
    if not rules:
        raise ValueError("%s: no rules" % (path or WAIT_FRAMES_FILE))
    return rules


def _matches(frame, rule):
    file_re, function_re, code_re = rule
    name, filename, source = frame.get("name"), frame.get("filename"), frame.get("source")
    if file_re is not None and not (isinstance(filename, str) and file_re.search(filename)):
        return False
    if function_re is not None and not (isinstance(name, str) and function_re.fullmatch(name)):
        return False
    if code_re is not None and not (isinstance(source, str) and code_re.search(source)):
        return False
    return True


def main_frames(threads):
    """The main thread's frames, innermost first (the thread named MainThread, else the first)."""
    if not isinstance(threads, list) or not threads:
        return []
    named = [t for t in threads if isinstance(t, dict) and t.get("thread_name") == "MainThread"]
    thread = named[0] if named else threads[0]
    frames = thread.get("frames") if isinstance(thread, dict) else None
    return [f for f in frames if isinstance(f, dict)] if isinstance(frames, list) else []


def classify(threads, rules):
    """(waiting in a collective, the innermost frame as text, the stack's signature) of one
    sample's main thread. Pure."""
    frames = main_frames(threads)
    waiting = any(_matches(f, rule) for f in frames[:MAX_SOURCE_FRAMES] for rule in rules)
    top = frames[0] if frames else {}
    where = "%s (%s:%s)" % (top.get("name"), top.get("filename"), top.get("line")) if frames else None
    signature = tuple((f.get("name"), f.get("filename"), f.get("line")) for f in frames[:MAX_SOURCE_FRAMES])
    return waiting, where, signature


def summarise_samples(samples):
    """One process's window from its samples [(waiting, where, signature)]: {"samples",
    "waiting", "wait_share", "busy_frame", "busy_share", "distinct_stacks"}. Pure."""
    n = len(samples)
    waiting = sum(1 for w, _, _ in samples if w)
    busy = {}
    for w, where, _ in samples:
        if not w and where:
            busy[where] = busy.get(where, 0) + 1
    frame, count = max(busy.items(), key=lambda kv: (kv[1], kv[0])) if busy else (None, 0)
    return {"samples": n, "waiting": waiting, "wait_share": round(waiting / n, 4) if n else None,
            "busy_frame": frame, "busy_share": round(count / n, 4) if n else None,
            "distinct_stacks": len(set(sig for _, _, sig in samples))}


def sample_window(found, proc, py_spy, window, rate, rules, clock=time.monotonic, sleep=time.sleep,
                  also=None):
    """Each found process's main thread sampled ``rate`` times a second on average, at random
    intervals, for ``window`` seconds (the standard-library reader where it can read them: no
    process started, none paused; else py-spy ``--nonblocking``): {pid: summarise_samples(...)},
    and the rounds made. ``also()`` is called every round (the GPU sampler's turn)."""
    period = 1.0 / rate
    start = clock()
    samples = dict((pid, []) for pid, _, _, _ in found)
    caches = dict((pid, {}) for pid in samples)
    use_spy = None                    # decided on the first round: the reader that works
    rounds = 0
    import random
    jitter = random.Random()
    while True:
        tick = clock()
        if tick - start >= window:
            break
        for pid in samples:
            threads = None
            if use_spy is not True:
                threads, error, _ = read_stdlib(pid, proc)
                if threads is None and use_spy is None and py_spy:
                    use_spy = True
                elif threads is not None:
                    use_spy = False
            if use_spy and threads is None:
                try:
                    threads, error, _ = dump(py_spy, pid, nonblocking=True)
                except OSError:
                    threads = None
            if isinstance(threads, list):
                add_source(proc, pid, threads, caches[pid])
                samples[pid].append(classify(threads, rules))
        rounds += 1
        if also is not None:
            also()
        # NOTE: a random interval (mean: the period), not a fixed one: a job steps at a steady
        # rate, and samples at a rate near it would see every rank at the same point of each step
        # (measured on the lab's slow job, 5 steps and 5 samples a second: the ranks that wait 80 %
        # of the time showed 7 %); random times see each part of the step as often as it lasts
        left = period * jitter.uniform(0.5, 1.5) - (clock() - tick)
        if left > 0:
            sleep(left)
    return dict((pid, summarise_samples(got)) for pid, got in samples.items()), rounds


GPU_FIELDS = "index,uuid,utilization.gpu,power.draw,power.limit"
GPU_PERIOD = 1.0                  # seconds between two nvidia-smi queries in a window
GPU_HUNG_AFTER = 5.0              # a query still running after this is hung: no more are started


class GpuSampler(object):
    """Every GPU's utilisation and power over a window (the "waiting in a collective" signature:
    busy GPUs that draw little power), from ``nvidia-smi --query-gpu`` about once a second.
    Each query is a child that is never waited for: ``tick()`` collects the one that ended and
    starts the next, so the stack samples go on whatever nvidia-smi does; one that has not
    answered after ``GPU_HUNG_AFTER`` is killed and no more are started (a wedged driver is
    gpu-status's finding; here the window just has no GPU figures)."""

    def __init__(self, smi, period=GPU_PERIOD, hung_after=GPU_HUNG_AFTER, clock=time.monotonic):
        self.smi, self.period, self.hung_after, self.clock = smi, period, hung_after, clock
        self.child, self.started, self.next = None, 0.0, 0.0
        self.rows, self.queries, self.error = {}, 0, None if smi else "nvidia-smi not found"

    def tick(self):
        now = self.clock()
        if self.child is not None:
            if self.child.poll() is None:
                if now - self.started > self.hung_after:
                    _remote.kill_child(self.child)
                    self.child, self.smi = None, None
                    self.error = "nvidia-smi did not answer in %g s: no more GPU samples" % self.hung_after
                return
            self._collect()
        if self.smi and now >= self.next:
            try:
                self.child = subprocess.Popen([self.smi, "--query-gpu=" + GPU_FIELDS,
                                               "--format=csv,noheader,nounits"],
                                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, start_new_session=True)
            except OSError as e:
                self.smi, self.error = None, "nvidia-smi: %s" % e
                return
            self.started, self.next = now, now + self.period

    def _collect(self):
        child, self.child = self.child, None
        out = child.stdout.read(1 << 20)        # it has ended: its few lines are in the pipe
        err = child.stderr.read(4096)
        _remote.kill_child(child)
        if child.returncode != 0:
            self.error = "nvidia-smi exited %s: %s" % (
                child.returncode, (out or err).decode("utf-8", "replace").strip()[:300])
            return
        self.queries += 1
        for line in out.decode("utf-8", "replace").splitlines():
            row = parse_gpu_row(line)
            if row is not None:
                self.rows.setdefault((row[0], row[1]), []).append(row[2:])

    def finish(self):
        """{tool, queries, gpus: [{index, uuid, samples, util_pct, power_w, power_limit_w}], error}:
        the means over the window."""
        if self.child is not None:
            if self.child.poll() is not None:
                self._collect()
            else:
                _remote.kill_child(self.child)
                self.child = None
        gpus = []
        for (index, uuid), got in sorted(self.rows.items()):
            def mean(i):
                values = [g[i] for g in got if g[i] is not None]
                return round(sum(values) / len(values), 2) if values else None
            gpus.append({"index": index, "uuid": uuid, "samples": len(got), "util_pct": mean(0),
                         "power_w": mean(1), "power_limit_w": mean(2)})
        return {"tool": self.smi, "queries": self.queries, "gpus": gpus, "error": self.error}


def parse_gpu_row(line):
    """``0, GPU-8e..., 100, 142.31, 700.00`` (GPU_FIELDS, csv,noheader,nounits) ->
    (index, uuid, util, power, limit); ``[N/A]``/``[Not Supported]`` cells are None; a line
    that is not such a row (a warning, a lost GPU's message) is None."""
    cells = [c.strip() for c in line.split(",")]
    if len(cells) != 5 or not cells[0].isdigit():
        return None

    def number(text):
        try:
            value = float(text)
        except ValueError:
            return None
        return value if 0.0 <= value < 1e6 else None
    return (int(cells[0]), cells[1][:80], number(cells[2]), number(cells[3]), number(cells[4]))


def _left_out_text(left_out):
    n = left_out.get("in a container below this one", 0)
    return "; %d in containers left out" % n if n else ""



if __name__ == "__main__":
    _result = run(build_parser().parse_args())
    print(json.dumps(_result, indent=2))
    sys.exit(_remote.exit_code(_result))
