"""node-check's clock against this machine's (builtin/node_check/clock.py): the bracket's
arithmetic with injected clocks, what the judge finds over a fleet, and the stamp the runner's
follow-up puts on a real Result. The lab's nodes, and a node whose clock libfaketime shifts, are
in tests/integration/test_node_check_clock.py."""

import math

import pytest

from diagnostics.builtin.node_check import clock, run as node_check_run
from diagnostics.core.results import Result


def result(target, wall=None, run_s=None, sent=None, received=None, status="ok"):
    data = {}
    if wall is not None:
        data["clock"] = {"wall_s": wall, "run_s": run_s}
    if sent is not None:
        data[clock.KEY] = {"sent_s": sent, "received_s": received}
    return Result("node-check", target, status, "healthy", data=data)


def node(target, offset, bound=0.1, run_s=2.0, sent=1000.0):
    """A node whose clock is ``offset`` ahead of this machine's, its answer taking ``2 * bound``
    beyond its own run: its wall reading at the very end of the run."""
    received = sent + run_s + 2 * bound
    true_end = received - bound          # anywhere in the bracket; the middle here
    return result(target, wall=true_end + offset, run_s=run_s, sent=sent, received=received)


def test_the_bracket_is_the_transports_part_of_the_run():
    """The node read 1010.0 at its run's end; this machine sent at 1000.0 and had the answer at
    1003.0; the run took 2.5 s on the node: it ended at a client time in [1002.5, 1003.0]."""
    offset, bound = clock.offset_of(result("a", wall=1010.0, run_s=2.5, sent=1000.0, received=1003.0).data)
    assert (offset, bound) == (pytest.approx(7.25), pytest.approx(0.25))


@pytest.mark.parametrize("run_s", [None, -1.0, 3.5, "2", True, math.inf])
def test_a_run_time_the_bracket_cannot_hold_is_not_trusted(run_s):
    """The node's run_s is the target's word: longer than the whole bracket, negative or not a
    number, the looser bracket (the reading anywhere between sent and received) is used."""
    offset, bound = clock.offset_of(result("a", wall=1010.0, run_s=run_s, sent=1000.0, received=1003.0).data)
    assert (offset, bound) == (pytest.approx(8.5), pytest.approx(1.5))


@pytest.mark.parametrize("data", [
    {},                                                            # an older node_check.py
    {"clock": {"wall_s": 5.0, "run_s": 1.0}},                        # not stamped here
    {clock.KEY: {"sent_s": 1.0, "received_s": 2.0}},                   # the node said nothing
    {"clock": {"wall_s": "5", "run_s": 1.0}, clock.KEY: {"sent_s": 1.0, "received_s": 2.0}},
    {"clock": {"wall_s": math.nan, "run_s": 1.0}, clock.KEY: {"sent_s": 1.0, "received_s": 2.0}},
    {"clock": {"wall_s": True, "run_s": 1.0}, clock.KEY: {"sent_s": 1.0, "received_s": 2.0}},
    {"clock": [5.0], clock.KEY: {"sent_s": 1.0, "received_s": 2.0}},
    {"clock": {"wall_s": 5.0}, clock.KEY: {"sent_s": 3.0, "received_s": 2.0}},
])
def test_not_measured(data):
    assert clock.offset_of(data) is None


def codes(found, target):
    return [(f.code, f.level, f.action) for f in found.get(target, [])]


def test_one_node_off_among_three():
    results = [node("a", 0.0), node("b", 0.05), node("c", 30.0)]
    found = clock.findings(results)
    assert list(found) == ["c"]
    assert codes(found, "c") == [("clock-offset", "warn", "monitor"), ("clock-skew", "warn", "monitor")]
    assert [f.message for f in found["c"]] == [
        "the clock is 30.000 s ahead of this machine's (± 0.100 s, measured by mldiag)",
        "the clock is 29.950 s ahead of the median of the 3 nodes measured (± 0.200 s)"]
    assert all(f.check == "host" for f in found["c"])
    for r in results:
        assert r.data[clock.KEY]["nodes_spread_s"] == pytest.approx(30.0)
        assert r.data[clock.KEY]["nodes_spread_bound_s"] == pytest.approx(0.2)
    assert results[2].data[clock.KEY]["offset_s"] == pytest.approx(30.0)
    assert results[2].data[clock.KEY]["bound_s"] == pytest.approx(0.1)


