"""The target-side runtime, driven for real through the local transport (real processes).

Each test runs a small diagnostic through the same bootstrap → runtime → child path as over
SSH; only the transport differs.
"""

import ast
import glob
import re
import os
import shlex
import sys
import textwrap
import time

import pytest

from diagnostics.core.paths import SCRIPTS_DIR
from diagnostics.engine import bundle, runner
from diagnostics.transport.ssh import SshPool
from diagnostics.inventory.topology import Target
from tests.lab.util import pids_with_marker
from tests.programs import load_script, space_free_python

SCRIPTS = SCRIPTS_DIR
PY = sys.executable


def local(**kw):
    return Target(name="local", local=True, python=space_free_python(), **kw)


def diag_job(source, argv=(), mode="diagnostic", **kw):
    return bundle.Job("demo", "demo.py", textwrap.dedent(source).encode(), argv=tuple(argv),
                      mode=mode, **kw)


def run(source, argv=(), target=None, **kw):
    return runner.run_one(target or local(), diag_job(source, argv, **kw), SshPool())


pytestmark = pytest.mark.usefixtures("private_tmpdir")     # tests/unit/conftest.py


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
            sys.stdout.write("FIRST LINE\\n")
            chunk = "noise @@MLDIAG-RESULT-BEGIN 00@@ {" * 1000 + "\\n"
            for _ in range(100):            # ~3.4 MB on stdout and on stderr
                sys.stdout.write(chunk)
                sys.stderr.write(chunk)
            os.write(1, b"\\xff\\xfe not utf-8\\n")
            return {"summary": "survived", "data": {"x": 1}}
    """)
    assert r.status == "ok" and r.summary == "survived" and r.data == {"x": 1}
    stdout_log = [e for e in r.log if e["source"] == "stdout"]
    message = stdout_log[0]["message"]
    assert len(message) <= 4096          # bounded, and both ends kept: the first line and the last
    assert message.startswith("FIRST LINE\n") and message.endswith(" not utf-8\n")
    assert "characters not kept" in message


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
    fake.write_text(f"#!/bin/sh\nexec {shlex.quote(PY)} -c 'import sys; sys.version_info = (3, 6, 15, \"final\", 0); "
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


# ------------------------------------------------------------------ fork-hoppers (issue 10 item 14)

# A descendant that never stays put: it leaves its session (setsid), then forever forks a child
# and exits, the child waiting 0.5 ms before doing the same (so each pid lives about a
# millisecond). With EVERY_GENERATION each child also starts a session of its own, so no process
# group holds the lineage. It stops by itself after LIFETIME_S, so a failing test cannot leave
# it running on the machine.
HOPPER = r"""
import os, sys, time
every_generation, until = sys.argv[2] == "1", time.time() + float(sys.argv[3])
os.setsid()
while time.time() < until:
    if os.fork():
        os._exit(0)
    if every_generation:
        os.setsid()
    time.sleep(0.0005)
"""
HOPPER_LIFETIME_S = 20

HOPPER_DIAGNOSTIC = """
    import argparse, subprocess, sys, time
    def build_parser():
        p = argparse.ArgumentParser()
        for name in ("marker", "every_generation", "lifetime", "hopper"):
            p.add_argument(name)
        return p
    def run(args):
        subprocess.Popen([sys.executable, "-c", args.hopper, args.marker, args.every_generation,
                          args.lifetime])
        time.sleep(0.3)      # hopping by now
        return {"summary": "left a fork-hopper behind"}
