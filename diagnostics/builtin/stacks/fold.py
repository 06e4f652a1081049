"""stacks' judgement on the client: every rank's main-thread Python stack,
identical stacks folded into one group across targets and ranks, the minority named.

    3/4 ranks (trainbox:[0-2])  all_reduce (torch/distributed/distributed_c10d.py) ← sync (train.py:14) ← main (train.py:25)
    1/4 ranks (trainbox:3)      wait_for_data (train.py:10) ← main (train.py:24)   ← the odd one out

Input: one ``RankStack`` per process, its threads as ``py-spy dump --json`` gives them (a list
of ``{"thread_name", "frames": [{"name", "filename", "short_filename", "line"}, ...]}``,
innermost frame first). Everything in it came from a target: names and files are bounded and
shown through ``render.safe_text`` by whoever prints them; a malformed dump is a process
without a stack (its own group), never an exception.

The judgement (``judge``): all ranks alike → info ``stacks-agree``. Otherwise the largest group
is the majority when it is strictly larger than each other group; the others are the odd ones
out: ``fail`` when the majority waits in a collective (a frame of ``torch.distributed`` named
like a collective or a wait) — the classic hang: everyone waits for the rank that is elsewhere —
and ``warn`` otherwise. No strict majority: ``warn stacks-split``.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from ...core import nodeset

# torch.distributed's blocking entry points (distributed_c10d.py), and Work.wait
COLLECTIVES = frozenset((
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor",
    "all_gather_object", "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor",
    "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list", "reduce", "gather",
    "gather_object", "scatter", "scatter_object_list", "barrier", "monitored_barrier", "send",
    "recv", "send_object_list", "recv_object_list", "batch_isend_irecv", "wait"))
COLLECTIVE_FILES = ("torch/distributed/", "deepspeed/comm/")
LIBRARY_DIRS = ("/site-packages/", "/dist-packages/")
MAX_FRAMES = 256          # frames kept per stack (a deep recursion is cut, said so)
MAX_TEXT = 200            # characters of a function or file name
SHOWN_FRAMES = 6          # frames in the one-line form
MAX_GROUPS = 20           # groups shown and judged one by one; the rest in one line / finding


@dataclass(frozen=True)
class Frame:
    name: str
    file: str                     # py-spy's short_filename (or the filename)
    line: int
    library: bool                 # under site-packages/dist-packages
    # the line of code, as the target read it (not part of the frame's identity: a target that
    # could not read a file must not split a group)
    source: str = field(default="", compare=False)

    def shown(self) -> str:
        """``sync (train.py:14)``; a library frame without its line: ``all_reduce (torch/…py)``."""
        return f"{self.name} ({self.file})" if self.library else f"{self.name} ({self.file}:{self.line})"

    @property
    def collective(self) -> bool:
        return self.name in COLLECTIVES and any(d in self.file for d in COLLECTIVE_FILES)


@dataclass
class RankStack:
    """One process of the job: where it runs, its rank (None when unknown), its dump."""
    target: str
    pid: int
    rank: Optional[int] = None
    threads: Any = None           # py-spy's JSON list, as received

    @property
    def member(self) -> str:
        return f"{self.target}:{self.rank}" if self.rank is not None else f"{self.target}:pid{self.pid}"


def _text(value: Any) -> str:
    return str(value)[:MAX_TEXT] if isinstance(value, (str, int)) else "?"


def _frame(raw: Any) -> Optional[Frame]:
    if not isinstance(raw, dict):
        return None
    filename = raw.get("filename") if isinstance(raw.get("filename"), str) else ""
    short = raw.get("short_filename") if isinstance(raw.get("short_filename"), str) else filename
    line = raw.get("line")
    source = raw.get("source")
    return Frame(_text(raw.get("name")), _text(short or "?"),
                 line if isinstance(line, int) and not isinstance(line, bool) else 0,
                 any(d in filename for d in LIBRARY_DIRS),
                 " ".join(source.split())[:MAX_TEXT] if isinstance(source, str) else "")


def main_thread(threads: Any) -> Tuple[Frame, ...]:
    """The main thread's frames, innermost first: the thread named MainThread, else the first
    one (py-spy lists the main thread first). () when the dump has none."""
    if not isinstance(threads, list) or not threads:
        return ()
    named = [t for t in threads if isinstance(t, dict) and t.get("thread_name") == "MainThread"]
    thread = named[0] if named else threads[0]
    frames = thread.get("frames") if isinstance(thread, dict) else None
    if not isinstance(frames, list):
        return ()
    return tuple(f for f in (_frame(raw) for raw in frames[:MAX_FRAMES]) if f is not None)


def shown_frames(frames: Sequence[Frame]) -> List[Frame]:
    """The innermost frame, then the program's own frames (library frames between them are
    left out), outermost ``<module>`` dropped."""
    if not frames:
        return []
    return [frames[0]] + [f for f in frames[1:] if not f.library and f.name != "<module>"]


def one_line(frames: Sequence[Frame]) -> str:
    """``all_reduce (torch/…) ← sync (train.py:14)``: the shown frames (``shown_frames``)."""
    kept = shown_frames(frames)
    if not kept:
        return "no Python stack"
    more = len(kept) - SHOWN_FRAMES
    text = " ← ".join(f.shown() for f in kept[:SHOWN_FRAMES])
    return text + (f" ← … {more} more" if more > 0 else "")


def source_lines(frames: Sequence[Frame]) -> List[str]:
    """Under a group's line: each shown frame's ``file:line  code`` (those the target could
    read)."""
    kept = [f for f in shown_frames(frames)[:SHOWN_FRAMES] if f.source]
    width = max((len(f"{f.file}:{f.line}") for f in kept), default=0)
    return [f"    {f'{f.file}:{f.line}'.ljust(width)}  {f.source}" for f in kept]


@dataclass
class Group:
    frames: Tuple[Frame, ...]
    members: List[RankStack] = field(default_factory=list)

    @property
    def in_collective(self) -> bool:
        return any(f.collective for f in self.frames)

    @property
    def nodes(self) -> str:
        return nodeset.fold(m.member for m in self.members)


def fold(stacks: Sequence[RankStack]) -> List[Group]:
    """Identical main-thread stacks (function, file, line of every frame) in one group; the
    largest group first, then in the order first seen."""
    groups: Dict[Tuple[Frame, ...], Group] = {}
    for stack in stacks:
        frames = main_thread(stack.threads)
        groups.setdefault(frames, Group(frames)).members.append(stack)
    order = list(groups.values())
    return sorted(order, key=lambda g: -len(g.members))      # stable: first seen among equals


def majority(groups: Sequence[Group]) -> Optional[Group]:
    """The largest group when it is strictly larger than every other one."""
    if len(groups) == 1 or (len(groups) > 1 and len(groups[0].members) > len(groups[1].members)):
        return groups[0]
    return None


def judge(groups: Sequence[Group]) -> List[Dict[str, Any]]:
    """Findings ({level, code, message}) for the folded groups; see the module docstring."""
    total = sum(len(g.members) for g in groups)
    if not groups:
        return []
    if len(groups) == 1:
        return [{"level": "info", "code": "stacks-agree",
                 "message": f"all {total} ranks alike: {one_line(groups[0].frames)}"}]
    major = majority(groups)
    if major is None:
        sizes = ", ".join(f"{len(g.members)}" for g in groups)
        return [{"level": "warn", "code": "stacks-split",
                 "message": f"no majority among {total} ranks ({sizes} alike)"}]
    waiting = major.in_collective
    findings = []
    odd = [g for g in groups if g is not major]
    for group in odd[:MAX_GROUPS]:
        where = one_line(group.frames)
        if waiting:
            message = (f"{len(group.members)}/{total} ranks ({group.nodes}) not in the collective "
                       f"the other {len(major.members)} wait in "
                       f"({next(f.name for f in major.frames if f.collective)}): {where}")
        else:
            message = f"{len(group.members)}/{total} ranks ({group.nodes}) elsewhere: {where}"
        findings.append({"level": "fail" if waiting else "warn", "code": "stacks-odd-one-out",
                         "message": message})
    rest = odd[MAX_GROUPS:]
    if rest:
        findings.append({"level": "fail" if waiting else "warn", "code": "stacks-odd-one-out",
                         "message": f"… {len(rest)} more groups ({sum(len(g.members) for g in rest)} "
                                    f"ranks) with stacks of their own"})
    return findings


def lines(groups: Sequence[Group]) -> List[str]:
    """The folded view, one line per group, the odd ones out marked."""
    total = sum(len(g.members) for g in groups)
    major = majority(groups)
    heads = [f"{len(g.members)}/{total} ranks ({g.nodes})" for g in groups]
    width = max((len(h) for h in heads), default=0)
    out = []
    for head, group in list(zip(heads, groups))[:MAX_GROUPS + 1]:
        mark = "   ← the odd one out" if major is not None and group is not major else ""
        out.append(f"{head.ljust(width)}  {one_line(group.frames)}{mark}")
        out.extend(source_lines(group.frames))
    rest = groups[MAX_GROUPS + 1:]
    if rest:
        out.append(f"… {len(rest)} more groups ({sum(len(g.members) for g in rest)} ranks): "
                   "--json or --save has every stack")
    return out


def processes_of(results: Sequence[Any]) -> Iterator[Tuple[Any, Dict[str, Any]]]:
    """(result, process) for each process entry a target that answered sent (data.processes[]):
    a target's data is its own word, so anything else in it is skipped."""
    for result in results:
        data = result.data if isinstance(result.data, dict) else {}
        processes = data.get("processes")
        if result.status == "error" or not isinstance(processes, list):
            continue
        for proc in processes:
            if isinstance(proc, dict):
                yield result, proc
