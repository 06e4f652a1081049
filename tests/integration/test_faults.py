"""Fault injection against the real lab (issue 5): every fault classified, nothing orphaned,
nothing leaked.

Each test looks, after the fault, at the process table of the place the diagnostic ran (the
host, CT 200, the `inner` network namespace's host) and at every temp dir level, by markers
the test put into the diagnostic's argv (argv travels in the bundle, never on a command line).
Transport faults already covered elsewhere: refused, black-holed, jump down (test_transport,
test_fleet), auth refused and host key changed (test_hostkeys), become, container missing /
stopped, interpreter missing / too old (test_transport, test_runtime), Slurm node down
(test_slurm). This file adds the ones that strike mid-run.
"""

import json
import os
import signal
import subprocess
import textwrap
import threading
import time
import uuid
from functools import partial

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology
from diagnostics.transport.ssh import SshPool
from tests.lab.util import pids_with_marker, wait_until
from tests.programs import mldiag, signal_and_wait, start_mldiag

VENV_PY = "/root/venv/bin/python"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


wait_for = partial(wait_until, interval=0.1)


def marked(cmdlines, marker):
    return [c for c in cmdlines if any(marker in part for part in c)]


def script_job(source, argv=(), **kw):
    return bundle.Job("run-script", "fault.py", textwrap.dedent(source).encode(),
                      argv=tuple(argv), mode="script", **kw)


def diag_job(source, argv=(), **kw):
    return bundle.Job("demo", "demo.py", textwrap.dedent(source).encode(), argv=tuple(argv), **kw)


@pytest.fixture(scope="module")
def hosts(lab):
    inner = lab.inner
    cts = "\n".join(f"      ct-{name}: {{runtime: pct, id: \"200\", python: {VENV_PY}}}"
                    for name in FAULTS)
    return topology.load(str(lab.hosts_yaml(textwrap.dedent(f"""\
        defaults: {{connect_timeout: 5, timeout: 60}}
        hosts:
          main: {{}}
          inner: {{}}
          nosftp: {{}}
          inner-direct: {{address: "{inner.address}", port: {inner.port}, user: mlsh}}
          pve:
            address: main
            become: sudo
            containers:
              trainbox: {{runtime: pct, id: "200", python: {VENV_PY}}}
        """) + cts + "\n")))


# ------------------------------------------------------------------ diagnostic faults

# name → (source of a run(args) diagnostic, expected layer, words in the message)
FAULTS = {
    "empty-message": ("""
        import argparse
        def build_parser(): p = argparse.ArgumentParser(); p.add_argument("marker"); return p
        def run(args):
            raise KeyError()
        """, "crashed", "KeyError()"),
    "os-exit": ("""
        import argparse, os
        def build_parser(): p = argparse.ArgumentParser(); p.add_argument("marker"); return p
        def run(args):
            os._exit(7)
        """, "crashed", "exited with code 7"),
    "segfault": ("""
        import argparse, ctypes
        def build_parser(): p = argparse.ArgumentParser(); p.add_argument("marker"); return p
        def run(args):
            ctypes.string_at(0)
        """, "killed", "SIGSEGV"),
    "sigkill": ("""
        import argparse, os, signal
        def build_parser(): p = argparse.ArgumentParser(); p.add_argument("marker"); return p
        def run(args):
            os.kill(os.getpid(), signal.SIGKILL)
        """, "killed", "SIGKILL"),
    "fifty-mb": ("""
        import argparse, sys
        def build_parser(): p = argparse.ArgumentParser(); p.add_argument("marker"); return p
        def run(args):
            line = "y" * 1023 + "\\n"
            for _ in range(50 * 1024):
                sys.stdout.write(line)      # 50 MB before the result
            return {"summary": "after 50 MB"}
        """, None, "after 50 MB"),
    "non-utf8": ("""
        import argparse, sys
        def build_parser(): p = argparse.ArgumentParser(); p.add_argument("marker"); return p
        def run(args):
            sys.stdout.buffer.write(b"\\xff\\xfe\\xc3\\x28 bytes\\n")
            sys.stderr.buffer.write(b"\\x80\\x81 err\\n")
            sys.stdout.flush()
            return {"summary": "bytes survived", "data": {"raw": b"\\xff\\xfe".decode("latin-1")}}
        """, None, "bytes survived"),
    "ignores-sigterm": ("""
        import argparse, signal, time
        def build_parser(): p = argparse.ArgumentParser(); p.add_argument("marker"); return p
        def run(args):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            time.sleep(600)
        """, "timeout", "ran past"),
    "setsid-grandchild": ("""
        import argparse, subprocess, sys, time
        def build_parser():
            p = argparse.ArgumentParser(); p.add_argument("marker"); return p
        def run(args):
            code = "import os, time\\nos.setsid()\\ntime.sleep(600)\\n"
            subprocess.Popen([sys.executable, "-c", code, args.marker], start_new_session=True)
            time.sleep(0.5)
            return {"summary": "left a grandchild behind"}
        """, None, "left a grandchild behind"),
}


