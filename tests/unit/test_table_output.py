"""What the table shows of a target's own output (issue 11, items 1 and 15), through the real
``mldiag`` program on the ``local`` target (and local hosts of a hosts.yaml): run-script's stdout
and stderr tails and its traceback, a backend's failure traceback, error rows that say their
message once, ping's user, the runbook report's saved path on a terminal."""

import json
import os
import pwd
import re
import sys
import textwrap

import pytest

from tests.programs import mldiag, space_free_python

# Never a developer's own user-level hosts file: these tests read only the files they write.
ENV = {"XDG_CONFIG_HOME": "/nonexistent-mldiag-test-config", "NO_COLOR": "1"}


def run(tmp_path, *argv, **kw):
    kw.setdefault("env", ENV)
    return mldiag(*argv, cwd=tmp_path, **kw)


def stable(text):
    """The table with what changes from run to run replaced: the private run directory's name
    and the runtime's own line numbers."""
    text = re.sub(r'File "[^"]*/mldiag-[0-9a-f]+/', 'File "RUN/', text)
    return re.sub(r'(File "mldiag/_runtime\.py", line )\d+', r"\1N", text)


THIRTY = """\
import sys
for i in range(1, 31):
    print(f"line {i} of stdout")
for i in range(1, 4):
    print(f"warning {i} on stderr", file=sys.stderr)
raise RuntimeError("disk full on /scratch")
"""


def test_run_script_shows_the_tail_of_stdout_and_stderr_and_the_whole_traceback(tmp_path):
    (tmp_path / "thirty.py").write_text(THIRTY)
    r = run(tmp_path, "run-script", "thirty.py")
    assert r.returncode == 2, r.stderr
    assert stable(r.stdout) == """\
TARGETS  STATUS  SUMMARY
local    fail    exit 1: RuntimeError: disk full on /scratch
  stdout:
        … 20 more lines: --json/--save
        line 21 of stdout
        line 22 of stdout
        line 23 of stdout
        line 24 of stdout
        line 25 of stdout
        line 26 of stdout
        line 27 of stdout
        line 28 of stdout
        line 29 of stdout
        line 30 of stdout
  stderr:
        warning 1 on stderr
        warning 2 on stderr
        warning 3 on stderr
  traceback:
        Traceback (most recent call last):
          File "mldiag/_runtime.py", line N, in run_child
          File "mldiag/_runtime.py", line N, in _run_path
          File "RUN/thirty.py", line 6, in <module>
            raise RuntimeError("disk full on /scratch")
        RuntimeError: disk full on /scratch

1 fail
"""
    # --json keeps all of it, as before
    doc = json.loads(run(tmp_path, "run-script", "thirty.py", "--json").stdout)[0]
    assert doc["data"]["stdout"].count("of stdout") == 30
    assert doc["data"]["exception"]["traceback"] in doc["data"]["stderr"]


