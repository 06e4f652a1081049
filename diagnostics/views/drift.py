"""Drift between targets: which facts of a diagnostic's ``data`` differ, and where.

The default multi-target view of ``env-report`` (docs/architecture.md), and of any diagnostic run
with ``--diff``: instead of N full reports, one line per *fact* whose value is not the same
everywhere, its values grouped with the targets that have each, most targets first::

    torch: 2.13.0+cpu on gpu[01-15]; 2.12.0 on gpu16
    torch: 2.13.0+cpu on mlbox; missing on gpubox
    python: 3.11.2 (executable /root/venv/bin/python, venv true) on ct; 3.11.2 (executable /usr/bin/python3, venv false) on main
    python: 3.11.7 on mlbox; 3.11.2 on gpubox (also differ: executable, prefix, base_prefix, venv)

**Keys.** ``flatten()`` turns each target's ``data`` into dotted keys (nested dicts only; a
list is one value; an empty dict has no keys). ``drift_keys()`` groups the targets by value
per key and keeps the keys with more than one group (``DriftRow``). A key missing on a
target counts as the value ``ABSENT``; pass only results that actually ran (an ``error``
result has no data and would show up everywhere as absent).

**Facts.** ``drift()`` gathers the differing keys into facts, each fact a name and its fields:

* a key under a section that maps names to things is the fact of that name, merged across
  such sections and with a top-level section of the same name: ``packages.torch`` (the fact's
  own value), ``torch.cuda`` and ``imports.torch.ok`` are the fields of one fact ``torch``
  (``MERGED_SECTIONS``: ``packages``, whose children are values, and ``imports``, whose
  children are records);
* each environment variable is a fact of its own: ``env.NCCL_DEBUG`` is ``NCCL_DEBUG``
  (``OWN_SECTIONS``: ``env``), never merged with a package of that name;
* any other key is a field of the fact named by its first component: ``python.version``,
  ``python.venv`` -> ``python``; ``driver.*``, ``gpus.*``, ``cuda_toolkit.*``, ``os.*``,
  ``pip_check.*``; a top-level scalar (``count``) is a fact by itself.

So another diagnostic's ``--diff`` gets one line per top-level section of its ``data`` (and
per package or variable where it uses those section names) with no table of its own here.

**A fact's value on a target** is its *headline*: the fact's own value (``packages.torch``,
``env.X``, a top-level scalar) if it has one, else its ``version`` field, else the differing
fields themselves that say something (``ok false, problems [...]``: null, absent and empty
values left out unless two groups would then read alike). A headline that is null or absent reads
``missing`` (a package not installed, a variable unset); without a headline, a target whose
differing fields are all null or absent is ``missing``. A missing fact shows the differing
fields that still say something there (not null, absent, empty or false: ``missing
(nvidia_smi_error exit 15: ...)``). Targets are grouped by all the fact's
differing fields; where groups share a headline, each of them adds the fields that tell them
apart in parentheses. Fields that differ between targets that are present but are hidden by
different headlines are named at the end ``(also differ: ...)``, at most ``ALSO_MAX`` of them;
fields that only repeat the headline (``torch.version`` beside ``packages.torch``) or only
differ because the fact is missing somewhere (``torch.path: none``) are not.

The majority value is the most common one (ties go to the value seen first, in the order the
results were given); facts come in the order their keys are first seen.

Keys that differ on every machine by nature are ignored (``IGNORE_PATTERNS``,
shell-style patterns matched case-insensitively against the last component of a
key and against the whole dotted key):

* host identity: ``hostname``, ``fqdn``, ``machine_id``, ``boot_id``, ``uuid``,
  ``*_uuid``, ``serial``, ``*_serial``
* process ids: ``pid``, ``*_pid``, ``ppid``, ``pids``
* mldiag's per-run private temp dir: ``tmpdir``, ``remote_tmpdir``
* timestamps: ``timestamp``, ``*_timestamp``, ``time``, ``*_time``, ``*_at``, ``date``
* durations: ``duration*``, ``*_duration*``, ``elapsed*``, ``*_elapsed*``, ``uptime*``

``format_drift()`` renders fact rows as text lines (not yet escaped: every view passes them
through ``render.safe_text``), folding target lists ClusterShell-style (``gpu[01-04,06]``)
and falling back to a comma list for names a node set would misread (``a,b``, ``x!y``,
``n[1]``); a majority set whose folded form is longer than ``FOLD_MAX`` characters is
written ``N targets``.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..core import nodeset


IGNORE_PATTERNS: Tuple[str, ...] = (
    # host identity
    "hostname", "fqdn", "machine_id", "boot_id", "uuid", "*_uuid", "serial", "*_serial",
    # process ids
    "pid", "*_pid", "ppid", "pids",
    # mldiag's own per-run private temp dir
    "tmpdir", "remote_tmpdir",
    # timestamps
    "timestamp", "*_timestamp", "time", "*_time", "*_at", "date",
    # durations
    "duration*", "*_duration*", "elapsed*", "*_elapsed*", "uptime*",
)

# Sections mapping a name to a thing, merged into the fact of that name (with a top-level
# section of the same name): packages.torch, imports.torch.*, torch.* -> "torch". The value
# says what a child is: None, the fact's own value (packages.zope.interface is the package
# "zope.interface"); a text, a record whose fields are named with it (imports.torch.ok is
# the field "import ok").
MERGED_SECTIONS: Dict[str, Optional[str]] = {"packages": None, "imports": "import "}
# Sections mapping a name to a thing that is a fact of its own, never merged: env.X -> "X".
OWN_SECTIONS: Tuple[str, ...] = ("env",)
ALSO_MAX = 4          # hidden differing fields named at most, then "+N more"
FOLD_MAX = 40         # longest folded majority set before it is written "N targets"


class _Absent:
    """The value of a key a target does not have."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


