"""``--jsonl`` (diagnostics/views/jsonl.py, engine/execute.py): one JSON object per line on stdout
as each target's result arrives, flushed, then one summary line — read here line by line from a
real ``mldiag`` process while it is still running."""

import io
import json
import select
import time

import pytest

from diagnostics.core.results import Finding, Result
from diagnostics.engine import execute
from diagnostics.views import jsonl
from tests.programs import mldiag, running_mldiag

DOCUMENT_KEYS = ["schema", "diagnostic", "target", "status", "summary", "findings", "data", "log",
                 "error", "duration_s"]


def line_within(proc, seconds: float) -> str:
    """The next line of the running process's stdout, or a failure after ``seconds``."""
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    assert ready, f"no line within {seconds} s"
    return proc.stdout.readline()


@pytest.fixture
def two_speeds(tmp_path):
    """A hosts file with a fast and a slow local target (the slow one naps NAP seconds)."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n"
                                         "  fast: {local: true, env: {NAP: '0'}}\n"
                                         "  slow: {local: true, env: {NAP: '4'}}\n")
    return tmp_path


NAP = "import os, time; time.sleep(float(os.environ['NAP'])); print('done\\nnap \\u2028 over')"


def test_each_line_is_readable_as_its_target_finishes_while_the_run_goes_on(two_speeds):
    started = time.monotonic()
    with running_mldiag("run-script", "-c", NAP, "-H", "slow,fast", "--jsonl",
                        cwd=two_speeds) as proc:
        first = json.loads(line_within(proc, 30))
        first_at = time.monotonic() - started
        assert proc.poll() is None, "the first line came only when the run had ended"
        assert first["target"] == "fast" and first["status"] == "ok"
        second = json.loads(line_within(proc, 60))
        summary = json.loads(line_within(proc, 30))
        assert proc.stdout.read() == ""        # nothing after the summary
        assert proc.wait(timeout=30) == 0
        ended_at = time.monotonic() - started
    # the slow target naps 4 s: its line, and the end, came seconds after the first line (a
    # run that printed every line at its end would show them all at once)
    assert ended_at - first_at > 2, (first_at, ended_at)
    assert second["target"] == "slow"
    for doc in (first, second):
        assert list(doc) == DOCUMENT_KEYS   # the object --json prints in its list
        assert doc["data"]["stdout"] == "done\nnap \u2028 over\n"   # one line all the same
    assert summary == {"summary": {"diagnostic": "run-script", "targets": 2, "ok": 2, "warn": 0,
                                   "fail": 0, "error": 0, "exit_code": 0}}


def test_the_lines_hold_what_json_prints_and_the_summary_the_exit_code(tmp_path):
    (tmp_path / "hosts.yaml").write_text("hosts:\n"
                                         "  good: {local: true}\n"
                                         "  gone: {local: true, python: /nonexistent/python3}\n")
    r = mldiag("ping", "-H", "good,gone", "--jsonl", cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and r.stdout.endswith("\n")
    docs = [json.loads(line) for line in lines]
    assert sorted(d["target"] for d in docs[:2]) == ["gone", "good"]
    by_target = {d["target"]: d for d in docs[:2]}
    assert by_target["gone"]["error"]["layer"] == "interpreter"
    assert docs[2] == {"summary": {"diagnostic": "ping", "targets": 2, "ok": 1, "warn": 0,
                                   "fail": 0, "error": 1, "exit_code": 3}}
    as_json = json.loads(mldiag("ping", "-H", "good,gone", "--json", cwd=tmp_path).stdout)
    for doc in as_json:      # the same documents, run to run (times and temp dirs aside)
        got = by_target[doc["target"]]
        for key in ("schema", "diagnostic", "status", "findings", "error"):
            assert got[key] == doc[key]


def test_json_and_jsonl_together_are_bad_input(tmp_path):
    r = mldiag("ping", "--json", "--jsonl", cwd=tmp_path)
    assert r.returncode == 4 and r.stdout == ""
    assert r.stderr == ("mldiag: --json and --jsonl: give one of them (--json: one document at "
                        "the end; --jsonl: a line per result as it arrives)\n")


def test_jsonl_makes_stdout_json_only_as_json_does():
    # node-check's Slurm lines, runbook --drain's: to stderr where opts.json says stdout is JSON
    assert execute.Options(jsonl=True).json is True
    assert execute.Options().json is False


def test_a_fleet_judgement_holds_the_lines_until_it_has_judged(tmp_path):
    """A diagnostic that judges all the answers together (node-check's majority) may change any
    result once the last has arrived: its lines come after the judgement, as --save's files do."""
    (tmp_path / "hosts.yaml").write_text("hosts:\n  a: {local: true}\n  b: {local: true}\n")
    seen_at_judgement = []

    def amend(results):
        seen_at_judgement.append(out.getvalue())
        results[1].findings.append(Finding("fail", "odd-one-out", "differs from the majority"))
        results[1].status = "fail"

    out = io.StringIO()
    opts = execute.Options(host=["a", "b"], hosts_file=str(tmp_path / "hosts.yaml"), jsonl=True)
    outcome = execute.execute(opts, execute.script_code_job("-c", b"pass", [], []), out=out,
                              amend=amend)
    assert seen_at_judgement == [""]
    docs = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [d.get("target") for d in docs] == ["a", "b", None]
    assert docs[1]["findings"][0]["code"] == "odd-one-out"
    assert docs[2]["summary"]["fail"] == 1 and docs[2]["summary"]["exit_code"] == 2
    assert outcome.exit_code == 2


def test_summary_counts_an_unknown_status_as_error():
    results = [Result("x", "a", "ok", ""), Result("x", "b", "weird", ""),
               Result("x", "c", "warn", "")]
    assert jsonl.summary(results) == {"summary": {"targets": 3, "ok": 1, "warn": 1, "fail": 0,
                                                  "error": 1, "exit_code": 3}}
    line = jsonl.line({"summary": {"nan": float("nan"), "text": "a\nb\u2028"}})
    assert line == '{"summary":{"nan":"NaN","text":"a\\nb\\u2028"}}'


def test_a_junit_file_that_cannot_be_written_at_the_end_is_in_the_summarys_exit_code(tmp_path):
    (tmp_path / "hosts.yaml").write_text("hosts:\n  a: {local: true}\n")
    report = tmp_path / "r.xml"
    out = io.StringIO()
    opts = execute.Options(host=["a"], hosts_file=str(tmp_path / "hosts.yaml"), jsonl=True,
                           junit=str(report))
    outcome = execute.execute(opts, execute.script_code_job("-c", b"pass", [], []), out=out,
                              amend=lambda results: report.mkdir())   # in the way by the end
    summary = json.loads(out.getvalue().splitlines()[-1])["summary"]
    assert summary["ok"] == 1 and summary["exit_code"] == 3 == outcome.exit_code
    assert outcome.messages == (f"--junit {report}: not written: Is a directory",)
