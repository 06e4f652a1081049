"""Running a runbook: its steps in order on every selected target, with the fleet machinery.

Semantics (docs/runbooks.md, "Writing a runbook", says the same for users):
- Each step runs on all the targets still in the run at once (``runner.run_many``), one step
  after the other; all steps share one SSH connection pool.
- A step is skipped on every target when it refers to a parameter that was not given and has
  no default; on one target when its ``when:`` does not hold there (``gpu-status.fail``: the
  step ``gpu-status`` ran on the target and its status there is at least ``fail``), or when an
  argument refers to a setting the target lacks (``{{ target.models.draft }}``, or no
  ``models:`` at all for a model step).
- A target leaves the run — later steps skip it, so an unreachable machine is asked once, not
  once per step — when a step ends in ``error`` at a layer that no later step can get past
  (``DROP_LAYERS``: unreachable, auth, hostkey, become, container, interpreter, upload), or
  when the step's status there is at least its ``stop_if:``. A timed-out or crashed diagnostic
  keeps the target in the run: the next step asks something else.
- A Slurm login target's allocation is made at its first step and shared by the later ones
  (released when the runbook ends, in every outcome); its rows (``cluster-a:n3``)
  count for it: conditions see the worst of them.
- A step's local files are read before anything runs: a node-check step's ``baseline:``
  (``_judges``), a run-script step's script and put files (``_scripts``: its job is the
  task's, with each target's arguments); one that cannot be read is bad input (exit 4).
- The exit code is the worst status of the steps that ran (skipped ones do not count);
  130 when interrupted, 143 / 129 when ended by TERM / HUP (the report of what ran is still
  written).

``execute`` and ``list_runbooks`` return an ``outcome.Outcome`` or raise ``InputError``;
the task layer alone turns them into an exit (nothing here imports Invoke).
"""

import json
import os
import re
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO

from .. import __version__
from ..engine import execute as engine, jobs, registry, runner
from ..views import render
from . import report, model as runbook
from ..core import termination
from ..inventory import topology
from ..engine.bundle import Job
from ..core.errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, InputError, TargetInputError
from ..transport.ssh import SshPool
from ..core.outcome import Outcome
from ..core.results import Result, exit_code, worst_status
from .model import Runbook, Step
from ..core.savedir import SaveDir, result_file_name
from ..inventory.topology import Target
from ..inventory.yamlfile import At

DROP_LAYERS = ("unreachable", "auth", "hostkey", "become", "container", "interpreter", "upload")
FORMATS = ("md", "json")


@dataclass(frozen=True)
class Skip:
    """A step that did not run on a target, and why."""
    target: str
    kind: str      # param | when | setting | stopped | unreachable | interrupted
    reason: str


@dataclass
class StepRun:
    number: int
    step: Step
    results: List[Result] = field(default_factory=list)
    skipped: List[Skip] = field(default_factory=list)
    owners: Dict[str, str] = field(default_factory=dict)   # result row → selected target

    def owner(self, result: Result) -> str:
        return self.owners.get(result.target, result.target)

    def status_of(self, target: str) -> Optional[str]:
        """The worst status of the step's results on ``target``; None where it did not run."""
        statuses = [r.status for r in self.results if self.owner(r) == target]
        return worst_status(statuses) if statuses else None

    def skip_of(self, target: str) -> Optional[Skip]:
        return next((s for s in self.skipped if s.target == target), None)


@dataclass
class RunbookRun:
    runbook: Runbook
    targets: List[str]
    params: Dict[str, str]
    started: datetime
    duration_s: float = 0.0
    steps: List[StepRun] = field(default_factory=list)
    interrupted: bool = False
    interrupted_code: int = EXIT_INTERRUPTED   # 130 for Ctrl-C, 143 / 129 for TERM / HUP
    interrupted_as: str = "interrupted"        # or "terminated (SIGTERM)": for the message
    # where each target is, in words ("pve (main) → sudo → pct 200"), for the report
    placements: Dict[str, str] = field(default_factory=dict)

    @property
    def results(self) -> List[Result]:
        return [r for s in self.steps for r in s.results]

    @property
    def exit_code(self) -> int:
        return self.interrupted_code if self.interrupted else exit_code(self.results)


def placement(target: Target) -> str:
    """Where a target is, from hosts.yaml alone (nothing resolved): ``pve (main) → sudo →
    pct 200``, ``this machine``."""
    if target.local:
        parts = ["this machine"]
    else:
        host = target.host
        parts = [host.name + (f" ({host.address})" if host.address and host.address != host.name else "")]
    if target.slurm is not None:
        parts.append("Slurm")
    if target.become:
        parts.append(target.become)
    if target.container is not None:
        parts.append(f"{target.container.runtime} {target.container.id}")
    return " → ".join(parts)


