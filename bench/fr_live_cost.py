#!/usr/bin/env python3
"""What asking a running job for its flight recorder costs the job (issue 33 item 3): a 4-rank
gloo job here (torchrun, CPU torch), each rank serving torch's worker server on a TCP port
(the per-rank half of torch.distributed.debug.start_debug_server) with a full recorder (2000
entries, torch's default size, filled before timing), stepping STEP_S of sleep then an
all_reduce. Rounds alternate, order rotating: the job left alone for --seconds, and the job while
every rank is asked (scripts/flight_recorder.py live_dump, as stacks asks) --rate times a second.
Prints the steps/s of each, their ratio (alone / asked; 1.00 = no cost) and the time one answer
takes, min/median/max over the rounds.

    flock /tmp/mldiag-lab.lock .venv/bin/python bench/fr_live_cost.py [--rounds 3] [--seconds 8]
                                                                   [--rate 10] [--save FILE]
"""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "diagnostics" / "scripts"))
import flight_recorder as fr  # noqa: E402

JOB = r'''
import os, sys, time, torch, torch.distributed as dist
from torch._C._distributed_c10d import _WorkerServer
dist.init_process_group("gloo")
server = _WorkerServer("::", 0)
rank, t = dist.get_rank(), torch.zeros(4)
for _ in range(2100):                    # the recorder full: 2000 entries, torch's default
    dist.all_reduce(t)
log = open(sys.argv[1] + str(rank), "w", buffering=1)
os.write(1, b"ready\n")
while True:
    time.sleep(float(os.environ.get("STEP_S", "0.05")))
    t.fill_(1.0 if rank == 0 and os.path.exists(sys.argv[2]) else 0.0)
    dist.all_reduce(t)
    log.write("%.6f\n" % time.monotonic())
    if t[0].item() > 0:
        break
server.shutdown()
os._exit(0)
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def steps_between(log, t0, t1):
    stamps = [float(x) for x in log.read_text().split()]
    inside = [s for s in stamps if t0 <= s <= t1]
    return (len(inside) - 1) / (inside[-1] - inside[0]) if len(inside) > 2 else float("nan")


def ranks_of(torchrun_pid):
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    children = {}
    for line in out.splitlines():
        pid, ppid = (int(x) for x in line.split())
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [torchrun_pid]
    while todo:
        for c in children.get(todo.pop(), []):
            todo.append(c)
            try:
                env = open(f"/proc/{c}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if any(e.startswith(b"RANK=") for e in env):
                found.append(c)
    return sorted(found)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--save")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mldiag-fr-cost-"))
    (work / "job.py").write_text(JOB)
    stop = work / "stop"
    torchrun = Path(sys.executable).with_name("torchrun")
    job = subprocess.Popen([str(torchrun), "--nproc-per-node", "4", "--master-port", str(free_port()),
                            str(work / "job.py"), str(work / "steps"), str(stop)],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1", TORCH_FR_BUFFER_SIZE="2000"))
    rows = {"alone": [], "asked": [], "answer_ms": [], "entries": set()}
    try:
        ready = 0
        while ready < 4:
            line = job.stdout.readline()
            if not line:
                raise SystemExit("the job ended before it was ready")
            ready += line.strip() == b"ready"
        time.sleep(1.0)
        ranks = ranks_of(job.pid)
        envs = {pid: {} for pid in ranks}
        log = work / "steps0"
        for n in range(args.rounds):
            for mode in (("alone", "asked") if n % 2 == 0 else ("asked", "alone")):
                t0 = time.monotonic()
                end = t0 + args.seconds
                while time.monotonic() < end:
                    if mode == "asked":
                        tick = time.monotonic()
                        for pid in ranks:
                            a = time.monotonic()
                            got = fr.live_dump(pid, envs[pid], None)
                            rows["answer_ms"].append((time.monotonic() - a) * 1000)
                            assert got is not None and "error" not in got, got
                            rows["entries"].add(got["entries_total"])
                        time.sleep(max(0.0, 1.0 / args.rate - (time.monotonic() - tick)))
                    else:
                        time.sleep(0.05)
                rows[mode].append(steps_between(log, t0 + 0.5, end))
    finally:
        stop.touch()
        try:
            job.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        for pid in ranks_of(job.pid) if job.poll() is None else []:
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
    ratios = [a / b for a, b in zip(rows["alone"], rows["asked"])]

    def mmm(xs):
        return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"
    print(f"recorder entries per answer: {sorted(rows['entries'])}")
    print(f"steps/s alone     {mmm(rows['alone'])}")
    print(f"steps/s asked     {mmm(rows['asked'])}   ({args.rate:g} asks/s of each of 4 ranks)")
    print(f"ratio alone/asked {mmm(ratios)}")
    print(f"one answer, ms    {mmm(rows['answer_ms'])}")
    if args.save:
        Path(args.save).write_text(json.dumps({"alone": rows["alone"], "asked": rows["asked"], "ratios": ratios,
                                               "answer_ms": rows["answer_ms"], "rate": args.rate}, indent=1))


if __name__ == "__main__":
    main()
