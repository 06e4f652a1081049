"""The hop contract: a transport runs an argv; a wrapper rewrites an argv one level further in.

A chain is ``transport (local | ssh) → [sudo] → [container] → interpreter``.  Wrappers never
subclass each other; they stack by wrapping the argv of the hop inside them (Mitogen's ``via``).
"""

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

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
