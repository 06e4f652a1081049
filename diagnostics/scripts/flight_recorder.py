"""flight_recorder: PyTorch flight-recorder dumps of a distributed job, read safely, summed up per rank.

Runnable by hand (standard library only, python3 3.8+): ``python3 flight_recorder.py [PREFIX...]``
prints the JSON of ``collect(PREFIX...)`` (no PREFIX: this process's own environment and
torch's defaults, ``default_prefixes``).

Where torch writes them (torch 2.13, c10d ``DebugInfoWriter::getWriter``): ``<prefix><rank>``,
the prefix from ``$TORCH_FR_DUMP_TEMP_FILE``, else the older name
``$TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, else ``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_`` (no
XDG_CACHE_HOME: ``${HOME:-/tmp}/.cache/torch/comm_lib_trace_rank_``); torch before the rename
wrote ``/tmp/nccl_trace_rank_<rank>``. NCCL writes one on a watchdog timeout
(TORCH_NCCL_DUMP_ON_TIMEOUT); gloo never does by itself, a job may call
``torch._C._distributed_c10d._dump_fr_trace()`` (the same pickle). The file is a pickle of
plain data; ``_dump_fr_trace_json`` gives the same as JSON (its pg_status numbers as strings):
both are read. Recording is on by default (TORCH_FR_BUFFER_SIZE, old TORCH_NCCL_TRACE_BUFFER_SIZE:
2000 entries).

Reading, as root, files that any user may have planted: only names ``<prefix><digits>``;
``lstat`` then ``open(O_NOFOLLOW|O_NONBLOCK)`` and ``fstat``: a regular file or nothing (a link,
a FIFO, a device is refused, never opened or read); at most ``max_bytes``; unpickled with an
Unpickler whose ``find_class`` refuses every global, so nothing in the file runs (a dump holds
dicts, lists, tuples, str, int, float, bool, None only), under an address-space cap
(``max_memory``, RLIMIT_AS's soft limit while parsing) so that a small file of container
opcodes cannot exhaust the node's memory. A file that fails any of this is a per-file ``error``
string, never an exception.

Result (bounded whatever the files hold): ``{"prefixes": [...], "dumps": [...], "more_files": N}``,
a dump ``{"file", "rank", "mtime", "size", "format": "pickle"|"json", "version",
"pg_config": {key: {"name", "desc", "ranks": [[first, last], ...], "ranks_count"}},
"pg_status": {pg_id: {"last_enqueued_collective", "last_started_collective",
"last_completed_collective", "name", "desc", "recent_ops": [[seq, profiling_name], ...]}},
"entries_total", "entries": [the last max_entries, reduced: record_id, pg_id, process_group,
collective_seq_id, p2p_seq_id, op_id, profiling_name, state, is_p2p, retired, input_sizes,
output_sizes, time_created_ns, timeout_ms, frames (max_frames: the innermost, then the
program's own, not site-packages), frames_total]}``
(also "comm_lib_version", and "pg_config_groups"/"pg_status_groups": how many the file had;
"trimmed": true past the output budget) or ``{"file", "rank", "error"}``. gloo's dump has ``pg_config`` under the key ``''`` (no group
name): kept as it is; the client (diagnostics/builtin/stacks/flight_recorder.py) knows that shape.
"""

import io
import json
import os
import pickle
import re
import stat
import sys
import time

import _remote

ENV_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
DEFAULT_NAME = "comm_lib_trace_rank_"           # under $XDG_CACHE_HOME/torch or ~/.cache/torch
LEGACY_PREFIX = "/tmp/nccl_trace_rank_"          # torch before the TORCH_FR_* names
MAX_BYTES = 32 * 1024 * 1024     # one dump file (2000 entries with stacks: a few MB)
MAX_PARSE_MEMORY = 1 << 30      # address space one parse may add (see _MemoryCap)
MAX_OUTPUT = 4 * 1024 * 1024    # JSON of all summaries; past it, dumps keep their status only
MAX_FILES = 64                   # dump files read per call (the others only counted)
MAX_ENTRIES = 16                 # entries kept per dump, the last ones
MAX_FRAMES = 4                   # frames kept per entry: the innermost, then the program's own
MAX_SCAN_FRAMES = 256            # frames of one entry looked at
LIBRARY_DIRS = ("/site-packages/", "/dist-packages/")
MAX_GROUPS = 64                  # process groups kept per dump (pg_config, pg_status)
MAX_SCAN_ENTRIES = 100000        # entries of one dump looked at
MAX_DIR_SCAN = 100000            # directory entries looked at per prefix
MAX_PREFIXES = 16
MAX_TEXT = 200                   # characters of any string kept
MAX_PATH = 4096
MAX_RANKS_TEXT = 4 * 1024 * 1024  # characters of a pg_config "ranks" string parsed
MAX_RANGES = 256                 # [first, last] ranges kept per group's ranks
MAX_RANK = 10 ** 7               # a rank suffix longer than 7 digits is not a rank
MAX_TENSORS = 8                  # input/output sizes kept per entry
MAX_DIMS = 8
RECENT_OPS = 8                   # (seq, op) kept per process group
STATUS_KEYS = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")


