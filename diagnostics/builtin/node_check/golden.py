"""node-check's golden configuration: the facts every node of a fleet is expected to report,
written once from the fleet's majority (``mldiag baseline-init``), reviewed and kept in git,
then held against each node (hosts.yaml ``baseline: FILE``, or ``--baseline FILE``) and shown as
drift (``mldiag baseline-diff FILE``). NHC's ``nhc-genconf`` is the model: a generated file a
person reads, corrects and commits.

The file (YAML, written by ``render``, read back by ``load``)::

    schema: 1
    written: "2026-12-07T08:00:00+00:00"    # when, by which mldiag, from which nodes
    mldiag: "0.1.0"
    nodes: "h200-[a-c]"
    facts:                                   # the fleet's: a fact name -> its value
      driver: "590.48.01"
      gpu.gpu3.ecc_mode: "Enabled"
      # nvlink.gpu3.active: 18   # h200-[a-b]   (no majority: commented out for a person)
    groups:                                  # a hosts.yaml group whose majority differs
      h100:
        gpu.model: "NVIDIA H100 80GB HBM3"

A node is held to ``facts`` with the sections of its hosts.yaml groups over them (the first
section in the file that names a fact wins). Only the facts the file names are compared: a
fact it leaves out (commented out, or new since the file was written) is not judged, as an
NHC config checks only what it lists. The facts themselves are node-check's
(``result.data["facts"]``, see baseline.py); a result without facts (an ``error`` row) is left
out of the writing and of the judging.
"""

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

from ... import __version__
from ...core import nodeset
from ...core.errors import EXIT_ERROR, EXIT_FAIL, EXIT_OK, InputError
from ...core.outcome import Outcome
from ...core.results import Finding, Result
from ...views.render import safe_text
from ...inventory import yamlfile
from ...inventory.targets import did_you_mean
from ...inventory.yamlfile import At, LineMapping, items_at, show, unknown_key
from . import baseline as baseline_mod

SCHEMA = 1
MAX_FILE_BYTES = 8 * 1024 * 1024      # thousands of facts and groups are a few hundred KB
TOP_KEYS = ("schema", "written", "mldiag", "nodes", "facts", "groups")
SEEN_SHOWN = 300                       # characters of a comment naming values and nodes
_SCALARS = (str, int, float, bool, type(None))
# a key written plain (no quotes) in the file: what node-check's fact names look like, never a
# word YAML 1.1 reads as something else (yes, no, on, null, ~)
_PLAIN_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_./-]*")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}
_MISSING = object()


# ------------------------------------------------------------------ the fleet's majority

@dataclass(frozen=True)
class Entry:
    """One fact of a section: ``value`` the strict majority's (``_MISSING``: none, the fact is
    written commented out), ``seen`` every value with its nodes (most nodes first; ``_MISSING``
    for the nodes that lack the fact)."""
    key: str
    value: Any
    seen: Tuple[Tuple[Any, Tuple[str, ...]], ...]

    @property
    def decided(self) -> bool:
        return self.value is not _MISSING

    def odd(self) -> Tuple[Tuple[Any, Tuple[str, ...]], ...]:
        """The values (and nodes) other than the majority's."""
        return tuple((v, n) for v, n in self.seen if _vote(v) != _vote(self.value))


def _vote(value: Any) -> Any:
    return ("missing",) if value is _MISSING else baseline_mod._key(value)


def entries(nodes: Sequence[Tuple[str, Mapping[str, Any]]]) -> List[Entry]:
    """Per fact any node reports: the value a strict majority of ``nodes`` hold (a node
    without the fact votes "missing"); no majority, or a majority without it: not decided.
    One node is a majority of one (a known-good node, as nhc-genconf takes)."""
    keys = sorted({k for _, facts in nodes for k in facts}, key=baseline_mod._fact_order)
    out = []
    for key in keys:
        votes: Dict[Any, List[str]] = {}
        values: Dict[Any, Any] = {}
        for target, facts in nodes:
            value = facts.get(key, _MISSING)
            vote = _vote(value)
            votes.setdefault(vote, []).append(target)
            values.setdefault(vote, value)
        ranked = sorted(votes, key=lambda v: (-len(votes[v]), v == ("missing",), str(v)))
        seen = tuple((values[v], tuple(votes[v])) for v in ranked)
        top = ranked[0]
        decided = len(votes[top]) * 2 > len(nodes) and top != ("missing",)
        out.append(Entry(key, values[top] if decided else _MISSING, seen))
    return out


