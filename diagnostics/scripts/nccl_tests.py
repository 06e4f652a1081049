#!/usr/bin/env python3
"""nccl_tests: what an nccl-tests run printed, and the bus bandwidth a GPU model should reach.

Standard library only, Python 3.8+, importable on its own. Shipped beside nccl_check.py with its
data file ``nccl_thresholds.json`` (load_thresholds() reads it from this file's directory).

Pure parts (the unit tests drive them with recorded outputs, tests/fixtures/nccl/):

- ``parse(text, op=None) -> dict``: the output of NVIDIA/nccl-tests' ``all_reduce_perf``,
  ``all_gather_perf``, ``alltoall_perf``, ``reduce_scatter_perf``, ``broadcast_perf``,
  ``reduce_perf``, ``sendrecv_perf`` (and the rest of its family), of every format it has
  printed (NVIDIA/nccl-tests' history): before 2.13 (2022) each test printed its own table
  (``error``, a maximum deviation, where later versions print ``#wrong``, a count; no ``root``
  column but for broadcast and reduce; all-gather and sendrecv without ``redop``, alltoall with
  the column left blank); 2.13 on one table for all (``redop`` and ``root`` always; blank where
  there is no reduction, ``none`` from 2.13.4), ``Group`` in the Rank lines (2.13.4), the PCI
  address as ``[0000:0f:00]`` instead of ``[0x0f]`` (2.14.1), ``# Collective test
  starting/concluded`` (2.16.7), ``# nccl-tests version`` (2.17.4), per-iteration columns
  (``-I``, 2.19.2) and a timestamp after each row (2.18.5).
  Lines Slurm's ``srun -l`` (``0: ``) or Open MPI's ``--tag-output`` (``[1,0]<stdout>:``)
  put in front are read as the line behind them; interleaved ``NCCL INFO`` lines are counted;
  a line read as nothing is ignored, never an error, and no input makes it raise.
- ``peak_busbw(parsed, min_size=None)``, ``busbw_at(parsed, size)``: the figures thresholds
  are compared against.
- ``BUS_FACTORS``, ``bus_factor(op, n)``, ``algbw(size_bytes, seconds)``: nccl-tests'
  arithmetic (its doc/PERFORMANCE.md and each test's ``GetBw``), for measurements made
  without it.
- ``load_thresholds(path=None)``, ``threshold_for(gpu_name, op, gpus, table)``: the busbw a
  healthy node of a GPU model reaches, as a cloud's own health checks hold it (each row
  names the file and line it comes from); None for a model nobody published a figure for,
  when a node can only be judged against its peers.

Run by hand: ``python3 nccl_tests.py [FILE]`` prints what ``parse`` read from FILE (or stdin)
as JSON.

``parse``'s result::

    {"op": "all_reduce" | ... | None,   # "# Collective test starting: X_perf", else op=, else the table
     "header": {"nThread": 1, "nGpus": 8, "minBytes": 1, "maxBytes": 8589934592, "step": 2,
                "step_kind": "factor", "warmup_iters": 5, "iters": 20, "agg_iters": 1,
                "validation": 1, "graph": 0, "unalign": 0, "nccl_tests_version": "2.17.6",
                "nccl_headers": 22703, "nccl_library": 22703, "maxBytes_reduced": N, ...},
                # what the output says, nothing made up
     "devices": [{"rank", "group" (None before 2.13.4), "pid", "host", "device", "busid", "name"}],
     "rows": [{"size": bytes, "count", "type", "redop" (None: "none" or no column), "root" (None:
               no column), "oop": {"time_us", "algbw", "busbw", "wrong", "max_error"} or None,
               "ip": {...}, ["timestamp"]}],    # wrong: a count, None for N/A or an old table
                                                # (whose max_error is the deviation it printed)
     "avg_busbw": float | None, "avg_check": "OK" | "FAILED" | None (-c's verdict),
     "out_of_bounds": {"count": int, "ok": bool} | None, "wrong_total": int | None,
     "nccl_warn": [line, ...] (at most 50), "nccl_info_lines": int,
     "version": "2.16.2+cuda11.6" | "2.27.3" (from nccl-library=) | None,
     "concluded": bool ("# Collective test concluded" seen),
     "error": None | why the run gave no (complete) result: the first line that names a cause
              ("host: Test NCCL failure common.cu:1057 'internal error / '", Open MPI's "There
              are not enough slots available ...", "Invalid number of GPUs ...", "srun: error:
              ..."), else the first of what follows one (" .. host pid N: Test failure ...",
              "mpirun noticed that process rank ..."), else "NCCL WARN: <its first line>" when
              no row came, "no result rows", or "incomplete output: ..." (rows, no summary),
     "lines": int}
"""

