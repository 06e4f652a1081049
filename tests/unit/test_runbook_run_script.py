"""``run-script`` as a runbook step (issue 30 §3): ``{task: run-script, args: {script: PATH,
args: [...], put: [...]}}`` or ``code:``. The loader's errors with their file:line:key; the
script and its put files beside the runbook (a path from a parameter: the user's, from the
current directory); read, and a missing one refused (exit 4), before anything runs; the job the
task's own (``execute.script_file_job`` / ``execute.script_code_job``) with every target's references
resolved; its $MLDIAG_RESULT findings deciding the step's status and a later ``when:``; the
report's title and output for the step. The last tests run the real ``mldiag runbook`` on the
local target."""

import io
import json
import os
import textwrap

import pytest

from diagnostics.engine import execute
from diagnostics.runbooks import report, model as runbook, run as runbook_run
from diagnostics.core.errors import InputError
from diagnostics.core.results import Finding, Result
from diagnostics.runbooks.run import RunbookRun, StepRun
from diagnostics.inventory.topology import Target
from tests.programs import marking_python, mldiag, space_free_python
from tests.unit.test_runbook import FakeFleet, cells

T = {name: Target(name=name, local=True, gpus=8, models=(("main", f"/m/{name}"),))
     for name in ("a", "b")}

REPORTS = textwrap.dedent("""\
    import json, os, sys
    print("checking", *sys.argv[1:])
    with open(os.environ["MLDIAG_RESULT"], "w") as f:
        json.dump({"summary": "link slow on " + sys.argv[1],
                   "findings": [{"level": "warn", "code": "slow-link", "message": sys.argv[1],
                                 "hint": "reseat the cable"}],
                   "data": {"args": sys.argv[1:]}}, f)
    """)


def book(tmp_path, text, name="rb.yaml", scripts=()):
    """A runbook file in tmp_path/books (with ``scripts``: {relative path: text} beside it)."""
    directory = tmp_path / "books"
    for rel, content in dict(scripts).items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_text(content)
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text(textwrap.dedent(text))
    return path


def load_error(text):
    with pytest.raises(InputError) as exc:
        runbook.loads(text, "rb.yaml")
    assert exc.value.exit_code == 4
    return str(exc.value)


# ---------------------------------------------------------------------------- the loader

def test_a_run_script_step_is_loaded_with_its_files_beside_the_runbook(tmp_path):
    path = book(tmp_path, """\
        description: a script step
        params:
          iface: {description: the interface}
          extra: {description: another script}
        steps:
          - id: link
            task: run-script
            args:
              script: checks/link.py
              args: [--iface, "{{ params.iface }}", "--host={{ target.name }}", ""]
              put: [data/limits.json, "~/x.json"]
          - task: run-script
            id: inline
            title: quick look
            args: {code: "print(1)"}
          - task: run-script
            id: theirs
            args: {script: "{{ params.extra }}", put: ["sub/{{ params.extra }}"]}
        """)
    first, inline, theirs = runbook.load(str(path)).steps
    books = str(tmp_path / "books")
    assert (first.id, first.task, first.title, first.line) == ("link", "run-script", "", 6)
    assert first.args == (
        ("script", f"{books}/checks/link.py"),
        ("args", ("--iface", "{{ params.iface }}", "--host={{ target.name }}", "")),
        ("put", (f"{books}/data/limits.json", os.path.expanduser("~/x.json"))))
    assert first.params == ["iface"]
    assert first.heading({}) == "link.py" and inline.heading({}) == "quick look"
    assert inline.args == (("code", "print(1)"),) and inline.params == []
    # a path that starts with a reference is the user's (the current directory's): as written
    assert theirs.args == (("script", "{{ params.extra }}"),
                           ("put", (f"{books}/sub/{{{{ params.extra }}}}",)))
    assert theirs.params == ["extra"]
    assert theirs.heading({"extra": "/x/probe.py"}) == "probe.py"
    assert theirs.heading({}) == "{{ params.extra }}"
    assert runbook.loads("description: x\nsteps:\n  - {task: run-script, args: {code: x}}\n",
                         "rb.yaml").steps[0].heading({}) == "inline code"


