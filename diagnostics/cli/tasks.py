"""The task collection: thin @task wrappers over the engine (``engine/execute.py``, ``runbooks/run.py``).

The engine returns an ``Outcome`` or raises an ``errors.MldiagError``; ``MldiagTask.__call__``
is the one place either becomes Invoke's ``Exit`` (the process's exit code and stderr).
"""

import inspect
import json as jsonlib
import os
import sys
from dataclasses import replace

from typing import Dict, List, Optional

from invoke import Argument, Collection, Exit, Task, task

from ..builtin import BUILTIN, BUILTINS
from ..engine import execute, registry
from ..views import junit
from . import cmdline
from ..core import termination
from ..core.errors import EXIT_ERROR, EXIT_OK, InputError, MldiagError
from ..core.outcome import Outcome

# Invoke would give --host the short flag -h (taken by --help); ours are named, as in Fabric.
SHORT_FLAGS = {"host": "H", "group": "g", "code": "c"}
# The argv this process was started with; program.py sets it (``mldiag``), else sys.argv (``inv``).
COMMAND_LINE: Optional[List[str]] = None


def command_line() -> List[str]:
    return list(COMMAND_LINE if COMMAND_LINE is not None else sys.argv)


class MldiagTask(Task):
    """A Task whose only short flags are the ones in SHORT_FLAGS, and whose repeatable flags
    are checked against the raw command line before it runs (``check_command_line``)."""

    # a task that hands what follows `--` to something (run-script: to the script)
    takes_remainder = False

    def __init__(self, *args, **kwargs):
        kwargs["auto_shortflags"] = False
        kwargs.setdefault("iterable", [])
        kwargs["iterable"] = list(kwargs["iterable"]) + ["host", "group"]
        super().__init__(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        """The task's outcome, or mldiag's error, as the process's exit (the one place a run
        becomes an ``Exit``; program.py adds Invoke's own parse errors). Never a raw traceback on the terminal: our own bugs are named, their traceback
        saved. SIGTERM and SIGHUP end the run as Ctrl-C does: exit 128 + signal
        (``termination``)."""
        with termination.terminates_like_ctrl_c():
            try:
                self.check_command_line(kwargs)
                outcome = super().__call__(*args, **kwargs)
            except MldiagError as exc:   # bad input (4); a run interrupted after saving (130 ...)
                raise Exit(f"mldiag: {exc}", code=exc.exit_code)
            except KeyboardInterrupt as exc:   # before or after the engine's own handling
                raise Exit(f"mldiag: {termination.describe(exc)}",
                           code=termination.exit_code_of(exc))
            except BrokenPipeError:  # `mldiag ... | head`: the reader left; that is not an error
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                raise Exit(code=EXIT_OK)
            except Exception as exc:
                raise Exit(execute.internal_error(exc), code=EXIT_ERROR)
        if isinstance(outcome, Outcome) and (outcome.exit_code or outcome.messages):
            raise Exit(outcome.stderr_text(), code=outcome.exit_code)
        return outcome

    # ------------------------------------------------------------ the raw command line

    def flags(self) -> List[cmdline.Flag]:
        """This task's flags as the command line spells them (from its signature; Invoke's own
        Arguments lose their help text when built twice)."""
        params = list(inspect.signature(self.body).parameters.values())[1:]
        return [cmdline.Flag(p.name.strip("_").replace("_", "-"), SHORT_FLAGS.get(p.name),
                             takes_value=not isinstance(p.default, bool),
                             repeatable=p.name in self.iterable) for p in params]

    def remainder(self) -> Optional[List[str]]:
        """The tokens after ``--`` on this task's command line, byte for byte (None: no ``--``,
        or the task was not started from a command line)."""
        body, rest = cmdline.split_remainder(command_line()[1:])
        if cmdline.task_segment(body, self.names()) is None:
            return None
        return rest

    def names(self) -> List[str]:
        name = self.name or getattr(self.body, "__name__", "")
        return [name.replace("_", "-"), name, *self.aliases]

    def check_command_line(self, kwargs: Dict) -> None:
        """Bad input (exit 4), never a silent change of the run: a value of a repeatable flag
        that Invoke read as a flag of its own (``--arg=--json`` turning on --json), a
        repeatable flag given without a value (``-H`` last: Invoke starts a list flag with the
        value ``[]``, which its own check takes for a value, so a bare ``-H`` ran on the
        default targets), ``--`` on a task that passes nothing on. Checked here, not in
        Invoke's parser, so that ``inv`` says the same as ``mldiag`` (exit 4)."""
        body, rest = cmdline.split_remainder(command_line()[1:])
        flags = self.flags()
        segment = cmdline.task_segment(body, self.names())
        if segment is None:
            return
        if rest is not None and not self.takes_remainder:
            raise InputError(f"`--`: {self.names()[0]} takes no arguments after `--` (only "
                             f"run-script does, for its script)")
        for flag in flags:
            if not flag.repeatable:
                continue
            given = [str(v) for v in kwargs.get(flag.name.replace("-", "_")) or ()]
            lost = cmdline.lost_values(cmdline.written_values(segment, flag, flags), given)
            if lost:
                raise InputError(self.lost_value_message(flag, lost[0]))

    def lost_value_message(self, flag: cmdline.Flag, value: Optional[str]) -> str:
        named = flag.spellings[0] + (f" ({flag.spellings[1]})" if flag.short else "")
        if value is None:
            return f"{named} needs a value"
        return (f"{named} {value!r}: Invoke reads {value!r} as one of {self.names()[0]}'s own "
                f"flags, not as a value of {flag.spellings[0]}")

    def arg_opts(self, name, default, taken_names):
        opts = super().arg_opts(name, default, taken_names)
        if name in SHORT_FLAGS:
            opts["names"] = opts["names"] + [SHORT_FLAGS[name]]
        return opts


class RunScriptTask(MldiagTask):
    """``run-script``: what follows ``--`` is the script's; ``-c CODE`` stands for the path."""
    takes_remainder = True

    def get_arguments(self, *args, **kwargs):
        return _filling(super().get_arguments(*args, **kwargs), "code", "path")

    def lost_value_message(self, flag: cmdline.Flag, value: Optional[str]) -> str:
        if flag.name != "arg":
            return super().lost_value_message(flag, value)
        if value is None:
            return ("--arg needs a value (the script's arguments can also follow `--`: "
                    "run-script SCRIPT -- ARG...)")
        return (f"--arg {value!r}: Invoke reads {value!r} as one of run-script's own flags, so "
                f"the script would not get it. Put the script's arguments after `--` "
                f"(run-script SCRIPT -- {value} ...) or give them as JSON "
                f"(--args-json '{jsonlib.dumps([value])}')")


class _FillsPositional(Argument):
    """A flag that stands for a task's positional (``runbook --list`` needs no NAME,
    ``run-script -c CODE`` no SCRIPT): seeing it fills the positional with ''."""
    fills: Optional[Argument] = None

    def set_value(self, value, cast=True):
        super().set_value(value, cast)
        if value is not None and value is not False and self.fills is not None \
                and self.fills.value is None:
            self.fills.set_value("", cast=False)


def _filling(arguments: List[Argument], flag: str, positional: str) -> List[Argument]:
    """``arguments`` with ``flag`` made again as a ``_FillsPositional`` of ``positional``, from
    the options Invoke's Task gave it (the Task builds plain Arguments: the class is not its
    caller's to choose)."""
    by_name = {a.name: a for a in arguments}
    old = by_name[flag]
    new = _FillsPositional(names=old.names, kind=old.kind, default=old.default, help=old.help,
                           positional=old.positional, optional=old.optional,
                           incrementable=old.incrementable, attr_name=old.attr_name)
    new.fills = by_name[positional]
    return [new if a is old else a for a in arguments]


COMMON_HELP = {
    "host": "target name, comma list or node set (gpu[01-04]); repeatable",
    "group": "group name from the hosts file; repeatable",
    "hosts-file": "the hosts file (default: the first of $MLDIAG_HOSTS_FILE, ./hosts.yaml, "
                  "$XDG_CONFIG_HOME/mldiag/hosts.yaml; `mldiag hosts` says which)",
    "json": "print the result documents as JSON (nothing else on stdout)",
    "jsonl": "print each result as one JSON line as it arrives, then a summary line (JSON "
             "Lines, for pipelines; nothing else on stdout)",
    "save": "directory to write one JSON file per target plus summary.json",
    "junit": "also write a JUnit XML report to FILE (one testsuite per diagnostic, one testcase "
             "per target and check), for CI test reports",
    "parallel": f"targets run at once (default {32})",
    "timeout": "seconds the diagnostic may run on the target (default: hosts.yaml's, 300)",
    "keep-remote": "keep the remote temp dir for debugging (its path is in the result's data)",
    "diff": "after the table, show only the data fields that differ from the majority of targets",
    "no-color": "no colour (also off when NO_COLOR is set or the output is not a terminal)",
}
# The name of each flag's value in help (``-H NAME, --host=NAME``); Invoke would say STRING.
COMMON_METAVARS = {"host": "NAME", "group": "GROUP", "hosts-file": "FILE", "save": "DIR",
                   "junit": "FILE", "parallel": "N", "timeout": "SECONDS"}
METAVARS: Dict[str, Dict[str, str]] = {
    "run-script": {"path": "SCRIPT", "code": "CODE", "arg": "VALUE", "args-json": "JSON",
                   "put": "FILE"},
    "runbook": {"name": "NAME", "param": "NAME=VALUE", "format": "FORMAT", "runbooks-dir": "DIR"},
    "baseline-init": {"out": "FILE", "results": "DIR"},
    "baseline-diff": {"path": "FILE", "results": "DIR"},
}
# A task's positional as its usage line shows it (``mldiag scan-log [options] PATH``).
USAGE = {**{spec.name: spec.positional.value_name for spec in BUILTINS
            if spec.positional is not None},
         "run-script": "SCRIPT | -c CODE | -  [-- ARG...]", "runbook": "NAME | --list",
         "baseline-diff": "FILE"}


def metavar(task_name: str, arg: str) -> str:
    spec = registry.current().specs.get(task_name)
    own = spec.arg(arg) if spec is not None else None
    if own is not None:
        return own.value_name
    return METAVARS.get(task_name, {}).get(arg) or COMMON_METAVARS.get(arg) or "VALUE"


def _help(**extra):
    """COMMON_HELP plus ``extra``; an entry set to None is left out."""
    return {k: v for k, v in {**COMMON_HELP, **extra}.items() if v is not None}


def _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff, no_color,
             jsonl=False, junit=None):
    if json and jsonl:
        raise InputError("--json and --jsonl: give one of them (--json: one document at the "
                         "end; --jsonl: a line per result as it arrives)")
    if junit is not None and not str(junit).strip():
        raise InputError("--junit: expected a file name, got ''")
    return execute.Options(host=host, group=group, hosts_file=hosts_file, json=json, save=save,
                       parallel=parallel, timeout=timeout, keep_remote=keep_remote, diff=diff,
                       no_color=no_color, jsonl=jsonl, junit=junit)


