"""The two-pass isolation of a slow node from pair measurements (nccl_check/pairs.py), run on
a simulated fleet: a pair's busbw is its slower node's, halved across a bad link."""

import pytest

from diagnostics.builtin.nccl_check import pairs


def fleet(nodes, slow_nodes=(), bad_links=()):
    """busbw of a pair: 100 GB/s, a slow node's 55, a bad link halves it."""
    def measure(pair):
        speed = min(55.0 if n in slow_nodes else 100.0 for n in pair)
        return speed / 2 if frozenset(pair) in {frozenset(l) for l in bad_links} else speed
    return measure


def isolate(nodes, measure, threshold=None):
    """Both passes as the task runs them: every round's pairs measured, then the verdicts."""
    measured = {p: measure(p) for p in pairs.first_pass(nodes)}
    figure = pairs.threshold_of(measured, threshold)
    pass1 = pairs.slow_pairs(measured, figure)
    rounds = pairs.second_pass(pass1)
    for r in rounds:                               # a round's pairs run at once: no node twice
        flat = [n for p in r for n in p]
        assert len(flat) == len(set(flat)), r
    pass2 = pairs.slow_pairs({p: measure(p) for r in rounds for p in r}, figure)
    return pass1, rounds, pairs.verdicts(pass1, pass2)


NODES = [f"n{i}" for i in range(1, 9)]


def test_the_first_pass_pairs_in_order_and_the_odd_node_with_the_first():
    assert pairs.first_pass(NODES[:4]) == [("n1", "n2"), ("n3", "n4")]
    assert pairs.first_pass(NODES[:5]) == [("n1", "n2"), ("n3", "n4"), ("n5", "n1")]
    assert pairs.first_pass(["n1"]) == [] and pairs.first_pass(["n1", "n1", "n2"]) == [("n1", "n2")]


def test_a_slow_node_is_named_and_its_partner_cleared():
    pass1, rounds, (nodes, links) = isolate(NODES, fleet(NODES, slow_nodes={"n6"}), threshold=80.0)
    assert [p for p, slow in pass1.items() if slow] == [("n5", "n6")]
    assert rounds == [[("n5", "n1"), ("n6", "n2")]]
    assert (nodes, links) == ({"n6": "node"}, [])


def test_a_pair_slow_only_together_is_a_link():
    _, _, (nodes, links) = isolate(NODES, fleet(NODES, bad_links=[("n3", "n4")]), threshold=80.0)
    assert (nodes, links) == ({}, [("n3", "n4")])


def test_two_slow_nodes_in_two_pairs_need_known_good_partners_in_turn():
    _, rounds, (nodes, links) = isolate(NODES, fleet(NODES, slow_nodes={"n2", "n7"}), threshold=80.0)
    assert [p for r in rounds for p in r] == [("n1", "n3"), ("n2", "n4"), ("n7", "n5"), ("n8", "n6")]
    assert nodes == {"n2": "node", "n7": "node"} and links == []


def test_more_suspects_than_good_nodes_run_in_rounds():
    nodes6 = NODES[:6]
    _, rounds, (nodes, _) = isolate(nodes6, fleet(nodes6, slow_nodes={"n1", "n3"}), threshold=80.0)
    assert rounds == [[("n1", "n5"), ("n2", "n6")], [("n3", "n5"), ("n4", "n6")]]
    assert nodes == {"n1": "node", "n3": "node"}


def test_without_a_known_good_node_nothing_is_blamed():
    four = NODES[:4]
    _, rounds, (nodes, links) = isolate(four, fleet(four, slow_nodes=set(four)), threshold=80.0)
    assert rounds == [] and links == []
    assert nodes == {n: "undetermined" for n in four}


def test_relative_to_the_median_without_a_threshold():
    busbw = {("a", "b"): 100.0, ("c", "d"): 98.0, ("e", "f"): 60.0}
    assert pairs.threshold_of(busbw) == pytest.approx(78.4)
    assert pairs.slow_pairs(busbw, pairs.threshold_of(busbw)) == {("a", "b"): False, ("c", "d"): False,
                                                                   ("e", "f"): True}
    assert pairs.slow_pairs(busbw, pairs.threshold_of(busbw, pct=50)) == {p: False for p in busbw}
    two = {("a", "b"): 1.0, ("c", "d"): 100.0}
    assert pairs.threshold_of(two) is None and pairs.slow_pairs(two, None) == {p: False for p in two}
    assert pairs.threshold_of(two, threshold=50.0) == 50.0


@pytest.mark.parametrize("slow", NODES)
def test_any_one_slow_node_of_eight_is_found_and_only_it(slow):
    _, _, (nodes, links) = isolate(NODES, fleet(NODES, slow_nodes={slow}))
    assert (nodes, links) == ({slow: "node"}, [])
