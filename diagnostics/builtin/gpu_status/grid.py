"""gpu-status over a fleet: a node × GPU grid, one mark per GPU, and a legend.

One row per node, rows that read the same folded under one node set (ClusterShell style), one
column per GPU index; each cell is marked by that GPU's worst finding (the findings name their
GPUs in ``gpus``), a letter per finding code, upper case when it fails, lower case when it
warns, so the grid reads without colour; the legend says which code is behind each mark. On a
terminal each mark has its status's colour, as in the table.

A pure function of the results, like every view in ``render``: whatever JSON a target sent
(a ``gpus`` list of junk, indices that are strings or huge, codes with escapes) is a row, never
a crash, and every text of a target's goes through ``render.safe_text``.
"""

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set, TextIO, Tuple

from ...views import render
from ...core.results import STATUSES, Result, known_status, level_rank

MAX_COLUMNS = 64          # GPU indices 0..63 are drawn; any other is counted, not drawn
CODE_CHARS = 60           # a code in the legend is cut here (a target's code can be any size)

OK, NO_GPU, UNREADABLE, OTHER = ".", "-", "!", "*"

# Each code's letter (its case says the level) and what the mark means, for the legend.
MARKS: Dict[str, Tuple[str, str]] = {
    "gpu-lost": ("L", "the GPU is lost (fallen off the bus)"),
    "xid-fatal": ("X", "an Xid in the kernel log that needs a GPU reset or a reboot"),
    "xid": ("X", "an Xid in the kernel log"),
    "ecc-uncorrectable": ("E", "uncorrectable ECC errors since the driver loaded"),
    "ecc-uncorrectable-history": ("E", "uncorrectable ECC errors in its lifetime count"),
    "remap-failure": ("R", "a row remapping failed (no spare rows left)"),
    "remap-pending": ("R", "a row remapping waits for a GPU reset"),
    "retired-pages-pending": ("A", "pages wait to be retired"),
    "clocks-hw-thermal": ("T", "HW thermal slowdown"),
    "clocks-hw-power-brake": ("B", "HW power brake slowdown"),
    "clocks-hw-slowdown": ("S", "HW slowdown"),
    "clocks-sw-thermal": ("H", "SW thermal slowdown (above its operating temperature)"),
    "mig-pending": ("M", "a MIG mode change waits for a GPU reset"),
    "persistence-off": ("P", "persistence mode off"),
    "gpu-busy": ("U", "in use by compute processes"),
    "gpu-memory-unattributed": ("N", "memory held by processes not visible here"),
}


