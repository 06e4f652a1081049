"""Issue 11 items 7 and 11 over the lab's real sshd: ``run-script -c CODE``, ``run-script -``
(the script from stdin) and the script's arguments after ``--``, through `mldiag` (a subprocess,
as a user runs it) → ssh main (user mlsh, sh; and mlzsh, zsh) → the host's python, and → sudo →
pct 200 → /root/venv/bin/python. Code and arguments hold the bytes the quoting layers of
`ssh host 'pct exec 200 -- python -c "..."'` get wrong; they must arrive as they were given."""

import json
import textwrap
from functools import partial

import pytest

from tests import programs

mldiag = partial(programs.mldiag, timeout=240)

# Quotes of both kinds, $(), backticks, globs, braces, a backslash, non-ASCII, a tab, a CR and
# lines: what the script prints back must be exactly this.
S_VALUE = "naïve ☃ 日本 $(id) `id` 'sq' \"dq\" {a,b} * ~root \\ \t|;&!#% \r end"
CODE = ("import json, os, sys\n"
        f"S = {S_VALUE!r}\n"
        "sys.stdout.write(json.dumps([S, os.path.basename(sys.argv[0])] + sys.argv[1:]))\n")
ARGS = ["--json", "-H", "foo", "a b", "$(id)", "`id`", "l1\nl2", "ü", "", "--", "-c", "'", '"',
        "*", "~root"]


@pytest.fixture(scope="module")
def hosts(lab):
    lab.need("lxc")
    return lab.hosts_yaml(textwrap.dedent("""\
        defaults: {connect_timeout: 5, timeout: 120}
        hosts:
          main: {}
          main-mlzsh: {}
          pve:
            address: main
            become: sudo
            containers:
              ct: {runtime: pct, id: "200", python: /root/venv/bin/python}
        """))


def outputs(r):
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    docs = json.loads(r.stdout)
    assert all(d["status"] == "ok" for d in docs), docs
    return {d["target"]: json.loads(d["data"]["stdout"]) for d in docs}


TARGETS = ["main", "main-mlzsh", "ct"]


def test_inline_code_and_its_arguments_arrive_as_given(hosts):
    r = mldiag("run-script", "-c", CODE, "--hosts-file", hosts, "-H", ",".join(TARGETS),
               "--arg", "first", "--json", "--", *ARGS)
    assert outputs(r) == {t: [S_VALUE, "-c", "first", *ARGS] for t in TARGETS}


def test_the_script_from_stdin_and_its_arguments_arrive_as_given(hosts):
    r = mldiag("run-script", "-", "--hosts-file", hosts, "-H", ",".join(TARGETS), "--json",
               "--", *ARGS, input=CODE)
    assert outputs(r) == {t: [S_VALUE, "-", *ARGS] for t in TARGETS}
