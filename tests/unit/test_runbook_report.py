"""The runbook report against literal expected output: a fixed run (three targets, one of them
unreachable at the first step, a crashed diagnostic, a step skipped for want of a parameter),
a fixed time and a fixed mldiag version."""

import io
import json
import textwrap
from datetime import datetime, timezone

from diagnostics.runbooks import report, model as runbook
from diagnostics.core.results import ErrorInfo, Finding, Result
from diagnostics.runbooks.run import RunbookRun, Skip, StepRun

BOOK = runbook.loads(textwrap.dedent("""\
    description: Training is slow on the test targets
    params:
      log: {description: the training log}
    steps:
      - task: gpu-status
        title: busy or throttled GPUs?
      - task: env-report
      - task: check-attn
        stop_if: error
      - id: log
        task: scan-log
        args: {path: "{{ params.log }}"}
    """), "/books/slow.yaml", "/books")


def gpu(used, util, reasons=()):
    return {"index": 0, "name": "NVIDIA H200", "memory_used_mib": used, "memory_total_mib": 143771,
            "utilization_gpu_pct": util, "clocks_event_reasons": {"names": list(reasons)}}


def fixed_run():
    s1, s2, s3, s4 = (StepRun(i + 1, step) for i, step in enumerate(BOOK.steps))
    s1.results = [
        Result("gpu-status", "trainbox", "ok", "1× NVIDIA H200: healthy; GPU 0 busy (71 GiB, pid 4242)",
               findings=[Finding("info", "gpu-busy", "GPU 0 busy: 71 GiB held by pid 4242 (python train.py)")],
               data={"gpus": [gpu(72704, 98)]}, duration_s=0.5),
        Result("gpu-status", "sickbox", "fail", "1× NVIDIA H200: GPU 0: HW thermal slowdown",
               findings=[Finding("fail", "clocks-hw-thermal", "GPU 0: HW thermal slowdown active at 93 C",
                                 "check the cooling: fans, airflow, inlet temperature")],
               data={"gpus": [gpu(0, 0, ["hw_slowdown", "hw_thermal_slowdown"])]}, duration_s=0.5),
        Result.failure("gpu-status", "deadbox", "unreachable", "connect to 10.0.0.9:22: connection refused",
                       duration_s=0.1),
    ]
    s1.skipped = []
    s2.results = [
        Result("env-report", "trainbox", "ok", "python 3.11.2 · torch 2.13.0",
               data={"packages": {"torch": "2.13.0"}, "os": {"hostname": "a"}}),
        Result("env-report", "sickbox", "warn", "python 3.11.2 · torch 2.12.1",
               findings=[Finding("warn", "pip-check", "transformers 5.2.0 requires huggingface-hub>=1.0")],
               data={"packages": {"torch": "2.12.1"}, "os": {"hostname": "b"}}),
    ]
    s2.skipped = [Skip("deadbox", "unreachable", "left the run at step 1 (gpu-status): unreachable")]
    s3.results = [
        Result("check-attn", "trainbox", "warn", "Qwen3NextForCausalLM: sdpa on 1 attention module",
               findings=[Finding("warn", "fla-missing", "3 of 4 layers are linear attention and "
                                 "flash-linear-attention is missing: slow torch fallback",
                                 "pip install flash-linear-attention causal-conv1d")]),
        Result("check-attn", "sickbox", "error", "crashed: KeyError",
               error=ErrorInfo("crashed", "KeyError", "KeyError: 'model.layers.*' in <module>",
                               traceback="Traceback (most recent call last):\n  ...\nKeyError: 'x'")),
    ]
    s3.skipped = [Skip("deadbox", "unreachable", "left the run at step 1 (gpu-status): unreachable")]
    s4.skipped = [Skip(t, "param", "parameter log not given (--param log=VALUE)")
                  for t in ("trainbox", "sickbox", "deadbox")]
    return RunbookRun(runbook=BOOK, targets=["trainbox", "sickbox", "deadbox"], params={},
                      started=datetime(2025, 6, 1, 12, 0, 0, tzinfo=timezone.utc), duration_s=12.34,
                      steps=[s1, s2, s3, s4])