@dataclass(frozen=True)
class Section:
    """A hosts.yaml group's facts that differ from the fleet's (its nodes with facts), and the
    fleet's facts most of its nodes do not report (``absent``: not judged on them)."""
    name: str
    members: Tuple[str, ...]
    entries: Tuple[Entry, ...]
    absent: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """What ``render`` writes: the nodes (with facts) it came from, the ones left out (no
    facts: their error), the fleet's entries and the groups' sections."""
    nodes: Tuple[str, ...]
    left_out: Tuple[Tuple[str, str], ...]
    facts: Tuple[Entry, ...]
    groups: Tuple[Section, ...]


def plan(results: Sequence[Result], groups: Mapping[str, Sequence[str]] = {}) -> Plan:
    """The golden config of ``results``: the majority of every node with facts, then a section
    per group (of ``groups``, hosts.yaml's, in its order) with at least one of these nodes,
    not all of them, whose own majority differs from the fleet's on some fact (the value it
    decides, or undecided where the fleet decided one the group's nodes do not all hold)."""
    nodes = [(r.target, facts) for r in results
             for facts in [baseline_mod.facts_of(r)] if facts is not None]
    left = tuple((r.target, _why_left_out(r)) for r in results if baseline_mod.facts_of(r) is None)
    fleet = entries(nodes)
    by_key = {e.key: e for e in fleet}
    names = [t for t, _ in nodes]
    sections = []
    for group, members in groups.items():
        inside = [(t, f) for t, f in nodes if _owner(t) in members or t in members]
        if not inside or len(inside) == len(nodes):
            continue
        own, absent = [], []
        group_entries = entries(inside)
        for entry in group_entries:
            fleet_entry = by_key[entry.key]
            if entry.decided and fleet_entry.decided and _vote(entry.value) == _vote(fleet_entry.value):
                continue                   # the fleet's value: nothing of its own
            lacking = entry.seen[0][0] is _MISSING and len(entry.seen[0][1]) * 2 > len(inside)
            if lacking and fleet_entry.decided:
                absent.append(entry.key)   # most of the group's nodes do not report it
            elif entry.decided or fleet_entry.decided:
                own.append(entry)          # its own value, or the fleet's value not held here
        reported = {e.key for e in group_entries}
        absent += [e.key for e in fleet if e.decided and e.key not in reported]
        if own or absent:
            sections.append(Section(group, tuple(t for t, _ in inside), tuple(own),
                                    tuple(sorted(absent, key=baseline_mod._fact_order))))
    return Plan(tuple(names), left, tuple(fleet), tuple(sections))


def _owner(target: str) -> str:
    """A Slurm node row (``cluster-a:n3``) belongs to its login target's groups."""
    return target.split(":", 1)[0]


def _why_left_out(result: Result) -> str:
    if result.error is not None:
        return f"{result.error.layer}: {result.error.message}"[:200]
    return f"{result.status}: no facts" if result.status != "error" else "error"


# ------------------------------------------------------------------ writing the file

