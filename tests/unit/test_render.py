"""render.py: literal expected tables (gpustat style), summary lines, JSON, folding."""

import io
import json
import re

import pytest

from diagnostics.views.render import (fold, fold_names, render_hosts, render_json, render_table,
                                summary_line)
from diagnostics.core.results import ErrorInfo, Finding, Result

ATTN_OK = "sdpa  16/64 full-attention layers"


def ok(target, summary=ATTN_OK):
    return Result("check-attn", target, "ok", summary)


def table(results, **kw):
    out = io.StringIO()
    render_table(results, out, **kw)
    return out.getvalue()


def fla_warn(target):
    return Result("check-attn", target, "warn", "sdpa  48/64 linear-attention layers",
                  findings=[Finding("warn", "fla-missing",
                                    "48 of 64 layers are linear attention and "
                                    "flash-linear-attention is missing: slow torch fallback",
                                    hint="pip install flash-linear-attention")])


TRACEBACK = """\
Traceback (most recent call last):
  File "/tmp/mldiag-k2/_runtime.py", line 88, in main
    doc = module.run(args)
  File "/tmp/mldiag-k2/check_attn.py", line 41, in run
    impl = config.text_config._attn_implementation
AttributeError: 'Qwen3Config' object has no attribute 'text_config'
"""


def crashed(target, stderr=None, traceback=TRACEBACK):
    return Result("check-attn", target, "error",
                  "crashed: AttributeError: 'Qwen3Config' object has no attribute 'text_config'",
                  error=ErrorInfo("crashed", "AttributeError",
                                  "'Qwen3Config' object has no attribute 'text_config'",
                                  traceback=traceback, stderr=stderr))


# --------------------------------------------------------------------------- tables

def test_single_ok_target():
    assert table([ok("local")]) == """\
TARGETS  STATUS  SUMMARY
local    ok      sdpa  16/64 full-attention layers

1 ok
"""


def test_identical_results_fold_worst_first():
    results = [ok(f"node{i:02d}") for i in range(1, 11)]
    results.append(Result.failure("check-attn", "node12", "unreachable",
                                  "connect to 10.0.0.12:22: Connection refused"))
    results.append(fla_warn("node11"))
    assert table(results) == """\
TARGETS      STATUS  SUMMARY
node12       error   unreachable: connect to 10.0.0.12:22: Connection refused
node11       warn    sdpa  48/64 linear-attention layers
  warn  fla-missing: 48 of 64 layers are linear attention and flash-linear-attention is missing: slow torch fallback
        hint: pip install flash-linear-attention
node[01-10]  ok      sdpa  16/64 full-attention layers

10 ok · 1 warn · 1 error (unreachable)
"""


def test_fold_key_and_order():
    results = [ok("gpu10"), ok("gpu2"), ok("gpu1", "other"), fla_warn("gpu3"), fla_warn("gpu12"),
               Result("x", "gpu5", "fail", "bad"), ok("gpu9")]
    groups = fold(results)
    assert [(g.name, g.status) for g in groups] == [
        ("gpu5", "fail"), ("gpu[3,12]", "warn"), ("gpu1", "ok"), ("gpu[2,9-10]", "ok")]
    assert groups[3].targets == ["gpu2", "gpu9", "gpu10"]   # natural order, not text order


def test_fold_distinguishes_finding_hint_and_error_message():
    a, b = fla_warn("n1"), fla_warn("n2")
    b.findings[0].hint = "pip install fla"
    e1 = Result.failure("d", "n3", "timeout", "ran past 300 s")
    e2 = Result.failure("d", "n4", "timeout", "ran past 300 s", stderr="other stderr")
    e3 = Result.failure("d", "n5", "unreachable", "ran past 300 s")
    names = [g.name for g in fold([a, b, e1, e2, e3])]
    assert names == ["n[3-4]", "n5", "n1", "n2"]


