"""The wire format, and the one place where what a target sends back is let in (docs/architecture.md,
invariants 1 and 8).

Outbound: the command line carries only ``PYTHON -c BOOT``.  BOOT is a constant of ours made of
characters no shell treats specially inside single quotes, so every login shell (sh, bash, zsh,
fish, csh) passes it through untouched.  Everything else rides in the payload written to the
exec channel's stdin:

    len\\n STAGE_A · len [sha256]\\n _runtime.py · len\\n header JSON · len\\n the files, concatenated

(the header's ``files`` lists each file's name and size, in order).  Stage A
(``scripts/_stage_a.py``) checks the interpreter version before anything 3.8-only is compiled,
then loads the runtime, through the target's code cache when its line names its digest.

Inbound: the runtime prints one frame, ``BEGIN nonce`` · the result JSON · ``END nonce``, last
on stdout.  ``read_result`` finds it in linear time, bounds its size and nesting depth before
parsing, bounds every value in the parsed document (``bounded_values``: each int within
``MAX_INT`` either way, each float finite; each lone surrogate in a string or a key let in as
its ``\\udXXX`` escape, so no file, label or stream it reaches fails to encode it), and checks
the document against the result schema; anything else is a ``ProtocolError`` that becomes the
target's ``protocol`` row, never a crash of the run.  A run-script result may carry the text of
the script's $MLDIAG_RESULT file (``reported``): it is parsed and checked here too, and merged
(``take_report``); a file the script got wrong is that target's ``protocol`` error.

Progress, before the frame, only when the header asks for it (``"progress": true``: the client
shows a live display on a terminal): whole lines ``@@MLDIAG-PROGRESS nonce@@ {json}\n``, at most
about five a second, each at most ``MAX_PROGRESS_LINE`` bytes, ``MAX_PROGRESS_BYTES`` in all::

    {"seq": 0, "t": 1.25,                      # order, seconds since the runtime started
     "text": "Loading weights", "level": "INFO", "source": "transformers",   # the newest news:
                                               # a log record (INFO and up, any logger) or the
                                               # latest output line (source "stdout"/"stderr")
     "coalesced": 3,                           # newer news replaced that many older ones
     "output": [["stdout", "step 1\n"], ...]}  # run-script only: the output itself, in order

Every key but ``seq`` and ``t`` is optional.  ``ProgressReader`` takes stdout as it arrives
and lets in only whole, bounded lines with this run's nonce and this shape; everything else is
counted and skipped (never an error: progress is a courtesy, the frame is the result).
``diagnostics/scripts/_runtime.py`` cannot import this module (it is a remote single file):
it repeats the frame markers, and ``tests/unit/test_wire.py`` checks that both agree.
"""

import json
import math
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .paths import SCRIPTS_DIR
from .results import ACTIONS, ERROR_LAYERS, SCHEMA, STATUSES, with_findings, with_report

BOOT = "import sys;b=sys.stdin.buffer;exec(b.read(int(b.readline())))"
OLD_PYTHON_MARK = "@@MLDIAG-OLD-PYTHON"
FRAME_BEGIN = "@@MLDIAG-RESULT-BEGIN %s@@"
FRAME_END = "@@MLDIAG-RESULT-END %s@@"
PROGRESS_MARK = "@@MLDIAG-PROGRESS %s@@ "

# Runs under whatever python3 the target has (py3.0+ syntax only): refuse < 3.8 in a way the
# client recognises, then load the runtime from the stream (through the target's code cache when
# the runtime's length line names its digest) and hand it the rest of stdin.
def _read_stage_a() -> str:
    with open(os.path.join(SCRIPTS_DIR, "_stage_a.py"),
              encoding="utf-8") as f:
        return f.read()


STAGE_A = _read_stage_a()

# Characters a shell leaves alone inside single quotes, in every common shell (csh: no '!').
_FORBIDDEN_IN_BOOT = set("'\"\\!$`\n")
assert not (_FORBIDDEN_IN_BOOT & set(BOOT)), "BOOT must stay shell-inert"
assert OLD_PYTHON_MARK in STAGE_A

