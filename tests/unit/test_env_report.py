"""env-report: run in-process and as a script, on whatever this machine has.

The tests do not assume torch is installed or absent: they ask importlib.metadata
and assert what the report must say in either case. GPU-side findings are tested
on the data they are computed from (a fake nvidia-smi, a fake /proc file, edited
data documents), since no GPU is here.
"""

import argparse
import ast
import collections
import copy
import importlib
import importlib.metadata as md
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.programs import SCRIPTS, load_script
from tests.programs import level_codes, script_imports

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "diagnostics" / "scripts" / "env_report.py"

# data.packages key -> distribution names, written out here (not read from the script)
DISTS = {
    "torch": ["torch"], "transformers": ["transformers"], "vllm": ["vllm"],
    "speculators": ["speculators"], "flash-attn": ["flash-attn", "flash_attn"],
    "flash-linear-attention": ["flash-linear-attention", "fla-core"],
    "causal-conv1d": ["causal-conv1d", "causal_conv1d"], "triton": ["triton", "pytorch-triton"],
    "deepspeed": ["deepspeed"], "accelerate": ["accelerate"], "numpy": ["numpy"],
    "safetensors": ["safetensors"], "tokenizers": ["tokenizers"],
    "huggingface-hub": ["huggingface-hub", "huggingface_hub"],
    "nvidia-nccl-cu12": ["nvidia-nccl-cu12"], "nvidia-nccl-cu13": ["nvidia-nccl-cu13"],
    "nvidia-cudnn-cu12": ["nvidia-cudnn-cu12"], "nvidia-cudnn-cu13": ["nvidia-cudnn-cu13"],
}
DATA_KEYS = ["os", "python", "packages", "driver", "gpus", "torch", "imports", "cuda_toolkit",
             "duplicates", "pip_check", "env"]
TORCH_KEYS = ["installed", "version", "imported", "import_error", "path", "debug", "cuda", "hip",
              "cudnn", "nccl", "cuda_available", "cuda_init_warning", "device_count", "devices",
              "capabilities", "arch_list"]


er = load_script("env_report.py", "mldiag_test_env_report")


def args(**kw):
    base = dict(imports="none", packages="", no_pip_check=True, timeout=30.0)
    base.update(kw)
    return argparse.Namespace(**base)


def meta_version(names):
    for n in names:
        try:
            return md.version(n)
        except md.PackageNotFoundError:
            pass
    return None


TORCH_META = meta_version(["torch"])


@pytest.fixture(scope="module")
def default_result():
    """One run with the script's own defaults (torch imported when installed, pip check)."""
    return er.run(er.build_parser().parse_args([]))


# --------------------------------------------------------------------------- the real machine

def test_stable_keys_and_versions_from_metadata():
    r = er.run(args(packages="pip,not-a-package-xyz"))
    d = r["data"]
    assert list(d) == DATA_KEYS
    assert list(d["torch"]) == TORCH_KEYS
    assert list(d["packages"]) == list(DISTS) + ["pip", "not-a-package-xyz"]
    for key, names in DISTS.items():
        assert d["packages"][key] == meta_version(names), key
    assert d["packages"]["pip"] == md.version("pip")
    assert d["packages"]["not-a-package-xyz"] is None
    assert d["python"]["version"] == "%d.%d.%d" % sys.version_info[:3]
    assert d["python"]["executable"] == sys.executable
    assert d["python"]["venv"] == (sys.prefix != sys.base_prefix)
    assert d["os"]["kernel"] == os.uname().release
    assert d["pip_check"]["error"] == "skipped (--no-pip-check)"
    assert d["imports"] == {}
    assert r["status"] in ("ok", "warn", "fail")
    assert r["summary"].startswith("python %d.%d.%d \u00b7 " % sys.version_info[:3])
    json.dumps(r)   # one JSON document


