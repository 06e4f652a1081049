"""node-check's clock measurement and hosts.yaml ``paths:`` through the real lab: `mldiag
node-check` → ssh main → sudo → pct 210/211 (LXC) → /usr/bin/python3, as test_node_check.py.

- Clocks: the CTs share this machine's kernel clock, so their true offset is 0: the bracket
  mldiag reports must hold 0. One more target on CT 210 runs node-check under libfaketime
  (the PyPI ``libfaketime`` wheel's libfaketime.so.1, pushed into the CT, named by the target's
  ``env: LD_PRELOAD``: the runtime execs a fresh interpreter for such an env), its wall clock
  really 30 s ahead: mldiag must find it there, within its bound, and name it.
- Paths: directories inside CT 210 (one with spaces in its name), one missing, a file; the free
  space node-check reports is held to what ``stat -f`` says in the CT.
"""

import base64
import importlib.util
import json
import os
import re
from functools import partial
from pathlib import Path

import pytest

from tests import programs
from tests.integration.test_node_check import H200, PY
SHIFT_S = 30.0
FAKETIME_DIR = "/run/mldiag-test-faketime"
# what libfaketime.so.1 links that the lab's minimal rootfs (tests/lab/rootfs.py: this machine's
# libraries, only those its binaries need) leaves out: this machine's own, the same glibc
FAKETIME_NEEDS = ("libdl.so.2", "librt.so.1")
LIB_DIR = "/lib/x86_64-linux-gnu"
SPACED = "/run/mldiag test paths/my ckpt"

mldiag = partial(programs.mldiag, timeout=180)


def ct(vmid, paths=None, **env):
    """One of the lab's node CTs as a target, healthy GPUs (the fake nvidia-smi's capture)."""
    return {"runtime": "pct", "id": str(vmid), "python": PY, "env": {"MLDIAG_FAKE_NVIDIA_SMI": H200, **env},
            **({"paths": paths} if paths else {})}


def hosts(lab, **containers):
    """A hosts.yaml (JSON is YAML) with ``containers`` on the lab's pve host (ssh main, sudo)."""
    return lab.hosts_yaml(json.dumps({"defaults": {"connect_timeout": 5, "timeout": 120}, "hosts": {
        "pve": {"address": "main", "become": "sudo", "containers": containers}}}, indent=1))


def in_ct(lab, vmid, script, input=None):
    for attempt in range(3):
        r = lab.ssh("main", "sudo", "-n", "pct", "exec", str(vmid), "--", "/bin/sh", "-c",
                    "'" + script.replace("'", "'\\''") + "'", input=input)
        # NOTE: lxc-attach re-executes itself from a sealed memfd first; once in CI the seal
        # failed (EBUSY: "Failed to rexec as memfd") and lxc-attach aborted in its error path
        # (exit 134) before the command ran. LXC's own transient failure: the command again.
        if not (r.returncode == 134 and "Failed to rexec as memfd" in r.stderr):
            break
    assert r.returncode == 0, (script, r.stdout, r.stderr)
    return r.stdout


def docs_of(r):
    assert "Traceback" not in r.stderr, r.stderr
    return {d["target"]: d for d in json.loads(r.stdout)}


def libfaketime():
    """The PyPI libfaketime wheel's own libfaketime.so.1 (the test extra installs it)."""
    spec = importlib.util.find_spec("libfaketime")
    if spec is None or not spec.submodule_search_locations:
        why = "libfaketime is not installed (pip install libfaketime: the test extra)"
        if os.environ.get("CI") == "true":     # no tier CI skips
            pytest.fail(why)
        pytest.skip(why)
    so = Path(list(spec.submodule_search_locations)[0]) / "vendor" / "libfaketime" / "src" / "libfaketime.so.1"
    assert so.is_file(), so
    return so


