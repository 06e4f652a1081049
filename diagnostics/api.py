"""A Python API for a team's own ``tasks.py``: mldiag's tasks in an Invoke collection, a task run
from Python the way the command line runs it, and a decorator for a team task's target flags.

    from diagnostics import api

    @api.task
    def preflight(c, min_free_gb=50, host=None, group=None, hosts_file=None):
        gpus = api.run("gpu-status", hosts=host, group=group, hosts_file=hosts_file)
        disk = api.run("disk-free", hosts=host, group=group, hosts_file=hosts_file,
                       min_free_gb=min_free_gb)
        for name, doc in disk.items():
            print(name, gpus[name]["status"], doc["status"], doc["summary"])
        return api.worst(gpus, disk)        # the exit code: the worst status of both

    ns = api.collection()                   # every mldiag task, a team's diagnostics included
    ns.add_task(preflight)
    ns.configure({"mldiag": {"hosts_file": "hosts.yaml"}})

docs/extending.md walks through a team repository built this way. Besides ``cli/``'s tasks,
this is the one module a team imports; like them, it turns Invoke's words into the engine's.
"""

import inspect
import io
import json
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

from .builtin import BUILTIN
from .engine import execute, registry, team
from .core.errors import MldiagError
from .core.outcome import Outcome
from .core.results import status_rank

Hosts = Union[None, str, Sequence[str]]
# what a team task's function gets, when it does not name them itself, and the CLI's spellings
TARGET_PARAMETERS = (("host", None), ("group", None), ("hosts_file", None))


class ApiError(MldiagError):
    """Bad input, or a run mldiag could not make: ``str()`` is the message the command line
    would print after ``mldiag: ``, ``exit_code`` its exit code (4 for bad input)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class RunResult(Mapping[str, Dict[str, Any]]):
    """Every target's result document (the dicts ``--json`` prints), by target name, in the
    order the run gave them. ``status``: the worst; ``exit_code``: what the command line would
    exit with; ``messages``: what it would print on stderr (an output file not written)."""

    def __init__(self, documents: List[Dict[str, Any]], exit_code: int, messages: Sequence[str]):
        self.documents = documents
        self._by_target = {doc["target"]: doc for doc in documents}
        self.exit_code = exit_code
        self.messages = tuple(messages)

    def __getitem__(self, target: str) -> Dict[str, Any]:
        return self._by_target[target]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_target)

    def __len__(self) -> int:
        return len(self._by_target)

    @property
    def status(self) -> str:
        statuses = [doc["status"] for doc in self.documents]
        return max(statuses, key=status_rank) if statuses else "ok"

    def __repr__(self) -> str:
        return f"RunResult({self.status}, {len(self)} target(s), exit {self.exit_code})"


def worst(*runs: RunResult) -> int:
    """The exit code of several runs together: the worst status among them, as one run's."""
    return max((run.exit_code for run in runs), default=0)


def registry_for(hosts_file: Optional[str] = None,
                 diagnostics_dirs: Sequence[str] = ()) -> registry.Registry:
    """The built-ins and the team's diagnostics ``hosts_file`` and ``diagnostics_dirs`` name
    (and the installed ``mldiag.diagnostics`` packages), made this process's registry."""
    found = team.discover(BUILTIN, hosts_file, diagnostics_dirs)
    registry.use(found)
    return found


def collection(hosts_file: Optional[str] = None, diagnostics_dirs: Sequence[str] = ()):
    """An Invoke ``Collection`` of every mldiag task (a team's diagnostics included), to which a
    team adds its own tasks. Its config has an ``mldiag`` namespace: ``hosts_file``,
    ``parallel`` and ``timeout`` there are the defaults of every mldiag task's flags (and of
    ``run`` with ``config=c``)."""
    from .cli.tasks import collection as tasks_collection
    tasks = tasks_collection(registry_for(hosts_file, diagnostics_dirs))
    tasks.configure({"mldiag": {"hosts_file": None, "parallel": None, "timeout": None}})
    return tasks


def _names(hosts: Hosts) -> List[str]:
    if hosts is None:
        return []
    return [hosts] if isinstance(hosts, str) else [str(h) for h in hosts]