def test_default_run_reports_torch_as_metadata_says(default_result):
    d = default_result["data"]
    t = d["torch"]
    assert d["packages"]["torch"] == TORCH_META
    if TORCH_META is None:
        assert t["installed"] is False and t["imported"] is False and t["version"] is None
        assert "torch" not in d["imports"]
        assert "torch not installed" in default_result["summary"]
        return
    assert t["installed"] is True
    if not t["imported"]:   # installed but broken: that must be the finding
        assert t["import_error"]
        assert "torch-import-failed" in [f["code"] for f in default_result["findings"]]
        return
    import torch
    assert t["version"] == torch.__version__
    assert t["cuda"] == torch.version.cuda
    assert t["cuda_available"] == torch.cuda.is_available()
    assert d["imports"]["torch"]["ok"] is True
    if t["cuda"] is None:       # CPU build: no CUDA side at all
        assert t["cuda_available"] is False and t["nccl"] is None and t["device_count"] == 0
        assert "(CPU build" in default_result["summary"]
    assert ("torch %s" % t["version"]) in default_result["summary"]


def test_default_run_pip_check(default_result):
    pc = default_result["data"]["pip_check"]
    if importlib.util.find_spec("pip") is not None:
        assert pc["tool"] == "pip" and pc["error"] is None
        assert pc["ok"] is (not pc["problems"])
        codes = [f["code"] for f in default_result["findings"]]
        assert ("pip-check" in codes) == bool(pc["problems"])
    else:
        assert pc["tool"] in ("metadata", None)


def test_no_driver_here_means_no_gpu_fields():
    if os.path.exists(er.PROC_DRIVER_VERSION) or shutil.which("nvidia-smi"):
        pytest.skip("this machine has an NVIDIA driver")
    d = er.run(args())["data"]
    assert d["driver"]["version"] is None
    assert d["gpus"] == {"count": 0, "models": None, "source": None}
    assert "no NVIDIA driver" in er._summary(d)


# --------------------------------------------------------------------------- env vars

