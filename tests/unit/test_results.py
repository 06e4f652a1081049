"""diagnostics.core.results: the result document as data (DESIGN.md §4), statuses and exit codes.

Written against a mutation run (setup.cfg [mutmut]): every default, every key and every rank
below is one that a one-token change of results.py would get wrong."""
import pytest

from diagnostics.core import errors
from diagnostics.core.results import (ACTIONS, ERROR_LAYERS, SCHEMA, STATUSES, ErrorInfo, Finding, Result,
                                 action_rank, exit_code, status_rank, worst_action, worst_status)


def test_the_vocabulary_is_pinned():
    assert SCHEMA == 2
    assert STATUSES == ("ok", "warn", "fail", "error")
    assert ERROR_LAYERS == ("unreachable", "auth", "hostkey", "become", "container", "interpreter",
                            "upload", "timeout", "crashed", "killed", "protocol", "internal")


@pytest.mark.parametrize("status, rank", [("ok", 0), ("warn", 1), ("fail", 2), ("error", 3),
                                          ("bogus", 3), ("", 3), ("OK", 3)])
def test_status_rank_unknown_ranks_as_error(status, rank):
    assert status_rank(status) == rank


@pytest.mark.parametrize("statuses, worst", [
    ([], "ok"),
    (["ok"], "ok"),
    (["ok", "warn"], "warn"),
    (["warn", "ok"], "warn"),
    (["warn", "fail", "ok"], "fail"),
    (["fail", "warn"], "fail"),
    (["error", "fail"], "error"),
    (["ok", "error", "warn"], "error"),
    (["bogus"], "error"),            # never hide a problem behind an unknown word...
    (["warn", "bogus", "fail"], "error"),
    (["ok", "nonsense"], "error"),   # ...and never pass the unknown word on
])
def test_worst_status(statuses, worst):
    assert worst_status(iter(statuses)) == worst


def _r(status):
    return Result("d", "t", status, "s")


@pytest.mark.parametrize("statuses, code", [
    ([], 0), (["ok", "ok"], 0), (["ok", "warn"], 1), (["warn", "fail", "ok"], 2),
    (["fail", "error"], 3), (["weird"], 3)])
def test_exit_code_is_the_worst_status(statuses, code):
    assert exit_code([_r(s) for s in statuses]) == code
    assert (errors.EXIT_OK, errors.EXIT_WARN, errors.EXIT_FAIL, errors.EXIT_ERROR) == (0, 1, 2, 3)


def test_finding_to_dict_omits_an_empty_hint():
    assert Finding("warn", "c", "m").to_dict() == {"level": "warn", "code": "c", "message": "m"}
    assert Finding("warn", "c", "m", hint="").to_dict() == {"level": "warn", "code": "c", "message": "m"}
    assert Finding("fail", "c", "m", hint="h").to_dict() == {"level": "fail", "code": "c", "message": "m",
                                                             "hint": "h"}


def test_error_info_to_dict_has_every_key():
    assert ErrorInfo("auth", "T", "m").to_dict() == {"layer": "auth", "type": "T", "message": "m",
                                                     "traceback": None, "stderr": None}
    assert ErrorInfo("crashed", "T", "m", traceback="tb", stderr="se").to_dict() == {
        "layer": "crashed", "type": "T", "message": "m", "traceback": "tb", "stderr": "se"}


def test_result_to_dict_is_the_document():
    r = Result("gpu-status", "h1", "warn", "sum", findings=[Finding("warn", "c", "m", "h")],
               data={"k": 1}, log=[{"t": 0}], duration_s=1.23456)
    assert r.to_dict() == {
        "schema": 2, "diagnostic": "gpu-status", "target": "h1", "status": "warn", "summary": "sum",
        "findings": [{"level": "warn", "code": "c", "message": "m", "hint": "h"}],
        "data": {"k": 1}, "log": [{"t": 0}], "error": None, "duration_s": 1.235}
    assert list(r.to_dict()) == ["schema", "diagnostic", "target", "status", "summary", "findings", "data",
                                 "log", "error", "duration_s"]
    bare = Result("d", "t", "ok", "s").to_dict()
    assert (bare["findings"], bare["data"], bare["log"], bare["error"], bare["duration_s"]) == ([], {}, [], None, 0.0)


def test_defaults_are_not_shared_between_results():
    a, b = Result("d", "t", "ok", "s"), Result("d", "t", "ok", "s")
    a.findings.append(Finding("warn", "c", "m"))
    a.data["x"] = 1
    a.log.append({})
    assert (b.findings, b.data, b.log) == ([], {}, [])


def test_from_dict_round_trips():
    r = Result.failure("gpu-status", "h1", "timeout", "no answer in 5 s", type="Timeout", stderr="se",
                       traceback="tb", duration_s=5.0004)
    r.findings.append(Finding("fail", "c", "m", "h"))
    r.data["k"] = [1]
    r.log.append({"t": 1})
    assert Result.from_dict(r.to_dict()).to_dict() == r.to_dict()


