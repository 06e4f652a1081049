"""``ssh -G`` answers kept between runs, while nothing they depend on has changed.

Each SSH target's ssh_config is one ``ssh -G`` child: about 5 ms of CPU per target on the
bench machine (the ssh binary's 3.6 ms, the rest the fork), on the critical path of a one-target
run and 0.16 s of a 32-target one. Its answer is a function of its command line, the ssh binary,
the config files it reads and a few facts of this user and machine, unless the config runs a
command or asks the network. So an answer is kept under a digest of all of those, and asked
again whenever any of them changes:
- the files: the config (``-F``, else ``~/.ssh/config`` and ``/etc/ssh/ssh_config``) and every
  file its ``Include`` lines name, globs expanded now (a new file in ``ssh_config.d`` changes
  the digest), each by path, content, owner and mode (ssh refuses a config others may write);
  ``~`` is the password database's home directory, as ssh takes it, never ``$HOME``;
- the ssh binary (path, size, mtime, inode), the user (uid, home directory, ``$USER``), this
  machine's name (``%L``, ``%l``) and the value of every ``${VAR}`` a config names;
- never kept: a config with ``Match exec``, ``localnetwork``, ``canonical`` or ``final``,
  or ``CanonicalizeHostname`` on (answered through DNS), in any of its files, however the
  line is spelled (``Match exec=cmd``, quotes, tabs, any case); an unreadable file, an
  ``Include`` deeper than ssh's own limit or more than MAX_FILES files; a failed ``ssh -G``.

Where: ``<dir>/sshg-<digest>.json`` in the user's private directory (``private.private_dir``: the
user's own, 0700, not a link), written 0600 through ``SaveDir`` (a temp file and a rename),
read through no link from a regular file of the user's own that no one else may write, in
that directory as it is when read (its owner and mode checked again on the open directory), at
most MAX_BYTES long. A file is believed only when it names the state it is the answers of (a
file renamed from another state's name is not) and its checksum matches its answers (one edited
or cut short outside mldiag is not), and each answer has the form of ``ssh -G`` output; any other
file is ignored, which costs one ``ssh -G``. The answers of the KEEP_STATES most recent states
are kept.
``$MLDIAG_SSH_G_CACHE=0`` turns this off. What the file says decides where mldiag connects (a
ProxyCommand too): it is exactly as trusted as the user's own ssh_config, which only the user
can change.
"""

import glob
import hashlib
import json
import os
import re
import socket
import stat
import threading
import time
from typing import Dict, List, Optional, Tuple

from ..core.errors import InputError
from ..core.ownfile import read_own
from ..core.savedir import SaveDir
from .private import is_private, private_dir

ENV_SWITCH = "MLDIAG_SSH_G_CACHE"
FORMAT = 2               # 2: a file names its state and carries its answers' checksum
MAX_FILES = 64            # files of one config closure
MAX_DEPTH = 16            # Include nesting (OpenSSH's READCONF_MAX_DEPTH)
MAX_FILE_BYTES = 1 << 20  # one config file
MAX_BYTES = 16 << 20      # one state's answers
MAX_ANSWERS = 8192
KEEP_STATES = 8
SAVE_EVERY_S = 1.0   # outside a batch: many answers are written a few times, not once each

_REFUSED_MATCH = {"exec", "localnetwork", "canonical", "final"}
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
# the only lines read word by word: a fleet's config is hundreds of Host blocks
_LINES_THAT_MATTER = re.compile(r"^[ \t]*(?:include|match|canonicalizehostname)\b.*$", re.I | re.M)
# an answer as ssh -G prints it: "keyword value" lines (a keyword's case is ssh's own:
# canonicalizePermittedcnames), one of them the hostname
_ANSWER_LINE = re.compile(r"[A-Za-z0-9]+ [^\n]*")
_lock = threading.Lock()


class NotKept(Exception):
    """This config's answers may change with no file changing: ask ``ssh -G`` each time."""


def _words(line: str) -> List[str]:
    """An ssh_config line's words: ``keyword value...`` or ``keyword=value``; double quotes
    group; ``#`` starts a comment."""
    line = line.strip()
    if not line or line.startswith("#"):
        return []
    head, sep, tail = line.partition("=")
    if sep and " " not in head.strip() and "\t" not in head.strip():
        line = head.strip() + " " + tail
    words, current, quoted, started = [], [], False, False
    for c in line:
        if c == '"':
            quoted, started = not quoted, True
        elif c in " \t" and not quoted:
            if started:
                words.append("".join(current))
            current, started = [], False
        else:
            current.append(c)
            started = True
    if started:
        words.append("".join(current))
    return words


