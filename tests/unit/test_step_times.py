"""step-times on recorded step-time lines (tests/fixtures/step_logs/, README.md there names the
source of each line), its scoring, and the script run by hand.

Expected numbers were written by hand from the fixture lines, not computed by the parser.
"""

import argparse
import json
import random
import subprocess
from pathlib import Path

import pytest

from diagnostics.builtin import step_times as step_times_across
from diagnostics.core.results import Finding, Result
from tests.programs import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "diagnostics" / "scripts" / "step_times.py"
LOGS = ROOT / "tests" / "fixtures" / "step_logs"

st = load_script("step_times.py", "mldiag_test_step_times")


def read(name):
    """The fixture's text as written, its \\r kept (read_text() would make them newlines)."""
    with open(str(LOGS / name), encoding="utf-8", newline="") as f:
        return f.read()


def pairs(result):
    return [(s["step"], s["seconds"]) for s in result["steps"]]


def ms(*values):
    return [v / 1000.0 for v in values]


# fixture -> (detected format, unit, steps, seconds)
EXPECTED = {
    "megatron_ms.log": ("megatron", "s", [10, 20, 30, 40, 50], ms(2152.2, 1354.9, 1376.1, 1379.8, 1377.4)),
    "megatron_s.log": ("megatron", "s", list(range(31214, 31223)),
                       [106.46, 105.90, 106.40, 106.33, 107.53, 106.36, 106.30, 106.13, 106.44]),
    "deepspeed_pipeline.log": ("megatron", "s", [1, 2], ms(150471.3, 145207.0)),
    "deepspeed_wallclock.log": ("deepspeed", "s", [136005, 136006, 136007, 136008],
                                ms(713.90 + 2398.57 + 173.53, 714.77 + 2347.57 + 164.55,
                                   714.07 + 2397.83 + 156.84, 714.43 + 2325.28 + 150.73)),
    "torchtitan.log": ("torchtitan", "s/token", list(range(1, 11)),
                       [1.0 / t for t in (149, 6697, 6562, 6563, 6634, 6627, 6671, 6688, 6688, 6698)]),
    "hf_trainer.log": ("hf-trainer", "s", list(range(1, 17)),
                       [58.76, 59.61, 59.72, 59.45, 59.80, 59.73, 59.78, 58.70, 57.92, 57.37,
                        56.98, 56.63, 56.44, 56.11, 55.88, 57.45]),
    "lightning_issue4225.log": ("lightning", "s", [1, 2, 3, 4, 5], [8.77, 5.82, 4.87, 4.47, 4.14]),
    "fallback_llmc.log": ("fallback", "s", [0, 1, 2, 3, 39],
                          ms(1452.121, 1288.673, 1369.394, 1290.761, 1323.779)),
}


