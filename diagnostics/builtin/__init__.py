"""The built-in diagnostics: one ``DiagnosticSpec`` each (``engine/registry.py`` says what a
spec is), with the hooks that reach their client sides in this package (gpu-status's view and
remembered nvidia-smi fields, node-check's run, stacks' fold). ``BUILTIN`` is the registry a
run starts from; a team's diagnostics are added to it (``engine/team.py``).
"""

import functools
import json
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..core.errors import InputError
from ..core.paths import SCRIPTS_DIR
from ..engine.registry import Arg, DiagnosticSpec, Registry, Values

# ------------------------------------------------------------------------------- their hooks
# Each imports its module when called: the registry is read at every start.

MODEL = Arg("model", "model directory on the target, or a name from the target's models: "
                     "(default: its first)", kind="model")


def _gpu_status_argv(target: Any) -> List[str]:
    """hosts.yaml's ``gpus:``, and what the client remembers of the target's nvidia-smi."""
    from .gpu_status import smi_memory
    gpus = target.expect_dict.get("gpus")
    return ([f"--expect-gpus={gpus}"] if gpus is not None else []) + smi_memory.known_argv(target.name)


def _remember_smi(values: Values, hosts: Any = None) -> Callable[[List[Any]], None]:
    from .gpu_status import smi_memory
    return smi_memory.remember


def _gpu_view(results, stream, *, color=False) -> None:
    from .gpu_status import view
    view.render_gpus(results, stream, color=color)


def _env_view(results, stream, *, color=False) -> None:
    from ..views import render
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
    from ..core import literals
    return literals.read_constants(os.path.join(SCRIPTS_DIR, "dcgm.py"))["TIMEOUTS"]


def _node_check_timeout(values: Values) -> Optional[float]:
    """The job gets a minute more than dcgmi diag's level needs, for the rest of node-check;
    with --budget, the budget and 15 s for the interpreter and the bundle (the script ends its
    own checks at the budget)."""
    level, budget = values.get("dcgm-level"), values.get("budget")
    if budget:
        return float(budget) + 15.0
    if not level or values.get("no-dcgm"):
        return None
    return dcgm_level_timeouts()[int(level)] + 60.0


def _expect_block(target: Any) -> List[str]:
    """node-check: the target's ``expect:`` block, one JSON token (keys and integers only), and
    its ``paths:``, one JSON token too: a token of the job's argv travels in the bundle, never on
    a command line (invariant 1), so a path with a space or a quote in it is sent as it is."""
    expect = target.expect_dict
    paths = [{"name": name, "path": path, "min_free_gb": least} for name, path, least in target.paths]
    return (([f"--expect={json.dumps(expect, sort_keys=True)}"] if expect else [])
            + ([f"--paths={json.dumps(paths)}"] if paths else []))


def _node_check_timed(job: Any, values: Values) -> Any:
    from .node_check import clock
    return clock.stamped(job, values)


def _node_check_check(values: Values) -> None:
    from .node_check import run as node_check_run
    node_check_run.check(values)


def _node_check_judge(values: Values, hosts: Any = None) -> Callable[[List[Any]], None]:
    from .node_check import run as node_check_run
    return node_check_run.judge(values, hosts)


def _node_check_view(results, stream, *, color=False) -> None:
    from .node_check import view as node_view
    node_view.render_actions(results, stream, color=color)


def _node_check_run(opts: Any, values: Values, *, out=None) -> Any:
    from .node_check import run as node_check_run
    return node_check_run.run(opts, values, out=out)


def _offer_py_spy(job: Any, values: Values) -> Any:
    from .stacks import upload as stacks_upload
    return stacks_upload.offer(job, values)


def _stacks_check(values: Values) -> None:
    from .stacks import run as stacks_run
    stacks_run.check_values(values)


def _stacks_judge(values: Values, hosts: Any = None) -> Callable[[List[Any]], None]:
    from .stacks import run as stacks_run
    return stacks_run.amend


def _step_times_judge(values: Values, hosts: Any = None) -> Callable[[List[Any]], None]:
    from . import step_times
    return step_times.amend


