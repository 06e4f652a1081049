"""Progress while a diagnostic runs (issue 11 item 2): the runtime's progress lines, driven for
real through the local transport, and the client's reader of them, fed hostile input.

No test here measures time: where the order of events matters, the diagnostic waits for a file
that only the client's progress callback creates, so it can only finish if its progress arrived
while it ran.
"""

import json
import os
import textwrap
import threading

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.core import wire
from diagnostics.transport.local import LocalTransport
from diagnostics.transport.ssh import SshPool
from diagnostics.inventory.topology import Target
from tests.programs import load_script, space_free_python

NONCE = "0123456789abcdef0123456789abcdef"
MARK = (wire.PROGRESS_MARK % NONCE).encode()


def local(**kw):
    return Target(name="local", local=True, python=space_free_python(), **kw)


def job(source, mode="script", argv=()):
    return bundle.Job("run-script" if mode == "script" else "demo", "demo.py",
                      textwrap.dedent(source).encode(), argv=tuple(argv), mode=mode)


def run_collecting(source, target=None, on_record=None, **kw):
    """run_one with a progress callback: (result, [records in arrival order])."""
    records = []

    def seen(name, record):
        if record is not None:
            records.append(record)
            if on_record:
                on_record(record)

    result = runner.run_one(target or local(), job(source, **kw), SshPool(), on_progress=seen)
    return result, records


def release_on(text, path):
    """A progress callback that creates ``path`` once a record's text contains ``text``."""
    def on_record(record):
        if text in record.get("text", ""):
            open(path, "a").close()
    return on_record


WAIT_FOR_RELEASE = """
    import os, time
    def wait_for(path):
        end = time.time() + 30
        while not os.path.exists(path):
            if time.time() > end:
                raise SystemExit("never released: no progress reached the client while I ran")
            time.sleep(0.01)
"""


# ----------------------------------------------------------------------------- the runtime side


def test_log_records_reach_the_client_while_the_diagnostic_runs(tmp_path):
    release = tmp_path / "release"
    r, records = run_collecting(WAIT_FOR_RELEASE + f"""
    import argparse, logging
    def build_parser(): return argparse.ArgumentParser()
    def run(args):
        logging.basicConfig(level=logging.INFO)    # a no-op here: our handler is on the root
        logging.getLogger("transformers").setLevel(logging.INFO)
        logging.getLogger("transformers").info("loading shard 1 of 2")
        wait_for({str(release)!r})
        return {{"summary": "released"}}
    """, mode="diagnostic", on_record=release_on("loading shard 1 of 2", release))
    assert (r.status, r.summary) == ("ok", "released"), r.to_dict()
    assert {"text": "loading shard 1 of 2", "level": "INFO", "source": "transformers"}.items() \
        <= records[0].items()
    assert r.log == []      # the result's log keeps its WARNING-and-up rule


def test_records_come_in_order_throttled_and_the_newest_text_always_arrives():
    r, records = run_collecting("""
    import logging, sys, time
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    log = logging.getLogger("steps")
    for i in range(400):
        log.info("step %d", i)
        time.sleep(0.002)
    log.info("the last step")
    """)
    assert r.status == "ok", r.to_dict()
    seqs = [rec["seq"] for rec in records]
    assert seqs == list(range(len(seqs)))
    times = [rec["t"] for rec in records]
    assert times == sorted(times)
    # at most one line per interval, by the runtime's own clock; the last lines, sent at once
    # when the diagnostic has ended, carry what was left
    sent_at = sorted(set(times))
    gaps = [b - a for a, b in zip(sent_at[:-2], sent_at[1:-1])]
    assert len(sent_at) >= 3 and all(gap >= 0.2 - 1e-3 for gap in gaps), times
    assert sum(rec.get("coalesced", 0) for rec in records) > 0
    assert records[-1]["text"] in ("the last step", "INFO:steps:the last step")
    steps = [int(rec["text"].split()[-1]) for rec in records if rec.get("text", "").startswith("step ")]
    assert steps == sorted(steps)
    # nothing is lost from the output itself: it all streams, in order
    streamed = "".join(text for rec in records for stream, text in rec.get("output", ()))
    assert streamed == r.data["stdout"]


