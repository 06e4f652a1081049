"""A fan-out spread over worker processes (issue 14 goal 4) against the lab's real sshds and
CT 200: the same rows as one process gives, and no more SSH connections. Containers of one host
and hosts behind one jump host stay in one worker, so they still share their connection.
tests/unit/test_shards.py has the table, --save, exit code and worker death on local targets."""

import textwrap

from diagnostics.engine import bundle, runner, shards
from diagnostics.inventory import topology

SERVERS = ("main", "defaults", "jump")


def _row(result):
    return (result.target, result.status, result.summary,
            result.error.layer if result.error else None)


def test_sharded_ssh_targets_and_containers_answer_alike_on_as_many_connections(lab):
    lab.need("lxc")
    containers = "\n".join(f'      ct{i}: {{runtime: pct, id: "200", python: /root/venv/bin/python}}'
                           for i in range(1, 5))
    text = textwrap.dedent("""\
        defaults: {connect_timeout: 5, timeout: 60}
        hosts:
          main: {}
          main-mlzsh: {}
          defaults: {}
          jump: {}
          inner: {}
          refused: {address: 127.0.0.2, port: 1, user: mlsh}
          pve:
            address: main
            become: sudo
            containers:
        """) + containers + "\n"
    topo = topology.load(str(lab.hosts_yaml(text)))
    targets = [t for name, t in topo.targets.items() if name != "local"]
    keys = shards.resolved_keys(targets)
    split = shards.split(targets, 3, keys)
    assert len(split) == 3
    where = {targets[i].name: n for n, share in enumerate(split) for i in share}
    assert len({where[f"ct{i}"] for i in range(1, 5)} | {where["main"]}) == 1
    assert where["jump"] == where["inner"]       # inner's ProxyJump is in ssh_config alone
    by_name = topo.targets
    assert shards.shard_key(by_name["inner"]) != shards.shard_key(by_name["jump"])

    runs = {}
    for workers in (1, 3):
        before = {s: lab.servers[s].connection_count() for s in SERVERS}
        results = runner.run_many(targets, bundle.script_job("ping"), workers=workers)
        runs[workers] = ([_row(r) for r in results],
                         {s: lab.servers[s].connection_count() - before[s] for s in SERVERS})
    (rows_one, conns_one), (rows_three, conns_three) = runs[1], runs[3]
    assert rows_three == rows_one
    assert [r[0] for r in rows_three] == [t.name for t in targets]
    assert {r[0]: r[1] for r in rows_three if r[1] != "ok"} == {"refused": "error"}
    assert conns_three == conns_one, (conns_one, conns_three)
    # main, its 4 CTs and pve (main as mlsh with sudo) share one connection; main-mlzsh its own
    assert conns_three["main"] == 2, conns_three
