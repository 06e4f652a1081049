#!/usr/bin/env python3
"""env-report: what this Python environment is made of -- a collect_env superset.

Covers what PyTorch's and vLLM's ``collect_env`` report (OS, Python, torch with
its CUDA runtime, cuDNN and NCCL, NVIDIA driver, GPU models, CUDA toolkit,
relevant environment variables) plus the ML packages that break together:
transformers, vllm, speculators, flash-attn, flash-linear-attention,
causal-conv1d, triton, deepspeed, accelerate, numpy, safetensors, tokenizers,
huggingface-hub and the NCCL/cuDNN wheels.

* Versions come from package metadata (``importlib.metadata``): no pip, no import.
  ``data.packages`` has one key per package, its version or null.
* Some packages are also imported (``--imports``; by default torch and the
  compiled kernels -- flash-attn, flash-linear-attention, causal-conv1d -- whose
  imports fail when they were built for another torch); a failing import is
  reported with its error, the version from metadata stays.
* ``pip check`` problems (``python -m pip check`` when pip is importable, else
  the same check from metadata with ``packaging`` when that is importable).
* Environment variables with the prefixes CUDA, NCCL, TORCH, PYTORCH, HF_,
  HUGGINGFACE/HUGGING_FACE, VLLM, OMP_, NVIDIA_, CUDNN, CUBLAS, TRANSFORMERS_,
  TOKENIZERS_, TRITON_ plus CUDA_VISIBLE_DEVICES, LD_LIBRARY_PATH, LD_PRELOAD and
  PYTHONPATH. The value of any name containing SECRET, TOKEN, KEY, PASSWORD,
  PASSWD or CREDENTIAL (any case) is replaced by "<redacted>"
  (TOKENIZERS_PARALLELISM excepted); credentials inside URLs are redacted too.

Findings: torch-import-failed (fail), import-failed (warn), cuda-unavailable
(fail), no-driver (warn), driver-too-old (fail), driver-mismatch (fail),
arch-unsupported (fail), import-version-mismatch (warn), duplicate-package
(warn: one distribution installed in several sys.path entries with different
versions), pip-check (warn).

Standard library only at import time; Python 3.8+; runs standalone:
``python3 env_report.py``.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import glob
import importlib
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import warnings

import _remote

try:
    import importlib.metadata as importlib_metadata
except ImportError:  # pragma: no cover - Python < 3.8 is not supported by the runtime
    importlib_metadata = None

DEFAULT_TIMEOUT = 30.0
PROC_DRIVER_VERSION = "/proc/driver/nvidia/version"
PROC_GPU_INFO_GLOB = "/proc/driver/nvidia/gpus/*/information"

# key in data.packages -> (distribution names to try, in order; module imported by --imports)
PACKAGES = collections.OrderedDict([
    ("torch", (("torch",), "torch")),
    ("transformers", (("transformers",), "transformers")),
    ("vllm", (("vllm",), "vllm")),
    ("speculators", (("speculators",), "speculators")),
    ("flash-attn", (("flash-attn", "flash_attn"), "flash_attn")),
    ("flash-linear-attention", (("flash-linear-attention", "fla-core"), "fla")),
    ("causal-conv1d", (("causal-conv1d", "causal_conv1d"), "causal_conv1d")),
    ("triton", (("triton", "pytorch-triton"), "triton")),
    ("deepspeed", (("deepspeed",), "deepspeed")),
    ("accelerate", (("accelerate",), "accelerate")),
    ("numpy", (("numpy",), "numpy")),
    ("safetensors", (("safetensors",), "safetensors")),
    ("tokenizers", (("tokenizers",), "tokenizers")),
    ("huggingface-hub", (("huggingface-hub", "huggingface_hub"), "huggingface_hub")),
    ("nvidia-nccl-cu12", (("nvidia-nccl-cu12",), None)),
    ("nvidia-nccl-cu13", (("nvidia-nccl-cu13",), None)),
    ("nvidia-cudnn-cu12", (("nvidia-cudnn-cu12",), None)),
    ("nvidia-cudnn-cu13", (("nvidia-cudnn-cu13",), None)),
])
# torch (for its CUDA/cuDNN/NCCL) and the compiled kernels, whose imports break when they
# were built for another torch; --imports all adds the rest (transformers, vllm: seconds each)
DEFAULT_IMPORTS = ("torch", "flash-attn", "flash-linear-attention", "causal-conv1d")

ENV_PREFIXES = ("CUDA", "NCCL", "TORCH", "PYTORCH", "HF_", "HUGGINGFACE", "HUGGING_FACE", "VLLM",
                "OMP_", "NVIDIA_", "CUDNN", "CUBLAS", "TRANSFORMERS_", "TOKENIZERS_", "TRITON_")
ENV_EXACT = ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH")
SECRET_WORDS = ("SECRET", "TOKEN", "KEY", "PASSWORD", "PASSWD", "CREDENTIAL")
NOT_SECRET = frozenset(["TOKENIZERS_PARALLELISM"])
REDACTED = "<redacted>"
_URL_CREDENTIALS = re.compile(r"(://)[^/@\s:]+:[^/@\s]+@")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="env_report.py",
        description="Report OS, Python, torch (CUDA, cuDNN, NCCL), NVIDIA driver, GPU models, "
                    "ML package versions (from package metadata), pip check problems and "
                    "relevant environment variables (secrets redacted) as one JSON result.")
    p.add_argument("--imports", default=",".join(DEFAULT_IMPORTS), type=_imports_arg,
                   help="packages to also import, to catch broken installs: a comma list of "
                        "package keys, 'all' (every installed one; vllm and deepspeed imports "
                        "take seconds) or 'none' (default: %(default)s)")
    p.add_argument("--packages", default="",
                   help="extra distribution names to report, comma separated")
    p.add_argument("--no-pip-check", action="store_true",
                   help="skip the pip check (it reads every installed package's metadata)")
    p.add_argument("--timeout", type=_positive_float, default=DEFAULT_TIMEOUT,
                   help="seconds allowed to each external command: nvidia-smi, nvcc, "
                        "pip check (default %(default)s)")
    return p


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a number" % text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be positive, got %r" % text)
    return value


# --------------------------------------------------------------------------- helpers

def _read(path: str):
    try:
        with open(path, "r", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _cmd(argv, timeout: float):
    """(returncode, combined output) or (None, reason) when it could not run."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out after %g s" % timeout
    except OSError as e:
        return None, "%s: %s" % (type(e).__name__, e.strerror or e)
    return proc.returncode, proc.stdout.decode("utf-8", errors="replace")