from __future__ import annotations

import json
import math
import os
import re

THRESHOLDS_FILE = "nccl_thresholds.json"
MAX_WARN = 50          # NCCL WARN lines kept: a failing run on many ranks prints one per rank and more
MAX_TEXT = 300         # characters of a line quoted in "error"
OP_TOLERANCE = 0.02    # busbw/algbw within 2% of one op's factor names the op (2-decimal rounding: <1%)

# busbw = algbw x a * (n - b) / n for n ranks: nccl-tests' doc/PERFORMANCE.md ("Summary") and each
# test's GetBw (src/*.cu). hypercube's algbw already counts its n - 1 exchanges, so its factor is 1.
BUS_FACTORS = {
    "all_reduce": (2, 1),        # 2(n-1)/n
    "reduce_scatter": (1, 1),    # (n-1)/n
    "all_gather": (1, 1),
    "alltoall": (1, 1),
    "alltoallv": (1, 1),
    "scatter": (1, 1),
    "gather": (1, 1),
    "broadcast": (1, 0),         # 1
    "reduce": (1, 0),
    "sendrecv": (1, 0),
    "hypercube": (1, 0),
}
OP_ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
              "all_to_all": "alltoall", "send_recv": "sendrecv", "bcast": "broadcast"}

# --------------------------------------------------------------------------- the arithmetic


def normal_op(op):
    """"all-reduce", "AllReduce", "all_reduce_perf" -> "all_reduce"; None for what is no name."""
    if not isinstance(op, str):
        return None
    name = re.sub(r"[\s-]+", "_", op.strip().lower())
    name = re.sub(r"_perf(_\w*)?$", "", name)
    name = OP_ALIASES.get(name, name)
    return name if re.match(r"^[a-z][a-z_]*$", name) else None


def bus_factor(op, n):
    """busbw / algbw of ``op`` over ``n`` ranks, as nccl-tests computes it (all_reduce 2(n-1)/n;
    reduce_scatter, all_gather, alltoall (n-1)/n; broadcast, reduce, sendrecv 1); None for an op
    it does not know or no rank."""
    factor = BUS_FACTORS.get(normal_op(op))
    if factor is None or not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return None
    a, b = factor
    return a * (n - b) / float(n)


def algbw(size_bytes, seconds):
    """GB/s as nccl-tests prints algbw: bytes / seconds / 1e9 (decimal GB, not GiB); 0.0 for a
    time that is not positive."""
    if not seconds or seconds <= 0:
        return 0.0
    return size_bytes / float(seconds) / 1e9


# --------------------------------------------------------------------------- the parser

_PREFIXES = (re.compile(r"^\s*\d+:\s"),                          # srun -l / --label
             re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:\s?"))    # mpirun --tag-output
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
                   r"\s+\[([^\]]*)\]\s*(.*?)\s*$")
_HEADER_PAIRS = re.compile(r"(?:^|\s)(nThread|nGpus|minBytes|maxBytes|warmup iters|agg iters|iters|validation"
                           r"|graph|unalign)\s*:?\s+(-?\d+)")
_NTHREAD = re.compile(r"^#\s*nThread\s")
_STEP = re.compile(r"\bstep:\s*(\d+)\s*\((\w+)\)")
_TESTS_VERSION = re.compile(r"^#\s*nccl-tests version\s+(\S+)(.*)$")
_CODES = re.compile(r"\b(nccl-headers|nccl-library)=(\d+)")
_STARTING = re.compile(r"^#\s*Collective test (starting|concluded):\s*(\S+)")
_REDUCING = re.compile(r"^#\s*Reducing maxBytes to\s+(\d+)")
_OUT_OF_BOUNDS = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?")
_NCCL_VERSION = re.compile(r"\bNCCL version\s+(\d+\.\d+\.\d+\S*)")
_ROW_START = re.compile(r"^\s*\d+\s+\d+\s+\S")
_TIMESTAMP = (re.compile(r"^\d{4}-\d\d-\d\d$"), re.compile(r"^\d\d:\d\d:\d\d$"))
_OLD_ERROR = re.compile(r"^-?\d(?:\.\d+)?e[+-]\d+$")          # "%5.0le": 0e+00, 2e-07
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$|^[-+]?(?:nan|inf)$", re.IGNORECASE)

