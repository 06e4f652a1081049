"""One execute path (issue 10): the engine returns outcomes and raises mldiag's errors; only
the task layer (``tasks.MldiagTask``) turns them into Invoke's ``Exit``.

What "the engine imports without Invoke" means here, and what these tests prove:
- the runbook model, the job table, results, renderers, reports, hosts.yaml and the save
  directory import with Invoke *and* Fabric unimportable (no transport in them at all);
- the whole engine (``cli``, ``runbook_run``, ``runner``, the hops) imports with Invoke and
  Fabric unimportable, and a local target runs end to end through ``execute.execute`` and
  ``runbook_run.execute`` so: the SSH transport imports Fabric (built on Invoke) only when it
  opens a connection;
- beyond imports, the guard below refuses ``import invoke`` to any ``diagnostics`` module but
  ``tasks`` and ``program`` (the task layer), and Fabric to all but the SSH transport.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
from invoke import Context, Exit, task

from diagnostics.engine import execute
from diagnostics.runbooks import model as runbook, run as runbook_run
from diagnostics.core import termination
from diagnostics.core.errors import (EXIT_BAD_INPUT, EXIT_ERROR, EXIT_INTERRUPTED, InputError,
                                Interrupted)
from diagnostics.core.outcome import Outcome
from diagnostics.core.results import Result
from diagnostics.cli.tasks import MldiagTask
from diagnostics.inventory.topology import Target

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINE_DIR = os.path.join(REPO, "diagnostics")

BLOCK_INVOKE_AND_FABRIC = """\
import sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("invoke", "fabric"):
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Blocked())
"""

# Every `import` statement calls builtins.__import__, also for a module already loaded.
ENGINE_NEVER_IMPORTS_INVOKE = """\
import builtins, sys

TASK_LAYER = ("diagnostics.cli.tasks", "diagnostics.cli.program")
FABRIC_USER = "diagnostics.transport.ssh"
real_import = builtins.__import__

def guarded(name, globals=None, locals=None, fromlist=(), level=0):
    importer = (globals or {}).get("__name__", "")
    top = name.split(".")[0] if level == 0 else ""
    if importer.startswith("diagnostics") and importer not in TASK_LAYER:
        if top == "invoke" or (top == "fabric" and importer != FABRIC_USER):
            raise ImportError(f"{importer} imports {name}")
    return real_import(name, globals, locals, fromlist, level)