def _core_flag_spellings() -> frozenset:
    from invoke import Program
    core = Program()
    return frozenset(("--" if len(n) > 1 else "-") + n
                     for a in core.core_args() + core.task_args() for n in a.names)


def _not_a_flag(task_name: str, what: str, value: str) -> None:
    """Invoke fills a task's missing positional before it looks at its own core flags, so
    ``scan-log --help`` would scan a log named --help (``mldiag TASK --help`` shows the help
    before this is reached; ``inv`` does not). Any other value starting with '-' is the
    user's (``--path=-odd.log``)."""
    if value in _core_flag_spellings():
        raise InputError(f"{value!r} is not a {what} (help: `mldiag {task_name} --help` or "
                         f"`inv --help {task_name}`; a {what} starting with '-': ./{value})")


@task(klass=MldiagTask, help={k: COMMON_HELP[k] for k in ("host", "group", "hosts-file", "json",
                                                          "no-color")})
def hosts(c, host=None, group=None, hosts_file=None, json=False, no_color=False):
    """Show each target and its hop chain, and which hosts file was read (no connection is made)."""
    execute.show_hosts(execute.Options(host=host or [], group=group or [], hosts_file=hosts_file, json=json,
                               no_color=no_color))


# The common flags' parameters, in the order every diagnostic task's signature ends with.
COMMON_PARAMETERS = (("host", None), ("group", None), ("hosts_file", None), ("json", False),
                     ("jsonl", False), ("save", None), ("junit", None), ("parallel", None),
                     ("timeout", None), ("keep_remote", False), ("diff", False), ("no_color", False))