def _owner_of(name: str, targets: Sequence[Target]) -> str:
    """A Slurm row ``cluster-a:n3`` belongs to the selected ``cluster-a`` (or ``cluster-a:n[1-4]``)."""
    names = [t.name for t in targets]
    if name in names:
        return name
    base = name.split(":", 1)[0]
    return next((n for n in names if n.split(":", 1)[0] == base), name)


def _job_for(step: Step, values: Dict[str, str], target: Target,
             scripts: Dict[str, Job]) -> Job:
    """The step's job on one target: MissingValue or TargetInputError when it cannot run. A
    run-script step's is its job as read before the run (``_scripts``) with this target's
    arguments: the task's job for the same script, files and arguments."""
    if step.task == runbook.SCRIPT_TASK:
        return replace(scripts[step.id], argv=tuple(step.resolve(values, target, ["args"])
                                                    .get("args", ())))
    return jobs.job_source(step.task, step.resolve(values, target))(target)


def _scripts(book: Runbook, values: Dict[str, str]) -> Dict[str, Job]:
    """Each run-script step's job, its arguments aside: its script (or code) and put files read
    now, before anything runs, as ``run-script`` reads them (``engine.script_file_job`` /
    ``engine.script_code_job``). A file that cannot be read or shipped is bad input naming the
    runbook's file:line:key. A step that refers to a parameter not given: none (it is skipped
    on every target)."""
    found = {}
    for step in book.steps:
        if step.task != runbook.SCRIPT_TASK or any(p not in values for p in step.params):
            continue
        args = dict(step.args)
        files = step.local_files(values)
        names = {} if "script" in args else {"-c": "code:"}    # the bundle's name for code
        for _key, path, where in files:
            _check_local_file(path, where, names)
        puts = [path for key, path, _where in files if key != "script"]
        try:
            if "code" in args:
                found[step.id] = engine.script_code_job("-c", os.fsencode(args["code"]), (), puts)
            else:
                found[step.id] = engine.script_file_job(files[0][1], (), puts)
        except InputError as exc:     # what the checks above did not foresee (a file gone since)
            raise dict(step.where)["args"].error(exc.reason) from None
    return found


def _check_local_file(path: str, where: At, names: Dict[str, str]) -> None:
    """A run-script step's file: readable, and a name the run's directory can take (none of the
    runtime's, none twice); ``names``: the names taken so far."""
    name = os.path.basename(path)
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise where.error(f"{path}: {exc.strerror or exc}") from None
    if name.startswith(engine.OWN_FILES):
        raise where.error(f"{path}: a name starting with {engine.OWN_FILES!r} is mldiag's own in the "
                          "run's directory (the runtime's files, the $MLDIAG_RESULT file)")
    if name in names:
        raise where.error(f"{path}: two uploaded files would be named {name!r}")
    names[name] = path


def _plan(sr: StepRun, targets: Sequence[Target], values: Dict[str, str],
          gone: Dict[str, Skip], earlier: Dict[str, StepRun],
          scripts: Dict[str, Job]) -> List[Target]:
    """The targets this step runs on; every other target gets its Skip."""
    step = sr.step
    missing = [p for p in step.params if p not in values]
    eligible = []
    for target in targets:
        if missing:
            skip = Skip(target.name, "param", f"parameter {missing[0]} not given "
                                              f"(--param {missing[0]}=VALUE)")
        elif target.name in gone:
            skip = gone[target.name]
        else:
            skip = None
            for cond in step.when:
                status = earlier[cond.step].status_of(target.name)
                if not cond.holds(status):
                    seen = f"it was {status}" if status else "it did not run"
                    skip = Skip(target.name, "when", f"when: {cond} does not hold ({seen})")
                    break
            if skip is None:
                try:
                    _job_for(step, values, target, scripts)
                except (runbook.MissingValue, TargetInputError) as exc:
                    skip = Skip(target.name, "setting", str(exc))
        if skip is None:
            eligible.append(target)
        else:
            sr.skipped.append(skip)
    return eligible


