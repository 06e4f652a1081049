"""stacks' reading of PyTorch flight-recorder dumps on the client: the
per-rank summaries scripts/flight_recorder.py brought back from every target -- the dump files
the job wrote, and the recorders asked of running ranks through torch's worker server (``live``:
the state now, newest by construction) -- merged by rank, judged per process group.

    flight recorder: 4 dumps, ranks 0-3 on trainbox, format 2.10
      pg 0 (default_pg): ranks 0-2 at #2 all_reduce; rank 3 at #1 all_reduce   ← diverge at #2

The core signal is ``pg_status[pg].last_enqueued_collective`` of every rank: the collective
sequence number each rank has reached in that group. Ranks that enqueued fewer collectives than
the others never called the one the others wait in: ``fail fr-ranks-diverge`` names them and
the collective (``ranks 0-2 enqueued all_reduce #2, rank 3 is at #1``). The group's members come
from ``pg_config`` (its ``ranks``), else ``world_size`` for the default group: a member
without any dump is ``warn fr-missing-dumps``. All alike: ``info fr-agree``. Unreadable files
(the target's per-file errors, or a summary that is not what flight_recorder.py writes):
``warn fr-bad-dump``; the same rank dumped twice (the newest is used): ``warn
fr-duplicate-rank``; dumps written far apart in time (an earlier run's left-overs):
``warn fr-stale-dumps``. No dump anywhere: no finding, no line.

gloo's dumps: ``pg_config`` has one key ``''`` (gloo records no group name; torchfrtrace fails on
it with ``KeyError: ('0', 3)``); ``pg_status`` is keyed by pg id (``'0'``) and the entries name
the group ``('0', 'default_pg')``. A ``''`` entry is taken as the default group's members when
it holds every rank that has a status for that group (the 1-process world writes ``'[]'``).

Everything here came from a target: types checked, lengths bounded, names shown through
``render.safe_text``; garbage is a finding, never an exception.
"""

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from ...views.render import safe_text

MAX_TARGETS = 4096
MAX_DUMPS = 16384          # dumps looked at, all targets together
MAX_GROUPS_PER_DUMP = 64
MAX_RANGES = 256           # pg_config ranks ranges read per group
MAX_RANK = 10 ** 7
MAX_MEMBERS = 1 << 17      # ranks of one group (the largest jobs: ~100k ranks)
MAX_EXPANDED = 1 << 21     # ranks expanded from pg_config in one analysis, all groups together
MAX_DISTINCT_CONFIGS = 1024
MAX_GROUPS_TOTAL = 256     # distinct process groups judged (the rest counted in a line)
MAX_TEXT = 120
MAX_FINDINGS = 20          # fr-ranks-diverge findings, one per group; the rest in one
MAX_LINES = 12
MAX_EXAMPLES = 3           # files named in fr-bad-dump / fr-duplicate-rank
STALE_SPREAD_S = 15 * 60   # dumps further apart than this: some are from an earlier run
DEFAULT_GROUP = "0"        # the default group's name and id in every dump


@dataclass
class Status:
    enqueued: Optional[int]
    started: Optional[int]
    completed: Optional[int]
    desc: Optional[str]
    ops: Dict[int, str] = field(default_factory=dict)     # collective seq -> op, recent ones


@dataclass
class RankDump:
    target: str
    rank: int
    file: str
    mtime: Optional[float]
    version: Optional[str]
    groups: Dict[str, Status]                               # by group key (its name)
    config: Dict[str, Tuple[Optional[str], Optional[FrozenSet[int]]]]   # key -> (desc, ranks)
    live: bool = False                                      # asked of the running rank, no file


@dataclass
class Divergence:
    """One process group whose ranks are not all at the same collective."""
    group: str
    desc: Optional[str]
    seq: int                                                # the first collective not everywhere
    op: Optional[str]
    ahead: Dict[int, int]                                   # rank -> last enqueued, the leaders
    behind: Dict[int, Optional[int]]                        # rank -> last enqueued (None: no record)


