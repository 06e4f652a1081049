"""Fan-out over many targets with dead ones among them (DESIGN.md §3.7, issue #4).

A refused port and a black-holed address (an iptables DROP rule inside the jump host's
network namespace: SYNs vanish, the client's connect times out) sit among 16 live targets;
every live target reports, the dead ones are classified, and the run ends within the
black-holed target's connect timeout plus a small margin."""

import subprocess
import textwrap
import time

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology

BLACKHOLE_PORT = 9      # nothing listens there in the jump namespace; the DROP rule makes it silent
CONNECT_TIMEOUT = 5


@pytest.fixture
def blackhole(lab):
    rule = ["iptables", "-w", "-I", "INPUT", "-p", "tcp", "--dport", str(BLACKHOLE_PORT), "-j", "DROP"]
    subprocess.run(lab.netns_argv("jump", rule), check=True, capture_output=True)
    try:
        yield lab.jump.address
    finally:
        rule[2] = "-D"
        subprocess.run(lab.netns_argv("jump", rule), check=False, capture_output=True)


def test_live_targets_report_while_dead_ones_are_classified(lab, blackhole):
    containers = "\n".join(f"      ct{i:02d}: {{runtime: pct, id: \"200\", python: /root/venv/bin/python}}"
                           for i in range(1, 12))
    text = textwrap.dedent(f"""\
        defaults: {{connect_timeout: {CONNECT_TIMEOUT}, timeout: 60}}
        hosts:
          main: {{}}
          main-mlzsh: {{}}
          defaults: {{}}
          jump: {{}}
          inner: {{}}
          refused: {{address: 127.0.0.2, port: 1, user: mlsh}}
          blackholed: {{address: "{blackhole}", port: {BLACKHOLE_PORT}, user: mlsh}}
          pve:
            address: main
            become: sudo
            containers:
        """) + containers + "\n"
    topo = topology.load(str(lab.hosts_yaml(text)))
    targets = list(t for name, t in topo.targets.items() if name != "local")
    assert len(targets) >= 18
    arrival = []
    t0 = time.monotonic()
    results = runner.run_many(targets, bundle.script_job("ping"), parallel=32,
                              on_result=lambda r: arrival.append((r.target, time.monotonic() - t0)))
    elapsed = time.monotonic() - t0
    by_name = {r.target: r for r in results}
    dead = {"refused", "blackholed"}
    for name, r in by_name.items():
        if name not in dead:
            assert r.status == "ok", (name, r.summary)
    assert by_name["refused"].error.layer == "unreachable"
    assert by_name["blackholed"].error.layer == "unreachable"
    assert "timed out" in by_name["blackholed"].error.message
    # the black hole costs its own connect timeout, nothing more, and delays no one else
    assert CONNECT_TIMEOUT <= elapsed < CONNECT_TIMEOUT + 6, elapsed
    assert arrival[-1][0] == "blackholed", arrival
    others_done = max(t for name, t in arrival if name != "blackholed")
    assert others_done < CONNECT_TIMEOUT, arrival
