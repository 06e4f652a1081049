"""Progress over real SSH (issue 11 item 2): records reach the client through the ssh transport
while the diagnostic runs, before its result; and on a terminal a remote run-script's output
streams live.

`main` is this machine behind the lab's sshd (user mlsh): the remote script waits for a release
file that the client creates only once the progress record it waits for has arrived, so the run
can end only if progress streamed.
"""

import os
import tempfile
import textwrap

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology
from diagnostics.transport.ssh import SshPool
from tests.terminal import TMUX, mldiag_screen

WAITER = """\
import os, sys, time
def wait_for(path):
    end = time.time() + 30
    while not os.path.exists(path):
        if time.time() > end:
            sys.exit("never released: no progress reached the client while I ran")
        time.sleep(0.02)
"""


@pytest.fixture
def release_dir():
    d = tempfile.mkdtemp(prefix="mldiag-release-")
    os.chmod(d, 0o755)       # mlsh on `main` must see what appears in it
    try:
        yield d
    finally:
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)


@pytest.fixture(scope="module")
def hosts_file(lab):
    return lab.hosts_yaml(textwrap.dedent("""\
        defaults: {connect_timeout: 3, timeout: 60}
        hosts:
          main: {}
          pve:
            address: main
            become: sudo
            containers:
              trainbox: {runtime: pct, id: "200", python: /root/venv/bin/python}
        """))


def test_progress_records_arrive_over_ssh_before_the_result(hosts_file, release_dir):
    release = os.path.join(release_dir, "go")
    source = WAITER + textwrap.dedent(f"""\
        import logging
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("loader").info("loading shard 1 of 2 as %s", os.environ.get("USER") or os.getuid())
        wait_for({release!r})
        logging.getLogger("loader").info("loading shard 2 of 2")
        """)
    job = bundle.Job("run-script", "remote.py", source.encode(), mode="script")
    target = topology.load(str(hosts_file)).targets["main"]
    events = []

    def on_progress(name, record):
        events.append((name, record))
        if record is not None and "shard 1 of 2" in record.get("text", ""):
            open(release, "w").close()

    result = runner.run_one(target, job, SshPool(), on_progress=on_progress)
    assert result.status == "ok", result.to_dict()
    assert events[0] == ("main", None)
    records = [r for _, r in events[1:]]
    assert [r["seq"] for r in records] == list(range(len(records)))
    texts = [r.get("text", "") for r in records]
    first = next(i for i, t in enumerate(texts) if "shard 1 of 2" in t)
    assert any("shard 2 of 2" in t for t in texts[first + 1:])
    # run-script's own output rode along, in order, and matches the result's capture
    streamed = "".join(text for r in records for stream, text in r.get("output", ()) if stream == "stderr")
    assert streamed == result.data["stderr"]
    assert "INFO:loader:loading shard 2 of 2" in streamed


@pytest.mark.skipif(TMUX is None and not os.environ.get("CI"), reason="tmux is not installed")
def test_a_remote_run_script_streams_live_on_a_terminal(hosts_file, release_dir):
    script = os.path.join(release_dir, "steps.py")
    with open(script, "w") as f:
        f.write(WAITER + f"print('step 1 on', os.uname().nodename, flush=True)\n"
                         f"wait_for({os.path.join(release_dir, 'go')!r})\nprint('step 2')\n")
    with mldiag_screen("run-script", script, "--hosts-file", hosts_file, "-H", "main",
                       width=80, height=20) as screen:
        shown = screen.wait_for(lambda s: "step 1 on" in s and "main" in s)
        assert screen.exit_status() is None
        assert shown.splitlines()[0].startswith("step 1 on ")
        assert shown.splitlines()[1].startswith("main ")
        open(os.path.join(release_dir, "go"), "w").close()
        assert screen.wait_exit() == 0
        lines = screen.text().splitlines()
        assert lines[1:] == ["step 2", "TARGETS  STATUS  SUMMARY", "main     ok      exit 0",
                             "  output: shown above as it ran (--json/--save keep it)", "", "1 ok"]


def test_progress_passes_through_sudo_and_a_container(hosts_file):
    """ssh → sudo → pct exec → the container's python: the wrappers only rewrite argv, so the
    records stream through them too. (The container cannot see a release file of ours: here the
    diagnostic waits 3 s after its first record, and that record must reach the client well
    before the run ends.)"""
    import time
    source = textwrap.dedent("""\
        import logging, time
        logging.basicConfig(level=logging.INFO)
        logging.getLogger("ct").info("inside the container")
        time.sleep(3)
        """)
    job = bundle.Job("run-script", "ct.py", source.encode(), mode="script")
    target = topology.load(str(hosts_file)).targets["trainbox"]
    arrivals = []
    result = runner.run_one(target, job, SshPool(), on_progress=lambda name, record: arrivals.append(
        (time.monotonic(), record)))
    ended = time.monotonic()
    assert result.status == "ok", result.to_dict()
    first = next(at for at, record in arrivals if record and record.get("text") == "inside the container")
    assert ended - first > 2.0, (ended - first, arrivals)