def _text(value: Any, limit: int = MAX_TEXT) -> Optional[str]:
    if isinstance(value, str):
        return safe_text(value[:limit])
    return None


def _int(value: Any) -> Optional[int]:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if abs(value) < 2 ** 63 else None


def _float(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def ranks_text(ranks: Iterable[int]) -> str:
    """``0-2,5,7-8``."""
    out: List[List[int]] = []
    for r in sorted(set(ranks)):
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in out]
    if len(parts) > 12:
        parts = parts[:12] + [f"… {len(parts) - 12} more ranges"]
    return ",".join(parts)


def _ranks_word(ranks: Iterable[int]) -> str:
    ranks = set(ranks)
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {ranks_text(ranks)}"


def _op(name: Optional[str]) -> Optional[str]:
    """``gloo:all_reduce`` / ``nccl:all_reduce`` → ``all_reduce``."""
    if not name:
        return None
    return name.split(":", 1)[1] if ":" in name and name.split(":", 1)[1] else name


class _Ranks:
    """pg_config ranks as sets, each distinct list expanded once (every rank sends the same),
    within a budget for the whole analysis (garbage from many targets stays cheap)."""

    def __init__(self) -> None:
        self.seen: Dict[Tuple[Tuple[int, int], ...], Optional[FrozenSet[int]]] = {}
        self.budget = MAX_EXPANDED

    def __call__(self, raw: Any) -> Optional[FrozenSet[int]]:
        """flight_recorder.py's ``[[first, last], ...]``; None when absent, malformed, empty
        or too large."""
        if not isinstance(raw, list) or not raw:
            return None
        pairs = []
        for pair in raw[:MAX_RANGES]:
            if not isinstance(pair, list) or len(pair) != 2:
                return None
            a, b = _int(pair[0]), _int(pair[1])
            if a is None or b is None or not 0 <= a <= b < MAX_RANK:
                return None
            pairs.append((a, b))
        key = tuple(pairs)
        if key not in self.seen:
            size = sum(b - a + 1 for a, b in pairs)
            if size > MAX_MEMBERS or size > self.budget or len(self.seen) >= MAX_DISTINCT_CONFIGS:
                return None
            self.budget -= size
            self.seen[key] = frozenset(r for a, b in pairs for r in range(a, b + 1))
        return self.seen[key]


def _status(raw: Any) -> Optional[Status]:
    if not isinstance(raw, dict):
        return None
    ops: Dict[int, str] = {}
    recent = raw.get("recent_ops")
    if isinstance(recent, list):
        for pair in recent[:32]:
            if isinstance(pair, list) and len(pair) == 2 and _int(pair[0]) is not None:
                op = _op(_text(pair[1], 60))
                if op:
                    ops[pair[0]] = op
    return Status(_int(raw.get("last_enqueued_collective")), _int(raw.get("last_started_collective")),
                  _int(raw.get("last_completed_collective")), _text(raw.get("desc"), 60), ops)