def test_crashed_result_shows_full_traceback_and_stderr_tail():
    stderr = "".join(f"loading shard {i}\n" for i in range(1, 26))
    assert table([crashed("trainbox", stderr=stderr), ok("b200")]) == """\
TARGETS   STATUS  SUMMARY
trainbox  error   crashed: AttributeError: 'Qwen3Config' object has no attribute 'text_config'
  error Traceback (most recent call last):
          File "/tmp/mldiag-k2/_runtime.py", line 88, in main
            doc = module.run(args)
          File "/tmp/mldiag-k2/check_attn.py", line 41, in run
            impl = config.text_config._attn_implementation
        AttributeError: 'Qwen3Config' object has no attribute 'text_config'
        stderr (last 20 of 25 lines):
          loading shard 6
          loading shard 7
          loading shard 8
          loading shard 9
          loading shard 10
          loading shard 11
          loading shard 12
          loading shard 13
          loading shard 14
          loading shard 15
          loading shard 16
          loading shard 17
          loading shard 18
          loading shard 19
          loading shard 20
          loading shard 21
          loading shard 22
          loading shard 23
          loading shard 24
          loading shard 25
b200      ok      sdpa  16/64 full-attention layers

1 ok · 1 error (crashed)
"""


def test_short_stderr_progress_redraws_and_empty_message():
    err = Result("extract-smoke", "dgx01", "error", "crashed: KeyError",
                 error=ErrorInfo("crashed", "KeyError", "",
                                 traceback="Traceback (most recent call last):\n"
                                           "  File \"x.py\", line 1, in <module>\n"
                                           "KeyError: ''\n",
                                 stderr="ok\r\n 10%|#\r 50%|#####\r100%|##########\n"))
    assert table([err]) == """\
TARGETS  STATUS  SUMMARY
dgx01    error   crashed: KeyError
  error Traceback (most recent call last):
          File "x.py", line 1, in <module>
        KeyError: ''
        stderr:
          ok
          100%|##########

1 error (crashed)
"""


def test_folded_errors_with_different_tracebacks_say_whose_is_shown():
    other = TRACEBACK.replace("mldiag-k2", "mldiag-q7")
    out = table([crashed("n2", traceback=other), crashed("n1")])
    assert out.splitlines()[1:4] == [
        "n[1-2]   error   crashed: AttributeError: 'Qwen3Config' object has no attribute 'text_config'",
        "  error (details of n1; the others differ, --json has each)",
        "        Traceback (most recent call last):",
    ]
    assert "mldiag-k2" in out and "mldiag-q7" not in out


def test_multiline_finding_and_hint_stay_under_the_message_column():
    r = Result("scan-log", "box", "fail", "2 kinds of failure in the last 500 lines",
               findings=[Finding("fail", "nan-loss", "loss became nan\nfirst at line 120",
                                 hint="lower the lr\nor enable grad clipping"),
                         Finding("error", "", "no code here")])
    assert table([r]) == """\
TARGETS  STATUS  SUMMARY
box      fail    2 kinds of failure in the last 500 lines
  fail  nan-loss: loss became nan
        first at line 120
        hint: lower the lr
              or enable grad clipping
  error no code here

1 fail
"""


def test_remote_control_characters_cannot_reach_the_terminal():
    r = Result("x", "box", "ok", "fine\x1b[2J\nreally\tok", findings=[Finding("warn", "c", "a\x07b")])
    assert table([r]) == """\
TARGETS  STATUS  SUMMARY
box      ok      fine\\x1b[2J\\nreally\\tok
  warn  c: a\\x07b

1 ok
"""


def test_slurm_colon_names_fold_and_odd_names_stay_plain():
    results = [ok(f"cluster-a:n{i}") for i in (1, 2, 3)] + [ok("cluster-b:n1")]
    results += [ok("bad]name"), ok("x[1]"), ok("a,b")]
    assert table(results) == """\
TARGETS                                          STATUS  SUMMARY
cluster-a:n[1-3],cluster-b:n1,a,b,bad]name,x[1]  ok      sdpa  16/64 full-attention layers

7 ok
"""


def test_fold_names():
    assert fold_names(["gpu01", "gpu03", "gpu02", "gpu12", "gpu02"]) == "gpu[01-03,12]"
    assert fold_names(["cluster-a:n3", "cluster-a:n1", "cluster-a:n2"]) == "cluster-a:n[1-3]"
    # group syntax is off: "@h200" is a plain name, no group source is consulted
    assert fold_names(["@h200", "node1", "node1!"]) == "@h200,node1,node1!"
    assert fold_names(["n[1-2]", "n3"]) == "n3,n[1-2]"      # a bracket name is not a range
    assert fold_names(["x[1-99999999]"]) == "x[1-99999999]"   # not expanded (fast)
    assert fold_names([]) == ""