@dataclass(frozen=True)
class DriftRow:
    """One key whose value differs between targets."""

    key: str                                   # dotted key, e.g. "packages.torch"
    majority: Any                              # the most common value
    majority_targets: Tuple[str, ...]          # the targets that have it, in input order
    others: Tuple[Tuple[Any, Tuple[str, ...]], ...]   # (value, targets), most common first

    @property
    def targets(self) -> Tuple[str, ...]:
        return self.majority_targets + tuple(t for _v, ts in self.others for t in ts)


@dataclass(frozen=True)
class FactGroup:
    """The targets on which a fact has one value."""

    headline: Any                              # the headline's value (ABSENT: no headline field)
    missing: bool                              # the fact is not there (null/absent headline)
    details: Tuple[Tuple[str, Any], ...]       # (field, value) shown beside the headline
    targets: Tuple[str, ...]                   # in input order


@dataclass(frozen=True)
class FactRow:
    """One fact whose value differs between targets."""

    fact: str                                  # its name as shown: "torch", "python", "NCCL_DEBUG"
    keys: Tuple[str, ...]                      # the differing dotted keys it gathers
    groups: Tuple[FactGroup, ...]              # most targets first (ties: first seen)
    also: Tuple[str, ...] = ()                 # differing fields no group shows

    @property
    def targets(self) -> Tuple[str, ...]:
        return tuple(t for g in self.groups for t in g.targets)