def test_every_node_off_alike_is_this_machines_clock():
    """Each node 5 s behind this machine: clock-offset on each (its hint names this machine),
    no clock-skew: the nodes agree with each other."""
    found = clock.findings([node(n, -5.0) for n in "abcd"])
    assert [codes(found, n) for n in "abcd"] == [[("clock-offset", "warn", "monitor")]] * 4
    assert found["a"][0].message == "the clock is 5.000 s behind this machine's (± 0.100 s, measured by mldiag)"
    assert "this machine's clock" in found["a"][0].hint


@pytest.mark.parametrize("offset, bound, flagged", [
    (1.05, 0.1, False),       # could be 0.95: within the limit once the bound is subtracted
    (1.15, 0.1, True),
    (-1.15, 0.1, True),
    (3.0, 2.5, False),        # a slow link: no claim the bracket cannot back
])
def test_the_bound_is_subtracted_before_the_limit(offset, bound, flagged):
    found = clock.findings([node("a", offset, bound=bound)])
    assert codes(found, "a") == ([("clock-offset", "warn", "monitor")] if flagged else [])


def test_two_nodes_apart_and_unmeasured_ones():
    """Two nodes 4 s apart: which one is off, the median cannot say (it lies between them): no
    clock-skew; the one 4 s off this machine is clock-offset, and the spread is on both. A node
    that was not measured (an error row, no stamp) is in no count."""
    results = [node("a", 0.0), node("b", 4.0), result("c", status="error"), result("d", wall=1.0, run_s=0.1)]
    found = clock.findings(results)
    assert list(found) == ["b"] and codes(found, "b") == [("clock-offset", "warn", "monitor")]
    assert results[0].data[clock.KEY]["nodes_spread_s"] == pytest.approx(4.0)
    assert clock.KEY not in results[3].data
    found = clock.findings([node("a", 0.0), node("b", 4.0), node("e", 0.0)])
    assert codes(found, "b") == [("clock-offset", "warn", "monitor"), ("clock-skew", "warn", "monitor")]
    assert "of the 3 nodes measured" in found["b"][1].message and list(found) == ["b"]


def test_none_measured_nothing_found():
    assert clock.findings([result("a"), result("b", status="error")]) == {}


def test_the_follow_up_stamps_the_result_with_this_machines_bracket():
    """The job built at monotonic 100.0; the answer in at monotonic 103.5, wall 5000.0: the run
    lies within [4996.5, 5000.0] of this machine's wall clock. A target's own value under the key
    is replaced; an error row is not stamped; no second job is asked for."""
    r = result("a", wall=4999.0, run_s=3.0)
    r.data[clock.KEY] = {"sent_s": 0.0, "received_s": 1e12}          # the target's word: replaced
    assert clock._stamp(100.0, r, now=lambda: 5000.0, monotonic=lambda: 103.5) is None
    assert r.data[clock.KEY] == {"sent_s": 4996.5, "received_s": 5000.0}
    failed = Result.failure("node-check", "b", "timeout", "no answer")
    clock._stamp(100.0, failed, now=lambda: 5000.0, monotonic=lambda: 103.5)
    assert clock.KEY not in failed.data


def test_the_spec_times_its_job_and_the_judge_amends_status_and_action():
    """The job node-check's spec builds carries the stamping follow-up; the fleet judgement
    (run.judge, the task's and a runbook step's) adds the clock findings and lifts the status and
    worst action."""
    from diagnostics.builtin import BUILTIN
    from diagnostics.engine import bundle
    job = BUILTIN.specs["node-check"].finish(bundle.Job("node-check", "node_check.py", b""), {})
    r = result("a", wall=None)
    r.data["clock"] = {"wall_s": 0.0, "run_s": 0.0}                 # a node at the epoch
    r.data["worst_action"] = None
    assert job.follow_up(r) is None and r.data[clock.KEY]["received_s"] > 1.7e9
    node_check_run.judge({})([r])
    assert (r.status, r.data["worst_action"]) == ("warn", "monitor")
    assert [f.code for f in r.findings] == ["clock-offset"]
