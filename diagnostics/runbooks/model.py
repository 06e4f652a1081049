"""Runbook files (YAML) → checked, frozen ``Runbook`` objects; finding them by name.

A runbook is a team's incident steps as one command (``inv runbook slow-training -H trainbox``).
The file ``NAME.yaml`` in a runbook directory defines the runbook ``NAME``::

    description: Training is slower than it should be          # required, one line
    params:                                                     # optional; --param NAME=VALUE
      log: {description: training log on the target}            # no default: steps using it are
      lines: {description: lines to scan, default: "5000"}      #   skipped when it is not given
    steps:                                                      # required, run in this order
      - task: gpu-status                                        # a diagnostic task
        stop_if: error                                          # stop this target's run when
                                                                #   its status here is ≥ error
      - task: check-attn
        args: {model: draft}                                    # the task's own flags, dash names
      - id: log                                                 # default id: the task name
        task: scan-log
        when: gpu-status.warn                                   # only where gpu-status was ≥ warn
        args: {path: "{{ params.log }}", lines: "{{ params.lines }}"}
      - id: link                                                # a local script, run as
        task: run-script                                        #   `run-script` runs it
        args:
          script: checks/link.py                                # beside this file (or code: |)
          args: [--iface, "{{ params.iface }}"]                 # the script's arguments
          put: [checks/limits.json]                             # local files shipped beside it

References (in any string argument, Ansible-style, quoted in YAML): ``{{ params.NAME }}``,
``{{ target.name }}``, ``{{ target.model }}`` (its first ``models:`` path),
``{{ target.models.NAME }}``, ``{{ target.gpus }}``. A parameter that is not given and has no
default skips every step that refers to it; a target setting a target lacks skips the step on
that target. Keys starting with ``x-`` are free for team metadata, as in hosts.yaml.

A ``run-script`` step's ``script:`` and ``put:`` files are this machine's, read before anything
runs (one file for the whole step: only ``{{ params.NAME }}`` may be referred to there): a path
written in the runbook is relative to the runbook's directory; one that starts with a reference
(``script: "{{ params.check }}"``) is the user's, relative to the current directory; ``~``
is expanded in both. ``code:`` is inline Python, taken as written (no references). Its title
defaults to the script's base name, or "inline code".

Every error names the file, the line and the key, like hosts.yaml's (exit 4).
"""

import difflib
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core.paths import RUNBOOKS_DIR
from ..engine import registry
from ..core.errors import InputError
from ..core.results import status_rank
from ..inventory.yamlfile import NAME
from ..inventory.yamlfile import At as _At
from ..inventory.yamlfile import LineMapping as _Mapping
from ..inventory.yamlfile import LineSequence as _Sequence
from ..inventory.yamlfile import expect_mapping as _mapping
from ..inventory.yamlfile import expect_string as _string
from ..inventory.yamlfile import is_number as _is_number
from ..inventory.yamlfile import items_at as _entries
from ..inventory.yamlfile import parse as _parse_yaml
from ..inventory.yamlfile import show as _show
from ..inventory.yamlfile import unknown_key as _unknown_key

BUILTIN_DIR = RUNBOOKS_DIR
SUFFIXES = (".yaml", ".yml")
MAX_FILE_BYTES = 2**20
RUNBOOK_KEYS = ("name", "description", "params", "steps")
PARAM_KEYS = ("description", "default")
STEP_KEYS = ("task", "id", "title", "args", "when", "stop_if", "timeout")
# run-script as a step: not a registered diagnostic (its job is the task's, from local files)
SCRIPT_TASK = "run-script"
SCRIPT_KEYS = ("script", "code", "args", "put")
SCRIPT_REQUIRED = ("the script to run (a local file, relative to the runbook), or code: "
                   "(inline Python)")
# A step's status at which its when:/stop_if: hold ("at least"); ok would always hold.
CONDITION_STATUSES = ("warn", "fail", "error")
PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
REFERENCE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
TARGET_FIELDS = ("name", "model", "gpus")


class MissingValue(Exception):
    """A reference with no value for this run or target: the step is skipped (never an error)."""


@dataclass(frozen=True)
class Param:
    name: str
    description: str
    default: Optional[str] = None


