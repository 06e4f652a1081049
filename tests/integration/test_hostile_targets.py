"""Hostile targets against the real lab (issue 10 items 6, 7, 11, 12): one bad target costs no
other target its row.

Targets whose `python:` is tests/fixtures/hostile/python (a fake interpreter that reads the
payload like the runtime, then answers as its `env:` says; the lab's copy in `lab.hostile_dir`,
which the lab users can run whatever the checkout's path and modes) run over the lab's sshd
beside healthy targets, through the `mldiag` command line with `--save`. Each test asserts that
the healthy targets' results are intact in the table and in the saved files, that the exit code
is the worst status, and that nothing is `internal`.
"""

import json
import os
import resource
import subprocess
import sys
import textwrap
import time
from functools import partial
from pathlib import Path

import pytest

from tests import programs

REPO = Path(__file__).resolve().parents[2]
VENV_PY = "/root/venv/bin/python"

MALFORMED = ["status-list", "doc-list", "finding-str", "error-str", "error-layer", "not-json",
             "deep", "deep-dict", "nan"]


mldiag = partial(programs.mldiag, timeout=300)


def hostile_host(lab, name: str, mode: str, **env) -> str:
    """A hosts.yaml entry: user mlsh on `main`, its interpreter the hostile fake in `mode`."""
    values = ", ".join(f"{k}: \"{v}\"" for k, v in {"HOSTILE_MODE": mode, **env}.items())
    return (f"  {name}:\n    address: main\n    python: {lab.hostile_dir / 'python'}\n"
            f"    env: {{{values}}}\n")


def saved(directory: Path) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in directory.glob("*.json")}


def assert_healthy_intact(out: str, files: dict, healthy) -> None:
    for name in healthy:
        assert files[name]["status"] == "ok", files[name]
        assert files[name]["error"] is None and files[name]["data"]["python"]
        assert name in out, out
    assert files["summary"]["targets"] == {n: d["status"] for n, d in files.items() if n != "summary"}


def test_malformed_frames_floods_and_marker_floods_are_rows_of_their_own(lab, tmp_path):
    """Each malformed frame of item 6, 1 GB of output on stdout and on stderr, and a flood of
    20,000 frame-begin markers (item 7): healthy targets beside them report in full."""
    text = "hosts:\n  good-a: {address: main}\n  good-ct:\n    address: main\n    become: sudo\n" \
           f"    containers:\n      good-b: {{runtime: pct, id: \"200\", python: {VENV_PY}}}\n"
    text += "".join(hostile_host(lab, f"bad-{mode}", mode) for mode in MALFORMED)
    text += hostile_host(lab, "flood-out", "stdout-flood", HOSTILE_BYTES=10**9)
    text += hostile_host(lab, "flood-err", "stderr-flood", HOSTILE_BYTES=10**9)
    text += hostile_host(lab, "markers", "marker-flood", HOSTILE_COUNT=20000)
    hosts = lab.hosts_yaml(text)
    save = tmp_path / "save"
    names = ["good-a", "good-b", "flood-out", "flood-err", "markers"] + [f"bad-{m}" for m in MALFORMED]
    started = time.monotonic()
    r = mldiag("ping", "--hosts-file", str(hosts), "-H", ",".join(names), "--save", str(save),
               "--timeout", "240")
    elapsed = time.monotonic() - started
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    files = saved(save)
    assert not [n for n, d in files.items() if n != "summary" and d["error"]
                and d["error"]["layer"] == "internal"], files
    assert not [line for line in r.stdout.splitlines() if " internal: " in line], r.stdout
    assert set(files) == set(names) | {"summary"}
    assert files["summary"]["exit_code"] == 3
    # the floods end with a good frame: kept whole behind a gigabyte of noise
    assert_healthy_intact(r.stdout, files, ["good-a", "good-b"])
    for name in ("flood-out", "flood-err"):
        assert files[name]["status"] == "ok", files[name]
    for name in ["markers"] + [f"bad-{m}" for m in MALFORMED]:
        doc = files[name]
        assert doc["status"] == "error" and doc["error"]["layer"] == "protocol", doc
        assert doc["error"]["message"].startswith("the target answered with a malformed result")
        assert not any(ord(c) < 32 for c in doc["error"]["message"]), doc["error"]["message"]
    assert "\x1b" not in r.stdout
    print(f"hostile run: {elapsed:.1f} s for 2 GB of noise and {len(MALFORMED) + 1} malformed answers")


