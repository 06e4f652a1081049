#!/usr/bin/env python3
"""nvbandwidth: what NVIDIA's nvbandwidth printed, the copy figures per GPU, and its command line.

Standard library only, Python 3.8+. A companion for a diagnostic that runs NVIDIA/nvbandwidth,
shipped with ``nccl_tests.py`` and ``gpu_perf_figures.json`` beside it (and ``_remote.py``, beside
every diagnostic): nccl_tests.py, loaded by path at import, gives the launcher prefixes
(_strip_prefix), the quoting of a line (_clip) and the model matching (name_tokens, _matches),
one rule each for both tools; load_figures() reads the data file from this file's directory.

Pure parts (the unit tests drive them with recorded outputs, tests/fixtures/nvbandwidth/):

- ``parse(text, tests=None) -> dict``: the plain-text output, of every format nvbandwidth has
  printed (NVIDIA/nvbandwidth's output.cpp, inline_common.h, nvbandwidth.cpp): ``nvbandwidth
  Version: v0.8`` and ``Built from Git version:``; ``CUDA Runtime Version: 12040`` (13.3 (13030)
  from v0.10), ``CUDA Driver Version[ (API)]:``, ``Driver Version:``; ``Device 0: NAME`` (v0.4),
  ``Device 0: NAME (00000000:19:00)`` (v0.5 on), ``Process 0 (host): device 0: NAME (pci)`` (the
  multinode build); per test ``Running NAME.``, the description (``memcpy CE CPU(row) -> GPU(column)
  bandwidth (GB/s)``; ``(ns)`` for the latency tests), the matrix (column labels, then one line a
  row: its label and a figure or ``N/A`` a column), ``SUM KEY VALUE`` (or ``&&&& PERF KEY VALUE
  +GB/s`` with --perfFormatter) and, from v0.10, ``COEFFICIENT_OF_VARIATION KEY VALUE``. The
  bidirectional device-to-device tests print three matrices (``KEY_read1``/``_read2``/``_total``,
  or ``_write1``...). A waived test prints ``Waived: `` without its name (v0.5 on; ``Waiving
  NAME.`` in v0.4): ``tests``, the names the run was given (argv's -t order), names them; without
  it they are counted in ``waived_unnamed``. A failure prints ``ERROR: Testcase NAME not found!``
  (a name nvbandwidth does not know), ``Error: MESSAGE`` (the running test threw), or a CUDA /
  NVML / ASSERT line (``[CUDA_ERROR_X] ... in expression ... : file:line``, on stderr) before it
  exits 1. Lines Slurm's ``srun -l`` or Open MPI's ``--tag-output`` put in front are read as the
  line behind them (nccl_tests' prefixes); a line read as nothing is ignored; no input raises.
- ``parse_json(text) -> dict``: the same shape from ``nvbandwidth -j`` (json_output.cpp: one object
  ``{"nvbandwidth": {"version", "git_version", "CUDA Runtime Version", "Driver Version", "GPU Device
  list", "testcases": [{"name", "status", "bandwidth_description", "bandwidth_matrix" (strings,
  "N/A"), "sum", with -v "min"/"max"/"average"}], "error", "warning"}}``), found inside whatever
  else was printed around it. nvbandwidth appends every matrix of a test to one
  bandwidth_matrix, so a bidirectional device-to-device test's 3N rows are split back into its
  three N x N matrices; its Error status comes as a second entry of the same name (the later
  status wins).
- ``per_gpu(parsed) -> {gpu: {...}}``: the figures per GPU index from the host<->device and
  device<->device tests.
- ``argv(binary, tests, json_output=False, samples=None, buffer_mib=None)``: the command line.
- ``load_figures(path=None)``, ``figures_for(gpu_name, table=None)``: the published per-model
  figures (gpu_perf_figures.json) a GPU's results are judged against.

Run by hand: ``python3 nvbandwidth.py [FILE]`` prints what ``parse`` (``parse_json`` for JSON
output) read from FILE (or stdin) as JSON.

``parse``'s and ``parse_json``'s result::

    {"format": "text" | "json",
     "version": "v0.8" | None, "git_version": str | None, "hostname": str | None,
     "cuda_runtime": 12040 | None, "cuda_driver": 12040 | None,   # CUDA's version integers
     "driver": "550.54.15" | None, "mpi": str | None,
     "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "pci": "00000000:19:00" | None,
                  "process": None | rank, "host": None | str}],
     "tests": {NAME: {"status": "passed" | "waived" | "error" | "not found" | "incomplete",
                      "waived": bool, "error": None | str,
                      "matrix": {"rows": ["0"], "cols": ["0", "1"], "values": [[26.03, 25.94]]} | None,
                      "sum": 51.97 | None, "unit": "GB/s" | "ns" | None,
                      "cv": 0.01 | None,       # COEFFICIENT_OF_VARIATION (v0.10)
                      "matrices": [{"key", "description", "unit", "rows", "cols", "values", "sum",
                                    "cv"}]}},   # "matrix"/"sum"/"unit": the _total one, else the first
     "order": [NAME, ...],                # as run
     "waived_unnamed": int,               # "Waived:" lines no name could be given to
     "warnings": [line, ...],             # "Warning: ...", the small-buffer NOTE
     "error": None | why the run gave no (complete) result: a CUDA/NVML/ASSERT/argument error line,
              else "NAME: <its Error or ERROR message>", else "incomplete output: NAME has no
              complete result", else "no test results",
     "lines": int}

``per_gpu``'s result: {0: {"h2d_gbps", "d2h_gbps" (host_to_device / device_to_host memcpy: the CE
figure where the run has one, else the SM one: CE is what Azure's check_gpu_bw holds against its
figures), "h2d_ce_gbps", "h2d_sm_gbps", "d2h_ce_gbps", "d2h_sm_gbps", "d2d_read_min_gbps",
"d2d_read_min_peer", "d2d_write_min_gbps", "d2d_write_min_peer" (the GPU's row of
device_to_device_memcpy_read_ce / _write_ce, CE else SM: its lowest figure to another GPU, the
diagonal and N/A skipped), "local_copy_gbps" (device_local_copy)}, each key only where the run
measured it}.
"""

