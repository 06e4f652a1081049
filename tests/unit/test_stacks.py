"""scripts/stacks.py's discovery over a /proc tree written here (environ, cmdline, status as the
kernel lays them out), its py-spy error classification against a stand-in that prints what
py-spy prints, and the client's reading of what targets sent (stacks_run). The real job:
tests/integration/test_stacks.py."""

import argparse
import json
import os
import sys

import pytest

from diagnostics.builtin.stacks import run as stacks_run
from diagnostics.core.errors import InputError
from diagnostics.core.results import Result
from tests.programs import load_script

stacks = load_script("stacks.py", "mldiag_test_stacks")
FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "stacks")


def process(proc, pid, env=(), cmd=("python3", "train.py"), nspid=None, ppid=1, start=None, maps=""):
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env))
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmd) + b"\0")
    ns = f"{pid}" if nspid is None else f"{pid}\t{nspid}"
    (d / "status").write_text(f"Name:\tpython3\nPPid:\t{ppid}\nNSpid:\t{ns}\n")
    # /proc/PID/stat: field 22 (starttime) is the 20th after the ")" of the command name
    (d / "stat").write_text(f"{pid} (python3) S {ppid} " + " ".join(["0"] * 17) + f" {start or pid} 0 0\n")
    (d / "maps").write_text(maps)