# Common flags whose default an Invoke config's ``mldiag`` section may give.
CONFIGURABLE = ("hosts_file", "parallel", "timeout")


def diagnostic_task(spec: registry.DiagnosticSpec) -> MldiagTask:
    """The Invoke task of a registered diagnostic: its own arguments as flags (a positional
    first, then in the spec's order; a bool one a flag without value), the common flags after
    them, the spec's summary as its docstring; it runs ``execute.run_diagnostic``, the path a
    runbook step shares."""
    def parameter(name: str, default=inspect.Parameter.empty) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)

    own = sorted(spec.args, key=lambda a: not a.positional)     # stable: the positional first
    signature = inspect.Signature(
        [parameter("c")]
        + [parameter(a.python_name, inspect.Parameter.empty if a.positional else
                     (False if a.kind == "bool" else None)) for a in own]
        + [parameter(name, default) for name, default in COMMON_PARAMETERS])

    def body(*args, **kwargs):
        values = signature.bind(*args, **kwargs)
        values.apply_defaults()
        values = dict(values.arguments)
        config = getattr(values.pop("c"), "config", None)
        common = {name: values.pop(name) for name, _ in COMMON_PARAMETERS}
        for name in CONFIGURABLE:           # a team's tasks.py may set defaults (api.collection)
            if common[name] is None:
                common[name] = execute.configured(config, name)
        for arg in own:
            if arg.positional:
                _not_a_flag(spec.name, arg.what or arg.name, values[arg.python_name])
        return execute.run_diagnostic(spec, _options(**common), values)

    body.__signature__ = signature
    body.__name__ = body.__qualname__ = spec.name.replace("-", "_")
    body.__doc__ = spec.summary
    return MldiagTask(body, help=_help(**{a.name: a.task_help or a.help for a in spec.args}),
                      iterable=[a.python_name for a in spec.args if a.repeatable])


