"""Runbook files (every loader error with its file:line) and the step semantics (when:,
stop_if:, parameters, unreachable targets, interruption), with a stand-in for run_many."""

import json
import os
import textwrap

import pytest

from diagnostics.engine import jobs
from diagnostics.runbooks import model as runbook, run as runbook_run
from diagnostics.inventory import topology
from diagnostics.core.errors import InputError
from diagnostics.core.results import Result
from diagnostics.inventory.topology import Target
from tests.programs import mldiag

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GOOD = textwrap.dedent("""\
    description: a test runbook
    x-owner: infra
    params:
      log: {description: the log}
      lines: {description: how many lines, default: 50}
    steps:
      - task: gpu-status
        stop_if: fail
      - task: check-attn
        title: attention
        args: {model: draft}
      - id: log
        task: scan-log
        when: [gpu-status.warn, check-attn.warn]
        args: {path: "{{ params.log }}", lines: "{{ params.lines }}"}
        timeout: 30
    """)


def load(text, name="rb.yaml"):
    return runbook.loads(textwrap.dedent(text), name)


def test_a_good_runbook():
    book = load(GOOD)
    assert book.name == "rb" and book.description == "a test runbook"
    assert book.params == (runbook.Param("log", "the log"), runbook.Param("lines", "how many lines", "50"))
    assert [s.id for s in book.steps] == ["gpu-status", "check-attn", "log"]
    gpu, attn, log = book.steps
    assert gpu.stop_if == "fail" and gpu.when == () and gpu.args == ()
    assert attn.title == "attention" and attn.args == (("model", "draft"),)
    assert log.task == "scan-log" and log.timeout == 30.0 and log.line == 12
    assert log.when == (runbook.Condition("gpu-status", "warn"), runbook.Condition("check-attn", "warn"))
    assert log.params == ["log", "lines"]


def test_the_built_in_runbooks_load():
    found = runbook.files(runbook.search_dirs())
    assert list(found) == ["extraction-fails", "node-health", "qualify", "slow-or-hung", "slow-training"]
    books = {name: runbook.load(path) for name, (path, _label) in found.items()}
    assert [s.task for s in books["slow-training"].steps] == ["gpu-status", "env-report", "check-attn", "scan-log"]
    assert [s.task for s in books["extraction-fails"].steps] == ["env-report", "extract-smoke", "scan-log"]
    assert [s.task for s in books["node-health"].steps] == ["ping", "gpu-status", "node-check", "scan-log", "env-report"]


