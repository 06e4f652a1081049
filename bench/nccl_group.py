#!/usr/bin/env python3
"""nccl-check --across on a group of 2, 4 and 8 nodes next to the same all-reduce started by hand
with torchrun over ssh: mldiag's coordination overhead, as a ratio, measured in the same run.

    flock /tmp/mldiag-lab.lock .venv/bin/python bench/nccl_group.py [--runs 5] [--sizes 2,4,8]
                                                                    [--save FILE]     (as root)

Starts the test lab without its containers and Slurm (tests/lab: MLDIAG_LAB_SKIP) and its fleet:
network namespaces on one bridge, an sshd in each (servers f1..f8; the fleet is grown to the
largest size for this run only, tests/lab/lab.py's FLEET_NODES stays as the tests need it).
Each node's interpreter is this venv's (through tests/programs.py's space_free_python(), as the
lab's tests name it), with torch; the ranks are gloo on the CPU, one per node, meeting at f1's
address over the bridge (GLOO_SOCKET_IFNAME=eth0 on both sides). Per size N it times, whole
process, rotating the order every round so that drift hits every command alike:
  torchrun   bash: one `ssh -F CFG ADDR 'env GLOO_SOCKET_IFNAME=eth0 torchrun --nnodes N
             --node-rank K --master-addr F1 --master-port P --nproc-per-node 1 allreduce.py ...' &`
             per node, then `wait` (P random per run, in nccl-check's range); allreduce.py is
             nccl_check.py's torch worker for all-reduce on gloo, as a user would write it for
             torchrun (env://): the same sizes, warm-up and timed iterations, each size's time the
             slowest rank's
  mldiag     mldiag nccl-check --across -H f1,...,fN --hosts-file H --json --valid-for 0
             --max-bytes B --iters I
and two floors (--no-floors skips them): `ssh` (one `ssh ADDR true` per node, in parallel) and
`import torch` (one `ssh ADDR PYTHON -c 'import torch'` per node, in parallel). Prints per size
the median, min and max wall seconds, the client's and the targets' CPU seconds, the ratio of
mldiag's median to torchrun's and the median (and range) of the per-round ratios. The warm-up
run and every timed run are checked: mldiag's N rows all ok, each reporting the N-node group;
torchrun's rank 0 printed its rows. The lab is torn down whatever happens, also on Ctrl-C.

Hold `flock /tmp/mldiag-lab.lock` around it, as around the lab tests: one lab user at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (REPO, BenchError, Sample, bytecode_env, children_cpu, kill_current,  # noqa: E402
                    load_avg, timed)
from tests.lab import Lab  # noqa: E402
from tests.lab import lab as lab_module  # noqa: E402
from tests.lab.util import LabError, LabUnavailable  # noqa: E402
from tests.programs import space_free_python  # noqa: E402

# The parts of the lab this bench does not use: they start slower than all the rest together.
SKIP_PARTS = ("lxc", "podman", "slurm")
SETTLE_S = 60.0              # the longest wait for the targets to be idle again between commands
PORTS = (29500, 39500)       # where nccl-check's groups meet (diagnostics/engine/groups.py)
MIB = 1024 ** 2
REFERENCE = "torchrun"
MLDIAG = "mldiag"

# nccl_check.py's worker() for all-reduce on gloo, written for torchrun (env://): every size
# from MIN to MAX, doubling; WARMUP runs, a barrier, ITERS timed runs, the slowest rank's time.
ALLREDUCE = '''\
import datetime, json, sys, time
import torch
import torch.distributed as dist

min_bytes, max_bytes, warmup, iters = (int(a) for a in sys.argv[1:5])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))
rows, size = [], max(4, min_bytes - min_bytes % 4)
while size <= max_bytes:
    x = torch.ones(size // 4, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(x)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    took = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    rows.append({"size": size, "time_us": took.item() * 1e6})
    size *= 2
if dist.get_rank() == 0:
    print(json.dumps({"world": dist.get_world_size(), "rows": rows}), flush=True)
dist.destroy_process_group()
'''


def nccl_defaults() -> argparse.Namespace:
    """nccl_check.py's own defaults (--min-bytes, --warmup): the reference uses the same."""
    scripts = str(REPO / "diagnostics" / "scripts")
    sys.path.insert(0, scripts)
    try:
        import nccl_check
    finally:
        sys.path.remove(scripts)
    return nccl_check.build_parser().parse_args([])


