"""A team diagnostic that runs on groups (``GROUP_SIZE``, engine/team.py): the registry's group
feature, which nccl-check uses, open to a team's own checks. Here, a check written with the
standard library alone: in each group the first member listens at the address the engine hands
every member (--master), the other connects, and each says who it met."""

import json
import textwrap

import pytest

from tests.programs import mldiag

MEET = '''\
"""Two members meet over TCP: each says whom it met (a team diagnostic run on groups)."""
import argparse
import os
import socket
import time

GROUP_SIZE = {size}


def build_parser():
    p = argparse.ArgumentParser()
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--master", default="")
    p.add_argument("--greeting", default="hello")
    return p


def run(args):
    host, port = args.master.rsplit(":", 1)
    me = (args.greeting + " from " + os.environ.get("MEMBER", "?")).encode()
    if args.node_rank == 0:
        server = socket.create_server(("", int(port)))
        server.settimeout(30)
        peers = []
        for _ in range(args.nodes - 1):
            conn, _ = server.accept()
            peers.append(conn.recv(200).decode())
            conn.sendall(me)
            conn.close()
        server.close()
    else:
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        conn.sendall(me)
        peers = [conn.recv(200).decode()]
        conn.close()
    return {{"summary": "rank %d of %d met %s" % (args.node_rank, args.nodes, ", ".join(sorted(peers))),
             "data": {{"rank": args.node_rank, "nodes": args.nodes, "met": sorted(peers)}}}}
'''


def team(tmp_path, size, names=("n1", "n2", "n3", "n4")):
    d = tmp_path / "team"
    d.mkdir()
    (d / "meet.py").write_text(MEET.format(size=size))
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("diagnostics: team\nhosts:\n" + "".join(
        f"  {n}: {{local: true, python: /usr/bin/python3, env: {{MEMBER: {n}}}}}\n" for n in names))
    return hosts


def test_a_team_diagnostic_runs_on_groups_of_two(tmp_path):
    r = mldiag("meet", "--hosts-file", team(tmp_path, 2), "-H", "n1,n2,n3,n4", "--greeting", "hi", "--json",
               timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    docs = {d["target"]: d["data"] for d in json.loads(r.stdout)}
    assert docs == {"n1": {"rank": 0, "nodes": 2, "met": ["hi from n2"]},
                    "n2": {"rank": 1, "nodes": 2, "met": ["hi from n1"]},
                    "n3": {"rank": 0, "nodes": 2, "met": ["hi from n4"]},
                    "n4": {"rank": 1, "nodes": 2, "met": ["hi from n3"]}}


def test_group_size_0_is_one_group_of_all_and_a_runbook_step_runs_it_alike(tmp_path):
    hosts = team(tmp_path, 0, names=("n1", "n2", "n3"))
    books = tmp_path / "books"
    books.mkdir()
    (books / "meet-all.yaml").write_text("description: all meet\nsteps:\n  - task: meet\n")
    r = mldiag("runbook", "meet-all", "--runbooks-dir", books, "--hosts-file", hosts, "-H", "n1,n2,n3", "--json",
               timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    (step,) = json.loads(r.stdout)["steps"]
    assert {x["target"]: x["data"]["met"] for x in step["results"]} == {
        "n1": ["hello from n2", "hello from n3"], "n2": ["hello from n1"], "n3": ["hello from n1"]}


def test_the_engines_flags_are_not_the_tasks(tmp_path):
    r = mldiag("meet", "--help", "--hosts-file", team(tmp_path, 2), timeout=60)
    assert r.returncode == 0 and "--greeting" in r.stdout, r.stdout + r.stderr
    assert "--node-rank" not in r.stdout and "--master" not in r.stdout


@pytest.mark.parametrize("body,said", [
    ("GROUP_SIZE = 1\n", "GROUP_SIZE: expected the number of targets in a group"),
    ("GROUP_SIZE = 'two'\n", "GROUP_SIZE: expected the number of targets in a group"),
    ("GROUP_SIZE = 2\n\n\ndef build_parser():\n    import argparse\n    p = argparse.ArgumentParser()\n"
     "    p.add_argument('--nodes', type=int)\n    return p\n",
     "GROUP_SIZE: build_parser() must take --node-rank, --master"),
])
def test_a_bad_group_size_is_named_with_its_file_and_line(tmp_path, body, said):
    d = tmp_path / "team"
    d.mkdir()
    (d / "meet.py").write_text('"""Meet."""\n' + body + "\n\ndef run(args):\n    return {}\n")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("diagnostics: team\nhosts:\n  n1: {local: true}\n")
    r = mldiag("meet", "--hosts-file", hosts, "-H", "n1", timeout=60)
    assert r.returncode == 4, r.stdout + r.stderr
    assert f"{d / 'meet.py'}:2: {said}" in r.stderr, r.stderr