# Lines that say the run failed, (pattern, tier): tier 0 names the cause, tier 1 is what follows
# one (nccl-tests' trace of returns, the launcher's epilogue), quoted only when nothing says more.
_FAILURES = (
    (re.compile(r"Test (?:CUDA|NCCL) failure\b"), 0),
    (re.compile(r"Test timeout\b"), 0),
    (re.compile(r"There are not enough slots available in the system"), 0),
    (re.compile(r"Invalid number of GPUs"), 0),
    (re.compile(r"Incompatible NCCL versions"), 0),
    (re.compile(r"error while loading shared libraries"), 0),
    (re.compile(r"(?:mpirun|prterun) was unable to (?:launch|find)"), 0),
    (re.compile(r"ORTE was unable to reliably start|PRTE has lost communication|An ORTE daemon has unexpectedly"), 0),
    (re.compile(r"^srun: error:"), 0),
    (re.compile(r"\bTest failure\b"), 1),
    (re.compile(r"(?:mpirun|prterun) noticed that process rank"), 1),
    (re.compile(r"(?:mpirun|prterun) detected that one or more processes exited"), 1),
    (re.compile(r"MPI_ABORT was invoked"), 1),
)


def _clip(text, n=MAX_TEXT):
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."


def _number(token):
    """A finite float from a printed figure, or None ("N/A", "-nan", "inf", words)."""
    if not _NUMBER.match(token):
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int(token):
    try:
        return int(token)
    except (TypeError, ValueError):
        return None


def _strip_prefix(line):
    for prefix in _PREFIXES:
        m = prefix.match(line)
        if m:
            return line[m.end():]
    return line


def _table(line):
    """The column header line (``#  size  count  type  redop  root  time  algbw  busbw  #wrong
    ...``) as what the rows under it have: a redop column, the 4th column of a set (#wrong, or
    the old error), the per-iteration columns; None for any other line."""
    words = line.lstrip("#").split()
    if len(words) < 5 or words[0] != "size" or "count" not in words or "busbw" not in words:
        return None
    return {"redop": "redop" in words, "error_column": "error" in words and "#wrong" not in words,
            "per_iter": "i_min" in words}


def _placement(fields, table):
    """One out-of-place or in-place set of a row: time, algbw, busbw, #wrong (or the old error)
    and the per-iteration figures; None when the time or a bandwidth is no number."""
    time_us, alg, bus = (_number(f) for f in fields[:3])
    if time_us is None or alg is None or bus is None:
        return None
    out = {"time_us": time_us, "algbw": alg, "busbw": bus, "wrong": None, "max_error": None}
    mark = fields[3]
    if mark != "N/A":
        value = _number(mark)
        if value is None:
            return None
        old = table["error_column"] if table else bool(_OLD_ERROR.match(mark)) and ("e-" in mark or value == 0)
        if old:
            out["max_error"] = value
        else:
            out["wrong"] = int(value)
    if len(fields) == 8:
        for key, token in zip(("i_min_us", "i_max_us", "i_p99_us", "i_cv_pct"), fields[4:]):
            out[key] = _number(token)
    return out


