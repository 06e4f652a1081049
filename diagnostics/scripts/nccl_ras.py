#!/usr/bin/env python3
"""nccl-ras: what NCCL's RAS subsystem says about the NCCL job running on this node.

Standard library only, Python 3.8+. NCCL 2.24 and later start a RAS thread in every process of
a job; each listens for clients on ``localhost:28028`` (``NCCL_RAS_ADDR=host:port`` moves it)
and answers for the *whole* job: every process, every communicator, every rank. This is a
client for that port that speaks exactly what NVIDIA's own client ``ncclras`` speaks, bounded
in time and bytes, and reads the answer into findings.

The protocol (NVIDIA/nccl @ 5067397c2676d5aed50042fc39e5c8ee96eb0027, v2.30.7; the client is
``src/ras/client.cc``, the server side ``src/ras/client_support.cc: rasClientEventLoop``, the
constants ``src/ras/ras_internal.h``; the same protocol since 2.24.3, ``SET FORMAT`` since
2.28.7). Text lines, each ended by ``\\n`` (the server also takes ``\\r\\n``), commands matched
without regard to case, one reply line per command:

    -> CLIENT PROTOCOL 2            (NCCL_RAS_CLIENT_PROTOCOL = 2 in every release so far)
    <- SERVER PROTOCOL 2            (the client goes on, with a warning, when the number differs)
    -> TIMEOUT <seconds>            (how long RAS waits for the other processes' data; 0: forever)
    <- OK                           (or "ERROR: Invalid timeout value <v>")
    -> SET FORMAT json              (2.28.7 on; "text" is the default)
    <- OK                           (an older NCCL: "ERROR: Unknown command SET FORMAT json")
    -> STATUS  |  VERBOSE STATUS
    <- the report, in pieces, then the server closes the connection (its end)

An unknown command is answered ``ERROR: Unknown command <cmd>`` and the connection stays
usable; a line over 1024 bytes without a newline makes the server close it. The text report is
``NCCL version ...``, ``CUDA runtime version ...``, ``Job summary`` (its tables), ``Communicators...
(T s)``, the group table, ``Errors`` (INCOMPLETE: processes that sent no data; DEAD: processes
the RAS network gave up on; ``#g-c (hash) INCOMPLETE|ERROR`` per communicator) and ``Warnings``
(TIMEOUT; ``#g-c (hash) MISMATCH``: ranks with different status or operation counts). NCCL lists
the ranks of a group that is an *outlier* only: one rank always; otherwise at most 10 ranks and
at most 25% of the communicator (``VERBOSE STATUS``: under 50%, no cap). The JSON report
(``jsonWriteHeader`` ... ``jsonWriteFooter``) is the raw data instead: every communicator with
every rank (host, pid, GPU, ``init_state``/``async_error`` as ncclResult_t numbers, the
finalize/destroy/abort flags, per-collective operation counts) and every missing rank
(``unresponsive``, ``considered_dead``), then ``ras.collection_time_sec`` and
``ras.timeouts_count``; it has no job summary, so ``job`` is derived from the ranks.

How long: ``ncclras`` waits 1 s for each handshake reply and retries the whole connection when
one is late, for ever; then 1 + TIMEOUT + 5 s for the report (RAS's collective gives up on slow
peers after TIMEOUT s, default 5, and on everything 5 s later, both times
``NCCL_RAS_TIMEOUT_FACTOR``). This client never retries: one total deadline (``timeout``, 10 s by
default) bounds resolving, connecting and every read; a handshake reply must also come within
``HANDSHAKE_READ`` s; it sends ``TIMEOUT`` = the deadline less RAS's 5 s grace less 1 s (at least
1), so that RAS answers, with what it has, before the deadline. The answer is read to at most
``max_bytes`` (8 MiB). A server that drips, floods, closes early or greets wrongly costs at most
the deadline and the cap, and is named (``ras-no-answer``, ``ras-protocol``).

What is found (the codes; NCCL's own sections decide the level: its ``Errors`` are fails, its
``Warnings`` warns):

- ``ras-unreachable``: info when the connection is refused (nothing listens: no NCCL 2.24+ job
  with RAS on this node, or it uses another ``NCCL_RAS_ADDR``); warn when connecting timed out
  or failed otherwise (a firewall, a wrong address), since then something may be there;
- ``ras-no-answer`` (warn): connected, but no complete answer within the deadline (a RAS thread
  that is stuck, or a report that takes longer than the deadline);
- ``ras-protocol`` (warn): what answered is not NCCL's RAS (another greeting, an unexpected
  reply, a report that does not read as NCCL's), or it closed early, or sent more than the cap;
- ``ras-rank-missing`` (fail): a communicator's rank whose process sent no data (INCOMPLETE);
- ``ras-process-missing`` / ``ras-process-dead`` (fail): a job process that sent no data / that
  the RAS network declared dead (unreachable for 60 s);
- ``ras-comm-error`` (fail): ranks that report an initialization or asynchronous NCCL error;
- ``ras-rank-behind`` / ``ras-rank-ahead`` (warn): ranks whose count of one collective differs
  from what most ranks have launched (NCCL's MISMATCH: a Warning; NCCL's guide: no concern while
  the counts move between queries, a communicator stuck if they do not);
- ``ras-rank-status`` (warn): ranks in another state than most (INIT, FINALIZE, ABORT);
- ``ras-rank-nocomm`` (warn): a rank whose process answered but no longer (or not yet) lists the
  communicator (init or teardown in progress);
- ``ras-timeout`` (warn): RAS met communication timeouts while gathering (the data may be partial).

Pure parts the unit tests drive: ``parse_addr``, ``parse_text(text)``, ``parse_json(text)``,
``parse(text)``, ``findings(parsed)``; none raises on any input. ``query(addr, timeout,
max_bytes)`` talks to the server. Run by hand: ``python3 nccl_ras.py [--addr HOST:PORT]
[--timeout S] [--verbose]`` prints the result as JSON and exits 0 ok, 1 warn, 2 fail.
"""

import argparse
import json
import os
import re
import socket
import sys
import threading
import time

TIMEOUT = 30                   # mldiag's budget for the script (the query itself: --timeout)

DEFAULT_PORT = 28028           # NCCL_RAS_CLIENT_PORT
PROTOCOL = 2                   # NCCL_RAS_CLIENT_PROTOCOL
RAS_EXTRA_TIMEOUT = 5          # RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC: RAS's grace after TIMEOUT
DEFAULT_TIMEOUT = 10.0
HANDSHAKE_READ = 3.0           # a handshake reply comes at once (ncclras waits 1 s, then retries)
MAX_BYTES = 8 * 1024 * 1024
MAX_LINE = 4096                # a handshake reply line (NCCL's are under 100 bytes)
MAX_LISTED = 32                # ranks or processes kept per list (their totals are kept too)
MAX_NAMED = 8                  # ranks or processes named in one finding's message
MAX_COMMS = 4096
MAX_RANKS = 1 << 20            # ranks of one communicator read from JSON
MAX_OPS = 16
MAX_TEXT = 200
MAX_INT32 = 2 ** 31 - 1
MAX_COUNT = 2 ** 63 - 1        # an operation count (uint64 in NCCL; mldiag's wire takes int64)