def flatten(data: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}, "c": [1, 2]}`` -> ``{"a.b": 1, "c": [1, 2]}``. An empty dict has
    no keys: where others have some, they show up as absent there."""
    out: Dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def is_ignored(key: str, patterns: Iterable[str] = IGNORE_PATTERNS) -> bool:
    last = key.rsplit(".", 1)[-1].lower()
    full = key.lower()
    return any(fnmatch.fnmatchcase(last, p) or fnmatch.fnmatchcase(full, p) for p in patterns)


def _identity(value: Any) -> str:
    """A hashable stand-in for a JSON value (lists and dicts compare by content)."""
    if value is ABSENT:
        return "\0absent"
    return json.dumps(value, sort_keys=True, default=repr)


def _flat(results: Sequence[Tuple[str, Mapping[str, Any]]], patterns: Tuple[str, ...]):
    flat = [(name, flatten(data or {})) for name, data in results]
    keys: Dict[str, None] = {}
    for _name, f in flat:
        for k in f:
            if not is_ignored(k, patterns):
                keys.setdefault(k, None)
    return flat, list(keys)


def _groups(flat, key: str) -> List[List[Any]]:
    """[[value, [targets]], ...] for one key, most targets first (stable: ties keep first-seen)."""
    groups: Dict[str, List[Any]] = {}
    for name, f in flat:
        value = f.get(key, ABSENT)
        groups.setdefault(_identity(value), [value, []])[1].append(name)
    return sorted(groups.values(), key=lambda g: -len(g[1]))


def drift_keys(results: Sequence[Tuple[str, Mapping[str, Any]]], *,
               ignore: Iterable[str] = IGNORE_PATTERNS) -> List[DriftRow]:
    """One row per dotted key whose values are not the same on every target.

    ``results`` is a list of ``(target_name, data)``; rows come in the order keys
    are first seen. Fewer than two targets: no drift.
    """
    if len(results) < 2:
        return []
    flat, keys = _flat(results, tuple(ignore))
    rows: List[DriftRow] = []
    for key in keys:
        ordered = _groups(flat, key)
        if len(ordered) < 2:
            continue
        (mval, mtargets), rest = ordered[0], ordered[1:]
        rows.append(DriftRow(key=key, majority=mval, majority_targets=tuple(mtargets),
                             others=tuple((v, tuple(ts)) for v, ts in rest)))
    return rows


def fact_of(key: str) -> Tuple[Tuple[str, str], str]:
    """``(fact id, field)`` of a dotted key; the field is ``""`` for the fact's own value.

    ``packages.torch`` -> ``(("", "torch"), "")``; ``imports.torch.ok`` -> ``(("", "torch"),
    "import ok")``; ``torch.cuda`` -> ``(("", "torch"), "cuda")``; ``env.NCCL_DEBUG`` ->
    ``(("env", "NCCL_DEBUG"), "")``; ``python.version`` -> ``(("", "python"), "version")``.
    """
    head, dot, rest = key.partition(".")
    if dot and rest:
        if head in OWN_SECTIONS:
            return (head, rest), ""
        if head in MERGED_SECTIONS:
            prefix = MERGED_SECTIONS[head]
            name, dot2, field = rest.rpartition(".")
            if prefix is None or not dot2:     # packages.torch: the fact's own value
                return ("", rest), ""
            return ("", name), prefix + field
        return ("", head), rest
    return ("", key), ""


def _none(value: Any) -> bool:
    return value is None or value is ABSENT


def _empty(value: Any) -> bool:
    return _none(value) or (isinstance(value, (str, list, tuple, Mapping)) and not value)


def drift(results: Sequence[Tuple[str, Mapping[str, Any]]], *,
          ignore: Iterable[str] = IGNORE_PATTERNS) -> List[FactRow]:
    """One row per fact (see the module docstring) whose values are not the same on every
    target. ``results`` is a list of ``(target_name, data)``; fewer than two targets: no drift."""
    if len(results) < 2:
        return []
    flat, keys = _flat(results, tuple(ignore))
    facts: Dict[Tuple[str, str], Dict[str, str]] = {}        # fact id -> {key: field}
    for key in keys:
        fid, field = fact_of(key)
        facts.setdefault(fid, {})[key] = field
    rows = []
    for fid, fields in facts.items():
        row = _fact_row(fid[1], fields, flat)
        if row is not None:
            rows.append(row)
    return rows


def _fact_row(name: str, fields: Dict[str, str], flat) -> Optional[FactRow]:
    differing = [k for k in fields if len({_identity(f.get(k, ABSENT)) for _n, f in flat}) > 1]
    if not differing:
        return None
    headline = next((k for k, fl in fields.items() if fl == ""), None) or \
        next((k for k, fl in fields.items() if fl == "version"), None)
    by_sig: Dict[Tuple[str, ...], List[Any]] = {}            # signature -> [values, missing, [targets]]
    for target, f in flat:
        values = {k: f.get(k, ABSENT) for k in differing}
        hval = f.get(headline, ABSENT) if headline else ABSENT
        missing = _none(hval) if headline else all(_none(v) for v in values.values())
        sig = (_identity(hval),) + tuple(_identity(values[k]) for k in differing)
        by_sig.setdefault(sig, [values, hval, missing, []])[3].append(target)
    ordered = sorted(by_sig.values(), key=lambda g: -len(g[3]))
    shown = [k for k in differing if k != headline]
    # the label each group would have without details; groups sharing one get the fields
    # that tell them apart
    base = [("missing",) if g[2] else (_identity(g[1]),) if headline else
            ("fields",) + tuple(_identity(g[0][k]) for k in shown) for g in ordered]
    details: List[Tuple[str, ...]] = [() for _ in ordered]
    for label in set(base):
        same = [i for i, b in enumerate(base) if b == label]
        if len(same) < 2:
            continue
        apart = tuple(k for k in shown if len({_identity(ordered[i][0][k]) for i in same}) > 1)
        for i in same:
            details[i] = apart
    if headline is None:
        # no headline: a group reads as its differing fields that say something (not null,
        # absent or empty), or all of them where that would make two groups read alike
        said = [tuple(k for k in shown if not _empty(g[0][k])) for g in ordered]
        sigs = [tuple(_identity(g[0][k]) for k in said[i]) + said[i] for i, g in enumerate(ordered)]
        if len(set(sigs)) < len(sigs):
            said = [tuple(shown) for _ in ordered]
    # a missing fact: the fields that still say something there (driver: nvidia_smi_error
    # exit 15 ...), or, where two missing groups would then read alike, what tells them apart
    why = {i: tuple(k for k in shown if not _empty(g[0][k]) and g[0][k] is not False)
           for i, g in enumerate(ordered) if g[2]}
    why_sigs = [tuple((k, _identity(ordered[i][0][k])) for k in w) for i, w in why.items()]
    if len(set(why_sigs)) < len(why_sigs):
        why = {i: details[i] for i in why}
    groups = []
    for i, (values, hval, missing, targets) in enumerate(ordered):
        if missing:
            det = why[i]
        elif headline is None:
            det = said[i]
        else:
            det = details[i]
        groups.append(FactGroup(headline=hval if headline else ABSENT, missing=missing,
                                details=tuple((fields[k], values[k]) for k in det),
                                targets=tuple(targets)))
    present = [g for g in ordered if not g[2]]
    also = []
    if headline is not None:
        in_details = {k for d in details for k in d}
        for k in shown:
            if k in in_details:
                continue
            if len({_identity(g[0][k]) for g in present}) < 2:
                continue                 # the same wherever the fact is there
            if all(format_value(g[0][k], None) == format_value(g[1], None) for g in present):
                continue                 # repeats the headline
            also.append(fields[k])
    return FactRow(fact=name, keys=tuple(differing), groups=tuple(groups), also=tuple(also))


def fold(names: Sequence[str]) -> str:
    """``["gpu01", "gpu02", "gpu04"]`` -> ``"gpu[01-02,04]"`` (``nodeset.fold``: names that are
    not plain node names follow as a comma list)."""
    return nodeset.fold(names)


def format_value(value: Any, max_len: Optional[int] = 80) -> str:
    if value is ABSENT:
        text = "absent"
    elif value is None:
        text = "none"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value if value else '""'
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(format_value(v, None) for v in value) + "]"
    elif isinstance(value, Mapping):
        text = json.dumps(value, sort_keys=True, default=repr)
    else:
        text = str(value)
    if max_len is not None and len(text) > max_len:
        text = text[:max_len - 1] + "\u2026"
    return text


def _where(targets: Sequence[str], majority: bool) -> str:
    text = fold(targets)
    if majority and len(targets) > 1 and len(text) > FOLD_MAX:
        return f"{len(targets)} targets"
    return text


def format_group(group: FactGroup, max_len: Optional[int] = 80) -> str:
    """``2.13.0+cpu``, ``missing``, ``3.11.2 (executable /usr/bin/python3, venv false)``,
    ``ok false, problems [...]`` (no headline field)."""
    det = ", ".join(f"{field} {format_value(value, max_len)}".strip() for field, value in group.details)
    if group.missing:
        label = "missing"
    elif group.headline is ABSENT:
        return det
    else:
        label = format_value(group.headline, max_len)
    return f"{label} ({det})" if det else label


def format_row(row: FactRow, max_len: Optional[int] = 80) -> str:
    """``torch: 2.13.0+cpu on gpu[01-15]; 2.12.0 on gpu16``: each value with its targets,
    most targets first; then ``(also differ: ...)``."""
    parts = [f"{format_group(g, max_len)} on {_where(g.targets, i == 0)}"
             for i, g in enumerate(row.groups)]
    line = f"{row.fact}: " + "; ".join(parts)
    if row.also:
        names = list(row.also[:ALSO_MAX])
        more = len(row.also) - len(names)
        line += " (also differ: " + ", ".join(names) + (f" +{more} more" if more else "") + ")"
    return line


def format_drift(rows: Iterable[FactRow], max_len: Optional[int] = 80) -> List[str]:
    return [format_row(r, max_len) for r in rows]
