"""What travels to a target: a fixed bootstrap on the command line, everything else on stdin.

The command line carries only ``PYTHON -c BOOT``.  BOOT is a constant of ours made of characters
no shell treats specially inside single quotes, so every login shell (sh, bash, zsh, fish, csh)
passes it through untouched (DESIGN.md §3 invariant 1).  The script, its arguments, env values
and any extra files ride in the payload written to the exec channel's stdin:

    len\\n STAGE_A · len\\n _runtime.py · len\\n header JSON · len\\n the files, concatenated

(the header's ``files`` lists each file's name and size, in order).

Stage A checks the interpreter version before anything 3.8-only is compiled.
"""

import json
import os
import secrets
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

SCRIPTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts")

BOOT = "import sys;b=sys.stdin.buffer;exec(b.read(int(b.readline())))"
OLD_PYTHON_MARK = "@@MLDIAG-OLD-PYTHON"

# Runs under whatever python3 the target has (py3.0+ syntax only): refuse < 3.8 in a way the
# client recognises, then load the runtime from the stream and hand it the rest of stdin.
STAGE_A = """\
import sys
if sys.version_info < (3, 8):
    sys.stdout.write("\\n%s %s %s@@\\n" % ("@@MLDIAG-OLD-PYTHON", ".".join(map(str, sys.version_info[:3])), sys.executable))
    sys.stdout.flush()
    raise SystemExit(0)
src = b.read(int(b.readline()))
g = {"__name__": "mldiag_runtime", "__builtins__": __builtins__}
exec(compile(src, "mldiag/_runtime.py", "exec"), g)
g["RUNTIME_SOURCE"] = src
g["main"](b)
"""

# Characters a shell leaves alone inside single quotes, in every common shell (csh: no '!').
_FORBIDDEN_IN_BOOT = set("'\"\\!$`\n")
assert not (_FORBIDDEN_IN_BOOT & set(BOOT)), "BOOT must stay shell-inert"


def _read_runtime() -> bytes:
    with open(os.path.join(SCRIPTS_DIR, "_runtime.py"), "rb") as f:
        return f.read()


_RUNTIME = _read_runtime()
_STAGE_A = STAGE_A.encode("utf-8")


@dataclass(frozen=True)
class Job:
    """One diagnostic run, independent of where it runs."""
    diagnostic: str                      # task name, e.g. "gpu-status" or "run-script"
    script_name: str                     # file name inside the bundle
    script_source: bytes
    argv: Sequence[str] = ()
    mode: str = "diagnostic"             # "diagnostic": run(args) -> dict; "script": __main__ + exit code
    extra_files: Dict[str, bytes] = field(default_factory=dict)
    keep_remote: bool = False
    timeout: Optional[float] = None      # overrides the target's timeout


def script_job(diagnostic: str, argv: Sequence[str] = (), **kw) -> Job:
    """A Job for one of our own scripts (``gpu-status`` → ``scripts/gpu_status.py``)."""
    name = diagnostic.replace("-", "_") + ".py"
    with open(os.path.join(SCRIPTS_DIR, name), "rb") as f:
        source = f.read()
    return Job(diagnostic=diagnostic, script_name=name, script_source=source, argv=tuple(argv), **kw)


def _frame(data: bytes) -> bytes:
    return str(len(data)).encode("ascii") + b"\n" + data




def build_header(job: Job, *, target: str, timeout: float, env: Dict[str, str],
                 activate: Sequence[str], python: str, nonce: str,
                 tmpdir: Optional[str] = None) -> dict:
    header = {"v": 1, "nonce": nonce, "diagnostic": job.diagnostic, "target": target,
              "mode": job.mode, "script": job.script_name, "argv": list(job.argv),
              "env": dict(env), "timeout": timeout, "keep": job.keep_remote,
              "activate": list(activate), "python": python}
    if tmpdir:
        header["tmpdir"] = tmpdir
    return header


def build_payload(header: dict, files: Dict[str, bytes]) -> bytes:
    """The bytes written to the bootstrap's stdin. Files are plain concatenated bytes (no zip:
    its import and parse cost every target CPU time); the header says where each one ends."""
    header = dict(header, files=[[name, len(data)] for name, data in files.items()])
    return b"".join((_frame(_STAGE_A), _frame(_RUNTIME), _frame(json.dumps(header).encode("utf-8")),
                     _frame(b"".join(files.values()))))


def new_nonce() -> str:
    return secrets.token_hex(8)


def job_files(job: Job) -> Dict[str, bytes]:
    files = {job.script_name: job.script_source}
    for name, data in job.extra_files.items():
        if name in files:
            raise ValueError(f"--put {name}: clashes with the script's own name")
        files[name] = data
    return files


def bootstrap_argv(python: str) -> List[str]:
    return [python, "-c", BOOT]


def parse_payload(payload: bytes):
    """Inverse of ``build_payload`` (what the target reads): (stage A, runtime, header, files)."""
    parts, rest = [], payload
    for _ in range(4):
        size, _, rest = rest.partition(b"\n")
        n = int(size)
        parts.append(rest[:n])
        rest = rest[n:]
    if rest:
        raise ValueError(f"{len(rest)} trailing bytes after the bundle")
    header = json.loads(parts[2].decode("utf-8"))
    files, offset = {}, 0
    for name, size in header.pop("files"):
        files[name] = parts[3][offset:offset + size]
        offset += size
    return parts[0].decode(), parts[1], header, files
