"""nccl-check's memory of the nodes that passed (nccl_check/passed.py): skipped within
--valid-for unless --force, said in their rows, kept in the user's private cache."""

import json
import os

import pytest

from diagnostics.builtin.nccl_check import passed
from diagnostics.core.errors import InputError
from diagnostics.inventory.targets import Target
from tests.programs import result_of

HOUR = 3600.0


def measured(name, busbw, status="ok"):
    return result_of("nccl-check", name, status=status, data={
        "backend": "torch-gloo", "op": "all_reduce", "ranks": 2,
        "rows": [{"size": 2 ** 20, "busbw": busbw * 2}, {"size": 2 ** 26, "busbw": busbw}]})


class Fleet:
    """A fan-out that measures each target it is given (and notes which), at a settable clock."""

    def __init__(self, busbw):
        self.busbw, self.ran, self.now = busbw, [], 1_000_000.0

    def fan_out(self, targets, job_for, *, on_result=None, **kw):
        self.ran.append([t.name for t in targets])
        return [measured(t.name, self.busbw[t.name], "ok" if self.busbw[t.name] > 1 else "fail") for t in targets]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MLDIAG_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def targets(*names):
    return [Target(name=n, local=True) for n in names]


def test_a_node_that_passed_is_skipped_within_the_window_and_said(cache):
    fleet = Fleet({"a": 2.0, "b": 0.5, "c": 3.0})
    run = passed.skipping(fleet.fan_out, "all_reduce", 24 * HOUR, clock=lambda: fleet.now)
    run(targets("a", "b"), None)
    fleet.now += 3 * HOUR
    seen = []
    results = run(targets("a", "b", "c"), None, on_result=seen.append)
    assert fleet.ran == [["a", "b"], ["b", "c"]]          # b failed: measured again
    assert [r.target for r in results] == ["a", "b", "c"]
    a = results[0]
    assert (a.status, a.data["skipped"], a.data["busbw"]) == ("ok", True, 2.0)
    assert a.summary == "skipped: passed 3.0 h ago (busbw 2.00 GB/s; --force to measure)"
    assert [r.target for r in seen] == ["a"]               # the skipped rows are reported too
    fleet.now += 22 * HOUR                                 # a passed 25 h ago, c 22 h ago
    run(targets("a", "c"), None)
    assert fleet.ran[-1] == ["a"]


def test_force_and_zero_hours_measure_every_node(cache):
    assert passed.valid_for({"force": True, "valid-for": 48}) == 0.0
    assert passed.valid_for({}) == 24 * HOUR and passed.valid_for({"valid-for": 2}) == 2 * HOUR
    fleet = Fleet({"a": 2.0})
    run = passed.skipping(fleet.fan_out, "all_reduce", 0.0, clock=lambda: fleet.now)
    run(targets("a"), None)
    run(targets("a"), None)
    assert fleet.ran == [["a"], ["a"]]


@pytest.mark.parametrize("hours", ["-1", "x"])
def test_bad_hours_are_refused_before_anything_runs(hours):
    with pytest.raises(InputError, match="--valid-for"):
        passed.valid_for({"valid-for": hours})


def test_per_collective_and_private(cache):
    fleet = Fleet({"a": 2.0})
    passed.skipping(fleet.fan_out, "all_reduce", 24 * HOUR, clock=lambda: fleet.now)(targets("a"), None)
    passed.skipping(fleet.fan_out, "all_gather", 24 * HOUR, clock=lambda: fleet.now)(targets("a"), None)
    assert fleet.ran == [["a"], ["a"]]                     # another collective is measured
    assert set(passed.load()["a"]) == {"all_reduce", "all_gather"}
    st = os.stat(cache / passed.FILE)
    assert st.st_mode & 0o777 == 0o600 and os.stat(cache).st_mode & 0o777 == 0o700


def test_what_is_read_back_is_validated(cache):
    cache.mkdir(mode=0o700)
    (cache / passed.FILE).write_text(json.dumps({
        "a": {"all_reduce": {"passed": 1.0, "busbw": 2.0}}, "b": {"all_reduce": {"passed": "x", "busbw": 1}},
        "c": ["junk"], "d": {"all_reduce": {"passed": True, "busbw": 1.0}}}))
    os.chmod(cache / passed.FILE, 0o600)
    assert passed.load() == {"a": {"all_reduce": {"passed": 1.0, "busbw": 2.0}}}


def test_a_linked_cache_file_is_not_read(cache, tmp_path):
    cache.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"a": {"all_reduce": {"passed": 1.0, "busbw": 2.0}}}))
    (cache / passed.FILE).symlink_to(elsewhere)
    assert passed.load() == {}
