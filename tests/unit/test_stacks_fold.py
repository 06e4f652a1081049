"""stacks_fold.py (issue 13 item 3) on real py-spy dumps of a hung 4-rank gloo job
(tests/fixtures/stacks/README.md): ranks 0-2 in all_reduce, rank 3 in a function of its own."""

import json
from pathlib import Path

import pytest

from diagnostics.builtin.stacks import fold as stacks_fold
from diagnostics.builtin.stacks.fold import RankStack

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stacks"


def dump(rank):
    return json.loads((FIXTURES / f"pyspy-gloo4-rank{rank}.json").read_text())


def job(target="trainbox", ranks=range(4)):
    return [RankStack(target, 12520 + r, r, dump(r)) for r in ranks]


def test_the_hung_job_folds_into_the_waiting_ranks_and_the_odd_one():
    groups = stacks_fold.fold(job())
    assert [(g.nodes, len(g.members)) for g in groups] == [("trainbox:[0-2]", 3), ("trainbox:3", 1)]
    assert stacks_fold.lines(groups) == [
        "3/4 ranks (trainbox:[0-2])  all_reduce (torch/distributed/distributed_c10d.py) "
        "← sync (train.py:14) ← main (train.py:25)",
        "1/4 ranks (trainbox:3)      wait_for_data (train.py:10) ← main (train.py:24)"
        "   ← the odd one out"]
    assert stacks_fold.judge(groups) == [{
        "level": "fail", "code": "stacks-odd-one-out",
        "message": "1/4 ranks (trainbox:3) not in the collective the other 3 wait in (all_reduce): "
                   "wait_for_data (train.py:10) ← main (train.py:24)"}]


def test_ranks_on_two_hosts_fold_across_hosts():
    stacks = job("gpu01", range(2)) + [RankStack("gpu02", 7, 2, dump(2)), RankStack("gpu02", 8, 3, dump(3))]
    groups = stacks_fold.fold(stacks)
    assert [g.nodes for g in groups] == ["gpu01:[0-1],gpu02:2", "gpu02:3"]


def test_all_alike_is_info_and_a_tie_is_a_split():
    same = stacks_fold.fold(job(ranks=range(3)))
    assert stacks_fold.judge(same) == [{
        "level": "info", "code": "stacks-agree",
        "message": "all 3 ranks alike: all_reduce (torch/distributed/distributed_c10d.py) "
                   "← sync (train.py:14) ← main (train.py:25)"}]
    tie = stacks_fold.fold(job(ranks=(2, 3)))
    assert stacks_fold.judge(tie) == [{"level": "warn", "code": "stacks-split",
                                       "message": "no majority among 2 ranks (1, 1 alike)"}]
    assert not any("odd one out" in line for line in stacks_fold.lines(tie))


def test_a_majority_outside_a_collective_makes_the_odd_one_a_warning():
    odd = stacks_fold.fold([RankStack("t", 1, 0, dump(3)), RankStack("t", 2, 1, dump(3)),
                            RankStack("t", 3, 2, dump(0))])
    [finding] = stacks_fold.judge(odd)
    assert finding["level"] == "warn" and finding["message"].startswith("1/3 ranks (t:2) elsewhere: all_reduce")


@pytest.mark.parametrize("threads", [None, [], "garbage", [{"frames": "x"}], [1, 2],
                                     [{"thread_name": "MainThread", "frames": [{"name": ["x"], "line": "7"}]}]])
def test_a_malformed_dump_is_its_own_group_not_an_exception(threads):
    groups = stacks_fold.fold(job(ranks=range(3)) + [RankStack("t", 99, None, threads)])
    assert groups[-1].nodes == "t:pid99"
    assert stacks_fold.one_line(groups[-1].frames) in ("no Python stack", "? (?:0)")
    assert stacks_fold.judge(groups)[0]["level"] == "fail"


