"""A team's own diagnostics: ``DIR/NAME.py`` files read into registry specs without running them.

The file contract (docs/extending.md says it for users; the built-in scripts follow it too):

- ``DIR/NAME.py`` is the task ``NAME`` with ``_`` → ``-`` (``disk_free.py`` → ``disk-free``);
  a file whose name starts with ``_`` is a helper, not a task; other files are not read;
- the module's docstring: its first line is the task's summary (``mldiag --list``);
- ``build_parser()`` (optional) returns an ``argparse.ArgumentParser``; each
  ``add_argument("--long-name", ...)`` is the task's flag and the runbook step's arg
  (``--min-free-gb`` → ``--min-free-gb`` / ``min-free-gb:``): ``action="store_true"`` a flag
  without value, ``action="append"`` a repeatable one (a list in a runbook), ``type=int`` a
  whole number, ``choices``, ``required``, ``metavar`` and ``help`` as argparse has them;
- optional module constants: ``TIMEOUT`` (seconds the diagnostic may run on a target, unless
  ``--timeout`` says otherwise), ``COMPANIONS`` (names of files beside it in DIR, shipped
  with it: its helpers and data) and ``GROUP_SIZE`` (the diagnostic runs on groups of that many
  targets at once, 0: all the selected targets one group, engine/groups.py: each member's run
  gets ``--node-rank R --nodes N --master ADDR:PORT``, which its ``build_parser()`` must take;
  those three are the engine's, not the task's flags).

Everything here is read with ``ast`` (the client never imports or runs a team's file: that
happens on the target), so only what is written literally counts: strings, numbers, tuples and
lists of them, ``"..." % CONSTANT``, ``+`` between strings and names bound to such values at
the top of the module. A help text written otherwise is left out (the flag still works); an
option's name, action, type or choices written otherwise is refused, naming the file and line,
as is a positional argument (a flag is what a runbook step can name).
"""

import ast
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import registry
from ..inventory import topology
from ..core.literals import NotLiteral, literal, module_constants
from ..core.errors import InputError
from .registry import Arg, DiagnosticSpec

MAX_FILE_BYTES = 2**20          # a diagnostic's source; larger is refused, not read
ENTRY_POINT_GROUP = "mldiag.diagnostics"   # a pip-installed collection: its package's directory
BOOL_ACTIONS = ("store_true", "store_false")
KNOWN_ACTIONS = BOOL_ACTIONS + ("store", "append")


@dataclass(frozen=True)
class Problem:
    """A team file that is not a diagnostic mldiag can run: said by ``--list`` and by running
    it (exit 4); every other task still runs."""
    task: str
    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}" if self.line else \
            f"{self.file}: {self.message}"


class _Refused(Exception):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line, self.message = line, message


def discover(base: registry.Registry, hosts_file: Optional[str] = None, dirs: Sequence[str] = (),
             entry_points: bool = True) -> registry.Registry:
    """``base`` (the built-ins: ``diagnostics.builtin.BUILTIN``) and a team's diagnostics: the
    hosts file's ``diagnostics:`` directories,
    then ``dirs`` (``--diagnostics-dir``), then the packages installed under the entry-point
    group ``mldiag.diagnostics``. A file named like one of mldiag's tasks, or like a diagnostic
    found before it, is refused (a problem naming both), never runs in its place. A hosts file
    that cannot be read adds nothing here: the task that reads it says what is wrong."""
    sources: List[Tuple[str, str]] = []
    try:
        sources += [(d, f"{file}:{line}") for d, file, line in topology.load(hosts_file).diagnostic_dirs]
    except InputError:
        pass
    sources += [(os.path.abspath(os.path.expanduser(d)), "--diagnostics-dir") for d in dirs]
    problems: List[Problem] = []
    if entry_points:
        sources += _entry_point_dirs(problems)
    specs = dict(base.specs)
    found_in: Dict[str, str] = {}
    seen = set()
    for directory, source in sources:
        if os.path.realpath(directory) in seen:
            continue
        seen.add(os.path.realpath(directory))
        found, refused = scan(directory, source)
        problems += refused
        for spec in found:
            path = os.path.join(spec.directory, spec.script_name)
            if spec.name in base.specs or spec.name in registry.OTHER_TASKS:
                problems.append(Problem("", path, 0, f"named like mldiag's own task "
                                                     f"{spec.name!r}, which it would shadow: "
                                                     "rename the file"))
            elif spec.name in found_in:
                problems.append(Problem(spec.name, path, 0, f"{spec.name!r} is also "
                                                            f"{found_in[spec.name]}: rename one"))
                specs.pop(spec.name, None)
            else:
                specs[spec.name] = spec
                found_in[spec.name] = path
    return registry.Registry(specs, tuple(problems))


