"""The node-check task's engine: the diagnostic on every target (``cli.execute``), then what
only the client can do with all the answers together (issue 12):

- ``--baseline FILE``: every fact that differs from the saved baseline, per node; without
  it, every fact in which a node differs from the majority of the selected nodes
  (``baseline.deviations``) -- added as findings before anything is saved or shown;
- ``--save-baseline FILE``: the nodes' facts saved for a later ``--baseline``;
- ``--prom FILE``: a node-exporter textfile-collector file (``prom.write``);
- Slurm: ``--drain`` drains the nodes whose worst action is drain or worse, ``--undrain``
  resumes the nodes mldiag drained that now pass; without either, the commands it would run
  are printed (``drain.plan`` / ``drain.run``).

Bad input (a baseline file that is not one, both --drain and --undrain, a bad --dcgm-level)
is refused before anything connects.
"""

import io
import sys
from typing import List, Optional, TextIO

from . import cli, jobs, node_view, results as results_mod
from .errors import InputError
from .outcome import Outcome
from .results import Result


def amend_with(deviations) -> None:
    """Fold client-side findings into the results: status and worst action follow."""
    def amend(results: List[Result]) -> None:
        for result in results:
            extra = deviations.get(result.target) or []
            if not extra or result.status == "error":
                continue
            result.findings.extend(extra)
            result.status = results_mod.worst_status(
                [result.status] + [("ok" if f.level == "info" else f.level) for f in extra])
            if isinstance(result.data, dict):
                result.data["worst_action"] = results_mod.worst_action(result.findings)
    return amend


def execute(opts: cli.Options, values: dict, *, save_baseline: Optional[str] = None,
            baseline: Optional[str] = None, drain: bool = False, undrain: bool = False,
            prom: Optional[str] = None, out: Optional[TextIO] = None) -> Outcome:
    out = out or sys.stdout
    level = values.get("dcgm_level")
    if level is not None and str(level) not in ("1", "2", "3"):
        raise InputError(f"--dcgm-level: expected 1, 2 or 3, got {level!r}")
    if drain and undrain:
        raise InputError("--drain and --undrain: give one of them")
    # TODO(issue 12, this session): baseline, prom and drain land from their branches
    import importlib.util
    has = {m: importlib.util.find_spec(f"diagnostics.{m}") is not None
           for m in ("baseline", "prom", "drain")}
    saved = None
    if has["baseline"]:
        from . import baseline as baseline_mod
        saved = baseline_mod.load(baseline) if baseline else None
    job = jobs.job_source("node-check", values)

    def amend(results: List[Result]) -> None:
        if has["baseline"]:
            amend_with(baseline_mod.deviations(results, saved))(results)

    outcome = cli.execute(opts, job, out=out, after_table=node_view.render_actions, amend=amend)
    if save_baseline and has["baseline"]:
        baseline_mod.save(save_baseline, outcome.results)
    if prom and has["prom"]:
        from . import prom as prom_mod
        prom_mod.write(prom, outcome.results)
    if has["drain"]:
        from . import drain as drain_mod
        targets = cli.select_targets(opts, note=io.StringIO())
        steps = drain_mod.plan(outcome.results, targets, undrain=undrain)
        if steps:
            drain_mod.run(steps, execute=drain or undrain, out=out)
    return outcome
