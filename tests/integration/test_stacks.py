"""stacks (issue 13) against real hung jobs on CPU torch with the gloo backend, where the last
rank blocks in a function of its own (``signal.sigwait``, so it is released by SIGUSR1 and by
nothing else) while the others wait in ``all_reduce`` (shared/notes/test-infra.md, "A hung
distributed job"):

- a 2-node torchrun job: node 0 on the lab host (ranks 0-1), node 1 in LXC CT 200 (ranks 2-3,
  rank 3 the odd one), torch bind-mounted read-only into the CT. Reached over ssh (``box-sudo``:
  ssh main → sudo) and ssh → sudo → pct (``ct``); the host alone sees only its own ranks, the
  two targets together fold across hosts and name ``ct:3``. Neither the host's sudo PATH nor the
  CT has py-spy: mldiag ships the client's. ``--no-upload`` reads with the standard-library
  reader (pyframes.py) and must fold to the same lines. At the end the odd rank is released and
  the job finishes: nothing was disturbed.
- an ``mp.spawn`` job of 3 workers (no RANK in their environment).
py-spy is the PyPI wheel's static binary (the ``test`` extra)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest

from tests import programs
from tests.integration.test_diagnostics_remote import bind, ct, mlenv
from tests.lab import lxc

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "tests" / "fixtures" / "stacks" / "hung_gloo_job.py"
SPAWN_JOB = REPO / "tests" / "fixtures" / "stacks" / "hung_spawn_job.py"
mldiag = partial(programs.mldiag, timeout=120)
FR_VAR = "TORCH_FR_DUMP_TEMP_FILE"
START_DEADLINE = 240     # four torch imports at once on a busy 2-core machine take a while

# signal.sigwait is a Python wrapper in the standard library: its line is the CPython's own
ODD = "sigwait (signal.py:{line}) ← wait_for_data (hung_gloo_job.py:11) ← main (hung_gloo_job.py:42)"
MAJOR = ("all_reduce (torch/distributed/distributed_c10d.py) ← sync (hung_gloo_job.py:15) ← main "
         "(hung_gloo_job.py:43)")


class free_port:
    """A free TCP port on 127.0.0.1 (released just before torchrun binds it)."""
    def __enter__(self):
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def __exit__(self, *exc):
        return False


def environ(pid):
    try:
        items = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(i.decode(errors="replace").partition("=")[::2] for i in items if b"=" in i)


def nspid(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(n) for n in line.split()[1:]]
    return []


def job_ranks(script_name, **env_match):
    """{rank: host pid} of the job's workers (by RANK in their environment, or by order)."""
    found = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        env = environ(name)
        if any(script_name.encode() in c for c in cmd) and "RANK" in env and \
                all(env.get(k) == v for k, v in env_match.items()):
            found[int(env["RANK"])] = int(name)
    return found


def wait_for(logs, count, procs):
    end = time.monotonic() + START_DEADLINE
    while sum(log.read_text(errors="replace").count("warm ") for log in logs) < count:
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > end:
            text = "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-3000:]}" for log in logs)
            pytest.fail(f"the hung job did not start:\n{text}")
        time.sleep(0.2)
    time.sleep(1.0)                            # the others are inside all_reduce by now


def end_session(proc):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:             # gone already
            return
        try:
            proc.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            continue


def torch_in_ct(lab):
    """The env a CT process needs to import this process's torch (bind-mounted read-only)."""
    lab.need("lxc")
    torch = mlenv.require("torch")
    site = Path(torch.__file__).resolve().parents[1]
    bind(lab, lambda b: b == site, f"site-packages {site}")
    libdir = bind(lab, lambda b: b.parent.name == "ml" and b.name.startswith("lib-"), "the torch libs dir")
    fixtures = bind(lab, lambda b: b.name == "fixtures", "tests/fixtures")
    return {"PYTHONPATH": str(site), "LD_LIBRARY_PATH": str(libdir)}, fixtures


