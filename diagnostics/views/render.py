"""Table (folded, ClusterShell-style) and JSON views of results, written to a passed-in stream.

Everything here is a pure function of its arguments (gpustat style): no global state, no
terminal detection; the caller picks the stream and whether to colour.
"""

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, Iterable, List, Optional, Sequence, TextIO, Tuple


from ..core import nodeset
from ..core.results import ERROR_LAYERS, STATUSES, Finding, Result, status_rank

STDERR_TAIL_LINES = 20
STDERR_LINE_CHARS = 400   # a single many-MB line must not flood the terminal
DETAIL_INDENT = "  "
LEVEL_WIDTH = 5           # "error"; so messages and hints start at column 8
CONT_INDENT = " " * (len(DETAIL_INDENT) + LEVEL_WIDTH + 1)
SEP = " \N{MIDDLE DOT} "

_COLORS = {"ok": "\033[32m", "warn": "\033[33m", "fail": "\033[31m", "error": "\033[1;31m"}
_RESET = "\033[0m"
# What replaces our own non-ASCII symbols on a stream that cannot encode them.
_ASCII_FALLBACK = {"\N{MIDDLE DOT}": "-", "\N{RIGHTWARDS ARROW}": "->", "\N{HORIZONTAL ELLIPSIS}": "..."}


# --------------------------------------------------------------------------- folding

_natural_key = nodeset.natural_key
fold_names = nodeset.fold   # one folder for every view (``nodeset.fold``)


def _fold_key(r: Result) -> Tuple[Any, ...]:
    findings = tuple((f.level, f.code, f.message, f.hint) for f in r.findings)
    err = (r.error.layer, r.error.message) if r.error else None
    return (r.status, r.summary, findings, err)


@dataclass(frozen=True)
class Group:
    """Results that read the same, under one folded name; ``results[0]`` speaks for all."""

    name: str
    results: Tuple[Result, ...]

    @property
    def first(self) -> Result:
        return self.results[0]

    @property
    def status(self) -> str:
        return self.first.status

    @property
    def summary(self) -> str:
        return self.first.summary

    @property
    def findings(self) -> List[Finding]:
        return self.first.findings

    @property
    def targets(self) -> List[str]:
        return [r.target for r in self.results]


def fold(results: Iterable[Result]) -> List[Group]:
    """Gather identical results (status, summary, findings, error layer and message).

    Groups come worst status first (error, fail, warn, ok), then by their first target name
    in natural order; inside a group, results are in that same name order.
    """
    buckets: Dict[Tuple[Any, ...], List[Result]] = {}
    for r in results:
        buckets.setdefault(_fold_key(r), []).append(r)
    groups = []
    for members in buckets.values():
        members.sort(key=lambda r: _natural_key(r.target))
        groups.append(Group(name=fold_names(r.target for r in members), results=tuple(members)))
    groups.sort(key=lambda g: (-status_rank(g.status), _natural_key(g.first.target)))
    return groups


# --------------------------------------------------------------------------- text hygiene

# What a target's text may not put on a terminal, or into a report, as it is: C0, DEL and C1
# controls drive the terminal (``ESC]0;title BEL``, ``ESC[2J``); the bidi controls reorder what
# is shown (Trojan Source); U+2028/U+2029 break lines in some viewers; a lone surrogate (bytes
# that were not UTF-8) cannot be written at all.
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible(match: "re.Match[str]") -> str:
    ch = match.group(0)
    code = ord(ch)
    return _NAMED_ESCAPES.get(ch) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def safe_text(value: Any) -> str:
    """Any value that came from a target as one inert line: each unsafe character (above) as a
    visible escape (``\\x1b``, ``\\n``, ``\\u202e``). The one escaping layer every view uses —
    table, per-GPU rows, drift, full view, progress, Markdown; idempotent (a backslash is safe)."""
    text = "" if value is None else value if isinstance(value, str) else str(value)
    return UNSAFE.sub(_visible, text)