def test_color_only_when_asked_and_alignment_unchanged():
    results = [ok("node01"), fla_warn("node02")]
    plain, colored = table(results), table(results, color=True)
    assert "\x1b[" not in plain
    assert "\x1b[33mwarn\x1b[0m" in colored
    assert re.sub(r"\x1b\[[0-9;]*m", "", colored) == plain


def test_empty_results():
    assert table([]) == "no targets\n"


def test_unencodable_symbols_fall_back_to_ascii():
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    render_table([ok("a"), fla_warn("b")], stream)
    stream.flush()
    assert raw.getvalue().decode("ascii").endswith("\n1 ok - 1 warn\n")


# --------------------------------------------------------------------------- summary line

def test_summary_line_cases():
    def error(layer):
        return Result.failure("d", "t", layer, "m")

    assert summary_line([]) == "no targets"
    assert summary_line([ok("a")] * 62 + [fla_warn("w"), error("unreachable")]) == \
        "62 ok · 1 warn · 1 error (unreachable)"
    assert summary_line([error("timeout"), error("unreachable")]) == \
        "2 error (1 unreachable, 1 timeout)"
    assert summary_line([error("auth")] * 3) == "3 error (auth)"
    assert summary_line([Result("d", "t", "fail", "x"), fla_warn("w"), ok("o")]) == \
        "1 ok · 1 warn · 1 fail"
    # an unknown status counts as an error (never hide a problem); no layer → "unknown"
    assert summary_line([Result("d", "t", "bogus", "x"), error("crashed")]) == \
        "2 error (1 crashed, 1 unknown)"


# --------------------------------------------------------------------------- JSON

def test_json_is_parseable_and_only_json():
    results = [ok("node01"), fla_warn("node02"), crashed("trainbox", stderr="boom\n")]
    results[0].data = {"mean": float("nan"), "max": float("inf"), "layers": [2, 16]}
    out = io.StringIO()
    render_json(results, out)
    text = out.getvalue()
    assert text.endswith("]\n") and text.count("\n") == len(text.rstrip("\n").splitlines())

    def reject(constant):
        raise AssertionError(f"not strict JSON: {constant}")

    docs = json.loads(text, parse_constant=reject)
    assert docs[0]["data"] == {"mean": "NaN", "max": "Infinity", "layers": [2, 16]}
    assert docs[1:] == [r.to_dict() for r in results[1:]]
    assert docs[2]["error"]["traceback"] == TRACEBACK


def test_json_empty():
    out = io.StringIO()
    render_json([], out)
    assert out.getvalue() == "[]\n"


# --------------------------------------------------------------------------- hosts

def test_render_hosts():
    out = io.StringIO()
    render_hosts([("trainbox", "ssh root@10.1.2.6 (via bastion) → pct 200 → /root/venv/bin/python"),
                  ("local", "local → python3"),
                  ("cluster-a:n3", "ssh root@login.cluster-a → srun -w n3 → python3")], out)
    assert out.getvalue() == """\
TARGET        CHAIN
trainbox      ssh root@10.1.2.6 (via bastion) → pct 200 → /root/venv/bin/python
local         local → python3
cluster-a:n3  ssh root@login.cluster-a → srun -w n3 → python3
"""
    empty = io.StringIO()
    render_hosts([], empty)
    assert empty.getvalue() == "no targets\n"


def test_gpu_rows_table_literal():
    from diagnostics.builtin.gpu_status.view import render_gpus
    gpu = {"index": 3, "name": "NVIDIA H200", "memory_used_mib": 72704, "memory_total_mib": 143771,
           "utilization_gpu_pct": 97, "temperature_c": 28, "power_draw_w": 77.71, "power_limit_w": 700.0,
           "clocks_event_reasons": {"names": ["gpu_idle", "sw_power_cap"]}}
    idle = dict(gpu, index=0, memory_used_mib=0, utilization_gpu_pct=0, temperature_c=None,
                clocks_event_reasons={"names": ["gpu_idle"]})
    # one target: its GPUs one row each (several targets get the grid: tests/unit/test_gpu_grid.py)
    results = [Result("gpu-status", "b200", "ok", "s",
                      data={"gpus": [idle, gpu, {"index": 1, "error": "bad row"}]})]
    out = io.StringIO()
    render_gpus(results, out)
    assert out.getvalue() == (
        "\n"
        "TARGET  GPU  NAME            MEMORY        UTIL  TEMP  POWER     CLOCK EVENTS\n"
        "b200    0    NVIDIA H200     0.0/140 GiB   0%    -     78/700 W  -\n"
        "b200    3    NVIDIA H200     71.0/140 GiB  97%   28 C  78/700 W  sw_power_cap\n"
        "b200    1    error: bad row\n")