EXPECTED = r"""# Runbook `slow`

Training is slow on the test targets

- **Targets:** deadbox,sickbox,trainbox (3)
- **Parameters:** none given
- **Started:** 2025-06-01 12:00:00 UTC, took 12.3 s
- **mldiag:** 0.1.0 (runbook: /books/slow.yaml)
- **Result:** error (exit 3): 2 ok · 2 warn · 1 fail · 2 error (1 unreachable, 1 crashed)

## Summary

| Step | trainbox | sickbox | deadbox |
|---|---|---|---|
| 1. gpu-status: busy or throttled GPUs? | ok | fail | error |
| 2. env-report | ok | warn | skipped (unreachable) |
| 3. check-attn | warn | error | skipped (unreachable) |
| 4. log | skipped (param) | skipped (param) | skipped (param) |

## Findings

- **error** · 1. gpu-status · deadbox · `unreachable`: connect to 10.0.0.9:22: connection refused
- **error** · 3. check-attn · sickbox · `crashed`: KeyError: 'model.layers.\*' in \<module>
- **fail** · 1. gpu-status · sickbox · `clocks-hw-thermal`: GPU 0: HW thermal slowdown active at 93 C
  - hint: check the cooling: fans, airflow, inlet temperature
- **warn** · 2. env-report · sickbox · `pip-check`: transformers 5.2.0 requires huggingface-hub>=1.0
- **warn** · 3. check-attn · trainbox · `fla-missing`: 3 of 4 layers are linear attention and flash-linear-attention is missing: slow torch fallback
  - hint: pip install flash-linear-attention causal-conv1d
- **info** · 1. gpu-status · trainbox · `gpu-busy`: GPU 0 busy: 71 GiB held by pid 4242 (python train.py)

## Skipped

- 2. env-report on deadbox: left the run at step 1 (gpu-status): unreachable
- 3. check-attn on deadbox: left the run at step 1 (gpu-status): unreachable
- 4. log on deadbox,sickbox,trainbox: parameter log not given (--param log=VALUE)

## Steps

### 1. gpu-status: busy or throttled GPUs?

- deadbox: **error** · unreachable: connect to 10.0.0.9:22: connection refused
- sickbox: **fail** · 1× NVIDIA H200: GPU 0: HW thermal slowdown
- trainbox: **ok** · 1× NVIDIA H200: healthy; GPU 0 busy (71 GiB, pid 4242)

GPUs in use, throttled or in error (2 of 2):

| Target | GPU | Name | Memory | Util | Temp | Power | Clock events |
|---|---|---|---|---|---|---|---|
| trainbox | 0 | NVIDIA H200 | 71.0/140 GiB | 98% | - | - | - |
| sickbox | 0 | NVIDIA H200 | 0.0/140 GiB | 0% | - | - | hw_slowdown,hw_thermal_slowdown |

### 2. env-report

- sickbox: **warn** · python 3.11.2 · torch 2.12.1
- trainbox: **ok** · python 3.11.2 · torch 2.13.0

Drift across 2 targets:
- torch: 2.13.0 on trainbox; 2.12.1 on sickbox

### 3. check-attn

- sickbox: **error** · crashed: KeyError
- trainbox: **warn** · Qwen3NextForCausalLM: sdpa on 1 attention module

### 4. log (scan-log)

Did not run (see Skipped).

## Raw results

<details>
<summary>7 result documents (JSON)</summary>

#### 1. gpu-status · trainbox

```json
{
  "schema": 2,
  "diagnostic": "gpu-status",
  "target": "trainbox",
  "status": "ok",
  "summary": "1× NVIDIA H200: healthy; GPU 0 busy (71 GiB, pid 4242)",
  "findings": [
    {
      "level": "info",
      "code": "gpu-busy",
      "message": "GPU 0 busy: 71 GiB held by pid 4242 (python train.py)"
    }
  ],
  "data": {
    "gpus": [
      {
        "index": 0,
        "name": "NVIDIA H200",
        "memory_used_mib": 72704,
        "memory_total_mib": 143771,
        "utilization_gpu_pct": 98,
        "clocks_event_reasons": {
          "names": []
        }
      }
    ]
  },
  "log": [],
  "error": null,
  "duration_s": 0.5
}
```

#### 1. gpu-status · sickbox

```json
{
  "schema": 2,
  "diagnostic": "gpu-status",
  "target": "sickbox",
  "status": "fail",
  "summary": "1× NVIDIA H200: GPU 0: HW thermal slowdown",
  "findings": [
    {
      "level": "fail",
      "code": "clocks-hw-thermal",
      "message": "GPU 0: HW thermal slowdown active at 93 C",
      "hint": "check the cooling: fans, airflow, inlet temperature"
    }
  ],
  "data": {
    "gpus": [
      {
        "index": 0,
        "name": "NVIDIA H200",
        "memory_used_mib": 0,
        "memory_total_mib": 143771,
        "utilization_gpu_pct": 0,
        "clocks_event_reasons": {
          "names": [
            "hw_slowdown",
            "hw_thermal_slowdown"
          ]
        }
      }
    ]
  },
  "log": [],
  "error": null,
  "duration_s": 0.5
}
```

#### 1. gpu-status · deadbox

```json
{
  "schema": 2,
  "diagnostic": "gpu-status",
  "target": "deadbox",
  "status": "error",
  "summary": "unreachable: connect to 10.0.0.9:22: connection refused",
  "findings": [],
  "data": {},
  "log": [],
  "error": {
    "layer": "unreachable",
    "type": "unreachable",
    "message": "connect to 10.0.0.9:22: connection refused",
    "traceback": null,
    "stderr": null
  },
  "duration_s": 0.1
}
```

#### 2. env-report · trainbox

```json
{
  "schema": 2,
  "diagnostic": "env-report",
  "target": "trainbox",
  "status": "ok",
  "summary": "python 3.11.2 · torch 2.13.0",
  "findings": [],
  "data": {
    "packages": {
      "torch": "2.13.0"
    },
    "os": {
      "hostname": "a"
    }
  },
  "log": [],
  "error": null,
  "duration_s": 0.0
}
```

#### 2. env-report · sickbox

```json
{
  "schema": 2,
  "diagnostic": "env-report",
  "target": "sickbox",
  "status": "warn",
  "summary": "python 3.11.2 · torch 2.12.1",
  "findings": [
    {
      "level": "warn",
      "code": "pip-check",
      "message": "transformers 5.2.0 requires huggingface-hub>=1.0"
    }
  ],
  "data": {
    "packages": {
      "torch": "2.12.1"
    },
    "os": {
      "hostname": "b"
    }
  },
  "log": [],
  "error": null,
  "duration_s": 0.0
}
```

#### 3. check-attn · trainbox

```json
{
  "schema": 2,
  "diagnostic": "check-attn",
  "target": "trainbox",
  "status": "warn",
  "summary": "Qwen3NextForCausalLM: sdpa on 1 attention module",
  "findings": [
    {
      "level": "warn",
      "code": "fla-missing",
      "message": "3 of 4 layers are linear attention and flash-linear-attention is missing: slow torch fallback",
      "hint": "pip install flash-linear-attention causal-conv1d"
    }
  ],
  "data": {},
  "log": [],
  "error": null,
  "duration_s": 0.0
}
```

#### 3. check-attn · sickbox

```json
{
  "schema": 2,
  "diagnostic": "check-attn",
  "target": "sickbox",
  "status": "error",
  "summary": "crashed: KeyError",
  "findings": [],
  "data": {},
  "log": [],
  "error": {
    "layer": "crashed",
    "type": "KeyError",
    "message": "KeyError: 'model.layers.*' in <module>",
    "traceback": "Traceback (most recent call last):\n  ...\nKeyError: 'x'",
    "stderr": null
  },
  "duration_s": 0.0
}
```

</details>
"""


