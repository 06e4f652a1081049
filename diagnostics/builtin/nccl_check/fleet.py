"""nccl-check judged across the fleet: a node whose bus bandwidth is far below its peers' is a
finding, whether or not a figure for its GPUs is known (a degraded NVLink or NIC that still
says "Active" reports nothing; it is only slower than the nodes beside it).

Peers are the nodes measured the same way (backend, collective, number of ranks, largest size):
their median busbw at the largest size is the yardstick, and a node below ``pct`` % of it is
``busbw-below-fleet`` (fail, drain). Fewer than ``MIN_PEERS`` such nodes make no median worth
the name: nothing is said then.
"""

import statistics
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from ...core import results as results_mod
from ...core.errors import InputError
from ...core.results import Finding, Result

DEFAULT_PCT = 80
MIN_PEERS = 3
HINT = ("slower than its peers measured the same way: check its NVLinks, NICs and PCIe links "
        "(mldiag node-check), then run it again alone before draining")


def measured(result: Result) -> Optional[Tuple[Tuple[Any, ...], float]]:
    """(how it was measured, busbw at its largest size) of a result that measured, else None."""
    data = result.data if isinstance(result.data, dict) else {}
    rows = [r for r in data.get("rows") or [] if isinstance(r, dict)
            and isinstance(r.get("size"), int) and isinstance(r.get("busbw"), (int, float))]
    if result.status == "error" or not rows:
        return None
    last = max(rows, key=lambda r: r["size"])
    return (data.get("backend"), data.get("op"), data.get("ranks"), last["size"]), float(last["busbw"])


def below_fleet(results: List[Result], pct: float = DEFAULT_PCT) -> Dict[str, Finding]:
    """{target: finding} for each node below ``pct`` % of its peers' median busbw."""
    groups: Dict[Tuple[Any, ...], List[Tuple[str, float]]] = {}
    for result in results:
        got = measured(result)
        if got is not None:
            groups.setdefault(got[0], []).append((result.target, got[1]))
    out = {}
    for (backend, op, ranks, size), members in groups.items():
        if len(members) < MIN_PEERS:
            continue
        median = statistics.median(busbw for _, busbw in members)
        for target, busbw in members:
            if median > 0 and busbw < median * pct / 100.0:
                out[target] = Finding(
                    level="fail", code="busbw-below-fleet", action="drain", hint=HINT,
                    message=(f"{str(op).replace('_', '-')} busbw {busbw:.2f} GB/s, {100 * busbw / median:.0f} % "
                             f"of the median of {len(members)} nodes measured alike ({median:.2f} GB/s; "
                             f"a node below {pct:g} % is named)"))
    return out


def judge(values: Mapping[str, Any]) -> Callable[[List[Result]], None]:
    """The fleet judgement of the task and of a runbook step alike (``--fleet-pct``)."""
    pct = percentage(values)

    def amend(results: List[Result]) -> None:
        slow = below_fleet(results, pct)
        for result in results:
            extra = slow.get(result.target)
            if extra is None:
                continue
            result.findings.append(extra)
            result.status = results_mod.worst_status([result.status, extra.level])
    return amend


def percentage(values: Mapping[str, Any]) -> float:
    """``--fleet-pct`` (default DEFAULT_PCT), checked before anything runs."""
    return number_flag(values, "fleet-pct", DEFAULT_PCT, "a percentage from 1 to 100", lambda v: 0 < v <= 100)


def number_flag(values: Mapping[str, Any], name: str, default: float, expected: str,
                fits: Callable[[float], bool]) -> float:
    """nccl-check's numeric client flag ``name``: ``default`` when not given, else a number that
    ``fits``; anything else is bad input naming the flag and ``expected``."""
    value = values.get(name)
    if value in (None, ""):
        return float(default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not fits(number):
        raise InputError(f"--{name}: expected {expected}, got {value!r}")
    return number
