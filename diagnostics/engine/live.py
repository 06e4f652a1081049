"""The live area: what runs, on a terminal's stderr, while targets run.

One line per running target (``NAME  elapsed  latest progress text``), clipped to the terminal's
width so a redraw never wraps, and ``[n/N] k failed so far`` when there are several targets; it
is erased when the run ends, so the table printed after it is what stays on the screen.  With
``passthrough`` (one target, run-script) the script's own output is written above the area as it
arrives, and stays.  Everything a target sent goes through ``render.safe_text``.

Only on a terminal and never with ``--json`` (``open_area`` decides): on a pipe nothing here
writes a byte.  Writes go to the stream it is given, from one lock, so the runner's worker
threads and the ticker (elapsed times) never interleave.  ``close`` (called from ``finally``,
also on Ctrl-C, TERM and HUP) erases the area and shows the cursor again.
"""

import os
import threading
import time
import unicodedata
from typing import Any, Dict, List, Optional, Sequence, TextIO

from ..views.render import is_terminal, safe_text
from ..core.results import Result

TICK_S = 0.1          # the ticker's step: a changed area is redrawn within it
REDRAW_S = 1.0        # an unchanged area is redrawn this often (elapsed times move)
FIRST_DRAW_S = 0.3    # a run over sooner never flickers an area onto the screen
HIDE_CURSOR, SHOW_CURSOR = "\033[?25l", "\033[?25h"
UP, CLEAR_DOWN = "\033[A", "\033[J"
PARTIAL_LIMIT = 64 * 1024   # of a passed-through line still without its newline


def open_area(stream: TextIO, names: Sequence[str], *, enabled: bool = True,
              passthrough: bool = False) -> "LiveArea":
    """The live area for a run on the targets ``names`` (their lines in that order) on
    ``stream``; an inert one (``live`` False: every method does nothing) unless ``enabled`` and
    ``stream`` is a terminal."""
    try:
        terminal = enabled and is_terminal(stream)
    except (AttributeError, ValueError):
        terminal = False
    return LiveArea(stream, names, passthrough=passthrough, live=terminal)


def display_width(text: str) -> int:
    return sum(_char_width(ch) for ch in text)


def _char_width(ch: str) -> int:
    if unicodedata.combining(ch):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def clip(text: str, columns: int) -> str:
    """``text`` cut to at most ``columns`` terminal columns (an ellipsis marks the cut)."""
    if display_width(text) <= columns:
        return text
    out, used = [], 0
    for ch in text:
        w = _char_width(ch)
        if used + w > columns - 1:
            break
        out.append(ch)
        used += w
    return "".join(out) + "\N{HORIZONTAL ELLIPSIS}"


def elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds}s" if seconds < 60 else f"{seconds // 60}m{seconds % 60:02d}s"


def shown_line(text: str) -> str:
    """One output line as a terminal would leave it (a ``\\r`` redraw keeps its last drawing),
    made inert."""
    text = text.rstrip("\r")
    if "\r" in text:
        segments = [s for s in text.split("\r") if s]
        text = segments[-1] if segments else ""
    return safe_text(text.expandtabs(8))


class LiveArea:
    def __init__(self, stream: TextIO, names: Sequence[str], *, passthrough: bool = False,
                 live: bool = True):
        self.stream, self.passthrough, self.live = stream, passthrough, live
        self.total = len(names)
        self.order = {name: i for i, name in enumerate(names)}   # others (Slurm node rows) last
        # the name column: as wide as the longest name, so it stays put as targets finish
        self.pad = max((len(safe_text(name)) for name in names), default=0)
        self.count = self.bad = 0
        self.running: Dict[str, List[Any]] = {}   # name -> [started (monotonic), text]
        self.partial = {"stdout": "", "stderr": ""}
        self.passed_through = False   # some of the script's output is on the screen already
        self.drawn = 0            # lines the area takes now (the cursor is on its last)
        self.dirty = False
        self.last_draw = 0.0
        self.closed = False
        self.opened = time.monotonic()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ticker: Optional[threading.Thread] = None
        if live:
            self.ticker = threading.Thread(target=self._tick, name="mldiag-live", daemon=True)
            self.ticker.start()

    # ------------------------------------------------------------------ events

    def event(self, name: str, record: Optional[Dict[str, Any]]) -> None:
        """A target started (``record`` None) or sent progress (a ``wire.ProgressReader``
        record); from any thread."""
        if not self.live:
            return
        with self.lock:
            if self.closed:
                return
            if record is None:
                self.running[name] = [time.monotonic(), ""]
            else:
                entry = self.running.setdefault(name, [time.monotonic(), ""])
                text = record.get("text")
                if text:
                    level = record.get("level")
                    entry[1] = f"{level} {text}" if level in ("WARNING", "ERROR", "CRITICAL") else text
                if self.passthrough and record.get("output"):
                    self._pass_through(record["output"])
            self.dirty = True

    def add(self, result: Result) -> None:
        """A target's result arrived."""
        if not self.live:
            return
        with self.lock:
            self.count += 1
            self.bad += result.status in ("fail", "error")
            self.running.pop(result.target, None)
            self.dirty = True

    def close(self) -> None:
        """Erase the area, end any passed-through line, show the cursor (idempotent)."""
        if not self.live:
            return
        self.stop.set()
        with self.lock:
            if self.closed:
                return
            self.closed = True
            out = self._erase()
            for stream in ("stdout", "stderr"):
                if self.partial[stream]:
                    out += shown_line(self.partial[stream]) + "\n"
                    self.partial[stream] = ""
            self._write(out + SHOW_CURSOR)
        if self.ticker is not None and self.ticker is not threading.current_thread():
            self.ticker.join(timeout=1.0)

    done = close

    # ------------------------------------------------------------------ drawing

    def _tick(self) -> None:
        while not self.stop.wait(TICK_S):
            with self.lock:
                if self.closed:
                    return
                now = time.monotonic()
                if now - self.opened < FIRST_DRAW_S:
                    continue
                if self.dirty or (self.running and now - self.last_draw >= REDRAW_S):
                    self._write(self._erase() + self._area(now))

    def _size(self):
        try:
            size = os.get_terminal_size(self.stream.fileno())
            return max(10, size.columns), max(3, size.lines)
        except (AttributeError, ValueError, OSError):
            return 80, 24

    def _area(self, now: float) -> str:
        """The area's text; the cursor stays at the end of its last line (no newline after it:
        a full-width line would otherwise leave an empty line)."""
        columns, lines = self._size()
        width = columns - 1               # never the last column: no terminal wraps then
        pad = max([self.pad] + [len(safe_text(name)) for name in self.running])
        names = sorted(self.running, key=lambda n: (self.order.get(n, len(self.order)), n))
        rows = []
        for name in names:
            started, text = self.running[name]
            rows.append(f"{safe_text(name).ljust(pad)}  {elapsed(now - started):>5}  "
                        f"{shown_line(text)}".rstrip())
        room = lines - 2 if self.total > 1 else lines - 1
        if len(rows) > room:
            rows = rows[:room - 1] + [f"... {len(rows) - room + 1} more running"]
        if self.total > 1:
            rows.append(f"[{self.count}/{self.total}] {self.bad} failed so far")
        self.drawn = len(rows)
        self.dirty = False
        self.last_draw = now
        return (HIDE_CURSOR if rows else "") + "\n".join(clip(r, width) for r in rows)

    def _erase(self) -> str:
        """Back to the start of the area's first line, everything below erased."""
        if not self.drawn:
            return ""
        out = "\r" + UP * (self.drawn - 1) + CLEAR_DOWN
        self.drawn = 0
        return out

    def _pass_through(self, output) -> None:
        """The script's output, whole lines only, above the area (which is redrawn under it)."""
        text = ""
        for stream, piece in output:
            if stream not in self.partial:
                continue
            lines = (self.partial[stream] + piece).split("\n")
            self.partial[stream] = lines.pop()[-PARTIAL_LIMIT:]
            text += "".join(shown_line(line) + "\n" for line in lines)
        if text:
            self.passed_through = True
            self._write(self._erase() + text + self._area(time.monotonic()))

    def _write(self, text: str) -> None:
        if not text:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):   # the terminal went away: nothing more to show
            self.live = False
