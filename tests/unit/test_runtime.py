"""The target-side runtime, driven for real through the local transport (real processes).

Each test runs a small diagnostic through the same bootstrap → runtime → child path as over
SSH; only the transport differs.
"""

import ast
import glob
import re
import os
import sys
import textwrap
import time

import pytest

from diagnostics import bundle, runner
from diagnostics.hops.ssh import SshPool
from diagnostics.topology import Target
from tests.lab.util import pids_with_marker

SCRIPTS = os.path.join(os.path.dirname(bundle.__file__), "scripts")
PY = sys.executable


def local(**kw):
    return Target(name="local", local=True, python=PY, **kw)


def diag_job(source, argv=(), mode="diagnostic", **kw):
    return bundle.Job("demo", "demo.py", textwrap.dedent(source).encode(), argv=tuple(argv),
                      mode=mode, **kw)


def run(source, argv=(), target=None, **kw):
    return runner.run_one(target or local(), diag_job(source, argv, **kw), SshPool())


def mldiag_tmpdirs():
    return set(glob.glob(os.path.join(os.environ.get("TMPDIR", "/tmp"), "mldiag-*")))


OK = """
def build_parser():
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1)
    return p
def run(args):
    return {"summary": "fine %d" % args.n, "findings": [], "data": {"n": args.n}}
"""


def test_ok_result_has_every_document_field():
    r = run(OK, ["--n", "3"])
    d = r.to_dict()
    assert d["status"] == "ok" and d["summary"] == "fine 3" and d["data"] == {"n": 3}
    assert set(d) == {"schema", "diagnostic", "target", "status", "summary", "findings", "data",
                      "log", "error", "duration_s"}


def test_status_derived_from_worst_finding():
    r = run("""
        import argparse
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            return {"summary": "s", "findings": [{"level": "warn", "code": "a", "message": "m"},
                                                 {"level": "fail", "code": "b", "message": "n"}]}
    """)
    assert r.status == "fail"
    assert [f.code for f in r.findings] == ["a", "b"]


def test_exception_with_empty_message_names_type_and_full_traceback():
    r = run("""
        import argparse
        def build_parser(): return argparse.ArgumentParser()
        def helper():
            raise ValueError()
        def run(args):
            helper()
    """)
    assert r.status == "error" and r.error.layer == "crashed"
    assert r.error.type == "ValueError"
    assert r.error.message == "ValueError()"          # never empty
    assert "demo.py\", line 5, in helper" in r.error.traceback
    assert "in run" in r.error.traceback and r.error.traceback.rstrip().endswith("ValueError")


def test_megabytes_of_noise_do_not_corrupt_the_result():
    r = run("""
        import argparse, sys, os
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            chunk = "noise @@MLDIAG-RESULT-BEGIN 00@@ {" * 1000 + "\\n"
            for _ in range(100):            # ~3.4 MB on stdout and on stderr
                sys.stdout.write(chunk)
                sys.stderr.write(chunk)
            os.write(1, b"\\xff\\xfe not utf-8\\n")
            return {"summary": "survived", "data": {"x": 1}}
    """)
    assert r.status == "ok" and r.summary == "survived" and r.data == {"x": 1}
    stdout_log = [e for e in r.log if e["source"] == "stdout"]
    assert stdout_log and len(stdout_log[0]["message"]) <= 4096


def test_warnings_and_log_records_go_to_log():
    r = run("""
        import argparse, logging, warnings
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            warnings.warn("deprecated thing", DeprecationWarning)
            logging.getLogger("transformers.modeling").warning("slow path for %d layers", 3)
            return {"summary": "ok"}
    """)
    sources = {(e["source"], e["message"].split(" (")[0]) for e in r.log}
    assert ("DeprecationWarning", "deprecated thing") in sources
    assert ("transformers.modeling", "slow path for 3 layers") in sources