def test_code_is_taken_as_written_not_as_references():
    step = runbook.loads(textwrap.dedent("""\
        description: x
        steps:
          - task: run-script
            args:
              code: |
                print(f"{{ 'a': 1 }}")
              args: ["{{ target.name }}"]
        """), "rb.yaml").steps[0]
    assert step.params == []
    assert step.resolve({}, T["a"]) == {"code": "print(f\"{{ 'a': 1 }}\")\n", "args": ("a",)}


STEP = "description: x\nparams: {p: {description: p}}\nsteps:\n  - task: run-script\n"


@pytest.mark.parametrize("args, message", [
    pytest.param("", "rb.yaml:4: steps[0].args.script: required: the script to run (a local file, "
                     "relative to the runbook), or code: (inline Python)", id="nothing"),
    pytest.param("    args: {args: [a]}\n", "rb.yaml:5: steps[0].args.script: required: the script to "
                 "run (a local file, relative to the runbook), or code: (inline Python)", id="no-script"),
    pytest.param("    args:\n      script: a.py\n      code: print(1)\n",
                 "rb.yaml:7: steps[0].args.code: give script: or code:, not both", id="both"),
    pytest.param("    args: {scirpt: a.py}\n",
                 "rb.yaml:5: steps[0].args.scirpt: run-script has no argument 'scirpt' (did you mean "
                 "'script'?) (its arguments: script, code, args, put)", id="unknown-key"),
    pytest.param("    args: {path: a.py}\n",
                 "rb.yaml:5: steps[0].args.path: run-script has no argument 'path' (its arguments: "
                 "script, code, args, put)", id="the-tasks-flag"),
    pytest.param("    args: {script: [a.py]}\n",
                 "rb.yaml:5: steps[0].args.script: expected a path, got a list", id="script-list"),
    pytest.param("    args: {script: ''}\n",
                 "rb.yaml:5: steps[0].args.script: expected a path, got ''", id="script-empty"),
    pytest.param("    args: {code: 3}\n",
                 "rb.yaml:5: steps[0].args.code: expected Python code, got 3", id="code-number"),
    pytest.param("    args: {script: a.py, args: --x}\n",
                 "rb.yaml:5: steps[0].args.args: expected a list of strings (the script's arguments), "
                 "got '--x'", id="args-not-a-list"),
    pytest.param("    args:\n      script: a.py\n      args:\n        - --lines\n        - 50\n",
                 "rb.yaml:9: steps[0].args.args[1]: expected a string (quote a number), got 50",
                 id="args-number"),
    pytest.param("    args:\n      script: a.py\n      args: [a, {b: c}]\n",
                 "rb.yaml:7: steps[0].args.args[1]: expected a string, got a mapping", id="args-mapping"),
    pytest.param("    args:\n      script: a.py\n      args: [\"{{ params.q }}\"]\n",
                 "rb.yaml:7: steps[0].args.args[0]: {{ params.q }}: no parameter 'q' (parameters: p)",
                 id="args-unknown-param"),
    pytest.param("    args:\n      script: a.py\n      args: [\"{{ target.nmae }}\"]\n",
                 "rb.yaml:7: steps[0].args.args[0]: {{ target.nmae }}: unknown reference (expected "
                 "params.NAME, target.name, target.model, target.models.NAME or target.gpus)",
                 id="args-unknown-reference"),
    pytest.param("    args: {script: \"{{ target.name }}.py\"}\n",
                 "rb.yaml:5: steps[0].args.script: {{ target.* }} in '{{ target.name }}.py': the script "
                 "is read on this machine, one file for the whole step (only params.NAME may be "
                 "referred to)", id="script-target-reference"),
    pytest.param("    args:\n      code: x\n      put: [a, \"{{ target.gpus }}\"]\n",
                 "rb.yaml:7: steps[0].args.put[1]: {{ target.* }} in '{{ target.gpus }}': a put file "
                 "is read on this machine, one file for the whole step (only params.NAME may be "
                 "referred to)", id="put-target-reference"),
    pytest.param("    args: {code: x, put: a.json}\n",
                 "rb.yaml:5: steps[0].args.put: expected a list of local files (relative to the "
                 "runbook), got 'a.json'", id="put-not-a-list"),
    pytest.param("    args: {code: x, put: [null]}\n",
                 "rb.yaml:5: steps[0].args.put[0]: expected a path, got an empty value", id="put-null"),
    pytest.param("    args: {script: \"{{ params.p }\"}\n",
                 "rb.yaml:5: steps[0].args.script: unbalanced {{ }} in '{{ params.p }'", id="unbalanced"),
])
def test_loader_errors_name_file_line_and_key(args, message):
    assert load_error(STEP + args) == message


