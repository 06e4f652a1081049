"""The runbook report: Markdown (for a terminal and a chat or issue tracker) and JSON views of a
``RunbookRun``, written to a passed-in stream. Pure functions of their arguments: the time and
mldiag version come from the run and the caller, so a test can pin them.

Markdown layout: a header (runbook, targets, parameters, time, mldiag version, result), the
summary table (step × target → status; targets whose column reads the same share one column,
named by their folded node set), every finding with its hint, worst first (identical findings
of one step folded over their targets), what was skipped and why, each step's one-line
summaries (plus GPU rows for gpu-status and the drift between targets for env-report), and the
raw result documents in a collapsible ``<details>`` appendix.
"""

import json
import re
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from ..builtin.gpu_status import view as gpu_view
from ..builtin.stacks import stragglers
from ..views import render
from ..views.drift import drift, format_drift
from ..core.results import Result, worst_status

LEVELS = ("error", "fail", "warn", "info")     # worst first; anything else sorts after info
SKIP_CELLS = {"param": "skipped (param)", "when": "skipped (when)", "setting": "skipped (setting)",
              "stopped": "skipped (stopped)", "unreachable": "skipped (unreachable)",
              "interrupted": "skipped (interrupted)"}


# --------------------------------------------------------------------------- Markdown text
#
# Every string that came from a target (and, as cheaply, from a runbook file) reaches the
# Markdown as inline text that renders as it reads and makes nothing: no link, image, heading,
# list, table, raw HTML or entity, under CommonMark and under GitHub's GFM (tables,
# strikethrough, bare-URL and e-mail autolinks, math). tests/unit/test_runbook_report.py checks
# it with two real parsers (markdown-it-py, GitHub's cmark-gfm) over generated hostile strings.
# - First the terminal layer (render.safe_text): controls, newlines and bidi characters become
#   visible escapes, so one string is one line.
# - A backslash before each character that means something inline anywhere in a line:
#   \ ` * < [ ] & ~ | $ #, and _ at a word's edge (intraword _ is never emphasis, so
#   ``hw_thermal_slowdown`` keeps its underscores). ! ( ) > : . - + = stay as they are: they
#   only mean something next to an escaped one or at the start of a line.
# - A remote string starts a line only in a finding's continuation lines; there its first
#   character is escaped when it is punctuation, and ``1.`` / ``1)`` lose their list meaning.
# - A word that a linkifier turns into a link by itself (``https://…``, ``www.…``, ``a@b.c``,
#   ``//host``) becomes an inline code span: code is never linked, whereas cmark-gfm links the
#   e-mail ``a\@b\.c`` whatever is escaped in it.
# - The diagnostics' own code spans (`nvidia-smi -q`) stay code spans, when the string holds
#   no such word.

_CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)")
_INLINE_SYNTAX = re.compile(r"[\\`*<\[\]&~|$#]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_LINKISH = re.compile(r"@|//|www\.", re.IGNORECASE)   # scheme:// has its //
_ASCII_PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"


def _md_plain(text: str) -> str:
    return _INLINE_SYNTAX.sub(lambda m: "\\" + m.group(0), text)


def _md(text: Any, *, table: bool = False) -> str:
    """A string as inline Markdown text that reads as it does in a terminal (rules above);
    ``table``: for a GFM table cell (a code span's pipes escaped too)."""
    text = render.safe_text(text)
    if _LINKISH.search(text):
        words = re.split(r"(\s+)", text)
        return "".join(_code(w, table=table) if _LINKISH.search(w) else _md_plain(w)
                       for w in words)
    out, at = [], 0
    for match in _CODE_SPAN.finditer(text):
        span = match.group(0).replace("|", "\\|") if table else match.group(0)
        out += [_md_plain(text[at:match.start()]), span]
        at = match.end()
    return "".join(out + [_md_plain(text[at:])])


def _line_start(md: str) -> str:
    """Inline Markdown made safe to begin a line: no heading, list, quote, fence, table row,
    setext underline or thematic break can start there."""
    md = md.lstrip(" ")
    if md[:1] and md[0] in _ASCII_PUNCTUATION and md[0] not in "\\`":
        return "\\" + md
    return re.sub(r"^(\d{1,9})([.)])", r"\1\\\2", md)


def _cell(text: Any) -> str:
    return _md(text, table=True)


def _code(text: Any, *, table: bool = False) -> str:
    """An inline code span that survives any backticks inside."""
    text = render.safe_text(text)
    if table:
        text = text.replace("|", "\\|")
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def _fence(text: str, info: str = "") -> List[str]:
    ticks = "`" * max(3, max((len(m) for m in re.findall(r"`{3,}", text)), default=0) + 1)
    return [ticks + info, text, ticks]


def _lines(text: Any) -> List[str]:
    """A multi-line string: the first line inline, each further one safe at a line's start."""
    # NOTE: rstrip: two trailing spaces would make a hard line break
    lines = [_md(line.rstrip(" ")) for line in str(text or "").splitlines() if line.strip()] or [""]
    return lines[:1] + [_line_start(line) for line in lines[1:]]


def _fold(names: Sequence[str]) -> str:
    return render.fold_names(names)


def _status_word(run) -> str:
    results = run.results
    if run.interrupted:
        return f"interrupted (exit {run.exit_code})"
    if not results:
        return "nothing ran (exit 0)"
    return f"{worst_status(r.status for r in results)} (exit {run.exit_code}): " \
           f"{render.summary_line(results)}"


def _step_label(sr) -> str:
    return f"{sr.number}. {sr.step.id}"


def _title(run, sr) -> str:
    """The step's title: as written, else its default (a run-script step's script's base name,
    with the run's parameters as the report shows them, or "inline code")."""
    book = run.runbook
    values = {p.name: p.default for p in book.params if p.default is not None}
    return sr.step.heading({**values, **_shown_params(run)})


def _cell_of(sr, target: str) -> str:
    status = sr.status_of(target)
    if status is not None:
        return status
    skip = sr.skip_of(target)
    return SKIP_CELLS.get(skip.kind, "skipped") if skip else "-"


# --------------------------------------------------------------------------- sections

def _header(run, version: str) -> List[str]:
    book = run.runbook
    params = ", ".join(f"{_code(k)}={_code(v)}" for k, v in _shown_params(run).items()) or "none given"
    where = "built-in" if book.source == "built-in" else _md(book.path)
    return [
        f"# Runbook {_code(book.name)}", "",
        _line_start(_md(book.description)), "",
        f"- **Targets:** {_md(_fold(run.targets)) or 'none'} ({len(run.targets)})",
        f"- **Parameters:** {params}",
        f"- **Started:** {run.started.strftime('%Y-%m-%d %H:%M:%S UTC')}, took "
        f"{run.duration_s:.1f} s",
        f"- **mldiag:** {_md(version)} (runbook: {where})",
        f"- **Result:** {_md(_status_word(run))}",
    ]


# what to do next, by verdict (a runbook that sampled stacks, stragglers or RAS: slow-or-hung)
NEXT = {
    "hung": "the odd rank is where the job stands: look at its frame (above); its node's kernel log "
            "and GPUs (node-check, gpu-status); NCCL's view (nccl-ras) says which communicator waits",
    "slow": "the straggler is the rank the others wait for: check its node (gpu-perf under load, "
            "node-check, its data loading); if it is one node's hardware, drain it and restart the job",
}


def verdict(run) -> Optional[Dict[str, Any]]:
    """The job's state from what the steps found, or None when no step judged it: ``slow`` where a
    straggler was named (stacks over a window, or the ranks' step times: the job moves), else
    ``hung`` where the fold named an odd rank (or NCCL said a rank is missing). {"verdict",
    "evidence": [(step, target, finding)]}."""
    found = {"slow": [], "hung": []}
    for sr in run.steps:
        for r in sr.results:
            for f in r.findings:
                if f.code in stragglers.SLOW_CODES:
                    found["slow"].append((sr, r.target, f))
                elif f.code in ("stacks-odd-one-out", "ras-rank-missing", "ras-process-missing",
                                "ras-process-dead"):
                    found["hung"].append((sr, r.target, f))
    for name in ("slow", "hung"):
        if found[name]:
            return {"verdict": name, "evidence": found[name]}
    return None


def _verdict(run) -> List[str]:
    """The verdict, with its evidence and where each rank named runs, before anything else; for
    a hang the folded stacks too."""
    judged = verdict(run)
    if judged is None:
        return []
    placements = getattr(run, "placements", {})
    lines = [f"## Verdict: {judged['verdict']}", ""]
    for sr, target, finding in judged["evidence"]:
        where = placements.get(sr.owner(result_named(sr, target)))
        lines.append(f"- **{_md(target)}**" + (f" ({_md(where)})" if where else "")
                     + f" · {_md(sr.step.id)} · {_md(finding.level)} · {_lines(finding.message)[0]}")
    lines += ["", f"Next: {_md(NEXT[judged['verdict']])}."]
    stacks = next((sr for sr in run.steps if sr.step.task == "stacks" and sr.results), None)
    if judged["verdict"] == "hung" and stacks is not None:
        from ..builtin.stacks.run import fold_view      # only a report with a stacks step needs it
        lines += [""] + _fence("\n".join(fold_view(stacks.results)))
    return lines


def result_named(sr, target: str) -> Result:
    return next(r for r in sr.results if r.target == target)


def _summary(run) -> List[str]:
    columns: Dict[Tuple[str, ...], List[str]] = {}
    for target in run.targets:
        columns.setdefault(tuple(_cell_of(sr, target) for sr in run.steps), []).append(target)
    heads = [_cell(_fold(names)) for names in columns.values()]
    lines = ["## Summary", "", "| Step | " + " | ".join(heads) + " |",
             "|---|" + "---|" * len(heads)]
    for i, sr in enumerate(run.steps):
        cells = [_cell(column[i]) for column in columns]
        heading = _title(run, sr)
        title = f": {_cell(heading)}" if heading else ""
        lines.append(f"| {_cell(_step_label(sr))}{title} | " + " | ".join(cells) + " |")
    return lines


def _result_findings(r: Result) -> List[Tuple[str, str, str, str]]:
    """(level, code, message, hint) of a result; an error or a bare non-ok status is one too."""
    found = [(f.level, f.code, f.message, f.hint or "") for f in r.findings]
    if r.error is not None:
        found.append(("error", r.error.layer, r.error.message or r.error.type, ""))
    elif not found and r.status != "ok":
        found.append((r.status, "", r.summary, ""))
    return found


def _level_rank(level: str) -> int:
    return LEVELS.index(level) if level in LEVELS else len(LEVELS)


def _findings(run) -> List[str]:
    folded: Dict[Tuple[Any, ...], List[str]] = {}
    for sr in run.steps:
        for r in sr.results:
            for level, code, message, hint in _result_findings(r):
                folded.setdefault((sr.number, sr.step.id, level, code, message, hint),
                                  []).append(r.target)
    lines = ["## Findings", ""]
    if not folded:
        return lines + ["No findings."]
    order = sorted(folded, key=lambda k: (_level_rank(k[2]), k[0]))
    for key in order:
        number, step_id, level, code, message, hint = key
        text = _lines(message)
        head = f"{_code(code)}: " if code else ""
        lines.append(f"- **{_md(level)}** · {number}. {_md(step_id)} · "
                     f"{_md(_fold(folded[key]))} · {head}{text[0]}")
        lines.extend(f"  {line}" for line in text[1:])
        if hint:
            hint_lines = _lines(hint)
            lines.append(f"  - hint: {hint_lines[0]}")
            lines.extend(f"    {line}" for line in hint_lines[1:])
    return lines


def _skipped(run) -> List[str]:
    folded: Dict[Tuple[int, str, str], List[str]] = {}
    for sr in run.steps:
        for skip in sr.skipped:
            folded.setdefault((sr.number, sr.step.id, skip.reason), []).append(skip.target)
    if not folded:
        return []
    lines = ["## Skipped", ""]
    for (number, step_id, reason), targets in folded.items():
        lines.append(f"- {number}. {_md(step_id)} on {_md(_fold(targets))}: {_md(reason)}")
    return lines


def _notable(row: Tuple[str, ...]) -> bool:
    """A GPU row worth a line: in use, throttled, or in error (idle healthy GPUs are not)."""
    _target, _index, name, memory, util, _temp, _power, events = row
    return (name.startswith("error: ") or not memory.startswith(("0.0/", "-"))
            or util not in ("0%", "-") or events != "-")


def _gpu_table(results: Sequence[Result]) -> List[str]:
    rows = gpu_view.gpu_rows(results)
    shown = [row for row in rows if _notable(row)][:gpu_view.GPU_ROWS_LIMIT]
    if not rows:
        return []
    if not shown:
        return ["", "The only GPU is idle, no clock events." if len(rows) == 1 else
                f"All {len(rows)} GPUs idle, no clock events."]
    head = ("Target", "GPU", "Name", "Memory", "Util", "Temp", "Power", "Clock events")
    return ["", f"GPUs in use, throttled or in error ({len(shown)} of {len(rows)}):", "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + \
        ["| " + " | ".join(_cell(c) for c in row) + " |" for row in shown]


def _drift(results: Sequence[Result]) -> List[str]:
    ran = [r for r in results if r.status != "error"]
    if len(ran) < 2:
        return []
    rows = format_drift(drift([(r.target, render.data_of(r)) for r in ran]))
    lines = ["", f"Drift across {len(ran)} targets:" if rows else
             f"No drift across {len(ran)} targets: every field agrees."]
    return lines + [f"- {_md(row)}" for row in rows]


def _script_output(results: Sequence[Result]) -> List[str]:
    """run-script: the tails of each target's stdout and stderr, and its traceback, as the
    table shows them (targets whose output reads the same: once)."""
    lines: List[str] = []
    for targets, blocks in render.output_groups(results):
        for label, text in blocks:
            lines += ["", f"{label} of {_md(_fold(targets))}:", ""] + _fence("\n".join(text))
    return lines


DETAILS = {"gpu-status": _gpu_table, "env-report": _drift, "run-script": _script_output}


def _steps(run) -> List[str]:
    lines = ["## Steps"]
    for sr in run.steps:
        heading = _title(run, sr)
        title = f": {_md(heading)}" if heading else ""
        task = f" ({_md(sr.step.task)})" if sr.step.task != sr.step.id else ""
        lines += ["", f"### {_md(_step_label(sr))}{task}{title}", ""]
        if not sr.results:
            lines.append("Did not run (see Skipped).")
            continue
        for group in render.fold(sr.results):
            lines.append(f"- {_md(group.name)}: **{_md(group.status)}** · "
                         f"{_lines(group.summary)[0]}")
        lines.extend(DETAILS.get(sr.step.task, lambda results: [])(sr.results))
    return lines


def _appendix(run) -> List[str]:
    results = [(sr, r) for sr in run.steps for r in sr.results]
    lines = ["## Raw results", "", "<details>",
             f"<summary>{len(results)} result documents (JSON)</summary>"]
    for sr, r in results:
        doc = _json_text(r.to_dict())
        lines += ["", f"#### {_md(_step_label(sr))} · {_md(r.target)}", ""] + _fence(doc, "json")
    return lines + ["", "</details>"]


def _json_text(doc: Any) -> str:
    """Readable JSON (non-ASCII kept) for a fenced block; the characters the terminal layer
    escapes (bidi controls, C1, DEL, lone surrogates) as \\u escapes, which JSON reads back."""
    text = json.dumps(render.strict_json(doc), indent=2, allow_nan=False, default=str,
                      ensure_ascii=False)
    # NOTE: json.dumps has escaped every control inside a string; the newlines left are its own
    return render.UNSAFE.sub(lambda m: m.group(0) if m.group(0) == "\n" else
                             f"\\u{ord(m.group(0)):04x}", text)


def _shown_params(run) -> Dict[str, str]:
    """--param values as a report may show them: secret names masked (``--param hf_token=...``)."""
    from ..core.redact import REDACTED, is_secret_name, redact_text
    return {k: REDACTED if is_secret_name(k) else redact_text(str(v)) for k, v in run.params.items()}


def render_markdown(run, stream: TextIO, *, version: str, appendix: bool = True,
                    saved: Optional[str] = None) -> None:
    """The whole report; ``appendix=False`` leaves the raw result documents out (a terminal:
    tens of KB of JSON would bury the report) and says where they are: in ``saved`` (the
    report.md that ``--save`` wrote) when there is one."""
    where = (f"the whole report, with them, is in {_code(saved)}; " if saved else
             "`--save DIR` writes them into DIR/report.md, ")
    tail = _appendix(run) if appendix else [
        "## Raw results", "", f"Left out on a terminal: {where}"
        "`--format json` prints them, and a pipe or a redirect gets the whole report."]
    sections = [_header(run, version), _verdict(run), _summary(run), _findings(run),
                _skipped(run), _steps(run), tail]
    render.emit(stream, "\n\n".join("\n".join(s) for s in sections if s) + "\n")


# --------------------------------------------------------------------------- JSON

def report_dict(run, *, version: str) -> Dict[str, Any]:
    book = run.runbook
    results = run.results
    return {
        "schema": 1, "runbook": book.name, "description": book.description,
        "source": book.source, "path": book.path, "mldiag_version": version,
        "started": run.started.isoformat(timespec="seconds"),
        "duration_s": round(run.duration_s, 3), "targets": list(run.targets),
        "params": _shown_params(run),
        "status": worst_status(r.status for r in results) if results else None,
        "exit_code": run.exit_code, "interrupted": run.interrupted,
        "verdict": _verdict_dict(run),
        "steps": [{"number": sr.number, "id": sr.step.id, "task": sr.step.task,
                   "title": _title(run, sr), "args": dict(sr.step.args),
                   "results": [r.to_dict() for r in sr.results],
                   "skipped": [{"target": s.target, "kind": s.kind, "reason": s.reason}
                               for s in sr.skipped]} for sr in run.steps],
    }


def _verdict_dict(run) -> Optional[Dict[str, Any]]:
    judged = verdict(run)
    if judged is None:
        return None
    return {"verdict": judged["verdict"], "next": NEXT[judged["verdict"]],
            "evidence": [{"step": sr.step.id, "target": target, "code": f.code, "message": f.message}
                         for sr, target, f in judged["evidence"]]}


def render_json(run, stream: TextIO, *, version: str) -> None:
    json.dump(render.strict_json(report_dict(run, version=version)), stream, indent=2,
              allow_nan=False, default=str)
    stream.write("\n")


# --------------------------------------------------------------------------- --list

def render_list(books: Sequence[Any], stream: TextIO) -> None:
    """``NAME  SOURCE  DESCRIPTION``, then each parameter on its own line under the description."""
    if not books:
        stream.write("no runbooks\n")
        return
    safe = render.safe_text   # a team's runbook directory may be shared: its text is inert too
    rows = [("NAME", "SOURCE", "DESCRIPTION")] + [(safe(b.name), safe(b.source), safe(b.description))
                                                  for b in books]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    indent = " " * (widths[0] + widths[1] + 4)
    for i, row in enumerate(rows):
        stream.write(f"{row[0].ljust(widths[0])}  {row[1].ljust(widths[1])}  {row[2]}".rstrip()
                     + "\n")
        for p in (books[i - 1].params if i else ()):
            default = f" (default: {safe(p.default)})" if p.default is not None else ""
            stream.write(f"{indent}--param {safe(p.name)}=...  {safe(p.description)}{default}\n")