def _dump(target: str, raw: Any, ranks: _Ranks) -> Tuple[Optional[RankDump], Optional[str]]:
    """(RankDump, None), or (None, why) for a per-file error or a malformed summary."""
    if not isinstance(raw, dict):
        return None, "not a dump summary"
    name = _text(raw.get("file"), 300) or "?"
    if raw.get("error") is not None:
        return None, f"{name}: {_text(raw.get('error'), 200) or 'unreadable'}"
    rank = _int(raw.get("rank"))
    if rank is None or not 0 <= rank < MAX_RANK:
        return None, f"{name}: no rank"
    status, config = raw.get("pg_status"), raw.get("pg_config")
    if not isinstance(status, dict) or not isinstance(config, dict):
        return None, f"{name}: malformed summary (no pg_status/pg_config)"
    groups: Dict[str, Status] = {}
    for pg_id, item in list(status.items())[:MAX_GROUPS_PER_DUMP]:
        parsed = _status(item)
        if parsed is None or not isinstance(pg_id, str):
            continue
        # the group's name (as pg_config and other ranks know it) when the entries said it;
        # a pg id is this process's own counter, a name is the same on every member
        group_name = _text(item.get("name"), 80) if isinstance(item, dict) else None
        key = group_name or _text(pg_id, 20) or "?"
        groups[key] = parsed
    cfg: Dict[str, Tuple[Optional[str], Optional[FrozenSet[int]]]] = {}
    for key, item in list(config.items())[:MAX_GROUPS_PER_DUMP]:
        if isinstance(key, str) and isinstance(item, dict):
            cfg[_text(key, 80) or ""] = (_text(item.get("desc"), 60), ranks(item.get("ranks")))
    return RankDump(target, rank, name, _float(raw.get("mtime")), _text(raw.get("version"), 20),
                    groups, cfg, raw.get("live") is True), None


def merge(per_target: Any) -> Tuple[Dict[int, RankDump], List[str], List[str]]:
    """({rank: its newest dump}, errors "target:file: why", duplicates "rank N: file, file")."""
    errors: List[str] = []
    by_rank: Dict[int, List[RankDump]] = {}
    seen = 0
    ranks = _Ranks()
    pairs = per_target if isinstance(per_target, (list, tuple)) else []
    for pair in pairs[:MAX_TARGETS]:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            errors.append("?: not a (target, result) pair")
            continue
        target = _text(pair[0], 80) or "?"
        collected = pair[1]
        if collected is None:
            continue
        dumps = collected.get("dumps") if isinstance(collected, dict) else None
        if not isinstance(dumps, list):
            errors.append(f"{target}: no dump list in the result")
            continue
        for raw in dumps:
            seen += 1
            if seen > MAX_DUMPS:
                break
            dump, why = _dump(target, raw, ranks)
            if dump is None:
                errors.append(f"{target}:{why}")
            else:
                by_rank.setdefault(dump.rank, []).append(dump)
    newest: Dict[int, RankDump] = {}
    duplicates: List[str] = []
    for rank, dumps in sorted(by_rank.items()):
        dumps.sort(key=lambda d: d.mtime if d.mtime is not None else -math.inf, reverse=True)
        newest[rank] = dumps[0]
        if len(dumps) > 1:
            duplicates.append(f"rank {rank}: "
                              + ", ".join(f"{d.target}:{d.file}" for d in dumps[:MAX_EXAMPLES]))
    return newest, errors, duplicates


def _members(key: str, dumps: Dict[int, RankDump], with_status: FrozenSet[int],
             world_size: Optional[int]) -> Tuple[Optional[FrozenSet[int]], Optional[str]]:
    """(the group's ranks, where from): pg_config (the most common answer among the dumps;
    gloo's '' key taken for the default group), else the world size for the default group,
    else (None, None). An answer that leaves out a rank that has the group is not believed."""
    default = key == DEFAULT_GROUP
    votes: Counter = Counter()
    for dump in dumps.values():
        for cfg_key in ([key, ""] if default else [key]):
            ranks = dump.config.get(cfg_key, (None, None))[1]
            if ranks is not None and with_status <= ranks:
                votes[ranks] += 1
                break
    if votes:
        return votes.most_common(1)[0][0], "pg_config"
    if default and world_size is not None and 0 < world_size <= MAX_MEMBERS:
        members = frozenset(range(world_size))
        if with_status <= members:
            return members, "the job's world size"
    return None, None


@dataclass
class Groups:
    """The process groups of the merged dumps."""
    diverged: List[Divergence]
    members: Dict[str, FrozenSet[int]]                      # where known
    source: Dict[str, str]                                  # where the members came from
    statuses: List[Tuple[str, Dict[int, Status]]]           # every group's, by rank
    left_out: int = 0                                       # groups past MAX_GROUPS_TOTAL


