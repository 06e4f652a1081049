"""diagnostics/engine/registry.py, in this process (mutmut-registry.cfg): each built-in's hooks as a
task and a runbook step call them (the job a target gets, the timeout, the bad-input check, the
view after the table, the common options), and the words of ``unknown``.

Written against a mutation run: every argument a hook passes on, every key it reads and every
bound it adds is one that a one-token change of registry.py would get wrong."""

import importlib
import io
import json
import os

import pytest

from diagnostics import builtin
from diagnostics.engine import execute, jobs, registry
from diagnostics.builtin.gpu_status import smi_memory
from diagnostics.inventory import topology
from diagnostics.core.errors import InputError
from diagnostics.engine.team import Problem
from diagnostics.inventory.topology import Target

BUILTIN_NAMES = ("ping, gpu-status, check-attn, env-report, extract-smoke, scan-log, node-check, "
                 "nccl-check, gpu-perf, nccl-ras, step-times, stacks")


def target(body="{local: true}"):
    return topology.loads(f"hosts:\n  box: {body}\n").targets["box"]


def argv(task, values, on):
    return list(jobs.job_source(task, values)(on).argv)


# ---------------------------------------------------------------------------- the spec itself

def test_arg_finds_an_argument_by_its_dash_name_and_none_otherwise():
    spec = registry.get("scan-log")
    assert spec.arg("lines") is spec.args[1] and spec.arg("lines").kind == "int"
    assert spec.arg("max-tokens") is None and spec.arg("path").positional


def test_given_takes_either_spelling_and_names_every_unknown_argument_sorted():
    spec = registry.get("extract-smoke")
    assert spec.given({"max_tokens": 3, "dtype": "auto"}) == {"max-tokens": 3, "dtype": "auto"}
    assert spec.given({}) == {}
    with pytest.raises(ValueError) as caught:
        spec.given({"zeta": 1, "max_tokens": 3, "alpha_beta": 2})
    assert str(caught.value) == "extract-smoke: no argument alpha-beta, zeta"
    with pytest.raises(ValueError) as caught:
        registry.get("ping").given({"lines": 1})
    assert str(caught.value) == "ping: no argument lines"


# ---------------------------------------------------------------------------- unknown

def test_unknown_guesses_the_closest_task_and_lists_them_all():
    assert registry.unknown("gpu-stats") == ("unknown task 'gpu-stats' (did you mean 'gpu-status'? "
                                             f"tasks: {BUILTIN_NAMES})")
    assert registry.unknown("zzzz") == f"unknown task 'zzzz' (tasks: {BUILTIN_NAMES})"


def test_unknown_lists_and_guesses_the_callers_other_tasks_after_the_diagnostics():
    assert registry.unknown("run-scrip", ["run-script"]) == (
        f"unknown task 'run-scrip' (did you mean 'run-script'? tasks: {BUILTIN_NAMES}, run-script)")
    assert registry.unknown("zzzz", ("a", "b")) == \
        f"unknown task 'zzzz' (tasks: {BUILTIN_NAMES}, a, b)"


def test_unknown_says_a_team_files_problem_for_its_task_only():
    problem = Problem("probe", "/team/probe.py", 3, "syntax error: '{' was never closed")
    registry.use(registry.Registry(builtin.REGISTRY, (problem,)))
    assert registry.unknown("probe") == ("task 'probe' cannot run: /team/probe.py:3: syntax error: "
                                         "'{' was never closed")
    assert registry.unknown("scanlog") == ("unknown task 'scanlog' (did you mean 'scan-log'? "
                                        f"tasks: {BUILTIN_NAMES})")


# ---------------------------------------------------------------------------- what a target gets