def test_diagnostic_faults_are_classified_and_leave_nothing_in_the_container(hosts, lab):
    """All eight faults at once, one CT target each, on one connection; then the CT's process
    table and every temp dir level are checked for anything the faults left."""
    marker = f"mldiag-fault-{uuid.uuid4().hex[:8]}"
    ct_before, host_before = set(lab.container_tmp(200)), set(lab.host_tmp("mlsh"))

    def job_for(target):
        name = target.name[len("ct-"):]
        source, layer, _ = FAULTS[name]
        timeout = 4 if layer == "timeout" else 60
        return diag_job(source, [f"{marker}-{name}"], timeout=timeout)

    targets = [hosts.targets[f"ct-{name}"] for name in FAULTS]
    t0 = time.monotonic()
    results = {r.target[len("ct-"):]: r for r in runner.run_many(targets, job_for)}
    elapsed = time.monotonic() - t0
    for name, (_, layer, words) in FAULTS.items():
        r = results[name]
        if layer is None:
            assert r.status == "ok" and r.summary == words, (name, r.to_dict())
            continue
        assert r.status == "error" and r.error.layer == layer, (name, r.to_dict())
        assert words in r.error.message, (name, r.error.message)
        if layer == "crashed" and name == "empty-message":
            assert r.error.type == "KeyError"
            assert 'demo.py", line 5, in run' in r.error.traceback
    assert results["non-utf8"].data["raw"] == "\xff\xfe"
    assert "killed 1" in results["ignores-sigterm"].error.message  # SIGKILL after the grace
    assert elapsed < 30, elapsed
    # nothing left: no process with the marker, no temp dir, at the CT and at the host
    assert marked(lab.container_cmdlines(200), marker) == []
    assert pids_with_marker(marker) == []
    assert set(lab.container_tmp(200)) - ct_before == set()
    assert set(lab.host_tmp("mlsh")) - host_before == set()


def test_keep_remote_dir_is_0700_and_its_files_0600(hosts, lab):
    r = runner.run_many([hosts.targets["trainbox"]],
                        diag_job("""
                            import argparse
                            def build_parser(): return argparse.ArgumentParser()
                            def run(args): return {"summary": "kept"}
                            """, keep_remote=True))[0]
    kept = r.data["remote_tmpdir"]
    root = f"/proc/{lab.container_pids(200, include_init=True)[0]}/root"
    try:
        assert oct(os.stat(root + kept).st_mode & 0o777) == "0o700"
        modes = {name: oct(os.stat(os.path.join(root + kept, name)).st_mode & 0o777)
                 for name in os.listdir(root + kept)}
        assert modes and set(modes.values()) == {"0o600"}, modes
    finally:
        lab.ssh("main", "sudo", "-n", "pct", "exec", "200", "--", "rm", "-rf", kept)


# ------------------------------------------------------------------ transport faults mid-run

# the sleep runs in a child whose argv carries the marker (the runtime forks the script without
# exec, so the script's own argv is not in /proc/PID/cmdline)
SLEEPER = """
    import subprocess, sys
    subprocess.run([sys.executable, "-c", "import sys, time; time.sleep(float(sys.argv[1]))",
                    sys.argv[1], sys.argv[2]])
    print("slept")
    """