# --------------------------------------------------------------------------- hostile targets
# Issue 10 items 8 and 9: one escaping layer (render.safe_text) under every view, and views that
# take any JSON a target sends. Each view is fed strings that would drive a terminal and data
# of every shape; its output may hold no unsafe character but its own newlines, and no view
# may raise.

from hypothesis import given, settings, strategies as st  # noqa: E402

from diagnostics.views import render  # noqa: E402
from diagnostics.builtin.gpu_status import view as gpu_view  # noqa: E402

HOSTILE = [
    "\x1b]0;owned\x07\x1b[2J",           # set the title, clear the screen (a METADATA Version:)
    "1.0\x1b[31m\x9b2J\x85",             # CSI as C1, NEL
    "evil\u202egnp.exe\u2066x\u2069",    # bidi override and isolate (Trojan Source)
    "a\rb\nc\td\x00e\x7f\u2028f\udcff",  # CR, LF, tab, NUL, DEL, line separator, lone surrogate
]


def unsafe_in(text):
    return [ch for ch in text if render.UNSAFE.match(ch) and ch != "\n"]


def test_safe_text_escapes_each_unsafe_character_visibly_and_is_idempotent():
    assert render.safe_text(HOSTILE[0]) == "\\x1b]0;owned\\x07\\x1b[2J"
    assert render.safe_text(HOSTILE[2]) == "evil\\u202egnp.exe\\u2066x\\u2069"
    assert render.safe_text(HOSTILE[3]) == "a\\rb\\nc\\td\\x00e\\x7f\\u2028f\\udcff"
    assert render.safe_text(None) == "" and render.safe_text(3.5) == "3.5"
    assert render.safe_text("torch 2.13.0 · ÿ é 中") == "torch 2.13.0 · ÿ é 中"
    for s in HOSTILE:
        assert render.safe_text(render.safe_text(s)) == render.safe_text(s)


def hostile_results(s):
    gpu = {"index": s, "name": s, "memory_used_mib": s, "memory_total_mib": 1024, "error": None,
           "utilization_gpu_pct": s, "temperature_c": [s], "power_draw_w": s, "power_limit_w": {"w": s},
           "clocks_event_reasons": {"names": [s, 7, None]}}
    return [
        Result("gpu-status", "a" + s, "warn", s, findings=[Finding("warn", s, s, hint=s, gpus=[0, s])],
               data={"gpus": [gpu, {"index": 1, "error": s}], "packages": {s: s}, "v": s}),
        Result("gpu-status", "b", "ok", "fine", data={"gpus": [], "packages": {s: "1"}, "v": "2"}),
        Result("gpu-status", "c" + s, "error", s,
               error=ErrorInfo(s, s, s, traceback=s, stderr=s)),
    ]


def every_view(results):
    """What each view writes, by name: the table (with the GPU grid after it), the per-GPU rows
    of one target, drift, the full view, hosts, and the runbook report on a terminal."""
    from diagnostics.runbooks import report
    from diagnostics.runbooks.run import RunbookRun, StepRun
    from tests.unit.test_runbook_report import BOOK
    views = {}
    for name, write in {
        "table+gpus": lambda out: render_table(results, out, details=gpu_view.render_gpus),
        "gpus of one": lambda out: gpu_view.render_gpus(results[:1], out),
        "diff": lambda out: render.render_diff(results, out),
        "full": lambda out: render.render_full(results, out),
        "hosts": lambda out: render_hosts([(r.target, r.summary) for r in results], out),
        "report": lambda out: report.render_markdown(RunbookRun(
            BOOK, [r.target for r in results], {}, __import__("datetime").datetime(2025, 1, 1),
            steps=[StepRun(1, BOOK.steps[0], results=list(results)),
                   StepRun(2, BOOK.steps[1], results=list(results))]), out, version="0",
            appendix=False),
    }.items():
        out = io.StringIO()
        write(out)
        views[name] = out.getvalue()
    return views