def _leave(sr: StepRun, gone: Dict[str, Skip]) -> None:
    """Targets that leave the run after this step: unreachable, or stopped by ``stop_if:``."""
    step = sr.step
    for result in sr.results:
        owner = sr.owner(result)
        if owner in gone:
            continue
        layer = result.error.layer if result.status == "error" and result.error else None
        if layer in DROP_LAYERS:
            gone[owner] = Skip(owner, "unreachable", f"left the run at step {sr.number} "
                                                     f"({step.id}): {layer}")
    if step.stop_if:
        for owner in dict.fromkeys(sr.owner(r) for r in sr.results):
            status = sr.status_of(owner)
            if owner not in gone and runbook.Condition(step.id, step.stop_if).holds(status):
                gone[owner] = Skip(owner, "stopped", f"stopped after step {sr.number} "
                                                     f"({step.id}: {status}; stop_if: {step.stop_if})")


def _step_hooks(book: Runbook, values: Dict[str, str], hook: str, *more: Any) -> Dict[str, Callable[..., Any]]:
    """Each step's answer to its task's ``hook`` (``registry.DiagnosticSpec``: ``judge``, the fleet
    judgement; ``fan_out``, how its targets run together), from the step's client-side arguments
    (one value for the whole step), where it has one. A step that refers to a parameter not
    given is skipped on every target: none."""
    found = {}
    for step in book.steps:
        if step.task == runbook.SCRIPT_TASK or any(p not in values for p in step.params):
            continue
        spec = registry.get(step.task)
        answer = getattr(spec, hook)(step.resolve(values, None, [a.name for a in spec.args if a.client]), *more)
        if answer is not None:
            found[step.id] = answer
    return found


def _judges(book: Runbook, values: Dict[str, str], hosts: Any = None) -> Dict[str, Callable[[List[Result]], None]]:
    """Each step's fleet judgement, as its task applies it (node-check's baseline and outliers,
    hosts.yaml's golden files given ``hosts``, the run's Topology; stacks' fold)."""
    return _step_hooks(book, values, "judge", hosts)


def run(book: Runbook, targets: Sequence[Target], params: Dict[str, str], *,
        parallel: int = runner.DEFAULT_PARALLEL, timeout: Optional[float] = None,
        keep_remote: bool = False, run_many: Callable[..., List[Result]] = runner.run_many,
        on_result: Optional[Callable[[StepRun, Result], None]] = None,
        on_step: Optional[Callable[[StepRun, List[Target]], None]] = None,
        judges: Optional[Dict[str, Callable[[List[Result]], None]]] = None,
        scripts: Optional[Dict[str, Job]] = None) -> RunbookRun:
    """Run every step of ``book`` on ``targets``. ``params``: the command line's, checked here
    (InputError for an undeclared one). ``judges``: each step's fleet judgement by step id, as
    ``_judges`` makes them; ``scripts``: each run-script step's job, as ``_scripts`` reads them
    (each made here when not given). Returns what ran and what was skipped, also when
    interrupted (``interrupted`` set)."""
    values = book.param_values(params)
    if judges is None:      # bad input (a step's --baseline file) before anything runs
        judges = _judges(book, values)
    if scripts is None:     # and a run-script step's files
        scripts = _scripts(book, values)
    fan_outs = _step_hooks(book, values, "fan_out")     # nccl-check's pairs
    record = RunbookRun(runbook=book, targets=[t.name for t in targets], params=dict(params),
                        started=datetime.now(timezone.utc),
                        placements={t.name: placement(t) for t in targets})
    t0 = time.monotonic()
    gone: Dict[str, Skip] = {}
    by_id: Dict[str, StepRun] = {}
    pool = SshPool()
    allocations: Dict[str, object] = {}      # a Slurm target's, shared by the steps (runner)
    try:
        for number, step in enumerate(book.steps, 1):
            sr = StepRun(number, step)
            record.steps.append(sr)
            by_id[step.id] = sr
            if record.interrupted:
                sr.skipped = [Skip(t.name, "interrupted", "the run was interrupted")
                              for t in targets]
                continue
            eligible = _plan(sr, targets, values, gone, by_id, scripts)
            if on_step:
                on_step(sr, eligible)
            if not eligible:
                continue
            arrived: List[Result] = []
            amend = judges.get(step.id)     # judged on all results: shown after that

            def job_for(target: Target, step=step) -> Job:
                job = _job_for(step, values, target, scripts)
                limit = timeout if timeout is not None else step.timeout
                return replace(job, timeout=limit if limit is not None else job.timeout,
                               keep_remote=keep_remote or job.keep_remote)

            def got(result: Result, sr=sr, arrived=arrived) -> None:
                sr.owners[result.target] = _owner_of(result.target, targets)
                arrived.append(result)
                if on_result and amend is None:
                    on_result(sr, result)

            try:
                sr.results = fan_outs.get(step.id, run_many)(eligible, job_for, parallel=parallel, pool=pool,
                                                             on_result=got, keep_allocations=allocations)
                if amend is not None:
                    amend(sr.results)
                    for result in sr.results if on_result else ():
                        on_result(sr, result)
            except KeyboardInterrupt as interrupt:   # Ctrl-C, TERM or HUP
                record.interrupted = True
                record.interrupted_code = termination.exit_code_of(interrupt)
                record.interrupted_as = termination.describe(interrupt)
                sr.results = list(arrived)
                for result in sr.results if on_result and amend is not None else ():
                    on_result(sr, result)
                answered = {sr.owner(r) for r in arrived}
                sr.skipped += [Skip(t.name, "interrupted", "the run was interrupted")
                               for t in eligible if t.name not in answered]
            _leave(sr, gone)
    finally:
        for allocation in allocations.values():
            allocation.release()
        pool.close()
        record.duration_s = time.monotonic() - t0
    return record