def test_markdown_report_is_exactly_the_expected_one():
    out = io.StringIO()
    report.render_markdown(fixed_run(), out, version="0.1.0")
    assert out.getvalue() == EXPECTED


def test_without_the_appendix_the_report_is_the_same_up_to_it_and_says_where_it_is():
    out = io.StringIO()
    report.render_markdown(fixed_run(), out, version="0.1.0", appendix=False)
    head = EXPECTED[:EXPECTED.index("## Raw results")]
    assert out.getvalue() == head + (
        "## Raw results\n\nLeft out on a terminal: `--save DIR` writes them into DIR/report.md, "
        "`--format json` prints them, and a pipe or a redirect gets the whole report.\n")


def test_markdown_on_an_ascii_stream_falls_back_to_ascii_symbols():
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="ascii")
    report.render_markdown(fixed_run(), stream, version="0.1.0")
    stream.flush()
    text = raw.getvalue().decode("ascii")
    assert "- **warn** - 2. env-report - sickbox - `pip-check`: transformers" in text
    assert "1\\xd7 NVIDIA H200" in text       # remote text that ASCII cannot hold: escaped, not lost


def test_json_report_holds_every_step_result_and_skip():
    out = io.StringIO()
    report.render_json(fixed_run(), out, version="0.1.0")
    doc = json.loads(out.getvalue())
    assert {k: doc[k] for k in ("schema", "runbook", "source", "path", "mldiag_version", "started",
                                "duration_s", "targets", "params", "status", "exit_code",
                                "interrupted")} == {
        "schema": 1, "runbook": "slow", "source": "/books", "path": "/books/slow.yaml",
        "mldiag_version": "0.1.0", "started": "2025-06-01T12:00:00+00:00", "duration_s": 12.34,
        "targets": ["trainbox", "sickbox", "deadbox"], "params": {}, "status": "error",
        "exit_code": 3, "interrupted": False}
    assert [(s["number"], s["id"], s["task"]) for s in doc["steps"]] == [
        (1, "gpu-status", "gpu-status"), (2, "env-report", "env-report"), (3, "check-attn", "check-attn"),
        (4, "log", "scan-log")]
    assert doc["steps"][3]["args"] == {"path": "{{ params.log }}"}
    assert [r["target"] for r in doc["steps"][0]["results"]] == ["trainbox", "sickbox", "deadbox"]
    assert doc["steps"][0]["results"][2]["error"]["layer"] == "unreachable"
    assert doc["steps"][1]["skipped"] == [{"target": "deadbox", "kind": "unreachable",
                                           "reason": "left the run at step 1 (gpu-status): unreachable"}]