def start_two_nodes(lab, work, job, host_env, ct_env):
    """torchrun --nnodes 2 of ``job`` (a file of tests/fixtures/stacks): node 0 here (ranks
    0-1, with ``host_env``), node 1 in CT 200 (ranks 2-3, with ``ct_env``). (procs, logs)."""
    env, fixtures = torch_in_ct(lab)
    logs = (work / "node0.log", work / "node1.log")
    torchrun = Path(sys.executable).with_name("torchrun")
    procs = []
    with free_port() as port:
        common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                  "--master-port", str(port)]
        with open(logs[0], "wb") as out:
            procs.append(subprocess.Popen([str(torchrun), *common, "--node-rank", "0", str(job)],
                                          stdout=out, stderr=subprocess.STDOUT, cwd=str(work),
                                          start_new_session=True, env={**os.environ, **host_env}))
        with open(logs[1], "wb") as out:
            procs.append(subprocess.Popen(
                # the CT's pid and mount namespaces, the host's network: its ranks reach node 0
                # on 127.0.0.1 (the lab's CTs have a network namespace of their own, lo only)
                ["lxc-attach", "-P", str(lab.lxc_path), "-n", str(lab.ct_running),
                 "--namespaces=MOUNT|PID|UTS|IPC", "--clear-env", "--",
                 "env", *(f"{k}={v}" for k, v in {**env, **ct_env}.items()),
                 lab.venv_python, "-m",
                 "torch.distributed.run", *common, "--node-rank", "1",
                 str(fixtures / "stacks" / job.name)],
                stdout=out, stderr=subprocess.STDOUT, cwd="/", start_new_session=True))
    return procs, logs


@pytest.fixture(scope="module")
def two_node_job(lab, tmp_path_factory):
    """torchrun --nnodes 2: node 0 here, node 1 in CT 200.
    Yields {"host": {rank: pid}, "ct": {rank: host pid}, "procs": (host, ct), "logs": ...}."""
    work = tmp_path_factory.mktemp("hung-job")
    procs, logs = start_two_nodes(lab, work, JOB, {FR_VAR: str(work / "fr_rank_")}, {FR_VAR: "/tmp/fr_rank_"})
    dumps = []
    try:
        wait_for(logs, 4, procs)
        host = job_ranks(JOB.name, GROUP_RANK="0")
        in_ct = job_ranks(JOB.name, GROUP_RANK="1")
        assert sorted(host) == [0, 1] and sorted(in_ct) == [2, 3], (host, in_ct)
        ct_root = Path(f"/proc/{lxc.init_pid(lab.lxc_path, lab.ct_running)}/root")   # outlives the job
        dumps = [work / "fr_rank_0", work / "fr_rank_1", *(ct_root / "tmp" / f"fr_rank_{r}" for r in (2, 3))]
        end = time.monotonic() + 30
        while not all(d.exists() for d in dumps):
            assert time.monotonic() < end, f"no flight-recorder dumps: {[d.exists() for d in dumps]}"
            time.sleep(0.1)
        yield {"host": host, "ct": in_ct, "procs": procs, "logs": logs}
    finally:
        for dump in dumps:                             # the CT's /tmp is shared by later tests
            try:
                dump.unlink()
            except OSError:
                pass
        end_two_nodes(procs, JOB)


def end_two_nodes(procs, job):
    """Both nodes' sessions ended, and what lxc-attach left inside the CT."""
    for proc in procs:
        end_session(proc)
    for pid in job_ranks(job.name).values():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def py_spy(lab):
    """py-spy where every lab user may run it (the checkout may sit under a 0700 home)."""
    found = shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")
    if not found:
        pytest.fail("py-spy is not installed (pip install -e '.[test]')")
    dest = lab.dir / "py-spy"
    shutil.copyfile(found, dest)
    dest.chmod(0o755)
    return dest


@pytest.fixture(scope="module")
def hosts(lab):
    return lab.hosts_yaml("defaults: {connect_timeout: 5, timeout: 120}\n"
                          "hosts:\n"
                          "  here: {local: true}\n"
                          "  box-sudo: {address: main, become: sudo, python: /usr/bin/python3}\n"
                          "  box: {address: main, python: /usr/bin/python3}\n"
                          "  pve:\n"
                          "    address: main\n"
                          "    become: sudo\n"
                          "    containers:\n" + ct("ct"))


def docs_of(r):
    assert "Traceback" not in r.stderr, r.stderr
    return {d["target"]: d for d in json.loads(r.stdout)}


