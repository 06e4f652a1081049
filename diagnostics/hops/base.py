"""The hop contract: a transport runs an argv; a wrapper rewrites an argv one level further in.

A chain is ``transport (local | ssh) → [sudo] → [container] → interpreter``.  Wrappers never
subclass each other; they stack by wrapping the argv of the hop inside them (Mitogen's ``via``).
"""

import json
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

# Audit: when set, every command line sent to a hop is appended to this file as one JSON line
# ({"hop", "line", "pid"}), exactly as sent. The test suite turns it on for every test and then
# checks each line against the safe alphabet (DESIGN.md §3 invariant 1).
RECORD_ENV = "MLDIAG_RECORD_COMMANDS"

Classification = Optional[Tuple[str, str]]   # (error layer, one-line reason) or None


class Wrapper:
    """One in-process hop (sudo, a container runtime)."""

    kind = "?"

    def wrap(self, argv: Sequence[str]) -> List[str]:
        raise NotImplementedError

    def put_argv(self, src: str, dest: str) -> List[str]:
        """argv, run one level out, that places ``src`` (a path there) at ``dest`` inside."""
        raise NotImplementedError(f"the {self.kind} hop does not support put")

    def describe(self) -> str:
        raise NotImplementedError

    def classify(self, exit_code: Optional[int], stderr: str) -> Classification:
        """Name this hop's failure from the chain's exit code and stderr, if it is one."""
        return None


@dataclass
class ProcessOutput:
    stdout: bytes
    stderr: bytes
    exit_code: Optional[int]      # None when the process did not end (timeout) or the link died
    timed_out: bool = False
    lost: Optional[str] = None    # why the link was lost, if it was


def first_line(text: str, limit: int = 300) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:limit]
    return ""


def find_line(text: str, *needles: str) -> Optional[str]:
    """The first stderr line containing any needle (case-insensitive)."""
    for line in text.splitlines():
        low = line.lower()
        if any(n.lower() in low for n in needles):
            return line.strip()[:300]
    return None


def record_command(hop: str, line: str) -> None:
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    entry = (json.dumps({"hop": hop, "line": line, "pid": os.getpid()}) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, entry)   # one O_APPEND write per line: whole lines from many processes
    finally:
        os.close(fd)
