"""The ``--save DIR`` directory: opened once, before any connection, then written only through
its file descriptor.

A run (often as root) must not be steered by anyone else's files, so:

- DIR is created 0700 when it does not exist; an existing DIR must be a real directory (not a
  symbolic link), owned by the invoking user (the effective uid) and writable by nobody else
  (no group or other write bit). Anything else is bad input (exit 4), found before a target
  is asked anything, as is a DIR that cannot be created or written (a file, a read-only place).
- Every file is written to a fresh temp name opened relative to DIR's fd with
  ``O_CREAT|O_EXCL|O_NOFOLLOW`` (mode 0600), then renamed within that fd over its final name.
  A symbolic link planted under a final name (``report.md``) is replaced itself; one planted
  under an old temp name (``summary.json.part``) is never opened: temp names are new each time.
- Subdirectories (a runbook's ``steps/NN-STEP``) are made and opened the same way
  (``O_NOFOLLOW``, relative to the parent's fd) and checked like DIR.

NOTE: only DIR's last component is opened with O_NOFOLLOW. The components above it are the
user's own choice of path and may be links the user made (``/tmp`` → ``/private/tmp`` on macOS,
``~/results`` → ``/data/results``): following them is what was asked for. What a local user can
plant is DIR itself (pre-created in a shared place) and entries inside it, and neither is ever
followed. A parent that others can write could only move DIR's *place* (to a directory that the
invoking user owns and nobody else can write, or a new one): every write still lands in such a
directory, under names of ours (``*.json``, ``report.md``, ``steps/``).
"""

import errno
import json
import os
import re
import secrets
import stat
from typing import Any, Callable, Iterable, Optional, TextIO

from . import termination
from .errors import InputError

_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_TRIES = 8


def result_file_name(target: str) -> str:
    """``cluster-a:n3`` → ``cluster-a_n3.json``: one plain file name per target."""
    return (re.sub(r"[^A-Za-z0-9_.-]", "_", target) or "target") + ".json"


def _check_entry_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"not a plain file name: {name!r}")


def _who(uid: int) -> str:
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _check_private(fd: int, shown: str) -> None:
    """The open directory ``fd`` is owned by us and nobody else can write it."""
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"--save {shown}: not a directory")
    if st.st_uid != os.geteuid():
        raise InputError(f"--save {shown}: owned by {_who(st.st_uid)}, not by you "
                         f"({_who(os.geteuid())}); name a directory of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = " and ".join(w for w, bit in (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH))
                           if st.st_mode & bit)
        raise InputError(f"--save {shown}: writable by {who} (mode {stat.S_IMODE(st.st_mode):04o});"
                         f" make it private (chmod go-w) or name another directory")


def _open_dir(name: str, shown: str, dir_fd: Optional[int] = None) -> int:
    """Open an existing directory without following a link at ``name``; InputError otherwise."""
    try:
        return os.open(name, _OPEN_DIR, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):   # Linux says ENOTDIR for a link here
            raise InputError(f"--save {shown}: " + ("a symbolic link; name the directory itself"
                                                    if _is_link(name, dir_fd) else "not a directory"))
        raise InputError(f"--save {shown}: {exc.strerror}")


def _is_link(name: str, dir_fd: Optional[int]) -> bool:
    """Only to word the refusal: the O_NOFOLLOW open has already refused it."""
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


class SaveDir:
    """An open, checked ``--save`` directory (or a subdirectory of one)."""

    def __init__(self, fd: int, path: str):
        self.fd, self.path = fd, path

    @classmethod
    def open(cls, path: str) -> "SaveDir":
        """Create (0700) or open and check DIR; InputError (exit 4) when it is not safe to use."""
        clean = path.rstrip("/") or "/"
        parent = os.path.dirname(clean)
        try:
            if parent:
                os.makedirs(parent, exist_ok=True)
            os.mkdir(clean, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise InputError(f"--save {path}: {exc.strerror}")
        fd = _open_dir(clean, path)
        save = cls(fd, path)
        try:
            _check_private(fd, path)
            save._probe()
        except BaseException:
            save.close()
            raise
        return save

    def _probe(self) -> None:
        """Writable here? (a read-only file system, a mode without u+w for a non-root user)"""
        try:
            name, fd = self._new_temp("probe")
        except OSError as exc:
            raise InputError(f"--save {self.path}: {exc.strerror}")
        os.close(fd)
        os.unlink(name, dir_fd=self.fd)

    def subdir(self, name: str) -> "SaveDir":
        """``name`` inside this directory, made 0700 if missing; checked like DIR itself."""
        _check_entry_name(name)
        shown = os.path.join(self.path, name)
        try:
            os.mkdir(name, 0o700, dir_fd=self.fd)
        except FileExistsError:
            pass
        except OSError as exc:
            raise InputError(f"--save {shown}: {exc.strerror}")
        fd = _open_dir(name, shown, dir_fd=self.fd)
        sub = SaveDir(fd, shown)
        try:
            _check_private(fd, shown)
        except BaseException:
            sub.close()
            raise
        return sub

    def check_files(self, names: Iterable[str]) -> None:
        """Before a run: each name is free, a file or a link (a link is replaced, never
        followed) — not a directory, which a rename could not replace at the end of a run."""
        for name in names:
            _check_entry_name(name)
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise InputError(f"--save {os.path.join(self.path, name)}: {exc.strerror}")
            if stat.S_ISDIR(st.st_mode):
                raise InputError(f"--save {os.path.join(self.path, name)}: a directory is in "
                                 f"the way of a file mldiag writes")

    def exists(self, name: str) -> bool:
        """Is there an entry ``name`` here (a link counts, whatever it points at)?"""
        _check_entry_name(name)
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False

    def _new_temp(self, name: str):
        """(temp name, fd): a name nobody has used, created by us, never a link's target."""
        for _ in range(_TEMP_TRIES):
            temp = f".{name}.{secrets.token_hex(6)}.part"
            try:
                return temp, os.open(temp, _OPEN_NEW, 0o600, dir_fd=self.fd)
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, "no free temp name", name)

    def write_text(self, name: str, write: Callable[[TextIO], None]) -> None:
        """``write(stream)`` into a temp file, then rename it over ``name`` (atomic: a reader
        never sees half a file, a failed write leaves the old one). A signal (Ctrl-C, TERM,
        HUP) waits until the file is whole: otherwise one arriving just after the temp file
        is made, before its name is kept here, would leave that ``.part`` file behind."""
        _check_entry_name(name)
        with termination.held():
            self._write_whole(name, write)

    def _write_whole(self, name: str, write: Callable[[TextIO], None]) -> None:
        temp, fd = self._new_temp(name)
        try:
            # NOTE: backslashreplace: a stray lone surrogate in a target's text must not cost
            # the file; the JSON writers are ASCII anyway.
            with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as stream:
                write(stream)
            os.rename(temp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=self.fd)
            except OSError:
                pass
            raise

    def write_json(self, name: str, doc: Any) -> None:
        def dump(stream: TextIO) -> None:
            json.dump(doc, stream, indent=2, default=str)
            stream.write("\n")
        self.write_text(name, dump)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "SaveDir":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
