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
import functools
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

SCRIPTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")
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


def _no_judge(values: Values) -> Optional[Callable[[List[Any]], None]]:
    return None


def _options_as_given(opts: Any, values: Values) -> Any:
    return opts


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
    # values: the fleet judgement a task and a runbook step both apply (None: none)
    judge: Callable[[Values], Optional[Callable[[List[Any]], None]]] = _no_judge
    # what the task prints after the table (results, stream, color=...)
    view: Optional[Callable[..., None]] = None
    # the task's common options as the values change them (env-report: --diff unless --full)
    options: Callable[[Any, Values], Any] = _options_as_given
    # a task whose run is more than one fan-out: run(opts, values, out=...) -> Outcome
    run: Optional[Callable[..., Any]] = None

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
        return given


# ------------------------------------------------------------------------ the built-ins' hooks
# Each imports its module when called: the registry is read at every start.

MODEL = Arg("model", "model directory on the target, or a name from the target's models: "
                     "(default: its first)", kind="model")


def _gpu_status_argv(target: Any) -> List[str]:
    """hosts.yaml's ``gpus:``, and what the client remembers of the target's nvidia-smi."""
    from . import smi_memory
    gpus = target.expect_dict.get("gpus")
    return ([f"--expect-gpus={gpus}"] if gpus is not None else []) + smi_memory.known_argv(target.name)


def _remember_smi(values: Values) -> Callable[[List[Any]], None]:
    from . import smi_memory
    return smi_memory.remember


def _gpu_view(results, stream, *, color=False) -> None:
    from . import render
    render.render_gpus(results, stream, color=color)


def _env_view(results, stream, *, color=False) -> None:
    from . import render
    render.render_full(results, stream, color=color)


def _env_options(opts: Any, values: Values) -> Any:
    """Several targets' env reports: only what differs, unless --full."""
    from dataclasses import replace
    return replace(opts, diff=opts.diff or not values.get("full"))


@functools.lru_cache(maxsize=None)
def dcgm_level_timeouts() -> Dict[int, float]:
    """dcgmi diag's timeout per run level: scripts/dcgm.py's TIMEOUTS (its docstring gives
    NVIDIA's documented run times: r1 seconds, r2 about 2 min, r3 about 15 min, 30 in older
    guides), read from the script, where it is written once (it stands alone on the target)."""
    from . import literals
    return literals.read_constants(os.path.join(SCRIPTS_DIR, "dcgm.py"))["TIMEOUTS"]


def _node_check_timeout(values: Values) -> Optional[float]:
    """The job gets a minute more than dcgmi diag's level needs, for the rest of node-check."""
    level = values.get("dcgm-level")
    if not level or values.get("no-dcgm"):
        return None
    return dcgm_level_timeouts()[int(level)] + 60.0


def _expect_block(target: Any) -> List[str]:
    """node-check: the target's ``expect:`` block, one JSON token (keys and integers only)."""
    expect = target.expect_dict
    return [f"--expect={json.dumps(expect, sort_keys=True)}"] if expect else []


def _node_check_check(values: Values) -> None:
    from . import node_check_run
    node_check_run.check(values)


def _node_check_judge(values: Values) -> Callable[[List[Any]], None]:
    from . import node_check_run
    return node_check_run.judge(values)


def _node_check_view(results, stream, *, color=False) -> None:
    from . import node_view
    node_view.render_actions(results, stream, color=color)


def _node_check_run(opts: Any, values: Values, *, out=None) -> Any:
    from . import node_check_run
    return node_check_run.run(opts, values, out=out)


def _offer_py_spy(job: Any, values: Values) -> Any:
    from . import stacks_upload
    return stacks_upload.offer(job, values)


def _stacks_check(values: Values) -> None:
    from . import stacks_run
    stacks_run.check_values(values)


def _stacks_judge(values: Values) -> Callable[[List[Any]], None]:
    from . import stacks_run
    return stacks_run.amend