def _stacks_timeout(values: Values) -> Optional[float]:
    """A window of samples takes its length, and a minute for the rest (finding the ranks,
    the last dumps)."""
    window = values.get("window")
    return float(window) + 60.0 if window else None


def _stacks_view(results, stream, *, color=False) -> None:
    from .stacks import run as stacks_run
    stacks_run.render_view(results, stream, color=color)


def _nccl_expect(target: Any) -> List[str]:
    """nccl-check: hosts.yaml's ``expect: {allreduce_busbw: GBPS}``, the node's own figure."""
    busbw = target.expect_dict.get("allreduce_busbw")
    return [f"--expect-busbw={busbw}"] if busbw is not None else []


def _nccl_timeout(values: Values) -> Optional[float]:
    """The job outlives the measurement's budget by half a minute (starting the ranks, torch's
    import, the result)."""
    budget = values.get("budget")
    return float(budget or 90) + 30.0


def _nccl_judge(values: Values, hosts: Any = None) -> Callable[[List[Any]], None]:
    from .nccl_check import fleet
    return fleet.judge(values)


def _nccl_check(values: Values) -> None:
    from .nccl_check import fleet, passed
    fleet.percentage(values)
    passed.valid_for(values)
    if values.get("across") and values.get("pairs"):
        raise InputError("nccl-check: --across and --pairs are two ways to group the nodes: give one")


def _nccl_fan_out(values: Values) -> Any:
    from .nccl_check import run as nccl_run
    return nccl_run.fan_out(values)


def _nccl_run(opts: Any, values: Values, *, out=None) -> Any:
    from .nccl_check import run as nccl_run
    return nccl_run.run(opts, values, out=out)


# gpu-perf: hosts.yaml's expect keys -> the script's flags (bf16 GEMM TFLOPS, device copy and
# host<->device GB/s per GPU)
_GPU_PERF_EXPECT = (("gemm_tflops", "--expect-gemm"), ("hbm_gbps", "--expect-hbm"), ("h2d_gbps", "--expect-h2d"))
_GPU_PERF_BUDGETS = {"quick": 30, "standard": 120, "full": 900}     # gpu_perf.py's TIERS


def _gpu_perf_expect(target: Any) -> List[str]:
    expect = target.expect_dict
    return [f"{flag}={expect[key]}" for key, flag in _GPU_PERF_EXPECT if expect.get(key) is not None]


def _gpu_perf_timeout(values: Values) -> Optional[float]:
    """The tier's budget (or --budget), and a minute for the start and the result."""
    budget = _GPU_PERF_BUDGETS.get(values.get("tier") or "quick", 900)     # a bad tier: refused after
    if values.get("budget"):
        budget = min(budget, int(values["budget"]))
    return float(budget) + 60.0


def _gpu_perf_check(values: Values) -> None:
    budget, pct = values.get("budget"), values.get("peer-pct")
    if budget is not None and not 1 <= int(budget) <= 900:
        raise InputError(f"gpu-perf: --budget: expected seconds from 1 to 900, got {budget}")
    if pct is not None and not 0 < int(pct) <= 100:
        raise InputError(f"gpu-perf: --peer-pct: expected a percentage from 1 to 100, got {pct}")