def test_tqdm_redraws_show_their_last_drawing(tmp_path):
    release = tmp_path / "release"
    r, records = run_collecting(WAIT_FOR_RELEASE + f"""
    import sys
    sys.stderr.write("Loading: 10%|#   |\\rLoading: 60%|###  |\\rLoading: 90%|#### |")
    sys.stderr.flush()
    wait_for({str(release)!r})
    """, on_record=release_on("90%", release))
    assert r.status == "ok", r.to_dict()
    assert records[0]["text"] == "Loading: 90%|#### |"
    assert records[0]["source"] == "stderr"


def test_records_of_loggers_that_do_not_propagate_are_seen_too(tmp_path):
    release = tmp_path / "release"
    r, records = run_collecting(WAIT_FOR_RELEASE + f"""
    import logging, sys
    vllm = logging.getLogger("vllm")        # as vLLM sets itself up: own handler, no propagation
    vllm.addHandler(logging.NullHandler())
    vllm.setLevel(logging.DEBUG)
    vllm.propagate = False
    vllm.debug("below INFO: never shown")
    vllm.info("Loading model weights took 2.1 GB")
    wait_for({str(release)!r})
    """, on_record=release_on("weights took", release))
    assert r.status == "ok", r.to_dict()
    logs = [rec for rec in records if rec.get("source") == "vllm"]
    assert logs and logs[0]["text"] == "Loading model weights took 2.1 GB"
    assert not any("below INFO" in rec.get("text", "") for rec in records)


def test_a_script_s_logging_behaves_as_under_plain_python():
    """run-script: basicConfig takes effect (no handler of ours on the root logger) and its
    records still reach the progress display and, WARNING and up, the result's log."""
    r, records = run_collecting("""
    import logging
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    logging.getLogger("train").info("epoch 1")
    logging.getLogger("train").warning("loss is rising")
    """)
    assert r.status == "ok", r.to_dict()
    assert r.data["stderr"] == "INFO train epoch 1\nWARNING train loss is rising\n"
    assert [(e["level"], e["source"], e["message"]) for e in r.log] == [
        ("WARNING", "train", "loss is rising")]
    assert any(rec.get("text") == "loss is rising" and rec.get("level") == "WARNING" for rec in records)


@pytest.mark.parametrize("spawned", [False, True])
def test_the_record_pipe_never_reaches_what_the_script_runs(spawned):
    """The log-record pipe is close-on-exec in the diagnostic's own process (a spawned child
    gets it across its exec, then closes it for its own children) and its variable is gone."""
    target = local(env=(("PYTHONDONTWRITEBYTECODE", "1"),)) if spawned else local()
    r, records = run_collecting("""
    import os, subprocess, sys
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.listdir('/proc/self/fd')))"],
                           stdout=subprocess.PIPE, universal_newlines=True).stdout
    print("child fds", child.strip(), "env", os.environ.get("MLDIAG_PROGRESS_FD"))
    import logging
    logging.getLogger().warning("still delivered")
    """, target=target)
    assert r.status == "ok", r.to_dict()
    assert "child fds ['0', '1', '2', '3'] env None" in r.data["stdout"]   # 3: listdir's own
    assert any(rec.get("text") == "still delivered" for rec in records)


def test_without_a_display_no_progress_line_is_sent_at_all():
    """No progress asked for (a pipe, --json): the runtime sets nothing up and stdout holds the
    frame only, byte for byte as before."""
    source = b"import logging\nlogging.basicConfig(level=logging.INFO)\nlogging.info('x')\nprint('y')\n"
    j = bundle.Job("run-script", "demo.py", source, mode="script")
    header = bundle.build_header(j, target="local", timeout=30, env={}, activate=(),
                                 python=space_free_python(), nonce=NONCE, tmpdir=None)
    seen = []
    out = LocalTransport().run(wire.bootstrap_argv(space_free_python()),
                               bundle.build_payload(header, bundle.job_files(j)),
                               deadline=__import__("time").monotonic() + 60, on_stdout=seen.append)
    assert b"@@MLDIAG-PROGRESS" not in out.stdout
    assert out.stdout.startswith(b"\n" + (wire.FRAME_BEGIN % NONCE).encode())
    assert b"".join(seen) == out.stdout       # the transport passes every chunk on, as it came