def run(task: str, hosts: Hosts = None, group: Hosts = None, hosts_file: Optional[str] = None,
        *, parallel: Optional[int] = None, timeout: Optional[float] = None,
        keep_remote: bool = False, save: Optional[str] = None, config: Any = None,
        **flags: Any) -> RunResult:
    """Run a diagnostic task as ``mldiag TASK`` does — the same checks before anything connects,
    the same fan-out, fleet judgement and outputs — printing nothing. ``flags``: the task's own,
    by their Python names (``min_free_gb=0``, ``kernel_log_file="/x"``); ``config``: an Invoke
    context or config whose ``mldiag.*`` gives defaults. Bad input raises ``ApiError`` with the
    message and exit code the command line would give; Ctrl-C raises KeyboardInterrupt."""
    config = getattr(config, "config", config)
    hosts_file = hosts_file or execute.configured(config, "hosts_file")
    found = registry.current()
    if task not in found.specs and task in BUILTIN.specs:
        found = BUILTIN     # nothing installed yet (a team's registry holds the built-ins too)
        registry.use(found)
    elif task not in found.specs:
        found = registry_for(hosts_file)
    if task not in found.specs:
        raise ApiError(registry.unknown(task), 4)
    spec = found.specs[task]
    known = {a.python_name for a in spec.args}
    unknown = sorted(set(flags) - known)
    if unknown:
        raise ApiError(f"{task}: no flag {unknown[0]!r} (its flags: "
                       f"{', '.join(sorted(known)) or 'none'})", 4)
    parallel = parallel if parallel is not None else execute.configured(config, "parallel")
    timeout = timeout if timeout is not None else execute.configured(config, "timeout")
    opts = execute.Options(host=_names(hosts), group=_names(group), hosts_file=hosts_file, json=True,
                       save=save, parallel=None if parallel is None else str(parallel),
                       timeout=None if timeout is None else str(timeout),
                       keep_remote=keep_remote, quiet=True)
    out = io.StringIO()
    try:
        outcome = execute.run_diagnostic(spec, opts, flags, out=out)
    except MldiagError as exc:
        raise ApiError(str(exc), exc.exit_code) from None
    documents = json.loads(out.getvalue() or "[]")
    return RunResult(documents, outcome.exit_code, outcome.messages)


def task(func: Optional[Callable] = None, **task_options: Any):
    """``@api.task``: an Invoke task for a team's function, with mldiag's target flags
    (``-H/--host`` and ``-g/--group``, repeatable, and ``--hosts-file``) added after its own
    parameters where it does not name them, defaults for them from the ``mldiag`` config, and
    mldiag's exits: an ``ApiError`` (or any of mldiag's errors) is ``mldiag: MESSAGE`` with its
    code, a returned int or ``RunResult`` is the exit code. ``task_options``: Invoke's
    (``help=``, ``aliases=``, ...)."""
    if func is None:
        return lambda f: task(f, **task_options)
    from .cli.tasks import MldiagTask

    own = list(inspect.signature(func).parameters.values())
    named = {p.name for p in own}
    added = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default)
             for name, default in TARGET_PARAMETERS if name not in named]
    signature = inspect.Signature(own + added)

    def body(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        context = values.get(own[0].name) if own else None
        if values.get("hosts_file") is None and context is not None:
            values["hosts_file"] = execute.configured(getattr(context, "config", None), "hosts_file")
        call = {k: v for k, v in values.items() if k in named}
        returned = func(**call)
        code = returned.exit_code if isinstance(returned, RunResult) else returned
        if isinstance(code, int) and not isinstance(code, bool) and code:
            return Outcome(returned, code)      # MldiagTask ends the process with it
        return returned

    body.__signature__ = signature
    body.__name__ = body.__qualname__ = func.__name__
    body.__doc__ = func.__doc__
    body.__module__ = func.__module__
    help_texts = {"host": cli_help("host"), "group": cli_help("group"),
                  "hosts-file": cli_help("hosts-file"), **task_options.pop("help", {})}
    return MldiagTask(body, help=help_texts, **task_options)


def cli_help(flag: str) -> str:
    from .cli.tasks import COMMON_HELP
    return COMMON_HELP[flag]


__all__ = ["ApiError", "RunResult", "collection", "run", "task", "worst", "registry_for"]