def _text(value, limit=MAX_TEXT):
    """A bounded str, or None: str as is, bytes decoded, numbers written out."""
    if isinstance(value, bytes):
        value = value[:limit * 4].decode("utf-8", "replace")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        value = str(value)
    if not isinstance(value, str):
        return None
    return value[:limit]


def _int(value):
    """An int from an int (not a bool) or a decimal string (torch's JSON dump), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 2 ** 63 else None
    if isinstance(value, (str, bytes)) and 0 < len(value) <= 20:
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        if re.fullmatch(r"-?[0-9]+", text.strip()):
            return int(text.strip())
    return None


def _bool(value):
    return value if isinstance(value, bool) else None


# -- where the dumps are ------------------------------------------------------------------------

def _clean_prefix(value):
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    if not isinstance(value, str) or not value or len(value) > MAX_PATH or "\0" in value:
        return None
    return value


def prefixes_from_environ(env, cwd=None, defaults=True):
    """The dump prefixes a process's environment names: ``TORCH_FR_DUMP_TEMP_FILE`` and
    ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` (the first one set is the one torch uses; both are
    given), then, with ``defaults``, torch's default for that environment
    (``$XDG_CACHE_HOME/torch/comm_lib_trace_rank_`` or ``${HOME:-/tmp}/.cache/torch/...``) and
    the old ``/tmp/nccl_trace_rank_``. ``env``: a dict of str (or bytes), e.g. parsed from
    /proc/PID/environ; ``cwd``: the process's working directory (/proc/PID/cwd), for a relative
    prefix (without it a relative prefix is left relative). Anything not a usable path is
    skipped."""
    env = env if isinstance(env, dict) else {}

    def get(name):
        value = env.get(name)
        if value is None:
            value = env.get(name.encode())
        return _clean_prefix(value)

    found = [get(name) for name in ENV_VARS]
    if defaults:
        cache = get("XDG_CACHE_HOME")
        if cache is None:
            cache = os.path.join(get("HOME") or "/tmp", ".cache")
        found.append(os.path.join(cache, "torch", DEFAULT_NAME))
        found.append(LEGACY_PREFIX)
    out = []
    for prefix in found:
        if prefix is None:
            continue
        if not os.path.isabs(prefix) and cwd:
            prefix = os.path.join(cwd, prefix)
        if prefix not in out:
            out.append(prefix)
    return out


def default_prefixes(env=None):
    """This process's own: ``prefixes_from_environ(os.environ)`` (the default when no prefix
    is given)."""
    return prefixes_from_environ(dict(os.environ) if env is None else env)


def _candidates(prefix):
    """[(rank, path)] of the names ``<prefix><digits>`` in the prefix's directory (an error
    listing it: none)."""
    directory, base = os.path.split(prefix)
    directory = directory or "."
    found = []
    try:
        with os.scandir(directory) as it:
            for n, entry in enumerate(it):
                if n >= MAX_DIR_SCAN:
                    break
                name = entry.name
                if not name.startswith(base):
                    continue
                suffix = name[len(base):]
                if re.fullmatch(r"[0-9]{1,7}", suffix):
                    found.append((int(suffix), os.path.join(directory, name)))
    except (OSError, ValueError):
        return []
    return found


# -- reading one file ---------------------------------------------------------------------------

class _PlainUnpickler(pickle.Unpickler):
    """Plain data only: every global (class, function) is refused, so nothing in the file
    runs; persistent ids are refused by pickle itself."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError("refused a global (%s.%s): a flight-recorder dump holds "
                                     "plain data only" % (str(module)[:60], str(name)[:60]))


def _kind(mode):
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def read_bytes(path, max_bytes=MAX_BYTES):
    """(bytes, stat, error): the file's bytes when it is a regular file (not a link) of at most
    ``max_bytes``; else (None, stat or None, why)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return None, None, "cannot stat: %s" % (e.strerror or e)
    if not stat.S_ISREG(st.st_mode):
        return None, st, "%s: refused" % _kind(st.st_mode)
    flags = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
             | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        fd = os.open(path, flags)
    except OSError as e:
        return None, st, "cannot open: %s" % (e.strerror or e)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, st, "%s: refused" % _kind(st.st_mode)
        if st.st_size > max_bytes:
            return None, st, "%d bytes, over the %d-byte limit: not read" % (st.st_size, max_bytes)
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > max_bytes:
            return None, st, "grew past the %d-byte limit while read: not read" % max_bytes
        return b"".join(chunks), st, None
    except OSError as e:
        return None, st, "cannot read: %s" % (e.strerror or e)
    finally:
        os.close(fd)


class _MemoryCap(object):
    """While parsing, this process's address space may grow by ``extra`` bytes at most
    (RLIMIT_AS, the soft limit only, put back after): a small file of one-byte opcodes that
    each build a container (``}`` 32 M times: ~2 GB) is a MemoryError, not an OOM kill on a
    GPU node. Where the limit cannot be read or set, nothing is changed."""

    def __init__(self, extra):
        self.extra, self.old, self.resource = extra, None, None

    def __enter__(self):
        try:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            with open("/proc/self/statm") as f:
                size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            cap = size + self.extra
            if hard != resource.RLIM_INFINITY:
                cap = min(cap, hard)
            if soft == resource.RLIM_INFINITY or soft > cap:
                resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
                self.old, self.resource = (soft, hard), resource
        except (ImportError, OSError, ValueError, IndexError, AttributeError):
            pass
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            try:
                self.resource.setrlimit(self.resource.RLIMIT_AS, self.old)
            except (OSError, ValueError):
                pass
        return False


def parse(data, max_memory=None, json_only=False):
    """(dump, format, error): the pickle (globals refused) or JSON document in ``data`` (only
    JSON with ``json_only``: what a worker server answers), parsed with at most ``max_memory``
    bytes more address space (None: MAX_PARSE_MEMORY)."""
    with _MemoryCap(MAX_PARSE_MEMORY if max_memory is None else max_memory):
        return _parse(data, json_only)


def _parse(data, json_only=False):
    head = data[:64].lstrip()
    if head[:1] == b"{" or json_only:
        try:
            return json.loads(data.decode("utf-8")), "json", None
        except (ValueError, RecursionError, MemoryError) as e:
            return None, "json", "not valid JSON (%s)" % type(e).__name__
    if not data:
        return None, None, "empty file"
    try:
        return _PlainUnpickler(io.BytesIO(data)).load(), "pickle", None
    except pickle.UnpicklingError as e:
        message = str(e)
        if message.startswith("refused a global"):
            return None, "pickle", message
        if "truncated" in message:
            return None, "pickle", "a truncated pickle"
        return None, "pickle", "not a valid pickle (nor JSON)"
    except EOFError:
        return None, "pickle", "a truncated pickle"
    except (RecursionError, MemoryError) as e:
        return None, "pickle", "a pickle too deep or too large (%s)" % type(e).__name__
    except Exception as e:  # noqa: BLE001 -- anything a broken pickle raises is this file's error
        return None, "pickle", "not a valid pickle (%s)" % type(e).__name__[:40]


# -- summing one dump up ------------------------------------------------------------------------

def _ranges(values):
    """Sorted ints as [[first, last], ...] (bounded), and how many there were."""
    ranks = sorted(set(values))
    out = []
    for r in ranks:
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        elif len(out) < MAX_RANGES:
            out.append([r, r])
        else:
            break
    return out, len(ranks)


def _ranks(value):
    """pg_config's "ranks": a string "[0, 1, 2, 3]" (pickle and JSON alike) or a list."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if isinstance(value, str):
        numbers = [int(n) for n in re.findall(r"[0-9]{1,9}", value[:MAX_RANKS_TEXT])]
    elif isinstance(value, (list, tuple)):
        numbers = [n for n in (_int(v) for v in value[:MAX_RANK]) if n is not None and n >= 0]
    else:
        return None, None
    return _ranges(numbers)


def _sizes(value):
    if not isinstance(value, (list, tuple)):
        return None
    out = []
    for tensor in value[:MAX_TENSORS]:
        if isinstance(tensor, (list, tuple)):
            out.append([_int(d) for d in tensor[:MAX_DIMS]])
        else:
            out.append(None)
    return out


def _frames(value, max_frames):
    """The innermost frame (torch's collective), then the program's own frames (not under
    site-packages / dist-packages), ``max_frames`` in all; and how many the entry had."""
    if not isinstance(value, (list, tuple)):
        return [], 0
    out = []
    for n, frame in enumerate(value[:MAX_SCAN_FRAMES]):
        if len(out) >= max_frames:
            break
        if not isinstance(frame, dict):
            continue
        filename = _text(frame.get("filename"), MAX_PATH) or ""
        if n > 0 and any(d in filename for d in LIBRARY_DIRS):
            continue
        out.append({"name": _text(frame.get("name")), "filename": filename[-MAX_TEXT:] or None,
                    "line": _int(frame.get("line"))})
    return out, len(value)


def _pg_name(entry):
    """process_group: (name, desc), a tuple in the pickle, a list in JSON."""
    pg = entry.get("process_group")
    if isinstance(pg, (list, tuple)) and pg:
        return _text(pg[0]), _text(pg[1]) if len(pg) > 1 else None
    return None, None


def _entry(entry, max_frames):
    frames, frames_total = _frames(entry.get("frames"), max_frames)
    name, desc = _pg_name(entry)
    out = {"record_id": _int(entry.get("record_id")), "pg_id": _int(entry.get("pg_id")),
           "process_group": [name, desc],
           "collective_seq_id": _int(entry.get("collective_seq_id")),
           "p2p_seq_id": _int(entry.get("p2p_seq_id")), "op_id": _int(entry.get("op_id")),
           "profiling_name": _text(entry.get("profiling_name")), "state": _text(entry.get("state")),
           "is_p2p": _bool(entry.get("is_p2p")), "retired": _bool(entry.get("retired")),
           "input_sizes": _sizes(entry.get("input_sizes")),
           "output_sizes": _sizes(entry.get("output_sizes")),
           "time_created_ns": _int(entry.get("time_created_ns")),
           "timeout_ms": _int(entry.get("timeout_ms")),
           "frames": frames, "frames_total": frames_total}
    return out


def summarize(dump, max_entries=MAX_ENTRIES, max_frames=MAX_FRAMES):
    """(summary, error): the bounded summary of one parsed dump (see the module docstring)."""
    if not isinstance(dump, dict):
        return None, "not a flight-recorder dump (a %s, not a dict)" % type(dump).__name__
    if not any(k in dump for k in ("entries", "pg_status", "pg_config")):
        return None, "not a flight-recorder dump (no entries, pg_status or pg_config)"
    out = {"version": _text(dump.get("version")),
           "comm_lib_version": _text(dump.get("comm_lib_version"))}

    config = {}
    raw_config = dump.get("pg_config")
    if isinstance(raw_config, dict):
        for key, value in list(raw_config.items())[:MAX_GROUPS]:
            key = _text(key)
            if key is None or not isinstance(value, dict):
                continue
            ranges, count = _ranks(value.get("ranks"))
            config[key] = {"name": _text(value.get("name")), "desc": _text(value.get("desc")),
                           "ranks": ranges, "ranks_count": count}
        out["pg_config_groups"] = len(raw_config)
    out["pg_config"] = config

    entries = dump.get("entries")
    entries = entries if isinstance(entries, (list, tuple)) else []
    names, ops = {}, {}
    for entry in entries[:MAX_SCAN_ENTRIES]:
        if not isinstance(entry, dict):
            continue
        pg_id = _int(entry.get("pg_id"))
        if pg_id is None:
            continue
        name, desc = _pg_name(entry)
        if name is not None or desc is not None:
            names[pg_id] = (name, desc)
        seq = _int(entry.get("collective_seq_id"))
        if seq is not None and seq > 0 and entry.get("is_p2p") is not True:
            recent = ops.setdefault(pg_id, [])
            op = _text(entry.get("profiling_name"))
            if recent and recent[-1][0] == seq:
                recent[-1][1] = op             # coalesced: one seq, several entries; the last
            else:
                recent.append([seq, op])
                del recent[:-RECENT_OPS]

    status = {}
    raw_status = dump.get("pg_status")
    if isinstance(raw_status, dict):
        for key, value in list(raw_status.items())[:MAX_GROUPS]:
            pg_id = _int(key)
            if pg_id is None or not isinstance(value, dict):
                continue
            item = dict((k, _int(value.get(k))) for k in STATUS_KEYS)
            item["name"], item["desc"] = names.get(pg_id, (None, None))
            item["recent_ops"] = ops.get(pg_id, [])
            status[str(pg_id)] = item
        out["pg_status_groups"] = len(raw_status)
    out["pg_status"] = status
    out["entries_total"] = len(entries)
    kept = entries[max(0, len(entries) - max_entries):] if max_entries > 0 else []
    out["entries"] = [_entry(e, max_frames) for e in kept if isinstance(e, dict)]
    return out, None


def read_dump(path, rank=None, max_bytes=MAX_BYTES, max_entries=MAX_ENTRIES, max_frames=MAX_FRAMES,
              max_memory=None):
    """One file's summary dict, or {"file", "rank", "error"}: never raises for what the file
    holds."""
    item = {"file": _text(path, MAX_PATH), "rank": rank}
    data, st, error = read_bytes(path, max_bytes)
    if st is not None:
        item["mtime"] = st.st_mtime
        item["size"] = st.st_size
    if error is None:
        dump, item["format"], error = parse(data, max_memory)
        del data
    if error is None:
        summary, error = summarize(dump, max_entries, max_frames)
        del dump
    if error is not None:
        item["error"] = error
        return item
    item.update(summary)
    return item


def _trimmed(item):
    """A dump past the output budget: its status numbers only (no entries, ops or ranks)."""
    out = dict((k, v) for k, v in item.items() if k not in ("entries", "pg_config", "pg_status"))
    if "pg_status" in item:
        out["pg_status"] = dict((k, dict((f, v.get(f)) for f in STATUS_KEYS + ("name", "desc")))
                                for k, v in item["pg_status"].items())
        out["pg_config"] = dict((k, {"name": v.get("name"), "desc": v.get("desc"),
                                     "ranks_count": v.get("ranks_count")})
                                for k, v in item.get("pg_config", {}).items())
        out["entries"] = []
        out["trimmed"] = True
    return out


def collect(prefixes=None, max_files=MAX_FILES, max_bytes=MAX_BYTES, max_entries=MAX_ENTRIES,
            max_frames=MAX_FRAMES, max_memory=None, max_output=MAX_OUTPUT):
    """Every dump ``<prefix><rank>`` of ``prefixes`` (None: ``default_prefixes()``), read and
    summed up: ``{"prefixes", "dumps": [one per file, by rank], "more_files"}``. Past
    ``max_output`` bytes of JSON, each further dump is ``trimmed`` to its status numbers."""
    if prefixes is None:
        prefixes = default_prefixes()
    if isinstance(prefixes, (str, bytes)):
        prefixes = [prefixes]
    clean = []
    for prefix in list(prefixes or [])[:MAX_PREFIXES]:
        prefix = _clean_prefix(prefix)
        if prefix is not None and prefix not in clean:
            clean.append(prefix)
    seen, found = set(), []
    for prefix in clean:
        for rank, path in _candidates(prefix):
            try:
                st = os.lstat(path)
                key = (st.st_dev, st.st_ino)
            except OSError:
                key = os.path.abspath(path)
            if key in seen:                       # the same file through two prefixes
                continue
            seen.add(key)
            found.append((rank, path))
    found.sort()
    dumps, used = [], 0
    for rank, path in found[:max(0, max_files)]:
        item = read_dump(path, rank, max_bytes, max_entries, max_frames, max_memory)
        size = len(json.dumps(item))
        if used + size > max_output:
            item = _trimmed(item)
            size = len(json.dumps(item))
        used += size
        dumps.append(item)
    return {"prefixes": clean, "dumps": dumps, "more_files": max(0, len(found) - max(0, max_files))}


# -- asking a live job: torch's worker server ----------------------------------------------------
#
# torch serves a rank's handlers over HTTP from a "worker server" in the rank's own process
# (c10d's WorkerServer, threads named pt_workerserver): on a Unix socket, from
# torch.distributed.elastic.control_plane.worker_main with $TORCH_WORKER_SERVER_SOCKET (torch
# 2.4+), and on a TCP port bound to every address, from torch.distributed.debug.start_debug_server
# (torch 2.10+, every rank; its rank-0 web front end is not needed here). ``POST
# /handler/fr_trace_json`` answers the rank's flight recorder as the JSON dump above (torch
# 2.13, gloo and NCCL alike; NCCL's older handler name, dump_nccl_trace_json, is tried next).
# Nothing is started or changed in the job: the dump is taken under the recorder's lock by the
# server's own thread while the job runs on.
#
# Safety: only a process with a pt_workerserver thread is asked; its Unix socket must be a
# socket owned by the process's user or root, reached through /proc/PID/root (the rank's own
# filesystem, also in a container); a TCP port must be one the process itself listens on, bound
# to the wildcard address (gloo and NCCL bind their own to an interface's address), not the
# store's MASTER_PORT, and in our network namespace; at most LIVE_PORTS ports are tried, each
# with its deadline, and the answer is read up to max_bytes.

WORKER_THREAD = "pt_workerserver"
SOCKET_ENV = "TORCH_WORKER_SERVER_SOCKET"
LIVE_HANDLERS = ("fr_trace_json", "dump_nccl_trace_json")
LIVE_TIMEOUT = 5.0               # seconds for one rank's answer
LIVE_PORTS = 4                   # wildcard-bound TCP ports of one process tried at most


def has_worker_server(pid, proc="/proc"):
    task = os.path.join(proc, str(pid), "task")
    try:
        tids = os.listdir(task)[:4096]
    except OSError:
        return False
    for tid in tids:
        try:
            with open(os.path.join(task, tid, "comm"), "rb") as f:
                if f.read(64).strip() == WORKER_THREAD.encode():
                    return True
        except OSError:
            continue
    return False


def _socket_inodes(pid, proc):
    return set(t[8:-1] for t in _remote.fd_targets(pid, proc)
               if t.startswith("socket:[") and t.endswith("]") and t[8:-1].isdigit())


def wildcard_ports(pid, env, proc="/proc"):
    """[(port, "tcp6" | "tcp")]: the TCP ports the process listens on at the wildcard address
    (IPv6 ``::`` or IPv4 0.0.0.0), from its own /proc/PID/net/tcp6 and tcp, MASTER_PORT left out."""
    mine = _socket_inodes(pid, proc)
    master = (env or {}).get("MASTER_PORT", "")
    ports = []
    for name, wildcard in (("tcp6", "0" * 32), ("tcp", "0" * 8)):
        try:
            with open(os.path.join(proc, str(pid), "net", name)) as f:
                lines = f.read(4 << 20).splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != "0A" or cols[9] not in mine:
                continue
            address, _, port = cols[1].partition(":")
            try:
                port = int(port, 16)
            except ValueError:
                continue
            if address == wildcard and str(port) != master and (port, name) not in ports:
                ports.append((port, name))
    return ports


def _same_netns(pid, proc):
    try:
        return os.readlink(os.path.join(proc, str(pid), "ns", "net")) == os.readlink("/proc/self/ns/net")
    except OSError:
        return False


def _unix_socket(pid, path, proc):
    """(path to connect to, error): the rank's socket seen through its own root."""
    if not path.startswith("/") or len(path) > 200:
        return None, "%s is not an absolute path" % SOCKET_ENV
    full = os.path.join(proc, str(pid), "root") + path
    try:
        st = os.lstat(full)
        owner = os.stat(os.path.join(proc, str(pid))).st_uid
    except OSError as e:
        return None, "%s: %s" % (path, e.strerror or e)
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)
        return None, "%s: %s, not a socket: refused" % (path, kind)
    if st.st_uid not in (owner, 0):
        return None, "%s: owned by uid %d, not the job's: refused" % (path, st.st_uid)
    return full, None


def _post(connect, handler, deadline, max_bytes):
    """(status, body, error) of ``POST /handler/<handler>`` over a fresh connection."""
    import socket
    sock = None
    try:
        family, address = connect
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        sock.connect(address)
        sock.sendall(("POST /handler/%s HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
                      "Connection: close\r\n\r\n" % handler).encode("ascii"))
        data, limit = b"", max_bytes + 65536
        while len(data) <= limit:
            left = deadline - time.monotonic()
            if left <= 0:
                return None, None, "no whole answer in the time allowed"
            sock.settimeout(left)
            chunk = sock.recv(min(1 << 20, limit + 1 - len(data)))
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            length = re.search(br"(?im)^content-length:\s*(\d{1,12})\s*$", head) if sep else None
            if length and len(body) >= int(length.group(1)):
                data = head + sep + body[:int(length.group(1))]
                break
        if len(data) > limit:
            return None, None, "an answer over the %d-byte limit: not read" % max_bytes
    except socket.timeout:
        return None, None, "no whole answer in the time allowed"
    except (OSError, ValueError) as e:
        return None, None, "%s" % (getattr(e, "strerror", None) or e or type(e).__name__)
    finally:
        if sock is not None:
            sock.close()
    head, sep, body = data.partition(b"\r\n\r\n")
    status = re.match(br"HTTP/1\.[01] (\d{3})", head)
    if not sep or not status:
        return None, None, "not an HTTP answer"
    if re.search(br"(?im)^transfer-encoding:\s*chunked", head):
        return int(status.group(1)), None, "a chunked answer (not read)"
    return int(status.group(1)), body, None


def live_dump(pid, env, rank=None, proc="/proc", timeout=LIVE_TIMEOUT, max_bytes=MAX_BYTES,
              max_entries=MAX_ENTRIES, max_frames=MAX_FRAMES, max_memory=None):
    """The flight recorder of a live rank, asked of its torch worker server: a dump dict as
    ``read_dump`` makes (``"file"`` says where it came from, ``"live": true``), or None when the
    process has no worker server. Never raises for what the process or its server does."""
    if not has_worker_server(pid, proc):
        return None
    import socket
    deadline = time.monotonic() + timeout
    env = env or {}
    item = {"file": None, "rank": rank, "live": True}
    path = env.get(SOCKET_ENV)
    tried = []
    if path:
        full, error = _unix_socket(pid, path, proc)
        if error:
            item.update(file="pid %d: %s" % (pid, _text(path, MAX_PATH)), error=error)
            return item
        tried.append(("unix socket %s" % path, (socket.AF_UNIX, full)))
    elif _same_netns(pid, proc):
        for port, kind in wildcard_ports(pid, env, proc)[:LIVE_PORTS]:
            tried.append(("port %d" % port, (socket.AF_INET6, ("::1", port, 0, 0)) if kind == "tcp6"
                          else (socket.AF_INET, ("127.0.0.1", port))))
    else:
        item.update(file="pid %d" % pid, error="its worker server is in another network namespace: "
                                               "add its container as a target")
        return item
    errors = []
    for where, connect in tried:
        for handler in LIVE_HANDLERS:
            status, body, error = _post(connect, handler, deadline, max_bytes)
            if status == 404:
                continue
            item["file"] = _text("pid %d: worker server, %s, /handler/%s" % (pid, where, handler), MAX_PATH)
            if error is None and status != 200:
                error = "HTTP %d" % status
            if error is None:
                item["mtime"], item["size"] = time.time(), len(body)
                dump, item["format"], error = parse(body, max_memory, json_only=True)
                del body
                if error is None:
                    summary, error = summarize(dump, max_entries, max_frames)
                    if error is None:
                        item.update(summary)
                        return item
            errors.append("%s: %s" % (where, error))
            break
        else:
            errors.append("%s: no flight-recorder handler (HTTP 404)" % where)
    item["file"] = item["file"] or "pid %d: worker server" % pid
    item["error"] = _text("; ".join(errors) or "no socket of its worker server found", 600)
    return item


def build_parser():
    import argparse   # only here: through mldiag the client parses argv (bundle.parsed_args)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("prefixes", nargs="*", help="dump prefixes (the file is PREFIX<rank>); default: "
                   "$TORCH_FR_DUMP_TEMP_FILE, $TORCH_NCCL_DEBUG_INFO_TEMP_FILE, torch's defaults")
    p.add_argument("--max-entries", type=int, default=MAX_ENTRIES, help="entries kept per dump")
    p.add_argument("--max-files", type=int, default=MAX_FILES, help="dump files read at most")
    return p


if __name__ == "__main__":
    _args = build_parser().parse_args()
    print(json.dumps(collect(_args.prefixes or None, max_files=_args.max_files,
                             max_entries=_args.max_entries), indent=2))
    sys.exit(0)