@pytest.mark.parametrize("text, message", [
    pytest.param("", "rb.yaml:1: empty runbook (expected a mapping with description: and steps:)", id="empty"),
    pytest.param("- task: ping\n", "rb.yaml:1: expected a mapping with description: and steps:, got a list",
                 id="not-a-mapping"),
    pytest.param("steps: [{task: ping}]\n", "rb.yaml:1: description: required", id="no-description"),
    pytest.param("description: x\n", "rb.yaml:1: steps: required", id="no-steps"),
    pytest.param("description: x\nsteps: []\n", "rb.yaml:2: steps: expected a list of steps, got a list",
                 id="no-step"),
    pytest.param("description: x\nname: other\nsteps: [{task: ping}]\n",
                 "rb.yaml:2: name: 'other' differs from the file name: rb.yaml defines the runbook 'rb' "
                 "(leave name: out)", id="name-mismatch"),
    pytest.param("description: x\nstep: []\n",
                 "rb.yaml:2: step: unknown key (did you mean 'steps'?)", id="unknown-top-key"),
    pytest.param("description: x\nsteps:\n  - task: ping\n  - task: gpu-stats\n",
                 "rb.yaml:4: steps[1].task: unknown task 'gpu-stats' (did you mean 'gpu-status'? tasks: "
                 "ping, gpu-status, check-attn, env-report, extract-smoke, scan-log, node-check, nccl-check, gpu-perf, nccl-ras, step-times, stacks, run-script)",
                 id="unknown-task"),
    pytest.param("description: x\nsteps:\n  - args: {}\n",
                 "rb.yaml:3: steps[0].task: required (one of ping, gpu-status, check-attn, env-report, "
                 "extract-smoke, scan-log, node-check, nccl-check, gpu-perf, nccl-ras, step-times, stacks, run-script)", id="no-task"),
    pytest.param("description: x\nsteps:\n  - task: gpu-status\n    stop-if: fail\n",
                 "rb.yaml:4: steps[0].stop-if: unknown key (did you mean 'stop_if'?)", id="unknown-step-key"),
    pytest.param("description: x\nsteps:\n  - task: check-attn\n    args:\n      modle: x\n",
                 "rb.yaml:5: steps[0].args.modle: check-attn has no argument 'modle' (did you mean "
                 "'model'?) (its arguments: model, attn-implementation, model-class)", id="unknown-arg"),
    pytest.param("description: x\nsteps:\n  - task: ping\n    args: {model: x}\n",
                 "rb.yaml:4: steps[0].args.model: ping has no argument 'model' (its arguments: none)",
                 id="arg-of-argless-task"),
    pytest.param("description: x\nsteps:\n  - task: scan-log\n",
                 "rb.yaml:3: steps[0].args.path: required: log file on the target", id="required-arg"),
    pytest.param("description: x\nsteps:\n  - task: scan-log\n    args: {path: /x, lines: many}\n",
                 "rb.yaml:4: steps[0].args.lines: expected a whole number, got 'many'", id="int-arg"),
    pytest.param("description: x\nsteps:\n  - task: extract-smoke\n    args:\n      backend: tensorrt\n",
                 "rb.yaml:5: steps[0].args.backend: 'tensorrt' is not one of auto, transformers, vllm",
                 id="choice-arg"),
    pytest.param("description: x\nsteps:\n  - task: gpu-status\n    args: {expect-idle: yes please}\n",
                 "rb.yaml:4: steps[0].args.expect-idle: expected true or false, got 'yes please'", id="bool-arg"),
    pytest.param("description: x\nsteps:\n  - task: scan-log\n    args:\n      path: [a]\n",
                 "rb.yaml:5: steps[0].args.path: expected a value, got a list (write a reference quoted: "
                 "\"{{ params.NAME }}\")", id="list-arg"),
    pytest.param("description: x\nsteps:\n  - task: scan-log\n    args:\n      path: {{ params.log }}\n",
                 "rb.yaml:5: invalid YAML: found unhashable key (quote a reference: path: \"{{ params.log }}\")",
                 id="unquoted-reference"),
    pytest.param("description: x\nparams: {log: {description: l}}\nsteps:\n  - task: scan-log\n"
                 "    args:\n      path: \"{{ params.lg }}\"\n",
                 "rb.yaml:6: steps[0].args.path: {{ params.lg }}: no parameter 'lg' (did you mean 'log'?) "
                 "(parameters: log)", id="undeclared-param"),
    pytest.param("description: x\nsteps:\n  - task: scan-log\n    args:\n      path: \"{{ params.log }}\"\n",
                 "rb.yaml:5: steps[0].args.path: {{ params.log }}: no parameter 'log' (parameters: none are "
                 "declared under params:)", id="no-params"),
    pytest.param("description: x\nsteps:\n  - task: scan-log\n    args:\n      path: \"/{{ target.nmae }}\"\n",
                 "rb.yaml:5: steps[0].args.path: {{ target.nmae }}: unknown reference (expected params.NAME, "
                 "target.name, target.model, target.models.NAME or target.gpus)", id="unknown-target-field"),
    pytest.param("description: x\nsteps:\n  - task: scan-log\n    args:\n      path: \"{{ target.name }\"\n",
                 "rb.yaml:5: steps[0].args.path: unbalanced {{ }} in '{{ target.name }'", id="unbalanced"),
    pytest.param("description: x\nsteps:\n  - task: ping\n    when: gpu-status.fail\n  - task: gpu-status\n",
                 "rb.yaml:4: steps[0].when: 'gpu-status.fail': 'gpu-status' is not an earlier step "
                 "(earlier steps: none: this is the first step)", id="when-later-step"),
    pytest.param("description: x\nsteps:\n  - task: ping\n  - task: gpu-status\n    when: [ping.error, pnig.fail]\n",
                 "rb.yaml:5: steps[1].when[1]: 'pnig.fail': 'pnig' is not an earlier step (did you mean "
                 "'ping'?) (earlier steps: ping)", id="when-unknown-step"),
    pytest.param("description: x\nsteps:\n  - task: ping\n  - task: gpu-status\n    when: ping.ok\n",
                 "rb.yaml:5: steps[1].when: 'ping.ok': expected STEP.STATUS with STATUS one of warn, fail, "
                 "error (the step's status on the target is at least that)", id="when-ok"),
    pytest.param("description: x\nsteps:\n  - task: ping\n    stop_if: bad\n",
                 "rb.yaml:4: steps[0].stop_if: expected one of warn, fail, error (stop this target's run when "
                 "the step's status is at least that), got 'bad'", id="stop-if"),
    pytest.param("description: x\nsteps:\n  - task: ping\n    timeout: -3\n",
                 "rb.yaml:4: steps[0].timeout: expected a positive number of seconds, got -3", id="timeout"),
    pytest.param("description: x\nsteps:\n  - task: ping\n  - task: gpu-status\n  - task: ping\n",
                 "rb.yaml:5: steps[2]: two steps are named 'ping' (first at line 3): give one of them an id:",
                 id="duplicate-id"),
    pytest.param("description: x\nsteps:\n  - {task: ping, id: -x}\n",
                 "rb.yaml:3: steps[0].id: '-x' is not a valid step id: use only [A-Za-z0-9._-], not starting "
                 "with '.' or '-'", id="bad-id"),
    pytest.param("description: x\nparams:\n  log: {default: /x}\nsteps: [{task: ping}]\n",
                 "rb.yaml:3: params.log.description: required (one line: what to give)", id="param-description"),
    pytest.param("description: x\nparams:\n  log files: {description: x}\nsteps: [{task: ping}]\n",
                 "rb.yaml:3: params.log files: 'log files' is not a parameter name ([A-Za-z_][A-Za-z0-9_-]*)",
                 id="param-name"),
    pytest.param("description: x\nsteps:\n  - task: ping\n  - task: ping\n    task: gpu-status\n",
                 "rb.yaml:5: steps[1].task: duplicate key (first at line 4)", id="duplicate-key"),
    pytest.param("description: x\nsteps:\n  - task: [ping\n",
                 "rb.yaml:4: invalid YAML: did not find expected ',' or ']' (while parsing a flow "
                 "sequence at line 3)", id="bad-yaml"),
])
def test_loader_errors_name_file_line_and_key(text, message):
    with pytest.raises(InputError) as exc:
        runbook.loads(text, "rb.yaml")
    assert str(exc.value) == message
    assert exc.value.exit_code == 4