def test_no_view_lets_a_control_character_through():
    for s in HOSTILE:
        views = every_view(hostile_results(s))
        for name, text in views.items():
            assert unsafe_in(text) == [], (name, s, text)
        assert "\\x1b]0;owned\\x07" in views["table+gpus"] or s != HOSTILE[0]


def test_the_gpu_rows_show_a_hostile_name_escaped():
    out = io.StringIO()
    gpu_view.render_gpus([Result("gpu-status", "n1", "ok", "s", data={"gpus": [
        {"index": 0, "name": "H200\x1b]0;x\x07\x1b[2J", "memory_used_mib": "lots",
         "memory_total_mib": 143771, "power_draw_w": "12", "clocks_event_reasons": ["x"]}]})], out)
    assert out.getvalue() == (
        "\n"
        "TARGET  GPU  NAME                     MEMORY           UTIL  TEMP  POWER   CLOCK EVENTS\n"
        "n1      0    H200\\x1b]0;x\\x07\\x1b[2J  lots/143771 MiB  -     -     12/- W  -\n")


def test_drift_and_full_views_escape_keys_and_values():
    results = [Result("env-report", "a", "ok", "s", data={"packages": {"torch": "2.1\x1b[2J"}}),
               Result("env-report", "b", "ok", "s", data={"packages": {"torch": "2.2"}})]
    out = io.StringIO()
    render.render_diff(results, out)
    assert out.getvalue() == "\ndrift across 2 targets:\n  torch: 2.1\\x1b[2J on a; 2.2 on b\n"
    out = io.StringIO()
    render.render_full(results[:1] + [Result("env-report", "c\u202e", "ok", "s", data=["x\x07"])], out)
    assert out.getvalue() == "\na:\n  packages.torch: 2.1\\x1b[2J\n\nc\\u202e:\n  data: ['x\\x07']\n"


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                 max_size=3),
                    max_leaves=12)
GPU_KEYS = ("index", "name", "memory_used_mib", "memory_total_mib", "utilization_gpu_pct",
            "temperature_c", "power_draw_w", "power_limit_w", "clocks_event_reasons", "error")


@settings(max_examples=300, deadline=None)
@given(data=JSON | st.dictionaries(st.sampled_from(("gpus", "packages", "v")), JSON, max_size=3),
       gpus=st.lists(JSON | st.fixed_dictionaries({}, optional={k: JSON for k in GPU_KEYS}), max_size=3))
def test_views_take_any_json_a_target_sends(data, gpus):
    """Item 9: a non-numeric gpu-status field (or data of any shape) never crashes a view."""
    results = [Result("gpu-status", "a", "ok", "s", data=data),
               Result("gpu-status", "b", "warn", "s", data={"gpus": gpus, "packages": data}),
               Result("gpu-status", "c", "ok", "s", data={"gpus": [data]})]
    for name, text in every_view(results).items():
        assert unsafe_in(text) == [], name


# --------------------------------------------------------------------------- through `mldiag`

def test_a_hostile_local_target_reaches_the_terminal_escaped(tmp_path):
    """The issue's reproductions through the real program, on local targets: a package whose
    METADATA ``Version:`` sets the title and clears the screen (env-report's drift and full
    views), and a gpu-status answer whose GPU name holds escapes and whose memory is a string
    (an interpreter wrapper rewrites the result document on its way out)."""
    import shlex
    import sys
    from tests import programs
    repo = __import__("pathlib").Path(programs.REPO)
    dist = tmp_path / "site" / "evilpkg-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: evilpkg\n"
                                   "Version: 1.0\x1b]0;owned\x07\x1b[2J\u202e\n")
    wrapper = tmp_path / "python-rewriting"
    wrapper.write_text("#!/bin/sh\n" + shlex.quote(sys.executable) + ' "$@" | sed '
                       r"""'s/"memory_used_mib": [0-9.]*/"memory_used_mib": "lots"/g; """
                       r"""s/"name": "NVIDIA H200"/"name": "H200\\u001b]0;x\\u0007\\u009b2J"/g'""" + "\n")
    wrapper.chmod(0o755)
    (tmp_path / "hosts.yaml").write_text(
        f"hosts:\n  evil: {{local: true, env: {{PYTHONPATH: {tmp_path / 'site'}}}}}\n"
        "  twin: {local: true}\n"
        f"  gpus: {{local: true, python: {wrapper}, env: {{PATH: \"{repo / 'tests' / 'fakes'}:/usr/bin:/bin\", "
        "MLDIAG_FAKE_NVIDIA_SMI: derived__h200x8__healthy}}\n")

    drift = programs.mldiag("env-report", "-H", "evil,twin", "--packages", "evilpkg", cwd=tmp_path)
    full = programs.mldiag("env-report", "-H", "evil", "--full", "--packages", "evilpkg", cwd=tmp_path)
    gpus = programs.mldiag("gpu-status", "-H", "gpus", cwd=tmp_path)
    for r in (drift, full, gpus):
        assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
        assert unsafe_in(r.stdout + r.stderr) == [], r.stdout
    assert "  evilpkg: 1.0\\x1b]0;owned\\x07\\x1b[2J\\u202e on evil; missing on twin\n" in drift.stdout
    assert "  packages.evilpkg: 1.0\\x1b]0;owned\\x07\\x1b[2J\\u202e\n" in full.stdout
    assert gpus.returncode == 0, gpus.stdout + gpus.stderr
    rows = [line for line in gpus.stdout.split("\n\n")[1].splitlines() if line.startswith("gpus ")]
    assert len(rows) == 8 and rows[0].split()[:4] == ["gpus", "0", "H200\\x1b]0;x\\x07\\x9b2J",
                                                      "lots/143771"], rows