def test_run_script_output_on_a_real_terminal(tmp_path):
    """As a user sees it in a terminal (tmux). One target: the script's output streamed live
    (item 2) stays above the table, whole and inert, and the table points at it instead of
    repeating it. Two targets: nothing streams, the table shows each tail; statuses painted,
    the script's own text never."""
    from tests.terminal import mldiag_screen
    (tmp_path / "thirty.py").write_text(THIRTY.replace('print(f"line {i} of stdout")',
                                                       'print(f"\\x1b[32mline {i}\\x1b[0m of stdout")'))
    env = {k: v for k, v in ENV.items() if k != "NO_COLOR"}
    with mldiag_screen("run-script", "thirty.py", cwd=str(tmp_path), env=env, width=100,
                       height=50) as screen:
        assert screen.wait_exit() == 2
        shown, painted = screen.text(), screen.text(escapes=True)
    above, table = stable(shown).split("TARGETS  STATUS  SUMMARY\n")
    assert table == """\
local    fail    exit 1: RuntimeError: disk full on /scratch
  output: shown above as it ran (--json/--save keep it)

1 fail
"""
    lines = above.splitlines()
    stdout = [line for line in lines if line.endswith("of stdout")]
    assert stdout == [f"\\x1b[32mline {i}\\x1b[0m of stdout" for i in range(1, 31)]
    assert [line for line in lines if "on stderr" in line] == [f"warning {i} on stderr" for i in (1, 2, 3)]
    tb = lines.index("Traceback (most recent call last):")
    assert lines[tb + 3:tb + 6] == ['  File "RUN/thirty.py", line 6, in <module>',
                                    '    raise RuntimeError("disk full on /scratch")',
                                    "RuntimeError: disk full on /scratch"]
    assert len(lines) == 30 + 3 + 6
    assert all("\x1b[" not in line for line in painted.splitlines()
               if "of stdout" in line or "stderr" in line)

    (tmp_path / "hosts.yaml").write_text("hosts:\n  box1: {local: true}\n  box2: {local: true}\n")
    with mldiag_screen("run-script", "thirty.py", "-H", "box1,box2", cwd=str(tmp_path), env=env,
                       width=100, height=50) as screen:
        assert screen.wait_exit() == 2
        shown, painted = screen.text(), screen.text(escapes=True)
    assert stable(shown) == """\
TARGETS   STATUS  SUMMARY
box[1-2]  fail    exit 1: RuntimeError: disk full on /scratch
  stdout:
        … 20 more lines: --json/--save
""" + "".join(f"        \\x1b[32mline {i}\\x1b[0m of stdout\n" for i in range(21, 31)) + """\
  stderr:
        warning 1 on stderr
        warning 2 on stderr
        warning 3 on stderr
  traceback:
        Traceback (most recent call last):
          File "mldiag/_runtime.py", line N, in run_child
          File "mldiag/_runtime.py", line N, in _run_path
          File "RUN/thirty.py", line 6, in <module>
            raise RuntimeError("disk full on /scratch")
        RuntimeError: disk full on /scratch

2 fail
"""
    assert "fail" in painted.splitlines()[1] and "\x1b[" in painted.splitlines()[1]
    assert all("\x1b[" not in line for line in painted.splitlines()[2:-2])


def test_run_script_that_succeeds_shows_its_short_output_whole(tmp_path):
    (tmp_path / "hello.py").write_text("print('loaded 3 shards')\nprint('sum = 42')\n")
    r = run(tmp_path, "run-script", "hello.py")
    assert r.returncode == 0, r.stderr
    assert r.stdout == """\
TARGETS  STATUS  SUMMARY
local    ok      exit 0
  stdout:
        loaded 3 shards
        sum = 42

1 ok
"""


def test_run_script_with_no_output_shows_only_its_row(tmp_path):
    (tmp_path / "quiet.py").write_text("x = 1\n")
    assert run(tmp_path, "run-script", "quiet.py").stdout == """\
TARGETS  STATUS  SUMMARY
local    ok      exit 0

1 ok
"""


def test_run_script_output_is_inert_and_each_line_clipped(tmp_path):
    (tmp_path / "hostile.py").write_text(textwrap.dedent("""\
        import sys
        sys.stdout.write("\\x1b]0;owned\\x07\\x1b[2J title\\n" + "x" * 1000 + "\\n")
        sys.stderr.write("\\u202eevil\\n")
        """))
    r = run(tmp_path, "run-script", "hostile.py")
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "\u202e" not in r.stdout
    lines = r.stdout.splitlines()
    assert "        \\x1b]0;owned\\x07\\x1b[2J title" in lines
    assert "        " + "x" * 200 + "… (+800 chars)" in lines
    assert "        \\u202eevil" in lines


HOSTS = """\
hosts:
  box1: {local: true, env: {WHO: one}}
  box2: {local: true, env: {WHO: one}}
  box3: {local: true, env: {WHO: three}}
  box4: {local: true, env: {WHO: four}}
  dead: {address: 127.0.0.1, port: 1, user: nobody, connect_timeout: 5}
"""


def test_a_folded_group_whose_output_differs_says_whose_is_shown(tmp_path):
    (tmp_path / "hosts.yaml").write_text(HOSTS)
    (tmp_path / "who.py").write_text("import os, sys\nprint('hello from', os.environ['WHO'])\n"
                                     "sys.exit(3)\n")
    r = run(tmp_path, "run-script", "who.py", "-H", "box[1-4]")
    assert r.returncode == 2, r.stderr
    assert r.stdout == """\
TARGETS   STATUS  SUMMARY
box[1-4]  fail    exit 3
  output of box1 (box[3-4] differ; --json/--save has each):
  stdout:
        hello from one

4 fail
"""
    same = run(tmp_path, "run-script", "who.py", "-H", "box[1-2]")
    assert "output of" not in same.stdout and "hello from one" in same.stdout
    # the same traceback on both (only the run directory's name differs) reads the same
    (tmp_path / "boom.py").write_text("raise OSError('no space left on device')\n")
    boom = run(tmp_path, "run-script", "boom.py", "-H", "box[1-2]")
    assert "output of" not in boom.stdout and "  traceback:" in boom.stdout


