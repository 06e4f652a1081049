"""hosts.yaml → frozen dataclasses (DESIGN.md §2).

CONTRACT (other modules rely on these types):

    load(path: Optional[str]) -> Topology
        path None  → $MLDIAG_HOSTS_FILE, else ./hosts.yaml; when that default file does not
                     exist, a Topology holding only the embedded ``local`` target.
        explicit path that does not exist / is a directory → InputError (exit 4).
    loads(text: str, path: str = "hosts.yaml") -> Topology     (same, from a string)
    Topology.select(hosts: Sequence[str], groups: Sequence[str]) -> List[Target]
    expand_selector("gpu[01-04],b200") -> names;  expand_nodeset(text) -> names;
    fold_names(names) -> "b200,gpu[01-04]"    (ClusterShell node sets, ValueError when malformed)

Every validation error is an ``errors.InputError`` whose message reads
``FILE:LINE: dotted.key: what was expected``.

Choices where DESIGN.md is silent:
- Keys starting with ``x-`` are metadata at every mapping level, so no host, container,
  group, model or env name can start with ``x-``.
- An empty entry (``bastion:`` or ``bastion: {}``) is an ssh_config alias; an empty
  ``hosts:``/``groups:``/``defaults:`` section is the same as leaving it out.
- Plain YAML 1.1, except that ``00:10:00`` is the string it looks like (YAML 1.2), not the
  base-60 number 600; numbers given for an id or an env value keep their spelling (``010``).
- defaults' connection keys and ``become`` apply to SSH hosts only; a ``local: true`` host
  and the embedded ``local`` take python/timeout/env/activate from defaults.
- ``become: true`` means sudo and ``become: false`` turns an inherited sudo off.
"""

import contextvars
import difflib
import math
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from . import nodeset
from .errors import InputError

RUNTIMES = ("pct", "docker", "podman", "lxc", "kubectl")
HOST_KEY_POLICIES = ("strict", "accept-new")
BECOME_METHODS = ("sudo",)

# Tokens that may appear on a remote command line (DESIGN.md §3 invariant 1): nothing any
# login shell (sh, bash, zsh, fish, csh) treats specially, and no leading '=' or '~' (zsh
# expands `=ls` and `~user` even unquoted by shlex) — neither character is in the alphabet.
SAFE_TOKEN = re.compile(r"[A-Za-z0-9_@%+,./:-]+")


def is_safe_token(token: str) -> bool:
    return bool(SAFE_TOKEN.fullmatch(token))


# Target, group and model names. They become --save file names and -H values: no '/',
# no leading '.' or '-'; ':' is reserved for Slurm node rows (`cluster-a:n3`).
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
NAME_ALPHABET = "[A-Za-z0-9._-]"
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SLURM_TIME = re.compile(r"(?:\d+-)?\d+(?::\d+){0,2}|UNLIMITED|INFINITE|unlimited|infinite")
METADATA_PREFIX = "x-"
DEFAULT_HOSTS_FILE = "hosts.yaml"
HOSTS_FILE_ENV = "MLDIAG_HOSTS_FILE"
# Node-set bounds (see nodeset.py): names per node set / selection / group / file's targets.
MAX_NODES = nodeset.MAX_NODES
# 1 MiB holds ~25,000 one-line hosts and parses in ~4 s; a larger file is a mistake
# (a log or a dump named by accident), refused before it is parsed.
MAX_FILE_BYTES = 2**20


@dataclass(frozen=True)
class SshHost:
    """A machine reached over SSH. ``address`` None means: an ssh_config alias named ``name``."""
    name: str
    address: Optional[str] = None
    port: Optional[int] = None
    user: Optional[str] = None
    identity_file: Optional[str] = None
    connect_timeout: float = 10.0
    host_key_policy: Optional[str] = None   # None: as ssh_config's StrictHostKeyChecking says
    jump: Optional["SshHost"] = None        # ProxyJump through this host (itself maybe jumped)


@dataclass(frozen=True)
class Container:
    runtime: str                  # one of RUNTIMES
    id: str                       # VMID, container name/id, or pod name
    namespace: Optional[str] = None   # kubectl only
    container: Optional[str] = None   # kubectl only (-c)
    exec_user: Optional[str] = None


@dataclass(frozen=True)
class Slurm:
    partition: Optional[str] = None
    nodes: int = 1
    gpus_per_node: Optional[int] = None
    time: Optional[str] = None
    account: Optional[str] = None
    nodelist: Optional[str] = None


@dataclass(frozen=True)
class Target:
    """One thing a diagnostic runs on: a host, or a container on a host."""
    name: str
    local: bool = False
    host: Optional[SshHost] = None          # None when local
    become: Optional[str] = None            # "sudo" or None
    container: Optional[Container] = None
    python: str = "python3"
    activate: Tuple[str, ...] = ()          # e.g. ("/opt/conda/etc/profile.d/conda.sh", "conda", "activate", "train")
    env: Tuple[Tuple[str, str], ...] = ()   # merged defaults → host → container
    timeout: float = 300.0
    models: Tuple[Tuple[str, str], ...] = ()  # (name, path); the first is the default
    gpus: Optional[int] = None
    slurm: Optional[Slurm] = None
    tmpdir: Optional[str] = None            # where the private temp dir is made (default: $TMPDIR, /tmp, ...)
    source: Tuple[str, int] = ("<embedded>", 0)   # file, line where the target is defined
    # Set by the runner on a Slurm node row (``cluster-a:n3``): (allocation job id, node name).
    slurm_step: Optional[Tuple[str, str]] = None

    @property
    def env_dict(self) -> Dict[str, str]:
        return dict(self.env)

    @property
    def default_model(self) -> Optional[str]:
        return self.models[0][1] if self.models else None


