"""An interrupted fan-out tells its local children to stop (diagnostics/hops/local.py, Stopper),
whenever the signal lands: a child is registered before it is started, and none starts after.

Found by a stress run of tests/integration/test_termination.py's two-signal case (about one run
in 25): a signal that landed while a worker was between starting a local child and registering
it left the child unstopped, its runtime waiting on an open stdin, and mldiag waiting for the
worker thread at exit, for good."""

import subprocess
import sys
import threading
import time

from diagnostics.hops import local
from diagnostics.hops.local import LocalTransport, Stopper

# reads its stdin to the end, then says so: it ends only when its stdin is closed
WAITS_FOR_EOF = [sys.executable, "-c", "import sys; sys.stdin.buffer.read(); print('eof')"]


def in_a_worker(stopper, fn):
    """``fn()`` in a thread that answers to ``stopper``, as a fan-out's worker does."""
    box = {}

    def worker():
        local.answer_to(stopper)
        box["value"] = fn()
    thread = threading.Thread(target=worker)
    thread.start()
    return thread, box


def test_a_child_started_as_the_signal_lands_is_still_told(monkeypatch):
    stopper = Stopper()
    real_popen = subprocess.Popen

    def popen_then_signal(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        stopper.stop()                  # the interrupt, right after the fork
        return proc
    monkeypatch.setattr(local.subprocess, "Popen", popen_then_signal)
    started = time.monotonic()
    thread, box = in_a_worker(stopper, lambda: LocalTransport().run(
        WAITS_FOR_EOF, b"", time.monotonic() + 60))
    thread.join(30)
    assert not thread.is_alive(), "the child was never told: the worker waits for it"
    assert time.monotonic() - started < 10
    assert box["value"].stdout == b"eof\n" and box["value"].exit_code == 0


def test_no_child_starts_once_the_fan_out_is_stopped(tmp_path):
    stopper = Stopper()
    stopper.stop()
    marker = tmp_path / "started"
    thread, box = in_a_worker(stopper, lambda: LocalTransport().run(
        ["touch", str(marker)], b"", time.monotonic() + 60))
    thread.join(30)
    assert not marker.exists()
    assert box["value"].stderr.startswith(b"mldiag: the run was interrupted")


def test_a_stop_reaches_every_running_child_of_its_fan_out_only():
    ours, other = Stopper(), Stopper()
    mine = [in_a_worker(ours, lambda: LocalTransport().run(WAITS_FOR_EOF, b"",
                                                           time.monotonic() + 60))
            for _ in range(3)]
    theirs, their_box = in_a_worker(other, lambda: LocalTransport().run(
        WAITS_FOR_EOF, b"", time.monotonic() + 3))
    deadline = time.monotonic() + 30
    while len(ours._events) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    ours.stop()
    for thread, box in mine:
        thread.join(30)
        assert not thread.is_alive() and box["value"].stdout == b"eof\n"
    theirs.join(30)
    assert their_box["value"].timed_out            # another fan-out's child was left alone
    assert not ours._events and not other._events


def test_a_child_outside_a_fan_out_runs_as_before():
    out = LocalTransport().run([sys.executable, "-c", "print(1)"], b"", time.monotonic() + 30)
    assert (out.stdout, out.exit_code) == (b"1\n", 0)
