"""``--junit FILE`` (diagnostics/views/junit.py, engine/execute.py: ReportFile): every report is
valid against the schema the Jenkins xUnit plugin validates JUnit reports with
(tests/fixtures/junit/jenkins-junit.xsd, the real file: its README says where from) and is read
back by a real consumer, junitparser; a target's hostile text stays inert and bounded; the file
is checked before any target is contacted and never written through a link."""

import datetime
import io
import json
import os
import re
import select
import signal
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

import junitparser
import pytest
import xmlschema
from hypothesis import HealthCheck, given, settings, strategies as st

from diagnostics.core.errors import InputError
from diagnostics.core.outcome import Outcome
from diagnostics.core.results import ErrorInfo, Finding, Result
from diagnostics.engine import execute
from diagnostics.views import junit
from tests.programs import REPO, mldiag, running_mldiag

XSD = Path(REPO) / "tests" / "fixtures" / "junit" / "jenkins-junit.xsd"


@pytest.fixture(scope="module")
def schema():
    return xmlschema.XMLSchema(str(XSD))


def rendered(*suites) -> str:
    out = io.StringIO()
    junit.render_junit(list(suites), out)
    return out.getvalue()


def read(text: str, tmp_path: Path, schema) -> junitparser.JUnitXml:
    """The report validated against the Jenkins schema, then read with junitparser."""
    path = tmp_path / "report.xml"
    path.write_text(text, encoding="utf-8")
    schema.validate(str(path))
    return junitparser.JUnitXml.fromfile(str(path))


def suite_of(results, name="node-check", **kw) -> junit.Suite:
    return junit.Suite(name=junit.suite_name(name), results=results, check=name, **kw)


def cases(xml: junitparser.JUnitXml):
    return {case.name: case for suite in xml for case in suite}


def outcome(case) -> str:
    kinds = {type(r).__name__ for r in case.result}
    assert len(kinds) <= 1, kinds
    return kinds.pop().lower() if kinds else "passed"


FLEET = [
    Result("node-check", "gpu01", "ok", "healthy: 8 GPUs", duration_s=1.25),
    Result("node-check", "gpu02", "fail", "GPU 3 lost",
           findings=[Finding("fail", "xid-79", "GPU 3 fell off the bus (Xid 79)",
                             hint="drain the node; reseat or replace GPU 3", gpus=[3],
                             action="drain", check="xid"),
                     Finding("fail", "xid-79", "GPU 5 fell off the bus (Xid 79)", gpus=[5]),
                     Finding("warn", "ecc-sbe", "GPU 1: 12 corrected ECC errors",
                             hint="watch it", action="monitor"),
                     Finding("info", "dcgm-absent", "dcgmi not found")],
           duration_s=2.5),
    Result.failure("node-check", "gpu03", "unreachable",
                   "connect to 10.0.0.9:22: connection refused",
                   stderr="ssh: connect to host 10.0.0.9 port 22: Connection refused\n",
                   duration_s=0.1),
    Result("node-check", "gpu04", "warn", "one warning",
           findings=[Finding("warn", "ecc-sbe", "GPU 0: 3 corrected ECC errors")], duration_s=1),
]