def torch_env(rank, world=4):
    return [("PATH", "/usr/bin"), ("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world),
            ("GROUP_RANK", 0), ("TORCHELASTIC_RUN_ID", "none"), ("HF_TOKEN", "secret")]


SPAWN_CMD = ("/usr/bin/python3", "-c", "from multiprocessing.spawn import spawn_main; "
             "spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork")
TORCH_MAPS = "7f00-7f10 r-xp 0 08:01 12 /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so\n"


@pytest.fixture
def proc(tmp_path):
    root = tmp_path / "proc"
    process(root, 100, [("PATH", "/usr/bin")], ("python3", "torchrun", "--nproc-per-node", "4"))
    for rank, pid in ((2, 103), (0, 101), (3, 104), (1, 102)):
        process(root, pid, torch_env(rank), ppid=100)
    process(root, 200, [("SLURM_PROCID", 7)], ("/opt/venv/bin/python", "eval.py"))
    process(root, 201, [("SLURM_PROCID", 0)], ("bash", "job.sh"))         # not Python: skipped
    process(root, 300, [], ("python3", "-m", "vllm.entrypoints.api_server"))
    process(root, 301, [], ("vim", "vllm.txt"))
    (root / "self").mkdir()
    (root / "999").mkdir()                                                 # gone meanwhile: no files
    return root


def found_of(proc, **kw):
    found, _ = stacks.discover(str(proc), **kw)
    return [(pid, how, env.get("RANK"), env.get("WORLD_SIZE")) for pid, how, env, _ in found]


def test_ranks_are_found_by_their_environment_in_rank_order(proc):
    found, left_out = stacks.discover(str(proc))
    assert [(pid, how, env.get("RANK"), env.get("SLURM_PROCID")) for pid, how, env, _ in found] == [
        (101, "torch", "0", None), (102, "torch", "1", None), (103, "torch", "2", None),
        (104, "torch", "3", None), (200, "slurm", None, "7")]
    assert left_out == {}
    # only the variables that say where a rank is are kept: never a token
    assert all("HF_TOKEN" not in env and "PATH" not in env for _, _, env, _ in found)


def test_a_containers_ranks_are_left_out_on_its_host_unless_asked(tmp_path):
    root = tmp_path / "proc"
    (root / "self").mkdir(parents=True)
    (root / "self" / "status").write_text("Name:\tpython3\nPPid:\t1\nNSpid:\t50\n")
    for rank in range(2):                                  # on the host
        process(root, 101 + rank, torch_env(rank), ppid=100)
    for rank in (2, 3):                                    # in a CT: its pid inside is the last
        process(root, 201 + rank, torch_env(rank), ppid=200, nspid=10 + rank)
    found, left_out = stacks.discover(str(root))
    assert [pid for pid, *_ in found] == [101, 102]
    assert left_out == {"in a container below this one": 2}
    assert found_of(root, all_namespaces=True) == [(101, "torch", "0", "4"), (102, "torch", "1", "4"),
                                                   (203, "torch", "2", "4"), (204, "torch", "3", "4")]
    assert stacks.ns_pid_of(str(root), 204) == 13 and stacks.ns_pid_of(str(root), 101) == 101
    # inside the CT, the same processes are in our own namespace
    (root / "self" / "status").write_text("Name:\tpython3\nPPid:\t1\nNSpid:\t70\t5\n")
    assert [pid for pid, *_ in stacks.discover(str(root))[0]] == [101, 102, 203, 204]


def test_a_ranks_own_children_and_the_launcher_are_not_ranks(tmp_path):
    root = tmp_path / "proc"
    # torchrun started by srun: a Python process with SLURM_PROCID, parent of the ranks
    process(root, 100, [("SLURM_PROCID", 0)], ("/venv/bin/python", "/venv/bin/torchrun", "train.py"))
    for rank in range(2):
        process(root, 101 + rank, torch_env(rank) + [("SLURM_PROCID", 0)], ppid=100)
    # rank 0's DataLoader workers: forked (same command line and environment at exec) or spawned
    process(root, 110, torch_env(0) + [("SLURM_PROCID", 0)], ppid=101)
    process(root, 111, torch_env(0) + [("SLURM_PROCID", 0)], SPAWN_CMD, ppid=101)
    found, left_out = stacks.discover(str(root))
    assert [(pid, how) for pid, how, *_ in found] == [(101, "torch"), (102, "torch")]
    assert left_out == {"the launcher of the ranks": 1, "a rank's own child (e.g. a DataLoader worker)": 2}
    # named with --pid, a process is dumped whatever it is
    assert (110, "pid", "0", "4") in found_of(root, pids=[110])


def test_mp_spawn_workers_are_ranked_by_their_start(tmp_path):
    root = tmp_path / "proc"
    process(root, 500, [], ("python3", "train_spawn.py"))
    # started in rank order; pids need not be (a wrapped pid counter)
    for pid, start in ((903, 3000), (510, 3001), (511, 3002)):
        process(root, pid, [("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")], SPAWN_CMD,
                ppid=500, start=start)
    process(root, 512, [], SPAWN_CMD, ppid=500, start=3003, maps=TORCH_MAPS)    # torch loaded
    # a multiprocessing pool worker without torch or a master address: not a rank
    process(root, 600, [], SPAWN_CMD, ppid=599)
    assert found_of(root) == [(903, "spawn", "0", "4"), (510, "spawn", "1", "4"),
                              (511, "spawn", "2", "4"), (512, "spawn", "3", "4")]


def test_pid_and_match_add_other_python_processes(proc):
    found = {pid: how for pid, how, _, _ in stacks.discover(str(proc), pids=[100], match=r"vllm\.")[0]}
    assert found[100] == "pid" and found[300] == "match" and 301 not in found


class Args(argparse.Namespace):
    def __init__(self, **kw):
        super().__init__(**{"pid": "", "match": "", "py_spy": "", "native": False,
                            "all_namespaces": False, "offer_py_spy": "", **kw})


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
    assert by_pid[101]["collector"] == "py-spy" and doc["data"]["collector"] == "py-spy"
    assert by_pid[104]["error"] == "py-spy exited 2" and by_pid[200]["error"] == "py-spy's answer is not JSON"
    assert [(f["level"], f["code"]) for f in doc["findings"]] == [("warn", "dump-failed")]
    assert doc["summary"] == "5 processes (ranks 0,1,2,3,7), 3 stacks read"


def test_native_is_passed_to_py_spy(proc, tmp_path):
    rank3 = os.path.join(FIXTURES, "pyspy-gloo4-rank3.json")
    spy = fake_py_spy(tmp_path, f'[ "$5" = --native ] && cat "{rank3}" || exit 3\n')
    doc = stacks.run(Args(py_spy=spy, native=True), proc=str(proc))
    assert doc["status"] == "ok" and doc["summary"] == "5 processes (ranks 0,1,2,3,7), 5 stacks read"


def test_a_py_spy_that_cannot_run_gives_way_to_the_stdlib_reader(proc, tmp_path):
    """A temp dir mounted noexec, or a binary of another machine: py-spy fails to start (an
    OSError, not an answer); the standard-library reader is tried for every process."""
    spy = tmp_path / "py-spy"
    spy.write_bytes(b"\x7fELF not really")
    spy.chmod(0o755)
    doc = stacks.run(Args(py_spy=str(spy)), proc=str(proc))
    assert doc["data"]["py_spy_error"].startswith("py-spy could not run: Exec format error")
    assert {p["collector"] for p in doc["data"]["processes"]} == {"stdlib"}
    assert ("info", "py-spy-unusable") in [(f["level"], f["code"]) for f in doc["findings"]]


def test_without_py_spy_the_target_asks_for_one_when_offered(proc, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))               # no py-spy on PATH
    monkeypatch.setattr(stacks, "HERE", str(tmp_path))      # nor beside the script
    machine = stacks.platform.machine()
    doc = stacks.run(Args(py_spy=str(tmp_path / "none"), offer_py_spy=machine), proc=str(proc))
    assert doc["status"] == "ok" and doc["data"]["wants_py_spy"] is True
    assert [p["rank"] for p in doc["data"]["processes"]] == [0, 1, 2, 3, 7]
    assert all("threads" not in p for p in doc["data"]["processes"])    # nothing read yet
    # offered for another machine type: no ask, the stdlib reader is tried at once
    doc = stacks.run(Args(py_spy=str(tmp_path / "none"), offer_py_spy="s390x"), proc=str(proc))
    assert "wants_py_spy" not in doc["data"]
    assert {p["collector"] for p in doc["data"]["processes"]} == {"stdlib"}


