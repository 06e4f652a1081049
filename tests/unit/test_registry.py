"""One registry, one path (diagnostics/engine/registry.py): every diagnostic's task is generated from
its spec, a runbook step takes exactly the task's flags (or refuses one with its reason), and
a runbook's step gets the task's fleet judgement: node-check's --baseline findings."""

import inspect
import io
import json
import textwrap

import pytest

from diagnostics import builtin
from diagnostics.engine import execute, registry
from diagnostics.runbooks import model as runbook, run as runbook_run
from diagnostics.inventory import topology
from diagnostics.core.errors import InputError
from diagnostics.cli.tasks import COMMON_PARAMETERS, diagnostic_task, ns

COMMON = {name.replace("_", "-") for name, _ in COMMON_PARAMETERS}


def task_flags(name):
    params = list(inspect.signature(ns[name].body).parameters.values())[1:]
    return [p.name.replace("_", "-") for p in params]


def a_value(arg):
    if arg.kind == "bool":
        return "true"
    if arg.kind == "int":
        return '"3"'
    if arg.choices:
        return f'"{arg.choices[-1]}"'
    return '"x"'


def step_with(spec, arg):
    required = [a for a in spec.args if a.required and a is not arg]
    args = ", ".join(f"{a.name}: {a_value(a)}" for a in [arg] + required)
    return f"description: d\nsteps:\n  - task: {spec.name}\n    args: {{{args}}}\n"


def test_the_registry_lists_the_tasks_mldiag_has():
    diagnostic_tasks = [n for n in ns.tasks if n not in ("hosts", "run-script", "runbook",
                                                         "baseline-init", "baseline-diff")]
    assert diagnostic_tasks == registry.names()
    assert [ns[n].__doc__ for n in diagnostic_tasks] == [s.summary for s in builtin.BUILTINS]


@pytest.mark.parametrize("spec", builtin.BUILTINS, ids=lambda s: s.name)
def test_every_flag_of_a_task_is_a_runbook_arg_or_refused_with_its_reason(spec):
    own = [f for f in task_flags(spec.name) if f not in COMMON]
    assert sorted(own) == sorted(a.name for a in spec.args)
    assert [f for f in task_flags(spec.name) if f in COMMON] == [n.replace("_", "-") for n, _
                                                                  in COMMON_PARAMETERS]
    for arg in spec.args:
        text = step_with(spec, arg)
        if arg.not_in_runbook:
            with pytest.raises(InputError) as caught:
                runbook.loads(text, "rb.yaml")
            assert str(caught.value) == (f"rb.yaml:4: steps[0].args.{arg.name}: {spec.name}'s "
                                         f"--{arg.name} is not a runbook step's: "
                                         f"{arg.not_in_runbook}")
        else:
            step = runbook.loads(text, "rb.yaml").steps[0]
            assert step.args[0][0] == arg.name, text


@pytest.mark.parametrize("spec", builtin.BUILTINS, ids=lambda s: s.name)
def test_a_tasks_flag_help_and_value_name_are_its_specs(spec):
    # a task built afresh: Invoke hands each flag's help out once (get_arguments pops it)
    context_args = {a.name: a for a in diagnostic_task(spec).get_arguments()}
    for arg in spec.args:
        argument = context_args[arg.python_name]
        assert argument.help == (arg.task_help or arg.help)
        assert argument.kind is (bool if arg.kind == "bool" else list if arg.repeatable else str)
        assert argument.positional is arg.positional


def test_client_side_args_are_never_sent_to_the_target():
    target = topology.loads("hosts:\n  here: {local: true}\n").targets["here"]
    job = registry_job("node-check", {"no-dcgm": True, "baseline": "/b.json", "prom": "/x.prom",
                                      "save-baseline": "/s.json", "drain": True})(target)
    assert list(job.argv) == ["--no-dcgm"]


def registry_job(name, values):
    from diagnostics.engine import jobs
    return jobs.job_source(name, values)


