"""node-check's own view after the folded table: the nodes grouped by what a person must do.

    ACTION     TARGETS         WHY
    drain      gpu[03,07]      ib-port-down (mlx5_4/1), xid-79 (GPU 2)
    reset-gpu  gpu05           xid-48 (GPU 1)
    monitor    gpu02           ib-counter (mlx5_1/1)
    none       gpu[01,04,06]   healthy

Each node is counted once, under its worst action (results.ACTIONS order); WHY lists the codes
of the findings that carry that action, with the GPUs/ports they name, bounded. A node that
could not be checked (status error) is under ``unchecked`` with its error layer, never
``none``. Every string from a target goes through ``render.safe_text``.
"""

from collections import OrderedDict
from typing import Dict, List, Sequence, TextIO

from ...core import nodeset
from ...views.render import emit, safe_text
from ...core.results import ACTIONS, Result, action_rank, worst_action

MAX_WHY = 4          # codes shown per group before "… N more"


def _about(finding) -> str:
    names = []
    if finding.gpus:
        names.append(("GPU " if len(finding.gpus) == 1 else "GPUs ")
                     + ",".join(safe_text(g) for g in finding.gpus[:8])
                     + ("…" if len(finding.gpus) > 8 else ""))
    if finding.ports:
        names.append(",".join(safe_text(p) for p in finding.ports[:4])
                     + ("…" if len(finding.ports) > 4 else ""))
    return f" ({'; '.join(names)})" if names else ""


def action_groups(results: Sequence[Result]) -> "OrderedDict[str, Dict[str, List[str]]]":
    """{action: {"targets": [...], "why": [...]}} from the most severe action down."""
    groups: Dict[str, Dict[str, List[str]]] = {}
    for result in results:
        if result.status == "error":
            key = "unchecked"
            why = [f"{result.error.layer if result.error else 'error'}"]
        else:
            key = worst_action(result.findings) or "none"
            carrying = [f for f in result.findings if f.action == key and f.level != "info"]
            why = [f"{safe_text(f.code)}{_about(f)}" for f in carrying] or ["healthy"]
        group = groups.setdefault(key, {"targets": [], "why": []})
        group["targets"].append(result.target)
        for w in why:
            if w not in group["why"]:
                group["why"].append(w)
    order = sorted(groups, key=lambda a: (a != "unchecked", -action_rank(a)))
    return OrderedDict((a, groups[a]) for a in order)


def render_actions(results: Sequence[Result], stream: TextIO, *, color: bool = False) -> None:
    groups = action_groups(results)
    if not groups or (len(results) == 1 and list(groups) == ["none"]):
        return
    rows = []
    for action, group in groups.items():
        why = group["why"][:MAX_WHY]
        if len(group["why"]) > MAX_WHY:
            why.append(f"… {len(group['why']) - MAX_WHY} more")
        rows.append((action, safe_text(nodeset.fold(group["targets"])), ", ".join(why)))
    width_a = max(len("ACTION"), *(len(r[0]) for r in rows))
    width_t = max(len("TARGETS"), *(len(r[1]) for r in rows))
    lines = [f"{'ACTION':<{width_a}}  {'TARGETS':<{width_t}}  WHY"]
    for action, targets, why in rows:
        lines.append(f"{action:<{width_a}}  {targets:<{width_t}}  {why}".rstrip())
    emit(stream, "\n" + "\n".join(lines) + "\n")


__all__ = ["ACTIONS", "action_groups", "render_actions"]