LOCAL_TARGET = Target(name="local", local=True)


@dataclass(frozen=True)
class Topology:
    path: Optional[str]                          # None when nothing was read (embedded local only)
    targets: Dict[str, Target] = field(default_factory=dict)   # in file order
    groups: Dict[str, Tuple[str, ...]] = field(default_factory=dict)  # expanded target names
    default_targets: Tuple[str, ...] = ("local",)
    # runbooks: directories (absolute), each with the file and line that named it
    runbook_dirs: Tuple[Tuple[str, str, int], ...] = ()

    def select(self, hosts: Sequence[str] = (), groups: Sequence[str] = ()) -> List[Target]:
        """Targets named by --host values (names, comma lists, node sets) then --group names,
        de-duplicated in order; neither given → ``default_targets``."""
        if not hosts and not groups:
            names = list(self.default_targets)
        else:
            budget = nodeset.Budget(MAX_NODES, "the --host values")
            names = [n for value in hosts for n in self._named_targets(value, budget)]
            names += [n for group in groups for n in self._group_members(group)]
        return [self.targets.get(name) or self._slurm_row(name) for name in _unique(names)]

    def _named_targets(self, value: str, budget: nodeset.Budget) -> List[str]:
        try:
            names = expand_selector(value, budget)
        except ValueError as exc:
            raise InputError(str(exc), key="--host") from None
        for name in names:
            if name not in self.targets and not self._slurm_row(name):
                raise InputError(f"unknown target {name!r}{_hint(name, self.targets)}")
        return names

    def _slurm_row(self, name: str) -> Optional[Target]:
        """``cluster-a:n3`` (or ``cluster-a:n[1-2]``): the Slurm login target restricted to
        those nodes; None when ``name`` is not of that form."""
        base, sep, nodes = name.partition(":")
        target = self.targets.get(base)
        if not sep or target is None or target.slurm is None or not nodes:
            return None
        try:
            expanded = nodeset.expand(nodes)
        except ValueError as exc:
            raise InputError(f"{name}: {exc}", key="--host") from None
        for node in expanded:
            if not NAME.fullmatch(node):
                raise InputError(f"{name}: node name {node!r} is not a plain name", key="--host")
        slurm = replace(target.slurm, nodes=len(expanded), nodelist=",".join(expanded))
        return replace(target, name=name, slurm=slurm)

    def _group_members(self, group: str) -> Tuple[str, ...]:
        if group not in self.groups:
            if not self.groups:
                raise InputError(f"unknown group {group!r} (no groups are defined"
                                 f"{' in ' + self.path if self.path else ''})")
            raise InputError(f"unknown group {group!r}{_hint(group, self.groups)}")
        return self.groups[group]


def load(path: Optional[str] = None) -> Topology:
    if not path:
        path = os.environ.get(HOSTS_FILE_ENV)
        if not path:
            if not os.path.lexists(DEFAULT_HOSTS_FILE):
                return Topology(path=None, targets={"local": LOCAL_TARGET})
            path = DEFAULT_HOSTS_FILE
    return loads(_read_text(path), path)


def loads(text: str, path: str = "hosts.yaml") -> Topology:
    document = _parse_yaml(text, path)
    token = _file_budget.set(nodeset.Budget(nodeset.MAX_FILE_NAMES, "one hosts file"))
    try:
        return _build(document, path)
    finally:
        _file_budget.reset(token)


# The names the hosts.yaml being read may still expand to (every node set and group reference
# of one file counts against one budget; a validator cannot be handed it as an argument).
_file_budget: "contextvars.ContextVar[Optional[nodeset.Budget]]" = contextvars.ContextVar(
    "mldiag_hosts_file_budget", default=None)


# ---------------------------------------------------------------------------- names and node sets

def expand_selector(text: str, budget: Optional[nodeset.Budget] = None) -> List[str]:
    """``"gpu[01-04],b200"`` → names in the order written (each node set in ClusterShell's
    order). Names with ':' (Slurm node rows) are kept as they are. ValueError when malformed,
    when the whole selection could name more than ``MAX_NODES`` (counted before anything is
    expanded), or past ``budget`` (the names still allowed to the input being read)."""
    parts = [part.strip() for part in nodeset.split_top_level(text, ",")]
    if not all(parts):
        raise ValueError(f"empty name in {_excerpt(text)}")
    plain = [":" in part or bool(NAME.fullmatch(part)) for part in parts]
    bound = sum(1 if is_plain else nodeset.size_bound(part) for part, is_plain in zip(parts, plain))
    if bound > MAX_NODES:
        raise nodeset.TooManyNodes(f"{_excerpt(text)} names up to {bound} targets "
                                   f"(at most {MAX_NODES})")
    if budget is not None:
        budget.spend(bound)
    names = []
    for part, is_plain in zip(parts, plain):
        names.extend([part] if is_plain else nodeset.expand(part))
    return names


def expand_nodeset(text: str, budget: Optional[nodeset.Budget] = None) -> List[str]:
    """ClusterShell's expansion of ``text`` (no @group lookups), bounded (``nodeset``), counted
    against ``budget`` or, while a hosts.yaml is read, that file's; ValueError when malformed."""
    budget = budget or _file_budget.get()
    return budget.expand(text) if budget is not None else nodeset.expand(text)