def test_the_main_thread_is_chosen_by_name_and_deep_stacks_are_bounded():
    worker = {"thread_name": "Thread-1", "frames": [{"name": "run", "filename": "/x/threading.py",
                                                     "short_filename": "threading.py", "line": 1}]}
    main = dump(3)[0]
    assert stacks_fold.main_thread([worker, main])[0].name == "wait_for_data"
    assert stacks_fold.main_thread([worker])[0].name == "run"
    deep = [{"thread_name": "MainThread",
             "frames": [{"name": f"f{i}", "filename": "/app/x.py", "short_filename": "x.py", "line": i}
                        for i in range(10_000)]}]
    frames = stacks_fold.main_thread(deep)
    assert len(frames) == stacks_fold.MAX_FRAMES
    assert stacks_fold.one_line(frames).endswith(f"← … {stacks_fold.MAX_FRAMES - 6} more")


def test_a_flood_of_distinct_stacks_is_bounded_in_lines_and_findings():
    """A hostile or broken fleet: 3 ranks alike in all_reduce, then 500 ranks each somewhere of
    its own. The view and the findings stay bounded; every rank is still counted."""
    flood = [RankStack("t", 1000 + i, 10 + i, [{"thread_name": "MainThread", "frames": [
        {"name": f"f{i}", "filename": "/app/x.py", "short_filename": "x.py", "line": i}]}]) for i in range(500)]
    groups = stacks_fold.fold(job(ranks=range(3)) + flood)
    shown = stacks_fold.lines(groups)
    assert len(shown) == stacks_fold.MAX_GROUPS + 2
    assert shown[-1] == "… 480 more groups (480 ranks): --json or --save has every stack"
    findings = stacks_fold.judge(groups)
    assert len(findings) == stacks_fold.MAX_GROUPS + 1
    assert findings[-1]["message"] == "… 480 more groups (480 ranks) with stacks of their own"
    assert all(f["level"] == "fail" for f in findings)


def with_source(threads, sources):
    """The dump with `source` added to the main thread's frames, as the target adds it."""
    threads = json.loads(json.dumps(threads))
    for frame in threads[0]["frames"]:
        key = (frame["short_filename"], frame["line"])
        if key in sources:
            frame["source"] = sources[key]
    return threads


def test_each_group_shows_its_frames_source_lines_without_splitting_on_them():
    sources = {("train.py", 14): "dist.all_reduce(t)", ("train.py", 25): "sync(t)",
               ("train.py", 10): "time.sleep(10**6)", ("train.py", 24): "wait_for_data()",
               ("torch/distributed/distributed_c10d.py", 3252): "work.wait()"}
    # rank 2's target could not read the files: same frames, no source; still one group
    stacks = [RankStack("trainbox", 12520 + r, r, with_source(dump(r), sources if r != 2 else {}))
              for r in range(4)]
    groups = stacks_fold.fold(stacks)
    assert [(g.nodes, len(g.members)) for g in groups] == [("trainbox:[0-2]", 3), ("trainbox:3", 1)]
    assert stacks_fold.lines(groups) == [
        "3/4 ranks (trainbox:[0-2])  all_reduce (torch/distributed/distributed_c10d.py) "
        "← sync (train.py:14) ← main (train.py:25)",
        "    torch/distributed/distributed_c10d.py:3252  work.wait()",
        "    train.py:14                                 dist.all_reduce(t)",
        "    train.py:25                                 sync(t)",
        "1/4 ranks (trainbox:3)      wait_for_data (train.py:10) ← main (train.py:24)"
        "   ← the odd one out",
        "    train.py:10  time.sleep(10**6)",
        "    train.py:24  wait_for_data()"]
    # a source line is text from a target: one line, bounded
    [odd] = stacks_fold.fold([RankStack("t", 1, 0, with_source(dump(3), {("train.py", 10): "x\n\ty" * 500}))])
    assert odd.frames[0].source == " ".join(("x\n\ty" * 500).split())[:stacks_fold.MAX_TEXT]
    assert "\n" not in odd.frames[0].source and len(odd.frames[0].source) == stacks_fold.MAX_TEXT
