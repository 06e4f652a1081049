"""ssh_config as OpenSSH reads it: ask the local ``ssh -G`` for the effective settings.

paramiko's parser ignores ``Include`` and Fabric ignores ``UserKnownHostsFile``; ``ssh -G`` prints
exactly what OpenSSH would use (Include, Match, ProxyJump, ProxyCommand, UserKnownHostsFile with
hashed entries...).  ``$MLDIAG_SSH_CONFIG`` names another config file (``ssh -F``).
hosts.yaml settings win over ssh_config ones.
"""

import os
import shutil
import subprocess
import threading
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

from ..core.errors import InputError
from ..inventory.topology import SshHost
from . import sshg_cache

# OpenSSH's ControlPersist=yes (or 0) keeps a master until it is told to exit; a held
# connection here always expires (transport/held.py): "forever" is this long unused.
PERSIST_FOREVER_S = 3600.0
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "~/.ssh/known_hosts2")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")


@dataclass(frozen=True)
class Endpoint:
    """Everything needed to open one SSH connection, after ssh_config and hosts.yaml."""
    label: str                         # hosts.yaml name (or the ProxyJump spec) for messages
    hostname: str
    port: int
    user: str
    identity_files: Tuple[str, ...]
    known_hosts: Tuple[str, ...]       # UserKnownHostsFile, expanded; the first is written to
    global_known_hosts: Tuple[str, ...]
    strict: str                        # "yes" | "accept-new" | "no"
    connect_timeout: float
    jump: Optional["Endpoint"] = None
    proxy_command: Optional[str] = None
    hash_known_hosts: bool = False     # ssh_config HashKnownHosts: accept-new writes hashed names
    persist: float = 0.0               # seconds a connection is held unused between calls (held.py)

    @property
    def key(self) -> tuple:
        """Identity of the physical connection: same key, same shared transport. What it was
        authenticated and verified with is part of it: a target written with another key or
        a stricter host-key policy never rides a connection opened without them."""
        return (self.user, self.hostname, self.port, self.proxy_command,
                self.jump.key if self.jump else None, self.identity_files, self.known_hosts,
                self.global_known_hosts, self.strict, self.hash_known_hosts)

    @property
    def known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def describe(self) -> str:
        port = "" if self.port == 22 else f":{self.port}"
        return f"ssh {self.user}@{self.hostname}{port}"


_cache: Dict[tuple, Dict[str, List[str]]] = {}
_cache_lock = threading.Lock()


def ssh_dash_g(alias: str, port: Optional[int] = None, user: Optional[str] = None) -> Dict[str, List[str]]:
    """``ssh -G`` output as {lowercase key: [values...]} (cached per process, and between
    processes while the config and what it depends on are unchanged: sshg_cache.py)."""
    config = os.environ.get("MLDIAG_SSH_CONFIG")
    key = (alias, port, user, config)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    ssh = shutil.which("ssh")
    if not ssh:
        result = _paramiko_fallback(alias, config)
    else:
        argv = [ssh, "-G"]
        if config:
            argv += ["-F", config]
        if port:
            argv += ["-p", str(port)]
        if user:
            argv += ["-l", user]
        argv += ["--", alias]
        asked = sshg_cache.answer_key(alias, port, user)
        kept, store = sshg_cache.lookup(ssh, config, asked)
        if kept is None:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=10)
            if proc.returncode != 0:
                raise InputError(f"ssh -G {alias} failed: "
                                 f"{proc.stderr.decode(errors='replace').strip()}", key="ssh_config")
            kept = proc.stdout.decode(errors="replace")
            if store is not None:
                sshg_cache.keep(store, asked, kept)
        result = {}
        for line in kept.splitlines():
            k, _, v = line.partition(" ")
            result.setdefault(k.lower(), []).append(v)
    with _cache_lock:
        _cache[key] = result
    return result


def _paramiko_fallback(alias: str, config: Optional[str]) -> Dict[str, List[str]]:
    """No OpenSSH client here: paramiko's parser (no Include support) is the best we have."""
    import paramiko
    path = config or os.path.expanduser("~/.ssh/config")
    cfg = paramiko.SSHConfig.from_path(path) if os.path.exists(path) else paramiko.SSHConfig()
    found = cfg.lookup(alias)
    out = {k.lower(): (v if isinstance(v, list) else [str(v)]) for k, v in found.items()}
    out.setdefault("hostname", [alias])
    return out