def test_script_output_streams_up_to_the_capture_limit_and_the_frame_still_arrives():
    r, records = run_collecting("""
    import sys
    for i in range(40000):
        sys.stdout.write("line %06d ........................................\\n" % i)
    sys.stderr.write("done\\n")
    """)
    assert r.status == "ok", r.to_dict()
    streamed = {"stdout": "", "stderr": ""}
    for rec in records:
        for stream, text in rec.get("output", ()):
            streamed[stream] += text
    assert len(streamed["stdout"]) == 256 * 1024       # the capture's limit, from the start
    assert r.data["stdout"].startswith(streamed["stdout"][:1000])
    assert streamed["stderr"] == "done\n"
    assert r.data["stdout_bytes"] == 40000 * 53


def test_a_diagnostic_writing_garbage_into_the_record_pipe_changes_nothing(tmp_path):
    release = tmp_path / "release"
    r, records = run_collecting(WAIT_FOR_RELEASE + f"""
    import os
    for fd in range(3, 64):    # find the record pipe and write junk into it
        try:
            if os.readlink("/proc/self/fd/%d" % fd).startswith("pipe:"):
                os.write(fd, b"not json\\n{{\\"level\\": 1}}\\n" + b"x" * 100000 + b"\\n")
        except OSError:
            pass
    print("after the junk", flush=True)
    wait_for({str(release)!r})
    """, on_record=release_on("after the junk", release))
    assert r.status == "ok", r.to_dict()
    assert not any("not json" in rec.get("text", "") for rec in records)


# ----------------------------------------------------------------------------- the client's reader


def line(record, nonce=NONCE):
    return (wire.PROGRESS_MARK % nonce).encode() + json.dumps(record).encode() + b"\n"


def read(*chunks):
    got = []
    reader = wire.ProgressReader(NONCE, got.append)
    for chunk in chunks:
        reader.feed(chunk)
    return got, reader


def test_good_lines_pass_in_order_with_only_the_documented_keys():
    got, reader = read(line({"seq": 0, "t": 0.5, "text": "a", "extra": {"x": 1}}),
                       b"noise\n", line({"seq": 1, "t": 1, "output": [["stdout", "hi\n"]],
                                         "coalesced": 2, "level": "INFO", "source": "s"}))
    assert got == [{"seq": 0, "t": 0.5, "text": "a"},
                   {"seq": 1, "t": 1.0, "output": [("stdout", "hi\n")], "coalesced": 2,
                    "level": "INFO", "source": "s"}]
    assert (reader.accepted, reader.ignored) == (2, 0)


def test_fed_a_byte_at_a_time_it_reads_the_same():
    data = b"".join(line({"seq": i, "t": i, "text": f"t{i}"}) for i in range(5)) + b"\n@@x\n"
    whole, _ = read(data)
    bytewise, _ = read(*(data[i:i + 1] for i in range(len(data))))
    assert whole == bytewise and len(whole) == 5


@pytest.mark.parametrize("bad", [
    line({"seq": 0, "t": 0, "text": "forged"}, nonce="f" * 32),        # another run's nonce
    MARK + b"{not json\n",
    MARK + b'{"seq": 0, "t": NaN}\n',
    MARK + b'[1, 2]\n',
    MARK + b'{"t": 0}\n',
    MARK + b'{"seq": -1, "t": 0}\n',
    MARK + b'{"seq": true, "t": 0}\n',
    MARK + b'{"seq": 0, "t": "0"}\n',
    MARK + b'{"seq": 0, "t": 0, "text": 5}\n',
    MARK + b'{"seq": 0, "t": 0, "output": [["stdin", "x"]]}\n',
    MARK + b'{"seq": 0, "t": 0, "output": [["stdout"]]}\n',
    MARK + b'{"seq": 0, "t": 0, "output": "x"}\n',
    MARK + b'{"seq": 0, "t": 0, "coalesced": -3}\n',
    MARK + b'{"seq": 0, "t": 0, "x": ' + b"[" * 5 + b"]" * 5 + b'}\n',
    MARK + b'[' * 10000 + b"\n",
    MARK + b'{"seq": 0, "t": 0, "text": "\xff\xfe"}\n',
], ids=lambda b: repr(b[len(MARK):len(MARK) + 30]))
def test_hostile_lines_are_counted_and_dropped(bad):
    got, reader = read(bad, line({"seq": 5, "t": 0, "text": "fine"}))
    assert got == [{"seq": 5, "t": 0.0, "text": "fine"}]
    assert reader.ignored >= 1


