"""A team's own diagnostics (diagnostics/engine/team.py, issue 30 §2): a file's spec read with ast and
never run on the client; the task it becomes, listed and run through the real `mldiag` on the
local target; what is refused, by file and line, without costing any other task.

tests/fixtures/team/probe.py is the tests' own diagnostic (its README says so); the directory is
copied into each test's tmp_path, so a test can add a broken file beside it."""

import json
import shutil
import subprocess
import sys
import textwrap

import pytest

from diagnostics import builtin
from diagnostics.engine import jobs, registry, team
from diagnostics.builtin import BUILTIN
from diagnostics.runbooks import model as runbook
from diagnostics.inventory import topology
from diagnostics.core.errors import InputError
from tests.programs import REPO, inv, mldiag

from tests.unit.conftest import TEAM_FIXTURE as FIXTURE
# Quotes of both kinds, $(), backticks, globs, a backslash, non-ASCII, a tab, lines and a marker
# test_command_lines.py looks for on every command line the suite sent: it must arrive intact.
HOSTILE = "naïve ☃ $(id) `id` 'sq' \"dq\" {a,b} * ~root \\ \t|;&!#% l1\nl2 s3cr3t-team"


def spec_of(tmp_path, source, name="x.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return team.read(str(path), team.task_name(name))


# ---------------------------------------------------------------------------- the file's spec

def test_the_spec_is_read_from_the_file_without_running_it(tmp_path):
    ran = tmp_path / "ran"
    spec = spec_of(tmp_path, f'''\
        """Free space against a floor.

        More words."""
        import argparse
        open({str(ran)!r}, "w").close()      # would run at import: it must not
        GB = 10
        TIMEOUT = 45

        def build_parser():
            p = argparse.ArgumentParser()
            p.add_argument("--min-free-gb", type=float, default=GB, help="floor (default %d)" % GB)
            p.add_argument("--path", "-p", action="append", metavar="DIR", help="a " + "mount")
            p.add_argument("--count", type=int, required=True, help=compute())
            p.add_argument("--mode", choices=["fast", "deep"])
            if True:
                p.add_argument("--strict", action="store_true")
            return p

        def run(args):
            return {{}}
        ''', "disk_free.py")
    assert not ran.exists()
    assert (spec.name, spec.summary, spec.timeout, spec.builtin) == \
        ("disk-free", "Free space against a floor.", 45.0, False)
    assert [(a.name, a.kind, a.repeatable, a.required, a.choices, a.metavar, a.help)
            for a in spec.args] == [
        ("min-free-gb", "text", False, False, (), "", "floor (default 10)"),
        ("path", "text", True, False, (), "DIR", "a mount"),
        ("count", "int", False, True, (), "", ""),          # a help written otherwise: left out
        ("mode", "text", False, False, ("fast", "deep"), "", ""),
        ("strict", "bool", False, False, (), "", "")]
    assert (spec.directory, spec.script_name) == (str(tmp_path), "disk_free.py")


@pytest.mark.parametrize("name, expected", [("disk_free.py", "disk-free"), ("_helper.py", None),
                                            ("notes.txt", None), ("my-check.py", None),
                                            ("a.b.py", None)])
def test_which_files_are_tasks(name, expected):
    assert team.task_name(name) == expected


@pytest.mark.parametrize("source, line, message", [
    ("def run(args):\n    return {\n", 2, "syntax error: '{' was never closed"),
    ("X = 1\n", 1, "no run(args) function at the top of the module"),
    ("import argparse\ndef build_parser():\n    p = argparse.ArgumentParser()\n"
     "    p.add_argument('target')\n    return p\ndef run(a):\n    return {}\n",
     4, "'target': a positional argument: mldiag passes flags"),
    ("def build_parser():\n    p.add_argument('-v')\ndef run(a):\n    return {}\n",
     2, "-v: give it a long name too (--name)"),
    ("def build_parser():\n    p.add_argument('--timeout')\ndef run(a):\n    return {}\n",
     2, "--timeout: a common flag of every task (mldiag's own)"),
    ("def build_parser():\n    p.add_argument('--a_b')\ndef run(a):\n    return {}\n",
     2, "--a_b: not a flag mldiag can pass"),
    ("def build_parser():\n    p.add_argument(NAME)\ndef run(a):\n    return {}\n",
     2, "add_argument: write the option names literally"),
    ("def build_parser():\n    p.add_argument('--n', action='count')\ndef run(a):\n    return {}\n",
     2, "--n: action='count' is not one mldiag can pass"),
    ("def build_parser():\n    p.add_argument('--n', choices=make())\ndef run(a):\n    return {}\n",
     2, "--n: write choices= literally"),
    ("def build_parser():\n    p.add_argument('--n')\n    p.add_argument('--n')\n"
     "def run(a):\n    return {}\n", 3, "--n is added twice"),
    ("TIMEOUT = 'soon'\ndef run(a):\n    return {}\n", 1, "TIMEOUT: expected a positive number"),
    ("x = 1\nTIMEOUT = 0\ndef run(a):\n    return {}\n", 2, "TIMEOUT: expected a positive number"),
    ("COMPANIONS = ['missing.json']\ndef run(a):\n    return {}\n", 1,
     "COMPANIONS: 'missing.json': no such file beside it"),
    ("COMPANIONS = ['../x.py']\ndef run(a):\n    return {}\n", 1,
     "COMPANIONS: '../x.py' is not a file name in the diagnostic's directory"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_a_file_that_cannot_be_a_diagnostic_is_refused_at_its_line(tmp_path, source, line, message):
    (tmp_path / "x.py").write_text(source)
    specs, problems = team.scan(str(tmp_path), "test")
    assert specs == []
    assert [(p.task, p.file, p.line) for p in problems] == [("x", str(tmp_path / "x.py"), line)]
    assert problems[0].message.startswith(message), problems[0].message
    assert str(problems[0]).startswith(f"{tmp_path / 'x.py'}:{line}: {message}")


def test_discover_reads_the_hosts_files_dirs_then_the_command_lines(tmp_path, checks):
    directory, hosts = checks
    other = tmp_path / "more"
    other.mkdir()
    (other / "gpu_status.py").write_text("def run(a):\n    return {}\n")    # a built-in's name
    (other / "probe.py").write_text("def run(a):\n    return {}\n")         # probe's, again
    (other / "solo.py").write_text('"""Alone."""\ndef run(a):\n    return {}\n')
    found = team.discover(BUILTIN, str(hosts), [str(other), str(tmp_path / "nowhere")], entry_points=False)
    assert list(found.specs) == registry.names() + ["solo"]     # probe is two files: neither
    assert found.specs["gpu-status"] is builtin.REGISTRY["gpu-status"]
    said = [str(p) for p in found.problems]
    assert said == [
        f"{other / 'gpu_status.py'}: named like mldiag's own task 'gpu-status', which it would "
        "shadow: rename the file",
        f"{other / 'probe.py'}: 'probe' is also {directory / 'probe.py'}: rename one",
        f"{tmp_path / 'nowhere'}: diagnostics directory (--diagnostics-dir): No such file or "
        "directory"]
    assert registry.Registry(found.specs, found.problems).problem_of("probe") is found.problems[1]
    assert topology.load(str(hosts)).diagnostic_dirs == ((str(directory), str(hosts), 1),)


def test_a_team_job_ships_the_file_and_its_companions_and_passes_flags_as_argv(checks):
    directory, hosts = checks
    previous = registry.use(team.discover(BUILTIN, str(hosts), entry_points=False))
    try:
        target = topology.load(str(hosts)).targets["here"]
        job = jobs.job_source("probe", {"echo": ["a b", "-x"], "quiet": True, "level": "warn",
                                        "count": None})(target)
    finally:
        registry.use(previous)
    assert list(job.argv) == ["--level=warn", "--echo=a b", "--echo=-x", "--quiet"]
    assert (job.script_name, sorted(job.extra_files), job.timeout) == \
        ("probe.py", ["_levels.py", "_remote.py", "levels.json"], 60.0)   # _remote.py: ours
    assert (job.own_code, job.team) == (False, True)      # the client never parses its argv


# ---------------------------------------------------------------------------- through mldiag

def docs(r):
    return json.loads(r.stdout)


def test_list_and_help_show_the_team_task_with_its_flags(checks):
    _, hosts = checks
    r = mldiag("--list", env={"MLDIAG_HOSTS_FILE": str(hosts)})
    assert r.returncode == 0, r.stderr
    assert "  probe          Who runs here, and the flags as they arrived: a team" in r.stdout
    assert "levels" not in r.stdout                                 # a helper is no task
    i = inv("--list", env={"MLDIAG_HOSTS_FILE": str(hosts)})
    assert i.returncode == 0 and "  probe  " in i.stdout, i.stdout + i.stderr
    h = mldiag("probe", "--help", "--hosts-file", hosts)
    assert h.returncode == 0, h.stderr
    assert "  --level=VALUE  the level of the one finding (one of ok, warn, fail)\n" in h.stdout
    assert "  --echo=TEXT    a value to send back as it arrived (repeatable)\n" in h.stdout
    assert "  --quiet        no finding at all\n" in h.stdout
    assert h.stdout.startswith("Usage: mldiag probe [options]\n\nWho runs here")


def test_a_team_diagnostic_runs_with_its_flags_intact(checks):
    _, hosts = checks
    r = mldiag("probe", "--hosts-file", hosts, "--echo", HOSTILE, "--echo=-x", "--level",
               "warn", "--count", "2", "--json")
    assert r.returncode == 1, r.stderr
    [doc] = docs(r)
    assert (doc["diagnostic"], doc["status"], doc["summary"]) == ("probe", "warn", "probed as root")
    assert doc["findings"] == [{"level": "warn", "code": f"probe-{i}", "message": "look at this"}
                               for i in range(2)]
    assert doc["data"]["echo"] == [HOSTILE, "-x"] and doc["data"]["here"] == "mldiag-"


@pytest.mark.parametrize("shape, layer, message", [
    ("list", "protocol", "probe.py's run() value holds a list, not an object"),
    ("bad-finding", "protocol", "probe.py's run() value findings[0].level 'catastrophic' is not "
                                "one of info, ok, warn, fail"),
    ("extra-key", "protocol", "probe.py's run() value has 'status', not one of summary, "
                              "findings, data"),
    ("raise", "crashed", "probe was told to fail"),
])
def test_a_result_of_the_wrong_shape_is_that_targets_error_naming_the_file(checks, shape, layer,
                                                                          message):
    _, hosts = checks
    r = mldiag("probe", "--hosts-file", hosts, "--shape", shape, "--json")
    assert r.returncode == 3, r.stderr
    [doc] = docs(r)
    assert (doc["status"], doc["error"]["layer"], doc["error"]["message"]) == \
        ("error", layer, message)
    if shape == "raise":
        assert 'raise RuntimeError("probe was told to fail")' in doc["error"]["traceback"]


def test_a_broken_file_is_named_by_list_and_by_running_it_and_costs_nothing_else(checks):
    directory, hosts = checks
    (directory / "broken.py").write_text('"""Broken."""\ndef run(args):\n    return {\n')
    (directory / "gpu_status.py").write_text("def run(a):\n    return {}\n")
    r = mldiag("--list", "--diagnostics-dir", directory)
    assert r.returncode == 4
    assert "  probe " in r.stdout and "  gpu-status " in r.stdout and "broken" not in r.stdout
    assert r.stderr.splitlines() == [
        f"mldiag: {directory / 'broken.py'}:3: syntax error: '{{' was never closed",
        f"mldiag: {directory / 'gpu_status.py'}: named like mldiag's own task 'gpu-status', "
        "which it would shadow: rename the file"]
    b = mldiag("broken", "--hosts-file", hosts)
    assert b.returncode == 4 and b.stdout == ""
    assert b.stderr == (f"mldiag: task 'broken' cannot run: {directory / 'broken.py'}:3: syntax "
                        "error: '{' was never closed\n")
    p = mldiag("probe", "--hosts-file", hosts, "--quiet")          # its sibling still runs
    assert p.returncode == 0 and "probed as root" in p.stdout, p.stderr
    g = mldiag("gpu-status", "--hosts-file", hosts, "--json")      # the built-in, not the file
    assert docs(g)[0]["diagnostic"] == "gpu-status" and g.returncode in (0, 1), g.stderr


def test_a_runbook_step_takes_the_team_diagnostics_flags(checks, tmp_path):
    directory, hosts = checks
    books = tmp_path / "books"
    books.mkdir()
    (books / "preflight.yaml").write_text(textwrap.dedent("""\
        description: the team's own check, then ping where it warned
        steps:
          - task: probe
            args: {level: warn, echo: ["one", "{{ target.name }}"]}
          - task: ping
            when: probe.warn
        """))
    r = mldiag("runbook", "preflight", "--runbooks-dir", books, "--hosts-file", hosts, "-H", "here",
               "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    probe, ping = doc["steps"]
    assert probe["results"][0]["data"]["echo"] == ["one", "here"]
    assert probe["results"][0]["status"] == "warn" and ping["results"][0]["status"] == "ok"

    (books / "bad.yaml").write_text("description: d\nsteps:\n  - task: probe\n"
                                    "    args: {levle: warn}\n")
    b = mldiag("runbook", "bad", "--runbooks-dir", books, "--hosts-file", hosts)
    assert b.returncode == 4
    assert b.stderr.startswith(f"mldiag: {books / 'bad.yaml'}:4: steps[0].args.levle: probe has "
                               "no argument 'levle' (did you mean 'level'?)"), b.stderr


def test_the_runbook_loader_refuses_a_list_for_a_flag_that_is_not_repeatable(checks):
    _, hosts = checks
    previous = registry.use(team.discover(BUILTIN, str(hosts), entry_points=False))
    try:
        with pytest.raises(InputError, match=r"rb.yaml:4: steps\[0\].args.level: expected a "
                                             r"value, got a list"):
            runbook.loads("description: d\nsteps:\n  - task: probe\n"
                          "    args: {level: [warn]}\n", "rb.yaml")
    finally:
        registry.use(previous)


def test_an_installed_package_of_diagnostics_is_found_through_its_entry_point(tmp_path):
    """A team's pip-installable collection: a package naming itself in the entry-point group
    ``mldiag.diagnostics``, installed by pip into a throwaway venv (which sees mldiag and its
    dependencies through a .pth file: nothing is downloaded). Its directory's files are tasks;
    the package's code is never imported by the client."""
    source = tmp_path / "src"
    package = source / "teamchecks"
    shutil.copytree(FIXTURE, package, ignore=shutil.ignore_patterns("README.md", "__pycache__"))
    (package / "probe.py").rename(package / "installed_probe.py")
    (package / "__init__.py").write_text("raise SystemExit('the client imported the package')\n")
    (source / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "teamchecks"
        version = "1.0"
        [project.entry-points."mldiag.diagnostics"]
        teamchecks = "teamchecks"
        [tool.setuptools]
        packages = ["teamchecks"]
        [tool.setuptools.package-data]
        teamchecks = ["*.json"]
        """))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    [site] = venv.glob("lib/python*/site-packages")
    import sysconfig
    (site / "mldiag-under-test.pth").write_text(f"{REPO}\n{sysconfig.get_paths()['purelib']}\n")
    python = str(venv / "bin" / "python")
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                          "--no-build-isolation", str(source)], capture_output=True, text=True,
                         timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    installed = list(site.glob("teamchecks/installed_probe.py"))
    assert installed, list(site.iterdir())

    def run(*argv):
        return subprocess.run([python, "-c", "from diagnostics.cli.entry import main; main()", *argv],
                              capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    listed = run("--list")
    assert listed.returncode == 0, listed.stderr
    assert "  installed-probe  Who runs here" in listed.stdout
    r = run("installed-probe", "--level", "fail", "--json")
    assert r.returncode == 2, r.stderr
    [doc] = json.loads(r.stdout)
    assert doc["findings"] == [{"level": "fail", "code": "probe-0", "message": "this is broken"}]


@pytest.mark.parametrize("argv, word", [
    (["gpu-status", "-H", "x"], "gpu-status"),
    (["--search-root", "/repo", "disk-free", "--path", "gpu-status"], "disk-free"),
    (["-r", "gpu-status", "probe"], "probe"),          # a core flag's value is not the task
    (["--search-root=/r", "-e", "ping"], "ping"),
    (["--list"], None), (["--", "ping"], None), ([], None)])
def test_the_task_word_of_a_command_line_skips_flags_and_their_values(argv, word):
    from diagnostics.cli import cmdline
    assert cmdline.first_word(argv, ["-r", "--search-root"]) == word
