"""The wire module: what crosses to a target and the one gate what comes back passes
(DESIGN.md §3 invariants 1 and 8; issue 10 items 6, 7 and the runner-level check)."""

import json
import os
import re
import resource
import sys
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnostics.engine import bundle, runner
from diagnostics.core import results, wire
from diagnostics.transport import base, chain_for
from diagnostics.transport.local import LocalTransport
from diagnostics.transport.ssh import SshPool
from diagnostics.inventory.topology import Target
from tests.programs import load_script, space_free, space_free_python

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNTIME_PATH = os.path.join(REPO, "diagnostics", "scripts", "_runtime.py")
HOSTILE = os.path.join(REPO, "tests", "fixtures", "hostile", "python")
NONCE = "0123456789abcdef"


def load_runtime():
    return load_script("_runtime.py", "mldiag_runtime_under_test")


def good_doc(**changes):
    doc = {"schema": 2, "diagnostic": "ping", "target": "t", "status": "ok", "summary": "fine",
           "findings": [{"level": "warn", "code": "c", "message": "m", "hint": "h"}],
           "data": {"nested": {"a": [1, 2.5, None, True, "s"]}},
           "log": [{"level": "WARNING", "source": "x", "message": "y"}], "error": None,
           "duration_s": 0.25}
    doc.update(changes)
    return doc


def framed(doc, nonce=NONCE) -> bytes:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return (b"noise\n" + (wire.FRAME_BEGIN % nonce).encode() + b"\n" + body + b"\n"
            + (wire.FRAME_END % nonce).encode() + b"\n")


# ----------------------------------------------------------------------------- one format


def test_runtime_markers_are_the_wire_markers():
    """_runtime.py cannot import wire (a remote single file): its copies must agree."""
    rt = load_runtime()
    assert rt.FRAME_BEGIN == wire.FRAME_BEGIN
    assert rt.FRAME_END == wire.FRAME_END
    assert wire.OLD_PYTHON_MARK in wire.STAGE_A


def test_what_the_runtime_emits_is_what_the_client_reads(capfd):
    rt = load_runtime()
    doc = good_doc(summary="ü \x1b[2J emitted")
    rt.emit(NONCE, doc)
    out = capfd.readouterr().out.encode("utf-8")
    assert wire.read_result(b"before" + out, NONCE) == doc


def test_bundle_and_hops_use_the_wire_constants():
    from diagnostics.transport import interpreter
    assert bundle.BOOT is wire.BOOT and bundle.STAGE_A is wire.STAGE_A
    assert interpreter.Interpreter("python3").argv() == ["python3", "-c", wire.BOOT]


def test_protocol_is_an_error_layer():
    assert "protocol" in results.ERROR_LAYERS
    assert results.ERROR_LAYERS[-1] == "internal"


@settings(max_examples=50, deadline=None)
@given(header=st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=20), max_size=4),
       files=st.dictionaries(st.text(min_size=1, max_size=12), st.binary(max_size=200), max_size=4))
def test_payload_round_trips(header, files):
    header = {**{k: v for k, v in header.items() if k != "files"}, "nonce": NONCE}
    payload = wire.build_payload(b"RUNTIME\n\x00", header, files)
    stage_a, runtime, decoded, got = wire.parse_payload(payload)
    assert stage_a == wire.STAGE_A and runtime == b"RUNTIME\n\x00"
    assert decoded == header and got == files


def test_the_files_key_of_the_header_is_the_payloads_own():
    """Hypothesis found a header carrying `files` that came back without it: it is refused."""
    with pytest.raises(ValueError, match="'files' key"):
        wire.build_payload(b"R", {"nonce": NONCE, "files": ""}, {})


def test_a_truncated_payload_is_refused():
    payload = wire.build_payload(b"R", {"nonce": NONCE}, {"a.py": b"x" * 10})
    with pytest.raises(ValueError):
        wire.parse_payload(payload[:-3])
    with pytest.raises(ValueError):
        wire.parse_payload(payload + b"extra")


# ----------------------------------------------------------------------------- the runner's argv


class RecordingLocal(LocalTransport):
    """The real local transport, remembering exactly what it was handed."""

    def __init__(self, calls):
        self.calls = calls

    def run(self, argv, payload, deadline):
        self.calls.append((list(argv), payload))
        return super().run(argv, payload, deadline)


def test_the_transport_is_handed_only_the_bootstrap_and_the_payload(monkeypatch):
    """A runner-level check: the command line is exactly `PYTHON -c BOOT`, and everything else
    (script, arguments, env, --put files) is in the payload, where the runtime finds it."""
    calls = []

    def recording_chain(target, pool, step=None):
        chain = chain_for(target, pool, step)
        chain.transport = RecordingLocal(calls)
        return chain

    monkeypatch.setattr(runner, "chain_for", recording_chain)
    source = textwrap.dedent("""\
        import sys
        print(open("data.bin", "rb").read().hex(), sys.argv[1:])
    """).encode()
    job = bundle.Job("run-script", "probe-name.py", source, argv=("--flag", "a b", "$HOME"),
                     mode="script", extra_files={"data.bin": b"\x00\xffput"}, timeout=42)
    target = Target(name="rec", local=True, python=space_free_python(),
                    env=(("SECRET_TOKEN", "s3cr3t-value"), ("PLAIN", "v")))
    result = runner.run_one(target, job, SshPool())
    assert result.status == "ok", result.to_dict()
    assert "00ff707574" in result.data["stdout"] and "$HOME" in result.data["stdout"]
    [(argv, payload)] = calls
    assert argv == [target.python, "-c", wire.BOOT]
    stage_a, runtime, header, files = wire.parse_payload(payload)
    assert stage_a == wire.STAGE_A
    with open(RUNTIME_PATH, "rb") as f:
        assert runtime == f.read()
    assert files == {"probe-name.py": source, "data.bin": b"\x00\xffput"}
    assert len(header.pop("nonce")) == 16
    assert header == {"v": 1, "diagnostic": "run-script", "target": "rec", "mode": "script",
                      "script": "probe-name.py", "argv": ["--flag", "a b", "$HOME"],
                      "env": {"SECRET_TOKEN": "s3cr3t-value", "PLAIN": "v"}, "timeout": 42,
                      "keep": False, "activate": [], "python": target.python,
                      "code_digests": {}}   # a user's script is never kept in a code cache
    assert not any("probe-name" in token or "s3cr3t" in token for token in argv)