def fold_names(names: Sequence[str]) -> str:
    """``gpu01, gpu02, b200`` → ``b200,gpu[01-02]`` (ClusterShell folding)."""
    return nodeset.fold(names)


def _excerpt(text: str, width: int = 80) -> str:
    return repr(text if len(text) <= width else text[:width] + "...")


def _unique(names: Sequence[str]) -> List[str]:
    return list(dict.fromkeys(names))


def _hint(name: str, known: Sequence[str]) -> str:
    """`` (did you mean 'trainbox'? known: b200,gpu[01-16],local)``, the list folded and cut."""
    close = difflib.get_close_matches(name, list(known), n=1)
    folded = fold_names(list(known))
    if len(folded) > 200:
        folded = folded[:200].rsplit(",", 1)[0] + ",..."
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f" ({guess}known: {folded})"


# ---------------------------------------------------------------------------- reading YAML

class _Mapping(dict):
    """A YAML mapping that remembers its line, each key's line, and how each plain scalar
    value was written (so ``id: 0200`` stays "0200")."""
    line = 1

    def __init__(self) -> None:
        super().__init__()
        self.key_lines: Dict[Any, int] = {}
        self.written: Dict[Any, str] = {}


class _Sequence(list):
    line = 1

    def __init__(self) -> None:
        super().__init__()
        self.item_lines: List[int] = []


_YAML = "tag:yaml.org,2002:"
# SafeLoader's int and float patterns without the YAML 1.1 base-60 forms (00:10:00 → 600).
_YAML12_NUMBERS = {
    _YAML + "int": re.compile(r"""^(?:[-+]?0b[0-1_]+
        |[-+]?0[0-7_]+
        |[-+]?(?:0|[1-9][0-9_]*)
        |[-+]?0x[0-9a-fA-F_]+)$""", re.X),
    _YAML + "float": re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
        |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""", re.X),
}

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """safe_load semantics; mappings and sequences come back as _Mapping / _Sequence."""

    yaml_implicit_resolvers = {
        first: [(tag, _YAML12_NUMBERS.get(tag, pattern)) for tag, pattern in resolvers]
        for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
    }

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception as exc:  # `!!int abc` raises ValueError, `!!bool x` KeyError, ...
            written = f"{node.value!r}" if isinstance(node, ScalarNode) else "this value"
            raise ConstructorError(None, None, f"{written} is not a valid {node.tag}",
                                   node.start_mark) from None

    def construct_line_mapping(self, node):
        mapping = _Mapping()
        mapping.line = node.start_mark.line + 1
        yield mapping
        self.flatten_mapping(node)
        for key_node, value_node in node.value:
            key = self.construct_object(key_node)
            try:
                hash(key)
            except TypeError:
                raise ConstructorError("while constructing a mapping", node.start_mark,
                                       "found unhashable key", key_node.start_mark) from None
            mapping[key] = self.construct_object(value_node)
            mapping.key_lines[key] = key_node.start_mark.line + 1
            if isinstance(value_node, ScalarNode):
                mapping.written[key] = value_node.value

    def flatten_mapping(self, node):
        """Resolve ``<<`` merge keys into ``node.value``: own keys win, then the earlier of
        the merged mappings (YAML merge spec; PyYAML versions disagree on the order)."""
        sources, own = [], []
        for key_node, value_node in node.value:
            if key_node.tag != _YAML + "merge":
                own.append((key_node, value_node))
                continue
            for source in (value_node.value if isinstance(value_node, SequenceNode)
                           else [value_node]):
                if not isinstance(source, MappingNode):
                    raise ConstructorError("while constructing a mapping", node.start_mark,
                                           "expected a mapping or list of mappings for merging, "
                                           f"but found {source.id}", source.start_mark)
                self.flatten_mapping(source)
                sources.append(source.value)
        node.value = [pair for pairs in reversed(sources) for pair in pairs] + own

    def construct_line_sequence(self, node):
        sequence = _Sequence()
        sequence.line = node.start_mark.line + 1
        yield sequence
        for item_node in node.value:
            sequence.append(self.construct_object(item_node))
            sequence.item_lines.append(item_node.start_mark.line + 1)

    def construct_unknown_tag(self, node):
        raise ConstructorError(None, None, f"tag {node.tag!r} is not allowed (plain YAML only)",
                               node.start_mark)


_Loader.add_constructor(_YAML + "map", _Loader.construct_line_mapping)
_Loader.add_constructor(_YAML + "seq", _Loader.construct_line_sequence)
_Loader.add_constructor(_YAML + "value", _Loader.construct_yaml_str)   # a bare `=` is text
_Loader.add_constructor(None, _Loader.construct_unknown_tag)


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        named_by = os.environ.get(HOSTS_FILE_ENV) == path
        raise InputError("hosts file not found" + (f" (named by ${HOSTS_FILE_ENV})" if named_by
                                                    else ""), file=path) from None
    except IsADirectoryError:
        raise InputError("is a directory, expected a hosts.yaml file", file=path) from None
    except OSError as exc:
        raise InputError(f"cannot read the hosts file: {exc.strerror or exc}", file=path) from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"larger than {MAX_FILE_BYTES // 2**20} MiB, the most a hosts file may be "
                         "(write node ranges such as gpu[001-512] rather than one entry per node)",
                         file=path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"not UTF-8 text (byte 0x{data[exc.start]:02x})", file=path,
                         line=line) from None


def _parse_yaml(text: str, path: str,
                empty: str = "empty hosts file (expected a mapping with hosts:)") -> Any:
    """The document as _Mapping/_Sequence/scalars; every YAML problem as an InputError."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        line = text.count("\n", 0, exc.start) + 1
        raise InputError(f"invalid YAML: {exc.reason}", file=path, line=line) from None
    loader = None
    try:
        loader = _Loader(data)
        node = loader.get_single_node()
        if node is None:
            raise InputError(empty, file=path, line=1)
        _check_keys(node, path)
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, path) from None
    except yaml.reader.ReaderError as exc:
        character = f" (character #x{exc.character:04x})" if isinstance(exc.character, int) else ""
        raise InputError(f"invalid YAML: {exc.reason}{character}", file=path,
                         line=data.count(b"\n", 0, exc.position) + 1) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", file=path) from None
    except RecursionError:
        raise InputError("invalid YAML: nested too deeply", file=path) from None
    finally:
        if loader is not None:
            loader.dispose()


