"""What every task does around its diagnostic: parse common flags, pick targets, run, render.

The engine half of a task: it returns an ``Outcome`` (results and exit code) or raises one of
``errors.MldiagError`` (bad input: exit 4; an interrupted run: 130, 143, 129) and never ends
the process itself; ``tasks.py`` maps both to Invoke's ``Exit``. No engine module imports
Invoke (only Fabric does, under the SSH transport): tests/unit/test_engine.py.
"""

import datetime
import json
import os
import re
import secrets
import stat
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, List, Mapping, Optional, Sequence, TextIO, Union

from . import jobs, live, runner, shards
from ..core import nodeset, termination
from ..views import jsonl, junit, render
from ..inventory import topology
from .bundle import Job
from ..core.errors import EXIT_ERROR, EXIT_INTERRUPTED, InputError, TargetInputError  # noqa: F401 (TargetInputError: re-exported)
from ..core.outcome import Outcome
from ..core.results import Result, exit_code
from ..core.savedir import SaveDir, result_file_name
from ..inventory.topology import Target

JobSource = Union[Job, Callable[[Target], Job]]
# The runtime's own files in a run's private directory (scripts/_runtime.py: RUNTIME_FILE...,
# REPORT_FILE, the one $MLDIAG_RESULT names): no script or --put file may take their names.
OWN_FILES = ".mldiag-"


@dataclass
class Options:
    """The common flags (docs/architecture.md), as given on the command line (numbers still strings)."""
    host: Sequence[str] = ()
    group: Sequence[str] = ()
    hosts_file: Optional[str] = None
    json: bool = False
    save: Optional[str] = None
    jsonl: bool = False      # one JSON line per result as it arrives (implies json: stdout is JSON only)
    junit: Optional[str] = None   # FILE for a JUnit XML report (views/junit.py)
    parallel: Optional[str] = None
    timeout: Optional[str] = None
    keep_remote: bool = False
    diff: bool = False
    no_color: bool = False
    quiet: bool = False      # nothing on stderr while it runs (api.run: a team's own task prints)

    def __post_init__(self) -> None:
        # --jsonl's stdout is JSON as --json's is: whatever a task would print beside the
        # document (node-check's Slurm lines) goes to stderr alike
        if self.jsonl:
            self.json = True


def parse_positive_number(flag: str, value: Optional[str], *, integer: bool = False) -> Optional[float]:
    """``--timeout abc`` is bad input (exit 4), named by its flag."""
    if value is None or value == "":
        return None
    text = str(value).strip()
    pattern = r"[0-9]+" if integer else r"[0-9]+(\.[0-9]*)?|\.[0-9]+"
    if not re.fullmatch(pattern, text) or float(text) <= 0:
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise InputError(f"{flag}: expected {kind}, got {value!r}")
    return int(text) if integer else float(text)


def select_targets(opts: Options, *, note: Optional[TextIO] = None) -> List[Target]:
    """The targets of ``-H``/``-g``, else hosts.yaml's ``defaults.targets``: said on ``note``
    (default stderr) when it is a terminal and the file names them, so a run on a fleet
    nobody named is never a surprise. An unknown target or group names the hosts file read,
    or where mldiag looked for one."""
    topo = topology.load(opts.hosts_file)
    targets = _select(topo, opts.host, opts.group)
    note = note if note is not None else sys.stderr
    if not (opts.host or opts.group) and topo.default_targets_given and not opts.quiet \
            and render.is_terminal(note):
        note.write(f"mldiag: no -H/-g: running on defaults.targets from "
                   f"{os.path.abspath(topo.path)}: {topology.fold_names(topo.default_targets)}\n")
        note.flush()
    return targets


def _select(topo: topology.Topology, host: Sequence[str], group: Sequence[str]) -> List[Target]:
    try:
        return topo.select(_split(host), _split(group, "--group"))
    except InputError as exc:
        if not exc.reason.startswith(("unknown target", "unknown group")):
            raise
        raise InputError(f"{exc}\nmldiag: {topo.origin.describe()}") from None


