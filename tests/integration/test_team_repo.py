"""docs/extending.md's team repository (tests/fixtures/team-repo) against the lab, as a team
runs it: `inv` in the repository's own directory loads its tasks.py — every mldiag task through
`api.collection()`, its checks/ diagnostic `disk-free` (named by hosts.yaml's `diagnostics:`)
and its own `inv preflight`, which chains two `api.run` calls — on ssh main (mlsh) and sudo →
pct 200. Only hosts.yaml's hosts are the lab's; the rest is the example as the docs show it."""

import shutil
import textwrap
from pathlib import Path

import pytest

from tests import programs

FIXTURE = Path(programs.REPO) / "tests" / "fixtures" / "team-repo"


@pytest.fixture(scope="module")
def repo(lab, tmp_path_factory):
    lab.need("lxc")
    root = tmp_path_factory.mktemp("repo") / "team repo"     # a path with a space, too
    shutil.copytree(FIXTURE, root)
    (root / "hosts.yaml").write_text(textwrap.dedent("""\
        diagnostics: checks
        runbooks: runbooks
        defaults: {connect_timeout: 5, timeout: 120}
        hosts:
          main: {}
          pve:
            address: main
            become: sudo
            containers:
              ct: {runtime: pct, id: "200", python: /root/venv/bin/python}
        """))
    return root


def inv(repo, *argv):
    return programs.inv(*argv, cwd=repo, timeout=240)


def test_the_team_repos_tasks_are_listed(repo):
    r = inv(repo, "--list")
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.splitlines()[2:] if line.strip()
             and not line.startswith("    ")]
    assert {"preflight", "disk-free", "gpu-status", "runbook", "run-script"} <= set(names), names
    h = inv(repo, "--help", "preflight")
    assert h.returncode == 0, h.stderr
    assert "--min-free-gb" in h.stdout and "least free space on / and /tmp" in h.stdout
    assert "-H STRING, --host=STRING" in h.stdout or "--host" in h.stdout


def test_preflight_chains_two_runs_and_exits_with_the_worst(repo):
    ok = inv(repo, "preflight", "-H", "main", "-H", "ct")
    assert ok.returncode in (0, 1), (ok.returncode, ok.stdout, ok.stderr)   # gpu-status's fake
    lines = sorted(ok.stdout.splitlines())
    assert [line.split(":")[0] for line in lines] == ["ct", "main"], ok.stdout
    assert all(", disk ok (2 path(s) checked)" in line for line in lines), ok.stdout
    short = inv(repo, "preflight", "-H", "main,ct", "--min-free-gb", "1e9")
    assert short.returncode == 1 or short.returncode == ok.returncode, short.stderr
    assert all(", disk warn (2 path(s) checked)" in line
               for line in short.stdout.splitlines()), short.stdout
    bad = inv(repo, "preflight", "-H", "nosuchbox")
    assert bad.returncode == 4 and bad.stdout == ""
    assert bad.stderr.startswith("mldiag: unknown target 'nosuchbox'"), bad.stderr


def test_the_runbook_runs_the_team_check_as_a_step(repo):
    r = inv(repo, "runbook", "before-training", "-H", "main,ct", "--param", "floor=1000000",
            "--json")
    assert r.returncode in (1, 2), (r.returncode, r.stdout[-2000:], r.stderr)
    import json
    doc = json.loads(r.stdout)
    disk, gpus = doc["steps"]
    assert [x["status"] for x in disk["results"]] == ["warn", "warn"]
    assert sorted(x["target"] for x in gpus["results"]) == ["ct", "main"]   # when: held