"""


def survivors(marker, scans=20):
    """Processes with ``marker`` seen in any of several /proc scans over ~0.2 s: one scan can miss
    a hopper between two pids, a live one shows up in the next."""
    seen = set()
    for _ in range(scans):
        seen.update(pids_with_marker(marker))
        time.sleep(0.01)
    return sorted(seen)


@pytest.mark.parametrize("every_generation", [False, True], ids=["setsid-once", "setsid-every-fork"])
def test_a_fork_hopping_descendant_is_killed_every_time(every_generation):
    left = []
    for attempt in range(10):
        marker = f"mldiag-test-hopper-{os.getpid()}-{time.monotonic_ns()}"
        r = run(HOPPER_DIAGNOSTIC, [marker, "1" if every_generation else "0", str(HOPPER_LIFETIME_S),
                                    HOPPER])
        assert r.status == "ok" and r.summary == "left a fork-hopper behind", r.to_dict()
        if survivors(marker):
            left.append(attempt)
    assert left == [], f"a fork-hopper survived in runs {left} of 10"


# ------------------------------------------------------------------ the private temp dir (issue 10 item 2)

def load_runtime():
    """_runtime.py as a module (it is a plain script: importing it only defines things)."""
    return load_script("_runtime.py", "mldiag_runtime_under_test")


@pytest.fixture
def rt():
    return load_runtime()


@pytest.fixture
def outside(tmp_path):
    """A directory of files that must survive whatever a removal meets."""
    d = tmp_path / "outside"
    (d / "sub").mkdir(parents=True)
    (d / "precious.txt").write_text("precious")
    (d / "sub" / "deep.txt").write_text("deep")
    return d


def outside_intact(d):
    return ((d / "precious.txt").read_text() == "precious" and (d / "sub" / "deep.txt").read_text() == "deep"
            and sorted(os.listdir(d)) == ["precious.txt", "sub"])


def build_tree(top, outside):
    """Nested dirs, read-only files, a read-only dir, a fifo and symlinks leading out of the tree."""
    (top / "a" / "b" / "c").mkdir(parents=True)
    for rel in ("f.txt", "a/g.txt", "a/b/c/ro.bin"):
        (top / rel).write_bytes(b"x" * 100)
    os.chmod(top / "a" / "b" / "c" / "ro.bin", 0o400)
    (top / "ro-dir").mkdir()
    (top / "ro-dir" / "inside.txt").write_text("x")
    os.chmod(top / "ro-dir", 0o500)
    os.mkfifo(top / "a" / "fifo")
    os.symlink(outside, top / "link-to-dir")
    os.symlink(outside / "precious.txt", top / "a" / "b" / "link-to-file")
    os.symlink("/nonexistent", top / "dangling")
    (top / "victim").mkdir()
    (top / "victim" / "v.txt").write_text("ours")


def test_fd_removal_empties_a_tree_without_following_symlinks(rt, tmp_path, outside):
    top = tmp_path / "tree"
    top.mkdir()
    build_tree(top, outside)
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert rt.remove_contents(fd) == 0
    finally:
        os.close(fd)
    assert os.listdir(top) == []
    assert outside_intact(outside)


def _remove_racing_a_swap(rt, tmp_path, outside, monkeypatch, put_in_place):
    """remove_contents over a tree whose `victim` directory, between being listed and being
    opened, is moved away and replaced by ``put_in_place(path)``: (what was left, the tree)."""
    top = tmp_path / "tree"
    top.mkdir()
    build_tree(top, outside)
    real_open, swapped = os.open, []

    def open_after_a_swap(path, flags, *args, **kw):
        if path == "victim" and not swapped:
            os.rename(top / "victim", tmp_path / "moved-away")
            put_in_place(top / "victim")
            swapped.append(True)
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(rt.os, "open", open_after_a_swap)
    fd = real_open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        left = rt.remove_contents(fd)
    finally:
        os.close(fd)
    monkeypatch.undo()
    assert swapped
    return left, top


def test_fd_removal_meets_a_directory_swapped_for_a_symlink_mid_way(rt, tmp_path, outside, monkeypatch):
    """Between listing `victim` as a directory and opening it, another process moves it away and
    puts a symlink to `outside` in its place: the link is removed, never what it points to."""
    left, top = _remove_racing_a_swap(rt, tmp_path, outside, monkeypatch,
                                      lambda victim: os.symlink(outside, victim))
    assert left == 0
    assert os.listdir(top) == []
    assert outside_intact(outside)
    assert (tmp_path / "moved-away" / "v.txt").read_text() == "ours"   # out of our tree: not ours to touch


def test_fd_removal_meets_a_directory_swapped_for_another_directory(rt, tmp_path, outside, monkeypatch):
    """The same race with a real directory put in place (a bind of `outside` would look so): it is
    not the one listed (device and inode differ), so it is not entered."""
    left, top = _remove_racing_a_swap(rt, tmp_path, outside, monkeypatch,
                                      lambda victim: os.rename(outside, victim))
    assert left == 1
    assert os.listdir(top) == ["victim"] and outside_intact(top / "victim")


def test_fd_removal_does_not_enter_another_file_system_mounted_inside(rt, tmp_path):
    """A diagnostic that mounted something in its temp dir and left it: never emptied (as
    systemd-tmpfiles stops at mount points); the mount point is counted as not removed."""
    import subprocess
    top = tmp_path / "tree"
    (top / "mnt").mkdir(parents=True)
    (top / "plain.txt").write_text("x")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(top / "mnt")], check=True)
    try:
        (top / "mnt" / "on-the-mount.txt").write_text("keep")
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert rt.remove_contents(fd) == 1
        finally:
            os.close(fd)
        assert os.listdir(top) == ["mnt"] and (top / "mnt" / "on-the-mount.txt").read_text() == "keep"
    finally:
        subprocess.run(["umount", "-l", str(top / "mnt")], check=False)


def test_private_dir_swapped_for_a_symlink_whole_is_emptied_where_it_went(rt, tmp_path, outside):
    """The private dir itself renamed and replaced by a symlink (what a user who can write the
    parent would do): its files are removed through the fd held since creation, the symlink and
    the directory it points to are left alone, and the run says so."""
    parent = tmp_path / "parent"
    parent.mkdir(mode=0o700)
    private = rt.PrivateDir.create(str(parent))
    assert oct(os.stat(private.path).st_mode & 0o777) == "0o700"
    private.write("demo.py", b"print(1)\n")
    os.makedirs(os.path.join(private.path, "sub", "dir"))     # what a diagnostic may leave
    private.write("data.bin", b"\0" * 10)
    moved = tmp_path / "moved"
    os.rename(private.path, moved)
    os.symlink(outside, private.path)
    notes = private.remove()
    assert outside_intact(outside)
    assert os.path.islink(private.path)
    assert os.listdir(moved) == []
    assert len(notes) == 1 and "moved or replaced" in notes[0] and private.path in notes[0]


def test_private_dir_files_are_0600_and_never_written_through_a_symlink(rt, tmp_path, outside):
    parent = tmp_path / "parent"
    parent.mkdir(mode=0o700)
    private = rt.PrivateDir.create(str(parent))
    try:
        private.write("b.txt", b"data")
        assert oct(os.stat(os.path.join(private.path, "b.txt")).st_mode & 0o777) == "0o600"
        with pytest.raises(FileExistsError):
            private.write("b.txt", b"again")
        os.symlink(outside / "precious.txt", os.path.join(private.path, "planted"))
        os.symlink(outside / "new.txt", os.path.join(private.path, "dangling"))
        with pytest.raises(OSError):
            private.write("planted", b"overwritten")
        with pytest.raises(OSError):
            private.write("dangling", b"created through the link")
        for bad in ("/etc/x", "../x", "a/b", "", ".", "..", "planted-dir/new.txt"):
            with pytest.raises(ValueError):
                private.write(bad, b"")
        assert outside_intact(outside)
    finally:
        assert private.remove() == []
    assert not os.path.lexists(private.path)


@pytest.mark.parametrize("mode, owner, refused", [
    (0o777, 0, "writable by every user without the sticky bit (mode 0777)"),
    (0o770, 0, "writable by group"),
    (0o1777, 0, None),
    (0o1770, 0, None),
    (0o755, 0, None),
    (0o700, 0, None),
    (0o1777, 65534, "owned by uid 65534"),
])
def test_temp_parent_others_could_change_is_refused(rt, tmp_path, mode, owner, refused):
    parent = tmp_path / "parent"
    parent.mkdir()
    os.chmod(parent, mode)
    os.chown(parent, owner, -1)
    if refused:
        with pytest.raises(rt.UnsafeTempParent) as e:
            rt.PrivateDir.create(str(parent))
        assert str(parent) in str(e.value) and refused in str(e.value)
        assert os.listdir(parent) == []
    else:
        private = rt.PrivateDir.create(str(parent))
        assert os.path.dirname(private.path) == str(parent)
        assert private.remove() == [] and os.listdir(parent) == []


def test_temp_parent_through_a_symlink_is_judged_by_what_it_leads_to(rt, tmp_path):
    """A symlinked parent is followed (as mkdtemp and OpenSSH do: /tmp is a symlink on some
    systems), and the directory reached is the one checked."""
    safe, unsafe = tmp_path / "safe", tmp_path / "unsafe"
    safe.mkdir(mode=0o1777)
    os.chmod(safe, 0o1777)
    unsafe.mkdir()
    os.chmod(unsafe, 0o777)
    os.symlink(safe, tmp_path / "to-safe")
    os.symlink(unsafe, tmp_path / "to-unsafe")
    private = rt.PrivateDir.create(str(tmp_path / "to-safe"))
    assert os.listdir(safe) == [private.name]
    assert private.remove() == []
    with pytest.raises(rt.UnsafeTempParent):
        rt.PrivateDir.create(str(tmp_path / "to-unsafe"))
    assert os.listdir(unsafe) == []


def test_unsafe_tmpdir_is_an_upload_error_naming_the_directory(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    r = run(OK, target=local(tmpdir=str(shared)))
    assert r.status == "error" and r.error.layer == "upload", r.to_dict()
    assert r.error.type == "UnsafeTempParent"
    assert str(shared) in r.error.message and "sticky bit" in r.error.message
    assert os.listdir(shared) == []
    os.chmod(shared, 0o1777)
    r = run(OK, target=local(tmpdir=str(shared)))
    assert r.status == "ok", r.to_dict()
    assert os.listdir(shared) == []


def test_unsafe_tmpdir_from_the_environment_is_refused_too(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("TMPDIR", str(shared))
    r = run(OK)
    assert r.status == "error" and r.error.layer == "upload" and str(shared) in r.error.message
    assert os.listdir(shared) == []


def test_a_diagnostic_that_swaps_its_own_dir_for_a_symlink_removes_nothing_outside(tmp_path, outside):
    """Through the real runtime: the private dir is renamed and a symlink planted in its place
    while the diagnostic runs (here the diagnostic does it itself); the result is intact and says
    what happened, the link's target is untouched."""
    parent = tmp_path / "parent"
    parent.mkdir(mode=0o700)
    r = run(f"""
        import argparse, os
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            here = os.environ["MLDIAG_TMPDIR"]
            os.rename(here, "{tmp_path}/moved")
            os.symlink("{outside}", here)
            return {{"summary": "swapped", "data": {{"dir": here}}}}
    """, target=local(tmpdir=str(parent)))
    assert r.status == "ok" and r.summary == "swapped", r.to_dict()
    assert outside_intact(outside)
    assert os.path.islink(r.data["dir"]) and os.listdir(tmp_path / "moved") == []
    assert [e["source"] for e in r.log] == ["mldiag-runtime"] and "moved or replaced" in r.log[0]["message"]