def test_the_client_stays_bounded_under_a_gigabyte(lab, tmp_path):
    """1 GB on stderr over SSH: the client's peak RSS stays far below the stream's size.

    NOTE: peak RSS is VmHWM of the probe's own memory map. ru_maxrss would not do: Linux keeps
    it across execve, and Python starts a child with vfork, so a probe started by a pytest
    process that has loaded torch (test_diagnostics_remote) reports that process's 400 MB."""
    hosts = lab.hosts_yaml("hosts:\n"
                           + hostile_host(lab, "flood", "stderr-flood", HOSTILE_BYTES=10**9))
    probe = textwrap.dedent(f"""\
        import json, re
        from diagnostics.engine import bundle, runner
        from diagnostics.builtin import BUILTIN; from diagnostics.engine import registry; registry.use(BUILTIN)
        from diagnostics.inventory import topology
        topo = topology.load({str(hosts)!r})
        r = runner.run_one(topo.targets["flood"], bundle.script_job("ping"), runner.SshPool())
        with open("/proc/self/status") as f:
            hwm_kib = int(re.search(r"VmHWM:\\s*([0-9]+) kB", f.read()).group(1))
        print(json.dumps({{"status": r.status, "rss_mib": hwm_kib / 1024}}))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO,
                         timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["status"] == "ok"
    assert got["rss_mib"] < 300, got      # was about 2 GB before issue 10
    print(f"client peak RSS with 1 GB of stderr over SSH: {got['rss_mib']:.0f} MiB")


def test_a_large_put_to_a_target_that_never_reads_ends_at_the_deadline(lab, tmp_path):
    """Item 11: 32 MB of --put (far past the SSH window) to a command that never reads stdin:
    a `timeout` row after --timeout plus the client's grace, not a hang; others unharmed."""
    from diagnostics.engine.runner import CLIENT_GRACE_S
    never_reads = lab.hostile_dir / "never-reads"
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(32 * 2**20))
    script = tmp_path / "probe.py"
    script.write_text("import os\nprint(os.path.getsize('big.bin'))\n")
    hosts = lab.hosts_yaml(f"hosts:\n  good: {{address: main}}\n"
                           f"  deaf:\n    address: main\n    python: {never_reads}\n")
    save = tmp_path / "save"
    started = time.monotonic()
    r = mldiag("run-script", str(script), "--put", str(big), "-H", "good,deaf",
               "--hosts-file", str(hosts), "--timeout", "3", "--save", str(save), timeout=120)
    elapsed = time.monotonic() - started
    assert r.returncode == 3, (r.stdout, r.stderr)
    files = saved(save)
    assert files["good"]["status"] == "ok" and files["good"]["data"]["stdout"].strip() == str(32 * 2**20)
    assert files["deaf"]["error"]["layer"] == "timeout", files["deaf"]
    assert elapsed < 3 + CLIENT_GRACE_S + 20, elapsed
    # the session ended with the run: nothing of it is left on the host
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _processes_running(str(never_reads)):
        time.sleep(0.2)
    assert not _processes_running(str(never_reads))


def _processes_running(marker: str) -> list:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


@pytest.fixture
def fleet150(lab, tmp_path):
    """150 targets on 127.0.0.101..250, served by 10 real sshds (bench/common.py's fleet)."""
    sys.path.insert(0, str(REPO / "bench"))
    from common import fleet_files, start_fleet
    targets = start_fleet(lab, 150, prefix="h")
    try:
        cfg = fleet_files(lab, targets, tmp_path)
        yield targets, cfg
    finally:
        for s in {t.server.name: t.server for t in targets}.values():
            s.stop()
            lab.servers.pop(s.name, None)


def test_150_targets_under_ulimit_100(lab, fleet150, tmp_path):
    """Item 12: every host's connection closes when its target is done, the connections open
    at once are bounded by the descriptor limit: 150 hosts under `ulimit -n 100`, 150 ok rows
    (74 `internal` EMFILE rows before), one connection per host."""
    targets, cfg = fleet150
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n" + "".join(f"  {t.alias}: {{}}\n" for t in targets))
    counts_before = {t.server.name: t.server.connection_count() for t in targets}
    save = tmp_path / "save"

    def limit_descriptors():
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    r = mldiag("ping", "-H", ",".join(t.alias for t in targets), "--hosts-file", str(hosts),
               "--save", str(save), env={"MLDIAG_SSH_CONFIG": str(cfg)},
               preexec_fn=limit_descriptors, timeout=600)
    files = saved(save)
    statuses = {n: d["status"] for n, d in files.items() if n != "summary"}
    problems = {n: d["summary"] for n, d in files.items() if n != "summary" and d["status"] != "ok"}
    assert not problems, problems
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert len(statuses) == 150
    servers = {t.server.name: t.server for t in targets}
    opened = sum(s.connection_count() - counts_before[name] for name, s in servers.items())
    assert opened == 150, opened


def test_connections_close_with_their_last_target_and_stay_under_the_bound(lab):
    """Item 12, in the pool: seven endpoints (four users on `main`, `defaults`, `nosftp`, and
    `inner` through `jump`) under a bound of two open sockets: every target ok, never more than
    two direct connections at once, and none left open when the run ends (the pool is the
    caller's, so it is not the final close() that did it). Invariant 7 holds: the two targets
    on one host share its connection."""
    from diagnostics.engine import bundle, runner
    from diagnostics.inventory import topology
    from diagnostics.transport.ssh import SshPool
    names = ["main", "main-again", "main-mlzsh", "main-nosudo", "main-root", "defaults", "nosftp", "inner"]
    hosts = lab.hosts_yaml("hosts:\n" + "".join(
        f"  {n}: {{address: {'main' if n == 'main-again' else n}}}\n" for n in names))
    topo = topology.load(str(hosts))
    pool = SshPool(max_open=2)
    try:
        results = runner.run_many([topo.targets[n] for n in names], bundle.script_job("ping"),
                                  pool=pool, parallel=8)
        assert [r.status for r in results] == ["ok"] * len(names), [r.summary for r in results]
        assert pool.peak_open <= 2, pool.peak_open
        assert pool._conns == {}, list(pool._conns)
        assert pool.opened >= 8     # seven endpoints and the jump host; evictions may add more
    finally:
        pool.close()
