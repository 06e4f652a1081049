"""node-check's gpu-host check inside real containers (issue 34 item 5, "inside a container: the
GPUs visible against the ones given to it"): `mldiag node-check` → ssh main (user mlsh) → sudo →
pct → an LXC CT of the lab's, made here for these tests, whose GPUs are

- /dev/nvidiaN: device nodes bind-mounted from /dev/null (character devices 1:3, as the lab's
  Slurm GRES devices are made), one per GPU the CT was given -- or one fewer;
- NVIDIA_VISIBLE_DEVICES in the CT's init environment (lxc.environment), where the NVIDIA
  container runtime puts the list it was given;
- nvidia-smi: the fake answering the 8x H200 captures (tests/fakes/nvidia-smi).

The CT has its own PID namespace, as every LXC CT does: memory nvidia-smi shows in use with no
process listed is not called leaked there (the processes may be the host's); on the lab's host
itself (target `main`, ssh) the same is a leak."""

import json
import textwrap
from functools import partial

import pytest

from tests import programs
from tests.lab import lxc

mldiag = partial(programs.mldiag, timeout=180)
GIVEN = "0,1,2,3,4,5,6,7"
# VMIDs of these tests' own CTs (the lab's are 200/201 and the node-check CTs 210/211)
ALL_NODES, ONE_MISSING = 236, 237


def ct_lines(nodes):
    lines = [f"lxc.mount.entry = /dev/null dev/nvidia{n} none bind,create=file 0 0" for n in nodes]
    lines.append(f"lxc.environment = NVIDIA_VISIBLE_DEVICES={GIVEN}")
    return lines


@pytest.fixture(scope="module")
def gpu_cts(lab):
    lab.need("lxc")
    made = []
    try:
        for vmid, nodes in ((ALL_NODES, range(8)), (ONE_MISSING, [0, 1, 2, 3, 4, 6, 7])):
            lxc.destroy(lab.lxc_path, vmid)              # a CT a killed run left behind
            lxc.define(lab.lxc_path, vmid, lab.rootfs, lab._binds(),
                       {"/usr/bin/nvidia-smi": str(lab.fakes_dir / "nvidia-smi")},
                       extra_lines=ct_lines(nodes), hostname=f"gpu-ct{vmid}")
            made.append(vmid)
            lxc.start(lab.lxc_path, vmid, lab.dir / f"lxc-{vmid}.log")
        yield made
    finally:
        for vmid in made:
            lxc.destroy(lab.lxc_path, vmid)


def target(name, vmid, capture="derived__h200x8__healthy", **env):
    fields = {"runtime": "pct", "id": str(vmid), "python": "/usr/bin/python3",
              "env": {"MLDIAG_FAKE_NVIDIA_SMI": capture, **env}}
    return f"      {name}: {json.dumps(fields)}\n"


@pytest.fixture(scope="module")
def hosts(lab, gpu_cts):
    # `main` itself (ssh, no container): the lab's sshd runs in this machine's PID namespace
    host = ('  main-leaked: {address: main, env: {MLDIAG_FAKE_NVIDIA_SMI: derived__h200x8__leaked-memory}}\n')
    return lab.hosts_yaml(programs.PCT_HOSTS_HEAD.replace("hosts:\n", "hosts:\n" + host) + "".join([
        target("given-8-has-8", ALL_NODES),
        target("given-8-has-7", ONE_MISSING),
        target("cuda-names-8", ALL_NODES, CUDA_VISIBLE_DEVICES="0,8,1"),
        target("held-elsewhere", ALL_NODES, capture="derived__h200x8__pid-namespace"),
    ]))


def gpu_host(hosts, *names):
    r = mldiag("node-check", "--hosts-file", hosts, "-H", ",".join(names), "--no-dcgm", "--json")
    assert "Traceback" not in r.stderr, r.stderr
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    assert set(docs) == set(names), r.stdout + r.stderr
    return docs


def codes(doc):
    return [(f["code"], f["level"], f["action"]) for f in doc["findings"] if f["check"] == "gpu-host"]