def test_escapes_pass_as_text_for_the_display_to_make_inert():
    """The reader does not judge text; everything shown goes through render.safe_text (the
    terminal tests show it on a real screen)."""
    from diagnostics.engine.live import shown_line
    got, _ = read(line({"seq": 0, "t": 0, "text": "\x1b]0;owned\x07\x1b[2J\u202eevil"}))
    assert shown_line(got[0]["text"]) == "\\x1b]0;owned\\x07\\x1b[2J\\u202eevil"


def test_a_huge_line_is_skipped_without_being_kept():
    reader = wire.ProgressReader(NONCE, lambda r: None)
    reader.feed(MARK + b'{"seq": 0, "t": 0, "text": "')
    for _ in range(100):                       # 100 x 64 KiB, no newline yet
        reader.feed(b"A" * 65536)
        assert len(reader.buf) <= wire.MAX_PROGRESS_LINE
    reader.feed(b'"}\n' + line({"seq": 1, "t": 0, "text": "next"}))
    assert (reader.accepted, reader.ignored) == (1, 1)


def test_a_line_that_is_not_progress_is_never_buffered():
    reader = wire.ProgressReader(NONCE, lambda r: None)
    reader.feed(b"\n" + (wire.FRAME_BEGIN % NONCE).encode() + b"\n{")
    for _ in range(50):
        reader.feed(b'"k": "' + b"v" * 65536 + b'", ')
        assert len(reader.buf) == 0


def test_a_flood_stops_at_the_total_limit():
    got = []
    reader = wire.ProgressReader(NONCE, got.append)
    lines = [line({"seq": i, "t": 0, "text": "x" * 1000}) for i in range(2500)]   # ~2.7 MB
    reader.feed(b"".join(lines))
    fits = 0
    while sum(map(len, lines[:fits + 1])) <= wire.MAX_PROGRESS_BYTES:
        fits += 1
    assert len(got) == fits < len(lines)
    assert reader.ignored == len(lines) - fits


def test_replayed_or_reordered_records_are_dropped():
    got, reader = read(line({"seq": 3, "t": 0}), line({"seq": 3, "t": 0}), line({"seq": 1, "t": 0}),
                       line({"seq": 4, "t": 0}))
    assert [r["seq"] for r in got] == [3, 4]
    assert reader.ignored == 2


