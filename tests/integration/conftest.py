"""The `lab` fixture: one real test lab per pytest session (see tests/lab/lab.py).

Under CI (CI=true) a lab that cannot start is a test failure; elsewhere the
integration tests are skipped with the reason. Every test in this directory is
marked `integration`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `tests.lab` is imported from the checkout, whatever the rootdir
    sys.path.insert(0, str(REPO))

from tests.lab import Lab, LabUnavailable  # noqa: E402

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
HERE = Path(__file__).resolve().parent
_started: list = []  # the session's lab, for the terminal summary


def lab_unavailable(reason: str) -> None:
    """Fail under CI, skip elsewhere."""
    if IN_CI:
        pytest.fail(f"test lab unavailable (CI=true, so this is a failure): {reason}", pytrace=False)
    pytest.skip(f"test lab unavailable: {reason}")


# Runs before every other test: it starts a lab of its own, and the session's starts with the
# first test that uses it (test_private_clone.py says why two labs must not overlap).
ALONE_FIRST = "test_private_clone.py"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
    first = [item for item in items if Path(str(item.fspath)).name == ALONE_FIRST]
    items[:] = first + [item for item in items if item not in first]


# Base-system libraries torch's wheel links (libstdc++6, libgcc-s1 and glibc's compat stubs):
# every real Debian CT has them, the lab's minimal rootfs (tests/lab/rootfs.py) does not.
ML_LIBS = ("libstdc++.so.6", "libgcc_s.so.1", "libdl.so.2", "libpthread.so.0", "librt.so.1")


def _ml_binds() -> list:
    """extra_binds for the lab's containers (read-only, same path inside): tests/fixtures (the
    fake nvidia-smi's captures; the Lab's default), and for test_diagnostics_remote.py
    /var/tmp/mldiag-lab-UID/ml/lib-KEY (copies of ML_LIBS, for LD_LIBRARY_PATH), .../ml/models (tiny
    models saved by the tests after the CT started) and the site-packages holding torch and
    transformers (for PYTHONPATH). Found there through `lab.extra_binds`."""
    import glob
    import hashlib
    import importlib.util
    import shutil
    import tempfile

    binds = [REPO / "tests" / "fixtures"]
    # NOTE: not under /tmp: the transport tests check that the CT's /tmp has no mldiag-* left
    ml = Path(f"/var/tmp/mldiag-lab-{os.getuid()}") / "ml"
    (ml / "models").mkdir(parents=True, exist_ok=True)
    for d in (ml.parent, ml, ml / "models"):
        os.chmod(d, 0o755)
    binds.append(ml / "models")
    libs = [next(iter(sorted(glob.glob(f"/usr/lib/*-linux-gnu/{n}") + glob.glob(f"/usr/lib64/{n}"))), None)
            for n in ML_LIBS]
    if all(libs):
        key = hashlib.sha256(repr([(lib, os.stat(lib).st_size, os.stat(lib).st_mtime_ns)
                                   for lib in libs]).encode()).hexdigest()[:12]
        lib_dir = ml / f"lib-{key}"
        if not lib_dir.is_dir():
            tmp = Path(tempfile.mkdtemp(prefix=".lib-", dir=ml))
            for name, lib in zip(ML_LIBS, libs):
                shutil.copy2(os.path.realpath(lib), tmp / name)
            os.chmod(tmp, 0o755)
            try:
                os.rename(tmp, lib_dir)
            except OSError:  # another session made it meanwhile
                shutil.rmtree(tmp, ignore_errors=True)
        binds.append(lib_dir)
    # read inside the CT by root, so never copied (the lab copies only binds under tests/, which
    # its users read too: Lab._stage_test_files)
    for name in ("torch", "transformers"):
        spec = importlib.util.find_spec(name)
        if spec and spec.origin:
            site = Path(spec.origin).resolve().parents[1]
            if site not in binds:
                binds.append(site)
    return binds


@pytest.fixture(scope="session")
def lab():
    """The running lab: `lab.ssh_config`, `lab.main`, `lab.inner`, `lab.lxc_path`, ...
    (the attributes are listed in the docstring of tests.lab.Lab)."""
    try:
        # strict under CI: any missing part (package, LXC, podman, netns) stops the lab
        the_lab = Lab.start(strict=IN_CI, extra_binds=_ml_binds())
    except LabUnavailable as e:
        lab_unavailable(str(e))
    the_lab.on_unavailable = lab_unavailable
    _started.append(the_lab)
    try:
        yield the_lab
    finally:
        the_lab.close()


@pytest.fixture(scope="session")
def node_cts(lab):
    """The node-check CTs 210 `h200-ok` and 211 `h200-bad` (tests/lab/nodecheck.py), started on
    first use and shared by the session."""
    return lab.node_check_cts()


def pytest_terminal_summary(terminalreporter):
    for the_lab in _started:
        missing = f"; unavailable: {', '.join(the_lab.unavailable)}" if the_lab.unavailable else ""
        terminalreporter.write_line(f"mldiag test lab: up in {the_lab.startup_s:.2f}s {the_lab.timings}{missing}")


@pytest.fixture(scope="session", autouse=True)
def mldiag_ssh_config(lab):
    """$MLDIAG_SSH_CONFIG for mldiag in these tests: the lab's aliases (through `Include`),
    and for raw addresses the lab's known_hosts and identity, as a user's ~/.ssh/config would."""
    cfg = lab.dir / "mldiag_ssh_config"
    cfg.write_text(f"Include {lab.ssh_config}\n\nHost *\n"
                   f"  IdentityFile {lab.identity}\n"
                   f"  UserKnownHostsFile {lab.known_hosts}\n"
                   f"  StrictHostKeyChecking yes\n")
    old = os.environ.get("MLDIAG_SSH_CONFIG")
    os.environ["MLDIAG_SSH_CONFIG"] = str(cfg)
    try:
        yield cfg
    finally:
        if old is None:
            os.environ.pop("MLDIAG_SSH_CONFIG", None)
        else:
            os.environ["MLDIAG_SSH_CONFIG"] = old