from __future__ import annotations

import json
import math
import os
import re

import _remote

FIGURES_FILE = "gpu_perf_figures.json"
MAX_WARNINGS = 20
MAX_JSON_STARTS = 200   # "{" tried as the start of nvbandwidth's JSON object
HERE = os.path.dirname(os.path.abspath(__file__))

_nt = _remote.load_companion(HERE, "nccl_tests.py", "mldiag_nccl_tests")
if _nt is None:
    raise ImportError("nvbandwidth.py needs nccl_tests.py beside it (%s)" % HERE)
_clip, _strip_prefix = _nt._clip, _nt._strip_prefix

# --------------------------------------------------------------------------- the text output

_VERSION = re.compile(r"^nvbandwidth Version:\s*(\S+)")
_GIT = re.compile(r"^Built from Git version:\s*(.*)$")
_RUNTIME = re.compile(r"^CUDA Runtime Version:\s*(.+)$")
_CUDA_DRIVER = re.compile(r"^CUDA Driver Version(?:\s*\(API\))?:\s*(.+)$")
_DRIVER = re.compile(r"^Driver Version:\s*(\S+)")
_MPI = re.compile(r"^MPI version:\s*(.+)$")
_PCI = r"(?:\s+\(([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)\))?"
_DEVICE = re.compile(r"^Device (\d+):\s*(.*?)" + _PCI + r"\s*$")
_PROCESS = re.compile(r"^Process\s+(\d+)\s+\((.*?)\):\s*device\s+(\d+):\s*(.*?)" + _PCI + r"\s*$")
_RUNNING = re.compile(r"^Running\s+(\S+?)\.?\s*$")
_WAIVING = re.compile(r"^Waiving\s+(\S+?)\.?\s*$")            # v0.4
_WAIVED = re.compile(r"^Waived:")
_NOT_FOUND = re.compile(r"^ERROR:\s*Testcase (?:index )?(\S+) (?:not found|out of bound)")
_TEST_ERROR = re.compile(r"^(?:Error|ERROR):\s*(.*)$")
_SUM = re.compile(r"^SUM\s+(\S+)\s+(\S+)")
_PERF = re.compile(r"^&&&& PERF\s+(\S+)\s+(\S+)")
_CV = re.compile(r"^COEFFICIENT_OF_VARIATION\s+(\S+)\s+(\S+)")
_UNIT = re.compile(r"\((GB/s|ns)\)\s*$")
_GLOBAL_ERRORS = (
    re.compile(r"^\[(?:CUDA_ERROR_|cuda)\w*\]"),                 # CU_ASSERT / CUDA_ASSERT
    re.compile(r"^NVML_ERROR:"),
    re.compile(r"^ASSERT in expression"),
    re.compile(r"^ERROR: Invalid Arguments"),
    re.compile(r"^You cannot specify both testcase and testcasePrefix"),
    re.compile(r"^Specified list of testcase prefixes did not match"),
)
_WARNING = re.compile(r"^(?:Warning:|NOTE: You have chosen a buffer size)")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