def fold_lines(stdout):
    """The folded view after the table: the lines that start with 'N/M ranks', with the line
    of the standard library's signal.py (a CPython's own) as {line}."""
    return [re.sub(r"sigwait \(signal\.py:\d+\)", "sigwait (signal.py:{line})", line)
            for line in stdout.splitlines() if re.match(r"\d+/\d+ ranks ", line)]


@pytest.mark.parametrize("target", ["here", "box-sudo"])
def test_one_node_alone_sees_its_own_ranks_agree(two_node_job, hosts, py_spy, target):
    """On the host, the CT's ranks are another pid namespace's: counted, left out. Its two
    ranks agree; its flight-recorder dumps say that ranks 2-3 exist and were not asked."""
    r = mldiag("stacks", "--hosts-file", hosts, "-H", target, "--py-spy", py_spy, "--json")
    doc = docs_of(r)[target]
    assert r.returncode == 1, r.stdout + r.stderr
    procs = doc["data"]["processes"]
    assert [(p["rank"], p["pid"], p["world_size"], p["found_by"], p["collector"]) for p in procs] == [
        (rank, two_node_job["host"][rank], 4, "torch", "py-spy") for rank in (0, 1)]
    assert doc["data"]["left_out"] == {"in a container below this one": 2}
    assert doc["summary"] == "2 processes (ranks 0,1), 2 stacks read; 2 in containers left out"
    assert [(f["level"], f["code"], f["message"]) for f in doc["findings"]] == [
        ("warn", "fr-missing-dumps", "flight recorder: no dump from ranks 2-3 (2 of 4 ranks dumped; "
                                     "members from pg_config)")]


def test_the_odd_rank_is_named_across_the_host_and_its_container(two_node_job, hosts):
    """box-sudo (ssh → sudo) and ct (ssh → sudo → pct exec 200), neither with py-spy: the
    client's is shipped to both, and the fold runs across them."""
    tmp_before = set(lab_ct_tmp(two_node_job))
    r = mldiag("stacks", "--hosts-file", hosts, "-H", "box-sudo,ct", "--no-color")
    assert r.returncode == 2, r.stdout + r.stderr
    assert fold_lines(r.stdout) == [f"3/4 ranks (box-sudo:[0-1],ct:2)  {MAJOR}",
                                    f"1/4 ranks (ct:3)                 {ODD}   ← the odd one out"]
    assert ("  fail  stacks-odd-one-out: 1/4 ranks (ct:3) not in the collective the other 3 wait in "
            f"(all_reduce): {ODD}") in fold_lines(r.stdout) + [
                re.sub(r"signal\.py:\d+", "signal.py:{line}", line) for line in r.stdout.splitlines()]

    docs = docs_of(mldiag("stacks", "--hosts-file", hosts, "-H", "box-sudo,ct", "--json"))
    for name, ranks in (("box-sudo", (0, 1)), ("ct", (2, 3))):
        data = docs[name]["data"]
        assert data["collector"] == "py-spy" and "wants_py_spy" not in data
        # shipped into the run's private temp dir (removed after it), not found on the target
        assert re.fullmatch(r"/tmp/mldiag-[^/]+/py-spy", data["py_spy"]), data["py_spy"]
        assert [p["rank"] for p in data["processes"]] == list(ranks)
    ct_procs = docs["ct"]["data"]["processes"]
    # inside the CT, its own pids: NSpid's last number of the host's view
    assert [p["pid"] for p in ct_procs] == [nspid(two_node_job["ct"][rank])[-1] for rank in (2, 3)]
    assert docs["ct"]["status"] == "fail" and docs["box-sudo"]["status"] == "ok"
    # the flight recorder, from the dumps the job wrote itself (host: its work dir; CT: its /tmp)
    assert [d["rank"] for d in docs["box-sudo"]["data"]["flight_recorder"]["dumps"]] == [0, 1]
    assert [d["rank"] for d in docs["ct"]["data"]["flight_recorder"]["dumps"]] == [2, 3]
    assert [(f["level"], f["code"], f["message"]) for f in docs["ct"]["findings"]] == [
        ("fail", "stacks-odd-one-out", re.sub(r"\{line\}", re.search(
            r"signal\.py:(\d+)", docs["ct"]["findings"][0]["message"]).group(1),
            f"1/4 ranks (ct:3) not in the collective the other 3 wait in (all_reduce): {ODD}")),
        ("fail", "fr-ranks-diverge", "flight recorder: pg 0 (default_pg) diverges at collective #2 "
                                     "(all_reduce): ranks 0-2 enqueued all_reduce #2, rank 3 (on ct) is at "
                                     "#1 (all_reduce)")]
    assert "  pg 0 (default_pg): ranks 0-2 at #2 all_reduce; rank 3 at #1 all_reduce   ← diverge at #2" \
        in r.stdout.splitlines(), r.stdout
    # each group's frames with their source lines, read where each rank sees its files
    text = r.stdout.splitlines()
    odd_at = next(i for i, line in enumerate(text) if line.startswith("1/4 ranks (ct:3)"))
    assert [line.split(None, 1) for line in text[odd_at + 1:odd_at + 4]][1:] == [
        ["hung_gloo_job.py:11", "signal.sigwait([signal.SIGUSR1]) # released by SIGUSR1, never by accident"],
        ["hung_gloo_job.py:42", "wait_for_data()"]], text[odd_at:odd_at + 4]
    major_at = next(i for i, line in enumerate(text) if line.startswith("3/4 ranks ("))
    assert ["hung_gloo_job.py:15", "dist.all_reduce(t)"] in [line.split(None, 1) for line in text[major_at:odd_at]]
    assert set(lab_ct_tmp(two_node_job)) - tmp_before == set()      # the run's temp dirs are gone


