"""stacks: where every rank of a distributed job is, one Python stack per process (issue 13).

Runnable by hand (stdlib only): ``python3 stacks.py [--pid 123,456] [--match REGEX]``.

Finding the job's processes, without being told: every process whose environment (at exec,
``/proc/PID/environ``) has ``RANK`` and ``WORLD_SIZE`` -- torchrun / torch elastic workers,
with ``LOCAL_RANK``, ``GROUP_RANK``, ``TORCHELASTIC_RUN_ID`` -- or a Python process with
``SLURM_PROCID`` (an srun task); plus ``--pid`` and ``--match`` (a regular expression on the
command line) for anything else. ``NSpid`` in ``/proc/PID/status`` tells a container's process
apart when scanning from its host (its pid inside is the last number).

Dumping: ``py-spy dump --json --pid PID`` once per process, each with its own timeout (about
15 ms per process; the process is paused only for the dump), py-spy taken from ``--py-spy``,
from beside this script (the bundle), or from PATH. No py-spy: a warn finding with the way to
get one; ptrace refused: a fail finding with the fix, not a crash.

Result data: ``processes``: [{pid, ns_pid, rank, local_rank, world_size, group_rank, run_id,
cmdline, found_by, threads | error, seconds}]; ``collector``: ``py-spy`` and its path.
The client folds the main-thread stacks across targets and names the odd rank
(diagnostics/stacks_fold.py).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
             "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_JOB_ID")
MAX_ENVIRON = 256 * 1024          # bytes of /proc/PID/environ read
MAX_PROCESSES = 512               # processes dumped at most
MAX_DUMP = 4 * 1024 * 1024        # bytes of one py-spy answer
DUMP_TIMEOUT = 10.0               # seconds per py-spy call
DENIED = re.compile(r"permission denied|operation not permitted|ptrace", re.I)
PTRACE_HINT = ("run as the job's user or as root (hosts.yaml: become: sudo); in a container, "
               "start it with --cap-add SYS_PTRACE; a host with kernel.yama.ptrace_scope >= 2 "
               "needs root")


def build_parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pid", default="", help="comma list of pids to dump as well")
    p.add_argument("--match", default="", help="also dump processes whose command line matches")
    p.add_argument("--py-spy", dest="py_spy", default="", help="the py-spy binary to use")
    return p


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


def ns_pid_of(proc, pid):
    raw = _read(os.path.join(proc, str(pid), "status"), 16384) or b""
    for line in raw.decode("ascii", "replace").splitlines():
        if line.startswith("NSpid:"):
            numbers = line.split()[1:]
            return int(numbers[-1]) if numbers and numbers[-1].isdigit() else None
    return None


def _int(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def discover(proc, pids=(), match=""):
    """[(pid, found_by, env, cmdline)] of the job's processes, by pid."""
    pattern = re.compile(match) if match else None
    wanted = set(pids)
    me = os.getpid()
    found = []
    for name in os.listdir(proc):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        env = environ_of(proc, pid)
        cmd = cmdline_of(proc, pid)
        python = bool(cmd) and "python" in os.path.basename(cmd[0])
        if pid in wanted:
            how = "pid"
        elif "RANK" in env and "WORLD_SIZE" in env:
            how = "torch"
        elif "SLURM_PROCID" in env and python:
            how = "slurm"
        elif pattern is not None and cmd and pattern.search(" ".join(cmd)) and python:
            how = "match"
        else:
            continue
        found.append((pid, how, env, cmd))
    found.sort(key=lambda item: (_int(item[2].get("RANK", item[2].get("SLURM_PROCID"))) or 0, item[0]))
    return found[:MAX_PROCESSES]


def find_py_spy(given):
    for path in (given, os.path.join(HERE, "py-spy"), shutil.which("py-spy")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def dump(py_spy, pid):
    """(threads, error, seconds): py-spy's JSON for one process, or why not."""
    start = time.monotonic()
    try:
        proc = subprocess.run([py_spy, "dump", "--json", "--pid", str(pid)], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=DUMP_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, "py-spy did not answer within %g s" % DUMP_TIMEOUT, time.monotonic() - start
    except OSError as e:
        return None, "py-spy could not run: %s" % (e.strerror or e), time.monotonic() - start
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        text = (proc.stderr or proc.stdout).decode("utf-8", "replace").strip().splitlines()
        return None, (text[-1] if text else "py-spy exited %d" % proc.returncode)[:300], seconds
    try:
        threads = json.loads(proc.stdout[:MAX_DUMP].decode("utf-8", "replace"))
    except ValueError:
        return None, "py-spy's answer is not JSON", seconds
    return threads if isinstance(threads, list) else None, None, seconds


def run(args, proc="/proc"):
    pids = [int(p) for p in args.pid.split(",") if p.strip().isdigit()]
    found = discover(proc, pids, args.match)
    py_spy = find_py_spy(args.py_spy)
    processes, findings = [], []
    for pid, how, env, cmd in found:
        entry = {"pid": pid, "ns_pid": ns_pid_of(proc, pid), "found_by": how,
                 "rank": _int(env.get("RANK", env.get("SLURM_PROCID"))),
                 "local_rank": _int(env.get("LOCAL_RANK")), "world_size": _int(env.get("WORLD_SIZE")),
                 "group_rank": _int(env.get("GROUP_RANK")), "run_id": env.get("TORCHELASTIC_RUN_ID"),
                 "cmdline": " ".join(cmd)[:300]}
        if py_spy:
            entry["threads"], entry["error"], entry["seconds"] = dump(py_spy, pid)
        processes.append(entry)
    denied = [p["pid"] for p in processes if p.get("error") and DENIED.search(p["error"])]
    failed = [p["pid"] for p in processes if p.get("error") and p["pid"] not in denied]
    if not found:
        findings.append({"level": "warn", "code": "no-job-process", "action": "none",
                         "message": "no process of a distributed job found (no RANK/WORLD_SIZE or "
                                    "SLURM_PROCID in any environment)",
                         "hint": "name the processes with --pid or --match"})
    elif not py_spy:
        findings.append({"level": "warn", "code": "py-spy-absent", "action": "none",
                         "message": "py-spy not found on the target: %d processes found, no stack read"
                                    % len(found),
                         "hint": "pip install py-spy on the target (a static binary, no dependencies)"})
    if denied:
        findings.append({"level": "fail", "code": "ptrace-denied", "action": "none",
                         "message": "reading the stack was refused for pid %s"
                                    % ",".join(str(p) for p in denied), "hint": PTRACE_HINT})
    if failed:
        findings.append({"level": "warn", "code": "dump-failed", "action": "none",
                         "message": "no stack for pid %s: %s" % (
                             ",".join(str(p) for p in failed),
                             next(p["error"] for p in processes if p["pid"] in failed))})
    levels = [f["level"] for f in findings]
    status = "fail" if "fail" in levels else "warn" if "warn" in levels else "ok"
    ranks = sorted(p["rank"] for p in processes if p["rank"] is not None)
    summary = ("%d processes (ranks %s), %d stacks read" % (
        len(processes), ",".join(map(str, ranks)) or "-", sum(1 for p in processes if p.get("threads")))
        if processes else findings[0]["message"])
    return {"status": status, "summary": summary, "findings": findings,
            "data": {"processes": processes, "collector": "py-spy" if py_spy else None,
                     "py_spy": py_spy}}


_EXIT = {"ok": 0, "warn": 1, "fail": 2, "error": 3}

if __name__ == "__main__":
    _result = run(build_parser().parse_args())
    print(json.dumps(_result, indent=2))
    sys.exit(_EXIT.get(_result.get("status"), 3))
