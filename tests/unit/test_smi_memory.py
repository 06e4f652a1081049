"""What the client remembers of each target's nvidia-smi (diagnostics/builtin/gpu_status/smi_memory.py): the
common case of gpu-status is two nvidia-smi calls once a target was seen (issue 14 goal 1).
End to end on the local target with the fake nvidia-smi (real captures), which logs each call."""

import json
import os
from pathlib import Path

import pytest

from diagnostics.builtin.gpu_status import smi_memory
from tests import programs
from tests.programs import result_of

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "fakes"


def result(target="a", **data):
    base = {"source": "nvidia-smi", "driver_version": "590.48.01", "cuda_version": "13.1",
            "gpus": [{"index": 0}], "nvidia_smi": {"fields_asked": ["index", "name", "driver_version"]}}
    base.update(data)
    return result_of("gpu-status", target, data=base)


def test_what_a_run_learnt_comes_back_as_the_targets_argument(tmp_path, monkeypatch):
    monkeypatch.setenv("MLDIAG_CACHE_DIR", str(tmp_path / "cache"))
    assert smi_memory.known_argv("a") == []
    smi_memory.remember([result("a"), result("b", driver_version="535.104.05", cuda_version=None)])
    assert json.loads(smi_memory.known_argv("a")[0][len("--known="):]) == {
        "driver": "590.48.01", "cuda": "13.1", "fields": ["index", "name", "driver_version"]}
    assert json.loads(smi_memory.known_argv("b")[0][len("--known="):])["cuda"] is None
    st = os.stat(tmp_path / "cache" / smi_memory.FILE)
    assert st.st_mode & 0o777 == 0o600 and os.stat(tmp_path / "cache").st_mode & 0o777 == 0o700
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [smi_memory.FILE]   # no temp left


@pytest.mark.parametrize("bad", [
    {"status": "error"}, {"source": "nvml"}, {"gpus": []}, {"driver_version": "590; rm -rf /"},
    {"nvidia_smi": {"fields_asked": ["index", "name,uuid"]}}, {"nvidia_smi": "x"}, {"driver_version": None}])
def test_nothing_odd_a_target_said_is_kept(tmp_path, bad):
    r = result()
    if "status" in bad:
        r.status = bad["status"]
    else:
        r.data.update(bad)
    smi_memory.remember([r], tmp_path)
    assert smi_memory.load(tmp_path) == {}


def test_a_planted_file_or_directory_is_never_used(tmp_path, monkeypatch):
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"a": {"driver": "1.0", "cuda": None, "fields": ["index"]}}))
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / smi_memory.FILE).symlink_to(secret)
    assert smi_memory.load(cache) == {}
    # a cache directory that is a link: neither read nor written through
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    smi_memory.remember([result()], link)
    assert list((tmp_path / "elsewhere").iterdir()) == []
    # someone else's file
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    (other / smi_memory.FILE).write_text(secret.read_text())
    if os.getuid() == 0:
        os.chown(other / smi_memory.FILE, 12345, 12345)
        assert smi_memory.load(other) == {}
    # garbage is no memory, and is replaced by the next good one
    (cache / smi_memory.FILE).unlink()
    (cache / smi_memory.FILE).write_text("{not json")
    assert smi_memory.load(cache) == {}
    smi_memory.remember([result()], cache)
    assert list(smi_memory.load(cache)) == ["a"]


def test_gpu_status_asks_twice_once_the_target_was_seen(tmp_path):
    """The local target with the fake nvidia-smi on its PATH: the first run asks query-gpu,
    query-compute-apps and --version at once; the second only the first two."""
    log = tmp_path / "calls.log"
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("hosts:\n  box:\n    local: true\n    env:\n"
                     f"      PATH: {FAKES}:/usr/bin:/bin\n"
                     "      MLDIAG_FAKE_NVIDIA_SMI: linux-x86_64__nvidia-h200__590.48.01\n"
                     f"      MLDIAG_FAKE_NVIDIA_SMI_LOG: {log}\n")
    env = {"MLDIAG_CACHE_DIR": str(tmp_path / "cache")}
    seen = []
    for _ in range(3):
        r = programs.mldiag("gpu-status", "--hosts-file", hosts, "-H", "box", "--json", env=env)
        assert r.returncode in (0, 1), r.stdout + r.stderr
        doc = json.loads(r.stdout)[0]
        calls = [json.loads(line)[0].split("=")[0] for line in log.read_text().splitlines()]
        log.write_text("")
        seen.append((sorted(calls), doc["data"]["cuda_version"], doc["data"]["driver_version"]))
    assert seen == [(["--query-compute-apps", "--query-gpu", "--version"], "13.1", "590.48.01")] + \
        [(["--query-compute-apps", "--query-gpu"], "13.1", "590.48.01")] * 2
