"""scripts/pyframes.py, the standard-library reader of a live CPython's stacks, against real
processes (tests/fixtures/stacks/pyframes_target.py under each CPython it knows), checked
against the lines the fixture marks and against ``py-spy dump --json`` on the same process."""

import contextlib
import copy
import functools
import json
import os
import re
import select
import shutil
import subprocess
import sys
import time

import pytest

from tests.programs import SCRIPTS, load_script
from tests.pythons import find_python as _find_python, require_python

pyframes = load_script("pyframes.py", "mldiag_test_pyframes")

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                        "stacks")
TARGET = os.path.join(FIXTURES, "pyframes_target.py")
TARGET_SHORT = "pyframes_target.py"
READER = str(SCRIPTS / "pyframes.py")
PYSPY = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")


find_python = functools.lru_cache(maxsize=None)(_find_python)


def _marks():
    marks = {}
    with open(TARGET) as f:
        for number, line in enumerate(f, 1):
            m = re.search(r"# MARK:(\w+)", line)
            if m:
                marks[m.group(1)] = number
    return marks


MARK = _marks()


@functools.lru_cache(maxsize=None)
def _python(which):
    """The interpreter a target runs: the venv's 3.11, Debian's /usr/bin/python3.11 (the lab's
    targets), pyenv's 3.12 and 3.13."""
    if which == "venv":
        return sys.executable
    if which == "debian":
        if not os.access("/usr/bin/python3.11", os.X_OK):
            pytest.skip("no /usr/bin/python3.11 here")
        return "/usr/bin/python3.11"
    return require_python(which)


INTERPRETERS = ["venv", "debian", "3.12", "3.13"]