def yaml_value(value: Any) -> str:
    """A fact's value as YAML that reads back as the same type: text double-quoted (JSON's
    escapes are YAML's), numbers, true/false, null."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):    # wire.py lets none in; never written as YAML's .nan
            return json.dumps(str(value))
        return repr(value)
    return json.dumps(str(value))


def yaml_key(key: str) -> str:
    if _PLAIN_KEY.fullmatch(key) and key.lower() not in _YAML_WORDS and not key.startswith("x-"):
        return key
    return json.dumps(key)


def _nodes(names: Sequence[str]) -> str:
    return nodeset.fold(list(names))


def _seen_text(seen: Sequence[Tuple[Any, Sequence[str]]]) -> str:
    parts = [f"{'(missing)' if v is _MISSING else yaml_value(v)} on {_nodes(n)}" for v, n in seen]
    text = "; ".join(parts)
    return text if len(text) <= SEEN_SHOWN else text[:SEEN_SHOWN - 1] + "…"


def _entry_lines(entry: Entry, indent: str) -> List[str]:
    key = yaml_key(entry.key)
    if entry.decided:
        odd = entry.odd()
        note = f"   # differs: {_seen_text(odd)}" if odd else ""
        return [f"{indent}{key}: {yaml_value(entry.value)}{note}"]
    lines = [f"{indent}# UNDECIDED {key} (no value held by a strict majority): uncomment "
             f"one line, or none"]
    for value, names in entry.seen:
        if value is _MISSING:
            lines.append(f"{indent}#   (not reported by {_nodes(names)})")
        else:
            lines.append(f"{indent}# {key}: {yaml_value(value)}   # {_nodes(names)}")
    return lines


def _section_lines(items: Sequence[Entry], indent: str) -> List[str]:
    """Entries under a comment per family (``driver``..., ``gpu``, ``ib``, ``nvlink``...)."""
    lines: List[str] = []
    family = None
    for entry in items:
        head = yaml_key(entry.key.split(".", 1)[0]) if "." in entry.key else "node"
        if head != family:
            family = head
            lines.append(f"{indent}# -- {head}")
        lines.extend(_entry_lines(entry, indent))
    return lines


def render(p: Plan, *, written: str, hosts_file: Optional[str] = None,
           command: str = "mldiag baseline-init") -> str:
    """The golden file's text: a header saying when, from which nodes, by which mldiag and how
    to review it, then the facts and the groups' sections."""
    undecided = sum(1 for e in p.facts if not e.decided)
    undecided += sum(1 for s in p.groups for e in s.entries if not e.decided)
    lines = [
        "# mldiag golden configuration: the facts node-check expects of every node of this fleet.",
        f"# Written {written} by mldiag {__version__} (`{command}`) from node-check on",
        f"# {len(p.nodes)} node(s): {_nodes(p.nodes) or '(none)'}"
        + (f"; hosts file {safe_text(hosts_file)}" if hosts_file else "") + ".",
    ]
    for target, why in p.left_out:
        # NOTE: an error's words came from a target or a transport: one inert line (safe_text)
        lines.append(f"# Left out (no facts): {target}: {safe_text(why)}")
    lines += [
        "#",
        "# How to review it before you commit it:",
        "# - each fact holds the value a strict majority of those nodes reported; `# differs:`",
        "#   names the nodes that reported another (are they the broken ones, or the majority?)",
        f"# - {undecided} fact(s) had no majority: written commented out under UNDECIDED with",
        "#   each value and its nodes; uncomment the right line, or leave the fact out;",
        "# - a section under groups: holds a hosts.yaml group's own values where its nodes'",
        "#   majority differs from the fleet's (facts:), and the fleet's facts most of them do",
        "#   not report (absent:); a node is held to its groups' sections first;",
        "# - only the facts written here are compared: delete a line to stop judging that fact.",
        "# Then name this file in hosts.yaml (defaults: {baseline: FILE}, relative to it): node-check",
        "# judges each node against it, and `mldiag baseline-diff FILE` shows what drifted since.",
        "",
        f"schema: {SCHEMA}",
        f"written: {json.dumps(written)}",
        f"mldiag: {json.dumps(__version__)}",
        f"nodes: {json.dumps(_nodes(p.nodes))}",
        "",
        "facts:",
    ]
    lines += _section_lines(p.facts, "  ") or ["  {}"]
    if p.groups:
        lines += ["", "groups:"]
        for section in p.groups:
            lines.append(f"  {yaml_key(section.name)}:")
            lines.append(f"    # {len(section.members)} node(s) of group {section.name}: "
                         f"{_nodes(section.members)}")
            if section.entries:
                lines.append("    facts:")
                lines += _section_lines(section.entries, "      ")
            if section.absent:
                lines.append("    # the fleet's facts most of these nodes do not report: not "
                             "judged on them")
                lines.append("    absent:")
                lines += [f"      - {yaml_key(key)}" for key in section.absent]
    return "\n".join(lines) + "\n"


