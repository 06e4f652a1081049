"""The transport against the real lab: OpenSSH servers, a jump chain in network namespaces,
sudo, LXC containers behind the `pct` stand-in, and podman.

Targets come from a hosts.yaml written per test module; the ssh side reads the lab's
ssh_config through $MLDIAG_SSH_CONFIG (as `ssh -F` would)."""

import json
import os
import textwrap
import time

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology
from diagnostics.transport import sshconfig
from diagnostics.transport.ssh import SshPool

VENV_PY = "/root/venv/bin/python"


def lab_hosts(lab, extra=""):
    inner = lab.inner
    return textwrap.dedent(f"""\
        defaults:
          connect_timeout: 5
          timeout: 60
        hosts:
          main: {{}}                       # ssh aliases of the lab's ssh_config (user mlsh)
          main-mlzsh: {{}}
          defaults: {{}}
          jump: {{}}
          inner: {{}}                      # ProxyJump jump, from ssh_config
          inner-yaml: {{address: "{inner.address}", port: {inner.port}, user: mlsh, jump: jump}}
          inner-direct: {{address: "{inner.address}", port: {inner.port}, user: mlsh, connect_timeout: 2}}
          refused: {{address: 127.0.0.2, port: 1, user: mlsh}}
          nosudo-box: {{address: main-nosudo, become: sudo}}
          sudo-box: {{address: main, become: sudo}}
          pve:
            address: main
            become: sudo
            containers:
              trainbox: {{runtime: pct, id: "200", python: {VENV_PY}}}
              stopped-ct: {{runtime: pct, id: "201", python: {VENV_PY}}}
              ghost-ct: {{runtime: pct, id: "999", python: {VENV_PY}}}
              nopython-ct: {{runtime: pct, id: "200", python: /root/venv/bin/python9}}
              podbox: {{runtime: podman, id: podbox, python: /usr/bin/python3.11}}
          pve-zsh:
            address: main-mlzsh
            become: sudo
            containers:
              trainbox-zsh: {{runtime: pct, id: "200", python: {VENV_PY}}}
        """) + extra


@pytest.fixture(scope="module")
def hosts(lab):
    return topology.load(str(lab.hosts_yaml(lab_hosts(lab))))


def run(hosts, names, job, **kw):
    targets = [hosts.targets[n] for n in names]
    return {r.target: r for r in runner.run_many(targets, job, **kw)}


def ping(hosts, *names):
    return run(hosts, names, bundle.script_job("ping"))


def inline_job(source, argv=(), **kw):
    return bundle.Job("demo", "demo.py", textwrap.dedent(source).encode(), argv=tuple(argv), **kw)


# ------------------------------------------------------------------ reaching things

def test_ping_over_ssh_with_sh_and_zsh_login_shells(hosts):
    r = ping(hosts, "main", "main-mlzsh")
    assert r["main"].status == "ok", r["main"].to_dict()
    assert r["main"].data["user"] == "mlsh"
    assert r["main-mlzsh"].status == "ok", r["main-mlzsh"].to_dict()
    assert r["main-mlzsh"].data["user"] == "mlzsh"
    assert r["main"].data["tmpdir_mode"] == "0o700"


def test_jump_chain_through_two_real_sshds(hosts, lab):
    r = ping(hosts, "inner", "inner-yaml", "inner-direct")
    assert r["inner"].status == "ok", r["inner"].to_dict()
    assert r["inner-yaml"].status == "ok", r["inner-yaml"].summary
    # inner lives in a network namespace only the jump host can reach
    assert r["inner-direct"].status == "error" and r["inner-direct"].error.layer == "unreachable"


def test_jump_host_down_is_reported_as_the_jumps_failure(lab):
    text = f"""
hosts:
  deadjump: {{address: 127.0.0.2, port: 1, user: mlsh, connect_timeout: 2}}
  behind: {{address: "{lab.inner.address}", port: {lab.inner.port}, user: mlsh, jump: deadjump}}
"""
    topo = topology.load(str(lab.hosts_yaml(text)))
    r = runner.run_many([topo.targets["behind"]], bundle.script_job("ping"))[0]
    assert r.error.layer == "unreachable"
    assert r.error.message.startswith("jump host deadjump:"), r.error.message


def test_refused_port_is_unreachable_and_others_still_report(hosts):
    r = ping(hosts, "refused", "main")
    assert r["refused"].error.layer == "unreachable"
    assert "refused" in r["refused"].error.message.lower()
    assert r["main"].status == "ok"


def test_sudo_with_and_without_a_sudoers_rule(hosts):
    r = ping(hosts, "sudo-box", "nosudo-box")
    assert r["sudo-box"].status == "ok" and r["sudo-box"].data["user"] == "root"
    bad = r["nosudo-box"]
    assert bad.status == "error" and bad.error.layer == "become"
    assert "a password is required" in bad.error.message