def test_markdown_escaping():
    assert report._md("a*b <x> [l](u) __init__ hw_thermal_slowdown ~~s~~ $x$ &amp; #1 a|b") == \
        "a\\*b \\<x> \\[l\\](u) \\_\\_init\\_\\_ hw_thermal_slowdown \\~\\~s\\~\\~ \\$x\\$ " \
        "\\&amp; \\#1 a\\|b"
    # the diagnostics' own code spans stay code (their insides untouched); a lone backtick is text
    assert report._md("run `nvidia-smi -q` or `a*b` and ``x`y`` `") == \
        "run `nvidia-smi -q` or `a*b` and ``x`y`` \\`"
    # a word a linkifier would link is code; the rest of the string is escaped text
    assert report._md("see https://x.io/a, mail root@h.io or www.x.io `k`") == \
        "see `https://x.io/a,` mail `root@h.io` or `www.x.io` \\`k\\`"
    assert report._md("line\n# heading\x1b[2J") == "line\\\\n\\# heading\\\\x1b\\[2J"
    assert report._cell("a|b `c|d`") == "a\\|b `c\\|d`"
    assert report._code("x`y") == "``x`y``" and report._code("`x") == "`` `x ``"
    assert report._fence("a\n```\nb") == ["````", "a\n```\nb", "````"]
    assert [report._line_start(report._md(t)) for t in ("# h", "  - x", "1. x", "12) x", "=", "`c`")] \
        == ["\\# h", "\\- x", "1\\. x", "12\\) x", "\\=", "`c`"]


def test_list_view():
    out = io.StringIO()
    report.render_list([BOOK], out)
    assert out.getvalue() == (
        "NAME  SOURCE  DESCRIPTION\n"
        "slow  /books  Training is slow on the test targets\n"
        "              --param log=...  the training log\n")