def test_run_script_is_one_of_the_step_tasks_the_loader_names():
    message = load_error("description: x\nsteps:\n  - task: run-scirpt\n")
    assert message.startswith("rb.yaml:3: steps[0].task: unknown task 'run-scirpt' (did you mean "
                              "'run-script'? tasks: ping, gpu-status, ")
    assert message.endswith(", stacks, run-script)")
    assert load_error("description: x\nsteps:\n  - args: {}\n").endswith(", stacks, run-script)")


# ------------------------------------------------------------ the job, read before anything runs

def test_the_job_is_the_tasks_own_with_every_targets_references_resolved(tmp_path):
    path = book(tmp_path, """\
        description: x
        params:
          iface: {description: i, default: ib0}
        steps:
          - id: link
            task: run-script
            args:
              script: checks/link.py
              args: [--iface, "{{ params.iface }}", "--host={{ target.name }}", "{{ target.model }}",
                     "{{ target.gpus }}"]
              put: [data/limits.json]
          - id: inline
            task: run-script
            args: {code: "import sys; print(sys.argv)", args: ["{{ target.models.main }}"]}
        """, scripts={"checks/link.py": REPORTS, "data/limits.json": "{}"})
    fleet = FakeFleet()
    seen = {}

    def run_many(targets, job_for, **kw):
        for target in targets:
            seen[(job_for(target).script_name, target.name)] = job_for(target)
        return fleet(targets, job_for, **kw)
    record = runbook_run.run(runbook.load(str(path)), [T["a"], T["b"]], {}, run_many=run_many)
    books = tmp_path / "books"
    for name in ("a", "b"):
        argv = ["--iface", "ib0", f"--host={name}", f"/m/{name}", "8"]
        assert seen[("link.py", name)] == execute.script_file_job(
            str(books / "checks" / "link.py"), argv, [str(books / "data" / "limits.json")])
        assert seen[("-c", name)] == execute.script_code_job(
            "-c", b"import sys; print(sys.argv)", [f"/m/{name}"], [])
    assert seen[("link.py", "a")].mode == "script" and seen[("link.py", "a")].extra_files == {
        "limits.json": b"{}"}
    assert cells(record) == {"link": {"a": "ok", "b": "ok"}, "inline": {"a": "ok", "b": "ok"}}


def test_a_target_that_lacks_a_setting_an_argument_names_skips_the_step_there(tmp_path):
    path = book(tmp_path, """\
        description: x
        steps:
          - task: run-script
            args: {code: "pass", args: ["{{ target.models.draft }}"]}
        """)
    with_draft = Target(name="d", local=True, models=(("draft", "/m/draft"),))
    fleet = FakeFleet()
    record = runbook_run.run(runbook.load(str(path)), [T["a"], with_draft], {}, run_many=fleet)
    assert cells(record) == {"run-script": {"a": "setting", "d": "ok"}}
    assert record.steps[0].skip_of("a").reason == "a has no models: entry 'draft' in hosts.yaml"
    assert fleet.argv[("run-script", "d")] == ["/m/draft"]


def test_the_reported_findings_decide_the_status_and_a_later_when(tmp_path):
    path = book(tmp_path, """\
        description: x
        steps:
          - {id: probe, task: run-script, args: {code: "pass"}}
          - {task: ping, when: probe.warn}
          - {task: gpu-status, when: probe.fail}
        """)
    warned = Result("run-script", "b", "warn", "link slow",
                    findings=[Finding("warn", "slow-link", "ib0 at 100 Gb/s")])
    record, = [runbook_run.run(runbook.load(str(path)), [T["a"], T["b"]], {},
                               run_many=FakeFleet({("run-script", "b"): warned}))]
    assert cells(record) == {"probe": {"a": "ok", "b": "warn"}, "ping": {"a": "when", "b": "ok"},
                             "gpu-status": {"a": "when", "b": "when"}}
    assert record.exit_code == 1