def _number(token):
    """A finite float from a printed figure, or None ("N/A", "nan", words)."""
    if isinstance(token, bool):
        return None
    if isinstance(token, (int, float)):
        return float(token) if math.isfinite(token) else None
    if not isinstance(token, str) or not _NUMBER.match(token.strip()):
        return None
    value = float(token)
    return value if math.isfinite(value) else None


def _version_int(text):
    """12040 from "12040", 13030 from "13.3 (13030)"; None otherwise."""
    if isinstance(text, bool):
        return None
    if isinstance(text, int):
        return text
    if not isinstance(text, str):
        return None
    m = re.search(r"\((\d+)\)", text) or re.match(r"^\s*(\d+)\s*$", text)
    return int(m.group(1)) if m else None


def _empty(fmt):
    return {"format": fmt, "version": None, "git_version": None, "hostname": None, "cuda_runtime": None,
            "cuda_driver": None, "driver": None, "mpi": None, "devices": [], "tests": {}, "order": [],
            "waived_unnamed": 0, "warnings": [], "error": None, "lines": 0}


def _test(out, name):
    test = out["tests"].get(name)
    if test is None:
        test = {"status": "incomplete", "waived": False, "error": None, "matrix": None, "sum": None,
                "unit": None, "cv": None, "matrices": []}
        out["tests"][name] = test
        out["order"].append(name)
    return test


def _matrix(description, cols):
    unit = _UNIT.search(description or "")
    return {"key": None, "description": description, "unit": unit.group(1) if unit else None,
            "rows": [], "cols": list(cols), "values": [], "sum": None, "cv": None}


def _expected_rows(matrix):
    """Rows a complete matrix has: one a GPU for a GPU(row)-GPU(column) matrix, else at least one."""
    description = matrix["description"] or ""
    if "GPU(row)" in description and "GPU(column)" in description:
        return len(matrix["cols"])
    return 1


def _complete(matrix):
    return bool(matrix["rows"]) and len(matrix["rows"]) >= _expected_rows(matrix)


def _finish(test):
    """The test's summary fields from its matrices: the _total one, else the first."""
    matrices = test["matrices"]
    if not matrices:
        return
    main = next((m for m in matrices if (m["key"] or "").endswith("_total")), matrices[0])
    test["matrix"] = {"rows": main["rows"], "cols": main["cols"], "values": main["values"]}
    test["sum"], test["unit"], test["cv"] = main["sum"], main["unit"], main["cv"]
    if test["status"] not in ("error", "waived", "not found"):
        test["status"] = "passed" if all(_complete(m) for m in matrices) else "incomplete"