def test_the_layout_warn_ok_fail_error_as_jenkins_reads_them(tmp_path, schema):
    started = datetime.datetime(2026, 1, 2, 3, 4, 5)
    xml = read(rendered(suite_of(FLEET, time_s=2.75, started=started)), tmp_path, schema)
    (suite,) = list(xml)
    assert suite.name == "mldiag.node-check"
    assert (suite.tests, suite.failures, suite.errors, suite.skipped) == (8, 1, 1, 0)
    assert suite.time == 2.75 and suite.timestamp == "2026-01-02T03:04:05"
    by_name = cases(xml)
    assert list(by_name) == ["gpu01: node-check", "gpu02: node-check", "gpu02: xid-79",
                             "gpu02: ecc-sbe", "gpu02: dcgm-absent", "gpu03: node-check",
                             "gpu04: node-check", "gpu04: ecc-sbe"]
    assert {c.classname for c in by_name.values()} == {"mldiag.node-check"}
    assert {name: outcome(c) for name, c in by_name.items()} == {
        "gpu01: node-check": "passed",
        "gpu02: node-check": "passed",      # its fail is the finding's testcase's
        "gpu02: xid-79": "failure",
        "gpu02: ecc-sbe": "passed",         # warn: passed, recorded in system-out
        "gpu02: dcgm-absent": "passed",
        "gpu03: node-check": "error",       # could not be checked
        "gpu04: node-check": "passed",
        "gpu04: ecc-sbe": "passed",
    }
    (failure,) = by_name["gpu02: xid-79"].result
    assert failure.type == "xid-79" and failure.message == "GPU 3 fell off the bus (Xid 79)"
    assert failure.text == ("fail: GPU 3 fell off the bus (Xid 79)\n"
                            "hint: drain the node; reseat or replace GPU 3\n"
                            "action: drain; check: xid; gpus: 3\n\n"
                            "fail: GPU 5 fell off the bus (Xid 79)\ngpus: 5")
    assert by_name["gpu02: ecc-sbe"].system_out == ("warn: GPU 1: 12 corrected ECC errors\n"
                                                     "hint: watch it\naction: monitor")
    assert by_name["gpu01: node-check"].system_out == "ok: healthy: 8 GPUs"
    (error,) = by_name["gpu03: node-check"].result
    assert error.type == "unreachable"
    assert error.message == "unreachable: connect to 10.0.0.9:22: connection refused"
    assert "stderr:\nssh: connect to host 10.0.0.9 port 22: Connection refused" in error.text
    assert by_name["gpu01: node-check"].time == 1.25 and by_name["gpu02: xid-79"].time == 2.5
    root = ET.fromstring(rendered(suite_of(FLEET, time_s=2.75)))
    assert (root.tag, root.get("tests"), root.get("failures"), root.get("errors")) == \
        ("testsuites", "8", "1", "1")


def test_a_fail_no_finding_explains_fails_the_targets_own_testcase(tmp_path, schema):
    results = [Result("run-script", "box", "fail", "exit 3", data={"exit_code": 3,
                      "stdout": "step 1\nstep 2\n", "stderr": "boom\n"}),
               Result("run-script", "other", "error", "protocol: no result", findings=[
                   Finding("fail", "reported", "the script said so")])]
    xml = read(rendered(suite_of(results, "run-script")), tmp_path, schema)
    by_name = cases(xml)
    (failure,) = by_name["box: run-script"].result
    assert (failure.type, failure.message) == ("fail", "exit 3")
    assert by_name["box: run-script"].system_out == ("fail: exit 3\n\nstdout:\n  step 1\n  step 2"
                                                      "\n\nstderr:\n  boom")
    # an error status without ErrorInfo is still an error, beside the finding's failure
    assert outcome(by_name["other: run-script"]) == "error"
    assert outcome(by_name["other: reported"]) == "failure"


def test_an_unknown_finding_level_is_never_a_pass(tmp_path, schema):
    results = [Result("x", "box", "error", "odd", findings=[Finding("fatal", "odd", "what")])]
    by_name = cases(read(rendered(suite_of(results, "x")), tmp_path, schema))
    assert outcome(by_name["box: odd"]) == "failure"


def test_a_runbooks_skipped_and_interrupted_targets(tmp_path, schema):
    suite = suite_of([FLEET[0]], not_run=[
        junit.NotRun("gpu02", "when", "when: gpu-status found a lost GPU: not here"),
        junit.NotRun("gpu03", "interrupted", "not finished: terminated (SIGTERM)", error=True)])
    xml = read(rendered(suite), tmp_path, schema)
    (parsed,) = list(xml)
    assert (parsed.tests, parsed.skipped, parsed.errors) == (3, 1, 1)
    by_name = cases(xml)
    (skipped,) = by_name["gpu02: node-check"].result
    assert isinstance(skipped, junitparser.Skipped) and skipped.type == "when"
    assert outcome(by_name["gpu03: node-check"]) == "error"