def _error_text(e: BaseException) -> str:
    text = str(e)
    return "%s: %s" % (type(e).__name__, text) if text.strip() else repr(e)


def _first_line(text: str) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()
    return ""


def _summarise_names(names) -> str:
    """["NVIDIA H200"] * 8 -> "8× NVIDIA H200" (first-seen order)."""
    counts = collections.OrderedDict()
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join("%d\u00d7 %s" % (c, n) for n, c in counts.items())


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --------------------------------------------------------------------------- sections

def os_info() -> dict:
    rel = {}
    text = _read("/etc/os-release") or _read("/usr/lib/os-release") or ""
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            rel[k.strip()] = v.strip().strip('"').strip("'")
    libc = "-".join(x for x in platform.libc_ver() if x) or None
    return {
        "name": rel.get("PRETTY_NAME") or platform.system(),
        "id": rel.get("ID"),
        "version_id": rel.get("VERSION_ID"),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "libc": libc,
        "hostname": socket.gethostname(),
        "container": _remote.container_kind(),
    }


def python_info() -> dict:
    base = getattr(sys, "base_prefix", sys.prefix)
    uv = bool(os.environ.get("UV"))
    cfg = _read(os.path.join(sys.prefix, "pyvenv.cfg"))
    if cfg and re.search(r"^uv\s*=", cfg, re.M):
        uv = True
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "prefix": sys.prefix,
        "base_prefix": base,
        "venv": sys.prefix != base,
        "uv": uv,
        "virtual_env": os.environ.get("VIRTUAL_ENV"),
        "conda_prefix": os.environ.get("CONDA_PREFIX"),
        "conda_env": os.environ.get("CONDA_DEFAULT_ENV"),
    }


