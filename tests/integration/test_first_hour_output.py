"""Issue 11 item 15, against the lab through the real ``mldiag``: a target in a missing Proxmox
CT says "not found" once; a container's uid 0 is "root" whatever the host's $LOGNAME says; a
run-script's output through ssh → sudo → pct shows in the table."""

import json
import os
import re
import textwrap

import pytest

from tests.programs import mldiag

VENV_PY = "/root/venv/bin/python"


@pytest.fixture(scope="module")
def hosts_file(lab):
    return lab.hosts_yaml(textwrap.dedent(f"""\
        defaults: {{connect_timeout: 5, timeout: 60}}
        hosts:
          pve:
            address: main
            become: sudo
            containers:
              trainbox: {{runtime: pct, id: "200", python: {VENV_PY}}}
              ghost: {{runtime: pct, id: "399", python: {VENV_PY}}}
              podbox: {{runtime: podman, id: podbox, python: /usr/bin/python3.11}}
          here:
            local: true
            containers:
              here-ct: {{runtime: pct, id: "200", python: {VENV_PY}}}
        """))


def test_a_target_in_a_missing_proxmox_ct_says_not_found_once(hosts_file):
    r = mldiag("ping", "--hosts-file", hosts_file, "-H", "ghost")
    assert r.returncode == 3, r.stdout + r.stderr
    node = os.uname().nodename.split(".")[0]
    assert r.stdout == f"""\
TARGETS  STATUS  SUMMARY
ghost    error   container: pct 399: not found (Configuration file 'nodes/{node}/lxc/399.conf' does not exist)

1 error (container)
"""
    doc = json.loads(mldiag("ping", "--hosts-file", hosts_file, "-H", "ghost", "--json").stdout)[0]
    assert "does not exist" in doc["error"]["stderr"]   # --json keeps what pct said


def test_uid_0_in_a_container_is_root_whatever_the_hosts_logname(hosts_file, lab):
    # `su` to root keeps $LOGNAME/$USER; a local pct exec passes the environment into the CT
    env = {"LOGNAME": "barsroot", "USER": "barsroot", "MLDIAG_PCT_LXCPATH": str(lab.lxc_path),
           "PATH": f"{lab.fakes_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    r = mldiag("ping", "--hosts-file", hosts_file, "-H", "here-ct,trainbox,podbox", "--json",
               env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    users = {d["target"]: (d["data"]["user"], d["data"]["uid"]) for d in json.loads(r.stdout)}
    assert users == {"here-ct": ("root", 0), "trainbox": ("root", 0), "podbox": ("root", 0)}


def test_run_script_output_through_ssh_sudo_pct_shows_in_the_table(hosts_file, tmp_path):
    script = tmp_path / "report.py"
    script.write_text("import socket, sys\nprint('on', socket.gethostname())\n"
                      "print('half done', file=sys.stderr)\nraise SystemExit(4)\n")
    r = mldiag("run-script", script, "--hosts-file", hosts_file, "-H", "trainbox")
    assert r.returncode == 2, r.stdout + r.stderr
    shown = re.sub(r"on \S+\n", "on CT\n", r.stdout)
    assert shown == """\
TARGETS   STATUS  SUMMARY
trainbox  fail    exit 4
  stdout:
        on CT
  stderr:
        half done

1 fail
"""