def test_parameters_with_secret_names_are_masked_in_both_reports():
    run = fixed_run()
    run.params = {"log": "/var/log/train.log", "hf_token": "hf_abcdefghijklmnopqrstuvwxyz0123456789",
                  "url": "https://bob:pa55w0rd@hub.example.org/m"}
    md, js = io.StringIO(), io.StringIO()
    report.render_markdown(run, md, version="0.1.0")
    report.render_json(run, js, version="0.1.0")
    assert ("- **Parameters:** `log`=`/var/log/train.log`, `hf_token`=`<redacted>`, "
            "`url`=`https://bob:<redacted>@hub.example.org/m`") in md.getvalue()
    assert json.loads(js.getvalue())["params"] == {
        "log": "/var/log/train.log", "hf_token": "<redacted>",
        "url": "https://bob:<redacted>@hub.example.org/m"}
    assert "abcdefghij" not in md.getvalue() + js.getvalue() and "pa55w0rd" not in md.getvalue() + js.getvalue()


# --------------------------------------------------------------------------- hostile targets
# Issue 10 item 5: every string a target sends reaches report.md inline and inert. Two real
# parsers read the report: markdown-it-py (CommonMark, with GFM tables, strikethrough and a
# linkifier) and cmark-gfm (GitHub's own renderer, with its autolink and tagfilter extensions).
# A report whose remote strings are all hostile must hold exactly the structure (blocks, links,
# images, headings, HTML, emphasis) of the same report with a harmless "x" in their place: the
# remote text may add text, code spans and soft line breaks, nothing else.

import html.parser  # noqa: E402

import pytest  # noqa: E402
from collections import Counter  # noqa: E402

import cmarkgfm  # noqa: E402
from cmarkgfm.cmark import Options  # noqa: E402
from hypothesis import example, given, settings, strategies as st  # noqa: E402
from markdown_it import MarkdownIt  # noqa: E402

from diagnostics.views import render  # noqa: E402

MARKDOWN_IT = MarkdownIt("commonmark", {"linkify": True}).enable(["table", "strikethrough", "linkify"])
MARKDOWN_IT.linkify.set({"fuzzy_link": False})   # as GFM: scheme://, www. and e-mail, not bare x.com
REMOTE_ONLY_TOKENS = {"text", "code_inline", "softbreak", "text_special"}

HOSTILE_MARKDOWN = [
    "ok\n[x]: https://evil.example/a.png\n![img][x] [click][x]",     # the issue's own case
    "fine\n# Heading\n## more\nsetext\n===",
    "<img src=x onerror=alert(1)> <script>alert(1)</script> <!-- c --> <details>",
    "a\n\n<div>\n\nblock html</div>",
    "https://evil.example www.evil.example root@evil.example <https://evil.example> //evil.example",
    "xmpp:a@evil.example mailto:a@b.example HTTPS://EVIL.EXAMPLE ftp://e.example",
    "[a](https://evil.example) ![b](https://evil.example/i.png) [c]: /u \"t\"",
    "| a | b |\n|---|---|\n| c | d |",
    "x\n- item\n+ item\n* item\n1. one\n2) two\n> quote\n    code\n```\nfence\n```\n~~~\nt\n~~~",
    "***bold*** __u__ ~~del~~ $math$ $$m$$ \\* \\\\ &amp; &#x3C;a&#62; &copy;",
    "` `` ``` a `b` ``c`` `https://evil.example` [x]`y`",
    "line  \nhard break\\\nafter  ",
    "\x1b]0;t\x07\x1b[2J \u202eevil\u202c \x85 \udcff \x00 \r\n---\n***\n___",
    "[^1]\n\n[^1]: note",
    "- [ ] task\n- [x] done",
]

FRAGMENTS = ["#", "*", "_", "[", "]", "(", ")", "!", "<", ">", "`", "~", "|", "$", "&", ":", "/",
             ".", "@", "-", "+", "=", "\\", " ", "  ", "\n", "\n\n", "\t", "1", "a", "Z", "é",
             "https://", "http://", "www.", "e.com", "a@b.co", "[x]: ", "![", "](", "<a>", "&amp;",
             "&#91;", "\n# ", "\n- ", "\n1. ", "\n> ", "\n```", "\n---\n", "|-|", "\x1b[2J", "\u202e"]
