"""stacks ships py-spy only to a target that has none.

The client's py-spy is the PyPI wheel's binary (``pip install 'fabric-mldiag[stacks]'``): a
static executable, so it runs on any Linux of its machine type. A stacks job is offered with
``--offer-py-spy=MACHINE``; a target without py-spy whose machine type matches stops after
finding the job's processes and says ``wants_py_spy``; the job's ``follow_up`` then runs it
again on that target (same connection) with the binary in the run's private temp dir, where
stacks.py finds it beside itself. A target with py-spy, a target of another machine type,
``--no-upload``, or a client without a usable binary: one run, nothing shipped (the target reads
the stacks with the standard-library reader when it has no py-spy).
"""

import functools
import os
import shutil
import struct
import sys
from dataclasses import replace
from typing import Any, Mapping, Optional, Tuple

from ...engine.bundle import Job

OFFER_FLAG = "--offer-py-spy="
ELF_MACHINES = {62: "x86_64", 183: "aarch64", 40: "armv7l", 21: "ppc64le", 22: "s390x"}
PT_INTERP = 3
MAX_BINARY = 64 * 1024 * 1024


def static_elf_machine(data: bytes) -> Optional[str]:
    """The machine type (as ``uname -m`` says it) of a 64-bit little-endian ELF executable
    without a program interpreter (static or static-pie), else None."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    e_machine, = struct.unpack_from("<H", data, 18)
    e_phoff, = struct.unpack_from("<Q", data, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
    if e_phentsize < 4 or e_phoff + e_phentsize * e_phnum > len(data):
        return None
    for i in range(e_phnum):
        p_type, = struct.unpack_from("<I", data, e_phoff + i * e_phentsize)
        if p_type == PT_INTERP:
            return None
    return ELF_MACHINES.get(e_machine)


def find_local_py_spy() -> Optional[str]:
    """py-spy beside this Python (a venv's bin), else on PATH."""
    return (shutil.which("py-spy", path=os.path.dirname(sys.executable))
            or shutil.which("py-spy"))


@functools.lru_cache(maxsize=4)
def shippable(path: Optional[str]) -> Optional[Tuple[str, bytes]]:
    """(machine type, bytes) of the binary at ``path`` when it can run on another machine."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BINARY + 1)
    except OSError:
        return None
    machine = static_elf_machine(data) if len(data) <= MAX_BINARY else None
    return (machine, data) if machine else None


def offer(job: Job, values: Mapping[str, Any], *, binary: Optional[str] = None) -> Job:
    """The stacks job, offering py-spy when the client has a shippable one."""
    if values.get("no-upload"):
        return job
    ship = shippable(binary or find_local_py_spy())
    if ship is None:
        return job
    machine, data = ship
    return replace(job, argv=tuple(job.argv) + (OFFER_FLAG + machine,),
                   follow_up=functools.partial(_with_py_spy, job, data))


def _with_py_spy(job: Job, data: bytes, result: Any) -> Optional[Job]:
    """The job again with py-spy shipped, when the target asked for it (and only then)."""
    asked = isinstance(result.data, dict) and result.data.get("wants_py_spy") is True
    if result.status == "error" or not asked:
        return None
    return replace(job, extra_files={**job.extra_files, "py-spy": data})