def test_a_missing_script_or_put_file_is_refused_before_anything_runs(tmp_path):
    python, mark = marking_python(tmp_path)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  here: {{local: true, python: {python}}}\n")
    books = tmp_path / "books"
    path = book(tmp_path, """\
        description: x
        steps:
          - task: ping
          - task: run-script
            args:
              script: checks/link.py
              put:
                - limits.json
                - nowhere/data.json
        """, name="nb.yaml", scripts={"limits.json": "{}"})
    save = tmp_path / "out"
    opts = execute.Options(host=["here"], hosts_file=str(hosts), save=str(save))

    def refused():
        with pytest.raises(InputError) as exc:
            runbook_run.execute(opts, "nb", runbooks_dirs=[str(books)], out=io.StringIO())
        assert not mark.exists() and not save.exists()
        return str(exc.value)
    assert refused() == (f"{path}:6: steps[1].args.script: {books / 'checks' / 'link.py'}: "
                         "No such file or directory")
    (books / "checks").mkdir()
    (books / "checks" / "link.py").write_text(REPORTS)
    assert refused() == (f"{path}:9: steps[1].args.put[1]: {books / 'nowhere' / 'data.json'}: "
                         "No such file or directory")
    (books / "nowhere").mkdir()
    (books / "nowhere" / "data.json").mkdir()
    assert refused() == (f"{path}:9: steps[1].args.put[1]: {books / 'nowhere' / 'data.json'}: "
                         "Is a directory")
    (books / "nowhere" / "data.json").rmdir()
    (books / "nowhere" / "limits.json").write_text("{}")
    path.write_text(path.read_text().replace("data.json", "limits.json"))
    assert refused() == (f"{path}:9: steps[1].args.put[1]: {books / 'nowhere' / 'limits.json'}: "
                         "two uploaded files would be named 'limits.json'")
    path.write_text(path.read_text().replace("nowhere/limits.json", ".mldiag-x"))
    (books / ".mldiag-x").write_text("")
    assert refused() == (f"{path}:9: steps[1].args.put[1]: {books / '.mldiag-x'}: a name starting "
                         "with '.mldiag-' is mldiag's own in the run's directory (the runtime's "
                         "files, the $MLDIAG_RESULT file)")


def test_a_script_from_a_parameter_is_the_users_path_from_the_current_directory(tmp_path, monkeypatch):
    path = book(tmp_path, """\
        description: x
        params: {check: {description: the script}}
        steps:
          - task: run-script
            args: {script: "{{ params.check }}"}
        """)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text("print('mine')\n")
    seen = []

    def run_many(targets, job_for, **kw):
        seen.extend(job_for(t) for t in targets)
        return []
    runbook_run.run(runbook.load(str(path)), [T["a"]], {"check": "mine.py"}, run_many=run_many)
    assert seen == [execute.script_file_job(str(tmp_path / "mine.py"), [], [])]
    with pytest.raises(InputError) as exc:
        runbook_run.run(runbook.load(str(path)), [T["a"]], {"check": "books/mine.py"},
                        run_many=run_many)
    assert str(exc.value) == (f"{path}:5: steps[0].args.script: {tmp_path / 'books' / 'mine.py'}: "
                              "No such file or directory")
    # not given: the step is skipped on every target, nothing is read
    record = runbook_run.run(runbook.load(str(path)), [T["a"]], {}, run_many=run_many)
    assert cells(record) == {"run-script": {"a": "param"}}


# ---------------------------------------------------------------------------- the report

