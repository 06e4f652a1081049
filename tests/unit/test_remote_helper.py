"""scripts/_remote.py, the remote scripts' shared helpers: standard library only and Python 3.8
syntax (it runs on every target), shipped with every diagnostic job, and each helper doing what
the scripts that once kept a copy of it did."""

import os
import sys

from diagnostics.core.paths import SCRIPTS_DIR
from diagnostics.engine import bundle, execute
from tests.programs import load_script, script_imports

REMOTE = os.path.join(SCRIPTS_DIR, "_remote.py")
remote = load_script("_remote.py", "mldiag_test_remote")


def test_standard_library_only_and_python38():
    imported = script_imports(REMOTE)
    assert imported <= set(sys.stdlib_module_names), imported


def test_every_diagnostic_job_carries_it_a_run_script_job_does_not():
    with open(REMOTE, "rb") as f:
        helper = f.read()
    for name in ("ping", "gpu-status", "node-check", "stacks", "scan-log"):
        assert bundle.script_job(name).extra_files["_remote.py"] == helper, name
    # a user's script gets only what it was given (--put)
    assert "_remote.py" not in execute.script_code_job("-c", b"print(1)", (), ()).extra_files


def test_load_companion_by_path_once_and_none_for_a_missing_file(tmp_path):
    (tmp_path / "json.py").write_text("VALUE = 7\n")       # named like a standard module
    one = remote.load_companion(str(tmp_path), "json.py", "_mldiag_test_companion")
    assert one.VALUE == 7 and sys.modules["json"] is not one
    assert remote.load_companion(str(tmp_path), "json.py", "_mldiag_test_companion") is one
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "json.py").write_text("VALUE = 8\n")          # the same private name, another file
    assert remote.load_companion(str(other), "json.py", "_mldiag_test_companion").VALUE == 8
    assert remote.load_companion(str(tmp_path), "nothing.py", "_mldiag_test_nothing") is None
    (tmp_path / "broken.py").write_text("raise ValueError('x')\n")
    try:
        remote.load_companion(str(tmp_path), "broken.py", "_mldiag_test_broken")
    except ValueError:
        pass
    assert "_mldiag_test_broken" not in sys.modules


def test_find_tool_on_path_then_in_the_extra_directories(tmp_path):
    on_path, extra = tmp_path / "bin", tmp_path / "drivers"
    for d in (on_path, extra):
        d.mkdir()
    tool = extra / "nvidia-smi"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert remote.find_tool("nvidia-smi", [str(extra)], path=str(on_path)) == str(tool)
    assert remote.which("nvidia-smi", path=str(on_path)) is None
    (on_path / "nvidia-smi").mkdir()                          # a directory is no tool
    assert remote.which("nvidia-smi", path=str(on_path)) is None
    assert remote.find_tool("nope", [str(extra)], path=str(on_path)) is None


def test_the_orders_and_the_small_helpers():
    assert remote.fmt_indices([5, 0, 1, 2]) == "GPUs 0-2,5" and remote.fmt_indices([3]) == "GPU 3"
    assert remote.worst_status([{"level": "info"}, {"level": "warn"}]) == "warn"
    assert remote.worst_status([{"level": "bogus"}]) == "error" and remote.worst_status([]) == "ok"
    assert remote.exit_code({"status": "fail"}) == 2 and remote.exit_code({}) == 3
    f = remote.check_finding("nvlink", "warn", "c", "m", "monitor", gpus=[3, 1], ports=("a",))
    assert f == {"level": "warn", "code": "c", "message": "m", "action": "monitor", "check": "nvlink",
                 "gpus": [1, 3], "ports": ["a"]}
    g = dict(f, gpus=[0])
    assert remote.fold_gpus([f, g]) == [dict(f, gpus=[0, 1, 3])]


def test_merge_folds_makes_findings_that_differ_only_in_their_device_one():
    def about(device, kind, rest):
        return {"level": "warn", "code": "c", "message": str(device) + rest, kind: [device],
                "_fold": ("warn", "c", rest)}
    plain = {"level": "info", "code": "p", "message": "m"}
    out, first = remote.merge_folds([about(0, "gpus", ": hot"), plain, about(3, "gpus", ": hot"),
                                     about("mlx5_0/1", "ports", " down"), about(1, "gpus", ": cold")])
    assert [f["code"] for f in out] == ["c", "p", "c", "c"]       # each in its first one's place
    assert out[0]["gpus"] == [0, 3] and out[2]["ports"] == ["mlx5_0/1"] and out[3]["gpus"] == [1]
    assert set(first) == {("warn", "c", ": hot"), ("warn", "c", " down"), ("warn", "c", ": cold")}
    assert not any("_fold" in f for f in out)