# ncclFuncStr (src/init.cc), the order of rasCollComms' collOpCounts
OPS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
# statusStr in rasClientRunComms, in the order of the rasACStatus bits; "UNKNOWN" is 2.24-2.25's NOCOMM
STATUS_ORDER = ("NOCOMM", "INIT", "RUNNING", "FINALIZE", "ABORT")
STATUS_ALIASES = {"UNKNOWN": "NOCOMM"}
ERRORS_WORDS = ("OK", "MISMATCH", "ERROR", "INCOMPLETE")
# ncclResult_t (src/nccl.h.in) and ncclErrorToString's words (client_support.cc)
NCCL_RESULTS = {0: "Success", 1: "Unhandled CUDA error", 2: "System error", 3: "Internal error",
                4: "Invalid argument", 5: "Invalid usage", 6: "Remote process error",
                7: "NCCL operation in progress", 8: "Timeout"}
IN_PROGRESS = 7

LEVEL_ACTION = {"info": "none", "warn": "monitor", "fail": "app"}
BEHIND_HINT = ("NCCL counts this a warning: ranks launch collectives at their own pace, so a small "
               "spread is normal while the counts move; query again - counts that stay put mean the "
               "communicator is stuck, and the ranks behind (their host and GPU) are where to look")
MISSING_HINT = ("the process holding that rank did not answer RAS: look at that host (is the process "
                "alive, stopped, its node reachable?) and the job's logs; RAS declares it dead after 60 s")


def _remote():
    try:
        import _remote as module
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import _remote as module
    return module


# --------------------------------------------------------------------------- small readers

