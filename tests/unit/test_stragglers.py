"""stacks --window: which samples wait in a collective (wait_frames.json, against real py-spy
dumps of a gloo job), one process's window summed up, and the straggler named from every rank's
wait share (pure); the sampling itself against a real process of this machine."""

import json
import random
import subprocess
import sys
import time

import pytest

from diagnostics.builtin.stacks import stragglers as st
from diagnostics.core.results import Result
from tests.programs import SCRIPTS, load_script

stacks = load_script("stacks.py", "mldiag_test_stacks_window")
FIXTURES = SCRIPTS.parents[1] / "tests" / "fixtures" / "stacks"
RULES = stacks.load_wait_rules()


def dump(rank):
    return json.loads((FIXTURES / f"pyspy-gloo4-rank{rank}.json").read_text())


def test_a_rank_in_all_reduce_waits_and_the_odd_one_does_not():
    """The real dumps of the hung 4-rank gloo job: ranks 0-2 in all_reduce, rank 3 in its own
    wait_for_data (which is not a collective)."""
    for rank in (0, 1, 2):
        waiting, where, _ = stacks.classify(dump(rank), RULES)
        assert waiting and where.startswith("all_reduce (")
    waiting, where, _ = stacks.classify(dump(3), RULES)
    assert not waiting and where == "wait_for_data (/tmp/hung/train.py:10)"


@pytest.mark.parametrize("frame,waits", [
    ({"name": "_exception_logger.<locals>.wrapper", "filename": "/x/torch/distributed/c10d_logger.py", "line": 83}, True),
    ({"name": "barrier", "filename": "/x/torch/distributed/distributed_c10d.py", "line": 1}, True),
    ({"name": "wait_tensor", "filename": "/x/torch/distributed/_functional_collectives.py", "line": 1}, True),
    ({"name": "step", "filename": "/job/train.py", "line": 9, "source": "work.wait()"}, True),
    ({"name": "step", "filename": "/job/train.py", "line": 9, "source": "dist.all_reduce(grad)"}, True),
    ({"name": "step", "filename": "/job/train.py", "line": 9, "source": "torch.cuda.synchronize()"}, True),
    ({"name": "all_reduce", "filename": "/job/my_all_reduce.py", "line": 1}, False),      # not torch's
    ({"name": "wait_for_data", "filename": "/job/train.py", "line": 10, "source": "q.get()"}, False),
    ({"name": "forward", "filename": "/x/torch/nn/modules/linear.py", "line": 1}, False),
])
def test_the_wait_frames_are_data(frame, waits):
    threads = [{"thread_name": "MainThread", "frames": [frame]}]
    assert stacks.classify(threads, RULES)[0] is waits


def test_a_window_summed_up():
    a, b = ("all_reduce", "f", 1), ("work", "g", 2)
    samples = [(True, "all_reduce (f:1)", (a,))] * 6 + [(False, "work (g:2)", (b,))] * 3 + [(False, "io (h:3)", (b, a))]
    assert stacks.summarise_samples(samples) == {"samples": 10, "waiting": 6, "wait_share": 0.6,
                                                 "busy_frame": "work (g:2)", "busy_share": 0.3,
                                                 "distinct_stacks": 3}
    assert stacks.summarise_samples([])["wait_share"] is None


def test_sampling_a_real_process_over_a_window(tmp_path):
    """A Python process of this machine that spends its time in one function: sampled at 10/s
    for 1.5 s with the standard-library reader, never waiting, its busy frame named."""
    script = tmp_path / "busy.py"
    script.write_text("import time\n\ndef spin():\n    while True:\n        time.sleep(0.001)\n\nspin()\n")
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(0.5)
        found = [(proc.pid, "pid", {}, [])]
        per_pid, rounds = stacks.sample_window(found, "/proc", None, 1.5, 10.0, RULES)
    finally:
        proc.kill()
        proc.wait()
    w = per_pid[proc.pid]
    assert 8 <= rounds <= 22 and w["samples"] == rounds          # random intervals, 10 a second on average
    assert w["waiting"] == 0 and w["busy_frame"].startswith("spin (") and w["busy_share"] >= 0.9