def test_from_dict_fills_defaults_and_never_trusts_the_status():
    r = Result.from_dict({"diagnostic": 7, "target": None, "status": "great", "summary": 3,
                          "findings": [{}], "data": None, "log": None, "duration_s": None,
                          "error": {}})
    assert (r.diagnostic, r.target, r.status, r.summary) == ("7", "None", "error", "3")
    assert r.findings == [Finding(level="warn", code="", message="", hint=None)]
    assert (r.data, r.log, r.duration_s) == ({}, [], 0.0)
    assert r.error is None  # an empty error object is no error
    e = Result.from_dict({"status": "fail", "error": {"message": "m"}}).error
    assert e == ErrorInfo(layer="internal", type="", message="m", traceback=None, stderr=None)
    e = Result.from_dict({"status": "error", "error": {"layer": "auth"}}).error
    assert e == ErrorInfo(layer="auth", type="", message="", traceback=None, stderr=None)
    empty = Result.from_dict({})
    assert (empty.diagnostic, empty.target, empty.status, empty.summary, empty.findings,
            empty.error) == ("", "", "error", "", [], None)
    assert Result.from_dict({"status": "warn", "duration_s": "2.5"}).duration_s == 2.5
    assert Result.from_dict({"status": "ok"}).status == "ok"


def test_from_dict_reads_every_field():
    doc = {"diagnostic": "d", "target": "t", "status": "fail", "summary": "s",
           "findings": [{"level": "fail", "code": "c", "message": "m", "hint": "h"}],
           "data": {"a": 1}, "log": [{"x": 1}], "duration_s": 2,
           "error": {"layer": "auth", "type": "T", "message": "m", "traceback": "tb", "stderr": "se"}}
    r = Result.from_dict(doc)
    assert r.findings == [Finding("fail", "c", "m", "h")]
    assert r.error == ErrorInfo("auth", "T", "m", "tb", "se")
    assert (r.data, r.log, r.duration_s) == ({"a": 1}, [{"x": 1}], 2.0)


def test_failure_is_an_error_row_naming_its_layer():
    r = Result.failure("ping", "h", "auth", "key refused")
    assert (r.diagnostic, r.target, r.status, r.summary) == ("ping", "h", "error", "auth: key refused")
    assert r.error == ErrorInfo(layer="auth", type="auth", message="key refused", traceback=None, stderr=None)
    assert (r.findings, r.data, r.duration_s) == ([], {}, 0.0)
    r = Result.failure("ping", "h", "crashed", "boom", type="KeyError", stderr="se", traceback="tb",
                       duration_s=1.5)
    assert r.error == ErrorInfo("crashed", "KeyError", "boom", "tb", "se")
    assert r.duration_s == 1.5


# ----------------------------------------------------------------------------- actions (issue 29 §5)


def test_the_action_order_is_pinned():
    """Least to most severe: a swap (``drain`` after ``rma``) would send a dead GPU to a drain."""
    assert ACTIONS == ("none", "monitor", "app", "reset-gpu", "reboot", "drain", "rma")


@pytest.mark.parametrize("action, rank", [
    ("none", 0), ("monitor", 1), ("app", 2), ("reset-gpu", 3), ("reboot", 4), ("drain", 5),
    ("rma", 6),
    (None, -1), ("", -1), ("panic", -1), ("RMA", -1),   # no action, or one we do not know
])
def test_action_rank(action, rank):
    assert action_rank(action) == rank


def _acting(*actions):
    return [Finding("fail", "c", "m", action=a) for a in actions]


@pytest.mark.parametrize("actions, worst", [
    ((), None),
    ((None,), None),
    ((None, None), None),
    (("none",), "none"),
    ((None, "monitor"), "monitor"),
    (("monitor", None), "monitor"),
    (("drain", "rma"), "rma"),
    (("rma", "drain"), "rma"),
    (("reboot", "drain", "monitor"), "drain"),
    (("app", "reset-gpu"), "reset-gpu"),
    (("reset-gpu", "app"), "reset-gpu"),
    (("none", "monitor", "app", "reset-gpu", "reboot", "drain", "rma"), "rma"),
    (("rma", "drain", "reboot", "reset-gpu", "app", "monitor", "none"), "rma"),
    (("drain", "panic"), "drain"),      # an unknown word never outranks a known action...
    (("panic", "monitor"), "monitor"),
    (("panic",), None),                 # ...nor stands for one
])
def test_worst_action(actions, worst):
    assert worst_action(iter(_acting(*actions))) == worst


def test_finding_to_dict_keeps_empty_lists_and_drops_only_none():
    """``gpus: []`` (about no GPU) is what the target said: kept, as an explicit empty list."""
    assert Finding("info", "c", "m", gpus=[], ports=[]).to_dict() == {
        "level": "info", "code": "c", "message": "m", "gpus": [], "ports": []}
    assert Finding("info", "c", "m", gpus=[0], action="none", check="xid", ports=["mlx5_0/1"]).to_dict() == {
        "level": "info", "code": "c", "message": "m", "gpus": [0], "action": "none", "check": "xid",
        "ports": ["mlx5_0/1"]}
    assert Finding("info", "c", "m", gpus=None, action=None, check=None, ports=None).to_dict() == {
        "level": "info", "code": "c", "message": "m"}


def test_finding_from_dict_reads_the_schema_2_fields():
    f = Finding.from_dict({"level": "fail", "code": "c", "message": "m", "gpus": [0, "0000:b3:00.0"],
                           "action": "rma", "check": "xid", "ports": ["mlx5_0/1"]})
    assert (f.gpus, f.action, f.check, f.ports) == ([0, "0000:b3:00.0"], "rma", "xid", ["mlx5_0/1"])
    assert Finding.from_dict(f.to_dict()) == f
