"""The drift lines of ``inv env-report -H mlbox,gpubox[,oldbox]`` as a user sees them on a real
terminal (tests/terminal.py): one line per fact, a missing torch one line.

The targets are this machine through interpreters that differ: ``mlbox`` is this test's own
virtualenv (real torch, transformers, ...; ``NCCL_DEBUG=INFO`` in its hosts.yaml env), ``gpubox``
a bare venv (no packages, no pip) of pyenv's Python 3.8, ``oldbox`` one of its Python 3.9. The
expected screen is literal; only the versions of this virtualenv's packages and of the two
interpreters are read from them (so that an upgrade of the shared venv is not a failure here).
"""

import platform
import subprocess
import sys

import pytest

from tests.programs import REPO, space_free_python
from tests.pythons import require_python
from tests.terminal import TMUX, run_on_screen

pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed (.ci/run installs it)")


def _installed():
    """(package key, version) of env-report's packages installed in this virtualenv, in its order."""
    from tests.programs import load_script
    er = load_script("env_report.py", "mldiag_test_drift_screen_env_report")
    return [(k, v) for k, v in er.package_versions().items() if v]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("drift-screen")
    versions = {}
    for name, version in (("gpubox", "3.8"), ("oldbox", "3.9")):
        python = require_python(version)
        subprocess.run([python, "-m", "venv", "--without-pip", str(root / name)], check=True, timeout=60)
        versions[name] = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                                        capture_output=True, text=True, check=True).stdout.strip()
    hosts = root / "hosts.yaml"
    hosts.write_text(
        "hosts:\n"
        f"  mlbox: {{local: true, python: {space_free_python()}, env: {{NCCL_DEBUG: INFO}}}}\n"
        f"  gpubox: {{local: true, python: {root / 'gpubox' / 'bin' / 'python'}}}\n"
        f"  oldbox: {{local: true, python: {root / 'oldbox' / 'bin' / 'python'}}}\n")
    return hosts, versions


def _drift_block(screen: str) -> str:
    assert "drift across" in screen, screen
    return "drift across" + screen.split("drift across", 1)[1]


def test_two_targets_one_lacking_torch(targets):
    hosts, versions = targets
    pkgs = _installed()
    assert pkgs and pkgs[0][0] == "torch", pkgs
    status, screen = run_on_screen("env-report", "-H", "mlbox,gpubox", "--hosts-file", hosts,
                                   program="inv", cwd=REPO, width=120, height=50)
    expected = "\n".join(
        ["drift across 2 targets:",
         f"  python: {platform.python_version()} on mlbox; {versions['gpubox']} on gpubox (also differ: executable, prefix, base_prefix)"]
        + [f"  {key}: {version} on mlbox; missing on gpubox" for key, version in pkgs]
        + ["  pip_check: tool pip, ok true on mlbox; error pip not available on gpubox",
           "  NCCL_DEBUG: INFO on mlbox; missing on gpubox",
           "",
           "2 ok"]) + "\n"
    assert _drift_block(screen) == expected, screen
    assert status == 0, screen


def test_three_targets_two_lacking_torch(targets):
    hosts, versions = targets
    pkgs = _installed()
    status, screen = run_on_screen("env-report", "-H", "mlbox,gpubox,oldbox", "--hosts-file", hosts,
                                   program="inv", cwd=REPO, width=120, height=50)
    expected = "\n".join(
        ["drift across 3 targets:",
         f"  python: {platform.python_version()} on mlbox; {versions['gpubox']} on gpubox; "
         f"{versions['oldbox']} on oldbox (also differ: executable, prefix, base_prefix)"]
        + [f"  {key}: missing on gpubox,oldbox; {version} on mlbox" for key, version in pkgs]
        + ["  pip_check: error pip not available on gpubox,oldbox; tool pip, ok true on mlbox",
           "  NCCL_DEBUG: missing on gpubox,oldbox; INFO on mlbox",
           "",
           "3 ok"]) + "\n"
    assert _drift_block(screen) == expected, screen
    assert status == 0, screen