def dist_version(names):
    """(version, distribution name) of the first of ``names`` that is installed, else (None, None)."""
    if importlib_metadata is None:
        return None, None
    for name in names:
        try:
            return importlib_metadata.version(name), name
        except importlib_metadata.PackageNotFoundError:
            continue
        except Exception:   # broken metadata (a half-removed install): not installed for us
            continue
    return None, None


def package_versions(extra=()) -> "collections.OrderedDict":
    out = collections.OrderedDict()
    for key, (dists, _module) in PACKAGES.items():
        out[key] = dist_version(dists)[0]
    for name in extra:
        if name and name not in out:
            out[name] = dist_version((name,))[0]
    return out


def editable_source(dist):
    """The source directory of an editable install (``pip install -e DIR``: PEP 610's
    direct_url.json), else None. Its build metadata in DIR (``NAME.egg-info``, seen when DIR is
    on sys.path) is the same install, not a second copy."""
    try:
        text = dist.read_text("direct_url.json")
        info = json.loads(text) if text else None
    except Exception:
        return None
    if not isinstance(info, dict) or not (info.get("dir_info") or {}).get("editable"):
        return None
    url = info.get("url")
    if not isinstance(url, str) or not url.startswith("file://"):
        return None
    from urllib.parse import unquote, urlparse
    return os.path.realpath(unquote(urlparse(url).path))


def installed_distributions():
    """canonical name -> list of (version, location), in sys.path order, one per location."""
    found = collections.OrderedDict()
    if importlib_metadata is None:
        return found
    seen = set()
    for dist in importlib_metadata.distributions():
        try:
            name = dist.metadata["Name"]
            version = dist.version
        except Exception:
            continue
        if not name:
            continue
        location = editable_source(dist)
        if location is None:
            try:
                location = os.path.realpath(str(dist.locate_file("")))
            except Exception:
                location = None
        key = (_canon(name), location)
        if key in seen:
            continue
        seen.add(key)
        found.setdefault(_canon(name), []).append((version, location))
    return found


def duplicates(found) -> "collections.OrderedDict":
    return collections.OrderedDict(
        (name, [{"version": v, "location": loc} for v, loc in items])
        for name, items in found.items() if len(items) > 1)


def try_import(module: str) -> dict:
    """Import a module, reporting instead of raising: an installed package whose import
    fails (wrong torch ABI, missing CUDA library) is one of the things we look for."""
    info = {"module": module, "ok": False, "error": None, "version": None, "path": None,
            "warnings": []}
    saved = sys.stdout
    sys.stdout = sys.stderr      # a library printing at import must not corrupt our JSON
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                mod = importlib.import_module(module)
            finally:
                # e.g. torch's "Failed to initialize NumPy" (a numpy it was not built for)
                for w in caught:
                    text = "%s: %s" % (getattr(w.category, "__name__", "Warning"), w.message)
                    if text not in info["warnings"] and len(info["warnings"]) < 5:
                        info["warnings"].append(text[:300])
    except Exception as e:
        info["error"] = _error_text(e)
        return info
    finally:
        sys.stdout = saved
    info["ok"] = True
    version = getattr(mod, "__version__", None)
    info["version"] = str(version) if version is not None else None
    path = getattr(mod, "__file__", None)
    info["path"] = os.path.dirname(path) if path else None
    return info