# ---------------------------------------------------------------------------- the task's glue

def _parse_params(values: Sequence[str]) -> Dict[str, str]:
    params: Dict[str, str] = {}
    for item in values or ():
        name, sep, value = item.partition("=")
        if not sep or not runbook.PARAM_NAME.fullmatch(name):
            raise InputError(f"--param {item!r}: expected NAME=VALUE")
        params[name] = value
    return params


def _dirs(hosts_file: Optional[str], runbooks_dirs: Sequence[str]):
    return runbook.search_dirs(topology.load(hosts_file).runbook_dirs, runbooks_dirs or ())


def _step_dir_name(number: int, step: Step) -> str:
    return f"{number:02d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', step.id)}"


class _SavedRun:
    """``--save DIR`` of a runbook: report.md, report.json and steps/NN-STEP/ (each step's
    results and summary.json), all through savedir.SaveDir. Opened and checked before any
    connection; a step's directory is made when its first result arrives."""

    def __init__(self, path: str, book: Runbook, targets: Sequence[Target]):
        self.top = SaveDir.open(path)
        self.steps: Optional[SaveDir] = None
        self._dirs: Dict[int, SaveDir] = {}
        try:
            self.top.check_files(["report.md", "report.json"])
            self.steps = self.top.subdir("steps")
            names = [result_file_name(t.name) for t in targets] + ["summary.json"]
            for number, step in enumerate(book.steps, 1):   # one left from an earlier run
                name = _step_dir_name(number, step)
                if self.steps.exists(name):
                    self._dirs[number] = self.steps.subdir(name)
                    self._dirs[number].check_files(names)
        except BaseException:
            self.close()
            raise

    def step(self, sr: StepRun) -> SaveDir:
        if sr.number not in self._dirs:
            self._dirs[sr.number] = self.steps.subdir(_step_dir_name(sr.number, sr.step))
        return self._dirs[sr.number]

    def close(self) -> None:
        for d in list(self._dirs.values()) + [self.steps, self.top]:
            if d is not None:
                d.close()