def home_dir() -> str:
    """The home directory ssh reads ``~/.ssh/config`` from and expands ``~`` to: the password
    database's entry for the real uid (OpenSSH's ssh.c and misc.c ``tilde_expand`` take
    ``getpwuid(getuid())->pw_dir``), never ``$HOME``, which sudo may keep from another user."""
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_dir
    except (ImportError, KeyError):
        return os.path.expanduser("~")


def _expand_tilde(path: str, home: str) -> str:
    if path == "~" or path.startswith("~/"):
        return home + path[1:]
    return os.path.expanduser(path)     # ~user: from the password database too


def _match_criteria(words: List[str]) -> List[str]:
    """A ``Match`` line's criteria and arguments, lowercased and without ``!``: ssh splits a
    criterion from its argument at one ``=`` as at whitespace (``Match exec=cmd`` runs cmd,
    tried with OpenSSH 9.2), so each word is split there too."""
    return [piece.lstrip("!").lower() for word in words[1:] for piece in word.split("=")]


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise NotKept(f"{path}: {exc}")
    if len(data) > MAX_FILE_BYTES:
        raise NotKept(f"{path}: larger than {MAX_FILE_BYTES} bytes")
    return data


def config_closure(roots: List[Tuple[str, str]], names: Optional[set] = None,
                   home: Optional[str] = None) -> List[list]:
    """``[[path, sha256 or None (missing), uid, mode], ...]`` of every file ssh would read,
    from ``roots`` (``(path, directory its relative Includes are under)``), Includes followed
    in order, ``~`` in them being ``home`` (``home_dir()`` unless given); ``names`` gets the
    ``${VAR}`` names they use. Raises NotKept for a config whose answers no file pins down."""
    out: List[list] = []
    names = set() if names is None else names
    home = home_dir() if home is None else home

    def visit(path: str, base: str, depth: int) -> None:
        if depth > MAX_DEPTH or len(out) >= MAX_FILES:
            raise NotKept("Include nesting or file count past the limit")
        data = _read(path)
        if data is None:
            out.append([path, None, None, None])
            return
        st = os.stat(path)
        out.append([path, hashlib.sha256(data).hexdigest(), st.st_uid, stat.S_IMODE(st.st_mode)])
        text = data.decode("utf-8", errors="replace")
        names.update(_ENV_REF.findall(text))
        for found in _LINES_THAT_MATTER.finditer(text):
            words = _words(found.group(0))
            if not words:
                continue
            keyword = words[0].lower()
            if keyword == "match" and _REFUSED_MATCH.intersection(_match_criteria(words)):
                raise NotKept(f"{path}: Match {' '.join(words[1:])}")
            if keyword == "canonicalizehostname" and len(words) > 1 and \
                    words[1].lower() not in ("no", "false"):
                raise NotKept(f"{path}: CanonicalizeHostname {words[1]}")
            if keyword == "include":
                for pattern in words[1:]:
                    pattern = _expand_tilde(pattern, home)
                    if not pattern.startswith("/"):
                        pattern = os.path.join(base, pattern)
                    matches = sorted(glob.glob(pattern))
                    out.append(["glob", pattern, matches, None])
                    for match in matches:
                        if os.path.isfile(match):
                            visit(match, base, depth + 1)

    for path, base in roots:
        visit(path, base, 0)
    return out


def _roots(config: Optional[str], home: str) -> List[Tuple[str, str]]:
    user_dir = os.path.join(home, ".ssh")
    if config:
        return [(config, user_dir)]
    return [(os.path.join(user_dir, "config"), user_dir), ("/etc/ssh/ssh_config", "/etc/ssh")]


def state_digest(ssh: str, config: Optional[str], environ=os.environ) -> str:
    """The digest of everything an ``ssh -G`` answer depends on but its own arguments."""
    names: set = set()
    home = home_dir()
    closure = config_closure(_roots(config, home), names, home)
    st = os.stat(ssh)
    facts = {"format": FORMAT, "ssh": [ssh, st.st_size, st.st_mtime_ns, st.st_ino],
             "config": config, "files": closure, "uid": os.getuid(), "home": home,
             "user": environ.get("USER", ""), "host": socket.gethostname(),
             "env": {name: environ.get(name) for name in sorted(names)}}
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def enabled(environ=os.environ) -> bool:
    return environ.get(ENV_SWITCH, "1").strip() not in ("0", "no", "false", "off")


def _checksum(answers) -> str:
    return hashlib.sha256(json.dumps(answers, sort_keys=True).encode()).hexdigest()


def _is_answer(text: str) -> bool:
    lines = text.splitlines()
    return (all(_ANSWER_LINE.fullmatch(line) for line in lines)
            and any(line.startswith("hostname ") for line in lines))


