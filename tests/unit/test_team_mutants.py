"""diagnostics/engine/team.py's discovery, in this process (mutmut-registry.cfg): the directories read
once each and in order, what is refused and with which fields, and the packages installed
under the entry-point group ``mldiag.diagnostics`` (``importlib.metadata.entry_points`` as
Python 3.9, 3.10 and this Python give it; the packages are found, never imported).

tests/unit/test_team.py installs such a package with pip into a venv and runs mldiag there;
these tests give the same answers without a venv, each entry point's case on its own."""

import shutil
import sys
import types
from importlib import metadata

import pytest

from diagnostics import builtin
from diagnostics.engine import registry, team
from diagnostics.builtin import BUILTIN
from tests.unit.conftest import TEAM_FIXTURE as FIXTURE

RUNS = "def run(args):\n    return {}\n"
GROUP = "mldiag.diagnostics"


def diagnostics_dir(path, *names):
    path.mkdir(parents=True)
    for name in names:
        (path / f"{name}.py").write_text(f'"""{name} here."""\n{RUNS}')
    return path


@pytest.fixture
def no_hosts_file(tmp_path):
    """A hosts file that names no diagnostics directory (never the checkout's or the user's)."""
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  here: {local: true}\n")
    return str(hosts)


def team_names(found):
    return [name for name in found.specs if name not in builtin.REGISTRY]


# ---------------------------------------------------------------------------- the directories

def test_a_directory_named_twice_is_read_once_and_the_ones_after_it_still_are(tmp_path,
                                                                            no_hosts_file):
    one = diagnostics_dir(tmp_path / "one", "alpha")
    two = diagnostics_dir(tmp_path / "two", "beta")
    found = team.discover(BUILTIN, no_hosts_file, [str(one), str(tmp_path / "x" / ".." / "one"), str(two)],
                          entry_points=False)
    assert team_names(found) == ["alpha", "beta"] and found.problems == ()
    assert found.specs["beta"].directory == str(two)


def test_the_same_name_in_three_directories_is_refused_in_the_second_and_the_third(tmp_path,
                                                                                no_hosts_file):
    dirs = [diagnostics_dir(tmp_path / d, "same", d) for d in ("d1", "d2", "d3")]
    found = team.discover(BUILTIN, no_hosts_file, [str(d) for d in dirs], entry_points=False)
    assert team_names(found) == ["d1", "d2", "d3"]
    first = dirs[0] / "same.py"
    assert [(p.task, p.file, p.line, p.message) for p in found.problems] == [
        ("same", str(d / "same.py"), 0, f"'same' is also {first}: rename one") for d in dirs[1:]]


def test_a_file_named_like_mldiags_own_task_is_a_problem_of_no_task(tmp_path, no_hosts_file):
    directory = diagnostics_dir(tmp_path / "d", "ping", "runbook", "ok_one")
    found = team.discover(BUILTIN, no_hosts_file, [str(directory)], entry_points=False)
    assert team_names(found) == ["ok-one"] and found.specs["ping"] is builtin.REGISTRY["ping"]
    assert [(p.task, p.file, p.line) for p in found.problems] == [
        ("", str(directory / "ping.py"), 0), ("", str(directory / "runbook.py"), 0)]
    assert found.problems[1].message == ("named like mldiag's own task 'runbook', which it would "
                                         "shadow: rename the file")


# ---------------------------------------------------------------------------- entry points