HOSTILE_STRINGS = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=24).map("".join)


def report_with(s):
    """fixed_run() with every string that came from a target replaced by ``s``."""
    run = fixed_run()
    for sr in run.steps:
        for r in sr.results:
            r.summary = s
            r.findings = [Finding(f.level, s, s, s) for f in r.findings] or [Finding("info", s, s)]
            if r.error is not None:
                r.error = ErrorInfo(r.error.layer, s, s, traceback=s, stderr=s)
            if r.diagnostic == "gpu-status" and r.data.get("gpus"):
                r.data = {"gpus": [dict(gpu(1, 50, [s]), name=s)]}
            if r.diagnostic == "env-report":
                r.data = {"packages": {"torch": s + r.target}}
    out = io.StringIO()
    report.render_markdown(run, out, version="0.1.0")
    return out.getvalue()


def markdown_it_structure(text):
    counts = Counter()

    def walk(tokens):
        for t in tokens:
            if t.type not in REMOTE_ONLY_TOKENS:
                counts[(t.type, t.tag, t.markup if t.type != "fence" else "")] += 1
            walk(t.children or [])
    walk(MARKDOWN_IT.parse(text))
    return counts


class _Tags(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = Counter()

    def handle_starttag(self, tag, attrs):
        if tag != "code":
            self.tags[tag] += 1

    def handle_comment(self, data):
        self.tags["<!--"] += 1


def gfm_tags(text):
    parser = _Tags()
    parser.feed(cmarkgfm.github_flavored_markdown_to_html(text, options=Options.CMARK_OPT_UNSAFE))
    return parser.tags


BASELINE = report_with("x")


def assert_inert(hostile):
    text = report_with(hostile)
    assert markdown_it_structure(text) == markdown_it_structure(BASELINE), hostile
    assert gfm_tags(text) == gfm_tags(BASELINE), hostile


@pytest.mark.parametrize("hostile", HOSTILE_MARKDOWN)
def test_hostile_markdown_from_a_target_adds_nothing_but_text_to_the_report(hostile):
    assert_inert(hostile)


# (a string with no visible character leaves out what it would fill: an empty hint has no line)
@settings(max_examples=150, deadline=None)
@given(HOSTILE_STRINGS.filter(str.strip))
def test_generated_hostile_strings_add_nothing_but_text_to_the_report(s):
    assert_inert(s)


def rendered_text(markdown):
    """The text a reader sees in a paragraph (markdown-it), code spans' insides included."""
    (inline,) = [t for t in MARKDOWN_IT.parse(markdown) if t.type == "inline"]
    return "".join(c.content for c in inline.children if c.type in ("text", "code_inline",
                                                                     "text_special"))


@settings(max_examples=400, deadline=None)
@given(HOSTILE_STRINGS)
@example("a ``x`y`` b `nvidia-smi -q` c")
@example(
    s='https://\\|',
).via('discovered failure')
def test_a_remote_string_reads_in_the_report_as_it_does_in_a_terminal(s):
    """Escaped, not mangled: what renders is the terminal's escaped text (backticks aside: a code
    span's own are not shown), as a paragraph, in a table cell and on a continuation line."""
    def bare(text):   # what a reader compares: no backticks, no whitespace
        return "".join(text.replace("`", "").split())
    want = bare(render.safe_text(s))
    for markdown in ("A " + report._md(s) + " Z", "A\n" + report._line_start(report._md(s)) + " Z"):
        assert bare(rendered_text(markdown)) == "A" + want + "Z", markdown
    table = "| h |\n|---|\n| " + report._cell(s) + " |\n"
    cells = [t for t in MARKDOWN_IT.parse(table) if t.type == "inline"]
    assert len(cells) == 2, table
    # a table unescapes \\| before inline parsing, in code spans too (markdown-it and cmark-gfm
    # agree): the cell's text reads back as the terminal shows it, backslashes included
    assert bare("".join(c.content for c in cells[1].children)) == want
