"""What mldiag keeps for its user between runs: JSON files in one private directory.

The directory is ``$MLDIAG_CACHE_DIR``, else ``$XDG_CACHE_HOME/mldiag``, else ``~/.cache/mldiag``.
A file is written as ``--save DIR`` writes (``savedir.SaveDir``: a 0700 directory of our own,
never a link nor one others can write; a fresh ``O_EXCL|O_NOFOLLOW`` temp file renamed over the
name) and read only if it is a regular file of ours in a directory of ours. Best effort: a file
that cannot be read is None, one that cannot be written is not (callers keep no state on it).
"""

import json
import os
import stat
from pathlib import Path
from typing import Any, Optional

from .errors import InputError
from .ownfile import read_own
from .savedir import SaveDir


def cache_dir() -> Optional[Path]:
    for var, sub in (("MLDIAG_CACHE_DIR", ""), ("XDG_CACHE_HOME", "mldiag")):
        value = os.environ.get(var)
        if value:
            return Path(value) / sub if sub else Path(value)
    home = os.path.expanduser("~")
    return Path(home) / ".cache" / "mldiag" if home and home != "~" else None


def _own_dir(path: Path) -> bool:
    """A directory of ours, not a link."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()


def read_json(name: str, max_bytes: int, directory: Optional[Path] = None) -> Any:
    """The JSON document in file ``name`` of the cache, or None (no such file of ours, too big,
    not JSON)."""
    directory = directory or cache_dir()
    if directory is None or not _own_dir(directory):
        return None
    data = read_own(directory / name, max_bytes)
    try:
        return json.loads(data.decode("utf-8")) if data is not None else None
    except ValueError:
        return None


def write_json(name: str, document: Any, directory: Optional[Path] = None) -> bool:
    """``document`` as file ``name`` of the cache; False where it could not be written."""
    directory = directory or cache_dir()
    if directory is None:
        return False
    try:
        with SaveDir.open(str(directory)) as cache:
            cache.write_json(name, document)
        return True
    except (InputError, OSError):
        return False
