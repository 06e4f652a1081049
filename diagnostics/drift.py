"""Drift between targets: which values of a diagnostic's ``data`` differ, and where.

The default multi-target view of ``env-report`` (DESIGN.md §1): instead of N
full reports, one line per key whose value is not the same everywhere::

    torch: 2.11.0 on 7 targets, 2.10.0 on gpu05

``drift()`` flattens each target's ``data`` into dotted keys (nested dicts only;
a list is one value; an empty dict has no keys), groups the targets by value per key and keeps the keys
with more than one group. The majority value is the most common one (ties go to
the value seen first, in the order the results were given). A key missing on a
target counts as the value ``ABSENT``; pass only results that actually ran
(an ``error`` result has no data and would show up everywhere as absent).

Keys that differ on every machine by nature are ignored (``IGNORE_PATTERNS``,
shell-style patterns matched case-insensitively against the last component of a
key and against the whole dotted key):

* host identity: ``hostname``, ``fqdn``, ``machine_id``, ``boot_id``, ``uuid``,
  ``*_uuid``, ``serial``, ``*_serial``
* process ids: ``pid``, ``*_pid``, ``ppid``, ``pids``
* mldiag's per-run private temp dir: ``tmpdir``, ``remote_tmpdir``
* timestamps: ``timestamp``, ``*_timestamp``, ``time``, ``*_time``, ``*_at``, ``date``
* durations: ``duration*``, ``*_duration*``, ``elapsed*``, ``*_elapsed*``, ``uptime*``

``format_drift()`` renders rows as text, folding target lists ClusterShell-style
(``gpu[01-04,06]``) and falling back to a comma list for names a node set would
misread (``a,b``, ``x!y``, ``n[1]``).
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import nodeset


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

# Prefixes dropped from keys when displayed: env-report's versions live under
# data.packages, and "torch: 2.11.0 ..." reads better than "packages.torch: ...".
DISPLAY_STRIP_PREFIXES: Tuple[str, ...] = ("packages.",)


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


def drift(results: Sequence[Tuple[str, Mapping[str, Any]]], *,
          ignore: Iterable[str] = IGNORE_PATTERNS) -> List[DriftRow]:
    """Rows for the keys whose values are not the same on every target.

    ``results`` is a list of ``(target_name, data)``; rows come in the order keys
    are first seen. Fewer than two targets: no drift.
    """
    if len(results) < 2:
        return []
    patterns = tuple(ignore)
    flat = [(name, flatten(data or {})) for name, data in results]
    keys: Dict[str, None] = {}
    for _name, f in flat:
        for k in f:
            keys.setdefault(k, None)
    rows: List[DriftRow] = []
    for key in keys:
        if is_ignored(key, patterns):
            continue
        groups: Dict[str, List[Any]] = {}     # identity -> [value, [targets]]
        for name, f in flat:
            value = f.get(key, ABSENT)
            groups.setdefault(_identity(value), [value, []])[1].append(name)
        if len(groups) < 2:
            continue
        ordered = sorted(groups.values(), key=lambda g: -len(g[1]))   # stable: ties keep first-seen
        (mval, mtargets), rest = ordered[0], ordered[1:]
        rows.append(DriftRow(key=key, majority=mval, majority_targets=tuple(mtargets),
                             others=tuple((v, tuple(ts)) for v, ts in rest)))
    return rows


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


def display_key(key: str) -> str:
    for prefix in DISPLAY_STRIP_PREFIXES:
        if key.startswith(prefix) and len(key) > len(prefix):
            return key[len(prefix):]
    return key


def format_row(row: DriftRow, max_len: Optional[int] = 80) -> str:
    """``torch: 2.11.0 on 7 targets, 2.10.0 on gpu05``: the majority value with its
    count (its name when it is on one target), then each other value with its
    targets folded."""
    n = len(row.majority_targets)
    where = row.majority_targets[0] if n == 1 else f"{n} targets"
    parts = [f"{format_value(row.majority, max_len)} on {where}"]
    for value, targets in row.others:
        parts.append(f"{format_value(value, max_len)} on {fold(targets)}")
    return f"{display_key(row.key)}: " + ", ".join(parts)


def format_drift(rows: Iterable[DriftRow], max_len: Optional[int] = 80) -> List[str]:
    return [format_row(r, max_len) for r in rows]
