"""The test lab itself works, checked with plain tools only: the OpenSSH client
(`ssh -F lab.ssh_config`), lxc-attach and podman — never mldiag's transport."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time

import pytest

from tests.programs import ok

pytestmark = [pytest.mark.integration, pytest.mark.lab]   # the lab's self-tests: -m lab / -m "not lab"

SHELLS = {"mlsh": "sh", "mlzsh": "zsh", "nosudo": "sh"}


@pytest.mark.parametrize("server", ["main", "defaults", "jump", "inner"])
@pytest.mark.parametrize("user", sorted(SHELLS))
def test_each_alias_logs_in_as_its_user_with_its_shell(lab, server, user):
    if server in ("jump", "inner"):
        lab.need("netns")
    alias = lab.servers[server].aliases[user]
    out = ok(lab.ssh(alias, 'echo "$0 $(id -un) $SSH_CONNECTION"')).split()
    assert out[:2] == [SHELLS[user], user]
    assert out[4:6] == [lab.servers[server].address, str(lab.servers[server].port)]


def test_root_alias(lab):
    assert ok(lab.ssh("main-root", "id -u")).strip() == "0"


def test_session_path_and_sudo_secure_path_reach_the_fakes(lab):
    out = ok(lab.ssh("main", "echo $PATH; command -v pct; sudo -n sh -c 'command -v pct; command -v podman'"))
    path, pct, sudo_pct, sudo_podman = out.split()
    assert path == lab.path
    assert pct == sudo_pct == str(lab.fakes_dir / "pct")
    assert sudo_podman == "/usr/bin/podman"
    env = ok(lab.ssh("main", "sudo -n env")).splitlines()
    for key, value in lab.session_env.items():
        assert f"{key}={value}" in env


def test_nosudo_needs_a_password(lab):
    proc = lab.ssh("main-nosudo", "sudo -n true")
    assert proc.returncode == 1
    assert "a password is required" in proc.stderr


def test_pct_exec_runs_the_venv_python_in_ct_200(lab):
    lab.need("lxc")
    script = "'import sys; print(sys.prefix); print(sys.stdin.read().upper())'"
    out = ok(lab.ssh("main", "sudo", "-n", "pct", "exec", "200", "--", "/root/venv/bin/python", "-c", script,
                     input="from stdin\n"))
    assert out.splitlines()[:2] == ["/root/venv", "FROM STDIN"]


def test_pct_exec_passes_argv_and_exit_code_through(lab):
    lab.need("lxc")
    # argv reaches the CT unchanged: no shell inside, only the ssh login shell parses this line
    proc = lab.ssh("main-mlzsh", "sudo", "-n", "pct", "exec", "200", "--", "/usr/bin/python3.11", "-c",
                   "'import sys; print(sys.argv[1:]); sys.exit(7)'", "'a b'", "'{x}'", "'$HOME'")
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout.strip() == "['a b', '{x}', '$HOME']"


def test_pct_exec_path_inside_ct_is_pcts_and_finds_nvidia_smi_link(lab):
    lab.need("lxc")
    out = ok(lab.ssh("main", "sudo -n pct exec 200 -- /usr/bin/python3.11 -c "
                             "'import os; print(os.environ[\"PATH\"]); print(os.readlink(\"/usr/bin/nvidia-smi\"))'"))
    path, link = out.split()
    assert path == "/sbin:/bin:/usr/sbin:/usr/bin"
    assert link == str(lab.fakes_dir / "nvidia-smi")
    assert ok(lab.ssh("main", f"sudo -n pct exec 200 -- ls {lab.fakes_dir}")).split().count("pct") == 1


def test_fake_nvidia_smi_answers_on_the_host_under_sudo_and_in_both_containers(lab):
    lab.need("lxc", "podman")
    if not (lab.fakes_dir / "nvidia-smi").exists():
        pytest.skip("tests/fakes/nvidia-smi is not there")
    q = "nvidia-smi --query-gpu=name --format=csv,noheader"
    for prefix in ("", "sudo -n ", "sudo -n pct exec 200 -- ", "sudo -n podman exec podbox "):
        out = ok(lab.ssh("main", prefix + q))
        assert out.startswith("NVIDIA "), (prefix, out)


def test_pct_on_stopped_ct(lab):
    lab.need("lxc")
    proc = lab.ssh("main", "sudo -n pct exec 201 -- true")
    assert (proc.returncode, proc.stderr.strip()) == (255, "container '201' not running!")
    proc = lab.ssh("main", "echo x > /tmp/mlx-$$ && sudo -n pct push 201 /tmp/mlx-$$ /tmp/x; rc=$?; rm -f /tmp/mlx-$$; exit $rc")
    assert (proc.returncode, proc.stderr.strip()) == (255, "can only push files to a running CT")
    assert ok(lab.ssh("main", "sudo -n pct status 201")) == "status: stopped\n"
    assert ok(lab.ssh("main", "sudo -n pct status 200")) == "status: running\n"


def test_pct_unknown_vmid(lab):
    lab.need("lxc")
    node = os.uname().nodename.split(".")[0]
    for cmd in ("exec 999 -- true", "status 999"):
        proc = lab.ssh("main", f"sudo -n pct {cmd}")
        assert proc.returncode == 255
        assert proc.stderr.strip() == f"Configuration file 'nodes/{node}/lxc/999.conf' does not exist"


def test_pct_needs_root(lab):
    proc = lab.ssh("main", "pct status 200")
    assert (proc.returncode, proc.stderr.strip()) == (255, "please run as root")


def test_pct_push_writes_inside_the_ct_with_perms_and_owner(lab):
    lab.need("lxc")
    name = f"pushed-{os.getpid()}"
    proc = lab.ssh("main", f"umask 077; printf 'hello\\n' > /tmp/{name} && "
                           f"sudo -n pct push 200 /tmp/{name} /tmp/{name} --perms 640 --user ctuser --group ctuser; "
                           f"rc=$?; rm -f /tmp/{name}; exit $rc")
    ok(proc)
    assert name in lab.container_tmp(200)
    assert name not in lab.host_tmp("mlsh")
    out = ok(lab.ssh("main", f"sudo -n pct exec 200 -- stat -c '%a %U %G' /tmp/{name}"))
    assert out.strip() == "640 ctuser ctuser"
    assert ok(lab.ssh("main", f"sudo -n pct exec 200 -- cat /tmp/{name}")) == "hello\n"
    subprocess.run(["lxc-attach", "-P", str(lab.lxc_path), "-n", "200", "--", "rm", f"/tmp/{name}"], check=True)


def test_ct_venv_uses_the_rootfs_interpreter(lab):
    lab.need("lxc")
    proc = subprocess.run(["lxc-attach", "-P", str(lab.lxc_path), "-n", "200", "--clear-env", "--",
                           "/root/venv/bin/python", "-c", "import sys; print(sys.version.split()[0], sys.base_prefix)"],
                          capture_output=True, text=True)
    version, base = ok(proc).split()
    assert base == "/usr" and version.startswith("3.11.")


def test_podman_exec_through_sudo(lab):
    lab.need("podman")
    proc = lab.ssh("main", "sudo -n podman exec -i podbox python3.11 -c "
                           "'import sys; print(sys.executable, sys.stdin.read())'", input="via podman")
    assert ok(proc).split() == ["/usr/bin/python3.11", "via", "podman"]


def test_inner_is_reachable_only_through_jump(lab):
    lab.need("netns")
    before = lab.jump.connection_count()
    out = ok(lab.ssh("inner", "echo $SSH_CONNECTION")).split()
    assert out[0] == lab.jumpnet.jump_inner_addr  # the connection came from the jump namespace
    assert lab.jump.connection_count() == before + 1
    assert f"Connection from {lab.jumpnet.jump_inner_addr} " in lab.inner.log_text()
    # no route from here: the direct connect fails at once
    t = time.monotonic()
    direct = subprocess.run(["ssh", "-F", str(lab.ssh_config), "-o", "ProxyJump=none", "-o", "ConnectTimeout=5",
                             "inner", "true"], capture_output=True, text=True)
    assert direct.returncode == 255
    assert "No route to host" in direct.stderr
    assert time.monotonic() - t < 3
    assert ok(lab.ssh("jump", "cat /proc/sys/net/ipv4/ip_forward")).strip() == "0"


def test_default_limits_server_has_no_limit_lines(lab):
    cfg = lab.defaults.config_path.read_text()
    assert not re.search(r"(?im)^\s*(MaxSessions|MaxStartups)\b", cfg)
    assert re.search(r"(?m)^MaxSessions 100$", lab.main.config_path.read_text())
    effective = subprocess.run(["/usr/sbin/sshd", "-T", "-f", str(lab.defaults.config_path)],
                               capture_output=True, text=True)
    settings = dict(line.split(" ", 1) for line in ok(effective).splitlines() if " " in line)
    assert settings["maxsessions"] == "10"
    assert settings["maxstartups"] == "10:30:100"


def test_known_hosts_is_hashed_and_verifies(lab):
    lines = lab.known_hosts.read_text().splitlines()
    assert lines and all(line.startswith("|1|") for line in lines)
    for s in lab.servers.values():
        name = s.address if s.port == 22 else f"[{s.address}]:{s.port}"
        found = subprocess.run(["ssh-keygen", "-F", name, "-f", str(lab.known_hosts)], capture_output=True, text=True)
        assert s.host_key_pub.split()[1] in ok(found)
    # a key that is not the server's is refused
    bad = lab.dir / "known_hosts.bad"
    bad.write_text(lab.known_hosts.read_text().replace(lab.main.host_key_pub.split()[1],
                                                       lab.defaults.host_key_pub.split()[1]))
    proc = subprocess.run(lab.ssh_argv("main", "true")[:3] + ["-o", f"UserKnownHostsFile={bad}", "main", "true"],
                          capture_output=True, text=True)
    assert proc.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in proc.stderr


def test_logs_count_connections(lab):
    before = lab.defaults.connection_count()
    ok(lab.ssh("defaults", "true"))
    assert lab.defaults.connection_count() == before + 1


def test_container_helpers_see_processes_and_tmp(lab):
    lab.need("lxc", "podman")
    marker = f"lab-marker-{os.getpid()}"
    seconds = f"30.{os.getpid()}"  # a sleep no one else runs
    assert ["sleep", seconds] not in lab.container_cmdlines(200)
    ct = subprocess.Popen(lab.ssh_argv("main", f"sudo -n pct exec 200 -- sleep {seconds}"),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pod = subprocess.Popen(lab.ssh_argv("main", f"sudo -n podman exec podbox sleep {seconds}"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if (["sleep", seconds] in lab.container_cmdlines(200)
                    and ["sleep", seconds] in lab.podman_cmdlines("podbox")):
                break
            time.sleep(0.05)
        assert ["sleep", seconds] in lab.container_cmdlines(200)
        assert ["sleep", seconds] in lab.podman_cmdlines("podbox")
        assert len(lab.container_pids(200, include_init=True)) == len(lab.container_pids(200)) + 1
        # cutting the ssh connections ends the remote commands (stdin/pipe closed, SIGHUP)
        assert lab.kill_session_sshd("main") >= 2
        assert ct.wait(timeout=10) == 255 and pod.wait(timeout=10) == 255
    finally:
        ct.kill()
        pod.kill()
    subprocess.run(["lxc-attach", "-P", str(lab.lxc_path), "-n", "200", "--", "touch", f"/tmp/{marker}"], check=True)
    assert marker in lab.container_tmp(200)
    subprocess.run(["lxc-attach", "-P", str(lab.lxc_path), "-n", "200", "--", "rm", f"/tmp/{marker}"], check=True)
    ok(lab.ssh("main", f"touch /tmp/{marker}"))
    assert marker in lab.host_tmp("mlsh")
    os.unlink(f"/tmp/{marker}")
    assert isinstance(lab.podman_tmp("podbox"), list)


def test_container_init_reaps_orphans(lab):
    lab.need("lxc")
    # the child of a killed parent is adopted by the CT's init, which must reap it
    ok(lab.ssh("main", "sudo -n pct exec 200 -- /bin/sh -c 'sleep 0.2 & kill -9 $$'; true"))
    time.sleep(0.6)
    zombies = [p for p in lab.container_pids(200) if open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"]
    assert zombies == []


def test_many_parallel_connections_to_main(lab):
    # the generous limits: 12 connections at once (the default MaxStartups drops past 10) all get in
    results = [None] * 12

    def one(i):
        results[i] = lab.ssh("main", "sleep 0.5; echo ok")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.stdout for r in results] == ["ok\n"] * len(results), [r.stderr for r in results if r.returncode]


def test_hosts_yaml_writes_a_file_in_its_own_dir(lab):
    a = lab.hosts_yaml("hosts: {local: {local: true}}\n")
    b = lab.hosts_yaml("hosts: {}\n")
    assert a.name == b.name == "hosts.yaml" and a.parent != b.parent
    assert a.read_text() == "hosts: {local: {local: true}}\n"


def test_home_has_an_ssh_dir_for_home_based_tools(lab):
    ssh_dir = lab.home / ".ssh"
    assert (ssh_dir / "known_hosts").read_text() == lab.known_hosts.read_text()
    env = {**os.environ, "HOME": str(lab.home)}
    proc = subprocess.run(["ssh", "-F", str(ssh_dir / "config"), "main", "true"], capture_output=True, text=True,
                          env=env)
    ok(proc)
