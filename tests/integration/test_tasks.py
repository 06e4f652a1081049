"""The tasks end to end: the `mldiag` program against the lab, as a user runs it."""

import json
import os
import textwrap

import pytest

from tests.programs import GPU_STATUS_CONTAINERS, mldiag

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# the fake-GPU targets of CT 200, indented under this file's `containers:`
GPU_CONTAINERS = textwrap.indent(GPU_STATUS_CONTAINERS, "        ").rstrip("\n")


@pytest.fixture(scope="module")
def hosts_file(lab):
    return lab.hosts_yaml(textwrap.dedent(f"""\
        defaults: {{connect_timeout: 3, timeout: 60}}
        hosts:
          main: {{}}
          refused: {{address: 127.0.0.2, port: 1, user: mlsh}}
          inner: {{}}
          pve:
            address: main
            become: sudo
            containers:
{GPU_CONTAINERS}
        groups:
          fleet: [trainbox, sickbox]
        """))


def test_hosts_shows_each_chain(hosts_file):
    r = mldiag("hosts", "--hosts-file", str(hosts_file), "--json")
    assert r.returncode == 0, r.stderr
    chains = {row["name"]: row["chain"] for row in json.loads(r.stdout)}
    assert chains["trainbox"] == "ssh main → sudo → pct 200 → /root/venv/bin/python"
    assert chains["local"] == "local → python3"
    table = mldiag("hosts", "--hosts-file", str(hosts_file)).stdout
    assert table.splitlines()[0].split() == ["TARGET", "CHAIN"]


def test_gpu_status_through_ssh_sudo_pct_venv(hosts_file):
    r = mldiag("gpu-status", "--hosts-file", str(hosts_file), "-H", "trainbox", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)[0]
    assert doc["status"] == "ok", doc["summary"]
    assert doc["data"]["gpu_count"] == 8
    assert doc["summary"].startswith("8× NVIDIA H200")
    assert {g["name"] for g in doc["data"]["gpus"]} == {"NVIDIA H200"}


def test_group_run_exit_code_is_the_worst(hosts_file):
    r = mldiag("gpu-status", "--hosts-file", str(hosts_file), "-g", "fleet")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["TARGETS", "STATUS", "SUMMARY"]
    assert lines[1].split()[:2] == ["sickbox", "fail"]   # worst first
    assert "7 of 8 GPUs visible" in r.stdout
    assert lines[-1] == "1 ok · 1 fail"


def test_warn_exits_1(hosts_file):
    r = mldiag("gpu-status", "--hosts-file", str(hosts_file), "-H", "consumer", "--json")
    doc = json.loads(r.stdout)[0]
    assert doc["status"] == "warn" and r.returncode == 1
    assert "persistence-off" in {f["code"] for f in doc["findings"]}


def test_unreachable_target_reported_while_others_finish(hosts_file):
    r = mldiag("ping", "--hosts-file", str(hosts_file), "-H", "refused,main,inner")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "refused  error" in r.stdout.replace("   ", "  ") or "refused" in r.stdout.splitlines()[1]
    assert r.stdout.splitlines()[-1] == "2 ok · 1 error (unreachable)"
    assert "Traceback" not in r.stderr


def test_unknown_target_is_bad_input(hosts_file):
    r = mldiag("ping", "--hosts-file", str(hosts_file), "-H", "nosuch")
    assert r.returncode == 4
    assert "unknown target 'nosuch'" in r.stderr and r.stdout == ""