def _one(g: Dict[str, List[str]], key: str) -> Optional[str]:
    vals = g.get(key)
    if not vals or vals[0].lower() == "none":
        return None
    return vals[0]


def _strict(policy: Optional[str], g: Dict[str, List[str]]) -> str:
    if policy == "accept-new":
        return "accept-new"
    if policy == "strict":
        return "yes"
    value = (_one(g, "stricthostkeychecking") or "ask").lower()
    if value in ("accept-new",):
        return "accept-new"
    if value in ("no", "off", "false"):
        return "no"
    return "yes"  # yes / ask / true: we cannot ask, so refuse an unknown key


def persist_seconds(g: Dict[str, List[str]]) -> float:
    """How long OpenSSH itself would keep this host's connection between calls: ControlPersist
    (``ssh -G`` prints seconds, ``yes`` or ``no``), when ControlMaster makes a master at all."""
    master = (_one(g, "controlmaster") or "no").lower()
    value = (_one(g, "controlpersist") or "no").lower()
    if master in ("no", "false") or value in ("no", "false"):
        return 0.0
    if value in ("yes", "true", "0"):
        return PERSIST_FOREVER_S
    try:
        return min(max(float(value), 0.0), PERSIST_FOREVER_S)
    except ValueError:
        return 0.0


def _split_jump(spec: str) -> Tuple[Optional[str], str, Optional[int]]:
    """``user@host:port`` → (user, host, port)."""
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, p = rest.split(":")
        port = int(p)
    return (user or None), host, port


def _expand_proxy_command(cmd: str, hostname: str, port: int, user: str) -> str:
    out, i = [], 0
    while i < len(cmd):
        c = cmd[i]
        if c == "%" and i + 1 < len(cmd):
            out.append({"h": hostname, "p": str(port), "r": user, "n": hostname, "%": "%"}
                       .get(cmd[i + 1], "%" + cmd[i + 1]))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def resolve(host: SshHost) -> Endpoint:
    """An Endpoint for a hosts.yaml host: its own settings over ssh_config's."""
    alias = host.address or host.name
    g = ssh_dash_g(alias, host.port, host.user)
    jump = resolve(host.jump) if host.jump else None
    if jump is None:
        spec = _one(g, "proxyjump")
        if spec:
            jump = _resolve_jump_spec(spec, host.connect_timeout)
    endpoint = _endpoint(host.name, g, host.port, host.user, host.identity_file,
                         host.host_key_policy, host.connect_timeout, jump)
    persist = host.persist if host.persist is not None else persist_seconds(g)
    return replace(endpoint, persist=persist) if persist else endpoint


def _resolve_jump_spec(spec: str, connect_timeout: float) -> Endpoint:
    """ProxyJump ``a,b``: connect to a, through a to b, through b to the target."""
    jump = None
    for hop in spec.split(","):
        user, host, port = _split_jump(hop.strip())
        g = ssh_dash_g(host, port, user)
        inner_spec = _one(g, "proxyjump")
        if jump is None and inner_spec:
            jump = _resolve_jump_spec(inner_spec, connect_timeout)
        jump = _endpoint(hop.strip(), g, port, user, None, None, connect_timeout, jump)
    return jump


def _endpoint(label, g, port, user, identity_file, policy, connect_timeout, jump) -> Endpoint:
    hostname = _one(g, "hostname") or label
    port = port or int(_one(g, "port") or 22)
    user = user or _one(g, "user") or os.environ.get("USER") or "root"
    if identity_file:
        identities = (os.path.expanduser(identity_file),)
    else:
        identities = tuple(p for p in (os.path.expanduser(v) for v in g.get("identityfile", []))
                           if os.path.exists(p))
    known = tuple(os.path.expanduser(p) for v in g.get("userknownhostsfile", []) for p in v.split()) \
        or tuple(os.path.expanduser(p) for p in DEFAULT_KNOWN_HOSTS)
    global_known = tuple(p for v in g.get("globalknownhostsfile", []) for p in v.split()) \
        or DEFAULT_GLOBAL_KNOWN_HOSTS
    proxy = _one(g, "proxycommand") if jump is None else None
    if proxy:
        proxy = _expand_proxy_command(proxy, hostname, port, user)
    return Endpoint(label=label, hostname=hostname, port=port, user=user,
                    identity_files=identities, known_hosts=known, global_known_hosts=global_known,
                    strict=_strict(policy, g), connect_timeout=float(connect_timeout),
                    jump=jump, proxy_command=proxy,
                    hash_known_hosts=(_one(g, "hashknownhosts") or "no").lower() == "yes")
