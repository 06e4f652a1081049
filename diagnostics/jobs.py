"""Task name + arguments + target → Job: what the tasks and the runbook steps share.

Each diagnostic task declares its arguments once (``TASKS``): the name used on the command
line and in a runbook step (``max-tokens``), the script flag it becomes, its kind and help.
``job_source(task, values)`` returns a ``Target -> Job`` callable; it raises
``errors.TargetInputError`` for a target that lacks a setting the job needs (no ``models:``
entry for ``check-attn``), which a task reports as bad input (exit 4) and a runbook as a
skipped step on that target. Nothing here imports the transports or Invoke: the runbook
model (``runbook.py``) builds on it.

``run-script`` is not here: its job comes from local files (``cli.script_file_job``).
"""

import difflib
import functools
import json
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from . import bundle
from .errors import TargetInputError
from .topology import Target

KINDS = ("text", "int", "bool", "model")


@dataclass(frozen=True)
class Arg:
    name: str                    # dash name: ``--max-tokens`` and ``max-tokens:`` in a runbook
    help: str
    flag: Optional[str] = None   # the script's flag (default ``--NAME``); model args build their own
    kind: str = "text"           # text | int | bool (a flag without value) | model
    choices: Tuple[str, ...] = ()
    required: bool = False
    metavar: str = ""            # the value's name in help (``--lines=N``); default by kind

    @property
    def script_flag(self) -> str:
        return self.flag or f"--{self.name}"

    @property
    def value_name(self) -> str:
        return self.metavar or {"int": "N", "model": "MODEL"}.get(self.kind, "VALUE")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    summary: str
    args: Tuple[Arg, ...] = ()
    # argv the target itself adds (gpu-status: --expect-gpus from hosts.yaml ``gpus:``)
    target_argv: Callable[[Target], List[str]] = lambda target: []
    # the least timeout a run with these argument values needs (node-check --dcgm-level 3)
    least_timeout: Callable[[Mapping[str, Any]], Optional[float]] = lambda values: None
    # the job once built, given the values (stacks: offer to ship py-spy)
    finish: Callable[[bundle.Job, Mapping[str, Any]], bundle.Job] = lambda job, values: job
    # a look at every target's result together, before any is saved or shown (stacks: the
    # fold across targets names the odd rank); a task and a runbook step both apply it
    amend: Optional[Callable[[List[Any]], None]] = None

    def arg(self, name: str) -> Optional[Arg]:
        return next((a for a in self.args if a.name == name), None)


MODEL = Arg("model", "model directory on the target, or a name from the target's models: "
                     "(default: its first)", kind="model")


def _gpu_status_argv(target: Target) -> List[str]:
    """hosts.yaml's ``gpus:``, and what the client remembers of the target's nvidia-smi."""
    from . import smi_memory
    gpus = target.expect_dict.get("gpus")
    return ([f"--expect-gpus={gpus}"] if gpus is not None else []) + smi_memory.known_argv(target.name)


def _remember_smi(results: List[Any]) -> None:
    from . import smi_memory
    smi_memory.remember(results)


# dcgmi diag's timeout per run level: scripts/dcgm.py's TIMEOUTS (its docstring gives NVIDIA's
# documented run times: r1 seconds, r2 about 2 min, r3 about 15 min, 30 in older guides); the
# job gets a minute more for the rest of node-check. The remote script stands alone, so the
# table is written twice; tests/unit/test_node_check_core.py pins the two to each other.
DCGM_LEVEL_TIMEOUT = {1: 120.0, 2: 600.0, 3: 3600.0}


def _node_check_timeout(values: Mapping[str, Any]) -> Optional[float]:
    level = values.get("dcgm-level")
    return DCGM_LEVEL_TIMEOUT[int(level)] + 60.0 if level and not values.get("no-dcgm") else None


def _expect_block(target: Target) -> List[str]:
    """node-check: the target's ``expect:`` block, one JSON token (keys and integers only)."""
    expect = target.expect_dict
    return [f"--expect={json.dumps(expect, sort_keys=True)}"] if expect else []


def _offer_py_spy(job: bundle.Job, values: Mapping[str, Any]) -> bundle.Job:
    from . import stacks_upload
    return stacks_upload.offer(job, values)


def _stacks_amend(results: List[Any]) -> None:
    from . import stacks_run
    stacks_run.amend(results)