def write(path: str, text: str, *, force: bool = False) -> None:
    """``text`` to ``path`` the project's way (baseline.write_atomic: a fresh name renamed into
    place, a link at ``path`` replaced, never followed); an existing file only with ``force``
    (a reviewed file is not lost to a second run by mistake)."""
    if not force:
        refuse_existing(path)
    baseline_mod.write_atomic(path, "--out", lambda stream: stream.write(text))


def refuse_existing(path: str) -> None:
    if os.path.lexists(path):
        raise InputError("exists: a golden file is reviewed by hand; --force writes over it "
                         "(git shows what changed)", file=path, key="--out")


# ------------------------------------------------------------------ reading the file

@dataclass(frozen=True)
class Fact:
    value: Any
    written: Optional[str]     # a plain scalar as it was written (``cuda: 12.4``), else None
    line: int


@dataclass(frozen=True)
class Golden:
    """A golden file, checked: the fleet's facts and each group's section, in file order."""
    path: str
    written: Optional[str]
    facts: Dict[str, Fact] = field(default_factory=dict)
    groups: Dict[str, Dict[str, Fact]] = field(default_factory=dict)
    absent: Dict[str, Tuple[str, ...]] = field(default_factory=dict)
    group_lines: Dict[str, int] = field(default_factory=dict)

    def expected(self, groups: Sequence[str]) -> Dict[str, Tuple[Fact, str]]:
        """Every fact a node of ``groups`` (its hosts.yaml groups) is held to, with where it
        comes from (``facts`` or ``groups.NAME``): the first section in the file naming a fact
        wins over the fleet's value."""
        out = {key: (fact, "facts") for key, fact in self.facts.items()}
        taken = set()
        for name, section in self.groups.items():
            if name not in groups:
                continue
            for key, fact in section.items():
                if key not in taken:
                    out[key] = (fact, f"groups.{name}")
                    taken.add(key)
            for key in self.absent.get(name, ()):
                if key not in taken:
                    out.pop(key, None)
                    taken.add(key)
        return out


def looks_like_golden(path: str) -> bool:
    """A --baseline FILE that is YAML (not the JSON --save-baseline writes): its first
    character that is not blank or a comment line is not ``{``."""
    try:
        with open(path, "rb") as f:
            head = f.read(65536)
    except OSError:
        return False
    for line in head.splitlines():
        text = line.strip()
        if text and not text.startswith(b"#"):
            return not text.startswith(b"{")
    return True


