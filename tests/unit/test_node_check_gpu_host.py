"""node-check's GPU host check (scripts/gpu_host.py): nvidia-smi is the fake answering from real
captures and derived ones (tests/fixtures/nvidia-smi, README.md there), run by node-check's own
ToolRunner; the processes it names are real ones of this machine (one reaped, one a zombie, this
test itself), judged through the real /proc; a PID namespace of its own is a real one (``unshare
--pid --fork --mount-proc``); nvidia-persistenced is a real process of that name; device nodes
are real character devices (copies of /dev/null, as the lab's Slurm GRES devices). The check
inside a real container: tests/integration/test_gpu_host_container.py."""

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from tests.programs import FAKE_NVIDIA_SMI, SCRIPTS, load_script

gh = load_script("gpu_host.py", "mldiag_test_gpu_host")
nc = load_script("node_check.py", "mldiag_test_node_check_for_gpu_host")
host = load_script("host_checks.py", "mldiag_test_host_checks_for_gpu_host")

root_only = pytest.mark.skipif(os.geteuid() != 0 and os.environ.get("CI") != "true",
                               reason="device nodes and PID namespaces need root (CI runs as root)")


@pytest.fixture
def smi(monkeypatch, tmp_path):
    """A ToolRunner whose nvidia-smi is the fake, answering the capture ``smi(name)`` names."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(FAKE_NVIDIA_SMI, bin_dir / "nvidia-smi")

    def use(capture):
        monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", str(capture))
        return nc.ToolRunner(path=str(bin_dir))
    return use


def run_check(run_tool, tmp_path, **options):
    options.setdefault("dev_root", str(tmp_path / "no-dev"))
    options.setdefault("leak_recheck", 0)
    return gh.check({}, run_tool, **options)


def of(result, code):
    return [f for f in result["findings"] if f["code"] == code]


# ---------------------------------------------------------------- leaked memory

def test_memory_in_use_with_no_process_listed_is_leaked_on_the_host(smi, tmp_path):
    got = run_check(smi("derived__h200x8__pid-namespace"), tmp_path)
    assert got["data"]["pid_namespace"] == "host"
    (f,) = of(got, "gpu-memory-leaked")
    assert (f["level"], f["action"], f["gpus"]) == ("fail", "reset-gpu", list(range(8)))
    assert f["message"] == ("GPUs 0-7: 60.0 GiB in use and no live process holds it: nvidia-smi lists "
                            "no process on it")
    (f,) = of(run_check(smi("derived__h200x8__leaked-memory"), tmp_path), "gpu-memory-leaked")
    assert f["gpus"] == [3] and f["message"].startswith("GPU 3: 71.0 GiB in use")
    assert of(run_check(smi("derived__h200x8__healthy"), tmp_path), "gpu-memory-leaked") == []


IN_OWN_NAMESPACE = textwrap.dedent('''
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import gpu_host, node_check
    got = gpu_host.check({}, node_check.ToolRunner(path=sys.argv[2]), dev_root="/nonexistent", leak_recheck=0)
    print(json.dumps(got))
''')


@root_only
def test_the_same_memory_seen_from_a_pid_namespace_of_its_own_is_not_judged(smi, tmp_path):
    """From a namespace of its own the processes holding the memory are invisible: gpu-status's
    unattributed memory, not a leak."""
    smi("derived__h200x8__pid-namespace")
    p = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", IN_OWN_NAMESPACE,
                        str(SCRIPTS), str(tmp_path / "bin")], capture_output=True, text=True, timeout=60,
                       env=os.environ.copy())
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["data"]["pid_namespace"] == "own"
    assert of(got, "gpu-memory-leaked") == []
    assert [(m["gpu"], m["used_mib"]) for m in got["data"]["memory"]] == [(i, 61440) for i in range(8)]


def capture_with_apps(tmp_path, apps):
    """A derived capture (written here: the pids are this run's) holding memory for ``apps``:
    [(gpu, pid, MiB)]."""
    lines = ["# test: processes of this machine on an 8x H200", "base linux-x86_64__nvidia-h200__590.48.01.txt",
             "gpus 8", "clear-apps *", "set * * memory.used = 0 MiB"]
    for gpu, pid, mib in apps:
        lines += ["set * %d memory.used = %d MiB" % (gpu, mib), "app * %d %d %d python" % (gpu, pid, mib)]
    path = tmp_path / "derived__test__apps.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_memory_of_a_process_that_is_gone_or_a_zombie_is_leaked_and_a_live_ones_is_not(smi, tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()                                      # reaped: no /proc entry
    zombie = subprocess.Popen(["true"])              # exits, not reaped: state Z
    try:
        deadline = time.monotonic() + 10
        while gh.pid_state(zombie.pid) != "zombie":
            assert time.monotonic() < deadline, "the child did not become a zombie"
            time.sleep(0.01)
        assert gh.pid_state(gone.pid) == "gone" and gh.pid_state(os.getpid()) == "alive"
        capture = capture_with_apps(tmp_path, [(3, gone.pid, 72704), (5, zombie.pid, 20480),
                                               (6, os.getpid(), 40960)])
        got = run_check(smi(capture), tmp_path)
    finally:
        zombie.wait()
    assert [(f["gpus"], f["message"]) for f in of(got, "gpu-memory-leaked")] == [
        ([3], "GPU 3: 71.0 GiB in use and no live process holds it: its processes are gone "
              "(pid %d not running)" % gone.pid),
        ([5], "GPU 5: 20.0 GiB in use and no live process holds it: its processes are gone "
              "(pid %d a zombie)" % zombie.pid)]
    assert got["data"]["memory"] == [
        {"gpu": 3, "used_mib": 72704, "processes": [{"pid": gone.pid, "used_memory_mib": 72704, "state": "gone"}]},
        {"gpu": 5, "used_mib": 20480, "processes": [{"pid": zombie.pid, "used_memory_mib": 20480,
                                                     "state": "zombie"}]},
        {"gpu": 6, "used_mib": 40960, "processes": [{"pid": os.getpid(), "used_memory_mib": 40960,
                                                     "state": "alive"}]}]


def test_memory_freed_before_the_second_look_is_no_leak(smi, tmp_path, monkeypatch):
    """A job that has just exited may still be freeing its memory: the check asks nvidia-smi
    again after ``leak_recheck`` seconds and reports only what stayed."""
    run_tool = smi("derived__h200x8__leaked-memory")
    calls = []

    def freed_after_first_look(argv, timeout=10):
        calls.append(argv)
        if len(calls) == 2:       # both queries of the first look answered: the job is gone
            monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", "derived__h200x8__healthy")
        return run_tool(argv, timeout)
    got = run_check(freed_after_first_look, tmp_path)
    assert len(calls) == 4 and of(got, "gpu-memory-leaked") == []
    assert got["data"]["memory"] == []                 # what the second look saw


def test_a_hung_or_missing_nvidia_smi(smi, tmp_path, monkeypatch):
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI_HANG", "30")
    got = run_check(smi("derived__h200x8__healthy"), tmp_path, tool_timeout=0.5)
    assert [(f["code"], f["level"], f["action"]) for f in got["findings"]] == [("tool-hung", "fail", "reboot")]
    got = run_check(nc.ToolRunner(path=str(tmp_path / "empty")), tmp_path)
    assert [(f["code"], f["level"]) for f in got["findings"]] == [("not-checked", "info")]
    assert "memory" not in got["data"]


# ---------------------------------------------------------------- persistence

def test_persistence_off_without_the_daemon(smi, tmp_path):
    gpus = gh.parse_gpus(smi("derived__h200x8__persistence-off")(gh.gpu_argv()).out)
    assert [g["persistence"] for g in gpus] == ["Disabled"] * 8
    (f,) = gh.persistence_findings(gpus, daemon=False, in_container=False)
    assert (f["code"], f["level"], f["action"], f["gpus"]) == ("persistence-off", "warn", "monitor", list(range(8)))
    assert f["message"].startswith("GPUs 0-7: persistence mode off and nvidia-persistenced is not running")
    assert gh.persistence_findings(gpus, daemon=True, in_container=False) == []
    (f,) = gh.persistence_findings(gpus, daemon=None, in_container=True)
    assert "this container cannot see whether nvidia-persistenced runs" in f["message"]
    got = run_check(smi("derived__h200x8__persistence-off"), tmp_path)
    assert got["facts"]["gpu.persistence_mode"] == "Disabled" and len(of(got, "persistence-off")) == 1
    # a desktop card (the real RTX 4080 SUPER capture: persistence Disabled, a display attached)
    desk = gh.parse_gpus(smi("linux-x86_64__nvidia-geforce-rtx-4080-super__595.71.05")(gh.gpu_argv()).out)
    assert [(g["persistence"], g["display"]) for g in desk] == [("Disabled", "Enabled")]
    assert gh.persistence_findings(desk, daemon=False, in_container=False) == []


def test_the_daemon_is_a_real_process_of_that_name(tmp_path):
    if gh.persistenced_running("/proc"):
        pytest.skip("an nvidia-persistenced runs on this machine")
    daemon = tmp_path / "nvidia-persistenced"
    shutil.copy("/bin/sleep", daemon)
    p = subprocess.Popen([str(daemon), "30"])
    try:
        deadline = time.monotonic() + 10
        # the kernel keeps 15 bytes of the name: a comparison of comm with the whole name misses it
        while gh._remote.read_text("/proc/%d/comm" % p.pid) != "nvidia-persiste":
            assert time.monotonic() < deadline, "the exec'd daemon's comm is not cut to 15 bytes"
            time.sleep(0.01)
        deadline = time.monotonic() + 10
        while not gh.persistenced_running("/proc"):
            assert time.monotonic() < deadline, "the daemon was not seen"
            time.sleep(0.01)
    finally:
        p.kill()
        p.wait()
    assert gh.persistenced_running("/proc") is False


# ---------------------------------------------------------------- inside a container

def null_nodes(directory, numbers):
    """/dev/nvidiaN as the lab's Slurm GRES devices are made: character devices 1:3 (/dev/null)."""
    directory.mkdir(exist_ok=True)
    for n in numbers:
        os.mknod(directory / ("nvidia%d" % n), 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (directory / "nvidiactl").touch()              # not a GPU
    (directory / "nvidia-uvm").touch()
    return directory


@root_only
def test_device_nodes_are_read_from_a_dev_directory(tmp_path):
    dev = null_nodes(tmp_path / "dev", [0, 1, 2, 3, 5, 6, 7, 10])
    assert gh.device_nodes(str(dev)) == [0, 1, 2, 3, 5, 6, 7, 10]
    assert gh.device_nodes(str(tmp_path / "none")) == []


def env(nvd=None, cvd=None):
    out = {}
    if nvd is not None:
        out["NVIDIA_VISIBLE_DEVICES"] = (nvd, "PID 1")
    if cvd is not None:
        out["CUDA_VISIBLE_DEVICES"] = (cvd, "this process")
    return out


def test_given_seven_of_eight_device_nodes():
    findings, data = gh.container_findings("docker", 7, env("0,1,2,3,4,5,6,7"), [0, 1, 2, 3, 4, 6, 7], None)
    (f,) = findings
    assert (f["code"], f["level"], f["action"]) == ("container-gpu-mismatch", "fail", "app")
    assert f["message"] == (
        "inside this docker container the GPUs do not agree: the NVIDIA runtime was given 8 "
        "(NVIDIA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7); 7 device nodes (/dev/nvidia0, /dev/nvidia1, "
        "/dev/nvidia2, /dev/nvidia3, /dev/nvidia4, /dev/nvidia6, /dev/nvidia7); nvidia-smi lists 7")
    assert data["nvidia_visible_devices"] == "0,1,2,3,4,5,6,7" and data["listed"] == 7
    # the runtime's per-GPU /proc/driver/nvidia/gpus entries count as well
    findings, _ = gh.container_findings("docker", 8, env("0,1,2,3,4,5,6,7"), list(range(8)),
                                        ["0000:18:00.0", "0000:2a:00.0"])
    assert [f["code"] for f in findings] == ["container-gpu-mismatch"]
    assert "2 in /proc/driver/nvidia/gpus" in findings[0]["message"]


def test_what_agrees_is_no_finding():
    assert gh.container_findings("docker", 8, env("all"), list(range(8)), None)[0] == []
    assert gh.container_findings("lxc", 8, env(), list(range(8)), None)[0] == []
    assert gh.container_findings("docker", 2, env("3,5"), [3, 5], ["0000:5d:00.0", "0000:ab:00.0"])[0] == []
    assert gh.container_findings("docker", 0, env("void"), [], None)[0] == []
    # no device node at all: nvidia-smi's list cannot be this container's (the driver answers
    # through /dev/nvidiaN), so it is not compared -- only what the runtime was given is
    assert gh.container_findings("lxc", 8, env(), [], None)[0] == []
    (f,) = gh.container_findings("docker", None, env("0,1"), [], None)[0]
    assert "was given 2" in f["message"] and "0 device nodes (none)" in f["message"]


def test_a_lost_gpu_still_has_its_device_node(smi, tmp_path):
    """nvidia-smi names a lost GPU in its own line (node-check's gpu-count reports it): with its
    device node still there, it counts as one of the container's GPUs."""
    got = gh.query(smi("derived__h200x8__gpu-lost"), 10)
    assert (len(got.gpus), got.lost, got.listed()) == (7, 1, 8)
    assert gh.container_findings("lxc", got.listed(), env(), list(range(8)), None)[0] == []


def test_cuda_visible_devices_naming_a_gpu_not_there():
    (f,) = gh.container_findings("docker", 4, env("0,1,2,3", "0,4,1"), [0, 1, 2, 3], None)[0]
    assert (f["code"], f["level"], f["action"]) == ("cuda-visible-devices", "fail", "app")
    assert f["message"] == ("CUDA_VISIBLE_DEVICES=0,4,1 (this process) names '4', which is not one of the "
                            "4 GPUs here: CUDA ignores it and every entry after it")
    assert gh.cuda_visible_problem("0,1,2,3", 4) is None
    assert gh.cuda_visible_problem("GPU-00000003,1", 4) is None        # UUIDs: not judged
    assert gh.cuda_visible_problem("", 4) == ""
    assert gh.cuda_visible_problem("-1", 4) == "-1"
    assert gh.cuda_visible_problem("NoDevFiles", 4) == "NoDevFiles"


def test_nvidia_visible_devices_values():
    assert gh.given_devices(None) == (None, None)
    assert gh.given_devices("all") == (None, "all")
    assert gh.given_devices("none") == ([], "none")
    assert gh.given_devices("") == ([], "void")
    assert gh.given_devices("0, 2 ,GPU-1234") == (["0", "2", "GPU-1234"], "0, 2 ,GPU-1234")
    assert gh.given_devices("0:1,0:2")[0] is None                    # MIG devices: not counted
    assert gh.given_devices("MIG-aaaa")[0] is None


def test_the_device_plugins_volume_mounts_list(tmp_path):
    """Kubernetes' device plugin with deviceListStrategy volume-mounts: NVIDIA_VISIBLE_DEVICES
    names a directory, one empty file per device given (real files in a real directory here)."""
    listing = tmp_path / "nvidia-container-devices"
    listing.mkdir()
    for uuid in ("GPU-00000003-0000-0000-0000-000000000003", "GPU-00000005-0000-0000-0000-000000000005"):
        (listing / uuid).touch()
    given, raw = gh.given_devices(str(listing))
    assert len(given) == 2 and raw.startswith(str(listing) + ": GPU-00000003")
    (f,) = gh.container_findings("kubernetes", 1, env(str(listing)), [3], None)[0]
    assert "the NVIDIA runtime was given 2" in f["message"] and "1 device node (/dev/nvidia3)" in f["message"]
    assert gh.given_devices(str(tmp_path / "missing")) == ([], str(tmp_path / "missing") + ": no file")


def test_node_check_runs_it_as_a_check_of_its_own(smi, tmp_path):
    """node_check's run_checks loads gpu_host.py beside it as check "gpu-host", its data under
    that name."""
    run_tool = smi("derived__h200x8__leaked-memory")
    findings, facts, checks, data = nc.run_checks(["gpu-host"], {}, run_tool, {"leak_recheck": 0,
                                                  "dev_root": str(tmp_path)}, 60)
    assert checks["gpu-host"]["status"] == "fail"
    assert [(f["check"], f["code"]) for f in findings] == [("gpu-host", "gpu-memory-leaked")]
    assert facts == {"gpu.persistence_mode": "Enabled"} and data["gpu-host"]["pid_namespace"] == "host"
