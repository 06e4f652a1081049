"""known_hosts as OpenSSH reads it: plain and hashed (``|1|``) host patterns, ``@revoked`` and
``@cert-authority`` markers, and OpenSSH's verdict on a server's key (sshd(8) "SSH_KNOWN_HOSTS
FILE FORMAT", ssh(1) ``check_host_key``).

paramiko's own parser raises on a marker line (every host using that file then failed as
``internal``), so lines are read here, and paramiko is left with no known keys: every key
reaches ``KnownHostsPolicy``, which decides as OpenSSH does, before authentication:

- a key listed ``@revoked`` for the host is refused, whatever ``StrictHostKeyChecking`` says;
- a key listed for the host is accepted; another key when the host has one listed is refused
  as changed;
- an unlisted host is refused (``yes``/``ask``) or recorded (``accept-new``/``no``): hashed
  when the file already holds hashed entries or ssh_config says ``HashKnownHosts yes``.

``@cert-authority`` lines are not used (paramiko cannot check host certificates); a host that
only such a line covers is reported as unknown with a note saying so.
"""

import base64
import binascii
import errno
import hashlib
import hmac
import os
import re
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import fcntl
import paramiko

from .sshconfig import Endpoint

REVOKED = "@revoked"
CERT_AUTHORITY = "@cert-authority"


class HostKeyRefused(Exception):
    """The server's host key is not one we may trust; the message says why and what to do."""


class HostKeyUnknown(HostKeyRefused):
    pass


class HostKeyChanged(HostKeyRefused):
    pass


class HostKeyRevoked(HostKeyRefused):
    pass


def fingerprint_of_blob(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def fingerprint(key: paramiko.PKey) -> str:
    return fingerprint_of_blob(key.asbytes())


@dataclass(frozen=True)
class Entry:
    """One known_hosts line that names a key."""
    marker: Optional[str]        # None, REVOKED or CERT_AUTHORITY
    hosts: str                   # the host field as written (patterns or one |1|salt|hash)
    keytype: str
    blob: bytes
    where: str                   # "FILE:LINE" for messages

    def __post_init__(self):
        # a hashed line's salt and digest, decoded once (not a field: equality stays the line's)
        object.__setattr__(self, "_salted", _salt_and_digest(self.hosts) if self.hashed else None)

    @property
    def hashed(self) -> bool:
        return self.hosts.startswith("|1|")

    def matches(self, name: str) -> bool:
        """Whether this line's host field covers ``name`` (``host`` or ``[host]:port``)."""
        name = name.lower()
        if self.hashed:
            return _hashed_match(self._salted, name)
        return match_host_patterns(self.hosts, name)


def _salt_and_digest(field: str) -> Optional[Tuple[bytes, bytes]]:
    """``|1|salt|hash`` decoded; None for a malformed one (it matches no name)."""
    parts = field.split("|")
    if len(parts) != 4:
        return None
    try:
        return base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except (binascii.Error, ValueError):
        return None


def _hashed_match(salted: Optional[Tuple[bytes, bytes]], name: str) -> bool:
    # NOTE: one lookup per target scans every hashed line (each has its own salt), 1,000 × 1,000
    # HMACs for a 1,000-host file: hmac.digest's one-shot C path is about twice hmac.new's speed
    if salted is None:
        return False
    salt, digest = salted
    return hmac.compare_digest(hmac.digest(salt, name.encode(), "sha1"), digest)


_pattern_cache: Dict[str, "re.Pattern"] = {}


def _pattern(glob: str) -> "re.Pattern":
    """OpenSSH's match_pattern: ``*`` and ``?`` only, case-insensitive for host names."""
    rx = _pattern_cache.get(glob)
    if rx is None:
        rx = re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)
                        + r"\Z", re.IGNORECASE | re.DOTALL)
        _pattern_cache[glob] = rx
    return rx