HOSTILE = ("a\x00b\x07c\x1b[31md\x7fe\x85f\u202eg\u2028h\ud800i\ufffej\uffffk"
           "]]><!-- & </failure> \"quoted\" 'single'\r\nnext\rline\tend")
ESCAPED = r"a\x00b\x07c\x1b[31md\x7fe\x85f\u202eg\u2028h\ud800i\ufffej\uffffk"
# what XML forbids, and what misleads a reader (C1, bidi, U+2028): none of it in the file
RAW = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202e\u2028\ud800-\udfff\ufffe\uffff]")


def test_hostile_text_is_inert_valid_xml_with_visible_escapes(tmp_path, schema):
    result = Result("node-check", HOSTILE, "error", HOSTILE,
                    findings=[Finding("fail", HOSTILE, HOSTILE, hint=HOSTILE, gpus=[HOSTILE],
                                      ports=[HOSTILE], action=HOSTILE, check=HOSTILE)],
                    error=ErrorInfo("crashed", HOSTILE, HOSTILE, traceback=HOSTILE,
                                    stderr=HOSTILE))
    text = rendered(suite_of([result], "d"))
    assert not RAW.search(text)
    xml = read(text, tmp_path, schema)
    line = junit.xml_line(HOSTILE)     # an attribute: one line
    assert line == ESCAPED + "]]><!-- & </failure> \"quoted\" 'single' next line end"
    block = junit.xml_text(HOSTILE)    # a text: XML's line ends
    assert block == ESCAPED + "]]><!-- & </failure> \"quoted\" 'single'\nnext\nline\tend"
    target_case, finding_case = list(list(xml)[0])
    assert (target_case.name, finding_case.name) == (f"{line}: d", f"{line}: {line}")
    (error,) = target_case.result
    assert (error.type, error.message) == ("crashed", line)
    assert f"stderr:\n{block}" in error.text and f"traceback:\n{block}" in error.text
    assert target_case.system_out == f"error: {block}"
    (failure,) = finding_case.result
    assert (failure.type, failure.message) == (line, line)
    assert failure.text.startswith(f"fail: {block}\nhint: {block}\naction: {line}; check: {line}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(st.characters(exclude_categories=()), max_size=40), min_size=6,
                      max_size=6),
       level=st.sampled_from(["info", "warn", "fail", "error", "??"]),
       status=st.sampled_from(["ok", "warn", "fail", "error", "??"]),
       duration=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**7)))
def test_any_text_from_a_target_makes_a_valid_report(tmp_path, schema, texts, level, status,
                                                     duration):
    target, summary, code, message, hint, stderr = texts
    result = Result("d", target, status, summary, findings=[Finding(level, code, message, hint)],
                    error=ErrorInfo("crashed", "t", message, stderr=stderr) if status == "error"
                    else None, duration_s=duration)
    xml = read(rendered(suite_of([result], "d")), tmp_path, schema)
    assert list(xml)[0].tests == 2


def test_everything_a_target_sends_is_bounded(tmp_path, schema):
    huge = "x" * 200_000                # wire.py lets in 16 MiB a target: about that here
    findings = [Finding("fail", f"code-{i}", huge, hint=huge) for i in range(30)]
    findings += [Finding("warn", f"w-{i}", "w") for i in range(200)]
    findings += [Finding("warn", "same", huge) for _ in range(20)]
    result = Result("node-check", "box", "fail", huge, findings=findings, data={"stdout": huge})
    text = rendered(suite_of([result]))
    assert len(text) < 1_500_000
    xml = read(text, tmp_path, schema)
    by_name = cases(xml)
    assert len(by_name) == 1 + junit.CASES_PER_TARGET
    rest = 231 - (junit.CASES_PER_TARGET - 1)
    assert list(by_name)[-1] == f"box: {rest} more checks"
    assert outcome(by_name[f"box: {rest} more checks"]) == "passed"   # warnings only
    assert len(by_name[f"box: {rest} more checks"].system_out) < junit.TEXT_CHARS + 100
    (failure,) = by_name["box: code-0"].result
    more = f"\N{HORIZONTAL ELLIPSIS} ({200_000 - junit.MESSAGE_CHARS} more characters)"
    assert failure.message == "x" * junit.MESSAGE_CHARS + more
    assert failure.text.startswith("fail: " + "x" * (junit.TEXT_CHARS - 6) + "\N{HORIZONTAL ELLIPSIS} (")
    assert failure.text.endswith(" more characters)")
    assert len(failure.text) < junit.TEXT_CHARS + 100


