"""Node sets (ClusterShell's syntax, group lookups off): one expand, one fold, one comma split.

Every node set mldiag reads — hosts.yaml keys, addresses, groups and Slurm nodelists, ``-H``
values, a Slurm login node's ``squeue`` answer — is expanded here, and its size is checked
*before* ClusterShell expands it: ClusterShell builds every index in memory (~4 s and
hundreds of MB per million names), so ``n[1-2000000]`` from a login node, or a 5 KB file
repeating ``n[1-99999]`` 400 times, would cost minutes and gigabytes.

Bounds (docs/hosts-file.md, "Rules"):
- ``MAX_NODES`` (100,000) names from one node set, one ``-H`` selection, one group, the
  targets of one hosts.yaml, or one Slurm allocation;
- ``MAX_FILE_NAMES`` (500,000) names expanded in all while reading one hosts.yaml (node sets,
  addresses, group members and group references together).
"""

import re
from typing import Any, Iterable, List, Optional, Tuple

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

MAX_NODES = 100_000
MAX_FILE_NAMES = 500_000


class TooManyNodes(ValueError):
    pass


def split_top_level(text: str, separators: str = ",") -> List[str]:
    """Split at separators outside brackets: ``a[1,2],b`` → ``a[1,2]``, ``b`` (parts as written,
    empty ones included)."""
    parts, current, depth = [], [], 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        if char in separators and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def size_bound(text: str) -> int:
    """At least as many names as ``text`` expands to, counted without expanding (the
    operators ``!&^`` are counted as unions: an over-estimate, never an under-estimate)."""
    total = 0
    for pattern in split_top_level(text, ",!&^ "):
        size = 1
        for ranges in re.findall(r"\[([^\[\]]*)\]", pattern):
            size *= sum(_range_size(item) for item in ranges.split(","))
        total += size
    return total


def _range_size(item: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*(?:/\s*(\d+)\s*)?)?", item)
    if not match or match.group(2) is None:
        return 1
    first, last, step = int(match.group(1)), int(match.group(2)), int(match.group(3) or 1)
    return max(last - first, 0) // max(step, 1) + 1


def expand(text: str, limit: int = MAX_NODES) -> List[str]:
    """ClusterShell's expansion of ``text``, in its order; ValueError when malformed or empty,
    ``TooManyNodes`` (a ValueError) past ``limit`` names, before anything is expanded."""
    bound = size_bound(text)
    if bound > limit:
        raise TooManyNodes(f"node set {_excerpt(text)} has up to {bound} nodes (at most {limit})")
    try:
        nodes = list(NodeSet(text, resolver=RESOLVER_NOGROUP))
    except NodeSetException as exc:
        raise ValueError(f"invalid node set {_excerpt(text)}: {exc}") from None
    if not nodes:
        raise ValueError(f"node set {_excerpt(text)} is empty")
    return nodes


def _excerpt(text: str, width: int = 80) -> str:
    return repr(text if len(text) <= width else text[:width] + "...")


class Budget:
    """Names left to expand while reading one input (a hosts.yaml, a set of -H values)."""

    def __init__(self, limit: int, what: str):
        self.limit = limit
        self.left = limit
        self.what = what

    def spend(self, count: int) -> None:
        if count > self.left:
            raise TooManyNodes(f"more than {self.limit} names in {self.what} (node sets, "
                               f"groups and their repeats counted)")
        self.left -= count

    def expand(self, text: str) -> List[str]:
        """``expand(text)``, its size counted against this budget before expanding."""
        bound = size_bound(text)
        if bound <= MAX_NODES:
            self.spend(bound)
        return expand(text)


# ----------------------------------------------------------------------------------- folding

def natural_key(name: str) -> Tuple[Tuple[Any, ...], str]:
    """``node2`` before ``node10``; the raw name breaks ties (``n1`` vs ``n01``)."""
    parts = re.split(r"(\d+)", name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


def _read_back(name: str) -> Optional[NodeSet]:
    """``name`` as a one-node NodeSet when ClusterShell reads it back as exactly that node.

    ``,``, brackets, the ``!&^`` operators and surrounding whitespace mean something to the
    node-set parser; for such names this returns None and they are shown as they are.
    """
    if "[" in name:
        return None   # brackets never read back as themselves; and x[1-99999999] is huge
    try:
        single = NodeSet(name, resolver=RESOLVER_NOGROUP)
    except NodeSetException:
        return None
    return single if len(single) == 1 and str(single) == name else None


def fold(names: Iterable[str]) -> str:
    """``gpu01..gpu08, gpu12`` → ``gpu[01-08,12]``; duplicates collapse.

    Folding is ClusterShell's (group syntax off, so ``@x`` is a plain name and no group
    source is ever consulted). ``:`` is a plain name character to ClusterShell, so Slurm
    rows fold too: ``cluster-a:n[1-4]``. Names the parser would read as something else
    (``a,b``, ``x[1]``, ``bad]``) follow as a plain comma list, in natural order.
    """
    folded = NodeSet(resolver=RESOLVER_NOGROUP)
    plain: List[str] = []
    for name in dict.fromkeys(str(n) for n in names):
        single = _read_back(name)
        if single is None:
            plain.append(name)
        else:
            folded.update(single)
    parts = [str(folded)] if len(folded) else []
    parts.extend(sorted(plain, key=natural_key))
    return ",".join(parts)
