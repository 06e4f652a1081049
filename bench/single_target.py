#!/usr/bin/env python3
"""One loopback target: whole-process wall time of mldiag next to raw OpenSSH, in one run.

    sudo .venv/bin/python bench/single_target.py [--runs 9]

Starts the test lab (tests/lab: a real sshd on 127.0.0.2, user mlsh, /bin/sh login shell),
then times, alternating so drift hits every command alike:
  ssh       ssh -F CFG main python3 - < script          (the streaming floor)
  ssh-c25519  the same with -o KexAlgorithms=curve25519-sha256
  mldiag    mldiag run-script script -H main              (console script)
  inv       inv run-script script -H main                 (from the repository)
  gpu       mldiag gpu-status -H main                     (fake nvidia-smi on the lab PATH)
and prints medians and ratios against `ssh`. Needs root (the lab makes users, netns, LXC).
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import PROBE as SCRIPT, REPO, BenchError, bytecode_env, timed as _timed  # noqa: E402
from tests.lab import Lab  # noqa: E402


def timed(argv, stdin_path=None, env=None, cwd=None):
    try:
        return _timed(argv, stdin_path, env, cwd).wall
    except BenchError as e:
        raise SystemExit(str(e))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    lab = Lab.start(strict=False)
    work = tempfile.mkdtemp(prefix="mldiag-bench-")
    try:
        cfg = os.path.join(work, "ssh_config")
        with open(cfg, "w") as f:
            f.write(f"Include {lab.ssh_config}\n\nHost *\n  IdentityFile {lab.identity}\n"
                    f"  UserKnownHostsFile {lab.known_hosts}\n  StrictHostKeyChecking yes\n")
        script = os.path.join(work, "probe.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        hosts = os.path.join(work, "hosts.yaml")
        with open(hosts, "w") as f:
            f.write("hosts:\n  main: {}\n")
        env = bytecode_env(dict(os.environ, MLDIAG_SSH_CONFIG=cfg, MLDIAG_HOSTS_FILE=hosts),
                           Path(work) / "pycache")
        bindir = os.path.dirname(sys.executable)
        mldiag = shutil.which("mldiag", path=bindir) or "mldiag"
        inv = shutil.which("inv", path=bindir) or "inv"
        cases = {
            "ssh": (["ssh", "-F", cfg, "main", "python3", "-"], script),
            "ssh-c25519": (["ssh", "-F", cfg, "-o", "KexAlgorithms=curve25519-sha256", "main",
                            "python3", "-"], script),
            "mldiag": ([mldiag, "run-script", script, "-H", "main"], None),
            "inv": ([inv, "run-script", script, "-H", "main"], None),
            "gpu": ([mldiag, "gpu-status", "-H", "main"], None),
        }
        times = {name: [] for name in cases}
        for name, (argv, stdin) in cases.items():   # warm-up: page cache, first ssh -G
            timed(argv, stdin, env, REPO)
        for _ in range(args.runs):
            for name, (argv, stdin) in cases.items():
                times[name].append(timed(argv, stdin, env, REPO))
        floor = statistics.median(times["ssh"])
        print(f"one loopback target, median of {args.runs} runs (load avg {os.getloadavg()[0]:.2f})")
        print(f"{'command':<12} {'median s':>9} {'min s':>7} {'× ssh':>6}")
        for name, values in times.items():
            med = statistics.median(values)
            print(f"{name:<12} {med:9.3f} {min(values):7.3f} {med / floor:6.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        lab.close()


if __name__ == "__main__":
    main()