@task(klass=RunScriptTask, iterable=["arg", "put"], help=_help(
    path="local script to upload and run as __main__ (or give it as the first argument; "
         "- reads it from stdin)",
    code="run CODE instead of a script file, as python -c does (no quoting beyond your shell's)",
    arg="one argument for the script, byte for byte (repeatable); or put the script's "
        "arguments after `--`",
    **{"args-json": "the script's arguments as a JSON list of strings (exact, for any value)"},
    put="extra local file uploaded beside the script (repeatable)"))
def run_script(c, path, code=None, arg=None, args_json=None, put=None, host=None, group=None,
               hosts_file=None, json=False, jsonl=False, save=None, junit=None, parallel=None,
               timeout=None, keep_remote=False, diff=False, no_color=False):
    """Upload a local script (or -c CODE, or - for stdin) and run it with arguments on the targets.

    The script's arguments, in this order: each --arg, the --args-json list, then everything
    after `--` exactly as given: mldiag run-script x.py -H box -- --json -H foo
    """
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, diff,
                    no_color, jsonl=jsonl, junit=junit)
    argv = list(arg or [])
    if args_json is not None:
        try:
            extra = jsonlib.loads(args_json)
        except ValueError as exc:
            raise InputError(f"--args-json: not JSON ({exc})")
        if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
            raise InputError("--args-json: expected a JSON list of strings")
        argv += extra
    argv += run_script.remainder() or []
    if code is not None:
        if path:
            raise InputError(f"run-script: give a script ({path!r}) or -c CODE, not both")
        job = execute.script_code_job("-c", os.fsencode(code), argv, put or [])
    elif path == "-":
        job = execute.script_code_job("-", execute.read_stdin("run-script -"), argv, put or [])
    else:
        _not_a_flag("run-script", "script path", path)
        job = execute.script_file_job(path, argv, put or [])
    return execute.execute(opts, job)


class RunbookTask(MldiagTask):
    def get_arguments(self, *args, **kwargs):
        return _filling(super().get_arguments(*args, **kwargs), "list_", "name")


@task(klass=RunbookTask, positional=["name"], iterable=["param", "runbooks_dir"], help=_help(
    diff=None, jsonl=None, name="the runbook to run (file NAME.yaml in a runbook directory)",
    json="print the report as JSON (the same as --format json; nothing else on stdout)",
    timeout="seconds each step's diagnostic may run on the target (default: the step's, "
            "else hosts.yaml's)",
    list="list the runbooks found, with their descriptions and parameters",
    param="a runbook parameter, NAME=VALUE (repeatable), e.g. --param log=/var/log/train.log",
    format="report format: md (default) or json (--json is the same as --format json)",
    save="directory to write report.md, report.json and each step's results (steps/NN-STEP/)",
    junit="also write a JUnit XML report to FILE (one testsuite per step, one testcase per "
          "target and check; a step skipped on a target is a skipped testcase)",
    drain="Slurm: after the run, drain the nodes whose worst action in any step is drain or "
          "worse (node-check's tagged reason; node-check --undrain resumes them)",
    **{"runbooks-dir": "another directory of runbook files (repeatable; searched after the "
                       "built-in ones and hosts.yaml's runbooks:)"}))
