"""hosts.yaml → frozen dataclasses (DESIGN.md §2).

CONTRACT (the loader below is to be implemented; other modules rely on these types):

    load(path: Optional[str]) -> Topology
        path None  → $MLDIAG_HOSTS_FILE, else ./hosts.yaml; when that default file does not
                     exist, a Topology holding only the embedded ``local`` target.
        explicit path that does not exist / is a directory → InputError (exit 4).
    loads(text: str, path: str = "hosts.yaml") -> Topology     (same, from a string)
    Topology.select(hosts: Sequence[str], groups: Sequence[str]) -> List[Target]

Every validation error is an ``errors.InputError`` whose message reads
``FILE:LINE: dotted.key: what was expected``.
"""

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from .errors import InputError

RUNTIMES = ("pct", "docker", "podman", "lxc", "kubectl")
HOST_KEY_POLICIES = ("strict", "accept-new")
BECOME_METHODS = ("sudo",)

# Tokens that may appear on a remote command line (DESIGN.md §3 invariant 1): nothing any
# login shell (sh, bash, zsh, fish, csh) treats specially, and no leading '=' or '~'.
SAFE_TOKEN = re.compile(r"[A-Za-z0-9_@%+,./:-]+")


def is_safe_token(token: str) -> bool:
    return bool(SAFE_TOKEN.fullmatch(token))


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
    slurm: Optional[Slurm] = None
    source: Tuple[str, int] = ("<embedded>", 0)   # file, line where the target is defined

    @property
    def env_dict(self) -> Dict[str, str]:
        return dict(self.env)

    @property
    def default_model(self) -> Optional[str]:
        return self.models[0][1] if self.models else None


LOCAL_TARGET = Target(name="local", local=True)


@dataclass(frozen=True)
class Topology:
    path: Optional[str]                          # None when nothing was read (embedded local only)
    targets: Dict[str, Target] = field(default_factory=dict)   # in file order
    groups: Dict[str, Tuple[str, ...]] = field(default_factory=dict)  # expanded target names
    default_targets: Tuple[str, ...] = ("local",)

    def select(self, hosts: Sequence[str] = (), groups: Sequence[str] = ()) -> List[Target]:
        raise NotImplementedError


def load(path: Optional[str] = None) -> Topology:
    raise NotImplementedError


def loads(text: str, path: str = "hosts.yaml") -> Topology:
    raise NotImplementedError