class Case:
    def __init__(self, size: int, name: str, argv: Callable[[], List[str]],
                 check: Optional[Callable[[Sample], dict]] = None,
                 outdir: Optional[Path] = None):
        self.size, self.name, self.argv, self.check = size, name, argv, check
        self.outdir = outdir              # each node's output (torchrun)
        self.samples: List[Sample] = []
        self.target_cpu: List[float] = []
        self.busbw: List[float] = []      # GB/s the run measured (checked runs that report it)
        self.job_s: List[float] = []      # mldiag: the longest of its rows' duration_s
        self.tail_s: List[float] = []     # the targets' processes still running after it returned


def busbw(size: int, time_us: float, nodes: int) -> float:
    """nccl-tests' all-reduce busbw in GB/s: size / time x 2(n-1)/n."""
    return size / (time_us / 1e6) / 1e9 * 2 * (nodes - 1) / nodes


def check_mldiag(nodes: List[str]) -> Callable[[Sample], dict]:
    def check(sample: Sample) -> float:
        text = sample.stdout.decode(errors="replace")
        try:
            docs = json.loads(text)
        except ValueError:
            raise BenchError(f"mldiag printed no JSON (exit {sample.returncode}): {text[-800:]}"
                             f"{sample.stderr.decode(errors='replace')[-800:]}")
        rows = {d.get("target"): d for d in docs}
        bad = [f"{n}: {rows.get(n, {}).get('status')} {rows.get(n, {}).get('summary')}"
               for n in nodes if rows.get(n, {}).get("status") != "ok"]
        if bad or sample.returncode != 0:
            raise BenchError(f"mldiag nccl-check --across exited {sample.returncode}: {'; '.join(bad)}")
        groups = {(d["data"].get("group") or {}).get("nodes") for d in rows.values()}
        if groups != {len(nodes)}:
            raise BenchError(f"mldiag's rows report groups of {groups} nodes, not one of "
                             f"{len(nodes)}: is --across there?")
        return {"busbw": rows[nodes[0]]["data"]["rows"][-1]["busbw"],
                "job_s": max(d.get("duration_s") or 0.0 for d in rows.values())}
    return check


def check_torchrun(outdir: Path, nodes: int) -> Callable[[Sample], dict]:
    def check(sample: Sample) -> dict:
        text = (outdir / "0").read_text(errors="replace")
        for line in reversed(text.strip().splitlines()):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("world") == nodes and doc.get("rows"):
                row = doc["rows"][-1]
                return {"busbw": busbw(row["size"], row["time_us"], nodes)}
        raise BenchError(f"torchrun's rank 0 printed no rows: {text[-1500:]}")
    return check


def check_ok(_sample: Sample) -> dict:
    return {}


def parallel_ssh(cfg: Path, remotes: List[str], outdir: Optional[Path]) -> List[str]:
    """bash: one `ssh -F CFG ADDR REMOTE &` per (address, remote), each one's output to
    OUTDIR/K, then wait for each; exit 1 if any failed."""
    lines = ['pids=""']
    for k, (address, remote) in enumerate(remotes):
        out = shlex.quote(str(outdir / str(k))) if outdir else "/dev/null"
        lines.append(f"ssh -F {shlex.quote(str(cfg))} {shlex.quote(address)} {shlex.quote(remote)} "
                     f"< /dev/null > {out} 2>&1 & pids=\"$pids $!\"")
    lines.append('rc=0; for p in $pids; do wait "$p" || rc=1; done; exit $rc')
    return ["bash", "-c", "\n".join(lines)]