def load(path: str, *, key: str = "baseline") -> Golden:
    """The golden file at ``path``, checked; InputError (exit 4) naming file, line and key."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=path, key=key) from None
    if len(raw) > MAX_FILE_BYTES:
        raise InputError(f"larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB: not a golden "
                         f"file", file=path, key=key)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", file=path,
                         line=raw.count(b"\n", 0, exc.start) + 1) from None
    return loads(text, path)


def loads(text: str, path: str) -> Golden:
    doc = yamlfile.parse(text, path, empty="empty file: not a golden file (mldiag baseline-init "
                                           "writes one)")
    top_at = At(path, getattr(doc, "line", 1))
    if not isinstance(doc, LineMapping):
        raise top_at.error(f"expected a mapping with schema and facts, got {show(doc)}")
    values: Dict[str, Any] = {}
    places: Dict[str, At] = {}
    for k, value, where in items_at(doc, top_at):
        if k not in TOP_KEYS:
            raise where.error(unknown_key(k, TOP_KEYS))
        values[k], places[k] = value, where
    if "schema" not in values:
        raise top_at.error("no schema: not a golden file (mldiag baseline-init writes one)")
    if values["schema"] != SCHEMA or isinstance(values["schema"], bool):
        raise places["schema"].error(f"expected {SCHEMA}, got {show(values['schema'])} (write "
                                     f"it again with mldiag baseline-init)")
    for k in ("written", "mldiag", "nodes"):
        if k in values and not isinstance(values[k], str):
            raise places[k].error(f"expected text, got {show(values[k])}")
    facts = _facts(values.get("facts"), places.get("facts", top_at.child("facts", top_at.line)))
    groups: Dict[str, Dict[str, Fact]] = {}
    absent: Dict[str, Tuple[str, ...]] = {}
    group_lines: Dict[str, int] = {}
    if values.get("groups") is not None:
        groups_at = places["groups"]
        if not isinstance(values["groups"], LineMapping):
            raise groups_at.error(f"expected a mapping of hosts.yaml group names, got "
                                  f"{show(values['groups'])}")
        for name, section, where in items_at(values["groups"], groups_at):
            yamlfile.expect_name(name, where)
            groups[name], absent[name] = _group(section, where)
            group_lines[name] = where.line
    return Golden(path, values.get("written"), facts, groups, absent, group_lines)


GROUP_KEYS = ("facts", "absent")


def _group(value: Any, at: At) -> Tuple[Dict[str, Fact], Tuple[str, ...]]:
    """A group's section: ``facts`` (its own values) and ``absent`` (fact names not judged)."""
    section = yamlfile.expect_mapping(value, at)
    facts: Dict[str, Fact] = {}
    absent: List[str] = []
    for k, item, where in items_at(section, at):
        if k not in GROUP_KEYS:
            raise where.error(unknown_key(k, GROUP_KEYS))
        if k == "facts":
            facts = _facts(item, where)
        elif item is not None:
            if not isinstance(item, yamlfile.LineSequence):
                raise where.error(f"expected a list of fact names, got {show(item)}")
            for i, (name, line) in enumerate(zip(item, item.item_lines)):
                if not isinstance(name, str) or not name:
                    raise where.item(i, line).error(f"expected a fact name, got {show(name)}")
                absent.append(name)
    return facts, tuple(absent)


def _facts(value: Any, at: At) -> Dict[str, Fact]:
    if value is None:
        return {}
    if not isinstance(value, LineMapping):
        raise at.error(f"expected a mapping of fact names to values, got {show(value)}")
    out = {}
    for key, fact, where in items_at(value, at):
        if not isinstance(key, str) or not key:
            raise where.error(f"expected a fact name (text), got {show(key)}")
        if not isinstance(fact, _SCALARS) or (isinstance(fact, float) and not math.isfinite(fact)):
            raise where.error(f"expected one value (text, a number, true/false or null), got "
                              f"{show(fact)}")
        out[key] = Fact(fact, value.written.get(key) if isinstance(fact, (int, float, bool))
                        else None, where.line)
    return out


def check_groups(golden: Golden, known: Mapping[str, Any], hosts_file: Optional[str]) -> None:
    """A section for a group hosts.yaml does not have would never apply: bad input."""
    for name in golden.groups:
        if name not in known:
            where = f" {hosts_file}" if hosts_file else ""
            raise InputError(f"not a group of the hosts file{where}"
                             f"{did_you_mean(name, list(known)) if known else ''}",
                             file=golden.path, line=golden.group_lines[name],
                             key=f"groups.{name}")


# ------------------------------------------------------------------ comparing

@dataclass(frozen=True)
class Drift:
    """One fact of one node that is not what the golden file says: ``now`` is ``None`` with
    ``missing`` when the node no longer reports it; ``source`` ``facts`` or ``groups.NAME``."""
    key: str
    golden: Any
    now: Any
    source: str
    missing: bool = False


def same(fact: Fact, value: Any) -> bool:
    """As a fact: baseline's equality, or a plain scalar written by hand whose spelling is the
    node's text (``cuda: 12.4`` holds a node reporting "12.4"; YAML read it as a number)."""
    if baseline_mod._same(fact.value, value):
        return True
    return fact.written is not None and isinstance(value, str) and fact.written == value