PROBE = textwrap.dedent("""\
    import json, os, re
    nodes = sorted(n for n in os.listdir("/dev") if re.match(r"nvidia[0-9]+$", n))
    kinds = ["%d:%d" % (os.major(os.stat("/dev/" + n).st_rdev), os.minor(os.stat("/dev/" + n).st_rdev))
             for n in nodes if os.path.exists("/dev/" + n)]
    print(json.dumps([nodes, kinds, open("/proc/1/environ").read()]))
""")


def test_the_cts_are_what_they_say(lab, gpu_cts):
    """The lab's part, without mldiag: device nodes, the runtime's list in PID 1's environment."""
    for vmid, want in ((ALL_NODES, 8), (ONE_MISSING, 7)):
        r = lxc.attach(lab.lxc_path, vmid, ["/usr/bin/python3", "-c", PROBE])
        nodes, kinds, init_env = json.loads(r.stdout)
        assert len(nodes) == want and set(kinds) == {"1:3"}, r.stdout
        lines = init_env.split("\0")
        assert f"NVIDIA_VISIBLE_DEVICES={GIVEN}" in lines and "container=lxc" in lines, r.stdout


def test_given_eight_gpus_with_seven_device_nodes(hosts):
    docs = gpu_host(hosts, "given-8-has-8", "given-8-has-7")
    ok, bad = docs["given-8-has-8"], docs["given-8-has-7"]
    assert codes(ok) == [] and ok["data"]["checks"]["gpu-host"]["status"] == "ok", ok["findings"]
    container = ok["data"]["gpu-host"]["container"]
    assert (container["kind"], container["nvidia_visible_devices"], container["device_nodes"],
            container["listed"]) == ("lxc", GIVEN, list(range(8)), 8), container
    assert codes(bad) == [("container-gpu-mismatch", "fail", "app")], bad["findings"]
    (f,) = [f for f in bad["findings"] if f["check"] == "gpu-host"]
    assert f["message"] == (
        "inside this lxc container the GPUs do not agree: the NVIDIA runtime was given 8 "
        "(NVIDIA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7); 7 device nodes (/dev/nvidia0, /dev/nvidia1, "
        "/dev/nvidia2, /dev/nvidia3, /dev/nvidia4, /dev/nvidia6, /dev/nvidia7); nvidia-smi lists 8")
    assert bad["data"]["worst_action"] in ("app", "reboot", "drain", "rma"), bad["data"]["worst_action"]


def test_cuda_visible_devices_and_memory_held_outside(hosts):
    docs = gpu_host(hosts, "cuda-names-8", "held-elsewhere")
    cuda = docs["cuda-names-8"]
    assert codes(cuda) == [("cuda-visible-devices", "fail", "app")], cuda["findings"]
    (f,) = [f for f in cuda["findings"] if f["check"] == "gpu-host"]
    assert f["message"] == ("CUDA_VISIBLE_DEVICES=0,8,1 (this process) names '8', which is not one of the "
                            "8 GPUs here: CUDA ignores it and every entry after it")
    # 60 GiB in use on every GPU and no process listed: from the CT's own PID namespace that is
    # memory of processes it cannot see, not a leak
    held = docs["held-elsewhere"]
    assert held["data"]["gpu-host"]["pid_namespace"] == "own", held["data"]["gpu-host"]
    assert codes(held) == [], held["findings"]
    assert [m["used_mib"] for m in held["data"]["gpu-host"]["memory"]] == [61440] * 8


def test_memory_held_by_no_process_on_the_host(hosts):
    doc = gpu_host(hosts, "main-leaked")["main-leaked"]
    data = doc["data"]["gpu-host"]
    assert data["pid_namespace"] == "host", data
    leaked = [f for f in doc["findings"] if f["code"] == "gpu-memory-leaked"]
    assert [(f["level"], f["action"], f["gpus"], f["message"]) for f in leaked] == [
        ("fail", "reset-gpu", [3], "GPU 3: 71.0 GiB in use and no live process holds it: nvidia-smi lists "
                                   "no process on it")], doc["findings"]
    assert data["memory"] == [{"gpu": 3, "used_mib": 72704, "processes": []}]