@dataclass(frozen=True)
class Condition:
    """``STEP.STATUS``: the step ran on this target and its status there is at least STATUS."""
    step: str
    status: str

    def __str__(self) -> str:
        return f"{self.step}.{self.status}"

    def holds(self, status: Optional[str]) -> bool:
        return status is not None and status_rank(status) >= status_rank(self.status)


@dataclass(frozen=True)
class Step:
    id: str
    task: str
    title: str
    args: Tuple[Tuple[str, Any], ...] = ()    # as written; strings may hold {{ references }}
    when: Tuple[Condition, ...] = ()           # all must hold
    stop_if: Optional[str] = None
    timeout: Optional[float] = None
    line: int = 0
    # run-script: where each of its local files was named (``script``, ``put[1]``, and ``args``
    # for the step's), for an error found when they are read
    where: Tuple[Tuple[str, _At], ...] = field(default=(), compare=False)

    @property
    def params(self) -> List[str]:
        """Names of the parameters the arguments refer to, in order."""
        names = [ref.split(".", 1)[1] for key, value in self.args if key not in _LITERAL
                 for text in _texts(value)
                 for ref in REFERENCE.findall(text) if ref.startswith("params.")]
        return list(dict.fromkeys(names))

    def resolve(self, params: Mapping[str, str], target: Any,
                names: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """The arguments for one target (``names``: only these); MissingValue when a reference
        has no value there."""
        return {key: value if key in _LITERAL else _resolved(value, params, target)
                for key, value in self.args if names is None or key in names}

    def local_files(self, params: Mapping[str, str]) -> List[Tuple[str, str, _At]]:
        """run-script: ``(key, path, where)`` of its script and each put file for this run,
        absolute (a path that started with a reference: from the current directory);
        MissingValue when a parameter they name is not given."""
        args = dict(self.args)
        named = ([("script", args["script"])] if "script" in args else []) + \
            [(f"put[{i}]", path) for i, path in enumerate(args.get("put", ()))]
        where = dict(self.where)
        return [(key, os.path.abspath(os.path.expanduser(_substitute(path, params, None))),
                 where[key]) for key, path in named]

    def heading(self, params: Mapping[str, str]) -> str:
        """The title as written; a run-script step's default: its script's base name (its
        references replaced by ``params`` where they can be) or "inline code"."""
        args = dict(self.args)
        if self.title or self.task != SCRIPT_TASK:
            return self.title
        if "script" not in args:
            return "inline code"
        try:
            path = _substitute(args["script"], params, None)
        except MissingValue:
            path = args["script"]
        return os.path.basename(path) or path


@dataclass(frozen=True)
class Runbook:
    name: str
    description: str
    params: Tuple[Param, ...]
    steps: Tuple[Step, ...]
    path: str
    source: str = "built-in"     # "built-in", or the directory it was found in

    def param_values(self, given: Mapping[str, str]) -> Dict[str, str]:
        """Defaults, then the values given on the command line (each name checked)."""
        declared = {p.name: p for p in self.params}
        for name in given:
            if name not in declared:
                listed = ", ".join(declared) if declared else "none"
                raise InputError(f"--param {name}: runbook {self.name!r} has no parameter "
                                 f"{name!r}{_guess(name, declared)} (its parameters: {listed})")
        values = {p.name: p.default for p in self.params if p.default is not None}
        values.update(given)
        return values


def _guess(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_LITERAL = ("code",)      # taken as written: Python's own {{ }} are no references


def _texts(value: Any) -> List[str]:
    """The strings of an argument's value: itself, or each item of a repeatable one's list."""
    if isinstance(value, str):
        return [value]
    return [item for item in value if isinstance(item, str)] if isinstance(value, tuple) else []


def _resolved(value: Any, params: Mapping[str, str], target: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_resolved(item, params, target) for item in value)
    return _substitute(value, params, target) if isinstance(value, str) else value


def _substitute(text: str, params: Mapping[str, str], target: Any) -> str:
    def value(match: "re.Match") -> str:
        ref = match.group(1)
        scope, _, rest = ref.partition(".")
        if scope == "params":
            if rest not in params:
                raise MissingValue(f"parameter {rest} not given (--param {rest}=VALUE)")
            return params[rest]
        if rest == "name":
            return target.name
        if rest == "model":
            if not target.default_model:
                raise MissingValue(f"{target.name} has no models: entry in hosts.yaml")
            return target.default_model
        if rest == "gpus":
            if target.gpus is None:
                raise MissingValue(f"{target.name} has no gpus: setting in hosts.yaml")
            return str(target.gpus)
        model = rest.split(".", 1)[1]
        models = dict(target.models)
        if model not in models:
            raise MissingValue(f"{target.name} has no models: entry {model!r} in hosts.yaml")
        return models[model]
    return REFERENCE.sub(value, text)


# ---------------------------------------------------------------------------- finding runbooks

def search_dirs(topology_dirs: Sequence[Tuple[str, str, int]] = (),
                extra: Sequence[str] = ()) -> List[Tuple[str, str]]:
    """(directory, label) in the order they are searched: built-in, hosts.yaml's ``runbooks:``,
    then ``--runbooks-dir``; a later directory's runbook replaces an earlier one of that name.
    Directories named by the user must exist."""
    dirs = [(BUILTIN_DIR, "built-in")]
    for path, file, line in topology_dirs:
        if not os.path.isdir(path):
            raise InputError(f"{path}: not a directory", file=file, line=line, key="runbooks")
        dirs.append((path, path))
    for path in extra:
        if not os.path.isdir(path):
            raise InputError(f"--runbooks-dir {path}: not a directory")
        dirs.append((os.path.abspath(path), os.path.abspath(path)))
    return dirs


def files(dirs: Sequence[Tuple[str, str]]) -> Dict[str, Tuple[str, str]]:
    """name → (file, label) of every runbook file, later directories winning."""
    found: Dict[str, Tuple[str, str]] = {}
    for directory, label in dirs:
        names: Dict[str, str] = {}
        for entry in sorted(os.listdir(directory)):
            stem, suffix = os.path.splitext(entry)
            if suffix not in SUFFIXES or entry.startswith("."):
                continue
            if stem in names:
                raise InputError(f"two files define runbook {stem!r}: {names[stem]} and {entry}",
                                 file=os.path.join(directory, entry))
            names[stem] = entry
            found[stem] = (os.path.join(directory, entry), label)
    return dict(sorted(found.items()))


# a built-in runbook's old name: still runs it (a team's runbook of that name comes first)
ALIASES = {"hung-job": "slow-or-hung"}


def find(name: str, dirs: Sequence[Tuple[str, str]]) -> Runbook:
    known = files(dirs)
    if name not in known and ALIASES.get(name) in known:
        name = ALIASES[name]
    if name not in known:
        listed = ", ".join(known) or "none"
        raise InputError(f"unknown runbook {name!r}{_guess(name, known)} (runbooks: {listed}; "
                         "`runbook --list` describes them)")
    path, label = known[name]
    return load(path, label)


def load(path: str, source: str = "built-in") -> Runbook:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read the runbook: {exc.strerror or exc}", file=path) from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"larger than {MAX_FILE_BYTES // 2**20} MiB, the most a runbook may be",
                         file=path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte 0x{data[exc.start]:02x})", file=path,
                         line=data.count(b"\n", 0, exc.start) + 1) from None
    return loads(text, path, source)


def loads(text: str, path: str = "runbook.yaml", source: str = "built-in") -> Runbook:
    try:
        document = _parse_yaml(text, path, empty="empty runbook (expected a mapping with "
                                                 "description: and steps:)")
    except InputError as exc:
        if "unhashable key" in exc.reason and "{{" in text:
            raise InputError(exc.reason + " (quote a reference: path: \"{{ params.log }}\")",
                             file=exc.file, line=exc.line) from None
        raise
    if not isinstance(document, _Mapping):
        raise InputError(f"expected a mapping with description: and steps:, got {_show(document)}",
                         file=path, line=getattr(document, "line", 1))
    top = _fields(document, _At(path, document.line), RUNBOOK_KEYS)
    stem = os.path.splitext(os.path.basename(path))[0]
    if not NAME.fullmatch(stem):
        raise InputError(f"{stem!r} is not a valid runbook name: use only [A-Za-z0-9._-], not "
                         "starting with '.' or '-'", file=path)
    if "name" in top:
        name, where = top["name"]
        if _string(name, where, "a name") != stem:
            raise where.error(f"{name!r} differs from the file name: {os.path.basename(path)} "
                              f"defines the runbook {stem!r} (leave name: out)")
    for required in ("description", "steps"):
        if required not in top:
            raise _At(path, document.line).child(required, document.line).error("required")
    description = _string(*top["description"], "a one-line description")
    params = _params(*top["params"]) if "params" in top else ()
    steps = _steps(*top["steps"], params)
    return Runbook(name=stem, description=description.strip(), params=params, steps=steps,
                   path=path, source=source)


def _fields(value: Any, at: _At, allowed: Sequence[str]) -> Dict[str, Tuple[Any, _At]]:
    fields = {}
    for key, setting, where in _entries(_mapping(value, at), at):
        if key not in allowed:
            raise where.error(_unknown_key(key, allowed))
        fields[key] = (setting, where)
    return fields


def _params(value: Any, at: _At) -> Tuple[Param, ...]:
    params = []
    for name, spec, where in _entries(_mapping(value, at), at):
        if not isinstance(name, str) or not PARAM_NAME.fullmatch(name):
            raise where.error(f"{_show(name)} is not a parameter name ([A-Za-z_][A-Za-z0-9_-]*)")
        fields = _fields(spec, where, PARAM_KEYS)
        if "description" not in fields:
            raise where.child("description", where.line).error("required (one line: what to give)")
        default = None
        if "default" in fields:
            default = _scalar_text(*fields["default"])
        params.append(Param(name, _string(*fields["description"], "a description"), default))
    return tuple(params)


def _scalar_text(value: Any, at: _At) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise at.error(f"expected a string or a number, got {_show(value)}")
    return str(value)


def _steps(value: Any, at: _At, params: Tuple[Param, ...]) -> Tuple[Step, ...]:
    if not isinstance(value, _Sequence) or not value:
        raise at.error(f"expected a list of steps, got {_show(value)}")
    steps: List[Step] = []
    first_line: Dict[str, int] = {}
    for i, (spec, line) in enumerate(zip(value, value.item_lines)):
        step = _step(spec, at.item(i, line), params, steps)
        if step.id in first_line:
            raise at.item(i, line).error(f"two steps are named {step.id!r} (first at line "
                                         f"{first_line[step.id]}): give one of them an id:")
        first_line[step.id] = line
        steps.append(step)
    return tuple(steps)


def _step(value: Any, at: _At, params: Tuple[Param, ...], earlier: List[Step]) -> Step:
    fields = _fields(value, at, STEP_KEYS)
    if "task" not in fields:
        raise at.child("task", at.line).error(f"required (one of {', '.join(_step_tasks())})")
    task, task_at = fields["task"]
    if task not in registry.current().specs and task != SCRIPT_TASK:
        raise task_at.error(registry.unknown(str(task), (SCRIPT_TASK,)))
    step_id = task
    if "id" in fields:
        step_id, id_at = fields["id"]
        if not isinstance(step_id, str) or not NAME.fullmatch(step_id):
            raise id_at.error(f"{_show(step_id)} is not a valid step id: use only [A-Za-z0-9._-], "
                              "not starting with '.' or '-'")
    title = _string(*fields["title"], "a one-line title") if "title" in fields else ""
    args_at = fields.get("args", (None, at.child("args", at.line)))
    where: Tuple[Tuple[str, _At], ...] = ()
    if task == SCRIPT_TASK:
        args, where = _script_args(*args_at, params)
    else:
        args = _args(task, *args_at, params)
    when = _when(*fields["when"], earlier) if "when" in fields else ()
    stop_if = _status(*fields["stop_if"]) if "stop_if" in fields else None
    timeout = _timeout(*fields["timeout"]) if "timeout" in fields else None
    return Step(id=step_id, task=task, title=title, args=args, when=when, stop_if=stop_if,
                timeout=timeout, line=at.line, where=where)


def _step_tasks() -> List[str]:
    return registry.names() + [SCRIPT_TASK]


def _script_args(value: Any, at: _At, params: Tuple[Param, ...]
                 ) -> Tuple[Tuple[Tuple[str, Any], ...], Tuple[Tuple[str, _At], ...]]:
    """A run-script step's ``args:`` (``script`` or ``code``, ``args``, ``put``) and where its
    local files are named. The argv's items may refer to the target; the files, read on this
    machine for the whole step, only to parameters."""
    fields = {}
    for name, setting, where in _entries(_mapping(value, at), at):
        if name not in SCRIPT_KEYS:
            raise where.error(f"{SCRIPT_TASK} has no argument {name!r}"
                              f"{_guess(str(name), SCRIPT_KEYS)} (its arguments: "
                              f"{', '.join(SCRIPT_KEYS)})")
        fields[name] = (setting, where)
    if "script" not in fields and "code" not in fields:
        raise at.child("script", at.line).error(f"required: {SCRIPT_REQUIRED}")
    if "script" in fields and "code" in fields:
        raise fields["code"][1].error("give script: or code:, not both")
    args: List[Tuple[str, Any]] = []
    places = [("args", at)]
    for name, (setting, where) in fields.items():
        if name == "code":
            args.append((name, _string(setting, where, "Python code")))
        elif name == "script":
            args.append((name, _local_path(setting, where, params, "the script")))
            places.append((name, where))
        elif name == "put":
            items = _items(setting, where, "a list of local files (relative to the runbook)")
            args.append((name, tuple(_local_path(item, item_at, params, "a put file")
                                     for item, item_at in items)))
            places += [(f"put[{i}]", item_at) for i, (_item, item_at) in enumerate(items)]
        else:
            items = _items(setting, where, "a list of strings (the script's arguments)")
            args.append((name, tuple(_script_arg(item, item_at, params) for item, item_at in items)))
    return tuple(args), tuple(places)


def _items(value: Any, at: _At, what: str) -> List[Tuple[Any, _At]]:
    if not isinstance(value, _Sequence):
        raise at.error(f"expected {what}, got {_show(value)}")
    return [(item, at.item(i, line)) for i, (item, line) in enumerate(zip(value, value.item_lines))]


def _script_arg(value: Any, at: _At, params: Tuple[Param, ...]) -> str:
    if _is_number(value):       # YAML's 010 or 1e3 would not reach the script as written
        raise at.error(f"expected a string (quote a number), got {_show(value)}")
    if not isinstance(value, str):
        raise at.error(f"expected a string, got {_show(value)}")
    _check_references(value, at, params)
    return value


def _local_path(value: Any, at: _At, params: Tuple[Param, ...], what: str) -> str:
    """A local file of a step (a run-script step's script and puts, node-check's baseline):
    written in the runbook, relative to its directory
    (made absolute here); starting with a reference (``{{ params.check }}``), the user's: kept
    as written, relative to the current directory once resolved."""
    path = _string(value, at, "a path")
    _check_references(path, at, params)
    if any(ref.startswith("target") for ref in REFERENCE.findall(path)):
        raise at.error(f"{{{{ target.* }}}} in {_show(path)}: {what} is read on this machine, one "
                       "file for the whole step (only params.NAME may be referred to)")
    if REFERENCE.match(path):
        return path
    return os.path.join(os.path.dirname(os.path.abspath(at.file)), os.path.expanduser(path))


def _args(task: str, value: Any, at: _At, params: Tuple[Param, ...]) -> Tuple[Tuple[str, Any], ...]:
    """A step's ``args:``: the task's own flags by their dash names, checked as the task checks
    them; the few that make no sense in a step (``drain``) are refused with their reason."""
    spec = registry.get(task)
    mapping = _mapping(value, at)
    taken = [a for a in spec.args if not a.not_in_runbook]
    args = []
    for name, setting, where in _entries(mapping, at):
        arg = spec.arg(name) if isinstance(name, str) else None
        if arg is not None and arg.not_in_runbook:
            raise where.error(f"{task}'s --{name} is not a runbook step's: {arg.not_in_runbook}")
        if arg is None:
            known = [a.name for a in taken]
            listed = ", ".join(known) if known else "none"
            raise where.error(f"{task} has no argument {name!r}{_guess(str(name), known)} "
                              f"(its arguments: {listed})")
        args.append((name, _arg_value(arg, setting, where, params)))
    for arg in taken:
        if arg.required and arg.name not in mapping:
            raise at.child(arg.name, at.line).error(f"required: {arg.help}")
    return tuple(args)


def _arg_value(arg: registry.Arg, value: Any, at: _At, params: Tuple[Param, ...]) -> Any:
    if arg.repeatable and isinstance(value, _Sequence):     # the flag once per item
        return tuple(_arg_value(replace(arg, repeatable=False), item, at.item(i, line), params)
                     for i, (item, line) in enumerate(zip(value, value.item_lines)))
    if isinstance(value, (_Mapping, _Sequence)) or value is None:
        raise at.error(f"expected a value, got {_show(value)} (write a reference quoted: "
                       "\"{{ params.NAME }}\")")
    if arg.kind == "bool":
        if not isinstance(value, bool):
            raise at.error(f"expected true or false, got {_show(value)}")
        return value
    if isinstance(value, bool):
        raise at.error(f"expected a {'number' if arg.kind == 'int' else 'string'}, got "
                       f"{_show(value)}")
    if not isinstance(value, str):
        value = str(value)
    _check_references(value, at, params)
    if arg.client and any(ref.startswith("target") for ref in REFERENCE.findall(value)):
        raise at.error(f"{{{{ target.* }}}} in {_show(value)}: --{arg.name} is mldiag's own, "
                       "one value for the whole step (only params.NAME may be referred to)")
    if arg.kind == "file":      # a local file: as a run-script step's (one rule for both)
        return _local_path(value, at, params, f"--{arg.name}")
    if REFERENCE.search(value):
        return value
    if arg.kind == "int" and not value.isdigit():
        raise at.error(f"expected a whole number, got {_show(value)}")
    if arg.choices and value not in arg.choices:
        raise at.error(f"{value!r} is not one of {', '.join(arg.choices)}")
    return value


def _check_references(text: str, at: _At, params: Tuple[Param, ...]) -> None:
    if "{{" in REFERENCE.sub("", text) or "}}" in REFERENCE.sub("", text):
        raise at.error(f"unbalanced {{{{ }}}} in {_show(text)}")
    declared = [p.name for p in params]
    for ref in REFERENCE.findall(text):
        scope, _, rest = ref.partition(".")
        if scope == "params":
            if rest not in declared:
                listed = ", ".join(declared) if declared else "none are declared under params:"
                raise at.error(f"{{{{ {ref} }}}}: no parameter {rest!r}{_guess(rest, declared)} "
                               f"(parameters: {listed})")
        elif not (scope == "target" and (rest in TARGET_FIELDS or (
                rest.startswith("models.") and NAME.fullmatch(rest[len("models."):])))):
            raise at.error(f"{{{{ {ref} }}}}: unknown reference (expected params.NAME, "
                           "target.name, target.model, target.models.NAME or target.gpus)")


def _when(value: Any, at: _At, earlier: List[Step]) -> Tuple[Condition, ...]:
    items = ([(v, at.item(i, line)) for i, (v, line) in enumerate(zip(value, value.item_lines))]
             if isinstance(value, _Sequence) else [(value, at)])
    conditions = []
    for item, where in items:
        text = _string(item, where, "STEP.STATUS, e.g. gpu-status.fail")
        step, _, status = text.rpartition(".")
        if not step or status not in CONDITION_STATUSES:
            raise where.error(f"{text!r}: expected STEP.STATUS with STATUS one of "
                              f"{', '.join(CONDITION_STATUSES)} (the step's status on the target "
                              "is at least that)")
        ids = [s.id for s in earlier]
        if step not in ids:
            listed = ", ".join(ids) if ids else "none: this is the first step"
            raise where.error(f"{text!r}: {step!r} is not an earlier step{_guess(step, ids)} "
                              f"(earlier steps: {listed})")
        conditions.append(Condition(step, status))
    return tuple(conditions)


def _status(value: Any, at: _At) -> str:
    if value not in CONDITION_STATUSES:
        raise at.error(f"expected one of {', '.join(CONDITION_STATUSES)} (stop this target's "
                       f"run when the step's status is at least that), got {_show(value)}")
    return value


def _timeout(value: Any, at: _At) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise at.error(f"expected a positive number of seconds, got {_show(value)}")
    return float(value)
