"""Nodes that passed nccl-check lately, remembered per user: the next run skips a node that
passed the same collective within ``--valid-for`` hours (default 24, as cluster-health-scanner
keeps its results) unless ``--force``, and its row says so. A node that did not pass is
measured every time; an entry read back is validated, and a cache that cannot be read or
written is simply not used (``core/usercache.py``)."""

import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from . import fleet
from ...core import usercache
from ...core.results import Result

FILE = "nccl-check.json"
MAX_BYTES = 4 * 1024 * 1024
MAX_NODES = 10000
DEFAULT_VALID_H = 24


def valid_for(values: Mapping[str, Any]) -> float:
    """``--valid-for`` in seconds (0 with ``--force``), checked before anything runs."""
    hours = fleet.number_flag(values, "valid-for", DEFAULT_VALID_H, "hours from 0", lambda v: v >= 0)
    return 0.0 if values.get("force") else hours * 3600.0


def _entry(raw: Any) -> Optional[Dict[str, float]]:
    if not isinstance(raw, dict):
        return None
    at, busbw = raw.get("passed"), raw.get("busbw")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (at, busbw)):
        return None
    return {"passed": float(at), "busbw": float(busbw)}


def load(directory=None) -> Dict[str, Dict[str, Dict[str, float]]]:
    """{target: {op: {"passed": epoch seconds, "busbw": GB/s}}}, what validates of the file."""
    raw = usercache.read_json(FILE, MAX_BYTES, directory)
    out: Dict[str, Dict[str, Dict[str, float]]] = {}
    for name, ops in (raw.items() if isinstance(raw, dict) else ()):
        if isinstance(name, str) and isinstance(ops, dict):
            kept = {op: e for op, e in ((op, _entry(v)) for op, v in ops.items() if isinstance(op, str)) if e}
            if kept:
                out[name] = kept
    return out


def passed_busbw(result: Result) -> Optional[float]:
    """The busbw of a result that passed (ok, measured), else None."""
    data = result.data if isinstance(result.data, dict) else {}
    if result.status != "ok" or data.get("skipped"):
        return None
    if isinstance(data.get("best_busbw"), (int, float)):          # --pairs: its best pair
        return float(data["best_busbw"])
    got = fleet.measured(result)
    return got[1] if got is not None else None


def remember(results: Sequence[Result], op: str, now: float, directory=None) -> None:
    passed = {r.target: b for r, b in ((r, passed_busbw(r)) for r in results) if b is not None}
    if not passed:
        return
    memory = load(directory)
    for name, busbw in passed.items():
        memory.setdefault(name, {})[op] = {"passed": now, "busbw": busbw}
    if len(memory) > MAX_NODES:
        newest = lambda kv: max(e["passed"] for e in kv[1].values())   # noqa: E731
        memory = dict(sorted(memory.items(), key=newest)[-MAX_NODES:])
    usercache.write_json(FILE, memory, directory)


def skipped_row(name: str, entry: Dict[str, float], now: float) -> Result:
    hours = max(0.0, now - entry["passed"]) / 3600.0
    return Result(diagnostic="nccl-check", target=name, status="ok",
                  summary=f"skipped: passed {hours:.1f} h ago (busbw {entry['busbw']:.2f} GB/s; --force to measure)",
                  data={"skipped": True, "passed_at": entry["passed"], "busbw": entry["busbw"]})


def skipping(fan_out: Callable[..., List[Result]], op: str, valid_s: float,
             clock: Callable[[], float] = time.time) -> Callable[..., List[Result]]:
    """``fan_out`` over the targets that did not pass ``op`` within ``valid_s`` seconds; a row
    for each one skipped; what passed now remembered."""
    def run(targets, job_for, *, on_result=None, **kw) -> List[Result]:
        now = clock()
        memory = load() if valid_s > 0 else {}
        recent = {t.name: memory[t.name][op] for t in targets
                  if op in memory.get(t.name, {}) and now - memory[t.name][op]["passed"] <= valid_s}
        to_run = [t for t in targets if t.name not in recent]
        ran = fan_out(to_run, job_for, on_result=on_result, **kw) if to_run else []
        skipped = {name: skipped_row(name, entry, now) for name, entry in recent.items()}
        for row in skipped.values():
            if on_result is not None:
                on_result(row)
        remember(ran, op, clock())
        out: List[Result] = []
        for t in targets:       # in the targets' order; a Slurm target's rows are its nodes'
            if t.name in skipped:
                out.append(skipped[t.name])
            else:
                out.extend(r for r in ran if r.target == t.name or r.target.startswith(t.name + ":"))
        return out
    return run
