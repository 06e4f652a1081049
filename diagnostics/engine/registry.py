"""Every diagnostic as data: one ``DiagnosticSpec`` per diagnostic, in one registry.

A spec is the single source for everything that names the diagnostic or its arguments:

- its Invoke task (``tasks.py`` generates one per spec: the flags, their help and value names,
  the positional, the docstring that ``mldiag TASK --help`` and ``--list`` show);
- its runbook steps (``runbook.py`` checks a step's ``args:`` against the same ``Arg``\\ s, and
  refuses, with the arg's own reason, the few flags that make no sense in a step);
- the job sent to a target (``jobs.job_source``: the script, its companion files, the argv
  built from the values, the timeout the values need);
- what only the client can do with every target's answer together (``judge``: node-check's
  baseline and fleet outliers, stacks' fold across ranks), applied by a task and by a
  runbook step alike;
- how a task shows its results beyond the table (``view``) and, for the one diagnostic whose
  run is more than one fan-out (node-check: Slurm drain windows, its output files), ``run``.

Nothing here imports the engine, the transports or Invoke: the hooks import what they need
when called, so reading the registry costs the start of every run nothing but this module.
"""

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core.errors import InputError
from ..core.paths import SCRIPTS_DIR
KINDS = ("text", "int", "bool", "model", "file")

Values = Mapping[str, Any]      # dash names (``max-tokens``) → the value given; None: not given


@dataclass(frozen=True)
class Arg:
    """One argument of a diagnostic: the task's ``--NAME`` flag and the runbook step's
    ``NAME:`` key.

    ``client``: read by mldiag itself (``--baseline FILE``), never sent to the target.
    ``not_in_runbook``: why a runbook step refuses it (empty: a step takes it).
    ``positional``: the task also takes it as its first argument (``scan-log PATH``)."""
    name: str                    # dash name: ``--max-tokens`` and ``max-tokens:`` in a runbook
    help: str
    flag: Optional[str] = None   # the script's flag (default ``--NAME``); model args build their own
    kind: str = "text"           # text | int | bool (a flag without value) | model | file (local)
    choices: Tuple[str, ...] = ()
    required: bool = False
    metavar: str = ""            # the value's name in help (``--lines=N``); default by kind
    client: bool = False
    not_in_runbook: str = ""
    positional: bool = False
    task_help: str = ""          # the task flag's help where it says more than the step's
    what: str = ""               # a positional's noun in errors (``log path``)
    repeatable: bool = False     # argparse's action="append": the flag again, a list in a step

    @property
    def script_flag(self) -> str:
        return self.flag or f"--{self.name}"

    @property
    def value_name(self) -> str:
        return self.metavar or {"int": "N", "model": "MODEL", "file": "FILE"}.get(self.kind, "VALUE")

    @property
    def python_name(self) -> str:
        """The task function's parameter (``max_tokens``)."""
        return self.name.replace("-", "_")


def _no_target_argv(target: Any) -> List[str]:
    return []


def _no_least_timeout(values: Values) -> Optional[float]:
    return None


def _job_as_built(job: Any, values: Values) -> Any:
    return job


def _no_check(values: Values) -> None:
    return None


def _no_judge(values: Values, hosts: Any = None) -> Optional[Callable[[List[Any]], None]]:
    return None


def _options_as_given(opts: Any, values: Values) -> Any:
    return opts


def _each_alone(values: Values) -> Optional[Callable[..., List[Any]]]:
    return None