TASKS: Dict[str, TaskSpec] = {spec.name: spec for spec in (
    TaskSpec("ping", "check every layer: ssh, jump, sudo, container, interpreter, temp dir"),
    TaskSpec("gpu-status", "per GPU: memory, utilisation, ECC/remap health, throttling, processes",
             (Arg("kernel-log-file", "scan this file on the target (a saved dmesg) for Xid lines "
                                     "instead of the live kernel log", metavar="FILE"),
              Arg("expect-idle", "GPU memory held by processes is a warning (the GPUs should be "
                                 "free)", kind="bool")),
             target_argv=_gpu_status_argv, amend=_remember_smi),
    TaskSpec("check-attn", "requested vs resolved attention per module, layer types, fast kernels",
             (MODEL,
              Arg("attn-implementation", "request this implementation (eager, sdpa, "
                                         "flash_attention_2, ...)", metavar="NAME"),
              Arg("model-class", "build this transformers class instead of the checkpoint's "
                                 "architectures", metavar="CLASS"))),
    TaskSpec("env-report", "python, torch, driver, ML package versions, env vars; drift",
             (Arg("imports", "packages to import as well: comma list, 'all' or 'none'",
                  metavar="LIST"),
              Arg("packages", "extra distribution names to report, comma separated",
                  metavar="LIST"))),
    TaskSpec("extract-smoke", "hidden-state extraction smoke test",
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
    TaskSpec("node-check", "node hardware health: Xid with an action, NVLink, NVSwitch fabric, PCIe, "
                           "InfiniBand/RoCE ports, DCGM",
             (Arg("kernel-log-file", "read this file on the target (a saved kernel log) instead of "
                                     "journalctl -k / dmesg", metavar="FILE"),
              Arg("since", "how far back the live kernel log is read (default 24h; e.g. 2h, 7d)",
                  metavar="AGE"),
              Arg("dcgm-level", "run dcgmi diag at this level (1 default when dcgmi is there; 2 "
                                "takes minutes, 3 about 15: the timeout rises to match, to 1 h)",
                  choices=("1", "2", "3"), metavar="LEVEL"),
              Arg("no-dcgm", "do not run dcgmi diag even where it is installed", kind="bool")),
             target_argv=_expect_block, least_timeout=_node_check_timeout),
    TaskSpec("stacks", "where every rank of a distributed job is: Python stacks folded, the odd "
                       "one out named",
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
             finish=_offer_py_spy, amend=_stacks_amend),
    TaskSpec("scan-log", "classify a remote log: tracebacks, empty errors, NaN, OOM, NCCL, Xid",
             (Arg("path", "log file on the target", required=True, metavar="PATH"),
              Arg("lines", "scan the last N lines (default 2000)", kind="int"))),
)}


def help_for(task: str) -> Dict[str, str]:
    """``@task(help=...)`` entries for the task's own arguments."""
    return {a.name: a.help for a in TASKS[task].args}


def unknown_task(name: str) -> str:
    close = difflib.get_close_matches(name, list(TASKS), n=1)
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown task {name!r} ({guess}tasks: {', '.join(TASKS)})"


def model_argv(target: Target, model: Optional[str]) -> List[str]:
    """``--model`` may name an entry of the target's ``models:``; default: its first entry."""
    models = dict(target.models)
    path = models.get(model, model) if model else target.default_model
    if not path:
        raise TargetInputError(f"{target.name}: no --model given and the target has no models: "
                               "entry in hosts.yaml")
    return [f"--model={path}"]


@functools.lru_cache(maxsize=None)
def _script_job(task: str) -> bundle.Job:
    """The script read once per process (a runbook builds a job per step and target)."""
    return bundle.script_job(task)


def job_source(task: str, values: Mapping[str, Any]) -> Callable[[Target], bundle.Job]:
    """``Target -> Job`` for ``task`` with ``values`` (keys: dash or underscore names; None or
    False: not given)."""
    spec = TASKS[task]
    given = {key.replace("_", "-"): value for key, value in values.items()}
    unknown = set(given) - {a.name for a in spec.args}
    if unknown:
        raise ValueError(f"{task}: no argument {', '.join(sorted(unknown))}")
    base = _script_job(task)

    def job(target: Target) -> bundle.Job:
        argv: List[str] = []
        for arg in spec.args:
            value = given.get(arg.name)
            if arg.kind == "model":
                argv += model_argv(target, value)
            elif value is None or value is False:
                continue
            elif arg.kind == "bool":
                argv.append(arg.script_flag)
            else:   # one token, --flag=VALUE: a value starting with '-' is never a flag
                argv.append(f"{arg.script_flag}={value}")
        least = spec.least_timeout(given)
        timeout = max(target.timeout, least) if least else base.timeout
        return spec.finish(replace(base, argv=tuple(argv + spec.target_argv(target)),
                                   timeout=timeout), given)

    return job