def test_logging_imported_late_or_by_a_submodule_is_still_captured_and_unused_costs_nothing():
    r = run("""
        import argparse, sys
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            before = sorted(m for m in ("logging", "runpy") if m in sys.modules)
            import logging.handlers          # the package comes in through its submodule
            logging.getLogger("vllm.engine").error("engine died: %s", "CUDA error")
            logging.getLogger("quiet").info("below WARNING: not kept")
            return {"summary": "ok", "data": {"imported_before": before}}
    """)
    assert r.data["imported_before"] == []    # nothing of ours imported them for the diagnostic
    assert [(e["level"], e["source"], e["message"]) for e in r.log] == [
        ("ERROR", "vllm.engine", "engine died: CUDA error")]


def test_script_runs_as_main_with_its_own_file_and_picklable_classes(tmp_path):
    r = run("""
        import pickle, sys
        class Point:
            pass
        p = pickle.loads(pickle.dumps(Point()))
        print(__name__, __file__.endswith("demo.py"), type(p).__name__, sys.modules["__main__"].Point is Point)
    """, mode="script")
    assert r.status == "ok" and r.data["stdout"] == "__main__ True Point True\n", r.to_dict()


@pytest.mark.parametrize("body, layer, needle", [
    ("import os; os._exit(7)", "crashed", "exited with code 7"),
    ("import sys; sys.exit(3)", "crashed", "sys.exit(3)"),
    ("import ctypes; ctypes.string_at(0)", "killed", "SIGSEGV"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "killed", "SIGKILL"),
])
def test_abnormal_endings_are_classified(body, layer, needle):
    r = run(f"""
        import argparse
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            {body}
    """)
    assert r.status == "error" and r.error.layer == layer
    assert needle in r.error.message


SPAWNER = """
    import argparse, signal, subprocess, sys, time
    def build_parser(): return argparse.ArgumentParser()
    def sleeper(marker, ignore_term=False, setsid=False):
        code = "import signal, time\\n"
        if ignore_term:
            code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        code += "time.sleep(600)\\n"
        argv = [sys.executable, "-c", code, marker]
        return subprocess.Popen((["setsid"] if setsid else []) + argv).pid
    def run(args):
        pids = [sleeper(MARKER, setsid=True), sleeper(MARKER, ignore_term=True)]
        with open(PIDFILE, "w") as f:
            f.write(" ".join(map(str, pids)))
        time.sleep(0.3)   # let both start
        if WAIT:
            time.sleep(600)
        return {"summary": "done early"}
"""


def spawner(tmp_path, wait):
    marker = f"mldiag-test-sleeper-{os.getpid()}-{time.monotonic_ns()}"
    pidfile = tmp_path / "pids"
    src = f"MARKER = {marker!r}\nPIDFILE = {str(pidfile)!r}\nWAIT = {wait!r}\n" + textwrap.dedent(SPAWNER)
    return src, marker, pidfile


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_timeout_kills_every_descendant_including_a_setsid_grandchild(tmp_path):
    src, marker, pidfile = spawner(tmp_path, wait=True)
    before = mldiag_tmpdirs()
    t0 = time.monotonic()
    r = run(src, timeout=1.5)
    elapsed = time.monotonic() - t0
    assert r.status == "error" and r.error.layer == "timeout"
    assert "1.5 s timeout" in r.error.message
    killed = int(re.search(r"killed (\d+) process", r.error.message).group(1))
    assert killed >= 3, r.error.message      # the diagnostic and both sleepers
    assert elapsed < 1.5 + 1.0 + 10, elapsed  # timeout + TERM grace + slack for a loaded machine
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2 and not any(alive(p) for p in pids)
    assert pids_with_marker(marker) == []
    assert mldiag_tmpdirs() - before == set()


def test_grandchild_left_behind_by_a_finished_diagnostic_is_killed(tmp_path):
    src, marker, pidfile = spawner(tmp_path, wait=False)
    r = run(src)
    assert r.status == "ok" and r.summary == "done early"
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2 and not any(alive(p) for p in pids)
    assert pids_with_marker(marker) == []