def test_hosts_yaml_names_runbook_dirs_relative_to_itself(tmp_path):
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "slow-training.yaml").write_text("description: ours\nsteps: [{task: ping}]\n")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  local: {local: true}\nrunbooks: team\n")
    topo = topology.load(str(hosts))
    assert topo.runbook_dirs == ((str(tmp_path / "team"), str(hosts), 3),)
    dirs = runbook.search_dirs(topo.runbook_dirs)
    book = runbook.find("slow-training", dirs)          # the team's replaces the built-in
    assert book.description == "ours" and book.source == str(tmp_path / "team")
    assert runbook.find("node-health", dirs).source == "built-in"

    hosts.write_text("hosts:\n  local: {local: true}\nrunbooks:\n  - team\n  - missing\n")
    with pytest.raises(InputError) as exc:
        runbook.search_dirs(topology.load(str(hosts)).runbook_dirs)
    assert str(exc.value) == f"{hosts}:5: runbooks: {tmp_path / 'missing'}: not a directory"
    hosts.write_text("hosts:\n  local: {local: true}\nrunbooks: {a: b}\n")
    with pytest.raises(InputError, match=r"hosts.yaml:3: runbooks: expected a directory, got a mapping$"):
        topology.load(str(hosts))


def test_unknown_runbook_and_undeclared_param():
    dirs = runbook.search_dirs()
    with pytest.raises(InputError) as exc:
        runbook.find("slow-trainig", dirs)
    assert str(exc.value) == ("unknown runbook 'slow-trainig' (did you mean 'slow-training'?) (runbooks: "
                              "extraction-fails, node-health, qualify, slow-or-hung, slow-training; `runbook --list` describes them)")
    book = runbook.find("slow-training", dirs)
    with pytest.raises(InputError) as exc:
        book.param_values({"lg": "/x"})
    assert str(exc.value) == ("--param lg: runbook 'slow-training' has no parameter 'lg' (did you mean 'log'?) "
                              "(its parameters: log, lines)")
    assert book.param_values({"log": "/x"}) == {"lines": "2000", "log": "/x"}


