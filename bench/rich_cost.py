#!/usr/bin/env python3
"""What rich would cost mldiag's start-up (docs/terminal-output.md), in one run.

    .venv/bin/python bench/rich_cost.py [--runs 40]

Times fresh interpreters, alternating so drift hits every command alike:
  pass        python -c pass                                   (the interpreter alone)
  mldiag      mldiag hosts -H local                            (start-up, hosts.yaml, print; no connection)
  mldiag+rich the same with rich.console, rich.table, rich.live imported first
and reads ``python -X importtime`` for rich's own share (alone, and after mldiag's imports).
Needs rich installed (it is not a dependency); no lab, no root.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAIN = "from diagnostics.cli.entry import main; main()"
RICH = "import rich.console, rich.table, rich.live"
CASES = {
    "pass": ["-c", "pass"],
    "mldiag": ["-c", MAIN, "hosts", "-H", "local"],
    "mldiag+rich": ["-c", f"{RICH}; {MAIN}", "hosts", "-H", "local"],
}


def env():
    return dict(os.environ, PYTHONPATH=str(REPO), MLDIAG_HOSTS_FILE=str(REPO / "hosts.yaml"))


def importtime_ms(code, modules):
    """Cumulative import time of ``modules`` (ms) as ``-X importtime`` reports it for ``code``."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True,
                         text=True, env=env(), check=True).stderr
    return sum(int(re.search(r"\|\s*(\d+) \|\s+%s$" % re.escape(m), err, re.M).group(1))
               for m in modules) / 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=40)
    runs = ap.parse_args().runs
    wall = {name: [] for name in CASES}
    for _ in range(runs):
        for name, argv in CASES.items():
            t0 = time.perf_counter()
            subprocess.run([sys.executable] + argv, env=env(), check=True, stdout=subprocess.DEVNULL)
            wall[name].append(time.perf_counter() - t0)
    for name, times in wall.items():
        print(f"{name:12s} median {statistics.median(times) * 1000:6.1f} ms  min {min(times) * 1000:6.1f} ms")
    base, rich = statistics.median(wall["mldiag"]), statistics.median(wall["mldiag+rich"])
    print(f"rich adds {1000 * (rich - base):.0f} ms ({100 * (rich / base - 1):.0f} %) to mldiag's start-up")
    rich_mods = ["rich.console", "rich.table", "rich.live"]
    n = max(5, runs // 4)
    print("importtime medians over %d runs:" % n)
    for label, code, mods in (
            ("diagnostics.cli.program", "import diagnostics.cli.program", ["diagnostics.cli.program"]),
            ("rich alone", RICH, rich_mods),
            ("rich after mldiag's imports", f"import diagnostics.cli.program; {RICH}", rich_mods)):
        print(f"  {label:28s} {statistics.median(importtime_ms(code, mods) for _ in range(n)):6.1f} ms")
    before = subprocess.run([sys.executable, "-c", "import sys, diagnostics.cli.program; a = set(sys.modules); "
                             f"{RICH}; print(len(set(sys.modules) - a))"], env=env(), check=True,
                            capture_output=True, text=True).stdout.strip()
    print(f"modules rich adds after mldiag's imports: {before}")


if __name__ == "__main__":
    main()
