#!/usr/bin/env python3
"""stacks --window on a real slow 4-rank gloo job (issue 33): how long a straggler takes to name,
by window length and rate of samples, and what the sampling costs the job's steps.

    flock /tmp/mldiag-lab.lock .venv/bin/python bench/stragglers.py [--runs 3] [--windows 1,2,5]
        [--rates 2,5,10] [--cost-window 5] [--cost-rates 5,10,20] [--save FILE]

Starts tests/fixtures/stacks/slow_gloo_job.py with torchrun (4 ranks on this machine, gloo, CPU
torch; every rank sleeps STEP_S=0.05 s a step, then all_reduce), twice: the straggler job
(SLOW_RANK=3: rank 3 also busy-loops EXTRA_S=0.15 s every step, the others wait for it in
all_reduce) and the equal job (SLOW_RANK=-1). On each it runs, the order rotating every round so
that drift hits every command alike:
  no window     mldiag stacks -H local --no-upload --json        (the floor: start, find, read, exit)
  W s at R/s    mldiag stacks -H local --no-upload --json --window W --rate R
                for every W of --windows and R of --rates, and at --cost-window for every R of
                --cost-rates
  baseline      no command: --cost-window seconds of the job stepping unobserved
Each run is checked: exit 0, 1 or 2, one `local` result whose processes are exactly the job's four
ranks (their pids below torchrun, RANK from their environment), each sampled, the window
and rate as asked. It records the wall and CPU seconds of the whole command (os.wait4: its
process tree), the ranks its `straggler` findings name, and how fast the job stepped: a thread
here polls rank 0's log (LOG_PREFIX0.log, `step N took X s`, every 5 ms) and timestamps each
step's line, and steps/s over an interval is (last step - first step) / (their time apart). For a
window, the interval is [end - window.seconds, end - 0.5 s] (end: when the command returned;
window.seconds: how long the target sampled; 0.5 s: the most the reading of the stacks, the
output and the exit after the window take), inside the window whatever the command's start took;
for the baseline the same length.

Prints per window and rate: the median (min-max) wall seconds, the samples per rank, the sampler's
CPU (the command's CPU seconds less the no-window run's, per second of window, in % of one core),
how many runs named rank 3 of the straggler job (and how many a wrong rank), and how many named
anybody in the equal job. Then what sampling costs each job: per round, steps/s of the baseline
over steps/s of the window (> 1: the job stepped slower while sampled; issue 33 asks ≤ 1.02),
median (min-max), and rank 0's own `took` (its part of the step before the collective).

The fixture's work is timed by the wall clock (sleep, a busy loop until a deadline): what the
sampler takes from a job whose compute needs the CPU is at most its CPU share (the column).
The job is stopped in every outcome, also on Ctrl-C: its STOP_FILE, then SIGKILL to torchrun's
process group and to each rank left (every rank is a session of its own) if it has not ended in
20 s; the private temp dir is removed. Hold `flock /tmp/mldiag-lab.lock` around it: the lab's
tests run slow jobs of their own that `-H local` would find.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import REPO, BenchError, Sample, bytecode_env, kill_current, load_avg, timed  # noqa: E402

JOB = REPO / "tests" / "fixtures" / "stacks" / "slow_gloo_job.py"
RANKS = 4
SLOW = 3
STEP_S = 0.05
EXTRA_S = 0.15
POLL_S = 0.005        # how often rank 0's log is read
TAIL_S = 0.5          # the most the command takes after its window (read, print, exit)
START_S = 240.0       # the longest the job may take to start (4 torch imports on 2 cores)
STOP_S = 20.0         # the longest it may take to stop on its STOP_FILE before SIGKILL
JOBS = (("straggler", SLOW), ("equal", -1))
STEP_LINE = re.compile(rb"^step (\d+) took ([0-9.]+) s$")
NAMED = re.compile(r"^rank (?:\d+|\?) \(pid (\d+) on ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StepLog(threading.Thread):
    """Rank 0's log, polled every POLL_S: (monotonic time it was seen, step, took) per line."""

    def __init__(self, path: Path):
        super().__init__(daemon=True)
        self.path = path
        self.steps: List[Tuple[float, int, float]] = []
        self.lock = threading.Lock()
        self.done = threading.Event()

    def run(self) -> None:
        buf = b""
        f = None
        while not self.done.is_set():
            if f is None:
                try:
                    f = open(self.path, "rb")
                except FileNotFoundError:
                    time.sleep(POLL_S)
                    continue
            data = f.read()
            now = time.monotonic()
            if data:
                buf += data
                *lines, buf = buf.split(b"\n")
                got = [(now, int(m.group(1)), float(m.group(2)))
                       for m in map(STEP_LINE.match, lines) if m]
                with self.lock:
                    self.steps.extend(got)
            time.sleep(POLL_S)
        if f is not None:
            f.close()

    def between(self, a: float, b: float) -> List[Tuple[float, int, float]]:
        with self.lock:
            return [s for s in self.steps if a <= s[0] <= b]

    def count(self) -> int:
        with self.lock:
            return len(self.steps)

    def pace(self, a: float, b: float) -> Optional[dict]:
        """Steps/s over [a, b] from the first to the last step seen in it, and rank 0's median
        `took`; None with fewer than 3 steps."""
        got = self.between(a, b)
        if len(got) < 3 or got[-1][0] <= got[0][0]:
            return None
        return {"steps_per_s": (got[-1][1] - got[0][1]) / (got[-1][0] - got[0][0]),
                "steps": got[-1][1] - got[0][1], "took": statistics.median(s[2] for s in got)}


