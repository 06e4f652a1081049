"""Targets and their selection: the data a hosts file is read into (``Target`` and the hops it
names: ``SshHost``, ``Container``, ``Slurm``), and which of them a command line's -H/-g names
(``select``: names, comma lists, node sets, groups, a Slurm login's ``NAME:nodes`` rows).
Reading and checking the file is ``topology.py``'s.
"""

import difflib
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..core import nodeset
from ..core.errors import InputError
from .yamlfile import NAME

# Node-set bounds (see nodeset.py): names per node set / selection / group / file's targets.
MAX_NODES = nodeset.MAX_NODES


@dataclass(frozen=True)
class SshHost:
    """A machine reached over SSH. ``address`` None means: an ssh_config alias named ``name``."""
    name: str
    address: Optional[str] = None
    port: Optional[int] = None
    user: Optional[str] = None
    identity_file: Optional[str] = None
    connect_timeout: float = 10.0
    host_key_policy: Optional[str] = None   # None: as ssh_config's StrictHostKeyChecking says
    jump: Optional["SshHost"] = None        # ProxyJump through this host (itself maybe jumped)
    persist: Optional[float] = None         # seconds held between calls; None: as ssh_config says


@dataclass(frozen=True)
class Container:
    runtime: str                  # one of RUNTIMES
    id: str                       # VMID, container name/id, or pod name
    namespace: Optional[str] = None   # kubectl only
    container: Optional[str] = None   # kubectl only (-c)
    exec_user: Optional[str] = None


@dataclass(frozen=True)
class Slurm:
    partition: Optional[str] = None
    nodes: int = 1
    gpus_per_node: Optional[int] = None
    time: Optional[str] = None
    account: Optional[str] = None
    nodelist: Optional[str] = None
    reservation: Optional[str] = None      # salloc --reservation (a maintenance window)


@dataclass(frozen=True)
class Target:
    """One thing a diagnostic runs on: a host, or a container on a host."""
    name: str
    local: bool = False
    host: Optional[SshHost] = None          # None when local
    become: Optional[str] = None            # "sudo" or None
    container: Optional[Container] = None
    python: str = "python3"
    activate: Tuple[str, ...] = ()          # e.g. ("/opt/conda/etc/profile.d/conda.sh", "conda", "activate", "train")
    env: Tuple[Tuple[str, str], ...] = ()   # merged defaults → host → container
    timeout: float = 300.0
    models: Tuple[Tuple[str, str], ...] = ()  # (name, path); the first is the default
    gpus: Optional[int] = None
    # node-check's expectations (EXPECT_KEYS), merged defaults → host → container; ``gpus:``
    # is the shorthand of ``expect: {gpus: N}``
    expect: Tuple[Tuple[str, int], ...] = ()
    # hosts.yaml paths: ((name, absolute directory, least free GB or None), ...), merged
    # defaults → host → container by name; node-check's host check stats them on the node
    paths: Tuple[Tuple[str, str, Optional[float]], ...] = ()
    slurm: Optional[Slurm] = None
    tmpdir: Optional[str] = None            # where the private temp dir is made (default: $TMPDIR, /tmp, ...)
    code_cache: bool = True                 # the target may keep mldiag's own code compiled (scripts/_stage_a.py)
    peer_address: Optional[str] = None      # where a group's other members reach it (engine/groups.py)
    baseline: Optional[str] = None          # node-check's golden file (absolute; hosts.yaml baseline:)
    source: Tuple[str, int] = ("<embedded>", 0)   # file, line where the target is defined

    @property
    def env_dict(self) -> Dict[str, str]:
        return dict(self.env)

    @property
    def expect_dict(self) -> Dict[str, int]:
        merged = dict(self.expect)
        if self.gpus is not None:           # ``gpus:`` is the shorthand of expect: {gpus: N}
            merged.setdefault("gpus", self.gpus)
        return merged

    @property
    def default_model(self) -> Optional[str]:
        return self.models[0][1] if self.models else None


LOCAL_TARGET = Target(name="local", local=True)


