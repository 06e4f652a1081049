"""node-check's client side (diagnostics/node_check_run.py): bad flags refused before any target
is touched, and --drain/--undrain with no Slurm node among the targets is an error, not a
silent no-op. The target is a real local run of the node-check script (this machine: no GPU)."""

import io
import json
import sys

import pytest

from diagnostics import cli, node_check_run
from diagnostics.errors import EXIT_ERROR, InputError


@pytest.fixture
def hosts(tmp_path):
    """One local target whose interpreter leaves a mark: whether anything ran on it."""
    marker = tmp_path / "ran"
    python = tmp_path / "python-marking"
    python.write_text(f'#!/bin/sh\n: > "{marker}"\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    path = tmp_path / "hosts.yaml"
    path.write_text(f"hosts:\n  here:\n    local: true\n    python: {python}\n")
    return path, marker


def opts(hosts_file, **more):
    return cli.Options(host=["here"], hosts_file=str(hosts_file), **more)


@pytest.mark.parametrize("flags, message", [
    (dict(prom="metrics.txt"), "--prom metrics.txt: the file name must end in .prom"),
    (dict(drain=True, undrain=True), "--drain and --undrain: give one of them"),
])
def test_bad_flags_are_refused_before_the_target_runs(hosts, tmp_path, flags, message):
    path, marker = hosts
    with pytest.raises(InputError) as caught:
        node_check_run.execute(opts(path), {}, out=io.StringIO(), **flags)
    assert str(caught.value).startswith(message)
    assert not marker.exists()
    assert not (tmp_path / "metrics.txt").exists()


def test_a_bad_dcgm_level_is_refused_before_the_target_runs(hosts):
    path, marker = hosts
    with pytest.raises(InputError, match="--dcgm-level: expected 1, 2 or 3, got '7'"):
        node_check_run.execute(opts(path), {"dcgm_level": "7"}, out=io.StringIO())
    assert not marker.exists()


def test_a_file_that_is_not_a_baseline_is_refused_before_the_target_runs(hosts, tmp_path):
    path, marker = hosts
    bad = tmp_path / "baseline.json"
    bad.write_text("[1, 2, 3]\n")
    with pytest.raises(InputError, match="baseline.json"):
        node_check_run.execute(opts(path), {}, baseline=str(bad), out=io.StringIO())
    assert not marker.exists()


def test_drain_with_no_slurm_node_is_an_error_that_keeps_the_results(hosts):
    path, marker = hosts
    out = io.StringIO()
    outcome = node_check_run.execute(opts(path, json=True), {"no_dcgm": True}, drain=True, out=out)
    assert marker.exists()                               # the node was checked ...
    docs = json.loads(out.getvalue())
    assert [d["target"] for d in docs] == ["here"] and docs[0]["status"] != "error", docs
    assert outcome.exit_code == EXIT_ERROR               # ... but the drain asked for did not happen
    assert outcome.messages[-1] == "--drain/--undrain: no Slurm node was checked"


def test_without_drain_flags_a_run_with_no_slurm_node_says_nothing_of_slurm(hosts):
    path, _ = hosts
    out = io.StringIO()
    outcome = node_check_run.execute(opts(path, no_color=True), {"no_dcgm": True}, out=out)
    assert "Slurm" not in out.getvalue()
    assert out.getvalue().splitlines()[1].split()[0] == "here", out.getvalue()
    assert outcome.exit_code < EXIT_ERROR and not outcome.messages
