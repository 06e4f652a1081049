"""``--junit FILE``: the results as a JUnit XML report, what Jenkins, GitLab and GitHub's test
reporters read (valid against the Jenkins xUnit plugin's JUnit schema,
tests/fixtures/junit/jenkins-junit.xsd).

The layout (docs/tasks.md, "Reports for CI and pipelines"):

- one ``<testsuite>`` per diagnostic (a runbook: one per step), named ``mldiag.DIAGNOSTIC``,
  which is also each of its testcases' ``classname``;
- one ``<testcase>`` per target and check, a check being a finding's code, ``TARGET: CODE``,
  after the target's own, ``TARGET: DIAGNOSTIC``, there in every run (a test's history in
  Jenkins follows its name): it fails only where no finding says why (a run-script's exit
  code), and is the ``<error>`` of a target that could not be checked;
- a fail-level finding is a ``<failure type=CODE message=...>`` holding every finding of that
  code (level, message, hint, action, GPUs, ports); a target that could not be checked
  (status ``error``: unreachable, timed out, crashed) an ``<error type=LAYER>``; a ``warn`` or
  ``info`` finding passes, its text kept in the testcase's ``<system-out>`` (JUnit has no
  "passed with a warning": a failure would turn a Jenkins build UNSTABLE for what mldiag's own
  exit code calls a warning (1), and ``<skipped>`` would say the check did not run);
- a target's own testcase keeps its status and summary in ``<system-out>``, with what a
  run-script printed (the tails the table shows);
- ``time``: a testcase's is its target's run (every check of a target ran in that one run), a
  suite's the wall-clock time of the whole fan-out.

Everything a target sent is untrusted (docs/architecture.md, invariant 8): each string is
made XML 1.0 text here (a character XML forbids, and a bidi or C1 control that would mislead a
reader of the CI page, becomes a visible escape such as ``\\x1b``), every text is bounded, and so
is the number of testcases one target can make. The file itself is written by the engine
(``engine/execute.py: ReportFile``: a temp name and a rename, never through a link).
"""

import datetime
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from ..core.results import Finding, Result, level_rank, status_rank
from .render import output_blocks

# what a single attribute (a message) and a single element's text keep, in characters
MESSAGE_CHARS = 500
TEXT_CHARS = 8 * 1024
STDERR_CHARS = 4 * 1024           # the tail of a failed target's stderr (and traceback)
FINDINGS_PER_CASE = 20            # findings of one code written out in one testcase
CASES_PER_TARGET = 100            # codes of one target with a testcase of their own; the rest share one

_FAIL = status_rank("fail")
_ERROR = status_rank("error")

# XML 1.0 forbids C0 controls but tab, newline and carriage return, the surrogates, U+FFFE and
# U+FFFF; C1 controls, the bidi controls and U+2028/2029 are allowed but mislead whoever reads
# the report in a browser (render.UNSAFE's reasoning). Each becomes a visible escape.
_UNSAFE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e"
                     "\u2066-\u2069\ud800-\udfff\ufffe\uffff]")
_LINE_BREAKS = re.compile(r"\r\n?|\n|\t")


def _visible(match: "re.Match[str]") -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def xml_text(value: Any, limit: int = TEXT_CHARS, *, tail: bool = False) -> str:
    """``value`` as XML 1.0 character data: line ends made ``\\n``, every character XML forbids
    (or that misleads a reader) a visible escape, at most ``limit`` characters kept (the first
    ones; ``tail``: the last ones) with how many were left out."""
    text = "" if value is None else value if isinstance(value, str) else str(value)
    text = _UNSAFE.sub(_visible, text.replace("\r\n", "\n").replace("\r", "\n"))
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    if tail:
        return f"\N{HORIZONTAL ELLIPSIS} ({cut} characters before)\n" + text[-limit:]
    return text[:limit] + f"\N{HORIZONTAL ELLIPSIS} ({cut} more characters)"


