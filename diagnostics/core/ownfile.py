"""Reading a file this side keeps for itself (remembered nvidia-smi fields, kept ``ssh -G``
answers): only a regular file of the user's own that no one else may write, reached through no
link, and bounded; any other file is as good as none."""

import os
import stat
from typing import Optional, Union


def read_own(path: Union[str, os.PathLike], max_bytes: int, dir_fd: Optional[int] = None) -> Optional[bytes]:
    """The bytes of ``path`` (relative to ``dir_fd`` when given), or None: missing, a link,
    not a regular file, not the effective user's, writable by its group or others (then what
    it says may be theirs), larger than ``max_bytes``, unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or st.st_size > max_bytes):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(max_bytes + 1)[:max_bytes]
    except OSError:
        return None
    finally:
        os.close(fd)