def lab_ct_tmp(job):
    """The CT's /tmp, seen through one of its processes."""
    return os.listdir(f"/proc/{job['ct'][2]}/root/tmp")


def test_native_frames_on_request(two_node_job, hosts, py_spy):
    """py-spy --native: the C/C++ frames under the Python ones (about 1 s per torch rank)."""
    plain = docs_of(mldiag("stacks", "--hosts-file", hosts, "-H", "here", "--py-spy", py_spy, "--json"))
    native = docs_of(mldiag("stacks", "--hosts-file", hosts, "-H", "here", "--py-spy", py_spy, "--json",
                            "--native"))
    for p, n in zip(plain["here"]["data"]["processes"], native["here"]["data"]["processes"]):
        py_frames = p["threads"][0]["frames"]
        all_frames = n["threads"][0]["frames"]
        assert n["error"] is None and len(all_frames) > len(py_frames), (len(all_frames), len(py_frames))
        assert any("::" in f["name"] for f in all_frames), [f["name"] for f in all_frames][:20]


def test_all_namespaces_on_the_host_sees_the_whole_job(two_node_job, hosts, py_spy):
    r = mldiag("stacks", "--hosts-file", hosts, "-H", "box-sudo", "--py-spy", py_spy,
               "--all-namespaces", "--no-color")
    assert r.returncode == 2, r.stdout + r.stderr
    assert fold_lines(r.stdout) == [f"3/4 ranks (box-sudo:[0-2])  {MAJOR}",
                                    f"1/4 ranks (box-sudo:3)      {ODD}   ← the odd one out"]
    doc = docs_of(mldiag("stacks", "--hosts-file", hosts, "-H", "box-sudo", "--py-spy", py_spy,
                         "--all-namespaces", "--json"))["box-sudo"]
    by_rank = {p["rank"]: p for p in doc["data"]["processes"]}
    for rank in (2, 3):
        host_pid = two_node_job["ct"][rank]
        assert by_rank[rank]["pid"] == host_pid and by_rank[rank]["ns_pid"] == nspid(host_pid)[-1] != host_pid


@pytest.mark.parametrize("targets", ["box-sudo,ct"])
def test_no_upload_reads_the_same_stacks_with_the_standard_library(two_node_job, hosts, targets):
    """The host's /usr/bin/python3 reads pyenv's 3.11.7 ranks; the CT's venv python (Debian's
    3.11) reads the CT's ranks: the fold is line for line py-spy's."""
    r = mldiag("stacks", "--hosts-file", hosts, "-H", targets, "--no-upload", "--no-color")
    assert r.returncode == 2, r.stdout + r.stderr
    assert fold_lines(r.stdout) == [f"3/4 ranks (box-sudo:[0-1],ct:2)  {MAJOR}",
                                    f"1/4 ranks (ct:3)                 {ODD}   ← the odd one out"]
    docs = docs_of(mldiag("stacks", "--hosts-file", hosts, "-H", targets, "--no-upload", "--json"))
    for doc in docs.values():
        assert doc["data"]["collector"] == "stdlib" and doc["data"]["py_spy"] is None
        assert "(stdlib)" in doc["summary"]