def runbook(c, name=None, list_=False, param=None, runbooks_dir=None, format=None, host=None,
            group=None, hosts_file=None, json=False, save=None, junit=None, parallel=None,
            timeout=None, keep_remote=False, no_color=False, drain=False):
    """Run a runbook's steps on the targets and print one report (Markdown or JSON)."""
    from ..runbooks import run as runbook_run   # here: every other task's start-up skips its import (~40 ms)
    if list_:
        return runbook_run.list_runbooks(hosts_file, runbooks_dir or [], as_json=json)
    opts = _options(host, group, hosts_file, json, save, parallel, timeout, keep_remote, False,
                    no_color, junit=junit)
    # the report file is checked before the runbook connects anywhere, written after its report
    # (an interrupted run's too: the outcome holds what ran)
    report = execute.ReportFile.open("--junit", opts.junit)
    try:
        outcome = runbook_run.execute(replace(opts, junit=None), name, params=param or [],
                                      runbooks_dirs=runbooks_dir or [], fmt=format, drain=drain)
    except BaseException:
        if report is not None:
            report.close()
        raise
    return execute.with_messages(outcome, execute.write_junit(report, runbook_suites(outcome.results)))


# The golden configuration's commands (builtin/node_check/golden.py): node-check's facts on
# the selected targets, written as a reviewed YAML file, then compared with it.
_GOLDEN_HELP = {k: COMMON_HELP[k] for k in ("host", "group", "hosts-file", "parallel", "timeout",
                                            "no-color")}


@task(klass=MldiagTask, help={**_GOLDEN_HELP,
      "out": "the golden file to write (YAML, commented, for review and git)",
      "force": "write over an existing FILE (git shows what changed)",
      "results": "read the results a node-check --save DIR kept instead of running node-check"})
def baseline_init(c, out=None, force=False, results=None, host=None, group=None, hosts_file=None,
                  parallel=None, timeout=None, no_color=False):
    """Write a golden config (YAML to review): the fleet's majority of node-check's facts."""
    from ..builtin.node_check import golden
    opts = _options(host, group, hosts_file, False, None, parallel, timeout, False, False, no_color)
    return golden.init(opts, out or "", force=force, results_dir=results)


@task(klass=MldiagTask, help={**_GOLDEN_HELP, "json": "print each node's drift as JSON (nothing "
                                                     "else on stdout)",
      "path": "the golden file (mldiag baseline-init wrote it)",
      "results": "compare the results a node-check --save DIR kept instead of running node-check"})
def baseline_diff(c, path, results=None, host=None, group=None, hosts_file=None, json=False,
                  parallel=None, timeout=None, no_color=False):
    """Show what drifted from a golden config: per node and fact, golden value and now."""
    from ..builtin.node_check import golden
    _not_a_flag("baseline-diff", "golden file", path)
    opts = _options(host, group, hosts_file, json, None, parallel, timeout, False, False, no_color)
    return golden.diff(opts, path, results_dir=results)


def runbook_suites(record) -> List[junit.Suite]:
    """A runbook's JUnit suites (``record``: runbooks.run.RunbookRun): one per step that ran or
    was skipped somewhere, ``mldiag.RUNBOOK.NN-STEP``; a target the step skipped is a skipped
    testcase (why: its ``when``, a missing parameter, an earlier stop, an unreachable target)."""
    suites = []
    for sr in record.steps:
        if not sr.results and not sr.skipped:
            continue
        name = junit.suite_name(record.runbook.name, f"{sr.number:02d}-{sr.step.id}")
        suites.append(junit.Suite(name=name, results=sr.results, check=sr.step.task,
                                  started=record.started,
                                  not_run=[junit.NotRun(s.target, s.kind, s.reason,
                                                        error=s.kind == "interrupted")
                                           for s in sr.skipped]))
    return suites


def collection(found: registry.Registry) -> Collection:
    """Every task of a run: hosts, each diagnostic of ``found`` (the built-ins first, then a
    team's), run-script and runbook."""
    tasks = Collection(hosts, *(diagnostic_task(spec) for spec in found.specs.values()),
                       run_script, runbook, baseline_init, baseline_diff)
    tasks.configure({"run": {"echo": False}})
    return tasks


ns = collection(BUILTIN)