def script_run(results, title_line=""):
    book_ = runbook.loads(textwrap.dedent(f"""\
        description: a script
        params: {{check: {{description: c, default: /x/probe.py}}}}
        steps:
          - id: probe
            task: run-script
            args: {{script: "{{{{ params.check }}}}", args: [a]}}
          - task: run-script
            {title_line or "args: {code: pass}"}
        """), "/books/s.yaml", "/books")
    first, second = StepRun(1, book_.steps[0]), StepRun(2, book_.steps[1])
    first.results = list(results)
    from datetime import datetime, timezone
    return RunbookRun(runbook=book_, targets=[r.target for r in results], params={},
                      started=datetime(2025, 6, 1, tzinfo=timezone.utc), steps=[first, second])


def script_result(target, stdout="checking a\n", stderr=""):
    return Result("run-script", target, "warn", "link slow on a",
                  findings=[Finding("warn", "slow-link", "a", "reseat the cable")],
                  data={"exit_code": 0, "stdout": stdout, "stderr": stderr, "reported": {}})


def test_the_report_titles_a_script_step_and_shows_its_output():
    run = script_run([script_result("a"), script_result("b"),
                      script_result("c", stdout="".join(f"line {i}\n" for i in range(12)),
                                    stderr="warning: x\n")])
    out = io.StringIO()
    report.render_markdown(run, out, version="0")
    text = out.getvalue()
    assert "| 1. probe: probe.py | warn |" in text
    assert "| 2. run-script: inline code | - |" in text
    steps = text.split("## Steps\n", 1)[1].split("## Raw results", 1)[0]
    assert steps == textwrap.dedent("""\

        ### 1. probe (run-script): probe.py

        - a,b,c: **warn** · link slow on a

        stdout of a,b:

        ```
        checking a
        ```

        stdout of c:

        ```
        … 2 more lines: --json/--save
        line 2
        line 3
        line 4
        line 5
        line 6
        line 7
        line 8
        line 9
        line 10
        line 11
        ```

        stderr of c:

        ```
        warning: x
        ```

        ### 2. run-script: inline code

        Did not run (see Skipped).

        """)
    assert "- **warn** · 1. probe · a,b,c · `slow-link`: a\n  - hint: reseat the cable" in text
    js = io.StringIO()
    report.render_json(run, js, version="0")
    steps = json.loads(js.getvalue())["steps"]
    assert [(s["id"], s["task"], s["title"]) for s in steps] == [
        ("probe", "run-script", "probe.py"), ("run-script", "run-script", "inline code")]
    assert steps[0]["args"] == {"script": "{{ params.check }}", "args": ["a"]}
    assert steps[1]["args"] == {"code": "pass"}
    # a written title wins; a parameter given on the command line names the script
    run = script_run([script_result("a")], "title: a look\n            args: {code: pass}")
    run.params = {"check": "/y/other.py"}
    out = io.StringIO()
    report.render_markdown(run, out, version="0")
    assert "| 1. probe: other.py | warn |" in out.getvalue()
    assert "| 2. run-script: a look | - |" in out.getvalue()


def test_a_scripts_hostile_output_adds_nothing_but_text_to_the_report():
    from tests.unit.test_runbook_report import HOSTILE_MARKDOWN, gfm_tags, markdown_it_structure

    def rendered(s):
        out = io.StringIO()
        report.render_markdown(script_run([script_result("a", stdout=s, stderr=s + "```\n~~~")]),
                               out, version="0")
        return out.getvalue()
    baseline = rendered("x")
    for hostile in HOSTILE_MARKDOWN + ["```\n</details>\n```", "````` `x` ~~~~"]:
        text = rendered(hostile)
        assert markdown_it_structure(text) == markdown_it_structure(baseline), hostile
        assert gfm_tags(text) == gfm_tags(baseline), hostile


# ---------------------------------------------------------------------------- mldiag runbook