# ----------------------------------------------------------------------------- frames


def test_the_frame_with_this_runs_nonce_is_read():
    other = framed(good_doc(summary="other run"), nonce="f" * 16)
    mine = framed(good_doc(summary="mine"))
    assert wire.read_result(other + mine + other, NONCE)["summary"] == "mine"
    assert wire.read_result(other, NONCE) is None
    assert wire.read_result(b"", NONCE) is None


def test_the_last_frame_wins():
    stdout = framed(good_doc(summary="first")) + framed(good_doc(summary="last"))
    assert wire.read_result(stdout, NONCE)["summary"] == "last"


def test_an_end_marker_without_its_begin_is_a_protocol_error():
    stdout = b"x" * 100 + b"\n" + (wire.FRAME_END % NONCE).encode() + b"\n"
    with pytest.raises(wire.ProtocolError, match="without its begin"):
        wire.read_result(stdout, NONCE)


def test_a_marker_flood_is_scanned_once():
    """20,000 begin markers (92 s of client CPU with the old regex): still one frame, found."""
    flood = ((wire.FRAME_BEGIN % NONCE).encode() + b"\n") * 20000
    assert wire.read_result(flood, NONCE) is None
    # the flood's last marker is the frame's start
    assert wire.read_result(flood + json.dumps(good_doc()).encode() + b"\n"
                            + (wire.FRAME_END % NONCE).encode(), NONCE) == good_doc()
    with pytest.raises(wire.ProtocolError):
        wire.read_result(flood + b"{}\n[" + flood + (wire.FRAME_END % NONCE).encode(), NONCE)
    assert wire.read_result(flood + framed(good_doc()), NONCE)["summary"] == "fine"


# ----------------------------------------------------------------------------- depth and size


def reference_depth(text: bytes):
    """Max nesting outside strings by a plain byte walk, None if the brackets do not balance,
    "open" for an unterminated string (the parser refuses that itself, after the brackets
    before it were counted)."""
    depth = best = 0
    in_string = escaped = False
    for byte in text:
        c = chr(byte)
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            best = max(best, depth)
        elif c in "]}":
            depth -= 1
            if depth < 0:
                return None
    if in_string:
        return "open"
    return best if depth == 0 else None


json_text = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab'),
                         lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.text(alphabet='[]{"\\k', max_size=3), inner, max_size=3),
                         max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(json_text)
def test_depth_check_agrees_with_a_byte_walk_on_json(value):
    text = json.dumps(value).encode()
    depth = reference_depth(text)
    for limit in (1, 2, 3, 5):
        if depth <= limit:
            wire.check_depth(text, limit)
        else:
            with pytest.raises(wire.ProtocolError):
                wire.check_depth(text, limit)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='[]{}"\\x', max_size=40))
def test_depth_check_refuses_whatever_a_byte_walk_calls_unbalanced_or_deep(text):
    data = text.encode()
    depth = reference_depth(data)
    if depth == "open":
        return
    if depth is None or depth > 3:
        with pytest.raises(wire.ProtocolError):
            wire.check_depth(data, 3)
    else:
        wire.check_depth(data, 3)


def test_depth_limit_is_exact():
    wire.decode_result(json.dumps(good_doc(data={"d": json.loads("[" * 62 + "]" * 62)})).encode())
    with pytest.raises(wire.ProtocolError, match="deeper than 64"):
        wire.decode_result(json.dumps(good_doc(data={"d": json.loads("[" * 63 + "]" * 63)})).encode())


@pytest.mark.parametrize("body", [b"[" * 100000 + b"]" * 100000,
                                  b'{"a":' * 100000 + b"1" + b"}" * 100000,
                                  b"[" * 100000,
                                  b'"\\' * 50000 + b"[" * 1000])
def test_deep_nesting_is_refused_before_any_parser_recurses(body):
    with pytest.raises(wire.ProtocolError):
        wire.decode_result(body)


def test_brackets_inside_strings_do_not_count():
    doc = good_doc(summary="[[[[" * 1000 + '\\"{{{{' * 1000)
    assert wire.decode_result(json.dumps(doc).encode()) == doc


def test_size_is_bounded_before_parsing():
    body = json.dumps(good_doc(data={"pad": "x" * wire.MAX_RESULT_BYTES})).encode()
    with pytest.raises(wire.ProtocolError, match="over the 16 MiB limit"):
        wire.decode_result(body)


@pytest.mark.parametrize("body", [b'{"schema": 1, "x": NaN}', b'{"x": Infinity}', b"\xff\xfe",
                                  b"", b"nul\x00l", b'{"schema": 1} trailing'])
def test_non_json_is_a_protocol_error(body):
    with pytest.raises(wire.ProtocolError, match="not JSON"):
        wire.decode_result(body)


# ----------------------------------------------------------------------------- the schema


