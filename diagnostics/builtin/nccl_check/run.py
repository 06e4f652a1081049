"""nccl-check --pairs: the nodes measured two by two, in two passes, and the slow one named
(pairs.py decides; engine/groups.py starts each pair's two runs together).

Pass 1 runs every pair at once (no node is in two pairs); pass 2 runs its rounds one after the
other, the pairs of a round at once. A pair is slow below ``--fleet-pct`` % of the median of
pass 1's pairs (its figure is pass 2's too); a pair whose run failed counts as slow, so its nodes
are tried again with known-good partners. Each node's row says what its pairs measured and the
verdict: ``slow-node`` (fail, drain), ``slow-link`` (warn, monitor: a pair slow only together),
``slow-undetermined`` (warn: no known-good node to test it against).
"""

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

from . import fleet, pairs, passed
from ...core.outcome import Outcome
from ...core.results import Finding, Result
from ...engine import execute as engine, groups, jobs, runner
from ...inventory.targets import Target

HINTS = {
    "slow-node": "slow with every partner: check its NICs, PCIe and NVLinks (mldiag node-check), "
                 "then drain it",
    "slow-link": "slow only with this partner: the path between the two (a cable, a switch port); "
                 "each node is fine with others",
    "slow-undetermined": "no fast pair to compare with: a fabric-wide problem, or a figure that "
                         "does not fit these nodes (--fleet-pct)",
}
VERDICT_FINDING = {"node": ("fail", "slow-node", "drain"), "undetermined": ("warn", "slow-undetermined", "none")}

Measured = Dict[pairs.Pair, Tuple[Optional[float], List[Result]]]


def pair_busbw(results: Sequence[Result]) -> Optional[float]:
    """The pair's busbw at its largest size (the same on both members), or None when a member
    measured nothing."""
    got = [fleet.measured(r) for r in results]
    if any(g is None for g in got):
        return None
    return got[0][1]