def _index(value: Any) -> Optional[int]:
    """A GPU index a target sent, if it is one we draw."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COLUMNS:
        return value
    return None


@dataclass(frozen=True)
class Cell:
    """One GPU: its worst finding's level (rank) and code; ``unreadable`` when its row is an
    error (its state unknown, whatever else was said)."""
    rank: int = 0
    code: str = ""
    unreadable: bool = False


@dataclass
class Row:
    """One node: its cells by GPU index, or the text that stands for them."""
    target: str
    cells: Dict[int, Cell]
    text: str = ""          # "not checked: unreachable", "no GPUs seen"
    status: str = "ok"      # the colour of ``text``
    undrawn: int = 0        # GPUs the target sent that have no index we can draw


def _as_list(value: Any) -> List[Any]:
    return value if isinstance(value, list) else []


def node_row(r: Result) -> Row:
    """The cells of one gpu-status result (any shape a target sent)."""
    target = render.safe_text(r.target)
    if r.status == "error" or r.error is not None:
        layer = render.safe_text(r.error.layer) if r.error is not None else "error"
        return Row(target, {}, text=f"not checked: {layer}", status="error")
    data = r.data if isinstance(r.data, dict) else {}
    cells: Dict[int, Cell] = {}
    undrawn = 0
    for key in ("gpus", "lost_gpus"):
        for g in _as_list(data.get(key)):
            index = _index(g.get("index")) if isinstance(g, dict) else None
            if index is None:
                undrawn += 1
                continue
            unreadable = key == "gpus" and bool(g.get("error"))
            cells[index] = Cell(rank=3 if unreadable else 0, unreadable=unreadable)
    for f in r.findings:
        gpus = f.gpus if isinstance(f.gpus, list) else []
        rank = level_rank(f.level)
        for index in {_index(i) for i in gpus} - {None}:
            cell = cells.get(index, Cell())
            if rank > cell.rank and not cell.unreadable:
                cells[index] = Cell(rank=rank, code=render.safe_text(f.code)[:CODE_CHARS])
            elif index not in cells:
                cells[index] = cell
    row = Row(target, cells, undrawn=undrawn)
    if not cells:
        row.text, row.status = "no GPUs seen", known_status(r.status)
    return row


def assign_marks(rows: Sequence[Row]) -> Dict[Tuple[int, str], str]:
    """A one-character mark for each (rank, code) the cells show: the code's letter (MARKS, else
    the first letter of the code), upper case for fail and error, lower case for warn; the next
    free letter of the code, then of the alphabet, when two codes would share one; ``*`` when
    none is left. Worst first, and our own codes before any other, so they keep their letters."""
    keys = sorted({(c.rank, c.code) for row in rows for c in row.cells.values()
                   if c.rank > 0 and not c.unreadable}, key=lambda k: (-k[0], k[1] not in MARKS, k[1]))
    taken = {OK, NO_GPU, UNREADABLE, OTHER}
    marks = {}
    for rank, code in keys:
        preferred = MARKS.get(code, ("", ""))[0]
        candidates = [ch for ch in preferred + code + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if ch.isascii()
                      and ch.isalpha()]
        mark = OTHER
        for ch in candidates:
            ch = ch.upper() if rank >= 2 else ch.lower()
            if ch not in taken:
                mark = ch
                break
        taken.add(mark)
        marks[(rank, code)] = mark
    return marks


def _mark(cell: Optional[Cell], marks: Dict[Tuple[int, str], str]) -> Tuple[str, Optional[str]]:
    """(mark, status to paint it) of one cell; a GPU index the node lacks is ``-``."""
    if cell is None:
        return NO_GPU, None
    if cell.unreadable:
        return UNREADABLE, "error"
    if cell.rank == 0:
        return OK, "ok"
    return marks.get((cell.rank, cell.code), OTHER), STATUSES[cell.rank]


def _paint_cells(cells: Sequence[Tuple[str, Optional[str]]], width: int, color: bool) -> str:
    """The marks, ``width`` wide each, one blank apart; a run of one status painted at once."""
    runs: List[Tuple[Optional[str], List[str]]] = []
    for mark, status in cells:
        if runs and runs[-1][0] == status:
            runs[-1][1].append(mark.ljust(width))
        else:
            runs.append((status, [mark.ljust(width)]))
    parts = []
    for status, marks in runs:
        text = " ".join(marks)
        shown = text.rstrip()
        painted = render._paint(shown, status, color) if status else shown
        parts.append(painted + " " * (len(text) - len(shown)))
    return " ".join(parts).rstrip()


def render_grid(results: Sequence[Result], stream: TextIO, *, color: bool = False) -> None:
    """The node × GPU grid and its legend (nothing when there are no results)."""
    rows = [node_row(r) for r in results]
    if not rows:
        return
    columns = max((max(row.cells) + 1 for row in rows if row.cells), default=0)
    width = len(str(columns - 1)) if columns else 1
    marks = assign_marks(rows)

    folded: Dict[Tuple[Any, ...], List[Row]] = {}
    for row in rows:
        shown = tuple(_mark(row.cells.get(i), marks) for i in range(columns)) if row.cells else ()
        folded.setdefault((shown, row.text, row.status, row.undrawn), []).append(row)
    groups = sorted(folded.items(), key=lambda kv: render._natural_key(
        min((r.target for r in kv[1]), key=render._natural_key)))
    names = [render.fold_names(r.target for r in members) for _, members in groups]
    name_width = max([len("NODES")] + [len(n) for n in names])
    header = "NODES".ljust(name_width) + "  GPU " + " ".join(str(i).ljust(width) for i in range(columns))
    lines = ["", header.rstrip()]
    for name, ((shown, text, status, undrawn), _members) in zip(names, groups):
        body = _paint_cells(shown, width, color) if shown else render._paint(text, status, color)
        if undrawn:
            body += f"  (+{render.count(undrawn, 'GPU')} without an index to draw)"
        lines.append((name.ljust(name_width) + "      " + body).rstrip())
    shown_marks = {cell for (shown, *_rest) in folded for cell in shown}
    lines += legend(shown_marks, marks, color)
    render.emit(stream, "\n".join(lines) + "\n")


def legend(shown: Set[Tuple[str, Optional[str]]], marks: Dict[Tuple[int, str], str],
           color: bool) -> List[str]:
    """One line per mark the grid shows: the mark, its level, the finding code behind it and
    what it means; worst first, then ok and the absent GPU."""
    entries: List[Tuple[str, Optional[str], str]] = []
    if (UNREADABLE, "error") in shown:
        entries.append((UNREADABLE, "error", "gpu-row-error: the GPU's row could not be read"))
    for (rank, code), mark in sorted(marks.items(), key=lambda kv: (-kv[0][0], kv[0][1])):
        if mark == OTHER:
            continue
        meaning = MARKS.get(code, ("", ""))[1]
        entries.append((mark, STATUSES[rank], f"{code}: {meaning}" if meaning else code or "(no code)"))
    for status in ("error", "fail", "warn"):
        if (OTHER, status) in shown:
            entries.append((OTHER, status, "another finding (the table above says which)"))
    if (OK, "ok") in shown:
        entries.append((OK, "ok", "no finding above info"))
    if (NO_GPU, None) in shown:
        entries.append((NO_GPU, None, "no GPU at this index"))
    out = []
    for mark, status, text in entries:
        painted = render._paint(mark, status, color) if status else mark
        out.append(f"  {painted}  {(status or '').ljust(5)}  {text}".rstrip())
    return ["", "Legend:"] + out if out else []