# Bounds on what a target may send back.  An honest result is a few KB (the runtime keeps
# at most 256 KB of a script's output); these leave room for big `data` while keeping one
# hostile target's cost to the client fixed.
MAX_RESULT_BYTES = 16 * 1024 * 1024      # the JSON between the markers
MAX_DEPTH = 64                           # nesting of [ and {
EXCERPT_CHARS = 160
# What the hops keep of each stream: stdout must hold a whole maximal frame in its tail (the
# runtime prints the frame last); stderr only feeds a tail into error rows.
STDOUT_HEAD, STDOUT_TAIL = 64 * 1024, MAX_RESULT_BYTES + 256 * 1024
STDERR_HEAD, STDERR_TAIL = 256 * 1024, 1024 * 1024
# A progress line: the runtime's are at most ~110 KB (8 K characters of output, JSON-escaped);
# all of a run's at most 2 MiB, so the stdout tail above still holds a maximal frame after them.
MAX_PROGRESS_LINE = 128 * 1024
MAX_PROGRESS_BYTES = 2 * 1024 * 1024
PROGRESS_STREAMS = ("stdout", "stderr")
# Every int a target sends is within MAX_INT either way: int64 less its one asymmetric value,
# what a Go or C reader of the saved JSON takes as an integer and a float holds without an
# overflow (Python's json reads 401 digits as an int, and 1e400 as inf: both refused).
MAX_INT = 2**63 - 1
# run-script's $MLDIAG_RESULT file, sent by the runtime unparsed (``reported``, at most its
# REPORT_LIMIT bytes: 6 MiB once JSON-escaped at worst, which leaves the frame room for the
# script's bounded output) and judged here: its keys, its findings' levels.
MAX_REPORT_BYTES = 1024 * 1024
REPORT_NAME = "the script's $MLDIAG_RESULT"
REPORT_KEYS = ("summary", "findings", "data")
REPORT_LEVELS = ("info", "ok", "warn", "fail")
FINDING_FIELDS = (("level", "code", "message"), ("hint", "action", "check"))   # required, optional


# ----------------------------------------------------------------------------- outbound


def bootstrap_argv(python: str) -> List[str]:
    """The whole command line of a run: the interpreter and our constant, nothing else."""
    return [python, "-c", BOOT]


def _part(data: bytes) -> bytes:
    return str(len(data)).encode("ascii") + b"\n" + data


def build_payload(runtime: bytes, header: dict, files: Dict[str, bytes],
                  runtime_digest: str = "") -> bytes:
    """The bytes written to the bootstrap's stdin. Files are plain concatenated bytes (no zip:
    its import and parse cost every target CPU time); the header says where each one ends,
    under its ``files`` key (reserved: a header that has one already is a bug of the caller).
    ``runtime_digest``: the runtime's SHA-256 (hex) after its length, for the target's code
    cache (stage A); empty: the target compiles it."""
    if "files" in header:
        raise ValueError("the header's 'files' key is the payload's own (the files' sizes)")
    if runtime_digest and not re.fullmatch(r"[0-9a-f]{64}", runtime_digest):
        raise ValueError(f"not a SHA-256 digest: {runtime_digest!r}")
    header = dict(header, files=[[name, len(data)] for name, data in files.items()])
    runtime_part = (str(len(runtime)).encode("ascii") + b" " + runtime_digest.encode("ascii") + b"\n"
                    + runtime) if runtime_digest else _part(runtime)
    return b"".join((_part(STAGE_A.encode("utf-8")), runtime_part,
                     _part(json.dumps(header).encode("utf-8")), _part(b"".join(files.values()))))


