"""The hop contract (issue 10, "the face, in one place"): every transport honours ``Transport``
(run, put, describe, close); building a chain opens nothing; ``inv hosts`` prints the chain the
runner runs (one code path); a Slurm node row is a target plus its step, never a Target field."""

import dataclasses
import inspect
import os
import stat
import sys
import time

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology
from diagnostics.core.errors import InputError
from diagnostics.transport import Chain, chain_for, describe_targets, transport_for
from diagnostics.transport.base import ProcessOutput, Transport, TransportError
from diagnostics.transport.local import LocalTransport
from diagnostics.transport.slurm import SrunStep
from diagnostics.transport.ssh import SshPool, SshTransport
from diagnostics.inventory.topology import Target
from tests.programs import space_free_python

TRANSPORTS = [LocalTransport, SshTransport]
CONTRACT = {"run": ["argv", "payload", "deadline"], "put": ["data", "path"],
            "describe": [], "close": []}


@pytest.mark.parametrize("cls", TRANSPORTS, ids=lambda c: c.__name__)
def test_each_transport_implements_the_whole_contract(cls):
    assert issubclass(cls, Transport)
    assert not inspect.isabstract(cls), cls.__abstractmethods__
    for name, params in CONTRACT.items():
        method = getattr(cls, name)
        assert method is not getattr(Transport, name), f"{cls.__name__}.{name} is not its own"
        required = [p.name for p in list(inspect.signature(method).parameters.values())[1:]
                    if p.default is inspect.Parameter.empty and p.kind is not p.KEYWORD_ONLY]
        assert required == [p for p in params], (name, required)


def test_a_transport_missing_a_method_cannot_be_made():
    class NoPut(Transport):
        def run(self, argv, payload, deadline):
            return ProcessOutput(b"", b"", 0)

        def describe(self):
            return "noput"

        def close(self):
            pass

    with pytest.raises(TypeError, match="put"):
        NoPut()


def test_local_transport_runs_and_puts(tmp_path):
    t = LocalTransport()
    # safe tokens only: every line sent is recorded and checked (tests/integration/test_command_lines.py)
    out = t.run(["head", "-c", "5"], b"hello world", time.monotonic() + 30)
    assert isinstance(out, ProcessOutput) and (out.stdout, out.exit_code) == (b"hello", 0)
    dest = tmp_path / "f"
    t.put(b"\x00\xffdata", str(dest))
    assert dest.read_bytes() == b"\x00\xffdata" and stat.S_IMODE(dest.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):            # never over an existing file
        t.put(b"again", str(dest))
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    with pytest.raises(OSError):                    # nor through a planted symlink
        t.put(b"x", str(tmp_path / "link"))
    assert not (tmp_path / "elsewhere").exists()
    assert t.describe() == "local"
    t.close()


def test_ssh_transport_link_failure_is_a_transport_error():
    """Connection refused: the contract's TransportError (classified), not an OSError."""
    topo = topology.loads("hosts:\n  gone: {address: 127.0.0.1, port: 1, user: u, connect_timeout: 3}\n",
                          "h.yaml")
    pool = SshPool()
    try:
        transport = transport_for(topo.targets["gone"], pool)
        with pytest.raises(TransportError) as caught:
            transport.run(["true"], b"", time.monotonic() + 10)
        assert caught.value.layer == "unreachable", caught.value.message
        with pytest.raises(TransportError):
            transport.put(b"x", "/tmp/never")
    finally:
        pool.close()


HOSTS = """\
hosts:
  local: {local: true}
  bastion: {address: 10.9.9.1, user: ops, port: 2222}
  pve:
    address: 10.9.9.6
    user: root
    jump: bastion
    become: sudo
    containers:
      trainbox: {runtime: pct, id: "200", python: /root/venv/bin/python}
  dgx01:
    address: dgx01.lab
    user: alice
    become: sudo
    activate: /opt/conda/etc/profile.d/conda.sh conda activate train
    python: python
  login:
    address: 10.9.9.7
    slurm: {partition: gpu, nodelist: "n[1-2]"}
  login4:
    address: 10.9.9.8
    slurm: {nodes: 4}
"""


@pytest.fixture
def topo():
    return topology.loads(HOSTS, "h.yaml")


def test_hosts_output(topo):
    names = ["local", "trainbox", "dgx01", "login", "login4"]
    assert dict(zip(names, describe_targets([topo.targets[n] for n in names]))) == {
        "local": "local → python3",
        "trainbox": "ssh root@10.9.9.6 (via bastion) → sudo → pct 200 → /root/venv/bin/python",
        # the bootstrap starts under python3; `python` only exists once activated
        "dgx01": "ssh alice@dgx01.lab → sudo → python3 → activate "
                 "/opt/conda/etc/profile.d/conda.sh conda activate train → python",
        "login": "ssh 10.9.9.7 → srun -p gpu (n[1-2], one step per node) → python3",
        "login4": "ssh 10.9.9.8 → srun (4 nodes, one step per node) → python3",
    }