def test_times_are_what_the_schema_takes():
    assert junit._seconds(1.23456) == "1.235"
    assert junit._seconds(float("nan")) == "0.000"
    assert junit._seconds(float("inf")) == "0.000"
    assert junit._seconds(-1) == "0.000"
    assert junit._seconds(1e20) == "100000000000000000000.000"


# ------------------------------------------------------------------------------ the file

def test_a_bad_junit_path_is_refused_before_any_target_runs(tmp_path, hosts):
    hosts_file, marker = hosts
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-dir").mkdir()
    for path, words in [(tmp_path / "a-file" / "r.xml", "Not a directory"),
                        (tmp_path / "a-dir", "a directory is in the way"),
                        (f"{tmp_path / 'a-dir'}/", "expected a file name"),
                        ("/proc/r.xml", "cannot write in its directory")]:
        r = mldiag("ping", "-H", "here", "--hosts-file", hosts_file, "--junit", path, cwd=tmp_path)
        assert r.returncode == 4, r.stderr
        assert r.stderr.startswith(f"mldiag: --junit {path}: ") and words in r.stderr
        assert r.stdout == "" and "Traceback" not in r.stderr
        assert not marker.exists()
    assert sorted(os.listdir(tmp_path / "a-dir")) == []   # no probe left behind


def test_report_file_checks_alone(tmp_path):
    assert execute.ReportFile.open("--junit", None) is None
    with pytest.raises(InputError, match=r"^--junit .*/x/\.\.: expected a file name"):
        execute.ReportFile.open("--junit", str(tmp_path / "x" / ".."))
    made = execute.ReportFile.open("--junit", str(tmp_path / "new" / "deeper" / "r.xml"))
    assert (tmp_path / "new" / "deeper").is_dir()      # made, as pytest's --junitxml does
    assert made.write(lambda s: s.write("<x/>")) is None
    made.close()
    assert (tmp_path / "new" / "deeper" / "r.xml").read_text() == "<x/>"
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "deeper" / "r.xml").st_mode) == 0o644


def test_a_failed_write_at_the_end_is_said_with_exit_3(tmp_path):
    report = execute.ReportFile.open("--junit", str(tmp_path / "r.xml"))
    (tmp_path / "r.xml").mkdir()          # in the way by the end of the run
    message = execute.write_junit(report, [])
    assert message.startswith(f"--junit {tmp_path / 'r.xml'}: not written: ")
    done = execute.with_messages(Outcome([], 1), message)
    assert done.exit_code == 3 and done.messages == (message,)


