"""Small process and network helpers shared by the lab builders (no pytest here)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence


class LabUnavailable(RuntimeError):
    """This machine lacks something the lab needs (a package, root, a kernel feature)."""


class LabError(RuntimeError):
    """A lab step failed although its prerequisites were present (a bug or a broken machine)."""


def run(argv: Sequence[str], *, check: bool = True, input: Optional[str] = None,
        timeout: float = 60, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run argv, capture text output; on failure raise LabError naming the command and its stderr."""
    proc = subprocess.run(list(argv), input=input, capture_output=True, text=True,
                          timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv)} exited {proc.returncode}: "
                       f"{(proc.stderr or proc.stdout).strip()[-2000:]}")
    return proc


def missing_programs(names: Iterable[str]) -> List[str]:
    """The names in `names` that are neither absolute existing paths nor on PATH (sbin included)."""
    path = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin:/sbin"
    out = []
    for name in names:
        if os.path.isabs(name):
            if not os.access(name, os.X_OK):
                out.append(name)
        elif shutil.which(name, path=path) is None:
            out.append(name)
    return out


def free_port(address: str) -> int:
    """A TCP port free on `address` right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.01):
    """Poll predicate() until it returns a true value; raise LabError naming `what` on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------- /proc walking

def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def all_pids() -> List[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def ppid_of(pid: int) -> Optional[int]:
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    # comm may contain spaces and parentheses: split after the last ')'
    rest = stat[stat.rindex(b")") + 2:].split()
    return int(rest[1])


def state_of(pid: int) -> Optional[str]:
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    return stat[stat.rindex(b")") + 2:].split()[0].decode()


def cmdline(pid: int) -> Optional[List[str]]:
    raw = _read(f"/proc/{pid}/cmdline")
    if raw is None:
        return None
    return [a.decode("utf-8", "surrogateescape") for a in raw.split(b"\0")[:-1]]


def pids_with_marker(marker: str) -> List[int]:
    """Live processes, in any namespace (a container's too), whose argv holds ``marker``;
    this process left out. How the fault tests and the soak find what a diagnostic left."""
    me, needle = os.getpid(), marker.encode()
    return [p for p in all_pids() if p != me and needle in (_read(f"/proc/{p}/cmdline") or b"")]


def environ_has(pid: int, key: str, value: str) -> bool:
    raw = _read(f"/proc/{pid}/environ")
    return bool(raw) and f"{key}={value}".encode() in raw.split(b"\0")


def uid_of(pid: int) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def ns_of(pid: int, kind: str = "pid") -> Optional[str]:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def descendants(roots: Iterable[int]) -> List[int]:
    """All live descendants of `roots` (not the roots themselves), from one /proc scan."""
    children: Dict[int, List[int]] = {}
    for pid in all_pids():
        ppid = ppid_of(pid)
        if ppid is not None:
            children.setdefault(ppid, []).append(pid)
    out, stack = [], list(roots)
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def kill_all(pids: Iterable[int], grace: float = 1.0) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL whatever is left."""
    pids = [p for p in set(pids) if p > 1 and p != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            pids = [p for p in pids if state_of(p) not in (None, "Z")]
            if not pids:
                return
            time.sleep(0.02)


def world_readable(top: Path) -> None:
    """Let every user read the tree `top` (a copy the lab made): directories 0755, files 0755
    where their owner may run them, else 0644. Symlinks are left as they are (their targets
    are in the tree or the system's)."""
    for d, dirs, files in os.walk(top):
        os.chmod(d, 0o755)
        for name in files:
            p = os.path.join(d, name)
            mode = os.lstat(p).st_mode
            if stat.S_ISREG(mode):
                os.chmod(p, 0o755 if mode & stat.S_IXUSR else 0o644)
