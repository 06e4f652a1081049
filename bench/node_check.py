#!/usr/bin/env python3
"""node-check on a healthy capture-backed 8-GPU node: whole-process wall time, next to the
transport floor and gpu-status measured in the same run (issue 12 item 11: ≤ 3 s without DCGM).

    sudo .venv/bin/python bench/node_check.py [--runs 7]

Starts the test lab with its node-check CTs (tests/lab/nodecheck.py: CT 210 `h200-ok`, a fake
nvidia-smi answering from the H200 capture, the recorded /sys/class/infiniband tree and a PCIe
tree bind-mounted at their real paths, journalctl/dmesg stand-ins), reached as a real user
would: ssh → sudo → pct exec. Then times, alternating so drift hits every command alike:
  ping        mldiag ping -H h200-ok                       (every layer, no diagnostic: the floor)
  gpu-status  mldiag gpu-status -H h200-ok
  node-check  mldiag node-check -H h200-ok --no-dcgm       (Xid, NVLink, fabric, PCIe, IB)
  node-dcgm   mldiag node-check -H h200-ok                 (with the fake dcgmi's level-1 run)
and prints medians, ratios against `ping`, and node-check's own on-target check times (the
`data.checks` seconds of the last run). Needs root (the lab makes users, netns, LXC).
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import REPO, BenchError, bytecode_env, timed  # noqa: E402
from tests.lab import Lab  # noqa: E402
from tests.programs import PCT_HOSTS_HEAD  # noqa: E402

EXPECT = {"gpus": 8, "ib_ports": 8, "ib_rate": 400, "nvlinks_per_gpu": 18, "pcie_width": 16,
          "pcie_gen": 5}
HOSTS = PCT_HOSTS_HEAD + """\
      h200-ok: %s
""" % json.dumps({"runtime": "pct", "id": "210", "python": "/usr/bin/python3", "expect": EXPECT,
                  "env": {"MLDIAG_FAKE_NVIDIA_SMI": "derived__h200x8__healthy"}})


def run(argv, env):
    """One timed run; exit 0 or 1 (the fake node is healthy, a warn is an info-level hint)."""
    try:
        sample = timed(argv, None, env, str(REPO), check=False)
    except BenchError as e:
        raise SystemExit(str(e))
    if sample.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv[1:4])} exited {sample.returncode}:\n"
                         f"{sample.stdout.decode(errors='replace')[-1500:]}"
                         f"{sample.stderr.decode(errors='replace')[-1500:]}")
    return sample


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    lab = Lab.start(strict=False)
    work = tempfile.mkdtemp(prefix="mldiag-bench-")
    try:
        lab.node_check_cts()
        cfg = os.path.join(work, "ssh_config")
        with open(cfg, "w") as f:
            f.write(f"Include {lab.ssh_config}\n\nHost *\n  IdentityFile {lab.identity}\n"
                    f"  UserKnownHostsFile {lab.known_hosts}\n  StrictHostKeyChecking yes\n")
        hosts = os.path.join(work, "hosts.yaml")
        with open(hosts, "w") as f:
            f.write(HOSTS)
        env = bytecode_env(dict(os.environ, MLDIAG_SSH_CONFIG=cfg, MLDIAG_HOSTS_FILE=hosts),
                           Path(work) / "pycache")
        mldiag = shutil.which("mldiag", path=os.path.dirname(sys.executable)) or "mldiag"
        cases = {
            "ping": [mldiag, "ping", "-H", "h200-ok"],
            "gpu-status": [mldiag, "gpu-status", "-H", "h200-ok"],
            "node-check": [mldiag, "node-check", "-H", "h200-ok", "--no-dcgm", "--json"],
            "node-dcgm": [mldiag, "node-check", "-H", "h200-ok", "--json"],
        }
        for argv in cases.values():            # warm-up: page cache, first ssh -G
            run(argv, env)
        times = {name: [] for name in cases}
        last = {}
        for _ in range(args.runs):
            for name, argv in cases.items():
                sample = run(argv, env)
                times[name].append(sample.wall)
                last[name] = sample
        floor = statistics.median(times["ping"])
        print(f"node-check on CT 210 h200-ok (ssh → sudo → pct), median of {args.runs} runs "
              f"(load avg {os.getloadavg()[0]:.2f})")
        print(f"{'command':<12} {'median s':>9} {'min s':>7} {'max s':>7} {'× ping':>7}")
        for name, values in times.items():
            med = statistics.median(values)
            print(f"{name:<12} {med:9.3f} {min(values):7.3f} {max(values):7.3f} {med / floor:7.2f}")
        for name in ("node-check", "node-dcgm"):
            doc = json.loads(last[name].stdout)[0]
            checks = doc["data"]["checks"]
            shown = ", ".join(f"{check} {info['seconds']:.3f}" for check, info in checks.items())
            print(f"{name} on the target, last run: status {doc['status']}, "
                  f"checks (s): {shown}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        lab.close()


if __name__ == "__main__":
    main()