def _cell(text: Any) -> str:
    """A one-line table cell."""
    return safe_text(text)


def _lines(text: Optional[str]) -> List[str]:
    """Lines as a terminal would show them: ``\\r`` redraws keep their last segment."""
    if not text:
        return []
    lines = []
    for raw in str(text).split("\n"):
        raw = raw.rstrip("\r")
        if "\r" in raw:
            segments = [seg for seg in raw.split("\r") if seg]
            raw = segments[-1] if segments else ""
        lines.append(safe_text(raw.expandtabs(8)))
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _clip(line: str, width: int) -> str:
    if len(line) <= width:
        return line
    return line[:width] + f"\N{HORIZONTAL ELLIPSIS} (+{len(line) - width} chars)"


def count(n: int, noun: str) -> str:
    """``count(1, "GPU")`` → "1 GPU", ``count(8, "GPU")`` → "8 GPUs"."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal: False for a stream without ``isatty`` (a test's
    StringIO stand-in) or a closed one, never an error. The one test every view and the live
    progress make."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def wants_color(stream: TextIO, environ: Optional[Dict[str, str]] = None, *,
                no_color: bool = False) -> bool:
    """Statuses in colour only on a terminal, never with ``--no-color`` (``no_color``), when
    ``NO_COLOR`` is set (no-color.org) or ``TERM=dumb``: a pipe, a file or ``--json`` reader
    gets plain text."""
    if no_color:
        return False
    env = os.environ if environ is None else environ
    return is_terminal(stream) and not env.get("NO_COLOR") and env.get("TERM") != "dumb"


def _paint(text: str, status: str, color: bool) -> str:
    if not color or status not in _COLORS:
        return text
    return _COLORS[status] + text + _RESET


def emit(stream: TextIO, text: str) -> None:
    """Write ``text``; on a stream that cannot encode our symbols, ASCII stand-ins."""
    encoding = getattr(stream, "encoding", None)
    if encoding:
        try:
            text.encode(encoding)
        except (UnicodeEncodeError, LookupError):
            for symbol, ascii_ in _ASCII_FALLBACK.items():
                text = text.replace(symbol, ascii_)
            try:
                text = text.encode(encoding, "backslashreplace").decode(encoding)
            except LookupError:
                pass
    stream.write(text)


# --------------------------------------------------------------------------- table

def _detail(level: str, text_lines: Sequence[str], color: bool) -> List[str]:
    """``  fail  code: message`` plus continuation lines under the message column."""
    head = _paint(level, level, color) + " " * (LEVEL_WIDTH - len(level))
    first = text_lines[0] if text_lines else ""
    out = [f"{DETAIL_INDENT}{head} {first}".rstrip()]
    out.extend((CONT_INDENT + line).rstrip() for line in text_lines[1:])
    return out


def _finding_lines(f: Finding, color: bool) -> List[str]:
    msg = _lines(f.message) or [""]
    code = _cell(f.code)
    if code:
        msg[0] = f"{code}: {msg[0]}" if msg[0] else f"{code}:"
    out = _detail(_cell(f.level), msg, color)
    hint = _lines(f.hint)
    if hint:
        out.append(f"{CONT_INDENT}hint: {hint[0]}")
        out.extend(CONT_INDENT + "      " + line for line in hint[1:])
    return out


def _error_text(err: Any) -> List[str]:
    """``unreachable: message``; the exception type when it adds something; never empty."""
    message = _lines(err.message)
    etype = _cell(err.type)
    # NOTE: the runtime's own types only restate the layer (``timeout``/``Timeout``)
    if etype and etype.lower() != str(err.layer).lower() \
            and not (message and message[0].startswith(etype)):
        message = [f"{etype}: {message[0]}" if message else etype] + message[1:]
    if not message:
        message = [etype or "(no message)"]
    message[0] = f"{_cell(err.layer)}: {message[0]}"
    return message


# The runtime's private directory on a target (``/tmp/mldiag-4c5bcce0e84c/``): in every frame of a
# traceback, a different name on each target and run.
_RUN_DIR = re.compile(r"/mldiag-[0-9a-f]{12}/")


def _run_free(value: Any) -> str:
    """``value`` as text with each run directory's name left out: two targets whose tracebacks
    differ only there read the same."""
    return _RUN_DIR.sub("/mldiag-RUN/", repr(value))


def _error_lines(group: Group, color: bool) -> List[str]:
    """What the SUMMARY column does not already say: the error text when the summary is not it,
    the whole traceback, the tail of stderr (less the lines the message already quotes)."""
    err = group.first.error
    text = _error_text(err)
    summary = _cell(group.summary)
    message = _lines(err.message)
    bare = f"{_cell(err.layer)}: {message[0]}" if message else None
    if summary == text[0] or (summary == bare and _lines(err.traceback)):
        # the usual ``layer: message`` is said once, in the row (a traceback names the type)
        text = text[1:]
    elif summary == "\\n".join(text):   # a many-line message, escaped onto the row
        text = []
    body: List[str] = list(text)
    differs = any(_run_free((r.error.type, r.error.traceback, r.error.stderr))
                  != _run_free((err.type, err.traceback, err.stderr)) for r in group.results[1:])
    if differs and (err.traceback or err.stderr):
        body.append(f"(details of {_cell(group.first.target)}; "
                    "the others differ, --json has each)")
    # NOTE: a crashed diagnostic shows its whole traceback: the last frame alone is
    # rarely the one to fix.
    body.extend(_lines(err.traceback))
    stderr = _lines(err.stderr)
    # NOTE: a hop's classified message quotes the tool's own line ("pct 399: not found
    # (Configuration file ... does not exist)"): a stderr that only says that again is left out.
    said = _cell(group.summary) + "\n" + "\n".join(_lines(err.message))
    if stderr and all(not line.strip() or line.strip() in said for line in stderr):
        stderr = []
    if stderr:
        if len(stderr) > STDERR_TAIL_LINES:
            body.append(f"stderr (last {STDERR_TAIL_LINES} of {len(stderr)} lines):")
            stderr = stderr[-STDERR_TAIL_LINES:]
        else:
            body.append("stderr:")
        body.extend("  " + _clip(line, STDERR_LINE_CHARS) for line in stderr)
    return _detail("error", body, color) if body else []


# --------------------------------------------------------------------------- output blocks

OUTPUT_TAIL_LINES = 10    # run-script's stdout and stderr in the table: the last lines of each
OUTPUT_LINE_CHARS = 200
MORE_LINES = "\N{HORIZONTAL ELLIPSIS} {n} more lines: --json/--save"
SHOWN_ABOVE = "output: shown above as it ran (--json/--save keep it)"


def _text_field(mapping: Any, key: str) -> Optional[str]:
    value = mapping.get(key) if isinstance(mapping, dict) else None
    return value if isinstance(value, str) and value.strip() else None


def _tail(text: Optional[str], limit: int = OUTPUT_TAIL_LINES) -> List[str]:
    """The last ``limit`` lines of ``text``, each clipped, after a line counting the rest."""
    lines = _lines(text)
    shown = lines[-limit:] if limit else []
    out = [MORE_LINES.format(n=len(lines) - len(shown))] if len(shown) < len(lines) else []
    return out + [_clip(line, OUTPUT_LINE_CHARS) for line in shown]


def output_blocks(result: Result) -> List[Tuple[str, List[str]]]:
    """``(label, lines)`` for what a result carries in ``data`` that a user reads in the table:
    run-script's stdout and stderr tails and its traceback; a backend's failure traceback
    (``data.error.traceback``, e.g. extract-smoke's ``backend-failed``). Whole tracebacks."""
    data = result.data if isinstance(result.data, dict) else {}
    blocks: List[Tuple[str, List[str]]] = []
    if result.diagnostic == "run-script":
        exc = data.get("exception")
        traceback = _text_field(exc, "traceback")
        stdout, stderr = _text_field(data, "stdout"), _text_field(data, "stderr")
        # NOTE: the runtime writes an uncaught exception's traceback to the script's stderr
        # too (as python would): shown once, whole, under its own label.
        if traceback and stderr and stderr.endswith(traceback):
            stderr = stderr[:-len(traceback)] or None
        for label, text in (("stdout", stdout), ("stderr", stderr)):
            if text and text.strip():
                blocks.append((label, _tail(text)))
    else:
        traceback = _text_field(data.get("error"), "traceback")
    if traceback:
        blocks.append(("traceback", [_clip(line, STDERR_LINE_CHARS) for line in _lines(traceback)]))
    return blocks


def output_groups(results: Sequence[Result]) -> List[Tuple[List[str], List[Tuple[str, List[str]]]]]:
    """``(targets, blocks)``: the results' output blocks, targets whose blocks read the same (run
    directories aside) together, in the results' order; targets without output left out."""
    groups: Dict[str, Tuple[List[str], List[Tuple[str, List[str]]]]] = {}
    for result in results:
        blocks = output_blocks(result)
        if blocks:
            groups.setdefault(_run_free(blocks), ([], blocks))[0].append(result.target)
    return list(groups.values())


def _output_lines(group: Group, streamed: Collection[str] = ()) -> List[str]:
    """The output blocks of a group's first result (its others' when they are the same): the
    label at the finding indent, the text under the message column. A target in ``streamed``
    had its output (traceback included) written live above the table: only a pointer to it."""
    blocks = output_blocks(group.first)
    if not blocks:
        return []
    if len(group.results) == 1 and group.first.target in streamed:
        return [f"{DETAIL_INDENT}{SHOWN_ABOVE}"]
    out = []
    others = [r.target for r in group.results[1:]
              if _run_free(output_blocks(r)) != _run_free(blocks)]
    if others:
        verb = "differs" if len(others) == 1 else "differ"
        out.append(f"{DETAIL_INDENT}output of {_cell(group.first.target)} "
                   f"({_cell(fold_names(others))} {verb}; --json/--save has each):")
    for label, lines in blocks:
        out.append(f"{DETAIL_INDENT}{label}:")
        out.extend((CONT_INDENT + line).rstrip() for line in lines)
    return out


def _columns(rows: Sequence[Sequence[str]], paint: Optional[Sequence[str]] = None,
             color: bool = False) -> List[str]:
    """Left-aligned columns two spaces apart, widths from content, no trailing blanks.

    ``paint`` (one status per row) colours the second column after padding it.
    """
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    out = []
    for n, row in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(row, widths)] + [row[-1]]
        if paint is not None and paint[n] is not None:
            word = row[1]
            cells[1] = _paint(word, paint[n], color) + cells[1][len(word):]
        out.append("  ".join(cells).rstrip())
    return out


