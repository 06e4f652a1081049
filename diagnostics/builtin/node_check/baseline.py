"""node-check's baseline: each node's facts saved once (``--save-baseline FILE``) and every later
difference reported (``--baseline FILE``); without a baseline, the node that differs from the
strict majority of the selected nodes (the outlier a person looks for).

Facts are ``result.data["facts"]``: a flat dict, dotted keys (``nvlink.gpu3.active``,
``ib.mlx5_4/1.rate``, ``driver``), scalar values — configuration that should be the same on
identical nodes, never counters. A result without facts (status ``error``: the node could not be
checked) is left out: never saved, never a deviation, never part of a majority.

The file: one JSON document ``{"schema": 1, "taken": ISO-8601 UTC, "nodes": {target: facts}}``,
written to a fresh temp name beside FILE (``O_CREAT|O_EXCL|O_NOFOLLOW``, relative to the
directory's fd) and renamed over it, as ``--save`` files are (savedir.SaveDir): a reader never
sees half a file, a symbolic link planted at FILE is replaced, never followed.
"""

import dataclasses
import datetime
import json
import os
import re
import stat
from collections import Counter
from typing import Any, Callable, Dict, Iterable, List, Optional, TextIO, Tuple

from ...core.errors import InputError
from ...core.results import Finding, Result
from ...core.savedir import SaveDir

SCHEMA = 1
MAX_FILE_BYTES = 64 * 1024 * 1024     # a baseline of thousands of nodes is a few MB
MAX_FINDINGS_PER_NODE = 20            # then one "… N more" finding
MIN_MAJORITY_NODES = 3
VALUE_SHOWN = 80                      # characters of a value in a message
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

BASELINE_CODE = "baseline-deviation"
MAJORITY_CODE = "majority-deviation"
NOT_IN_BASELINE_CODE = "not-in-baseline"

_MISSING = object()
_SCALARS = (str, int, float, bool, type(None))
# NOTE: at most 18 digits: a target's fact key "gpu<5,000 digits>" was an int() past Python's
# 4,300-digit limit (ValueError, the run ended); a longer one names no GPU (wire.MAX_INT)
_GPU_KEY = re.compile(r"(?:^|\.)gpu(\d{1,18})(?:\.|$)")
_IB_PORT_KEY = re.compile(r"^ib\.([A-Za-z0-9_.-]+/\d+)\.")


# ------------------------------------------------------------------ facts

def facts_of(result: Result) -> Optional[Dict[str, Any]]:
    """The result's facts (scalars only), or None when it has none to compare: an ``error``
    row (unreachable, timed out, crashed) or a document without ``data.facts``."""
    if result.status == "error":
        return None
    facts = (result.data or {}).get("facts") if isinstance(result.data, dict) else None
    if not isinstance(facts, dict):
        return None
    return {str(k): v for k, v in facts.items() if isinstance(v, _SCALARS)}


def _with_facts(results: Iterable[Result]) -> List[Tuple[str, Dict[str, Any]]]:
    out = []
    for r in results:
        facts = facts_of(r)
        if facts is not None:
            out.append((r.target, facts))
    return out


# ------------------------------------------------------------------ the file

def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def document(results: Iterable[Result], taken: Optional[str] = None) -> Dict[str, Any]:
    """What ``save`` writes: every node with facts, by target name."""
    return {"schema": SCHEMA, "taken": taken or _now(),
            "nodes": {target: dict(sorted(facts.items())) for target, facts in _with_facts(results)}}


def save(path: str, results: List[Result]) -> None:
    """Write the baseline of ``results`` to ``path`` atomically; a link at ``path`` is replaced,
    never followed. InputError (exit 4) naming the file when it cannot be written, or when no
    result has facts (an empty baseline would later say nothing about any node)."""
    doc = document(results)
    if not doc["nodes"]:
        raise InputError("no node reported facts (every target failed?): no baseline written",
                         file=path, key="--save-baseline")
    write_atomic(path, "--save-baseline", lambda stream: _dump(doc, stream))


def _dump(doc: Dict[str, Any], stream: TextIO) -> None:
    json.dump(doc, stream, indent=2, default=str)
    stream.write("\n")