def match_host_patterns(field: str, name: str) -> bool:
    """A comma list of patterns, ``!pattern`` negating: a negated match wins (match_hostname)."""
    matched = False
    for pattern in field.split(","):
        negated = pattern.startswith("!")
        if negated:
            pattern = pattern[1:]
        if pattern and _pattern(pattern).match(name):
            if negated:
                return False
            matched = True
    return matched


def parse(text: str, path: str) -> List[Entry]:
    """Every usable line of one known_hosts file; malformed lines are skipped, as OpenSSH does."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = None
        if fields[0].startswith("@"):
            marker = fields[0].lower()
            if marker not in (REVOKED, CERT_AUTHORITY):
                continue
            fields = fields[1:]
        if len(fields) < 3:
            continue
        try:
            blob = base64.b64decode(fields[2], validate=True)
        except (binascii.Error, ValueError):
            continue
        entries.append(Entry(marker, fields[0], fields[1], blob, f"{path}:{number}"))
    return entries


_cache: Dict[tuple, "KnownHosts"] = {}
_cache_lock = threading.Lock()


class KnownHosts:
    """The merged entries of several known_hosts files, with per-name lookups memoised (a hashed
    entry costs one HMAC per name; many targets share one file)."""

    def __init__(self, entries: Sequence[Entry]):
        self.entries = tuple(entries)
        self._by_name: Dict[str, Tuple[Entry, ...]] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, paths: Sequence[str]) -> "KnownHosts":
        """Parsed once per process and file version."""
        stamp = []
        for path in paths:
            try:
                st = os.stat(path)
            except OSError:
                continue
            stamp.append((path, st.st_mtime_ns, st.st_size, st.st_ino))
        key = tuple(stamp)
        with _cache_lock:
            known = _cache.get(key)
        if known is None:
            entries: List[Entry] = []
            for path, *_ in stamp:
                try:
                    with open(path, encoding="utf-8", errors="replace") as f:
                        entries += parse(f.read(), path)
                except OSError:
                    continue
            known = cls(entries)
            with _cache_lock:
                _cache[key] = known
        return known

    def for_name(self, name: str) -> Tuple[Entry, ...]:
        with self._lock:
            found = self._by_name.get(name)
        if found is None:
            found = tuple(e for e in self.entries if e.matches(name))
            with self._lock:
                self._by_name[name] = found
        return found

    def key_types(self, name: str) -> List[str]:
        """The key types listed for ``name``, in file order (offered first in the handshake)."""
        out: List[str] = []
        for e in self.for_name(name):
            if e.marker is None and e.keytype not in out:
                out.append(e.keytype)
        return out

    def verdict(self, name: str, key: paramiko.PKey) -> Tuple[str, Optional[Entry]]:
        """``("revoked", entry)``, ``("known", entry)``, ``("changed", a listed entry)``, or
        ``("unknown", a @cert-authority entry covering the host, if any)``."""
        blob = key.asbytes()
        entries = self.for_name(name)
        for e in entries:
            if e.marker == REVOKED and e.blob == blob:
                return "revoked", e
        listed = [e for e in entries if e.marker is None]
        for e in listed:
            if e.blob == blob:
                return "known", e
        if listed:
            same_type = [e for e in listed if e.keytype == key.get_name()]
            return "changed", (same_type or listed)[0]
        authority = next((e for e in entries if e.marker == CERT_AUTHORITY), None)
        return "unknown", authority


def hashed_name(name: str, salt: Optional[bytes] = None) -> str:
    """``|1|salt|HMAC-SHA1(salt, name)``, as ``ssh-keygen -H`` writes it."""
    salt = os.urandom(20) if salt is None else salt
    digest = hmac.new(salt, name.lower().encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def append_entry(path: str, name: str, key: paramiko.PKey, hashed: bool) -> None:
    """Append one line to the user's own known_hosts: never through a symlink planted in its
    place (O_NOFOLLOW), created 0600 when missing, locked against our other threads' writes."""
    host = hashed_name(name) if hashed else name
    line = f"{host} {key.get_name()} {key.get_base64()}\n"
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as f:   # a last line without its newline would swallow ours
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    line = "\n" + line
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def file_is_hashed(path: str) -> bool:
    """Whether the user hashes this file: any of its host entries is hashed."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return any(e.hashed for e in parse(f.read(), path) if e.marker is None)
    except OSError:
        return False


class KnownHostsPolicy(paramiko.MissingHostKeyPolicy):
    """OpenSSH's host key check; paramiko hands every server key here (it knows none itself)."""

    _write_lock = threading.Lock()

    def __init__(self, endpoint: Endpoint, known: KnownHosts):
        self.endpoint = endpoint
        self.known = known

    def missing_host_key(self, client, hostname, key):
        ep = self.endpoint
        name = ep.known_hosts_name
        offered = f"{key.get_name()} {fingerprint(key)}"
        verdict, entry = self.known.verdict(name, key)
        if verdict == "revoked":
            raise HostKeyRevoked(
                f"host key for {name} is REVOKED ({offered}, marked @revoked in {entry.where}); "
                f"refusing to connect whatever the host key policy")
        if verdict == "known":
            return
        if verdict == "changed":
            raise HostKeyChanged(
                f"REMOTE HOST IDENTIFICATION HAS CHANGED for {name}: it offered {offered}, "
                f"known_hosts has {entry.keytype} {fingerprint_of_blob(entry.blob)} ({entry.where}). "
                f"Someone could be eavesdropping, or the host was reinstalled; if you trust the "
                f"change, remove the old key with: ssh-keygen -R '{name}'")
        if ep.strict == "yes":
            where = ep.known_hosts[0] if ep.known_hosts else "~/.ssh/known_hosts"
            port = f"-p {ep.port} " if ep.port != 22 else ""
            note = (f"; note: {entry.where} names a @cert-authority for it, and mldiag does not "
                    f"check host certificates" if entry is not None else "")
            raise HostKeyUnknown(
                f"host key for {name} is not known ({offered}); "
                f"verify it, then trust it with: ssh-keyscan {port}{ep.hostname} >> {where} "
                f"(or set host_key_policy: accept-new for this host){note}")
        if ep.known_hosts:
            path = ep.known_hosts[0]
            try:
                with self._write_lock:
                    append_entry(path, name, key, ep.hash_known_hosts or file_is_hashed(path))
            except OSError as exc:
                why = ("it is a symlink, and mldiag writes only the file itself"
                       if exc.errno == errno.ELOOP else exc.strerror or str(exc))
                raise HostKeyRefused(f"cannot record the host key of {name} ({offered}) in "
                                     f"{path}: {why}") from None


def _preferring(key_types: Sequence[str]):
    """A paramiko transport factory that offers the host's listed key types first (OpenSSH's
    HostKeyAlgorithms ordering), so a host with several keys shows the one we know."""
    def factory(sock, **kwargs):
        transport = paramiko.Transport(sock, **kwargs)
        options = transport.get_security_options()
        wanted = []
        for t in key_types:
            wanted += ["rsa-sha2-512", "rsa-sha2-256", t] if t == "ssh-rsa" else [t]
        first = [t for t in wanted if t in options.key_types]
        if first:
            options.key_types = first + [t for t in options.key_types if t not in first]
        return transport
    return factory


def trust_known_hosts(connection, ep: Endpoint) -> None:
    """Make a Fabric connection check host keys as OpenSSH would (replaces Fabric's
    ``~/.ssh/known_hosts`` load and its AutoAddPolicy)."""
    known = KnownHosts.load(ep.known_hosts + ep.global_known_hosts)
    client = connection.client
    client._system_host_keys = paramiko.HostKeys()
    client._host_keys = paramiko.HostKeys()
    client.set_missing_host_key_policy(KnownHostsPolicy(ep, known))
    connection.connect_kwargs["transport_factory"] = _preferring(known.key_types(ep.known_hosts_name))
