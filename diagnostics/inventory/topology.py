"""The hosts file: found, read and checked into a ``Topology`` (docs/hosts-file.md). The
targets it holds, and the selection of targets by -H/-g, are ``targets.py``'s.

CONTRACT (other modules rely on these types):

    load(path: Optional[str]) -> Topology
        path None  → $MLDIAG_HOSTS_FILE, else ./hosts.yaml, else the user's
                     $XDG_CONFIG_HOME/mldiag/hosts.yaml (~/.config/mldiag/hosts.yaml); when
                     none exists, a Topology holding only the embedded ``local`` target
                     (``find_hosts_file`` says where it looked; ``Topology.origin`` keeps it).
        explicit path that does not exist / is a directory → InputError (exit 4).
    loads(text: str, path: str = "hosts.yaml") -> Topology     (same, from a string)
    Topology.select(hosts: Sequence[str], groups: Sequence[str]) -> List[Target]   (targets.select)
    expand_nodeset(text) -> names    (``nodeset``'s, bounded by the file's budget; ValueError
                                     when malformed); targets.py: expand_selector, fold_names

The file is read by ``yamlfile`` (lines kept, duplicate keys refused, generic value checks);
this module is the hosts schema on top of it. Every validation error is an ``errors.InputError`` whose message reads
``FILE:LINE: dotted.key: what was expected``.

Choices the hosts file's contract leaves open:
- Keys starting with ``x-`` are metadata at every mapping level, so no host, container,
  group, model or env name can start with ``x-``.
- An empty entry (``bastion:`` or ``bastion: {}``) is an ssh_config alias; an empty
  ``hosts:``/``groups:``/``defaults:`` section is the same as leaving it out.
- Plain YAML 1.1, except that ``00:10:00`` is the string it looks like (YAML 1.2), not the
  base-60 number 600; numbers given for an id or an env value keep their spelling (``010``).
- defaults' connection keys and ``become`` apply to SSH hosts only; a ``local: true`` host
  and the embedded ``local`` take python/timeout/env/activate from defaults.
- ``become: true`` means sudo and ``become: false`` turns an inherited sudo off.
"""

import contextvars
import os
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..core import nodeset
from ..core.errors import InputError
# the targets a file is read into, and their selection (targets.py), also named here for the
# callers that read a file and select from it
from .targets import (LOCAL_TARGET, MAX_NODES, Container, Slurm, SshHost, Target,  # noqa: F401
                      did_you_mean, expand_selector, unique_in_order, fold_names, select)
from .yamlfile import SAFE_TOKEN  # noqa: F401 (the alphabet, re-exported with NAME, is_safe_token)
from .yamlfile import (NAME, At, LineMapping, LineSequence, expect_argument, expect_boolean,
                       expect_choice, expect_count, expect_integer, expect_mapping, expect_name, expect_port,
                       expect_positive_count, expect_seconds, expect_shell_token, expect_string,
                       is_number, is_safe_token, items_at, parse, show, unknown_key)

RUNTIMES = ("pct", "docker", "podman", "lxc", "kubectl")
HOST_KEY_POLICIES = ("strict", "accept-new")
BECOME_METHODS = ("sudo",)



ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SLURM_TIME = re.compile(r"(?:\d+-)?\d+(?::\d+){0,2}|UNLIMITED|INFINITE|unlimited|infinite")
DEFAULT_HOSTS_FILE = "hosts.yaml"
HOSTS_FILE_ENV = "MLDIAG_HOSTS_FILE"
XDG_CONFIG_ENV = "XDG_CONFIG_HOME"
# 1 MiB holds ~25,000 one-line hosts and parses in ~4 s; a larger file is a mistake
# (a log or a dump named by accident), refused before it is parsed.
MAX_FILE_BYTES = 2**20



