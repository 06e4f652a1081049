"""A minimal container root filesystem copied from this machine, cached between runs.

Debian's /usr/bin/python3.11 and its stdlib, dash as /bin/sh, a few coreutils and
procps, and every shared library `ldd` lists for them (lib-dynload included):
≈ 80 MB, built in well under a second, then reused while the sources are unchanged.
Containers use it read-only as the lower layer of an overlay.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable, List, Set

from .util import LabError, LabUnavailable, run

VERSION = 4  # bump when the layout below changes

PYTHON = "/usr/bin/python3.11"
STDLIB = "/usr/lib/python3.11"
TOOLS = [
    "dash", "env", "sleep", "cat", "ls", "id", "mkdir", "rm", "rmdir", "mktemp", "chmod",
    "chown", "cp", "mv", "ln", "true", "false", "echo", "uname", "head", "tail", "wc",
    "sort", "tr", "touch", "printf", "test", "[", "basename", "dirname", "readlink",
    "realpath", "stat", "pwd", "date", "tee", "nproc", "timeout", "kill", "ps", "whoami",
    "setpriv",  # run as ctuser: setpriv --reuid=ctuser --regid=ctuser --init-groups -- ARGV
]

# PID 1 of the lab's containers. `sleep infinity` would do for "a running CT", but
# it never reaps: processes orphaned inside the container (a diagnostic killed by
# SIGKILL leaves its children) would stay as zombies. A real CT runs an init that
# reaps them; this one does only that, and exits on SIGTERM/SIGINT/SIGPWR.
LAB_INIT = """#!/usr/bin/python3.11 -S
# mldiag lab container init: reap orphans, stop on SIGTERM/SIGINT/SIGPWR.
import os, signal, sys
def stop(*_):
    sys.exit(0)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGPWR):
    signal.signal(s, stop)
signal.signal(signal.SIGCHLD, lambda *_: None)
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        signal.pause()
    except InterruptedError:
        pass
