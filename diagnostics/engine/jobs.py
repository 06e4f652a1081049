"""Task name + arguments + target → Job: what the tasks and the runbook steps share.

Each diagnostic declares its arguments once, in its spec (``registry.py``): the name used on
the command line and in a runbook step (``max-tokens``), the script flag it becomes, its kind
and help. ``job_source(task, values)`` returns a ``Target -> Job`` callable; it raises
``errors.TargetInputError`` for a target that lacks a setting the job needs (no ``models:``
entry for ``check-attn``), which a task reports as bad input (exit 4) and a runbook as a
skipped step on that target. Nothing here imports the transports or Invoke: the runbook
model (``runbook.py``) builds on it.

``run-script`` is not here: its job comes from local files (``cli.script_file_job``).
"""

import functools
from dataclasses import replace
from typing import Any, Callable, List, Mapping, Optional

from . import bundle, registry
from ..core.errors import TargetInputError
from ..inventory.topology import Target


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
    False: not given). The spec's client-side arguments are not the job's."""
    spec = registry.get(task)
    given = spec.given(values)
    base = _script_job(task)

    def job(target: Target) -> bundle.Job:
        argv: List[str] = []
        for arg in spec.args:
            value = given.get(arg.name)
            if arg.client:      # read by mldiag itself (node-check --baseline), never sent
                continue
            if arg.kind == "model":
                argv += model_argv(target, value)
            elif value is None or value is False:
                continue
            elif arg.kind == "bool":
                argv.append(arg.script_flag)
            elif arg.repeatable:    # argparse's append: the flag once per value
                items = [value] if isinstance(value, str) else list(value)
                argv += [f"{arg.script_flag}={item}" for item in items]
            else:   # one token, --flag=VALUE: a value starting with '-' is never a flag
                argv.append(f"{arg.script_flag}={value}")
        least = spec.least_timeout(given)
        timeout = max(target.timeout, least) if least else base.timeout
        return spec.finish(replace(base, argv=tuple(argv + spec.target_argv(target)),
                                   timeout=timeout), given)

    return job
