"""Issue 30 §3 over the lab's real sshd: a runbook's ``run-script`` step, its script and put file
beside the runbook, through `mldiag runbook` (a subprocess, as a user runs it) → ssh main as
mlzsh (zsh as its login shell) → the host's python, and → sudo → pct 200 → /root/venv/bin/python.
The script reports a warning through $MLDIAG_RESULT; a later step runs only where it did."""

import json
import textwrap
from functools import partial

from tests import programs
from tests.integration.test_run_script_inline import hosts  # noqa: F401 (a fixture)

mldiag = partial(programs.mldiag, timeout=240)
USERS = {"main-mlzsh": "mlzsh", "ct": "root"}

PROBE = textwrap.dedent("""\
    import getpass, json, os, sys
    limits = json.load(open("limits.json"))
    user = getpass.getuser()
    print("probing", *sys.argv[1:])
    findings = [{"level": "warn", "code": "slow-link", "message": f"{sys.argv[1]} below "
                 f"{limits['gbps']} Gb/s on {sys.argv[2]}", "hint": "reseat the cable"}]
    with open(os.environ["MLDIAG_RESULT"], "w") as f:
        json.dump({"summary": f"checked as {user}", "findings": findings,
                   "data": {"user": user, "argv": sys.argv[1:]}}, f)
    """)


def test_a_run_script_step_beside_the_runbook_reports_through_mldiag_result(hosts, tmp_path):  # noqa: F811
    books = tmp_path / "books"
    (books / "checks").mkdir(parents=True)
    (books / "checks" / "probe.py").write_text(PROBE)
    (books / "checks" / "limits.json").write_text('{"gbps": 400}')
    (books / "link.yaml").write_text(textwrap.dedent("""\
        description: a team's link check
        params: {iface: {description: the interface, default: ib0}}
        steps:
          - id: probe
            task: run-script
            args:
              script: checks/probe.py
              args: ["{{ params.iface }}", "{{ target.name }}"]
              put: [checks/limits.json]
          - id: closer
            task: run-script
            when: probe.warn
            args:
              code: |
                import os, sys
                print("closer look on", sys.argv[1], "in", os.path.basename(os.getcwd())[:7])
              args: ["{{ target.name }}"]
          - task: ping
            when: probe.fail
        """))
    save = tmp_path / "out"
    r = mldiag("runbook", "link", "--runbooks-dir", books, "--hosts-file", hosts,
               "-H", ",".join(USERS), "--param", "iface=mlx5_0", "--save", save)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)     # the worst: warn
    assert (save / "report.md").read_text() == r.stdout
    doc = json.loads((save / "report.json").read_text())
    probe, closer, ping = doc["steps"]
    assert probe["title"] == "probe.py" and closer["title"] == "inline code"
    for result in probe["results"]:
        target, user = result["target"], USERS[result["target"]]
        assert (result["status"], result["summary"]) == ("warn", f"checked as {user}"), result
        assert result["findings"] == [{"level": "warn", "code": "slow-link",
                                       "message": f"mlx5_0 below 400 Gb/s on {target}",
                                       "hint": "reseat the cable"}]
        assert result["data"]["reported"] == {"user": user, "argv": ["mlx5_0", target]}
        assert result["data"]["stdout"] == f"probing mlx5_0 {target}\n"
    assert {r["target"]: r["data"]["stdout"] for r in closer["results"]} == {
        t: f"closer look on {t} in mldiag-\n" for t in USERS}
    assert ping["results"] == [] and {s["kind"] for s in ping["skipped"]} == {"when"}
    assert "| 1. probe: probe.py | warn |" in r.stdout
    assert "| 2. closer: inline code | ok |" in r.stdout
    for target in USERS:
        assert (f"- **warn** · 1. probe · {target} · `slow-link`: mlx5_0 below 400 Gb/s on "
                f"{target}\n  - hint: reseat the cable") in r.stdout
