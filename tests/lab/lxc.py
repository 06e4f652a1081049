"""LXC containers for the lab, on an LXC path of their own (driven like Proxmox CTs)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from .util import LabError, run, wait_until


def fstab_escaped(path: str) -> str:
    """`path` as one field of an fstab line: LXC reads its mount entries with getmntent(3),
    which splits at blanks and decodes these octal escapes (a checkout or a .venv under a
    directory with a space in its name is bound this way)."""
    for char, escape in (("\\", "\\134"), (" ", "\\040"), ("\t", "\\011"), ("\n", "\\012")):
        path = path.replace(char, escape)
    return path


def config_text(vmid: int, base: Path, delta: Path, binds: Iterable[Path],
                extra_lines: Iterable[str] = (), hostname: Optional[str] = None) -> str:
    lines = [
        f"# mldiag lab CT {vmid}",
        f"lxc.uts.name = {hostname or f'ct{vmid}'}",
        f"lxc.rootfs.path = overlay:{base}:{delta}",
        # NOTE: 'empty' is a network namespace with only lo, like a CT without a NIC;
        # 'none' would share the host's network namespace.
        "lxc.net.0.type = empty",
        "lxc.mount.auto = proc:mixed sys:ro",
        "lxc.autodev = 1",
        "lxc.apparmor.profile = unconfined",
        "lxc.init.cmd = /sbin/lab-init",
        "lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,mode=1777,create=dir 0 0",
    ]
    for b in binds:
        path = fstab_escaped(str(b))
        lines.append(f"lxc.mount.entry = {path} {path.lstrip('/')} none bind,ro,create=dir 0 0")
    lines.extend(extra_lines)
    return "\n".join(lines) + "\n"


def define(lxc_path: Path, vmid: int, base: Path, binds: Iterable[Path] = (),
           links: Optional[Dict[str, str]] = None, extra_lines: Iterable[str] = (),
           hostname: Optional[str] = None) -> Path:
    """Write LXC_PATH/VMID/config and an empty overlay delta; `links` are symlinks
    (path inside the CT -> target) placed in the delta, e.g. /usr/bin/nvidia-smi;
    `extra_lines` go at the end of the config (e.g. more lxc.mount.entry lines)."""
    d = lxc_path / str(vmid)
    delta = d / "delta"
    delta.mkdir(parents=True, exist_ok=True)
    for path, target in (links or {}).items():
        link = delta / path.lstrip("/")
        link.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(link):
            link.unlink()
        os.symlink(target, link)
    (d / "config").write_text(config_text(vmid, base, delta, binds, extra_lines, hostname))
    return d


def state(lxc_path: Path, vmid: int) -> str:
    """RUNNING, STOPPED, ... as lxc-info reports it."""
    return run(["lxc-info", "-P", str(lxc_path), "-n", str(vmid), "-s", "-H"]).stdout.strip()


def init_pid(lxc_path: Path, vmid: int) -> Optional[int]:
    out = run(["lxc-info", "-P", str(lxc_path), "-n", str(vmid), "-p", "-H"], check=False).stdout.strip()
    return int(out) if out.isdigit() else None


def start(lxc_path: Path, vmid: int, log: Path) -> int:
    """Start the CT (daemonised) and return its init's host PID."""
    proc = run(["lxc-start", "-P", str(lxc_path), "-n", str(vmid), "-d",
                "-o", str(log), "-l", "INFO"], check=False)
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        raise LabError(f"lxc-start CT {vmid} failed ({proc.returncode}): {proc.stderr.strip()}\n{tail}")
    pid = wait_until(lambda: init_pid(lxc_path, vmid), 10, f"CT {vmid} to run")
    # A CT's loopback is up, as its init (systemd, ifupdown) brings it up on a Proxmox host; the
    # lab's init does not, and ranks meeting on 127.0.0.1 (nccl-check) need it
    run(["nsenter", "-t", str(pid), "-n", "ip", "link", "set", "lo", "up"])
    return pid


def attach(lxc_path: Path, vmid: int, argv: List[str], check: bool = True):
    return run(["lxc-attach", "-P", str(lxc_path), "-n", str(vmid), "--clear-env",
                "--", *argv], check=check)


def stop(lxc_path: Path, vmid: int) -> None:
    """Kill the CT (lxc-stop -k) if it runs; never raises."""
    run(["lxc-stop", "-P", str(lxc_path), "-n", str(vmid), "-k"], check=False, timeout=30)


def destroy(lxc_path: Path, vmid: int) -> None:
    stop(lxc_path, vmid)
    shutil.rmtree(lxc_path / str(vmid), ignore_errors=True)