def _row(line, table):
    """A result line (``size count type [redop] [root] time algbw busbw #wrong time ...``) as a
    row, or None when it is not one. The columns are read from the left: a blank redop (old
    alltoall) or none at all (old all_gather) is told apart by the next word being a number; a
    root column by the count of the figures left (one more than whole sets)."""
    words = line.split()
    if len(words) < 7 or not _ROW_START.match(line):
        return None
    size, count = _int(words[0]), _int(words[1])
    if size is None or count is None:
        return None
    row = {"size": size, "count": count, "type": words[2], "redop": None, "root": None}
    rest = words[3:]
    if len(rest) >= 2 and _TIMESTAMP[0].match(rest[-2]) and _TIMESTAMP[1].match(rest[-1]):
        row["timestamp"] = rest[-2] + " " + rest[-1]
        rest = rest[:-2]
    if rest and _number(rest[0]) is None and rest[0] != "N/A":
        redop = rest.pop(0)
        row["redop"] = None if redop == "none" else redop
    per_set = 8 if (table["per_iter"] if table else len(rest) in (16, 17)) else 4
    if len(rest) % per_set == 1:
        root = _int(rest.pop(0))
        if root is None:
            return None
        row["root"] = root
    if len(rest) == 2 * per_set:
        row["oop"], row["ip"] = _placement(rest[:per_set], table), _placement(rest[per_set:], table)
        if row["oop"] is None or row["ip"] is None:
            return None
    elif len(rest) == per_set:
        # a blank out-of-place set (nccl-tests' writeBenchMarkLineNullBody: in-place only)
        row["oop"], row["ip"] = None, _placement(rest, table)
        if row["ip"] is None:
            return None
    else:
        return None
    return row


def _header(line, header):
    for key, value in _HEADER_PAIRS.findall(line):
        header[key.replace(" ", "_")] = int(value)
    m = _STEP.search(line)
    if m:
        header["step"], header["step_kind"] = int(m.group(1)), m.group(2)


def _slots_message(lines, i):
    """Open MPI's "not enough slots" paragraph (its first lines, up to the blank one) as one line."""
    words = []
    for line in lines[i:i + 4]:
        if not line.strip():
            break
        words.append(line.strip())
    return _clip(" ".join(words).rstrip(":"))


