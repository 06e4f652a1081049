"""What mldiag remembers of each target's nvidia-smi between runs.

gpu-status asks a machine it has not seen three things at once (the GPUs with the newest field
names, the processes, ``--version`` for the CUDA version); an old driver that refuses a field
costs one more round (``--help-query-gpu``, then the query again). What a run learnt -- the
driver version, its CUDA version and the field names the driver took -- is kept here per target
name, and the next run sends it (``--known``): two calls, and ``--version`` only after a driver
change. Wrong or stale memory is never wrong data: the target checks the driver it sees and
falls back to asking.

The file is ``nvidia-smi.json`` in the user's cache (``core/usercache.py``: private, written as
``--save DIR`` is, read only if it is ours). What targets said is validated before it is kept
(it is sent back to the same target only). Best effort: a cache that cannot be read or written
is simply not used.
"""

import json
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ...core import usercache
from ...core.usercache import cache_dir

FILE = "nvidia-smi.json"
MAX_BYTES = 4 * 1024 * 1024
MAX_TARGETS = 10000                 # entries kept, the most recently seen
MAX_FIELDS = 64
VERSION = re.compile(r"^[0-9][0-9.]{0,19}$")
FIELD = re.compile(r"^[a-z][a-z0-9_.]{0,63}$")


def entry(raw: Any) -> Optional[Dict[str, Any]]:
    """A remembered entry, validated: {"driver", "cuda" (or None), "fields", "seen"}."""
    if not isinstance(raw, dict):
        return None
    driver, cuda, fields = raw.get("driver"), raw.get("cuda"), raw.get("fields")
    if not (isinstance(driver, str) and VERSION.match(driver)) or not isinstance(fields, list):
        return None
    if not all(isinstance(f, str) and FIELD.match(f) for f in fields) or not 0 < len(fields) <= MAX_FIELDS:
        return None
    seen = raw.get("seen")
    return {"driver": driver, "cuda": cuda if isinstance(cuda, str) and VERSION.match(cuda) else None,
            "fields": list(fields), "seen": seen if isinstance(seen, (int, float)) else 0}


def load(directory: Optional[Path] = None) -> Dict[str, Dict[str, Any]]:
    raw = usercache.read_json(FILE, MAX_BYTES, directory)
    if not isinstance(raw, dict):
        return {}
    kept = {name: e for name, e in ((n, entry(v)) for n, v in raw.items() if isinstance(n, str))
            if e is not None}
    return kept


_loaded: Dict[str, Dict[str, Dict[str, Any]]] = {}


def known_argv(name: str) -> List[str]:
    """``--known=JSON`` for gpu-status on target ``name``, when remembered (read once a process)."""
    directory = cache_dir()
    key = str(directory)
    if key not in _loaded:
        _loaded[key] = load(directory)
    found = _loaded[key].get(name)
    if found is None:
        return []
    return ["--known=" + json.dumps({k: found[k] for k in ("driver", "cuda", "fields")},
                                    separators=(",", ":"))]


def learnt(result: Any) -> Optional[Dict[str, Any]]:
    """What a gpu-status result teaches about its target's nvidia-smi, or None."""
    data = getattr(result, "data", None)
    if getattr(result, "status", "error") == "error" or not isinstance(data, dict):
        return None
    smi = data.get("nvidia_smi")
    if data.get("source") != "nvidia-smi" or not isinstance(smi, dict) or not data.get("gpus"):
        return None
    return entry({"driver": data.get("driver_version"), "cuda": data.get("cuda_version"),
                  "fields": smi.get("fields_asked"), "seen": time.time()})


def remember(results: Sequence[Any], directory: Optional[Path] = None) -> None:
    """Keep what the results taught (merged into what the file holds now); never raises."""
    new = {r.target: e for r, e in ((r, learnt(r)) for r in results) if e is not None}
    directory = directory or cache_dir()
    if not new or directory is None:
        return
    merged = load(directory)
    if all(merged.get(name, {}).get(k) == e[k] for name, e in new.items() for k in ("driver", "cuda", "fields")):
        return                          # nothing new: no write
    merged.update(new)
    if len(merged) > MAX_TARGETS:
        merged = dict(sorted(merged.items(), key=lambda kv: kv[1]["seen"])[-MAX_TARGETS:])
    usercache.write_json(FILE, merged, directory)
    _loaded.pop(str(directory), None)
