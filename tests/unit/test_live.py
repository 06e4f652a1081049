"""The live area on a real terminal (a tmux pane, tests/terminal.py) and its absence on pipes
(issue 11 item 2).

The scripts wait for release files the test creates once the screen shows what it must show
while they run: nothing here depends on how fast anything is.
"""

import os
import re
import signal
import subprocess
import textwrap

import pytest

from tests.programs import mldiag
from tests.terminal import TMUX, mldiag_screen

pytestmark = pytest.mark.skipif(TMUX is None and not os.environ.get("CI"),
                                reason="tmux is not installed (.ci/run installs it)")

WAITER = """\
import os, sys, time
def wait_for(name):
    path = os.path.join(os.environ["RELEASE_DIR"], name)
    end = time.time() + 60
    while not os.path.exists(path):
        if time.time() > end:
            sys.exit("never released")
        time.sleep(0.02)
"""


def elapsed_as_n(text: str) -> str:
    """The live lines' elapsed times (``0s``, ``12s``, ``1m05s``, right-aligned in 5 columns)
    as ``Ns`` in the same columns: the rest is literal."""
    return re.sub(r"(?<= )\d+(?:m\d\d)?s(?=  |$)", lambda m: "Ns".rjust(len(m.group())), text,
                  flags=re.M)


def cursor_visible(screen) -> bool:
    """tmux's own idea of the pane's cursor (terminal.py has no helper for it)."""
    out = subprocess.run([TMUX, "-S", screen.socket, "display-message", "-p", "#{cursor_flag}"],
                         capture_output=True, text=True, timeout=30).stdout
    return out.strip() == "1"


@pytest.fixture
def work(tmp_path):
    (tmp_path / "release").mkdir()
    return tmp_path


def release(work, name):
    (work / "release" / name).touch()


def write(work, name, text):
    (work / name).write_text(textwrap.dedent(text))
    return str(work / name)


def test_run_script_output_streams_live_on_a_terminal_then_the_table(work):
    script = write(work, "steps.py", WAITER + """\
print("step 1: loading", flush=True)
print("\\x1b[2J not a clear screen", flush=True)
wait_for("go")
print("step 2: done")
""")
    with mldiag_screen("run-script", script, cwd=work, env={"RELEASE_DIR": str(work / "release")},
                       width=80, height=20) as screen:
        shown = screen.wait_for(lambda s: "not a clear screen" in s and "local" in s)
        assert screen.exit_status() is None            # still running: the output came live
        assert elapsed_as_n(shown) == (
            "step 1: loading\n"
            "\\x1b[2J not a clear screen\n"
            "local     Ns  \\x1b[2J not a clear screen\n")
        release(work, "go")
        assert screen.wait_exit() == 0
        assert screen.text() == (
            "step 1: loading\n"
            "\\x1b[2J not a clear screen\n"
            "step 2: done\n"
            "TARGETS  STATUS  SUMMARY\n"
            "local    ok      exit 0\n"
            "  output: shown above as it ran (--json/--save keep it)\n"
            "\n"
            "1 ok\n")
        assert cursor_visible(screen)


HOSTS = """\
hosts:
  alpha: {local: true}
  beta: {local: true}
  gamma-with-a-long-name: {local: true}
"""

LOADER = WAITER + """\
import logging
logging.basicConfig(level=logging.INFO)
me = os.environ["MLDIAG_TARGET"]
log = logging.getLogger("loader")
messages = {
    "alpha": "loading shard 1 of 2",
    "beta": "\\x1b]0;pwned\\x07 weights " + "x" * 100,
    "gamma-with-a-long-name": "warming up",
}
log.info(messages[me])
if me == "beta":
    log.warning("beta: cache miss")
wait_for(me)
sys.exit(1 if me == "beta" else 0)
"""


def test_several_targets_show_one_live_line_each_then_only_the_table(work):
    (work / "hosts.yaml").write_text(HOSTS)
    script = write(work, "loader.py", LOADER)
    with mldiag_screen("run-script", script, "-H", "alpha,beta,gamma-with-a-long-name", cwd=work,
                       env={"RELEASE_DIR": str(work / "release")}, width=72, height=20) as screen:
        shown = screen.wait_for(lambda s: s.count("  ") >= 3 and "warming up" in s
                                and "loading shard" in s and "WARNING" in s)
        # one line per target, in the hosts order, clipped to the width (71 columns: a redraw
        # never wraps); the target's escapes shown, never obeyed; no script output (3 targets)
        assert elapsed_as_n(shown) == (
            "alpha                      Ns  loading shard 1 of 2\n"
            "beta                       Ns  WARNING beta: cache miss\n"
            "gamma-with-a-long-name     Ns  warming up\n"
            "[0/3] 0 failed so far\n")
        release(work, "beta")
        shown = screen.wait_for(lambda s: "[1/3] 1 failed so far" in s)
        assert elapsed_as_n(shown) == (
            "alpha                      Ns  loading shard 1 of 2\n"
            "gamma-with-a-long-name     Ns  warming up\n"
            "[1/3] 1 failed so far\n")
        release(work, "alpha")
        release(work, "gamma-with-a-long-name")
        assert screen.wait_exit() == 2
        # the table (item 1: each group's stderr tail under it; the terminal wraps at 72)
        assert screen.text() == (
            "TARGETS                       STATUS  SUMMARY\n"
            "beta                          fail    exit 1\n"
            "  stderr:\n"
            "        INFO:loader:\\x1b]0;pwned\\x07 weights xxxxxxxxxxxxxxxxxxxxxxxxxxx\n"
            + "x" * 72 + "\n"
            "x\n"
            "        WARNING:loader:beta: cache miss\n"
            "alpha,gamma-with-a-long-name  ok      exit 0\n"
            "  output of alpha (gamma-with-a-long-name differs; --json/--save has eac\n"
            "h):\n"
            "  stderr:\n"
            "        INFO:loader:loading shard 1 of 2\n"
            "\n"
            "2 ok · 1 fail\n")
        assert cursor_visible(screen)