def _cudnn_text(v):
    if v is None:
        return None
    v = int(v)
    if v >= 90000:          # cuDNN 9+: major*10000 + minor*100 + patch
        return "%d.%d.%d" % (v // 10000, (v % 10000) // 100, v % 100)
    return "%d.%d.%d" % (v // 1000, (v % 1000) // 100, v % 100)   # cuDNN 8: major*1000 + minor*100 + patch


def torch_info(installed_version, do_import: bool):
    """(data.torch, the import record or None when torch was not imported)."""
    info = collections.OrderedDict([
        ("installed", installed_version is not None), ("version", installed_version),
        ("imported", False), ("import_error", None), ("path", None), ("debug", None),
        ("cuda", None), ("hip", None), ("cudnn", None), ("nccl", None),
        ("cuda_available", None), ("cuda_init_warning", None), ("device_count", None),
        ("devices", None), ("capabilities", None), ("arch_list", None),
    ])
    if not do_import or (installed_version is None and importlib.util.find_spec("torch") is None):
        return info, None
    imp = try_import("torch")
    if not imp["ok"]:
        info["import_error"] = imp["error"]
        return info, imp
    import torch   # already imported above; cheap
    info["imported"] = True
    info["version"] = imp["version"]
    info["path"] = imp["path"]
    version = getattr(torch, "version", None)
    info["debug"] = getattr(version, "debug", None)
    info["cuda"] = getattr(version, "cuda", None)
    info["hip"] = getattr(version, "hip", None)
    try:
        if torch.backends.cudnn.is_available():
            info["cudnn"] = _cudnn_text(torch.backends.cudnn.version())
    except Exception:       # CPU builds, missing libcudnn: not available is the answer
        info["cudnn"] = None
    try:
        v = torch.cuda.nccl.version()
        info["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except Exception:       # CPU builds have no NCCL binding
        info["nccl"] = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = bool(torch.cuda.is_available())
    info["cuda_available"] = available
    messages = [str(w.message).strip() for w in caught if str(w.message).strip()]
    info["cuda_init_warning"] = " | ".join(messages) if messages else None
    try:
        info["arch_list"] = list(torch.cuda.get_arch_list())
    except Exception:
        info["arch_list"] = None
    if available:
        count = torch.cuda.device_count()
        names = [torch.cuda.get_device_name(i) for i in range(count)]
        caps = ["%d.%d" % torch.cuda.get_device_capability(i) for i in range(count)]
        info["device_count"] = count
        info["devices"] = _summarise_names(names) if names else None
        info["capabilities"] = sorted(set(caps))
    else:
        info["device_count"] = 0
    return info, imp


def driver_info(timeout: float) -> dict:
    info = collections.OrderedDict([
        ("version", None), ("source", None), ("kernel_module", None), ("cuda_driver_api", None),
        ("nvidia_smi", shutil.which("nvidia-smi")), ("nvidia_smi_error", None),
    ])
    text = _read(PROC_DRIVER_VERSION)
    if text:
        m = re.search(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
        if m:
            info["version"] = m.group(1)
            info["source"] = PROC_DRIVER_VERSION
        info["kernel_module"] = "open" if "Open Kernel Module" in text else "proprietary"
    info["cuda_driver_api"] = _cuda_driver_api()
    return info


def _cuda_driver_api():
    """The CUDA version the driver supports (cuDriverGetVersion), without initialising CUDA."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        v = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(v)) != 0 or v.value <= 0:
            return None
    except (OSError, AttributeError):
        return None
    return "%d.%d" % (v.value // 1000, (v.value % 1000) // 10)


def gpu_info(driver: dict, timeout: float) -> dict:
    """GPU models from nvidia-smi, else /proc/driver/nvidia/gpus; fills driver.version if needed."""
    info = collections.OrderedDict([("count", None), ("models", None), ("source", None)])
    smi = driver.get("nvidia_smi")
    names = []
    if smi:
        rc, out = _cmd([smi, "--query-gpu=index,name,driver_version",
                        "--format=csv,noheader,nounits"], timeout)
        if rc == 0:
            for line in out.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) >= 3 and parts[0].isdigit():
                    names.append(parts[1])
                    if driver.get("version") is None:
                        driver["version"] = parts[2]
                        driver["source"] = "nvidia-smi"
            if names:
                info["source"] = "nvidia-smi"
        else:
            driver["nvidia_smi_error"] = ("exit %s: %s" % (rc, _first_line(out))) if rc is not None \
                else out
    if not names:
        for path in sorted(glob.glob(PROC_GPU_INFO_GLOB)):
            m = re.search(r"^Model:\s*(.+)$", _read(path) or "", re.M)
            if m:
                names.append(m.group(1).strip())
        if names:
            info["source"] = os.path.dirname(os.path.dirname(PROC_GPU_INFO_GLOB))
    if names:
        info["count"] = len(names)
        info["models"] = _summarise_names(names)
    elif driver.get("version") is None and not smi:
        info["count"] = 0
    return info


def cuda_toolkit_info(timeout: float) -> dict:
    info = {"nvcc": None, "version": None}
    nvcc = shutil.which("nvcc")
    if not nvcc:
        for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
            if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
                nvcc = os.path.join(home, "bin", "nvcc")
                break
    if nvcc:
        info["nvcc"] = nvcc
        rc, out = _cmd([nvcc, "--version"], timeout)
        m = re.search(r"release \S+ V(\S+)", out or "") if rc == 0 else None
        if m:
            info["version"] = m.group(1)
    return info


def start_pip_check():
    """Start ``python -m pip check`` in the background (it takes seconds in a big
    environment; the rest of the report runs meanwhile). None when pip is not importable."""
    if importlib.util.find_spec("pip") is None:
        return None
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    try:
        return subprocess.Popen([sys.executable, "-m", "pip", "check"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    except OSError:
        return None


def finish_pip_check(proc, timeout: float) -> dict:
    """The pip check answer: pip's when it ran, else the metadata check, else "pip not available"."""
    if proc is not None:
        try:
            raw, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {"tool": "pip", "ok": None, "problems": [],
                    "error": "pip check timed out after %g s" % timeout}
        out = raw.decode("utf-8", errors="replace")
        lines = [l.strip() for l in out.splitlines()
                 if l.strip() and not l.startswith("No broken requirements")]
        if proc.returncode in (0, 1):
            return {"tool": "pip", "ok": proc.returncode == 0 and not lines, "problems": lines,
                    "error": None}
        return {"tool": "pip", "ok": None, "problems": [],
                "error": "pip check exit %d: %s" % (proc.returncode, _first_line(out))}
    try:
        problems = metadata_check()
    except ImportError:
        return {"tool": None, "ok": None, "problems": [], "error": "pip not available"}
    return {"tool": "metadata", "ok": not problems, "problems": problems, "error": None}


def pip_check(timeout: float) -> dict:
    return finish_pip_check(start_pip_check(), timeout)


def metadata_check(path=None):
    """pip check's answer from importlib.metadata + packaging (for venvs without pip, e.g. uv):
    every installed distribution's unconditional requirements (markers evaluated for this
    interpreter, no extras), missing or of the wrong version. ``path``: where to look
    (default sys.path). Raises ImportError when ``packaging`` is not importable."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version
    installed = {}
    dists = importlib_metadata.distributions() if path is None \
        else importlib_metadata.distributions(path=list(path))
    for dist in dists:
        try:
            name = dist.metadata["Name"]
            version = dist.version
        except Exception:
            continue
        if name and _canon(name) not in installed:
            installed[_canon(name)] = (name, version, dist)
    problems = []
    for cname in sorted(installed):
        name, version, dist = installed[cname]
        for text in dist.requires or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            try:
                if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                    continue
            except Exception:
                continue
            have = installed.get(_canon(req.name))
            if have is None:
                problems.append("%s %s requires %s, which is not installed." % (name, version, req.name))
                continue
            if req.specifier:
                try:
                    ok = req.specifier.contains(Version(have[1]), prereleases=True)
                except InvalidVersion:
                    continue
                if not ok:
                    problems.append("%s %s has requirement %s, but you have %s %s."
                                    % (name, version, req, have[0], have[1]))
    return problems


def redact(name: str, value: str) -> str:
    upper = name.upper()
    if upper not in NOT_SECRET and any(w in upper for w in SECRET_WORDS):
        return REDACTED
    return _URL_CREDENTIALS.sub(r"\1" + REDACTED + "@", value)


def env_vars(environ=None) -> "collections.OrderedDict":
    environ = os.environ if environ is None else environ
    out = collections.OrderedDict()
    for name in sorted(environ):
        if name in ENV_EXACT or name.upper().startswith(ENV_PREFIXES):
            out[name] = redact(name, environ[name])
    return out


# --------------------------------------------------------------------------- findings

def _version_tuple(text):
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _arch_covers(arch_list, cap: str) -> bool:
    """Whether a binary compiled for ``arch_list`` runs on compute capability ``cap``:
    SASS (sm_XY) runs on the same major with an equal or higher minor, PTX
    (compute_XY) is JIT-compiled for any equal or newer capability."""
    dev = _version_tuple(cap)
    if dev is None or not arch_list:
        return True
    for arch in arch_list:
        m = re.match(r"(sm|compute)_(\d+?)(\d)([a-z]?)$", arch)
        if not m:
            continue
        major, minor = int(m.group(2)), int(m.group(3))
        if m.group(1) == "sm":
            if m.group(4) == "a":
                if (major, minor) == dev:
                    return True
            elif major == dev[0] and minor <= dev[1]:
                return True
        elif (major, minor) <= dev:
            return True
    return False


def findings_for(data: dict):
    out = []
    pk = data["packages"]
    t = data["torch"]
    drv = data["driver"]
    gpus = data["gpus"]

    if t["installed"] and t["import_error"]:
        out.append({"level": "fail", "code": "torch-import-failed",
                    "message": "torch %s is installed but does not import: %s"
                               % (pk.get("torch") or "", t["import_error"]),
                    "hint": "a missing CUDA library or a mix of torch/nvidia-* wheels: "
                            "reinstall torch in this environment"})
    for key, imp in data["imports"].items():
        if key == "torch" or imp["ok"]:
            continue
        hint = "import it by hand with this interpreter for the full traceback"
        if "undefined symbol" in (imp["error"] or ""):
            hint = ("built against another torch than %s: reinstall %s for this torch "
                    "(pip install --no-build-isolation --force-reinstall %s)"
                    % (t["version"] or "this one", key, key))
        out.append({"level": "warn", "code": "import-failed",
                    "message": "%s %s is installed but `import %s` fails: %s"
                               % (key, pk.get(key) or "", imp["module"], imp["error"]),
                    "hint": hint})
    for key, imp in data["imports"].items():
        meta = pk.get(key)
        if imp["ok"] and imp["version"] and meta and imp["version"] != meta:
            out.append({"level": "warn", "code": "import-version-mismatch",
                        "message": "`import %s` loads version %s from %s but the installed "
                                   "distribution is %s: another copy shadows it"
                                   % (imp["module"], imp["version"], imp["path"], meta),
                        "hint": "check PYTHONPATH, the working directory and pip --target installs"})

    driver_present = bool(drv["version"] or drv["cuda_driver_api"] or gpus["count"])
    if t["imported"] and t["cuda"]:
        if not t["cuda_available"] and driver_present:
            why = t["cuda_init_warning"] or "no reason given"
            cvd = data["env"].get("CUDA_VISIBLE_DEVICES")
            if cvd is not None:
                why += " (CUDA_VISIBLE_DEVICES=%r)" % cvd
            out.append({"level": "fail", "code": "cuda-unavailable",
                        "message": "torch %s is a CUDA %s build and an NVIDIA driver is present, but "
                                   "torch.cuda.is_available() is False: %s" % (t["version"], t["cuda"], why),
                        "hint": "check CUDA_VISIBLE_DEVICES, /dev/nvidia* inside the container, "
                                "and that the driver supports this CUDA version"})
        elif not driver_present:
            out.append({"level": "warn", "code": "no-driver",
                        "message": "torch %s is a CUDA %s build but no NVIDIA driver is loaded here: "
                                   "it runs on CPU only" % (t["version"], t["cuda"]),
                        "hint": "expected on a CPU-only host; in a container, pass the GPUs through "
                                "(--gpus all / nvidia-container-toolkit / lxc device entries)"})
        need, have = _version_tuple(t["cuda"]), _version_tuple(drv["cuda_driver_api"])
        if need and have and need[0] > have[0]:
            out.append({"level": "fail", "code": "driver-too-old",
                        "message": "torch %s needs CUDA %s but driver %s supports CUDA %s at most"
                                   % (t["version"], t["cuda"], drv["version"] or "?",
                                      drv["cuda_driver_api"]),
                        "hint": "upgrade the NVIDIA driver or install a torch build for CUDA %d.x"
                                % have[0]})
    if "version mismatch" in (drv["nvidia_smi_error"] or ""):
        out.append({"level": "fail", "code": "driver-mismatch",
                    "message": "nvidia-smi: %s" % drv["nvidia_smi_error"],
                    "hint": "the loaded kernel module and the user-space driver differ "
                            "(driver upgraded without reboot, or a container's libraries "
                            "do not match the host): reboot or reload the nvidia modules"})
    if t["imported"] and t["capabilities"] and t["arch_list"]:
        bad = [c for c in t["capabilities"] if not _arch_covers(t["arch_list"], c)]
        if bad:
            out.append({"level": "fail", "code": "arch-unsupported",
                        "message": "torch %s has no kernels for compute capability %s "
                                   "(built for %s)" % (t["version"], ", ".join(bad),
                                                       " ".join(t["arch_list"])),
                        "hint": "install a torch build that lists this architecture "
                                "(newer GPUs need newer CUDA wheels)"})
    # the same version twice (an editable install and its source tree's egg-info) is harmless
    conflicting = [n for n, copies in data["duplicates"].items()
                   if len(set(c["version"] for c in copies)) > 1]
    if conflicting:
        names = conflicting
        desc = "; ".join("%s %s" % (n, " and ".join("%s (%s)" % (d["version"], d["location"])
                                                     for d in data["duplicates"][n]))
                         for n in names[:5])
        more = " and %d more" % (len(names) - 5) if len(names) > 5 else ""
        out.append({"level": "warn", "code": "duplicate-package",
                    "message": "installed more than once on sys.path (the first one wins): %s%s"
                               % (desc, more),
                    "hint": "remove the stale copy (pip uninstall until it is gone, or clean "
                            "PYTHONPATH / --target directories)"})
    pc = data["pip_check"]
    if pc["problems"]:
        shown = pc["problems"][:5]
        more = " (and %d more)" % (len(pc["problems"]) - 5) if len(pc["problems"]) > 5 else ""
        out.append({"level": "warn", "code": "pip-check",
                    "message": "%d broken requirement%s: %s%s"
                               % (len(pc["problems"]), "" if len(pc["problems"]) == 1 else "s",
                                  " | ".join(shown), more),
                    "hint": "pip install the versions the requirement asks for, or pin the "
                            "package that pulled the wrong one"})
    return out


# --------------------------------------------------------------------------- run

def wanted_imports(spec: str):
    """--imports value -> package keys; ValueError for keys we do not know how to import."""
    spec = (spec or "").strip()
    if spec == "none" or not spec:
        return []
    if spec == "all":
        return [k for k, (_d, m) in PACKAGES.items() if m]
    keys = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [k for k in keys if k not in PACKAGES or PACKAGES[k][1] is None]
    if unknown:
        raise ValueError("unknown or not importable: %s (choose from %s, all, none)"
                         % (", ".join(unknown), ", ".join(k for k, v in PACKAGES.items() if v[1])))
    return keys


def _imports_arg(text: str) -> str:
    try:
        wanted_imports(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))
    return text


def run(args) -> dict:
    timeout = getattr(args, "timeout", DEFAULT_TIMEOUT)
    wanted = wanted_imports(getattr(args, "imports", ",".join(DEFAULT_IMPORTS)))
    extra = [p.strip() for p in (getattr(args, "packages", "") or "").split(",") if p.strip()]

    skip_pip = getattr(args, "no_pip_check", False)
    pip_proc = None if skip_pip else start_pip_check()
    try:
        data = _collect(timeout, wanted, extra)
    except BaseException:
        if pip_proc is not None and pip_proc.poll() is None:
            pip_proc.kill()
            pip_proc.wait()
        raise
    if skip_pip:
        data["pip_check"] = {"tool": None, "ok": None, "problems": [], "error": "skipped (--no-pip-check)"}
    else:
        data["pip_check"] = finish_pip_check(pip_proc, timeout)
    data["env"] = env_vars()

    findings = findings_for(data)
    levels = [f["level"] for f in findings]
    status = "fail" if "fail" in levels else ("warn" if "warn" in levels else "ok")
    return {"status": status, "summary": _summary(data), "findings": findings, "data": data}


def _collect(timeout: float, wanted, extra) -> "collections.OrderedDict":
    data = collections.OrderedDict()
    data["os"] = os_info()
    data["python"] = python_info()
    data["packages"] = package_versions(extra)
    data["driver"] = driver_info(timeout)
    data["gpus"] = gpu_info(data["driver"], timeout)
    data["torch"], torch_import = torch_info(data["packages"]["torch"], "torch" in wanted)
    data["imports"] = collections.OrderedDict()
    if torch_import is not None:
        data["imports"]["torch"] = torch_import
    for key in wanted:
        if key == "torch":
            continue
        module = PACKAGES[key][1]
        if data["packages"].get(key) is None and importlib.util.find_spec(module) is None:
            continue
        data["imports"][key] = try_import(module)
    if data["gpus"]["count"] is None and data["torch"]["device_count"]:
        data["gpus"]["count"] = data["torch"]["device_count"]
        data["gpus"]["models"] = data["torch"]["devices"]
        data["gpus"]["source"] = "torch"
    data["cuda_toolkit"] = cuda_toolkit_info(timeout)
    data["duplicates"] = duplicates(installed_distributions())
    return data


def _summary(data: dict) -> str:
    parts = ["python %s" % data["python"]["version"]]
    t = data["torch"]
    if not t["installed"] and not t["imported"]:
        parts.append("torch not installed")
    elif t["import_error"]:
        parts.append("torch %s (import fails)" % (data["packages"]["torch"] or "?"))
    else:
        extras = []
        if t["cuda"]:
            extras.append("CUDA %s" % t["cuda"])
        elif t["imported"] and not t["hip"]:
            extras.append("CPU build")
        if t["hip"]:
            extras.append("ROCm %s" % t["hip"])
        if t["cudnn"]:
            extras.append("cuDNN %s" % t["cudnn"])
        if t["nccl"]:
            extras.append("NCCL %s" % t["nccl"])
        parts.append("torch %s%s" % (t["version"], " (%s)" % ", ".join(extras) if extras else ""))
    drv = data["driver"]
    parts.append("driver %s" % drv["version"] if drv["version"] else "no NVIDIA driver")
    if data["gpus"]["models"]:
        parts.append(data["gpus"]["models"])
    for key in ("transformers", "vllm"):
        if data["packages"].get(key):
            parts.append("%s %s" % (key, data["packages"][key]))
    return " \u00b7 ".join(parts)



if __name__ == "__main__":
    _result = run(build_parser().parse_args())
    print(json.dumps(_result, indent=2))
    sys.exit(_remote.exit_code(_result))