@pytest.fixture
def smi_cache(tmp_path, monkeypatch):
    """What an earlier gpu-status run taught about target ``box``'s nvidia-smi."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    known = {"driver": "550.54.15", "cuda": "12.4", "fields": ["name", "memory.used"]}
    (cache / smi_memory.FILE).write_text(json.dumps({"box": dict(known, seen=1.0)}))
    os.chmod(cache / smi_memory.FILE, 0o600)
    monkeypatch.setenv("MLDIAG_CACHE_DIR", str(cache))
    return "--known=" + json.dumps(known, separators=(",", ":"))


def test_gpu_status_sends_the_hosts_files_gpus_and_what_is_remembered_of_the_target(smi_cache):
    assert argv("gpu-status", {}, target("{local: true, gpus: 8}")) == ["--expect-gpus=8",
                                                                        smi_cache]
    assert argv("gpu-status", {}, target()) == [smi_cache]
    assert argv("gpu-status", {"expect-idle": True}, target("{local: true, gpus: 0}")) == \
        ["--expect-idle", "--expect-gpus=0", smi_cache]


def test_node_check_sends_the_expect_block_as_one_json_token_with_sorted_keys():
    on = target("{local: true, expect: {nvlinks_per_gpu: 18, gpus: 8}}")
    assert argv("node-check", {"no-dcgm": True}, on) == \
        ["--no-dcgm", '--expect={"gpus": 8, "nvlinks_per_gpu": 18}']
    assert argv("node-check", {}, target()) == []
    # a Target made in code, not read from a hosts file: its gpus join its expect block last
    made = Target(name="box", local=True, gpus=8, expect=(("nvlinks_per_gpu", 18),))
    assert argv("node-check", {}, made) == ['--expect={"gpus": 8, "nvlinks_per_gpu": 18}']


@pytest.mark.parametrize("values, least", [
    ({}, None), ({"dcgm-level": None}, None), ({"dcgm-level": "1"}, 180.0),
    ({"dcgm-level": "2"}, 660.0), ({"dcgm-level": "3"}, 3660.0),
    ({"dcgm-level": "3", "no-dcgm": True}, None), ({"no-dcgm": True}, None)])
def test_node_checks_least_timeout_is_dcgms_level_and_a_minute(values, least):
    assert registry.get("node-check").least_timeout(values) == least
    on = target()
    assert on.timeout == 300.0
    job = jobs.job_source("node-check", values)(on)
    # none: the target's own (the runtime's default); else the most of the target's and it
    assert job.timeout == (None if least is None else max(least, on.timeout))


def test_stacks_without_upload_is_the_job_as_built():
    job = jobs.job_source("stacks", {"no-upload": True, "pid": "12"})(target())
    assert (job.script_name, list(job.argv), job.follow_up) == ("stacks.py",
                                                                ["--pid=12", "--no-upload"], None)


def test_stacks_checks_pid_and_match_before_anything_connects():
    check = registry.get("stacks").check
    assert check({"pid": "1, 2", "match": "train"}) is None
    with pytest.raises(InputError) as caught:
        check({"pid": "1,x"})
    assert str(caught.value) == "--pid: expected a comma list of process ids, got '1,x'"


def test_env_report_shows_only_what_differs_unless_full():
    options = registry.get("env-report").options
    assert options(execute.Options(), {}).diff is True
    assert options(execute.Options(), {"full": True}).diff is False
    assert options(execute.Options(diff=True), {"full": True}).diff is True
    assert options(execute.Options(host=["box"]), {"full": None}) == execute.Options(host=["box"],
                                                                             diff=True)


# ---------------------------------------------------------------------------- the views

@pytest.mark.parametrize("task, module, renderer", [
    ("gpu-status", "builtin.gpu_status.view", "render_gpus"), ("env-report", "views.render", "render_full"),
    ("node-check", "builtin.node_check.view", "render_actions"),
    ("stacks", "builtin.stacks.run", "render_view")])
def test_a_tasks_view_is_its_renderer_given_the_results_the_stream_and_the_colour(
        monkeypatch, task, module, renderer):
    calls = []
    monkeypatch.setattr(importlib.import_module(f"diagnostics.{module}"), renderer,
                        lambda *args, **kwargs: calls.append((args, kwargs)))
    results, stream = [object()], io.StringIO()
    view = registry.get(task).view
    view(results, stream)
    view(results, stream, color=True)
    assert calls == [((results, stream), {"color": False}), ((results, stream), {"color": True})]


def test_only_these_tasks_have_a_view():
    assert [s.name for s in builtin.BUILTINS if s.view] == ["gpu-status", "env-report",
                                                            "node-check", "stacks"]