def expand_selector(text: str, budget: Optional[nodeset.Budget] = None) -> List[str]:
    """``"gpu[01-04],b200"`` → names in the order written (each node set in ClusterShell's
    order). Names with ':' (Slurm node rows) are kept as they are. ValueError when malformed,
    when the whole selection could name more than ``MAX_NODES`` (counted before anything is
    expanded), or past ``budget`` (the names still allowed to the input being read)."""
    parts = [part.strip() for part in nodeset.split_top_level(text, ",")]
    if not all(parts):
        raise ValueError(f"empty name in {_excerpt(text)}")
    plain = [":" in part or bool(NAME.fullmatch(part)) for part in parts]
    # a Slurm row `cluster-a:n[1-4]` stands for its nodes: counted as them
    bound = sum(nodeset.size_bound(part.partition(":")[2]) if ":" in part
                else 1 if is_plain else nodeset.size_bound(part) for part, is_plain in zip(parts, plain))
    if bound > MAX_NODES:
        raise nodeset.TooManyNodes(f"{_excerpt(text)} names up to {bound} targets "
                                   f"(at most {MAX_NODES})")
    if budget is not None:
        budget.spend(bound)
    names = []
    for part, is_plain in zip(parts, plain):
        names.extend([part] if is_plain else nodeset.expand(part))
    return names


def fold_names(names: Sequence[str]) -> str:
    """``gpu01, gpu02, b200`` → ``b200,gpu[01-02]`` (ClusterShell folding)."""
    return nodeset.fold(names)


def _excerpt(text: str, width: int = 80) -> str:
    return repr(text if len(text) <= width else text[:width] + "...")


def unique_in_order(names: Sequence[str]) -> List[str]:
    return list(dict.fromkeys(names))


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """`` (did you mean 'trainbox'? known: b200,gpu[01-16],local)``, the list folded and cut."""
    close = difflib.get_close_matches(name, list(known), n=1)
    folded = fold_names(list(known))
    if len(folded) > 200:
        folded = folded[:200].rsplit(",", 1)[0] + ",..."
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f" ({guess}known: {folded})"


# ---------------------------------------------------------------------------- selecting

def select(topo: Any, hosts: Sequence[str] = (), groups: Sequence[str] = ()) -> List[Target]:
    """Targets named by --host values (names, comma lists, node sets) then --group names,
    de-duplicated in order; neither given → ``default_targets``."""
    if not hosts and not groups:
        names = list(topo.default_targets)
    else:
        budget = nodeset.Budget(MAX_NODES, "the --host values")
        names = [n for value in hosts for n in _named_targets(topo, value, budget)]
        names += [n for group in groups for n in _group_members(topo, group)]
    return [topo.targets.get(name) or _slurm_row(topo, name) for name in unique_in_order(names)]


def _named_targets(topo: Any, value: str, budget: nodeset.Budget) -> List[str]:
    try:
        names = expand_selector(value, budget)
    except ValueError as exc:
        raise InputError(str(exc), key="--host") from None
    for name in names:
        if name not in topo.targets and not _slurm_row(topo, name):
            raise InputError(f"unknown target {name!r}{did_you_mean(name, topo.targets)}")
    return names


def _slurm_row(topo: Any, name: str) -> Optional[Target]:
    """``cluster-a:n3`` (or ``cluster-a:n[1-2]``): the Slurm login target restricted to
    those nodes; None when ``name`` is not of that form."""
    base, sep, nodes = name.partition(":")
    target = topo.targets.get(base)
    if not sep or target is None or target.slurm is None or not nodes:
        return None
    try:
        expanded = nodeset.expand(nodes)
    except ValueError as exc:
        raise InputError(f"{name}: {exc}", key="--host") from None
    for node in expanded:
        if not NAME.fullmatch(node):
            raise InputError(f"{name}: node name {node!r} is not a plain name", key="--host")
    slurm = replace(target.slurm, nodes=len(expanded), nodelist=",".join(expanded))
    return replace(target, name=name, slurm=slurm)


def _group_members(topo: Any, group: str) -> Tuple[str, ...]:
    if group not in topo.groups:
        if not topo.groups:
            raise InputError(f"unknown group {group!r} (no groups are defined"
                             f"{' in ' + topo.path if topo.path else ''})")
        raise InputError(f"unknown group {group!r}{did_you_mean(group, topo.groups)}")
    return topo.groups[group]
