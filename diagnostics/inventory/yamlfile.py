"""YAML files read with their line numbers, and the value checks whose errors name them.

Used by hosts.yaml (``topology``) and runbooks (``runbook``): ``parse`` gives the document as
``LineMapping`` / ``LineSequence`` / scalars, each mapping knowing its line and each key's line
(and how a plain scalar was written, so ``010`` stays ``010``); every YAML problem is an
``InputError`` ``FILE:LINE: invalid YAML: ...``. Then ``At`` (file, line, dotted key) follows
the walk down the document, and the ``expect_*`` checks raise ``FILE:LINE: key: what was
expected``.

Choices: plain YAML 1.1 (safe_load) except that ``00:10:00`` is the string it looks like, not the
base-60 number; duplicate keys refused; ``x-*`` keys are metadata at every level, never read;
custom tags refused.
"""

import difflib
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from ..core.errors import InputError

# Tokens that may appear on a remote command line (docs/architecture.md, invariant 1): nothing any
# login shell (sh, bash, zsh, fish, csh) treats specially, and no leading '=' or '~' (zsh
# expands `=ls` and `~user` even unquoted by shlex) — neither character is in the alphabet.
SAFE_TOKEN = re.compile(r"[A-Za-z0-9_@%+,./:-]+")


def is_safe_token(token: str) -> bool:
    return bool(SAFE_TOKEN.fullmatch(token))


# Target, group and model names. They become --save file names and -H values: no '/',
# no leading '.' or '-'; ':' is reserved for Slurm node rows (`cluster-a:n3`).
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
NAME_ALPHABET = "[A-Za-z0-9._-]"
METADATA_PREFIX = "x-"


class LineMapping(dict):
    """A YAML mapping that remembers its line, each key's line, and how each plain scalar
    value was written (so ``id: 0200`` stays "0200")."""
    line = 1

    def __init__(self) -> None:
        super().__init__()
        self.key_lines: Dict[Any, int] = {}
        self.written: Dict[Any, str] = {}


class LineSequence(list):
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
    """safe_load semantics; mappings and sequences come back as LineMapping / LineSequence."""

    yaml_implicit_resolvers = {
        first: [(tag, _YAML12_NUMBERS.get(tag, pattern)) for tag, pattern in resolvers]
        for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
    }

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except (yaml.YAMLError, RecursionError):
            raise
        except Exception:  # `!!int abc` raises ValueError, `!!bool x` KeyError, ...
            written = f"{node.value!r}" if isinstance(node, ScalarNode) else "this value"
            raise ConstructorError(None, None, f"{written} is not a valid {node.tag}",
                                   node.start_mark) from None

    def construct_line_mapping(self, node):
        mapping = LineMapping()
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
        sequence = LineSequence()
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


def parse(text: str, path: str,
                empty: str = "empty file") -> Any:
    """The document as LineMapping/LineSequence/scalars; every YAML problem as an InputError."""
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
class At:
    """Where a value is: file, line and dotted key, for error messages."""
    file: str
    line: int
    key: str = ""

    def child(self, key: Any, line: int) -> "At":
        return At(self.file, line, f"{self.key}.{key}" if self.key else str(key))

    def item(self, index: int, line: int) -> "At":
        return At(self.file, line, f"{self.key}[{index}]")

    def error(self, message: str) -> InputError:
        return InputError(message, file=self.file, line=self.line, key=self.key or None)


def show(value: Any) -> str:
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


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def items_at(mapping: LineMapping, at: At) -> Iterator[Tuple[Any, Any, At]]:
    """(key, value, where) of a mapping, metadata keys (``x-*``) left out."""
    for key, value in mapping.items():
        if isinstance(key, str) and key.startswith(METADATA_PREFIX):
            continue
        yield key, value, at.child(key, mapping.key_lines.get(key, mapping.line))


def expect_mapping(value: Any, at: At) -> LineMapping:
    """A mapping; an empty value counts as an empty mapping."""
    if value is None:
        empty = LineMapping()
        empty.line = at.line
        return empty
    if not isinstance(value, LineMapping):
        raise at.error(f"expected a mapping, got {show(value)}")
    return value


def expect_string(value: Any, at: At, what: str = "a string") -> str:
    if not isinstance(value, str) or not value:
        raise at.error(f"expected {what}, got {show(value)}")
    return value


def expect_shell_token(value: Any, at: At) -> str:
    token = expect_string(value, at)
    if not is_safe_token(token):
        raise at.error(f"{show(token)} contains characters outside [A-Za-z0-9_@%+,./:-] "
                       "(shell metacharacters are not allowed here)")
    return token


def expect_argument(value: Any, at: At) -> str:
    """A token that lands on a command line as an argument: safe, and not read as an option."""
    token = expect_shell_token(value, at)
    if token.startswith("-"):
        raise at.error(f"{show(token)} must not start with '-' (it would be read as an option)")
    return token


def expect_name(value: Any, at: At) -> str:
    name = expect_string(value, at, "a name")
    if not NAME.fullmatch(name):
        raise at.error(f"{show(name)} is not a valid name: use only {NAME_ALPHABET}, not starting "
                       "with '.' or '-' (':' is reserved for Slurm node rows like cluster-a:n3)")
    return name


def expect_integer(value: Any, at: At, minimum: int, maximum: Optional[int] = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise at.error(f"expected an integer, got {show(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
        raise at.error(f"expected an integer {bounds}, got {value}")
    return value


def expect_port(value: Any, at: At) -> int:
    return expect_integer(value, at, 1, 65535)


def expect_count(value: Any, at: At) -> int:
    return expect_integer(value, at, 0)


def expect_positive_count(value: Any, at: At) -> int:
    return expect_integer(value, at, 1)


def expect_seconds(value: Any, at: At) -> float:
    seconds = math.nan
    if is_number(value):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    if not (math.isfinite(seconds) and seconds > 0):
        raise at.error(f"expected a positive number of seconds, got {show(value)}")
    return seconds


def expect_boolean(value: Any, at: At) -> bool:
    if not isinstance(value, bool):
        raise at.error(f"expected true or false, got {show(value)}")
    return value


def expect_choice(options: Sequence[str]) -> Callable[[Any, At], str]:
    def check(value: Any, at: At) -> str:
        if isinstance(value, str) and value in options:
            return value
        if isinstance(value, str):
            raise at.error(f"{value!r} is not one of {', '.join(options)}")
        raise at.error(f"expected one of {', '.join(options)}, got {show(value)}")
    return check


def unknown_key(key: Any, allowed: Sequence[str]) -> str:
    close = difflib.get_close_matches(str(key), list(allowed), n=1)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    return f"unknown key (expected one of {', '.join(allowed)}, or x-* for metadata)"