@contextlib.contextmanager
def target(python, *args):
    """pyframes_target.py ARGS under ``python``, once it has said "ready"; killed after."""
    proc = subprocess.Popen([python, TARGET] + [str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        line = proc.stdout.readline() if ready else ""
        assert line.strip() == "ready", "target %s did not start: %r %r" % (
            args, line, proc.poll() is not None and proc.stderr.read())
        yield proc
    finally:
        proc.kill()
        proc.wait()


def settled(pid, innermost, line=None, timeout=10.0):
    """dump(pid) once the main thread's innermost frame is ``innermost`` (at ``line``) and two
    dumps in a row read the same: the target says "ready" just before it blocks, and its
    other threads may still be on their way to where they block."""
    deadline = time.monotonic() + timeout
    previous = None
    while True:
        threads = pyframes.dump(pid)
        frames = threads[0]["frames"] if threads else []
        there = frames and frames[0]["name"] == innermost and line in (None, frames[0]["line"])
        if there and threads == previous:
            return threads
        if time.monotonic() > deadline:
            raise AssertionError("main thread never settled in %s: %r" % (innermost, threads))
        previous = threads if there else None
        time.sleep(0.05)


def pyspy(pid):
    if not PYSPY:
        pytest.skip("no py-spy beside %s" % sys.executable)
    out = subprocess.run([PYSPY, "dump", "--json", "--pid", str(pid)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def triples(frames):
    return [(f["name"], f["short_filename"], f["line"]) for f in frames]


def main_of(threads):
    named = [t for t in threads if t["thread_name"] == "MainThread"]
    assert len(named) == 1, threads
    return named[0]


@pytest.fixture(scope="module")
def sleepers():
    """``sleep`` targets started on demand, one per interpreter for the whole module:
    {which: (python, pid, first dump)}."""
    with contextlib.ExitStack() as stack:
        started = {}

        def get(which):
            if which not in started:
                python = _python(which)
                proc = stack.enter_context(target(python, "sleep"))
                threads = settled(proc.pid, "Outer.method", MARK["method"])
                started[which] = (python, proc.pid, threads)
            return started[which]
        yield get


@pytest.fixture(params=INTERPRETERS)
def sleeping(request, sleepers):
    """(python, pid, dump) of a ``sleep`` target under each interpreter."""
    return sleepers(request.param)


@pytest.fixture
def sleeping_venv(sleepers):
    return sleepers("venv")


# --- the stacks ----------------------------------------------------------------------------

def test_main_thread_first_with_its_frames_at_the_marked_lines(sleeping):
    _, pid, threads = sleeping
    main = threads[0]
    assert main["thread_name"] == "MainThread"
    assert main["os_thread_id"] == pid and main["pid"] == pid
    assert triples(main["frames"]) == [
        ("Outer.method", TARGET_SHORT, MARK["method"]),
        ("outer.<locals>.inner", TARGET_SHORT, MARK["inner"]),
        ("outer", TARGET_SHORT, MARK["outer"]),
        ("main", TARGET_SHORT, MARK["module"]),
        ("<module>", TARGET_SHORT, MARK["entry"]),
    ]
    assert {f["filename"] for f in main["frames"]} == {TARGET}
    others = threads[1:]
    assert len(others) == 1 and others[0]["thread_name"] is None
    assert others[0]["os_thread_id"] not in (None, pid)
    assert ("waiter", TARGET_SHORT, MARK["waiter"]) in triples(others[0]["frames"])
    # innermost first: threading's own frames above waiter, the thread's bootstrap below it
    names = [f["name"] for f in others[0]["frames"]]
    assert names.index("Event.wait") < names.index("waiter") < names.index("Thread.run")


def test_same_stacks_as_pyspy(sleeping):
    _, pid, ours = sleeping
    theirs = pyspy(pid)
    assert triples(ours[0]["frames"]) == triples(main_of(theirs)["frames"])
    assert ours[0]["thread_id"] == main_of(theirs)["thread_id"]
    # every thread, every field py-spy and this reader both know
    by_id = {t["thread_id"]: t for t in theirs}
    assert sorted(by_id) == sorted(t["thread_id"] for t in ours)
    keys = ("name", "filename", "short_filename", "line", "module", "locals", "is_entry",
            "is_shim_entry")
    for thread in ours:
        spy = by_id[thread["thread_id"]]
        assert thread["os_thread_id"] == spy["os_thread_id"]
        assert [[f[k] for k in keys] for f in thread["frames"]] == \
            [[f[k] for k in keys] for f in spy["frames"]]


def test_json_shape_is_pyspys(sleeping):
    _, _, threads = sleeping
    with open(os.path.join(FIXTURES, "pyspy-gloo4-rank0.json")) as f:
        recorded = json.load(f)
    assert [list(t) for t in threads] == [list(recorded[0])] * len(threads)
    for thread in threads:
        assert thread["active"] is None and thread["owns_gil"] in (True, False, None)
        for frame in thread["frames"]:
            assert list(frame) == list(recorded[0]["frames"][0])
    assert json.loads(json.dumps(threads)) == threads


@pytest.mark.parametrize("which", INTERPRETERS)
def test_library_frames_short_filenames_as_pyspy(which):
    with target(_python(which), "library") as proc:
        ours = settled(proc.pid, "Condition.wait")
        theirs = pyspy(proc.pid)
    main = ours[0]
    assert [(f["name"], f["short_filename"]) for f in main["frames"][:4]] == [
        ("Condition.wait", "threading.py"), ("Queue.get", "queue.py"),
        ("in_queue", TARGET_SHORT), ("main", TARGET_SHORT)]
    assert main["frames"][2]["line"] == MARK["in_queue"]
    # the library lines are the waits in that interpreter's own stdlib
    for frame, call in zip(main["frames"], ("waiter.acquire(", "self.not_empty.wait(")):
        with open(frame["filename"]) as f:
            assert call in f.read().splitlines()[frame["line"] - 1]
    future = [t for t in ours if any(f["name"] == "in_future" for f in t["frames"])]
    assert len(future) == 1
    assert ("Future.result", "concurrent/futures/_base.py") in [
        (f["name"], f["short_filename"]) for f in future[0]["frames"]]
    assert triples(main["frames"]) == triples(main_of(theirs)["frames"])
    by_id = {t["thread_id"]: t for t in theirs}
    assert triples(future[0]["frames"]) == triples(by_id[future[0]["thread_id"]]["frames"])


@pytest.mark.parametrize("delete", [False, True], ids=["present", "deleted"])
def test_site_packages_frames(tmp_path, delete):
    """A package under a site-packages directory: its path below site-packages, whether the
    file is still there to look at (py-spy's __init__.py walk) or gone (the reader's fallback)."""
    pkg = tmp_path / "lib" / "site-packages" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("import time\n\n\ndef block():\n    print('ready', flush=True)\n"
                                "    time.sleep(3600)\n")
    with target(sys.executable, "site", pkg.parent, *(["--delete"] if delete else [])) as proc:
        ours = settled(proc.pid, "block", 6)
        theirs = pyspy(proc.pid)
    assert triples(ours[0]["frames"][:2]) == [("block", "pkg/mod.py", 6),
                                              ("main", TARGET_SHORT, MARK["main_site"])]
    assert ours[0]["frames"][0]["filename"] == str(pkg / "mod.py")
    assert triples(ours[0]["frames"]) == triples(main_of(theirs)["frames"])


def test_short_filename_rule(tmp_path):
    reader = object.__new__(pyframes._Reader)
    reader.root, reader.shorts, reader.exists = "", {}, {}
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/__init__.py", "a/b/__init__.py", "a/b/c.py", "a/top.py"):
        (tmp_path / name).write_text("")
    assert reader.short_filename(str(tmp_path / "a/b/c.py")) == "a/b/c.py"
    assert reader.short_filename(str(tmp_path / "a/top.py")) == "a/top.py"
    assert reader.short_filename("/gone/dist-packages/torch/distributed/x.py") == \
        "torch/distributed/x.py"
    assert reader.short_filename("/gone/lib/python3.11/threading.py") == "threading.py"
    assert reader.short_filename("<frozen importlib._bootstrap>") == "<frozen importlib._bootstrap>"


# --- bounds --------------------------------------------------------------------------------

def test_deep_stack_keeps_the_innermost_frames():
    with target(sys.executable, "deep", pyframes.MAX_FRAMES + 50) as proc:
        threads = settled(proc.pid, "down", MARK["bottom"])
    frames = threads[0]["frames"]
    assert len(frames) == pyframes.MAX_FRAMES
    assert frames[0]["line"] == MARK["bottom"]
    assert triples(frames[1:]) == [("down", TARGET_SHORT, MARK["down"])] * (len(frames) - 1)


def test_many_threads_bounded_main_first():
    with target(sys.executable, "many", pyframes.MAX_THREADS + 16) as proc:
        threads = settled(proc.pid, "main", MARK["many"])
    assert len(threads) == pyframes.MAX_THREADS
    assert threads[0]["thread_name"] == "MainThread"
    assert triples(threads[0]["frames"][:1]) == [("main", TARGET_SHORT, MARK["many"])]
    assert all(t["thread_name"] is None for t in threads[1:])


def test_wrong_offsets_give_readerror_or_stacks_never_anything_else(sleeping_venv, monkeypatch):
    """Memory read through wrong offsets is garbage to the reader: it must come out as
    ReadError (or as stacks), quickly, never as another exception."""
    _, pid, _ = sleeping_venv
    base = copy.deepcopy(pyframes._LAYOUTS[(3, 11)])
    outcomes = set()
    for key, value in sorted(base.items()):
        if value is None:
            continue
        for wrong in (value + 8, value - 8, value + 1, value + 4096):
            monkeypatch.setitem(pyframes._LAYOUTS, (3, 11), dict(base, **{key: wrong}))
            start = time.monotonic()
            try:
                threads = pyframes.dump(pid)
                assert isinstance(threads, list)
                outcomes.add("stacks")
            except pyframes.ReadError as e:
                assert str(e) and "\n" not in str(e)
                outcomes.add("ReadError")
            assert time.monotonic() - start < 2, (key, wrong)
    assert outcomes == {"stacks", "ReadError"}


# --- refusals ------------------------------------------------------------------------------

def test_not_python():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.05)
        with pytest.raises(pyframes.ReadError, match=r"is not a CPython process"):
            pyframes.dump(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_no_such_process():
    proc = subprocess.Popen(["true"])
    proc.wait()
    if os.path.exists("/proc/%d" % proc.pid):
        pytest.skip("pid reused already")
    with pytest.raises(pyframes.ReadError, match=r"^no process %d$" % proc.pid):
        pyframes.dump(proc.pid)
    with pytest.raises(pyframes.ReadError, match="not a pid"):
        pyframes.dump("self")


def test_unknown_version_named():
    python = find_python("3.10")
    if not python:
        pytest.skip("no python3.10 here")
    proc = subprocess.Popen([python, "-c", "import time; print('ready', flush=True); "
                                           "time.sleep(60)"], stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()
        with pytest.raises(pyframes.ReadError, match=r"^CPython 3\.10 is not known to the "
                                                     r"standard-library reader; use py-spy$"):
            pyframes.dump(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_permission_denied_is_permissionerror(sleeping_venv):
    """An unprivileged reader of a root-owned process: the kernel refuses, and the caller gets
    PermissionError itself (the CLI says so and exits 1)."""
    _, pid, _ = sleeping_venv
    if os.geteuid() != 0:
        prefix = []
        pid = 1                              # init, not ours to read
    else:
        setpriv = shutil.which("setpriv")
        if not setpriv:
            pytest.skip("no setpriv to drop root with")
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    if not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("no /usr/bin/python3 for the unprivileged reader")
    with open(READER) as f:
        source = f.read()
    api = ("import sys; ns = {'__name__': 'pyframes'}; exec(sys.stdin.read(), ns)\n"
           "try:\n    ns['dump'](%d)\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
           "else:\n    print('read')\n" % pid)
    out = subprocess.run(prefix + ["/usr/bin/python3", "-c", api], input=source,
                         capture_output=True, text=True, timeout=30, cwd="/")
    assert out.stdout.startswith("PermissionError"), (out.stdout, out.stderr)
    cli = subprocess.run(prefix + ["/usr/bin/python3", "-", str(pid)], input=source,
                         capture_output=True, text=True, timeout=30, cwd="/")
    assert cli.returncode == 1 and cli.stdout == ""
    assert "permission denied" in cli.stderr and "ptrace" in cli.stderr


# --- the command line ----------------------------------------------------------------------

def test_command_line_prints_the_json(sleeping):
    """``python3 pyframes.py PID`` under the oldest python3 a target may have (3.8)."""
    _, pid, threads = sleeping
    python = find_python("3.8")
    if not python:
        pytest.skip("no python3.8 here")
    out = subprocess.run([python, READER, str(pid)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    assert [triples(t["frames"]) for t in printed] == [triples(t["frames"]) for t in threads]


def test_command_line_refusals():
    for argv, rc, said in ((["nope"], 1, "pyframes: not a pid: 'nope'\n"),
                           ([], 2, "usage: pyframes.py PID\n")):
        out = subprocess.run([sys.executable, READER] + argv, capture_output=True, text=True,
                             timeout=30)
        assert (out.returncode, out.stdout, out.stderr) == (rc, "", said)
