"""Environment helpers for the ML diagnostics tests (check-attn, extract-smoke).

- require(name): import a heavy dependency (torch, transformers); skip the test module when it
  is missing, except under CI=true, where a missing dependency is a failure.
- load_script(name): import diagnostics/scripts/<name>.py by path, as the runtime would run it
  (the scripts never import the local package).
- tf457_dir(): a directory holding transformers 4.57 and the dependency versions it needs that
  differ from the 5.x environment, installed once per machine with
  ``pip install --target <cache>/tf457 --no-deps ...`` and used through PYTHONPATH in a subprocess.
  Cache: $MLDIAG_TF457_DIR (an existing target dir) or $MLDIAG_TEST_CACHE/tf457, default
  ~/.cache/mldiag-tests/tf457.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "diagnostics" / "scripts"
ML = Path(__file__).resolve().parent

TF457_VERSION = "4.57.6"
# transformers 4.57 pins huggingface-hub<1.0 and tokenizers<=0.23.0, and needs requests (5.x does not);
# everything else it needs (numpy, pyyaml, regex, safetensors, tqdm, filelock, packaging) is shared
# with the 5.x environment.
TF457_PACKAGES = (
    "transformers==" + TF457_VERSION,
    "huggingface-hub>=0.34.0,<1.0",
    "tokenizers>=0.22.0,<=0.23.0",
    "requests", "urllib3", "certifi", "charset-normalizer", "idna",
)


def in_ci():
    return os.environ.get("CI", "").lower() == "true"


def require(name):
    """Import `name`; skip when missing outside CI, fail (ImportError) under CI=true."""
    if in_ci():
        return importlib.import_module(name)
    return pytest.importorskip(name)


def _load(modname, path):
    if str(path.parent) not in sys.path:    # as the runtime: the script's directory first
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(modname, str(path))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return mod


def load_script(name):
    return _load("mldiag_script_" + name, SCRIPTS / (name + ".py"))


def load_tiny_models():
    return _load("mldiag_tiny_models", ML / "tiny_models.py")


def _cache_root():
    base = os.environ.get("MLDIAG_TEST_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "mldiag-tests"


def _unavailable(msg):
    if in_ci():
        pytest.fail(msg)
    pytest.skip(msg)


def tf457_version(target):
    """The transformers version importable with PYTHONPATH=target, or None."""
    env = dict(os.environ, PYTHONPATH=str(target))
    r = subprocess.run([sys.executable, "-c", "import transformers, sys; sys.stdout.write(transformers.__version__)"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                       timeout=300)
    return r.stdout.strip() if r.returncode == 0 else None


@contextlib.contextmanager
def _lock(path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(path), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tf457_dir():
    """Path of a --target install of transformers 4.57 (installed on first use, then reused)."""
    env_dir = os.environ.get("MLDIAG_TF457_DIR")
    if env_dir:
        v = tf457_version(env_dir)
        if not (v or "").startswith("4.57"):
            _unavailable("MLDIAG_TF457_DIR=%s does not provide transformers 4.57 (got %s)" % (env_dir, v))
        return Path(env_dir)
    target = _cache_root() / "tf457"
    marker = target / ".mldiag-complete"
    with _lock(_cache_root() / "tf457.lock"):
        if marker.exists():
            return target
        if subprocess.run([sys.executable, "-m", "pip", "--version"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode != 0:
            _unavailable("pip is not available to install transformers %s" % TF457_VERSION)
        tmp = Path(tempfile.mkdtemp(prefix="tf457-", dir=str(target.parent)))
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--no-deps", "--target", str(tmp)] + list(TF457_PACKAGES)
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                           timeout=900)
        if r.returncode != 0:
            shutil.rmtree(str(tmp), ignore_errors=True)
            _unavailable("could not install transformers %s: %s\n%s" % (TF457_VERSION, " ".join(cmd),
                                                                         r.stdout[-3000:]))
        v = tf457_version(tmp)
        if v != TF457_VERSION:
            shutil.rmtree(str(tmp), ignore_errors=True)
            _unavailable("the --target install does not import transformers %s (got %s)" % (TF457_VERSION, v))
        if target.exists():
            shutil.rmtree(str(target), ignore_errors=True)
        os.replace(str(tmp), str(target))
        marker.write_text(" ".join(TF457_PACKAGES) + "\n")
        return target