def parse_payload(payload: bytes) -> Tuple[str, bytes, dict, Dict[str, bytes]]:
    """Inverse of ``build_payload`` (what the target reads): (stage A, runtime, header, files)."""
    parts, rest = [], payload
    for _ in range(4):
        size, _, rest = rest.partition(b"\n")
        n = int(size.split(b" ")[0])   # the runtime's line may name its digest after the size
        if len(rest) < n:
            raise ValueError(f"payload truncated: a part of {n} bytes has {len(rest)}")
        parts.append(rest[:n])
        rest = rest[n:]
    if rest:
        raise ValueError(f"{len(rest)} trailing bytes after the bundle")
    header = json.loads(parts[2].decode("utf-8"))
    files, offset = {}, 0
    for name, size in header.pop("files"):
        files[name] = parts[3][offset:offset + size]
        offset += size
    return parts[0].decode("utf-8"), parts[1], header, files


# ----------------------------------------------------------------------------- inbound


class ProtocolError(ValueError):
    """The target answered, but not with a well-formed result (the ``protocol`` layer)."""

    def __init__(self, reason: str, excerpt: bytes = b""):
        self.reason = reason
        self.excerpt = safe_excerpt(excerpt) if excerpt else ""
        super().__init__(f"{reason}; it began {self.excerpt}" if self.excerpt else reason)


def safe_excerpt(data: bytes, limit: int = EXCERPT_CHARS) -> str:
    """A bounded, printable excerpt: control characters, non-ASCII and bad UTF-8 escaped
    (``\\x1b``, ``\\xe9``), never raw; at most ``limit`` characters between the quotes."""
    text = data[:limit * 4].decode("utf-8", "backslashreplace")
    escaped = ascii(text)[1:-1]
    cut = len(escaped) > limit or len(data) > limit * 4
    return "'" + escaped[:limit] + "'" + ("…" if cut else "")


def find_frame(stdout: bytes, nonce: str) -> Optional[bytes]:
    """The bytes between this run's last END marker and the BEGIN marker before it, or None
    when no END marker is there.  Two ``rfind``s: linear whatever else is on stdout."""
    end = ("\n" + FRAME_END % nonce).encode("ascii")
    begin = (FRAME_BEGIN % nonce + "\n").encode("ascii")
    stop = stdout.rfind(end)
    if stop < 0:
        return None
    start = stdout.rfind(begin, 0, stop + 1)
    if start < 0:
        raise ProtocolError(f"the result frame's end marker came without its begin marker "
                            f"(a frame over the {MAX_RESULT_BYTES // 2**20} MiB limit, or a "
                            f"broken one)", stdout[max(0, stop - EXCERPT_CHARS):stop])
    return stdout[start + len(begin):stop]


# A JSON string, or an unterminated one up to the end: it always matches from a `"`, so the
# scan never backtracks into a string (linear; a failed match would restart inside it).
_JSON_STRING = re.compile(rb'"(?:[^"\\]+|\\.)*"?', re.S)
_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def check_depth(text: bytes, limit: int = MAX_DEPTH, what: str = "the result") -> None:
    """Refuse nesting deeper than ``limit`` (or unbalanced brackets) before any parser recurses
    into it: strings removed, the brackets left peeled one level per round, in C. ``what``: the
    refusal's subject."""
    brackets = _JSON_STRING.sub(b"", text).translate(_BRACKETS_ONLY, _NOT_BRACKETS)
    if b"[" * (limit + 1) in brackets:     # the plain bomb, without peeling it 64 times
        brackets = b"["
    for _ in range(limit):
        if not brackets:
            return
        peeled = brackets.replace(b"[]", b"")
        if len(peeled) == len(brackets):
            break
        brackets = peeled
    if brackets:
        raise ProtocolError(f"{what} nests deeper than {limit} levels or its brackets do not "
                            f"balance", text)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")


class ValueOutOfBounds(ValueError):
    """A number past the bounds (``MAX_INT``, finite floats), with where it is in the document."""

    def __init__(self, what: str):
        self.what = what
        self.path: List[str] = []     # ".key" and "[i]", outermost first (filled in on the way out)
        super().__init__(what)

    def __str__(self) -> str:
        where = "".join(self.path)
        return f"{(where[1:] if where.startswith('.') else where) or 'the document'}: {self.what}"