def _entry_point_dirs(problems: List["Problem"]) -> List[Tuple[str, str]]:
    """The directory of each package named in the entry-point group (found, never imported:
    ``find_spec`` of a top-level package runs none of its code)."""
    import importlib.util
    from importlib import metadata
    if sys.version_info >= (3, 10):
        points = metadata.entry_points(group=ENTRY_POINT_GROUP)
    else:   # pragma: no cover - Python 3.9
        points = metadata.entry_points().get(ENTRY_POINT_GROUP, [])
    dirs = []
    for point in sorted(points, key=lambda p: p.name):
        module = point.value.split(":", 1)[0].strip()
        where = f"entry point {point.name} = {point.value} ({ENTRY_POINT_GROUP})"
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            found, why = None, str(exc)
        else:
            why = "no such module"
        if found is None or not (found.submodule_search_locations or found.origin):
            problems.append(Problem("", where, 0, f"{module}: {why}"))
            continue
        locations = list(found.submodule_search_locations or [])
        dirs.append((locations[0] if locations else os.path.dirname(found.origin), where))
    return dirs


def task_name(file_name: str) -> Optional[str]:
    """``disk_free.py`` → ``disk-free``; None for a helper (``_x.py``) or a non-Python file."""
    stem, ext = os.path.splitext(file_name)
    if ext != ".py" or not stem or stem.startswith("_") or not stem.isidentifier():
        return None
    return stem.replace("_", "-")


def scan(directory: str, source: str) -> Tuple[List[DiagnosticSpec], List[Problem]]:
    """The diagnostics in ``directory`` (sorted by file name), and the files refused. A directory
    that is missing or unreadable is one problem; ``source`` names who asked for it (a hosts
    file's line, ``--diagnostics-dir``, an entry point)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        return [], [Problem("", directory, 0, f"diagnostics directory ({source}): "
                                              f"{exc.strerror or exc}")]
    specs, problems = [], []
    for file_name in names:
        name = task_name(file_name)
        path = os.path.join(directory, file_name)
        if name is None or not os.path.isfile(path):
            continue
        try:
            specs.append(read(path, name))
        except _Refused as exc:
            problems.append(Problem(name, path, exc.line, exc.message))
    return specs, problems


def read(path: str, name: str) -> DiagnosticSpec:
    """The spec of the team diagnostic in ``path``; ``_Refused`` (with its line) when the file
    cannot be one."""
    try:
        with open(path, "rb") as f:
            source = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise _Refused(0, f"not readable: {exc.strerror or exc}")
    if len(source) > MAX_FILE_BYTES:
        raise _Refused(0, f"larger than {MAX_FILE_BYTES} bytes: not a diagnostic script")
    try:
        module = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise _Refused(exc.lineno or 0, f"syntax error: {exc.msg}")
    except ValueError as exc:       # a NUL byte in the source
        raise _Refused(0, f"not Python source: {exc}")
    constants = module_constants(module)
    if not any(isinstance(node, ast.FunctionDef) and node.name == "run" for node in module.body):
        raise _Refused(1, "no run(args) function at the top of the module: a diagnostic "
                          "returns its result from run(args) -> dict")
    doc = ast.get_docstring(module) or ""
    summary = doc.strip().splitlines()[0].strip() if doc.strip() else f"(a team diagnostic: {name})"
    timeout = _timeout(module, constants)
    args = _args(module, constants)
    size = _group_size(module, constants, args)
    if size is not None:     # the place in the group is the engine's to give
        args = tuple(a for a in args if a.name not in registry.RENDEZVOUS_FLAGS)
    return DiagnosticSpec(
        name=name, summary=summary, args=args, script=os.path.basename(path),
        companions=_companions(module, constants, os.path.dirname(path)),
        directory=os.path.dirname(path), builtin=False, timeout=timeout,
        fan_out=_each_alone if size is None else _GroupsOf(size))


def _each_alone(values: Any) -> None:
    return None


@dataclass(frozen=True)
class _GroupsOf:
    """A team diagnostic's fan_out hook: its targets in groups of ``size`` (engine/groups.py)."""
    size: int

    def __call__(self, values: Any):
        from . import groups      # here: reading a team's files imports no runner
        return groups.in_groups(self.size)


def _group_size(module: ast.Module, constants: Dict[str, Any], args: Sequence[Arg]) -> Optional[int]:
    line = _assigned_line(module, "GROUP_SIZE")
    if line is None:
        return None
    value = constants.get("GROUP_SIZE")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value == 1 or value > 100000:
        raise _Refused(line, "GROUP_SIZE: expected the number of targets in a group (2 or more; 0: all "
                             "the selected targets), written literally")
    missing = [f"--{flag}" for flag in registry.RENDEZVOUS_FLAGS if all(a.name != flag for a in args)]
    if missing:
        raise _Refused(line, f"GROUP_SIZE: build_parser() must take {', '.join(missing)} (each member "
                             "is told its place in the group with --node-rank R --nodes N --master ADDR:PORT)")
    return value