class _Reader:
    """The state of one pass over the text's lines."""

    def __init__(self, out, tests):
        self.out = out
        self.requested = [t for t in tests if isinstance(t, str)] if isinstance(tests, (list, tuple)) else None
        self.next_request = 0
        self.current = None       # the running test's name
        self.description = None   # a description line waiting for its column labels
        self.matrix = None        # the matrix being read
        self.failures = []        # (tier, text): 0 a global error, 1 a test's error

    def consume(self, name=None):
        """The next requested name (or the position after ``name`` in the request)."""
        if self.requested is None:
            return name
        if name is not None:
            if name in self.requested[self.next_request:]:
                self.next_request = self.requested.index(name, self.next_request) + 1
            return name
        if self.next_request < len(self.requested):
            self.next_request += 1
            return self.requested[self.next_request - 1]
        return None

    def close_matrix(self):
        self.matrix = None

    def line(self, line):
        out = self.out
        stripped = line.strip()
        if self.matrix is not None and self.row(stripped):
            return
        self.close_matrix()
        if not stripped:
            return
        if self.description is not None:
            cols = stripped.split()
            self.start_matrix(self.description, cols)
            self.description = None
            return
        if self.header(stripped):
            return
        m = _RUNNING.match(stripped)
        if m and _NAME.match(m.group(1)):
            self.current = self.consume(m.group(1))
            _test(out, self.current)
            return
        m = _WAIVING.match(stripped)
        if m and _NAME.match(m.group(1)):
            self.waive(self.consume(m.group(1)))
            return
        if _WAIVED.match(stripped):
            self.waive(self.consume())
            return
        m = _NOT_FOUND.match(stripped)
        if m:
            name = self.consume(m.group(1))
            test = _test(out, name)
            test["status"], test["error"] = "not found", _clip(stripped)
            self.failures.append((1, "%s: %s" % (name, _clip(stripped))))
            self.current = None
            return
        for pattern in _GLOBAL_ERRORS:
            if pattern.search(stripped):
                self.failures.append((0, _clip(stripped)))
                return
        m = _TEST_ERROR.match(stripped)
        if m and self.current is not None:
            test = _test(out, self.current)
            test["status"], test["error"] = "error", _clip(m.group(1)) or "Error"
            self.failures.append((1, "%s: %s" % (self.current, test["error"])))
            return
        if self.figures(stripped):
            return
        if _WARNING.match(stripped):
            if len(out["warnings"]) < MAX_WARNINGS:
                out["warnings"].append(_clip(stripped))
            return
        if _UNIT.search(stripped) and self.current is not None:
            self.description = stripped

    def header(self, line):
        out = self.out
        for pattern, key in ((_VERSION, "version"), (_GIT, "git_version"), (_DRIVER, "driver"), (_MPI, "mpi")):
            m = pattern.match(line)
            if m:
                out[key] = m.group(1).strip() or None
                return True
        m = _RUNTIME.match(line)
        if m:
            out["cuda_runtime"] = _version_int(m.group(1))
            return True
        m = _CUDA_DRIVER.match(line)
        if m:
            out["cuda_driver"] = _version_int(m.group(1))
            return True
        m = _DEVICE.match(line)
        if m:
            out["devices"].append({"index": int(m.group(1)), "name": m.group(2), "pci": m.group(3),
                                   "process": None, "host": None})
            return True
        m = _PROCESS.match(line)
        if m:
            out["devices"].append({"index": int(m.group(3)), "name": m.group(4), "pci": m.group(5),
                                   "process": int(m.group(1)), "host": m.group(2)})
            return True
        return False

    def figures(self, line):
        """SUM / &&&& PERF / COEFFICIENT_OF_VARIATION: the figure of the matrix the key names."""
        for pattern, field in ((_SUM, "sum"), (_PERF, "sum"), (_CV, "cv")):
            m = pattern.match(line)
            if m:
                self.keyed(m.group(1), field, _number(m.group(2)))
                return True
        return False

    def keyed(self, key, field, value):
        name = self.current
        if name is None or name not in self.out["tests"]:
            return
        test = self.out["tests"][name]
        target = next((mx for mx in test["matrices"] if mx["key"] == key), None)
        if target is None:
            target = next((mx for mx in reversed(test["matrices"]) if mx["key"] is None), None)
            if target is None:
                return
            target["key"] = key
        target[field] = value

    def waive(self, name):
        if name is None:
            self.out["waived_unnamed"] += 1
            return
        test = _test(self.out, name)
        test["status"], test["waived"] = "waived", True
        self.current = None

    def start_matrix(self, description, cols):
        if self.current is None:
            return
        matrix = _matrix(description, cols)
        _test(self.out, self.current)["matrices"].append(matrix)
        self.matrix = matrix

    def row(self, line):
        words = line.split()
        matrix = self.matrix
        if len(words) != len(matrix["cols"]) + 1:
            return False
        cells = words[1:]
        if not all(c == "N/A" or _number(c) is not None for c in cells):
            return False
        matrix["rows"].append(words[0])
        matrix["values"].append([_number(c) for c in cells])
        return True