def test_a_client_side_arg_takes_no_target_reference():
    text = ("description: d\nsteps:\n  - task: node-check\n"
            "    args: {baseline: \"{{ target.name }}.json\"}\n")
    with pytest.raises(InputError, match=r"rb.yaml:4: steps\[0\].args.baseline: \{\{ target.\* \}\}"
                                         r" in '\{\{ target.name \}\}.json': --baseline is mldiag's own"):
        runbook.loads(text, "rb.yaml")


# ---------------------------------------------------------------- node-check: task and step alike
# The target is a real local run of the node-check script (this machine: no GPU, so the facts a
# baseline keeps are its kernel and zero GPUs); a baseline with another kernel is a deviation.

def findings_of(docs):
    return [(f["level"], f["code"], f.get("action")) for f in docs[0]["findings"]]


def test_a_runbook_node_check_step_with_a_baseline_gives_the_tasks_findings(hosts, tmp_path):
    hosts, _ = hosts
    opts = execute.Options(host=["here"], hosts_file=str(hosts), json=True)
    saved = tmp_path / "books" / "base.json"
    saved.parent.mkdir()
    execute.run_diagnostic(registry.get("node-check"), opts,
                       {"no_dcgm": True, "save_baseline": str(saved)}, out=io.StringIO())
    base = json.loads(saved.read_text())
    base["nodes"]["here"]["kernel"] = "0.0.0-not-this-one"
    saved.write_text(json.dumps(base))

    out = io.StringIO()
    execute.run_diagnostic(registry.get("node-check"), opts, {"no_dcgm": True, "baseline": str(saved)},
                       out=out)
    by_task = findings_of(json.loads(out.getvalue()))
    assert ("warn", "baseline-deviation", "monitor") in by_task, by_task

    book = tmp_path / "books" / "nc.yaml"      # the step's baseline: beside the runbook
    book.write_text("description: node-check against a baseline\nsteps:\n"
                    "  - task: node-check\n    args: {no-dcgm: true, baseline: base.json}\n")
    targets = topology.load(str(hosts)).select(["here"], [])
    record = runbook_run.run(runbook.load(str(book)), targets, {})
    by_step = findings_of([r.to_dict() for r in record.steps[0].results])
    assert by_step == by_task


def test_a_runbook_whose_baseline_is_not_one_is_refused_before_anything_runs(hosts, tmp_path):
    hosts, marker = hosts
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "base.json").write_text("[1, 2, 3]\n")
    (tmp_path / "books" / "nc.yaml").write_text(textwrap.dedent("""\
        description: d
        steps:
          - task: ping
          - task: node-check
            args: {baseline: base.json}
        """))
    save = tmp_path / "out"
    opts = execute.Options(host=["here"], hosts_file=str(hosts), save=str(save))
    with pytest.raises(InputError, match="base.json"):
        runbook_run.execute(opts, "nc", runbooks_dirs=[str(tmp_path / "books")], out=io.StringIO())
    assert not marker.exists() and not save.exists()


@pytest.mark.parametrize("written, resolved", [
    ("base.json", "{dir}/base.json"),                          # beside the runbook
    ("/abs/base.json", "/abs/base.json"),
    ("bases/{{ params.site }}.json", "{dir}/bases/{{ params.site }}.json"),
    ("{{ params.base }}", "{{ params.base }}"),                # the user's: as they give it
])
def test_a_baseline_in_a_step_is_found_as_a_run_script_steps_files_are(tmp_path, written,
                                                                       resolved):
    book = tmp_path / "nc.yaml"
    book.write_text("description: d\nparams: {site: {description: s}, base: {description: b}}\n"
                    f"steps:\n  - task: node-check\n    args: {{baseline: \"{written}\"}}\n")
    step = runbook.load(str(book)).steps[0]
    assert dict(step.args)["baseline"] == resolved.replace("{dir}", str(tmp_path))
