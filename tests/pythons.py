"""Real older interpreters for compatibility tests: on PATH, or pyenv's builds (this machine
kind ships pyenv with 2.7, 3.6, 3.7, 3.8 ... beside the default 3.11)."""

import glob
import os
import shutil
import subprocess
from typing import Optional


def find_python(version: str) -> Optional[str]:
    """A working ``pythonX.Y`` executable, or None."""
    candidates = [shutil.which(f"python{version}")]
    for root in (os.environ.get("PYENV_ROOT"), os.path.expanduser("~/.pyenv"), "/root/.pyenv"):
        if root:
            candidates += sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin",
                                                        f"python{version}")))
    want = tuple(int(x) for x in version.split("."))
    for exe in filter(None, candidates):
        check = f"import sys; sys.exit(0 if tuple(sys.version_info[:2]) == {want!r} else 1)"
        try:
            if subprocess.run([exe, "-c", check], capture_output=True, timeout=30).returncode == 0:
                return exe
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def require_python(version: str) -> str:
    """find_python, or the test cannot run: a failure under CI (CI=true: this machine kind has
    pyenv's builds, so a missing one is a broken tier), a skip elsewhere."""
    import pytest
    exe = find_python(version)
    if exe:
        return exe
    reason = f"no working python{version} (PATH or pyenv)"
    if os.environ.get("CI", "").strip().lower() in ("1", "true", "yes"):
        pytest.fail(f"{reason}; CI=true, so this is a failure", pytrace=False)
    pytest.skip(reason)
