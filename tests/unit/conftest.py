"""The unit tier's fixtures (the suite's own are in tests/conftest.py; helpers a test calls,
rather than asks for, in tests/programs.py)."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from diagnostics.transport import sshconfig, sshg_cache
from tests.programs import REPO, marking_python

TEAM_FIXTURE = Path(REPO) / "tests" / "fixtures" / "team"
FAKE_SMI = Path(REPO) / "tests" / "fakes" / "nvidia-smi"
REAL_SSH = shutil.which("ssh")


@pytest.fixture
def checks(tmp_path):
    """A team's diagnostics directory (a copy of tests/fixtures/team), and a hosts file naming
    it (``diagnostics: checks``) with one local target, ``here``."""
    directory = tmp_path / "checks"
    shutil.copytree(TEAM_FIXTURE, directory)
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("diagnostics: checks\nhosts:\n  here: {local: true}\n")
    return directory, hosts


@pytest.fixture
def private_tmpdir(tmp_path, monkeypatch):
    """$TMPDIR (where the runtime makes its private dir) of this test's own: other test runs on
    the machine make and remove mldiag-* dirs in /tmp meanwhile, and a test counting them must
    not see those."""
    d = tmp_path / "TMPDIR"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("TMPDIR", str(d))
    return d


@pytest.fixture
def tool_dir(tmp_path, monkeypatch):
    """A PATH of our own: python3 without site (the fakes need only the stdlib), nvidia-smi."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").write_text('#!/bin/sh\nexec "%s" -S "$@"\n' % sys.executable)
    (bindir / "python3").chmod(0o755)
    os.symlink(FAKE_SMI, bindir / "nvidia-smi")
    monkeypatch.setenv("PATH", str(bindir))
    for var in ("MLDIAG_FAKE_NVIDIA_SMI_HANG", "MLDIAG_FAKE_NVIDIA_SMI_EXIT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", "derived__h200x8__healthy")
    return bindir


@pytest.fixture
def hosts(tmp_path):
    """One local target whose interpreter leaves a mark: whether anything ran on it."""
    python, marker = marking_python(tmp_path)
    path = tmp_path / "hosts.yaml"
    path.write_text(f"hosts:\n  here:\n    local: true\n    python: {python}\n")
    return path, marker


@pytest.fixture
def counted_ssh(tmp_path, monkeypatch):
    """PATH with an ``ssh`` that logs each call and runs the real one; a private runtime dir;
    a fresh process memory of answers. Returns a function giving the number of calls so far."""
    assert REAL_SSH, "the OpenSSH client is needed (CI installs openssh-client)"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "ssh-calls"
    wrapper = bindir / "ssh"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {REAL_SSH} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv(sshg_cache.ENV_SWITCH, raising=False)
    monkeypatch.setattr(sshconfig, "_cache", {})
    monkeypatch.setattr(sshg_cache, "_files", {})

    def calls() -> int:
        return len(log.read_text().splitlines()) if log.exists() else 0
    return calls


@pytest.fixture
def nobodys_dir():
    """A directory another user can reach (0755 under /tmp, whatever the checkout's and pytest's
    temp dirs allow: a clone in a 0700 home, pytest-of-root is 0700), holding ``scripts/``, a
    world-readable copy of diagnostics/scripts, for a test that runs a check as nobody."""
    root = Path(tempfile.mkdtemp(prefix="mldiag-nobody-"))
    try:
        os.chmod(root, 0o755)
        shutil.copytree(Path(REPO) / "diagnostics" / "scripts", root / "scripts",
                        ignore=shutil.ignore_patterns("__pycache__"))
        for d, _, files in os.walk(root / "scripts"):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