def drift(facts: Mapping[str, Any], expected: Mapping[str, Tuple[Fact, str]]) -> List[Drift]:
    """Every expected fact the node does not hold, in fact order (driver, cuda, ... first)."""
    out = []
    for key in sorted(expected, key=baseline_mod._fact_order):
        fact, source = expected[key]
        if key not in facts:
            out.append(Drift(key, fact.value, None, source, missing=True))
        elif not same(fact, facts[key]):
            out.append(Drift(key, fact.value, facts[key], source))
    return out


def drift_message(d: Drift) -> str:
    """``driver 550.54.15, golden 590.48.01`` (the group's section named where it decided)."""
    now = "missing" if d.missing else baseline_mod._show(d.now)
    want = baseline_mod._show(d.golden)
    if not d.missing and now == want:
        now, want = json.dumps(d.now)[:baseline_mod.VALUE_SHOWN], json.dumps(d.golden)[:baseline_mod.VALUE_SHOWN]
    source = "" if d.source == "facts" else f" ({d.source})"
    return f"{baseline_mod._named(d.key, now)}, golden{source} {want}"


# ------------------------------------------------------------------ node-check's judgement

Deviations = Callable[[List[Result]], Dict[str, List[Finding]]]


def judgement(path: Optional[str], hosts: Any = None) -> Deviations:
    """node-check's fleet judgement, its files read now (bad input before anything connects):
    ``--baseline FILE`` (``path``: the JSON --save-baseline writes, or a golden file) for every
    node; else each node whose hosts.yaml target names a golden file (``baseline:``) against
    it, and the others against their majority (baseline.deviations). ``hosts``: the run's
    Topology, for the targets' golden files and groups (None, as in a runbook step: no
    hosts.yaml golden file, and a golden file's group sections apply to no node)."""
    known_groups = dict(hosts.groups) if hosts is not None else {}
    if path and not looks_like_golden(path):
        saved = baseline_mod.load(path)
        return lambda results: baseline_mod.deviations(results, saved)
    if path:
        given = load(path, key="--baseline")
        if hosts is not None:
            check_groups(given, known_groups, hosts.path)
        return lambda results: _judged(results, lambda name: given, known_groups)
    loaded: Dict[str, Golden] = {}
    for target in (hosts.targets.values() if hosts is not None else ()):
        if target.baseline and target.baseline not in loaded:
            loaded[target.baseline] = load(target.baseline, key=f"baseline (named in {hosts.path})")
            check_groups(loaded[target.baseline], known_groups, hosts.path)
    if not loaded:
        return lambda results: baseline_mod.deviations(results, None)

    def golden_of(name: str) -> Optional[Golden]:
        target = hosts.targets.get(name) or hosts.targets.get(_owner(name))
        return loaded.get(target.baseline) if target is not None and target.baseline else None
    return lambda results: _judged(results, golden_of, known_groups)


def groups_of(name: str, groups: Mapping[str, Sequence[str]]) -> List[str]:
    return [g for g, members in groups.items() if name in members or _owner(name) in members]


def _judged(results: List[Result], golden_of: Callable[[str], Optional[Golden]],
            groups: Mapping[str, Sequence[str]]) -> Dict[str, List[Finding]]:
    """Each node with a golden file: one finding per fact that drifted (baseline-deviation,
    warn, monitor; at most 20, then one more naming the rest); the rest by their majority."""
    held = [r for r in results if golden_of(r.target) is not None]
    others = [r for r in results if golden_of(r.target) is None]
    out = baseline_mod.deviations(others, None)
    for result in held:
        facts = baseline_mod.facts_of(result)
        if facts is None:
            continue
        golden = golden_of(result.target)
        found = [(d.key, drift_message(d))
                 for d in drift(facts, golden.expected(groups_of(result.target, groups)))]
        out[result.target] = baseline_mod._capped(found, baseline_mod.BASELINE_CODE,
                                                  f"the golden file {golden.path}")
    return out