def test_an_error_row_says_its_message_once(tmp_path):
    (tmp_path / "hosts.yaml").write_text(HOSTS)
    r = run(tmp_path, "ping", "-H", "dead,box1")
    assert r.returncode == 3, r.stderr
    assert re.sub(r"python \S+(?: \(venv\))? as \S+ on \S+", "python V as U on H", r.stdout) == """\
TARGETS  STATUS  SUMMARY
dead     error   unreachable: connect to 127.0.0.1:1: Connection refused
box1     ok      python V as U on H

1 ok · 1 error (unreachable)
"""


def test_extract_smoke_backend_failure_shows_its_traceback_in_the_table(tmp_path):
    from tests.ml import mlenv
    mlenv.require("transformers")
    (tmp_path / "hosts.yaml").write_text(f"hosts:\n  venvbox: {{local: true, python: {space_free_python()}}}\n")
    (tmp_path / "emptymodel").mkdir()
    r = run(tmp_path, "extract-smoke", "-H", "venvbox", "--model", str(tmp_path / "emptymodel"))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[2].startswith("  fail  backend-failed: transformers backend, step load-config: ")
    assert lines[3] == ("        hint: --model must be a model directory whose config.json "
                        "transformers can read")
    assert lines[4:6] == ["  traceback:", "        Traceback (most recent call last):"]
    assert "data.error.traceback" not in r.stdout
    tb = [line for line in lines if line.startswith("        ")][1:]
    assert tb[-1].startswith("        ValueError: Unrecognized model in ")
    # the JSON document keeps its fields
    doc = json.loads(run(tmp_path, "extract-smoke", "-H", "venvbox", "--model",
                         str(tmp_path / "emptymodel"), "--json").stdout)[0]
    assert doc["data"]["error"]["step"] == "load-config"
    assert doc["data"]["error"]["traceback"].startswith("Traceback (most recent call last):")


def test_ping_names_the_user_of_its_uid_whatever_LOGNAME_says(tmp_path):
    me = pwd.getpwuid(os.getuid()).pw_name
    r = run(tmp_path, "ping", "--json", env={**ENV, "LOGNAME": "barsroot", "USER": "barsroot",
                                             "LNAME": "barsroot", "USERNAME": "barsroot"})
    doc = json.loads(r.stdout)[0]
    assert (doc["data"]["user"], doc["data"]["uid"]) == (me, os.getuid())
    assert f" as {me} on " in doc["summary"]


BOOK = """\
description: reachability only
steps:
  - task: ping
    title: every layer reachable?
"""


@pytest.mark.parametrize("save, said", [
    (["--save", "out/run1"], "Left out on a terminal: the whole report, with them, is in "
                             "`out/run1/report.md`;"),
    ([], "Left out on a terminal: `--save DIR` writes them into DIR/report.md,"),
])
def test_the_runbook_report_on_a_terminal_names_the_file_it_wrote(tmp_path, save, said):
    from tests.terminal import mldiag_screen
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "reach.yaml").write_text(BOOK)
    with mldiag_screen("runbook", "reach", "--runbooks-dir", "books", *save, cwd=str(tmp_path),
                       env=ENV, width=200, height=60) as screen:
        assert screen.wait_exit() == 0, screen.text(history=True)
        shown = " ".join(screen.text(history=True).split())
    assert said in shown
    assert "## Raw results" in shown and '"schema"' not in shown   # no appendix on a terminal
    if save:
        assert (tmp_path / "out" / "run1" / "report.md").is_file()