@dataclass(frozen=True)
class DiagnosticSpec:
    name: str                    # the task name and a runbook step's ``task:``
    summary: str                 # one line: ``mldiag --list``, the task's help
    args: Tuple[Arg, ...] = ()
    script: str = ""             # file in ``directory`` (default: NAME with _ for -, .py)
    companions: Tuple[str, ...] = ()   # files beside the script, shipped with it
    directory: str = SCRIPTS_DIR
    # one of mldiag's own (its parser read on the client, kept in a target's code cache), or a
    # team's (team.py: read with ast here, parsed and run on the target only)
    builtin: bool = True
    timeout: Optional[float] = None    # the job's, unless --timeout (a team file's TIMEOUT)
    # argv the target itself adds (gpu-status: --expect-gpus from hosts.yaml ``gpus:``)
    target_argv: Callable[[Any], List[str]] = _no_target_argv
    # the least timeout a run with these argument values needs (node-check --dcgm-level 3)
    least_timeout: Callable[[Values], Optional[float]] = _no_least_timeout
    # the job once built, given the values (stacks: offer to ship py-spy)
    finish: Callable[[Any, Values], Any] = _job_as_built
    # bad input in the values, found before anything connects (InputError, exit 4)
    check: Callable[[Values], None] = _no_check
    # a look at every target's result together, before any is saved or shown, given the
    # values and the run's hosts file (its Topology; None where a caller has none): the fleet
    # judgement a task and a runbook step both apply (None: none)
    judge: Callable[[Values, Any], Optional[Callable[[List[Any]], None]]] = _no_judge
    # what the task prints after the table (results, stream, color=...)
    view: Optional[Callable[..., None]] = None
    # the task's common options as the values change them (env-report: --diff unless --full)
    options: Callable[[Any, Values], Any] = _options_as_given
    # a task whose run is more than one fan-out: run(opts, values, out=...) -> Outcome
    run: Optional[Callable[..., Any]] = None
    # how the targets are run together, given the values: ``runner.run_many``'s signature and
    # answer, the task's and a runbook step's alike (nccl-check --pairs: two by two); None: each
    # target on its own
    fan_out: Callable[[Values], Optional[Callable[..., List[Any]]]] = _each_alone

    @property
    def script_name(self) -> str:
        return self.script or self.name.replace("-", "_") + ".py"

    def arg(self, name: str) -> Optional[Arg]:
        return next((a for a in self.args if a.name == name), None)

    @property
    def positional(self) -> Optional[Arg]:
        return next((a for a in self.args if a.positional), None)

    def given(self, values: Mapping[str, Any]) -> Dict[str, Any]:
        """``values`` by dash name (``max_tokens`` or ``max-tokens``), every name checked."""
        given = {key.replace("_", "-"): value for key, value in values.items()}
        unknown = set(given) - {a.name for a in self.args}
        if unknown:
            raise ValueError(f"{self.name}: no argument {', '.join(sorted(unknown))}")
        for arg in self.args:      # a value the script would refuse is bad input here, not its crash
            value = given.get(arg.name)
            if not arg.choices or value is None or value is False:
                continue
            for one in value if isinstance(value, (list, tuple)) else (value,):
                if str(one) not in arg.choices:
                    raise InputError(f"{self.name}: --{arg.name}: expected one of {', '.join(arg.choices)}, "
                                     f"got {str(one)!r}")
        return given


# the flags each member of a group run gets, its place in the group (engine/groups.py); a group
# diagnostic's parser takes them, and they are the engine's, not the task's
RENDEZVOUS_FLAGS = ("node-rank", "nodes", "master")
# mldiag's tasks that are not diagnostics: no team diagnostic may take their names either
OTHER_TASKS = ("hosts", "run-script", "runbook")
# every diagnostic task's common flags (tasks.py gives them their defaults and help): no
# diagnostic's own argument may take one of these names
COMMON_FLAGS = ("host", "group", "hosts-file", "json", "save", "parallel", "timeout",
                "keep-remote", "diff", "no-color")


@dataclass(frozen=True)
class Registry:
    """The diagnostics one run knows: the built-ins, and a team's (``team.discover``), with the
    team files that could not be read as one (``problems``: each names its file and line)."""
    specs: Mapping[str, DiagnosticSpec]
    problems: Tuple[Any, ...] = ()        # team.Problem

    def problem_of(self, name: str) -> Optional[Any]:
        return next((p for p in self.problems if p.task == name), None)


_current = Registry({})    # until ``use``: the program and the API install the built-ins first


def current() -> Registry:
    """The registry of this run: what ``use`` set (the program and ``api`` install the built-ins,
    ``diagnostics.builtin.BUILTIN``, or those with a team's, once the hosts file and the
    --diagnostics-dir directories are known). The engine never imports the built-ins itself."""
    return _current


def use(registry: Registry) -> Registry:
    """Make ``registry`` this run's; returns the one it replaces."""
    global _current
    previous, _current = _current, registry
    return previous


def get(name: str) -> DiagnosticSpec:
    """The spec of ``name`` in this run's registry; KeyError when there is none (``unknown``
    words the refusal)."""
    return _current.specs[name]


def names() -> List[str]:
    return list(_current.specs)


def unknown(name: str, also: Sequence[str] = ()) -> str:
    """Why ``name`` is not a task here: a team file's problem, or no such task (``also``: the
    other tasks the caller takes, listed after the diagnostics: a runbook's run-script)."""
    problem = _current.problem_of(name)
    if problem is not None:
        return f"task {name!r} cannot run: {problem}"
    known = names() + list(also)
    close = difflib.get_close_matches(name, known, n=1)
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown task {name!r} ({guess}tasks: {', '.join(known)})"