def test_pct_container_venv_and_temp_dirs_gone_at_every_level(hosts, lab):
    host_before = lab.host_tmp("mlsh")
    ct_before, pod_before = set(lab.container_tmp(200)), set(lab.podman_tmp())
    r = ping(hosts, "trainbox", "podbox")
    tb = r["trainbox"]
    assert tb.status == "ok", tb.to_dict()
    assert tb.data["venv"] is True and tb.data["prefix"] == "/root/venv"
    assert tb.data["user"] == "root" and tb.data["tmpdir_mode"] == "0o700"
    assert r["podbox"].status == "ok", r["podbox"].to_dict()
    assert r["podbox"].data["executable"] == "/usr/bin/python3.11"
    assert set(lab.container_tmp(200)) - ct_before == set()
    assert set(lab.podman_tmp()) - pod_before == set()
    assert lab.host_tmp("mlsh") == host_before


def test_container_faults_are_classified(hosts):
    r = ping(hosts, "stopped-ct", "ghost-ct", "nopython-ct")
    assert r["stopped-ct"].error.layer == "container", r["stopped-ct"].to_dict()
    assert "not running" in r["stopped-ct"].error.message
    assert r["ghost-ct"].error.layer == "container"
    assert "does not exist" in r["ghost-ct"].error.message
    assert r["nopython-ct"].error.layer == "interpreter"
    assert "/root/venv/bin/python9" in r["nopython-ct"].error.message


# ------------------------------------------------------------------ one trustworthy answer

def test_empty_exception_message_in_a_container(hosts):
    r = run(hosts, ["trainbox"], inline_job("""
        import argparse
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            raise KeyError()
    """))["trainbox"]
    assert r.status == "error" and r.error.layer == "crashed"
    assert r.error.type == "KeyError" and r.error.message == "KeyError()"
    assert 'demo.py", line 5, in run' in r.error.traceback


def test_megabytes_of_noise_before_the_result(hosts):
    r = run(hosts, ["trainbox"], inline_job("""
        import argparse, sys
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            for _ in range(5000):
                print("x" * 1000)         # 5 MB on stdout
            sys.stdout.buffer.write(b"\\xff\\xfe\\n")
            return {"summary": "after the noise"}
    """))["trainbox"]
    assert r.status == "ok" and r.summary == "after the noise"


def test_timeout_leaves_no_process_in_the_container(hosts, lab):
    marker = f"mldiag-lab-hang-{time.monotonic_ns()}"
    ct_before = set(lab.container_tmp(200))
    t0 = time.monotonic()
    r = run(hosts, ["trainbox"], inline_job(f"""
        import argparse, subprocess, sys, time
        def build_parser(): return argparse.ArgumentParser()
        def run(args):
            code = "import time\\ntime.sleep(600)\\n"
            subprocess.Popen([sys.executable, "-c", code, "{marker}"], start_new_session=True)
            subprocess.Popen([sys.executable, "-c", code, "{marker}"])
            time.sleep(600)
    """, timeout=2))["trainbox"]
    assert r.status == "error" and r.error.layer == "timeout", (r.error.message, r.error.traceback)
    assert time.monotonic() - t0 < 15
    assert int(r.error.message.split("killed ")[1].split()[0]) >= 3, r.error.message
    assert [c for c in lab.container_cmdlines(200) if marker in " ".join(c)] == []
    assert set(lab.container_tmp(200)) - ct_before == set()


def test_keep_remote_keeps_the_container_temp_dir(hosts, lab):
    r = run(hosts, ["trainbox"], bundle.Job(**{**bundle.script_job("ping").__dict__,
                                               "keep_remote": True}))["trainbox"]
    kept = r.data["remote_tmpdir"]
    name = os.path.basename(kept)
    assert name in lab.container_tmp(200)
    lab.ssh("main", "sudo", "-n", "pct", "exec", "200", "--", "rm", "-rf", kept)
    assert name not in lab.container_tmp(200)


# ------------------------------------------------------------------ sharing and limits

def test_containers_of_one_host_share_one_ssh_connection(lab):
    """Twelve container targets on the default-limits sshd: one connection, ≤ 8 channels."""
    cts = "\n".join(f"      ct{i}: {{runtime: pct, id: \"200\", python: {VENV_PY}}}" for i in range(12))
    topo = topology.load(str(lab.hosts_yaml(f"hosts:\n  pve-defaults:\n    address: defaults\n"
                                            f"    become: sudo\n    containers:\n{cts}\n")))
    before = lab.defaults.connection_count()
    pool = SshPool()
    results = runner.run_many([topo.targets[f"ct{i}"] for i in range(12)],
                              bundle.script_job("ping"), pool=pool)
    assert [r.status for r in results] == ["ok"] * 12, [r.summary for r in results]
    assert pool.opened == 1
    assert lab.defaults.connection_count() - before == 1