def test_a_crashed_diagnostic_shows_its_traceback_once_under_a_row_said_once(tmp_path):
    # a module of the target's own environment that breaks on import (a shadowing platform.py
    # on PYTHONPATH, as a broken site-packages would): ping itself crashes, on two hosts alike
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "platform.py").write_text(
        "def _load():\n    raise ImportError('libcudart.so.12: cannot open shared object file')\n"
        "_load()\n")
    (tmp_path / "hosts.yaml").write_text(
        "hosts:\n" + "".join(f"  box{i}: {{local: true, env: {{PYTHONPATH: {shadow}}}}}\n"
                             for i in (1, 2)))
    r = run(tmp_path, "ping", "-H", "box[1-2]")
    assert r.returncode == 3, r.stdout + r.stderr
    lines = stable(r.stdout).splitlines()
    assert lines[1].startswith("box[1-2]  error   crashed: ")
    assert lines[1].endswith("libcudart.so.12: cannot open shared object file")
    # the next line is the traceback, not the row again; the same traceback on both hosts
    # (only the run directory's name differs) is not "the others differ"
    assert lines[2] == "  error Traceback (most recent call last):"
    assert "details of" not in r.stdout
    assert lines[-3:] == [
        "        ImportError: libcudart.so.12: cannot open shared object file", "",
        "2 error (crashed)"]
    assert sum("libcudart" in line for line in lines) == 3   # row, raise line, last line
    assert f'          File "{shadow}/platform.py", line 3, in <module>' in lines


# --------------------------------------------------------------------------- any JSON a target sends

from hypothesis import given, settings, strategies as st  # noqa: E402

from diagnostics.views.render import UNSAFE, render_table  # noqa: E402
from diagnostics.core.results import Result  # noqa: E402

ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                   lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4),
                                                                               inner, max_size=3),
                   max_leaves=8)
TEXTS = st.text(alphabet=st.sampled_from("ab\n\r\t\x1b\x07\u202e\x9b é"), max_size=40)


@settings(max_examples=300, deadline=None)
@given(stdout=ANY | TEXTS, stderr=ANY | TEXTS, exc=ANY | st.fixed_dictionaries(
    {}, optional={"traceback": ANY | TEXTS, "type": ANY}), error=ANY | st.fixed_dictionaries(
    {}, optional={"traceback": ANY | TEXTS}))
def test_output_blocks_take_any_json_and_stay_inert(stdout, stderr, exc, error):
    import io
    results = [Result("run-script", "a", "fail", "exit 1",
                      data={"stdout": stdout, "stderr": stderr, "exception": exc}),
               Result("run-script", "b", "fail", "exit 1", data={"stdout": stderr}),
               Result("extract-smoke", "c", "fail", "x", data={"error": error})]
    out = io.StringIO()
    render_table(results, out)
    text = out.getvalue()
    assert [m.group(0) for m in UNSAFE.finditer(text) if m.group(0) != "\n"] == []


def test_run_script_that_times_out_still_shows_what_it_printed(tmp_path):
    """A script killed at its timeout: its output is the clue to where it hung (the runtime
    used to drop it from the result)."""
    (tmp_path / "hang.py").write_text(
        "import sys, time\nprint('loading shard 3 of 8', flush=True)\n"
        "print('NCCL WARN waiting for rank 2', file=sys.stderr, flush=True)\ntime.sleep(60)\n")
    r = run(tmp_path, "run-script", "hang.py", "--timeout", "1")
    assert r.returncode == 3, r.stderr
    assert r.stdout == """\
TARGETS  STATUS  SUMMARY
local    error   timeout: diagnostic ran past the 1 s timeout; killed 1 process(es)
  stdout:
        loading shard 3 of 8
  stderr:
        NCCL WARN waiting for rank 2

1 error (timeout)
"""
    doc = json.loads(run(tmp_path, "run-script", "hang.py", "--timeout", "1", "--json").stdout)[0]
    assert doc["data"]["stdout"] == "loading shard 3 of 8\n" and doc["error"]["stderr"] is None


@pytest.mark.parametrize("raised, said", [
    ("RuntimeError()", "RuntimeError (empty message)"),
    ("RuntimeError('')", "RuntimeError (empty message)"),
    ("KeyError('')", "KeyError: ''"),
    ("ValueError('bad shard 3')", "ValueError: bad shard 3"),
])
def test_run_script_summary_names_an_empty_message_as_such(tmp_path, raised, said):
    (tmp_path / "boom.py").write_text(f"raise {raised}\n")
    r = run(tmp_path, "run-script", "boom.py")
    assert r.returncode == 2, r.stderr
    assert r.stdout.splitlines()[1] == f"local    fail    exit 1: {said}"