def _lines(text):
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return []
    lines = [_strip_prefix(line) for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _error(out, failures):
    """Why the run gave no (complete) result, or None: see the module docstring's "error"."""
    for tier in (0, 1):
        for t, text in failures:
            if t == tier:
                return text
    for name in out["order"]:
        if out["tests"][name]["status"] == "incomplete":
            return "incomplete output: %s has no complete result" % name
    if not out["tests"] and not out["waived_unnamed"]:
        return "no test results"
    return None


def parse(text, tests=None):
    """nvbandwidth's plain-text output (stdout and stderr together, or either) as the module
    docstring's dict. ``tests``: the test names the run was given, in order, to name the
    ``Waived:`` lines. Never raises: text that is not a string reads as empty."""
    out = _empty("text")
    lines = _lines(text)
    out["lines"] = len(lines)
    reader = _Reader(out, tests)
    for i, line in enumerate(lines):
        if i and line.strip() and not out["devices"] and i + 1 < len(lines) and _DEVICE.match(lines[i + 1].strip()) \
                and len(line.split()) == 1 and not _DEVICE.match(line.strip()):
            out["hostname"] = line.strip()      # v0.8 prints the host's name above the Device lines
            continue
        reader.line(line)
    for test in out["tests"].values():
        _finish(test)
    out["error"] = _error(out, reader.failures)
    return out


# --------------------------------------------------------------------------- the JSON output

_DEVICE_ENTRY = re.compile(r"^(\d+):\s*(.*?)" + _PCI + r"(?::\s*\((.*)\))?\s*$")
_STATUSES = {"passed": "passed", "waived": "waived", "error": "error", "not found": "not found",
             "running": "incomplete"}


def _json_root(text):
    """The {"nvbandwidth": {...}} object in ``text`` (whatever is printed around it), or None."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    tries = 0
    while start != -1 and tries < MAX_JSON_STARTS:
        tries += 1
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("nvbandwidth"), dict):
            return value["nvbandwidth"]
        start = text.find("{", start + 1)
    return None


def _json_matrices(name, case):
    """The case's bandwidth_matrix as parse's matrices: one, or a bidirectional device-to-device
    test's three N x N ones (nvbandwidth appends all three to the one list)."""
    rows = case.get("bandwidth_matrix")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, list) for r in rows):
        return []
    width = max(len(r) for r in rows)
    values = [[_number(c) for c in r] + [None] * (width - len(r)) for r in rows]
    description = case.get("bandwidth_description") if isinstance(case.get("bandwidth_description"), str) else None
    unit = _UNIT.search(description.strip()) if description else None
    blocks = [(None, values)]
    if "bidirectional" in name and "device_to_device" in name and width and len(values) == 3 * width:
        kind = "write" if "write" in name else "read"
        blocks = [(name + "_%s1" % kind, values[:width]), (name + "_%s2" % kind, values[width:2 * width]),
                  (name + "_total", values[2 * width:])]
    out = []
    for i, (key, block) in enumerate(blocks):
        last = i == len(blocks) - 1
        out.append({"key": key or name, "description": description.strip() if description and last else None,
                    "unit": unit.group(1) if unit else None,
                    "rows": [str(n) for n in range(len(block))], "cols": [str(n) for n in range(width)],
                    "values": block, "sum": _number(case.get("sum")) if last else None, "cv": None})
    return out