def _yaml_error(exc: "yaml.MarkedYAMLError", path: str) -> InputError:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else None
    message = exc.problem or exc.context or "malformed document"
    if exc.problem and exc.context:
        if not exc.context.startswith("while"):      # "expected a single document ..."
            message = f"{exc.context}, {exc.problem}"
        elif exc.context_mark is not None and exc.context_mark.line + 1 != line:
            message += f" ({exc.context} at line {exc.context_mark.line + 1})"
    return InputError(f"invalid YAML: {message}", file=path, line=line)


def _check_keys(root, path: str) -> None:
    """Refuse duplicate keys (PyYAML keeps the last silently; merged keys are overrides, not
    duplicates) and drop ``x-*`` entries, which are never read, so are never constructed."""
    seen = set()
    pending = [(root, "")]
    while pending:
        node, where = pending.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, SequenceNode):
            pending.extend((item, f"{where}[{i}]") for i, item in enumerate(node.value))
        elif isinstance(node, MappingNode):
            first_line: Dict[Tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == _YAML + "merge":
                    pending.append((value_node, where))
                    continue
                key = key_node.value if isinstance(key_node, ScalarNode) else "<complex key>"
                key_path = f"{where}.{key}" if where else key
                line = key_node.start_mark.line + 1
                if isinstance(key_node, ScalarNode):
                    identity = (key_node.tag, key_node.value)
                    if identity in first_line:
                        raise InputError(f"duplicate key (first at line {first_line[identity]})",
                                         file=path, line=line, key=key_path)
                    first_line[identity] = line
                    if _is_metadata_key(key_node):
                        continue
                pending.append((value_node, key_path))
            node.value = [(k, v) for k, v in node.value if not _is_metadata_key(k)]


def _is_metadata_key(key_node) -> bool:
    return (key_node.tag == _YAML + "str" and isinstance(key_node.value, str)
            and key_node.value.startswith(METADATA_PREFIX))


# ---------------------------------------------------------------------------- checking values

@dataclass(frozen=True)
class _At:
    """Where a value is: file, line and dotted key, for error messages."""
    file: str
    line: int
    key: str = ""

    def child(self, key: Any, line: int) -> "_At":
        return _At(self.file, line, f"{self.key}.{key}" if self.key else str(key))

    def item(self, index: int, line: int) -> "_At":
        return _At(self.file, line, f"{self.key}[{index}]")

    def error(self, message: str) -> InputError:
        return InputError(message, file=self.file, line=self.line, key=self.key or None)


def _show(value: Any) -> str:
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 80 else text[:76] + "..."


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _entries(mapping: _Mapping, at: _At) -> Iterator[Tuple[Any, Any, _At]]:
    """(key, value, where) of a mapping, metadata keys (``x-*``) left out."""
    for key, value in mapping.items():
        if isinstance(key, str) and key.startswith(METADATA_PREFIX):
            continue
        yield key, value, at.child(key, mapping.key_lines.get(key, mapping.line))


def _mapping(value: Any, at: _At) -> _Mapping:
    """A mapping; an empty value counts as an empty mapping."""
    if value is None:
        empty = _Mapping()
        empty.line = at.line
        return empty
    if not isinstance(value, _Mapping):
        raise at.error(f"expected a mapping, got {_show(value)}")
    return value


def _string(value: Any, at: _At, what: str = "a string") -> str:
    if not isinstance(value, str) or not value:
        raise at.error(f"expected {what}, got {_show(value)}")
    return value


def _shell_token(value: Any, at: _At) -> str:
    token = _string(value, at)
    if not is_safe_token(token):
        raise at.error(f"{_show(token)} contains characters outside [A-Za-z0-9_@%+,./:-] "
                       "(shell metacharacters are not allowed here)")
    return token


def _argument(value: Any, at: _At) -> str:
    """A token that lands on a command line as an argument: safe, and not read as an option."""
    token = _shell_token(value, at)
    if token.startswith("-"):
        raise at.error(f"{_show(token)} must not start with '-' (it would be read as an option)")
    return token


def _name(value: Any, at: _At) -> str:
    name = _string(value, at, "a name")
    if not NAME.fullmatch(name):
        raise at.error(f"{_show(name)} is not a valid name: use only {NAME_ALPHABET}, not starting "
                       "with '.' or '-' (':' is reserved for Slurm node rows like cluster-a:n3)")
    return name


def _address(value: Any, at: _At) -> str:
    address = _argument(value, at)
    if "@" in address:
        raise at.error(f"{_show(address)}: give the user as user:, not in the address")
    return address


def _integer(value: Any, at: _At, minimum: int, maximum: Optional[int] = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise at.error(f"expected an integer, got {_show(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
        raise at.error(f"expected an integer {bounds}, got {value}")
    return value


def _port(value: Any, at: _At) -> int:
    return _integer(value, at, 1, 65535)


def _count(value: Any, at: _At) -> int:
    return _integer(value, at, 0)


def _positive_count(value: Any, at: _At) -> int:
    return _integer(value, at, 1)


def _seconds(value: Any, at: _At) -> float:
    seconds = math.nan
    if _is_number(value):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    if not (math.isfinite(seconds) and seconds > 0):
        raise at.error(f"expected a positive number of seconds, got {_show(value)}")
    return seconds


def _boolean(value: Any, at: _At) -> bool:
    if not isinstance(value, bool):
        raise at.error(f"expected true or false, got {_show(value)}")
    return value


def _choice(options: Sequence[str]) -> Callable[[Any, _At], str]:
    def check(value: Any, at: _At) -> str:
        if isinstance(value, str) and value in options:
            return value
        if isinstance(value, str):
            raise at.error(f"{value!r} is not one of {', '.join(options)}")
        raise at.error(f"expected one of {', '.join(options)}, got {_show(value)}")
    return check


def _become(value: Any, at: _At) -> Optional[str]:
    if isinstance(value, bool):
        return BECOME_METHODS[0] if value else None
    return _choice(BECOME_METHODS)(value, at)


def _identity_file(value: Any, at: _At) -> str:
    # A local path read by the client, never put on a remote command line: '~' is fine.
    path = _string(value, at, "a file path")
    if "\0" in path or "\n" in path:
        raise at.error(f"{_show(path)} is not a file path")
    return path


def _directory(value: Any, at: _At) -> str:
    """An absolute directory on the target (travels in the bundle's header, never on a command line)."""
    path = _shell_token(value, at)
    if not path.startswith("/"):
        raise at.error(f"expected an absolute path, got {_show(path)}")
    return path


def _activate(value: Any, at: _At) -> Tuple[str, ...]:
    if not isinstance(value, str):
        raise at.error(f"expected a string of words, got {_show(value)}")
    words = tuple(value.split())   # "" turns an inherited activate off
    for word in words:
        if not is_safe_token(word):
            raise at.error(f"word {_show(word)} contains characters outside [A-Za-z0-9_@%+,./:-] "
                           "(shell metacharacters are not allowed here)")
    return words


def _env(value: Any, at: _At) -> Dict[str, str]:
    env = {}
    mapping = _mapping(value, at)
    for name, setting, where in _entries(mapping, at):
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise where.error(f"{_show(name)} is not an environment variable name "
                              "([A-Za-z_][A-Za-z0-9_]*)")
        if _is_number(setting):
            setting = mapping.written.get(name, str(setting))
        if not isinstance(setting, str):
            raise where.error(f"expected a string or a number, got {_show(setting)} "
                              "(quote it to pass it as text)")
        env[name] = setting
    return env


def _models(value: Any, at: _At) -> Tuple[Tuple[str, str], ...]:
    models = []
    for name, model_path, where in _entries(_mapping(value, at), at):
        models.append((_name(name, where), _string(model_path, where, "a model path")))
    return tuple(models)


def _slurm_time(value: Any, at: _At) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)  # minutes, as sbatch --time reads a bare number
    text = _string(value, at, 'a Slurm time such as "00:10:00"')
    if not SLURM_TIME.fullmatch(text):
        raise at.error(f'{_show(text)} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH:MM:SS)')
    return text


def _nodelist(value: Any, at: _At) -> str:
    """A node set, kept as written; brackets glob in shells, so only the expanded names
    (which are checked here) may reach a command line."""
    text = _string(value, at, "a node set")
    try:
        nodes = expand_nodeset(text)
    except ValueError as exc:
        raise at.error(str(exc)) from None
    for node in nodes:
        if not is_safe_token(node) or node.startswith("-"):
            raise at.error(f"node {_show(node)} contains characters outside [A-Za-z0-9_@%+,./:-] "
                           "(shell metacharacters are not allowed here)")
    return text


def _keep(value: Any, at: _At) -> Any:
    return value


_CHECKS: Dict[str, Callable[[Any, _At], Any]] = {
    "user": _argument, "port": _port, "python": _argument, "tmpdir": _directory, "timeout": _seconds,
    "connect_timeout": _seconds, "identity_file": _identity_file,
    "host_key_policy": _choice(HOST_KEY_POLICIES), "become": _become, "env": _env,
    "activate": _activate, "address": _string, "jump": _name, "local": _boolean,
    "models": _models, "gpus": _count, "runtime": _choice(RUNTIMES), "id": _argument,
    "namespace": _argument, "container": _argument, "exec_user": _argument,
    "partition": _argument, "nodes": _positive_count, "gpus_per_node": _count,
    "time": _slurm_time, "account": _argument, "nodelist": _nodelist,
    "defaults": _keep, "hosts": _keep, "groups": _keep, "targets": _keep,
    "containers": _keep, "slurm": _keep, "runbooks": _keep,
}
_WRITTEN_AS_TEXT = ("id",)   # a number here is a name: keep its spelling

TOP_KEYS = ("defaults", "hosts", "groups", "runbooks")
CONNECTION_KEYS = ("address", "port", "user", "jump", "identity_file", "connect_timeout",
                   "host_key_policy")
RUN_KEYS = ("python", "timeout", "env", "activate", "tmpdir")
DEFAULTS_KEYS = ("user", "port", "python", "timeout", "connect_timeout", "targets",
                 "identity_file", "host_key_policy", "become", "env", "activate", "tmpdir")
HOST_KEYS = ("local",) + CONNECTION_KEYS + ("become",) + RUN_KEYS + (
    "models", "gpus", "containers", "slurm")
CONTAINER_KEYS = ("runtime", "id", "namespace", "container", "exec_user") + RUN_KEYS + (
    "models", "gpus")
SLURM_KEYS = ("partition", "nodes", "gpus_per_node", "time", "account", "nodelist")
KUBECTL_ONLY_KEYS = ("namespace", "container")
INHERITED_KEYS = RUN_KEYS + ("models", "gpus")


@dataclass(frozen=True)
class _Fields:
    """Checked values of one mapping (defaults, a host, a container), with where each was."""
    at: _At
    values: Dict[str, Any]
    places: Dict[str, _At]


def _read_fields(value: Any, at: _At, allowed: Sequence[str]) -> _Fields:
    mapping = _mapping(value, at)
    values, places = {}, {}
    for key, setting, where in _entries(mapping, at):
        if key not in allowed:
            raise where.error(_unknown_key(key, allowed))
        if key in _WRITTEN_AS_TEXT and _is_number(setting):
            setting = mapping.written.get(key, str(setting))
        values[key] = _CHECKS[key](setting, where)
        places[key] = where
    return _Fields(at, values, places)


def _unknown_key(key: Any, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(key), list(allowed), n=1)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key (expected one of {', '.join(allowed)}, or x-* for metadata)"


# ---------------------------------------------------------------------------- hosts and containers

@dataclass(frozen=True)
class _ContainerEntry:
    name: str
    at: _At
    fields: _Fields
    container: Container


@dataclass(frozen=True)
class _HostEntry:
    """One host of ``hosts:`` after node-range expansion."""
    name: str
    address: Optional[str]
    at: _At              # the key in hosts: (shared by a range's hosts)
    fields: _Fields
    containers: Tuple[_ContainerEntry, ...]
    slurm: Optional[Slurm]

    @property
    def local(self) -> bool:
        return bool(self.fields.values.get("local"))


def _read_hosts(value: Any, at: _At) -> List[_HostEntry]:
    entries = []
    for key, spec, key_at in _entries(_mapping(value, at), at):
        names = _host_names(key, key_at)
        fields = _read_fields(spec, key_at, HOST_KEYS)
        if fields.values.get("local"):
            _check_local_host(fields, names, key_at)
        if len(names) > 1 and fields.values.get("containers"):
            raise fields.places["containers"].error(
                f"a node range ({len(names)} hosts) cannot have containers: container names "
                "are target names and must be unique")
        containers, slurm = tuple(_read_containers(fields)), _read_slurm(fields)
        if len(entries) + len(names) > MAX_NODES:
            raise key_at.error(f"more than {MAX_NODES} hosts in one hosts file")
        for name, address in zip(names, _addresses(fields, names, key)):
            entries.append(_HostEntry(name, address, key_at, fields, containers, slurm))
    return entries


def _host_names(key: Any, at: _At) -> List[str]:
    """A host key is one name or a node set of names (``gpu[01-16]``)."""
    if isinstance(key, str) and NAME.fullmatch(key):
        return [key]
    try:
        names = expand_nodeset(_string(key, at, "a host name"))
    except ValueError as exc:
        raise at.error(str(exc)) from None
    for name in names:
        _name(name, at)
    return names


def _check_local_host(fields: _Fields, names: List[str], at: _At) -> None:
    for key in CONNECTION_KEYS:
        if key in fields.values:
            raise fields.places[key].error("not allowed on a local host (local: true runs "
                                           "without SSH)")
    if len(names) > 1:
        raise at.error(f"a local host cannot be a node range ({len(names)} hosts)")


def _addresses(fields: _Fields, names: List[str], key: Any) -> List[Optional[str]]:
    """One address per host: a range in ``address`` pairs with the key's range, in order."""
    address = fields.values.get("address")
    if address is None:
        return [None] * len(names)
    where = fields.places["address"]
    if "[" not in address:
        if len(names) > 1:
            raise where.error(f"{address!r} is one address for {len(names)} hosts of {key!r}; "
                              f"give a range such as \"10.0.0.[1-{len(names)}]\"")
        return [_address(address, where)]
    try:
        addresses = expand_nodeset(address)
    except ValueError as exc:
        raise where.error(str(exc)) from None
    if len(addresses) != len(names):
        raise where.error(f"{address!r} expands to {len(addresses)} addresses but {key!r} "
                          f"to {len(names)} hosts")
    return [_address(one, where) for one in addresses]


def _read_containers(fields: _Fields) -> List[_ContainerEntry]:
    at = fields.places.get("containers", fields.at)
    entries = []
    for name, spec, name_at in _entries(_mapping(fields.values.get("containers"), at), at):
        _name(name, name_at)
        container_fields = _read_fields(spec, name_at, CONTAINER_KEYS)
        entries.append(_ContainerEntry(name, name_at, container_fields,
                                       _container(container_fields)))
    return entries


def _container(fields: _Fields) -> Container:
    values = fields.values
    for required in ("runtime", "id"):
        if required not in values:
            hint = f" (one of {', '.join(RUNTIMES)})" if required == "runtime" else ""
            raise fields.at.child(required, fields.at.line).error(f"required{hint}")
    runtime = values["runtime"]
    for key in KUBECTL_ONLY_KEYS:
        if key in values and runtime != "kubectl":
            raise fields.places[key].error(f"only for runtime kubectl (this one is {runtime})")
    if runtime == "pct" and not values["id"].isdigit():
        raise fields.places["id"].error(f"expected a numeric VMID for runtime pct, "
                                        f"got {_show(values['id'])}")
    return Container(runtime=runtime, id=values["id"], namespace=values.get("namespace"),
                     container=values.get("container"), exec_user=values.get("exec_user"))


def _read_slurm(fields: _Fields) -> Optional[Slurm]:
    if "slurm" not in fields.values:
        return None
    slurm = _read_fields(fields.values["slurm"], fields.places["slurm"], SLURM_KEYS).values
    return Slurm(**slurm)


def _ssh_hosts(entries: List[_HostEntry], defaults: _Fields) -> Dict[str, SshHost]:
    """SshHost per non-local entry, each ``jump`` resolved to its SshHost (chains included)."""
    by_name = {entry.name: entry for entry in entries}
    resolved: Dict[str, SshHost] = {}
    for start in entries:
        if start.local:
            continue
        chain: List[str] = []
        current = start.name
        while current not in resolved:
            if current in chain:   # chains are a few hops: a list is fine
                raise _jump_cycle(chain[chain.index(current):], by_name)
            chain.append(current)
            jump = by_name[current].fields.values.get("jump")
            if jump is None:
                break
            _check_jump(jump, by_name[current], by_name)
            current = jump
        for name in reversed(chain):
            entry = by_name[name]
            jump = entry.fields.values.get("jump")
            resolved[name] = _ssh_host(entry, defaults, resolved[jump] if jump else None)
    return resolved


def _check_jump(jump: str, entry: _HostEntry, by_name: Dict[str, _HostEntry]) -> None:
    where = entry.fields.places["jump"]
    if jump not in by_name:
        raise where.error(f"unknown host {jump!r}: a jump names an entry of hosts: (an empty "
                          f"entry such as `{jump}: {{}}` is an ssh_config alias)"
                          f"{_hint(jump, list(by_name))}")
    if by_name[jump].local:
        raise where.error(f"{jump!r} is a local host (local: true); a jump must be an SSH host")


def _jump_cycle(cycle: List[str], by_name: Dict[str, _HostEntry]) -> InputError:
    first = min(range(len(cycle)), key=lambda i: by_name[cycle[i]].fields.places["jump"].line)
    ordered = cycle[first:] + cycle[:first]
    where = by_name[ordered[0]].fields.places["jump"]
    return where.error("jump cycle: " + " → ".join(ordered + [ordered[0]]))


def _ssh_host(entry: _HostEntry, defaults: _Fields, jump: Optional[SshHost]) -> SshHost:
    settings = {**{k: v for k, v in defaults.values.items() if k in CONNECTION_KEYS},
                **{k: v for k, v in entry.fields.values.items() if k in CONNECTION_KEYS}}
    return SshHost(name=entry.name, address=entry.address, port=settings.get("port"),
                   user=settings.get("user"), identity_file=settings.get("identity_file"),
                   connect_timeout=settings.get("connect_timeout", 10.0),
                   host_key_policy=settings.get("host_key_policy"), jump=jump)


def _inherit(*levels: Dict[str, Any]) -> Dict[str, Any]:
    """defaults → host → container: env maps merge (the inner key wins), the rest overrides."""
    merged: Dict[str, Any] = {}
    for level in levels:
        for key in INHERITED_KEYS:
            if key == "env" and key in level:
                merged["env"] = {**merged.get("env", {}), **level["env"]}
            elif key in level:
                merged[key] = level[key]
    return merged


def _target(name: str, settings: Dict[str, Any], source: _At, **placement: Any) -> Target:
    return Target(name=name, python=settings.get("python", "python3"),
                  activate=settings.get("activate", ()),
                  env=tuple(settings.get("env", {}).items()),
                  timeout=settings.get("timeout", 300.0), models=settings.get("models", ()),
                  gpus=settings.get("gpus"), tmpdir=settings.get("tmpdir"),
                  source=(source.file, source.line), **placement)


def _become_for(entry: _HostEntry, defaults: _Fields) -> Optional[str]:
    if "become" in entry.fields.values:
        return entry.fields.values["become"]
    return None if entry.local else defaults.values.get("become")


# ---------------------------------------------------------------------------- groups and targets

def _register(names: Dict[str, _At], name: str, at: _At) -> None:
    if name in names:
        raise at.error(f"duplicate target name {name!r} (first defined at line {names[name].line})")
    names[name] = at


def _resolve_groups(value: Any, at: _At, targets: Dict[str, Target]) -> Dict[str, Tuple[str, ...]]:
    members_of: Dict[str, List[Tuple[Any, _At]]] = {}
    for name, members, where in _entries(_mapping(value, at), at):
        _name(name, where)
        if name in targets:
            raise where.error(f"group name {name!r} is also a target name")
        members_of[name] = _members(members, where)
    resolved: Dict[str, Tuple[str, ...]] = {}

    def expand_group(group: str, visiting: Tuple[str, ...]) -> Tuple[str, ...]:
        if group not in resolved:
            inside = visiting + (group,)
            names: List[str] = []
            for member, where in members_of[group]:
                names += _expand_member(member, where, targets, members_of,
                                        lambda inner: expand_group(inner, inside), inside)
            resolved[group] = tuple(_unique(names))
        return resolved[group]

    for group in members_of:
        expand_group(group, ())
    return resolved


def _members(value: Any, at: _At) -> List[Tuple[Any, _At]]:
    """A list of members, or one string (which may be a comma list or a node set)."""
    if value is None:
        return []
    if isinstance(value, _Sequence):
        return [(member, at.item(i, line))
                for i, (member, line) in enumerate(zip(value, value.item_lines))]
    if isinstance(value, str):
        return [(value, at)]
    raise at.error(f"expected a list of target or group names, got {_show(value)}")


def _expand_member(member: Any, at: _At, targets: Dict[str, Target], groups: Dict[str, Any],
                   expand_group: Callable[[str], Tuple[str, ...]],
                   visiting: Sequence[str]) -> List[str]:
    """A group member or defaults.targets entry: names, node sets and groups → target names."""
    text = _string(member, at, "a target or group name")
    try:
        names = expand_selector(text, _file_budget.get())
    except ValueError as exc:
        raise at.error(str(exc)) from None
    expanded: List[str] = []
    for name in names:
        if name in visiting:
            raise at.error("group cycle: " + " → ".join(
                list(visiting[visiting.index(name):]) + [name]))
        if name in groups:
            members = expand_group(name)
            budget = _file_budget.get()
            try:   # each reference costs its size: `[g, g, g, ...]` must not multiply freely
                if budget is not None:
                    budget.spend(len(members))
            except ValueError as exc:
                raise at.error(str(exc)) from None
            expanded += members
        elif name in targets:
            expanded.append(name)
        else:
            inside = f" (from {text!r})" if name != text else ""
            raise at.error(f"unknown target or group {name!r}{inside}"
                           f"{_hint(name, list(targets) + list(groups))}")
    return expanded


def _default_targets(defaults: _Fields, targets: Dict[str, Target],
                     groups: Dict[str, Tuple[str, ...]]) -> Tuple[str, ...]:
    if "targets" not in defaults.values:
        return ("local",)
    where = defaults.places["targets"]
    names: List[str] = []
    for member, member_at in _members(defaults.values["targets"], where):
        names += _expand_member(member, member_at, targets, groups,
                                lambda group: groups[group], ())
    if not names:
        raise where.error("expected at least one target (leave targets: out for [local])")
    return tuple(_unique(names))


def _runbook_dirs(top: _Fields, path: str) -> Tuple[Tuple[str, str, int], ...]:
    """``runbooks:`` a directory or a list of them, relative to the hosts file. Whether they
    exist is checked by ``runbook`` only, so a missing one never blocks the other tasks."""
    if "runbooks" not in top.values:
        return ()
    value, where = top.values["runbooks"], top.places["runbooks"]
    items = ([(v, where.item(i, line)) for i, (v, line) in enumerate(zip(value, value.item_lines))]
             if isinstance(value, _Sequence) else [(value, where)])
    base = os.path.dirname(os.path.abspath(path))
    return tuple((os.path.join(base, os.path.expanduser(_string(item, at, "a directory"))),
                  at.file, at.line) for item, at in items)


def _build(document: Any, path: str) -> Topology:
    if not isinstance(document, _Mapping):
        raise InputError(f"expected a mapping with hosts:, got {_show(document)}", file=path,
                         line=getattr(document, "line", 1))
    top = _read_fields(document, _At(path, document.line), TOP_KEYS)
    defaults = _read_fields(top.values.get("defaults"),
                            top.places.get("defaults", top.at.child("defaults", 1)), DEFAULTS_KEYS)
    hosts_at = top.places.get("hosts", top.at.child("hosts", 1))
    entries = _read_hosts(top.values.get("hosts"), hosts_at)

    defined: Dict[str, _At] = {}
    for entry in entries:
        _register(defined, entry.name, entry.at)
        for container in entry.containers:
            _register(defined, container.name, container.at)
    ssh_hosts = _ssh_hosts(entries, defaults)

    targets: Dict[str, Target] = {}
    if "local" not in defined:
        targets["local"] = _target("local", _inherit(defaults.values), _At("<embedded>", 0),
                                   local=True)
    for entry in entries:
        host_settings = _inherit(defaults.values, entry.fields.values)
        place = dict(local=entry.local, host=ssh_hosts.get(entry.name),
                     become=_become_for(entry, defaults))
        targets[entry.name] = _target(entry.name, host_settings, entry.at, slurm=entry.slurm,
                                      **place)
        for container in entry.containers:
            settings = _inherit(defaults.values, entry.fields.values, container.fields.values)
            targets[container.name] = _target(container.name, settings, container.at,
                                              container=container.container, **place)

    groups = _resolve_groups(top.values.get("groups"),
                             top.places.get("groups", top.at.child("groups", 1)), targets)
    return Topology(path=path, targets=targets, groups=groups,
                    default_targets=_default_targets(defaults, targets, groups),
                    runbook_dirs=_runbook_dirs(top, path))