# ------------------------------------------------------------------ the commands

NODE_CHECK_VALUES = {"no-dcgm": True}    # dcgmi diag reports no facts: minutes saved


def _node_check(opts: Any, results_dir: Optional[str] = None) -> List[Result]:
    """node-check on the selected targets, the results only (the table is not shown; the live
    progress is, on a terminal); with ``results_dir``, the results a node-check ``--save DIR``
    kept there instead (nothing runs)."""
    if results_dir is not None:
        if opts.host or opts.group:
            raise InputError("--results DIR: its results are the targets; -H/-g select nothing "
                             "there (give one or the other)")
        return saved_results(results_dir)
    import io
    from dataclasses import replace
    from ...engine import execute as engine, jobs
    quiet = replace(opts, json=False, jsonl=False, junit=None, diff=False)
    outcome = engine.execute(quiet, jobs.job_source("node-check", NODE_CHECK_VALUES),
                             out=io.StringIO())
    return outcome.results


def saved_results(directory: str) -> List[Result]:
    """Every node-check result a ``--save DIR`` holds (one ``TARGET.json`` each; summary.json
    and dot files left out), each read as a target's answer is (``wire.decode_result``: bounded,
    checked against the result schema): a file that is not one is bad input naming it."""
    from ...core import wire

    def bad(message: str, path: str = directory) -> InputError:
        return InputError(message, file=path, key="--results")
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise bad(f"cannot read: {exc.strerror or exc}") from None
    out = []
    for name in names:
        if not name.endswith(".json") or name == "summary.json" or name.startswith("."):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                raw = f.read(wire.MAX_RESULT_BYTES + 1)
        except OSError as exc:
            raise bad(f"cannot read: {exc.strerror or exc}", path) from None
        try:
            result = Result.from_dict(wire.decode_result(raw))
        except wire.ProtocolError as exc:
            raise bad(f"not a result mldiag saved: {exc}", path) from None
        if result.diagnostic != "node-check":
            raise bad(f"a {safe_text(result.diagnostic)} result, not node-check's", path)
        out.append(result)
    if not out:
        raise bad("no node-check result in it (node-check --save DIR keeps one TARGET.json per "
                  "target)")
    return out


def init(opts: Any, out_path: str, *, force: bool = False, results_dir: Optional[str] = None,
         out: Optional[TextIO] = None) -> Outcome:
    """``mldiag baseline-init --out FILE``: node-check on the selected targets, their majority
    written to FILE (with hosts.yaml's groups' sections). Exit 0 written; 3 when no node
    reported facts (nothing written); 4 for bad input (FILE exists without --force)."""
    import datetime
    import sys
    from ...inventory import topology
    out = out or sys.stdout
    if not out_path:
        raise InputError("--out: expected a file name for the golden file")
    if not force:             # before anything connects
        refuse_existing(out_path)
    hosts = topology.load(opts.hosts_file)
    results = _node_check(opts, results_dir)
    p = plan(results, hosts.groups)
    if not p.nodes:
        return Outcome(results, EXIT_ERROR, tuple(f"{t}: {why}" for t, why in p.left_out)
                       + (f"--out {out_path}: not written: no node reported facts",))
    written = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    hosts_file = os.path.abspath(hosts.path) if hosts.path else None
    command = "mldiag baseline-init" + (f" --results {results_dir}" if results_dir else "")
    write(out_path, render(p, written=written, hosts_file=hosts_file, command=safe_text(command)),
          force=force)
    undecided = [e.key for e in p.facts if not e.decided]
    out.write(f"wrote {out_path}: {sum(1 for e in p.facts if e.decided)} facts from "
              f"{len(p.nodes)} node(s) ({_nodes(p.nodes)})"
              + (f", {len(undecided)} undecided (commented out)" if undecided else "")
              + (f", sections for {', '.join(s.name for s in p.groups)}" if p.groups else "")
              + "\n")
    for target, why in p.left_out:
        out.write(f"left out: {safe_text(target)}: {safe_text(why)}\n")
    out.write(f"review it, commit it, and name it in hosts.yaml: baseline: {out_path}\n")
    out.flush()
    return Outcome(results, EXIT_OK if not p.left_out else EXIT_ERROR,
                   ("some targets were left out (no facts)",) if p.left_out else ())