@dataclass(frozen=True)
class HostsFile:
    """Which hosts file a run reads, and why: ``path`` as it is opened (None: none was found),
    ``named_by`` the place that chose it (``--hosts-file``, ``$MLDIAG_HOSTS_FILE``,
    ``./hosts.yaml``, ``user config``), ``looked`` the absolute paths tried when none was
    named (in order)."""
    path: Optional[str]
    named_by: str = ""
    looked: Tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for a user: which file was read, or where mldiag looked."""
        if self.path is None:
            return (f"no hosts file found (looked for {' and '.join(self.looked)}), so the only "
                    f"target is 'local': write one there, or name one with --hosts-file or "
                    f"${HOSTS_FILE_ENV}")
        return f"hosts file: {os.path.abspath(self.path)} (from {self.named_by})"


def user_hosts_file(environ: Optional[Dict[str, str]] = None) -> str:
    """``$XDG_CONFIG_HOME/mldiag/hosts.yaml``; ``~/.config/mldiag/hosts.yaml`` when that variable
    is unset, empty or relative (the XDG spec says to ignore a relative one)."""
    env = os.environ if environ is None else environ
    base = env.get(XDG_CONFIG_ENV) or ""
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "mldiag", DEFAULT_HOSTS_FILE)


def find_hosts_file(path: Optional[str] = None,
                    environ: Optional[Dict[str, str]] = None) -> HostsFile:
    """The lookup order: ``--hosts-file``, ``$MLDIAG_HOSTS_FILE``, ``./hosts.yaml``, the user's
    file (``user_hosts_file``). Named files are returned whether they exist or not (reading
    one that does not is bad input); the last two only when they exist (a dangling link
    counts: reading it then says what is wrong)."""
    env = os.environ if environ is None else environ
    if path:
        return HostsFile(path, "--hosts-file")
    if env.get(HOSTS_FILE_ENV):
        return HostsFile(env[HOSTS_FILE_ENV], f"${HOSTS_FILE_ENV}")
    user = user_hosts_file(env)
    for candidate, named_by in ((DEFAULT_HOSTS_FILE, "./hosts.yaml"), (user, "user config")):
        if os.path.lexists(candidate):
            return HostsFile(candidate, named_by)
    return HostsFile(None, looked=(os.path.abspath(DEFAULT_HOSTS_FILE), user))


@dataclass(frozen=True)
class Topology:
    path: Optional[str]                          # None when nothing was read (embedded local only)
    targets: Dict[str, Target] = field(default_factory=dict)   # in file order
    groups: Dict[str, Tuple[str, ...]] = field(default_factory=dict)  # expanded target names
    default_targets: Tuple[str, ...] = ("local",)
    # runbooks: directories (absolute), each with the file and line that named it
    runbook_dirs: Tuple[Tuple[str, str, int], ...] = ()
    # diagnostics: a team's diagnostics directories (team.py), the same way
    diagnostic_dirs: Tuple[Tuple[str, str, int], ...] = ()
    # where the file came from (``load``); whether ``defaults.targets`` was written in it
    origin: HostsFile = field(default=HostsFile(None), compare=False)
    default_targets_given: bool = field(default=False, compare=False)

    def select(self, hosts: Sequence[str] = (), groups: Sequence[str] = ()) -> List[Target]:
        """Targets named by --host values (names, comma lists, node sets) then --group names
        (``targets.select``)."""
        return select(self, hosts, groups)


def load(path: Optional[str] = None) -> Topology:
    """The hosts file ``find_hosts_file`` picks, read (``origin`` says which and why)."""
    origin = find_hosts_file(path)
    if origin.path is None:
        return Topology(path=None, targets={"local": LOCAL_TARGET}, origin=origin)
    return replace(loads(_read_text(origin.path), origin.path), origin=origin)


def loads(text: str, path: str = "hosts.yaml") -> Topology:
    document = parse(text, path, empty="empty hosts file (expected a mapping with hosts:)")
    token = _file_budget.set(nodeset.Budget(nodeset.MAX_FILE_NAMES, "one hosts file"))
    try:
        return _build(document, path)
    finally:
        _file_budget.reset(token)


# The names the hosts.yaml being read may still expand to (every node set and group reference
# of one file counts against one budget; a validator cannot be handed it as an argument).
_file_budget: "contextvars.ContextVar[Optional[nodeset.Budget]]" = contextvars.ContextVar(
    "mldiag_hosts_file_budget", default=None)


# ---------------------------------------------------------------------------- node sets

def expand_nodeset(text: str, budget: Optional[nodeset.Budget] = None) -> List[str]:
    """ClusterShell's expansion of ``text`` (no @group lookups), bounded (``nodeset``), counted
    against ``budget`` or, while a hosts.yaml is read, that file's; ValueError when malformed."""
    budget = budget or _file_budget.get()
    return budget.expand(text) if budget is not None else nodeset.expand(text)


# ---------------------------------------------------------------------------- reading YAML