def test_a_runbook_on_the_local_target_gates_a_step_on_a_scripts_reported_warning(tmp_path):
    books = tmp_path / "books"
    book(tmp_path, """\
        description: a script's finding decides what runs next
        params: {iface: {description: the interface, default: ib0}}
        steps:
          - id: link
            task: run-script
            args:
              script: checks/link.py
              args: ["{{ params.iface }}", "{{ target.name }}"]
              put: [limits.json]
          - id: closer
            task: run-script
            title: only where the link was slow
            when: link.warn
            args:
              code: |
                import os, sys
                print("closer look", sys.argv[1:], open("limits.json").read())
              args: ["{{ target.name }}"]
              put: [limits.json]
          - task: ping
            when: link.fail
        """, name="linkcheck.yaml", scripts={"checks/link.py": REPORTS,
                                             "limits.json": '{"gbps": 400}'})
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  here: {{local: true, python: {space_free_python()}}}\n")
    save = tmp_path / "out"
    r = mldiag("runbook", "linkcheck", "--runbooks-dir", books, "--hosts-file", hosts, "-H", "here",
               "--save", save, cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr       # the worst: the reported warning
    assert "| 1. link: link.py | warn |" in r.stdout
    assert "| 2. closer: only where the link was slow | ok |" in r.stdout
    assert "| 3. ping | skipped (when) |" in r.stdout
    assert "- **warn** · 1. link · here · `slow-link`: ib0\n  - hint: reseat the cable" in r.stdout
    assert "- 1. link: **warn** · link slow on ib0" not in r.stdout
    assert "- here: **warn** · link slow on ib0" in r.stdout
    assert "stdout of here:\n\n```\nchecking ib0 here\n```" in r.stdout
    assert "closer look ['here'] {\"gbps\": 400}" in r.stdout
    assert "- 3. ping on here: when: link.fail does not hold (it was warn)" in r.stdout
    doc = json.loads((save / "report.json").read_text())
    link, closer, ping = doc["steps"]
    assert (link["title"], closer["title"]) == ("link.py", "only where the link was slow")
    result = link["results"][0]
    assert (result["diagnostic"], result["status"]) == ("run-script", "warn")
    assert result["findings"] == [{"level": "warn", "code": "slow-link", "message": "ib0",
                                   "hint": "reseat the cable"}]
    assert result["data"]["reported"] == {"args": ["ib0", "here"]}
    assert closer["results"][0]["status"] == "ok" and ping["results"] == []
    assert json.loads((save / "steps" / "01-link" / "here.json").read_text())["status"] == "warn"

    # a parameter's path is the user's: from the current directory
    (tmp_path / "other.py").write_text("print('other')\n")
    (books / "mine.yaml").write_text(textwrap.dedent("""\
        description: the user's script
        params: {check: {description: a script}}
        steps:
          - task: run-script
            args: {script: "{{ params.check }}"}
        """))
    r = mldiag("runbook", "mine", "--runbooks-dir", books, "--hosts-file", hosts, "-H", "here",
               "--param", "check=other.py", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    step, = json.loads(r.stdout)["steps"]
    assert step["title"] == "other.py" and step["results"][0]["data"]["stdout"] == "other\n"


def test_mldiag_runbook_refuses_a_missing_script_before_anything_runs(tmp_path):
    python, mark = marking_python(tmp_path)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  here: {{local: true, python: {python}}}\n")
    path = book(tmp_path, """\
        description: x
        steps:
          - task: ping
          - task: run-script
            args: {script: gone.py}
        """, name="gone.yaml")
    r = mldiag("runbook", "gone", "--runbooks-dir", tmp_path / "books", "--hosts-file", hosts,
               "-H", "here", "--save", tmp_path / "out")
    assert r.returncode == 4, r.stdout + r.stderr
    assert r.stderr == (f"mldiag: {path}:5: steps[1].args.script: {tmp_path / 'books' / 'gone.py'}: "
                        "No such file or directory\n")
    assert r.stdout == "" and not mark.exists() and not (tmp_path / "out").exists()


def test_the_docs_example_is_a_valid_runbook(tmp_path):
    docs = open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "docs", "runbooks.md")).read()
    example = docs.split("## A run-script step", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    steps = runbook.loads(example, str(tmp_path / "link-check.yaml")).steps
    assert [(s.id, s.task, s.heading({})) for s in steps] == [
        ("link", "run-script", "link.py"), ("closer", "run-script", "counters, only where the link is slow"),
        ("gpu-status", "gpu-status", "")]
    assert dict(steps[0].args)["put"] == (str(tmp_path / "checks" / "limits.json"),)
