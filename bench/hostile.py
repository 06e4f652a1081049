#!/usr/bin/env python3
"""Hostile-target bench (issue 10 item 7): the client's peak RSS and CPU whatever a target sends.

    .venv/bin/python bench/hostile.py [--quick] [--ssh]

Each case runs the client (``runner.run_one``) in a fresh process against a target whose
``python:`` is tests/fixtures/hostile/python — a fake interpreter that reads mldiag's payload like
the runtime, then answers with noise: 1 MB, 100 MB and 1 GB on stdout or stderr before a good
frame, 20,000 and 200,000 frame-begin markers, a frame over the size limit, 100,000-deep
nesting.  The target is local (``local: true``, a child process, no lab needed); with ``--ssh``
the same cases also run through the test lab's sshd (root needed).  Prints one row per case:
the client's own CPU (user+sys, the target's excluded), its peak RSS, wall time and the row it
produced.  CPU and RSS are the whole client process's (the baseline row is its imports);
wall is the run alone.  Flat is the goal: the client keeps a bounded head and tail per stream
(diagnostics/core/wire.py: STDOUT_*/STDERR_*) and scans frames in linear time.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOSTILE = REPO / "tests" / "fixtures" / "hostile" / "python"
MB = 1000 * 1000

CASES = [
    ("baseline (good frame)", "ok", {}),
    ("stdout 1 MB", "stdout-flood", {"HOSTILE_BYTES": 1 * MB}),
    ("stdout 100 MB", "stdout-flood", {"HOSTILE_BYTES": 100 * MB}),
    ("stdout 1 GB", "stdout-flood", {"HOSTILE_BYTES": 1000 * MB}),
    ("stderr 1 MB", "stderr-flood", {"HOSTILE_BYTES": 1 * MB}),
    ("stderr 100 MB", "stderr-flood", {"HOSTILE_BYTES": 100 * MB}),
    ("stderr 1 GB", "stderr-flood", {"HOSTILE_BYTES": 1000 * MB}),
    ("20,000 begin markers", "marker-flood", {"HOSTILE_COUNT": 20000}),
    ("200,000 begin markers", "marker-flood", {"HOSTILE_COUNT": 200000}),
    ("200,000 markers, then a frame", "marker-flood-then-ok", {"HOSTILE_COUNT": 200000}),
    ("frame of 17 MB (over the limit)", "huge-frame", {"HOSTILE_BYTES": 17 * 2**20}),
    ("100,000-deep nesting", "deep", {}),
]
QUICK = {"baseline (good frame)", "stdout 1 MB", "stdout 100 MB", "stderr 100 MB",
         "20,000 begin markers", "100,000-deep nesting"}

# Runs in the measured process: one target, one result, then its own rusage.
CLIENT = r"""
import json, resource, sys, time
from diagnostics.builtin import BUILTIN
from diagnostics.engine import bundle, registry, runner
registry.use(BUILTIN)
from diagnostics.transport.ssh import SshPool
from diagnostics.inventory.topology import Target, load
spec = json.loads(sys.argv[1])
env = tuple(sorted(spec["env"].items()))
if spec["hosts"]:
    from dataclasses import replace
    target = replace(load(spec["hosts"]).targets["hostile"], env=env)
else:
    target = Target(name="hostile", local=True, python=spec["python"], env=env)
t0 = time.monotonic()
r = runner.run_one(target, bundle.script_job("ping"), SshPool())
wall = time.monotonic() - t0
u = resource.getrusage(resource.RUSAGE_SELF)
# NOTE: VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve (a vfork'd child reports its
# parent's peak); VmHWM belongs to this process's own memory map
with open("/proc/self/status") as f:
    hwm_kib = int(next(l.split()[1] for l in f if l.startswith("VmHWM:")))
print(json.dumps({"cpu": u.ru_utime + u.ru_stime, "rss_mib": hwm_kib / 1024, "wall": wall,
                  "row": r.status + (" " + r.error.layer if r.error else "")}))
"""


CLIENT_REPO = [REPO]   # the checkout whose `diagnostics` the client imports (--client-repo)


def measure(mode: str, env: dict, hosts: str = "") -> dict:
    spec = {"python": str(HOSTILE), "env": {"HOSTILE_MODE": mode, **{k: str(v) for k, v in env.items()}},
            "hosts": hosts}
    proc = subprocess.run([sys.executable, "-c", CLIENT, json.dumps(spec)], capture_output=True,
                          text=True, cwd=CLIENT_REPO[0], env=dict(os.environ, PYTHONPATH=str(CLIENT_REPO[0])),
                          timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"client failed on {mode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_cases(title: str, cases, hosts: str = "") -> None:
    print(f"\n{title}", flush=True)
    print(f"{'case':34} {'client CPU s':>12} {'peak RSS MiB':>13} {'wall s':>8}  row")
    for name, mode, env in cases:
        m = measure(mode, env, hosts)
        print(f"{name:34} {m['cpu']:12.2f} {m['rss_mib']:13.1f} {m['wall']:8.2f}  {m['row']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the 1 GB and 200,000-marker cases")
    ap.add_argument("--ssh", action="store_true", help="also through the test lab's sshd (root)")
    ap.add_argument("--client-repo", type=Path, default=REPO,
                    help="measure another checkout's client (e.g. one before issue 10)")
    ap.add_argument("--only", default="", help="comma-separated case names (substrings)")
    args = ap.parse_args()
    CLIENT_REPO[0] = args.client_repo.resolve()
    cases = [c for c in CASES if not args.quick or c[0] in QUICK]
    if args.only:
        cases = [c for c in cases if any(o in c[0] for o in args.only.split(","))]
    run_cases(f"local target (a child process); client: {CLIENT_REPO[0]}", cases)
    if args.ssh:
        sys.path.insert(0, str(REPO))
        from tests.lab import Lab
        lab = Lab.start(strict=False)
        try:
            hosts = lab.hosts_yaml(f"hosts:\n  hostile:\n    address: main\n    python: {lab.hostile_dir / 'python'}\n")
            os.environ["MLDIAG_SSH_CONFIG"] = str(lab.ssh_config)
            run_cases("ssh target (the lab's sshd on 127.0.0.2, user mlsh)", cases, str(hosts))
        finally:
            lab.close()


if __name__ == "__main__":
    main()
