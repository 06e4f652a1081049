"""Node-set bounds (issue 10 item 13): sizes are checked before anything is expanded, so a
node-set bomb costs an error, not minutes and gigabytes. Asserted through the error, never
through time."""

import os
import stat

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.core import nodeset
from diagnostics.inventory import topology
from diagnostics.core.errors import InputError
from diagnostics.transport import slurm
from tests.programs import mldiag



@pytest.mark.parametrize("text,size", [
    ("n1", 1), ("n[1-10]", 10), ("n[1-10/2]", 5), ("n[1-3,7]", 4), ("n[1-2]p[1-3]", 6),
    ("a,b[1-2]", 3), ("n[1-10]!n[1-5]", 15),      # operators: an over-estimate
])
def test_size_bound_is_never_below_the_expansion(text, size):
    assert nodeset.size_bound(text) == size
    assert len(nodeset.expand(text)) <= size


@pytest.mark.parametrize("bomb", ["n[1-2000000]", "n[1-1000]p[1-1000]",
                                  ",".join(["n[1-99999]"] * 400)])
def test_expand_refuses_a_bomb_before_expanding(bomb):
    with pytest.raises(nodeset.TooManyNodes, match=r"at most 100000"):
        nodeset.expand(bomb)


def test_the_bound_itself_is_allowed():
    assert len(nodeset.expand("n[1-100000]")) == nodeset.MAX_NODES


def test_split_and_fold():
    assert nodeset.split_top_level("a[1,2],b,,c") == ["a[1,2]", "b", "", "c"]
    assert nodeset.fold(["n2", "n1", "n3", "b", "n1"]) == "b,n[1-3]"


def test_a_group_repeating_a_big_node_set_is_refused_with_its_line():
    text = ('hosts:\n  "n[1-9999]": {}\ngroups:\n  ok: "n[1-9999]"\n'
            '  bomb: "' + ",".join(["n[1-9999]"] * 400) + '"\n')
    with pytest.raises(InputError) as err:
        topology.loads(text, "h.yaml")
    assert str(err.value).startswith("h.yaml:5: groups.bomb: ")
    assert "names up to 3999600 targets (at most 100000)" in str(err.value)


def test_a_list_of_repeated_groups_is_bounded_by_the_file_budget():
    members = "\n".join("    - all" for _ in range(200))
    text = f'hosts:\n  "n[1-9999]": {{}}\ngroups:\n  all: "n[1-9999]"\n  bomb:\n{members}\n'
    with pytest.raises(InputError, match=r"h.yaml:\d+: groups.bomb\[\d+\]: more than 500000 names "
                                         r"in one hosts file"):
        topology.loads(text, "h.yaml")


def test_too_many_hosts_in_one_file():
    text = 'hosts:\n  "a[1-60000]": {}\n  "b[1-60000]": {}\n'
    with pytest.raises(InputError, match=r"h.yaml:3: hosts.b\[1-60000\]: more than 100000 hosts"):
        topology.loads(text, "h.yaml")


def test_host_flags_are_bounded_together():
    topo = topology.loads('hosts:\n  "n[1-9999]": {}\n', "h.yaml")
    assert len(topo.select(["n[1-9999]"] * 3)) == 9999
    with pytest.raises(InputError, match=r"more than 100000 names in the --host values"):
        topo.select(["n[1-9999]"] * 11)
    with pytest.raises(InputError, match=r"at most 100000"):
        topo.select([",".join(["n[1-9999]"] * 400)])


def test_slurm_rows_count_as_their_nodes():
    topo = topology.loads("hosts:\n  c: {address: login, slurm: {nodes: 2}}\n", "h.yaml")
    assert [t.slurm.nodes for t in topo.select(["c:n[1-3]"])] == [3]
    with pytest.raises(InputError, match=r"more than 100000 names in the --host values"):
        topo.select(["c:n[1-99999]"] * 3)


def test_the_command_line_exits_4_on_a_bomb(tmp_path):
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text('hosts:\n  "n[1-99]": {}\ngroups:\n  g: "' + ",".join(["n[1-99999]"] * 400) + '"\n')
    assert len(hosts.read_bytes()) < 6000
    r = mldiag("ping", "--hosts-file", hosts, "-H", "n1")
    assert r.returncode == 4, r.stderr
    assert f"{hosts}:4: groups.g: " in r.stderr and "at most 100000" in r.stderr
    hosts.write_text('hosts:\n  "n[1-99]": {}\n')
    r = mldiag("ping", "--hosts-file", hosts, "-H", "n[1-2000000]")
    assert r.returncode == 4 and "at most 100000" in r.stderr, r.stderr


# ------------------------------------------------ a Slurm login node's answer is untrusted