def execute(opts: engine.Options, name: str, *, params: Sequence[str] = (),
            runbooks_dirs: Sequence[str] = (), fmt: Optional[str] = None,
            out: Optional[TextIO] = None, drain: bool = False) -> Outcome:
    """``runbook NAME``: run it, print the report, write it to ``--save``. The outcome holds the
    RunbookRun and its exit code, also when interrupted (the report of what ran is written);
    InputError before anything connects. ``drain``: then drain the Slurm nodes whose worst
    action in any step is drain or worse (``drain_failing``)."""
    out = out or sys.stdout
    fmt = "json" if opts.json else (fmt or "md")
    if fmt not in FORMATS:
        raise InputError(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")
    if not name:
        raise InputError("name a runbook: `runbook NAME` (`runbook --list` shows them)")
    if name.startswith("-"):   # Invoke hands a task's positional whatever comes first
        raise InputError(f"{name!r} is not a runbook name (help: `inv --help runbook`; "
                         "`runbook --list` shows the runbooks)")
    timeout = engine.parse_positive_number("--timeout", opts.timeout)
    parallel = engine.parse_positive_number("--parallel", opts.parallel, integer=True)
    book = runbook.find(name, _dirs(opts.hosts_file, runbooks_dirs))
    given = _parse_params(params)
    values = book.param_values(given)
    judges = _judges(book, values, topology.load(opts.hosts_file))   # a step's --baseline file read here,
    scripts = _scripts(book, values)      # and a run-script step's files
    targets = engine.select_targets(opts)
    save = _SavedRun(opts.save, book, targets) if opts.save else None   # before connecting

    live = render.is_terminal(sys.stderr)

    def on_step(sr: StepRun, eligible: List[Target]) -> None:
        if live:
            sys.stderr.write(f"\r\033[Kstep {sr.number}/{len(book.steps)} "
                             f"{render.safe_text(sr.step.id)}: {len(eligible)} target(s)")
            sys.stderr.flush()

    def on_result(sr: StepRun, result: Result) -> None:
        if save is not None:
            engine.save_result(save.step(sr), result)

    try:
        record = run(book, targets, given, parallel=parallel or runner.DEFAULT_PARALLEL,
                     timeout=timeout, keep_remote=opts.keep_remote, on_result=on_result,
                     on_step=on_step, judges=judges, scripts=scripts)
    finally:
        if live:
            sys.stderr.write("\r\033[K")
    if save is not None:
        for sr in record.steps:
            if sr.results:
                engine.save_summary(save.step(sr), sr.results)
        save.top.write_text("report.md", lambda f: report.render_markdown(
            record, f, version=__version__))
        save.top.write_text("report.json", lambda f: report.render_json(
            record, f, version=__version__))
        save.close()
    if fmt == "json":
        report.render_json(record, out, version=__version__)
    else:
        report.render_markdown(record, out, version=__version__, appendix=not render.is_terminal(out),
                               saved=os.path.join(opts.save, "report.md") if save else None)
    out.flush()
    outcome = Outcome(record, record.exit_code, (record.interrupted_as,) if record.interrupted else ())
    if drain and not record.interrupted:
        return drain_failing(opts, record, outcome, targets, out=out)
    return outcome


def by_row(record: RunbookRun) -> List[Result]:
    """One result per row (a target, or a Slurm node row) that every step's results make
    together: the worst status, every finding, each named by its step; what node-check's drain
    plan reads (``drain.plan``)."""
    merged: Dict[str, Result] = {}
    for sr in record.steps:
        for r in sr.results:
            row = merged.get(r.target)
            if row is None:
                row = merged[r.target] = Result(diagnostic=f"runbook {record.runbook.name}", target=r.target,
                                                status="ok", summary="")
            row.status = worst_status([row.status, r.status])
            row.findings.extend(r.findings)
            if r.status == "error" and row.error is None:
                row.error = r.error
    return list(merged.values())


def drain_failing(opts: engine.Options, record: RunbookRun, outcome: Outcome, targets: Sequence[Target], *,
                  out: TextIO) -> Outcome:
    """``runbook --drain``: node-check's drain, on what all the steps found together (a node that
    one step says to drain is drained; one that errored is left as it is). Its lines go under the
    report (to stderr with --json); a drain that failed makes the exit code at least 3."""
    from ..builtin.node_check import drain as drain_mod
    steps = drain_mod.plan(by_row(record), targets)
    if not any(step.want != "skip" for step in steps):
        return Outcome(outcome.results, max(outcome.exit_code, EXIT_ERROR),
                       outcome.messages + ("--drain: no Slurm node was checked",))
    outcomes = drain_mod.run([s for s in steps if s.want != "resume"], drain=True)
    shown = [render.safe_text(line) for line in drain_mod.lines(outcomes)]
    messages = outcome.messages
    if opts.json:
        messages += tuple(shown)
    else:
        out.write("\nSlurm:\n" + "".join(f"  {line[len('Slurm: '):] if line.startswith('Slurm: ') else line}\n"
                                          for line in shown))
        out.flush()
    code = max(outcome.exit_code, EXIT_ERROR) if drain_mod.failed(outcomes) else outcome.exit_code
    return Outcome(outcome.results, code, messages)


def list_runbooks(hosts_file: Optional[str], runbooks_dirs: Sequence[str], *, as_json: bool = False,
                  out: Optional[TextIO] = None) -> Outcome:
    """``runbook --list``: every runbook found, with its description and parameters. A broken
    file is named on stderr (file:line) and makes the exit code 4; the others are still listed."""
    out = out or sys.stdout
    found = runbook.files(_dirs(hosts_file, runbooks_dirs))
    books, errors = [], []
    for name, (path, label) in found.items():
        try:
            books.append(runbook.load(path, label))
        except InputError as exc:
            errors.append(exc)
    if as_json:
        json.dump([{"name": b.name, "description": b.description, "source": b.source,
                    "path": b.path, "steps": [s.id for s in b.steps],
                    "params": [{"name": p.name, "description": p.description,
                                "default": p.default} for p in b.params]} for b in books],
                  out, indent=2)
        out.write("\n")
    else:
        report.render_list(books, out)
    out.flush()
    return Outcome(books, errors[0].exit_code if errors else EXIT_OK, tuple(map(str, errors)))