def parse_json(text):
    """``nvbandwidth -j`` output as parse's dict ("format": "json"). Never raises."""
    out = _empty("json")
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        text = ""
    out["lines"] = len(_lines(text))
    root = _json_root(text)
    if root is None:
        out["error"] = "no nvbandwidth JSON object"
        return out
    for key, field in (("version", "version"), ("git_version", "git_version"), ("Driver Version", "driver"),
                       ("Hostname", "hostname")):
        if isinstance(root.get(key), str):
            out[field] = root[key].strip() or None
    out["cuda_runtime"] = _version_int(root.get("CUDA Runtime Version"))
    for key, value in root.items():
        if isinstance(key, str) and key.startswith("CUDA Driver"):
            out["cuda_driver"] = _version_int(value)
    for entry in root.get("GPU Device list") or []:
        m = _DEVICE_ENTRY.match(entry) if isinstance(entry, str) else None
        if m:
            out["devices"].append({"index": int(m.group(1)), "name": m.group(2), "pci": m.group(3),
                                   "process": None, "host": m.group(4)})
    if isinstance(root.get("warning"), str):
        out["warnings"].append(_clip(root["warning"]))
    failures = []
    if isinstance(root.get("error"), str) and root["error"].strip():
        failures.append((0, _clip(root["error"])))
    cases = root.get("testcases")
    for case in cases if isinstance(cases, list) else []:
        if not isinstance(case, dict) or not isinstance(case.get("name"), str):
            continue
        name = case["name"]
        test = _test(out, name)
        status = case.get("status").strip().lower() if isinstance(case.get("status"), str) else ""
        matrices = _json_matrices(name, case)
        if matrices:
            test["matrices"] = matrices
        test["status"] = _STATUSES.get(status, "incomplete")
        test["waived"] = test["status"] == "waived"
        if isinstance(case.get("error"), str):
            test["error"] = _clip(case["error"])
        if test["status"] in ("error", "not found"):
            failures.append((1, "%s: %s" % (name, test["error"] or case.get("status"))))
    for test in out["tests"].values():
        status = test["status"]
        _finish(test)
        if status == "passed" and not test["matrices"]:
            test["status"] = "incomplete"
    out["error"] = _error(out, failures)
    return out


# --------------------------------------------------------------------------- per GPU

_HOST_TESTS = (("h2d", "host_to_device_memcpy"), ("d2h", "device_to_host_memcpy"))
_PEER_TESTS = (("d2d_read", "device_to_device_memcpy_read"), ("d2d_write", "device_to_device_memcpy_write"))


def _gpu(label):
    try:
        return int(label)
    except (TypeError, ValueError):
        return None


def _matrix_of(parsed, name):
    tests = parsed.get("tests") if isinstance(parsed, dict) else None
    test = tests.get(name) if isinstance(tests, dict) else None
    if not isinstance(test, dict) or test.get("status") != "passed" or not isinstance(test.get("matrix"), dict):
        return None
    matrix = test["matrix"]
    if not isinstance(matrix.get("values"), list) or not isinstance(matrix.get("cols"), list):
        return None
    return matrix


