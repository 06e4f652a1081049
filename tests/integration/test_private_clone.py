"""The suite from a clone in a private directory (issue 29 §2): what the lab's users and its
containers read or run is the lab's own copy, so a checkout they cannot reach still passes.

A home directory is often mode 0700, and the lab's ssh users (mlsh, mlzsh, nosudo) cannot enter
it: before the lab copied its files (tests/lab/lab.py, `Lab._stage_test_files`), three tests of
test_hostile_targets.py failed there because mlsh could not run tests/fixtures/hostile/python.
The first test clones the repository into a 0700 directory whose path has spaces
(`TMP/priv dir/clone x`) and runs one of those tests from the clone, with the clone's code and
lab: a nested pytest, this interpreter, cwd and PYTHONPATH the clone, this run's CI (under
CI=true a lab part that cannot start is a failure there too; elsewhere a skip there is a skip
here). One test, the one with the most hostile targets (12, beside a good host and a good CT):
the three failed alike, for one cause, and each costs 20-30 s on 2 cores.

What is tested is a clone of HEAD (`git clone --no-hardlinks`), what a user's clone holds:
uncommitted changes of this working tree are not in it (commit them to have them tested here).

One lab at a time: the nested run starts a lab of its own, and two labs on one machine would
share the lab users' sudoers rules (their secure_path names a session's copy of tests/fakes: the
second lab's rules would outlive its files), so a lab refuses to start while another runs (the
second test here). So the first test does not use the session's lab (it overrides the autouse
fixture that starts it), conftest.py orders this module before every other test, and it fails
if a lab is running all the same (the suite's lock, `flock /tmp/mldiag-lab.lock`, keeps other
runs out meanwhile). The nested run's command lines go to this session's record
($MLDIAG_RECORD_COMMANDS is inherited), which test_command_lines.py checks with the others.

Cost (2 cores, busy): the clone 0.1 s, the nested run ~30 s (its start and lab ~3 s, the test
~27 s; all three tests: 70 s).
"""

import os
import pwd
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.lab import Lab, LabError
from tests.lab.lab import running_labs
from tests.lab.users import SUDOERS_FILE
from tests.programs import ok

REPO = Path(__file__).resolve().parents[2]
CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
# What the nested run runs: a test of test_hostile_targets.py whose targets' interpreter is a
# fixture that mlsh runs (lab.hostile_dir). Its other two such tests are
# test_the_client_stays_bounded_under_a_gigabyte and
# test_a_large_put_to_a_target_that_never_reads_ends_at_the_deadline. Named, so that a rename
# fails here instead of selecting nothing.
HOSTILE_TESTS = ("test_malformed_frames_floods_and_marker_floods_are_rows_of_their_own",)
NESTED_TIMEOUT = 600


@pytest.fixture
def mldiag_ssh_config():
    """Overrides conftest.py's autouse fixture of this name, which would start the session's
    lab: the nested run below must be the only lab on the machine (the second test asks for
    the session's lab by name)."""
    yield None


def cannot_run(why: str) -> None:
    """Fail under CI, skip elsewhere (as conftest.py's lab_unavailable)."""
    if CI:
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def private_clone(tmp_path: Path) -> Path:
    """A clone of REPO's HEAD in `tmp_path/priv dir/clone x`, `priv dir` of mode 0700."""
    if not (REPO / ".git").exists():
        cannot_run("the private-clone test clones this checkout: needs a git checkout")
    private = tmp_path / "priv dir"
    private.mkdir()
    os.chmod(private, 0o700)
    clone = private / "clone x"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(clone)], check=True,
                   capture_output=True, timeout=120)
    return clone


def as_nobody():
    """preexec_fn: drop to the unprivileged `nobody`, as a lab user has no more rights."""
    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)


def test_the_hostile_target_tests_pass_from_a_clone_in_a_private_directory(tmp_path):
    if os.geteuid() != 0:
        cannot_run("the nested run starts a lab: needs root")
    running = running_labs()
    assert not running, f"a lab is running ({running}): the nested run needs the machine alone"
    clone = private_clone(tmp_path)
    hostile = clone / "tests" / "fixtures" / "hostile" / "python"
    # the premise: the clone is out of an unprivileged user's reach (what made the tests fail)
    assert stat.S_IMODE(os.stat(clone.parent).st_mode) == 0o700
    assert subprocess.run(["test", "-x", str(hostile)], preexec_fn=as_nobody).returncode != 0
    env = {**os.environ, "PYTHONPATH": str(clone), "CI": "true" if CI else ""}
    # the nested run imports the clone's code, not this checkout's (the venv's editable install)
    probe = subprocess.run([sys.executable, "-c", "import diagnostics, tests.lab, tests.programs;"
                            "print(diagnostics.__file__); print(tests.lab.__file__);"
                            "print(tests.programs.REPO)"],
                           cwd=clone, env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.splitlines() == [str(clone / "diagnostics" / "__init__.py"),
                                         str(clone / "tests" / "lab" / "__init__.py"),
                                         str(clone)], probe.stdout
    junit = tmp_path / "nested.xml"
    ids = [f"tests/integration/test_hostile_targets.py::{name}" for name in HOSTILE_TESTS]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"--junitxml={junit}", *ids], cwd=clone, env=env, capture_output=True,
                       text=True, timeout=NESTED_TIMEOUT)
    shown = f"rc={r.returncode}\n{r.stdout[-6000:]}\n{r.stderr[-3000:]}"
    assert r.returncode == 0, shown
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        bad = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name")] = bad[0] if bad else "passed"
    if not CI and set(outcomes.values()) == {"skipped"}:   # e.g. no LXC on this machine
        pytest.skip(f"the nested run skipped its tests:\n{r.stdout[-2000:]}")
    assert outcomes == {name: "passed" for name in HOSTILE_TESTS}, shown
    assert "mldiag test lab: up in" in r.stdout, shown     # the clone's own lab ran them
    assert not running_labs(), "the nested run left its lab running"


def test_a_second_lab_refuses_to_start_while_one_runs(lab):
    """What the nested run relies on, held by the lab itself: while a lab runs, Lab.start fails
    at once with the reason, and the running lab's sudoers rules (sudo finds its pct) are as
    they were. Before, a second lab started and left sudo naming its own fakes, then gone."""
    sudoers = SUDOERS_FILE.read_text()
    try:
        second = Lab.start(strict=False)
    except LabError as e:
        assert "another lab is running on this machine" in str(e) and str(lab.dir) in str(e), e
    else:
        second.close()
        pytest.fail("a second lab started beside the running one")
    assert SUDOERS_FILE.read_text() == sudoers
    assert running_labs() == [lab.dir]
    found = ok(lab.ssh("main", "sudo -n sh -c 'command -v pct'")).strip()
    assert found == str(lab.fakes_dir / "pct")