def _version_of_code(code):
    """NCCL_VERSION_CODE -> "2.27.3" (X*10000 + Y*100 + Z since 2.9; X*1000 + Y*100 + Z before)."""
    if code >= 20900:
        return "%d.%d.%d" % (code // 10000, code % 10000 // 100, code % 100)
    if code >= 2000:
        return "%d.%d.%d" % (code // 1000, code % 1000 // 100, code % 100)
    return None


def parse(text, op=None):
    """What an nccl-tests run printed (stdout and stderr together, or either), as the module
    docstring's dict. ``op``: the collective the caller ran, used when the output does not
    name it. Never raises: text that is not a string reads as empty."""
    out = {"op": None, "header": {}, "devices": [], "rows": [], "avg_busbw": None, "avg_check": None,
           "out_of_bounds": None, "wrong_total": None, "nccl_warn": [], "nccl_info_lines": 0,
           "version": None, "concluded": False, "error": None, "lines": 0}
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        text = ""
    lines = [_strip_prefix(line) for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    out["lines"] = len(lines)
    header, table = out["header"], None
    failures = {}        # tier -> the first such line
    for i, line in enumerate(lines):
        stripped = line.strip()
        if out["version"] is None:
            m = _NCCL_VERSION.search(line)
            if m:
                out["version"] = m.group(1)
        if "NCCL INFO" in line:
            # NCCL_DEBUG=INFO writes thousands of these and nothing else is on their lines
            out["nccl_info_lines"] += 1
            continue
        if "NCCL WARN" in line and len(out["nccl_warn"]) < MAX_WARN:
            out["nccl_warn"].append(stripped if len(stripped) <= 1000 else stripped[:997] + "...")
        for pattern, tier in _FAILURES:
            if pattern.search(stripped):
                message = _slots_message(lines, i) if "enough slots" in stripped else _clip(stripped)
                failures.setdefault(tier, message)
                break
        if stripped.startswith("#"):
            table = _comment(stripped, out, header, table)
            continue
        row = _row(line, table)
        if row is not None:
            out["rows"].append(row)
    if out["version"] is None and header.get("nccl_library"):
        out["version"] = _version_of_code(header["nccl_library"])
    out["op"] = out["op"] or normal_op(op) or _infer_op(out, table)
    wrongs = [p["wrong"] for r in out["rows"] for p in (r["oop"], r["ip"]) if p and p["wrong"] is not None]
    out["wrong_total"] = sum(wrongs) if wrongs else None
    out["error"] = _error(out, failures)
    return out


def _comment(line, out, header, table):
    """A ``#`` line: the header, a device, the column header, the summary, the test's name
    (``out["op"]``). Returns the table the rows that follow are read by."""
    new_table = _table(line)
    if new_table is not None:
        return new_table
    m = _RANK.match(line)
    if m:
        rank, group, pid, host, device, busid, name = m.groups()
        out["devices"].append({"rank": int(rank), "group": _int(group), "pid": int(pid), "host": host,
                               "device": int(device), "busid": busid.strip(), "name": name})
        return table
    if _NTHREAD.match(line):
        _header(line, header)
        return table
    m = _OUT_OF_BOUNDS.match(line)
    if m:
        count = int(m.group(1))
        out["out_of_bounds"] = {"count": count, "ok": m.group(2) == "OK" if m.group(2) else count == 0}
        return table
    m = _AVG.match(line)
    if m:
        out["avg_busbw"] = _number(m.group(1))
        out["avg_check"] = m.group(2)
        return table
    m = _STARTING.match(line)
    if m:
        name = normal_op(m.group(2))
        if m.group(1) == "concluded":
            out["concluded"] = True
        header.setdefault("program", m.group(2))
        out["op"] = out["op"] or name      # the first test named; -o/-d runs repeat it
        return table
    m = _TESTS_VERSION.match(line)
    if m:
        header["nccl_tests_version"] = m.group(1)
        for key, value in _CODES.findall(m.group(2)):
            header[key.replace("-", "_")] = int(value)
        return table
    m = _REDUCING.match(line)
    if m:
        header["maxBytes_reduced"] = int(m.group(1))
    elif "Blocking Enabled" in line:
        header["blocking"] = True
    elif "Parallel Init Enabled" in line:
        header["parallel_init"] = True
    return table


def _ranks(out):
    if out["devices"]:
        return len(out["devices"])
    h = out["header"]
    if isinstance(h.get("nThread"), int) and isinstance(h.get("nGpus"), int) and h["nThread"] * h["nGpus"] > 0:
        return h["nThread"] * h["nGpus"]
    return None


def _infer_op(out, table):
    """The collective from the table alone, where it is plain: a root (reduce: with a redop,
    broadcast: without), else the busbw/algbw ratio against each op's factor for the ranks
    listed (all_reduce from reduce_scatter; sendrecv from all_gather and alltoall), those two
    told apart only by an old table's (blank) redop column. None when it is not plain."""
    rows = out["rows"]
    if not rows:
        return None
    if any(r["root"] is not None and r["root"] >= 0 for r in rows):
        return "reduce" if any(r["redop"] for r in rows) else "broadcast"
    n = _ranks(out)
    ratios = sorted(p["busbw"] / p["algbw"] for r in rows for p in (r["oop"], r["ip"])
                    if p and p["algbw"] >= 1.0)
    if n is None or n < 2 or not ratios:
        return None
    ratio = ratios[len(ratios) // 2]
    reduces = any(r["redop"] for r in rows)
    candidates = ("all_reduce", "reduce_scatter") if reduces else ("sendrecv", "all_gather")
    near = [c for c in candidates if abs(ratio - bus_factor(c, n)) <= OP_TOLERANCE * max(bus_factor(c, n), 1e-9)]
    if len(near) != 1:
        return None
    if near[0] != "all_gather":
        return near[0]
    old = table is not None and table["error_column"]
    if not old:
        return None   # 2.13 on: all_gather and alltoall print the same columns and factor
    return "alltoall" if table["redop"] else "all_gather"


def _error(out, failures):
    """Why the run gave no (complete) result, or None: see the module docstring's "error"."""
    for tier in (0, 1):
        if tier in failures:
            return failures[tier]
    if not out["rows"]:
        if out["nccl_warn"]:
            return "NCCL WARN: " + _clip(out["nccl_warn"][0])
        return "no result rows"
    if out["avg_busbw"] is None and out["out_of_bounds"] is None:
        return "incomplete output: no summary after %d result rows (the run stopped before its end)" % len(out["rows"])
    return None


# --------------------------------------------------------------------------- the figures


def _rows_of(parsed):
    rows = parsed.get("rows") if isinstance(parsed, dict) else parsed
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _best(row):
    """The row's busbw: the better of out-of-place and in-place (None when neither has one)."""
    values = [p.get("busbw") for p in (row.get("oop"), row.get("ip")) if isinstance(p, dict)]
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return max(values) if values else None


def peak_busbw(parsed, min_size=None):
    """(size, busbw) of the best busbw (out-of-place or in-place) among the rows of at least
    ``min_size`` bytes (all rows when None); None when no row qualifies. The first such row on
    a tie. ``parsed``: parse's result or its rows."""
    best = None
    for row in _rows_of(parsed):
        size, bus = row.get("size"), _best(row)
        if bus is None or not isinstance(size, int) or (min_size is not None and size < min_size):
            continue
        if best is None or bus > best[1]:
            best = (size, bus)
    return best


def busbw_at(parsed, size):
    """(row size, busbw) at ``size`` bytes, or at the largest size below it when the run did
    not reach it; the better of out-of-place and in-place, and of the rows of that size (a
    run over several types or ops has several). None when no row is that small."""
    sizes = [r["size"] for r in _rows_of(parsed) if isinstance(r.get("size"), int) and r["size"] <= size
             and _best(r) is not None]
    if not sizes:
        return None
    at = max(sizes)
    return at, max(_best(r) for r in _rows_of(parsed) if r.get("size") == at and _best(r) is not None)


# --------------------------------------------------------------------------- thresholds

_TABLES = {}


def load_rows(path, key):
    """The list under ``key`` of the JSON file ``path`` (cached): a per-model table's rows (this
    file's thresholds, nvbandwidth.py's figures). Raises OSError or ValueError (a file that is
    not JSON, or has no list of rows)."""
    if (path, key) not in _TABLES:
        with open(path, "r", encoding="utf-8") as f:
            raw = json.load(f)
        rows = raw.get(key) if isinstance(raw, dict) else None
        if not isinstance(rows, list):
            raise ValueError("%s: no list of %s" % (path, key))
        _TABLES[(path, key)] = rows
    return _TABLES[(path, key)]


def load_thresholds(path=None):
    """The rows of nccl_thresholds.json beside this file (cached): each {"sku", "match": {"all",
    "any", "none"}, "op", "busbw_gbps", "size_bytes", "gpus", "compare", "source"}. Raises
    OSError or ValueError."""
    return load_rows(path or os.path.join(os.path.dirname(os.path.abspath(__file__)), THRESHOLDS_FILE),
                     "thresholds")


def name_tokens(gpu_name):
    """An nvidia-smi GPU name as its upper-case words: "NVIDIA A100-SXM4-80GB" -> {"NVIDIA",
    "A100", "SXM4", "80GB"}. Whole words, so that GH200 is no H200."""
    return set(re.findall(r"[A-Z0-9]+", gpu_name.upper())) if isinstance(gpu_name, str) else set()


def _matches(tokens, match):
    if not isinstance(match, dict) or not match.get("all"):
        return False
    return (all(t in tokens for t in match["all"])
            and (not match.get("any") or any(t in tokens for t in match["any"]))
            and not any(t in tokens for t in match.get("none") or ()))


def threshold_for(gpu_name, op="all_reduce", gpus=None, table=None):
    """The published busbw figure for ``op`` on a node of ``gpu_name`` GPUs (as nvidia-smi names
    them), with ``gpus`` GPUs when given (a figure holds for the GPU count it was measured
    with): {"sku", "op", "busbw_gbps", "size_bytes", "gpus", "compare", "source"}, or None for
    a model, op or count no row is for (the caller then judges the node against its peers).
    ``table``: rows as load_thresholds returns them (default: that file, whose errors it
    raises)."""
    rows = load_thresholds() if table is None else table
    tokens, op = name_tokens(gpu_name), normal_op(op)
    for row in rows:
        if not isinstance(row, dict) or normal_op(row.get("op")) != op or not _matches(tokens, row.get("match")):
            continue
        if gpus is not None and row.get("gpus") is not None and row["gpus"] != gpus:
            continue
        return dict((k, v) for k, v in row.items() if k != "match")
    return None


if __name__ == "__main__":
    import sys
    if len(sys.argv) > 1:
        with open(sys.argv[1], "r", encoding="utf-8", errors="replace") as fh:
            source = fh.read()
    else:
        source = sys.stdin.read()
    print(json.dumps(parse(source), indent=1))
