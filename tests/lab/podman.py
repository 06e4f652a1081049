"""A podman container for the lab (runc, private storage), reachable as `podman` under sudo.

podman works on this machine kind only with runc and explicit ulimits (crun
fails). The lab keeps its engine and storage configuration private to the
session (nothing under /etc/containers changes): the lab's sshds set
CONTAINERS_CONF and CONTAINERS_STORAGE_CONF in every session (SetEnv) and the
sudoers rule keeps them (env_keep), so `sudo -n podman exec -i podbox ...` over
ssh reaches this podman as it would reach a system-wide configured one, and two
lab sessions on one machine do not see each other's containers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from .util import LabError, run

PODMAN = "/usr/bin/podman"


class Podman:
    def __init__(self, dir: Path):
        self.dir = dir
        self.conf = dir / "containers.conf"
        self.storage_conf = dir / "storage.conf"

    @property
    def config_env(self) -> dict:
        """The variables that point podman at this lab's engine and storage."""
        return {"CONTAINERS_CONF": str(self.conf), "CONTAINERS_STORAGE_CONF": str(self.storage_conf)}

    @property
    def env(self) -> dict:
        return {**os.environ, **self.config_env}

    def write_config(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        d = self.dir
        self.conf.write_text(
            "# mldiag lab podman engine\n"
            "[containers]\n"
            'default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]\n'
            "[engine]\n"
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'tmp_dir = "{d}/tmp"\n'
        )
        self.storage_conf.write_text(
            "# mldiag lab podman storage\n"
            "[storage]\n"
            'driver = "overlay"\n'
            f'graphroot = "{d}/storage"\n'
            f'runroot = "{d}/run"\n'
        )

    def __call__(self, *args: str, check: bool = True, timeout: float = 60):
        return run([PODMAN, *args], check=check, env=self.env, timeout=timeout)

    def start(self, name: str, rootfs: Path, binds: Iterable[Path] = (),
              init: str = "/sbin/lab-init") -> int:
        """Run `name` detached on an overlay of `rootfs` (no image), no network; its PID."""
        self("rm", "-f", "-t", "0", name, check=False)
        argv = ["run", "-d", "--name", name, "--hostname", name, "--network", "none"]
        for b in binds:
            argv += ["-v", f"{b}:{b}:ro"]
        argv += ["--rootfs", f"{rootfs}:O", init]
        self(*argv)
        return self.pid(name)

    def pid(self, name: str) -> int:
        out = self("inspect", "-f", "{{.State.Pid}}", name).stdout.strip()
        if not out.isdigit() or out == "0":
            raise LabError(f"podman container {name} is not running (pid {out!r})")
        return int(out)

    def remove(self, name: str) -> None:
        self("rm", "-f", "-t", "0", name, check=False)