# ------------------------------------------------------------------ secrets on the target (issue 10 item 3)

SECRET_PROBE = """
    import argparse, os
    def build_parser(): return argparse.ArgumentParser()
    def run(args):
        here = os.environ["MLDIAG_TMPDIR"]
        holding = []
        for root, dirs, files in os.walk(here):
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    if os.environ["HF_TOKEN"].encode() in f.read():
                        holding.append(name)
        return {"summary": "probed", "data": {"dir": here, "files": sorted(os.listdir(here)),
                "holding": holding, "token_ok": os.environ["HF_TOKEN"].startswith("hf_"),
                "echo": os.environ["HF_TOKEN"]}}
"""


@pytest.mark.parametrize("spawn_env", [
    (("PYTHONDONTWRITEBYTECODE", "1"),),   # an interpreter-start variable: a spawned child
    (),                                     # a forked child
], ids=["spawned", "forked"])
def test_env_secrets_never_reach_a_file_on_the_target_and_keep_remote_keeps_none(spawn_env):
    import shutil
    token = f"hf_{os.getpid()}{time.monotonic_ns()}secret"
    r = run(SECRET_PROBE, keep_remote=True, target=local(env=(("HF_TOKEN", token),) + spawn_env))
    kept = r.data["remote_tmpdir"]
    try:
        assert r.status == "ok" and r.data["token_ok"], r.to_dict()
        assert r.data["holding"] == []              # not on disk while it ran
        assert ".mldiag-header.json" not in r.data["files"]
        for root, dirs, files in os.walk(kept):     # nor after: no header, no result file
            for name in files:
                with open(os.path.join(root, name), "rb") as f:
                    assert token.encode() not in f.read(), name
        assert sorted(os.listdir(kept)) == sorted(
            ["demo.py"] + ([".mldiag-runtime.py"] if spawn_env else []))
    finally:
        shutil.rmtree(kept, ignore_errors=True)