def test_the_result_frame_is_found_after_a_full_run_of_progress():
    """The most progress a runtime sends, then a maximal-size frame: the stdout capture keeps
    it all, and read_result finds the frame."""
    from diagnostics.transport.base import StreamCapture
    rt = load_script("_runtime.py", "mldiag_runtime_progress")
    cap = StreamCapture(wire.STDOUT_HEAD, wire.STDOUT_TAIL)
    record = line({"seq": 0, "t": 0, "output": [["stdout", "\x00" * 8192]]})
    for _ in range(wire.MAX_PROGRESS_BYTES // len(record)):
        cap.feed(record)
    doc = {"schema": 2, "status": "ok", "summary": "s", "findings": [], "data": {"big": "x" * (wire.MAX_RESULT_BYTES - 200)},
           "log": [], "error": None}
    cap.feed(("\n" + rt.FRAME_BEGIN % NONCE + "\n" + json.dumps(doc) + "\n" + rt.FRAME_END % NONCE + "\n").encode())
    assert wire.read_result(cap.value(), NONCE)["data"]["big"] == doc["data"]["big"]


def test_runtime_and_wire_agree_on_the_progress_format():
    rt = load_script("_runtime.py", "mldiag_runtime_progress2")
    assert rt.PROGRESS_MARK == wire.PROGRESS_MARK
    assert rt.PROGRESS_TOTAL_LIMIT <= wire.MAX_PROGRESS_BYTES
    # the longest line the runtime can write: every character escaped as a surrogate pair
    longest = len(rt.PROGRESS_MARK % NONCE) + 12 * (rt.PROGRESS_CHUNK_LIMIT + rt.PROGRESS_TEXT_LIMIT + 100) + 200
    assert longest <= wire.MAX_PROGRESS_LINE


def test_a_display_that_fails_stops_receiving_and_the_run_goes_on():
    calls = []

    def broken(name, record):
        calls.append(record)
        if record is not None:
            raise RuntimeError("display bug")

    r = runner.run_one(local(), job("print('a', flush=True)\nimport time\ntime.sleep(0.3)\nprint('b')\n"),
                       SshPool(), on_progress=broken)
    assert r.status == "ok", r.to_dict()
    assert len([c for c in calls if c is not None]) == 1


def test_many_targets_report_progress_from_their_own_threads(tmp_path):
    targets = [Target(name=f"t{i}", local=True, python=space_free_python()) for i in range(4)]
    seen = {}
    lock = threading.Lock()

    def on_progress(name, record):
        with lock:
            seen.setdefault(name, []).append(record)

    results = runner.run_many(targets, job("print('hello from', __import__('os').getpid(), flush=True)\n"),
                              on_progress=on_progress)
    assert all(r.status == "ok" for r in results)
    for t in targets:
        assert seen[t.name][0] is None                        # started
        assert seen[t.name][1]["text"].startswith("hello from")


def test_progress_crosses_from_worker_processes_alike():
    """A sharded run (diagnostics/engine/shards.py) passes each target's progress back to this process:
    the start, then the output line, for every target, secrets masked in the worker."""
    targets = [Target(name=f"w{i}", local=True, python=space_free_python(),
                      env=(("HF_TOKEN", "hf_abcdefghijklmnopqrstuvwxyz0123456789"),)) for i in range(4)]
    seen = {}
    lock = threading.Lock()

    def on_progress(name, record):
        with lock:
            seen.setdefault(name, []).append(record)

    script = job("import os\nprint('from', os.environ['MLDIAG_TARGET'], os.environ['HF_TOKEN'], flush=True)\n")
    results = runner.run_many(targets, script, on_progress=on_progress, workers=2)
    assert all(r.status == "ok" for r in results)
    for t in targets:
        assert seen[t.name][0] is None                                    # started
        assert seen[t.name][-1]["text"] == f"from {t.name} <redacted>"    # the latest line
        output = [piece for record in seen[t.name][1:] for piece in record.get("output", [])]
        assert [list(p) for p in output] == [["stdout", f"from {t.name} <redacted>\n"]]


@pytest.mark.parametrize("spawned", [False, True])
def test_progress_on_a_real_python_3_8(tmp_path, spawned):
    """The runtime's progress path is 3.8 code: forked, and exec'd with the pipe inherited."""
    from tests.pythons import require_python
    py38 = require_python("3.8")
    env = (("PYTHONDONTWRITEBYTECODE", "1"),) if spawned else ()
    release = tmp_path / "release"
    r, records = run_collecting(WAIT_FOR_RELEASE + f"""
    import logging, sys
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("old").info("on %s", sys.version.split()[0])
    wait_for({str(release)!r})
    """, target=Target(name="local", local=True, python=py38, env=env),
        on_record=release_on("on 3.8.", release))
    assert r.status == "ok", r.to_dict()
    assert records[0]["text"].startswith("on 3.8.") and records[0]["source"] == "old"


def test_secrets_are_masked_in_progress_even_across_a_chunk_boundary():
    secret = "correct-horse-battery-staple-42"
    target = local(env=(("DB_PASSWORD", secret),))
    r, records = run_collecting("""
    import logging, os, sys
    secret = os.environ["DB_PASSWORD"]
    # one line longer than a progress line's output piece, the secret across the cut
    sys.stdout.write("x" * (8192 - 10) + " " + secret + " end\\n")
    logging.basicConfig(level=logging.INFO)
    logging.getLogger("db").info("connecting with %s", secret)
    print("token hf_" + "a" * 34, flush=True)
    """, target=target)
    assert r.status == "ok", r.to_dict()
    shown = json.dumps(records)
    assert secret not in shown and "hf_aaaa" not in shown
    assert secret[:12] not in shown and secret[-12:] not in shown   # neither half of the cut one
    assert "end\\n" in shown and "connecting with" in shown