# --------------------------------------------------------------------------- the judgement

def result(target, *procs):
    return Result(diagnostic="stacks", target=target, status="ok", summary="",
                  data={"processes": [{"pid": 100 + rank, "rank": rank, "threads": [],
                                       "window": {"samples": n, "wait_share": share, "busy_frame": frame,
                                                  "distinct_stacks": distinct}}
                                      for rank, n, share, frame, distinct in procs]})


def test_the_rank_the_others_wait_for_is_named_with_its_score_and_frame():
    results = [result("host", (0, 20, 0.75, "sleep", 3), (1, 20, 0.7, "sleep", 3)),
               result("ct", (2, 20, 0.8, "sleep", 3), (3, 20, 0.05, "extra_work (job.py:18)", 4))]
    st.amend(results)
    assert [(r.target, r.status, [f.code for f in r.findings]) for r in results] == [
        ("host", "ok", []), ("ct", "fail", ["straggler"])]
    assert results[1].findings[0].message == (
        "rank 3 (pid 103 on ct) waited in collectives 5 % of 20 samples, its 3 peers 75 % (median): "
        "the one they wait for, score 0.70; its time goes to extra_work (job.py:18)")


@pytest.mark.parametrize("procs,why", [
    ([(0, 20, 0.1, "a", 3), (1, 20, 0.12, "a", 3), (2, 20, 0.0, "a", 3)], "the peers seldom wait"),
    ([(0, 20, 0.7, "a", 3), (1, 20, 0.4, "a", 3)], "two ranks make no median"),
    ([(0, 4, 0.7, "a", 3), (1, 4, 0.7, "a", 3), (2, 4, 0.0, "a", 3)], "too few samples"),
    ([(0, 20, 1.0, "a", 1), (1, 20, 1.0, "a", 1), (2, 20, 0.0, "sigwait", 1)], "hung: every stack stood still"),
    ([(0, 20, 0.6, "a", 3), (1, 20, 0.55, "a", 3), (2, 20, 0.35, "a", 3)], "not far enough below"),
    # CI, stop 38: an equal job's 1 s window at 10/s, host ranks 0-1, CT ranks 2-3
    ([(0, 12, 0.0833, "a", 3), (1, 12, 0.0, "a", 3), (2, 10, 0.3, "a", 3), (3, 10, 0.3, "a", 3)],
     "0 of 12 against peers at 30 %: the luck of a short window"),
])
def test_nobody_is_named(procs, why):
    assert st.stragglers(st.windows([result("t", *procs)])) == [], why


def test_the_same_shares_over_a_longer_window_name_the_rank():
    """The shares of the window CI saw, over 40 samples instead of 12: 0 of 40 against peers at
    30 % is no luck (0.7^40 = 6e-7)."""
    procs = [(0, 40, 0.075, "a", 3), (1, 40, 0.0, "a", 3), (2, 40, 0.3, "a", 3), (3, 40, 0.3, "a", 3)]
    (named,) = st.stragglers(st.windows([result("t", *procs)]))
    assert (named["rank"].rank, named["score"]) == (1, 0.3)


def test_the_chance_of_as_few_waiting_samples():
    assert st.chance_of_as_few(12, 0, 0.3) == pytest.approx(0.7 ** 12)
    assert st.chance_of_as_few(10, 2, 0.5) == pytest.approx((1 + 10 + 45) / 1024)
    assert st.chance_of_as_few(5, 5, 0.9) == pytest.approx(1.0)


def test_an_equal_job_names_nobody_in_20_noisy_windows():
    """Equal ranks: each waits for whoever is last this step. The lab's equal job waits little
    (0-27 % per rank and window, tests/integration/test_stragglers.py); here a harder one, 8
    ranks that all wait 20-60 % with the spread of short windows, in 20 seeded windows: nobody
    is named."""
    rng = random.Random(20261207)
    for _ in range(20):
        base = rng.uniform(0.2, 0.6)
        procs = [(r, 20, min(1.0, max(0.0, base + rng.gauss(0, 0.06))), "a", 3) for r in range(8)]
        assert st.stragglers(st.windows([result("t", *procs)])) == []


