"""run-script's $MLDIAG_RESULT (issue 30 §3): a script's own summary, findings and data.

The runtime reads the file (a regular file of at most REPORT_LIMIT bytes, never through a
link) and sends its text; the client's gate (wire.py) parses, checks and merges it. Tested on
the runtime's real ``read_report``/``compose`` over a real private dir, on the gate with the
frames a runtime sends, and through the real ``mldiag run-script`` on the ``local`` target."""

import json
import os
import shutil
import textwrap
import time

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.core import wire
from diagnostics.transport.ssh import SshPool
from diagnostics.inventory.topology import Target
from tests.programs import load_script, mldiag, space_free_python

NONCE = "0123456789abcdef"
# Never a developer's own user-level hosts file: these tests run on the built-in `local` target.
ENV = {"XDG_CONFIG_HOME": "/nonexistent-mldiag-test-config", "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def rt():
    return load_script("_runtime.py", "mldiag_runtime_report_under_test")


@pytest.fixture
def private(rt, tmp_path):
    parent = tmp_path / "tmp"
    parent.mkdir(mode=0o700)
    d = rt.PrivateDir.create(str(parent))
    yield d
    d.remove()


def run_local(job, **target):
    """``job`` through the real bootstrap and runtime on the local transport."""
    return runner.run_one(Target(name="local", local=True, python=space_free_python(), **target), job,
                          SshPool())


def report_path(rt, private):
    return os.path.join(private.path, rt.REPORT_FILE)


# ----------------------------------------------------------------------------- the runtime


def test_the_runtime_and_the_gate_agree_on_the_limit(rt):
    assert rt.REPORT_LIMIT == wire.MAX_REPORT_BYTES == 1024 * 1024
    assert rt.REPORT_FILE.startswith(".mldiag-")   # cli.OWN_FILES: no script or --put takes it


def test_no_file_is_nothing_reported(rt, private):
    assert rt.read_report(private) is None


def test_a_regular_file_is_read_as_its_text(rt, private):
    with open(report_path(rt, private), "w", encoding="utf-8") as f:
        f.write('{"summary": "naïve ☃"}')
    assert rt.read_report(private) == {"text": '{"summary": "naïve ☃"}'}


def test_a_symlink_is_never_followed(rt, private, tmp_path):
    """Planted at the path: to a file outside (never read), to a FIFO (never opened, so no
    hang), to nothing."""
    secret = tmp_path / "secret.json"
    secret.write_text('{"summary": "read through a link"}')
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (secret, fifo, tmp_path / "missing"):
        os.symlink(target, report_path(rt, private))
        started = time.monotonic()
        assert rt.read_report(private) == {"problem": "is a symbolic link, not followed"}
        assert time.monotonic() - started < 1
        os.unlink(report_path(rt, private))


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir])
def test_a_fifo_or_a_directory_is_not_read(rt, private, make):
    make(report_path(rt, private))
    assert rt.read_report(private) == {"problem": "is not a regular file"}


def test_the_size_limit(rt, private):
    path = report_path(rt, private)
    with open(path, "wb") as f:
        f.write(b" " * (rt.REPORT_LIMIT - 2) + b"{}")
    assert len(rt.read_report(private)["text"]) == rt.REPORT_LIMIT
    with open(path, "ab") as f:
        f.write(b" ")
    assert rt.read_report(private) == {"problem": "holds 1048577 bytes, over the limit of 1048576"}