"""

# ctuser: an unprivileged user inside the containers (exec_user tests)
ETC_PASSWD = ("root:x:0:0:root:/root:/bin/sh\n"
              "ctuser:x:1000:1000:ctuser:/home/ctuser:/bin/sh\n"
              "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
ETC_GROUP = "root:x:0:\nctuser:x:1000:\nnogroup:x:65534:\n"


def _tool_paths() -> List[str]:
    out = []
    for name in TOOLS:
        for d in ("/usr/bin", "/usr/sbin"):
            p = os.path.join(d, name)
            if os.path.isfile(p):
                out.append(p)
                break
    return out


def _libs(binaries: Iterable[str]) -> Set[str]:
    """Shared libraries (real paths and the names ldd shows) the binaries need."""
    binaries = list(binaries)
    # ldd costs ≈ 20 ms per file: four at a time
    chunks = [binaries[i::4] for i in range(4)]
    procs = [subprocess.Popen(["ldd", *c], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for c in chunks if c]
    stdout = "".join(p.communicate()[0] for p in procs)
    libs = set()
    for line in stdout.splitlines():
        parts = line.split()
        if "=>" in parts:
            i = parts.index("=>")
            if i + 1 < len(parts) and parts[i + 1].startswith("/"):
                libs.add(parts[i + 1])
        elif parts and parts[0].startswith("/") and len(parts) > 1 and parts[1].startswith("(0x"):
            libs.add(parts[0])  # the dynamic loader
    return libs


def _cache_key(tools: List[str]) -> str:
    h = hashlib.sha256(str(VERSION).encode())
    for p in [PYTHON, STDLIB, os.path.join(STDLIB, "os.py"), os.path.join(STDLIB, "lib-dynload"), *tools]:
        st = os.stat(p)
        h.update(f"{p}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _copy_file(src: str, root: Path) -> None:
    """Copy src (following symlinks) to root/src, and keep symlinked names as symlinks."""
    # /lib, /lib64 and /bin are symlinks into /usr: name things by their real directory
    src = os.path.join(os.path.realpath(os.path.dirname(src)), os.path.basename(src))
    dest = root / src.lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    real = os.path.realpath(src)
    if real != src and not os.path.lexists(dest):
        rdest = root / real.lstrip("/")
        rdest.parent.mkdir(parents=True, exist_ok=True)
        if not rdest.exists():
            _link_or_copy(real, rdest)
        os.symlink(os.path.relpath(rdest, dest.parent), dest)
    elif not os.path.lexists(dest):
        _link_or_copy(src, dest)


def _link_or_copy(src: str, dest: Path) -> None:
    # NOTE: a hard link costs nothing and is safe here: the tree is only ever the
    # read-only lower layer of an overlay, and dpkg replaces files by rename.
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)


def _build(root: Path, tools: List[str]) -> None:
    for d in ("usr/bin", "usr/sbin", "usr/lib", "usr/lib64", "etc", "root", "tmp", "dev",
              "proc", "sys", "run", "var/tmp", "home"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for link, target in (("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"),
                         ("lib64", "usr/lib64")):
        os.symlink(target, root / link)  # merged /usr, as on Debian 12
    os.chmod(root / "tmp", 0o1777)
    os.chmod(root / "var/tmp", 0o1777)
    os.chmod(root / "root", 0o700)
    # the stdlib in one C copy (fast); then the binaries one by one
    if subprocess.run(["cp", "-al", STDLIB, str(root / "usr/lib/")], capture_output=True).returncode:
        shutil.rmtree(root / "usr/lib/python3.11", ignore_errors=True)  # another filesystem
        run(["cp", "-a", STDLIB, str(root / "usr/lib/")])
    _copy_file(PYTHON, root)
    os.symlink("python3.11", root / "usr/bin/python3")
    dynload = [str(p) for p in Path(STDLIB, "lib-dynload").glob("*.so")]
    for p in tools:
        _copy_file(p, root)
    for lib in sorted(_libs([PYTHON, *tools, *dynload])):
        _copy_file(lib, root)
    os.symlink("dash", root / "usr/bin/sh")
    (root / "etc/passwd").write_text(ETC_PASSWD)
    (root / "etc/group").write_text(ETC_GROUP)
    (root / "etc/hostname").write_text("ct\n")
    (root / "home/ctuser").mkdir()
    os.chown(root / "home/ctuser", 1000, 1000)
    os_release = Path("/etc/os-release").resolve()
    if os_release.is_file():
        shutil.copy2(os_release, root / "etc/os-release")
    init = root / "sbin/lab-init"
    init.write_text(LAB_INIT)
    os.chmod(init, 0o755)


def base_rootfs(cache_dir: Path) -> Path:
    """The cached base rootfs under `cache_dir`, built first if missing or stale."""
    for p in (PYTHON, STDLIB, "/usr/bin/dash"):
        if not os.path.exists(p):
            raise LabUnavailable(f"{p} is missing: the container rootfs copies it "
                                 f"(apt-get install python3.11 dash)")
    tools = _tool_paths()
    key = _cache_key(tools)
    final = cache_dir / f"rootfs-{key}"
    if (final / "usr/bin/python3.11").exists():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".rootfs-build-", dir=cache_dir))
    try:
        os.chmod(tmp, 0o755)
        _build(tmp, tools)
        (tmp / ".mldiag-lab-rootfs.json").write_text(json.dumps({"version": VERSION, "key": key}))
        try:
            os.rename(tmp, final)
        except OSError:  # another session won the race: use its copy
            if not (final / "usr/bin/python3.11").exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    # drop stale builds (older keys); a running container of another session keeps its mount
    for old in cache_dir.glob("rootfs-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def check_python(root: Path) -> None:
    """Smoke test: the copied interpreter starts inside the tree (chroot)."""
    proc = subprocess.run(["chroot", str(root), "/usr/bin/python3.11", "-c", "import ssl, ctypes, json, venv"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(f"the base rootfs's python does not start: {proc.stderr.strip()}")