def test_a_targets_window_is_validated():
    bad = Result(diagnostic="stacks", target="x", status="ok", summary="", data={"processes": [
        {"pid": 1, "rank": 0, "window": {"samples": 20, "wait_share": 1.5}},
        {"pid": 2, "rank": True, "window": {"samples": "20", "wait_share": 0.5}},
        {"pid": 3, "rank": 1, "window": ["x"]}, "junk",
        {"pid": 4, "rank": 2, "window": {"samples": 20, "wait_share": 0.5, "busy_frame": "x" * 999,
                                         "distinct_stacks": -1}}]})
    (only,) = st.windows([bad])
    assert (only.pid, only.rank, len(only.busy_frame), only.distinct_stacks) == (4, 2, 300, 0)


# --------------------------------------------------------------------------- the node, from its GPUs

FAKE_SMI = SCRIPTS.parents[1] / "tests" / "fakes" / "nvidia-smi"


def sample_gpus(seconds, **kw):
    sampler = stacks.GpuSampler(str(FAKE_SMI), **kw)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sampler.tick()
        time.sleep(0.05)
    return sampler.finish()


def test_the_gpus_are_sampled_over_the_window_by_the_real_fake_nvidia_smi(monkeypatch):
    """The fake nvidia-smi (real captures; derived__h200x8__spin-in-collective) queried about
    every 0.4 s for 1.5 s, each query a child never waited for: every GPU's means."""
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", "derived__h200x8__spin-in-collective")
    got = sample_gpus(1.5, period=0.4)
    assert got["error"] is None and 2 <= got["queries"] <= 5, got
    assert [g["index"] for g in got["gpus"]] == list(range(8))
    assert {(g["util_pct"], g["power_w"], g["power_limit_w"], g["samples"] == got["queries"])
            for g in got["gpus"]} == {(100.0, 131.05, 700.0, True)}
    assert got["gpus"][3]["uuid"] == "GPU-5a1e0003-0000-0000-0000-000000000003"


def test_a_hung_nvidia_smi_ends_the_gpu_samples_not_the_window(monkeypatch):
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI_HANG", "60")
    t0 = time.monotonic()
    got = sample_gpus(1.2, period=0.2, hung_after=0.5)
    assert time.monotonic() - t0 < 3
    assert got["gpus"] == [] and got["error"] == "nvidia-smi did not answer in 0.5 s: no more GPU samples", got
    assert not subprocess.run(["pgrep", "-f", str(FAKE_SMI)], capture_output=True).stdout


def test_a_failing_and_a_missing_nvidia_smi_are_said(monkeypatch):
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI_EXIT", "9")
    got = sample_gpus(1.0, period=5.0)
    assert got["gpus"] == [] and got["queries"] == 0, got
    assert got["error"].startswith("nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate "
                                   "with the NVIDIA driver"), got
    assert stacks.GpuSampler(None).finish() == {"tool": None, "queries": 0, "gpus": [],
                                                 "error": "nvidia-smi not found"}


@pytest.mark.parametrize("line,row", [
    ("0, GPU-ab, 100, 131.05, 700.00", (0, "GPU-ab", 100.0, 131.05, 700.0)),
    ("7, GPU-ab, [N/A], [Not Supported], 700.00", (7, "GPU-ab", None, None, 700.0)),
    ("Unable to determine the device handle for GPU0000:1B:00.0: Unknown Error", None),
    ("WARNING: infoROM is corrupted at gpu 0000:01:00.0", None),
    ("0, GPU-ab, -5, 1e9, 700", (0, "GPU-ab", None, None, 700.0)),
])
def test_a_gpu_row_parsed(line, row):
    assert stacks.parse_gpu_row(line) == row


