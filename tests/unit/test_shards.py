"""A fan-out spread over worker processes (diagnostics/engine/shards.py, issue 14 goal 4) gives what
the same run in one process gives: the table, the --save directory and the exit code; a worker
that dies costs only its own targets; TERM ends every worker. Local targets here (each its own
group); tests/integration/test_shards.py runs SSH hosts and containers."""

import json
import os
import re
import signal
import uuid
from functools import partial

import pytest

from diagnostics.engine import bundle, runner, shards
from diagnostics.inventory import topology
from diagnostics.core.errors import InputError
from diagnostics.inventory.topology import Container, SshHost, Target
from tests.lab.util import pids_with_marker as marked, wait_until
from tests.programs import mldiag, running_mldiag, signal_and_wait

wait_for = partial(wait_until, interval=0.1)

PROBE = """\
import os, sys
print("hello from", os.environ["MLDIAG_TARGET"], os.environ.get("HF_TOKEN", "-"))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("SHARD_EXIT", "0")))
"""
HOSTS = """\
hosts:
  a: {local: true, env: {HF_TOKEN: "hf_abcdefghijklmnopqrstuvwxyz0123456789"}}
  b: {local: true}
  c: {local: true, env: {SHARD_EXIT: "3"}}
  d: {local: true}
  e: {local: true, python: /nonexistent/python3}
  f: {local: true}
"""
NAMES = "a,b,c,d,e,f"


def ssh(name, jump=None, **kw):
    return Target(name=name, host=SshHost(name=name, jump=jump, **kw))


# ---------------------------------------------------------------------------- the plan

def test_targets_sharing_a_connection_stay_together_and_the_split_is_balanced():
    jump = SshHost(name="bastion")
    pve = SshHost(name="pve", address="10.0.0.5", user="root")
    targets = [Target(name=f"ct{i}", host=pve, container=Container("pct", str(200 + i)))
               for i in range(4)]
    targets += [ssh("inner1", jump=jump), ssh("inner2", jump=jump), ssh("bastion")]
    targets += [ssh(f"n{i}") for i in range(5)]
    targets += [Target(name="here", local=True), Target(name="there", local=True)]
    assert shards.shard_key(targets[0]) == shards.shard_key(targets[3]) == ("ssh", "10.0.0.5", None, "root")
    assert shards.shard_key(targets[4]) == shards.shard_key(targets[5]) == ("ssh", "bastion", None, None)
    assert shards.shard_key(targets[-1]) != shards.shard_key(targets[-2])   # local: its own
    split = shards.split(targets, 3)
    assert sorted(i for share in split for i in share) == list(range(len(targets)))
    where = {targets[i].name: n for n, share in enumerate(split) for i in share}
    assert len({where[f"ct{i}"] for i in range(4)}) == 1
    assert where["inner1"] == where["inner2"] == where["bastion"]   # one connection to bastion
    assert sorted(len(share) for share in split) == [4, 5, 5]
    assert all(share == sorted(share) for share in split)


def test_how_many_workers():
    many = [ssh(f"n{i}") for i in range(1000)]
    assert shards.worker_count(many, cores=2) == 2
    assert shards.worker_count(many, cores=16) == 16
    assert shards.worker_count(many[:64], cores=16) == 2          # 32 targets per worker at least
    assert shards.worker_count(many[:63], cores=16) == 1
    assert shards.worker_count(many[:3], requested=8) == 3        # never more than the groups
    assert shards.worker_count(many, requested=1) == 1
    pve = SshHost(name="pve")
    cts = [Target(name=f"ct{i}", host=pve, container=Container("pct", str(i))) for i in range(100)]
    assert shards.worker_count(cts, cores=8) == 1                 # one connection: one worker
    slurm = Target(name="cluster", host=SshHost(name="login"), slurm=topology.Slurm(nodes=4))
    assert shards.worker_count(many + [slurm], cores=8) == 1


def test_parallel_is_shared_out_exactly():
    for parallel in (1, 5, 32, 33, 256):
        for workers in (1, 2, 3, 7):
            parts = [shards.parallel_share(parallel, workers, i) for i in range(workers)]
            assert sum(parts) == max(parallel, workers), (parallel, workers, parts)
            assert max(parts) - min(parts) <= 1


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5"])
def test_a_bad_worker_count_is_bad_input(text, tmp_path):
    proc = mldiag("ping", "-H", "local", "--save", tmp_path / "saved", env={"MLDIAG_WORKERS": text})
    assert proc.returncode == 4 and "$MLDIAG_WORKERS must be a whole number" in proc.stderr
    assert not (tmp_path / "saved").exists()      # refused before anything, no DIR left
    with pytest.raises(InputError, match=r"\$MLDIAG_WORKERS must be a whole number"):
        shards.requested_workers({"MLDIAG_WORKERS": text})
    assert shards.requested_workers({}) is None
    assert shards.requested_workers({"MLDIAG_WORKERS": "4"}) == 4


# ---------------------------------------------------------------------------- the runs

def _normalized_table(text: str) -> str:
    return re.sub(r"\d+\.\d+ ?s\b", "Ns", text)