def render_table(results: Sequence[Result], stream: TextIO, *, color: bool = False,
                 details: Optional[Callable[..., None]] = None,
                 streamed: Collection[str] = ()) -> None:
    """Header, one row per folded group with its findings/error under it, then ``details``
    (a task's own view, e.g. the GPU grid: ``details(results, stream, color=color)``), blank,
    summary. ``streamed``: targets whose output is on the screen already (``_output_lines``)."""
    results = list(results)
    groups = fold(results)
    if not groups:
        emit(stream, summary_line(results) + "\n")
        return
    rows = [("TARGETS", "STATUS", "SUMMARY")]
    rows += [(_cell(g.name), _cell(g.status), _cell(g.summary)) for g in groups]
    table = _columns(rows, paint=[None] + [g.status for g in groups], color=color)
    lines = [table[0]]
    for group, row in zip(groups, table[1:]):
        lines.append(row)
        for f in group.findings:
            lines.extend(_finding_lines(f, color))
        if group.first.error is not None:
            lines.extend(_error_lines(group, color))
        lines.extend(_output_lines(group, streamed))
    emit(stream, "\n".join(lines) + "\n")
    if details:
        details(results, stream, color=color)
    emit(stream, "\n" + summary_line(results) + "\n")


def summary_line(results: Iterable[Result]) -> str:
    """``62 ok · 1 warn · 2 error (1 unreachable, 1 timeout)``; ``no targets`` when empty."""
    counts = {s: 0 for s in STATUSES}
    layers: Dict[str, int] = {}
    for r in results:
        status = r.status if r.status in counts else "error"
        counts[status] += 1
        if status == "error":
            layer = r.error.layer if r.error is not None and r.error.layer else "unknown"
            layers[layer] = layers.get(layer, 0) + 1
    parts = []
    for status in STATUSES:
        if counts[status]:
            parts.append(f"{counts[status]} {status}")
    if layers:
        order = {layer: i for i, layer in enumerate(ERROR_LAYERS)}
        ranked = sorted(layers, key=lambda layer: (order.get(layer, len(order)), layer))
        if len(ranked) == 1:
            parts[-1] += f" ({_cell(ranked[0])})"
        else:
            parts[-1] += " (" + ", ".join(f"{layers[layer]} {_cell(layer)}"
                                          for layer in ranked) + ")"
    return SEP.join(parts) if parts else "no targets"


