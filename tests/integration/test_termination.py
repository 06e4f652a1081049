"""SIGTERM and SIGHUP end a run as Ctrl-C does (issue 10 item 10): what arrived is saved,
summary.json says interrupted, the diagnostics still running are stopped, exit 128 + signal.
Local targets only here (no lab needed); the Slurm cases are in test_slurm.py."""

import json
import os
import signal
import time
import uuid
from functools import partial

import pytest

from tests.lab.util import pids_with_marker as marked, wait_until
from tests.programs import running_mldiag, signal_and_wait, start_mldiag

wait_for = partial(wait_until, interval=0.1)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                      (signal.SIGINT, 130)])
def test_a_signal_ends_a_local_run_like_ctrl_c(tmp_path, sig, code):
    marker = f"mldiag-term-{uuid.uuid4().hex[:8]}"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  fast: {local: true}\n  slow: {local: true}\n")
    script = tmp_path / "sleepy.py"
    script.write_text("import os, subprocess, sys\n"
                      "if os.environ['MLDIAG_TARGET'] == 'slow':\n"
                      "    subprocess.run([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]])\n"
                      "print('done')\n")
    save = tmp_path / "saved"
    with running_mldiag("run-script", script, "--arg", marker, "--hosts-file", hosts,
                        "-H", "fast,slow", "--save", save) as proc:
        wait_for(lambda: (save / "fast.json").exists() and marked(marker), 60,
                 "fast saved and slow running")
        out, err = signal_and_wait(proc, sig, 60)
    assert proc.returncode == code, (proc.returncode, err)
    name = "interrupted" if sig == signal.SIGINT else f"terminated ({signal.Signals(sig).name})"
    assert err == f"mldiag: {name} (1 of 2 targets finished, saved in {save})\n"
    summary = json.loads((save / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["exit_code"] == code
    assert summary["targets"] == {"fast": "ok"} and summary["not_finished"] == ["slow"]
    # every file whole, none half-written (savedir: temp + rename, held against the signal)
    assert sorted(p.name for p in save.iterdir()) == ["fast.json", "summary.json"]
    assert json.loads((save / "fast.json").read_text())["status"] == "ok"
    wait_for(lambda: not marked(marker), 10, "the slow diagnostic to be stopped")


def test_terminating_a_runbook_writes_its_report_and_exits_143(tmp_path):
    """The runbook engine handles the interrupt itself (the report of what ran is written);
    TERM gives 143 there too, in the exit code and in report.json."""
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)                                   # scan-log blocks opening it: a hung step
    books = tmp_path / "books"
    books.mkdir()
    (books / "hang.yaml").write_text("description: a step that hangs\nsteps:\n  - task: ping\n"
                                     f"  - task: scan-log\n    args: {{path: {fifo}}}\n")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("runbooks: books\nhosts:\n  a: {local: true}\n")
    out = tmp_path / "out"
    proc = start_mldiag("runbook", "hang", "--hosts-file", hosts, "-H", "a", "--save", out)
    writer = []

    def scan_log_is_reading():
        """A FIFO opens for writing (non-blocking) only once a reader has it open: then the
        step is running, and with our end open and silent it stays blocked in read()."""
        assert proc.poll() is None, proc.communicate()
        try:
            writer.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            return False
        return True
    try:
        wait_for(scan_log_is_reading, 60, "the scan-log step to open the FIFO")
        _, err = signal_and_wait(proc, signal.SIGTERM, 60)
    finally:
        for fd in writer:
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, (proc.returncode, err)
    assert err == "mldiag: terminated (SIGTERM)\n"
    doc = json.loads((out / "report.json").read_text())
    assert doc["interrupted"] is True and doc["exit_code"] == 143
    assert [r["status"] for r in doc["steps"][0]["results"]] == ["ok"]


SIGNAL_PAIRS = [(signal.SIGTERM, signal.SIGINT), (signal.SIGINT, signal.SIGTERM),
                (signal.SIGHUP, signal.SIGTERM), (signal.SIGTERM, signal.SIGHUP)]


def test_a_second_signal_never_changes_the_first_ones_exit_code(tmp_path):
    """Two signals in quick succession, 20 runs, the second 0.1 to 0.955 s after the first: the
    run ends with the first one's code whenever the second lands, in the cleanup or after it
    (while Invoke prints and Python exits, where it used to end the process by itself, -15).

    Not closer than 0.1 s: two signals that are both pending when the main thread next runs are
    handled in signal-number order (Python's), and even the order their C-level handlers ran in
    is not the order they were sent (each goes to whichever thread the kernel picks), so which
    came "first" is not defined then. Sent back to back (0 s), a TERM then a Ctrl-C ended one run
    in 20 with 130 on a busy CI machine."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  slow: {local: true}\n")
    script = tmp_path / "sleepy.py"
    script.write_text("import subprocess, sys\n"
                      "subprocess.run([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]])\n")
    codes, landed = [], 0
    for run in range(20):
        first, second = SIGNAL_PAIRS[run % len(SIGNAL_PAIRS)]
        marker = f"mldiag-twice-{uuid.uuid4().hex[:8]}"
        with running_mldiag("run-script", script, "--arg", marker, "--hosts-file", hosts,
                            "-H", "slow") as proc:
            # the diagnostic, not mldiag (whose own argv holds the marker too): the run is on
            wait_for(lambda: set(marked(marker)) - {proc.pid}, 60, "the diagnostic to run")
            proc.send_signal(first)
            time.sleep(0.1 + 0.045 * run)
            landed += proc.poll() is None
            proc.send_signal(second)
            _, err = proc.communicate(timeout=60)
        codes.append((first, second, proc.returncode, 128 + first))
        wait_for(lambda: not marked(marker), 10, "the diagnostic to be stopped")
    assert [c for c in codes if c[2] != c[3]] == [], codes
    assert landed >= 10, f"the second signal reached a live process in only {landed} runs"