def test_a_file_that_grew_after_its_size_was_read_is_read_to_the_limit_and_one_byte(rt, private,
                                                                                   monkeypatch):
    """A size that changed after the lstat (a process SIGKILL could not end still writing):
    nothing past the limit and one byte is read."""
    with open(report_path(rt, private), "wb") as f:
        f.write(b"x" * (3 * rt.REPORT_LIMIT))
    real_stat, reads = os.stat, []

    def small(*args, **kw):
        st = real_stat(*args, **kw)
        return os.stat_result(st[:6] + (10,) + st[7:])

    real_read = os.read
    monkeypatch.setattr(rt.os, "stat", small)
    monkeypatch.setattr(rt.os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    assert rt.read_report(private) == {"problem": "holds more than 1048576 bytes, the limit"}
    assert sum(reads) <= rt.REPORT_LIMIT + 1


def test_a_file_that_is_not_utf8_is_refused(rt, private):
    with open(report_path(rt, private), "wb") as f:
        f.write(b'{"summary": "\xff"}')
    assert rt.read_report(private) == {"problem": "is not UTF-8 text (byte 13)"}


def script_run(rt, reported="absent", code=0, ended="exited"):
    out, err = rt.BoundedCapture(100), rt.BoundedCapture(100)
    out.feed(b"printed\n")
    run = {"ended": ended, "status": code << 8, "outcome": {"exit_code": code, "log": []},
           "out": out, "err": err, "killed": 0, "left": [], "timeout": 60}
    if reported != "absent":
        run["reported"] = reported
    return run


def test_nothing_reported_composes_the_same_document_as_before(rt):
    """A script that writes nothing: the document a runtime without $MLDIAG_RESULT composed,
    byte for byte (no ``reported`` key; duration_s is the clock's)."""
    before = rt.compose({"mode": "script"}, script_run(rt), 0.0)
    after = rt.compose({"mode": "script"}, script_run(rt, None), 0.0)
    before["duration_s"] = after["duration_s"] = 0.0
    assert json.dumps(after) == json.dumps(before)
    assert list(after) == ["schema", "diagnostic", "target", "status", "summary", "findings",
                           "data", "log", "error", "duration_s"]


def test_what_was_read_rides_in_the_document_unparsed(rt):
    doc = rt.compose({"mode": "script"}, script_run(rt, {"text": "{oops"}, code=2), time.time())
    assert doc["reported"] == {"text": "{oops"} and doc["status"] == "fail"
    assert doc["data"]["exit_code"] == 2 and doc["data"]["stdout"] == "printed\n"


def test_a_script_that_did_not_end_by_itself_reports_nothing(rt):
    """Timed out or killed: the error says why; a file it may have half written is not read
    into the result."""
    doc = rt.compose({"mode": "script"}, script_run(rt, {"text": "{}"}, ended="timeout"), time.time())
    assert doc["error"]["layer"] == "timeout" and "reported" not in doc


SH_WRITES = """\
import os, subprocess
print(os.environ["MLDIAG_RESULT"])
subprocess.run(["sh", "-c", "echo '{\\"data\\": {}}' > \\"$MLDIAG_RESULT\\""], check=True)
"""


def test_the_runtime_sets_the_variable_for_scripts_only_and_removes_the_file(rt, tmp_path):
    """Through the real bootstrap and runtime (the local transport): a script, and a shell it
    starts, see $MLDIAG_RESULT in the private dir; a diagnostic does not; a dir kept by
    ``--keep-remote`` holds no $MLDIAG_RESULT file."""
    job = bundle.Job("run-script", "s.py", SH_WRITES.encode(), mode="script", keep_remote=True)
    r = run_local(job, tmpdir=str(tmp_path))
    kept = r.data["remote_tmpdir"]
    assert r.data["stdout"] == os.path.join(kept, rt.REPORT_FILE) + "\n", r.to_dict()
    assert (r.status, r.summary, r.data.get("reported")) == ("ok", "exit 0", {})
    assert os.listdir(kept) == ["s.py"]
    diagnostic = textwrap.dedent("""\
        import argparse, os
        def build_parser(): return argparse.ArgumentParser()
        def run(args): return {"summary": str(os.environ.get("MLDIAG_RESULT"))}
        """).encode()
    r = run_local(bundle.Job("demo", "demo.py", diagnostic), tmpdir=str(tmp_path))
    assert r.summary == "None", r.to_dict()


WORST = """\
import os, sys
sys.stdout.write("\\x01" * 3000000)
sys.stderr.write("\\x01" * 3000000)
open(os.environ["MLDIAG_RESULT"], "w").write("\\x01" * (1 << 20))
"""


def test_the_largest_report_escaped_at_its_worst_fits_one_frame_beside_the_largest_output():
    """1 MiB of control characters (6 MiB once JSON-escaped) beside the most of stdout and
    stderr the runtime keeps, escaped as badly: the gate still reads the frame, and says what
    is wrong with the file, not that the frame is too big."""
    r = run_local(bundle.Job("run-script", "worst.py", WORST.encode(), mode="script"))
    assert r.error.layer == "protocol" and r.data["stdout_bytes"] == 3000000, r.summary
    assert r.error.message.startswith("the script's $MLDIAG_RESULT is not JSON")


# ----------------------------------------------------------------------------- the gate


def script_doc(reported, exit_code=0, **changes):
    """A document as the runtime composes it for a script that exited with ``exit_code``."""
    doc = {"schema": 2, "diagnostic": "run-script", "target": "t",
           "status": "ok" if exit_code == 0 else "fail", "summary": f"exit {exit_code}",
           "findings": [], "data": {"exit_code": exit_code, "stdout": "out\n", "stderr": "",
                                    "stdout_bytes": 4, "stderr_bytes": 0},
           "log": [], "error": None, "duration_s": 0.1}
    doc.update(changes)
    if reported is not None:
        doc["reported"] = reported
    return doc


def gate(doc):
    body = json.dumps(doc).encode()
    return wire.read_result((wire.FRAME_BEGIN % NONCE).encode() + b"\n" + body + b"\n"
                            + (wire.FRAME_END % NONCE).encode() + b"\n", NONCE)


def reported(report, **kw):
    text = report if isinstance(report, str) else json.dumps(report)
    return gate(script_doc({"text": text}, **kw))


def finding(level="warn", **kw):
    return dict({"level": level, "code": "c", "message": "m"}, **kw)


@pytest.mark.parametrize("exit_code,levels,status", [
    (0, [], "ok"), (0, ["info", "ok"], "ok"), (0, ["ok", "warn"], "warn"),
    (0, ["warn", "fail", "info"], "fail"), (3, [], "fail"), (3, ["warn"], "fail"),
    (1, ["ok"], "fail")])
def test_status_is_the_worse_of_the_exit_code_and_the_worst_finding(exit_code, levels, status):
    doc = reported({"findings": [finding(level) for level in levels]}, exit_code=exit_code)
    assert doc["status"] == status and [f["level"] for f in doc["findings"]] == levels
    assert doc["error"] is None


def test_summary_replaces_exit_0_and_follows_another_exit():
    assert reported({"summary": "3 GPUs below 150 GB/s"})["summary"] == "3 GPUs below 150 GB/s"
    assert reported({"summary": "3 GPUs below"}, exit_code=2)["summary"] == "exit 2; 3 GPUs below"
    assert reported({"summary": "  "})["summary"] == "exit 0"
    assert reported({"summary": None, "findings": None, "data": None}) == gate(script_doc(None))


def test_data_goes_whole_under_reported_and_mldiags_keys_stay():
    doc = reported({"data": {"exit_code": 99, "stdout": "forged", "busbw": [180.5, 1e-3]}})
    assert doc["data"]["exit_code"] == 0 and doc["data"]["stdout"] == "out\n"
    assert doc["data"]["reported"] == {"exit_code": 99, "stdout": "forged", "busbw": [180.5, 1e-3]}


def test_schema_2_finding_keys_are_kept():
    f = finding("fail", hint="h", action="drain", check="nccl", gpus=[0, "0000:3b:00.0"],
                ports=["mlx5_0/1"])
    assert reported({"findings": [f]})["findings"] == [f]


def test_a_report_at_the_depth_bound_fits_the_result_once_merged():
    def nested(levels):   # the report, its data and ``levels`` lists
        return {"data": {"x": json.loads("[" * levels + "]" * levels)}}
    doc = reported(nested(61))                        # 63 levels
    assert doc["status"] == "ok", doc
    wire.check_depth(json.dumps(doc).encode())        # merged, under data.reported: 64, the bound
    refused = reported(nested(62))
    assert "nests deeper than 63 levels" in refused["error"]["message"]


LONE = '{"summary": "\\ud800 half", "data": {"\\udfff": "x"}}'


def test_lone_surrogates_are_let_in_as_their_escapes():
    doc = reported(LONE)
    assert doc["summary"] == "\\ud800 half" and doc["data"]["reported"] == {"\\udfff": "x"}


MALFORMED = [
    ("{oops", "nests deeper than 63 levels or its brackets do not balance"),
    ("hello", "is not JSON (Expecting value"),
    ("", "is not JSON"),
    ('{"summary": NaN}', "is not JSON (NaN is not JSON)"),
    ('{"a": 1} {"b": 2}', "is not JSON (Extra data"),
    ("[1, 2]", "holds a list, not an object"),
    ('"a string"', "holds a string, not an object"),
    ("null", "holds null, not an object"),
    ("42", "holds a number, not an object"),
    ({"status": "ok"}, "has 'status', not one of summary, findings, data"),
    ({"summary": 3}, "summary is a number, not a string"),
    ({"data": [1]}, "data is a list, not an object"),
    ({"findings": {"level": "fail"}}, "findings is an object, not a list"),
    ({"findings": ["disk full"]}, "findings[0] is a string, not an object"),
    ({"findings": [{"level": "fail", "message": "m"}]}, "findings[0] has no 'code'"),
    ({"findings": [finding("error")]}, "findings[0].level 'error' is not one of info, ok, warn, fail"),
    ({"findings": [finding("critical")]}, "findings[0].level 'critical' is not one of"),
    ({"findings": [finding("WARN")]}, "findings[0].level 'WARN' is not one of"),
    ({"findings": [finding(None)]}, "findings[0].level is null, not a string"),
    ({"findings": [finding(), finding(["fail"])]}, "findings[1].level is a list, not a string"),
    ({"findings": [finding(action="panic")]}, "findings[0].action 'panic' is not one of"),
    ({"findings": [finding(gpus=[True])]}, "findings[0].gpus holds a boolean"),
    ({"data": {"n": 10**30}}, "data.n: an integer of 31 digits"),
    ('{"data": {"x": 1e400}}', "data.x: inf, not a finite number"),
    (" " * (wire.MAX_REPORT_BYTES - 1) + "{}", "holds 1048577 bytes, over the limit of 1048576"),
]


@pytest.mark.parametrize("report,reason", MALFORMED, ids=[r for _, r in MALFORMED])
def test_a_malformed_file_is_that_targets_protocol_error_naming_it(report, reason):
    """Never an exception out of the gate, never an internal error: the document becomes the
    target's ``protocol`` error naming $MLDIAG_RESULT, the exit code and output kept."""
    doc = reported(report, exit_code=0)
    assert doc["status"] == "error" and doc["findings"] == []
    assert doc["error"]["layer"] == "protocol"
    message = doc["error"]["message"]
    assert message.startswith("the script's $MLDIAG_RESULT ") and reason in message, message
    assert doc["summary"] == "protocol: " + message
    assert doc["data"]["exit_code"] == 0 and doc["data"]["stdout"] == "out\n"
    assert "reported" not in doc and "reported" not in doc["data"]
    assert wire.schema_problem(doc) is None


def test_what_the_runtime_would_not_read_is_said_by_the_gate():
    doc = gate(script_doc({"problem": "is a symbolic link, not followed"}, exit_code=4))
    assert doc["summary"] == "protocol: the script's $MLDIAG_RESULT is a symbolic link, not followed"
    assert doc["data"]["exit_code"] == 4


@pytest.mark.parametrize("envelope", [[], "text", {}, {"text": 1}, {"problem": None},
                                      {"text": "{}", "problem": "x"}, {"other": "{}"}])
def test_a_reported_of_another_shape_is_the_runtimes_fault(envelope):
    """The envelope is the runtime's own: a broken one is a ProtocolError like any other
    malformed result (the runner's ``protocol`` row)."""
    with pytest.raises(wire.ProtocolError, match="reported is not an object of one string"):
        gate(script_doc(envelope))


def test_no_reported_key_lets_the_document_in_unchanged():
    doc = script_doc(None)
    assert gate(doc) == doc


# ----------------------------------------------------------------------------- mldiag run-script


def run(tmp_path, *argv):
    return mldiag("run-script", *argv, cwd=tmp_path, env=ENV)


# Only shells out: the report is written by sh, through the variable it inherited.
SHELLS_OUT = """\
import subprocess, sys
subprocess.run(["sh", "-c", 'echo "checked by sh"; printf "%s" "$1" > "$MLDIAG_RESULT"', "sh",
                sys.argv[1]], check=True)
"""


@pytest.mark.parametrize("levels,code,status", [([], 0, "ok"), (["info", "ok"], 0, "ok"),
                                                (["ok", "warn"], 1, "warn"),
                                                (["warn", "fail"], 2, "fail")])
def test_a_script_that_only_shells_out_reports_findings(tmp_path, levels, code, status):
    (tmp_path / "shells.py").write_text(SHELLS_OUT)
    report = {"summary": f"{len(levels)} findings",
              "findings": [{"level": level, "code": f"c-{level}", "message": f"a {level} thing",
                            "hint": "look"} for level in levels],
              "data": {"levels": levels}}
    r = run(tmp_path, "shells.py", "--", json.dumps(report))
    assert r.returncode == code, r.stderr
    assert r.stdout.splitlines()[:2] == ["TARGETS  STATUS  SUMMARY",
                                         f"local    {status}{' ' * (6 - len(status))}  {len(levels)} findings"]
    for level in levels:
        assert f"  {level}{' ' * (5 - len(level))} c-{level}: a {level} thing" in r.stdout
    assert "checked by sh" in r.stdout
    doc = json.loads(run(tmp_path, "shells.py", "--json", "--", json.dumps(report)).stdout)[0]
    assert doc["status"] == status and doc["findings"] == report["findings"]
    assert doc["data"]["reported"] == {"levels": levels}
    assert doc["data"]["exit_code"] == 0 and doc["data"]["stdout"] == "checked by sh\n"


def test_the_exit_code_and_the_findings_decide_together(tmp_path):
    (tmp_path / "s.py").write_text(textwrap.dedent("""\
        import json, os, sys
        with open(os.environ["MLDIAG_RESULT"], "w") as f:
            json.dump({"summary": "2 of 8 GPUs slow",
                       "findings": [{"level": "warn", "code": "slow", "message": "GPU 3"}]}, f)
        sys.exit(5)
        """))
    r = run(tmp_path, "s.py")
    assert r.returncode == 2 and "local    fail    exit 5; 2 of 8 GPUs slow" in r.stdout
    assert "  warn  slow: GPU 3" in r.stdout


def test_a_script_that_writes_nothing_keeps_todays_result(tmp_path):
    r = run(tmp_path, "-c", "print('hi')", "--json")
    doc = json.loads(r.stdout)[0]
    assert (doc["status"], doc["summary"], doc["findings"]) == ("ok", "exit 0", [])
    assert doc["data"] == {"exit_code": 0, "stdout": "hi\n", "stderr": "", "stdout_bytes": 3,
                           "stderr_bytes": 0}


def test_a_malformed_file_is_a_protocol_error_and_the_output_stays(tmp_path):
    r = run(tmp_path, "-c", "import os; print('partial'); open(os.environ['MLDIAG_RESULT'], 'w')"
                            ".write('{\"findings\": [{\"level\": \"critical\"}]}')")
    assert r.returncode == 3, r.stderr
    assert r.stdout == textwrap.dedent("""\
        TARGETS  STATUS  SUMMARY
        local    error   protocol: the script's $MLDIAG_RESULT findings[0] has no 'code'; it began '{"findings": [{"level": "critical"}]}'
          stdout:
                partial

        1 error (protocol)
        """)


def test_a_symlink_planted_at_the_path_is_not_followed(tmp_path):
    """A link to a file the script's user can read: refused, its contents in no output."""
    outside = tmp_path / "elsewhere.json"
    outside.write_text('{"summary": "PLANTED-SUMMARY"}')
    code = f"import os; os.symlink({str(outside)!r}, os.environ['MLDIAG_RESULT'])"
    r = run(tmp_path, "-c", code, "--json")
    assert r.returncode == 3 and "PLANTED" not in r.stdout
    doc = json.loads(r.stdout)[0]
    assert doc["error"]["layer"] == "protocol"
    assert doc["summary"] == "protocol: the script's $MLDIAG_RESULT is a symbolic link, not followed"
    assert outside.read_text() == '{"summary": "PLANTED-SUMMARY"}'


def test_keep_remote_keeps_no_report_file(tmp_path):
    code = "import os; open(os.environ['MLDIAG_RESULT'], 'w').write('{\"summary\": \"s\"}')"
    doc = json.loads(run(tmp_path, "-c", code, "--keep-remote", "--json").stdout)[0]
    kept = doc["data"]["remote_tmpdir"]
    try:
        assert doc["summary"] == "s" and os.listdir(kept) == ["-c"]
    finally:
        shutil.rmtree(kept)


@pytest.mark.parametrize("argv", [[".mldiag-script-result.json"], ["s.py", "--put", ".mldiag-x"]])
def test_no_script_or_put_file_takes_an_own_files_name(tmp_path, argv):
    for name in (".mldiag-script-result.json", "s.py", ".mldiag-x"):
        (tmp_path / name).write_text("{}")
    r = run(tmp_path, *argv)
    assert r.returncode == 4 and "is mldiag's own in the run's directory" in r.stderr, r.stderr