def _group_order(key: str) -> Tuple[bool, bool, int, str]:
    """The default group first, then numbered groups by number, then named ones."""
    number = re.fullmatch(r"[0-9]{1,9}", key) is not None
    return (key != DEFAULT_GROUP, not number, int(key) if number else 0, key)


def divergences(dumps: Dict[int, RankDump], world_size: Optional[int] = None) -> Groups:
    """Every group's ranks by their last enqueued collective; the divergent groups."""
    keys: Dict[str, None] = {}
    for dump in dumps.values():
        for key in dump.groups:
            keys.setdefault(key, None)
    out = Groups([], {}, {}, [], max(0, len(keys) - MAX_GROUPS_TOTAL))
    for key in sorted(keys, key=_group_order)[:MAX_GROUPS_TOTAL]:
        statuses = {r: d.groups[key] for r, d in dumps.items() if key in d.groups}
        known, source = _members(key, dumps, frozenset(statuses), world_size)
        if known is not None:
            out.members[key], out.source[key] = known, source
        out.statuses.append((key, statuses))
        seqs = {r: s.enqueued for r, s in statuses.items() if s.enqueued is not None}
        if not seqs:
            continue
        top = max(seqs.values())
        behind: Dict[int, Optional[int]] = {r: q for r, q in seqs.items() if q < top}
        # a member with a dump but no record of the group never created it / reached it
        for rank in sorted((known or frozenset()) & frozenset(dumps)):
            if rank not in statuses:
                behind[rank] = None
        if not behind:
            continue
        seq = min((q for q in behind.values() if q is not None), default=0) + 1
        ahead = {r: q for r, q in seqs.items() if q == top}
        op = next((statuses[r].ops[seq] for r in ahead if seq in statuses[r].ops), None)
        if op is None:
            op = next((statuses[r].ops[seq] for r in seqs if seq in statuses[r].ops), None)
        desc = next((s.desc for s in statuses.values() if s.desc), None)
        out.diverged.append(Divergence(key, desc, seq, op, ahead, behind))
    return out


def _group_name(key: str, desc: Optional[str]) -> str:
    return f"pg {key} ({desc})" if desc and desc != key else f"pg {key}"


def _where(ranks: Iterable[int], dumps: Dict[int, RankDump]) -> str:
    targets = list(dict.fromkeys(dumps[r].target for r in sorted(ranks) if r in dumps))
    if not targets:
        return ""
    shown = ",".join(targets[:4]) + (f",… {len(targets) - 4} more" if len(targets) > 4 else "")
    return f" (on {shown})"


def _at(seq: Optional[int], ops: Dict[int, str]) -> str:
    if seq is None:
        return "has no record of the group"
    op = ops.get(seq)
    return f"is at #{seq}" + (f" ({op})" if op else "")


def _diverge_message(d: Divergence, dumps: Dict[int, RankDump]) -> str:
    top = max(d.ahead.values())
    what = f"{d.op} #{top}" if d.op and d.seq == top else (f"up to #{top}")
    lead = f"{_ranks_word(d.ahead)} enqueued {what}"
    by_seq: Dict[Optional[int], List[int]] = {}
    for rank, seq in d.behind.items():
        by_seq.setdefault(seq, []).append(rank)
    parts = []
    for seq in sorted(by_seq, key=lambda s: -1 if s is None else s, reverse=True)[:6]:
        ranks = by_seq[seq]
        ops = next((dumps[r].groups[d.group].ops for r in ranks if d.group in dumps[r].groups), {})
        parts.append(f"{_ranks_word(ranks)}{_where(ranks, dumps)} {_at(seq, ops)}")
    if len(by_seq) > 6:
        parts.append(f"… {len(by_seq) - 6} more positions")
    first = f"collective #{d.seq}" + (f" ({d.op})" if d.op else "")
    return (f"flight recorder: {_group_name(d.group, d.desc)} diverges at {first}: "
            f"{lead}, {'; '.join(parts)}")