def test_no_job_and_no_collector_are_said(tmp_path, proc, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(stacks, "HERE", str(empty))
    doc = stacks.run(Args(py_spy=str(tmp_path / "none")), proc=str(empty))
    assert [f["code"] for f in doc["findings"]] == ["no-job-process"] and doc["status"] == "warn"
    monkeypatch.setenv("PATH", str(empty))               # and none on PATH either
    doc = stacks.run(Args(py_spy=str(tmp_path / "none")), proc=str(proc))
    # these stand-in processes are files, not processes: the stdlib reader cannot read them
    assert [f["code"] for f in doc["findings"]] == ["py-spy-absent"] and doc["data"]["py_spy"] is None
    assert "the standard-library reader could not read the 5 processes" in doc["findings"][0]["message"]
    assert [p["rank"] for p in doc["data"]["processes"]] == [0, 1, 2, 3, 7]
    assert all(p["threads"] is None for p in doc["data"]["processes"])


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


def test_the_flight_recorder_finding_goes_to_the_target_of_the_rank_behind():
    """The recorded gloo dumps (tests/fixtures/stacks/fr), as two targets would send them:
    ranks 0-1 on a, 2-3 on b. Rank 3 is behind: its target gets the finding."""
    fr = load_script("flight_recorder.py", "mldiag_test_stacks_fr_reader")
    collected = fr.collect([os.path.join(FIXTURES, "fr", "comm_lib_trace_rank_")])
    assert [d["rank"] for d in collected["dumps"]] == [0, 1, 2, 3]
    results = [Result(diagnostic="stacks", target=name, status="ok", summary="",
                      data={"processes": [], "flight_recorder": dict(
                          collected, dumps=[d for d in collected["dumps"] if d["rank"] in ranks])})
               for name, ranks in (("a", (0, 1)), ("b", (2, 3)))]
    stacks_run.amend(results)
    assert results[0].findings == [] and results[0].status == "ok"
    [behind] = results[1].findings
    assert (behind.level, behind.code, results[1].status) == ("fail", "fr-ranks-diverge", "fail")
    assert behind.message == ("flight recorder: pg 0 (default_pg) diverges at collective #2 (all_reduce): "
                              "ranks 0-2 enqueued all_reduce #2, rank 3 (on b) is at #1 (all_reduce)")
    assert behind.hint
    view = stacks_run.fold_view(results)
    assert view[0] == "flight recorder: 4 dumps, ranks 0-3 on a,b, format 2.10"
    assert "  pg 0 (default_pg): ranks 0-2 at #2 all_reduce; rank 3 at #1 all_reduce   ← diverge at #2" in view


def test_source_lines_are_read_only_where_the_processes_owner_may(tmp_path):
    """add_source reads through /proc/PID/root (here a directory standing for the process's
    root): a .py file the owner may read gives its line; a link, a file of another user it may
    not read, or a name that is not .py gives nothing."""
    proc, root = tmp_path / "proc", tmp_path / "rootfs"
    (proc / "77").mkdir(parents=True)
    (proc / "77" / "root").symlink_to(root)
    (root / "app").mkdir(parents=True)
    (root / "app" / "train.py").write_text("import os\n\ndef main():\n    wait()   \n")
    (root / "app" / "secret.py").write_text("TOKEN = 'hunter2'\n")
    os.chown(root / "app" / "secret.py", 12345, 12345)
    (root / "app" / "secret.py").chmod(0o600)
    (root / "app" / "link.py").symlink_to(root / "app" / "train.py")
    (root / "etc").mkdir()
    (root / "etc" / "shadow").write_text("root:$6$x:1::::::\n")

    def frame(name, line):
        return {"name": "f", "filename": name, "short_filename": os.path.basename(name), "line": line}

    threads = [{"thread_name": "MainThread", "frames": [
        frame("/app/train.py", 4), frame("/app/secret.py", 1), frame("/app/link.py", 4),
        frame("/etc/shadow", 1), frame("/app/train.py", 99), "junk"]}]
    stacks.add_source(str(proc), 77, threads)
    assert [f.get("source") for f in threads[0]["frames"][:5]] == ["wait()", None, None, None, None]
    stacks.add_source(str(proc), 77, "garbage")         # a dump that is not a list: nothing


def test_companions_are_ours_whatever_the_targets_path_holds(tmp_path, monkeypatch):
    """A package named like a companion on the target's sys.path is neither used nor shadowed."""
    (tmp_path / "pyframes.py").write_text("raise SystemExit('the wrong pyframes')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = stacks.companion("pyframes")
    assert os.path.dirname(module.__file__) == stacks.HERE and hasattr(module, "dump")
    assert "pyframes" not in sys.modules or sys.modules["pyframes"].__file__ != module.__file__
    assert stacks.companion("no_such_companion") is None
