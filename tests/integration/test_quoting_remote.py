"""Many generated argv lists arrive byte-identical in sys.argv through
ssh → sudo → pct → venv python, with sh and with zsh as the remote login shell.

One batched run: every generated argv list is its own target row on one shared SSH
connection (not one connection per example)."""

import json
import os
import shlex
import string

from hypothesis import HealthCheck, given, settings, strategies as st

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology
from diagnostics.transport.ssh import SshPool
from diagnostics.inventory.topology import is_safe_token

NASTY = ["'", '"', "$(id)", "`id`", "{a,b}", "*", "?", "[ab]", "=ls", "~root", "\n", "", "-c",
         "--json", "ü", "\\", ";", "|", "&", "!", "#", "%", " ", "${HOME}", "a b", "l1\nl2",
         "-", "--", ">x", "<y", "(", ")", "\r", "\t", "日本"]
argument = st.one_of(st.sampled_from(NASTY),
                     st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
                     st.text(alphabet=string.printable.replace("\x00", "")),
                     st.builds("".join, st.lists(st.sampled_from(NASTY), max_size=6)))
argv_lists = st.lists(argument, max_size=8)

ECHO = b"import json, sys\nsys.stdout.write(json.dumps(sys.argv[1:]))\n"
N_LISTS = 24


def hosts_text():
    lines = ["hosts:"]
    for user, shell in (("main", "sh"), ("main-mlzsh", "zsh")):
        lines += [f"  pve-{shell}:", f"    address: {user}", "    become: sudo", "    containers:"]
        lines += [f"      ct-{shell}-{i}: {{runtime: pct, id: \"200\", python: /root/venv/bin/python}}"
                  for i in range(N_LISTS)]
    return "\n".join(lines) + "\n"


@settings(max_examples=2, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(st.lists(argv_lists, min_size=N_LISTS, max_size=N_LISTS))
def test_generated_argv_lists_arrive_byte_identical_with_sh_and_zsh(lab, batch):
    topo = topology.load(str(lab.hosts_yaml(hosts_text())))
    record = os.environ["MLDIAG_RECORD_COMMANDS"]       # tests/conftest.py: every line sent
    start = os.path.getsize(record) if os.path.exists(record) else 0
    for shell in ("sh", "zsh"):
        targets = [topo.targets[f"ct-{shell}-{i}"] for i in range(N_LISTS)]
        by_name = {t.name: argv for t, argv in zip(targets, batch)}

        def job(target):
            return bundle.Job("run-script", "echo_argv.py", ECHO, argv=tuple(by_name[target.name]),
                              mode="script")

        pool = SshPool()
        results = runner.run_many(targets, job, pool=pool)
        assert pool.opened == 1
        for r in results:
            assert r.status == "ok", r.to_dict()
            assert json.loads(r.data["stdout"]) == by_name[r.target], r.target
    # and nothing but safe tokens (and the bootstrap constant) crossed a shell
    with open(record, "rb") as f:
        f.seek(start)
        sent = [shlex.split(json.loads(line)["line"]) for line in f.read().splitlines()]
    assert len(sent) >= 2 * N_LISTS
    for argv in sent:
        assert all(t == bundle.BOOT or is_safe_token(t) for t in argv), argv