def test_hosts_output_shows_the_jump_ssh_config_adds(tmp_path, monkeypatch):
    """ProxyJump from ssh_config is part of the chain that runs, so it is part of what prints
    (the old hosts.yaml-only describer left it out)."""
    config = tmp_path / "ssh_config"
    config.write_text("Host inner\n  ProxyJump ops@gw:2222\n")
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(config))
    topo = topology.loads("hosts:\n  inner: {}\n  direct: {address: 10.9.9.9}\n", "h.yaml")
    assert describe_targets([topo.targets["inner"], topo.targets["direct"]]) == [
        "ssh inner (via ops@gw:2222) → python3", "ssh 10.9.9.9 → python3"]


def test_an_ssh_config_that_ssh_refuses_is_bad_input(tmp_path, monkeypatch):
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  NoSuchOption yes\n")
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(config))
    topo = topology.loads("hosts:\n  a: {address: 10.9.9.9}\n", "h.yaml")
    with pytest.raises(InputError, match="ssh -G 10.9.9.9 failed"):
        describe_targets([topo.targets["a"]])


def test_building_and_describing_a_chain_opens_nothing(topo):
    pool = SshPool()
    chains = [chain_for(t, pool) for t in topo.targets.values()]
    assert [c.describe() for c in chains]
    assert pool.opened == 0 and pool.peak_open == 0


def test_the_described_interpreter_is_the_one_the_argv_starts(topo):
    """What `inv hosts` names as the first interpreter is the one on the command line."""
    pool = SshPool()
    for name in ("local", "trainbox", "dgx01"):
        chain = chain_for(topo.targets[name], pool)
        described = chain.describe().split(" → ")
        argv = chain.argv()
        python_at = argv.index("-c") - 1
        assert argv[python_at] in described, (name, argv[:python_at + 1], described)
        assert described.index(argv[python_at]) == len(chain.wrappers) + 1, described


def test_a_slurm_login_chain_is_described_but_never_run(topo):
    pool = SshPool()
    with pytest.raises(RuntimeError, match="allocate"):
        chain_for(topo.targets["login"], pool).argv()
    row = dataclasses.replace(topo.targets["login"], name="login:n2")
    chain = chain_for(row, pool, SrunStep("42", "n2"))
    assert chain.describe() == "ssh 10.9.9.7 → srun -w n2 → python3"
    assert chain.argv()[:7] == ["srun", "--jobid", "42", "-N1", "-n1", "-w", "n2"]


def test_target_is_pure_topology():
    assert [f.name for f in dataclasses.fields(Target) if "step" in f.name] == []
    assert "put" not in vars(Chain)     # the multi-level put only tests reached is gone


def _fake_slurm(bindir, log):
    """salloc/squeue/scancel/srun on PATH: a login node that is this machine, whose srun runs
    the step's argv here and logs the node it was asked for."""
    scripts = {
        "salloc": "echo 'salloc: Granted job allocation 77' >&2",
        "squeue": "echo 'n[1-2]'",
        "scancel": f"echo \"scancel $*\" >> {log}",
        "srun": f"while [ \"$1\" != -- ]; do [ \"$1\" = -w ] && echo \"srun $2\" >> {log}; shift; done\n"
                "shift\nexec \"$@\"",
    }
    for name, body in scripts.items():
        path = bindir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def fake_cluster(tmp_path, monkeypatch):
    bindir, log = tmp_path / "bin", tmp_path / "slurm.log"
    bindir.mkdir()
    _fake_slurm(bindir, log)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    topo = topology.loads(f"hosts:\n  login:\n    local: true\n    python: {space_free_python()}\n"
                          f"    slurm: {{nodes: 2}}\n", "h.yaml")
    return topo, log


def test_node_rows_run_as_their_own_step(fake_cluster):
    topo, log = fake_cluster
    results = runner.run_many(topo.select(["login"]), bundle.script_job("ping"))
    assert [(r.target, r.status) for r in results] == [("login:n1", "ok"), ("login:n2", "ok")], \
        [r.to_dict() for r in results]
    assert sorted(log.read_text().splitlines()) == ["scancel 77", "srun n1", "srun n2"]


def test_one_node_selected_is_one_row(fake_cluster):
    topo, log = fake_cluster
    [target] = topo.select(["login:n2"])
    results = runner.run_many([target], bundle.script_job("ping"))
    assert [(r.target, r.status) for r in results] == [("login:n2", "ok")], results[0].to_dict()
    assert log.read_text().splitlines() == ["srun n2", "scancel 77"]