builtins.__import__ = guarded
"""


def python(prelude: str, body: str, tmp_path) -> subprocess.CompletedProcess:
    code = prelude + "\n" + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_runbook_model_imports_without_invoke_or_fabric(tmp_path):
    """Once ``runbook → jobs → cli → invoke``; now jobs takes TargetInputError from errors."""
    proc = python(BLOCK_INVOKE_AND_FABRIC, """\
        import diagnostics.runbooks.model, diagnostics.engine.jobs, diagnostics.core.results, diagnostics.views.render
        import diagnostics.runbooks.report, diagnostics.inventory.topology, diagnostics.core.savedir, diagnostics.core.outcome
        import diagnostics.core.errors, diagnostics.core.termination, diagnostics.engine.bundle
        from diagnostics.builtin import BUILTIN; from diagnostics.engine import registry; registry.use(BUILTIN)   # the program's first step
        book = diagnostics.runbooks.model.load(diagnostics.runbooks.model.files(
            diagnostics.runbooks.model.search_dirs((), ()))["node-health"][0], "built-in")
        print(len(book.steps), sorted(m for m in sys.modules if m.split(".")[0] in ("invoke", "fabric")))
        """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    steps, loaded = proc.stdout.split(" ", 1)
    assert int(steps) > 0 and loaded.strip() == "[]"


def test_the_guard_refuses_invoke_to_engine_modules_only(tmp_path):
    """The guard is real: ``tasks`` may import Invoke, an engine module may not (had cli kept
    ``from invoke import Exit``, importing tasks would fail here)."""
    proc = python(ENGINE_NEVER_IMPORTS_INVOKE, """\
        ns = {"__name__": "diagnostics.someengine"}
        try:
            exec("from invoke import Exit", ns)
        except ImportError as exc:
            print("refused:", exc)
        import diagnostics.cli.tasks
        print("tasks imported")
        """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "refused: diagnostics.someengine imports invoke\ntasks imported\n"


def test_a_local_target_runs_end_to_end_without_the_engine_importing_invoke(tmp_path):
    (tmp_path / "hosts.yaml").write_text("hosts:\n  here: {local: true}\n")
    books = tmp_path / "books"
    books.mkdir()
    (books / "twice.yaml").write_text("description: ping twice\nsteps:\n"
                                      "  - {task: ping, id: first}\n  - {task: ping, id: again}\n")
    proc = python(BLOCK_INVOKE_AND_FABRIC + ENGINE_NEVER_IMPORTS_INVOKE, """\
        import io, json
        import diagnostics.engine.execute as execute, diagnostics.runbooks.run as runbook_run
        import diagnostics.engine.runner, diagnostics.runbooks.model, diagnostics.engine.jobs, diagnostics.runbooks.report
        from diagnostics.core.errors import InputError
        from diagnostics.builtin import BUILTIN; from diagnostics.engine import registry; registry.use(BUILTIN)   # the program's first step
        opts = execute.Options(host=["here"], hosts_file="hosts.yaml", json=True)
        out = io.StringIO()
        outcome = execute.execute(opts, diagnostics.engine.jobs.job_source("ping", {}), out=out)
        docs = json.loads(out.getvalue())
        ran = runbook_run.execute(opts, "twice", runbooks_dirs=["books"], out=io.StringIO())
        try:
            execute.execute(execute.Options(host=["nowhere"], hosts_file="hosts.yaml"),
                        diagnostics.engine.jobs.job_source("ping", {}))
        except InputError as exc:
            bad = str(exc)
        print(json.dumps({"code": outcome.exit_code, "statuses": [d["status"] for d in docs],
                          "runbook": [ran.exit_code, [r.status for r in ran.results.results]],
                          "bad": bad}))
        """, tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["code"] == 0 and seen["statuses"] == ["ok"]
    assert seen["runbook"] == [0, ["ok", "ok"]]
    assert "nowhere" in seen["bad"]


def test_no_engine_module_raises_invokes_exit():
    """Exit is raised in tasks.py (and program.py for Invoke's own parse errors) only."""
    raising = []
    for root, _, names in os.walk(ENGINE_DIR):
        for name in names:
            path = os.path.join(root, name)
            if name.endswith(".py") and "scripts" not in path.split(os.sep):
                text = open(path, encoding="utf-8").read()
                if "raise Exit(" in text or "import invoke" in text or "from invoke" in text:
                    raising.append(os.path.relpath(path, ENGINE_DIR))
    assert sorted(raising) == ["cli/program.py", "cli/tasks.py"]


# ------------------------------------------------------------------ what the engine hands back

def test_bad_input_is_raised_as_mldiags_error_not_an_exit(tmp_path):
    (tmp_path / "hosts.yaml").write_text("hosts:\n  here: {local: true}\n")
    opts = execute.Options(host=["here"], hosts_file=str(tmp_path / "hosts.yaml"), timeout="soon")
    with pytest.raises(InputError, match="--timeout: expected a positive number") as caught:
        execute.execute(opts, execute.script_file_job(__file__, [], []))
    assert caught.value.exit_code == EXIT_BAD_INPUT
    with pytest.raises(InputError, match="name a runbook"):
        runbook_run.execute(opts, "")


def test_listing_runbooks_with_a_broken_file_lists_the_rest_and_returns_exit_4(tmp_path):
    (tmp_path / "hosts.yaml").write_text("hosts:\n  here: {local: true}\n")
    books = tmp_path / "books"
    books.mkdir()
    (books / "broken.yaml").write_text("steps: 3\n")
    (books / "fine.yaml").write_text("description: fine\nsteps:\n  - task: ping\n")
    out = open(tmp_path / "list.txt", "w+")
    outcome = runbook_run.list_runbooks(str(tmp_path / "hosts.yaml"), [str(books)], out=out)
    assert outcome.exit_code == EXIT_BAD_INPUT
    assert [b.name for b in outcome.results if b.source != "built-in"] == ["fine"]
    (message,) = outcome.messages
    assert message.startswith(f"{books / 'broken.yaml'}:1: ")
    assert outcome.stderr_text() == f"mldiag: {message}"


def test_an_interrupted_runbook_says_how_it_was_ended():
    """TERM while a step runs: the record (and the task's message) says terminated, 143."""
    book = runbook.loads("description: x\nsteps:\n  - task: ping\n", "x.yaml")

    def terminated_fleet(targets, job_for, *, on_result, **kw):
        on_result(Result(diagnostic="ping", target=targets[0].name, status="ok", summary="ok"))
        raise termination.Terminated(signal.SIGTERM)

    record = runbook_run.run(book, [Target(name="a", local=True), Target(name="b", local=True)],
                             {}, run_many=terminated_fleet)
    assert (record.interrupted, record.exit_code, record.interrupted_as) == \
        (True, 128 + signal.SIGTERM, "terminated (SIGTERM)")


@pytest.mark.parametrize("interrupt,message,code", [
    (KeyboardInterrupt(), "interrupted (1 of 2 targets finished)", EXIT_INTERRUPTED),
    (termination.Terminated(signal.SIGHUP), "terminated (SIGHUP) (1 of 2 targets finished)",
     128 + signal.SIGHUP)])
def test_an_interrupt_becomes_one_interrupted_error(interrupt, message, code):
    error = termination.interrupted(interrupt, "1 of 2 targets finished")
    assert isinstance(error, Interrupted) and (str(error), error.exit_code) == (message, code)


# ------------------------------------------------------------------ the one place that exits

def outcome_of(body):
    """What the task layer makes of ``body``'s return or raise: (code, stderr message)."""
    wrapped = task(klass=MldiagTask)(lambda c: body())
    try:
        returned = wrapped(Context())
    except Exit as exc:
        return exc.code, exc.message
    return "returned", returned


def raising(exc):
    def body():
        raise exc
    return body


def test_the_task_layer_maps_outcomes_and_errors_to_exits(tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))   # internal error's traceback file
    ok = Outcome([], 0)
    assert outcome_of(lambda: ok) == ("returned", ok)
    assert outcome_of(lambda: None) == ("returned", None)
    assert outcome_of(lambda: Outcome([], 2)) == (2, None)
    assert outcome_of(lambda: Outcome([], 4, ("a:1: bad", "b:2: worse"))) == \
        (4, "mldiag: a:1: bad\nmldiag: b:2: worse")
    assert outcome_of(lambda: Outcome([], 143, ("terminated (SIGTERM)",))) == \
        (143, "mldiag: terminated (SIGTERM)")
    assert outcome_of(raising(InputError("--x: no", key="k"))) == (4, "mldiag: k: --x: no")
    assert outcome_of(raising(Interrupted("interrupted (0 of 1 targets finished)"))) == \
        (130, "mldiag: interrupted (0 of 1 targets finished)")
    assert outcome_of(raising(KeyboardInterrupt())) == (130, "mldiag: interrupted")
    assert outcome_of(raising(termination.Terminated(signal.SIGTERM))) == \
        (143, "mldiag: terminated (SIGTERM)")
    code, message = outcome_of(raising(ValueError("a bug")))
    assert code == EXIT_ERROR
    assert message.startswith("mldiag: internal error (a bug of ours, please report it): "
                              "ValueError: a bug\nmldiag: full traceback in ")
