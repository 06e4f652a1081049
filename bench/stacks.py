#!/usr/bin/env python3
"""stacks on a real hung 4-rank gloo job (issue 13 item 6: ≤ 2 s end to end), by collector,
next to `ping` over the same chain measured in the same run.

    sudo .venv/bin/python bench/stacks.py [--runs 7]

Starts tests/fixtures/stacks/hung_gloo_job.py with torchrun (4 ranks on this machine, CPU torch)
and the test lab (for the `main` sshd), then times, alternating so drift hits every command alike:
  ping          mldiag ping -H box                     (ssh main → sudo, no diagnostic: the floor)
  py-spy        mldiag stacks -H box --py-spy PATH     (py-spy already on the target)
  shipped       mldiag stacks -H box                   (none there: mldiag ships its own, 8 MB)
  stdlib        mldiag stacks -H box --no-upload       (the standard-library reader)
  local         mldiag stacks -H local --py-spy PATH   (no transport at all)
and prints medians, ratios against `ping`, and what the target spent per process by collector
(data.processes[].seconds of the last run). Needs root (the lab makes users and sshds).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import REPO, BenchError, bytecode_env, timed  # noqa: E402
from tests.lab import Lab  # noqa: E402

JOB = REPO / "tests" / "fixtures" / "stacks" / "hung_gloo_job.py"


def start_job(work: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = work / "job.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "4",
                                 "--master-port", str(port), str(JOB)], stdout=out,
                                stderr=subprocess.STDOUT, cwd=str(work), start_new_session=True)
    end = time.monotonic() + 240
    while log.read_text(errors="replace").count("warm ") < 4:
        if proc.poll() is not None or time.monotonic() > end:
            raise SystemExit(f"the job did not start:\n{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)
    time.sleep(1.0)
    return proc


def run(argv, env):
    try:
        sample = timed(argv, None, env, str(REPO), check=False)
    except BenchError as e:
        raise SystemExit(str(e))
    if sample.returncode not in (0, 1, 2):
        raise SystemExit(f"{' '.join(argv[1:4])} exited {sample.returncode}:\n"
                         f"{sample.stderr.decode(errors='replace')[-1500:]}")
    return sample


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    mldiag = shutil.which("mldiag", path=os.path.dirname(sys.executable)) or "mldiag"
    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if not spy:
        raise SystemExit("py-spy is not installed (pip install -e '.[stacks]')")
    lab = Lab.start(strict=False)
    work = Path(tempfile.mkdtemp(prefix="mldiag-bench-"))
    job = None
    try:
        lab_spy = lab.dir / "py-spy"          # where the lab's users may run it
        shutil.copyfile(spy, lab_spy)
        lab_spy.chmod(0o755)
        cfg = work / "ssh_config"
        cfg.write_text(f"Include {lab.ssh_config}\n\nHost *\n  IdentityFile {lab.identity}\n"
                       f"  UserKnownHostsFile {lab.known_hosts}\n  StrictHostKeyChecking yes\n")
        hosts = work / "hosts.yaml"
        hosts.write_text("hosts:\n  box: {address: main, become: sudo, python: /usr/bin/python3}\n")
        env = bytecode_env(dict(os.environ, MLDIAG_SSH_CONFIG=str(cfg), MLDIAG_HOSTS_FILE=str(hosts)),
                           work / "pycache")
        job = start_job(work)
        cases = {
            "ping": [mldiag, "ping", "-H", "box"],
            "py-spy": [mldiag, "stacks", "-H", "box", "--py-spy", str(lab_spy), "--json"],
            "shipped": [mldiag, "stacks", "-H", "box", "--json"],
            "stdlib": [mldiag, "stacks", "-H", "box", "--no-upload", "--json"],
            "local": [mldiag, "stacks", "-H", "local", "--py-spy", spy, "--json"],
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
        print(f"stacks on a hung 4-rank gloo job, median of {args.runs} runs "
              f"(load avg {os.getloadavg()[0]:.2f})")
        print(f"{'command':<9} {'median s':>9} {'min s':>7} {'max s':>7} {'× ping':>7}  on the target per process (s)")
        for name, values in times.items():
            med = statistics.median(values)
            per = ""
            if name != "ping":
                doc = json.loads(last[name].stdout)[0]
                procs = doc["data"]["processes"]
                seconds = [p.get("seconds") or 0.0 for p in procs]
                per = (f"  {doc['data']['collector']}: {len(procs)} ranks, "
                       + " ".join(f"{s:.3f}" for s in seconds))
            print(f"{name:<9} {med:9.3f} {min(values):7.3f} {max(values):7.3f} {med / floor:7.2f}{per}")
    finally:
        if job is not None:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
        lab.close()


if __name__ == "__main__":
    main()