def test_session_sshd_killed_mid_run(hosts, lab):
    """The per-connection sshd dies while diagnostics run on the host and in the CT: both are
    reported unreachable at once, and both runtimes see stdin close and kill their diagnostic."""
    marker = f"mldiag-fault-{uuid.uuid4().hex[:8]}"
    ct_before, host_before = set(lab.container_tmp(200)), set(lab.host_tmp("mlsh"))
    job = script_job(SLEEPER, ["600", marker])
    done = {}

    worker = threading.Thread(target=lambda: done.update(
        {r.target: (r, time.monotonic()) for r in
         runner.run_many([hosts.targets["main"], hosts.targets["trainbox"]], job)}))
    worker.start()
    wait_for(lambda: len(pids_with_marker(marker)) >= 2 and marked(lab.container_cmdlines(200), marker),
             20, "both diagnostics to start")
    killed_at = time.monotonic()
    assert lab.kill_session_sshd("main", user="mlsh") >= 1
    worker.join(20)
    assert not worker.is_alive()
    for name in ("main", "trainbox"):
        r, at = done[name]
        assert r.status == "error" and r.error.layer == "unreachable", (name, r.to_dict())
        assert "closed" in r.error.message, r.error.message
        assert at - killed_at < 5
    wait_for(lambda: pids_with_marker(marker) == [], 5, "the diagnostics to be killed")
    wait_for(lambda: set(lab.container_tmp(200)) - ct_before == set()
             and set(lab.host_tmp("mlsh")) - host_before == set(), 5, "temp dirs to go")


@pytest.fixture
def drop_inner(lab):
    """An iptables DROP rule inside inner's namespace, on the sshd port: the link goes silent
    (nothing is closed, no RST: a black hole, as when a switch port dies)."""
    port = str(lab.inner.port)
    rules = [["INPUT", "-p", "tcp", "--dport", port, "-j", "DROP"],     # both ways: the result
             ["OUTPUT", "-p", "tcp", "--sport", port, "-j", "DROP"]]    # must not get out either
    state = {"on": False}

    def on():
        for rule in rules:
            subprocess.run(lab.netns_argv("inner", ["iptables", "-w", "-I"] + rule), check=True,
                           capture_output=True)
        state["on"] = True

    yield on
    if state["on"]:
        for rule in rules:
            subprocess.run(lab.netns_argv("inner", ["iptables", "-w", "-D"] + rule), check=False,
                           capture_output=True)


def test_network_dropped_mid_run(hosts, lab, drop_inner, monkeypatch):
    """The link to inner (behind jump) goes silent mid-run. The client gives up at the job's
    timeout plus its grace; on inner the runtime's own timeout ends the diagnostic (a silent
    link closes nothing) and removes its temp dir."""
    monkeypatch.setattr(runner, "CLIENT_GRACE_S", 4.0)
    marker = f"mldiag-fault-{uuid.uuid4().hex[:8]}"
    host_before = set(lab.host_tmp("mlsh"))
    job = script_job(SLEEPER, ["600", marker], timeout=3)
    out = {}
    worker = threading.Thread(target=lambda: out.update(
        r=runner.run_many([hosts.targets["inner"]], job)[0]))
    t0 = time.monotonic()
    worker.start()
    wait_for(lambda: pids_with_marker(marker), 20, "the diagnostic to start on inner")
    drop_inner()
    worker.join(30)
    elapsed = time.monotonic() - t0
    assert not worker.is_alive()
    r = out["r"]
    assert r.status == "error" and r.error.layer == "timeout", r.to_dict()
    assert "link may be down" in r.error.message
    assert 3 + 4 <= elapsed < 3 + 4 + 6, elapsed
    # inner's runtime stopped the diagnostic by itself at its 3 s timeout
    assert pids_with_marker(marker) == []
    wait_for(lambda: set(lab.host_tmp("mlsh")) - host_before == set(), 5, "inner's temp dir to go")