def measure(round_: Sequence[pairs.Pair], by_name: Mapping[str, groups.Member], member_job, parallel: int) -> Measured:
    """Every pair of one round at once (they share no node)."""
    def one(pair):
        results = groups.run_group([by_name[pair[0]], by_name[pair[1]]], member_job)
        return pair, (pair_busbw(results), results)
    with ThreadPoolExecutor(max_workers=max(1, min(len(round_), parallel // 2 or 1))) as ex:
        return dict(ex.map(one, round_))


def node_results(names: Sequence[str], pass1: Measured, pass2: Measured, figure: Optional[float],
                 pct: float) -> List[Result]:
    """One result per node: the pairs it was in, and the verdict."""
    slow1 = pairs.slow_pairs({p: (v if v is not None else -1.0) for p, (v, _) in pass1.items()}, figure)
    slow1.update({p: True for p, (v, _) in pass1.items() if v is None})
    slow2 = pairs.slow_pairs({p: (v if v is not None else -1.0) for p, (v, _) in pass2.items()}, figure)
    slow2.update({p: True for p, (v, _) in pass2.items() if v is None})
    verdict, links = pairs.verdicts(slow1, slow2)
    out = []
    for name in names:
        seen, members = [], []
        for number, measured, slow in ((1, pass1, slow1), (2, pass2, slow2)):
            for pair, (busbw, results) in measured.items():
                if name in pair:
                    other = pair[1] if pair[0] == name else pair[0]
                    seen.append({"pass": number, "with": other, "busbw": busbw, "slow": slow[pair]})
                    members.extend(r for r in results if r.target == name)
        failed = next((r for r in members if r.status == "error"), None)
        if failed is not None:
            out.append(failed)
            continue
        findings = []
        for r in members:       # what the node's own runs said (a rank that failed, no torch): once each
            for f in r.findings:         # (not that a partner's failure ended it: its partner's row says that)
                if f.level in ("warn", "fail") and f.code != "peer-failed" and all(f.code != g.code for g in findings):
                    findings.append(f)
        if name in verdict:
            level, code, action = VERDICT_FINDING[verdict[name]]
            findings.append(Finding(level=level, code=code, action=action, hint=HINTS[code],
                                    message=_said(seen, figure, "slow in both passes" if code == "slow-node"
                                                  else "slow, and no fast node to pair it with")))
        for pair in links:
            if name in pair:
                other = pair[1] if pair[0] == name else pair[0]
                findings.append(Finding(level="warn", code="slow-link", action="monitor", hint=HINTS["slow-link"],
                                        ports=[f"{pair[0]}<->{pair[1]}"],
                                        message=f"slow only with {other}: " + _said(
                                            [s for s in seen if s["with"] == other], figure, "")))
        status = "fail" if any(f.level == "fail" for f in findings) else "warn" if findings else "ok"
        best = max((s["busbw"] for s in seen if s["busbw"] is not None), default=None)
        summary = ", ".join(_pair_text(s) for s in seen) or "not measured"
        if findings:
            summary += "; " + ", ".join(dict.fromkeys(f.code for f in findings))
        out.append(Result(diagnostic="nccl-check", target=name, status=status, summary=summary,
                          findings=findings, data={"pairs": seen, "threshold_gbps": figure, "fleet_pct": pct,
                                                   "best_busbw": best, "verdict": verdict.get(name)}))
    return out


def _pair_text(seen: Mapping[str, Any]) -> str:
    busbw = "failed" if seen["busbw"] is None else f"{seen['busbw']:.2f} GB/s"
    return f"{busbw} with {seen['with']} (pass {seen['pass']})"


def _said(seen, figure, lead) -> str:
    text = ", ".join(_pair_text(s) for s in seen)
    below = f" (slow below {figure:.2f} GB/s)" if figure is not None else ""
    return (f"{lead}: " if lead else "") + text + below


def pairs_fan_out(pct: float) -> Callable[..., List[Result]]:
    """A ``run_many`` for execute(): the selected targets measured in pairs, two passes."""
    def fan_out(targets: Sequence[Target], job_for, *, parallel: int = 32,
                on_result: Optional[Callable[[Result], None]] = None, pool=None, keep_allocations=None,
                **_ignored) -> List[Result]:
        with groups.placed(targets, job_for, pool, keep_allocations) as (members, failed):
            names = [m.name for m, _ in members]
            by_name = {m.name: (m, step) for m, step in members}
            member_job = groups.member_job_of(job_for)
            pass1 = measure(pairs.first_pass(names), by_name, member_job, parallel)
            figure = pairs.threshold_of({p: v for p, (v, _) in pass1.items() if v is not None}, None, pct)
            slow1 = {p: v is None or (figure is not None and v < figure) for p, (v, _) in pass1.items()}
            pass2: Measured = {}
            for round_ in pairs.second_pass(slow1):
                pass2.update(measure(round_, by_name, member_job, parallel))
        results = failed + node_results(names, pass1, pass2, figure, pct)
        for r in results:
            if on_result is not None:
                on_result(r)
        return results
    return fan_out


def fan_out(values: Mapping[str, Any]) -> Optional[Callable[..., List[Result]]]:
    """How the task and a runbook step run the nodes together: two by two (--pairs), all as one
    group (--across), or each alone (None)."""
    if values.get("across"):
        return groups.in_groups(0)
    if values.get("pairs"):
        return pairs_fan_out(fleet.percentage(values))
    return None


def run(opts: engine.Options, values: Mapping[str, Any], *, out: Optional[TextIO] = None) -> Outcome:
    """The nccl-check task: each node alone, judged with its fleet; with --pairs, two by two;
    both without the nodes that passed lately (passed.py); with --across, all as one group."""
    op = values.get("op") or "all_reduce"
    together = fan_out(values)
    if values.get("across"):
        return engine.execute(opts, jobs.job_source("nccl-check", values), out=out, fan_out=together)
    valid_s = passed.valid_for(values)
    if together is None:
        return engine.execute(opts, jobs.job_source("nccl-check", values), out=out, amend=fleet.judge(values),
                              fan_out=passed.skipping(runner.run_many, op, valid_s))
    return engine.execute(opts, jobs.job_source("nccl-check", values), out=out,
                          fan_out=passed.skipping(together, op + " pairs", valid_s))
