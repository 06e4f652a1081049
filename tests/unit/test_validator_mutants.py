"""The client's gate for what a script or a team's diagnostic reports (wire.take_returned,
take_report, parse_report, report_problem, report_refused; results.with_report), in this
process (mutmut-validator.cfg): a team diagnostic's run() value through the gate and through a
real local run, the refused document field by field, each ProtocolError's words whole (the
excerpt of what came back included), and the cuts at their bound and one past it.

tests/unit/test_script_result.py holds the runtime's side and the run-script cases; these are
the cases a one-token change of the gate would otherwise get past."""

import json
import textwrap

import pytest

from diagnostics.engine import bundle
from diagnostics.core import wire
from tests.unit.test_script_result import NONCE, run_local, script_doc

REPORT = "the script's $MLDIAG_RESULT"


def frame(doc):
    return json.dumps(doc).encode()


def gate(doc, returned_by=None):
    body = frame(doc)
    return wire.read_result((wire.FRAME_BEGIN % NONCE).encode() + b"\n" + body + b"\n"
                            + (wire.FRAME_END % NONCE).encode() + b"\n", NONCE, returned_by)


def team_doc(returned, **changes):
    """A document as the runtime composes it for a team diagnostic whose run() returned
    ``returned`` (sent as it was, for the client to check)."""
    doc = {"schema": 2, "diagnostic": "disk-free", "target": "t", "status": "ok", "summary": "",
           "findings": [], "data": {}, "log": [], "error": None, "duration_s": 0.1,
           "returned": returned}
    doc.update(changes)
    return doc


def finding(level, code="c"):
    return {"level": level, "code": code, "message": "m"}


def refused(message):
    return {"status": "error", "summary": f"protocol: {message}", "findings": [],
            "error": {"layer": "protocol", "type": "protocol", "message": message,
                      "traceback": None, "stderr": None}}


# ---------------------------------------------------------------------------- take_returned

@pytest.mark.parametrize("returned, status, summary, findings, data", [
    ({"summary": "3 of 4 mounts full", "findings": [finding("info"), finding("warn")],
      "data": {"free_gb": [1, 2.5]}}, "warn", "3 of 4 mounts full",
     [finding("info"), finding("warn")], {"free_gb": [1, 2.5]}),
    ({}, "ok", "ok", [], {}),
    ({"summary": None, "findings": None, "data": None}, "ok", "ok", [], {}),
    ({"summary": "  ", "findings": [finding("fail"), finding("ok")]}, "fail", "fail",
     [finding("fail"), finding("ok")], {}),
    ({"findings": [finding("info")]}, "ok", "ok", [finding("info")], {}),
    ({"summary": " x ", "data": {}}, "ok", " x ", [], {}),
])
def test_a_team_diagnostics_value_becomes_the_document(returned, status, summary, findings, data):
    doc = gate(team_doc(returned, data={"runtime": 1}), "disk_free.py")
    assert "returned" not in doc
    assert (doc["status"], doc["summary"], doc["findings"], doc["data"]) == (status, summary,
                                                                              findings, data)
    assert doc["error"] is None and doc["target"] == "t" and wire.schema_problem(doc) is None


@pytest.mark.parametrize("returned, message", [
    ([1, 2], "disk_free.py's run() value holds a list, not an object"),
    ({"status": "ok"}, "disk_free.py's run() value has 'status', not one of summary, findings, "
                       "data"),
    ({"findings": [finding("error")]}, "disk_free.py's run() value findings[0].level 'error' is "
                                       "not one of info, ok, warn, fail"),
])
def test_a_team_diagnostics_wrong_value_is_its_protocol_error_naming_the_file(returned, message):
    doc = gate(team_doc(returned, findings=[finding("warn")], data={"kept": True}), "disk_free.py")
    expected = dict(team_doc(None, data={"kept": True}), **refused(message))
    del expected["returned"]
    assert doc == expected


