"""Issue 30 §3 over the lab's real sshd: a `run-script` script reports findings through
$MLDIAG_RESULT, through `mldiag` (a subprocess, as a user runs it) → ssh main (user mlsh, sh;
and mlzsh, zsh) → the host's python, and → sudo → pct 200 → /root/venv/bin/python (dash as
its /bin/sh). The script only shells out: sh writes the file through the variable it
inherited. A link planted at the path is refused on each target, never followed."""

import json
from functools import partial

from tests import programs
from tests.integration.test_run_script_inline import TARGETS, hosts  # noqa: F401 (a fixture)

mldiag = partial(programs.mldiag, timeout=240)
USERS = {"main": "mlsh", "main-mlzsh": "mlzsh", "ct": "root"}

SHELLS_OUT = r"""
import subprocess
subprocess.run(["sh", "-c", '''
u=$(id -un)
echo "checking as $u"
printf '{"summary": "checked as %s", "findings": [{"level": "warn", "code": "slow-link", ' "$u" \
    > "$MLDIAG_RESULT"
printf '"message": "%s", "hint": "reseat"}], "data": {"user": "%s"}}' "$u" "$u" >> "$MLDIAG_RESULT"
'''], check=True)
"""

PLANTS_A_LINK = """\
import os
os.symlink("/etc/passwd", os.environ["MLDIAG_RESULT"])
print("planted")
"""


def docs(r):
    return {d["target"]: d for d in json.loads(r.stdout)}


def test_a_script_that_only_shells_out_reports_findings_on_every_hop(hosts):
    r = mldiag("run-script", "-c", SHELLS_OUT, "--hosts-file", hosts, "-H", ",".join(TARGETS),
               "--json")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)   # the worst: warn
    for target, doc in docs(r).items():
        user = USERS[target]
        assert (doc["status"], doc["summary"]) == ("warn", f"checked as {user}"), doc
        assert doc["findings"] == [{"level": "warn", "code": "slow-link", "message": user,
                                    "hint": "reseat"}]
        assert doc["data"]["reported"] == {"user": user}
        assert doc["data"]["exit_code"] == 0 and doc["data"]["stdout"] == f"checking as {user}\n"


def test_a_link_planted_at_the_path_is_a_protocol_error_on_every_hop(hosts):
    r = mldiag("run-script", "-c", PLANTS_A_LINK, "--hosts-file", hosts, "-H", ",".join(TARGETS),
               "--json")
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "root:" not in r.stdout
    for doc in docs(r).values():
        assert doc["error"]["layer"] == "protocol", doc
        assert doc["summary"] == ("protocol: the script's $MLDIAG_RESULT is a symbolic link, "
                                  "not followed")
        assert doc["data"]["stdout"] == "planted\n" and doc["data"]["exit_code"] == 0
