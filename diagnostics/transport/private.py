"""The user's private directory on this machine: the connection holder's socket and the kept
``ssh -G`` answers live there (``held``, ``sshg_cache``). ``$XDG_RUNTIME_DIR/mldiag`` where that is
the user's own and nothing above it can be swapped, else ``/tmp/mldiag-UID``; nothing is kept
where the directory is not private."""

import os
import stat
from typing import Optional

# A socket's path is at most 107 bytes (sun_path): the directory leaves room for
# "/holder-<16 hex>.sock".
MAX_DIR_BYTES = 107 - 29


def private_dir() -> Optional[str]:
    """The user's directory for the holder's socket, made if missing; None when it is not
    private (another owner, group/other access, a link): then nothing is held."""
    uid = os.geteuid()
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = os.path.join(runtime, "mldiag")
    if not (runtime.startswith("/") and len(os.fsencode(base)) <= MAX_DIR_BYTES
            and _private(runtime, uid) and _fixed_above(runtime, uid)):
        base = f"/tmp/mldiag-{uid}"
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    return base if _private(base, uid) else None


def is_private(st: os.stat_result, uid: int) -> bool:
    """A directory of ``uid``'s own that no one else may enter, list or write."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077


def _private(path: str, uid: int) -> bool:
    try:
        return is_private(os.lstat(path), uid)
    except OSError:
        return False


def _fixed_above(path: str, uid: int) -> bool:
    """No one but root and ``uid`` can rename or replace a directory above ``path`` (OpenSSH's
    rule for the directories above a config file, sticky ones such as /tmp allowed): else
    another user could swap the private directory for one of theirs after it was checked.
    Both the path as written and the one its links lead to are checked."""
    for start in {os.path.abspath(path), os.path.realpath(path)}:
        here = start
        while os.path.dirname(here) != here:
            here = os.path.dirname(here)
            try:
                st = os.lstat(here)
            except OSError:
                return False
            open_to_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX
            if st.st_uid not in (0, uid) or (stat.S_ISDIR(st.st_mode) and open_to_others):
                return False
    return True