# ---------------------------------------------------------------------------- step semantics

class FakeFleet:
    """Stands in for runner.run_many: answers from a table {(task, target): status or Result}
    (default ok), records each job's argv, and can raise KeyboardInterrupt at a task."""

    def __init__(self, answers=None, interrupt_at=None):
        self.answers = answers or {}
        self.interrupt_at = interrupt_at
        self.calls = []     # (task, [target names])
        self.argv = {}      # (task, target) -> argv

    def __call__(self, targets, job_for, *, parallel, pool, on_result, keep_allocations=None):
        task = None
        results = []
        for target in targets:
            job = job_for(target)
            task = job.diagnostic
            self.argv[(task, target.name)] = list(job.argv)
            if task == self.interrupt_at and results:
                raise KeyboardInterrupt
            answer = self.answers.get((task, target.name), "ok")
            if isinstance(answer, str):
                answer = Result(diagnostic=task, target=target.name, status=answer,
                                summary=f"{task} {answer}")
            for r in answer if isinstance(answer, list) else [answer]:
                on_result(r)
                results.append(r)
        self.calls.append((task, [t.name for t in targets]))
        return results


def unreachable(task, target, layer="unreachable"):
    return Result.failure(task, target, layer, "connection refused")


T = {name: Target(name=name, local=True, models=(("default", f"/m/{name}"),)) for name in ("a", "b", "c")}
BARE = Target(name="bare", local=True)


def run(text, targets, answers=None, params=None, **kw):
    fleet = FakeFleet(answers, kw.pop("interrupt_at", None))
    record = runbook_run.run(load(text), targets, params or {}, run_many=fleet, **kw)
    return record, fleet


def cells(record):
    """{step id: {target: status or skip kind}}"""
    return {sr.step.id: {t: sr.status_of(t) or sr.skip_of(t).kind for t in record.targets}
            for sr in record.steps}


def test_when_runs_a_step_only_where_an_earlier_one_found_that_much():
    record, fleet = run("""\
        description: x
        steps:
          - task: gpu-status
          - task: env-report
            when: gpu-status.warn
          - task: ping
            when: [gpu-status.fail, env-report.warn]
        """, [T["a"], T["b"], T["c"]], {("gpu-status", "b"): "warn", ("gpu-status", "c"): "fail",
                                        ("env-report", "c"): "warn"})
    assert cells(record) == {"gpu-status": {"a": "ok", "b": "warn", "c": "fail"},
                             "env-report": {"a": "when", "b": "ok", "c": "warn"},
                             "ping": {"a": "when", "b": "when", "c": "ok"}}
    assert fleet.calls == [("gpu-status", ["a", "b", "c"]), ("env-report", ["b", "c"]), ("ping", ["c"])]
    ping = record.steps[2]
    assert ping.skip_of("a").reason == "when: gpu-status.fail does not hold (it was ok)"
    assert ping.skip_of("b").reason == "when: gpu-status.fail does not hold (it was warn)"
    assert record.exit_code == 2


