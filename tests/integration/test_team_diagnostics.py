"""Issue 30 §2 over the lab: a team's diagnostic (tests/fixtures/team/probe.py, the tests' own)
reaches every kind of target a built-in does, through `mldiag` as a user runs it: ssh main
(mlsh, sh), main-mlzsh (zsh login shell), a host behind a jump host, sudo → pct 200 →
/root/venv/bin/python, and two Slurm nodes through srun. Its flags arrive byte for byte (a
hostile value: quotes, $(), a newline and a marker test_command_lines.py looks for on every
command line the suite sent), its companions are shipped beside it, its result is validated at
the client's gate, and the private temp dir is gone afterwards."""

import json
import shutil
import textwrap
from functools import partial
from pathlib import Path

import pytest

from tests import programs

mldiag = partial(programs.mldiag, timeout=240)
FIXTURE = Path(programs.REPO) / "tests" / "fixtures" / "team"
HOSTILE = "naïve $(id) `id` 'sq' \"dq\" * ~root \\ |;&! l1\nl2 s3cr3t-team-lab"
USERS = {"main": "mlsh", "main-mlzsh": "mlzsh", "inner": "mlsh", "ct": "root"}


@pytest.fixture(scope="module")
def hosts(lab, tmp_path_factory):
    lab.need("lxc")
    lab.need("slurm")
    checks = tmp_path_factory.mktemp("team") / "checks"
    shutil.copytree(FIXTURE, checks)
    return lab.hosts_yaml(textwrap.dedent(f"""\
        diagnostics: {checks}
        defaults: {{connect_timeout: 5, timeout: 120}}
        hosts:
          main: {{}}
          main-mlzsh: {{}}
          inner: {{}}
          pve:
            address: main
            become: sudo
            containers:
              ct: {{runtime: pct, id: "200", python: /root/venv/bin/python}}
          cluster:
            address: main
            slurm: {{nodes: 2, time: "00:05:00"}}
        """))


def test_a_team_diagnostic_runs_on_every_kind_of_target_with_its_flags_intact(lab, hosts):
    r = mldiag("probe", "--hosts-file", hosts, "-H", "main,main-mlzsh,inner,ct,cluster",
               "--level", "warn", "--echo", HOSTILE, "--echo", "-x", "--json")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    assert sorted(docs) == sorted(["main", "main-mlzsh", "inner", "ct", "cluster:n1",
                                   "cluster:n2"])
    for target, doc in docs.items():
        assert doc["status"] == "warn" and doc["error"] is None, doc
        assert doc["findings"] == [{"level": "warn", "code": "probe-0",
                                    "message": "look at this"}], doc     # the companions came
        assert doc["data"]["echo"] == [HOSTILE, "-x"]
        assert doc["data"]["here"] == "mldiag-"                  # in the run's private dir
        if target in USERS:
            assert doc["summary"] == f"probed as {USERS[target]}"


def test_a_wrong_result_and_a_crash_are_that_targets_rows(lab, hosts):
    r = mldiag("probe", "--hosts-file", hosts, "-H", "main-mlzsh,ct", "--shape", "bad-finding",
               "--json")
    assert r.returncode == 3, (r.stdout, r.stderr)
    for doc in json.loads(r.stdout):
        assert doc["error"]["layer"] == "protocol", doc
        assert doc["error"]["message"].startswith("probe.py's run() value findings[0].level")
    c = mldiag("probe", "--hosts-file", hosts, "-H", "main,ct", "--shape", "raise", "--json")
    assert c.returncode == 3
    for doc in json.loads(c.stdout):
        assert (doc["error"]["layer"], doc["error"]["message"]) == ("crashed",
                                                                    "probe was told to fail")


def test_nothing_is_left_in_the_targets_temp_dirs(lab, hosts):
    """mlsh's private dirs on main (the machine's /tmp: other users' are not this run's)."""
    def mine():
        return set(lab.ssh("main", "find /tmp -maxdepth 1 -name 'mldiag-*' -user mlsh").stdout.split())
    before = mine()
    r = mldiag("probe", "--hosts-file", hosts, "-H", "main", "--quiet", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["status"] == "ok"
    assert mine() - before == set()