@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory on sys.path with what entry points name: a package whose __init__ must never
    run, a plain module, a namespace package; each beside (or holding) a diagnostic."""
    root = tmp_path / "site"
    package = root / "mldiag_test_ep_package"
    shutil.copytree(FIXTURE, package, ignore=shutil.ignore_patterns("README.md", "__pycache__"))
    (package / "__init__.py").write_text("raise SystemExit('the client imported the package')\n")
    (root / "mldiag_test_ep_module.py").write_text(f'"""A module that is a diagnostic."""\n{RUNS}')
    diagnostics_dir(root / "mldiag_test_ep_namespace", "spaced")
    monkeypatch.syspath_prepend(str(root))
    return root


def point(name, value):
    return types.SimpleNamespace(name=name, value=value, group=GROUP)


def entry_points_of(version, points):
    """``importlib.metadata.entry_points`` as Python ``version`` has it: 3.9's takes nothing
    and gives a dict by group; 3.10's takes ``group=``; without it, 3.12's gives every entry
    point, with no ``get``, as 3.10's and 3.11's give it only with a DeprecationWarning."""
    others = [types.SimpleNamespace(name="other", value="json", group="console_scripts")]
    if version < (3, 10):
        def entry_points():     # the groups that some installed distribution names
            return dict({GROUP: list(points)} if points else {}, console_scripts=others)
    else:
        def entry_points(**selection):
            if not selection:
                return tuple(points) + tuple(others)
            return tuple(p for p in tuple(points) + tuple(others)
                         if all(getattr(p, k) == v for k, v in selection.items()))
    return entry_points


@pytest.fixture(params=[(3, 9, 18, "final", 0), (3, 10, 14, "final", 0), sys.version_info],
                ids=["3.9", "3.10", "this"])
def python(request, monkeypatch):
    """team.py as it runs on that Python (its sys.version_info and importlib.metadata)."""
    monkeypatch.setattr(team, "sys", types.SimpleNamespace(version_info=request.param))

    def install(points):
        monkeypatch.setattr(metadata, "entry_points", entry_points_of(request.param, points))
    return install


def where(p):
    return f"entry point {p.name} = {p.value} ({GROUP})"


def test_each_entry_points_directory_in_name_order(site, python):
    points = [point("zz", "mldiag_test_ep_namespace"), point("mm", "mldiag_test_ep_module"),
              point("aa", " mldiag_test_ep_package :plugin")]
    python(points)
    problems = []
    assert team._entry_point_dirs(problems) == [
        (str(site / "mldiag_test_ep_package"), where(points[2])),
        (str(site), where(points[1])), (str(site / "mldiag_test_ep_namespace"), where(points[0]))]
    assert problems == []


def test_no_entry_point_in_the_group_is_no_directory(python):
    python([])
    problems = []
    assert team._entry_point_dirs(problems) == [] and problems == []


def test_an_entry_point_that_names_no_module_is_a_problem_and_the_next_still_counts(site, python,
                                                                                   monkeypatch):
    points = [point("a-missing", "mldiag_test_ep_nosuch:x"),
              point("b-parent", "mldiag_test_ep_noparent.child"), point("c-relative", ".x"),
              point("d-no-spec", "mldiag_test_ep_nospec"),
              point("e-good", "mldiag_test_ep_package")]
    python(points)
    loaded = types.ModuleType("mldiag_test_ep_nospec")     # imported, but without a spec
    loaded.__spec__ = None
    monkeypatch.setitem(sys.modules, "mldiag_test_ep_nospec", loaded)
    problems = []
    assert team._entry_point_dirs(problems) == [(str(site / "mldiag_test_ep_package"),
                                                 where(points[4]))]
    assert [(p.task, p.file, p.line, p.message) for p in problems] == [
        ("", where(points[0]), 0, "mldiag_test_ep_nosuch: no such module"),
        ("", where(points[1]), 0, "mldiag_test_ep_noparent.child: No module named "
                                  "'mldiag_test_ep_noparent'"),
        ("", where(points[2]), 0, ".x: no package specified for '.x' (required for relative "
                                  "module names)"),
        ("", where(points[3]), 0, "mldiag_test_ep_nospec: mldiag_test_ep_nospec.__spec__ is None")]
    assert str(problems[0]) == f"{where(points[0])}: mldiag_test_ep_nosuch: no such module"


def test_discover_reads_the_entry_points_unless_told_not_to(site, python, no_hosts_file):
    python([point("broken", "mldiag_test_ep_nosuch"), point("team", "mldiag_test_ep_package")])
    found = team.discover(BUILTIN, no_hosts_file)
    assert team_names(found) == ["probe"]
    assert found.specs["probe"].directory == str(site / "mldiag_test_ep_package")
    assert [str(p) for p in found.problems] == [
        f"entry point broken = mldiag_test_ep_nosuch ({GROUP}): mldiag_test_ep_nosuch: no such "
        "module"]
    assert team.discover(BUILTIN, no_hosts_file, entry_points=False) == registry.Registry(
        builtin.REGISTRY, ())