class Job:
    """The slow job under torchrun, in a session of its own."""

    def __init__(self, work: Path, name: str, slow: int):
        self.dir = work / name
        self.dir.mkdir()
        self.name, self.slow = name, slow
        self.stop_file = self.dir / "stop"
        self.proc: Optional[subprocess.Popen] = None
        self.log = StepLog(self.dir / "rank0.log")
        self.ranks: Dict[int, int] = {}
        self.stopped = False

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        env.update(SLOW_RANK=str(self.slow), STEP_S=str(STEP_S), EXTRA_S=str(EXTRA_S),
                   STOP_FILE=str(self.stop_file), LOG_PREFIX=str(self.dir / "rank"))
        out_path = self.dir / "job.log"
        with open(out_path, "wb") as out:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", str(RANKS),
                 "--master-port", str(free_port()), str(JOB)], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=str(self.dir), env=env, start_new_session=True)
        self.log.start()
        end = time.monotonic() + START_S
        while out_path.read_text(errors="replace").count("warm ") < RANKS or self.log.count() < 5:
            if self.proc.poll() is not None or time.monotonic() > end:
                raise BenchError(f"the {self.name} job did not start:\n"
                                 f"{out_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        self.ranks = self.find_ranks()
        if sorted(self.ranks.values()) != list(range(RANKS)):
            raise BenchError(f"the {self.name} job's ranks are not 0..{RANKS - 1}: {self.ranks}")

    def descendants(self) -> List[int]:
        """The pids below torchrun (its ranks are in sessions of their own: torch's elastic
        agent starts each with start_new_session)."""
        children: Dict[int, List[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [self.proc.pid]
        while todo:
            for pid in children.get(todo.pop(), []):
                out.append(pid)
                todo.append(pid)
        return out

    def find_ranks(self) -> Dict[int, int]:
        """{pid: RANK} of the processes below torchrun that carry RANK and run the job."""
        out = {}
        for pid in self.descendants():
            try:
                if JOB.name.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for var in environ:
                if var.startswith(b"RANK="):
                    out[pid] = int(var[5:])
        return out

    def ours(self, pid: int) -> bool:
        """Still one of this job's processes (not a pid reused since)."""
        try:
            return str(self.stop_file).encode() in Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return False

    def alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        return bool(self.find_ranks())

    def stop(self) -> None:
        """STOP_FILE, then, after STOP_S, SIGKILL to torchrun's process group and to every rank
        still there (each in a session of its own); once."""
        if self.stopped:
            return
        self.stopped = True
        try:
            self.stop_file.touch()
        except OSError:
            pass
        if self.proc is not None:
            left = set(self.ranks) | set(self.find_ranks() if self.proc.poll() is None else {})
            end = time.monotonic() + STOP_S
            while ((self.proc.poll() is None or any(self.ours(p) for p in left))
                   and time.monotonic() < end):
                time.sleep(0.1)
            if self.proc.poll() is None:
                left |= set(self.descendants())
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            for pid in left:
                if self.ours(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.log.done.set()


class Cell:
    """One kind of run on one job: a window (window, rate), the no-window floor (0, 0) or the
    baseline interval (None, None)."""

    def __init__(self, job: str, window: Optional[float], rate: Optional[float], length: float = 0.0):
        self.job, self.window, self.rate = job, window, rate
        self.length = length              # the baseline's seconds
        self.runs: List[dict] = []

    @property
    def label(self) -> str:
        if self.window is None:
            return "baseline"
        return "no window" if not self.window else f"{self.window:g} s at {self.rate:g}/s"


def fmt(x: float) -> str:
    return f"{x:g}"


def check_run(sample: Sample, job: Job, cell: Cell) -> dict:
    """What the run found, checked against what it claims: the job's four ranks, each sampled,
    the window and rate asked."""
    text = sample.stdout.decode(errors="replace")
    if sample.returncode not in (0, 1, 2):
        raise BenchError(f"stacks ({cell.label}) exited {sample.returncode}:\n"
                         f"{sample.stderr.decode(errors='replace')[-1500:]}{text[-800:]}")
    try:
        docs = json.loads(text)
        doc, = docs
        data = doc["data"]
        procs = {p["pid"]: p for p in data["processes"]}
    except (ValueError, KeyError, TypeError) as e:
        raise BenchError(f"stacks ({cell.label}) printed no single result ({e!r}): {text[-800:]}")
    if doc.get("target") != "local" or set(procs) != set(job.ranks):
        raise BenchError(f"stacks ({cell.label}) found pids {sorted(procs)} on {doc.get('target')}, not "
                         f"the {job.name} job's ranks {job.ranks}: another job on this machine?")
    got: dict = {"status": doc.get("status"), "summary": doc.get("summary"),
                 "codes": [f.get("code") for f in doc.get("findings") or []]}
    if cell.window:
        w = data.get("window") or {}
        windows = [procs[pid].get("window") or {} for pid in job.ranks]
        samples = [x.get("samples") or 0 for x in windows]
        if w.get("asked") != cell.window or w.get("rate") != cell.rate or min(samples) < 1:
            raise BenchError(f"stacks ({cell.label}) sampled {w} and {samples} per rank: not the "
                             "window asked")
        got.update(seconds=w["seconds"], rounds=w.get("rounds"), samples=samples,
                   shares={job.ranks[pid]: (procs[pid].get("window") or {}).get("wait_share")
                           for pid in job.ranks})
    named = []
    for f in doc.get("findings") or []:
        if f.get("code") == "straggler":
            m = NAMED.match(f.get("message") or "")
            named.append(job.ranks.get(int(m.group(1)), -1) if m else -1)
    got["named"] = sorted(named)
    return got


def run_cell(cell: Cell, job: Job, mldiag: str, env: Dict[str, str], rnd: int) -> None:
    if not job.alive():
        raise BenchError(f"the {job.name} job is gone:\n"
                         f"{(job.dir / 'job.log').read_text(errors='replace')[-2000:]}")
    if cell.window is None:                      # the baseline: the job unobserved
        t0 = time.monotonic()
        time.sleep(cell.length - TAIL_S)
        pace = job.log.pace(t0, time.monotonic())
        if pace is None:
            raise BenchError(f"the {job.name} job made no steps in {cell.label}")
        cell.runs.append({"round": rnd, **pace})
        return
    argv = [mldiag, "stacks", "-H", "local", "--no-upload", "--json"]
    if cell.window:
        argv += ["--window", fmt(cell.window), "--rate", fmt(cell.rate)]
    sample = timed(argv, None, env, str(REPO), timeout=(cell.window or 0) + 120, check=False)
    end = time.monotonic()
    got = check_run(sample, job, cell)
    run = {"round": rnd, "wall": sample.wall, "cpu": sample.cpu, **got}
    if cell.window:
        pace = job.log.pace(end - got["seconds"], end - TAIL_S)
        if pace is not None:
            run.update(pace)
    cell.runs.append(run)


def med(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float], f: str = ".3f") -> str:
    if not values:
        return "-"
    return f"{med(values):{f}} ({min(values):{f}}-{max(values):{f}})"


def report(cells: Dict[tuple, Cell], args, loads: List[float]) -> Tuple[str, dict]:
    out = [f"stacks --window on a 4-rank gloo job (CPU torch, {os.cpu_count()} CPUs), runs per cell: "
           f"{args.runs}; every rank sleeps {STEP_S} s a step, the straggler job's rank {SLOW} also "
           f"busy-loops {EXTRA_S} s; 1-min load average {loads[0]:.2f} before, "
           f"{min(loads[1:]):.2f}..{max(loads[1:]):.2f} after each round"]
    floor_cpu = {j: med([r["cpu"] for r in cells[(j, 0, 0)].runs]) for j, _ in JOBS}
    head = (f"{'window':>6} {'rate':>5} {'samples':>7}  {'wall s, median (min-max)':<25} {'sampler CPU':>11}  "
            f"{'straggler job: rank 3 named':>27} {'wrong':>5}  {'equal job: named':>16}")
    out += ["", head, "-" * len(head)]
    grid: List[dict] = []
    keys = [(0, 0)] + [(w, r) for w in args.windows for r in args.rates]
    for w, r in keys:
        slow, equal = cells[("straggler", w, r)], cells[("equal", w, r)]
        walls = [x["wall"] for x in slow.runs]
        n = len(slow.runs)
        right = sum(1 for x in slow.runs if x["named"] == [SLOW])
        wrong = sum(1 for x in slow.runs if any(k != SLOW for k in x["named"]))
        false = sum(1 for x in equal.runs if x["named"])
        if w:
            samples = med([min(x["samples"]) for x in slow.runs])
            cpu = med([(x["cpu"] - floor_cpu["straggler"]) / x["seconds"] for x in slow.runs])
            cpu_s = f"{100 * cpu:10.1f}%"
        else:
            samples, cpu_s = None, f"{'-':>11}"
        out.append(f"{fmt(w) if w else '-':>6} {fmt(r) if r else '-':>5} {'-' if samples is None else f'{samples:.0f}':>7}  {spread(walls):<25} "
                   f"{cpu_s}  {f'{right}/{n}' if w else '-':>27} {wrong if w else '-':>5}  "
                   f"{f'{false}/{len(equal.runs)}' if w else '-':>16}")
        grid.append({"window": w, "rate": r, "wall": walls, "named_right": right, "named_wrong": wrong,
                     "runs": n, "equal_named": false, "equal_runs": len(equal.runs),
                     "wall_equal": [x["wall"] for x in equal.runs]})
    out += ["", "samples: per rank (the fewest of the four, median over runs); sampler CPU: the command's "
            "CPU seconds less the no-window run's, per second of window (% of one core); "
            "rank 3 named: runs whose straggler findings were rank 3 and nobody else; wrong: runs "
            "that named another rank; equal job: runs that named anybody."]
    head = (f"{'job':<10} {'rate':>5} {'steps/s unobserved':>18} {'steps/s sampled':>15}  "
            f"{'ratio, median (min-max)':<25} {'rank 0 took ms':>15} {'sampler CPU':>11}")
    out += ["", f"what sampling costs the job: --window {fmt(args.cost_window)} against "
            f"{fmt(args.cost_window)} s unobserved in the same round; ratio = steps/s unobserved / "
            f"steps/s sampled (issue 33: ≤ 1.02)", head, "-" * len(head)]
    cost: List[dict] = []
    for j, _ in JOBS:
        base = {x["round"]: x for x in cells[(j, None, None)].runs}
        out.append(f"{j:<10} {'-':>5} {med([x['steps_per_s'] for x in base.values()]):18.3f} {'-':>15}  "
                   f"{'-':<25} {1e3 * med([x['took'] for x in base.values()]):15.1f} {'-':>11}")
        for r in args.cost_rates:
            runs = [x for x in cells[(j, args.cost_window, r)].runs if "steps_per_s" in x]
            ratios = [base[x["round"]]["steps_per_s"] / x["steps_per_s"] for x in runs if x["round"] in base]
            cpu = med([(x["cpu"] - floor_cpu[j]) / x["seconds"] for x in runs])
            out.append(f"{j:<10} {fmt(r):>5} {'':>18} {med([x['steps_per_s'] for x in runs]):15.3f}  "
                       f"{spread(ratios):<25} {1e3 * med([x['took'] for x in runs]):15.1f} {100 * cpu:10.1f}%")
            cost.append({"job": j, "rate": r, "window": args.cost_window, "ratios": ratios,
                         "steps_per_s": [x["steps_per_s"] for x in runs],
                         "steps_per_s_unobserved": [x["steps_per_s"] for x in base.values()],
                         "sampler_cpu_share": cpu})
    return "\n".join(out), {"grid": grid, "cost": cost}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--runs", type=int, default=3, help="rounds: runs per cell (default 3)")
    ap.add_argument("--windows", default="1,2,5", help="window lengths in seconds (default 1,2,5)")
    ap.add_argument("--rates", default="2,5,10", help="samples per second (default 2,5,10)")
    ap.add_argument("--cost-window", type=float, default=5.0,
                    help="the window (and unobserved interval) the cost is measured over (default 5)")
    ap.add_argument("--cost-rates", default="5,10,20", help="rates the cost is measured at (default 5,10,20)")
    ap.add_argument("--save", help="write every run as JSON to this file")
    args = ap.parse_args()
    try:
        args.windows = sorted({float(x) for x in args.windows.split(",") if x.strip()})
        args.rates = sorted({float(x) for x in args.rates.split(",") if x.strip()})
        args.cost_rates = sorted({float(x) for x in args.cost_rates.split(",") if x.strip()})
    except ValueError as e:
        ap.error(str(e))
    if (args.runs < 1 or not args.windows or not args.rates or args.cost_window < 2 * TAIL_S + 1
            or any(w <= 0 for w in args.windows) or any(r <= 0 or r > 20 for r in args.rates + args.cost_rates)):
        ap.error("--runs ≥ 1, windows > 0, rates in (0, 20], --cost-window ≥ 2")
    return args


def measure(args, work: Path, t0: float, jobs: List[Job]) -> None:
    mldiag = shutil.which("mldiag", path=os.path.dirname(sys.executable)) or "mldiag"
    env = bytecode_env(dict(os.environ, MLDIAG_CACHE_DIR=str(work / "cache")), work / "pycache")
    cells: Dict[tuple, Cell] = {}
    loads = [os.getloadavg()[0]]
    for name, slow in JOBS:
        kinds = [(0, 0)] + [(w, r) for w in args.windows for r in args.rates]
        kinds += [(args.cost_window, r) for r in args.cost_rates if (args.cost_window, r) not in kinds]
        row = [Cell(name, w, r) for w, r in kinds] + [Cell(name, None, None, args.cost_window)]
        for c in row:
            cells[(name, c.window, c.rate)] = c
        job = Job(work, name, slow)
        jobs.append(job)
        job.start()
        print(f"{name} job up ({time.monotonic() - t0:.0f}s): ranks {job.ranks}; {len(row)} runs a round, "
              f"load {load_avg()}", file=sys.stderr, flush=True)
        for c in (row[0], row[1]):              # warm-up: page cache, first reads; checked
            run_cell(c, job, mldiag, env, -1)
            c.runs.clear()
        for rnd in range(args.runs):
            shift = rnd * len(row) // args.runs
            for c in row[shift:] + row[:shift]:  # rotate: no fixed neighbours
                run_cell(c, job, mldiag, env, rnd)
            loads.append(os.getloadavg()[0])
            print(f"{name} round {rnd + 1}/{args.runs} done ({time.monotonic() - t0:.0f}s, load {load_avg()})",
                  file=sys.stderr, flush=True)
        job.stop()
    text, figures = report(cells, args, loads)
    print(text)
    if args.save:
        Path(args.save).write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpus": os.cpu_count(), "loads": loads,
            "step_s": STEP_S, "extra_s": EXTRA_S, "slow_rank": SLOW, **figures,
            "runs": [{"job": c.job, "window": c.window, "rate": c.rate, "runs": c.runs}
                     for c in cells.values()]}, indent=1))


def main() -> int:
    args = parse_args()

    def on_term(signum, frame):
        raise KeyboardInterrupt
    # NOTE: explicit, also for SIGINT: a shell starts background jobs with SIGINT ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_term)

    def teardown(jobs: List[Job]) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):   # a second Ctrl-C must not skip the cleanup
            signal.signal(sig, signal.SIG_IGN)
        for job in jobs:
            job.stop()

    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="mldiag-stragglers-"))
    jobs: List[Job] = []
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(lambda: print(f"cleaned up ({time.monotonic() - t0:.0f}s in all)", file=sys.stderr))
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        cleanup.callback(teardown, jobs)
        try:
            measure(args, work, t0, jobs)
            return 0
        except KeyboardInterrupt:
            kill_current()
            print("\ninterrupted: cleaning up", file=sys.stderr)
            return 130
        except BenchError as e:
            print(f"bench failed: {e}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