def node(target, util, power, limit=700.0, n=8, samples=5, uuid=None):
    return Result(diagnostic="stacks", target=target, status="ok", summary="", data={
        "processes": [], "gpu_window": {"tool": "nvidia-smi", "queries": samples, "error": None, "gpus": [
            {"index": i, "uuid": f"GPU-{uuid or target}-{i}", "samples": samples, "util_pct": util,
             "power_w": power, "power_limit_w": limit} for i in range(n)]}})


def test_the_node_whose_gpus_compute_while_the_others_spin_is_named():
    results = [node("a", 100, 131), node("b", 99, 140), node("c", 100, 627.4), node("d", 100, 128)]
    st.amend(results)
    assert [(r.target, r.status, [f.code for f in r.findings]) for r in results] == [
        ("a", "ok", []), ("b", "ok", []), ("c", "fail", ["straggler-node"]), ("d", "ok", [])]
    assert results[2].findings[0].message == (
        "c's 8 GPUs compute: util 100 %, power 90 % of limit (median GPU over the window), while the GPUs "
        "of the other 3 nodes spin in a collective (util ≥ 90 %, power ≤ 50 % of limit): the node they wait for")


def test_the_node_whose_gpus_starve_is_named():
    (odd,) = [st.odd_gpu_node(st.gpu_nodes([node("a", 100, 131), node("b", 12, 90)]))]
    assert (odd["node"].target, odd["how"], [n.target for n in odd["spinning"]]) == ("b", "starve", ["a"])


@pytest.mark.parametrize("nodes,why", [
    ([node("a", 100, 131), node("b", 100, 130), node("c", 100, 140)], "all spin: a hang or a collective-bound job"),
    ([node("a", 100, 600), node("b", 100, 620), node("c", 100, 627)], "all compute: nothing waits"),
    ([node("a", 100, 131), node("b", 100, 630), node("c", 100, 620)], "two nodes differ"),
    ([node("a", 100, 131), node("b", 85, 400)], "between spinning and computing: unclear"),
    ([node("a", 100, 131), node("b", 100, 627, uuid="a")], "the same GPUs seen from two targets"),
    ([node("a", 100, 131, samples=1), node("b", 100, 627)], "one query is no window"),
    ([node("a", 100, 131)], "one node"),
])
def test_no_node_is_named(nodes, why):
    assert st.odd_gpu_node(st.gpu_nodes(nodes)) is None, why


def test_a_hung_job_is_not_made_slow_by_its_gpus():
    """Every rank's stack stood still: the stacks say hung, so the idle GPUs of the odd rank's
    node are not a slow job's straggler node."""
    results = [node("a", 100, 131), node("b", 100, 130), node("c", 5, 80)]
    for i, r in enumerate(results):
        r.data["processes"] = [{"pid": 10 + i, "rank": i, "window": {"samples": 20, "wait_share": 1.0 if i < 2 else 0.0,
                                                                      "busy_frame": "x", "distinct_stacks": 1}}]
    st.amend(results)
    assert [f.code for r in results for f in r.findings] == []
    for r in results:
        r.data["processes"][0]["window"]["distinct_stacks"] = 3
    st.amend(results)
    assert [(r.target, f.code) for r in results for f in r.findings] == [("c", "straggler-node"), ("c", "straggler")]


def test_a_targets_gpu_window_is_validated():
    bad = node("x", 100, 131)
    bad.data["gpu_window"]["gpus"] += [{"samples": 5, "util_pct": 150, "power_w": 1, "power_limit_w": 700},
                                       {"samples": 5, "util_pct": 50, "power_w": 1, "power_limit_w": 0},
                                       {"samples": True, "util_pct": 50, "power_w": 1, "power_limit_w": 700},
                                       "junk", {"samples": 5, "util_pct": "50", "power_w": 1, "power_limit_w": 7}]
    (n,) = st.gpu_nodes([bad, node("y", 1, 1, n=0), Result(diagnostic="stacks", target="z", status="ok",
                                                             summary="", data={"gpu_window": ["x"]})])
    assert (n.target, n.gpus, n.util_pct, round(n.power_share, 3)) == ("x", 8, 100.0, 0.187)
