"""The node-check task's engine: the diagnostic on every target (``engine.execute``), then what
only the client can do with all the answers together:

- ``--baseline FILE``: every fact that differs from the saved baseline, per node; without
  it, every fact in which a node differs from the majority of the selected nodes
  (``baseline.deviations``) -- added as findings before anything is saved or shown;
- each node's clock against this machine's (measured through the job's follow-up) and the
  other nodes' (``clock.findings``), added as findings the same way;
- ``--save-baseline FILE``: the nodes' facts saved for a later ``--baseline``;
- ``--prom FILE``: a node-exporter textfile-collector file (``prom.write``);
- Slurm: ``--drain`` drains the nodes whose worst action is drain or worse; without a flag,
  the commands it would run are printed (``drain.plan`` / ``drain.run``). ``--undrain``: the
  nodes mldiag drained are resumed inside a maintenance reservation, checked there, and kept
  resumed only if they pass (``undrain.open_windows`` / ``close_windows``: the check runs on
  those nodes only; the window is closed whatever happens during the check).
- Kubernetes (kubectl targets): ``--taint`` / ``--condition`` mark the node a pod runs on
  whose worst action is drain or worse, ``--untaint`` removes only mldiag's marks from one
  that passes; without a flag, the commands are printed (``taint.plan`` / ``taint.run``).

Bad input (a baseline file that is not one, both --drain and --undrain, a bad --dcgm-level,
a --prom name not ending in .prom) is refused before anything connects. A Slurm command that
fails (no rights, the login host gone) makes the exit code at least 3: the drain a user asked
for did not happen. Each output is its own: a ``--save-baseline`` or ``--prom`` file that cannot
be written (whatever the reason) is said, naming the file, with exit code at least 3, and the
outputs after it (the Slurm step) still run.
"""

import io
import sys
from typing import Any, Callable, List, Mapping, Optional, Sequence, Set, TextIO, Tuple

from . import baseline as baseline_mod, drain as drain_mod, view as node_view, prom as prom_mod
from . import clock as clock_mod
from ...engine import execute as engine, jobs
from ...core import results as results_mod, termination
from . import golden as golden_mod, taint as taint_mod, undrain as undrain_mod
from ...inventory import topology
from ...transport.ssh import SshPool
from ...core.errors import EXIT_ERROR, InputError, MldiagError
from ...core.outcome import Outcome
from ...views.render import safe_text
from ...core.results import Result


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


def check(values: Mapping[str, Any]) -> None:
    """Bad input among node-check's values (dash names), refused before anything connects."""
    level = values.get("dcgm-level")
    if level is not None and str(level) not in ("1", "2", "3"):
        raise InputError(f"--dcgm-level: expected 1, 2 or 3, got {level!r}")
    if values.get("drain") and values.get("undrain"):
        raise InputError("--drain and --undrain: give one of them")
    if values.get("prom"):
        prom_mod.check_path(values["prom"])


def judge(values: Mapping[str, Any], hosts: Any = None) -> Callable[[List[Result]], None]:
    """The fleet judgement of a task and a runbook step alike: every fact that differs from
    ``--baseline FILE`` (read here, before anything connects: a file that is not a baseline is
    bad input), else from the golden file hosts.yaml names for the target (``hosts``: the
    task's Topology; a runbook step has none), else from the majority of the nodes, as
    findings (golden.judgement); and each node's clock against this machine's and the other
    nodes' (``clock.findings``)."""
    deviations = golden_mod.judgement(values.get("baseline"), hosts)

    def amend(results: List[Result]) -> None:
        amend_with(deviations(results))(results)
        amend_with(clock_mod.findings(results))(results)
    return amend


def execute(opts: engine.Options, values: dict, *, save_baseline: Optional[str] = None,
            baseline: Optional[str] = None, drain: bool = False, undrain: bool = False,
            prom: Optional[str] = None, out: Optional[TextIO] = None) -> Outcome:
    """``run`` with the client's flags as keywords, checked first (as the task is)."""
    given = {**{key.replace("_", "-"): value for key, value in values.items()},
             "save-baseline": save_baseline, "baseline": baseline, "drain": drain,
             "undrain": undrain, "prom": prom}
    check(given)
    return run(opts, given, out=out)