def _kubernetes_args() -> Tuple[Arg, ...]:
    """node-check's --taint, --condition, --untaint (node_check/taint.py): client flags that
    change nodes, which no runbook step takes."""
    helps = {
        "taint": "Kubernetes: taint the node of each pod whose worst action is drain or worse "
                 "(mldiag.io/unhealthy:NoSchedule); without it the commands are only printed",
        "condition": "Kubernetes: set the node condition MldiagUnhealthy (the codes in its "
                     "message) on those nodes (kubectl 1.24 or later)",
        "untaint": "Kubernetes: remove mldiag's taint and condition, and only those, from the "
                   "node of each pod that passes"}
    return tuple(Arg(name, text, kind="bool", client=True,
                     not_in_runbook=f"a runbook reports and changes no node: run `mldiag "
                                    f"node-check --{name}` on what it found")
                 for name, text in helps.items())


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
        companions=("kernel_log.py", "xid.py", "xid_catalog.json", "nvml.py"),
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
         Arg("budget", "seconds the whole check may take on the node, hung tools included: "
                       "each tool call gets a sixth, the checks still running at the end are "
                       "check-hung (default 60, or dcgmi's level time + 60)", kind="int",
             metavar="SECONDS"),
         Arg("save-baseline", "save each node's facts (driver, CUDA, VBIOS, GPUs, NVLinks, PCIe, "
                              "IB ports, firmware) to FILE, for a later --baseline",
             kind="file", client=True,
             not_in_runbook=_NOT_A_RUNBOOK_OUTPUT.format(flag="save-baseline FILE")),
         Arg("baseline", "report every fact that differs from FILE: a golden file (mldiag "
                         "baseline-init) or a --save-baseline file (default: hosts.yaml's "
                         "baseline:, else the majority of the selected nodes)", kind="file",
             client=True),
         Arg("drain", "Slurm: drain the nodes whose worst action is drain or worse (reason "
                      "'mldiag: CODE …'); without it the commands are only printed", kind="bool",
             client=True, not_in_runbook="a runbook reports and changes no node: run "
                                         "`mldiag node-check --drain` on what it found"),
         Arg("undrain", "Slurm: check the nodes mldiag drained inside a maintenance reservation "
                        "and keep resumed those that pass", kind="bool", client=True,
             not_in_runbook="a runbook reports and changes no node: run "
                            "`mldiag node-check --undrain`"),
         *_kubernetes_args(),
         Arg("prom", "write a Prometheus textfile-collector file (node-exporter) to FILE",
             kind="file", client=True,
             not_in_runbook=_NOT_A_RUNBOOK_OUTPUT.format(flag="prom FILE"))),
        companions=("kernel_log.py", "xid.py", "xid_catalog.json", "nvlink.py", "nvfabric.py", "pcie.py",
                    "ib.py", "dcgm.py", "host_checks.py", "gpu_host.py"),
        target_argv=_expect_block, least_timeout=_node_check_timeout, finish=_node_check_timed,
        check=_node_check_check,
        judge=_node_check_judge, view=_node_check_view, run=_node_check_run),
    DiagnosticSpec(
        "nccl-check", "A node's collective bus bandwidth (nccl-tests, else torch.distributed), "
                      "against its figure and its peers.",
        (Arg("op", "the collective: all_reduce (default), all_gather, alltoall",
             choices=("all_reduce", "all_gather", "alltoall"), metavar="OP"),
         Arg("backend", "auto (nccl-tests where installed, else torch) | nccl-tests | torch",
             choices=("auto", "nccl-tests", "torch"), metavar="BACKEND"),
         Arg("nccl-tests", "the nccl-tests binary, or its build directory, on the target",
             metavar="PATH"),
         Arg("ranks", "processes (default: one per GPU; 2 with gloo on a node without GPUs)",
             kind="int"),
         Arg("max-bytes", "largest message (default 16 GiB on GPUs, 64 MiB on the CPU)",
             kind="int"),
         Arg("iters", "timed runs of each size (default 20)", kind="int"),
         Arg("budget", "seconds the measurement may take on a node (default 90)", kind="int"),
         Arg("fleet-pct", "a node below this % of the median of its peers measured alike is a "
                          "fail (default 80; 3 nodes or more)", kind="int", client=True),
         Arg("pairs", "measure the nodes two by two, in two passes (the slow node, or the slow "
                      "link between two, named)", kind="bool", client=True),
         Arg("across", "one collective across all the selected nodes, started together (the "
                       "group's bandwidth; nothing skipped as passed)", kind="bool", client=True),
         Arg("valid-for", "skip a node that passed within this many hours (default 24; 0: "
                          "measure every node)", kind="int", client=True,
             not_in_runbook="a runbook step measures every node"),
         Arg("force", "measure every node, even one that passed lately", kind="bool", client=True,
             not_in_runbook="a runbook step measures every node")),
        companions=("nccl_tests.py", "nccl_thresholds.json"),
        target_argv=_nccl_expect, least_timeout=_nccl_timeout, check=_nccl_check, judge=_nccl_judge,
        run=_nccl_run, fan_out=_nccl_fan_out),
    DiagnosticSpec(
        "gpu-perf", "Each GPU under load: GEMM TFLOPS, HBM and host<->device GB/s, against its "
                    "model's figures and its peers.",
        (Arg("tier", "quick (<= 30 s, a prolog), standard (<= 2 min, an epilog), full (<= 15 min, "
                     "qualification, with nvbandwidth)", choices=("quick", "standard", "full"),
             metavar="TIER"),
         Arg("budget", "seconds the measuring may take (default: the tier's)", kind="int"),
         Arg("peer-pct", "a GPU below this % of the median of the node's GPUs is slow "
                         "(default 85)", kind="int"),
         Arg("device", "auto | cuda | cpu (cpu: the host's own matmul and memory copy)",
             choices=("auto", "cuda", "cpu"), metavar="DEVICE"),
         Arg("nvbandwidth", "the nvbandwidth binary on the target (full tier; default: on "
                            "PATH)", metavar="PATH")),
        companions=("nvbandwidth.py", "nccl_tests.py", "gpu_perf_figures.json"),
        target_argv=_gpu_perf_expect, least_timeout=_gpu_perf_timeout, check=_gpu_perf_check),
    DiagnosticSpec(
        "nccl-ras", "NCCL's own view of a job's communicators (its RAS port, NCCL 2.24+): missing "
                    "ranks, ranks behind, errors.",
        (Arg("addr", "the RAS address on the target (default: $NCCL_RAS_ADDR, else "
                     "localhost:28028)", metavar="HOST:PORT"),
         Arg("query-timeout", "seconds the query may take (default 10)", flag="--timeout", kind="int"),
         Arg("verbose", "VERBOSE STATUS: NCCL lists more of the outlier ranks", kind="bool"),
         Arg("format", "auto (JSON where NCCL has it, 2.28.7 on) | json | text",
             choices=("auto", "json", "text"), metavar="FORMAT"))),
    DiagnosticSpec(
        "step-times", "Per-rank step times from a job's logs (Megatron, DeepSpeed, torchtitan, "
                      "Lightning, HF Trainer): the slow rank.",
        (Arg("log", "one rank's log on the target (repeatable, in rank order)", metavar="FILE",
             repeatable=True),
         Arg("log-pattern", "the ranks' logs on the target, {rank} standing for the rank "
                            "(/logs/rank{rank}.log)", metavar="PATTERN"),
         Arg("ranks", "with --log-pattern: ranks 0 to N-1", kind="int"),
         Arg("format", "the logs' format (default: found per log)",
             choices=("megatron", "deepspeed", "torchtitan", "lightning", "hf-trainer", "fallback"),
             metavar="FORMAT"),
         Arg("last", "each rank's last N steps (default 200)", kind="int"),
         Arg("window", "the recent steps scored against the peers and the rank's own history "
                       "(default 10)", kind="int")),
        judge=_step_times_judge),
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
                               "own)", kind="bool"),
         Arg("window", "sample every rank's stack for this many seconds: the straggler of a slow "
                       "job is the rank that waits least in collectives (at most 600)", kind="int"),
         Arg("rate", "samples per second per rank during --window (default 4, at most 20)", kind="int")),
        companions=("pyframes.py", "flight_recorder.py", "wait_frames.json"),
        finish=_offer_py_spy, check=_stacks_check, judge=_stacks_judge, view=_stacks_view,
        least_timeout=_stacks_timeout),
)

REGISTRY: Dict[str, DiagnosticSpec] = {spec.name: spec for spec in BUILTINS}
BUILTIN = Registry(REGISTRY)
# The tasks whose run never needs a team's diagnostics: a command line naming one of them (the
# hot path) reads no hosts file and no team directory before the task itself does.
NO_TEAM_NEEDED = frozenset(REGISTRY) | {"hosts", "run-script", "baseline-init", "baseline-diff"}
