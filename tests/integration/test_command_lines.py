"""No command line sent to any hop, across the whole suite, holds anything outside the safe
alphabet (DESIGN.md §3 invariant 1; issue 5 §5).

tests/conftest.py sets $MLDIAG_RECORD_COMMANDS for the session, so every command line sent by
any test (in this process or in an `mldiag` subprocess) was appended, exactly as sent, to one
file; this module runs last and checks each line with its own rules, not the product's."""

import json
import os
import re
import shlex
import textwrap

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology

# The only allowed exception: the fixed bootstrap constant (checked shell-inert on its own).
BOOT = "import sys;b=sys.stdin.buffer;exec(b.read(int(b.readline())))"
SAFE_TOKEN = re.compile(r"[A-Za-z0-9_@%+,./:-]+")
# Values that tests put into scripts' argv, env and files: none may reach a command line.
USER_DATA = ("s3cr3t", "hf_", "PRIVATE KEY", "mldiag-lab-hang", "mldiag-fault-", "mldiag-sigint-")


def _recorded():
    path = os.environ.get("MLDIAG_RECORD_COMMANDS")
    assert path, "tests/conftest.py did not turn the recorder on"
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _make_some_traffic(lab):
    """Run alone (e.g. `pytest tests/integration/test_command_lines.py`), the file is empty:
    send the kinds of command line the suite sends (jump, sudo, pct, podman, local)."""
    topo = topology.load(str(lab.hosts_yaml(textwrap.dedent("""\
        hosts:
          local: {local: true}
          inner: {}
          pve:
            address: main
            become: sudo
            containers:
              ct: {runtime: pct, id: "200", python: /root/venv/bin/python}
              pod: {runtime: podman, id: podbox, python: /usr/bin/python3.11}
        """))))
    job = bundle.Job("run-script", "probe.py", b"import sys\nprint(sys.argv[1:])\n",
                     argv=("s3cr3t value; rm -rf ~",), mode="script")
    results = runner.run_many(list(topo.targets.values()), job)
    assert [r.status for r in results] == ["ok"] * len(topo.targets), [r.summary for r in results]


def test_every_command_line_sent_was_safe(lab):
    records = _recorded()
    if not any(r["hop"] == "ssh" for r in records):
        _make_some_traffic(lab)
        records = _recorded()
    by_hop = {}
    for r in records:
        by_hop.setdefault(r["hop"], []).append(r["line"])
    assert len(by_hop.get("ssh", [])) >= 3, by_hop.keys()
    bad = []
    for r in records:
        line = r["line"]
        if "\n" in line or any(secret in line for secret in USER_DATA):
            bad.append(line)
            continue
        for token in shlex.split(line):
            if token == BOOT:
                continue
            if not SAFE_TOKEN.fullmatch(token) or token[0] in "=~":
                bad.append(line)
                break
    assert bad == [], f"{len(bad)} unsafe command lines of {len(records)}: {bad[:5]}"
    # what was checked, for the log: many lines, through every kind of hop
    kinds = {word for line in by_hop["ssh"] for word in ("sudo", "pct", "podman", "srun", "salloc")
             if f" {word} " in f" {line} "}
    print(f"checked {len(records)} command lines ({ {h: len(v) for h, v in by_hop.items()} }); "
          f"hops seen: {sorted(kinds)}")
