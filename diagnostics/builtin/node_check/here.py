"""node-check on the node it runs on: Slurm's ``HealthCheckProgram``, ``Prolog`` and ``Epilog``.

slurmd runs these itself, as root, with no arguments and almost no environment: a health check
gets ``SLURMD_NODENAME`` and nothing else (no PATH, no SLURM_CONF), every
``HealthCheckInterval`` and once before slurmd registers, and is killed after 60 s; a prolog or
epilog gets the job's variables and ``SLURM_SCRIPT_CONTEXT`` (``prolog_slurmd``,
``epilog_slurmd``), and one that exits non-zero drains the node (a prolog's job is requeued).
So this mode runs the same node-check job as the task, on a local target named after the
Slurm node (the local transport: no SSH, no Fabric), within one time budget, and then does
what NHC does on its node, by node-check's drain rules (``drain.py``):

- a drain-level finding drains the node with the tagged Reason (``mldiag: CODE … (node-check
  by root TIME)``, the same owner rule as ``node-check --drain``: a drain by someone else is
  never touched);
- in the health check, a node that passes is resumed only if the drain is mldiag's own (the
  prolog and epilog only drain: a job is running there);
- a node-exporter textfile (``--prom``), as ``node-check --prom`` writes it.

The budget (default 30 s, NHC's default watchdog, half of slurmd's 60 s kill) is split: the
node-check job gets all but a reserve (a fifth, at least 3 s) and is stopped at that point by
the engine as any target's run is; inside it, each tool call gets a sixth of its budget and the
checks still running at its end are ``check-hung`` (node_check.py); what remains is for
scontrol (each of its four calls a quarter of what is left) and the Prometheus file.

Exit status: the health check exits as node-check does (0 ok, 1 warn, 2 fail, 3 the check or
a Slurm command could not be done) -- slurmd only logs it. A prolog or epilog exits 1 only when
the node has a drain-level finding (Slurm then drains it and requeues the prolog's job), else 0:
an error of mldiag's own (it could not check) is said on stderr, which slurmd logs, and is not a
reason to take the node out -- a broken install must not drain a whole cluster.
"""

import datetime
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, TextIO, Tuple

from . import drain as drain_mod, prom as prom_mod, view as node_view
from .run import write_output
from ...core.errors import EXIT_ERROR, InputError
from ...engine import execute as engine, jobs, registry
from ...inventory.targets import Target
from ...inventory.topology import NAME
from ...transport.local import LocalTransport

MODES = ("health", "prolog", "epilog")
CONTEXTS = {"prolog_slurmd": "prolog", "epilog_slurmd": "epilog"}   # SLURM_SCRIPT_CONTEXT
DEFAULT_BUDGET = 30.0
MIN_BUDGET = 10.0
RESERVE_SHARE, MIN_RESERVE = 0.2, 3.0
# the interpreter's start and the bundle's unpacking, inside the job's timeout but before the
# script's own clock starts
STARTUP_S = 1.5
SLURM_CALLS = 4   # scontrol show node, id -un, scontrol update, scontrol show node
# slurmd gives a health check no PATH: where the tools are on any distribution (NHC sets the same)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Settings:
    """One run of the node-local check. ``values``: node-check's own flags (dash names:
    ``kernel-log-file``, ``since``, ``dcgm-level``, ``no-dcgm``); ``expect``: what a healthy
    node has (hosts.yaml's ``expect:`` keys, integers); ``act``: drain/resume (False: say
    what would run)."""
    mode: str
    node: str
    budget: float = DEFAULT_BUDGET
    act: bool = True
    prom: Optional[str] = None
    values: Mapping[str, Any] = field(default_factory=dict)
    expect: Tuple[Tuple[str, int], ...] = ()


def mode_of(env: Mapping[str, str]) -> str:
    """``prolog``/``epilog`` where slurmd says so (``SLURM_SCRIPT_CONTEXT``), else ``health``."""
    return CONTEXTS.get(env.get("SLURM_SCRIPT_CONTEXT", ""), "health")