# --------------------------------------------------------------------------- the small parts
# Found by the mutation run (setup.cfg [mutmut]); each pins one behaviour a one-token change broke
# unnoticed.

@pytest.mark.parametrize("text, lines", [
    ("", []),
    (None, []),
    ("a\n", ["a"]),
    ("a\n\nb", ["a", "", "b"]),
    ("progress 10%\rprogress 100%", ["progress 100%"]),   # a redraw keeps its last segment
    ("a b\rc d\r", ["c d"]),                              # segments split on CR only
    ("done\r\n", ["done"]),
    ("TAXX\r", ["TAXX"]),                                  # only CR is stripped at the end
    ("keep  \t", ["keep    "]),                           # trailing blanks and tabs are text
    ("a\tb", ["a       b"]),                              # tab stops every 8 columns
    ("\x1b[2J", ["\\x1b[2J"]),
])
def test_lines_as_a_terminal_shows_them(text, lines):
    assert render._lines(text) == lines


def test_clip_says_how_much_it_cut():
    assert render._clip("abcd", 4) == "abcd"
    assert render._clip("abcdef", 4) == "abcd\N{HORIZONTAL ELLIPSIS} (+2 chars)"


def test_colour_paints_the_level_of_findings_and_errors():
    out = io.StringIO()
    render_table([Result("ping", "a", "warn", "s", findings=[Finding("warn", "c", "m")]),
                  Result.failure("ping", "b", "auth", "refused",
                                 stderr="Permission denied (publickey).")], out, color=True)
    text = out.getvalue()
    assert "  \033[33mwarn\033[0m  c: m\n" in text
    assert "  \033[1;31merror\033[0m stderr:\n" in text


def test_a_finding_without_a_message_shows_its_code():
    out = io.StringIO()
    render_table([Result("ping", "a", "warn", "s", findings=[Finding("warn", "c", "")])], out)
    assert "\n  warn  c:\n" in out.getvalue()


@pytest.mark.parametrize("err, first, rest", [
    (ErrorInfo("crashed", "KeyError", "one\ntwo\nthree"), "crashed: KeyError: one", ["two", "three"]),
    (ErrorInfo("auth", "", ""), "auth: (no message)", []),
    (ErrorInfo("auth", "BadKey", ""), "auth: BadKey", []),
    (ErrorInfo("auth", "auth", "refused"), "auth: refused", []),
    (ErrorInfo("crashed", "KeyError", "KeyError: 'x'"), "crashed: KeyError: 'x'", []),
])
def test_error_text(err, first, rest):
    assert render._error_text(err) == [first] + rest


@pytest.mark.parametrize("n, header", [(20, "stderr:"), (21, "stderr (last 20 of 21 lines):")])
def test_stderr_tail_starts_cutting_past_the_limit(n, header):
    out = io.StringIO()
    stderr = "\n".join("line %d" % i for i in range(1, n + 1))
    render_table([Result.failure("ping", "a", "crashed", "boom", stderr=stderr)], out)
    text = out.getvalue()
    assert header in text
    assert ("line 1\n" in text) is (n == 20) and "line %d\n" % n in text