def analyse(per_target: Sequence[Tuple[str, Any]], world_size: Optional[int] = None
            ) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(findings, lines) for every target's ``flight_recorder.collect`` result; see the module
    docstring. ``world_size``: the job's, when known otherwise (WORLD_SIZE of its processes),
    for the default group when no pg_config says its members."""
    try:
        return _analyse(per_target, world_size)
    except Exception as exc:  # noqa: BLE001 -- a bug here must not cost the rest of the report
        return ([{"level": "warn", "code": "fr-bad-dump", "action": "none",
                  "message": f"flight recorder: the dumps could not be analysed ({type(exc).__name__})"}],
                [])


def _analyse(per_target, world_size):
    dumps, errors, duplicates = merge(per_target)
    world_size = _int(world_size)
    findings: List[Dict[str, Any]] = []
    if not dumps and not errors:
        return [], []
    groups = divergences(dumps, world_size)
    found, members, table = groups.diverged, groups.members, groups.statuses

    for d in found[:MAX_FINDINGS]:
        findings.append({"level": "fail", "code": "fr-ranks-diverge", "action": "none",
                         "message": _diverge_message(d, dumps),
                         "hint": "the ranks behind never called the collective the others wait "
                                 "in: their stacks show where they are instead",
                         # where the finding belongs: the targets of the ranks behind
                         "targets": list(dict.fromkeys(dumps[r].target for r in d.behind if r in dumps))})
    if len(found) > MAX_FINDINGS:
        rest = found[MAX_FINDINGS:]
        findings.append({"level": "fail", "code": "fr-ranks-diverge", "action": "none",
                         "message": f"flight recorder: … {len(rest)} more process groups diverge "
                                    f"({', '.join(d.group for d in rest[:5])}…)"})

    expected = frozenset().union(*members.values()) if members else frozenset()
    if not expected and world_size is not None and 0 < world_size <= MAX_MEMBERS:
        expected = frozenset(range(world_size))
    missing = expected - frozenset(dumps)
    if missing:
        sources = sorted({groups.source[k] for k, ranks in members.items() if ranks - frozenset(dumps)})
        source = " and ".join(sources) or "the job's world size"
        findings.append({"level": "warn", "code": "fr-missing-dumps", "action": "none",
                         "message": f"flight recorder: no dump from {_ranks_word(missing)} "
                                    f"({len(dumps)} of {len(expected)} ranks dumped; members from {source})",
                         "hint": "a rank dumps on its own timeout (NCCL: TORCH_NCCL_DUMP_ON_TIMEOUT); "
                                 "one that died, hung elsewhere or runs on a target not asked has "
                                 "none: look at its stack, and at TORCH_FR_DUMP_TEMP_FILE on its node; "
                                 "a job that runs torch's worker server is asked for every rank's, "
                                 "live (worker_main with TORCH_WORKER_SERVER_SOCKET, or "
                                 "torch.distributed.debug.start_debug_server)"})
    if duplicates:
        findings.append({"level": "warn", "code": "fr-duplicate-rank", "action": "none",
                         "message": f"flight recorder: {len(duplicates)} ranks dumped more than once "
                                    f"(the newest used): {'; '.join(duplicates[:MAX_EXAMPLES])}"})
    times = [d.mtime for d in dumps.values() if d.mtime is not None]
    if len(times) > 1 and max(times) - min(times) > STALE_SPREAD_S:
        old = [r for r, d in dumps.items() if d.mtime is not None and max(times) - d.mtime > STALE_SPREAD_S]
        findings.append({"level": "warn", "code": "fr-stale-dumps", "action": "none",
                         "message": f"flight recorder: the dumps were written "
                                    f"{(max(times) - min(times)) / 60:.0f} min apart; "
                                    f"{_ranks_word(old)} may be from an earlier run",
                         "hint": "remove old dumps (or give each run its own TORCH_FR_DUMP_TEMP_FILE)"})
    if errors:
        findings.append({"level": "warn", "code": "fr-bad-dump", "action": "none",
                         "message": f"flight recorder: {len(errors)} dump(s) not read: "
                                    + "; ".join(errors[:MAX_EXAMPLES])
                                    + (f"; … {len(errors) - MAX_EXAMPLES} more"
                                       if len(errors) > MAX_EXAMPLES else "")})
    if dumps and not found:
        heads = []
        for key, statuses in table[:3]:
            seqs = {s.enqueued for s in statuses.values() if s.enqueued is not None}
            if len(seqs) == 1:
                seq = seqs.pop()
                op = next((s.ops[seq] for s in statuses.values() if seq in s.ops), None)
                pending = [r for r, s in statuses.items() if s.completed is not None and s.completed < seq]
                heads.append(f"{_group_name(key, next((s.desc for s in statuses.values() if s.desc), None))} "
                             f"at #{seq}" + (f" ({op})" if op else "")
                             + (f", not completed on {_ranks_word(pending)}" if pending else ""))
        findings.append({"level": "info", "code": "fr-agree", "action": "none",
                         "message": f"flight recorder: all {len(dumps)} dumped ranks at the same "
                                    f"collective in "
                                    + ("their process group" if len(table) == 1 else
                                       f"each of {len(table)} process groups")
                                    + (": " + "; ".join(heads) if heads else "")})
    return findings, _lines(dumps, groups, missing, errors)


def _lines(dumps, groups, missing, errors) -> List[str]:
    table, found = groups.statuses, groups.diverged
    if not dumps and not errors:
        return []
    versions = sorted({d.version for d in dumps.values() if d.version})
    targets = list(dict.fromkeys(d.target for d in dumps.values()))
    where = " on " + ",".join(targets[:4]) + (f",… {len(targets) - 4} more" if len(targets) > 4 else "")
    live = sum(1 for d in dumps.values() if d.live)
    out = [f"flight recorder: {len(dumps)} dumps"
           + (f" ({live} asked of the running ranks)" if live else "")
           + (f", {_ranks_word(dumps)}{where}" if dumps else "")
           + (f", format {','.join(versions[:3])}" if versions else "")]
    diverged = {d.group: d for d in found}
    for n, (key, statuses) in enumerate(table):
        if len(out) >= MAX_LINES - 2:
            out.append(f"  … {len(table) - n} more process groups: --json has every dump")
            break
        by_seq: Dict[Optional[int], List[int]] = {}
        for rank, status in statuses.items():
            by_seq.setdefault(status.enqueued, []).append(rank)
        d = diverged.get(key)
        if d is not None:
            for rank, seq in d.behind.items():
                if seq is None:
                    by_seq.setdefault(None, []).append(rank)
        parts = []
        for seq in sorted(by_seq, key=lambda s: -1 if s is None else s, reverse=True)[:4]:
            ranks = by_seq[seq]
            ops = next((statuses[r].ops for r in ranks if r in statuses), {})
            at = "no record" if seq is None else f"#{seq}" + (f" {ops[seq]}" if seq in ops else "")
            parts.append(f"{_ranks_word(ranks)} at {at}")
        desc = next((s.desc for s in statuses.values() if s.desc), None)
        mark = f"   ← diverge at #{d.seq}" if d is not None else ""
        out.append(f"  {_group_name(key, desc)}: {'; '.join(parts)}{mark}")
    if groups.left_out:
        out.append(f"  … {groups.left_out} more process groups not judged")
    if missing:
        out.append(f"  no dump: {_ranks_word(missing)}")
    if errors:
        out.append(f"  not read: {errors[0]}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))
    return out