def test_stdin_closing_kills_the_diagnostic(tmp_path):
    """The client going away (stdin EOF) ends the diagnostic and cleans up."""
    import subprocess
    src, marker, pidfile = spawner(tmp_path, wait=True)
    job = diag_job(src)
    header = bundle.build_header(job, target="local", timeout=600, env={}, activate=[],
                                 python=PY, nonce=bundle.new_nonce())
    before = mldiag_tmpdirs()
    proc = subprocess.Popen(bundle.bootstrap_argv(PY), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(bundle.build_payload(header, bundle.job_files(job)))
    proc.stdin.flush()
    deadline = time.monotonic() + 10
    while len(pids_with_marker(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pids_with_marker(marker)) == 2, "the diagnostic's children never started"
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0
    assert pids_with_marker(marker) == []
    assert mldiag_tmpdirs() - before == set()


def test_temp_dir_is_private_and_removed_unless_kept():
    probe = """
        import argparse, os, stat
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            here = os.environ["MLDIAG_TMPDIR"]
            files = {n: oct(os.stat(os.path.join(here, n)).st_mode & 0o777) for n in os.listdir(here)}
            return {"summary": "probe", "data": {"dir": here, "mode": oct(os.stat(here).st_mode & 0o777),
                                                  "cwd": os.getcwd(), "files": files}}
    """
    r = run(probe)
    assert r.data["mode"] == "0o700"
    assert r.data["cwd"] == r.data["dir"]
    assert r.data["files"]["demo.py"] == "0o600"
    assert not os.path.exists(r.data["dir"])
    kept = run(probe, keep_remote=True)
    try:
        assert os.path.isdir(kept.data["dir"]) and kept.data["remote_tmpdir"] == kept.data["dir"]
    finally:
        import shutil
        shutil.rmtree(kept.data["dir"], ignore_errors=True)


def test_what_the_diagnostic_leaves_in_its_temp_dir_goes_but_symlinks_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("precious")
    r = run(f"""
        import argparse, os
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            here = os.environ["MLDIAG_TMPDIR"]
            os.makedirs(os.path.join(here, "a", "b", "c"))
            with open(os.path.join(here, "a", "b", "c", "ro.bin"), "wb") as f:
                f.write(b"x" * 1000)
            os.chmod(os.path.join(here, "a", "b", "c", "ro.bin"), 0o400)
            os.symlink("{outside}", os.path.join(here, "a", "link-to-dir"))
            os.symlink("{outside}/keep.txt", os.path.join(here, "link-to-file"))
            return {{"summary": "left things", "data": {{"dir": here}}}}
    """)
    assert r.status == "ok", r.to_dict()
    assert not os.path.exists(r.data["dir"])
    assert (outside / "keep.txt").read_text() == "precious"


def test_env_values_reach_the_diagnostic_without_a_command_line():
    r = run("""
        import argparse, os
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            return {"summary": "env", "data": {"v": os.environ.get("HF_HOME")}}
    """, target=local(env=(("HF_HOME", "/dev/shm/hf $(id) `x`"),)))
    assert r.data["v"] == "/dev/shm/hf $(id) `x`"


# ------------------------------------------------------------------ run-script mode

def test_script_mode_argv_stdout_and_exit_code():
    argv = ["a b", "$HOME", "{x}", "'", '"', "", "*", "-c", "l1\nl2", "$(id)", "`id`", ";", "ü", "\\",
            "=ls", "~root", "--json"]
    r = run("""
        import json, sys
        print(json.dumps(sys.argv[1:]))
        sys.stderr.write("to stderr\\n")
        sys.exit(5)
    """, argv, mode="script")
    assert r.status == "fail"
    import json
    assert json.loads(r.data["stdout"]) == argv
    assert r.data["stderr"] == "to stderr\n" and r.data["exit_code"] == 5


def test_script_mode_uncaught_exception_is_fail_with_traceback():
    r = run("""
        class Quiet(Exception):
            pass
        raise Quiet()
    """, mode="script")
    assert r.status == "fail" and r.data["exit_code"] == 1
    assert r.data["exception"]["message"] == "Quiet()"
    assert "raise Quiet()" in r.data["exception"]["traceback"]
    assert "Traceback (most recent call last)" in r.data["stderr"]


def test_script_mode_put_files_sit_beside_the_script():
    job = bundle.Job("run-script", "s.py", b"print(open('patch.diff').read())", mode="script",
                     extra_files={"patch.diff": b"--- a\n+++ b\n"})
    r = runner.run_one(local(), job, SshPool())
    assert r.status == "ok" and r.data["stdout"] == "--- a\n+++ b\n\n"


# ------------------------------------------------------------------ interpreters

def test_missing_interpreter_is_classified():
    r = run(OK, target=Target(name="local", local=True, python="/nonexistent/python3"))
    assert r.error.layer == "interpreter" and "/nonexistent/python3" in r.error.message


def test_interpreter_older_than_3_8_is_classified(tmp_path):
    """A stand-in interpreter that reports 3.6 to stage A (no real 3.6 on this machine)."""
    fake = tmp_path / "python3.6"
    fake.write_text(f"#!/bin/sh\nexec {PY} -c 'import sys; sys.version_info = (3, 6, 15, \"final\", 0); "
                    f"exec(sys.argv[2])' \"$@\"\n")
    fake.chmod(0o755)
    r = run(OK, target=Target(name="local", local=True, python=str(fake)))
    assert r.error.layer == "interpreter"
    assert "Python 3.6.15" in r.error.message and "3.8" in r.error.message


def test_activate_runs_before_the_diagnostic(tmp_path):
    script = tmp_path / "activate.sh"
    script.write_text("MLDIAG_TEST_ACTIVATED=yes; export MLDIAG_TEST_ACTIVATED\n"
                      "mark() { MLDIAG_TEST_MARK=$1; export MLDIAG_TEST_MARK; }\n")
    r = run("""
        import argparse, os
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            return {"summary": "a", "data": {"a": os.environ.get("MLDIAG_TEST_ACTIVATED"),
                                              "m": os.environ.get("MLDIAG_TEST_MARK")}}
    """, target=local(activate=(str(script), "mark", "train")))
    assert r.status == "ok", r.to_dict()
    assert r.data == {"a": "yes", "m": "train"}


def test_failing_activation_is_classified(tmp_path):
    r = run(OK, target=local(activate=(str(tmp_path / "missing.sh"),)))
    assert r.error.layer == "interpreter" and "activation failed" in r.error.message


# ------------------------------------------------------------------ Python 3.8

@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(SCRIPTS, "*.py"))))
def test_remote_side_parses_as_python_3_8(path):
    with open(path) as f:
        ast.parse(f.read(), filename=path, feature_version=(3, 8))