class AnswerFile:
    """The kept answers of one state: ``{argument key: ssh -G stdout}``."""

    def __init__(self, directory: str, digest: str):
        self.directory = directory
        self.digest = digest
        self.name = f"sshg-{digest}.json"
        self.answers: Dict[str, str] = self._load()
        self.dirty = False
        self.saved_at = 0.0

    def _dir_fd(self) -> int:
        return os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def _load(self) -> Dict[str, str]:
        try:
            dfd = self._dir_fd()
        except OSError:
            return {}
        try:
            # the directory as it is now, not as private_dir() saw it: a swapped one is no store
            private = is_private(os.fstat(dfd), os.geteuid())
            data = read_own(self.name, MAX_BYTES, dir_fd=dfd) if private else None
        finally:
            os.close(dfd)
        try:
            doc = json.loads(data) if data is not None else None
        except ValueError:
            return {}
        if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("state") != self.digest:
            return {}
        answers = doc.get("answers")
        if not isinstance(answers, dict) or doc.get("sum") != _checksum(answers):
            return {}
        return {k: v for k, v in answers.items()
                if isinstance(k, str) and isinstance(v, str) and _is_answer(v)}

    def save(self) -> None:
        """Write the answers through the project's one no-follow writer (``SaveDir``: a fresh
        ``O_EXCL|O_NOFOLLOW`` temp file renamed over the old one) and remove the files of all
        but the KEEP_STATES most recent states."""
        self.dirty, self.saved_at = False, time.monotonic()
        if len(self.answers) > MAX_ANSWERS:
            return
        text = json.dumps({"format": FORMAT, "state": self.digest, "sum": _checksum(self.answers),
                           "answers": self.answers})
        if len(text) > MAX_BYTES:
            return
        try:
            with SaveDir.open(self.directory) as directory:
                directory.write_text(self.name, lambda stream: stream.write(text))
                self._prune(directory.fd)
        except (InputError, OSError):
            pass

    def _prune(self, dfd: int) -> None:
        kept = []
        for name in os.listdir(dfd):
            if name.startswith("sshg-") and name.endswith(".json") and name != self.name:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    kept.append((st.st_mtime_ns, name))
                except OSError:
                    pass
        for _, name in sorted(kept, reverse=True)[KEEP_STATES - 1:]:
            try:
                os.unlink(name, dir_fd=dfd)
            except OSError:
                pass


_files: Dict[Tuple[str, str], AnswerFile] = {}
# Within one resolve phase (``batch``) the state is read once, not once per target.
_batch: Dict[str, object] = {"depth": 0, "digests": {}}


class batch:
    """``with batch():`` around resolving a run's targets: the config's state is read once for
    all of them, and the new answers are written at the end."""

    def __enter__(self):
        with _lock:
            _batch["depth"] += 1
        return self

    def __exit__(self, *exc):
        with _lock:
            _batch["depth"] -= 1
            if not _batch["depth"]:
                _batch["digests"] = {}
        flush()


def _state(ssh: str, config: Optional[str]) -> str:
    with _lock:
        found = _batch["digests"].get((ssh, config)) if _batch["depth"] else None
    if found is None:
        found = state_digest(ssh, config)     # NotKept is raised each time: it is not memoized
        with _lock:
            if _batch["depth"]:
                _batch["digests"][(ssh, config)] = found
    return found


def answer_key(alias: str, port: Optional[int], user: Optional[str]) -> str:
    return json.dumps([alias, port, user])


def lookup(ssh: str, config: Optional[str], key: str) -> Tuple[Optional[str], Optional[AnswerFile]]:
    """(the kept answer or None, the file to keep a new answer in or None)."""
    if not enabled():
        return None, None
    directory = private_dir()
    if directory is None:
        return None, None
    try:
        digest = _state(ssh, config)
    except (NotKept, OSError):
        return None, None
    with _lock:
        store = _files.get((directory, digest))
        if store is None:
            store = _files[(directory, digest)] = AnswerFile(directory, digest)
        return store.answers.get(key), store


def keep(store: AnswerFile, key: str, answer: str) -> None:
    """Keep a new answer: written by the end of the ``batch`` around it, else at once when the
    last write is SAVE_EVERY_S old, else by the next ``flush``."""
    with _lock:
        if store.answers.get(key) == answer:
            return
        store.answers[key] = answer
        store.dirty = True
        if not _batch["depth"] and time.monotonic() - store.saved_at >= SAVE_EVERY_S:
            store.save()


def flush() -> None:
    """Write every state's answers kept since its last write."""
    with _lock:
        for store in _files.values():
            if store.dirty:
                store.save()