def _timeout(module: ast.Module, constants: Dict[str, Any]) -> Optional[float]:
    line = _assigned_line(module, "TIMEOUT")
    if line is None:
        return None
    value = constants.get("TIMEOUT")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise _Refused(line, "TIMEOUT: expected a positive number of seconds, written literally")
    return float(value)


def _companions(module: ast.Module, constants: Dict[str, Any], directory: str) -> Tuple[str, ...]:
    line = _assigned_line(module, "COMPANIONS")
    if line is None:
        return ()
    value = constants.get("COMPANIONS")
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise _Refused(line, "COMPANIONS: expected a list of file names, written literally")
    for companion in value:
        if not companion or companion != os.path.basename(companion) or companion in (".", ".."):
            raise _Refused(line, f"COMPANIONS: {companion!r} is not a file name in the "
                                 "diagnostic's directory")
        if not os.path.isfile(os.path.join(directory, companion)):
            raise _Refused(line, f"COMPANIONS: {companion!r}: no such file beside it")
    return value


def _assigned_line(module: ast.Module, name: str) -> Optional[int]:
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                for t in node.targets):
            return node.lineno
    return None


# ---------------------------------------------------------------------------- build_parser

def _args(module: ast.Module, constants: Dict[str, Any]) -> Tuple[Arg, ...]:
    builder = next((node for node in module.body
                    if isinstance(node, ast.FunctionDef) and node.name == "build_parser"), None)
    if builder is None:
        return ()
    calls = sorted((node for node in ast.walk(builder)
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"),
                   key=lambda node: (node.lineno, node.col_offset))   # as written
    args: List[Arg] = []
    for node in calls:
        arg = _arg(node, constants)
        if any(a.name == arg.name for a in args):
            raise _Refused(node.lineno, f"--{arg.name} is added twice")
        args.append(arg)
    return tuple(args)


def _arg(call: ast.Call, constants: Dict[str, Any]) -> Arg:
    line = call.lineno
    try:
        options = [literal(a, constants) for a in call.args]
    except NotLiteral:
        raise _Refused(line, "add_argument: write the option names literally (\"--name\")")
    if not all(isinstance(o, str) for o in options) or not options:
        raise _Refused(line, "add_argument: expected option names (\"--name\")")
    long_names = [o for o in options if o.startswith("--") and len(o) > 2]
    if not long_names:
        if any(o.startswith("-") for o in options):
            raise _Refused(line, f"{options[0]}: give it a long name too (--name): a task's flag "
                                 "and a runbook step's arg are long names")
        raise _Refused(line, f"{options[0]!r}: a positional argument: mldiag passes flags "
                             "(--name); use add_argument(\"--name\", required=True)")
    name = long_names[0][2:]
    if name == "help" or not all(c.isalnum() or c == "-" for c in name):
        raise _Refused(line, f"--{name}: not a flag mldiag can pass (letters, digits and "
                             "dashes: --min-free-gb)")
    if name in registry.COMMON_FLAGS:
        raise _Refused(line, f"--{name}: a common flag of every task (mldiag's own): name "
                             "the diagnostic's otherwise")
    keywords = {}
    for keyword in call.keywords:
        if keyword.arg is None:
            raise _Refused(line, f"--{name}: write add_argument's keywords out (no **)")
        keywords[keyword.arg] = keyword.value

    def value(key: str, default: Any = None, required_literal: bool = True) -> Any:
        if key not in keywords:
            return default
        try:
            return literal(keywords[key], constants)
        except NotLiteral:
            if required_literal:
                raise _Refused(line, f"--{name}: write {key}= literally")
            return default

    action = value("action", "store")
    if action not in KNOWN_ACTIONS:
        raise _Refused(line, f"--{name}: action={action!r} is not one mldiag can pass "
                             f"({', '.join(KNOWN_ACTIONS)})")
    kind = "bool" if action in BOOL_ACTIONS else "text"
    type_node = keywords.get("type")
    if type_node is not None and kind != "bool":
        type_name = type_node.id if isinstance(type_node, ast.Name) else None
        kind = "int" if type_name == "int" else "text"     # float, a function: the target parses
    choices = value("choices", ())
    if not isinstance(choices, tuple) or not all(isinstance(c, (str, int)) for c in choices):
        raise _Refused(line, f"--{name}: choices= must be a literal list of strings or numbers")
    help_text = value("help", "", required_literal=False)
    metavar = value("metavar", "", required_literal=False)
    required = value("required", False, required_literal=False) is True
    return Arg(name=name, help=help_text if isinstance(help_text, str) else "",
               flag=long_names[0], kind=kind, choices=tuple(str(c) for c in choices),
               required=required, metavar=metavar if isinstance(metavar, str) else "",
               repeatable=action == "append")
