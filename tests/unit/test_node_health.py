"""mldiag-node-health's own rules (builtin/node_check/here.py, cli/node_health.py): the mode and
node slurmd gives, the budget's split, bad input, and what it imports. slurmd running it on a
real cluster is tests/integration/test_node_health.py."""

import json
import os
import subprocess
import sys

import pytest

from diagnostics.builtin.node_check import here
from diagnostics.cli import node_health
from diagnostics.core.errors import InputError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("context, mode", [
    ("prolog_slurmd", "prolog"), ("epilog_slurmd", "epilog"), (None, "health"),
    # slurmctld's own prolog runs on the controller, not on the node: a health check there
    ("prolog_slurmctld", "health"), ("", "health")])
def test_the_mode_is_what_slurmd_says(context, mode):
    env = {"SLURMD_NODENAME": "n1"} if context is None else {"SLURM_SCRIPT_CONTEXT": context}
    assert here.mode_of(env) == mode


def test_the_node_is_slurmds_name_else_the_short_host_name():
    assert here.node_of({"SLURMD_NODENAME": "gpu-017"}, "ignored.example") == "gpu-017"
    assert here.node_of({}, "gpu-018.cluster.example") == "gpu-018"
    for bad in ("gpu 1", "-x", "a;b", "n1\nNodeName=n2"):
        with pytest.raises(InputError, match="not a plain Slurm node name"):
            here.node_of({"SLURMD_NODENAME": bad})


@pytest.mark.parametrize("budget", [10.0, 30.0, 60.0, 300.0])
def test_the_budget_keeps_a_reserve_for_slurm_and_the_script_ends_before_its_job(budget):
    job, script = here.split_budget(budget)
    reserve = budget - job
    assert reserve >= here.MIN_RESERVE and reserve >= here.RESERVE_SHARE * budget - 1e-9
    assert script == job - here.STARTUP_S and script > 0
    # each tool call of the script then gets a sixth of its budget, at most the default 10 s
    tool = _tool_timeout(script)
    assert tool <= script / 6 + 1e-9 or tool == 1.0
    assert tool <= 10.0


def _tool_timeout(budget):
    sys.path.insert(0, os.path.join(REPO, "diagnostics", "scripts"))
    try:
        import node_check
    finally:
        sys.path.pop(0)
    return node_check.tool_timeout_for(None, budget)


def test_the_scripts_tool_timeout_follows_a_budget_only_when_no_timeout_is_given():
    assert _tool_timeout(30.0) == 5.0
    assert _tool_timeout(120.0) == 10.0
    assert _tool_timeout(3.0) == 1.0
    sys.path.insert(0, os.path.join(REPO, "diagnostics", "scripts"))
    try:
        import node_check
    finally:
        sys.path.pop(0)
    assert node_check.tool_timeout_for(7.0, 30.0) == 7.0
    assert node_check.tool_timeout_for(None, None) == node_check.DEFAULT_TOOL_TIMEOUT


@pytest.mark.parametrize("settings, message", [
    (here.Settings(mode="cron", node="n1"), "--mode"),
    (here.Settings(mode="health", node="n1", budget=5), "--budget: at least 10"),
    (here.Settings(mode="health", node="n1", prom="/tmp/x.txt"), ".prom"),
])
def test_bad_settings_are_refused_before_anything_runs(settings, message):
    with pytest.raises(InputError, match=message):
        here.check_settings(settings)


@pytest.mark.parametrize("text, message", [
    ("[8]", "a JSON object"), ('{"gpu": 8}', "unknown key 'gpu'"),
    ('{"gpus": -1}', "non-negative"), ('{"gpus": true}', "non-negative"), ("{", "not JSON")])
def test_a_bad_expect_is_bad_input(text, message):
    with pytest.raises(node_health.argparse.ArgumentTypeError, match=message):
        node_health.parse_expect(text)


def _main(args, env):
    """The console script in a process of its own, as slurmd starts it: this environment only."""
    code = "from diagnostics.cli.node_health import run; run()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={"PYTHONPATH": REPO, **env}, timeout=60)


def test_bad_input_is_exit_4_in_a_health_check_and_0_in_a_prolog():
    """A prolog that fails drains the node: a typo in a wrapper copied to every node must not
    drain the cluster, so only a finding makes a prolog fail."""
    health = _main(["--budget", "nope"], {"SLURMD_NODENAME": "n1"})
    assert health.returncode == 4 and "--budget" in health.stderr, health.stderr
    prolog = _main(["--budget", "nope"], {"SLURMD_NODENAME": "n1", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd"})
    assert prolog.returncode == 0 and "--budget" in prolog.stderr, prolog.stderr
    low = _main(["--budget", "3"], {"SLURM_SCRIPT_CONTEXT": "epilog_slurmd", "SLURMD_NODENAME": "n1"})
    assert low.returncode == 0 and "at least 10" in low.stderr


def test_it_runs_without_path_home_or_slurm_conf_and_imports_no_invoke_fabric_or_paramiko(tmp_path):
    """slurmd's environment for a health check is SLURMD_NODENAME alone. The check runs (the
    local transport, python3 found on the default path); scontrol, with no cluster here, fails
    and says so (exit 3). Nothing of the SSH side is imported."""
    probe = ("import sys, json\n"
             "from diagnostics.cli import node_health\n"
             "code = node_health.main(['--dry-run', '--budget', '20', '--prom', sys.argv[1]])\n"
             "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'invoke', 'fabric', 'paramiko', 'cryptography'})\n"
             "print(json.dumps({'code': code, 'heavy': heavy}))\n")
    prom = tmp_path / "node.prom"
    run = subprocess.run([sys.executable, "-c", probe, str(prom)], capture_output=True, text=True,
                         env={"PYTHONPATH": REPO, "SLURMD_NODENAME": "n7"}, timeout=60)
    last = json.loads(run.stdout.strip().splitlines()[-1])
    assert last["heavy"] == [], last
    assert last["code"] == 3, run.stdout + run.stderr
    assert "n7 " in run.stdout and "Slurm:" in run.stdout
    assert "cannot read the node's Slurm state on n7" in run.stdout
    assert "nothing to drain or resume" not in run.stdout   # a failed read is not "nothing to do"
    assert 'mldiag_node_check_status{target="n7"' in prom.read_text()


def test_node_checks_own_flags_come_from_its_spec_in_the_registry():
    """One place: the flags node-check sends to the node are this command's too (less --budget,
    which here is the whole run's); a value reaches the node-check job as the task's would."""
    from diagnostics.builtin import BUILTIN
    from diagnostics.engine import jobs, registry
    from diagnostics.inventory.targets import Target
    registry.use(BUILTIN)
    sent = [a.name for a in BUILTIN.specs["node-check"].args if not a.client]
    assert [a.name for a in here.forwarded_args()] == [n for n in sent if n != "budget"]
    assert {"kernel-log-file", "since", "dcgm-level", "no-dcgm"} <= set(sent)
    args = node_health.build_parser().parse_args(["--since", "2h", "--no-dcgm", "--node", "n1"])
    settings = here.settings_from(args, env={})
    assert dict(settings.values) == {"since": "2h", "no-dcgm": True}
    job = jobs.job_source("node-check", {**settings.values, "budget": "20"})(Target(name="n1", local=True))
    assert {"--since=2h", "--no-dcgm", "--budget=20"} <= set(job.argv)
    with pytest.raises(node_health.BadInput, match="--dcgm-level"):
        node_health.build_parser().parse_args(["--dcgm-level", "4"])