def test_ssh_put_over_sftp(hosts, lab):
    """The contract's put on an SSH transport: SFTP, mode 0600, never over an existing file
    (the bundle itself is streamed through run; test_faults covers a host without SFTP)."""
    from diagnostics.transport import transport_for
    from diagnostics.transport.base import TransportError
    pool = SshPool()
    dest = f"/tmp/mldiag-put-test-{os.getpid()}"
    try:
        transport = transport_for(hosts.targets["main"], pool)
        transport.put(b"payload \x00\xff", dest)
        with open(dest, "rb") as f:
            assert f.read() == b"payload \x00\xff"
        assert oct(os.stat(dest).st_mode & 0o777) == "0o600"
        with pytest.raises(TransportError) as caught:
            transport.put(b"again", dest)
        assert caught.value.layer == "upload", caught.value.message
        with open(dest, "rb") as f:
            assert f.read() == b"payload \x00\xff"
        assert pool.opened == 1
    finally:
        pool.close()
        if os.path.exists(dest):
            os.unlink(dest)


def test_a_command_over_ssh_makes_no_os_pipe_per_channel(hosts, monkeypatch):
    """Waiting on a channel must not go through Channel.fileno(): its OS pipe can be written
    by paramiko's transport thread after close() released the descriptors (paramiko#692), and
    with descriptors reused at once that byte corrupted another connection's SSH stream
    ("Invalid packet blocking" under `ulimit -n 100`, test_hostile_targets)."""
    import paramiko.channel
    from diagnostics.transport import transport_for
    made = []
    real = paramiko.channel.pipe.make_pipe
    monkeypatch.setattr(paramiko.channel.pipe, "make_pipe", lambda: made.append(1) or real())
    pool = SshPool()
    try:
        transport = transport_for(hosts.targets["main"], pool)
        # output in pieces with pauses, on both streams: the wait between them is exercised
        out = transport.run(["sh"], b"for i in 1 2 3; do echo out$i; echo err$i >&2; "
                            b"sleep 0.2; done; exit 3\n", time.monotonic() + 30)
    finally:
        pool.close()
    assert (out.stdout, out.stderr, out.exit_code) == (b"out1\nout2\nout3\n", b"err1\nerr2\nerr3\n", 3)
    assert made == []


def test_ssh_config_proxycommand_is_honoured(lab, tmp_path):
    """A ProxyCommand from ssh_config (through `ssh -W` to the jump host) reaches inner."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"""Host via-proxycommand
  HostName {lab.inner.address}
  Port {lab.inner.port}
  User mlsh
  IdentityFile {lab.identity}
  UserKnownHostsFile {lab.known_hosts}
  StrictHostKeyChecking yes
  ProxyCommand ssh -F {lab.ssh_config} -W %h:%p jump
""")
    old = os.environ["MLDIAG_SSH_CONFIG"]
    os.environ["MLDIAG_SSH_CONFIG"] = str(cfg)
    try:
        topo = topology.load(str(lab.hosts_yaml("hosts:\n  via-proxycommand: {}\n")))
        r = runner.run_many([topo.targets["via-proxycommand"]], bundle.script_job("ping"))[0]
    finally:
        os.environ["MLDIAG_SSH_CONFIG"] = old
    assert r.status == "ok", r.to_dict()
    assert r.data["user"] == "mlsh"


def test_a_fabric_config_file_is_not_read(hosts, tmp_path, monkeypatch):
    """~/.fabric.yaml is Fabric's, not mldiag's: its `gateway` (a ProxyCommand that would
    replace mldiag's own socket) and its extra key files must not reach the connection."""
    from diagnostics.transport import ssh

    home = tmp_path / "home"
    home.mkdir()
    marker = tmp_path / "gateway-ran"
    planted_key = tmp_path / "planted_key"
    planted_key.write_text("not a key\n")
    (home / ".fabric.yaml").write_text(
        f"gateway: \"sh -c 'touch {marker}; exit 1'\"\n"
        f"connect_kwargs:\n  key_filename: [{planted_key}]\n")
    monkeypatch.setenv("HOME", str(home))
    r = ping(hosts, "main")["main"]
    assert r.status == "ok", r.to_dict()
    assert not marker.exists()
    config = ssh.fabric_config()
    assert config.gateway is None and config.connect_kwargs == {}
    # one per connection: Fabric writes into a connection's config (see fabric_config)
    assert ssh.fabric_config() is not config
