"""``--jsonl``: JSON Lines on stdout for pipelines and log shippers — one result document per
line as each target's result arrives (the object ``--json`` prints in its list), flushed at
once, then one summary line::

    {"schema": 2, "diagnostic": "ping", "target": "gpu01", "status": "ok", ...}
    {"summary": {"diagnostic": "ping", "targets": 1, "ok": 1, "warn": 0, "fail": 0,
                 "error": 0, "exit_code": 0}}

(each on one line). A result line always has ``target``; the summary line is the one object
whose only key is ``summary``. JSON's own escaping keeps every line one line and ASCII (a
newline or U+2028 in a target's text is ``\\n``, ``\\u2028``).
"""

import json
from typing import Any, Dict, Iterable, Optional, Sequence, TextIO

from ..core.results import STATUSES, Result, exit_code, known_status
from .render import strict_json


def line(doc: Any) -> str:
    """One JSON text without a line break (NaN and the infinities as strings, as ``--json``)."""
    return json.dumps(strict_json(doc), allow_nan=False, default=str, separators=(",", ":"))


def write_result(result: Result, stream: TextIO) -> None:
    stream.write(line(result.to_dict()) + "\n")
    stream.flush()


def summary(results: Iterable[Result], *, diagnostic: Optional[str] = None,
            code: Optional[int] = None, interrupted_code: Optional[int] = None,
            not_finished: Sequence[str] = ()) -> Dict[str, Any]:
    """Counts by status, and the exit code: ``code``, else the one the results give
    (``interrupted_code``: the run was ended by Ctrl-C, TERM or HUP with that code, before
    ``not_finished`` answered)."""
    results = list(results)
    counts = {s: 0 for s in STATUSES}
    for r in results:
        counts[known_status(r.status)] += 1
    doc: Dict[str, Any] = {}
    if diagnostic:
        doc["diagnostic"] = diagnostic
    doc.update(targets=len(results), **counts)
    if interrupted_code is not None:
        doc.update(exit_code=interrupted_code, interrupted=True, not_finished=list(not_finished))
    else:
        doc["exit_code"] = exit_code(results) if code is None else code
    return {"summary": doc}


def write_summary(results: Iterable[Result], stream: TextIO, **kw: Any) -> None:
    stream.write(line(summary(results, **kw)) + "\n")
    stream.flush()
