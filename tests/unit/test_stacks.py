"""scripts/stacks.py's discovery over a /proc tree written here (environ, cmdline, status as the
kernel lays them out), its py-spy error classification against a stand-in that prints what
py-spy prints, and the client's reading of what targets sent (stacks_run). The real job:
tests/integration/test_stacks.py."""

import argparse
import json
import os

import pytest

from diagnostics import stacks_run
from diagnostics.errors import InputError
from diagnostics.results import Result
from tests.programs import load_script

stacks = load_script("stacks.py", "mldiag_test_stacks")
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "stacks")


def process(proc, pid, env=(), cmd=("python3", "train.py"), nspid=None, ppid=1):
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env))
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmd) + b"\0")
    ns = f"{pid}" if nspid is None else f"{pid}\t{nspid}"
    (d / "status").write_text(f"Name:\tpython3\nPPid:\t{ppid}\nNSpid:\t{ns}\n")


def torch_env(rank, world=4):
    return [("PATH", "/usr/bin"), ("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world),
            ("GROUP_RANK", 0), ("TORCHELASTIC_RUN_ID", "none"), ("HF_TOKEN", "secret")]


@pytest.fixture
def proc(tmp_path):
    root = tmp_path / "proc"
    process(root, 100, [("PATH", "/usr/bin")], ("python3", "torchrun", "--nproc-per-node", "4"))
    for rank, pid in ((2, 103), (0, 101), (3, 104), (1, 102)):
        process(root, pid, torch_env(rank), ppid=100, nspid=10 + rank)
    process(root, 200, [("SLURM_PROCID", 7)], ("/opt/venv/bin/python", "eval.py"))
    process(root, 201, [("SLURM_PROCID", 0)], ("bash", "job.sh"))         # not Python: skipped
    process(root, 300, [], ("python3", "-m", "vllm.entrypoints.api_server"))
    process(root, 301, [], ("vim", "vllm.txt"))
    (root / "self").mkdir()
    (root / "999").mkdir()                                                 # gone meanwhile: no files
    return root


def test_ranks_are_found_by_their_environment_in_rank_order(proc):
    found = stacks.discover(str(proc))
    assert [(pid, how, env.get("RANK"), env.get("SLURM_PROCID")) for pid, how, env, _ in found] == [
        (101, "torch", "0", None), (102, "torch", "1", None), (103, "torch", "2", None),
        (104, "torch", "3", None), (200, "slurm", None, "7")]
    # only the variables that say where a rank is are kept: never a token
    assert all("HF_TOKEN" not in env and "PATH" not in env for _, _, env, _ in found)
    assert stacks.ns_pid_of(str(proc), 104) == 13 and stacks.ns_pid_of(str(proc), 200) == 200


def test_pid_and_match_add_other_python_processes(proc):
    found = {pid: how for pid, how, _, _ in stacks.discover(str(proc), pids=[100], match=r"vllm\.")}
    assert found[100] == "pid" and found[300] == "match" and 301 not in found


class Args(argparse.Namespace):
    def __init__(self, **kw):
        super().__init__(**{"pid": "", "match": "", "py_spy": "", **kw})


def fake_py_spy(tmp_path, script):
    path = tmp_path / "py-spy"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


def test_a_refused_ptrace_is_a_finding_with_the_fix(proc, tmp_path):
    spy = fake_py_spy(tmp_path, 'echo "Error: Permission denied (os error 13)" >&2; exit 1\n')
    doc = stacks.run(Args(py_spy=spy), proc=str(proc))
    assert doc["status"] == "fail"
    assert [(f["level"], f["code"]) for f in doc["findings"]] == [("fail", "ptrace-denied")]
    assert doc["findings"][0]["message"] == "reading the stack was refused for pid 101,102,103,104,200"
    assert doc["data"]["processes"][0]["error"] == "Error: Permission denied (os error 13)"


def test_dumps_are_read_per_process_and_other_failures_named(proc, tmp_path):
    rank3 = os.path.join(FIXTURES, "pyspy-gloo4-rank3.json")
    spy = fake_py_spy(tmp_path, f'case "$4" in 104) exit 2;; 200) echo not json;; *) cat "{rank3}";; esac\n')
    doc = stacks.run(Args(py_spy=spy), proc=str(proc))
    by_pid = {p["pid"]: p for p in doc["data"]["processes"]}
    assert by_pid[101]["threads"][0]["frames"][0]["name"] == "wait_for_data"
    assert by_pid[104]["error"] == "py-spy exited 2" and by_pid[200]["error"] == "py-spy's answer is not JSON"
    assert [(f["level"], f["code"]) for f in doc["findings"]] == [("warn", "dump-failed")]
    assert doc["summary"] == "5 processes (ranks 0,1,2,3,7), 3 stacks read"


def test_no_job_and_no_py_spy_are_said(tmp_path, proc, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    doc = stacks.run(Args(py_spy=str(tmp_path / "none")), proc=str(empty))
    assert [f["code"] for f in doc["findings"]] == ["no-job-process"] and doc["status"] == "warn"
    monkeypatch.setenv("PATH", str(empty))               # and none on PATH either
    doc = stacks.run(Args(py_spy=str(tmp_path / "none")), proc=str(proc))
    assert [f["code"] for f in doc["findings"]] == ["py-spy-absent"] and doc["data"]["py_spy"] is None
    assert [p["rank"] for p in doc["data"]["processes"]] == [0, 1, 2, 3, 7]
    assert all("threads" not in p for p in doc["data"]["processes"])


@pytest.mark.parametrize("values, message", [
    ({"pid": "12;rm"}, "--pid: expected a comma list of process ids"),
    ({"match": "(unclosed"}, "--match: not a regular expression"),
])
def test_bad_pid_and_match_are_refused_before_connecting(values, message):
    with pytest.raises(InputError) as caught:
        stacks_run.check_values(values)
    assert str(caught.value).startswith(message)
    stacks_run.check_values({"pid": "1, 2,3", "match": r"vllm\."})      # fine


def test_the_client_reads_only_well_formed_processes_and_judges_the_fleet():
    dump = [json.load(open(os.path.join(FIXTURES, f"pyspy-gloo4-rank{r}.json"))) for r in range(4)]
    results = [
        Result(diagnostic="stacks", target="a", status="ok", summary="",
               data={"processes": [{"pid": 1, "rank": 0, "threads": dump[0]},
                                   {"pid": 2, "rank": 1, "threads": dump[1]},
                                   {"pid": 3, "rank": True, "threads": "garbage"}, "junk"]}),
        Result(diagnostic="stacks", target="b", status="ok", summary="",
               data={"processes": [{"pid": 4, "rank": 2, "threads": dump[2]},
                                   {"pid": 5, "rank": 3, "threads": dump[3]}]}),
        Result(diagnostic="stacks", target="c", status="ok", summary="", data={"processes": "x"}),
    ]
    assert [(s.member) for s in stacks_run.rank_stacks(results)] == ["a:0", "a:1", "b:2", "b:3"]
    stacks_run.amend(results)
    assert [r.status for r in results] == ["ok", "fail", "ok"]
    [odd] = results[1].findings
    assert odd.code == "stacks-odd-one-out" and odd.message.startswith("1/4 ranks (b:3) not in the collective")


def test_the_more_groups_finding_goes_to_the_targets_it_counts():
    dump0 = json.load(open(os.path.join(FIXTURES, "pyspy-gloo4-rank0.json")))

    def own(i):
        return [{"thread_name": "MainThread", "frames": [{"name": f"f{i}", "filename": "/app/x.py",
                                                          "short_filename": "x.py", "line": i}]}]
    results = [Result(diagnostic="stacks", target="major", status="ok", summary="",
                      data={"processes": [{"pid": p, "rank": p, "threads": dump0} for p in range(30)]})]
    results += [Result(diagnostic="stacks", target=f"odd{i:02d}", status="ok", summary="",
                       data={"processes": [{"pid": 1, "rank": 100 + i, "threads": own(i)}]})
                for i in range(25)]
    stacks_run.amend(results)
    assert results[0].status == "ok" and results[0].findings == []
    firsts = [r.findings for r in results[1:21]]
    assert all(len(f) == 1 and f[0].message.startswith("1/55 ranks (odd") for f in firsts), firsts
    for r in results[21:]:
        assert [f.message for f in r.findings] == ["… 5 more groups (5 ranks) with stacks of their own"]
        assert r.status == "fail"