def test_render_json_is_indented_strict_and_survives_stray_values():
    from pathlib import PurePosixPath
    out = io.StringIO()
    render_json([Result("ping", "a", "ok", "s", data={"p": PurePosixPath("/x"), "n": float("nan")})], out)
    text = out.getvalue()
    assert text.startswith('[\n  {\n    "schema": 2,\n    "diagnostic": "ping",')
    assert '"p": "/x"' in text and '"n": "NaN"' in text and text.endswith("}\n]\n")


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _env(target, status="ok", **data):
    return Result("env-report", target, status, "s", data=data) if status != "error" else \
        Result.failure("env-report", target, "unreachable", "down")


def test_drift_and_full_views_leave_out_targets_that_did_not_answer():
    out = io.StringIO()
    render.render_diff([_env("a", torch="2.1"), _env("b", torch="2.1"), _env("c", torch="2.2"),
                        _env("x", "error")], out)
    assert out.getvalue() == "\ndrift across 3 targets:\n  torch: 2.1 on a,b; 2.2 on c\n"
    same = io.StringIO()
    render.render_diff([_env("a", torch="2.1", cuda="12"), _env("b", torch="2.1", cuda="12")], same)
    assert same.getvalue() == "\ndrift across 2 targets:\n  (none: every field agrees)\n"
    # fewer than two answered: the full view of what did answer
    alone = io.StringIO()
    render.render_diff([_env("x", "error"), _env("a", torch="2.1"), _env("y", "error")], alone)
    assert alone.getvalue() == "\na:\n  torch: 2.1\n"
    full = io.StringIO()
    render.render_full([_env("x", "error"), _env("a", torch="2.1"), _env("b", cuda="12")], full)
    assert full.getvalue() == "\na:\n  torch: 2.1\n\nb:\n  cuda: 12\n"


def test_drift_lines_are_one_per_field():
    out = io.StringIO()
    render.render_diff([_env("a", torch="2.1", cuda="12"), _env("b", torch="2.2", cuda="13"),
                        _env("c", torch="2.1", cuda="12")], out)
    assert out.getvalue() == ("\ndrift across 3 targets:\n  torch: 2.1 on a,c; 2.2 on b\n"
                              "  cuda: 12 on a,c; 13 on b\n")


@pytest.mark.parametrize("n, table", [(64, True), (65, False)])
def test_the_per_gpu_view_stops_past_its_limit(n, table):
    out = io.StringIO()
    gpu_view.render_gpus([Result("gpu-status", "n1", "ok", "s",
                               data={"gpus": [{"index": i, "name": "H200"} for i in range(n)]})], out)
    if table:
        assert out.getvalue().count("\n") == n + 2 and "TARGET" in out.getvalue()
    else:
        assert out.getvalue() == "\n(65 GPUs: per-GPU rows are in --json)\n"


def test_gpu_rows_show_each_field_or_a_dash():
    big = 10 ** 400   # an int no float format takes: shown as it came
    rows = gpu_view.gpu_rows([Result("gpu-status", "n", "ok", "s", data={"gpus": [
        {"index": 0, "utilization_gpu_pct": float("inf"), "temperature_c": big,
         "memory_used_mib": float("inf"), "memory_total_mib": 1024000, "power_draw_w": 300,
         "power_limit_w": 700, "clocks_event_reasons": {"names": "hw_slowdown"}},
        7,                                           # not an object: skipped, the rest still shown
        {"index": 1.5},
        {"index": 2, "error": "gone"},
        {"index": 3, "memory_total_mib": 81920, "clocks_event_reasons": {"names": None}},
        {"index": 4, "temperature_c": float("inf"), "power_draw_w": float("inf"), "power_limit_w": 700},
    ]})])
    assert rows == [
        ("n", "0", "-", "inf/1000 GiB", "inf%", str(big), "300/700 W", "hw_slowdown"),
        ("n", "1.5", "-", "-", "-", "-", "-", "-"),
        ("n", "2", "error: gone", "", "", "", "", ""),
        ("n", "3", "-", "-/80 GiB", "-", "-", "-", "-"),
        ("n", "4", "-", "-", "-", "inf C", "inf/700 W", "-"),
    ]
    assert render.data_of(Result("gpu-status", "n", "ok", "s", data=None)) == {}
    assert render.data_of(Result("gpu-status", "n", "ok", "s", data=[1])) == {"data": [1]}