MALFORMED = {
    "the document a list": ([good_doc()], "the result is a list"),
    "the document a string": ("ok", "the result is a string"),
    "status a list": (good_doc(status=["ok"]), "status is a list"),
    "status unknown": (good_doc(status="fine"), "status is 'fine'"),
    "schema 1": (good_doc(schema=1), "schema is 1, not 2"),
    "schema 3": (good_doc(schema=3), "schema is 3"),
    "an unknown action": (good_doc(findings=[{"level": "fail", "code": "x", "message": "m", "action": "panic"}]),
                          r"findings\[0\]\.action 'panic' is not one of none, monitor"),
    "gpus a string": (good_doc(findings=[{"level": "fail", "code": "x", "message": "m", "gpus": "0-7"}]),
                      r"findings\[0\]\.gpus is a string, not a list"),
    "ports of numbers": (good_doc(findings=[{"level": "fail", "code": "x", "message": "m", "ports": [1]}]),
                         r"findings\[0\]\.ports holds a number, not a string"),
    "check a number": (good_doc(findings=[{"level": "fail", "code": "x", "message": "m", "check": 3}]),
                       r"findings\[0\]\.check is a number, not a string"),
    "schema true": (good_doc(schema=True), "schema is True"),
    "schema a string": (good_doc(schema="2"), "schema is '2'"),
    "no status": ({k: v for k, v in good_doc().items() if k != "status"}, "has no 'status'"),
    "no error key": ({k: v for k, v in good_doc().items() if k != "error"}, "has no 'error'"),
    "summary a number": (good_doc(summary=3), "summary is a number"),
    "diagnostic an object": (good_doc(diagnostic={}), "diagnostic is an object"),
    "target a list": (good_doc(target=[]), "target is a list"),
    "duration a string": (good_doc(duration_s="1"), "duration_s is a string"),
    "duration a boolean": (good_doc(duration_s=True), "duration_s is a boolean"),
    "data a list": (good_doc(data=[]), "data is a list"),
    "findings an object": (good_doc(findings={}), "findings is an object"),
    "a finding a string": (good_doc(findings=["x"]), r"findings\[0\] is a string"),
    "a finding without code": (good_doc(findings=[{"level": "warn", "message": "m"}]),
                               r"findings\[0\] has no 'code'"),
    "a finding's level a list": (good_doc(findings=[{"level": [], "code": "c", "message": "m"}]),
                                 r"findings\[0\]\.level is a list"),
    "a finding's hint a number": (good_doc(findings=[{"level": "warn", "code": "c", "message": "m",
                                                      "hint": 1}]), r"findings\[0\]\.hint is a number"),
    "a finding's action an object": (good_doc(findings=[{"level": "warn", "code": "c", "message": "m",
                                                         "action": {}}]), r"\.action is an object"),
    "log a string": (good_doc(log="x"), "log is a string"),
    "a log entry a list": (good_doc(log=[[]]), r"log\[0\] is a list"),
    "a log message null": (good_doc(log=[{"level": "I", "source": "s", "message": None}]),
                           r"log\[0\]\.message is null"),
    "error a string": (good_doc(status="error", error="boom"), "error is a string"),
    "error without layer": (good_doc(error={"type": "t", "message": "m"}), "error has no 'layer'"),
    "error layer unknown": (good_doc(error={"layer": "nope", "type": "t", "message": "m"}),
                            "error.layer 'nope' is not a known layer"),
    "error layer a list": (good_doc(error={"layer": ["x"], "type": "t", "message": "m"}),
                           r"error\.layer is a list"),
    "error traceback a number": (good_doc(error={"layer": "crashed", "type": "t", "message": "m",
                                                 "traceback": 3}), r"error\.traceback is a number"),
    "error stderr a list": (good_doc(error={"layer": "crashed", "type": "t", "message": "m",
                                            "stderr": ["x"]}), r"error\.stderr is a list"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_off_schema_documents_are_refused(name):
    doc, reason = MALFORMED[name]
    with pytest.raises(wire.ProtocolError, match=reason):
        wire.decode_result(json.dumps(doc).encode())


def test_well_formed_documents_pass_whole():
    for doc in (good_doc(), good_doc(error={"layer": "crashed", "type": "T", "message": "m",
                                            "traceback": None, "stderr": "e"}, status="error"),
                good_doc(findings=[], log=[], data={}, diagnostic=None, target=None),
                good_doc(findings=[{"level": "fail", "code": "c", "message": "m", "hint": None,
                                    "action": "drain", "_gpu": 0}])):
        assert wire.decode_result(json.dumps(doc).encode()) == doc
        assert results.Result.from_dict(doc).to_dict()["status"] == doc["status"]


def test_the_runtime_s_own_answers_pass():
    """Every shape the real runtime produces (ok, crashed, script mode) passes validation."""
    ok = runner.run_one(Target(name="l", local=True, python=space_free_python()),
                        bundle.script_job("ping"), SshPool())
    assert ok.status == "ok", ok.to_dict()
    crashed = runner.run_one(Target(name="l", local=True, python=space_free_python()),
                             bundle.Job("demo", "d.py", b"import argparse\n"
                                        b"def build_parser(): return argparse.ArgumentParser()\n"
                                        b"def run(a): raise KeyError()\n"), SshPool())
    assert crashed.error.layer == "crashed", crashed.to_dict()


def test_an_excerpt_is_bounded_and_has_no_raw_control_characters():
    exc = wire.ProtocolError("bad", b"\x1b]0;owned\x07\x1b[2J\r\n\xff" + "é".encode() * 1000)
    assert len(exc.excerpt) <= wire.EXCERPT_CHARS + 3
    assert not any(ord(c) < 32 or ord(c) == 127 for c in str(exc))
    assert "\\x1b" in exc.excerpt and exc.excerpt.endswith("…")


# ----------------------------------------------------------------------------- a hostile target, end to end (local)


def hostile(mode, **env):
    pairs = (("HOSTILE_MODE", mode),) + tuple((k, str(v)) for k, v in env.items())
    return Target(name=f"hostile-{mode}", local=True, python=space_free(HOSTILE), env=pairs)


@pytest.mark.parametrize("mode", ["status-list", "doc-list", "finding-str", "error-str",
                                  "error-layer", "nan", "schema-3", "log-int", "not-json", "deep",
                                  "deep-dict"])
def test_a_malformed_frame_is_that_targets_protocol_row(mode):
    r = runner.run_one(hostile(mode), bundle.script_job("ping"), SshPool())
    assert r.status == "error" and r.error.layer == "protocol", r.to_dict()
    assert r.error.message.startswith("the target answered with a malformed result")
    assert len(r.error.message) < 600
    assert not any(ord(c) < 32 for c in r.summary)


def test_malformed_targets_cost_no_other_target_its_row():
    targets = [hostile("status-list"), Target(name="good", local=True, python=space_free_python()),
               hostile("deep"), hostile("marker-flood", HOSTILE_COUNT=20000)]
    got = runner.run_many(targets, bundle.script_job("ping"), parallel=4)
    assert [r.target for r in got] == [t.name for t in targets]
    assert [r.status for r in got] == ["error", "ok", "error", "error"]
    assert [r.error.layer for r in got if r.error] == ["protocol"] * 3
    assert results.exit_code(got) == 3


def test_a_frame_after_floods_of_output_still_arrives():
    for mode, env in (("stdout-flood", {"HOSTILE_BYTES": 40 * 2**20}),
                      ("stderr-flood", {"HOSTILE_BYTES": 40 * 2**20}),
                      ("marker-flood-then-ok", {"HOSTILE_COUNT": 20000})):
        r = runner.run_one(hostile(mode, **env), bundle.script_job("ping"), SshPool())
        assert r.status == "ok", (mode, r.to_dict())


def test_a_frame_over_the_limit_is_a_protocol_row():
    r = runner.run_one(hostile("huge-frame", HOSTILE_BYTES=wire.MAX_RESULT_BYTES + 1000),
                       bundle.script_job("ping"), SshPool())
    assert r.error is not None and r.error.layer == "protocol", r.to_dict()


# ----------------------------------------------------------------------------- bounded streams


def test_stream_capture_keeps_a_head_and_a_tail_and_counts_the_rest():
    cap = base.StreamCapture(head=10, tail=20)
    data = bytes(range(256)) * 40
    for i in range(0, len(data), 7):
        cap.feed(data[i:i + 7])
    assert cap.total == len(data)
    assert cap.dropped == len(data) - 30
    note = b"\n[mldiag: %d bytes not kept]\n" % (len(data) - 30)
    assert cap.value() == data[:10] + note + data[-20:]
    assert cap.tail_size <= 20 + 7     # never more than the limit and one chunk held


def test_stream_capture_fed_a_byte_at_a_time():
    cap = base.StreamCapture(head=3, tail=4)
    for byte in b"abcdefghij":
        cap.feed(bytes([byte]))
    assert cap.value() == b"abc\n[mldiag: 3 bytes not kept]\nghij" and cap.dropped == 3


def test_stream_capture_trims_the_chunk_that_straddles_the_tail_limit():
    cap = base.StreamCapture(head=2, tail=5)
    for chunk in (b"abcd", b"efgh", b"ijkl"):
        cap.feed(chunk)
    assert cap.value() == b"ab\n[mldiag: 5 bytes not kept]\nhijkl" and cap.dropped == 5


def test_stream_capture_under_its_limits_is_the_stream():
    cap = base.StreamCapture(head=10, tail=20)
    cap.feed(b"0123456789abcdef")
    cap.feed(b"ghij")
    assert cap.value() == b"0123456789abcdefghij" and cap.dropped == 0


def test_stdout_keeps_room_for_a_whole_maximal_frame():
    assert wire.STDOUT_TAIL > wire.MAX_RESULT_BYTES + 2 * len(wire.FRAME_END % ("f" * 64))


def test_a_target_that_never_reads_its_stdin_costs_the_deadline_not_a_hang():
    import time
    never = space_free(os.path.join(REPO, "tests", "fixtures", "hostile", "never-reads"))
    started = time.monotonic()
    out = LocalTransport().run([never], b"x" * (8 * 2**20), time.monotonic() + 2)
    assert out.timed_out and out.exit_code is None
    assert time.monotonic() - started < 30      # generous: what fails is a hang, not a slow box


def _runtime_with(marker: bytes, replacement: bytes) -> bytes:
    """The runtime's source with its first ``marker`` replaced (a test's hook)."""
    with open(RUNTIME_PATH, "rb") as f:
        runtime = f.read()
    hooked = runtime.replace(marker, replacement, 1)
    assert hooked != runtime
    return hooked


def _bootstrap_run(runtime: bytes, tmp_path, job=None):
    """The bootstrap run here on ``runtime`` (``job``, a ping job by default), stdin held open
    like a channel's."""
    import subprocess
    job = job or bundle.script_job("ping")
    header = bundle.build_header(job, target="t", timeout=30, env={}, activate=[],
                                 python=sys.executable, nonce=NONCE, tmpdir=str(tmp_path))
    payload = wire.build_payload(runtime, header, bundle.job_files(job))
    proc = subprocess.Popen(wire.bootstrap_argv(sys.executable), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(payload)
    proc.stdin.flush()
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdin.close()
    return proc.wait(), out, err


def test_the_runtime_process_ends_with_its_frame_without_teardown(tmp_path):
    # stage A ends the process right after the runtime's main (os._exit: no interpreter
    # teardown, ~3.5 ms of CPU a run): an atexit handler of the runtime never runs, and the
    # frame is the last thing on stdout
    hooked = _runtime_with(b"\nimport json\n", b"\nimport atexit\nimport os as _o\n"
                           b"atexit.register(lambda: _o.write(1, b'TEARDOWN'))\nimport json\n")
    code, out, err = _bootstrap_run(hooked, tmp_path)
    assert code == 0, err
    assert b"TEARDOWN" not in out
    assert out.rstrip().endswith((wire.FRAME_END % NONCE).encode())
    assert wire.read_result(out, NONCE)["status"] == "ok"


def test_a_runtime_that_raises_leaves_the_ordinary_way_with_its_traceback(tmp_path):
    broken = b"def main(stdin):\n    raise RuntimeError('runtime broke')\n"
    code, out, err = _bootstrap_run(broken, tmp_path)
    assert code == 1 and b"RuntimeError: runtime broke" in err and b"Traceback" in err


def test_the_supervisor_runs_without_the_cyclic_gc_and_the_diagnostic_with_it(tmp_path):
    # stage A turns the collector off in the supervisor (passes over the runtime's imports cost
    # ~2 ms a run); the diagnostic's forked process has it on again, what it inherited frozen
    hooked = _runtime_with(b"\ndef main(stdin):\n", b"\ndef main(stdin):\n"
                           b"    os.write(2, b'SUPERVISOR-GC=%d\\n' % gc.isenabled())\n")
    script = (b"import gc\n"
              b"print('CHILD-GC=%d FROZEN=%d' % (gc.isenabled(), gc.get_freeze_count()))\n")
    job = bundle.Job(diagnostic="run-script", script_name="gc.py", script_source=script,
                     mode="script")
    code, out, err = _bootstrap_run(hooked, tmp_path, job)
    assert code == 0, err
    assert b"SUPERVISOR-GC=0" in err
    found = re.search(rb"CHILD-GC=(\d) FROZEN=(\d+)", out)
    assert found and found.group(1) == b"1" and int(found.group(2)) > 1000
    assert wire.read_result(out, NONCE)["status"] == "ok"


# ----------------------------------------------------------------------------- descriptors


def test_concurrency_follows_the_descriptor_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, hard))
        assert base.concurrent_runs_allowed() == (100 - base.FD_RESERVE) // base.FDS_PER_RUN
        assert SshPool().max_open == base.concurrent_runs_allowed()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_out_of_descriptors_is_said_plainly():
    import errno
    assert base.out_of_descriptors(OSError(errno.EMFILE, "Too many open files"))
    assert not base.out_of_descriptors(OSError(errno.ENOENT, "x"))
    err = base.descriptors_error("cannot open a connection to h:22")
    assert err.layer == "unreachable"
    assert err.message.startswith("out of file descriptors (ulimit -n ")


# ----------------------------------------------------------------------- what a refusal says
# (found by the mutation run of setup.cfg [mutmut]: the reasons below reach the protocol row)

def _reason(body: bytes) -> str:
    with pytest.raises(wire.ProtocolError) as exc:
        wire.decode_result(body)
    return exc.value.reason


def test_a_nan_is_named_in_the_refusal():
    assert _reason(json.dumps(good_doc()).replace('0.25', 'NaN').encode()).startswith(
        "the result is not JSON (NaN is not JSON")


@pytest.mark.parametrize("changes, reason", [
    ({"summary": 1.5}, "summary is a number, not a string"),
    ({"summary": 2}, "summary is a number, not a string"),
    ({"summary": True}, "summary is a boolean, not a string"),
    ({"summary": None}, "summary is null, not a string"),
    ({"summary": []}, "summary is a list, not a string"),
    ({"data": "x"}, "data is a string, not an object"),
    ({"status": "s" * 50}, "status is '" + "s" * 39 + ", not one of ok, warn, fail, error"),
    ({"status": 3}, "status is a number, not one of ok, warn, fail, error"),
    ({"error": {"layer": "L" * 50, "type": "t", "message": "m"}},
     "error.layer '" + "L" * 40 + "' is not a known layer"),
])
def test_each_refusal_names_the_field_and_the_type(changes, reason):
    assert _reason(json.dumps(good_doc(**changes)).encode()) == reason


def test_a_value_json_cannot_hold_is_named_by_its_type():
    assert wire.schema_problem(("a", "tuple")) == "the result is tuple, not an object"
    assert wire.schema_problem(good_doc(summary={1, 2})) == "summary is set, not a string"


def test_a_refused_payload_says_why():
    payload = wire.build_payload(b"R", {"nonce": NONCE}, {"a.py": b"x" * 10})
    with pytest.raises(ValueError, match=r"^payload truncated: a part of 10 bytes has 7$"):
        wire.parse_payload(payload[:-3])
    with pytest.raises(ValueError, match=r"^5 trailing bytes after the bundle$"):
        wire.parse_payload(payload + b"extra")


BEGIN = (wire.FRAME_BEGIN % NONCE + "\n").encode()
END = ("\n" + wire.FRAME_END % NONCE).encode()


def test_frame_edges():
    assert wire.find_frame(BEGIN + b"{}" + END, NONCE) == b"{}"          # a frame at offset 0
    assert wire.find_frame(BEGIN + END, NONCE) == b""                    # an empty one
    assert wire.find_frame(b"x" + BEGIN + b"{}" + END + b"\n" + BEGIN + b"{\"par", NONCE) == b"{}"
    assert wire.find_frame(b"", NONCE) is None


@pytest.mark.parametrize("before", [b"", b"xyz", b"j" * 500])
def test_an_end_without_a_begin_shows_what_came_before_it(before):
    with pytest.raises(wire.ProtocolError) as exc:
        wire.find_frame(before + END, NONCE)
    assert exc.value.reason.startswith("the result frame's end marker came without its begin marker "
                                       "(a frame over the 16 MiB limit")
    assert exc.value.excerpt == (wire.safe_excerpt(before[-wire.EXCERPT_CHARS:]) if before else "")


def test_protocol_error_text():
    plain = wire.ProtocolError("r")
    assert (plain.reason, plain.excerpt, str(plain)) == ("r", "", "r")
    with_excerpt = wire.ProtocolError("r", b"ab\x1b")
    assert (with_excerpt.reason, with_excerpt.excerpt, str(with_excerpt)) == ("r", "'ab\\x1b'", "r; it began 'ab\\x1b'")


@pytest.mark.parametrize("data, excerpt", [
    (b"abc", "'abc'"),
    (b"a" * 50, "'" + "a" * 50 + "'"),
    (b"a" * 160, "'" + "a" * 160 + "'"),
    (b"a" * 161, "'" + "a" * 160 + "'\N{HORIZONTAL ELLIPSIS}"),
    (b"a" * 200, "'" + "a" * 160 + "'\N{HORIZONTAL ELLIPSIS}"),
    (b"\xff\xe9", "'\\\\xff\\\\xe9'"),
])
def test_safe_excerpt_exactly(data, excerpt):
    assert wire.safe_excerpt(data) == excerpt


@pytest.mark.parametrize("body", [b"[" * 100, b"not json", b'{"schema": 2}'])
def test_every_refusal_carries_an_excerpt_of_the_frame(body):
    with pytest.raises(wire.ProtocolError) as exc:
        wire.decode_result(body)
    assert exc.value.excerpt == wire.safe_excerpt(body)


def test_not_json_says_what_the_parser_said():
    assert _reason(b"{]").startswith("the result is not JSON (Expecting property name enclosed in double quotes")


def test_a_result_of_exactly_the_size_limit_passes():
    doc = good_doc()
    body = json.dumps(doc).encode()
    doc["data"]["pad"] = "x" * (wire.MAX_RESULT_BYTES - len(body) - len(', "pad": ""'))
    body = json.dumps(doc).encode()
    assert len(body) == wire.MAX_RESULT_BYTES
    assert wire.decode_result(body)["data"]["pad"].startswith("xxx")
    with pytest.raises(wire.ProtocolError, match="over the 16 MiB limit") as exc:
        wire.decode_result(body[:-1] + b" }")
    assert exc.value.excerpt.startswith("'{\"schema\": 2")


# ----------------------------------------------------------------------------- values at the gate (issue 29 §0)
# Well-formed, schema-valid documents with a value the client cannot hold or write: before the
# gate, each number below ended the whole run in Result.from_dict or prom.py (OverflowError),
# each surrogate in a file's or a stream's encoder (UnicodeEncodeError).

BIG = 10**400                      # json.dumps writes it as 401 digits


@pytest.mark.parametrize("changes, reason", [
    ({"duration_s": BIG}, "duration_s: an integer of 401 digits"),
    ({"duration_s": -BIG}, "duration_s: an integer of 401 digits"),
    ({"data": {"checks": {"xid": {"status": "ok", "seconds": BIG}}}},
     "data.checks.xid.seconds: an integer of 401 digits"),
    ({"data": {"rows": [1, [2, BIG]]}}, "data.rows[1][1]: an integer of 401 digits"),
    ({"findings": [{"level": "fail", "code": "c", "message": "m", "gpus": [0, BIG]}]},
     r"findings[0].gpus[1]: an integer of 401 digits"),
    ({"log": [{"level": "INFO", "source": "s", "message": "m", "n": BIG}]},
     "log[0].n: an integer of 401 digits"),
    ({"data": {"max": 2**63}}, "data.max: an integer of 19 digits"),
    ({"data": {"min": -2**63}}, "data.min: an integer of 19 digits"),
    ({"data": {"a\nb": BIG}}, "data.a\\nb: an integer of 401 digits"),
])
def test_an_integer_past_the_bound_is_a_protocol_error_naming_where(changes, reason):
    assert _reason(json.dumps(good_doc(**changes)).encode()) == \
        f"{reason}, past the bound of 2**63 - 1 either way"


def test_the_integer_bound_is_int64_less_its_one_asymmetric_value():
    assert wire.MAX_INT == 2**63 - 1
    doc = good_doc(duration_s=2**63 - 1, data={"max": 2**63 - 1, "min": -(2**63 - 1), "zero": 0})
    assert wire.decode_result(json.dumps(doc).encode()) == doc
    assert results.Result.from_dict(doc).duration_s == float(2**63 - 1)


@pytest.mark.parametrize("number, where, shown", [
    (b"1e400", "duration_s", "inf"),
    (b"-1e400", "duration_s", "-inf"),
    (b"1" + b"0" * 400 + b".0", "duration_s", "inf"),
])
def test_a_float_json_reads_as_infinite_is_a_protocol_error(number, where, shown):
    body = json.dumps(good_doc()).encode().replace(b"0.25", number)
    assert _reason(body) == f"{where}: {shown}, not a finite number"
    nested = json.dumps(good_doc(data={"t": [0.5, "x"]})).encode().replace(b"0.5", number)
    assert _reason(nested) == f"data.t[0]: {shown}, not a finite number"


def test_the_largest_finite_floats_pass():
    doc = good_doc(duration_s=1.7976931348623157e308, data={"tiny": -1.7976931348623157e308,
                                                            "sub": 5e-324})
    assert wire.decode_result(json.dumps(doc).encode()) == doc


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinities_are_not_json_anywhere(constant):
    for body in (json.dumps(good_doc()).encode().replace(b"0.25", constant),
                 json.dumps(good_doc(data={"x": [1, "y"]})).encode().replace(b"[1,", b"[" + constant + b",")):
        assert _reason(body) == f"the result is not JSON ({constant.decode()} is not JSON)"


@pytest.mark.parametrize("changes, reason", [
    ({"duration_s": True}, "duration_s is a boolean, not a number"),
    ({"duration_s": False}, "duration_s is a boolean, not a number"),
    ({"schema": True}, "schema is True, not 2"),
    ({"schema": 2.0}, "schema is 2.0, not 2"),
    ({"findings": [{"level": "fail", "code": "c", "message": "m", "gpus": [0, True]}]},
     "findings[0].gpus holds a boolean, not a number or a string"),
    ({"findings": [{"level": "fail", "code": "c", "message": "m", "gpus": [False]}]},
     "findings[0].gpus holds a boolean, not a number or a string"),
    ({"findings": [{"level": "fail", "code": "c", "message": "m", "ports": [True]}]},
     "findings[0].ports holds a boolean, not a string"),
    ({"findings": [{"level": "fail", "code": "c", "message": "m", "action": ""}]},
     "findings[0].action '' is not one of none, monitor, app, reset-gpu, reboot, drain, rma"),
])
def test_a_boolean_or_a_float_where_an_int_goes_and_an_empty_action_are_refused(changes, reason):
    assert _reason(json.dumps(good_doc(**changes)).encode()) == reason


def test_lone_surrogates_are_let_in_as_their_escapes_everywhere():
    """A code, a message, a summary, data keys and values, at any depth: each lone surrogate as
    the six characters render.safe_text shows; a real pair (an emoji) is left alone."""
    doc = good_doc(summary="s\udfff", findings=[{"level": "warn", "code": "x\ud800",
                                                 "message": "m\udbff\udbff", "hint": "\udc00"}],
                   data={"\ud800key": {"deep": ["v\udc00", {"\udfffk": "\U0001f600"}]}},
                   log=[{"level": "INFO", "source": "s\ud800", "message": "m"}])
    body = json.dumps(doc).encode()
    assert b"\\ud800" in body          # how a target sends one (json.dumps escapes it)
    got = wire.decode_result(body)
    assert got["summary"] == "s\\udfff"
    assert got["findings"][0] == {"level": "warn", "code": "x\\ud800", "message": "m\\udbff\\udbff",
                                  "hint": "\\udc00"}
    assert got["data"] == {"\\ud800key": {"deep": ["v\\udc00", {"\\udfffk": "\U0001f600"}]}}
    assert got["log"][0]["source"] == "s\\ud800"
    # what the files, the labels and the streams do with it: encode, never raise
    text = json.dumps(results.Result.from_dict(got).to_dict(), ensure_ascii=False)
    assert text.encode("utf-8").decode("utf-8") == text


def test_keys_that_become_one_once_escaped_are_refused_not_merged():
    body = b'{"k": 1, "\\\\ud800": 1, "\\ud800": 2}'
    assert json.loads(body)["\\ud800"] == 1       # one key is the six characters already
    assert _reason(json.dumps(good_doc(data={"x": 1})).encode().replace(b'{"x": 1}', body)) == \
        "data: two keys that are one once their lone surrogates are escaped"


def test_encodable_changes_only_lone_surrogates():
    assert wire.encodable("plain é \U0001f600 \\ud800") == "plain é \U0001f600 \\ud800"
    assert wire.encodable("\ud800\udfff") == "\\ud800\\udfff"     # two lone ones, not a pair
    assert wire.encodable("a\ud83d") == "a\\ud83d"


def test_a_hostile_value_at_the_top_of_a_progress_record_or_anywhere_else_in_one_drops_it():
    """Progress records pass the same gate: a 401-digit ``t`` raised OverflowError out of the
    reader (in the transport's output callback) before it."""
    for bad in (b'{"seq": 0, "t": 1' + b"0" * 400 + b"}", b'{"seq": 0, "t": 1e400}',
                b'{"seq": 9223372036854775808, "t": 0}', b'{"seq": 0, "t": 0, "x": [1e999]}'):
        assert wire.parse_progress(bad) is None, bad
    assert wire.parse_progress(b'{"seq": 9223372036854775807, "t": 0, "text": "a\\ud800"}') == \
        {"seq": 2**63 - 1, "t": 0.0, "text": "a\\ud800"}


@pytest.mark.parametrize("mode, reason", [
    ("int-401-duration", "duration_s: an integer of 401 digits"),
    ("int-401-seconds", "data.checks.xid.seconds: an integer of 401 digits"),
    ("float-1e400", "data.temperature_c: inf, not a finite number"),
    ("minus-infinity", "the result is not JSON (-Infinity is not JSON)"),
    ("bool-duration", "duration_s is a boolean, not a number"),
])
def test_a_hostile_value_is_that_targets_protocol_row(mode, reason):
    r = runner.run_one(hostile(mode), bundle.script_job("ping"), SshPool())
    assert r.status == "error" and r.error.layer == "protocol", r.to_dict()
    assert r.error.message.startswith(f"the target answered with a malformed result: {reason}")


def test_values_at_the_bound_and_escaped_surrogates_come_through_a_run():
    r = runner.run_one(hostile("int-at-bound"), bundle.script_job("ping"), SshPool())
    assert (r.status, r.data) == ("ok", {"max": 2**63 - 1, "min": -(2**63 - 1)}), r.to_dict()
    r = runner.run_one(hostile("surrogates"), bundle.script_job("ping"), SshPool())
    assert r.status == "warn" and [f.code for f in r.findings] == ["x\\ud800"], r.to_dict()


# ----------------------------------------------------------------------------- boundaries (issue 29 §5)
# Each limit at the limit and one past it; every one of these was a surviving hand-made mutant.

PROGRESS = (wire.PROGRESS_MARK % NONCE).encode()


def progress_line(seq: int, size: int) -> bytes:
    """A valid progress line of exactly ``size`` bytes, its newline not counted."""
    head = PROGRESS + b'{"seq": %d, "t": 0, "text": "' % seq
    line = head + b"x" * (size - len(head) - 2) + b'"}'
    assert len(line) == size
    return line


def read_progress(*lines: bytes):
    got = []
    reader = wire.ProgressReader(NONCE, got.append)
    reader.feed(b"".join(line + b"\n" for line in lines))
    return [record["seq"] for record in got], reader


def test_a_progress_line_of_128_kib_passes_and_one_byte_more_is_dropped():
    assert wire.MAX_PROGRESS_LINE == 128 * 1024       # what the runtime's lines are sized against
    assert read_progress(progress_line(0, 128 * 1024))[0] == [0]
    seqs, reader = read_progress(progress_line(0, 128 * 1024 + 1), progress_line(1, 100))
    assert (seqs, reader.ignored) == ([1], 1)


def test_progress_lines_of_2_mib_in_all_with_their_newlines_pass_and_one_byte_more_does_not():
    n, size = 16, wire.MAX_PROGRESS_BYTES // 16 - 1       # 16 lines + newlines == 2 MiB exactly
    exact = [progress_line(i, size) for i in range(n)]
    assert sum(len(line) + 1 for line in exact) == wire.MAX_PROGRESS_BYTES
    assert read_progress(*exact)[0] == list(range(n))
    over = exact[:-1] + [progress_line(n - 1, size + 1)]
    seqs, reader = read_progress(*over)
    assert (seqs, reader.ignored, reader.received) == (list(range(n - 1)), 1, (size + 1) * (n - 1))


def test_a_repeated_seq_is_dropped_and_seq_0_is_the_first():
    seqs, reader = read_progress(progress_line(0, 80), progress_line(0, 80), progress_line(1, 80))
    assert (seqs, reader.ignored) == ([0, 1], 1)


@pytest.mark.parametrize("text, ok", [
    (b'{"seq": 0, "t": 0}', True),
    (b'{"seq": -1, "t": 0}', False),
    (b'{"seq": true, "t": 0}', False),
    (b'{"seq": false, "t": 0}', False),
    (b'{"seq": 0, "t": true}', False),
    (b'{"seq": 0, "t": 0, "coalesced": 0}', True),
    (b'{"seq": 0, "t": 0, "coalesced": -1}', False),
    (b'{"seq": 0, "t": 0, "coalesced": true}', False),
    (b'{"seq": 0, "t": 0, "x": [[[1]]]}', True),          # depth 4: the limit
    (b'{"seq": 0, "t": 0, "x": [[[[1]]]]}', False),       # depth 5
    (b'{"seq": 0, "t": 0, "output": [["stdout", "a"]]}', True),
    (b'{"seq": 0, "t": 0, "output": [["stdout", "a", "b"]]}', False),
    (b'{"seq": 0, "t": 0, "output": [["stdout"]]}', False),
    (b'{"seq": 0, "t": 0, "output": [[]]}', False),
])
def test_progress_record_edges(text, ok):
    assert (wire.parse_progress(text) is not None) is ok


def test_a_payload_one_byte_short_is_refused():
    payload = wire.build_payload(b"R", {"nonce": NONCE}, {"a.py": b"x" * 10})
    with pytest.raises(ValueError, match=r"^payload truncated: a part of 10 bytes has 9$"):
        wire.parse_payload(payload[:-1])
    assert wire.parse_payload(payload)[3] == {"a.py": b"x" * 10}


def test_an_out_of_bounds_refusal_names_where_even_at_the_top_and_cuts_a_long_key():
    def refusal(value):
        with pytest.raises(wire.ValueOutOfBounds) as exc:
            wire.bounded_values(value)
        return str(exc.value)
    tail = "an integer of 401 digits, past the bound of 2**63 - 1 either way"
    assert refusal(BIG) == f"the document: {tail}"
    assert refusal([1, BIG]) == f"[1]: {tail}"
    assert refusal({"k" * 50: [{"a": BIG}]}) == f"{'k' * 40}[0].a: {tail}"
    body = json.dumps(good_doc(duration_s=BIG)).encode()
    with pytest.raises(wire.ProtocolError) as exc:
        wire.decode_result(body)
    assert exc.value.excerpt == wire.safe_excerpt(body)


def test_a_log_entry_s_extra_keys_are_not_checked_as_a_finding_s():
    """Only findings carry action/gpus/ports (schema 2); a log entry's other keys are ignored."""
    doc = good_doc(log=[{"level": "INFO", "source": "s", "message": "m", "action": "panic", "gpus": "x"}])
    assert wire.decode_result(json.dumps(doc).encode()) == doc


def test_the_runtime_s_length_line_names_its_digest_only_when_given_one():
    digest = "ab" * 32
    with_digest = wire.build_payload(b"RUNTIME", {"nonce": NONCE}, {}, runtime_digest=digest)
    plain = wire.build_payload(b"RUNTIME", {"nonce": NONCE}, {})
    stage_a = wire._part(wire.STAGE_A.encode("utf-8"))
    assert with_digest[len(stage_a):].startswith(b"7 " + digest.encode() + b"\nRUNTIME")
    assert plain[len(stage_a):].startswith(b"7\nRUNTIME")
    assert wire.parse_payload(with_digest)[1] == wire.parse_payload(plain)[1] == b"RUNTIME"
    with pytest.raises(ValueError, match=r"^the header's 'files' key is the payload's own \(the files' sizes\)$"):
        wire.build_payload(b"R", {"files": []}, {})


def test_an_unknown_action_is_quoted_up_to_40_characters():
    doc = good_doc(findings=[{"level": "fail", "code": "c", "message": "m", "action": "a" * 50}])
    assert _reason(json.dumps(doc).encode()).startswith(f"findings[0].action {'a' * 40!r} is not one of")