def test_a_window_over_a_hung_job_names_no_straggler(two_node_job, hosts):
    """stacks --window on the hung job: every rank's stack stands still through the window (the
    three in all_reduce wait in every sample, the odd one in none of them): hung, not slow, so
    no straggler is named; the fold still names the odd rank."""
    docs = docs_of(mldiag("stacks", "--hosts-file", hosts, "-H", "box-sudo,ct", "--no-upload", "--window", "2",
                          "--rate", "5", "--json"))
    windows = {p["rank"]: p["window"] for d in docs.values() for p in d["data"]["processes"]}
    assert {r: (w["wait_share"], w["distinct_stacks"]) for r, w in windows.items()} == {
        0: (1.0, 1), 1: (1.0, 1), 2: (1.0, 1), 3: (0.0, 1)}
    codes = [f["code"] for d in docs.values() for f in d["findings"]]
    assert "straggler" not in codes and "stacks-odd-one-out" in codes


def test_another_users_processes_are_a_clear_ptrace_finding(two_node_job, hosts, py_spy):
    """mlsh may not read root's processes: their environment hides the ranks, and the one named
    with --pid is refused by the kernel: a fail finding that says how to get in."""
    pid = two_node_job["host"][1]
    for extra in ((), ("--no-upload",)):
        r = mldiag("stacks", "--hosts-file", hosts, "-H", "box", "--py-spy", py_spy, "--json",
                   "--pid", str(pid), *extra)
        doc = docs_of(r)["box"]
        assert r.returncode == 2, r.stdout + r.stderr
        assert [(f["level"], f["code"]) for f in doc["findings"]] == [("fail", "ptrace-denied")], doc
        assert doc["findings"][0]["message"] == f"reading the stack was refused for pid {pid}"
        assert "become: sudo" in doc["findings"][0]["hint"]
        [proc] = doc["data"]["processes"]
        assert proc["found_by"] == "pid" and proc["rank"] is None and proc["threads"] is None