def xml_line(value: Any, limit: int = MESSAGE_CHARS) -> str:
    """One line of XML text for an attribute (a name, a message): line breaks and tabs become
    spaces, bounded as ``xml_text``."""
    text = "" if value is None else value if isinstance(value, str) else str(value)
    return xml_text(_LINE_BREAKS.sub(" ", text), limit)


@dataclass
class NotRun:
    """A target of a suite without a result: a runbook step skipped there (``skipped``), a
    target left unfinished by Ctrl-C or TERM (``error``: the check was asked for and did not
    happen)."""
    target: str
    kind: str                 # runbook.Skip's kind, or "interrupted"
    reason: str
    error: bool = False


@dataclass
class Suite:
    """One ``<testsuite>``: ``name`` (``mldiag.node-check``), also its testcases' classname."""
    name: str
    results: Sequence[Result]
    check: str                                     # the diagnostic (a target's testcase name)
    time_s: Optional[float] = None                 # None: the longest target's run
    started: Optional[datetime.datetime] = None
    not_run: Sequence[NotRun] = field(default_factory=tuple)


def suite_name(*parts: str) -> str:
    return ".".join(["mldiag", *parts])


def _seconds(value: Any) -> str:
    """``12.345``: what the schema's SUREFIRE_TIME takes (no exponent, at most 3 decimals)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = 0.0
    if not seconds >= 0 or seconds == float("inf"):   # NaN, negative, infinite
        seconds = 0.0
    return f"{seconds:.3f}"


def _finding_text(f: Finding) -> str:
    """A finding as a person reads it; each field bounded on its own first (the group's text
    is bounded again: a target's megabytes are never copied around whole)."""
    lines = [f"{xml_line(f.level)}: {xml_text(f.message)}"]
    if f.hint:
        lines.append(f"hint: {xml_text(f.hint)}")
    about = [f"{key}: {value}" for key, value in (
        ("action", f.action), ("check", f.check),
        ("gpus", ", ".join(str(g) for g in f.gpus) if f.gpus else None),
        ("ports", ", ".join(str(p) for p in f.ports) if f.ports else None)) if value]
    if about:
        lines.append(xml_line("; ".join(about), TEXT_CHARS))
    return "\n".join(lines)


def _findings_text(findings: Sequence[Finding]) -> str:
    parts = [_finding_text(f) for f in findings[:FINDINGS_PER_CASE]]
    if len(findings) > FINDINGS_PER_CASE:
        parts.append(f"\N{HORIZONTAL ELLIPSIS} {len(findings) - FINDINGS_PER_CASE} more findings "
                     f"(--json/--save have them all)")
    return "\n\n".join(parts)


def _by_code(findings: Sequence[Finding]) -> List[Tuple[str, List[Finding]]]:
    """The findings grouped by code, in the order each code first appears; past
    CASES_PER_TARGET codes the rest share one group (its name says how many checks)."""
    groups: Dict[str, List[Finding]] = {}
    for f in findings:
        code = f.code if isinstance(f.code, str) and f.code else "(no code)"
        groups.setdefault(code, []).append(f)
    items = list(groups.items())
    if len(items) <= CASES_PER_TARGET:
        return items
    kept, rest = items[:CASES_PER_TARGET - 1], items[CASES_PER_TARGET - 1:]
    return kept + [(f"{len(rest)} more checks", [f for _, fs in rest for f in fs])]


def _case(suite: Suite, target: str, check: str, time: str) -> ET.Element:
    return ET.Element("testcase", {"name": xml_line(f"{target}: {check}"),
                                   "classname": xml_line(suite.name), "time": time})


def _child(case: ET.Element, tag: str, text: str, **attrs: str) -> ET.Element:
    element = ET.SubElement(case, tag, {k: v for k, v in attrs.items() if v is not None})
    element.text = text
    return element


def _error_text(result: Result) -> str:
    err = result.error
    if err is None:
        return xml_text(result.summary)
    parts = [xml_text(f"{err.layer}: {err.message}" if err.message else err.layer, MESSAGE_CHARS * 2)]
    if err.type and err.type != err.layer:
        parts.append(xml_line(f"type: {err.type}"))
    for label, value in (("stderr", err.stderr), ("traceback", err.traceback)):
        if isinstance(value, str) and value.strip():
            parts.append(f"{label}:\n" + xml_text(value.rstrip("\n"), STDERR_CHARS, tail=True))
    return "\n".join(parts)


def _target_out(result: Result) -> str:
    """What a person reads first about the target (its status and summary), then the output a
    run-script printed or a backend's traceback, as the table shows them (``render.output_blocks``:
    the last lines, each clipped)."""
    parts = [f"{result.status}: {result.summary}"]
    for label, lines in output_blocks(result):
        parts.append(f"{label}:\n" + "\n".join(f"  {line}" for line in lines))
    return "\n\n".join(parts)


def result_cases(suite: Suite, result: Result) -> List[ET.Element]:
    """The testcases of one target's result (the module docstring says which and why)."""
    target = result.target
    time = _seconds(result.duration_s)
    cases = []
    worst_level = 0
    for code, findings in _by_code(result.findings):
        rank = max(level_rank(f.level) for f in findings)
        worst_level = max(worst_level, rank)
        case = _case(suite, target, code, time)
        text = xml_text(_findings_text(findings))
        if rank >= _FAIL:   # fail, or a level we do not know (ranked as error: never hidden)
            first = next(f for f in findings if level_rank(f.level) >= _FAIL)
            _child(case, "failure", text, type=xml_line(code), message=xml_line(first.message))
        else:
            _child(case, "system-out", text)
        cases.append(case)
    status = status_rank(result.status)
    case = _case(suite, target, suite.check, time)
    if status >= _ERROR and (result.error is not None or status > worst_level):
        layer = result.error.layer if result.error is not None else "error"
        _child(case, "error", _error_text(result), type=xml_line(layer),
               message=xml_line(result.summary or layer))
    elif status >= _FAIL and status > worst_level:   # a fail no finding says (an exit code)
        _child(case, "failure", xml_text(result.summary), type=xml_line(result.status),
               message=xml_line(result.summary))
    _child(case, "system-out", xml_text(_target_out(result)))
    return [case] + cases


def _not_run_case(suite: Suite, missing: NotRun) -> ET.Element:
    case = _case(suite, missing.target, suite.check, _seconds(0))
    tag = "error" if missing.error else "skipped"
    _child(case, tag, xml_text(missing.reason), type=xml_line(missing.kind),
           message=xml_line(missing.reason))
    return case


def _counts(cases: Sequence[ET.Element]) -> Dict[str, int]:
    def having(tag: str) -> int:
        return sum(1 for c in cases if c.find(tag) is not None)
    return {"tests": len(cases), "failures": having("failure"), "errors": having("error"),
            "skipped": having("skipped")}


def suite_element(suite: Suite) -> ET.Element:
    cases = [c for r in suite.results for c in result_cases(suite, r)]
    cases += [_not_run_case(suite, m) for m in suite.not_run]
    counts = _counts(cases)
    time = suite.time_s if suite.time_s is not None else \
        max((r.duration_s for r in suite.results), default=0.0)
    attrs = {"name": xml_line(suite.name), **{k: str(v) for k, v in counts.items()},
             "time": _seconds(time)}
    if suite.started is not None:    # local time without a zone, as Ant and Surefire write it
        attrs["timestamp"] = suite.started.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    element = ET.Element("testsuite", attrs)
    element.extend(cases)
    return element


def render_junit(suites: Sequence[Suite], stream: TextIO) -> None:
    """The report: ``<testsuites>`` with one ``<testsuite>`` per suite, UTF-8, indented."""
    elements = [suite_element(s) for s in suites]
    totals = {k: sum(int(e.get(k)) for e in elements) for k in ("tests", "failures", "errors")}
    root = ET.Element("testsuites", {"name": "mldiag", **{k: str(v) for k, v in totals.items()},
                                     "time": _seconds(sum(float(e.get("time")) for e in elements))})
    root.extend(elements)
    ET.indent(root)
    stream.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    stream.write(ET.tostring(root, encoding="unicode"))
    stream.write("\n")
