"""The mldiag test lab: real sshd hosts (one at OpenSSH's default limits, a jump
chain in network namespaces), LXC containers behind a Proxmox `pct` stand-in,
and a podman container. Pure helpers: usable from pytest (tests/integration/
conftest.py) and from a benchmark script (`python -m tests.lab` starts one and
prints how to reach it)."""

from .lab import FAKES, PACKAGES, REPO, Lab
from .sshd import SshServer
from .util import LabError, LabUnavailable

__all__ = ["Lab", "SshServer", "LabError", "LabUnavailable", "FAKES", "PACKAGES", "REPO"]