@pytest.mark.parametrize("answer,message", [
    ("n[1-2000000]\n", "at most 100000"),
    ("\n", "no nodes"),
    ("n1,n$(reboot)\n", "not a plain node name"),
])
def test_allocated_nodes_refuses_bad_answers(answer, message):
    with pytest.raises(ValueError, match=message.replace("$", r"\$").replace("(", r"\(")):
        slurm.allocated_nodes(answer)


def test_allocated_nodes():
    assert slurm.allocated_nodes("n[1-3],gpu7\n") == ["gpu7", "n1", "n2", "n3"]   # ClusterShell's order


def _fake_slurm(bindir, log):
    """salloc/squeue/scancel on PATH, as a login node that answers a node-set bomb."""
    scripts = {
        "salloc": "echo 'salloc: Granted job allocation 4242' >&2",
        "squeue": "echo 'n[1-2000000]'",
        "scancel": f"echo \"scancel $*\" >> {log}",
    }
    for name, body in scripts.items():
        path = bindir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_a_login_node_answering_a_bomb_is_an_error_row_and_the_allocation_is_cancelled(
        tmp_path, monkeypatch):
    bindir, log = tmp_path / "bin", tmp_path / "scancel.log"
    bindir.mkdir()
    _fake_slurm(bindir, log)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    topo = topology.loads("hosts:\n  login:\n    local: true\n    slurm: {nodes: 2}\n", "h.yaml")
    results = runner.run_many(topo.select(["login", "local"]), bundle.script_job("ping"))
    by_name = {r.target: r for r in results}
    assert sorted(by_name) == ["local", "login"]
    assert by_name["local"].status == "ok", by_name["local"].summary
    row = by_name["login"]
    assert row.status == "error" and row.error.layer == "unreachable", row.to_dict()
    assert "allocation 4242 on login" in row.error.message and "at most 100000" in row.error.message
    assert log.read_text() == "scancel 4242\n"


# Mutation testing (setup.cfg) found these edges untested.

@pytest.mark.parametrize("text,size", [
    ("n[5-5]", 1), ("n[5-3]", 1),          # a one-element and a reversed range
    ("nX[1-5]", 5),                        # 'X' is a plain name character, not a separator
])
def test_size_bound_edges(text, size):
    assert nodeset.size_bound(text) == size


def test_split_top_level_tracks_nested_brackets():
    assert nodeset.split_top_level("a[[1],2],b") == ["a[[1],2]", "b"]
    assert nodeset.split_top_level("aXb,c") == ["aXb", "c"]


def test_group_syntax_is_off():
    # With ClusterShell's default resolver `@x` is a group lookup (empty without groups.conf).
    assert nodeset.expand("@x") == ["@x"]
    assert nodeset.fold(["@x"]) == "@x"


def test_an_empty_node_set_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"^node set 'a!a' is empty$"):
        nodeset.expand("a!a")


def test_a_long_node_set_is_cut_to_80_characters_in_errors():
    exact, longer = "a[" + "1" * 78, "a[" + "1" * 79
    with pytest.raises(ValueError) as error:
        nodeset.expand(exact)
    assert str(error.value).startswith(f"invalid node set {exact!r}:")
    with pytest.raises(ValueError) as error:
        nodeset.expand(longer)
    assert str(error.value).startswith(f"invalid node set {longer[:80] + '...'!r}:")


def test_a_budget_may_be_spent_to_zero():
    budget = nodeset.Budget(5, "this test")
    budget.spend(5)
    assert budget.left == 0
    with pytest.raises(nodeset.TooManyNodes, match=r"more than 5 names in this test"):
        budget.spend(1)


def test_a_budget_counts_a_node_set_of_exactly_max_nodes():
    budget = nodeset.Budget(nodeset.MAX_NODES + 10, "this test")
    assert len(budget.expand(f"n[1-{nodeset.MAX_NODES}]")) == nodeset.MAX_NODES
    assert budget.left == 10


def test_fold_keeps_names_the_parser_reads_otherwise_as_written():
    # 'a!b' reads back as one node 'a', ' a' as 'a': neither is folded.
    assert nodeset.fold(["a!b", " a"]) == " a,a!b"
    # plain names follow the folded set, in natural order (9 before 10), joined by ','
    assert nodeset.fold(["a,10", "n2", "a,9", "n1"]) == "n[1-2],a,9,a,10"


def test_group_member_node_sets_count_against_the_file_budget(monkeypatch):
    # the file budget, made small: the host key spends 4, g0's node set 4, g1's would reach 12
    monkeypatch.setattr(nodeset, "MAX_FILE_NAMES", 10)
    text = "hosts:\n  n[1-4]: {}\ngroups:\n  g0: n[1-4]\n  g1: n[1-4]\n"
    with pytest.raises(InputError, match=r"^h\.yaml:5: groups\.g1: more than 10 names in one "
                                         r"hosts file"):
        topology.loads(text, "h.yaml")


def test_fold_folds_an_at_name_with_the_others():
    assert nodeset.fold(["n1", "@x"]) == "@x,n1"     # read back as itself: not a plain leftover