def run(opts: engine.Options, values: Mapping[str, Any], *, out: Optional[TextIO] = None) -> Outcome:
    """The node-check task (``values``: dash names, checked): the diagnostic with its fleet
    judgement, then the outputs (``finish``); with ``undrain``, inside the drained nodes'
    maintenance windows."""
    out = out or sys.stdout
    save_baseline, prom = values.get("save-baseline"), values.get("prom")
    drain, undrain = bool(values.get("drain")), bool(values.get("undrain"))
    kube = {flag: bool(values.get(flag)) for flag in ("taint", "condition", "untaint")}
    amend = judge(values, topology.load(opts.hosts_file))
    job = jobs.job_source("node-check", values)
    if not undrain:
        outcome = engine.execute(opts, job, out=out, after_table=node_view.render_actions, amend=amend)
        return finish(opts, outcome, save_baseline, prom, drain=drain, out=out, **kube)
    # --undrain: the nodes mldiag drained are checked inside a maintenance reservation
    # (undrain.py); whatever happens while it opens or during the check (an error, a signal),
    # what was opened is closed, and the closing is not cut short by a signal (it is held)
    targets = engine.select_targets(opts)
    run_timeout = engine.parse_positive_number("--timeout", opts.timeout)
    pool = SshPool()
    windows: List[undrain_mod.Window] = []
    outcome: Optional[Outcome] = None
    ended: Optional[BaseException] = None
    try:
        run_on, opened = undrain_mod.open_windows(
            targets, lambda t: run_timeout or job(t).timeout or t.timeout, windows, pool=pool)
        outcome = engine.execute(opts, job, out=out, after_table=node_view.render_actions,
                              amend=amend, targets=run_on)
    except BaseException as exc:
        ended = exc
        raise
    finally:
        checked = outcome.results if outcome is not None and ended is None else None
        try:
            with termination.held():
                closed = undrain_mod.close_windows(windows, checked, pool=pool)
                if ended is not None and closed:   # the run's error follows: say these first
                    sys.stderr.write("".join(f"mldiag: {line}\n"
                                             for line in drain_mod.lines(closed)))
        finally:
            pool.close()
    in_window = {o.target for o in closed}
    return finish(opts, outcome, save_baseline, prom, undrain=True, out=out,
                  opened=opened, closed=closed, in_window=in_window, **kube)


def finish(opts: engine.Options, outcome: Outcome, save_baseline: Optional[str],
           prom: Optional[str], *, out: TextIO, drain: bool = False, undrain: bool = False,
           opened: Sequence[str] = (), closed: Sequence[drain_mod.DrainOutcome] = (),
           in_window: Set[str] = frozenset(), taint: bool = False, condition: bool = False,
           untaint: bool = False) -> Outcome:
    # each output is its own: one that fails is said after the others have run
    results = outcome.results
    problems = []
    if save_baseline:
        problems.append(write_output("--save-baseline", save_baseline,
                                 lambda: baseline_mod.save(save_baseline, results)))
    if prom:
        problems.append(write_output("--prom", prom, lambda: prom_mod.write(prom, results)))
    problems = [problem for problem in problems if problem]
    outcome = slurm(opts, outcome, drain=drain, undrain=undrain, out=out, opened=opened,
                    closed=closed, in_window=in_window)
    outcome = taint_mod.report(opts, outcome, out=out, taint=taint, condition=condition,
                               untaint=untaint)
    if not problems:
        return outcome
    return Outcome(outcome.results, max([outcome.exit_code, EXIT_ERROR] + [c for c, _ in problems]),
                   outcome.messages + tuple(message for _, message in problems))


def write_output(flag: str, path: str, write: Callable[[], None]) -> Optional[Tuple[int, str]]:
    """Run ``write()``; (exit code, a message naming ``flag`` and ``path``) when it failed,
    else None. Any failure: a file the system refuses (a directory in the way, a full disk) or
    a value the writer cannot take, which is a bug of ours (named so, its traceback saved)."""
    try:
        write()
    except MldiagError as exc:   # the writer's own words, which name the file
        text = str(exc)
        return exc.exit_code, text if path in text else f"{flag} {path}: {text}"
    except OSError as exc:
        return EXIT_ERROR, f"{flag} {path}: not written: {exc.strerror or exc}"
    except Exception as exc:
        bug = engine.internal_error(exc)[len("mldiag: "):]
        return EXIT_ERROR, f"{flag} {path}: not written: {bug}"
    return None


def slurm(opts: engine.Options, outcome: Outcome, *, drain: bool, undrain: bool, out: TextIO,
          opened: Sequence[str] = (), closed: Sequence[drain_mod.DrainOutcome] = (),
          in_window: Set[str] = frozenset()) -> Outcome:
    """Drain/resume (or, without a flag, show what would be run) for the Slurm node rows; the
    rows of an --undrain window were decided when it closed (``closed``)."""
    targets = engine.select_targets(opts, note=io.StringIO())   # said once already, by the run
    rest = [r for r in outcome.results if r.target not in in_window]
    steps = drain_mod.plan(rest, targets)
    if not closed and not any(step.want != "skip" for step in steps):
        if drain or undrain:
            return Outcome(outcome.results, max(outcome.exit_code, EXIT_ERROR),
                           outcome.messages + tuple(safe_text(line) for line in opened)
                           + ("--drain/--undrain: no Slurm node was checked",))
        return outcome
    outcomes = list(closed) + drain_mod.run(steps, drain=drain, undrain=undrain)
    shown = [safe_text(line) for line in [*opened, *drain_mod.lines(outcomes)]]
    messages = outcome.messages
    if opts.json:   # stdout is the JSON document: the Slurm lines go to stderr
        messages += tuple(shown)
    else:           # under a "Slurm:" heading of their own
        out.write("\nSlurm:\n" + "".join(f"  {line[len('Slurm: '):] if line.startswith('Slurm: ') else line}\n"
                                          for line in shown))
        out.flush()
    code = outcome.exit_code
    if drain_mod.failed(outcomes):
        code = max(code, EXIT_ERROR)
    return Outcome(outcome.results, code, messages)