def test_the_hung_job_runbook_puts_the_odd_rank_first(two_node_job, lab, tmp_path):
    """`runbook hung-job` (the old name of slow-or-hung): stacks over a window on both targets
    (judged together: every rank stands still, so hung, not slow), the job's log scanned for
    the first gloo timeout (a real one: tests/fixtures/stacks/gloo_timeout.log), NCCL's RAS
    (nothing listens: a gloo job), gpu-status; the report opens with the verdict and where the
    odd rank is."""
    _env, fixtures = torch_in_ct(lab)
    log = fixtures / "stacks" / "gloo_timeout.log"
    hosts = lab.hosts_yaml("defaults: {connect_timeout: 5, timeout: 120}\n"
                           "hosts:\n"
                           "  box-sudo: {address: main, become: sudo, python: /usr/bin/python3}\n"
                           "  pve:\n"
                           "    address: main\n"
                           "    become: sudo\n"
                           "    containers:\n"
                           + ct("ct", env={"MLDIAG_FAKE_NVIDIA_SMI": "derived__h200x8__healthy"}))
    save = tmp_path / "report"
    r = mldiag("runbook", "hung-job", "--hosts-file", hosts, "-H", "box-sudo,ct", "--param",
               f"log={log}", "--param", "window=2", "--save", save, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 2, r.stdout + r.stderr
    report = (save / "report.md").read_text()
    assert report == r.stdout
    sections = re.findall(r"^## (.+)$", report, re.M)
    assert sections[:3] == ["Verdict: hung", "Summary", "Findings"], sections
    odd = report.split("## Verdict: hung", 1)[1].split("## Summary", 1)[0]
    assert "- **ct** (pve (main) → sudo → pct 200) · stacks · fail · 1/4 ranks (ct:3) not in the collective " \
           "the other 3 wait in (all_reduce): sigwait (signal.py:" in odd, odd
    assert "\nNext: the odd rank is where the job stands" in odd, odd
    assert [re.sub(r"signal\.py:\d+", "signal.py:{line}", line) for line in odd.splitlines()
            if re.match(r"\d+/\d+ ranks ", line)] == [
        f"3/4 ranks (box-sudo:[0-1],ct:2)  {MAJOR}", f"1/4 ranks (ct:3)                 {ODD}   ← the odd one out"]
    doc = json.loads((save / "report.json").read_text())
    steps = {s["id"]: {x["target"]: x for x in s["results"]} for s in doc["steps"]}
    assert [s["id"] for s in doc["steps"]] == ["stacks", "step-times", "nccl-ras", "scan-log", "gpu-status"]
    assert doc["runbook"] == "slow-or-hung" and doc["verdict"]["verdict"] == "hung"
    assert "straggler" not in [f["code"] for r in steps["stacks"].values() for f in r["findings"]]
    assert steps["stacks"]["ct"]["status"] == "fail" and steps["stacks"]["box-sudo"]["status"] == "ok"
    for target in ("box-sudo", "ct"):
        nccl = {f["code"]: f for f in steps["scan-log"][target]["findings"]}["nccl"]
        assert nccl["message"].startswith("3 NCCL/gloo error/timeout lines — first at line 21: [rank2]: "
                                          "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/")
    # the step's saved result carries the judgement too (saved after the fold, not before)
    saved = json.loads(next((save / "steps").glob("01-stacks/ct.json")).read_text())
    assert "stacks-odd-one-out" in [f["code"] for f in saved["findings"]]


def test_the_job_finishes_when_the_odd_rank_is_released(two_node_job):
    """Last: every rank is alive and where it was after all the dumps above; released, the odd
    rank joins the collective and the job ends cleanly on both nodes."""
    pids = {**two_node_job["host"], **two_node_job["ct"]}
    for rank, pid in pids.items():
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        assert state in ("S", "R"), (rank, state)
    os.kill(pids[3], signal.SIGUSR1)
    for proc in two_node_job["procs"]:
        assert proc.wait(timeout=60) == 0
    text = "".join(log.read_text(errors="replace") for log in two_node_job["logs"])
    assert sorted(re.findall(r"^done (\d) 16$", text, re.M)) == ["0", "1", "2", "3"], text


@pytest.fixture(scope="module")
def spawn_job(tmp_path_factory):
    work = tmp_path_factory.mktemp("spawn-job")
    log = work / "log"
    with free_port() as port, open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(SPAWN_JOB), str(port), "3"], stdout=out,
                                stderr=subprocess.STDOUT, cwd=str(work), start_new_session=True)
    try:
        wait_for([log], 3, [proc])
        yield proc, log
    finally:
        end_session(proc)


def test_mp_spawn_workers_are_found_and_ranked_by_their_start(spawn_job, hosts, py_spy):
    proc, log = spawn_job
    r = mldiag("stacks", "--hosts-file", hosts, "-H", "here", "--py-spy", py_spy, "--json")
    doc = docs_of(r)["here"]
    assert r.returncode == 2, r.stdout + r.stderr
    procs = doc["data"]["processes"]
    assert [(p["rank"], p["world_size"], p["found_by"]) for p in procs] == [(0, 3, "spawn"), (1, 3, "spawn"),
                                                                             (2, 3, "spawn")]
    # the ranks by start order are the ranks mp.spawn gave them: rank 2 is the odd one
    [odd] = doc["findings"]
    assert odd["code"] == "stacks-odd-one-out" and re.match(
        r"1/3 ranks \(here:2\) not in the collective the other 2 wait in \(all_reduce\): "
        r"sigwait \(signal\.py:\d+\) ← wait_for_data \(hung_spawn_job\.py:12\) ← worker "
        r"\(hung_spawn_job\.py:26\)", odd["message"]), odd["message"]
    os.kill(procs[2]["pid"], signal.SIGUSR1)
    assert proc.wait(timeout=60) == 0
    assert sorted(re.findall(r"^done (\d) 9$", log.read_text(), re.M)) == ["0", "1", "2"]