def test_end_to_end_the_report_beside_the_table_and_a_planted_link_replaced(tmp_path, schema):
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n"
                     "  good: {local: true, env: {F: '0'}}\n"
                     "  bad: {local: true, env: {F: '1'}}\n"
                     "  gone: {local: true, python: /nonexistent/python3}\n")
    script = tmp_path / "report.py"
    script.write_text(
        "import json, os\n"
        "f = os.environ['F'] == '1'\n"
        "doc = {'summary': 'GPU 3 lost' if f else 'healthy', 'findings': [\n"
        "    {'level': 'fail', 'code': 'gpu-lost', 'message': 'GPU 3 fell off the bus',\n"
        "     'hint': 'drain the node', 'action': 'drain'},\n"
        "    {'level': 'warn', 'code': 'ecc-sbe', 'message': 'GPU 5: 12 corrected'}] if f else []}\n"
        "with open(os.environ['MLDIAG_RESULT'], 'w') as out:\n"
        "    json.dump(doc, out)\n")
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    (tmp_path / "out").mkdir()
    os.symlink(victim, tmp_path / "out" / "r.xml")       # planted at FILE
    r = mldiag("run-script", script, "--hosts-file", hosts, "-H", "good,bad,gone",
               "--junit", "out/r.xml", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert r.stdout.startswith("TARGETS") and "gpu-lost" in r.stdout   # the table as ever
    assert victim.read_text() == "keep me\n"
    report = tmp_path / "out" / "r.xml"
    assert not report.is_symlink() and stat.S_IMODE(report.lstat().st_mode) == 0o644
    assert [p for p in os.listdir(tmp_path / "out") if p != "r.xml"] == []
    xml = read(report.read_text(), tmp_path, schema)
    by_name = cases(xml)
    assert {name: outcome(c) for name, c in by_name.items()} == {
        "good: run-script": "passed", "bad: run-script": "passed", "bad: gpu-lost": "failure",
        "bad: ecc-sbe": "passed", "gone: run-script": "error"}
    (error,) = by_name["gone: run-script"].result
    assert error.type == "interpreter" and "/nonexistent/python3" in error.message
    (failure,) = by_name["bad: gpu-lost"].result
    assert failure.text == "fail: GPU 3 fell off the bus\nhint: drain the node\naction: drain"


def test_runbook_junit_one_suite_per_step_with_skips(tmp_path, schema):
    (tmp_path / "hosts.yaml").write_text("hosts:\n  here: {local: true}\n")
    books = tmp_path / "books"
    books.mkdir()
    (books / "mini.yaml").write_text(
        "description: d\nparams:\n  log:\n    description: a log\nsteps:\n"
        "  - task: ping\n  - id: scan\n    task: scan-log\n    args: {path: '{{ params.log }}'}\n")
    r = mldiag("runbook", "mini", "--runbooks-dir", books, "-H", "here", "--junit", "r.xml",
               cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# ")       # the report as ever
    xml = read((tmp_path / "r.xml").read_text(), tmp_path, schema)
    assert [(s.name, s.tests, s.skipped) for s in xml] == [("mldiag.mini.01-ping", 1, 0),
                                                           ("mldiag.mini.02-scan", 1, 1)]
    (skipped,) = cases(xml)["here: scan-log"].result
    assert skipped.type == "param" and "log" in skipped.message
    r = mldiag("runbook", "mini", "--runbooks-dir", books, "-H", "here", "--junit", "/proc/r.xml",
               cwd=tmp_path)
    assert r.returncode == 4 and "--junit /proc/r.xml: cannot write" in r.stderr


def test_an_interrupted_run_writes_what_finished_and_names_the_rest(tmp_path, schema):
    (tmp_path / "hosts.yaml").write_text("hosts:\n"
                                         "  fast: {local: true, env: {NAP: '0'}}\n"
                                         "  slow: {local: true, env: {NAP: '60'}}\n")
    code = "import os, time; time.sleep(float(os.environ['NAP']))"
    with running_mldiag("run-script", "-c", code, "-H", "fast,slow", "--jsonl", "--junit",
                        "r.xml", cwd=tmp_path) as proc:
        assert select.select([proc.stdout], [], [], 60)[0], "no line from the fast target"
        first = json.loads(proc.stdout.readline())
        assert first["target"] == "fast" and proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        rest = proc.stdout.read()
        err = proc.stderr.read()
        proc.wait(timeout=30)
    assert proc.returncode == 143, err
    assert json.loads(rest) == {"summary": {"diagnostic": "run-script", "targets": 1, "ok": 1,
                                            "warn": 0, "fail": 0, "error": 0, "exit_code": 143,
                                            "interrupted": True, "not_finished": ["slow"]}}
    xml = read((tmp_path / "r.xml").read_text(), tmp_path, schema)
    by_name = cases(xml)
    assert outcome(by_name["fast: run-script"]) == "passed"
    (error,) = by_name["slow: run-script"].result
    assert error.type == "interrupted" and error.message == "not finished: terminated (SIGTERM)"