def _stacks_view(results, stream, *, color=False) -> None:
    from . import stacks_run
    stacks_run.render_view(results, stream, color=color)


_NOT_A_RUNBOOK_OUTPUT = ("a runbook writes its report (and with --save each step's results); "
                         "run `mldiag node-check --{flag}` for this")

BUILTINS: Tuple[DiagnosticSpec, ...] = (
    DiagnosticSpec("ping", "Check every layer: ssh, jump, sudo, container, interpreter, private "
                           "temp dir."),
    DiagnosticSpec(
        "gpu-status", "Per GPU: model, memory, utilisation, temperature, power, ECC/remap health, "
                      "throttling.",
        (Arg("kernel-log-file", "scan this file on the target (a saved dmesg) for Xid lines "
                                "instead of the live kernel log", metavar="FILE"),
         Arg("expect-idle", "GPU memory held by processes is a warning (the GPUs should be "
                            "free)", kind="bool")),
        companions=("xid.py", "xid_catalog.json"),
        target_argv=_gpu_status_argv, judge=_remember_smi, view=_gpu_view),
    DiagnosticSpec(
        "check-attn", "Requested vs resolved attention per module (meta-device build), layer "
                      "types, fast kernels.",
        (MODEL,
         Arg("attn-implementation", "request this implementation (eager, sdpa, "
                                    "flash_attention_2, ...)", metavar="NAME"),
         Arg("model-class", "build this transformers class instead of the checkpoint's "
                            "architectures", metavar="CLASS"))),
    DiagnosticSpec(
        "env-report", "python, torch (+CUDA, cuDNN, NCCL), driver, ML package versions, env vars; "
                      "drift across targets.",
        (Arg("full", "show every field on every target (default with several targets: only what "
                     "differs)", kind="bool", client=True,
             not_in_runbook="a runbook's report shows every field of every target"),
         Arg("imports", "packages to import as well: comma list, 'all' or 'none'",
             metavar="LIST"),
         Arg("packages", "extra distribution names to report, comma separated",
             metavar="LIST")),
        view=_env_view, options=_env_options),
    DiagnosticSpec(
        "extract-smoke", "Hidden-state extraction smoke test: capture layers, check shapes, dtype, "
                         "finiteness, stats.",
        (MODEL,
         Arg("layers", "hidden_states ids to capture, e.g. 2,16,29 (default: 2, N//2, N-3 "
                       "and N)", metavar="IDS"),
         Arg("samples", "number of built-in prompts (or lines of --data) to prefill "
                        "(default 3)", kind="int"),
         Arg("data", "JSONL file on the target with a 'text' or 'prompt' field per line",
             metavar="FILE"),
         Arg("backend", "auto | transformers | vllm (vllm: untested on a real GPU so far)",
             choices=("auto", "transformers", "vllm"), metavar="BACKEND"),
         Arg("max-tokens", "truncate each sample to at most N tokens (default 64)",
             kind="int"),
         Arg("device", "auto | cpu | cuda", choices=("auto", "cpu", "cuda"),
             metavar="DEVICE"),
         Arg("dtype", "auto | float32 | bfloat16 | float16",
             choices=("auto", "float32", "bfloat16", "float16"), metavar="DTYPE"))),
    DiagnosticSpec(
        "scan-log", "Classify a remote log: tracebacks, empty error messages, NaN loss, OOM, NCCL, "
                    "Xid, kills.",
        (Arg("path", "log file on the target", required=True, metavar="PATH", positional=True,
             task_help="log file on the target (or give it as the first argument: scan-log PATH)",
             what="log path"),
         Arg("lines", "scan the last N lines (default 2000)", kind="int")),
        companions=("xid.py", "xid_catalog.json")),
    DiagnosticSpec(
        "node-check", "A GPU node's hardware health: Xid with an action, NVLink, fabric, PCIe, IB, "
                      "DCGM.",
        (Arg("kernel-log-file", "read this file on the target (a saved kernel log) instead of "
                                "journalctl -k / dmesg", metavar="FILE"),
         Arg("since", "how far back the live kernel log is read (default 24h; e.g. 2h, 7d)",
             metavar="AGE"),
         Arg("dcgm-level", "run dcgmi diag at this level (1 default when dcgmi is there; 2 "
                           "takes minutes, 3 about 15: the timeout rises to match, to 1 h)",
             choices=("1", "2", "3"), metavar="LEVEL"),
         Arg("no-dcgm", "do not run dcgmi diag even where it is installed", kind="bool"),
         Arg("save-baseline", "save each node's facts (driver, CUDA, VBIOS, GPUs, NVLinks, PCIe, "
                              "IB ports, firmware) to FILE, for a later --baseline",
             kind="file", client=True,
             not_in_runbook=_NOT_A_RUNBOOK_OUTPUT.format(flag="save-baseline FILE")),
         Arg("baseline", "report every fact that differs from the baseline in FILE (default: "
                         "from the majority of the selected nodes)", kind="file", client=True),
         Arg("drain", "Slurm: drain the nodes whose worst action is drain or worse (reason "
                      "'mldiag: CODE …'); without it the commands are only printed", kind="bool",
             client=True, not_in_runbook="a runbook reports and changes no node: run "
                                         "`mldiag node-check --drain` on what it found"),
         Arg("undrain", "Slurm: check the nodes mldiag drained inside a maintenance reservation "
                        "and keep resumed those that pass", kind="bool", client=True,
             not_in_runbook="a runbook reports and changes no node: run "
                            "`mldiag node-check --undrain`"),
         Arg("prom", "write a Prometheus textfile-collector file (node-exporter) to FILE",
             kind="file", client=True,
             not_in_runbook=_NOT_A_RUNBOOK_OUTPUT.format(flag="prom FILE"))),
        companions=("xid.py", "xid_catalog.json", "nvlink.py", "nvfabric.py", "pcie.py", "ib.py",
                    "dcgm.py"),
        target_argv=_expect_block, least_timeout=_node_check_timeout, check=_node_check_check,
        judge=_node_check_judge, view=_node_check_view, run=_node_check_run),
    DiagnosticSpec(
        "stacks", "Where every rank of a hung job is: each process's Python stack, folded, the odd "
                  "one named.",
        (Arg("pid", "comma list of pids to dump as well as the job's ranks", metavar="PIDS"),
         Arg("match", "also dump Python processes whose command line matches this regular "
                      "expression", metavar="REGEX"),
         Arg("py-spy", "the py-spy binary on the target (default: py-spy on its PATH; "
                       "none there: this machine's is shipped)", metavar="PATH"),
         Arg("native", "py-spy --native: C/C++ frames too (about 1 s and 330 MB per torch "
                       "process)", kind="bool"),
         Arg("no-upload", "ship nothing: without py-spy on the target, read the stacks "
                          "with the standard-library reader (CPython 3.11-3.13)", kind="bool"),
         Arg("all-namespaces", "on a host, also the job's processes inside its containers "
                               "(default: left out, the containers are targets of their "
                               "own)", kind="bool")),
        companions=("pyframes.py", "flight_recorder.py"),
        finish=_offer_py_spy, check=_stacks_check, judge=_stacks_judge, view=_stacks_view),
)

REGISTRY: Dict[str, DiagnosticSpec] = {spec.name: spec for spec in BUILTINS}
# mldiag's tasks that are not diagnostics: no team diagnostic may take their names either
OTHER_TASKS = ("hosts", "run-script", "runbook")
# The tasks whose run never needs a team's diagnostics: a command line naming one of them (the
# hot path) reads no hosts file and no team directory before the task itself does.
NO_TEAM_NEEDED = frozenset(REGISTRY) | {"hosts", "run-script"}
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


BUILTIN = Registry(REGISTRY)
_current = BUILTIN


def current() -> Registry:
    """The registry of this run: the built-ins, or what ``use`` set (the program does, once it
    knows the hosts file and the --diagnostics-dir directories)."""
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
