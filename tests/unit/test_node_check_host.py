"""node-check's host check (scripts/host_checks.py), each finding from a real source of this
machine: a small tmpfs as /dev/shm, the locked-memory limit set with ulimit, a FUSE mount whose
server never answers (a hung network filesystem: its stat sleeps in the kernel, in D state) and a
process stuck on it holding a file it opened as /dev/nvidia0 (in a mount namespace of its own,
where /dev is a tmpfs); two real chronyd (-x: the clock untouched) where chrony is installed,
one told its server is 0.5 s ahead. Where the real thing needs what this machine has not --
systemd's timedatectl, huge pages -- a stand-in prints what the real tool prints (chronyc: a
recording of that real chronyd), and a recorded /proc/meminfo is read. Mounting needs root: CI
runs as root."""

import ctypes
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.programs import SCRIPTS, load_script

host = load_script("host_checks.py", "mldiag_test_host_checks")
nc = load_script("node_check.py", "mldiag_test_node_check_for_host")

root_only = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                               reason="mounts need root (CI runs as root)")

HANG_SERVER = textwrap.dedent('''
    import ctypes, os, sys, time
    fd = os.open("/dev/fuse", os.O_RDWR)
    libc = ctypes.CDLL(None, use_errno=True)
    opts = ("fd=%d,rootmode=40000,user_id=0,group_id=0" % fd).encode()
    if libc.mount(b"mldiag-test-hang", sys.argv[1].encode(), b"fuse", 0, opts) != 0:
        print("mount failed: " + os.strerror(ctypes.get_errno()), flush=True)
        sys.exit(1)
    print("mounted", flush=True)
    time.sleep(300)          # never reads /dev/fuse: every request on the mount waits
''')


def umount(path):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(str(path).encode(), 2)          # MNT_DETACH


@contextmanager
def tmpfs(path, size):
    path.mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "mldiag-test-shm", str(path)], check=True)
    try:
        yield path
    finally:
        umount(path)