def write_atomic(path: str, flag: str, write: Callable[[TextIO], None]) -> None:
    """``write(stream)`` into a fresh name beside ``path``, renamed over it (SaveDir.write_text):
    a link at ``path`` is replaced, never followed (invariant 9). InputError (exit 4) naming
    the file and ``flag`` when it cannot be written."""
    clean = path.rstrip("/")
    parent, name = os.path.split(clean)
    if not name or name in (".", ".."):
        raise InputError("not a file name", file=path, key=flag)
    # NOTE: the directory's own path is the user's choice and may go through links they made;
    # only the last component (FILE) is never followed (savedir.py's NOTE says why).
    try:
        fd = os.open(parent or ".", _OPEN_DIR)
    except OSError as exc:
        raise InputError(f"cannot open its directory: {exc.strerror}", file=path,
                         key=flag) from None
    try:
        st = _lstat(name, fd)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise InputError("a directory is in the way", file=path, key=flag)
        SaveDir(fd, parent or ".").write_text(name, write)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", file=path,
                         key=flag) from None
    finally:
        os.close(fd)


def _lstat(name: str, dir_fd: int):
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def load(path: str) -> Dict[str, Any]:
    """The baseline in ``path``, checked: InputError (exit 4) naming the file and what is wrong."""
    def bad(message: str) -> InputError:
        return InputError(message, file=path, key="--baseline")

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise bad(exc.strerror or str(exc)) from None
    if len(raw) > MAX_FILE_BYTES:
        raise bad(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB: not a baseline mldiag wrote")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise bad(f"not UTF-8 text (byte {exc.start})") from None
    except ValueError as exc:
        raise bad(f"not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise bad(f"expected a JSON object with schema, taken and nodes, got {_type(doc)}")
    if doc.get("schema") != SCHEMA:
        raise bad(f"schema {doc.get('schema')!r}, expected {SCHEMA} "
                  "(save it again with --save-baseline)")
    nodes = doc.get("nodes")
    if not isinstance(nodes, dict):
        raise bad(f"nodes: expected an object {{target: facts}}, got {_type(nodes)}")
    taken = doc.get("taken")
    if taken is not None and not isinstance(taken, str):
        raise bad(f"taken: expected a time (text), got {_type(taken)}")
    for target, facts in nodes.items():
        if not isinstance(facts, dict):
            raise bad(f"nodes.{target}: expected an object of facts, got {_type(facts)}")
        for key, value in facts.items():
            if not isinstance(value, _SCALARS):
                raise bad(f"nodes.{target}.{key}: expected a scalar (text, number, true/false, "
                          f"null), got {_type(value)}")
    return {"schema": SCHEMA, "taken": taken, "nodes": nodes}


def _type(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


# ------------------------------------------------------------------ comparing

def _same(a: Any, b: Any) -> bool:
    """Equal as facts: 18 == 18.0, but true is not 1 and "18" is not 18."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _key(value: Any) -> Any:
    """A hashable key under which _same values meet (for counting votes)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", value)      # 18 and 18.0: equal, same hash
    return (type(value).__name__, value)


def _show(value: Any) -> str:
    if value is _MISSING:
        return "missing"
    if isinstance(value, str):
        text = value
    else:
        text = json.dumps(value)
    return text if len(text) <= VALUE_SHOWN else text[:VALUE_SHOWN - 1] + "…"


def _show_pair(a: Any, b: Any) -> Tuple[str, str]:
    """Both values shown; typed (JSON) when their plain forms would read the same."""
    sa, sb = _show(a), _show(b)
    if sa == sb and a is not _MISSING and b is not _MISSING:
        return json.dumps(a)[:VALUE_SHOWN], json.dumps(b)[:VALUE_SHOWN]
    return sa, sb


def _named(key: str, value: str) -> str:
    """``driver 535.129.03`` (a plain word), ``nvlink.gpu3.active: 16`` (a dotted key)."""
    return f"{key}: {value}" if "." in key else f"{key} {value}"


def _fact_order(key: str) -> Tuple[int, str]:
    return (1 if "." in key else 0, key)      # driver, cuda, kernel first; then dotted keys


_FINDING_FIELDS = {f.name for f in dataclasses.fields(Finding)}


def _finding(key: Optional[str], code: str, message: str, level: str = "warn",
             action: str = "monitor") -> Finding:
    """A finding of check ``baseline``; the GPU or IB port a fact names goes in gpus/ports."""
    extra: Dict[str, Any] = {"action": action, "check": "baseline"}
    if key:
        gpu = _GPU_KEY.search(key)
        if gpu:
            extra["gpus"] = [int(gpu.group(1))]
        port = _IB_PORT_KEY.match(key)
        if port:
            extra["ports"] = [port.group(1)]
    # NOTE: results.Finding gains action/check/ports with schema 2; until then they are left out
    kwargs = {k: v for k, v in extra.items() if k in _FINDING_FIELDS}
    return Finding(level=level, code=code, message=message, **kwargs)


def _capped(found: List[Tuple[str, str]], code: str, against: str) -> List[Finding]:
    """One finding per fact, at most MAX_FINDINGS_PER_NODE, then one "… N more" naming keys."""
    found = sorted(found, key=lambda kv: _fact_order(kv[0]))
    out = [_finding(key, code, message) for key, message in found[:MAX_FINDINGS_PER_NODE]]
    rest = [key for key, _ in found[MAX_FINDINGS_PER_NODE:]]
    if rest:
        named = ", ".join(rest[:5]) + (", …" if len(rest) > 5 else "")
        out.append(_finding(None, code, f"… {len(rest)} more facts differ from {against}: {named}"))
    return out


def _against_baseline(facts: Dict[str, Any], base: Dict[str, Any]) -> List[Tuple[str, str]]:
    found = []
    for key in set(facts) | set(base):
        have, want = facts.get(key, _MISSING), base.get(key, _MISSING)
        if have is not _MISSING and want is not _MISSING and _same(have, want):
            continue
        if want is _MISSING:
            found.append((key, f"{_named(key, _show(have))}, not in the baseline"))
        else:
            shown_have, shown_want = _show_pair(have, want)
            found.append((key, f"{_named(key, shown_have)}, baseline {shown_want}"))
    return found


def _against_majority(nodes: List[Tuple[str, Dict[str, Any]]]) -> Dict[str, List[Tuple[str, str]]]:
    """Per fact: the value a strict majority of the nodes reporting it hold, and the nodes that
    differ; a fact most nodes report is "missing" on a node without it, and a fact most nodes
    lack is "not on N of M nodes" on a node that has it."""
    found: Dict[str, List[Tuple[str, str]]] = {target: [] for target, _ in nodes}
    total = len(nodes)
    if total < MIN_MAJORITY_NODES:
        return found
    keys = set()
    for _, facts in nodes:
        keys.update(facts)
    for key in keys:
        reporting = [(t, f[key]) for t, f in nodes if key in f]
        absent = [t for t, f in nodes if key not in f]
        if absent and len(absent) * 2 > total:
            for target, value in reporting:
                found[target].append((key, f"{_named(key, _show(value))}, not on "
                                           f"{len(absent)} of {total} nodes"))
            continue
        votes = Counter(_key(v) for _, v in reporting)
        top, count = votes.most_common(1)[0]
        if count * 2 <= len(reporting) or len(reporting) < MIN_MAJORITY_NODES:
            continue                      # no strict majority: nobody is the odd one out
        majority_value = next(v for _, v in reporting if _key(v) == top)
        for target, value in reporting:
            if _key(value) != top:
                shown, shown_major = _show_pair(value, majority_value)
                found[target].append((key, f"{_named(key, shown)}, {count} of "
                                           f"{len(reporting)} nodes: {shown_major}"))
        if absent and len(reporting) * 2 > total:
            for target in absent:
                found[target].append((key, f"{_named(key, 'missing')}, {count} of {total} "
                                           f"nodes: {_show(majority_value)}"))
    return found


def deviations(results: List[Result], baseline: Optional[Dict[str, Any]]) -> Dict[str, List[Finding]]:
    """{target: findings} for every node with facts (an empty list when it matches).

    With ``baseline`` (``load``'s answer): each fact that differs, is missing or is new
    (code ``baseline-deviation``); a node the baseline does not know gets one info finding
    (``not-in-baseline``). Without: each fact where the node differs from the strict majority
    of the nodes reporting it, with at least 3 nodes (``majority-deviation``). Findings are
    level warn, action monitor, check baseline; at most 20 per node, then one "… N more"."""
    nodes = _with_facts(results)
    if baseline is None:
        per_node = _against_majority(nodes)
        return {target: _capped(per_node[target], MAJORITY_CODE, "the majority")
                for target, _ in nodes}
    known = baseline.get("nodes") or {}
    taken = baseline.get("taken")
    out: Dict[str, List[Finding]] = {}
    for target, facts in nodes:
        base = known.get(target)
        if not isinstance(base, dict):
            when = f" (taken {taken})" if taken else ""
            out[target] = [_finding(None, NOT_IN_BASELINE_CODE,
                                    f"not in the baseline{when}: its facts were not compared",
                                    level="info", action="none")]
            continue
        out[target] = _capped(_against_baseline(facts, base), BASELINE_CODE, "the baseline")
    return out