def test_every_fixture_has_an_expectation():
    assert sorted(p.name for p in LOGS.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_parsed_to_its_numbers(name):
    fmt, unit, steps, seconds = EXPECTED[name]
    for result in (st.parse(read(name)), st.parse(read(name), fmt)):
        assert result["format"] == fmt
        assert result["unit"] == unit
        assert [s["step"] for s in result["steps"]] == steps
        assert [s["seconds"] for s in result["steps"]] == pytest.approx(seconds, rel=1e-12)


def test_deepspeed_pipeline_lines_as_deepspeed():
    r = st.parse(read("deepspeed_pipeline.log"), "deepspeed")
    assert pairs(r) == [(1, 150.471), (2, 145.206)]


def test_deepspeed_throughput_timer_when_no_wall_clock_lines():
    text = "\n".join(line for line in read("deepspeed_wallclock.log").splitlines() if "| fwd:" not in line)
    r = st.parse(text, "deepspeed")
    assert r["unit"] == "s/sample"
    assert [s["step"] for s in r["steps"]] == [5, 6, 7, 8]
    assert [s["seconds"] for s in r["steps"]] == pytest.approx(
        [1 / 2553.443452275532, 1 / 2561.3206693919196, 1 / 2576.511402462105, 1 / 1422.5676763766571])


def test_torchtitan_keeps_tps():
    r = st.parse(read("torchtitan.log"))
    assert [s["tps"] for s in r["steps"]][:3] == [149.0, 6697.0, 6562.0]


def test_hf_trainer_summary_and_mean_step_without_a_bar():
    r = st.parse(read("hf_trainer.log"))
    assert r["trainer_summary"] == {"train_runtime": 919.097, "train_steps_per_second": 0.017}
    only_dict = read("hf_trainer.log").split("\n")[1]   # splitlines() would split at the bar's \r too
    r = st.parse(only_dict, "hf-trainer")
    assert pairs(r) == [(None, pytest.approx(1 / 0.017))]


def test_lightning_bars_are_not_hf_trainer_ones():
    assert st.parse(read("lightning_issue4225.log"), "hf-trainer")["steps"] == []
    assert st.parse(read("hf_trainer.log"), "lightning")["steps"] == []
    assert {s["epoch"] for s in st.parse(read("lightning_issue4225.log"))["steps"]} == {0}


def test_megatron_timers_are_not_deepspeed_steps():
    assert st.parse(read("megatron_ms.log"), "deepspeed")["steps"] == []


def test_ansi_colours_removed():
    # torchtitan colours its metrics line; the fixture's step 2 line with colour codes put around
    line = read("torchtitan.log").splitlines()[2]
    coloured = line.replace("step:", "\x1b[31mstep:").replace("tps:", "\x1b[34mtps:") + "\x1b[39m"
    assert pairs(st.parse(coloured)) == [(2, pytest.approx(1 / 6697))]


GARBAGE = [None, b"", b"\xff\xfe\x00step 3 took 5 ms", "", "\r\r\n\n", 12, ["step 1 1 s"],
           "iteration 5/ 10 | elapsed time per iteration (ms): nan |", "step: 1 loss: x tps: 0",
           "time (ms) | fwd: 1e999 | bwd: 1 | step: 1", "step 99999999999999999999999 took 1e400 ms",
           "%|" * 5000, "Epoch 0: 100%|" + "|" * 10000 + " 1/2 [00:01<00:01, 1.0s/it]",
           "\x1b[" * 3000, "step " * 20000 + "1 ms", "x" * 200000]


@pytest.mark.parametrize("text", GARBAGE, ids=range(len(GARBAGE)))
@pytest.mark.parametrize("fmt", [None] + list(st.FORMATS))
def test_garbage_never_raises(text, fmt):
    r = st.parse(text, fmt)
    assert set(r) >= {"format", "unit", "steps"}
    for s in r["steps"]:
        assert s["seconds"] > 0 and s["seconds"] == s["seconds"] and s["seconds"] != float("inf")


def test_random_bytes_never_raise():
    rng = random.Random(7)
    pieces = [b"step ", b"iteration ", b"| elapsed time per iteration (ms): ", b"tps: ", b"s/it]",
              b"\r", b"\n", b"%|", b"time (ms) | fwd: ", b"1.5", b"-3", b",", b"\xff", b" "]
    for _ in range(300):
        blob = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
        st.parse(blob)


# --------------------------------------------------------------------------- scoring

def noisy(rng, base, n, sigma=0.03, spikes=0.03):
    """Step times as a healthy rank logs them: a few % of jitter and now and then a slow step
    (a checkpoint, a GC pause)."""
    out = []
    for _ in range(n):
        v = base * (1 + rng.gauss(0, sigma))
        if rng.random() < spikes:
            v *= rng.uniform(1.2, 2.0)
        out.append(max(v, base * 0.5))
    return out


def test_clear_straggler_named():
    rng = random.Random(1)
    per_rank = {str(r): noisy(rng, 1.0, 40) for r in range(8)}
    per_rank["5"] = noisy(rng, 1.3, 40)
    s = st.score(per_rank)
    assert s["stragglers"] == ["5"]
    e = s["ranks"]["5"]
    assert e["verdict"] == "straggler" and e["ratio"] > 1.2 and e["z"] >= 3.5
    assert e["window"] == {"recent_steps": 10, "first": 31, "last": 40, "of": 40}
    assert all(s["ranks"][r]["verdict"] == "ok" for r in per_rank if r != "5")


def test_equal_ranks_never_name_anyone():
    for seed in range(20):
        rng = random.Random(1000 + seed)
        n_ranks = rng.randint(3, 16)
        base = rng.uniform(0.05, 120.0)
        per_rank = {str(r): noisy(rng, base, rng.randint(5, 120)) for r in range(n_ranks)}
        s = st.score(per_rank, window=rng.choice([5, 10, 20]))
        assert s["stragglers"] == [] and s["slowed"] == [], (seed, s)


def test_rank_that_became_slow_named():
    rng = random.Random(3)
    per_rank = {str(r): noisy(rng, 2.0, 60) for r in range(4)}
    per_rank["2"] = noisy(rng, 2.0, 50) + noisy(rng, 2.6, 10)
    s = st.score(per_rank)
    assert s["slowed"] == ["2"] or s["stragglers"] == ["2"]
    e = s["ranks"]["2"]
    assert e["ratio_to_history"] > 1.2 and e["z_history"] >= 3.5 and e["history_steps"] == 50


def test_became_slow_with_two_ranks_only_from_history():
    rng = random.Random(4)
    s = st.score({"0": noisy(rng, 1.0, 30), "1": noisy(rng, 1.0, 20) + noisy(rng, 1.5, 10)})
    assert not s["peers_compared"] and s["stragglers"] == [] and s["slowed"] == ["1"]


def test_too_few_ranks_or_steps():
    s = st.score({"0": [1.0, 1.0, 1.0], "1": [5.0, 5.0, 5.0], "2": [1.0], "3": []})
    assert not s["peers_compared"] and s["stragglers"] == []
    assert s["ranks"]["2"]["verdict"] == "too-few-steps" and s["ranks"]["3"]["verdict"] == "no-steps"


def test_identical_peers_do_not_divide_by_zero():
    s = st.score({"0": [1.0] * 10, "1": [1.0] * 10, "2": [1.0] * 10, "3": [1.05] * 10})
    assert s["stragglers"] == []              # 5% slower: under the 10% ratio
    s = st.score({"0": [1.0] * 10, "1": [1.0] * 10, "2": [1.0] * 10, "3": [1.2] * 10})
    assert s["stragglers"] == ["3"] and s["ranks"]["3"]["z"] == pytest.approx(20.0)


# --------------------------------------------------------------------------- the diagnostic

def megatron_rank_log(path, scale):
    """A rank's log assembled from the fixture's real Megatron-LM lines (megatron_s.log), each
    repeated with its iteration number advanced and its elapsed time multiplied by ``scale``."""
    lines = read("megatron_s.log").splitlines()
    out = []
    for rep in range(3):
        for line in lines:
            it = line.split("iteration")[1].split("/")[0]
            new_it = str(int(it) + 9 * rep).rjust(len(it))
            value = line.split("elapsed time per iteration (s): ")[1].split(" ")[0]
            out.append(line.replace("iteration" + it + "/", "iteration" + new_it + "/", 1)
                       .replace("(s): " + value, "(s): %.2f" % (float(value) * scale), 1))
    path.write_text("\n".join(out) + "\n", encoding="utf-8")


def run_script(*argv):
    p = subprocess.run(["/usr/bin/python3", str(SCRIPT)] + list(argv), capture_output=True, text=True,
                       timeout=60, cwd=str(SCRIPT.parent))
    return p.returncode, json.loads(p.stdout), p.stderr


def test_script_names_the_straggler(tmp_path):
    for rank in range(4):
        megatron_rank_log(tmp_path / ("rank%d.log" % rank), 1.25 if rank == 3 else 1.0)
    rc, doc, err = run_script("--log-pattern", str(tmp_path / "rank{rank}.log"), "--ranks", "4")
    assert rc == 2, err
    assert doc["status"] == "fail"
    (f,) = [f for f in doc["findings"] if f["code"] == "straggler"]
    assert f["level"] == "fail" and f["action"] == "monitor" and f["message"].startswith("rank 3 ")
    assert doc["data"]["logs"]["0"]["format"] == "megatron"
    assert doc["data"]["logs"]["0"]["steps_used"] == 27
    assert doc["data"]["score"]["ranks"]["3"]["ratio"] == pytest.approx(1.25, rel=0.01)


def test_script_equal_ranks_ok_and_missing_log(tmp_path):
    for rank in range(3):
        megatron_rank_log(tmp_path / ("rank%d.log" % rank), 1.0)
    (tmp_path / "empty.log").write_text("nothing here\n")
    logs = [str(tmp_path / ("rank%d.log" % r)) for r in range(3)] + [str(tmp_path / "empty.log"),
                                                                      str(tmp_path / "absent.log")]
    rc, doc, err = run_script(*sum((["--log", p] for p in logs), []))
    assert rc == 1, err
    assert doc["status"] == "warn"
    assert sorted(f["code"] for f in doc["findings"]) == ["no-steps", "no-steps"]
    assert doc["summary"] == "no straggler among 3 rank(s) with step times"


def test_script_usage_without_logs():
    rc, doc, _ = run_script()
    assert rc == 2 and doc["findings"][0]["code"] == "usage"


def test_run_in_process_on_the_fixtures(tmp_path):
    # each fixture as one rank's log: different units are not compared
    args = argparse.Namespace(log=[str(LOGS / "megatron_s.log"), str(LOGS / "torchtitan.log")],
                              log_pattern=None, ranks=None, format=None, last=200, window=10,
                              max_bytes=1 << 20)
    doc = st.run(args)
    assert [f["code"] for f in doc["findings"]] == ["mixed-units"]


def test_read_tail_starts_at_a_whole_line(tmp_path):
    p = tmp_path / "log"
    p.write_bytes(b"first line\nsecond line\nthird\n")
    assert st.read_tail(str(p), 14) == "third\n"
    assert st.read_tail(str(p), 1000) == "first line\nsecond line\nthird\n"


# --------------------------------------------------------------------------- across targets

def as_result(target, doc):
    return Result(diagnostic="step-times", target=target, status=doc["status"], summary=doc["summary"],
                  findings=[Finding(**f) for f in doc["findings"]], data=doc["data"])


def two_nodes(tmp_path, scales):
    """Each node writes its own ranks' logs under the same pattern (node a: ranks 0-1, node b:
    ranks 2-3); the script run on each, as each target runs it."""
    docs = {}
    for node, ranks in (("a", (0, 1)), ("b", (2, 3))):
        d = tmp_path / node
        d.mkdir()
        for rank in ranks:
            megatron_rank_log(d / ("rank%d.log" % rank), scales[rank])
        rc, doc, err = run_script("--log-pattern", str(d / "rank{rank}.log"), "--ranks", "4")
        assert [f["code"] for f in doc["findings"]] == ["not-here", "too-few-ranks"], (err, doc["findings"])
        docs[node] = doc
    return docs


def test_a_straggler_whose_peers_are_on_another_target_is_named(tmp_path):
    docs = two_nodes(tmp_path, {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.25})
    assert docs["b"]["findings"][0]["message"] == (
        "rank(s) 0,1: no log on this target (%s): another node's, when each node writes its own "
        "ranks' logs" % (tmp_path / "b" / "rank0.log"))
    results = [as_result(node, doc) for node, doc in docs.items()]
    step_times_across.amend(results)
    assert [(r.target, r.status, [f.code for f in r.findings]) for r in results] == [
        ("a", "ok", ["not-here"]), ("b", "fail", ["not-here", "straggler"])]
    message = results[1].findings[1].message
    assert message.startswith("rank 3 on b is a straggler: median ") and "across 4 ranks on 2 targets (z " in message
    assert " 1.25x its peers' " in message, message
    assert results[1].summary == "straggler(s) across 2 targets: rank 3"


def test_equal_ranks_across_targets_name_nobody(tmp_path):
    results = [as_result(node, doc) for node, doc in two_nodes(tmp_path, dict.fromkeys(range(4), 1.0)).items()]
    step_times_across.amend(results)
    assert [(r.status, [f.code for f in r.findings]) for r in results] == [("ok", ["not-here"])] * 2
    assert results[0].summary == "no straggler here among 4 ranks on 2 targets"


def test_one_target_keeps_its_own_score_and_bad_data_is_left_out(tmp_path):
    for rank in range(4):
        megatron_rank_log(tmp_path / ("rank%d.log" % rank), 1.25 if rank == 3 else 1.0)
    rc, doc, _ = run_script("--log-pattern", str(tmp_path / "rank{rank}.log"), "--ranks", "4")
    alone = [as_result("a", doc)]
    step_times_across.amend(alone)
    assert [f.code for f in alone[0].findings] == ["straggler"]
    hostile = Result(diagnostic="step-times", target="x", status="ok", summary="", data={
        "unit": "s", "score": {"ranks": {"0": {"median": float("nan")}, "1": {"median": -1}, "2": "x",
                                         "3": {"median": True}, "4" * 99: {"median": 1.0}}}})
    assert step_times_across.medians([hostile]) == []


def test_no_rank_log_here_at_all_is_a_warning(tmp_path):
    rc, doc, _ = run_script("--log-pattern", str(tmp_path / "rank{rank}.log"), "--ranks", "2")
    assert rc == 1 and [f["code"] for f in doc["findings"]] == ["no-steps"]
    assert doc["findings"][0]["message"] == "no rank's log on this target: %s (2 ranks)" % (tmp_path / "rank*.log")