def build_cases(args, sizes: List[int], servers, cfg: Path, hosts: Path, work: Path, python: str,
                torchrun: List[str], script: Path, defaults) -> List[Case]:
    mldiag = shutil.which("mldiag", path=str(Path(sys.executable).parent)) or "mldiag"
    cases: List[Case] = []
    gloo = "env GLOO_SOCKET_IFNAME=eth0"
    for n in sizes:
        group = servers[:n]
        names = [s.name for s in group]
        addresses = [s.address for s in group]
        outdir = work / "out" / f"torchrun-{n}"
        outdir.mkdir(parents=True)

        def torchrun_argv(addresses=addresses, outdir=outdir, n=n) -> List[str]:
            port = random.randrange(*PORTS)          # a fresh one each run, as mldiag picks its own
            remotes = [(a, " ".join([gloo, *map(shlex.quote, torchrun),
                                     f"--nnodes {n} --node-rank {k} --master-addr {addresses[0]} "
                                     f"--master-port {port} --nproc-per-node 1",
                                     shlex.quote(str(script)), str(defaults.min_bytes),
                                     str(args.max_bytes), str(defaults.warmup), str(args.iters)]))
                       for k, a in enumerate(addresses)]
            return parallel_ssh(cfg, remotes, outdir)

        mldiag_argv = [mldiag, "nccl-check", "--across", "-H", ",".join(names), "--hosts-file",
                       str(hosts), "--json", "--valid-for", "0", "--max-bytes", str(args.max_bytes),
                       "--iters", str(args.iters)]
        cases.append(Case(n, REFERENCE, torchrun_argv, check_torchrun(outdir, n), outdir))
        cases.append(Case(n, MLDIAG, lambda argv=mldiag_argv: argv, check_mldiag(names)))
        if args.floors:
            ssh_true = parallel_ssh(cfg, [(a, "true") for a in addresses], None)
            imports = parallel_ssh(cfg, [(a, f"{shlex.quote(python)} -c 'import torch'")
                                         for a in addresses], None)
            cases.append(Case(n, "ssh", lambda argv=ssh_true: argv, check_ok))
            cases.append(Case(n, "import torch", lambda argv=imports: argv, check_ok))
    return cases


def settle(lab, timeout: float = SETTLE_S) -> float:
    """Seconds until no process started through the lab's sshds is left (a session, or a
    process that left its session: lab.session_processes()), at most ``timeout``; then the
    next command starts on idle targets and the listeners have reaped this one's sessions."""
    t0 = time.monotonic()
    while lab.session_processes() and time.monotonic() - t0 < timeout:
        time.sleep(0.05)
    return time.monotonic() - t0


def run_case(case: Case, env: Dict[str, str], lab, listeners: List[int]) -> None:
    cpu0 = children_cpu(listeners)
    sample = timed(case.argv(), None, env, str(REPO), timeout=300.0, check=False)
    tail = settle(lab)
    target_cpu = children_cpu(listeners) - cpu0
    if case.name != MLDIAG and sample.returncode != 0:
        said = "".join(f"--- node {f.name}:\n{f.read_text(errors='replace')[-1000:]}\n"
                       for f in sorted(case.outdir.iterdir())) if case.outdir else ""
        raise BenchError(f"{case.name} at {case.size} nodes exited {sample.returncode}:\n"
                         f"{sample.stderr.decode(errors='replace')[-1500:]}{said}")
    said = case.check(sample) if case.check else {}
    case.samples.append(sample)
    case.target_cpu.append(target_cpu)
    case.tail_s.append(tail)
    if "busbw" in said:
        case.busbw.append(said["busbw"])
    if "job_s" in said:
        case.job_s.append(said["job_s"])


def med(values):
    return statistics.median(values) if values else float("nan")