def test_when_on_a_step_that_did_not_run_does_not_hold():
    record, _ = run("""\
        description: x
        params: {log: {description: l}}
        steps:
          - task: scan-log
            args: {path: "{{ params.log }}"}
          - task: ping
            when: scan-log.warn
        """, [T["a"]])
    assert cells(record) == {"scan-log": {"a": "param"}, "ping": {"a": "when"}}
    assert record.steps[0].skip_of("a").reason == "parameter log not given (--param log=VALUE)"
    assert record.steps[1].skip_of("a").reason == "when: scan-log.warn does not hold (it did not run)"
    assert record.exit_code == 0 and record.results == []


def test_stop_if_ends_the_run_for_that_target_only():
    record, fleet = run("""\
        description: x
        steps:
          - task: gpu-status
            stop_if: fail
          - task: env-report
          - task: ping
        """, [T["a"], T["b"], T["c"]], {("gpu-status", "a"): "warn", ("gpu-status", "b"): "fail",
                                        ("gpu-status", "c"): "error"})
    assert cells(record) == {"gpu-status": {"a": "warn", "b": "fail", "c": "error"},
                             "env-report": {"a": "ok", "b": "stopped", "c": "stopped"},
                             "ping": {"a": "ok", "b": "stopped", "c": "stopped"}}
    assert fleet.calls[1:] == [("env-report", ["a"]), ("ping", ["a"])]
    assert record.steps[2].skip_of("b").reason == "stopped after step 1 (gpu-status: fail; stop_if: fail)"
    assert record.exit_code == 3     # the worst of what ran: c's error


@pytest.mark.parametrize("layer, leaves", [
    ("unreachable", True), ("auth", True), ("hostkey", True), ("become", True), ("container", True),
    ("interpreter", True), ("upload", True),
    ("timeout", False), ("crashed", False), ("killed", False), ("internal", False),
])
def test_a_target_unreachable_at_one_step_is_not_asked_again(layer, leaves):
    record, fleet = run("""\
        description: x
        steps:
          - task: ping
          - task: gpu-status
          - task: env-report
        """, [T["a"], T["b"]], {("gpu-status", "b"): unreachable("gpu-status", "b", layer)})
    later = fleet.calls[2]
    if leaves:
        assert later == ("env-report", ["a"])
        assert record.steps[2].skip_of("b") == runbook_run.Skip(
            "b", "unreachable", f"left the run at step 2 (gpu-status): {layer}")
    else:
        assert later == ("env-report", ["a", "b"])
    assert record.exit_code == 3


def test_parameters_defaults_and_target_settings_reach_the_argv():
    record, fleet = run("""\
        description: x
        params:
          log: {description: l}
          lines: {description: n, default: 50}
        steps:
          - task: scan-log
            args: {path: "/logs/{{ target.name }}/{{ params.log }}", lines: "{{ params.lines }}"}
          - task: check-attn
            args: {model: "{{ target.models.default }}", attn-implementation: eager}
          - task: extract-smoke
          - task: gpu-status
            args: {expect-idle: true}
        """, [T["a"], BARE], params={"log": "train.log"})
    assert fleet.argv[("scan-log", "a")] == ["--path=/logs/a/train.log", "--lines=50"]
    assert fleet.argv[("scan-log", "bare")] == ["--path=/logs/bare/train.log", "--lines=50"]
    assert fleet.argv[("check-attn", "a")] == ["--model=/m/a", "--attn-implementation=eager"]
    assert fleet.argv[("extract-smoke", "a")] == ["--model=/m/a"]
    assert fleet.argv[("gpu-status", "a")] == ["--expect-idle"]
    # the target without models: skips the model steps, and only those
    assert cells(record)["check-attn"] == {"a": "ok", "bare": "setting"}
    assert record.steps[1].skip_of("bare").reason == "bare has no models: entry 'default' in hosts.yaml"
    assert record.steps[2].skip_of("bare").reason == \
        "bare: no --model given and the target has no models: entry in hosts.yaml"
    assert cells(record)["gpu-status"] == {"a": "ok", "bare": "ok"}