def test_a_long_line_is_clipped_and_escapes_are_shown_inert(work):
    (work / "hosts.yaml").write_text(HOSTS)
    script = write(work, "loader.py", LOADER.replace('if me == "beta":', "if False:"))
    with mldiag_screen("run-script", script, "-H", "beta,alpha", cwd=work,
                       env={"RELEASE_DIR": str(work / "release")}, width=60, height=20) as screen:
        shown = screen.wait_for(lambda s: "weights" in s and "loading" in s)
        beta = [line for line in shown.splitlines() if line.startswith("beta")][0]
        assert elapsed_as_n(beta) == "beta      Ns  \\x1b]0;pwned\\x07 weights xxxxxxxxxxxxxxxxxxx…"
        assert len(beta) == 59     # the width less one: no terminal wraps it
        release(work, "alpha")
        release(work, "beta")
        screen.wait_exit()


@pytest.mark.parametrize("how", ["ctrl-c", "term"])
def test_an_interrupted_run_leaves_the_terminal_clean(work, how):
    (work / "hosts.yaml").write_text(HOSTS)
    script = write(work, "loader.py", LOADER)
    with mldiag_screen("run-script", script, "-H", "alpha,gamma-with-a-long-name", cwd=work,
                       env={"RELEASE_DIR": str(work / "release")}, width=80, height=20) as screen:
        screen.wait_for(lambda s: "warming up" in s and "loading shard" in s)
        # the pane's shell would die of a Ctrl-C typed into the pane (it is not interactive):
        # the signal goes to mldiag alone, as the terminal would send it
        shell = subprocess.run([TMUX, "-S", screen.socket, "display-message", "-p", "#{pane_pid}"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
        children = subprocess.run(["ps", "-o", "pid=", "--ppid", shell], capture_output=True,
                                  text=True, timeout=30).stdout.split()
        os.kill(int(children[0]), signal.SIGINT if how == "ctrl-c" else signal.SIGTERM)
        assert screen.wait_exit() == (130 if how == "ctrl-c" else 143)
        final = screen.text()
        assert "warming up" not in final and "failed so far" not in final, final
        assert final.startswith("mldiag: "), final       # only what mldiag says about it
        assert cursor_visible(screen)


def test_on_pipes_no_progress_byte_at_all(work):
    (work / "hosts.yaml").write_text(HOSTS)
    script = write(work, "loader.py", LOADER)
    for name in ("alpha", "beta", "gamma-with-a-long-name"):
        release(work, name)
    r = mldiag("run-script", script, "-H", "alpha,beta", cwd=work,
               env={"RELEASE_DIR": str(work / "release")})
    assert r.returncode == 2
    assert r.stderr == ""
    assert r.stdout == ("TARGETS  STATUS  SUMMARY\n"
                        "beta     fail    exit 1\n"
                        "  stderr:\n"
                        "        INFO:loader:\\x1b]0;pwned\\x07 weights " + "x" * 100 + "\n"
                        "        WARNING:loader:beta: cache miss\n"
                        "alpha    ok      exit 0\n"
                        "  stderr:\n"
                        "        INFO:loader:loading shard 1 of 2\n"
                        "\n"
                        "1 ok · 1 fail\n")


def test_with_json_on_a_terminal_nothing_live_is_drawn(work):
    script = write(work, "steps.py", WAITER + 'print("visible only in the JSON", flush=True)\n')
    with mldiag_screen("run-script", script, "--json", cwd=work, width=80, height=40,
                       env={"RELEASE_DIR": str(work / "release")}) as screen:
        assert screen.wait_exit() == 0
        text = screen.text()
        assert text.startswith("[") and "local  " not in text


def test_not_on_a_terminal_the_area_is_inert():
    import io
    from diagnostics.engine import live
    from diagnostics.core.results import Result
    for stream, enabled in ((io.StringIO(), True), (open(os.devnull, "w"), True)):
        area = live.open_area(stream, ["a", "b"], enabled=enabled)
        assert not area.live and area.ticker is None
        area.event("a", None)
        area.event("a", {"seq": 0, "t": 0.0, "text": "x", "output": [("stdout", "y\n")]})
        area.add(Result("ping", "a", "ok", "s"))
        area.close()
        if isinstance(stream, io.StringIO):
            assert stream.getvalue() == ""
        else:
            stream.close()