def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as stream:
            data = stream.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        named_by = os.environ.get(HOSTS_FILE_ENV) == path
        raise InputError("hosts file not found" + (f" (named by ${HOSTS_FILE_ENV})" if named_by
                                                    else ""), file=path) from None
    except IsADirectoryError:
        raise InputError("is a directory, expected a hosts.yaml file", file=path) from None
    except OSError as exc:
        raise InputError(f"cannot read the hosts file: {exc.strerror or exc}", file=path) from None
    if len(data) > MAX_FILE_BYTES:
        raise InputError(f"larger than {MAX_FILE_BYTES // 2**20} MiB, the most a hosts file may be "
                         "(write node ranges such as gpu[001-512] rather than one entry per node)",
                         file=path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(f"not UTF-8 text (byte 0x{data[exc.start]:02x})", file=path,
                         line=line) from None


# ---------------------------------------------------------------------------- checking values

def _address(value: Any, at: At) -> str:
    address = expect_argument(value, at)
    if "@" in address:
        raise at.error(f"{show(address)}: give the user as user:, not in the address")
    return address


def _become(value: Any, at: At) -> Optional[str]:
    if isinstance(value, bool):
        return BECOME_METHODS[0] if value else None
    return expect_choice(BECOME_METHODS)(value, at)


def _identity_file(value: Any, at: At) -> str:
    # A local path read by the client, never put on a remote command line: '~' is fine.
    path = expect_string(value, at, "a file path")
    if "\0" in path or "\n" in path:
        raise at.error(f"{show(path)} is not a file path")
    return path


def _interpreter(value: Any, at: At) -> str:
    """``python3`` (looked up on the target's PATH) or an absolute path; ``~`` is refused with
    the way out, since no shell on the target expands it (the interpreter is exec'd as is)."""
    text = value if isinstance(value, str) else None
    if text is not None and text.startswith("~"):
        raise at.error(f"{show(text)}: '~' is not expanded on the target (no shell runs the "
                       "interpreter); use an absolute path such as /root/venv/bin/python")
    return expect_argument(value, at)


def _directory(value: Any, at: At) -> str:
    """An absolute directory on the target (travels in the bundle's header, never on a command line)."""
    path = expect_shell_token(value, at)
    if not path.startswith("/"):
        raise at.error(f"expected an absolute path, got {show(path)}")
    return path


def _activate(value: Any, at: At) -> Tuple[str, ...]:
    if not isinstance(value, str):
        raise at.error(f"expected a string of words, got {show(value)}")
    words = tuple(value.split())   # "" turns an inherited activate off
    for word in words:
        if not is_safe_token(word):
            raise at.error(f"word {show(word)} contains characters outside [A-Za-z0-9_@%+,./:-] "
                           "(shell metacharacters are not allowed here)")
    return words


def _env(value: Any, at: At) -> Dict[str, str]:
    env = {}
    mapping = expect_mapping(value, at)
    for name, setting, where in items_at(mapping, at):
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise where.error(f"{show(name)} is not an environment variable name "
                              "([A-Za-z_][A-Za-z0-9_]*)")
        if is_number(setting):
            setting = mapping.written.get(name, str(setting))
        if not isinstance(setting, str):
            raise where.error(f"expected a string or a number, got {show(setting)} "
                              "(quote it to pass it as text)")
        env[name] = setting
    return env


def _models(value: Any, at: At) -> Tuple[Tuple[str, str], ...]:
    models = []
    for name, model_path, where in items_at(expect_mapping(value, at), at):
        models.append((expect_name(name, where), expect_string(model_path, where, "a model path")))
    return tuple(models)


# The ``expect:`` block: what a healthy node of this kind has (with the bounds a value can have:
# ib_rate in Gb/s, pcie_gen 1-6), read by node-check, nccl-check and gpu-perf.
EXPECT_KEYS: Dict[str, Tuple[int, Optional[int]]] = {
    "gpus": (0, None), "ib_ports": (0, None), "ib_rate": (1, None), "nvlinks_per_gpu": (0, None),
    "pcie_width": (1, 32), "pcie_gen": (1, 6),
    # nccl-check: the all-reduce bus bandwidth (GB/s) a healthy node of this kind reaches
    "allreduce_busbw": (1, None),
    # gpu-perf, per GPU: bf16 GEMM TFLOPS, device copy GB/s, host<->device GB/s
    "gemm_tflops": (1, None), "hbm_gbps": (1, None), "h2d_gbps": (1, None)}


def _expect(value: Any, at: At) -> Dict[str, int]:
    expected = {}
    for key, setting, where in items_at(expect_mapping(value, at), at):
        if key not in EXPECT_KEYS:
            raise where.error(unknown_key(key, list(EXPECT_KEYS)))
        expected[key] = expect_integer(setting, where, *EXPECT_KEYS[key])
    return expected


# The ``paths:`` block: directories a job writes to or reads from (checkpoints, datasets), each
# with the free space a healthy node has there; node-check's host check stats them on the node.
PATH_KEYS = ("path", "min_free_gb")
MAX_PATHS = 32          # node-check stats each in a child process of its own, all at once


def _paths(value: Any, at: At) -> Dict[str, Tuple[str, Optional[float]]]:
    """``NAME: /abs/path`` or ``NAME: {path: /abs/path, min_free_gb: GB}``. The path travels in
    the bundle (node-check's --paths, one JSON token of the job's argv, never a command line:
    invariant 1), so any character but NUL may be in it; ``~`` is not expanded on the node."""
    paths = {}
    mapping = expect_mapping(value, at)
    if len(mapping) > MAX_PATHS:
        raise at.error(f"{len(mapping)} paths: at most {MAX_PATHS}")
    for name, spec, where in items_at(mapping, at):
        expect_name(name, where)
        path_at, least, least_at = where, None, where
        if isinstance(spec, LineMapping):
            for key, setting, key_at in items_at(spec, where):
                if key not in PATH_KEYS:
                    raise key_at.error(unknown_key(key, PATH_KEYS))
            if "path" not in spec:
                raise where.error("expected path: (an absolute directory on the node), e.g. "
                                  "{path: /ckpt, min_free_gb: 500}")
            path_at = where.child("path", spec.key_lines.get("path", spec.line))
            least = spec.get("min_free_gb")
            least_at = where.child("min_free_gb", spec.key_lines.get("min_free_gb", spec.line))
            spec = spec["path"]
        path = expect_string(spec, path_at, "an absolute directory on the node, or {path: DIR, "
                                            "min_free_gb: GB}")
        if not path.startswith("/") or "\0" in path:
            raise path_at.error(f"expected an absolute path, got {show(path)}"
                                + (" ('~' is not expanded on the node)" if path.startswith("~") else ""))
        if least is not None and not (is_number(least) and 0 <= least < 1e12):
            raise least_at.error(f"expected a number of GB of at least 0, got {show(least)}")
        paths[name] = (path, None if least is None else float(least))
    return paths


def _slurm_time(value: Any, at: At) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return str(value)  # minutes, as sbatch --time reads a bare number
    text = expect_string(value, at, 'a Slurm time such as "00:10:00"')
    if not SLURM_TIME.fullmatch(text):
        raise at.error(f'{show(text)} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH:MM:SS)')
    return text


def _nodelist(value: Any, at: At) -> str:
    """A node set, kept as written; brackets glob in shells, so only the expanded names
    (which are checked here) may reach a command line."""
    text = expect_string(value, at, "a node set")
    try:
        nodes = expand_nodeset(text)
    except ValueError as exc:
        raise at.error(str(exc)) from None
    for node in nodes:
        if not is_safe_token(node) or node.startswith("-"):
            raise at.error(f"node {show(node)} contains characters outside [A-Za-z0-9_@%+,./:-] "
                           "(shell metacharacters are not allowed here)")
    return text


PERSIST_MAX_S = 3600


def _persist(value: Any, at: At) -> float:
    """Seconds a connection is held between calls (transport/held.py): 0 holds none."""
    if is_number(value) and 0 <= value <= PERSIST_MAX_S:
        return float(value)
    raise at.error(f"expected seconds from 0 (hold no connection) to {PERSIST_MAX_S}, got "
                   f"{show(value)}")


def _baseline(value: Any, at: At) -> str:
    """node-check's golden file (``mldiag baseline-init`` writes one): a path relative to the
    hosts file, kept absolute. Whether it exists and reads is node-check's to check, when it
    runs (a missing golden file must not stop the other tasks)."""
    text = expect_string(value, at, "a golden file's path (relative to the hosts file)")
    return os.path.join(os.path.dirname(os.path.abspath(at.file)), os.path.expanduser(text))


def _keep(value: Any, at: At) -> Any:
    return value


_CHECKS: Dict[str, Callable[[Any, At], Any]] = {
    "user": expect_argument, "port": expect_port, "python": _interpreter, "tmpdir": _directory, "timeout": expect_seconds,
    "code_cache": expect_boolean,
    "connect_timeout": expect_seconds, "identity_file": _identity_file, "persist": _persist,
    "host_key_policy": expect_choice(HOST_KEY_POLICIES), "become": _become, "env": _env,
    "activate": _activate, "address": expect_string, "jump": expect_name, "local": expect_boolean,
    "models": _models, "gpus": expect_count, "expect": _expect, "paths": _paths, "runtime": expect_choice(RUNTIMES), "id": expect_argument,
    "namespace": expect_argument, "container": expect_argument, "exec_user": expect_argument,
    "partition": expect_argument, "nodes": expect_positive_count, "gpus_per_node": expect_count,
    "time": _slurm_time, "account": expect_argument, "nodelist": _nodelist,
    "reservation": expect_argument, "peer_address": expect_string, "baseline": _baseline,
    "defaults": _keep, "hosts": _keep, "groups": _keep, "targets": _keep,
    "containers": _keep, "slurm": _keep, "runbooks": _keep, "diagnostics": _keep,
}
_WRITTEN_AS_TEXT = ("id",)   # a number here is a name: keep its spelling

TOP_KEYS = ("defaults", "hosts", "groups", "runbooks", "diagnostics")
CONNECTION_KEYS = ("address", "port", "user", "jump", "identity_file", "connect_timeout",
                   "host_key_policy", "persist")
RUN_KEYS = ("python", "timeout", "env", "activate", "tmpdir", "code_cache")
DEFAULTS_KEYS = ("user", "port", "python", "timeout", "connect_timeout", "persist", "targets",
                 "identity_file", "host_key_policy", "become", "env", "activate", "tmpdir",
                 "code_cache", "expect", "baseline", "paths")
# peer_address: the address a group's other members reach this target at (nccl-check --pairs,
# --across; engine/groups.py), where it is not the one mldiag connects to: a container's own
# address, a host's on the cluster network. Never inherited: it is one target's.
HOST_KEYS = ("local",) + CONNECTION_KEYS + ("become",) + RUN_KEYS + (
    "models", "gpus", "expect", "baseline", "paths", "containers", "slurm", "peer_address")
CONTAINER_KEYS = ("runtime", "id", "namespace", "container", "exec_user") + RUN_KEYS + (
    "models", "gpus", "expect", "baseline", "paths", "peer_address")
SLURM_KEYS = ("partition", "nodes", "gpus_per_node", "time", "account", "nodelist", "reservation")
KUBECTL_ONLY_KEYS = ("namespace", "container")
INHERITED_KEYS = RUN_KEYS + ("models", "gpus", "expect", "baseline", "paths")


@dataclass(frozen=True)
class _Fields:
    """Checked values of one mapping (defaults, a host, a container), with where each was."""
    at: At
    values: Dict[str, Any]
    places: Dict[str, At]


def _read_fields(value: Any, at: At, allowed: Sequence[str]) -> _Fields:
    mapping = expect_mapping(value, at)
    values, places = {}, {}
    for key, setting, where in items_at(mapping, at):
        if key not in allowed:
            raise where.error(unknown_key(key, allowed))
        if key in _WRITTEN_AS_TEXT and is_number(setting):
            setting = mapping.written.get(key, str(setting))
        values[key] = _CHECKS[key](setting, where)
        places[key] = where
    return _Fields(at, values, places)


# ---------------------------------------------------------------------------- hosts and containers

@dataclass(frozen=True)
class _ContainerEntry:
    name: str
    at: At
    fields: _Fields
    container: Container


@dataclass(frozen=True)
class _HostEntry:
    """One host of ``hosts:`` after node-range expansion."""
    name: str
    address: Optional[str]
    at: At              # the key in hosts: (shared by a range's hosts)
    fields: _Fields
    containers: Tuple[_ContainerEntry, ...]
    slurm: Optional[Slurm]
    peer_address: Optional[str] = None

    @property
    def local(self) -> bool:
        return bool(self.fields.values.get("local"))


def _read_hosts(value: Any, at: At) -> List[_HostEntry]:
    entries = []
    for key, spec, key_at in items_at(expect_mapping(value, at), at):
        names = _host_names(key, key_at)
        fields = _read_fields(spec, key_at, HOST_KEYS)
        if fields.values.get("local"):
            _check_local_host(fields, names, key_at)
        if len(names) > 1 and fields.values.get("containers"):
            raise fields.places["containers"].error(
                f"a node range ({len(names)} hosts) cannot have containers: container names "
                "are target names and must be unique")
        containers, slurm = tuple(_read_containers(fields)), _read_slurm(fields)
        if len(entries) + len(names) > MAX_NODES:
            raise key_at.error(f"more than {MAX_NODES} hosts in one hosts file")
        for name, address, peer in zip(names, _addresses(fields, names, key),
                                       _addresses(fields, names, key, "peer_address")):
            entries.append(_HostEntry(name, address, key_at, fields, containers, slurm, peer))
    return entries


def _host_names(key: Any, at: At) -> List[str]:
    """A host key is one name or a node set of names (``gpu[01-16]``)."""
    if isinstance(key, str) and NAME.fullmatch(key):
        return [key]
    try:
        names = expand_nodeset(expect_string(key, at, "a host name"))
    except ValueError as exc:
        raise at.error(str(exc)) from None
    for name in names:
        expect_name(name, at)
    return names


def _check_local_host(fields: _Fields, names: List[str], at: At) -> None:
    for key in CONNECTION_KEYS:
        if key in fields.values:
            raise fields.places[key].error("not allowed on a local host (local: true runs "
                                           "without SSH)")
    if len(names) > 1:
        raise at.error(f"a local host cannot be a node range ({len(names)} hosts)")


def _addresses(fields: _Fields, names: List[str], key: Any, field: str = "address") -> List[Optional[str]]:
    """One address per host: a range in ``address`` (or ``peer_address``) pairs with the key's
    range, in order."""
    address = fields.values.get(field)
    if address is None:
        return [None] * len(names)
    where = fields.places[field]
    if "[" not in address:
        if len(names) > 1:
            raise where.error(f"{address!r} is one address for {len(names)} hosts of {key!r}; "
                              f"give a range such as \"10.0.0.[1-{len(names)}]\"")
        return [_address(address, where)]
    try:
        addresses = expand_nodeset(address)
    except ValueError as exc:
        raise where.error(str(exc)) from None
    if len(addresses) != len(names):
        raise where.error(f"{address!r} expands to {len(addresses)} addresses but {key!r} "
                          f"to {len(names)} hosts")
    return [_address(one, where) for one in addresses]


def _peer_address(container: "_ContainerEntry") -> Optional[str]:
    value = container.fields.values.get("peer_address")
    return None if value is None else _address(value, container.fields.places["peer_address"])


def _read_containers(fields: _Fields) -> List[_ContainerEntry]:
    at = fields.places.get("containers", fields.at)
    entries = []
    for name, spec, name_at in items_at(expect_mapping(fields.values.get("containers"), at), at):
        expect_name(name, name_at)
        container_fields = _read_fields(spec, name_at, CONTAINER_KEYS)
        entries.append(_ContainerEntry(name, name_at, container_fields,
                                       _container(container_fields)))
    return entries


def _container(fields: _Fields) -> Container:
    values = fields.values
    for required in ("runtime", "id"):
        if required not in values:
            hint = f" (one of {', '.join(RUNTIMES)})" if required == "runtime" else ""
            raise fields.at.child(required, fields.at.line).error(f"required{hint}")
    runtime = values["runtime"]
    for key in KUBECTL_ONLY_KEYS:
        if key in values and runtime != "kubectl":
            raise fields.places[key].error(f"only for runtime kubectl (this one is {runtime})")
    if runtime == "pct" and not values["id"].isdigit():
        raise fields.places["id"].error(f"expected a numeric VMID for runtime pct, "
                                        f"got {show(values['id'])}")
    return Container(runtime=runtime, id=values["id"], namespace=values.get("namespace"),
                     container=values.get("container"), exec_user=values.get("exec_user"))


def _read_slurm(fields: _Fields) -> Optional[Slurm]:
    if "slurm" not in fields.values:
        return None
    slurm = _read_fields(fields.values["slurm"], fields.places["slurm"], SLURM_KEYS).values
    return Slurm(**slurm)


def _ssh_hosts(entries: List[_HostEntry], defaults: _Fields) -> Dict[str, SshHost]:
    """SshHost per non-local entry, each ``jump`` resolved to its SshHost (chains included)."""
    by_name = {entry.name: entry for entry in entries}
    resolved: Dict[str, SshHost] = {}
    for start in entries:
        if start.local:
            continue
        chain: List[str] = []
        current = start.name
        while current not in resolved:
            if current in chain:   # chains are a few hops: a list is fine
                raise _jump_cycle(chain[chain.index(current):], by_name)
            chain.append(current)
            jump = by_name[current].fields.values.get("jump")
            if jump is None:
                break
            _check_jump(jump, by_name[current], by_name)
            current = jump
        for name in reversed(chain):
            entry = by_name[name]
            jump = entry.fields.values.get("jump")
            resolved[name] = _ssh_host(entry, defaults, resolved[jump] if jump else None)
    return resolved


def _check_jump(jump: str, entry: _HostEntry, by_name: Dict[str, _HostEntry]) -> None:
    where = entry.fields.places["jump"]
    if jump not in by_name:
        raise where.error(f"unknown host {jump!r}: a jump names an entry of hosts: (an empty "
                          f"entry such as `{jump}: {{}}` is an ssh_config alias)"
                          f"{did_you_mean(jump, list(by_name))}")
    if by_name[jump].local:
        raise where.error(f"{jump!r} is a local host (local: true); a jump must be an SSH host")


def _jump_cycle(cycle: List[str], by_name: Dict[str, _HostEntry]) -> InputError:
    first = min(range(len(cycle)), key=lambda i: by_name[cycle[i]].fields.places["jump"].line)
    ordered = cycle[first:] + cycle[:first]
    where = by_name[ordered[0]].fields.places["jump"]
    return where.error("jump cycle: " + " → ".join(ordered + [ordered[0]]))


def _ssh_host(entry: _HostEntry, defaults: _Fields, jump: Optional[SshHost]) -> SshHost:
    settings = {**{k: v for k, v in defaults.values.items() if k in CONNECTION_KEYS},
                **{k: v for k, v in entry.fields.values.items() if k in CONNECTION_KEYS}}
    return SshHost(name=entry.name, address=entry.address, port=settings.get("port"),
                   user=settings.get("user"), identity_file=settings.get("identity_file"),
                   connect_timeout=settings.get("connect_timeout", 10.0),
                   host_key_policy=settings.get("host_key_policy"), jump=jump,
                   persist=settings.get("persist"))


def _inherit(*levels: Dict[str, Any]) -> Dict[str, Any]:
    """defaults → host → container: env, expect and paths maps merge (the inner key wins), the
    rest overrides."""
    merged: Dict[str, Any] = {}
    for level in levels:
        for key in INHERITED_KEYS:
            if key in ("env", "expect", "paths") and key in level:
                merged[key] = {**merged.get(key, {}), **level[key]}
            elif key in level:
                merged[key] = level[key]
    return merged


def _target(name: str, settings: Dict[str, Any], source: At, **placement: Any) -> Target:
    if len(settings.get("paths", {})) > MAX_PATHS:
        raise source.error(f"{len(settings['paths'])} paths in all (defaults, host and container "
                           f"together): at most {MAX_PATHS}")
    expect = dict(settings.get("expect", {}))
    if settings.get("gpus") is not None:   # gpus: N is the shorthand of expect: {gpus: N}
        expect.setdefault("gpus", settings["gpus"])
    return Target(expect=tuple(sorted(expect.items())),name=name, python=settings.get("python", "python3"),
                  activate=settings.get("activate", ()),
                  env=tuple(settings.get("env", {}).items()),
                  timeout=settings.get("timeout", 300.0), models=settings.get("models", ()),
                  gpus=settings.get("gpus"), tmpdir=settings.get("tmpdir"),
                  code_cache=settings.get("code_cache", True),
                  baseline=settings.get("baseline"),
                  paths=tuple((name, path, least) for name, (path, least)
                              in settings.get("paths", {}).items()),
                  source=(source.file, source.line), **placement)


def _become_for(entry: _HostEntry, defaults: _Fields) -> Optional[str]:
    if "become" in entry.fields.values:
        return entry.fields.values["become"]
    return None if entry.local else defaults.values.get("become")


# ---------------------------------------------------------------------------- groups and targets

def _register(names: Dict[str, At], name: str, at: At) -> None:
    if name in names:
        raise at.error(f"duplicate target name {name!r} (first defined at line {names[name].line})")
    names[name] = at


def _resolve_groups(value: Any, at: At, targets: Dict[str, Target]) -> Dict[str, Tuple[str, ...]]:
    members_of: Dict[str, List[Tuple[Any, At]]] = {}
    for name, members, where in items_at(expect_mapping(value, at), at):
        expect_name(name, where)
        if name in targets:
            raise where.error(f"group name {name!r} is also a target name")
        members_of[name] = _members(members, where)
    resolved: Dict[str, Tuple[str, ...]] = {}

    def expand_group(group: str, visiting: Tuple[str, ...]) -> Tuple[str, ...]:
        if group not in resolved:
            inside = visiting + (group,)
            names: List[str] = []
            for member, where in members_of[group]:
                names += _expand_member(member, where, targets, members_of,
                                        lambda inner: expand_group(inner, inside), inside)
            resolved[group] = tuple(unique_in_order(names))
        return resolved[group]

    for group in members_of:
        expand_group(group, ())
    return resolved


def _members(value: Any, at: At) -> List[Tuple[Any, At]]:
    """A list of members, or one string (which may be a comma list or a node set)."""
    if value is None:
        return []
    if isinstance(value, LineSequence):
        return [(member, at.item(i, line))
                for i, (member, line) in enumerate(zip(value, value.item_lines))]
    if isinstance(value, str):
        return [(value, at)]
    raise at.error(f"expected a list of target or group names, got {show(value)}")


def _expand_member(member: Any, at: At, targets: Dict[str, Target], groups: Dict[str, Any],
                   expand_group: Callable[[str], Tuple[str, ...]],
                   visiting: Sequence[str]) -> List[str]:
    """A group member or defaults.targets entry: names, node sets and groups → target names."""
    text = expect_string(member, at, "a target or group name")
    try:
        names = expand_selector(text, _file_budget.get())
    except ValueError as exc:
        raise at.error(str(exc)) from None
    expanded: List[str] = []
    for name in names:
        if name in visiting:
            raise at.error("group cycle: " + " → ".join(
                list(visiting[visiting.index(name):]) + [name]))
        if name in groups:
            members = expand_group(name)
            budget = _file_budget.get()
            try:   # each reference costs its size: `[g, g, g, ...]` must not multiply freely
                if budget is not None:
                    budget.spend(len(members))
            except ValueError as exc:
                raise at.error(str(exc)) from None
            expanded += members
        elif name in targets:
            expanded.append(name)
        else:
            inside = f" (from {text!r})" if name != text else ""
            raise at.error(f"unknown target or group {name!r}{inside}"
                           f"{did_you_mean(name, list(targets) + list(groups))}")
    return expanded


def _default_targets(defaults: _Fields, targets: Dict[str, Target],
                     groups: Dict[str, Tuple[str, ...]]) -> Tuple[str, ...]:
    if "targets" not in defaults.values:
        return ("local",)
    where = defaults.places["targets"]
    names: List[str] = []
    for member, member_at in _members(defaults.values["targets"], where):
        names += _expand_member(member, member_at, targets, groups,
                                lambda group: groups[group], ())
    if not names:
        raise where.error("expected at least one target (leave targets: out for [local])")
    return tuple(unique_in_order(names))


def _dirs(top: _Fields, path: str, key: str) -> Tuple[Tuple[str, str, int], ...]:
    """``runbooks:`` or ``diagnostics:``: a directory or a list of them, relative to the hosts
    file. Whether they exist is checked by their readers only (``runbook``, ``team``), so a
    missing one never blocks the other tasks."""
    if key not in top.values:
        return ()
    value, where = top.values[key], top.places[key]
    items = ([(v, where.item(i, line)) for i, (v, line) in enumerate(zip(value, value.item_lines))]
             if isinstance(value, LineSequence) else [(value, where)])
    base = os.path.dirname(os.path.abspath(path))
    return tuple((os.path.join(base, os.path.expanduser(expect_string(item, at, "a directory"))),
                  at.file, at.line) for item, at in items)


def _build(document: Any, path: str) -> Topology:
    if not isinstance(document, LineMapping):
        raise InputError(f"expected a mapping with hosts:, got {show(document)}", file=path,
                         line=getattr(document, "line", 1))
    top = _read_fields(document, At(path, document.line), TOP_KEYS)
    defaults = _read_fields(top.values.get("defaults"),
                            top.places.get("defaults", top.at.child("defaults", 1)), DEFAULTS_KEYS)
    hosts_at = top.places.get("hosts", top.at.child("hosts", 1))
    entries = _read_hosts(top.values.get("hosts"), hosts_at)

    defined: Dict[str, At] = {}
    for entry in entries:
        _register(defined, entry.name, entry.at)
        for container in entry.containers:
            _register(defined, container.name, container.at)
    ssh_hosts = _ssh_hosts(entries, defaults)

    targets: Dict[str, Target] = {}
    if "local" not in defined:
        targets["local"] = _target("local", _inherit(defaults.values), At("<embedded>", 0),
                                   local=True)
    for entry in entries:
        host_settings = _inherit(defaults.values, entry.fields.values)
        place = dict(local=entry.local, host=ssh_hosts.get(entry.name),
                     become=_become_for(entry, defaults))
        targets[entry.name] = _target(entry.name, host_settings, entry.at, slurm=entry.slurm,
                                      peer_address=entry.peer_address, **place)
        for container in entry.containers:
            settings = _inherit(defaults.values, entry.fields.values, container.fields.values)
            targets[container.name] = _target(container.name, settings, container.at,
                                              container=container.container,
                                              peer_address=_peer_address(container), **place)

    groups = _resolve_groups(top.values.get("groups"),
                             top.places.get("groups", top.at.child("groups", 1)), targets)
    return Topology(path=path, targets=targets, groups=groups,
                    default_targets=_default_targets(defaults, targets, groups),
                    runbook_dirs=_dirs(top, path, "runbooks"),
                    diagnostic_dirs=_dirs(top, path, "diagnostics"),
                    origin=HostsFile(path, "--hosts-file"),
                    default_targets_given="targets" in defaults.values)