def test_activate_child_gets_env_from_its_environment_not_a_file(tmp_path):
    import shutil
    script = tmp_path / "activate.sh"
    script.write_text("true\n")
    token = f"hf_{os.getpid()}{time.monotonic_ns()}secret"
    r = run(SECRET_PROBE, keep_remote=True,
            target=local(env=(("HF_TOKEN", token),), activate=(str(script),)))
    try:
        assert r.status == "ok" and r.data["token_ok"] and r.data["holding"] == [], r.to_dict()
        assert sorted(os.listdir(r.data["remote_tmpdir"])) == [".mldiag-runtime.py", "demo.py"]
    finally:
        shutil.rmtree(r.data["remote_tmpdir"], ignore_errors=True)


def test_a_diagnostic_that_closes_every_fd_still_reports_its_result(tmp_path):
    """The result goes in through the private dir's fd; a diagnostic that closed every fd and
    opened another directory under the same number still gets its result home, and nothing is
    written into that other directory."""
    other = tmp_path / "other"
    other.mkdir()
    r = run(f"""
        import argparse, os
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            os.closerange(3, 1024)
            fds = [os.open("{other}", os.O_RDONLY | os.O_DIRECTORY) for _ in range(8)]
            return {{"summary": "closed them all", "data": {{"fds": fds}}}}
    """)
    assert r.status == "ok" and r.summary == "closed them all", r.to_dict()
    assert os.listdir(other) == []