# A lone surrogate: what a "\ud800" escape parses to; it cannot be encoded to UTF-8 (a file, a
# stream, a label), so it is let in as the six characters of its escape, as render.safe_text
# shows one.
_SURROGATE = re.compile("[\ud800-\udfff]")


def encodable(text: str) -> str:
    """``text`` with each lone surrogate as its ``\\udXXX`` escape; other text unchanged."""
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def bounded_values(value: Any) -> Any:
    """A parsed JSON value with every string (keys too) ``encodable`` and every number checked:
    an int within ``MAX_INT`` either way, a float finite, else ``ValueOutOfBounds`` naming the
    first one outside.  Containers are changed in place (the parser's own, never shared); the
    walk's depth is ``check_depth``'s bound."""
    if isinstance(value, str):
        return encodable(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_INT:
            raise ValueOutOfBounds(f"an integer of {len(str(abs(value)))} digits, past the "
                                   f"bound of 2**63 - 1 either way")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueOutOfBounds(f"{value!r}, not a finite number")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            try:
                value[i] = bounded_values(item)
            except ValueOutOfBounds as exc:
                exc.path.insert(0, f"[{i}]")
                raise
    elif isinstance(value, dict):
        if any(_SURROGATE.search(key) for key in value):
            escaped = {encodable(key): item for key, item in value.items()}
            if len(escaped) < len(value):
                raise ValueOutOfBounds("two keys that are one once their lone surrogates are "
                                       "escaped")
            value.clear()
            value.update(escaped)
        for key, item in value.items():
            try:
                value[key] = bounded_values(item)
            except ValueOutOfBounds as exc:
                exc.path.insert(0, "." + ascii(key)[1:-1][:40])
                raise
    return value


def decode_result(frame: bytes, returned_by: Optional[str] = None) -> Dict[str, Any]:
    """The frame's document, parsed only once its size and depth are known to be bounded, its
    numbers bounded and its strings encodable (``bounded_values``), and checked against the
    result schema. ``returned_by``: the team diagnostic's file the job ran, whose run() value
    the runtime sends as it is (``take_returned``)."""
    if len(frame) > MAX_RESULT_BYTES:
        raise ProtocolError(f"the result is {len(frame)} bytes, over the "
                            f"{MAX_RESULT_BYTES // 2**20} MiB limit", frame)
    check_depth(frame)
    try:
        doc = json.loads(frame.decode("utf-8"), parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:   # UnicodeDecodeError is a ValueError
        raise ProtocolError(f"the result is not JSON ({str(exc)[:120]})", frame) from None
    try:
        doc = bounded_values(doc)
    except ValueOutOfBounds as exc:
        raise ProtocolError(str(exc), frame) from None
    problem = schema_problem(doc)
    if problem:
        raise ProtocolError(problem, frame)
    if "reported" in doc:
        doc = take_report(doc, frame)
    if "returned" in doc:
        doc = take_returned(doc, frame, returned_by)
    return doc


def take_returned(doc: Dict[str, Any], frame: bytes, script: Optional[str]) -> Dict[str, Any]:
    """A team diagnostic's result: what its ``run(args)`` returned (``returned``, sent by the
    runtime as it was) checked as a $MLDIAG_RESULT report is (``report_problem``: an object of
    ``summary``, ``findings``, ``data``) and made the document: its findings, the status of the
    worst of them, its summary (else the status), its data. Anything else is that target's
    ``protocol`` error naming the file. A ``returned`` from a job that is not a team's is the
    runtime's fault, a ProtocolError as any other."""
    returned = doc.pop("returned")
    if script is None:
        raise ProtocolError("returned in the result of a diagnostic that is not a team's", frame)
    problem = report_problem(returned, f"{script}'s run() value")
    if problem:
        return report_refused(doc, problem)
    findings = returned.get("findings") or []
    doc["findings"] = findings
    doc["status"] = with_findings("ok", [f["level"] for f in findings])
    summary = returned.get("summary")
    doc["summary"] = summary if summary and summary.strip() else doc["status"]
    doc["data"] = returned.get("data") or {}
    return doc


def take_report(doc: Dict[str, Any], frame: bytes) -> Dict[str, Any]:
    """run-script: ``doc`` (schema-checked) with the script's $MLDIAG_RESULT file, which the
    runtime sends unparsed as ``reported`` (``{"text": ...}``, or ``{"problem": ...}`` when it
    would not read the file), parsed, checked and merged (``results.with_report``). A file the
    script got wrong makes ``doc`` that target's ``protocol`` error naming $MLDIAG_RESULT, with
    its exit code, stdout and stderr kept; a ``reported`` of another shape is the runtime's own
    fault, a ProtocolError as any other."""
    reported = doc.pop("reported")
    kind = next(iter(reported), None) if isinstance(reported, dict) and len(reported) == 1 else None
    if kind not in ("text", "problem") or not isinstance(reported[kind], str):
        raise ProtocolError("reported is not an object of one string, its text or its problem",
                            frame)
    if kind == "problem":
        return report_refused(doc, f"{REPORT_NAME} {reported['problem'][:200]}")
    try:
        report = parse_report(reported["text"])
    except ProtocolError as exc:
        return report_refused(doc, str(exc))
    return with_report(doc, report)


def report_refused(doc: Dict[str, Any], message: str) -> Dict[str, Any]:
    """``doc`` as the target's ``protocol`` error saying ``message``; its data stays. Its type
    restates the layer, so the table says the message once (render._error_text)."""
    doc.update(status="error", summary=f"protocol: {message}", findings=[],
               error={"layer": "protocol", "type": "protocol", "message": message,
                      "traceback": None, "stderr": None})
    return doc


def parse_report(text: str) -> Dict[str, Any]:
    """The script's report (the text of its $MLDIAG_RESULT file), parsed within the bounds a
    result has and checked (``report_problem``), else ProtocolError naming $MLDIAG_RESULT. One
    level less deep than a result: its ``data`` goes under the result's ``data.reported``."""
    data = text.encode("utf-8")
    if len(data) > MAX_REPORT_BYTES:
        raise ProtocolError(f"{REPORT_NAME} holds {len(data)} bytes, over the limit of "
                            f"{MAX_REPORT_BYTES}", data)
    check_depth(data, MAX_DEPTH - 1, REPORT_NAME)
    try:
        report = bounded_values(json.loads(text, parse_constant=_reject_constant))
    except ValueOutOfBounds as exc:
        raise ProtocolError(f"{REPORT_NAME} {exc}", data) from None
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"{REPORT_NAME} is not JSON ({str(exc)[:120]})", data) from None
    problem = report_problem(report)
    if problem:
        raise ProtocolError(problem, data)
    return report


def report_problem(report: Any, name: str = REPORT_NAME) -> Optional[str]:
    """What is wrong with a parsed $MLDIAG_RESULT file (or what ``name`` says: a team
    diagnostic's run() value), or None: an object of ``REPORT_KEYS``
    only (each may be absent or null), ``summary`` a string, ``data`` an object, ``findings`` a
    list of findings as a result's are, each of a level in ``REPORT_LEVELS``."""
    if not isinstance(report, dict):
        return f"{name} holds {_type_name(report)}, not an object"
    for key in report:
        if key not in REPORT_KEYS:
            return f"{name} has {key[:40]!r}, not one of {', '.join(REPORT_KEYS)}"
    for key, kind in (("summary", str), ("data", dict), ("findings", list)):
        value = report.get(key)
        if value is not None and not isinstance(value, kind):
            return f"{name} {key} is {_type_name(value)}, not {_type_name(kind())}"
    for i, finding in enumerate(report.get("findings") or ()):
        where = f"{name} findings[{i}]"
        problem = _finding_item_problem(where, finding)
        if problem:
            return problem
        if finding["level"] not in REPORT_LEVELS:
            return f"{where}.level {finding['level'][:40]!r} is not one of {', '.join(REPORT_LEVELS)}"
    return None


def read_result(stdout: bytes, nonce: str, returned_by: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """This run's validated result document from the target's stdout; None when no frame
    came back at all (the hops then classify what went wrong); ProtocolError when one came
    back malformed. ``returned_by``: as ``decode_result``."""
    frame = find_frame(stdout, nonce)
    return None if frame is None else decode_result(frame, returned_by)


# ----------------------------------------------------------------------------- progress


class ProgressReader:
    """Progress records from a target's stdout, fed chunk by chunk as they arrive.

    Bounded whatever the target sends: a partial line is kept only while it can still be a
    progress line of ours and is at most ``MAX_PROGRESS_LINE`` bytes; any other line (the frame,
    noise) is skipped without being kept.  A line with another nonce, bad JSON, deep nesting or
    the wrong shape is counted in ``ignored`` and dropped.  ``on_record`` gets a clean dict (only
    the documented keys, checked types); its text is still the target's: show it through
    ``render.safe_text``."""

    def __init__(self, nonce: str, on_record):
        self.mark = (PROGRESS_MARK % nonce).encode("ascii")
        self.prefix = PROGRESS_MARK.split(" ")[0].encode("ascii")   # any run's progress line
        self.on_record = on_record
        self.buf = bytearray()
        self.skipping = False     # inside a line that is not ours: drop up to its newline
        self.accepted = 0
        self.ignored = 0
        self.received = 0         # bytes of progress lines let in
        self.last_seq = -1

    def feed(self, data: bytes) -> None:
        start = 0
        while start < len(data):
            nl = data.find(b"\n", start)
            end = len(data) if nl < 0 else nl
            if not self.skipping:
                self.buf += data[start:end]
                if not self._may_be_ours():
                    self.skipping = True
                    if self.buf.startswith(self.prefix):
                        self.ignored += 1      # a progress line, but too long
                    self.buf.clear()
            if nl < 0:
                return
            if not self.skipping and self.buf:
                self._line(bytes(self.buf))
            self.buf.clear()
            self.skipping = False
            start = nl + 1

    def _may_be_ours(self) -> bool:
        n = min(len(self.buf), len(self.prefix))
        if bytes(self.buf[:n]) != self.prefix[:n]:
            return False
        return len(self.buf) <= MAX_PROGRESS_LINE

    def _line(self, line: bytes) -> None:
        if not line.startswith(self.prefix):
            return                           # some other line (the frame's blank line before)
        record = None
        if line.startswith(self.mark) and self.received + len(line) + 1 <= MAX_PROGRESS_BYTES:
            record = parse_progress(line[len(self.mark):])
        if record is None or record["seq"] <= self.last_seq:
            self.ignored += 1
            return
        self.last_seq = record["seq"]
        self.received += len(line) + 1    # with its newline
        self.accepted += 1
        self.on_record(record)


def parse_progress(text: bytes) -> Optional[Dict[str, Any]]:
    """One progress record, checked (see the module's docstring), or None."""
    try:
        check_depth(text, 4)
        doc = bounded_values(json.loads(text.decode("utf-8"), parse_constant=_reject_constant))
    except (ValueError, RecursionError, ProtocolError):   # ValueOutOfBounds is a ValueError
        return None
    if not isinstance(doc, dict):
        return None
    seq, t = doc.get("seq"), doc.get("t")
    if not (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 and _is_number(t)):
        return None
    record: Dict[str, Any] = {"seq": seq, "t": float(t)}
    for key in ("text", "level", "source"):
        if key in doc:
            if not isinstance(doc[key], str):
                return None
            record[key] = doc[key]
    coalesced = doc.get("coalesced", 0)
    if not isinstance(coalesced, int) or isinstance(coalesced, bool) or coalesced < 0:
        return None
    if coalesced:
        record["coalesced"] = coalesced
    if "output" in doc:
        output = doc["output"]
        if not isinstance(output, list):
            return None
        for piece in output:
            if not (isinstance(piece, list) and len(piece) == 2 and piece[0] in PROGRESS_STREAMS
                    and isinstance(piece[1], str)):
                return None
        record["output"] = [(stream, text) for stream, text in output]
    return record


# ----------------------------------------------------------------------------- the schema


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fields_problem(where: str, obj: Any, required: Sequence[str],
                    optional: Sequence[str] = ()) -> Optional[str]:
    """``obj`` an object; each of ``required`` present and a string; each of ``optional``
    absent, null or a string. Other keys are ignored (and dropped by ``Result.from_dict``)."""
    if not isinstance(obj, dict):
        return f"{where} is {_type_name(obj)}, not an object"
    for key in required:
        if key not in obj:
            return f"{where} has no {key!r}"
    for key in list(required) + list(optional):
        value = obj.get(key)
        if isinstance(value, str) or (value is None and key not in required):
            continue
        return f"{where}.{key} is {_type_name(value)}, not a string"
    return None


def _finding_problem(where: str, finding: Dict[str, Any]) -> Optional[str]:
    """A finding's schema-2 keys: ``action`` one of ACTIONS, ``gpus`` a list of GPU indices
    (or PCI addresses of GPUs that are gone), ``ports`` a list of names."""
    action = finding.get("action")
    if action is not None and action not in ACTIONS:
        return f"{where}.action {action[:40]!r} is not one of {', '.join(ACTIONS)}"
    for key, kinds in (("gpus", (int, str)), ("ports", (str,))):
        value = finding.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            return f"{where}.{key} is {_type_name(value)}, not a list"
        for item in value:
            if not isinstance(item, kinds) or isinstance(item, bool):
                return f"{where}.{key} holds {_type_name(item)}, not {' or '.join(_type_name(k()) for k in kinds)}"
    return None


def _finding_item_problem(where: str, item: Any) -> Optional[str]:
    """A finding's fields (``FINDING_FIELDS``) and its schema-2 keys."""
    return _fields_problem(where, item, *FINDING_FIELDS) or _finding_problem(where, item)


def _log_item_problem(where: str, item: Any) -> Optional[str]:
    return _fields_problem(where, item, ("level", "source", "message"))


def schema_problem(doc: Any) -> Optional[str]:
    """What is wrong with ``doc`` as a result document (docs/architecture.md, the result document), or None.  Renderers,
    redaction and ``--save`` only ever see documents this accepts."""
    if not isinstance(doc, dict):
        return f"the result is {_type_name(doc)}, not an object"
    for key in ("schema", "status", "summary", "findings", "data", "log", "error"):
        if key not in doc:
            return f"the result has no {key!r}"
    if doc["schema"] != SCHEMA or not isinstance(doc["schema"], int) or isinstance(doc["schema"], bool):
        return f"schema is {doc['schema']!r:.40}, not {SCHEMA}"
    if not isinstance(doc["status"], str) or doc["status"] not in STATUSES:
        shown = repr(doc["status"])[:40] if isinstance(doc["status"], str) else _type_name(doc["status"])
        return f"status is {shown}, not one of {', '.join(STATUSES)}"
    for key in ("summary",):
        if not isinstance(doc[key], str):
            return f"{key} is {_type_name(doc[key])}, not a string"
    for key in ("diagnostic", "target"):
        if key in doc and doc[key] is not None and not isinstance(doc[key], str):
            return f"{key} is {_type_name(doc[key])}, not a string"
    if "duration_s" in doc and not _is_number(doc["duration_s"]):
        return f"duration_s is {_type_name(doc['duration_s'])}, not a number"
    if not isinstance(doc["data"], dict):
        return f"data is {_type_name(doc['data'])}, not an object"
    for name, check in (("findings", _finding_item_problem), ("log", _log_item_problem)):
        items = doc[name]
        if not isinstance(items, list):
            return f"{name} is {_type_name(items)}, not a list"
        for i, item in enumerate(items):
            problem = check(f"{name}[{i}]", item)
            if problem:
                return problem
    error = doc["error"]
    if error is not None:
        problem = _fields_problem("error", error, ("layer", "type", "message"),
                                  ("traceback", "stderr"))
        if problem:
            return problem
        if error["layer"] not in ERROR_LAYERS:
            return f"error.layer {error['layer'][:40]!r} is not a known layer"
    return None