@pytest.fixture(scope="module")
def faketime_in_ct(lab, node_cts):
    """The env that runs a process in CT 210 with libfaketime loaded (``FAKETIME`` to add)."""
    files = {"libfaketime.so.1": libfaketime()}
    files.update((name, Path(LIB_DIR) / name) for name in FAKETIME_NEEDS)
    in_ct(lab, 210, f"mkdir -p {FAKETIME_DIR}")
    try:
        for name, source in files.items():
            # the CT's rootfs has no base64: its python3 writes the file
            in_ct(lab, 210, f'{PY} -c "import base64, sys; open(sys.argv[1], \'wb\').write(base64.b64decode('
                            f'sys.stdin.read()))" {FAKETIME_DIR}/{name}',
                  input=base64.b64encode(source.read_bytes()).decode())
        yield {"LD_PRELOAD": f"{FAKETIME_DIR}/libfaketime.so.1", "LD_LIBRARY_PATH": FAKETIME_DIR,
               "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    finally:
        in_ct(lab, 210, f"rm -rf {FAKETIME_DIR}")


def clock_codes(doc):
    return [f["code"] for f in doc["findings"] if f["code"].startswith("clock-")]


def test_the_lab_nodes_at_zero_and_one_really_30_s_ahead(lab, node_cts, faketime_in_ct):
    shifted = {**faketime_in_ct, "FAKETIME": f"+{SHIFT_S:g}s"}
    # the CT itself first: libfaketime really moves the clock a process there reads
    now = f'{PY} -c "import time; print(time.time())"'
    moved = float(in_ct(lab, 210, " ".join(f"{k}={v}" for k, v in shifted.items()) + " " + now))
    plain = float(in_ct(lab, 210, now))            # a call later: a fraction of a second
    assert abs(moved - plain - SHIFT_S) < 1.0, (moved, plain)
    path = hosts(lab, **{"clock-a": ct(210), "clock-b": ct(211), "clock-c": ct(210),
                         "clock-ahead": ct(210, **shifted)})
    r = mldiag("node-check", "--hosts-file", str(path), "-H", "clock-a,clock-b,clock-c,clock-ahead",
               "--no-dcgm", "--json")
    docs = docs_of(r)
    for name in ("clock-a", "clock-b", "clock-c"):
        measured = docs[name]["data"]["clock_offset"]
        # the true offset is 0 (one kernel clock): the bracket holds it, and claims no more
        assert abs(measured["offset_s"]) <= measured["bound_s"] + 1e-4, (name, measured)
        assert 0 < measured["bound_s"] < 2.0, (name, measured)
        assert clock_codes(docs[name]) == [], docs[name]["findings"]
        print(f"{name}: offset {measured['offset_s']:+.4f} s ± {measured['bound_s']:.4f} s "
              f"(the run {docs[name]['data']['clock']['run_s']:.3f} s on the node, "
              f"{measured['received_s'] - measured['sent_s']:.3f} s here)")
    ahead = docs["clock-ahead"]
    measured = ahead["data"]["clock_offset"]
    assert abs(measured["offset_s"] - SHIFT_S) <= measured["bound_s"] + 1e-4, measured
    print(f"clock-ahead: offset {measured['offset_s']:+.4f} s ± {measured['bound_s']:.4f} s; "
          f"spread {measured['nodes_spread_s']:.3f} s ± {measured['nodes_spread_bound_s']:.3f} s")
    assert abs(measured["nodes_spread_s"] - SHIFT_S) <= measured["nodes_spread_bound_s"] + 1e-4, measured
    assert clock_codes(ahead) == ["clock-offset", "clock-skew"], ahead["findings"]
    found = {f["code"]: f for f in ahead["findings"]}
    assert (found["clock-offset"]["level"], found["clock-offset"]["action"]) == ("warn", "monitor")
    said = re.fullmatch(r"the clock is ([0-9.]+) s ahead of this machine's \(± ([0-9.]+) s, measured by mldiag\)",
                        found["clock-offset"]["message"])
    assert said, found["clock-offset"]
    assert (float(said[1]), float(said[2])) == (pytest.approx(measured["offset_s"], abs=0.0011),
                                                pytest.approx(measured["bound_s"], abs=0.0011))
    assert "of the median of the 4 nodes measured" in found["clock-skew"]["message"]
    assert ahead["status"] in ("warn", "fail") and ahead["data"]["worst_action"] != "none"


def test_paths_free_space_missing_and_not_a_directory_in_a_ct(lab, node_cts):
    in_ct(lab, 210, f"mkdir -p '{SPACED}'")
    try:
        paths = {"ckpt": {"path": SPACED, "min_free_gb": 0.001},
                 "huge": {"path": os.path.dirname(SPACED), "min_free_gb": 1e9},
                 "data": "/nonexistent/datasets",
                 "weights": {"path": "/etc/os-release", "min_free_gb": 1}}
        path = hosts(lab, **{"paths-a": ct(210, paths=paths)})
        r = mldiag("node-check", "--hosts-file", str(path), "-H", "paths-a", "--no-dcgm", "--json")
        doc = docs_of(r)["paths-a"]
        # what the CT's own stat -f says of that directory, read right after
        avail, size, blocks = map(int, in_ct(lab, 210, f"stat -f -c '%a %S %b' '{SPACED}'").split())
    finally:
        in_ct(lab, 210, f"rm -rf '{os.path.dirname(SPACED)}'")
    got = {p["name"]: p for p in doc["data"]["host"]["paths"]}
    assert got["ckpt"]["path"] == SPACED and got["ckpt"]["state"] == "ok", got
    assert got["ckpt"]["total_gb"] == pytest.approx(blocks * size / 1e9, abs=0.002), (got, blocks, size)
    assert got["ckpt"]["free_gb"] == pytest.approx(avail * size / 1e9, rel=0.01, abs=0.05), (got, avail, size)
    assert (got["data"]["state"], got["weights"]["state"]) == ("missing", "not-a-directory"), got
    found = sorted((f["code"], f["level"], f["action"]) for f in doc["findings"] if f["code"].startswith("path-"))
    assert found == [("path-low-space", "warn", "monitor"), ("path-missing", "warn", "monitor"),
                     ("path-missing", "warn", "monitor")], doc["findings"]
    low = next(f for f in doc["findings"] if f["code"] == "path-low-space")
    assert low["message"].startswith("hosts.yaml path huge (/run/mldiag test paths) has "), low
    print(f"paths-a: {SPACED!r} {got['ckpt']['free_gb']:.3f} GB free of {got['ckpt']['total_gb']:.3f} GB "
          f"(stat -f in the CT: {avail * size / 1e9:.3f} of {blocks * size / 1e9:.3f})")