def test_kill_loop_gives_up_after_its_limit_and_the_result_names_what_is_left(rt, monkeypatch):
    """A descendant SIGKILL cannot end (stuck in the kernel, state D; simulated here by a kill
    that skips it): the loop stops after KILL_LIMIT_S instead of spinning forever, returns the
    pid, and the result carries a warning that names it."""
    import subprocess
    stuck = subprocess.Popen(["sleep", "60"])
    real_kill = os.kill
    monkeypatch.setattr(rt.os, "kill", lambda pid, sig: None if pid == stuck.pid else real_kill(pid, sig))
    monkeypatch.setattr(rt, "KILL_LIMIT_S", 0.3)
    try:
        killed, left = rt.kill_tree(stuck.pid, 0)
    finally:
        monkeypatch.undo()
        stuck.kill()
        stuck.wait()
    assert left == [stuck.pid] and killed >= 1
    run_ = {"ended": "exited", "status": 0, "outcome": {"doc": {"summary": "fine"}, "log": []},
            "out": rt.BoundedCapture(100), "err": rt.BoundedCapture(100), "killed": killed, "left": left,
            "timeout": 60}
    result = rt.compose({"mode": "diagnostic"}, run_, time.time())
    assert result["status"] == "ok" and result["summary"] == "fine"
    assert [(e["level"], e["source"]) for e in result["log"]] == [("WARNING", "mldiag-runtime")]
    assert f"pids {stuck.pid}" in result["log"][0]["message"] and "after 5 s of SIGKILL" in result["log"][0]["message"]


@pytest.mark.parametrize("version", ["3.8", "3.11", "3.13"])
def test_subreaper_is_set_through_the_small_ctypes_path_on_each_python(version):
    """set_subreaper's prctl prototype (built on _ctypes, not the ctypes package) works and takes
    effect on the oldest and newest interpreters: PR_GET_CHILD_SUBREAPER reads 1 afterwards, and
    the ctypes package was never imported."""
    from tests.pythons import require_python
    import subprocess
    exe = require_python(version)
    code = ("import sys, runpy\n"
            "rt = runpy.run_path(sys.argv[1], run_name='mldiag_runtime')\n"
            "print(rt['set_subreaper'](), 'ctypes' in sys.modules)\n"
            "import ctypes\n"
            "v = ctypes.c_int()\n"
            "ctypes.CDLL(None).prctl(37, ctypes.byref(v), 0, 0, 0)\n"
            "print(v.value)\n")
    out = subprocess.run([exe, "-c", code, os.path.join(SCRIPTS, "_runtime.py")], capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["True", "False", "1"], out
