"""The result document (docs/architecture.md, the result document) as typed data, and the one
definition of its orders: statuses, finding levels, actions, and the exit code they give.

Every ranking in the client takes its rule from here, with one rule for a value it does not know
(a target may send anything the schema lets through): an unknown status or level ranks as
``error`` (never hidden), an unknown action as no action (a drain must be asked for by an action
we know: it takes a node from every user of the cluster). The remote scripts, which cannot import
this package, keep copies that tests/unit/test_order.py holds against these."""

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional

from . import errors

SCHEMA = 2   # 2: findings may carry action, check, ports (node-check)
# What a finding asks of a person, least to most severe (docs/architecture.md, the result document): ``app`` is the
# application's fault, not the node's; ``drain`` and worse take the node out of service.
ACTIONS = ("none", "monitor", "app", "reset-gpu", "reboot", "drain", "rma")
_ACTION_RANK = {a: i for i, a in enumerate(ACTIONS)}
STATUSES = ("ok", "warn", "fail", "error")  # also the order "worst last"
_RANK = {s: i for i, s in enumerate(STATUSES)}
LEVELS = ("info", "warn", "fail")   # a finding's level: info counts as ok
ERROR_LAYERS = ("unreachable", "auth", "hostkey", "become", "container", "interpreter",
                "upload", "timeout", "crashed", "killed", "protocol", "internal")
_EXIT_BY_STATUS = {"ok": errors.EXIT_OK, "warn": errors.EXIT_WARN,
                   "fail": errors.EXIT_FAIL, "error": errors.EXIT_ERROR}


def status_rank(status: Any) -> int:
    """0 for ok … 3 for error; unknown statuses rank as error (never hide a problem)."""
    return _RANK.get(status, _RANK["error"]) if isinstance(status, str) else _RANK["error"]


def known_status(status: Any) -> str:
    """``status`` when it is one of STATUSES, else ``error``."""
    return STATUSES[status_rank(status)]


def level_rank(level: Any) -> int:
    """A finding's level ranked as the status it makes: info and ok 0, warn 1, fail 2; a level we
    do not know ranks as error."""
    return status_rank("ok" if level == "info" else level)


def worst_status(statuses: Iterable[str]) -> str:
    worst = "ok"
    for s in statuses:
        if status_rank(s) > status_rank(worst):
            worst = known_status(s)
    return worst


def with_findings(status: str, levels: Iterable[str]) -> str:
    """``status`` made as bad as the worst finding's ``levels`` (``info`` counts as ok)."""
    return worst_status([status] + ["ok" if level == "info" else level for level in levels])


def with_report(doc: Dict[str, Any], report: Dict[str, Any]) -> Dict[str, Any]:
    """A run-script document (``doc``: exit code, stdout, stderr) with what the script reported
    in its $MLDIAG_RESULT file (``report``, checked by wire.py): its findings; the status the
    worse of the exit code's (0 ok, else fail) and the worst finding's; its summary in place of
    ``exit 0``, after ``exit N...; `` otherwise; its ``data`` whole under ``data.reported``
    (mldiag's own keys are never touched)."""
    findings = report.get("findings") or []
    doc["findings"] = list(doc["findings"]) + findings
    doc["status"] = with_findings(doc["status"], [f["level"] for f in findings])
    summary = report.get("summary")
    if summary and summary.strip():
        doc["summary"] = summary if doc["data"].get("exit_code") == 0 else f"{doc['summary']}; {summary}"
    if report.get("data") is not None:
        doc["data"]["reported"] = report["data"]
    return doc


def action_rank(action: Any) -> int:
    """-1 for no action or one we do not know; 0 (none) … 6 (rma)."""
    return _ACTION_RANK.get(action, -1) if isinstance(action, str) else -1


def worst_of_actions(actions: Iterable[Any]) -> Optional[str]:
    """The most severe action we know among ``actions`` (None when there is none)."""
    worst = None
    for action in actions:
        if action_rank(action) > action_rank(worst):
            worst = action
    return worst


def worst_action(findings: Iterable["Finding"]) -> Optional[str]:
    """The most severe action among ``findings`` (None when none carries one)."""
    return worst_of_actions(f.action for f in findings)


def exit_code(results: Iterable["Result"]) -> int:
    """Nagios-style: 0 all ok, 1 worst warn, 2 worst fail, 3 worst error."""
    return _EXIT_BY_STATUS[worst_status(r.status for r in results)]


@dataclass
class Finding:
    level: str
    code: str
    message: str
    hint: Optional[str] = None
    gpus: Optional[List[Any]] = None   # the GPUs (indices) it is about, as the target said
    action: Optional[str] = None       # one of ACTIONS (schema 2)
    check: Optional[str] = None        # node-check: which check found it (xid, nvlink, ib, ...)
    ports: Optional[List[str]] = None  # non-GPU things it is about: IB ports, NICs by PCI address

    def to_dict(self) -> Dict[str, Any]:
        d = {"level": self.level, "code": self.code, "message": self.message}
        if self.hint:
            d["hint"] = self.hint
        for key in ("gpus", "action", "check", "ports"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return d

    @classmethod
    def from_dict(cls, f: Dict[str, Any]) -> "Finding":
        return cls(level=f.get("level", "warn"), code=f.get("code", ""),
                   message=f.get("message", ""), hint=f.get("hint"), gpus=f.get("gpus"),
                   action=f.get("action"), check=f.get("check"), ports=f.get("ports"))


@dataclass
class ErrorInfo:
    layer: str
    type: str
    message: str
    traceback: Optional[str] = None
    stderr: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        return {"layer": self.layer, "type": self.type, "message": self.message,
                "traceback": self.traceback, "stderr": self.stderr}


@dataclass
class Result:
    diagnostic: str
    target: str
    status: str
    summary: str
    findings: List[Finding] = field(default_factory=list)
    data: Dict[str, Any] = field(default_factory=dict)
    log: List[Dict[str, Any]] = field(default_factory=list)
    error: Optional[ErrorInfo] = None
    duration_s: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        return {
            "schema": SCHEMA,
            "diagnostic": self.diagnostic,
            "target": self.target,
            "status": self.status,
            "summary": self.summary,
            "findings": [f.to_dict() for f in self.findings],
            "data": self.data,
            "log": self.log,
            "error": self.error.to_dict() if self.error else None,
            "duration_s": round(self.duration_s, 3),
        }

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Result":
        err = d.get("error")
        return cls(
            diagnostic=str(d.get("diagnostic", "")),
            target=str(d.get("target", "")),
            status=d.get("status") if d.get("status") in _RANK else "error",
            summary=str(d.get("summary", "")),
            findings=[Finding.from_dict(f) for f in d.get("findings") or []],
            data=d.get("data") or {},
            log=list(d.get("log") or []),
            error=ErrorInfo(layer=err.get("layer", "internal"), type=err.get("type", ""),
                            message=err.get("message", ""), traceback=err.get("traceback"),
                            stderr=err.get("stderr")) if err else None,
            duration_s=float(d.get("duration_s") or 0.0),
        )

    @classmethod
    def failure(cls, diagnostic: str, target: str, layer: str, message: str, *,
                type: str = "", stderr: Optional[str] = None, traceback: Optional[str] = None,
                duration_s: float = 0.0) -> "Result":
        """A target that could not be checked: status ``error`` with the layer that failed."""
        return cls(diagnostic=diagnostic, target=target, status="error",
                   summary=f"{layer}: {message}",
                   error=ErrorInfo(layer=layer, type=type or layer, message=message,
                                   traceback=traceback, stderr=stderr),
                   duration_s=duration_s)
