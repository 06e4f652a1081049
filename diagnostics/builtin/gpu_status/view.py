"""gpu-status's own view after the folded table: per-GPU rows for one target, the node × GPU
grid (``grid.py``) for several; the rows are also what a runbook report shows of a gpu-status
step."""

from typing import Any, List, Sequence, TextIO, Tuple

from ...core.results import Result
from ...views.render import count, emit, safe_text
from .grid import render_grid

GPU_ROWS_LIMIT = 64   # beyond this many GPUs (one target) the per-GPU table is left to --json


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _num(value: Any, fmt: str = "{:.0f}") -> str:
    """A number in ``fmt``; anything else a target sent (a string, a list) shown as it is."""
    if value is None:
        return "-"
    if _is_number(value):
        try:
            return fmt.format(value)
        except (ValueError, OverflowError):   # an int too large for a float format
            return safe_text(value)
    return safe_text(value)


def _memory(used: Any, total: Any) -> str:
    if total is None:
        return "-"
    if _is_number(total) and (used is None or _is_number(used)):
        shown = "-" if used is None else _num(used / 1024, "{:.1f}")
        return f"{shown}/{_num(total / 1024)} GiB"
    return f"{_num(used)}/{_num(total)} MiB"


def _power(draw: Any, limit: Any) -> str:
    return "-" if draw is None else f"{_num(draw)}/{_num(limit)} W"


def _clock_events(reasons: Any) -> str:
    names = reasons.get("names") if isinstance(reasons, dict) else None
    if not isinstance(names, list):
        names = [] if names is None else [names]
    return ",".join(safe_text(n) for n in names if n != "gpu_idle") or "-"


def gpu_rows(results: Sequence[Result]) -> List[Tuple[str, ...]]:
    """One row per GPU of every gpu-status result that has ``data.gpus``; each cell is inert
    text whatever JSON the target sent (a field of the wrong type is shown, not obeyed)."""
    rows = []
    for r in results:
        gpus = r.data.get("gpus") if isinstance(r.data, dict) else None
        for g in gpus if isinstance(gpus, list) else []:
            if not isinstance(g, dict):
                continue
            target, index = safe_text(r.target), _num(g.get("index"), "{}")
            if g.get("error"):
                rows.append((target, index, "error: " + safe_text(g["error"]), "", "", "", "", ""))
                continue
            rows.append((target, index, safe_text(g.get("name") or "-"),
                         _memory(g.get("memory_used_mib"), g.get("memory_total_mib")),
                         _num(g.get("utilization_gpu_pct"), "{:.0f}%"),
                         _num(g.get("temperature_c"), "{:.0f} C"),
                         _power(g.get("power_draw_w"), g.get("power_limit_w")),
                         _clock_events(g.get("clocks_event_reasons"))))
    return rows


def render_gpus(results: Sequence[Result], stream: TextIO, *, color: bool = False) -> None:
    """gpu-status's own view after the folded table: for several targets the node × GPU grid
    (``grid``: one mark per GPU, its worst finding, and a legend); for one target its GPUs
    one row each, with the numbers a person reads on one node (skipped past GPU_ROWS_LIMIT rows).

    NOTE: the rows stay for one target because there a grid is one row of marks the findings
    above already say, while memory, load, temperature and power are what one asks of a node;
    over a fleet those numbers are 8 rows a node, and which GPU is bad where is the question."""
    if len(results) > 1:
        render_grid(results, stream, color=color)
        return
    rows = gpu_rows(results)
    if not rows:
        return
    if len(rows) > GPU_ROWS_LIMIT:
        emit(stream, f"\n({count(len(rows), 'GPU')}: per-GPU rows are in --json)\n")
        return
    header = ("TARGET", "GPU", "NAME", "MEMORY", "UTIL", "TEMP", "POWER", "CLOCK EVENTS")
    widths = [max(len(row[i]) for row in rows + [header]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
             for row in [header] + rows]
    emit(stream, "\n" + "\n".join(lines) + "\n")