_SAFE_HOST = re.compile(r"^[0-9A-Za-z.:%_\-\[\]]{1,255}$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _clip(text, n=MAX_TEXT):
    """Untrusted text made safe to quote: control characters as '?', at most ``n`` characters."""
    text = _CONTROL.sub("?", str(text))
    return text if len(text) <= n else text[:n] + "..."


def _int(value, lo=0, hi=MAX_INT32):
    """An int within [lo, hi] (a bool is no int), else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if lo <= value <= hi else None


def _host(value):
    """A host as NCCL prints one (an IPv4/IPv6 address, 'unknown'), else None."""
    if isinstance(value, str) and _SAFE_HOST.match(value):
        return value
    return None


def _hash(value):
    """A communicator hash as 16 lowercase hex digits ('0xae94...' or 'ae94...'), else None."""
    if not isinstance(value, str):
        return None
    m = re.match(r"^(?:0[xX])?([0-9a-fA-F]{1,16})$", value.strip())
    return m.group(1).lower().rjust(16, "0") if m else None


def parse_addr(addr=None):
    """(host, port) from ``HOST:PORT``, ``[IPV6]:PORT``, ``HOST`` or a bare IPv6 address (the
    default port), or from ``$NCCL_RAS_ADDR`` when ``addr`` is None, else localhost:28028.
    Raises ValueError for what is not an address."""
    if addr is None:
        addr = os.environ.get("NCCL_RAS_ADDR") or "localhost:%d" % DEFAULT_PORT
    if not isinstance(addr, str) or not addr.strip() or len(addr) > 300:
        raise ValueError("not an address: %r" % (_clip(addr, 60),))
    addr = addr.strip()
    m = re.match(r"^\[([0-9A-Fa-f:.%\w]+)\](?::(\d+))?$", addr)
    if m:
        host, port = m.group(1), m.group(2)
    elif addr.count(":") == 1:
        host, port = addr.split(":")
    elif ":" in addr:                      # a bare IPv6 address
        host, port = addr, None
    else:
        host, port = addr, None
    if not host or not re.match(r"^[0-9A-Za-z.:%_\-]+$", host):
        raise ValueError("not a host: %r" % (_clip(host, 60),))
    if port is None or port == "":
        return host, DEFAULT_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("not a port: %r" % (_clip(port, 20),))
    return host, int(port)


# --------------------------------------------------------------------------- the exchange

class _Stop(Exception):
    """How the exchange ended early: ``kind`` is a key of query()'s error kinds."""

    def __init__(self, kind, message):
        Exception.__init__(self, message)
        self.kind = kind
        self.message = message


def _resolve(host, port, deadline):
    """getaddrinfo within the deadline (in a thread: a stuck resolver cannot hold us)."""
    box = {}

    def work():
        try:
            box["infos"] = socket.getaddrinfo(host, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            box["error"] = e

    t = threading.Thread(target=work, name="nccl-ras-resolve")
    t.daemon = True
    t.start()
    t.join(max(0.0, deadline - time.monotonic()))
    if t.is_alive():
        raise _Stop("timeout", "resolving %s took longer than the deadline" % _clip(host, 60))
    if "error" in box:
        raise _Stop("resolve", "cannot resolve %s: %s" % (_clip(host, 60), _clip(box["error"], 120)))
    return box["infos"]


def _connect(host, port, deadline):
    refused = timed_out = other = None
    for family, kind, proto, _, sockaddr in _resolve(host, port, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = timed_out or "the deadline passed before connecting"
            break
        sock = socket.socket(family, kind, proto)
        sock.settimeout(left)
        try:
            sock.connect(sockaddr)
            return sock
        except ConnectionRefusedError:
            refused = "connection refused"
        except socket.timeout:
            timed_out = "connecting timed out"
        except OSError as e:
            other = _clip(e.strerror or e, 120)
        sock.close()
    if timed_out:
        raise _Stop("timeout", timed_out)
    if other:
        raise _Stop("unreachable", other)
    raise _Stop("refused", refused or "no address to connect to")


class _Reader(object):
    """Reads from ``sock`` within the deadline and the byte cap; keeps what it has read."""

    def __init__(self, sock, deadline, max_bytes):
        self.sock, self.deadline, self.max_bytes = sock, deadline, max_bytes
        self.buf = b""
        self.total = 0
        self.eof = False

    def _recv(self, per_read=None):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Stop("timeout", "no complete answer within the deadline")
        wait = left if per_read is None else min(left, per_read)
        self.sock.settimeout(wait)
        try:
            chunk = self.sock.recv(min(65536, max(1, self.max_bytes - self.total + 1)))
        except socket.timeout:
            if per_read is not None and wait < left:
                raise _Stop("timeout", "no reply within %g s" % per_read)
            raise _Stop("timeout", "no complete answer within the deadline")
        except OSError as e:
            raise _Stop("closed", "the connection failed: %s" % _clip(e.strerror or e, 120))
        if not chunk:
            self.eof = True
            return False
        self.total += len(chunk)
        self.buf += chunk
        if self.total > self.max_bytes:
            raise _Stop("too-long", "more than %d bytes" % self.max_bytes)
        return True

    def line(self, per_read):
        """One reply line (without its newline), read as NCCL's client does: up to a newline."""
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                raise _Stop("protocol", "a reply line longer than %d bytes" % MAX_LINE)
            if not self._recv(per_read):
                raise _Stop("closed", "the server closed the connection%s" % (
                    " after %r" % _clip(self.buf.decode("utf-8", "replace"), 60) if self.buf else ""))
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode("utf-8", "replace")

    def rest(self):
        """Everything up to the server's close."""
        while self._recv():
            pass
        return self.buf


def _send(sock, text, deadline):
    left = deadline - time.monotonic()
    if left <= 0:
        raise _Stop("timeout", "no complete answer within the deadline")
    sock.settimeout(left)
    try:
        sock.sendall(text.encode("ascii"))
    except socket.timeout:
        raise _Stop("timeout", "sending %r timed out" % text.strip())
    except OSError as e:
        raise _Stop("closed", "sending %r failed: %s" % (text.strip(), _clip(e.strerror or e, 120)))


def ras_timeout(timeout):
    """The TIMEOUT sent to RAS for a total deadline of ``timeout`` s: RAS answers (with what it
    has) after TIMEOUT + its 5 s grace at worst, so that is kept 1 s inside the deadline."""
    return max(1, int(timeout) - RAS_EXTRA_TIMEOUT - 1)


def query(addr=None, timeout=DEFAULT_TIMEOUT, max_bytes=MAX_BYTES, verbose=False, fmt="auto"):
    """Ask the RAS server at ``addr`` (``parse_addr``'s forms; None: ``$NCCL_RAS_ADDR``, else
    localhost:28028) for the job's status, within ``timeout`` seconds and ``max_bytes``.

    ``fmt``: "auto" asks for JSON and takes text from an NCCL before 2.28.7, "text" never asks,
    "json" asks and takes text all the same. ``verbose``: VERBOSE STATUS (NCCL lists more
    outlier ranks in its text report). Never raises for what the network or the server does::

        {"addr": "localhost:28028", "connected": bool, "server_protocol": int | None,
         "format": "json" | "text" | None, "json_refused": the server's ERROR line or None,
         "answer": str (the report as received, decoded), "bytes": int (all received),
         "complete": bool (the server closed after its report), "seconds": float,
         "error": None | {"kind": "refused" | "timeout" | "unreachable" | "resolve" | "closed"
                          | "protocol" | "too-long" | "address", "stage": "connect" |
                          "handshake" | "timeout" | "format" | "status", "message": str},
         "notes": [str]}
    """
    start = time.monotonic()
    try:
        timeout = float(timeout)
    except (TypeError, ValueError):
        timeout = DEFAULT_TIMEOUT
    if not timeout > 0 or timeout != timeout:
        timeout = DEFAULT_TIMEOUT
    max_bytes = max_bytes if _int(max_bytes, 1, 1 << 40) else MAX_BYTES
    out = {"addr": None, "connected": False, "server_protocol": None, "format": None,
           "json_refused": None, "answer": "", "bytes": 0, "complete": False, "seconds": 0.0,
           "error": None, "notes": []}
    deadline = start + timeout
    stage = "connect"
    sock = reader = None
    try:
        try:
            host, port = parse_addr(addr)
        except ValueError as e:
            raise _Stop("address", str(e))
        out["addr"] = ("[%s]:%d" if ":" in host else "%s:%d") % (host, port)
        sock = _connect(host, port, deadline)
        out["connected"] = True
        reader = _Reader(sock, deadline, max_bytes)

        stage = "handshake"
        _send(sock, "CLIENT PROTOCOL %d\n" % PROTOCOL, deadline)
        line = reader.line(HANDSHAKE_READ)
        if not line.upper().startswith("SERVER PROTOCOL "):
            raise _Stop("protocol", "unexpected greeting %r (NCCL answers SERVER PROTOCOL %d)" % (
                _clip(line, 80), PROTOCOL))
        m = re.match(r"^\s*([+-]?\d+)", line[len("SERVER PROTOCOL "):])
        out["server_protocol"] = _int(int(m.group(1)), -MAX_INT32, MAX_INT32) if m and len(m.group(1)) < 12 else None
        if out["server_protocol"] != PROTOCOL:
            out["notes"].append("RAS protocol %s, this client speaks %d; going on, as ncclras does" % (
                _clip(line[len("SERVER PROTOCOL "):], 20), PROTOCOL))

        stage = "timeout"
        _send(sock, "TIMEOUT %d\n" % ras_timeout(timeout), deadline)
        line = reader.line(HANDSHAKE_READ)
        if line.rstrip("\r").upper() != "OK":
            raise _Stop("protocol", "unexpected reply to TIMEOUT: %r" % _clip(line, 80))

        out["format"] = "text"
        if fmt in ("auto", "json"):
            stage = "format"
            _send(sock, "SET FORMAT json\n", deadline)
            line = reader.line(HANDSHAKE_READ).rstrip("\r")
            if line.upper() == "OK":
                out["format"] = "json"
            elif line.upper().startswith("ERROR:"):
                out["json_refused"] = _clip(line, 120)     # NCCL before 2.28.7: text it is
            else:
                raise _Stop("protocol", "unexpected reply to SET FORMAT: %r" % _clip(line, 80))

        stage = "status"
        _send(sock, "VERBOSE STATUS\n" if verbose else "STATUS\n", deadline)
        reader.rest()
        out["complete"] = True
    except _Stop as stop:
        out["error"] = {"kind": stop.kind, "stage": stage, "message": stop.message}
    finally:
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass
    if reader is not None:
        data = reader.buf[:max_bytes]
        out["answer"] = data.decode("utf-8", "replace") if stage == "status" else ""
        out["bytes"] = reader.total
    out["seconds"] = round(time.monotonic() - start, 3)
    return out


# --------------------------------------------------------------------------- the parsed shape

def _empty(fmt):
    return {"format": fmt, "recognized": False, "complete": False, "nccl_version": None,
            "cuda_version": None, "cuda_runtime": None, "cuda_driver": None, "timestamp": None,
            "job": {"nodes": None, "processes": None, "gpus": None, "processes_per_node": None,
                    "gpus_per_process": None, "derived": fmt == "json"},
            "outlier_nodes": [], "collection_seconds": None, "timeouts": 0, "communicators_count": None,
            "groups": [], "communicators": [], "missing_processes": [], "missing_process_count": 0,
            "dead_processes": [], "dead_process_count": 0, "problems": []}


def _comm(hash_=None, ident=None):
    return {"id": ident, "hash": hash_, "secondary_hash": None, "size": None, "ranks_count": None,
            "missing_ranks_count": None, "status": None, "errors": [],
            "missing": [], "missing_total": 0, "nocomm": [], "nocomm_total": 0,
            "behind": [], "behind_total": 0, "ahead": [], "ahead_total": 0,
            "status_outliers": [], "status_outliers_total": 0, "rank_errors": [], "rank_errors_total": 0,
            "op_counts": {}}


def _keep(comm, key, entry):
    """Append ``entry`` to comm[key] within MAX_LISTED; count it in comm[key + '_total']."""
    comm[key + "_total"] += 1
    if len(comm[key]) < MAX_LISTED:
        comm[key].append(entry)


def _problem(parsed, text):
    if len(parsed["problems"]) < 20:
        parsed["problems"].append(_clip(text, 160))


def parse(text):
    """parse_json for what starts with '{', else parse_text."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return parse_text("")
    return parse_json(text) if text.lstrip()[:1] == "{" else parse_text(text)


# --------------------------------------------------------------------------- JSON

def parse_json(text):
    """NCCL's JSON report (2.28.7 on; ``rasDumpCommsToJSON``) -> the parsed shape. Every field
    is checked (type, bounds); what fails is left out and named in ``problems``. Never raises."""
    parsed = _empty("json")
    try:
        doc = json.loads(text) if isinstance(text, (str, bytes)) else None
    except (ValueError, RecursionError, MemoryError) as e:
        _problem(parsed, "not JSON: %s" % e)
        return parsed
    if not isinstance(doc, dict) or not isinstance(doc.get("communicators"), list):
        _problem(parsed, "JSON without a communicators list: not NCCL's RAS report")
        return parsed
    try:
        _read_json(doc, parsed)
    except (RecursionError, MemoryError) as e:     # pragma: no cover - bounded input
        _problem(parsed, "unreadable: %s" % type(e).__name__)
    return parsed


def _read_json(doc, parsed):
    parsed["recognized"] = True
    version = doc.get("nccl_version")
    if isinstance(version, str) and re.match(r"^\d+\.\d+\.\d+[\w.+-]{0,20}$", version):
        parsed["nccl_version"] = version
    elif version is not None:
        _problem(parsed, "nccl_version is not a version")
    parsed["cuda_runtime"] = _int(doc.get("cuda_runtime_version"), -1)
    parsed["cuda_driver"] = _int(doc.get("cuda_driver_version"), -1)
    if isinstance(doc.get("timestamp"), str):
        parsed["timestamp"] = _clip(doc["timestamp"], 40)
    comms = doc["communicators"]
    count = _int(doc.get("communicators_count"), 0, MAX_INT32)
    parsed["communicators_count"] = count if count is not None else len(comms)
    if count is not None and count != len(comms):
        _problem(parsed, "communicators_count %d, %d listed" % (count, len(comms)))
    if len(comms) > MAX_COMMS:
        _problem(parsed, "%d communicators: the first %d read" % (len(comms), MAX_COMMS))
    ras = doc.get("ras") if isinstance(doc.get("ras"), dict) else {}
    secs = ras.get("collection_time_sec")
    if isinstance(secs, (int, float)) and not isinstance(secs, bool) and 0 <= secs < 1e7:
        parsed["collection_seconds"] = float(secs)
    parsed["timeouts"] = _int(ras.get("timeouts_count")) or 0
    parsed["complete"] = "ras" in doc
    hosts, processes, gpus = set(), set(), set()
    for c in comms[:MAX_COMMS]:
        if not isinstance(c, dict):
            _problem(parsed, "a communicator that is not an object")
            continue
        comm = _json_comm(c, parsed, hosts, processes, gpus)
        if comm is not None:
            parsed["communicators"].append(comm)
    job = parsed["job"]
    job["nodes"], job["processes"], job["gpus"] = len(hosts), len(processes), len(gpus)


def _json_rank(r, parsed):
    if not isinstance(r, dict):
        return None
    rank = _int(r.get("rank"))
    if rank is None:
        _problem(parsed, "a rank without a valid rank number")
        return None
    host = _host(r.get("host"))
    if r.get("host") is not None and host is None:
        _problem(parsed, "rank %d: a host that is not an address" % rank)
    pid = _int(r.get("pid"), -1)
    return {"rank": rank, "host": None if host == "unknown" else host,
            "pid": None if pid in (None, -1) else pid,
            "gpu": _int(r.get("cuda_dev"), -1, 4096), "nvml": _int(r.get("nvml_dev"), -1, 4096)}


def _rank_status(st):
    if st.get("abort_flag") is True:
        return "ABORT"
    if st.get("finalize_called") is True or st.get("destroy_flag") is True:
        return "FINALIZE"
    return "RUNNING" if st.get("init_state") == 0 else "INIT"


def _json_comm(c, parsed, hosts, processes, gpus):
    comm = _comm(_hash(c.get("hash")))
    if comm["hash"] is None:
        _problem(parsed, "a communicator without a valid hash")
    sec = c.get("secondary_hash")
    if isinstance(sec, str) and re.match(r"^0x[0-9a-fA-F]{1,16}:0x[0-9a-fA-F]{1,16}$", sec):
        comm["secondary_hash"] = sec.lower()
    comm["size"] = _int(c.get("size"), 0, MAX_RANKS)
    comm["ranks_count"] = _int(c.get("ranks_count"), 0, MAX_RANKS)
    comm["missing_ranks_count"] = _int(c.get("missing_ranks_count"), 0, MAX_RANKS)
    ranks = c.get("ranks") if isinstance(c.get("ranks"), list) else []
    missing = c.get("missing_ranks") if isinstance(c.get("missing_ranks"), list) else []
    if len(ranks) > MAX_RANKS or len(missing) > MAX_RANKS:
        _problem(parsed, "communicator %s: more ranks than %d" % (comm["hash"], MAX_RANKS))
        ranks, missing = ranks[:MAX_RANKS], missing[:MAX_RANKS]
    present, statuses, counts, errors = [], {}, {}, False
    for r in ranks:
        entry = _json_rank(r, parsed)
        if entry is None:
            continue
        st = r.get("status") if isinstance(r.get("status"), dict) else {}
        status = _rank_status(st)
        entry["status"] = status
        statuses.setdefault(status, []).append(entry)
        for kind, key in (("init", "init_state"), ("async", "async_error")):
            code = _int(st.get(key), -MAX_INT32)
            if code is not None and code not in (0, IN_PROGRESS):
                errors = True
                _keep(comm, "rank_errors", dict(entry, kind=kind, code=code,
                                                error=NCCL_RESULTS.get(code, "Unexpected error")))
        ops = r.get("collective_counts") if isinstance(r.get("collective_counts"), dict) else {}
        for op, n in list(ops.items())[:MAX_OPS]:
            n = _int(n, 0, MAX_COUNT)
            if n is not None and isinstance(op, str) and re.match(r"^\w{1,32}$", op):
                counts.setdefault(op, []).append((n, entry))
        present.append(entry)
        _tally(entry, hosts, processes, gpus)
    for r in missing:
        entry = _json_rank(r, parsed)
        if entry is None:
            continue
        st = r.get("status") if isinstance(r.get("status"), dict) else {}
        entry["unresponsive"] = st.get("unresponsive") is True
        entry["dead"] = st.get("considered_dead") is True
        _tally(entry, hosts, processes, gpus)
        if entry["unresponsive"] or entry["dead"]:
            _keep(comm, "missing", entry)
        else:
            _keep(comm, "nocomm", entry)
    # what rasClientRunComms derives for its text report, from the same data
    mismatch = bool(comm["nocomm_total"])
    for op in sorted(counts, key=lambda o: OPS.index(o) if o in OPS else len(OPS)):
        mismatch = _json_counts(comm, op, counts[op]) or mismatch
    if len(statuses) > 1:
        mismatch = True
        common = max(statuses, key=lambda s: (len(statuses[s]), STATUS_ORDER.index(s)))
        for s, entries in sorted(statuses.items()):
            if s != common:
                for e in entries:
                    _keep(comm, "status_outliers", dict(e, reference=common))
    order = [s for s in STATUS_ORDER if s in statuses or (s == "NOCOMM" and comm["nocomm_total"])]
    comm["status"] = order[-1] if order else None
    comm["errors"] = [w for w, on in (("INCOMPLETE", comm["missing_total"]), ("ERROR", errors),
                                      ("MISMATCH", mismatch)) if on] or ["OK"]
    if comm["ranks_count"] is not None and comm["ranks_count"] != len(ranks):
        _problem(parsed, "communicator %s: ranks_count %d, %d listed" % (comm["hash"], comm["ranks_count"], len(ranks)))
    return comm


def _tally(entry, hosts, processes, gpus):
    if entry["host"]:
        hosts.add(entry["host"])
        if entry["pid"] is not None:
            processes.add((entry["host"], entry["pid"]))
        if entry["nvml"] is not None:
            gpus.add((entry["host"], entry["nvml"]))


def _json_counts(comm, op, values):
    """Ranks whose count of ``op`` differs from the reference: the most common count (the
    larger of equally common ones), as NCCL's rasValCountsCompareRev orders them."""
    freq = {}
    for n, _ in values:
        freq[n] = freq.get(n, 0) + 1
    ref = max(freq, key=lambda n: (freq[n], n))
    comm["op_counts"][op] = {"reference": ref, "ranks_at_reference": freq[ref],
                             "min": min(freq), "max": max(freq)}
    if len(freq) == 1:
        return False
    for n, entry in sorted(values, key=lambda v: (v[0], v[1]["rank"])):
        if n != ref:
            _keep(comm, "behind" if n < ref else "ahead",
                  dict(entry, op=op, count=n, reference=ref, ranks_at_reference=freq[ref]))
    return True


# --------------------------------------------------------------------------- text

_R = {
    "version": re.compile(r"^NCCL version (\S{1,40}) compiled with CUDA (\S{1,20})$"),
    "cuda": re.compile(r"^CUDA runtime version (-?\d{1,9}), driver version (-?\d{1,9})$"),
    "comms": re.compile(r"^Communicators\.\.\.(?: \((\d{1,7}(?:\.\d{1,6})?)s\))?"),
    "group": re.compile(r"^\s*(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s+(\d{1,9}(?:-\d{1,9})?)\s+(\d{1,9})\s+(\d{1,9})"
                        r"\s+([A-Z]{1,12})\s+([A-Z,]{1,40})\s*$"),
    "comm": re.compile(r"^#(\d{1,9})-(\d{1,9}) \(([0-9a-fA-F]{1,16})\) (INCOMPLETE|ERROR|MISMATCH)\s*$"),
    "proc_missing": re.compile(r"^\s+Missing communicator data from (\d{1,9}) job process(?:es)?\s*$"),
    "proc_dead": re.compile(r"^\s+(\d{1,9}) job process(?:es are| is) considered dead"),
    "process": re.compile(r"^\s+Process (-?\d{1,10}) on node (\S{0,255}) managing GPUs? (.{0,200})$"),
    "rank_missing": re.compile(r"^\s+Missing communicator data from (\d{1,9}) ranks?\s*$"),
    "missing_list": re.compile(r"^\s+The missing ranks?: ([\d, ]{1,1000})$"),
    "unknown_list": re.compile(r"^\s+The unknown ranks: ([\d, ]{1,1000})$"),
    "err_kind": re.compile(r"^\s+(Initialization|Asynchronous) errors? on (\d{1,9}) ranks?\s*$"),
    "err_group": re.compile(r"^\s+(\d{1,9}) ranks reported (.{1,80}?)\s*$"),
    "diff_status": re.compile(r"^\s+Communicator ranks have different status\s*$"),
    "status_group": re.compile(r"^\s+(\d{1,9}) ranks have status ([A-Z]{1,12})\s*$"),
    "diff_ops": re.compile(r"^\s+Communicator ranks have different (\w{1,32}) operation counts\s*$"),
    "ops_group": re.compile(r"^\s+(\d{1,9}) ranks have (?:launched up to operation (\d{1,20})|not launched any operations)\s*$"),
    "timeouts": re.compile(r"^\s+Encountered (\d{1,9}) communication timeouts? while gathering"),
    "outlier_node": re.compile(r"^\s+Node (\S{1,255}) running process(?:es)? ([\d,]{1,1000})\s*$"),
    "rank": re.compile(r"^\s+Rank ([\d,]{1,200})(?: (has status ([A-Z]{1,12})|has launched up to operation (\d{1,20})"
                       r"|has not launched any operations|reported (.{1,80}?)))?"
                       r"(?: -- (?:GPU (\d{1,4})(?: \(NVML (\d{1,4})\))? managed by process (-?\d{1,10}) on node (\S{0,255})"
                       r"|\[process information not found\]))?\s*$"),
}
# the tables' header lines (rasClientRunInit, rasClientRunComms): read as nothing
_HEADERS = frozenset(["Nodes  Processes         GPUs  Processes     GPUs", "Nodes  Processes         GPUs",
                      "per node  per process", "Nodes  Processes", "per node", "Processes         GPUs",
                      "per process", "#  in group  per comm  per node  per comm  in group"])
_INTS5 = re.compile(r"^\s*(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s*$")
_INTS3 = re.compile(r"^\s*(\d{1,9})\s+(\d{1,9})\s+(\d{1,9})\s*$")


def parse_text(text):
    """NCCL's text report (``ncclras``'s output, 2.24 on) -> the parsed shape. What a line says
    is read by its wording (each release's, see the module docstring); a line read as nothing is
    skipped, never an error. Never raises."""
    parsed = _empty("text")
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return parsed
    try:
        _read_text(text[:MAX_BYTES], parsed)
    except (RecursionError, MemoryError) as e:     # pragma: no cover - bounded input
        _problem(parsed, "unreadable: %s" % type(e).__name__)
    return parsed


def _rank_entry(m):
    """A 'Rank N ...' line's rank (or the first of a 2.24 list) with where NCCL says it is."""
    ranks = [int(x) for x in re.findall(r"\d+", m.group(1))][:MAX_LISTED]
    entry = {"rank": ranks[0] if ranks and ranks[0] <= MAX_INT32 else None, "host": None, "pid": None,
             "gpu": None, "nvml": None}
    if m.group(6) is not None:
        entry["gpu"] = int(m.group(6))
        entry["nvml"] = int(m.group(7)) if m.group(7) is not None else entry["gpu"]
        entry["pid"] = _int(int(m.group(8)), -1)
        entry["host"] = _host(m.group(9))
    return ranks, entry


def _read_text(text, parsed):
    comms = {}
    section = table = None
    sub = None            # what the current '#g-c' block or Errors entry is about
    comm = None
    group_value = None    # the current "N ranks ..." group's value
    ref = {}              # op -> the reference count (the first group NCCL printed: the most common)
    seen_errors = seen_warnings = False
    lines = text.split("\n")
    skip = -1             # a table row read with the header above it
    for i, raw in enumerate(lines[:200000]):
        line = raw.rstrip("\r")
        nxt = lines[i + 1].rstrip("\r") if i + 1 < len(lines) else ""
        stripped = line.strip()
        if i == skip or stripped in _HEADERS:
            continue
        if not stripped:
            table = None if table == "groups" else table
            continue
        m = _R["version"].match(line)
        if m:
            parsed["nccl_version"], parsed["cuda_version"] = _clip(m.group(1), 40), _clip(m.group(2), 20)
            parsed["recognized"] = True
            continue
        m = _R["cuda"].match(line)
        if m:
            parsed["cuda_runtime"], parsed["cuda_driver"] = int(m.group(1)), int(m.group(2))
            continue
        if stripped == "Job summary":
            section, parsed["recognized"] = "job", True
            continue
        if stripped.startswith("(total)   per node  per process    (total)  (total)"):
            m = _INTS5.match(nxt)
            if m:
                job, skip = parsed["job"], i + 1
                job["nodes"], job["processes_per_node"], job["gpus_per_process"], job["processes"], job["gpus"] = \
                    [int(x) for x in m.groups()]
            continue
        if stripped.startswith("(total)    (total)      (total)"):
            m = _INTS3.match(nxt)
            if m:
                job, skip = parsed["job"], i + 1
                job["nodes"], job["processes"], job["gpus"] = [int(x) for x in m.groups()]
            continue
        m = _R["outlier_node"].match(line)
        if m and section == "job":
            if len(parsed["outlier_nodes"]) < MAX_LISTED:
                parsed["outlier_nodes"].append({"host": _host(m.group(1)),
                                                "pids": [int(x) for x in m.group(2).split(",")[:MAX_LISTED] if x]})
            continue
        m = _R["comms"].match(line)
        if m:
            section, parsed["recognized"] = "comms", True
            if m.group(1):
                parsed["collection_seconds"] = float(m.group(1))
            continue
        if line.startswith("Group     Comms"):
            table, parsed["recognized"] = "groups", True
            continue
        if stripped == "No communicator data collected!":
            parsed["communicators_count"] = 0
            continue
        if table == "groups":
            m = _R["group"].match(line)
            if m:
                g = [int(x) for x in m.groups()[:3]]
                row = {"group": g[0], "comms": g[1], "nodes": g[2], "ranks_per_node": m.group(4),
                       "ranks": int(m.group(5)), "ranks_in_group": int(m.group(6)),
                       "status": STATUS_ALIASES.get(m.group(7), m.group(7)), "errors": m.group(8).split(",")}
                if len(parsed["groups"]) < MAX_COMMS:
                    parsed["groups"].append(row)
                continue
        if stripped in ("Errors", "Warnings") and nxt.strip() == "=" * len(stripped):
            section, sub, comm, parsed["recognized"] = stripped.lower(), None, None, True
            seen_errors = seen_errors or section == "errors"
            seen_warnings = seen_warnings or section == "warnings"
            continue
        if set(stripped) == {"="}:
            continue
        if section == "errors" and stripped in ("INCOMPLETE", "DEAD"):
            sub, comm = ("processes-missing" if stripped == "INCOMPLETE" else "processes-dead"), None
            continue
        if section == "warnings" and stripped == "TIMEOUT":
            sub, comm = "timeout", None
            continue
        m = _R["comm"].match(line)
        if m:
            ident, h = "#%s-%s" % (m.group(1), m.group(2)), m.group(3).lower().rjust(16, "0")
            comm = comms.get((ident, h))
            if comm is None:
                if len(comms) >= MAX_COMMS:
                    comm = None
                    continue
                comm = comms[(ident, h)] = _comm(h, ident)
                comm["group"] = int(m.group(1))
                parsed["communicators"].append(comm)
            sub, group_value, ref, parsed["recognized"] = m.group(4).lower(), None, {}, True
            continue
        if _text_detail(line, parsed, sub, comm, ref, group_value):
            group_value = _text_detail.group_value
            sub = _text_detail.sub
            continue
        _problem(parsed, "line %d not read: %s" % (i + 1, line))
    parsed["complete"] = seen_errors and seen_warnings
    for c in parsed["communicators"]:
        for row in parsed["groups"]:
            if row["group"] == c.get("group"):
                c["status"], c["errors"] = row["status"], list(row["errors"])
                c["size"] = row["ranks"]
    if parsed["communicators_count"] is None and parsed["groups"]:
        parsed["communicators_count"] = sum(r["comms"] for r in parsed["groups"])


def _text_detail(line, parsed, sub, comm, ref, group_value):
    """One line inside an Errors/Warnings entry; True when read (the new state left on the
    function: ``group_value``, ``sub``)."""
    _text_detail.group_value, _text_detail.sub = group_value, sub
    m = _R["proc_missing"].match(line)
    if m and sub == "processes-missing":
        parsed["missing_process_count"] = int(m.group(1))
        return True
    m = _R["proc_dead"].match(line)
    if m and sub == "processes-dead":
        parsed["dead_process_count"] = int(m.group(1))
        return True
    m = _R["process"].match(line)
    if m and sub in ("processes-missing", "processes-dead"):
        key = "missing_processes" if sub == "processes-missing" else "dead_processes"
        if len(parsed[key]) < MAX_LISTED:
            parsed[key].append({"pid": _int(int(m.group(1)), -1), "host": _host(m.group(2)),
                                "gpus": _clip(m.group(3), 60)})
        return True
    if re.match(r"^\s+\[could not find information on \d+ process(?:es)?\]\s*$", line):
        return True
    m = _R["timeouts"].match(line)
    if m:
        parsed["timeouts"] = int(m.group(1))
        return True
    if comm is None:
        return False
    m = _R["rank_missing"].match(line)
    if m and sub == "incomplete":
        comm["missing_total"] = max(comm["missing_total"], int(m.group(1)))
        return True
    m = _R["missing_list"].match(line)
    if m and sub == "incomplete":
        for r in [int(x) for x in re.findall(r"\d+", m.group(1))][:MAX_LISTED]:
            if len(comm["missing"]) < MAX_LISTED:
                comm["missing"].append({"rank": r, "host": None, "pid": None, "gpu": None, "nvml": None})
        return True
    m = _R["err_kind"].match(line)
    if m and sub in ("error", "error-init", "error-async"):
        _text_detail.sub = "error-init" if m.group(1) == "Initialization" else "error-async"
        _text_detail.group_value = None
        return True
    m = _R["err_group"].match(line)
    if m and sub in ("error-init", "error-async"):
        _text_detail.group_value = _clip(m.group(2), 80)
        return True
    if _R["diff_status"].match(line) and sub in ("mismatch", "mismatch-status", "mismatch-ops"):
        _text_detail.sub, _text_detail.group_value = "mismatch-status", None
        return True
    m = _R["status_group"].match(line)
    if m and sub == "mismatch-status":
        value = STATUS_ALIASES.get(m.group(2), m.group(2))
        ref.setdefault("status", value)
        if value == "NOCOMM":            # those ranks are not listed one by one
            comm["nocomm_total"] = max(comm["nocomm_total"], int(m.group(1)))
        _text_detail.group_value = value
        return True
    m = _R["diff_ops"].match(line)
    if m and sub in ("mismatch", "mismatch-status", "mismatch-ops"):
        _text_detail.sub, _text_detail.group_value = "mismatch-ops", None
        ref["op"] = m.group(1)          # 'collective' before 2.26: all collectives counted together
        return True
    m = _R["ops_group"].match(line)
    if m and sub == "mismatch-ops":
        value = int(m.group(2)) if m.group(2) else 0
        if ("count", ref.get("op")) not in ref:
            ref[("count", ref.get("op"))], ref[("n", ref.get("op"))] = value, int(m.group(1))
        _text_detail.group_value = value
        return True
    m = _R["unknown_list"].match(line)
    if m and sub == "mismatch-status":          # 2.24-2.25: the ranks that sent nothing for it
        for r in [int(x) for x in re.findall(r"\d+", m.group(1))][:MAX_LISTED]:
            _keep(comm, "nocomm", {"rank": r, "host": None, "pid": None, "gpu": None, "nvml": None})
        return True
    m = _R["rank"].match(line)
    if m:
        return _text_rank(m, comm, sub, ref, group_value)
    return False


def _text_rank(m, comm, sub, ref, group_value):
    ranks, entry = _rank_entry(m)
    if entry["rank"] is None:
        return False
    if sub == "incomplete":
        if len(comm["missing"]) < MAX_LISTED:
            comm["missing"].append(dict(entry, unresponsive=True, dead=None))
        return True
    if sub in ("error-init", "error-async"):
        error = m.group(5) or group_value
        if error is None:
            return False
        _text_detail.group_value = error if m.group(5) else group_value
        code = [k for k, v in NCCL_RESULTS.items() if v == error]
        _keep(comm, "rank_errors", dict(entry, kind=sub[6:], code=code[0] if code else None, error=error))
        return True
    if sub == "mismatch-status":
        status = m.group(3) or group_value
        status = STATUS_ALIASES.get(status, status)
        if status is None:
            return False
        ref.setdefault("status", status)
        for r in ranks:
            e = dict(entry, rank=r) if len(ranks) > 1 else entry
            if status == "NOCOMM":
                _keep(comm, "nocomm", e)
            elif status != ref["status"]:
                _keep(comm, "status_outliers", dict(e, status=status, reference=ref["status"]))
        return True
    if sub == "mismatch-ops":
        op = ref.get("op")
        if m.group(4) is not None:
            value = int(m.group(4))
        elif m.group(2) == "has not launched any operations":
            value = 0
        else:
            value = group_value
        if value is None or value > MAX_COUNT:
            return False
        reference = ref.setdefault(("count", op), value)
        stats = comm["op_counts"].setdefault(op, {"reference": reference, "ranks_at_reference": ref.get(("n", op)),
                                                  "min": value, "max": value})
        stats["min"], stats["max"] = min(stats["min"], value, reference), max(stats["max"], value, reference)
        if value != reference:
            _keep(comm, "behind" if value < reference else "ahead",
                  dict(entry, op=op, count=value, reference=reference, ranks_at_reference=ref.get(("n", op))))
        return True
    return False


# --------------------------------------------------------------------------- findings

def _finding(level, code, message, hint=None):
    f = {"level": level, "code": code, "message": _clip(message, 600), "action": LEVEL_ACTION[level]}
    if hint:
        f["hint"] = hint
    return f


def _where(e):
    """'rank 5 (GPU 5, process 1005 on 10.0.0.1)' from what NCCL said about it."""
    parts = []
    if e.get("gpu") is not None:
        parts.append("GPU %d" % e["gpu"] + (" (NVML %d)" % e["nvml"] if e.get("nvml") not in (None, e["gpu"]) else ""))
    if e.get("pid") is not None or e.get("host"):
        parts.append("process %s on %s" % (e["pid"] if e.get("pid") is not None else "?", e.get("host") or "?"))
    return "rank %d" % e["rank"] + (" (%s)" % ", ".join(parts) if parts else "")


def _named(entries, total, describe=_where):
    text = "; ".join(describe(e) for e in entries[:MAX_NAMED])
    rest = max(total, len(entries)) - min(len(entries), MAX_NAMED)
    return text + (" and %d more" % rest if rest > 0 else "")


def _comm_name(c):
    name = "communicator %s" % (c["hash"] or "?")
    if c.get("id"):
        name += " (%s)" % c["id"]
    if c.get("size"):
        name += " of %d ranks" % c["size"]
    return name


def findings(parsed):
    """The findings a parsed report makes (a healthy job: none). Never raises."""
    try:
        return _findings(parsed)
    except Exception as e:                    # pragma: no cover - the parsers' shape is ours
        return [_finding("warn", "ras-protocol", "the RAS report could not be judged: %s" % type(e).__name__)]


def _findings(parsed):
    out = []
    if not isinstance(parsed, dict):
        return out
    if not parsed.get("recognized"):
        out.append(_finding("warn", "ras-protocol", "the answer does not read as NCCL's RAS report%s" % (
            ": " + parsed["problems"][0] if parsed.get("problems") else "")))
        return out
    n_proc, procs = parsed.get("missing_process_count") or 0, parsed.get("missing_processes") or []
    if n_proc or procs:
        out.append(_finding("fail", "ras-process-missing", "%d job process%s sent RAS no data: %s" % (
            max(n_proc, len(procs)), "es" if max(n_proc, len(procs)) > 1 else "",
            _named(procs, n_proc, _process) or "not listed by NCCL (query with --verbose)"), MISSING_HINT))
    n_dead, dead = parsed.get("dead_process_count") or 0, parsed.get("dead_processes") or []
    if n_dead or dead:
        out.append(_finding("fail", "ras-process-dead", "%d job process%s considered dead by RAS (unreachable "
                            "via the RAS network): %s" % (max(n_dead, len(dead)), "es" if max(n_dead, len(dead)) > 1 else "",
                                                          _named(dead, n_dead, _process) or "not listed by NCCL"),
                            "RAS gave up on it after 60 s without an answer: the process is gone or its node is"))
    for c in parsed.get("communicators") or []:
        out.extend(_comm_findings(c))
    if parsed.get("timeouts"):
        out.append(_finding("warn", "ras-timeout", "RAS met %d communication timeout%s while gathering the "
                            "communicators' data: what it reports may be partial" % (
                                parsed["timeouts"], "s" if parsed["timeouts"] > 1 else "")))
    if parsed.get("format") == "text" and not parsed.get("complete"):
        out.append(_finding("warn", "ras-protocol", "the RAS report ended before its Errors and Warnings sections"))
    elif parsed.get("format") == "json" and not parsed.get("complete"):
        out.append(_finding("warn", "ras-protocol", "the RAS JSON report has no 'ras' footer: it may be cut"))
    return out


def _process(p):
    return "process %s on %s (GPU %s)" % (p.get("pid") if p.get("pid") is not None else "?", p.get("host") or "?",
                                          p.get("gpus") or "?")


def _comm_findings(c):
    out = []
    name = _comm_name(c)
    missing_total = max(c["missing_total"], len(c["missing"]))
    if missing_total:
        dead = [e for e in c["missing"] if e.get("dead")]
        out.append(_finding("fail", "ras-rank-missing", "%s: %d rank%s missing (no data from %s): %s" % (
            name, missing_total, "s" if missing_total > 1 else "", "its process" if missing_total == 1 else "their processes",
            _named(c["missing"], missing_total) or "not listed by NCCL (query with --verbose)")
            + (" - %d of them considered dead" % len(dead) if dead else ""), MISSING_HINT))
    elif "INCOMPLETE" in (c.get("errors") or []):
        out.append(_finding("fail", "ras-rank-missing", "%s: INCOMPLETE (ranks missing)" % name, MISSING_HINT))
    if c["rank_errors"] or "ERROR" in (c.get("errors") or []):
        total = max(c["rank_errors_total"], len(c["rank_errors"]))
        text = _named(c["rank_errors"], total, lambda e: "%s: %s %s" % (
            _where(e), "initialization error" if e["kind"] == "init" else "asynchronous error", e["error"]))
        out.append(_finding("fail", "ras-comm-error", "%s: %s" % (name, text or "ERROR (ranks report NCCL errors)"),
                            "the ranks' own logs (NCCL WARN lines) say what failed; the job must restart"))
    for key, code, word in (("behind", "ras-rank-behind", "behind"), ("ahead", "ras-rank-ahead", "ahead of")):
        entries = c[key]
        if not entries:
            continue
        total = max(c[key + "_total"], len(entries))
        by_op = {}
        for e in entries:
            by_op.setdefault(e.get("op"), []).append(e)
        parts = []
        for op, es in by_op.items():
            ref = es[0]["reference"]
            at = es[0].get("ranks_at_reference")
            parts.append("%s operations: %s %s the %s%s" % (
                op or "collective", _named(es, len(es), lambda e: "%s at %d" % (_where(e), e["count"])),
                "behind" if key == "behind" else "ahead of", "%d ranks at " % at if at else "most ranks' ", ref))
        if key == "ahead":
            message = "%s: %d rank%s %s the others, which have launched fewer operations - " % (
                name, total, "s" if total > 1 else "", "are ahead of" if total > 1 else "is ahead of")
        else:
            message = "%s: %d rank%s %s - " % (name, total, "s" if total > 1 else "", word)
        out.append(_finding("warn", code, message + "; ".join(parts), BEHIND_HINT))
    if c["status_outliers"]:
        total = max(c["status_outliers_total"], len(c["status_outliers"]))
        out.append(_finding("warn", "ras-rank-status", "%s: %d rank%s in another state than most (%s): %s" % (
            name, total, "s" if total > 1 else "", c["status_outliers"][0].get("reference"),
            _named(c["status_outliers"], total, lambda e: "%s %s" % (_where(e), e.get("status"))))))
    if c["nocomm"]:
        total = max(c["nocomm_total"], len(c["nocomm"]))
        out.append(_finding("warn", "ras-rank-nocomm", "%s: %d rank%s whose process answered but does not list "
                            "the communicator (being created or torn down): %s" % (
                                name, total, "s" if total > 1 else "", _named(c["nocomm"], total))))
    if ("MISMATCH" in (c.get("errors") or []) and not (c["behind"] or c["ahead"] or c["status_outliers"]
                                                       or c["nocomm"])):
        out.append(_finding("warn", "ras-rank-behind", "%s: MISMATCH - ranks differ in status or operation "
                            "counts (NCCL listed none as an outlier; query with --verbose)" % name, BEHIND_HINT))
    return out


# --------------------------------------------------------------------------- the diagnostic

def _no_answer_finding(res):
    err = res["error"]
    where = res.get("addr") or "the RAS address"
    kind = err["kind"]
    if kind == "refused":
        return _finding("info", "ras-unreachable", "nothing listens on %s: no NCCL 2.24+ job with RAS on this "
                        "node (or it set another NCCL_RAS_ADDR)" % where)
    if kind == "address":
        return _finding("warn", "ras-unreachable", "cannot use the address: %s" % err["message"])
    if not res.get("connected"):
        return _finding("warn", "ras-unreachable", "cannot reach %s: %s" % (where, err["message"]),
                        "something may be listening there: check the address (NCCL_RAS_ADDR) and any firewall")
    if kind == "timeout":
        got = " (%d bytes received)" % res["bytes"] if res.get("bytes") else ""
        return _finding("warn", "ras-no-answer", "%s accepted the connection but gave no complete answer within "
                        "%.3g s (%s)%s" % (where, res.get("deadline", DEFAULT_TIMEOUT), err["stage"], got),
                        "a NCCL process's RAS thread that does not answer, or a report slower than --timeout: "
                        "query again with a longer --timeout")
    return _finding("warn", "ras-protocol", "%s did not answer as NCCL's RAS does (%s): %s" % (
        where, err["stage"], err["message"]))


def build_parser():
    p = argparse.ArgumentParser(prog="nccl_ras.py", description=__doc__.split("\n")[0])
    p.add_argument("--addr", metavar="HOST:PORT",
                   help="the RAS address (default: $NCCL_RAS_ADDR, else localhost:%d)" % DEFAULT_PORT)
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help="the whole query's deadline in seconds (default %g)" % DEFAULT_TIMEOUT)
    p.add_argument("--verbose", action="store_true", help="VERBOSE STATUS: NCCL lists more outlier ranks")
    p.add_argument("--format", choices=["auto", "json", "text"], default="auto",
                   help="the report asked for (default auto: JSON where NCCL has it, 2.28.7 on)")
    return p


def _trim(c):
    keep = dict((k, v) for k, v in c.items() if v not in ([], None, {}) or k in ("hash", "errors", "status"))
    return keep


def run(args):
    timeout = args.timeout if isinstance(args.timeout, (int, float)) and args.timeout > 0 else DEFAULT_TIMEOUT
    res = query(args.addr, timeout=timeout, verbose=bool(args.verbose), fmt=getattr(args, "format", "auto"))
    res["deadline"] = timeout
    data = {"addr": res["addr"], "connected": res["connected"], "server_protocol": res["server_protocol"],
            "format": res["format"], "bytes": res["bytes"], "seconds": res["seconds"], "error": res["error"],
            "notes": res["notes"]}
    found = []
    if res["error"] is not None:
        found.append(_no_answer_finding(res))
    parsed = None
    if res["answer"].strip():
        parsed = parse(res["answer"])
        if res["error"] is None or parsed.get("recognized"):
            found.extend(f for f in findings(parsed) if res["error"] is None or f["code"] != "ras-protocol")
        data.update({"nccl_version": parsed["nccl_version"], "cuda_runtime": parsed["cuda_runtime"],
                     "cuda_driver": parsed["cuda_driver"], "job": parsed["job"],
                     "collection_seconds": parsed["collection_seconds"], "timeouts": parsed["timeouts"],
                     "communicators_count": parsed["communicators_count"], "groups": parsed["groups"][:64],
                     "communicators": [_trim(c) for c in parsed["communicators"][:64]],
                     "missing_processes": parsed["missing_processes"], "dead_processes": parsed["dead_processes"],
                     "problems": parsed["problems"]})
    elif res["error"] is None:
        found.append(_finding("warn", "ras-protocol", "%s closed the connection without a report" % res["addr"]))
    status = _remote().worst_status(found)
    if parsed is not None and parsed.get("recognized"):
        comms = parsed["communicators_count"] if parsed["communicators_count"] is not None else len(parsed["communicators"])
        job = parsed["job"]
        summary = "NCCL %s: %s communicator%s, %s process%s on %s node%s: %s" % (
            parsed["nccl_version"] or "?", comms, "" if comms == 1 else "s", job["processes"] if job["processes"] is not None else "?",
            "" if job["processes"] == 1 else "es", job["nodes"] if job["nodes"] is not None else "?",
            "" if job["nodes"] == 1 else "s", "healthy" if not found else "%d finding%s" % (len(found), "s" if len(found) > 1 else ""))
    else:
        summary = found[0]["message"] if found else "no answer"
    return {"status": status, "summary": _clip(summary, 300), "findings": found, "data": data}


if __name__ == "__main__":
    result = run(build_parser().parse_args())
    print(json.dumps(result, indent=1))
    sys.exit(_remote().exit_code(result))