def test_strict_json_names_each_non_finite_float():
    assert render.strict_json([float("inf"), float("-inf"), float("nan"), 1.5]) == \
        ["Infinity", "-Infinity", "NaN", 1.5]


def test_fold_names_keeps_natural_order_for_names_it_cannot_fold():
    assert render.fold_names(["b,10", "b,9", "n2", "n10"]) == "n[2,10],b,9,b,10"


def test_summary_line_counts_each_error_layer():
    assert render.summary_line([Result.failure("p", "a", "unreachable", "x"),
                                Result.failure("p", "b", "unreachable", "y"),
                                Result.failure("p", "c", "timeout", "z")]) == \
        "3 error (2 unreachable, 1 timeout)"


def test_errors_that_differ_do_not_fold_together():
    a = Result("p", "a", "error", "s", error=ErrorInfo("crashed", "E", "one"))
    b = Result("p", "b", "error", "s", error=ErrorInfo("crashed", "E", "two"))
    assert [g.targets for g in fold([a, b])] == [["a"], ["b"]]


def test_the_status_column_is_painted_and_rows_have_no_trailing_blanks():
    out = io.StringIO()
    render_table([Result("ping", "a", "warn", "")], out, color=True)
    assert out.getvalue().splitlines()[1] == "a        \033[33mwarn\033[0m"


def test_emit_writes_to_a_stream_without_an_encoding():
    class Sink:
        def __init__(self):
            self.parts = []

        def write(self, text):
            self.parts.append(text)
    sink = Sink()
    render.emit(sink, "a \N{MIDDLE DOT} b")
    assert sink.parts == ["a \N{MIDDLE DOT} b"]


def _mldiag_on_a_pty(tmp_path, env_extra):
    """`mldiag ping` on a local target with its stdout on a real pseudo-terminal: what it wrote."""
    import os
    import os
    import pty
    import subprocess
    from tests.programs import MLDIAG, program_env
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  here: {local: true}\n")
    leader, follower = pty.openpty()
    env = program_env(dict(env_extra), ("NO_COLOR",))
    proc = subprocess.Popen(MLDIAG + ["ping", "--hosts-file", str(hosts), "-H", "here"],
                            stdout=follower, stderr=subprocess.PIPE, env=env, cwd=str(tmp_path))
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:        # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0, proc.stderr.read()
    return seen.decode()


@pytest.mark.parametrize("env,painted", [({"TERM": "xterm"}, True),
                                         ({"TERM": "xterm", "NO_COLOR": "1"}, False),
                                         ({"TERM": "dumb"}, False)])
def test_statuses_are_coloured_on_a_terminal_only(tmp_path, env, painted):
    """The table's status column is painted on a real terminal (a pty), never with NO_COLOR or
    TERM=dumb; on a pipe it is plain (every other test here reads a pipe or a StringIO)."""
    screen = _mldiag_on_a_pty(tmp_path, env)
    assert "here" in screen and "ok" in screen
    assert ("\033[32mok\033[0m" in screen) is painted, repr(screen)
    assert ("\033[" in screen) is painted


def test_wants_color_reads_the_stream_and_the_environment():
    class Tty(io.StringIO):
        def isatty(self):
            return True
    assert render.wants_color(Tty(), {"TERM": "xterm"})
    assert not render.wants_color(io.StringIO(), {"TERM": "xterm"})
    assert not render.wants_color(Tty(), {"NO_COLOR": "x"})
    assert render.wants_color(Tty(), {"NO_COLOR": ""})      # no-color.org: set and non-empty
    assert not render.wants_color(Tty(), {"TERM": "dumb"})


def test_is_terminal_is_false_for_what_is_no_terminal_and_never_raises(tmp_path):
    """The one terminal test (render.is_terminal): the table's colour, the live progress, the
    defaults.targets note and the runbook report's appendix all ask it."""
    import os
    import pty
    closed = io.StringIO()
    closed.close()
    with open(tmp_path / "f", "w") as a_file:
        assert [render.is_terminal(s) for s in (io.StringIO(), closed, object(), a_file)] == \
            [False, False, False, False]
    leader, follower = pty.openpty()
    try:
        with open(follower, "w", closefd=False) as tty:
            assert render.is_terminal(tty) is True
    finally:
        os.close(leader)
        os.close(follower)