def test_env_vars_selected_and_redacted():
    environ = {
        "CUDA_VISIBLE_DEVICES": "0,1", "CUDA_HOME": "/usr/local/cuda", "NCCL_DEBUG": "INFO",
        "NCCL_IB_HCA": "mlx5_0", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "HF_HOME": "/dev/shm/hf",
        "HF_TOKEN": "hf_abcdef", "HUGGING_FACE_HUB_TOKEN": "hf_x", "VLLM_API_KEY": "sk-1",
        "VLLM_USE_V1": "1", "OMP_NUM_THREADS": "8", "TOKENIZERS_PARALLELISM": "false",
        "HF_ENDPOINT": "https://alice:s3cret@hub.internal/api", "NVIDIA_VISIBLE_DEVICES": "all",
        "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64", "PYTHONPATH": "/opt/tf457",
        "TORCH_SECRET_SAUCE": "x", "NCCL_PASSWORD": "y", "cuda_lower_private_key": "z",
        "HOME": "/root", "PATH": "/usr/bin", "AWS_SECRET_ACCESS_KEY": "nope", "OMPI_X": "no",
    }
    assert er.env_vars(environ) == collections.OrderedDict([
        ("CUDA_HOME", "/usr/local/cuda"),
        ("CUDA_VISIBLE_DEVICES", "0,1"),
        ("HF_ENDPOINT", "https://<redacted>@hub.internal/api"),
        ("HF_HOME", "/dev/shm/hf"),
        ("HF_TOKEN", "<redacted>"),
        ("HUGGING_FACE_HUB_TOKEN", "<redacted>"),
        ("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64"),
        ("NCCL_DEBUG", "INFO"),
        ("NCCL_IB_HCA", "mlx5_0"),
        ("NCCL_PASSWORD", "<redacted>"),
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("OMP_NUM_THREADS", "8"),
        ("PYTHONPATH", "/opt/tf457"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
        ("TOKENIZERS_PARALLELISM", "false"),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        ("TORCH_SECRET_SAUCE", "<redacted>"),
        ("VLLM_API_KEY", "<redacted>"),
        ("VLLM_USE_V1", "1"),
        ("cuda_lower_private_key", "<redacted>"),
    ])


def test_run_reads_the_process_environment(monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("HF_TOKEN", "hf_live_secret")
    env = er.run(args())["data"]["env"]
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["HF_TOKEN"] == "<redacted>"
    assert "hf_live_secret" not in json.dumps(er.run(args()))


# --------------------------------------------------------------------------- fake installs

def _dist(site, name, version, requires=(), module=None, module_src=None):
    """Write a minimal installed distribution (dist-info) and optionally its module."""
    info = site / ("%s-%s.dist-info" % (name.replace("-", "_"), version))
    info.mkdir(parents=True)
    meta = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)
    meta += "".join("Requires-Dist: %s\n" % r for r in requires)
    (info / "METADATA").write_text(meta)
    if module:
        pkg = site / module
        pkg.mkdir()
        (pkg / "__init__.py").write_text(textwrap.dedent(module_src or ""))


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    yield site
    for mod in ("flash_attn", "causal_conv1d", "fla"):
        sys.modules.pop(mod, None)
    importlib.invalidate_caches()


def test_broken_kernel_import_is_reported_with_its_error(fake_site):
    if meta_version(DISTS["flash-attn"]) is not None:
        pytest.skip("a real flash-attn is installed here")
    _dist(fake_site, "flash_attn", "2.8.3", module="flash_attn", module_src="""
        raise ImportError("/site/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so: undefined symbol: "
                          "_ZN3c105ErrorC2ENS_14SourceLocationESs")
    """)
    importlib.invalidate_caches()
    r = er.run(args(imports="flash-attn"))
    d = r["data"]
    assert d["packages"]["flash-attn"] == "2.8.3"
    imp = d["imports"]["flash-attn"]
    assert imp["ok"] is False and imp["module"] == "flash_attn"
    assert imp["error"].startswith("ImportError: /site/flash_attn_2_cuda")
    (f,) = [f for f in r["findings"] if f["code"] == "import-failed"]
    assert f["level"] == "warn"
    assert f["message"].startswith("flash-attn 2.8.3 is installed but `import flash_attn` fails: "
                                   "ImportError: /site/flash_attn_2_cuda")
    assert "reinstall flash-attn for this torch" in f["hint"]


def test_empty_import_error_is_reported_by_repr(fake_site):
    if meta_version(DISTS["causal-conv1d"]) is not None:
        pytest.skip("a real causal-conv1d is installed here")
    _dist(fake_site, "causal_conv1d", "1.5.2", module="causal_conv1d",
          module_src="raise RuntimeError()\n")
    importlib.invalidate_caches()
    d = er.run(args(imports="causal-conv1d"))["data"]
    assert d["imports"]["causal-conv1d"]["error"] == "RuntimeError()"


def test_shadowed_module_version_mismatch(fake_site):
    if meta_version(DISTS["causal-conv1d"]) is not None:
        pytest.skip("a real causal-conv1d is installed here")
    _dist(fake_site, "causal_conv1d", "1.5.2", module="causal_conv1d",
          module_src="__version__ = '1.4.0'\n")
    importlib.invalidate_caches()
    r = er.run(args(imports="causal-conv1d"))
    imp = r["data"]["imports"]["causal-conv1d"]
    assert (imp["ok"], imp["version"], imp["path"]) == (True, "1.4.0", str(fake_site / "causal_conv1d"))
    (f,) = [f for f in r["findings"] if f["code"] == "import-version-mismatch"]
    assert f["message"] == ("`import causal_conv1d` loads version 1.4.0 from %s but the installed "
                            "distribution is 1.5.2: another copy shadows it" % (fake_site / "causal_conv1d"))


def test_duplicate_distributions(tmp_path, monkeypatch):
    if meta_version(["speculators"]) is not None:
        pytest.skip("a real speculators is installed here")
    a, b = tmp_path / "a", tmp_path / "b"
    _dist(a, "speculators", "0.3.0")
    _dist(b, "speculators", "0.2.1")
    monkeypatch.syspath_prepend(str(b))
    monkeypatch.syspath_prepend(str(a))
    r = er.run(args())
    assert r["data"]["packages"]["speculators"] == "0.3.0"        # the first on sys.path wins
    assert r["data"]["duplicates"]["speculators"] == [
        {"version": "0.3.0", "location": str(a)}, {"version": "0.2.1", "location": str(b)}]
    (f,) = [f for f in r["findings"] if f["code"] == "duplicate-package"]
    assert f["message"] == ("installed more than once on sys.path (the first one wins): "
                            "speculators 0.3.0 (%s) and 0.2.1 (%s)" % (a, b))


def test_metadata_check_without_pip(tmp_path):
    pytest.importorskip("packaging")
    site = tmp_path / "site"
    _dist(site, "pkg-a", "1.0", requires=["pkg-b>=2", "pkg-c", "pkg-d; python_version < '3'",
                                         "pkg-e; extra == 'fast'"])
    _dist(site, "pkg-b", "1.5")
    assert er.metadata_check(path=[str(site)]) == [
        "pkg-a 1.0 has requirement pkg-b>=2, but you have pkg-b 1.5.",
        "pkg-a 1.0 requires pkg-c, which is not installed.",
    ]


def test_pip_not_available_falls_back(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(er.importlib.util, "find_spec",
                        lambda name, *a: None if name == "pip" else real(name, *a))
    assert er.start_pip_check() is None
    pc = er.finish_pip_check(None, 10)
    if importlib.util.find_spec("packaging") is not None:
        assert pc["tool"] == "metadata" and pc["error"] is None
    else:
        assert pc == {"tool": None, "ok": None, "problems": [], "error": "pip not available"}


# --------------------------------------------------------------------------- driver and GPUs

def _fake_smi(tmp_path, body):
    d = tmp_path / "bin"
    d.mkdir()
    smi = d / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(0o755)
    return smi


def test_gpu_models_from_nvidia_smi(tmp_path, monkeypatch):
    smi = _fake_smi(tmp_path, 'printf "0, NVIDIA H200, 570.133.20\\n1, NVIDIA H200, 570.133.20\\n'
                              '2, NVIDIA H100 80GB HBM3, 570.133.20\\n"\n')
    monkeypatch.setattr(er, "PROC_DRIVER_VERSION", str(tmp_path / "missing"))
    driver = er.driver_info(10)
    driver["nvidia_smi"] = str(smi)
    gpus = er.gpu_info(driver, 10)
    assert gpus == {"count": 3, "models": "2\u00d7 NVIDIA H200, 1\u00d7 NVIDIA H100 80GB HBM3",
                    "source": "nvidia-smi"}
    assert (driver["version"], driver["source"]) == ("570.133.20", "nvidia-smi")


def test_driver_library_mismatch_is_a_finding(tmp_path, monkeypatch):
    smi = _fake_smi(tmp_path, 'echo "Failed to initialize NVML: Driver/library version mismatch"\n'
                              'echo "NVML library version: 570.172"\nexit 18\n')
    monkeypatch.setenv("PATH", str(smi.parent) + os.pathsep + os.environ["PATH"])
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  "
                       "Release Build  (dvs-builder@U16-I3-B14-4-1)  Fri Mar 21 00:19:48 UTC 2026\n"
                       "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    monkeypatch.setattr(er, "PROC_DRIVER_VERSION", str(version))
    r = er.run(args())
    drv = r["data"]["driver"]
    assert (drv["version"], drv["kernel_module"], drv["source"]) == ("570.133.20", "open", str(version))
    assert drv["nvidia_smi_error"] == "exit 18: Failed to initialize NVML: Driver/library version mismatch"
    (f,) = [f for f in r["findings"] if f["code"] == "driver-mismatch"]
    assert f["level"] == "fail"
    assert "driver 570.133.20" in r["summary"]


def test_proprietary_driver_version_file(tmp_path, monkeypatch):
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n")
    monkeypatch.setattr(er, "PROC_DRIVER_VERSION", str(version))
    drv = er.driver_info(10)
    assert (drv["version"], drv["kernel_module"]) == ("535.183.01", "proprietary")


def test_gpu_models_from_proc_when_nvidia_smi_is_missing(tmp_path, monkeypatch):
    for i, bus in enumerate(["0000:18:00.0", "0000:3b:00.0"]):
        d = tmp_path / "gpus" / bus
        d.mkdir(parents=True)
        (d / "information").write_text("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 7%d\n" % i)
    monkeypatch.setattr(er, "PROC_GPU_INFO_GLOB", str(tmp_path / "gpus" / "*" / "information"))
    gpus = er.gpu_info({"nvidia_smi": None, "version": "570.133.20"}, 10)
    assert gpus == {"count": 2, "models": "2\u00d7 NVIDIA H100 80GB HBM3", "source": str(tmp_path / "gpus")}


@pytest.mark.parametrize("value, text", [(91002, "9.10.2"), (90100, "9.1.0"), (8902, "8.9.2"), (None, None)])
def test_cudnn_version_text(value, text):
    assert er._cudnn_text(value) == text


@pytest.mark.parametrize("arch_list, cap, ok", [
    (["sm_80", "sm_86", "sm_90"], "9.0", True),
    (["sm_80", "sm_86", "sm_90"], "8.9", True),          # sm_86 SASS runs on 8.9
    (["sm_80", "sm_86", "sm_90"], "10.0", False),        # B200 on a cu12.4 build
    (["sm_80", "sm_90", "compute_90"], "12.0", True),    # PTX JIT
    (["sm_90a"], "9.0", True),
    (["sm_90a"], "10.0", False),
    (["sm_100", "sm_120"], "12.0", True),
    ([], "9.0", True),
])
def test_arch_coverage(arch_list, cap, ok):
    assert er._arch_covers(arch_list, cap) is ok


# --------------------------------------------------------------------------- findings on edited data

_BASE = []


def _gpu_box_data():
    """A data document as a CUDA box would give it (from this machine's, edited)."""
    if not _BASE:
        _BASE.append(er.run(args())["data"])
    d = copy.deepcopy(_BASE[0])
    d["packages"].update(torch="2.9.1+cu128", transformers="4.57.1", vllm=None)
    d["torch"].update(installed=True, version="2.9.1+cu128", imported=True, cuda="12.8",
                      cudnn="9.10.2", nccl="2.27.3", cuda_available=True, device_count=8,
                      devices="8\u00d7 NVIDIA H200", capabilities=["9.0"],
                      arch_list=["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
    d["driver"].update(version="570.133.20", cuda_driver_api="12.8", nvidia_smi="/usr/bin/nvidia-smi")
    d["gpus"].update(count=8, models="8\u00d7 NVIDIA H200", source="nvidia-smi")
    d["imports"] = {"torch": {"module": "torch", "ok": True, "error": None,
                              "version": "2.9.1+cu128", "path": "/opt/venv/lib/torch",
                              "warnings": []}}
    d["duplicates"] = {}
    d["pip_check"] = {"tool": "pip", "ok": True, "problems": [], "error": None}
    d["env"] = {}
    return d


def codes(d):
    """(level, code) of what env-report finds in its data ``d``."""
    return level_codes(er.findings_for(d))


def test_healthy_gpu_box_has_no_findings():
    d = _gpu_box_data()
    assert codes(d) == []
    assert er._summary(d).split(" \u00b7 ", 1)[1] == (
        "torch 2.9.1+cu128 (CUDA 12.8, cuDNN 9.10.2, NCCL 2.27.3) \u00b7 driver 570.133.20 \u00b7 "
        "8\u00d7 NVIDIA H200 \u00b7 transformers 4.57.1")


def test_cuda_unavailable_with_driver_present():
    d = _gpu_box_data()
    d["torch"].update(cuda_available=False, device_count=0,
                      cuda_init_warning="CUDA initialization: Unexpected error from cudaGetDeviceCount()")
    d["env"] = {"CUDA_VISIBLE_DEVICES": ""}
    (f,) = er.findings_for(d)
    assert (f["level"], f["code"]) == ("fail", "cuda-unavailable")
    assert f["message"] == ("torch 2.9.1+cu128 is a CUDA 12.8 build and an NVIDIA driver is present, "
                            "but torch.cuda.is_available() is False: CUDA initialization: Unexpected "
                            "error from cudaGetDeviceCount() (CUDA_VISIBLE_DEVICES='')")


def test_cuda_build_without_driver():
    d = _gpu_box_data()
    d["torch"].update(cuda_available=False, device_count=0, capabilities=None)
    d["driver"].update(version=None, cuda_driver_api=None)
    d["gpus"].update(count=0, models=None, source=None)
    assert codes(d) == [("warn", "no-driver")]


def test_driver_too_old_for_the_torch_cuda_major():
    d = _gpu_box_data()
    d["torch"].update(cuda="13.0", cuda_available=False, device_count=0)
    d["driver"].update(version="550.54.15", cuda_driver_api="12.4")
    assert codes(d) == [("fail", "cuda-unavailable"), ("fail", "driver-too-old")]
    msg = er.findings_for(d)[1]["message"]
    assert msg == "torch 2.9.1+cu128 needs CUDA 13.0 but driver 550.54.15 supports CUDA 12.4 at most"


def test_minor_cuda_difference_is_not_a_finding():
    d = _gpu_box_data()
    d["driver"].update(cuda_driver_api="12.4")
    assert codes(d) == []


def test_arch_unsupported():
    d = _gpu_box_data()
    d["torch"].update(capabilities=["10.0"], arch_list=["sm_80", "sm_86", "sm_90"])
    (f,) = er.findings_for(d)
    assert (f["code"], f["message"]) == (
        "arch-unsupported",
        "torch 2.9.1+cu128 has no kernels for compute capability 10.0 (built for sm_80 sm_86 sm_90)")


def test_torch_import_failure_is_fail():
    d = _gpu_box_data()
    d["torch"].update(imported=False, import_error="OSError: libcudnn.so.9: cannot open shared object file",
                      cuda=None, cuda_available=None)
    d["imports"]["torch"].update(ok=False, error=d["torch"]["import_error"], version=None)
    assert codes(d) == [("fail", "torch-import-failed")]
    assert er._summary(d).split(" \u00b7 ")[1] == "torch 2.9.1+cu128 (import fails)"


def test_pip_check_problems_are_one_warning():
    d = _gpu_box_data()
    d["pip_check"] = {"tool": "pip", "ok": False, "error": None, "problems": [
        "vllm 0.11.0 has requirement torch==2.8.0, but you have torch 2.9.1.",
        "speculators 0.2.0 requires pydantic-settings, which is not installed."]}
    (f,) = er.findings_for(d)
    assert (f["level"], f["code"]) == ("warn", "pip-check")
    assert f["message"] == ("2 broken requirements: vllm 0.11.0 has requirement torch==2.8.0, but you "
                            "have torch 2.9.1. | speculators 0.2.0 requires pydantic-settings, which "
                            "is not installed.")


# --------------------------------------------------------------------------- as a script

def test_script_parses_as_python38_and_stands_alone():
    tree = ast.parse(SCRIPT.read_text(), feature_version=(3, 8))
    top = script_imports(SCRIPT, module_level=True)
    if hasattr(sys, "stdlib_module_names"):
        assert top <= set(sys.stdlib_module_names) | {"__future__", "_remote"}, top
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("diagnostics")
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("diagnostics") for a in node.names)


def test_help_runs_standalone():
    p = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True,
                       timeout=30, cwd="/")
    assert p.returncode == 0
    for flag in ("--imports", "--packages", "--no-pip-check", "--timeout"):
        assert flag in p.stdout


def test_bad_imports_value_is_a_usage_error():
    p = subprocess.run([sys.executable, str(SCRIPT), "--imports", "torch,nope"],
                       capture_output=True, text=True, timeout=30, cwd="/")
    assert p.returncode == 2 and "unknown or not importable: nope" in p.stderr


def test_runs_for_real_as_a_script():
    env = dict(os.environ, HF_TOKEN="hf_should_not_leak")
    p = subprocess.run([sys.executable, str(SCRIPT), "--imports", "none", "--no-pip-check"],
                       capture_output=True, text=True, timeout=60, cwd="/", env=env)
    doc = json.loads(p.stdout)
    assert p.returncode == {"ok": 0, "warn": 1, "fail": 2}[doc["status"]]
    assert list(doc["data"]) == DATA_KEYS
    assert doc["data"]["env"]["HF_TOKEN"] == "<redacted>"
    assert "hf_should_not_leak" not in p.stdout


def test_runs_under_python38_when_available():
    from tests.pythons import require_python
    py = require_python("3.8")
    p = subprocess.run([py, str(SCRIPT), "--imports", "none", "--no-pip-check"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    doc = json.loads(p.stdout)
    assert doc["data"]["python"]["version"].startswith("3.8.")


def test_same_version_twice_is_listed_but_not_a_finding(tmp_path, monkeypatch):
    if meta_version(["speculators"]) is not None:
        pytest.skip("a real speculators is installed here")
    a, b = tmp_path / "a", tmp_path / "b"
    _dist(a, "speculators", "0.3.0")
    _dist(b, "speculators", "0.3.0")
    monkeypatch.syspath_prepend(str(b))
    monkeypatch.syspath_prepend(str(a))
    r = er.run(args())
    assert len(r["data"]["duplicates"]["speculators"]) == 2
    assert not [f for f in r["findings"] if "speculators" in f["message"]]


def test_import_warnings_are_kept(fake_site):
    if meta_version(DISTS["flash-linear-attention"]) is not None:
        pytest.skip("a real flash-linear-attention is installed here")
    _dist(fake_site, "flash-linear-attention", "0.3.2", module="fla", module_src="""
        import warnings
        warnings.warn("Failed to initialize NumPy: _ARRAY_API not found", UserWarning)
        print("fla banner on stdout")
        __version__ = "0.3.2"
    """)
    importlib.invalidate_caches()
    r = er.run(args(imports="flash-linear-attention"))
    imp = r["data"]["imports"]["flash-linear-attention"]
    assert imp["ok"] is True and imp["version"] == "0.3.2"
    assert imp["warnings"] == ["UserWarning: Failed to initialize NumPy: _ARRAY_API not found"]
    assert [f["code"] for f in r["findings"] if "fla" in f["message"]] == []


def _write_dist(where, dirname, name, version, direct_url=None):
    meta = where / dirname
    meta.mkdir(parents=True)
    (meta / ("PKG-INFO" if dirname.endswith(".egg-info") else "METADATA")).write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if direct_url is not None:
        (meta / "direct_url.json").write_text(json.dumps(direct_url))


def _duplicates_seen_by_a_python_on(paths):
    """env-report's duplicates() in a python whose sys.path is ``paths`` (+ the stdlib only)."""
    code = ("import sys, json; sys.path[:0] = json.loads(sys.argv[1]); sys.path.insert(0, sys.argv[2]); "
            "import env_report as e; print(json.dumps(e.duplicates(e.installed_distributions())))")
    out = subprocess.run([sys.executable, "-S", "-c", code, json.dumps([str(p) for p in paths]),
                          str(SCRIPTS)], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def test_an_editable_install_seen_from_its_source_dir_is_not_a_duplicate(tmp_path):
    """``pip install -e DIR`` leaves DIR/NAME.egg-info; run from DIR (or with DIR on PYTHONPATH)
    both it and site-packages' dist-info are on sys.path: one install, not two copies."""
    site, src = tmp_path / "site", tmp_path / "src"
    _write_dist(site, "proj-0.1.0.dist-info", "proj", "0.1.0",
          {"url": src.as_uri(), "dir_info": {"editable": True}})
    _write_dist(src, "proj.egg-info", "proj", "0.1.0")
    assert _duplicates_seen_by_a_python_on([site, src]) == {}
    # two real copies are still two
    other = tmp_path / "other"
    _write_dist(other, "proj-0.0.9.dist-info", "proj", "0.0.9")
    found = _duplicates_seen_by_a_python_on([site, src, other])
    assert [c["version"] for c in found["proj"]] == ["0.1.0", "0.0.9"]