def test_timeouts_command_line_over_step_over_target():
    book = """\
        description: x
        steps:
          - {task: ping, timeout: 30}
          - task: gpu-status
        """
    seen = {}

    def fleet(targets, job_for, **kw):
        for t in targets:
            job = job_for(t)
            seen.setdefault(job.diagnostic, []).append(job.timeout)
        return []
    runbook_run.run(load(book), [T["a"]], {}, run_many=fleet)
    assert seen == {"ping": [30.0], "gpu-status": [None]}
    seen.clear()
    runbook_run.run(load(book), [T["a"]], {}, run_many=fleet, timeout=5.0, keep_remote=True)
    assert seen == {"ping": [5.0], "gpu-status": [5.0]}


def test_slurm_rows_count_for_their_login_target():
    cluster = Target(name="cl", local=True)
    rows = [Result("gpu-status", "cl:n1", "ok", "ok"), Result("gpu-status", "cl:n2", "fail", "lost")]
    record, fleet = run("""\
        description: x
        steps:
          - {task: gpu-status, stop_if: fail}
          - task: ping
        """, [cluster, T["a"]], {("gpu-status", "cl"): rows})
    gpu = record.steps[0]
    assert gpu.status_of("cl") == "fail" and gpu.owner(rows[1]) == "cl"
    assert cells(record)["ping"] == {"cl": "stopped", "a": "ok"}


def test_an_interrupted_run_keeps_what_arrived():
    record, _ = run("""\
        description: x
        steps:
          - task: ping
          - task: gpu-status
          - task: env-report
        """, [T["a"], T["b"]], interrupt_at="gpu-status")
    assert record.interrupted and record.exit_code == 130 and record.interrupted_as == "interrupted"
    assert [r.target for r in record.steps[1].results] == ["a"]
    assert cells(record)["env-report"] == {"a": "interrupted", "b": "interrupted"}


def test_jobs_are_the_tasks_own():
    """A runbook step and the task build the same job (one place: diagnostics/engine/jobs.py)."""
    target = Target(name="t", local=True, gpus=8, models=(("main", "/m/main"), ("draft", "/m/d")))
    job = jobs.job_source("check-attn", {"model": "draft", "model_class": "X"})(target)
    assert (job.diagnostic, job.script_name, list(job.argv)) == \
        ("check-attn", "check_attn.py", ["--model=/m/d", "--model-class=X"])
    assert list(jobs.job_source("gpu-status", {})(target).argv) == ["--expect-gpus=8"]
    assert list(jobs.job_source("extract-smoke", {"max-tokens": 16, "samples": None})(target).argv) == \
        ["--model=/m/main", "--max-tokens=16"]
    with pytest.raises(ValueError):
        jobs.job_source("scan-log", {"paht": "/x"})


# ---------------------------------------------------------------------------- the command line

def test_list_shows_the_runbooks_and_a_broken_one_exits_4(tmp_path):
    r = mldiag("runbook", "--list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NAME", "SOURCE", "DESCRIPTION"]
    assert [ln.split()[0] for ln in lines[1:] if not ln.startswith(" ")] == \
        ["extraction-fails", "node-health", "qualify", "slow-or-hung", "slow-training"]
    assert "--param log=...  the training log on the target" in r.stdout

    (tmp_path / "broken.yaml").write_text("description: x\nsteps:\n  - task: gpu-stats\n")
    (tmp_path / "mine.yaml").write_text("description: my own\nsteps: [{task: ping}]\n")
    r = mldiag("runbook", "--list", "--runbooks-dir", tmp_path, "--json")
    assert r.returncode == 4
    assert [b["name"] for b in json.loads(r.stdout)] == ["extraction-fails", "mine", "node-health", "qualify",
                                                         "slow-or-hung", "slow-training"]
    assert f"{tmp_path / 'broken.yaml'}:3: steps[0].task: unknown task 'gpu-stats'" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("argv, message", [
    (["runbook"], "'runbook' did not receive required positional arguments: 'name'"),
    (["runbook", "nosuch"], "unknown runbook 'nosuch'"),
    (["runbook", "-V"], "'-V' is not a runbook name (help: `inv --help runbook`"),
    (["runbook", "slow-training", "--param", "lg=/x"], "runbook 'slow-training' has no parameter 'lg'"),
    (["runbook", "slow-training", "--param", "log"], "--param 'log': expected NAME=VALUE"),
    (["runbook", "slow-training", "--format", "xml"], "--format: expected one of md, json, got 'xml'"),
    (["runbook", "slow-training", "--timeout", "soon"], "--timeout: expected a positive number"),
    (["runbook", "slow-training", "-H", "nosuch"], "unknown target 'nosuch'"),
    (["runbook", "slow-training", "--runbooks-dir", "/nonexistent"], "--runbooks-dir /nonexistent: not a directory"),
])
def test_bad_input_exits_4_before_anything_runs(argv, message):
    r = mldiag(*argv)
    assert r.returncode == 4, r.stdout + r.stderr
    assert message in r.stderr and r.stdout == "" and "Traceback" not in r.stderr


