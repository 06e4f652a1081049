#!/usr/bin/env python3
"""What asking for progress costs one target when there is no progress to show (issue 11 item 2).

    PYTHONPATH=$PWD .venv/bin/python bench/progress_cost.py [--runs 40]

Runs the `ping` diagnostic on the local target through the real runner, alternating runs without
progress (a pipe, --json: the header does not ask; nothing is set up) and with it (a terminal:
the runtime opens the log-record pipe, watches it, the client reads stdout through
wire.ProgressReader), and prints the median wall time of the whole run (in this process, no
interpreter start), plus how many progress records arrived (ping prints and logs nothing:
0 expected). A second pair does the same for a run-script that prints 200 lines, to show the
cost when there is something to show.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diagnostics.builtin import BUILTIN  # noqa: E402
from diagnostics.engine import bundle, registry, runner  # noqa: E402
from diagnostics.transport.ssh import SshPool  # noqa: E402
from diagnostics.inventory.topology import Target  # noqa: E402

registry.use(BUILTIN)

CHATTY = b"for i in range(200):\n    print('line', i)\n"


def one(job, progress: bool):
    records = []
    kw = {"on_progress": lambda name, rec: records.append(rec)} if progress else {}
    started = time.perf_counter()
    r = runner.run_one(Target(name="local", local=True, python=sys.executable), job, SshPool(), **kw)
    wall = time.perf_counter() - started
    assert r.status == "ok", r.to_dict()
    return wall, len([x for x in records if x is not None])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    jobs = {"ping": bundle.script_job("ping"),
            "run-script, 200 lines": bundle.Job("run-script", "chatty.py", CHATTY, mode="script")}
    print(f"local target, median of {args.runs} alternating runs (load avg {os.getloadavg()[0]:.2f})")
    print(f"{'job':<24} {'progress':<9} {'wall ms':>8} {'min ms':>8} {'records':>8}")
    for name, job in jobs.items():
        one(job, False)
        one(job, True)        # warm-up
        samples = {False: [], True: []}
        for _ in range(args.runs):
            for progress in (False, True):
                samples[progress].append(one(job, progress))
        for progress in (False, True):
            walls, counts = zip(*samples[progress])
            print(f"{name:<24} {'on' if progress else 'off':<9} {statistics.median(walls) * 1e3:8.1f} "
                  f"{min(walls) * 1e3:8.1f} {statistics.median(counts):8.0f}")


if __name__ == "__main__":
    main()
