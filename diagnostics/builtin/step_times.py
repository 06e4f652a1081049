"""step-times across targets: each target scores the ranks whose logs it reads
(scripts/step_times.py); where a job's logs lie on several targets -- each node writes its own
ranks' -- the peers of a rank are the ranks of every target. Each target's result carries every
rank's recent median (``data.score.ranks[label].median``, its last ``--window`` steps); here
they are compared across targets with the script's own rule and thresholds (read from the
script, one place): a rank whose median is ``Z_THRESHOLD`` robust z or more above its peers'
median of medians, and ``RATIO_THRESHOLD`` times it or more, with ``MIN_RANKS`` ranks at least,
is a ``straggler`` on the target that reads its log. That comparison replaces each target's own
peer comparison (a part of the job: its ``straggler`` and ``too-few-ranks`` findings); a rank
against its own history (``slowed``) stays the target's. Ranks are named with their target:
``--log`` numbers each target's logs from 0.
"""

import math
import os
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

from ..core import literals
from ..core.paths import SCRIPTS_DIR
from ..core.results import Finding, Result, with_findings

RULE = literals.read_constants(os.path.join(SCRIPTS_DIR, "step_times.py"))
PEER_CODES = ("straggler", "too-few-ranks")      # a target's own peer comparison, superseded here
HINT = ("check that rank's node (node-check, gpu-perf) before draining it: a log says where, not what")


@dataclass(frozen=True)
class RankMedian:
    target: str
    label: str
    median: float
    unit: str
    recent_steps: int


def medians(results: Sequence[Result]) -> List[RankMedian]:
    """Every scored rank of every target (validated: a target's data is its own word)."""
    out = []
    for result in results:
        data = result.data if isinstance(result.data, dict) else {}
        unit, score = data.get("unit"), data.get("score")
        ranks = score.get("ranks") if isinstance(score, dict) else None
        if not (isinstance(unit, str) and unit in RULE["UNITS"] and isinstance(ranks, dict)):
            continue
        for label, entry in list(ranks.items())[:4096]:
            if not (isinstance(label, str) and len(label) <= 40 and isinstance(entry, dict)):
                continue
            median, window = entry.get("median"), entry.get("window")
            steps = window.get("recent_steps") if isinstance(window, dict) else None
            if (isinstance(median, (int, float)) and not isinstance(median, bool)
                    and math.isfinite(median) and 0 < median < 1e9):
                out.append(RankMedian(result.target, label, float(median), unit,
                                      steps if isinstance(steps, int) and not isinstance(steps, bool) else 0))
    return out


def robust_z(value: float, reference: Sequence[float]):
    """(z, median): the script's _robust_z, with its constants."""
    med = statistics.median(reference)
    mad = statistics.median([abs(v - med) for v in reference])
    scale = max(RULE["MAD_TO_SIGMA"] * mad, RULE["SCALE_FLOOR"] * abs(med))
    return ((value - med) / scale if scale > 0 else 0.0), med


def stragglers(ranks: Sequence[RankMedian]) -> List[Dict[str, Any]]:
    """[{rank, peer_median, ratio, z}] of the ranks named across all targets, worst first; none
    where the units differ or too few ranks were scored. Pure."""
    if len({r.unit for r in ranks}) != 1 or len(ranks) < RULE["MIN_RANKS"]:
        return []
    named = []
    for r in ranks:
        z, peers = robust_z(r.median, [p.median for p in ranks if p is not r])
        if z >= RULE["Z_THRESHOLD"] and r.median / peers >= RULE["RATIO_THRESHOLD"]:
            named.append({"rank": r, "peer_median": peers, "ratio": r.median / peers, "z": z})
    return sorted(named, key=lambda n: -n["z"])


def _seconds(value: float, unit: str) -> str:
    if unit == "s":
        return "%.3g s" % value if value >= 1 else "%.3g ms" % (value * 1000)
    return "%.3g %s" % (value, unit)


def amend(results: List[Result]) -> None:
    """With ranks on two targets or more: the peer comparison across all of them, on the
    target of each rank named."""
    ranks = medians(results)
    targets = {r.target for r in ranks}
    if len(targets) < 2:
        return
    named = stragglers(ranks)
    by_target = {r.target: r for r in results}
    for target in targets:
        result = by_target[target]
        result.findings[:] = [f for f in result.findings if f.code not in PEER_CODES]
    for n in named:
        r = n["rank"]
        result = by_target[r.target]
        result.findings.append(Finding(
            level="fail", code="straggler", action="monitor", hint=HINT,
            message=(f"rank {r.label} on {r.target} is a straggler: median {_seconds(r.median, r.unit)} over its "
                     f"last {r.recent_steps} steps, {n['ratio']:.2f}x its peers' {_seconds(n['peer_median'], r.unit)} "
                     f"across {len(ranks)} ranks on {len(targets)} targets (z {n['z']:.1f})")))
    for target in targets:
        result = by_target[target]
        mine = [n for n in named if n["rank"].target == target]
        base = "ok" if result.status in ("ok", "warn", "fail") else result.status
        result.status = with_findings(base, [f.level for f in result.findings])
        result.summary = (f"straggler(s) across {len(targets)} targets: " + ", ".join(
            f"rank {n['rank'].label}" for n in mine) if mine else
            f"no straggler here among {len(ranks)} ranks on {len(targets)} targets")