def per_gpu(parsed):
    """{gpu index: figures} from parse's (or parse_json's) result; see the module docstring.
    Host<->device figures are the first row of their 1 x N matrix (the host); device<->device
    ones the GPU's row, lowest off-diagonal figure. Never raises; {} for nothing usable."""
    out = {}
    for prefix, test in _HOST_TESTS:
        for engine in ("sm", "ce"):           # CE last: it wins the plain key
            matrix = _matrix_of(parsed, "%s_%s" % (test, engine))
            if matrix is None or not matrix["values"] or not isinstance(matrix["values"][0], list):
                continue
            for label, value in zip(matrix["cols"], matrix["values"][0]):
                gpu = _gpu(label)
                if gpu is None or not isinstance(value, float):
                    continue
                out.setdefault(gpu, {})["%s_%s_gbps" % (prefix, engine)] = value
                out[gpu]["%s_gbps" % prefix] = value
    for prefix, test in _PEER_TESTS:
        matrix = _matrix_of(parsed, test + "_ce") or _matrix_of(parsed, test + "_sm")
        if matrix is None:
            continue
        for label, row in zip(matrix.get("rows") or [], matrix["values"]):
            gpu = _gpu(label)
            if gpu is None or not isinstance(row, list):
                continue
            cells = [(v, _gpu(peer)) for peer, v in zip(matrix["cols"], row)
                     if isinstance(v, float) and _gpu(peer) is not None and _gpu(peer) != gpu]
            if cells:
                value, peer = min(cells, key=lambda c: c[0])
                out.setdefault(gpu, {})["%s_min_gbps" % prefix] = value
                out[gpu]["%s_min_peer" % prefix] = peer
    matrix = _matrix_of(parsed, "device_local_copy")
    if matrix is not None and matrix["values"] and isinstance(matrix["values"][0], list):
        for label, value in zip(matrix["cols"], matrix["values"][0]):
            if _gpu(label) is not None and isinstance(value, float):
                out.setdefault(_gpu(label), {})["local_copy_gbps"] = value
    return out


# --------------------------------------------------------------------------- the command line


def argv(binary, tests, json_output=False, samples=None, buffer_mib=None):
    """The command line running ``binary`` for ``tests`` (test names, run in that order): each
    as ``-t NAME`` (repeated, as DCGM's nvbandwidth plugin does; -t takes several too), ``-j``
    for JSON output, ``-i N`` samples (nvbandwidth's default 3; Azure's check runs 10), ``-b MiB``
    buffer size (default 512 from v0.5, 64 before). None when ``binary`` is no path, ``tests``
    is empty or holds a string that is no test name, or a number is not a positive integer:
    nothing odd reaches a command line."""
    if not isinstance(binary, str) or not binary.strip() or "\n" in binary or "\0" in binary:
        return None
    if isinstance(tests, str):
        tests = [tests]
    if not isinstance(tests, (list, tuple)) or not tests:
        return None
    if not all(isinstance(t, str) and _NAME.match(t) for t in tests):
        return None
    out = [binary]
    for name in tests:
        out += ["-t", name]
    for flag, value in (("-i", samples), ("-b", buffer_mib)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return None
        out += [flag, str(value)]
    if json_output:
        out.append("-j")
    return out


# --------------------------------------------------------------------------- the figures

def load_figures(path=None):
    """The rows of gpu_perf_figures.json beside this file (cached): each {"sku", "match": {"all",
    "any", "none"}, the figures, "sources"}. Raises OSError or ValueError (a file that is not
    JSON, or has no list of rows)."""
    return _nt.load_rows(path or os.path.join(HERE, FIGURES_FILE), "figures")


def figures_for(gpu_name, table=None):
    """The published figures for a GPU that nvidia-smi names ``gpu_name``: the first row whose
    match fits, without "match"; None for a model no row is for (the caller then judges the GPU
    against its peers). ``table``: rows as load_figures returns them (default: that file, whose
    errors it raises)."""
    rows = load_figures() if table is None else table
    tokens = _nt.name_tokens(gpu_name)
    for row in rows:
        if isinstance(row, dict) and _nt._matches(tokens, row.get("match")):
            return dict((k, v) for k, v in row.items() if k != "match")
    return None


def parse_any(text):
    """parse_json when ``text`` holds nvbandwidth's JSON object, else parse."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if isinstance(text, str) and '"nvbandwidth"' in text:
        result = parse_json(text)
        if result["error"] != "no nvbandwidth JSON object":
            return result
    return parse(text)


if __name__ == "__main__":
    import sys
    if len(sys.argv) > 1:
        with open(sys.argv[1], "r", encoding="utf-8", errors="replace") as fh:
            source = fh.read()
    else:
        source = sys.stdin.read()
    print(json.dumps(parse_any(source), indent=1))