def _split(values: Sequence[str], flag: str = "--host") -> List[str]:
    """Repeatable flags; a value may also be a comma list (node sets keep their brackets).
    A value that names nothing (``-H ''``, ``-H ,``) is bad input: running on the default
    targets instead would answer a question nobody asked."""
    out = []
    for value in values or ():
        names = [v.strip() for v in nodeset.split_top_level(value, ",") if v.strip()]
        if not names:
            raise InputError(f"{flag}: expected a target name, a comma list or a node set, "
                             f"got {value!r}")
        out.extend(names)
    return out


def _read_local(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise InputError(f"{flag} {path}: {exc.strerror}")


def script_file_job(path: str, argv: Sequence[str], puts: Sequence[str]) -> Job:
    """``run-script``: the user's script and its ``--put`` files, all inside the bundle."""
    return script_code_job(os.path.basename(path), _read_local("run-script", path), argv, puts)


def script_code_job(name: str, source: bytes, argv: Sequence[str], puts: Sequence[str]) -> Job:
    """``run-script`` with the script's bytes in hand: a file's, ``-c CODE``'s (named ``-c``)
    or stdin's (named ``-``); shipped in the bundle as a file of that name either way."""
    extra = {}
    _not_own_file("run-script", name, name)
    for put in puts:
        base = os.path.basename(put)
        if base in extra or base == name:
            raise InputError(f"--put {put}: two uploaded files would be named {base!r}")
        _not_own_file("--put", put, base)
        extra[base] = _read_local("--put", put)
    return Job(diagnostic="run-script", script_name=name, script_source=source,
               argv=tuple(argv), mode="script", extra_files=extra)


def _not_own_file(flag: str, given: str, name: str) -> None:
    if name.startswith(OWN_FILES):
        raise InputError(f"{flag} {given}: a name starting with {OWN_FILES!r} is mldiag's own in "
                         f"the run's directory (the runtime's files, the $MLDIAG_RESULT file)")


def read_stdin(what: str) -> bytes:
    """The script piped to ``run-script -`` (as ``python -`` reads it: to the end)."""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise InputError(f"{what}: no standard input to read the script from")
    try:
        return stream.read()
    except OSError as exc:
        raise InputError(f"{what}: cannot read standard input: {exc.strerror or exc}")


def save_result(save: SaveDir, result: Result) -> None:
    """One target's document, written as soon as it arrives (an interrupted run keeps it)."""
    save.write_json(result_file_name(result.target), render.strict_json(result.to_dict()))


def save_summary(save: SaveDir, results: Sequence[Result],
                 interrupted: Optional[Sequence[str]] = None,
                 interrupted_code: int = EXIT_INTERRUPTED) -> None:
    """summary.json; after Ctrl-C, TERM or HUP (``interrupted``: the targets that had not
    finished) it says so, with ``interrupted_code`` (130, 143, 129), and lists only what finished."""
    doc = {"summary": render.summary_line(results) if results else "nothing finished",
           "exit_code": interrupted_code if interrupted is not None else exit_code(results),
           "targets": {r.target: r.status for r in results}}
    if interrupted is not None:
        doc.update(interrupted=True, not_finished=list(interrupted))
    save.write_json("summary.json", doc)


def open_save_dir(path: Optional[str], targets: Sequence[Target]) -> Optional[SaveDir]:
    """``--save DIR`` made or checked before any connection (savedir.py says what is refused);
    None without --save."""
    if not path:
        return None
    save = SaveDir.open(path)
    try:
        save.check_files(["summary.json"] + [result_file_name(t.name) for t in targets])
    except InputError:
        save.close()
        raise
    return save


class ReportFile:
    """A report a flag names (``--junit FILE``): checked before anything connects, written once at
    the end. FILE's directory is made if missing and opened then (the path to it is the user's
    choice and may go through links they made, as ``--save``'s is: savedir.py's NOTE); FILE
    itself is never followed: the report goes to a fresh temp name in that directory
    (``O_CREAT|O_EXCL|O_NOFOLLOW``) and is renamed over FILE (``savedir.SaveDir.write_text``), so
    a link planted at FILE is replaced, never written through, and a reader never sees half a
    report. Mode 0644 whatever the umask: a CI server's agent, maybe another user than a
    ``sudo mldiag`` run, reads it."""

    MODE = 0o644

    def __init__(self, flag: str, path: str, directory: SaveDir, name: str):
        self.flag, self.path, self.directory, self.name = flag, path, directory, name

    @classmethod
    def open(cls, flag: str, path: Optional[str]) -> Optional["ReportFile"]:
        """None without the flag; InputError (exit 4, naming the flag and FILE) when FILE cannot
        be written: its directory cannot be made or opened or written, FILE is a directory."""
        if path is None or path is False:
            return None
        shown = f"{flag} {path}"
        parent, name = os.path.split(str(path))
        if not name or name in (".", ".."):
            raise InputError(f"{shown}: expected a file name, not a directory")
        try:
            try:
                fd = os.open(parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:   # made, as pytest's --junitxml makes it
                os.makedirs(parent, exist_ok=True)
                fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise InputError(f"{shown}: its directory {parent}: {exc.strerror or exc}")
        report = cls(flag, str(path), SaveDir(fd, parent or "."), name)
        try:
            report._check()
        except BaseException:
            report.close()
            raise
        return report

    def _check(self) -> None:
        shown = f"{self.flag} {self.path}"
        fd = self.directory.fd
        try:
            st = os.stat(self.name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise InputError(f"{shown}: {exc.strerror or exc}")
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise InputError(f"{shown}: a directory is in the way")
        probe = f".{self.name}.{secrets.token_hex(6)}.probe"
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600, dir_fd=fd))
            os.unlink(probe, dir_fd=fd)
        except OSError as exc:
            raise InputError(f"{shown}: cannot write in its directory: {exc.strerror or exc}")

    def write(self, write: Callable[[TextIO], None]) -> Optional[str]:
        """Write the report; None, or the message naming the flag and FILE when it could not be
        written (the run's results stand: the caller makes the exit code at least 3)."""
        def whole(stream: TextIO) -> None:
            os.fchmod(stream.fileno(), self.MODE)
            write(stream)
        try:
            self.directory.write_text(self.name, whole)
        except OSError as exc:
            return f"{self.flag} {self.path}: not written: {exc.strerror or exc}"
        return None

    def close(self) -> None:
        self.directory.close()


def write_junit(report: Optional[ReportFile], suites: Sequence[junit.Suite]) -> Optional[str]:
    """``--junit``'s report of ``suites`` (None without --junit); the message when it failed."""
    if report is None:
        return None
    try:
        return report.write(lambda stream: junit.render_junit(suites, stream))
    finally:
        report.close()


def with_messages(outcome: Outcome, *messages: Optional[str]) -> Outcome:
    """``outcome`` and the messages that are not None; any makes the exit code at least 3."""
    given = tuple(m for m in messages if m)
    if not given:
        return outcome
    return Outcome(outcome.results, max(outcome.exit_code, EXIT_ERROR), outcome.messages + given)


def configured(config: Any, name: str) -> Any:
    """``mldiag.NAME`` in an Invoke config (a team's ``tasks.py`` sets defaults there, see
    ``api.collection``); None where it is not set."""
    section = config.get("mldiag") if config is not None else None
    return section.get(name) if section is not None else None


def run_diagnostic(spec, opts: Options, values: Mapping[str, Any], *,
                   out: Optional[TextIO] = None) -> Outcome:
    """A registered diagnostic's task (``spec``: ``registry.DiagnosticSpec``): ``values`` checked
    before anything connects, then the spec's own run, or one fan-out with the spec's fleet
    judgement and view. A runbook step builds the same job and applies the same judgement
    (``runbooks/run.py``)."""
    given = spec.given(values)
    spec.check(given)
    opts = spec.options(opts, given)
    if spec.run is not None:
        return spec.run(opts, given, out=out)
    return execute(opts, jobs.job_source(spec.name, given), out=out, after_table=spec.view,
                   amend=spec.judge(given, topology.load(opts.hosts_file)),
                   fan_out=spec.fan_out(given))


def execute(opts: Options, job: JobSource, *, out: TextIO = None,
            after_table: Optional[Callable[[List[Result], TextIO], None]] = None,
            amend: Optional[Callable[[List[Result]], None]] = None,
            targets: Optional[Sequence[Target]] = None,
            fan_out: Optional[Callable[..., List[Result]]] = None) -> Outcome:
    """Run ``job`` on the selected targets and print; the outcome's code is the worst status's.
    InputError before anything connects; ``errors.Interrupted`` after Ctrl-C, TERM or HUP
    (what arrived is saved first). ``amend``: a look at every result together before anything
    is saved or shown (node-check adds the fleet's baseline/majority findings there); with
    it, results are saved, and ``--jsonl`` lines printed, when all have arrived (or as they
    are, after an interrupt). ``targets``: run on these instead of the ones the options select
    (node-check --undrain narrows a Slurm target to the nodes of its maintenance window).
    ``fan_out``: how the targets are run, ``runner.run_many``'s signature and answer (one
    result per target, in their order; nccl-check --pairs runs them two by two,
    engine/groups.py). ``--junit FILE`` is written at the end (after an interrupt too, the
    targets that had not finished as errors); one that cannot be written then is said, with
    exit code at least 3."""
    out = out or sys.stdout
    timeout = parse_positive_number("--timeout", opts.timeout)
    parallel = parse_positive_number("--parallel", opts.parallel, integer=True)
    targets = list(targets) if targets is not None else select_targets(opts)
    if callable(job):
        for target in targets:   # every target's job is checked before anything runs
            job(target)
    shards.requested_workers()                 # a bad $MLDIAG_WORKERS is bad input here too
    report = ReportFile.open("--junit", opts.junit)   # bad input above leaves no FILE's directory
    try:
        save = open_save_dir(opts.save, targets)   # last: bad input above leaves no DIR behind
    except BaseException:
        if report is not None:
            report.close()
        raise

    def job_for(target: Target) -> Job:
        j = job(target) if callable(job) else job
        changes = {}
        if timeout is not None:
            changes["timeout"] = timeout
        if opts.keep_remote:
            changes["keep_remote"] = True
        return replace(j, **changes) if changes else j

    diagnostic = job_for(targets[0]).diagnostic if targets else "mldiag"
    # One line per running target on a terminal's stderr (never with --json, never on a pipe);
    # one target's run-script shows its output as it comes.
    progress = live.open_area(sys.stderr, [t.name for t in targets],
                              enabled=not (opts.json or opts.quiet),
                              passthrough=len(targets) == 1 and job_for(targets[0]).mode == "script")
    finished: List[Result] = []
    streaming = opts.jsonl and amend is None   # a fleet judgement may change any result: held
    started, clock = datetime.datetime.now(), time.monotonic()

    def suite(results: Sequence[Result], not_run: Sequence[junit.NotRun] = ()) -> junit.Suite:
        return junit.Suite(name=junit.suite_name(diagnostic), results=results, check=diagnostic,
                           time_s=time.monotonic() - clock, started=started, not_run=not_run)

    def arrived(result: Result) -> None:
        if save is not None and amend is None:
            save_result(save, result)
        finished.append(result)
        progress.add(result)
        if streaming:
            jsonl.write_result(result, out)

    try:
        results = (fan_out or runner.run_many)(targets, job_for, parallel=parallel or runner.DEFAULT_PARALLEL,
                                               on_result=arrived,
                                               on_progress=progress.event if progress.live else None)
    except KeyboardInterrupt as interrupt:   # Ctrl-C, or TERM/HUP (termination.Terminated)
        # run_many has closed every connection: the remote runtimes see stdin close and stop
        code = termination.exit_code_of(interrupt)
        done = {r.target for r in finished}
        # a Slurm login target's rows are its nodes: what did not finish is named by target
        not_finished = sorted(t.name for t in targets if t.name not in done and t.slurm is None)
        if save is not None:
            if amend is not None:
                for result in finished:
                    save_result(save, result)
            save_summary(save, list(finished), interrupted=not_finished, interrupted_code=code)
        failed = write_junit(report, [suite(finished, [junit.NotRun(
            name, "interrupted", f"not finished: {termination.describe(interrupt)}", error=True)
            for name in not_finished])])
        if opts.jsonl:
            _jsonl_after_interrupt(out, finished if not streaming else [], finished, diagnostic,
                                   code, not_finished)
        detail = f"{len(finished)} of {len(targets)} targets finished" + (
            f", saved in {opts.save}" if opts.save else "")
        raise termination.interrupted(interrupt, detail + (f"; {failed}" if failed else ""))
    finally:
        progress.done()
    if amend is not None:
        amend(results)
        if save is not None:
            for result in results:
                save_result(save, result)
    if save is not None:
        save_summary(save, results)
        save.close()
    failed = write_junit(report, [suite(results)])
    outcome = with_messages(Outcome(results, exit_code(results)), failed)
    if opts.jsonl:
        if not streaming:
            for result in results:
                jsonl.write_result(result, out)
        jsonl.write_summary(results, out, diagnostic=diagnostic, code=outcome.exit_code)
    elif opts.json:
        render.render_json(results, out)
    else:
        details = render.render_diff if opts.diff else after_table
        # NOTE: one target's run-script output went to the terminal as it ran; when the table
        # goes to that terminal too it is not shown twice (to a file it is: nothing is above it).
        streamed = [targets[0].name] if progress.passed_through and render.is_terminal(out) else []
        render.render_table(results, out, details=details,
                            color=render.wants_color(out, no_color=opts.no_color),
                            streamed=streamed)
    out.flush()
    return outcome


def _jsonl_after_interrupt(out: TextIO, held: Sequence[Result], finished: Sequence[Result],
                           diagnostic: str, code: int, not_finished: Sequence[str]) -> None:
    """``--jsonl`` after Ctrl-C, TERM or HUP: the results held for a fleet judgement, as they
    are, then the summary that says the run was cut short; a reader that has gone is no
    reason to lose the interrupt."""
    try:
        for result in held:
            jsonl.write_result(result, out)
        jsonl.write_summary(finished, out, diagnostic=diagnostic, interrupted_code=code,
                            not_finished=not_finished)
    except (OSError, ValueError):
        pass


def internal_error(exc: BaseException) -> str:
    """One line for the terminal; the traceback goes to a private file named in it."""
    import tempfile
    import traceback
    from ..core.redact import redact_text
    fd, path = tempfile.mkstemp(prefix="mldiag-internal-", suffix=".txt")
    with os.fdopen(fd, "w") as f:   # a file a user attaches to a bug report: no secrets in it
        f.write(redact_text("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))
    return (f"mldiag: internal error (a bug of ours, please report it): {type(exc).__name__}: "
            f"{redact_text(str(exc))}\nmldiag: full traceback in {path}")


def show_hosts(opts: Options, *, out: TextIO = None, note: TextIO = None) -> None:
    """``hosts``: each target and its hop chain on ``out``; on ``note`` (stderr) which hosts file
    was read (or where mldiag looked) and the targets a task runs on without -H/-g, so the
    table on stdout stays the data alone. InputError for a bad hosts.yaml or selection (or an
    ssh_config that ``ssh -G`` refuses)."""
    from ..transport import describe_targets
    out, note = out or sys.stdout, note or sys.stderr
    topo = topology.load(opts.hosts_file)
    targets = _select(topo, opts.host, opts.group) \
        if (opts.host or opts.group) else list(topo.targets.values())
    rows = list(zip([t.name for t in targets], describe_targets(targets)))
    if opts.json:
        json.dump([{"name": name, "chain": chain} for name, chain in rows], out, indent=2)
        out.write("\n")
    else:
        render.render_hosts(rows, out)
    out.flush()
    defaults = topology.fold_names(topo.default_targets)
    render.emit(note, f"mldiag: {topo.origin.describe()}\nmldiag: without -H/-g: {defaults}"
                      f"{' (defaults.targets)' if topo.default_targets_given else ''}\n")