def test_a_runbook_on_the_local_target_writes_its_report(tmp_path):
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "check.yaml").write_text(textwrap.dedent("""\
        description: ping then a log
        params: {log: {description: the log}}
        steps:
          - task: ping
          - task: scan-log
            args: {path: "{{ params.log }}"}
        """))
    log = tmp_path / "train.log"
    log.write_text("step 1 loss=2.0\nstep 2 loss=nan\n")
    save = tmp_path / "out"
    r = mldiag("runbook", "check", "--runbooks-dir", tmp_path / "books", "--param", f"log={log}",
               "--save", save)
    assert r.returncode == 2, r.stdout + r.stderr      # NaN loss is a fail
    assert r.stdout.startswith("# Runbook `check`\n\nping then a log\n\n- **Targets:** local (1)\n")
    assert "| 1. ping | ok |" in r.stdout and "| 2. scan-log | fail |" in r.stdout
    assert (save / "report.md").read_text() == r.stdout
    doc = json.loads((save / "report.json").read_text())
    assert doc["runbook"] == "check" and doc["exit_code"] == 2 and doc["params"] == {"log": str(log)}
    assert [s["results"][0]["status"] for s in doc["steps"]] == ["ok", "fail"]
    assert json.loads((save / "steps" / "02-scan-log" / "local.json").read_text())["status"] == "fail"
    assert json.loads((save / "steps" / "01-ping" / "summary.json").read_text())["exit_code"] == 0

    j = mldiag("runbook", "check", "--runbooks-dir", tmp_path / "books", "--json")
    assert j.returncode == 0, j.stderr
    doc = json.loads(j.stdout)
    assert doc["steps"][1]["skipped"] == [{"target": "local", "kind": "param",
                                           "reason": "parameter log not given (--param log=VALUE)"}]


def test_the_docs_example_is_a_valid_runbook(tmp_path):
    readme = open(os.path.join(REPO, "docs", "runbooks.md")).read()
    example = readme.split("## Writing a runbook", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    book = runbook.loads(example, str(tmp_path / "triage.yaml"))
    assert [s.id for s in book.steps] == ["gpu-status", "kernel-log", "check-attn"]
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "triage.yaml").write_text(example.replace("when: gpu-status.fail", "when: gpu-stats.fail"))
    with pytest.raises(InputError) as exc:
        runbook.load(str(tmp_path / "team" / "triage.yaml"))
    shown = readme.split("exit 4:\n  `team/triage.yaml:", 1)[1].split("`.", 1)[0]
    assert str(exc.value) == f"{tmp_path / 'team' / 'triage.yaml'}:{shown}"


def test_hung_job_is_the_old_name_of_slow_or_hung_and_a_teams_own_comes_first(tmp_path):
    dirs = runbook.search_dirs(())
    assert runbook.find("hung-job", dirs).name == "slow-or-hung"
    (tmp_path / "hung-job.yaml").write_text("description: ours\nsteps: [{task: ping}]\n")
    dirs = runbook.search_dirs(((str(tmp_path), "hosts.yaml", 1),))
    assert runbook.find("hung-job", dirs).description == "ours"