@contextmanager
def hung_fuse(path):
    """A FUSE mount at ``path`` whose server never answers; on exit the server is killed (the
    waiting requests fail with ENOTCONN) and the mount detached."""
    path.mkdir(exist_ok=True)
    server = subprocess.Popen([sys.executable, "-c", HANG_SERVER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline().strip()
        assert line == "mounted", line
        yield path
    finally:
        server.kill()
        server.wait()
        umount(path)


def no_tool(argv, timeout=10):
    return nc.Tool("missing", None, "", "%s: not found" % argv[0], 0.0)


def run_host(run_tool=no_tool, **options):
    options.setdefault("proc_root", "/proc")
    options.setdefault("sys_root", "/nonexistent-sys")
    return host.check({}, run_tool, **options)


def codes(result):
    return [f["code"] for f in result["findings"]]


@root_only
def test_a_containers_64_mb_shm_is_small_and_a_full_one_is_full(tmp_path):
    with tmpfs(tmp_path / "shm", "64m") as shm:
        got = run_host(shm_path=str(shm))
        assert got["facts"]["host.shm_mib"] == 64
        (f,) = [f for f in got["findings"] if f["code"].startswith("shm")]
        assert (f["code"], f["level"], f["action"]) == ("shm-small", "warn", "app")
        assert f["message"] == "/dev/shm is 64 MiB (64 MiB free): NCCL's shared-memory transport needs more " \
                               "than a container's 64 MB default"
    with tmpfs(tmp_path / "big", "1200m") as shm:
        with open(shm / "leftover", "wb") as f:
            os.posix_fallocate(f.fileno(), 0, 1000 << 20)
        got = run_host(shm_path=str(shm))
        assert [c for c in codes(got) if c.startswith("shm")] == ["shm-full"]
        (shm / "leftover").unlink()
        assert [c for c in codes(run_host(shm_path=str(shm))) if c.startswith("shm")] == []


CHECK_MEMLOCK = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import host_checks, node_check
    def no_tool(argv, timeout=10):
        return node_check.Tool("missing", None, "", "", 0.0)
    got = host_checks.check({}, no_tool, sys_root=sys.argv[2], proc_root="/proc", shm_path="/nonexistent")
    print(json.dumps([f for f in got["findings"] if f["code"] == "memlock-limited"] + [got["facts"]["host.memlock"]]))
''')


def test_rdma_devices_with_a_limited_memlock(tmp_path):
    """The limit as a shell's ulimit -l sets it for the session, with an RDMA device in a
    sys tree (the lab's recorded trees hold real ones)."""
    (tmp_path / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)

    def under(limit):
        p = subprocess.run(["bash", "-c", f'ulimit -l {limit} && exec "$0" -c "$1" "$2" "$3"', sys.executable,
                            CHECK_MEMLOCK, str(SCRIPTS), str(tmp_path)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        import json
        return json.loads(p.stdout)

    found = under(64)
    assert found[-1] == 64 * 1024 and [f["message"] for f in found[:-1]] == [
        "RDMA devices (mlx5_0) and a locked-memory limit of 64 KiB (ulimit -l): NCCL's InfiniBand transport "
        "needs it unlimited"]
    (tmp_path / "class" / "infiniband" / "mlx5_0").rmdir()
    assert under(64) == [64 * 1024]             # no RDMA device: the limit is only a fact


def test_huge_pages_all_in_use_from_a_recorded_meminfo(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal:       2113433004 kB\nHugePages_Total:    1024\n"
                                      "HugePages_Free:        0\nHugePages_Rsvd:        0\nHugepagesize:       2048 kB\n")
    (tmp_path / "mounts").write_text("")
    got = run_host(proc_root=str(tmp_path), shm_path="/nonexistent")
    assert codes(got) == ["hugepages-exhausted"] and got["facts"]["host.hugepages_total"] == 1024
    (tmp_path / "meminfo").write_text("HugePages_Total:    1024\nHugePages_Free:       12\n")
    assert codes(run_host(proc_root=str(tmp_path), shm_path="/nonexistent")) == []


def stand_in(tmp_path, name, script):
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    (d / name).write_text("#!/bin/sh\n" + script)
    (d / name).chmod(0o755)
    return nc.ToolRunner(path=str(d))


@pytest.mark.parametrize("name,script,synced", [
    # systemd's timedatectl show -p NTPSynchronized --value prints the bare value
    ("timedatectl", 'echo no\n', "no"),
    ("timedatectl", 'echo yes\n', "yes"),
    # chronyc tracking's "Leap status" line (chronyc(1): Normal, Insert second, Delete second,
    # Not synchronised)
    ("chronyc", 'printf "Reference ID    : 00000000 ()\\nStratum         : 0\\nLeap status     : Not synchronised\\n"\n', "no"),
    ("chronyc", 'printf "Reference ID    : C0A80001 (ntp1)\\nLeap status     : Normal\\n"\n', "yes"),
])
def test_the_clock_sync_state(tmp_path, name, script, synced):
    runner = stand_in(tmp_path, name, script)
    got = run_host(run_tool=runner, proc_root=str(tmp_path), shm_path="/nonexistent")
    assert got["facts"]["host.time_sync"] == synced
    assert codes(got) == (["clock-unsynced"] if synced == "no" else [])


def test_neither_time_tool_is_unknown_and_no_finding(tmp_path):
    got = run_host(run_tool=nc.ToolRunner(path=str(tmp_path)), proc_root=str(tmp_path), shm_path="/nonexistent")
    assert got["facts"]["host.time_sync"] == "unknown" and codes(got) == []


def test_gpus_and_rdma_devices_without_peermem(tmp_path):
    (tmp_path / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    (tmp_path / "module").mkdir()
    got = host.check({}, no_tool, gpus=[{"index": 0}], sys_root=str(tmp_path), proc_root="/proc",
                     shm_path="/nonexistent")
    assert [c for c in codes(got) if c != "memlock-limited"] == ["gpudirect-rdma-off"]
    assert got["facts"]["host.persistenced"] is False          # no nvidia-persistenced here
    (tmp_path / "module" / "nvidia_peermem").mkdir()
    got = host.check({}, no_tool, gpus=[{"index": 0}], sys_root=str(tmp_path), proc_root="/proc",
                     shm_path="/nonexistent")
    assert "gpudirect-rdma-off" not in codes(got) and got["facts"]["host.gpudirect_rdma"] is True


STUCK_ON_GPU = ('mount -t tmpfs mldiag-test-dev /dev && : > /dev/nvidia0 && '
                'exec "$0" -c "import os, sys; fd = os.open(\'/dev/nvidia0\', os.O_RDONLY); '
                'print(\'holding\', flush=True); os.stat(sys.argv[1])" "$1"')


@root_only
def test_a_hung_mount_and_the_processes_stuck_on_it(tmp_path):
    """A FUSE mount that never answers: its stat does not return (mount-hung, drain); a process
    stuck on it holding /dev/nvidia0 (stuck-gpu-holder, reboot) and one holding nothing
    (stuck-processes)."""
    with hung_fuse(tmp_path / "mnt") as mnt:
        holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", STUCK_ON_GPU,
                                   sys.executable, str(mnt / "ckpt")], stdout=subprocess.PIPE, text=True)
        plain = subprocess.Popen([sys.executable, "-c", "import os, sys; os.stat(sys.argv[1])", str(mnt / "data")])
        try:
            assert holder.stdout.readline().strip() == "holding"
            end = time.monotonic() + 10
            while not all(host.d_state().get(str(p.pid)) for p in (plain,)) and time.monotonic() < end:
                time.sleep(0.1)
            t0 = time.monotonic()
            got = run_host(mount_timeout=1.0, stuck_recheck=0.2, shm_path="/nonexistent")
            took = time.monotonic() - t0
        finally:
            for p in (holder, plain):
                p.kill()
    for p in (holder, plain):
        p.wait(timeout=10)
    assert took < 5, took
    by_code = {f["code"]: f for f in got["findings"]}
    hung = [f for f in got["findings"] if f["code"] == "mount-hung"]
    assert [f["message"] for f in hung if str(mnt) in f["message"]] == [
        f"{mnt} (fuse) did not answer a stat within 1 s"], hung
    assert (hung[0]["level"], hung[0]["action"]) == ("fail", "drain")
    gpu = by_code["stuck-gpu-holder"]
    assert (gpu["level"], gpu["action"]) == ("fail", "reboot")
    comm = os.path.basename(sys.executable)[:15]       # the kernel's comm: the program's name
    assert f"pid {holder.pid} ({comm}) /dev/nvidia0" in gpu["message"], gpu["message"]
    assert f"pid {plain.pid} ({comm})" in by_code["stuck-processes"]["message"]
    assert got["facts"]["host.network_mounts"] >= 1


def test_network_mounts_are_read_from_proc_mounts(tmp_path):
    (tmp_path / "mounts").write_text(
        "sysfs /sys sysfs rw 0 0\n"
        "10.0.0.5:/export /mnt/ckpt nfs4 rw,relatime,vers=4.2 0 0\n"
        "fusectl /sys/fs/fuse/connections fusectl rw 0 0\n"
        "s3fs /mnt/my\\040data fuse.s3fs rw 0 0\n"
        "lustre@o2ib:/fs /lustre lustre rw 0 0\n")
    assert host.network_mounts(str(tmp_path)) == [("/mnt/ckpt", "nfs4"), ("/mnt/my data", "fuse.s3fs"),
                                                   ("/lustre", "lustre")]


ZOMBIE_ON_GPU = ('mount -t tmpfs mldiag-test-dev /dev && : > /dev/nvidia0 && exec "$0" -c "$1" "$2"')
ZOMBIE = textwrap.dedent('''
    import ctypes, os, sys, threading
    ready = threading.Event()

    def hold():
        fd = os.open("/dev/nvidia0", os.O_RDONLY)
        ready.set()
        os.stat(sys.argv[1])         # stuck: the FUSE server never answers

    threading.Thread(target=hold).start()
    ready.wait()
    print("holding", flush=True)
    ctypes.CDLL(None).pthread_exit(None)     # the main thread ends: the process is a zombie
''')


@root_only
def test_a_zombie_whose_live_thread_holds_the_gpu(tmp_path):
    """The main thread exited (pthread_exit): the process is a zombie (Z), its fd table gone
    from /proc/PID/fd; its other thread, stuck in D on a hung mount, still holds /dev/nvidia0
    (seen through /proc/PID/task/TID/fd). node-check names the process, the thread and the GPU."""
    with hung_fuse(tmp_path / "mnt") as mnt:
        zombie = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", ZOMBIE_ON_GPU,
                                   sys.executable, ZOMBIE, str(mnt / "ckpt")], stdout=subprocess.PIPE, text=True)
        try:
            assert zombie.stdout.readline().strip() == "holding"
            pid = str(zombie.pid)
            end = time.monotonic() + 10
            while (host.d_state().get(pid) or (None, None, None))[2] != "Z" and time.monotonic() < end:
                time.sleep(0.1)
            name, tid, leader = host.d_state()[pid]
            assert leader == "Z" and tid != pid
            assert host.gpu_files("/proc", pid) == [] and host.gpu_files("/proc", pid, tid) == ["/dev/nvidia0"]
            got = run_host(mount_timeout=1.0, stuck_recheck=0.2, shm_path="/nonexistent")
        finally:
            zombie.kill()
    zombie.wait(timeout=10)
    (gpu,) = [f for f in got["findings"] if f["code"] == "stuck-gpu-holder"]
    assert f"pid {pid} ({name}, a zombie, thread {tid}) /dev/nvidia0" in gpu["message"], gpu["message"]


# --------------------------------------------------------------------------- the NTP offset

# chronyc tracking as chrony 4.3 printed it (tests/fixtures/chrony/README.md: a real chronyd
# told its server is half a second ahead), its "System time" line changed per case
CHRONY = Path(__file__).resolve().parents[1] / "fixtures" / "chrony"
TRACKING = (CHRONY / "tracking-0.5s-slow.txt").read_text()


def tracking_with(system_time):
    return re.sub(r"(?m)^(System time     : ).*$", lambda m: m.group(1) + system_time + " of NTP time", TRACKING)


def offset_message(offset, source):
    return "the clock is %.3f s %s its NTP source (%s)" % (abs(offset), "behind" if offset < 0 else "ahead of", source)


@pytest.mark.parametrize("tracking, offset, found", [
    (TRACKING, -0.49999854, ["clock-ntp-offset"]),                       # as recorded
    (tracking_with("0.000012345 seconds fast"), 0.000012345, []),
    (tracking_with("3.500000000 seconds fast"), 3.5, ["clock-ntp-offset"]),
    (tracking_with("0.099000000 seconds slow"), -0.099, []),
])
def test_chronys_measured_offset(tmp_path, tracking, offset, found):
    (tmp_path / "tracking.txt").write_text(tracking)
    runner = stand_in(tmp_path, "chronyc", 'exec cat "%s"\n' % (tmp_path / "tracking.txt"))
    got = run_host(run_tool=runner, proc_root=str(tmp_path), shm_path="/nonexistent")
    assert got["data"]["clock"] == {"sync": "yes", "ntp_offset_s": offset, "offset_source": "chronyc"}
    assert codes(got) == found
    if found:
        (f,) = got["findings"]
        assert (f["level"], f["action"], f["message"]) == ("warn", "monitor", offset_message(offset, "chronyc"))


# where .ci/run unpacks Debian's chrony package (never installed: no time daemon is added)
CI_CHRONY = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         ".ci", "chrony", "root")


def chrony_binaries():
    """chronyd and chronyc: an unpacked package that $MLDIAG_TEST_CHRONY names, the one .ci/run
    unpacks, or installed ones. Missing: a skip, and under CI=true a failure (no tier CI skips)."""
    roots = [r for r in (os.environ.get("MLDIAG_TEST_CHRONY"), CI_CHRONY) if r]
    candidates = [(os.path.join(r, "usr/sbin/chronyd"), os.path.join(r, "usr/bin/chronyc")) for r in roots]
    candidates.append((shutil.which("chronyd") or "/usr/sbin/chronyd", shutil.which("chronyc") or "/usr/bin/chronyc"))
    for found in candidates:
        if all(os.access(f, os.X_OK) for f in found):
            return found
    why = "chrony is not installed nor unpacked (bash .ci/run unpacks it: tests/fixtures/chrony/README.md)"
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


@root_only
def test_a_real_chronyd_whose_clock_is_half_a_second_slow(tmp_path):
    """Two real chronyd, neither allowed to touch the clock (-x): a server, and its client told
    the server is 0.5 s ahead (its offset option). The host check reads the client's own
    chronyc tracking: 0.5 s slow of NTP time."""
    chronyd, chronyc = chrony_binaries()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:     # a UDP port free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run = tmp_path / "run"
    run.mkdir(mode=0o700)                    # chronyd refuses a command socket in an open dir
    (tmp_path / "server.conf").write_text(
        f"local stratum 8\nallow 127.0.0.1\nport {port}\nbindaddress 127.0.0.1\ncmdport 0\n"
        f"bindcmdaddress {run}/server.sock\npidfile {run}/server.pid\n")
    (tmp_path / "client.conf").write_text(
        f"server 127.0.0.1 port {port} iburst minpoll -4 maxpoll -4 offset 0.5\nport 0\ncmdport 0\n"
        f"bindcmdaddress {run}/client.sock\npidfile {run}/client.pid\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "chronyc").write_text(f'#!/bin/sh\nexec "{chronyc}" -h "{run}/client.sock" "$@"\n')
    (bin_dir / "chronyc").chmod(0o755)
    daemons = [subprocess.Popen([chronyd, "-d", "-x", "-u", "root", "-f", str(tmp_path / f"{name}.conf"), "-L", "0"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for name in ("server", "client")]
    try:
        end, got = time.monotonic() + 20, None
        while time.monotonic() < end:
            got = run_host(run_tool=nc.ToolRunner(path=str(bin_dir)), proc_root=str(tmp_path), shm_path="/nonexistent")
            offset = got["data"]["clock"]["ntp_offset_s"]
            if offset is not None and abs(offset + 0.5) < 0.01:
                break
            time.sleep(0.5)
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            daemon.wait(timeout=10)
    clock = got["data"]["clock"]
    assert (clock["sync"], clock["offset_source"]) == ("yes", "chronyc"), clock
    assert clock["ntp_offset_s"] == pytest.approx(-0.5, abs=0.01), clock
    (f,) = got["findings"]
    assert (f["code"], f["level"], f["action"]) == ("clock-ntp-offset", "warn", "monitor")
    assert f["message"] == offset_message(clock["ntp_offset_s"], "chronyc")


# timedatectl timesync-status as systemd 252's prints it where systemd-timesyncd runs
TIMESYNC_STATUS = ("       Server: 192.168.0.1 (ntp1.lab)\\n"
                   "Poll interval: 34min 8s (min: 32s; max 34min 8s)\\n"
                   "         Leap: normal\\n"
                   "      Version: 4\\n"
                   "      Stratum: 2\\n"
                   "    Reference: 11FD2274\\n"
                   "    Precision: 1us (-25)\\n"
                   "Root distance: 35.541ms (max: 5s)\\n"
                   "       Offset: %s\\n"
                   "        Delay: 28.548ms\\n"
                   "       Jitter: 1.236ms\\n"
                   " Packet count: 68\\n"
                   "    Frequency: +8.042ppm\\n")


@pytest.mark.parametrize("printed, offset, found", [
    # systemd prints NTP's offset, server minus local ("+": this clock is behind), with
    # format_timespan's units; ntp_offset_s is system minus NTP time, as chrony's
    ("-1.053ms", 0.001053, []),
    ("+412.5ms", -0.4125, ["clock-ntp-offset"]),
    ("-2.000104s", 2.000104, ["clock-ntp-offset"]),
    ("+870us", -0.00087, []),
    ("+1min 3.500000s", -63.5, ["clock-ntp-offset"]),
])
def test_timesyncds_measured_offset(tmp_path, printed, offset, found):
    """timedatectl answers the sync state, and where chronyc is not there, timesyncd's last
    measured offset (systemd's timedatectl.c: print_ntp_status_info)."""
    script = ('case "$1" in show) echo yes ;; timesync-status) printf "%s" ;; *) exit 1 ;; esac\n'
              % (TIMESYNC_STATUS % printed))
    got = run_host(run_tool=stand_in(tmp_path, "timedatectl", script), proc_root=str(tmp_path),
                   shm_path="/nonexistent")
    clock = got["data"]["clock"]
    assert (clock["sync"], clock["offset_source"]) == ("yes", "timedatectl")
    assert clock["ntp_offset_s"] == pytest.approx(offset, abs=1e-12)
    assert codes(got) == found


def test_no_offset_where_neither_tool_says_one(tmp_path):
    got = run_host(run_tool=stand_in(tmp_path, "timedatectl", 'case "$1" in show) echo no ;; *) exit 1 ;; esac\n'),
                   proc_root=str(tmp_path), shm_path="/nonexistent")
    assert got["data"]["clock"] == {"sync": "no", "ntp_offset_s": None, "offset_source": None}
    assert codes(got) == ["clock-unsynced"]


# --------------------------------------------------------------------------- hosts.yaml paths

def entry(name, path, least=None):
    return {"name": name, "path": str(path), "min_free_gb": least}


@root_only
def test_hosts_yaml_paths_free_space_missing_and_not_a_directory(tmp_path):
    """A 64 MiB tmpfs (a directory with a space in its name on it), a path that is not there, a
    file where a directory should be."""
    with tmpfs(tmp_path / "small fs", "64m") as small:
        (small / "my ckpt").mkdir()
        (tmp_path / "a file").write_text("x")
        paths = [entry("ckpt", small / "my ckpt", 0.5), entry("scratch", small, 0.05),
                 entry("data", tmp_path / "gone"), entry("weights", tmp_path / "a file", 1),
                 entry("inside", tmp_path / "a file" / "x")]
        got = run_host(paths=paths, shm_path="/nonexistent")
    states = {p["name"]: p for p in got["data"]["paths"]}
    assert states["ckpt"]["state"] == "ok" and states["ckpt"]["total_gb"] == pytest.approx(0.067, abs=0.001)
    assert 0.06 < states["ckpt"]["free_gb"] <= states["ckpt"]["total_gb"]
    assert (states["data"]["state"], states["weights"]["state"], states["inside"]["state"]) == (
        "missing", "not-a-directory", "missing")
    found = [(f["code"], f["level"], f["action"], f["message"]) for f in got["findings"]
             if f["code"].startswith("path-")]
    assert found == [
        ("path-low-space", "warn", "monitor", "hosts.yaml path ckpt (%s) has 0.1 GB free of 0.1 GB, under "
         "the 0.5 GB asked (min_free_gb)" % (small / "my ckpt")),
        ("path-missing", "warn", "monitor", "hosts.yaml path data (%s) does not exist" % (tmp_path / "gone")),
        ("path-missing", "warn", "monitor", "hosts.yaml path weights (%s) is not a directory" % (tmp_path / "a file")),
        ("path-missing", "warn", "monitor", "hosts.yaml path inside (%s) does not exist" % (tmp_path / "a file" / "x")),
    ]


@root_only
def test_a_path_on_a_hung_mount_costs_one_timeout(tmp_path):
    """A hosts.yaml path on a FUSE mount that never answers: path-hung (drain) beside the
    mount's own mount-hung, within one timeout for both (the stats run side by side)."""
    with hung_fuse(tmp_path / "mnt") as mnt:
        t0 = time.monotonic()
        got = run_host(paths=[entry("ckpt", mnt / "ckpt", 100), entry("tmp", tmp_path)],
                       mount_timeout=1.0, stuck_recheck=0.0, shm_path="/nonexistent")
        took = time.monotonic() - t0
    assert took < 3, took
    assert [p["state"] for p in got["data"]["paths"]] == ["hung", "ok"]
    (f,) = [f for f in got["findings"] if f["code"] == "path-hung"]
    assert (f["level"], f["action"], f["message"]) == (
        "fail", "drain", "hosts.yaml path ckpt (%s) did not answer a stat within 1 s" % (mnt / "ckpt"))
    assert any(f["code"] == "mount-hung" and str(mnt) in f["message"] for f in got["findings"])


def test_the_paths_argument_as_node_check_reads_it():
    """--paths is the client's JSON token; by hand, a malformed one is refused naming the flag
    and an entry that is not one of hosts.yaml's shape is left out."""
    assert nc.parse_paths('[{"name": "ckpt", "path": "/my ckpt", "min_free_gb": 500}, {"name": "x", "path": "rel"}, '
                          '{"name": "d", "path": "/d", "min_free_gb": true}, "/e"]') == [
        {"name": "ckpt", "path": "/my ckpt", "min_free_gb": 500}, {"name": "d", "path": "/d", "min_free_gb": None}]
    with pytest.raises(SystemExit, match="^--paths: not JSON: "):
        nc.parse_paths("[{")
    with pytest.raises(SystemExit, match=r'^--paths: a JSON list, like \[\{"name"'):
        nc.parse_paths('{"ckpt": "/ckpt"}')
    with pytest.raises(SystemExit, match='^--expect: a JSON object, like {"gpus": 8}$'):
        nc.parse_expect("[8]")


CHECK_PATHS = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import host_checks, node_check
    def no_tool(argv, timeout=10):
        return node_check.Tool("missing", None, "", "", 0.0)
    got = host_checks.check({}, no_tool, proc_root="/nonexistent", sys_root="/nonexistent", shm_path="/nonexistent",
                            paths=[{"name": "ckpt", "path": sys.argv[2], "min_free_gb": 1}])
    print(json.dumps([got["data"]["paths"], [f for f in got["findings"] if f["code"].startswith("path-")]]))
''')


@root_only
def test_a_path_this_user_cannot_reach(nobodys_dir):
    """node-check run as a user the path's parent keeps out (0700, root's): the stat fails with
    EACCES, said as such (not "does not exist"). Everything above "private" is open to that
    user, and the same path is read as root."""
    ckpt = nobodys_dir / "private" / "ckpt"
    ckpt.mkdir(parents=True)
    (nobodys_dir / "private").chmod(0o700)

    def as_user(prefix):
        # the system's python3: this one may be under a directory the user cannot enter (pyenv's)
        p = subprocess.run(prefix + ["/usr/bin/python3", "-c", CHECK_PATHS, str(nobodys_dir / "scripts"), str(ckpt)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)
    (state,), (f,) = as_user(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
    assert (state["state"], state["error"]) == ("error", "Permission denied"), state
    assert (f["code"], f["level"], f["action"], f["message"]) == (
        "path-missing", "warn", "monitor", "hosts.yaml path ckpt (%s) cannot be read: Permission denied" % ckpt)
    (state,), _ = as_user([])
    assert state["state"] == "ok", state


def test_a_stat_child_that_cannot_start_is_said(tmp_path, monkeypatch):
    """No interpreter to start the child with (a node whose python went away under the run):
    the path's state says so, and no mount is called hung."""
    monkeypatch.setattr(host.sys, "executable", str(tmp_path / "no-python"))
    got = run_host(paths=[entry("ckpt", tmp_path, 1)], shm_path="/nonexistent")
    assert got["data"]["paths"] == [{"name": "ckpt", "path": str(tmp_path), "min_free_gb": 1, "state": "error",
                                     "error": "its stat child did not start: No such file or directory"}]
    assert [f["message"] for f in got["findings"] if f["code"].startswith(("path-", "mount-"))] == [
        "hosts.yaml path ckpt (%s) cannot be read: its stat child did not start: No such file or directory"
        % tmp_path]


@root_only
def test_mldiag_node_check_with_a_hosts_yaml_path_on_a_hung_mount(tmp_path):
    """End to end on this machine (a local target: the real runtime, no SSH): a hosts.yaml path
    with a space in it on a FUSE mount that never answers costs the run one stat deadline
    (5 s), and says path-hung (drain) beside mount-hung; the other path's free space is read."""
    from tests import programs
    with hung_fuse(tmp_path / "dead mnt") as mnt:
        hosts = tmp_path / "hosts.yaml"
        hosts.write_text(json.dumps({"hosts": {"here": {"local": True, "paths": {
            "ckpt": {"path": str(mnt / "ckpt"), "min_free_gb": 1}, "scratch": str(tmp_path)}}}}))
        t0 = time.monotonic()
        r = programs.mldiag("node-check", "--hosts-file", hosts, "-H", "here", "--no-dcgm", "--json", timeout=60)
        took = time.monotonic() - t0
    (doc,) = json.loads(r.stdout)
    assert took < host.MOUNT_TIMEOUT_S + 5, took
    assert [(p["name"], p["state"]) for p in doc["data"]["host"]["paths"]] == [("ckpt", "hung"), ("scratch", "ok")]
    found = {f["code"]: f for f in doc["findings"]}
    assert (found["path-hung"]["level"], found["path-hung"]["action"]) == ("fail", "drain")
    assert found["path-hung"]["message"] == "hosts.yaml path ckpt (%s) did not answer a stat within 5 s" % (mnt / "ckpt")
    assert str(mnt) in found["mount-hung"]["message"]
    assert (r.returncode, doc["status"], doc["data"]["worst_action"]) == (2, "fail", "drain"), r.stderr
    print(f"node-check with a hung path: {took:.2f} s")
