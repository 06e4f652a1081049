"""The client parses our own diagnostics' arguments (bundle.parsed_args), so a target never
imports argparse or builds a parser; anything the client's parse cannot vouch for is left to the
target exactly as before."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from diagnostics import builtin
from diagnostics.engine import bundle, runner
from diagnostics.transport.ssh import SshPool
from diagnostics.inventory.topology import Target
from tests.programs import space_free_python

SCRIPTS = bundle.SCRIPTS_DIR

LAZY = """
import sys
def build_parser():
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--names", default="a,b", type=%s)
    return p
def run(args):
    return {"summary": "n=%%d" %% args.n, "findings": [],
            "data": {"argparse_loaded": "argparse" in sys.modules, "args": dict(vars(args))}}
"""
KEEP_TEXT = LAZY % "str"
MAKE_TUPLE = LAZY % "lambda s: tuple(s.split(','))"   # JSON would bring a list back


def job(source, argv, own_code):
    return bundle.Job("demo", "demo.py", textwrap.dedent(source).encode(), argv=tuple(argv),
                      own_code=own_code)


def header_of(j):
    return bundle.build_header(j, target="t", timeout=30, env={}, activate=[], python="python3",
                               nonce="n")


def run_local(j):
    return runner.run_one(Target(name="local", local=True, python=space_free_python()), j, SshPool())


pytestmark = pytest.mark.usefixtures("private_tmpdir")     # tests/unit/conftest.py


def test_own_diagnostic_gets_the_clients_parse_and_the_target_never_imports_argparse():
    argv = ["--n", "5", "--names=x,y"]
    ours = run_local(job(KEEP_TEXT, argv, own_code=True))
    theirs = run_local(job(KEEP_TEXT, argv, own_code=False))   # a user's code: the target parses
    assert ours.status == theirs.status == "ok", (ours.error, theirs.error)
    assert ours.data["argparse_loaded"] is False
    assert theirs.data["argparse_loaded"] is True
    assert ours.data["args"] == theirs.data["args"] == {"n": 5, "names": "x,y"}
    assert header_of(job(KEEP_TEXT, argv, own_code=True))["args"] == {"n": 5, "names": "x,y"}
    assert "args" not in header_of(job(KEEP_TEXT, argv, own_code=False))


def test_argv_the_parser_refuses_is_left_to_the_target_and_the_client_prints_nothing(capfd):
    j = job(KEEP_TEXT, ["--n", "five"], own_code=True)
    assert "args" not in header_of(j)
    assert capfd.readouterr() == ("", "")          # argparse's usage lines stayed inside
    r = run_local(j)
    assert r.status == "error"
    assert "sys.exit(2)" in r.error.message        # the target's own parse said no, as before


def test_values_json_would_not_bring_back_unchanged_are_parsed_on_the_target():
    j = job(MAKE_TUPLE, ["--names=x,y"], own_code=True)
    assert "args" not in header_of(j)
    r = run_local(j)
    assert r.status == "ok" and r.data["argparse_loaded"] is True
    assert r.data["args"]["names"] == ["x", "y"]


# argv for every task of ours (the required flags of check-attn, extract-smoke, scan-log, and
# a few values of each kind)
SAMPLE_ARGV = {
    "ping": [],
    "gpu-status": ["--expect-gpus=8", "--timeout", "7.5", "--nvml", "off"],
    "check-attn": ["--model", "/models/llama"],
    "env-report": ["--imports", "torch,numpy"],
    "extract-smoke": ["--model", "/models/llama", "--samples", "2", "--dtype", "bfloat16"],
    "node-check": ["--expect", '{"gpus": 8}', "--dcgm-level", "2"],
    "stacks": ["--pid", "42,43"],
    "scan-log": ["--path", "/var/log/kern.log"],
    "nccl-check": ["--op", "all_gather", "--ranks", "4", "--expect-busbw=431", "--budget", "60"],
    "gpu-perf": ["--tier", "standard", "--budget", "60", "--expect-gemm=700", "--device", "cpu"],
    "nccl-ras": ["--addr", "127.0.0.1:28028", "--timeout", "5", "--verbose", "--format", "text"],
    "step-times": ["--log", "/logs/r0.log", "--log", "/logs/r1.log", "--format", "megatron", "--last", "50"],
}


def test_every_task_has_a_sample():
    assert set(SAMPLE_ARGV) == set(builtin.REGISTRY)


def test_a_fresh_client_parses_every_task_without_its_import_path():
    """In a process that never loaded a script (the CLI's case; a test process has loaded
    _remote.py long before), each script's ``import _remote`` is answered by scripts/_remote.py
    for this parse alone: every task's argv is parsed on the client, and the process is left
    with no module named ``_remote`` and no scripts directory on its path."""
    code = textwrap.dedent(f"""
        import json, sys
        from diagnostics.builtin import BUILTIN
        from diagnostics.engine import bundle, registry
        registry.use(BUILTIN)
        samples = json.loads(sys.argv[1])
        parsed = {{task: bundle.build_header(bundle.script_job(task, argv), target="t", timeout=30, env={{}},
                                            activate=[], python="python3", nonce="n").get("args") is not None
                  for task, argv in samples.items()}}
        print(json.dumps([parsed, "_remote" in sys.modules, bundle.SCRIPTS_DIR in sys.path]))
    """)
    p = subprocess.run([sys.executable, "-c", code, json.dumps(SAMPLE_ARGV)], capture_output=True, text=True,
                       timeout=120, cwd="/")
    assert p.returncode == 0, p.stderr
    parsed, remote_loaded, on_path = json.loads(p.stdout)
    assert parsed == {task: True for task in SAMPLE_ARGV}
    assert not remote_loaded and not on_path


@pytest.mark.parametrize("task", sorted(SAMPLE_ARGV))
def test_the_clients_parse_is_what_the_script_parses_on_another_machine(task, tmp_path):
    """The client's answer stands in for the target's, so no parser of ours may read the
    machine it runs on: the script parses the same argv in another interpreter (the system
    python3, as a target has), another directory, a bare environment and a narrow terminal."""
    j = bundle.script_job(task, SAMPLE_ARGV[task])
    args = header_of(j).get("args")
    assert args is not None, f"{task}: the client could not parse {SAMPLE_ARGV[task]}"
    there = subprocess.run(
        ["python3", "-c", "import json, sys; sys.path.insert(0, sys.argv[1]); "
                          "m = __import__(sys.argv[2]); "
                          "print(json.dumps(vars(m.build_parser().parse_args(sys.argv[3:]))))",
         SCRIPTS, j.script_name[:-3], *SAMPLE_ARGV[task]],
        cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "30",
                           "LANG": "C"},
        capture_output=True, text=True, timeout=60)
    assert there.returncode == 0, there.stderr
    assert json.loads(there.stdout) == args


def test_our_hot_diagnostics_import_argparse_only_to_build_a_parser():
    """gpu-status, ping, node-check and stacks run on every target of a fleet: with the
    client's parse, their module body must not import argparse (~2 ms and gettext with it)."""
    for name in ("gpu_status", "ping", "node_check", "stacks"):
        code = (f"import sys; sys.path.insert(0, {SCRIPTS!r}); import {name}; "
                "print('argparse' in sys.modules)")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"), timeout=60)
        assert out.stdout.strip() == "False", (name, out.stderr)


def test_a_fan_outs_threads_parse_one_argv_once(tmp_path):
    """Every target's header is built at once in the fan-out's threads: one of them parses,
    the others wait for its answer (a slow parser makes a second parse certain without that)."""
    import threading
    log = tmp_path / "builds"
    source = f"""
import time
def build_parser():
    import argparse
    with open({str(log)!r}, "a") as f:
        f.write("built\\n")
    time.sleep(0.2)
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1)
    return p
def run(args):
    return {{"summary": "n", "findings": [], "data": {{}}}}
"""
    j = job(source, ["--n", "3"], own_code=True)
    headers = []
    threads = [threading.Thread(target=lambda: headers.append(header_of(j))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [h["args"] for h in headers] == [{"n": 3}] * 8
    assert log.read_text() == "built\n"


def test_help_in_argv_prints_nothing_here_and_is_left_to_the_target(capfd):
    j = job(KEEP_TEXT, ["--help"], own_code=True)
    assert "args" not in header_of(j)
    assert capfd.readouterr() == ("", "")