# --------------------------------------------------------------------------- JSON

def strict_json(value: Any) -> Any:
    """NaN/±Infinity as strings: ``json.dump`` would write bare ``NaN``, which is not JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def render_json(results: Iterable[Result], stream: TextIO) -> None:
    """The list of result documents, indented, one trailing newline, nothing else."""
    docs = strict_json([r.to_dict() for r in results])
    # NOTE: ensure_ascii keeps the output valid on any stream encoding; default=str turns
    # a stray non-JSON value (a Path in data) into text instead of a traceback.
    json.dump(docs, stream, indent=2, allow_nan=False, default=str)
    stream.write("\n")


# --------------------------------------------------------------------------- hosts

def render_hosts(rows: Iterable[Tuple[str, str]], stream: TextIO) -> None:
    """``TARGET  CHAIN`` in two aligned columns, one row per target, in the given order."""
    body = [(_cell(name), _cell(chain)) for name, chain in rows]
    if not body:
        emit(stream, "no targets\n")
        return
    emit(stream, "\n".join(_columns([("TARGET", "CHAIN")] + body)) + "\n")


# ----------------------------------------------------------------------------- data views

def data_of(result: Result) -> Dict[str, Any]:
    """A result's ``data`` as a mapping whatever the target sent (a list or a string becomes
    the one field ``data``), for the views that flatten it."""
    data = result.data
    if isinstance(data, dict):
        return data
    return {} if data is None else {"data": data}


def render_diff(results: Sequence[Result], stream: TextIO, *, color: bool = False) -> None:
    """Only the data fields that differ from the majority (targets that answered)."""
    from .drift import drift, format_drift
    ran = [r for r in results if r.status != "error"]
    if len(ran) < 2:
        render_full(results, stream)
        return
    rows = format_drift(drift([(r.target, data_of(r)) for r in ran]))
    lines = [f"  {safe_text(line)}" for line in rows] or ["  (none: every field agrees)"]
    emit(stream, f"\ndrift across {len(ran)} targets:\n" + "\n".join(lines) + "\n")


def render_full(results: Sequence[Result], stream: TextIO, *, color: bool = False) -> None:
    """Every data field of every target that answered, one ``key: value`` a line."""
    from .drift import flatten
    lines = []
    for r in results:
        if r.status == "error":
            continue
        lines += ["", f"{safe_text(r.target)}:"]
        lines += [f"  {safe_text(key)}: {safe_text(value)}" for key, value in flatten(data_of(r)).items()]
    if lines:
        emit(stream, "\n".join(lines) + "\n")
