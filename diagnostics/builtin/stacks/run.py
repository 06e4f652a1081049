"""The stacks task's client side: scripts/stacks.py on every target, then every
process's main-thread stack folded across targets and ranks (stacks_fold), the odd rank named:

    3/4 ranks (trainbox:[0-2])  all_reduce (torch/distributed/distributed_c10d.py) ← sync (train.py:14) ← main (train.py:25)
    1/4 ranks (trainbox:3)      wait_for_data (train.py:10) ← main (train.py:24)   ← the odd one out

The judgement is made on all results together (``amend``, before anything is saved or shown):
the targets holding an odd rank get the ``stacks-odd-one-out`` finding (fail when the others
wait in a collective), so the table, ``--json`` and ``--save`` all say it.
"""

import re
from typing import List, Sequence, TextIO

from ...core import results as results_mod
from . import flight_recorder as stacks_fr, stragglers
from ...core.errors import InputError
from ...views.render import emit, safe_text
from ...core.results import Finding, Result
from .fold import MAX_GROUPS, RankStack, fold, judge, lines, processes_of


def rank_stacks(results: Sequence[Result]) -> List[RankStack]:
    """One RankStack per process a target dumped (data.processes[].threads); anything else in
    a target's data is skipped (it is that target's word, validated here)."""
    out = []
    for result, proc in processes_of(results):
        if not isinstance(proc.get("threads"), list):
            continue
        pid, rank = proc.get("pid"), proc.get("rank")
        out.append(RankStack(result.target, pid if isinstance(pid, int) else 0,
                             rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
                             proc["threads"]))
    return out


def amend(results: List[Result]) -> None:
    """Add the fleet's judgement to the targets it is about: odd ranks' targets, or (a split)
    every target with a stack; then the flight recorder's, to the targets of the ranks behind
    (or every target that sent dumps)."""
    stragglers.amend(results)        # --window: the rank the others wait for
    groups = fold(rank_stacks(results))
    by_target = {r.target: r for r in results}
    placed = _placed(groups, judge(groups)) + _flight_recorder(results)[0]
    for finding, group_targets in placed:
        for target in group_targets:
            result = by_target.get(target)
            if result is None:
                continue
            result.findings.append(Finding(level=finding["level"], code=finding["code"],
                                           message=finding["message"], hint=finding.get("hint"),
                                           action="none"))
            level = finding["level"]
            result.status = results_mod.worst_status([result.status, "ok" if level == "info" else level])


def _flight_recorder(results: Sequence[Result]):
    """([(finding, targets)], lines) from the flight-recorder dumps the targets sent
    (data.flight_recorder, scripts/flight_recorder.py), judged together (stacks_fr)."""
    per_target = [(r.target, r.data["flight_recorder"]) for r in results
                  if r.status != "error" and isinstance(r.data, dict)
                  and isinstance(r.data.get("flight_recorder"), dict)]
    if not per_target:
        return [], []
    sizes = [p.get("world_size") for r in results if isinstance(r.data, dict)
             and isinstance(r.data.get("processes"), list) for p in r.data["processes"] if isinstance(p, dict)]
    sizes = [n for n in sizes if isinstance(n, int) and not isinstance(n, bool)]
    world = max(set(sizes), key=sizes.count) if sizes else None
    findings, view = stacks_fr.analyse(per_target, world_size=world)
    senders = list(dict.fromkeys(t for t, _ in per_target))
    # a divergence goes to the targets of the ranks behind (analyse names them), the rest to
    # every target that sent dumps
    placed = [(f, f.get("targets") or senders) for f in findings if f.get("level") != "info"]
    return placed, view


def _placed(groups, findings):
    """(finding, targets it goes to): an odd-one-out to its group's targets (judge lists the
    odd groups in order), anything else to every target in the fold."""
    def targets(of):
        return list(dict.fromkeys(m.target for g in of for m in g.members))

    if findings and findings[0]["code"] == "stacks-odd-one-out":
        odd = list(groups[1:])
        placed = [(f, targets([g])) for f, g in zip(findings[:MAX_GROUPS], odd[:MAX_GROUPS])]
        if len(findings) > MAX_GROUPS:          # "… N more groups": to all of theirs
            placed.append((findings[MAX_GROUPS], targets(odd[MAX_GROUPS:])))
        return placed
    return [(f, targets(groups)) for f in findings if f["level"] != "info"]


def fold_view(results: Sequence[Result]) -> List[str]:
    """The folded view's lines, then the flight recorder's (after an empty line), each safe to
    print (names came from the targets)."""
    view = [safe_text(line) for line in lines(fold(rank_stacks(results)))]
    recorder = [safe_text(line) for line in _flight_recorder(results)[1]]
    return view + ([""] if view and recorder else []) + recorder


def render_view(results: Sequence[Result], stream: TextIO, *, color: bool = False) -> None:
    view = fold_view(results)
    if view:
        emit(stream, "\n" + "".join(line + "\n" for line in view))


def check_values(values: dict) -> None:
    """--pid and --match are checked here, before anything connects (exit 4 when wrong)."""
    pids = values.get("pid")
    if pids and not re.fullmatch(r"[0-9]+(,[0-9]+)*", str(pids).replace(" ", "")):
        raise InputError(f"--pid: expected a comma list of process ids, got {pids!r}")
    for name, most in (("window", 600), ("rate", 20)):
        value = values.get(name)
        if value is not None and not 1 <= int(value) <= most:
            raise InputError(f"--{name}: expected a whole number from 1 to {most}, got {value}")
    pattern = values.get("match")
    if pattern:
        try:
            re.compile(str(pattern))
        except re.error as exc:
            raise InputError(f"--match: not a regular expression: {pattern!r} ({exc})") from None
