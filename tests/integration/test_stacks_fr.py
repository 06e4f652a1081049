"""Flight-recorder dumps (issue 13 item 4) from a real job run here: 4 torchrun ranks on gloo
(CPU torch), ranks 0-2 enqueue a second all_reduce that rank 3 never joins, each rank writes
its own dump (tests/fixtures/stacks/fr_gloo_job.py) into this test's directory; then
scripts/flight_recorder.py, run by hand as a target runs it, and the client's analysis
(diagnostics/builtin/stacks/flight_recorder.py) on what it printed."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from diagnostics.builtin.stacks import flight_recorder as stacks_fr
from tests.programs import SCRIPTS, mldiag

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "fixtures" / "stacks" / "fr_gloo_job.py"
JOB_TIMEOUT = 150            # four ranks importing torch at once on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """The job run to its end (it exits by itself once every rank has dumped): the prefix."""
    torchrun = Path(sys.executable).with_name("torchrun")
    work = tmp_path_factory.mktemp("fr-job")
    prefix = str(work / "fr_trace_rank_")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCH_FR_DUMP_TEMP_FILE", None)
    proc = subprocess.Popen([str(torchrun), "--nproc-per-node", "4", "--master-port", str(free_port()),
                             str(JOB), prefix], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            cwd=str(work), env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the job did not end within {JOB_TIMEOUT} s:\n{out.decode(errors='replace')[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)      # anything of the session left behind
        except ProcessLookupError:
            pass
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert text.count("dumped ") == 4, text[-3000:]
    return prefix


def test_fresh_dumps_name_rank_3(dumps):
    proc = subprocess.run([sys.executable, str(SCRIPTS / "flight_recorder.py"), dumps],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    collected = json.loads(proc.stdout)
    assert [d["rank"] for d in collected["dumps"]] == [0, 1, 2, 3]
    assert all("error" not in d and d["format"] == "pickle" for d in collected["dumps"])
    assert [d["pg_status"]["0"]["last_enqueued_collective"] for d in collected["dumps"]] == [2, 2, 2, 1]
    assert list(collected["dumps"][0]["pg_config"]) == [""]            # gloo's shape
    assert {e["state"] for d in collected["dumps"] for e in d["entries"]} == {"scheduled"}
    last = collected["dumps"][0]["entries"][-1]
    assert last["profiling_name"] == "gloo:all_reduce" and last["collective_seq_id"] == 2
    assert [f["name"] for f in last["frames"]][:2] == ["all_reduce", "sync"]

    findings, lines = stacks_fr.analyse([("local", collected)])
    assert [f["code"] for f in findings] == ["fr-ranks-diverge"]
    assert findings[0]["level"] == "fail"
    assert findings[0]["message"] == (
        "flight recorder: pg 0 (default_pg) diverges at collective #2 (all_reduce): ranks 0-2 "
        "enqueued all_reduce #2, rank 3 (on local) is at #1 (all_reduce)")
    (d,) = stacks_fr.divergences(stacks_fr.merge([("local", collected)])[0]).diverged
    assert d.seq == 2 and d.behind == {3: 1} and sorted(d.ahead) == [0, 1, 2]
    assert lines[-1].endswith("← diverge at #2")


def test_found_through_the_jobs_environment(dumps):
    """What stacks would do from /proc/PID/environ: TORCH_FR_DUMP_TEMP_FILE names the prefix."""
    from tests.programs import load_script
    fr = load_script("flight_recorder.py", "mldiag_test_fr_integration")
    env = {"TORCH_FR_DUMP_TEMP_FILE": os.path.basename(dumps), "HOME": "/nonexistent"}
    prefixes = fr.prefixes_from_environ(env, cwd=os.path.dirname(dumps))
    assert prefixes[0] == dumps
    collected = fr.collect(prefixes)
    assert [d["rank"] for d in collected["dumps"]] == [0, 1, 2, 3]
    # rank 3's file gone (it never dumped): the '' pg_config still names it
    findings, _ = stacks_fr.analyse([("local", {"dumps": collected["dumps"][:3]})])
    assert [f["code"] for f in findings] == ["fr-missing-dumps", "fr-agree"]
    assert "no dump from rank 3 (3 of 4 ranks dumped" in findings[0]["message"]


LIVE_JOB = REPO / "tests" / "fixtures" / "stacks" / "fr_live_gloo_job.py"


@pytest.fixture(scope="module")
def live_job(tmp_path_factory):
    """The hung job of fr_live_gloo_job.py kept running: ranks 0 and 2 serve torch's worker
    server on a Unix socket of their own (worker_main, $TORCH_WORKER_SERVER_SOCKET set per rank
    by the launch line, as a launcher would), ranks 1 and 3 on a wildcard TCP port
    (start_debug_server's per-rank server). Nothing writes a dump file."""
    torchrun = Path(sys.executable).with_name("torchrun")
    work = tmp_path_factory.mktemp("fr-live")
    stop = work / "stop"
    launch = ('case $RANK in 0|2) export TORCH_WORKER_SERVER_SOCKET="$0/rank$RANK.sock";; esac; '
              'exec "$1" "$2" "$3"')
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_FR_DUMP_TEMP_FILE=str(work / "no_dump_"))
    env.pop("TORCH_WORKER_SERVER_SOCKET", None)
    proc = subprocess.Popen([str(torchrun), "--nproc-per-node", "4", "--master-port", str(free_port()),
                             "--no-python", "sh", "-c", launch, str(work), sys.executable, str(LIVE_JOB),
                             str(stop)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=str(work),
                            env=env, start_new_session=True)
    out = b""
    try:
        import select
        end = time.monotonic() + JOB_TIMEOUT
        while out.count(b"serving ") < 4:
            if proc.poll() is not None or time.monotonic() > end:
                pytest.fail(f"the live job did not start:\n{out.decode(errors='replace')[-3000:]}")
            if select.select([proc.stdout], [], [], 1.0)[0]:
                out += os.read(proc.stdout.fileno(), 65536)
        yield work
    finally:
        stop.touch()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def test_the_running_ranks_are_asked_for_their_flight_recorder(live_job):
    """Every rank's stack is the same (all wait in the job's own loop, their all_reduce enqueued
    asynchronously): only the flight recorders, asked of the running ranks through torch's
    worker server, say that rank 3 never enqueued the second all_reduce."""
    r = mldiag("stacks", "-H", "local", "--no-upload", "--json", timeout=120)
    assert "Traceback" not in r.stderr, r.stderr
    (doc,) = json.loads(r.stdout)
    dumps = doc["data"]["flight_recorder"]["dumps"]
    assert sorted((d["rank"], d["live"], "error" in d, d["format"]) for d in dumps) == [
        (rank, True, False, "json") for rank in range(4)], dumps
    how = {d["rank"]: d["file"].split(", ")[1] for d in dumps}
    assert [how[r].split(" ")[:2] for r in range(4)] == [
        ["unix", "socket"], ["port", how[1].split(" ")[1]], ["unix", "socket"], ["port", how[3].split(" ")[1]]]
    assert how[0] == f"unix socket {live_job / 'rank0.sock'}"
    assert [d["pg_status"]["0"]["last_enqueued_collective"] for d in sorted(dumps, key=lambda d: d["rank"])] == [2, 2, 2, 1]
    assert [f["code"] for f in doc["findings"]] == ["fr-ranks-diverge"], doc["findings"]
    assert doc["findings"][0]["message"] == (
        "flight recorder: pg 0 (default_pg) diverges at collective #2 (all_reduce): ranks 0-2 "
        "enqueued all_reduce #2, rank 3 (on local) is at #1 (all_reduce)")
    r = mldiag("stacks", "-H", "local", "--no-upload", timeout=120)
    assert "flight recorder: 4 dumps (4 asked of the running ranks), ranks 0-3 on local" in r.stdout, r.stdout
