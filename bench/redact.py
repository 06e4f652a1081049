"""Redaction: CPU per MB of output, growth on hostile output, and redact.py against detect-secrets.

    .venv/bin/python bench/redact.py scaling [--baseline REV]   # hostile floods, 100 KB and 1 MB
    .venv/bin/python bench/redact.py common  [--baseline REV]   # ordinary output, ms of CPU per MB
    .venv/bin/python bench/redact.py compare                    # the test tables, both tools

``--baseline REV`` also times ``diagnostics/core/redact.py`` as it was at REV (read with ``git show``),
on smaller floods and with a CPU cap per call, since a quadratic pattern takes minutes on 1 MB.

``compare`` needs ``pip install detect-secrets`` (not a dependency of mldiag). It scores both on
tests/unit/test_redact.py's SECRETS and NEAR_MISSES: a secret counts as caught when the tool
masks it (redact.py) or reports a string whose masking removes it (detect-secrets, which reports
and does not mask); "flagged" counts texts detect-secrets reports anything on; a near-miss is a
false alarm when it is changed (redact.py) or reported (detect-secrets). detect-secrets runs
with its default plugins and filters, and again without its two entropy plugins.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from diagnostics.core import redact  # noqa: E402
from tests.unit.test_redact import ADVERSARIAL, NEAR_MISSES, SECRETS  # noqa: E402

KNOWN = ["s3cr3t-value"]   # the hosts.yaml value the SECRETS table assumes
ORDINARY = {
    "train log": "step 10 loss=2.31 lr=3e-4 tokens/s=1234 grad_norm=0.9 mem: 40GiB\n",
    "gpu json": '{"gpu": 0, "name": "NVIDIA H100 80GB HBM3", "memory_used_mib": 1234, "util": 87}\n',
    "prose": "The quick brown fox jumps over the lazy dog while GPUs hum along\n",
    "pip list": "torch                    2.3.1+cu121\ntransformers             4.41.2\n",
}


class CpuCapReached(Exception):
    pass


def cpu_seconds(fn: Callable[[], object], repeat: int = 3, cap: Optional[float] = None) -> float:
    """Least CPU time of ``repeat`` calls; inf when one call passes ``cap`` seconds (stopped by
    SIGPROF, which the regex engine notices while it runs)."""
    def expire(signum, frame):
        raise CpuCapReached()
    best = math.inf
    previous = signal.signal(signal.SIGPROF, expire)
    try:
        for _ in range(repeat):
            signal.setitimer(signal.ITIMER_PROF, cap or 0)
            start = time.process_time()
            try:
                fn()
            except CpuCapReached:
                return math.inf
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            best = min(best, time.process_time() - start)
    finally:
        signal.signal(signal.SIGPROF, previous)
    return best


def baseline_module(rev: str) -> ModuleType:
    source = subprocess.run(["git", "show", f"{rev}:diagnostics/core/redact.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "redact_baseline.py"
    path.write_text(source)
    # named inside the diagnostics package, so its relative imports (.lean_imports) resolve
    spec = importlib.util.spec_from_file_location("diagnostics._redact_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flood(unit: str, size: int) -> str:
    # the needles in front make every pattern run (a flood alone may take the fast path)
    return " ".join(redact._NEEDLES) + "\n" + (unit * (size // len(unit) + 1))[:size]


def ms(seconds: float) -> str:
    return "  >cap" if seconds == math.inf else f"{seconds * 1000:8.1f}"


def run_scaling(baseline: Optional[ModuleType]) -> None:
    head = f"{'flood':15} {'100KB ms':>9} {'1MB ms':>9} {'ratio':>6}"
    if baseline:
        head += f" | {'base 10KB':>9} {'20KB':>8} {'40KB':>8} (cap 5 s)"
    print(head)
    for name, unit in ADVERSARIAL.items():
        small = cpu_seconds(lambda: redact.redact_text(flood(unit, 100_000)), 5)
        big = cpu_seconds(lambda: redact.redact_text(flood(unit, 1_000_000)), 2)
        line = f"{name:15} {ms(small)} {ms(big)} {big / small:6.1f}"
        if baseline:
            base = [cpu_seconds(lambda n=n: baseline.redact_text(flood(unit, n)), 1, cap=5.0)
                    for n in (10_000, 20_000, 40_000)]
            line += " | " + " ".join(ms(b) for b in base)
        print(line, flush=True)


def run_common(baseline: Optional[ModuleType]) -> None:
    print(f"{'text (1 MB)':15} {'ms':>8}" + (f" {'baseline ms':>12}" if baseline else ""))
    for name, unit in ORDINARY.items():
        text = unit * (1_000_000 // len(unit))
        line = f"{name:15} {ms(cpu_seconds(lambda: redact.redact_text(text)))}"
        if baseline:
            line += f" {ms(cpu_seconds(lambda: baseline.redact_text(text))):>12}"
        print(line, flush=True)


def detect_secrets_findings(texts: List[str], plugins: Optional[List[str]]) -> List[List[str]]:
    """The secret strings detect-secrets reports in each text (scanned as a file of its own, so
    its filters apply as they do in `detect-secrets scan`)."""
    from detect_secrets.core.scan import scan_file
    from detect_secrets.settings import default_settings, get_settings, transient_settings
    with default_settings():
        config = get_settings().json()
    if plugins is not None:
        config["plugins_used"] = [p for p in config["plugins_used"] if p["name"] in plugins]
    found = []
    with tempfile.TemporaryDirectory() as tmp, transient_settings(config):
        for i, text in enumerate(texts):
            path = os.path.join(tmp, f"case{i}.txt")
            with open(path, "w") as f:
                f.write(text + "\n")
            found.append([s.secret_value or "" for s in scan_file(path)])
    return found


def run_compare() -> None:
    secret_texts = [t for t, _ in SECRETS]
    rows: Dict[str, Dict[str, object]] = {}

    start = time.process_time()
    ours = [redact.redact_text(t, KNOWN) for t in secret_texts]
    ours_near = [redact.redact_text(t) for t in NEAR_MISSES]
    rows["redact.py"] = {
        "caught": sum(s not in out for (_, s), out in zip(SECRETS, ours)),
        "flagged": sum(out != t for t, out in zip(secret_texts, ours)),
        "false alarms": [t for t, out in zip(NEAR_MISSES, ours_near) if out != t],
        "missed": [t for (t, s), out in zip(SECRETS, ours) if s in out],
        "ms": (time.process_time() - start) * 1000,
    }
    try:
        from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    except ImportError:
        sys.exit("compare needs detect-secrets: .venv/bin/python -m pip install detect-secrets")
    names = [c.__name__ for c in get_mapping_from_secret_type_to_class().values()]
    for label, plugins in (("detect-secrets", None),
                           ("detect-secrets -entropy",
                            [n for n in names if "HighEntropy" not in n])):
        start = time.process_time()
        found = detect_secrets_findings(secret_texts, plugins)
        found_near = detect_secrets_findings(NEAR_MISSES, plugins)
        spent = (time.process_time() - start) * 1000

        def masks(text: str, secret: str, values: List[str]) -> bool:
            for value in sorted(values, key=len, reverse=True):
                if value:
                    text = text.replace(value, redact.REDACTED)
            return secret not in text
        rows[label] = {
            "caught": sum(masks(t, s, v) for (t, s), v in zip(SECRETS, found)),
            "flagged": sum(bool(v) for v in found),
            "false alarms": [t for t, v in zip(NEAR_MISSES, found_near) if v],
            "missed": [t for (t, s), v in zip(SECRETS, found) if not masks(t, s, v)],
            "ms": spent,
        }
    print(f"{len(SECRETS)} secret shapes, {len(NEAR_MISSES)} near-misses\n")
    print(f"{'tool':25} {'caught':>7} {'flagged':>8} {'false alarms':>13} {'CPU ms':>8}")
    for label, row in rows.items():
        print(f"{label:25} {row['caught']:>7} {row['flagged']:>8} {len(row['false alarms']):>13} "
              f"{row['ms']:8.1f}")
    for label, row in rows.items():
        print(f"\n{label} missed:")
        for text in row["missed"]:
            print("   ", repr(text[:90]))
        print(f"{label} false alarms:")
        for text in row["false alarms"]:
            print("   ", repr(text[:90]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("mode", choices=["scaling", "common", "compare"])
    ap.add_argument("--baseline", metavar="REV", help="also time diagnostics/core/redact.py at REV")
    args = ap.parse_args()
    baseline = baseline_module(args.baseline) if args.baseline else None
    {"scaling": lambda: run_scaling(baseline), "common": lambda: run_common(baseline),
     "compare": run_compare}[args.mode]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