def report(cases: List[Case], args, loads: List[float], defaults) -> str:
    out = [f"nccl-check --across next to torchrun over ssh: whole-process wall time, {args.runs} "
           f"runs; all-reduce of {args.max_bytes} B (sizes from {defaults.min_bytes} B), "
           f"{defaults.warmup} warm-up + {args.iters} timed iterations, gloo on the CPU, one rank "
           f"per node; {os.cpu_count()} CPUs; 1-min load average {loads[0]:.2f} before the bench, "
           f"{min(loads[1:]):.2f}..{max(loads[1:]):.2f} after each round"]
    head = (f"{'nodes':>5} {'command':<13} {'median s':>8} {'min s':>7} {'max s':>7} "
            f"{'× torchrun':>10} {'cli CPU':>7} {'tgt CPU':>7} {'busbw GB/s':>10} {'rows s':>6} {'tail s':>6}")
    out += [head, "-" * len(head)]
    by_size: Dict[int, Dict[str, Case]] = {}
    for c in cases:
        by_size.setdefault(c.size, {})[c.name] = c
    for size, row in by_size.items():
        ref = med([s.wall for s in row[REFERENCE].samples])
        for c in row.values():
            walls = [s.wall for s in c.samples]
            bw = f"{med(c.busbw):10.3f}" if c.busbw else f"{'-':>10}"
            job = f"{med(c.job_s):6.2f}" if c.job_s else f"{'-':>6}"
            out.append(f"{size:>5} {c.name:<13} {med(walls):8.3f} {min(walls):7.3f} {max(walls):7.3f} "
                       f"{med(walls) / ref:10.2f} {med([s.cpu for s in c.samples]):7.2f} "
                       f"{med(c.target_cpu):7.2f} {bw} {job} {max(c.tail_s):6.2f}")
    out.append("")
    out.append("cli CPU: user+sys of the command's process tree here (os.wait4); tgt CPU: what the "
               "fleet sshds' finished sessions used (sshd, the shell, torchrun or mldiag's job, "
               "the ranks); medians, seconds. busbw: the all-reduce's, as nccl-tests reckons it. rows s: "
               "mldiag's longest row duration_s (a member's run as its client thread timed it). tail s: the longest a "
               "target's processes went on after the command returned (each command starts once "
               "the targets are idle).")
    out.append("mldiag / torchrun: the ratio of the medians; per round, the median (and range) of "
               "the ratios of the two runs timed in the same round")
    for size, row in by_size.items():
        m, r = row[MLDIAG], row[REFERENCE]
        paired = [a.wall / b.wall for a, b in zip(m.samples, r.samples)]
        extra = med([a.wall - b.wall for a, b in zip(m.samples, r.samples)])
        out.append(f"  {size} nodes: {med([s.wall for s in m.samples]) / med([s.wall for s in r.samples]):.2f}× "
                   f"torchrun; per round {med(paired):.2f}× ({min(paired):.2f}-{max(paired):.2f}); "
                   f"mldiag - torchrun per round {extra:+.2f} s (median)")
    return "\n".join(out)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--runs", type=int, default=5, help="timed runs per command (default 5)")
    ap.add_argument("--sizes", default="2,4,8", help="group sizes, comma list (default 2,4,8)")
    ap.add_argument("--max-bytes", type=int, default=MIB,
                    help="the largest all-reduce (default 1 MiB: one size, nccl-check's smallest)")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations of each size (default 5)")
    ap.add_argument("--no-floors", dest="floors", action="store_false",
                    help="skip the `ssh true` and `import torch` rows")
    ap.add_argument("--save", help="write every sample as JSON to this file")
    args = ap.parse_args()
    args.sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    if args.runs < 1 or not args.sizes or any(n < 2 for n in args.sizes):
        ap.error("--runs must be positive and every size 2 or more")
    return args


