#!/usr/bin/env python3
"""scan-log on hostile lines (issue 11 item 5): the time to scan a log of 64 KiB lines built to
make a backtracking "loss" pattern quadratic, by the scanner in this checkout and, with
``--against FILE``, by another version of diagnostics/scripts/scan_log.py (e.g. the one before
the NaN-loss formats: ``git show 38c46b2:diagnostics/scripts/scan_log.py > /tmp/old.py``).

    .venv/bin/python bench/scan_log_lines.py [--lines N] [--against /tmp/old.py]

Each case is a file of N identical lines (default 16); the scanner classifies each line on its
first and last 32 KiB (MAX_CLASSIFY), so 64 KiB is the worst a line can be. Prints seconds per
case, best of 3. Flat (milliseconds per line) is the goal: the NaN-loss key is matched as any
one word and tested for "loss" in code (scan_log.py, _NONFINITE_VALUE).
"""

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KIB = 1024

CASES = [
    ("word of 'loss' x 16384", "loss" * 16384),
    ("'loss ' x 13000", "loss " * 13000),
    ("'loss: ' x 10000", "loss: " * 10000),
    ("'loss=' + 64 KiB blanks", "loss=" + " " * (64 * KIB - 6) + "x"),
    ("'x is ' x 12000 + 'loss'", "x is " * 12000 + "loss"),
    ("'lossloss' x 8000 + ' loss=nan'", "lossloss" * 8000 + " loss=nan"),
    ("plain training line", "step 12 | loss=0.3120 | lr=1e-4 | grad_norm=1.2 " * 1200),
]


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, str(path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def best_of(mod, path: str, lines: int, tries: int = 3) -> float:
    import argparse as ap
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        mod.run(ap.Namespace(path=path, lines=lines + 10))
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=16)
    p.add_argument("--against", type=Path, help="another scan_log.py to time beside this one")
    args = p.parse_args()
    mods = [("this checkout", load(REPO / "diagnostics" / "scripts" / "scan_log.py", "scan_log_now"))]
    if args.against:
        mods.append((str(args.against), load(args.against, "scan_log_other")))
    print("%-34s %s" % ("case (%d lines each)" % args.lines, "  ".join("%18s" % n[-18:] for n, _ in mods)))
    with tempfile.TemporaryDirectory() as tmp:
        for label, line in CASES:
            path = os.path.join(tmp, "case.log")
            with open(path, "w") as f:
                f.write((line + "\n") * args.lines)
            times = [best_of(m, path, args.lines) for _n, m in mods]
            print("%-34s %s" % (label, "  ".join("%16.3f s" % t for t in times)))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