@pytest.fixture
def small_tmpfs():
    path = f"/var/tmp/mldiag-full-{os.getpid()}"
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=1777", "tmpfs", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        os.rmdir(path)


def test_remote_disk_full_while_uploading(lab, small_tmpfs):
    """The target's temp dir (hosts.yaml `tmpdir:`) is a 256 KiB tmpfs; a 1 MiB --put file does
    not fit: `upload`, with where and why, and the partial dir is removed."""
    topo = topology.load(str(lab.hosts_yaml(textwrap.dedent(f"""\
        hosts:
          full: {{address: main, tmpdir: {small_tmpfs}}}
          roomy: {{address: main}}
        """))))
    job = bundle.Job("run-script", "probe.py", b"print('ran')\n", mode="script",
                     extra_files={"weights.bin": os.urandom(1 << 20)})
    full, roomy = runner.run_many([topo.targets["full"], topo.targets["roomy"]], job)
    assert full.status == "error" and full.error.layer == "upload", full.to_dict()
    assert "No space left on device" in full.error.message
    assert small_tmpfs in full.error.message
    assert os.listdir(small_tmpfs) == []
    assert roomy.status == "ok" and roomy.data["stdout"] == "ran\n", roomy.to_dict()


def test_sftp_disabled_upload_still_works(hosts, lab):
    """On an sshd without an SFTP subsystem: run-script with extra files works (everything is
    streamed through the exec channel), and a plain put falls back to `install` over exec."""
    assert "Subsystem" not in lab.nosftp.config_path.read_text()
    job = bundle.Job("run-script", "probe.py",
                     b"import os\nprint(open('patch.txt').read(), oct(os.stat('patch.txt').st_mode & 0o777))\n",
                     mode="script", extra_files={"patch.txt": "diff \u00e9\n".encode()})
    r = runner.run_many([hosts.targets["nosftp"]], job)[0]
    assert r.status == "ok" and r.data["stdout"] == "diff \u00e9\n 0o600\n", r.to_dict()
    from diagnostics.transport import chain_for
    pool = SshPool()
    dest = f"/tmp/mldiag-put-nosftp-{os.getpid()}"
    try:
        chain_for(hosts.targets["nosftp"], pool).transport.put(b"\x00\xffdata", dest)
        with open(dest, "rb") as f:
            assert f.read() == b"\x00\xffdata"
        assert oct(os.stat(dest).st_mode & 0o777) == "0o600"
    finally:
        pool.close()
        if os.path.exists(dest):
            os.unlink(dest)


# ------------------------------------------------------------------ interrupts