def measure(args, defaults, lab, work: Path, t0: float) -> None:
    """The lab's fleet, the files the commands read, the warm-up run and the timed rounds; the
    report on stdout (and --save)."""
    if "netns" in lab.unavailable:
        raise BenchError(f"the lab's fleet needs network namespaces: {lab.unavailable['netns']}")
    # this run's fleet as large as its largest group; the module's constant, read by
    # lab.fleet(), is what the lab's tests expect everywhere else
    lab_module.FLEET_NODES = max(lab_module.FLEET_NODES, max(args.sizes))
    servers = lab.fleet()
    os.chmod(work, 0o755)                 # the targets' sessions read the script
    script = work / "allreduce.py"
    script.write_text(ALLREDUCE)
    script.chmod(0o644)
    # as root on both sides: the venv's interpreter lives under /root, which the lab's other
    # users cannot read (the lab's tests go through `become: sudo` for it)
    cfg = work / "ssh_config"
    cfg.write_text(f"Include {lab.ssh_config}\n\nHost *\n  IdentityFile {lab.identity}\n"
                   f"  UserKnownHostsFile {lab.known_hosts}\n  StrictHostKeyChecking yes\n"
                   f"  BatchMode yes\n  User root\n")
    python = space_free_python()
    hosts = work / "hosts.yaml"
    hosts.write_text("defaults: {connect_timeout: 5, timeout: 240}\nhosts:\n" + "".join(
        f"  {s.name}: {{address: {s.address}, user: root, python: {python}, "
        "env: {GLOO_SOCKET_IFNAME: eth0}}\n" for s in servers))
    runner = Path(sys.executable).parent / "torchrun"
    torchrun = [str(runner)] if runner.exists() else [python, "-m", "torch.distributed.run"]
    env = bytecode_env(dict(os.environ, MLDIAG_SSH_CONFIG=str(cfg), MLDIAG_HOSTS_FILE=str(hosts),
                            MLDIAG_CACHE_DIR=str(work / "cache")), work / "pycache")
    env.pop("MLDIAG_LAB_SKIP", None)
    cases = build_cases(args, args.sizes, servers, cfg, hosts, work, python, torchrun, script, defaults)
    listeners = [s.pid for s in servers if s.pid]
    loads = [os.getloadavg()[0]]
    print(f"lab and a fleet of {len(servers)} up in {time.monotonic() - t0:.1f}s; {len(cases)} "
          f"commands x {args.runs} runs (+1 warm-up); load average {load_avg()}",
          file=sys.stderr, flush=True)
    for c in cases:                       # warm-up: page cache, first ssh -G; checks output
        run_case(c, env, lab, listeners)
        c.samples.clear(), c.target_cpu.clear(), c.busbw.clear(), c.job_s.clear(), c.tail_s.clear()
    for r in range(args.runs):
        for n in args.sizes:
            row = [c for c in cases if c.size == n]
            for c in row[r % len(row):] + row[:r % len(row)]:   # rotate: no fixed neighbours
                run_case(c, env, lab, listeners)
        loads.append(os.getloadavg()[0])
        print(f"run {r + 1}/{args.runs} done ({time.monotonic() - t0:.0f}s, load {load_avg()})",
              file=sys.stderr, flush=True)
    print(report(cases, args, loads, defaults))
    if args.save:
        Path(args.save).write_text(json.dumps([
            {"nodes": c.size, "command": c.name, "wall": [s.wall for s in c.samples],
             "cpu": [s.cpu for s in c.samples], "target_cpu": c.target_cpu, "busbw": c.busbw,
             "rows_s": c.job_s, "tail_s": c.tail_s}
            for c in cases], indent=1))


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        print("bench/nccl_group.py needs root (the test lab makes users and network namespaces)",
              file=sys.stderr)
        return 2
    defaults = nccl_defaults()
    if args.max_bytes < defaults.min_bytes:
        print(f"--max-bytes below nccl-check's smallest size ({defaults.min_bytes}): nothing "
              "would be measured", file=sys.stderr)
        return 2

    def on_term(signum, frame):
        raise KeyboardInterrupt
    # NOTE: explicit, also for SIGINT: a shell starts background jobs with SIGINT ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_term)

    def teardown(lab) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):   # a second Ctrl-C must not skip the cleanup
            signal.signal(sig, signal.SIG_IGN)
        if lab is not None:
            lab.close()                   # the fleet's sshds and namespaces too

    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="mldiag-nccl-group-"))
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(lambda: print(f"cleaned up ({time.monotonic() - t0:.0f}s in all)", file=sys.stderr))
        cleanup.callback(shutil.rmtree, work, ignore_errors=True)
        lab = None
        cleanup.callback(lambda: teardown(lab))
        try:
            skip = {p for p in os.environ.get("MLDIAG_LAB_SKIP", "").split(",") if p.strip()}
            os.environ["MLDIAG_LAB_SKIP"] = ",".join(sorted(skip | set(SKIP_PARTS)))
            lab = Lab.start(strict=False)
            measure(args, defaults, lab, work, t0)
            return 0
        except KeyboardInterrupt:
            kill_current()
            print("\ninterrupted: cleaning up", file=sys.stderr)
            return 130
        except (BenchError, LabError, LabUnavailable) as e:
            print(f"bench failed: {e}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
