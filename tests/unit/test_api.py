"""diagnostics/api.py: a task run from Python as the command line runs it (the same documents
--json prints, the same exit code and the same words for bad input), printing nothing; the
collection with the team's diagnostics; the decorator that gives a team task the target flags.
The targets are real local runs."""

import inspect
import json

import pytest
from invoke import Collection, Config, Context, Exit

from diagnostics import api
from diagnostics.engine import registry
from tests.programs import mldiag


def same_documents(a, b):
    """Documents equal but for the run's own duration."""
    strip = [{k: v for k, v in doc.items() if k != "duration_s"} for doc in a]
    return strip == [{k: v for k, v in doc.items() if k != "duration_s"} for doc in b]


def test_run_gives_the_documents_json_gives_and_prints_nothing(checks, capsys):
    _, hosts = checks
    got = api.run("probe", hosts="here", hosts_file=str(hosts), level="warn", echo=["a b"])
    assert capsys.readouterr() == ("", "")
    cli = mldiag("probe", "-H", "here", "--hosts-file", hosts, "--level", "warn", "--echo", "a b",
                 "--json")
    assert same_documents(got.documents, json.loads(cli.stdout))
    assert (list(got), got.status, got.exit_code, got.messages) == (["here"], "warn", 1, ())
    assert got["here"]["data"]["echo"] == ["a b"]


def test_a_built_in_with_its_flags_and_the_exit_code_of_the_worst(checks):
    _, hosts = checks
    got = api.run("scan-log", hosts=["here"], hosts_file=str(hosts), path=str(hosts), lines=5)
    assert got["here"]["diagnostic"] == "scan-log" and got.exit_code == {"ok": 0, "warn": 1}[
        got.status]
    assert api.worst(got, api.run("probe", hosts="here", hosts_file=str(hosts),
                                  level="fail")) == 2


def test_a_caller_that_installed_nothing_runs_a_built_in_and_a_teams(checks):
    """The engine installs no registry itself: api.run, called first thing in a process, installs
    the built-ins for a built-in task, and finds the team's for a team task."""
    _, hosts = checks
    registry.use(registry.Registry({}))
    got = api.run("scan-log", hosts="here", hosts_file=str(hosts), path=str(hosts), lines=5)
    assert got["here"]["diagnostic"] == "scan-log" and "scan-log" in registry.current().specs
    registry.use(registry.Registry({}))
    assert api.run("probe", hosts="here", hosts_file=str(hosts), level="warn").status == "warn"


@pytest.mark.parametrize("call, cli_argv, code", [
    (dict(task="probe", hosts="nosuchbox"), ["probe", "-H", "nosuchbox"], 4),
    (dict(task="gpu-stats"), None, 4),
    (dict(task="probe", colour="red"), None, 4),
    (dict(task="node-check", hosts="here", dcgm_level="7"), ["node-check", "-H", "here",
                                                            "--dcgm-level", "7"], 4),
])
def test_bad_input_raises_the_words_and_code_the_command_line_gives(checks, call, cli_argv, code):
    _, hosts = checks
    call = dict(call)           # the parameter's own dict stays whole for a second run (mutmut)
    task = call.pop("task")
    with pytest.raises(api.ApiError) as caught:
        api.run(task, hosts_file=str(hosts), **call)
    assert caught.value.exit_code == code
    if cli_argv:
        r = mldiag(*cli_argv, "--hosts-file", hosts)
        assert (r.returncode, r.stderr) == (code, f"mldiag: {caught.value}\n")
    elif task == "gpu-stats":
        assert str(caught.value).startswith("unknown task 'gpu-stats' (did you mean "
                                            "'gpu-status'?")
    else:
        assert str(caught.value).startswith("probe: no flag 'colour' (its flags: count, echo, ")


def test_the_hosts_file_may_come_from_the_mldiag_config(checks):
    _, hosts = checks
    context = Context(Config(overrides={"mldiag": {"hosts_file": str(hosts)}}))
    assert api.run("probe", hosts="here", config=context).status == "ok"


def test_collection_has_every_task_and_the_teams(checks):
    _, hosts = checks
    tasks = api.collection(str(hosts))
    assert isinstance(tasks, Collection)
    assert {"gpu-status", "node-check", "probe", "run-script", "runbook"} <= set(tasks.tasks)
    assert tasks.configuration()["mldiag"] == {"hosts_file": None, "parallel": None,
                                               "timeout": None}


def test_the_task_decorator_adds_the_target_flags_and_maps_the_exit(checks):
    _, hosts = checks
    seen = {}

    @api.task(help={"level": "the probe's level"})
    def preflight(c, level="ok", host=None):
        """Probe, once."""
        seen.update(host=host)
        return api.run("probe", hosts=host, config=c, level=level)

    names = list(inspect.signature(preflight.body).parameters)
    assert names == ["c", "level", "host", "group", "hosts_file"]
    assert preflight.iterable == ["host", "group"] and preflight.__doc__ == "Probe, once."
    context = Context(Config(overrides={"mldiag": {"hosts_file": str(hosts)}}))
    assert preflight(context, host=["here"]).status == "ok"
    with pytest.raises(Exit) as ended:
        preflight(context, level="warn", host=["here"])
    assert ended.value.code == 1
    with pytest.raises(Exit) as refused:
        preflight(context, host=["nosuchbox"])
    assert refused.value.code == 4 and str(refused.value.message).startswith(
        "mldiag: unknown target 'nosuchbox'")