@dataclass(frozen=True)
class NodeDrift:
    """What ``baseline-diff`` says of one node: its drift, or why it could not be compared."""
    target: str
    drift: Tuple[Drift, ...] = ()
    error: Optional[str] = None


def diff_nodes(results: Sequence[Result], golden: Golden,
               groups: Mapping[str, Sequence[str]]) -> List[NodeDrift]:
    out = []
    for result in results:
        facts = baseline_mod.facts_of(result)
        if facts is None:
            out.append(NodeDrift(result.target, error=_why_left_out(result)))
            continue
        expected = golden.expected(groups_of(result.target, groups))
        out.append(NodeDrift(result.target, tuple(drift(facts, expected))))
    return out


def diff_exit_code(nodes: Sequence[NodeDrift]) -> int:
    """node-check's order: a node not compared (error) 3, drift 2 (fail), else 0."""
    if any(n.error for n in nodes):
        return EXIT_ERROR
    return EXIT_FAIL if any(n.drift for n in nodes) else EXIT_OK


def _shown(value: Any, missing: bool = False) -> str:
    return "(missing)" if missing else safe_text(baseline_mod._show(value))


def render_diff(nodes: Sequence[NodeDrift], golden: Golden, out: TextIO) -> None:
    """One row per node and drifted fact (GOLDEN: the file's value, FROM: its section), then
    the nodes without drift folded, then those not compared."""
    rows = [(n.target, safe_text(d.key), _shown(d.golden), _shown(d.now, d.missing), d.source)
            for n in nodes for d in n.drift]
    when = f" (written {golden.written})" if golden.written else ""
    out.write(f"golden file: {golden.path}{when}\n")
    if rows:
        head = ("TARGET", "FACT", "GOLDEN", "NOW", "FROM")
        widths = [max(len(r[i]) for r in rows + [head]) for i in range(4)]
        for row in [head] + rows:
            out.write("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[4] + "\n")
    same_nodes = [n.target for n in nodes if not n.drift and not n.error]
    if same_nodes:
        out.write(f"no drift: {_nodes(same_nodes)}\n")
    for n in nodes:
        if n.error:
            out.write(f"not compared: {safe_text(n.target)}: {safe_text(n.error)}\n")
    out.flush()


def diff_json(nodes: Sequence[NodeDrift], golden: Golden) -> List[Dict[str, Any]]:
    return [{"target": n.target, "golden_file": golden.path,
             "status": "error" if n.error else ("drift" if n.drift else "same"),
             "error": n.error,
             "drift": [{"fact": d.key, "golden": d.golden, "now": None if d.missing else d.now,
                        "missing": d.missing, "from": d.source} for d in n.drift]}
            for n in nodes]


def diff(opts: Any, path: str, *, results_dir: Optional[str] = None,
         out: Optional[TextIO] = None) -> Outcome:
    """``mldiag baseline-diff FILE``: node-check on the selected targets, each node's facts
    against the golden file (its groups' sections first): per node, per fact, golden and now.
    Exit 2 when a fact drifted, 3 when a node could not be compared, else 0."""
    import sys
    from ...inventory import topology
    out = out or sys.stdout
    if not path:
        raise InputError("expected the golden file: mldiag baseline-diff FILE")
    golden = load(path, key="golden file")
    hosts = topology.load(opts.hosts_file)
    check_groups(golden, hosts.groups, hosts.path)
    results = _node_check(opts, results_dir)
    nodes = diff_nodes(results, golden, hosts.groups)
    if opts.json:
        json.dump(diff_json(nodes, golden), out, indent=2, default=str)
        out.write("\n")
        out.flush()
    else:
        render_diff(nodes, golden, out)
    return Outcome(results, diff_exit_code(nodes))