def _saved(directory) -> dict:
    out = {}
    for path in sorted(directory.iterdir()):
        doc = json.loads(path.read_text())
        for row in [doc] + list(doc.get("results", [])) if isinstance(doc, dict) else []:
            row.pop("duration_s", None)
        out[path.name] = doc
    return out


def test_a_sharded_run_gives_the_same_table_save_and_exit_code(tmp_path):
    hosts, probe = tmp_path / "hosts.yaml", tmp_path / "probe.py"
    hosts.write_text(HOSTS)
    probe.write_text(PROBE)
    runs = {}
    for workers in ("1", "3"):
        record = tmp_path / f"commands-{workers}"
        proc = mldiag("run-script", probe, "--hosts-file", hosts, "-H", NAMES,
                      "--save", tmp_path / f"saved-{workers}",
                      env={"MLDIAG_WORKERS": workers, "MLDIAG_RECORD_COMMANDS": str(record)})
        senders = {json.loads(line)["pid"] for line in record.read_text().splitlines()}
        runs[workers] = proc, senders
    (one, one_pids), (three, three_pids) = runs["1"], runs["3"]
    assert len(one_pids) == 1 and len(three_pids) == 3          # the work was spread
    assert one.returncode == three.returncode == 3               # e's python is missing: error
    assert "hf_abcdef" not in one.stdout + three.stdout and "<redacted>" in three.stdout
    assert "hello from c" in three.stdout and "exit 3" in three.stdout
    assert _normalized_table(three.stdout) == _normalized_table(one.stdout)
    assert three.stderr == one.stderr
    assert _saved(tmp_path / "saved-3") == _saved(tmp_path / "saved-1")
    assert len(_saved(tmp_path / "saved-3")) == 7                 # six targets and summary.json
    jsons = [mldiag("run-script", probe, "--hosts-file", hosts, "-H", NAMES, "--json",
                    env={"MLDIAG_WORKERS": w}) for w in ("1", "3")]
    docs = [json.loads(p.stdout) for p in jsons]
    for doc in docs:
        for row in doc:
            row.pop("duration_s")
    assert docs[0] == docs[1] and [r["target"] for r in docs[1]] == NAMES.split(",")


def test_a_worker_that_dies_costs_only_its_own_targets(tmp_path):
    topo = topology.load(str(_hosts(tmp_path)))
    targets = [topo.targets[n] for n in NAMES.split(",") if n != "e"]
    parent = os.getpid()
    script = bundle.Job(diagnostic="run-script", script_name="probe.py",
                        script_source=PROBE.encode(), mode="script")

    def job_for(target):
        if target.name == "b" and os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)      # b's worker dies before b runs
        return script

    arrived = []
    results = runner.run_many(targets, job_for, workers=2, on_result=arrived.append)
    assert [r.target for r in results] == [t.name for t in targets]
    assert sorted(r.target for r in arrived) == sorted(t.name for t in targets)
    split = shards.split(targets, 2)
    dead = next(share for share in split if targets.index(topo.targets["b"]) in share)
    for i, result in enumerate(results):
        if i in dead:
            if result.status == "error":
                assert result.error.layer == "internal"
                assert "worker process" in result.error.message
                assert "killed by SIGKILL" in result.error.message
        else:
            assert result.status in ("ok", "fail"), result.summary
    assert results[targets.index(topo.targets["b"])].status == "error"


def _hosts(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text(HOSTS)
    return path


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_terminating_a_sharded_run_ends_every_worker(tmp_path, sig):
    marker = f"mldiag-shard-{uuid.uuid4().hex[:8]}"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  fast: {local: true}\n  slow1: {local: true}\n  slow2: {local: true}\n")
    script = tmp_path / "sleepy.py"
    script.write_text("import os, subprocess, sys\n"
                      "if os.environ['MLDIAG_TARGET'] != 'fast':\n"
                      "    subprocess.run([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]])\n"
                      "print('done')\n")
    save = tmp_path / "saved"
    with running_mldiag("run-script", script, "--arg", marker, "--hosts-file", hosts,
                        "-H", "fast,slow1,slow2", "--save", save,
                        env={"MLDIAG_WORKERS": "3"}) as proc:
        wait_for(lambda: (save / "fast.json").exists() and len(marked(marker)) >= 2, 60,
                 "fast saved and both slow ones running")
        workers = [p for p in _children(proc.pid)]
        assert len(workers) >= 2      # the fast one's may have ended already
        out, err = signal_and_wait(proc, sig, 60)
    assert proc.returncode == 128 + sig, (proc.returncode, err)
    name = "interrupted" if sig == signal.SIGINT else f"terminated ({signal.Signals(sig).name})"
    assert err == f"mldiag: {name} (1 of 3 targets finished, saved in {save})\n"
    assert sorted(p.name for p in save.iterdir()) == ["fast.json", "summary.json"]   # no .part
    summary = json.loads((save / "summary.json").read_text())
    assert summary["targets"] == {"fast": "ok"} and summary["not_finished"] == ["slow1", "slow2"]
    wait_for(lambda: not marked(marker), 10, "the slow diagnostics to be stopped")
    assert not [p for p in workers if os.path.exists(f"/proc/{p}")]


def _children(pid: int):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]