def test_a_returned_from_a_job_that_is_not_a_teams_is_the_runtimes_fault():
    doc = team_doc({"summary": "s"})
    with pytest.raises(wire.ProtocolError) as caught:
        gate(doc)
    assert str(caught.value) == ("returned in the result of a diagnostic that is not a team's; "
                                 f"it began {wire.safe_excerpt(frame(doc))}")


DISK_FREE = textwrap.dedent('''\
    """Free space."""
    import argparse
    def build_parser():
        p = argparse.ArgumentParser()
        p.add_argument("--shape")
        return p
    def run(args):
        if args.shape == "list":
            return [1]
        return {"summary": "  ", "findings": [{"level": "warn", "code": "low", "message": "/"}]}
    ''').encode()


def test_a_team_job_run_locally_goes_through_the_gate_naming_its_file():
    """The real runtime on the local transport: the client checks run()'s value by file name."""
    good = run_local(bundle.Job("disk-free", "disk_free.py", DISK_FREE, team=True))
    assert (good.status, good.summary, [f.code for f in good.findings]) == ("warn", "warn", ["low"])
    bad = run_local(bundle.Job("disk-free", "disk_free.py", DISK_FREE, argv=("--shape=list",),
                               team=True))
    assert (bad.status, bad.error.layer, bad.error.message) == (
        "error", "protocol", "disk_free.py's run() value holds a list, not an object")


# ---------------------------------------------------------------------------- report_refused

def test_a_refused_document_keeps_its_data_and_drops_its_findings():
    doc = script_doc(None, exit_code=2, findings=[finding("warn")])
    same = wire.report_refused(doc, "what was wrong")
    assert same is doc
    assert doc == dict(script_doc(None, exit_code=2), **refused("what was wrong"))


# ---------------------------------------------------------------------------- the words

def raised(text):
    with pytest.raises(wire.ProtocolError) as caught:
        wire.parse_report(text)
    return caught.value


@pytest.mark.parametrize("text, reason", [
    ('{"findings": [{"level": "critical"}]}', f"{REPORT} findings[0] has no 'code'"),
    ('{"data": {"n": 1e400}}', f"{REPORT} data.n: inf, not a finite number"),
    ("{oops}", f"{REPORT} is not JSON (Expecting property name enclosed in double quotes: line "
               "1 column 2 (char 1))"),
])
def test_parse_report_says_the_reason_and_the_start_of_the_file(text, reason):
    error = raised(text)
    assert (error.reason, error.excerpt) == (reason, repr(text))
    assert str(error) == f"{reason}; it began {repr(text)}"


def test_a_report_over_the_size_limit_is_named_with_the_start_of_it():
    at_the_limit = "{" + " " * (wire.MAX_REPORT_BYTES - 2) + "}"
    assert wire.parse_report(at_the_limit) == {}
    error = raised(at_the_limit + " ")
    assert str(error) == (f"{REPORT} holds 1048577 bytes, over the limit of 1048576; it began "
                          f"'{{{' ' * 159}'…")


def test_a_reported_of_another_shape_names_the_frame():
    doc = script_doc({"text": 1})
    with pytest.raises(wire.ProtocolError) as caught:
        gate(doc)
    assert str(caught.value) == ("reported is not an object of one string, its text or its "
                                 f"problem; it began {wire.safe_excerpt(frame(doc))}")


@pytest.mark.parametrize("length", [199, 200, 201, 500])
def test_what_the_runtime_would_not_read_is_said_to_200_characters(length):
    problem = "".join(chr(ord("a") + i % 26) for i in range(length))
    doc = gate(script_doc({"problem": problem}))
    assert doc["error"]["message"] == f"{REPORT} {problem[:200]}"


@pytest.mark.parametrize("length", [39, 40, 41, 100])
def test_a_key_or_a_level_is_quoted_to_40_characters(length):
    name = "".join(chr(ord("a") + i % 26) for i in range(length))
    assert wire.report_problem({name: 1}) == (f"{REPORT} has {name[:40]!r}, not one of summary, "
                                              "findings, data")
    assert wire.report_problem({"findings": [finding(name)]}) == (
        f"{REPORT} findings[0].level {name[:40]!r} is not one of info, ok, warn, fail")