def test_ctrl_c_of_a_30_target_run(lab, tmp_path):
    """SIGINT to `mldiag run-script` while 20 of 30 targets are running or queued: exit 130 at once, every
    remote diagnostic killed, temp dirs gone, the 10 that finished kept in --save."""
    marker = f"mldiag-sigint-{uuid.uuid4().hex[:8]}"
    fast = [f"fast{i:02d}" for i in range(10)]
    slow = [f"slow{i:02d}" for i in range(20)]

    def ct(name):
        return f"      {name}: {{runtime: pct, id: \"200\", python: {VENV_PY}}}"
    # two hosts (the main sshd and the default-limits one)
    text = ("defaults: {connect_timeout: 5, timeout: 600}\nhosts:\n"
            "  pve-a:\n    address: main\n    become: sudo\n    containers:\n"
            + "\n".join(ct(n) for n in fast[:5] + slow[:10]) + "\n"
            "  pve-b:\n    address: defaults\n    become: sudo\n    containers:\n"
            + "\n".join(ct(n) for n in fast[5:] + slow[10:]) + "\n")
    hosts_file = lab.hosts_yaml(text)
    script = tmp_path / "sleepy.py"
    script.write_text("import os, subprocess, sys\n"
                      "if os.environ['MLDIAG_TARGET'].startswith('slow'):\n"
                      "    subprocess.run([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]])\n"
                      "print('done', sys.argv[1])\n")
    save = tmp_path / "saved"
    ct_before = set(lab.container_tmp(200))
    proc = start_mldiag("run-script", script, "--arg", marker, "--hosts-file", hosts_file,
                        "-H", ",".join(fast + slow), "--save", save,
                        # 10 at a time, taken in order: the fast ten run first
                        "--parallel", "10")
    def fast_saved():
        if proc.poll() is not None:
            raise AssertionError(f"mldiag ended early ({proc.returncode}): {proc.communicate()}")
        return save.is_dir() and len([n for n in os.listdir(save)
                                      if n.startswith("fast") and n.endswith(".json")]) == 10
    try:
        wait_for(fast_saved, 60, "the 10 fast targets to be saved")
        wait_for(lambda: len(marked(lab.container_cmdlines(200), marker)) >= 8, 30,
                 "8 slow diagnostics to run in the CT")
        t0 = time.monotonic()
        out, err = signal_and_wait(proc, signal.SIGINT, 20)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)
    assert "interrupted" in err and "Traceback" not in err
    assert took < 5, took
    wait_for(lambda: marked(lab.container_cmdlines(200), marker) == [], 5,
             "every remote diagnostic to be killed")
    wait_for(lambda: set(lab.container_tmp(200)) - ct_before == set(), 5, "the CT's temp dirs to go")
    saved = sorted(os.listdir(save))
    assert [n for n in saved if n != "summary.json"] == [f"{n}.json" for n in fast], saved
    for name in fast:
        doc = json.loads((save / f"{name}.json").read_text())
        assert doc["status"] == "ok" and doc["data"]["stdout"] == f"done {marker}\n"
    summary = json.loads((save / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["exit_code"] == 130
    assert len(summary["targets"]) == 10 and summary["not_finished"] == sorted(slow)


# ------------------------------------------------------------------ secrets

def test_secrets_never_reach_output_json_or_saved_files(lab, tmp_path):
    """env values with secret names (hosts.yaml), a private key the diagnostic prints, and
    tokens inside an exception: none shows in the table, --json, --save files or stderr."""
    token = "hf_" + uuid.uuid4().hex + "s3cr3t"
    password = "s3cr3t-" + uuid.uuid4().hex[:10]
    hosts_file = lab.hosts_yaml(textwrap.dedent(f"""\
        hosts:
          pve:
            address: main
            become: sudo
            containers:
              trainbox:
                runtime: pct
                id: "200"
                python: {VENV_PY}
                env: {{HF_TOKEN: "{token}", DB_PASSWORD: "{password}", HF_HOME: /dev/shm/hf}}
        """))
    script = tmp_path / "leaky.py"
    script.write_text(textwrap.dedent("""\
        import os, sys
        print("env:", os.environ["HF_TOKEN"], os.environ["DB_PASSWORD"], os.environ["HF_HOME"])
        print("-----BEGIN OPENSSH PRIVATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAAA\\n-----END OPENSSH PRIVATE KEY-----")
        sys.stderr.write("logging in with token=" + os.environ["HF_TOKEN"] + "\\n")
        raise RuntimeError("auth failed for " + os.environ["DB_PASSWORD"])
        """))
    outputs = []
    for extra in ([], ["--json"], ["--save", str(tmp_path / "saved")]):
        r = mldiag("run-script", script, "--hosts-file", hosts_file, "-H", "trainbox", *extra)
        assert r.returncode == 2, r.stderr    # the script raised: fail
        outputs += [r.stdout, r.stderr]
    env = mldiag("env-report", "--hosts-file", hosts_file, "-H", "trainbox", "--json")
    outputs += [env.stdout, env.stderr]
    saved = [p.read_text() for p in (tmp_path / "saved").iterdir()]
    assert len(saved) == 2
    everything = "\n".join(outputs + saved)
    assert token not in everything and password not in everything
    assert "PRIVATE KEY" not in everything
    # and the rest of the output is still there, masked where it must be
    doc = json.loads(outputs[2])[0]
    assert doc["data"]["stdout"].startswith("env: <redacted> <redacted> /dev/shm/hf\n")
    assert "RuntimeError: auth failed for <redacted>" in doc["data"]["stderr"]
    assert json.loads(env.stdout)[0]["data"]["env"]["HF_TOKEN"] == "<redacted>"