def node_of(env: Mapping[str, str], hostname: Optional[str] = None) -> str:
    """The Slurm node this runs on: ``SLURMD_NODENAME`` (slurmd sets it for all three), else
    the short host name (a run by hand). A name that is not a plain token is bad input."""
    name = env.get("SLURMD_NODENAME") or (hostname or socket.gethostname()).split(".")[0]
    if not NAME.fullmatch(name):
        raise InputError(f"not a plain Slurm node name: {name[:80]!r} (give --node NAME)")
    return name


def split_budget(budget: float) -> Tuple[float, float]:
    """(the node-check job's timeout, the script's own --budget) for a whole ``budget``."""
    job = budget - max(MIN_RESERVE, RESERVE_SHARE * budget)
    return job, job - STARTUP_S


def check_settings(settings: Settings) -> None:
    if settings.mode not in MODES:
        raise InputError(f"--mode: expected one of {', '.join(MODES)}, got {settings.mode!r}")
    if not settings.budget >= MIN_BUDGET:
        raise InputError(f"--budget: at least {MIN_BUDGET:g} seconds (got {settings.budget:g})")
    if settings.prom:
        prom_mod.check_path(settings.prom)


def run(settings: Settings, out: TextIO, *, clock: Callable[[], float] = time.monotonic,
        now: Optional[datetime.datetime] = None) -> int:
    """Check this node, act on it, write the Prometheus file; the exit status (module
    docstring). What it found and did goes to ``out``: slurmd keeps a failed health check's
    output in its log."""
    check_settings(settings)
    deadline = clock() + settings.budget
    os.environ.setdefault("PATH", DEFAULT_PATH)
    job_timeout, script_budget = split_budget(settings.budget)
    target = Target(name=settings.node, local=True, expect=settings.expect)
    values = {**settings.values, "budget": f"{script_budget:g}"}
    opts = engine.Options(timeout=f"{job_timeout:g}", quiet=True)
    outcome = engine.execute(opts, jobs.job_source("node-check", values), out=out,
                             after_table=node_view.render_actions, targets=[target])
    result = outcome.results[0]
    step = drain_mod.step_for(result, target, settings.node, drain_mod.stamp(now))
    per_call = max(1.0, (deadline - clock()) / SLURM_CALLS)
    outcomes = drain_mod.run([step], drain=settings.act,
                             undrain=settings.act and settings.mode == "health",
                             timeout=per_call, transport=lambda _login: LocalTransport())
    out.write("\nSlurm:\n" + "".join(f"  {line[len('Slurm: '):] if line.startswith('Slurm: ') else line}\n"
                                      for line in drain_mod.lines(outcomes)))
    problems = []
    if settings.prom:
        problem = write_output("--prom", settings.prom, lambda: prom_mod.write(settings.prom, outcome.results))
        if problem:
            problems.append(problem[1])
    if drain_mod.failed(outcomes):
        problems.append("a Slurm command failed (see above)")
    if result.status == "error":
        problems.append(f"{settings.node} was not checked: "
                        f"{result.error.message if result.error else 'error'}")
    for problem in problems:
        sys.stderr.write(f"mldiag: {problem}\n")
    out.flush()
    if settings.mode != "health":
        return 1 if step.want == "drain" else 0
    return max([outcome.exit_code] + ([EXIT_ERROR] if problems else []))


def forwarded_args() -> List[Any]:
    """node-check's arguments this command takes as its own flags, from node-check's spec in
    the registry (one place): those sent to the node, less ``budget`` (here: the whole run's)."""
    return [arg for arg in registry.get("node-check").args if not arg.client and arg.name != "budget"]


def settings_from(args: Any, env: Optional[Dict[str, str]] = None) -> Settings:
    """Settings from the command line's parsed ``args`` (cli/node_health.py: node-check's own
    flags under ``check_NAME``) and the environment slurmd gave (mode and node when not given)."""
    env = dict(os.environ if env is None else env)
    values = {arg.name: getattr(args, "check_" + arg.python_name) for arg in forwarded_args()}
    return Settings(mode=args.mode or mode_of(env), node=args.node or node_of(env),
                    budget=args.budget, act=not args.dry_run, prom=args.prom,
                    values={k: v for k, v in values.items() if v not in (None, False)},
                    expect=tuple(sorted(args.expect.items())) if args.expect else ())
