"""An interrupted fan-out tells its local children to stop (diagnostics/transport/local.py, Stopper),
whenever the signal lands: a child is registered before it is started, and none starts after.

Found by a stress run of tests/integration/test_termination.py's two-signal case (about one run
in 25): a signal that landed while a worker was between starting a local child and registering
it left the child unstopped, its runtime waiting on an open stdin, and mldiag waiting for the
worker thread at exit, for good."""

import subprocess
import threading
import time

import pytest

from diagnostics.transport import local
from diagnostics.transport.local import LocalTransport, Stopper
from tests.programs import space_free_python


@pytest.fixture
def waits_for_eof(tmp_path):
    """A child that reads its stdin to the end, then says so: it ends only when its stdin is
    closed. A script file, so that its command line is safe words (test_command_lines.py)."""
    script = tmp_path / "waits.py"
    script.write_text("import sys\nsys.stdin.buffer.read()\nprint('eof')\n")
    return [str(space_free_python()), str(script)]


def in_a_worker(stopper, fn):
    """``fn()`` in a thread that answers to ``stopper``, as a fan-out's worker does."""
    box = {}

    def worker():
        local.answer_to(stopper)
        box["value"] = fn()
    thread = threading.Thread(target=worker)
    thread.start()
    return thread, box


def test_a_child_started_as_the_signal_lands_is_still_told(monkeypatch, waits_for_eof):
    stopper = Stopper()
    real_popen = subprocess.Popen

    def popen_then_signal(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        stopper.stop()                  # the interrupt, right after the fork
        return proc
    monkeypatch.setattr(local.subprocess, "Popen", popen_then_signal)
    started = time.monotonic()
    thread, box = in_a_worker(stopper, lambda: LocalTransport().run(
        waits_for_eof, b"", time.monotonic() + 60))
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


def test_a_stop_reaches_every_running_child_of_its_fan_out_only(waits_for_eof):
    ours, other = Stopper(), Stopper()
    mine = [in_a_worker(ours, lambda: LocalTransport().run(waits_for_eof, b"",
                                                           time.monotonic() + 60))
            for _ in range(3)]
    theirs, their_box = in_a_worker(other, lambda: LocalTransport().run(
        waits_for_eof, b"", time.monotonic() + 3))
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


def test_a_child_outside_a_fan_out_runs_as_before(tmp_path):
    script = tmp_path / "says.py"
    script.write_text("print(1)\n")
    out = LocalTransport().run([str(space_free_python()), str(script)], b"", time.monotonic() + 30)
    assert (out.stdout, out.exit_code) == (b"1\n", 0)