def test_stage_a_parses_as_python_3_0():
    ast.parse(bundle.STAGE_A, feature_version=(3, 4))


def test_env_read_at_interpreter_start_takes_effect(tmp_path):
    """PYTHONPATH (and LD_*) only work in a fresh interpreter: such an env means a spawned child."""
    (tmp_path / "extra_mod.py").write_text("VALUE = 'from PYTHONPATH'\n")
    r = run("""
        import argparse
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            import extra_mod
            return {"summary": extra_mod.VALUE}
    """, target=local(env=(("PYTHONPATH", str(tmp_path)),)))
    assert r.status == "ok", r.to_dict()
    assert r.summary == "from PYTHONPATH"


def test_runtime_and_a_diagnostic_on_a_real_python_3_8():
    from tests.pythons import require_python
    py38 = require_python("3.8")
    r = runner.run_one(Target(name="local", local=True, python=py38),
                       bundle.script_job("ping"), SshPool())
    assert r.status == "ok", r.to_dict()
    assert r.data["python"].startswith("3.8.") and r.data["tmpdir_mode"] == "0o700"
    crashed = run("""
        import argparse
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            raise OSError()
    """, target=Target(name="local", local=True, python=py38))
    assert crashed.error.layer == "crashed" and crashed.error.message == "OSError()"


@pytest.mark.parametrize("version", ["3.6", "2.7"])
def test_real_old_interpreters_are_refused_as_interpreter(version):
    from tests.pythons import require_python
    exe = require_python(version)
    r = runner.run_one(Target(name="local", local=True, python=exe), bundle.script_job("ping"), SshPool())
    assert r.status == "error" and r.error.layer == "interpreter", r.to_dict()
    assert "3.8" in r.error.message
