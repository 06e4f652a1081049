#!/usr/bin/env python3
"""gpu-status: per-GPU health, load and compute processes of an NVIDIA machine.

Runs on the target, standard library only, Python 3.8+. Sources, in order:

1. ``nvidia-smi`` (on PATH, in a well-known driver directory, or ``--nvidia-smi``), each call
   with a timeout (nvidia-smi hangs on a GPU in a bad state), at once in parallel:
   ``--query-gpu=...`` with the newest field names (``--format=csv,noheader,nounits``),
   ``--query-compute-apps=...`` and ``--version`` (the CUDA version). Two calls when the client
   remembers this target (``--known``: its driver, CUDA version and the field names it took):
   those fields are asked, and ``--version`` only if the driver changed. A driver that refuses a
   field (an unknown field makes nvidia-smi fail the whole query: R470 knows no
   ``memory.reserved``) is asked ``--help-query-gpu`` and then only for the fields it lists --
   right the first time it is seen, in two rounds.
2. NVML, when nvidia-smi is missing (common inside containers): ``nvidia-ml-py`` (``import
   pynvml``) when importable, else a ctypes binding to ``libnvidia-ml.so.1``.
3. Neither: a finding that says so, or that the machine has AMD (``amd-smi``/``rocm-smi``) or
   Gaudi (``hl-smi``) accelerators, which this diagnostic does not support yet.

Then the kernel log (``/dev/kmsg``, ``dmesg``, ``journalctl -k``; best effort, bounded in time;
read while nvidia-smi answers, by kernel_log.py) is scanned for NVIDIA Xid lines by xid.py.

The result always carries ``status`` (worst finding level; ``info`` counts as ``ok``).
``data``: source ("nvidia-smi" | "nvml" | None), gpu_count (GPUs that answered), expected_gpus,
driver_version, cuda_version, gpus (one dict per GPU; a row that could not be read has "error"),
lost_gpus, processes (None when they could not be listed), nvidia_smi or nvml (how they were
asked), kernel_log ({"source", "xids"} or {"source": None, "error"}).

A finding about particular GPUs names them in ``gpus`` (their indices); identical findings of
several GPUs are one finding, "GPUs 0-3,5-7: ...", listing all of them.

Finding levels and actions (``action``: what to do about the node, least to most severe
none < monitor < app < reset-gpu < reboot < drain < rma; the same scale as node-check):

==========================  =====  =========  ==================================================
code                        level  action     when
==========================  =====  =========  ==================================================
gpu-count-low               fail   reboot     fewer GPUs visible than ``--expect-gpus`` (a GPU missing
                                              from nvidia-smi is usually off the bus: Xid 79, RESTART_BM)
gpu-count-high              warn   monitor    more GPUs visible than ``--expect-gpus``
gpu-lost                    fail   reboot     nvidia-smi: "Unable to determine the device handle ... GPU
                                              is lost" (NVIDIA: Xid 79 -> restart the machine; drain it
                                              if it comes back)
gpu-row-error               warn   monitor    a GPU row that could not be read (kept as a row with ``error``)
nvidia-smi-failed           fail   by code    nvidia-smi exited non-zero (the code's meaning from
                                              nvidia-smi(1)); NVIDIA_SMI_ACTION: 15 (off the bus),
                                              9 (driver not loaded), 10 (interrupt issue), 13 (NVML
                                              mismatch) reboot; 14 (infoROM corrupt) rma; 8 (power
                                              cables) drain; 4 (permission), 12 (no NVML library) none;
                                              others monitor
nvidia-smi-timeout          fail   reboot     nvidia-smi ran past ``--timeout`` (a hung tool: node-check's rule)
nvidia-smi-unusable         fail   none       nvidia-smi could not be started (permissions, bad path)
nvml-failed                 fail   monitor    NVML could not be initialised
no-nvidia-tools             warn   none       neither nvidia-smi nor libnvidia-ml.so.1 (fail and drain
                                              with --expect-gpus N>0: the node cannot run GPU jobs)
amd-unsupported             warn   none       no NVIDIA tools, but amd-smi/rocm-smi: "AMD GPUs: not supported yet"
gaudi-unsupported           warn   none       no NVIDIA tools, but hl-smi: "Gaudi: not supported yet"
ecc-uncorrectable           fail   reset-gpu  uncorrectable ECC errors since the driver loaded (volatile);
                                              NVIDIA's row remapping: a reset applies the pending remap
ecc-uncorrectable-history   warn   monitor    uncorrectable ECC errors in the lifetime count only (aggregate)
remap-failure               fail   rma        a row remapping failed (the GPU is out of spare rows:
                                              NVIDIA's row-remapping docs send it back)
remap-pending               warn   reset-gpu  a row remapping waits for a GPU reset
retired-pages-pending       warn   reset-gpu  page retirement waits for a driver reload (pre-Ampere GPUs)
clocks-hw-thermal           fail   monitor    HW thermal slowdown reported (cooling); said with the SM
                                              clock read beside it
clocks-hw-power-brake       fail   monitor    HW power brake slowdown active (external power brake: PSU)
clocks-hw-slowdown          warn   monitor    HW slowdown active without either of the two above
clocks-sw-thermal           warn   monitor    SW thermal slowdown active (above max operating temperature)
clocks-sw-power-cap         info   none       SW power cap active (normal under full load)
mig-pending                 warn   reset-gpu  MIG mode changes at the next GPU reset
persistence-off             warn   monitor    persistence mode off (driver reinitialised per client)
gpu-busy                    info   none       compute processes hold GPU memory (warn with --expect-idle)
gpu-memory-unattributed     info   none       memory in use, no process visible (warn with --expect-idle)
xid-fatal                   fail   catalog    an Xid whose action in xid_catalog.json is reset-gpu or worse
                                              (xid.py's rules: e.g. 79 reboot, 48 reset-gpu, 48 with
                                              63/64 drain)
xid                         warn   catalog    any other Xid (13/31/43/94: app; 63/92: monitor); without
                                              xid_catalog.json beside xid.py: "Xid N (catalog not shipped)", monitor
==========================  =====  =========  ==================================================

The kernel log's reader (kernel_log.py), its Xid parser, and Xid naming, severity and action
(xid.py, xid_catalog.json) are shipped beside this script (one reader and one catalog for
node-check, gpu-status and scan-log); run by hand without kernel_log.py the kernel log is not
read (``kernel_log`` says so), without xid.py its Xids are not read, without the catalog they
are listed unclassified.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import sys
import time

import _remote
from _remote import fmt_indices, pci_key, which

DIAGNOSTIC = "gpu-status"
DEFAULT_TIMEOUT = 20.0
KERNEL_LOG_BUDGET_S = 5.0
KERNEL_LOG_MAX_BYTES = 32 * 1024 * 1024
UNATTRIBUTED_MIB = _remote.HELD_MIB  # memory in use without a visible process worth a note
# Where drivers put their tools when not on PATH (_remote's), and the other vendors' SMIs
EXTRA_TOOL_DIRS = list(_remote.TOOL_DIRS) + ["/opt/rocm/bin", "/opt/habanalabs/bin"]
NVML_LIBRARY = "libnvidia-ml.so.1"      # named in messages; nvml.py loads it


# nvidia-smi(1), RETURN VALUE.
NVIDIA_SMI_EXIT = {
    0: "success",
    2: "a supplied argument or flag is invalid",
    3: "the requested operation is not available on the target device",
    4: "the current user does not have permission to access this device or perform this operation",
    6: "a query to find an object was unsuccessful",
    8: "the device's external power cables are not properly attached",
    9: "the NVIDIA driver is not loaded",
    10: "the NVIDIA kernel detected an interrupt issue with a GPU",
    12: "the NVML shared library couldn't be found or loaded",
    13: "the local version of NVML doesn't implement this function",
    14: "the infoROM is corrupted",
    15: "the GPU has fallen off the bus or has otherwise become inaccessible",
    255: "other error or internal driver error",
}
NVIDIA_SMI_HINT = {
    2: "nvidia-smi rejected the query; its --help-query-gpu output shows the fields this driver knows",
    4: "run as root or as a member of the group that owns /dev/nvidia*",
    6: "no GPU answered: check `lspci | grep -i nvidia` and the kernel log for NVRM errors",
    8: "attach the GPU's auxiliary power cables",
    9: "load the driver (`modprobe nvidia`); after a kernel update rebuild it (DKMS), then check "
       "`dmesg | grep -i nvrm`",
    10: "check the kernel log for NVRM errors; a reboot usually clears it, repeated faults mean hardware",
    12: "inside a container the NVIDIA container toolkit did not mount the driver libraries "
        "(run with --gpus/--runtime=nvidia, or run ldconfig); on a host, reinstall the driver",
    13: "nvidia-smi and libnvidia-ml.so come from different driver versions: reinstall the driver",
    14: "the GPU's infoROM is corrupt: drain the node and contact the vendor (RMA)",
    15: "the GPU is lost (Xid 79 in the kernel log): drain the node and reboot; if it recurs, "
        "reseat or replace the GPU",
    255: "check the kernel log for NVRM/Xid errors",
}

# NVML's nvmlClocksEventReason* bits (nvml.h); old drivers call them ClocksThrottleReason*.
CLOCK_EVENT_REASONS = [
    (0x0000000000000001, "gpu_idle", "GPU idle"),
    (0x0000000000000002, "applications_clocks_setting", "applications clocks setting"),
    (0x0000000000000004, "sw_power_cap", "SW power cap"),
    (0x0000000000000008, "hw_slowdown", "HW slowdown"),
    (0x0000000000000010, "sync_boost", "sync boost"),
    (0x0000000000000020, "sw_thermal_slowdown", "SW thermal slowdown"),
    (0x0000000000000040, "hw_thermal_slowdown", "HW thermal slowdown"),
    (0x0000000000000080, "hw_power_brake_slowdown", "HW power brake slowdown"),
    (0x0000000000000100, "display_clock_setting", "display clock setting"),
]

# What to do after each exit code of nvidia-smi (the module docstring's table).
NVIDIA_SMI_ACTION = {4: "none", 8: "drain", 9: "reboot", 10: "reboot", 12: "none", 13: "reboot",
                     14: "rma", 15: "reboot"}
# Each finding code's action (the module docstring's table); Xid findings take theirs from the
# catalog, nvidia-smi-failed from NVIDIA_SMI_ACTION, no-nvidia-tools from its level.
CODE_ACTION = {
    "gpu-count-low": "reboot", "gpu-count-high": "monitor", "gpu-lost": "reboot",
    "gpu-row-error": "monitor", "nvidia-smi-failed": "monitor", "nvidia-smi-timeout": "reboot",
    "nvidia-smi-unusable": "none", "nvml-failed": "monitor", "no-nvidia-tools": "none",
    "amd-unsupported": "none", "gaudi-unsupported": "none", "ecc-uncorrectable": "reset-gpu",
    "ecc-uncorrectable-history": "monitor", "remap-failure": "rma", "remap-pending": "reset-gpu",
    "retired-pages-pending": "reset-gpu", "clocks-hw-thermal": "monitor",
    "clocks-hw-power-brake": "monitor", "clocks-hw-slowdown": "monitor",
    "clocks-sw-thermal": "monitor", "clocks-sw-power-cap": "none", "mig-pending": "reset-gpu",
    "persistence-off": "monitor", "gpu-busy": "none", "gpu-memory-unattributed": "none",
    "xid-fatal": "reset-gpu", "xid": "monitor",
}
# An Xid line, for when xid.py is not beside this script (run by hand).

# The query: logical key -> nvidia-smi field names, newest first (an older driver knows the last).
QUERY_FIELDS = [
    ("index", ["index"]),
    ("name", ["name"]),
    ("uuid", ["uuid"]),
    ("pci_bus_id", ["pci.bus_id"]),
    ("driver_version", ["kmd_version", "driver_version"]),
    ("memory_total_mib", ["memory.total"]),
    ("memory_used_mib", ["memory.used"]),
    ("memory_reserved_mib", ["memory.reserved"]),
    ("utilization_gpu_pct", ["utilization.gpu"]),
    ("utilization_memory_pct", ["utilization.memory"]),
    ("temperature_c", ["temperature.gpu"]),
    ("temperature_memory_c", ["temperature.memory"]),
    ("power_draw_w", ["power.draw"]),
    ("power_limit_w", ["power.limit"]),
    ("enforced_power_limit_w", ["enforced.power.limit"]),
    ("pstate", ["pstate"]),
    ("clocks_sm_mhz", ["clocks.current.sm", "clocks.sm"]),
    ("clocks_max_sm_mhz", ["clocks.max.sm"]),
    ("persistence_mode", ["persistence_mode"]),
    ("display_active", ["display_active"]),
    ("compute_mode", ["compute_mode"]),
    ("compute_cap", ["compute_cap"]),
    ("ecc_mode", ["ecc.mode.current"]),
    ("ecc_corrected_volatile", ["ecc.errors.corrected.volatile.total"]),
    ("ecc_corrected_aggregate", ["ecc.errors.corrected.aggregate.total"]),
    ("ecc_uncorrected_volatile", ["ecc.errors.uncorrected.volatile.total"]),
    ("ecc_uncorrected_aggregate", ["ecc.errors.uncorrected.aggregate.total"]),
    ("retired_pages_sbe", ["retired_pages.single_bit_ecc.count", "retired_pages.sbe"]),
    ("retired_pages_dbe", ["retired_pages.double_bit.count", "retired_pages.dbe"]),
    ("retired_pages_pending", ["retired_pages.pending"]),
    ("remapped_rows_correctable", ["remapped_rows.correctable"]),
    ("remapped_rows_uncorrectable", ["remapped_rows.uncorrectable"]),
    ("remapped_rows_pending", ["remapped_rows.pending"]),
    ("remapped_rows_failure", ["remapped_rows.failure"]),
    ("clocks_event_reasons_active", ["clocks_event_reasons.active", "clocks_throttle_reasons.active"]),
    ("hw_thermal_slowdown_us", ["clocks_event_reasons_counters.hw_thermal_slowdown"]),
    ("hw_power_brake_slowdown_us", ["clocks_event_reasons_counters.hw_power_brake_slowdown"]),
    ("mig_mode_current", ["mig.mode.current"]),
    ("mig_mode_pending", ["mig.mode.pending"]),
]
# Known to every nvidia-smi with --query-gpu: if one of these is refused, nothing can be asked.
CORE_KEYS = ("index", "name", "uuid", "pci_bus_id", "driver_version", "memory_total_mib",
             "memory_used_mib", "utilization_gpu_pct", "utilization_memory_pct", "temperature_c",
             "power_draw_w", "power_limit_w", "persistence_mode")
APPS_FIELDS = "gpu_uuid,pid,used_gpu_memory,process_name"  # name last: it may contain ", "

# "not available" as nvidia-smi prints it; any other bracketed cell is an error text.
NOT_AVAILABLE = {"", "n/a", "[n/a]", "[not supported]", "not supported",
                 "[requested functionality has been deprecated]", "[function not found]",
                 "[not available]", "not available"}

UNKNOWN_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field to query')
# "... for GPU 0000:05:00.0: GPU is lost. ..." (older) or "... for GPU1: 0000:0A:00.0: GPU is lost ..."
LOST_RE = re.compile(r"Unable to determine the device handle for (?:GPU|gpu)\s*(?:(\d+):\s+)?"
                     r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])?:?\s*(.*)")


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    import argparse   # only here: through mldiag the client parses argv (bundle.parsed_args)
    p = argparse.ArgumentParser(
        prog="gpu_status.py",
        description="Per-GPU health, load and compute processes of an NVIDIA machine "
                    "(nvidia-smi, else NVML), as one JSON document.")
    p.add_argument("--expect-gpus", type=int, default=None, metavar="N",
                   help="number of GPUs the machine should show (hosts.yaml `gpus:`); fewer is a failure")
    p.add_argument("--nvidia-smi", default=None, metavar="PATH",
                   help="nvidia-smi to run (default: found on PATH, then in the usual driver directories)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help="limit for each nvidia-smi call (it can hang on a GPU in a bad state; default: %(default)s)")
    p.add_argument("--nvml", choices=("auto", "pynvml", "ctypes", "off"), default="auto",
                   help="how to reach NVML when nvidia-smi is missing: nvidia-ml-py if importable, "
                        "else ctypes on libnvidia-ml.so.1 (auto); or never (off)")
    p.add_argument("--expect-idle", action="store_true",
                   help="GPU memory held by processes is a warning, not information (the GPUs should be free)")
    p.add_argument("--known", default=None, metavar="JSON",
                   help="what the client remembers of this machine's nvidia-smi: "
                        '{"driver": "590.48.01", "cuda": "13.1", "fields": ["index", ...]}')
    p.add_argument("--no-kernel-log", action="store_true",
                   help="do not scan the kernel log for Xid errors")
    p.add_argument("--kernel-log-file", default=None, metavar="PATH",
                   help="scan this file (a saved dmesg) for Xid errors instead of the live kernel log")
    return p


# --------------------------------------------------------------------------- small helpers


def finding(level, code, message, hint=None, short=None, gpus=None):
    """A finding; ``gpus``: the indices of the GPUs it is about (kept in the result, so a
    reader of --json knows which GPUs a folded "GPUs 0-3,5-7: ..." means)."""
    f = {"level": level, "code": code, "message": message}
    if hint:
        f["hint"] = hint
    if gpus:
        f["gpus"] = sorted(set(gpus))
    # for the summary line only; removed before the result is returned
    if short:
        f["_short"] = short
    return f


def gpu_finding(level, code, g, rest, hint=None, short_rest=None):
    """A finding about one GPU: the message is its label then ``rest`` ("GPU 5" + ": 2
    uncorrectable ECC errors ..."), the summary's line its label then ``short_rest``; ``hint``
    a text, or a function of the GPU indices. fold_gpu_findings merges those that say the same
    about several GPUs into one ("GPUs 0-3,5-7: ...")."""
    index = g.get("index")
    indices = [index] if isinstance(index, int) and not isinstance(index, bool) else []
    label = gpu_label(g)
    f = finding(level, code, label + rest, hint=hint(indices) if callable(hint) else hint,
                short=label + short_rest if short_rest else None, gpus=indices)
    if indices:
        f["_fold"] = (level, code, rest, hint if callable(hint) else (hint or ""), short_rest)
    return f


def fold_gpu_findings(findings):
    """One finding per (level, code, text apart from the GPU label) instead of one per GPU,
    in the place of its first GPU: "GPUs 0-3,5-7: memory held by ..." with ``gpus`` listing them.

    NOTE: folded here, where each message is built, and not by the renderer: only here is it
    known that two messages differ in their label alone (a renderer would have to parse it out
    of text a target sent), and --json keeps one finding with its GPUs instead of eight."""
    out, first = _remote.merge_folds(findings)
    for (level, code, rest, hint, short_rest), f in first.items():
        if len(f["gpus"]) > 1:
            label = fmt_indices(f["gpus"])
            f["gpus"] = sorted(set(f["gpus"]))
            f["message"] = label + rest
            if callable(hint):
                f["hint"] = hint(f["gpus"])
            if short_rest:
                f["_short"] = label + short_rest
    return out


# How the summary names several GPUs with the same per-GPU finding (whatever else it says).
GROUP_SHORT = {
    "gpu-busy": "%s busy",
    "gpu-memory-unattributed": "%s: memory held by processes not visible here",
    "ecc-uncorrectable": "%s: uncorrectable ECC errors",
    "clocks-hw-thermal": "%s: HW thermal slowdown",
}


def is_not_available(cell):
    return cell is None or cell.strip().lower() in NOT_AVAILABLE


def cell_error(cell):
    """A bracketed cell that is not one of the "not available" forms, e.g. ``[Unknown Error]``."""
    if cell is None:
        return None
    s = cell.strip()
    if s.startswith("[") and s.endswith("]") and s.lower() not in NOT_AVAILABLE:
        return s
    return None


def parse_value(cell, kind):
    """One nvidia-smi cell -> Python value; every "not available" form -> None.

    kind: str | int | float | bool (Enabled/Yes/Active/On) | hex (0x... bitmask).
    Raises ValueError for a cell that is there but not of that kind.
    """
    if is_not_available(cell) or cell_error(cell):
        return None
    s = cell.strip()
    if kind == "str":
        return s
    if kind == "int":
        s = re.sub(r"\s*(MiB|%|W|MHz|C|us|ms)$", "", s)
        return int(s)
    if kind == "float":
        s = re.sub(r"\s*(MiB|%|W|MHz|C|us|ms)$", "", s)
        return float(s)
    if kind == "hex":
        return int(s, 16)
    if kind == "bool":
        low = s.lower()
        if low in ("enabled", "yes", "active", "on", "true", "1"):
            return True
        if low in ("disabled", "no", "not active", "off", "false", "0"):
            return False
        raise ValueError("not a yes/no value: %r" % s)
    raise AssertionError(kind)


FIELD_KIND = {
    "index": "int", "name": "str", "uuid": "str", "pci_bus_id": "str", "driver_version": "str",
    "memory_total_mib": "int", "memory_used_mib": "int", "memory_reserved_mib": "int",
    "utilization_gpu_pct": "int", "utilization_memory_pct": "int", "temperature_c": "int",
    "temperature_memory_c": "int", "power_draw_w": "float", "power_limit_w": "float",
    "enforced_power_limit_w": "float", "pstate": "str", "clocks_sm_mhz": "int",
    "clocks_max_sm_mhz": "int", "persistence_mode": "bool", "display_active": "bool",
    "compute_mode": "str", "compute_cap": "str", "ecc_mode": "bool",
    "ecc_corrected_volatile": "int", "ecc_corrected_aggregate": "int",
    "ecc_uncorrected_volatile": "int", "ecc_uncorrected_aggregate": "int",
    "retired_pages_sbe": "int", "retired_pages_dbe": "int", "retired_pages_pending": "bool",
    "remapped_rows_correctable": "int", "remapped_rows_uncorrectable": "int",
    "remapped_rows_pending": "bool", "remapped_rows_failure": "bool",
    "clocks_event_reasons_active": "hex", "hw_thermal_slowdown_us": "int",
    "hw_power_brake_slowdown_us": "int", "mig_mode_current": "bool", "mig_mode_pending": "bool",
}


def decode_clock_reasons(mask):
    """Bitmask -> [snake_case names], lowest bit first; unknown bits as ``0x...``."""
    if mask is None:
        return None
    names = []
    rest = mask
    for bit, name, _ in CLOCK_EVENT_REASONS:
        if mask & bit:
            names.append(name)
            rest &= ~bit
    if rest:
        names.append("0x%x" % rest)
    return names


def fmt_mib(mib):
    if mib is None:
        return "?"
    if mib >= 10 * 1024:
        return "%d GiB" % round(mib / 1024.0)
    if mib >= 1024:
        return "%.1f GiB" % (mib / 1024.0)
    return "%d MiB" % mib



def count_gpus(n):
    """1 -> "1 GPU", 8 -> "8 GPUs"."""
    return "%d GPU%s" % (n, "" if n == 1 else "s")


def gpu_label(g):
    return "GPU %s" % (g.get("index") if g.get("index") is not None else "?")


# --------------------------------------------------------------------------- running tools


class ToolRun(object):
    """The outcome of one external command: exit code, output, timed out, could not start."""

    def __init__(self, argv):
        self.argv = argv
        self.returncode = None
        self.stdout = ""
        self.stderr = ""
        self.timed_out = False
        self.start_error = None
        self.duration_s = 0.0
        self._proc = None      # a subprocess.Popen where posix_spawnp cannot be used
        self._pid = None       # the command started through posix_spawnp
        self._pipes = self._out = self._err = None
        self._t0 = time.monotonic()

    @property
    def ok(self):
        return self.returncode == 0 and not self.timed_out and self.start_error is None

    @property
    def output(self):
        return (self.stdout + ("\n" if self.stdout and self.stderr else "") + self.stderr).strip()


def start_tool(argv):
    """Start ``argv`` in a session of its own, stdin from /dev/null, stdout and stderr piped.
    Through ``posix_spawnp`` where the C library can start a session that way (glibc 2.26+,
    musl 1.1.17+): subprocess costs its import (~6 ms of CPU, threading and selectors with it)
    on every target, where this diagnostic starts two short commands. Elsewhere subprocess."""
    run = ToolRun(argv)
    spawn = getattr(os, "posix_spawnp", None)
    if spawn is None or _SPAWN_FALLBACK:
        return _start_with_subprocess(run)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        try:
            run._pid = spawn(argv[0], argv, os.environ, setsid=True,
                             setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # as subprocess restores them
                             file_actions=[(os.POSIX_SPAWN_DUP2, devnull, 0),
                                           (os.POSIX_SPAWN_DUP2, out_w, 1),
                                           (os.POSIX_SPAWN_DUP2, err_w, 2)])
        finally:
            os.close(devnull)
    except (NotImplementedError, OSError) as e:
        for fd in (out_r, out_w, err_r, err_w):
            os.close(fd)
        if isinstance(e, NotImplementedError):   # no POSIX_SPAWN_SETSID in this C library
            _SPAWN_FALLBACK.append(True)
            return _start_with_subprocess(run)
        run.start_error = "%s: %s" % (type(e).__name__, e.strerror or e)   # missing, not executable...
        return run
    os.close(out_w)
    os.close(err_w)
    run._pipes = {out_r: [], err_r: []}
    run._out, run._err = out_r, err_r
    return run


_SPAWN_FALLBACK = []   # [True] once posix_spawnp said it cannot start a session here


def _start_with_subprocess(run):
    import subprocess
    try:
        run._proc = subprocess.Popen(run.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True)
    except OSError as e:  # missing, not executable, bad interpreter line
        run.start_error = "%s: %s" % (type(e).__name__, e.strerror or e)
    return run


def finish_tool(run, deadline):
    """Wait for a started command until ``deadline`` (monotonic); kill its process group after."""
    if run._proc is not None:
        return _finish_subprocess(run, deadline)
    if run._pid is None:
        return run
    pipes = run._pipes
    status = None
    if _drain(pipes, deadline):
        status = _wait(run._pid, deadline)   # the pipes may close before the command exits
    if status is None:
        run.timed_out = True
        _kill_group(run._pid)
        if not _drain(pipes, time.monotonic() + 2):   # a grandchild in another session holds them
            for fd in pipes:
                pipes[fd] = []
        status = _wait(run._pid, None)
    for fd in list(pipes):
        os.close(fd)
    run.returncode = _exit_code(status)
    run.stdout = b"".join(pipes[run._out]).decode("utf-8", "replace")
    run.stderr = b"".join(pipes[run._err]).decode("utf-8", "replace")
    run.duration_s = time.monotonic() - run._t0
    run._pid = run._pipes = None
    return run


def _drain(pipes, deadline):
    """Read every pipe in ``pipes`` ({fd: [chunks]}) to its end; False if ``deadline`` came first."""
    open_fds = list(pipes)
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            ready, _, _ = select.select(open_fds, [], [], left)
        except InterruptedError:
            continue
        for fd in ready:
            chunk = os.read(fd, 65536)
            if chunk:
                pipes[fd].append(chunk)
            else:
                open_fds.remove(fd)
    return True


def _wait(pid, deadline):
    """The wait status of ``pid``; None if it still runs at ``deadline`` (monotonic; None: wait
    for it). A pid already reaped elsewhere counts as exited with status 0."""
    delay = 0.001
    while True:
        try:
            done, status = os.waitpid(pid, 0 if deadline is None else os.WNOHANG)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0
        if done:
            return status
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.05)


def _exit_code(status):
    """subprocess's returncode of a wait status: the exit code, or minus the killing signal."""
    if status is None:
        return None
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _finish_subprocess(run, deadline):
    import subprocess
    proc = run._proc
    try:
        out, err = proc.communicate(timeout=max(0.05, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        run.timed_out = True
        _kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:  # a grandchild in another session holds the pipes
            proc.kill()
            out, err = b"", b""
    run.returncode = proc.returncode
    run.stdout = out.decode("utf-8", "replace")
    run.stderr = err.decode("utf-8", "replace")
    run.duration_s = time.monotonic() - run._t0
    run._proc = None
    return run


def _kill_group(pid):
    """SIGKILL the command's session (its process group: it leads both), then the command."""
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def run_tools(argvs, timeout):
    """Run commands side by side, each bounded by ``timeout`` seconds; results in order."""
    runs = [start_tool(a) for a in argvs]
    deadline = time.monotonic() + timeout
    return [finish_tool(r, deadline) for r in runs]


def find_tool(name, path=None):
    return _remote.find_tool(name, EXTRA_TOOL_DIRS, path)


# --------------------------------------------------------------------------- nvidia-smi


def parse_help_fields(text):
    """``--help-query-gpu`` text -> {every accepted field name: canonical name}."""
    table = {}
    for line in text.splitlines():
        s = line.strip()
        if re.match(r'^"[^"]+"(?: or "[^"]+")*$', s):
            names = re.findall(r'"([^"]+)"', s)
            for n in names:
                table.setdefault(n, names[0])
    return table


def choose_fields(valid):
    """[(key, field)] to ask for: the first known name of each key; without help, the oldest."""
    chosen = []
    for key, names in QUERY_FIELDS:
        if valid is None:
            chosen.append((key, names[-1]))
            continue
        for n in names:
            if n in valid:
                chosen.append((key, n))
                break
    return chosen


def parse_gpu_rows(text, keys, returncode=0):
    """CSV rows (noheader, nounits) -> (gpu dicts, lost-GPU dicts, other lines).

    A line with the wrong number of cells is a GPU row that could not be read when nvidia-smi
    said it succeeded, and one of its messages when it did not.
    """
    gpus, lost, other = [], [], []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = LOST_RE.search(line)
        if m:
            lost.append({"index": int(m.group(1)) if m.group(1) else None,
                         "pci_bus_id": m.group(2), "error": line.strip()})
            continue
        cells = line.split(", ")
        if len(cells) != len(keys):
            if returncode == 0:
                gpus.append({"index": None, "error": "expected %d columns, got %d" % (len(keys), len(cells)),
                             "raw": line})
            else:
                other.append(line.strip())
            continue
        gpus.append(gpu_from_cells(dict(zip(keys, cells))))
    return gpus, lost, other


def gpu_from_cells(cells):
    g = {}
    unreadable = {}
    for key, cell in cells.items():
        err = cell_error(cell)
        if err:
            unreadable[key] = err
        try:
            g[key] = parse_value(cell, FIELD_KIND[key])
        except ValueError:
            g[key] = None
            unreadable[key] = cell
    if "index" in cells and g.get("index") is None:
        g["error"] = "no GPU index in nvidia-smi's row"
    if unreadable:
        g["unreadable"] = unreadable
    return normalise_gpu(g)


def normalise_gpu(g):
    """Flat per-field values -> the documented per-GPU shape (nested groups)."""
    out = {}
    for key in ("index", "name", "uuid", "pci_bus_id", "memory_used_mib", "memory_total_mib",
                "memory_reserved_mib", "utilization_gpu_pct", "utilization_memory_pct",
                "temperature_c", "temperature_memory_c", "power_draw_w", "power_limit_w",
                "enforced_power_limit_w", "pstate", "clocks_sm_mhz", "clocks_max_sm_mhz",
                "persistence_mode", "display_active", "compute_mode", "compute_cap", "ecc_mode"):
        out[key] = g.get(key)
    out["ecc_errors"] = {
        "uncorrected_volatile": g.get("ecc_uncorrected_volatile"),
        "uncorrected_aggregate": g.get("ecc_uncorrected_aggregate"),
        "corrected_volatile": g.get("ecc_corrected_volatile"),
        "corrected_aggregate": g.get("ecc_corrected_aggregate"),
    }
    out["remapped_rows"] = {
        "correctable": g.get("remapped_rows_correctable"),
        "uncorrectable": g.get("remapped_rows_uncorrectable"),
        "pending": g.get("remapped_rows_pending"),
        "failure": g.get("remapped_rows_failure"),
    }
    out["retired_pages"] = {
        "sbe": g.get("retired_pages_sbe"),
        "dbe": g.get("retired_pages_dbe"),
        "pending": g.get("retired_pages_pending"),
    }
    mask = g.get("clocks_event_reasons_active")
    out["clocks_event_reasons"] = {
        "active": None if mask is None else "0x%016X" % mask,
        "names": decode_clock_reasons(mask),
    }
    # how long each HW slowdown was engaged, in all (nvidia-smi's clocks_event_reasons_counters)
    out["clocks_event_counters_us"] = {"hw_thermal_slowdown": g.get("hw_thermal_slowdown_us"),
                                       "hw_power_brake_slowdown": g.get("hw_power_brake_slowdown_us")}
    out["mig_mode"] = {"current": g.get("mig_mode_current"), "pending": g.get("mig_mode_pending")}
    for extra in ("driver_version", "error", "raw", "unreadable"):
        if g.get(extra) is not None:
            out[extra] = g[extra]
    return out


def parse_apps(text):
    procs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = line.split(", ", 3)
        if len(cells) != 4:
            continue  # "No running processes found" and other prose
        uuid, pid, mem, name = cells
        try:
            pid_v = parse_value(pid, "int")
        except ValueError:
            continue
        try:
            mem_v = parse_value(mem, "int")
        except ValueError:
            mem_v = None
        procs.append({"gpu": None, "pid": pid_v, "name": parse_value(name, "str"),
                      "used_memory_mib": mem_v, "gpu_uuid": uuid.strip()})
    return procs


def parse_version(text):
    """``nvidia-smi --version`` -> {"driver_version", "cuda_version", "nvml_version"}."""
    out = {}
    for line in text.splitlines():
        if ":" not in line:
            continue
        k, v = [x.strip() for x in line.split(":", 1)]
        k = k.lower()
        if v.lower().startswith("deprecated"):
            continue
        if k in ("driver version", "kmd version"):
            out["driver_version"] = v
        elif k in ("cuda version", "cuda umd version"):
            out["cuda_version"] = v
        elif k == "nvml version":
            out["nvml_version"] = v
    return out


def parse_mig_listing(text):
    """``nvidia-smi -L`` -> {gpu index: [{"profile", "device", "uuid"}]}."""
    out = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^GPU (\d+): ", line)
        if m:
            current = int(m.group(1))
            continue
        m = re.match(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)", line)
        if m and current is not None:
            out.setdefault(current, []).append(
                {"profile": m.group(1), "device": int(m.group(2)), "uuid": m.group(3)})
    return out


def smi_failure(run, what, timeout):
    """A finding for an nvidia-smi call that did not answer, or None."""
    if run.start_error:
        return finding("fail", "nvidia-smi-unusable",
                       "nvidia-smi (%s) could not be started: %s" % (run.argv[0], run.start_error),
                       hint="check the path and its permissions", short="nvidia-smi unusable")
    if run.timed_out:
        return finding("fail", "nvidia-smi-timeout",
                       "nvidia-smi hung for %s s (%s) and was killed" % (_secs(timeout), what),
                       hint="a GPU in a bad state makes nvidia-smi hang: check the kernel log for Xid "
                            "errors; a GPU reset or a reboot is usually needed",
                       short="nvidia-smi hung for %s s" % _secs(timeout))
    if run.returncode:
        code = run.returncode
        meaning = NVIDIA_SMI_EXIT.get(code, "an exit code nvidia-smi(1) does not document")
        said = first_line(run.output)
        msg = "nvidia-smi exited with %d (%s)" % (code, meaning)
        if said:
            msg += ": %s" % said
        f = finding("fail", "nvidia-smi-failed", msg, hint=NVIDIA_SMI_HINT.get(code),
                    short="nvidia-smi failed (%d: %s)" % (code, meaning))
        f["action"] = NVIDIA_SMI_ACTION.get(code, "monitor")
        return f
    return None


def first_line(text):
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def _secs(x):
    return ("%g" % x) if x == int(x) else ("%.1f" % x)


def parse_known(text):
    """``--known`` -> {"driver", "cuda", "fields"} with only well-formed values (fields: names
    this script would ask for), or None."""
    try:
        raw = json.loads(text) if text else None
    except ValueError:
        return None
    if not isinstance(raw, dict):
        return None
    names = dict((n, key) for key, ns in QUERY_FIELDS for n in ns)
    fields = raw.get("fields")
    fields = [f for f in fields if f in names][:len(QUERY_FIELDS)] if isinstance(fields, list) else []
    text_of = lambda v: v if isinstance(v, str) and re.match(r"^[0-9][0-9.]{0,19}$", v) else None
    if not any(names[f] == "index" for f in fields):
        fields = []
    return {"driver": text_of(raw.get("driver")), "cuda": text_of(raw.get("cuda")),
            "fields": [(names[f], f) for f in fields]}


# The first question asks each key's newest name, except where a still-current driver refuses
# it and an older name means the same: kmd_version is 595+ only (590 refuses it), and every
# driver also answers driver_version.
FIRST_ASK = {"driver_version": "driver_version"}


def newest_fields():
    """[(key, field)]: each key's newest name (FIRST_ASK's where it says otherwise)."""
    return [(key, FIRST_ASK.get(key, names[0])) for key, names in QUERY_FIELDS]


def query_gpu_argv(smi, chosen):
    return [smi, "--query-gpu=" + ",".join(f for _, f in chosen), "--format=csv,noheader,nounits"]


def collect_nvidia_smi(smi, timeout, known=None):
    """What nvidia-smi says: (facts for the result's data, findings about its failures)."""
    facts, findings = {}, []
    facts["source"] = "nvidia-smi"
    info = {"path": smi, "calls": 0}
    facts["nvidia_smi"] = info
    chosen = (known or {}).get("fields") or newest_fields()
    ask_version = not (known and known.get("driver") and known.get("cuda"))
    batch = [query_gpu_argv(smi, chosen),
             [smi, "--query-compute-apps=" + APPS_FIELDS, "--format=csv,noheader,nounits"]]
    if ask_version:
        batch.append([smi, "--version"])
    runs = run_tools(batch, timeout)
    info["calls"] += len(batch)
    query_run, apps_run = runs[0], runs[1]
    version_run = runs[2] if ask_version else None
    for run, what in ((query_run, "--query-gpu"), (apps_run, "--query-compute-apps")):
        if run.start_error or run.timed_out:
            findings.append(smi_failure(run, what, timeout))
            return facts, findings

    refused = []
    if query_run.returncode and UNKNOWN_FIELD_RE.search(query_run.output):
        # A driver that does not know one of the fields: ask it which it knows, then only those
        refused.append(UNKNOWN_FIELD_RE.search(query_run.output).group(1))
        help_run = run_tools([[smi, "--help-query-gpu"]], timeout)[0]
        info["calls"] += 1
        if help_run.start_error or help_run.timed_out:
            findings.append(smi_failure(help_run, "--help-query-gpu", timeout))
            return facts, findings
        valid = parse_help_fields(help_run.stdout) if help_run.ok else None
        if not valid:
            info["help_query_gpu"] = "unavailable: " + (first_line(help_run.output) or "no output")
        chosen = [(k, f) for k, f in choose_fields(valid or None) if f not in refused]
        for attempt in range(4):
            query_run = run_tools([query_gpu_argv(smi, chosen)], timeout)[0]
            info["calls"] += 1
            if query_run.start_error or query_run.timed_out:
                findings.append(smi_failure(query_run, "--query-gpu", timeout))
                return facts, findings
            m = UNKNOWN_FIELD_RE.search(query_run.output)
            if not (query_run.returncode and m) or attempt == 3:
                break
            # no usable --help-query-gpu (a very old driver): drop the refused field and ask
            # again; after three refusals keep only the core fields
            refused.append(m.group(1))
            chosen = [(k, f) for k, f in chosen if f not in refused]
            if attempt == 2:
                chosen = [(k, f) for k, f in chosen if k in CORE_KEYS]
            if not any(k == "index" for k, _ in chosen):
                break
    if refused:
        info["fields_refused"] = refused
    info["fields_asked"] = [f for _, f in chosen]

    gpus, lost, other = parse_gpu_rows(query_run.stdout + "\n" + query_run.stderr, [k for k, _ in chosen],
                                       query_run.returncode)
    if other:
        info["messages"] = other[:10]  # what nvidia-smi said besides the rows (warnings, errors)
    if query_run.returncode:
        f = smi_failure(query_run, "--query-gpu", timeout)
        if not (query_run.returncode == 15 and lost):  # the lost GPUs say it better
            findings.append(f)
    for g in gpus:
        dv = g.pop("driver_version", None)
        if dv and not facts.get("driver_version"):
            facts["driver_version"] = dv
    if version_run is None and not (known and facts.get("driver_version") == known.get("driver")):
        # the client remembered another driver (an upgrade), or no GPU said its driver
        version_run = run_tools([[smi, "--version"]], timeout)[0]
        info["calls"] += 1
    if version_run is None:
        facts["cuda_version"] = known["cuda"]
    elif version_run.ok:
        v = parse_version(version_run.stdout)
        facts["cuda_version"] = v.get("cuda_version")
        if not facts.get("driver_version"):
            facts["driver_version"] = v.get("driver_version")
    for l in lost:
        findings.append(finding(
            "fail", "gpu-lost",
            "GPU %s%s is lost: %s" % (l["index"] if l["index"] is not None else "?",
                                      " (%s)" % l["pci_bus_id"] if l["pci_bus_id"] else "", l["error"]),
            hint=NVIDIA_SMI_HINT[15],
            short="GPU %s lost" % (l["index"] if l["index"] is not None else "?"),
            gpus=[l["index"]] if l["index"] is not None else None))
    facts["gpus"] = gpus
    facts["lost_gpus"] = lost

    # Processes: rows are kept even when nvidia-smi also complained (a lost GPU among healthy ones);
    # with no rows and a failure, the processes are unknown (None), not "none".
    by_uuid = dict((g.get("uuid"), g.get("index")) for g in gpus)
    procs = parse_apps(apps_run.stdout)
    for p in procs:
        p["gpu"] = by_uuid.get(p["gpu_uuid"])
        cmd = visible_command(p["pid"], p["name"])
        if cmd:
            p["command"] = cmd
    facts["processes"] = procs if (procs or apps_run.returncode == 0) else None
    if apps_run.returncode:
        info["query_compute_apps"] = "exit %d: %s" % (apps_run.returncode, first_line(apps_run.output))

    # MIG instances, when a GPU runs in MIG mode
    if any((g.get("mig_mode") or {}).get("current") for g in gpus):
        listing = run_tools([[smi, "-L"]], timeout)[0]
        info["calls"] += 1
        if listing.stdout:
            migs = parse_mig_listing(listing.stdout)
            for g in gpus:
                if g.get("index") in migs:
                    g["mig_devices"] = migs[g["index"]]
    return facts, findings


def visible_command(pid, name):
    """The full command line of ``pid`` when this PID namespace has that very process."""
    if not pid or not name:
        return None
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            raw = f.read(4096)
    except OSError:
        return None
    argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]
    if not argv or argv[0] != name:
        return None  # another process reusing the pid, or another namespace's pid
    return " ".join(argv)[:300]


# --------------------------------------------------------------------------- NVML


def load_nvml(mode="auto", cdll_loader=None):
    """The NVML API to use when nvidia-smi is missing, as (api, how) or (None, why not): pynvml
    when it is installed, else nvml.py's ctypes binding (a companion, loaded only here)."""
    nvml = _remote.load_companion(os.path.dirname(os.path.abspath(__file__)), "nvml.py", "mldiag_nvml")
    if nvml is None:
        return None, "nvml.py is not beside gpu_status.py"
    return nvml.load_nvml(mode, cdll_loader)


def _text(v):
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def collect_nvml(api, how):
    """What NVML (pynvml or CtypesNvml) says: (facts for the result's data, findings about its
    failures); per-field NVML errors become None."""
    facts, findings = {}, []
    facts["source"] = "nvml"
    facts["nvml"] = {"binding": how}
    err = api.NVMLError

    def get(name, *args):
        fn = getattr(api, name, None)
        if fn is None:
            return None
        try:
            return fn(*args)
        except err:
            return None

    try:
        api.nvmlInit()
    except err as e:
        findings.append(finding("fail", "nvml-failed", "NVML could not be initialised (%s): %s" % (how, e),
                                hint="check that the NVIDIA driver is loaded (`lsmod | grep nvidia`) and "
                                     "that this libnvidia-ml.so.1 matches it",
                                short="NVML failed: %s" % e))
        return facts, findings
    try:
        facts["driver_version"] = _text(get("nvmlSystemGetDriverVersion"))
        cuda = get("nvmlSystemGetCudaDriverVersion_v2")
        if cuda is None:
            cuda = get("nvmlSystemGetCudaDriverVersion")
        if cuda:
            facts["cuda_version"] = "%d.%d" % (cuda // 1000, (cuda % 1000) // 10)
        try:
            count = api.nvmlDeviceGetCount()
        except err as e:
            findings.append(finding("fail", "nvml-failed", "NVML could not count the GPUs: %s" % e,
                                    short="NVML failed: %s" % e))
            return facts, findings
        gpus, procs = [], []
        for i in range(count):
            try:
                h = api.nvmlDeviceGetHandleByIndex(i)
            except err as e:
                gpus.append(normalise_gpu({"index": i, "error": "NVML: %s" % e}))
                continue
            g = {"index": i, "name": _text(get("nvmlDeviceGetName", h)), "uuid": _text(get("nvmlDeviceGetUUID", h))}
            pci = get("nvmlDeviceGetPciInfo", h)
            g["pci_bus_id"] = _text(pci.busId) if pci is not None else None
            mem = get("nvmlDeviceGetMemoryInfo", h)
            if mem is not None:
                g["memory_total_mib"] = int(mem.total // (1024 * 1024))
                g["memory_used_mib"] = int(mem.used // (1024 * 1024))
            util = get("nvmlDeviceGetUtilizationRates", h)
            if util is not None:
                g["utilization_gpu_pct"], g["utilization_memory_pct"] = util.gpu, util.memory
            g["temperature_c"] = get("nvmlDeviceGetTemperature", h, 0)  # NVML_TEMPERATURE_GPU
            power = get("nvmlDeviceGetPowerUsage", h)
            g["power_draw_w"] = power / 1000.0 if power is not None else None
            limit = get("nvmlDeviceGetEnforcedPowerLimit", h)
            g["power_limit_w"] = limit / 1000.0 if limit is not None else None
            pm = get("nvmlDeviceGetPersistenceMode", h)
            g["persistence_mode"] = None if pm is None else bool(pm)
            reasons = get("nvmlDeviceGetCurrentClocksEventReasons", h)
            if reasons is None:
                reasons = get("nvmlDeviceGetCurrentClocksThrottleReasons", h)
            g["clocks_event_reasons_active"] = reasons
            cc = get("nvmlDeviceGetCudaComputeCapability", h)
            g["compute_cap"] = "%d.%d" % tuple(cc) if cc else None
            mig = get("nvmlDeviceGetMigMode", h)
            if mig:
                g["mig_mode_current"], g["mig_mode_pending"] = bool(mig[0]), bool(mig[1])
            ecc = get("nvmlDeviceGetEccMode", h)
            if ecc:
                g["ecc_mode"] = bool(ecc[0])
                # NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1; NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1
                g["ecc_uncorrected_volatile"] = get("nvmlDeviceGetTotalEccErrors", h, 1, 0)
                g["ecc_uncorrected_aggregate"] = get("nvmlDeviceGetTotalEccErrors", h, 1, 1)
                g["ecc_corrected_volatile"] = get("nvmlDeviceGetTotalEccErrors", h, 0, 0)
                g["ecc_corrected_aggregate"] = get("nvmlDeviceGetTotalEccErrors", h, 0, 1)
            rows = get("nvmlDeviceGetRemappedRows", h)
            if rows:
                g["remapped_rows_correctable"], g["remapped_rows_uncorrectable"] = rows[0], rows[1]
                g["remapped_rows_pending"], g["remapped_rows_failure"] = bool(rows[2]), bool(rows[3])
            gpus.append(normalise_gpu(g))
            for p in get("nvmlDeviceGetComputeRunningProcesses", h) or []:
                used = getattr(p, "usedGpuMemory", None)
                name = _text(get("nvmlSystemGetProcessName", p.pid))
                entry = {"gpu": i, "pid": p.pid, "name": name,
                         "used_memory_mib": None if used is None else int(used // (1024 * 1024)),
                         "gpu_uuid": g["uuid"]}
                cmd = visible_command(p.pid, name)
                if cmd:
                    entry["command"] = cmd
                procs.append(entry)
        facts["gpus"] = gpus
        facts["processes"] = procs
    finally:
        try:
            api.nvmlShutdown()
        except err:
            pass
    return facts, findings


# --------------------------------------------------------------------------- kernel log


class Background(object):
    """``fn()`` in a thread from now on; ``result()`` waits for it and returns its value (or
    raises what it raised)."""

    def __init__(self, fn):
        import threading
        self._value, self._error = None, None
        self._thread = threading.Thread(target=self._run, args=(fn,), name="mldiag-" + fn.__name__)
        self._thread.daemon = True
        self._thread.start()

    def _run(self, fn):
        try:
            self._value = fn()
        except BaseException as e:      # handed to the caller, with its traceback
            self._error = e

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def kernel_log_tool(argv, timeout):
    """kernel_log.read's ``run_tool``: one command through this script's spawn, its outcome
    as a ``_remote.Tool``."""
    exe = which(argv[0])
    if exe is None:
        return _remote.Tool("missing", None, "", "", 0.0)
    run = run_tools([[exe] + argv[1:]], timeout)[0]
    if run.start_error:
        return _remote.Tool("missing", None, "", run.start_error, run.duration_s)
    if run.timed_out:
        return _remote.Tool("timeout", None, run.stdout, run.stderr, run.duration_s)
    return _remote.Tool("ok", run.returncode, run.stdout, run.stderr, run.duration_s)


HERE = os.path.dirname(os.path.abspath(__file__))
NO_READER = "kernel_log.py is not beside gpu_status.py: the kernel log is not read"


def read_kernel_log(path=None, budget_s=KERNEL_LOG_BUDGET_S):
    """kernel_log.py's reader (``{"source", "text", "error", "hung"}``): the file at ``path``,
    else this boot's log within ``budget_s``. Not xid.py: a healthy log needs neither its
    parser nor its catalog (a compile and a parse each run)."""
    reader = _remote.load_companion(HERE, "kernel_log.py", "mldiag_kernel_log")
    if reader is None:
        return {"source": None, "text": "", "error": NO_READER, "hung": []}
    return reader.read(kernel_log_tool, since=None, path=path, timeout=budget_s, max_bytes=KERNEL_LOG_MAX_BYTES)


def xid_gpus(pcis, data):
    """The indices of the GPUs (answering or lost) at the PCI addresses an Xid names."""
    by_pci = {}
    for g in (data.get("gpus") or []) + (data.get("lost_gpus") or []):
        key = pci_key(g.get("pci_bus_id"))
        if key is not None and g.get("index") is not None:
            by_pci[key] = g["index"]
    return [by_pci[k] for k in (pci_key(p) for p in pcis) if k in by_pci]


def scan_xids(text, gpus=None):
    """Kernel log text -> [{"xid", "name", "fatal", "action", "count", "pci", "first", "last"}], by
    Xid number, as xid.py reads them; name/fatal/action from xid_catalog.json (fatal: its action
    is reset-gpu or worse; the worst action over the Xid's GPUs, 48 with 63/64 on one GPU:
    drain). ``gpus``: the inventory as node-check passes it ({"index", "pci"}). Without the
    catalog: name "catalog not shipped", not fatal, action monitor."""
    if "NVRM" not in text:
        # every Xid line (and "fallen off the bus", read as Xid 79) is an NVRM line: a healthy
        # node's log costs no load of the catalog (a parse each run)
        return []
    xm = _remote.load_xid(HERE, with_catalog=False)
    if xm is None:
        return []
    lines = text.splitlines()
    events = [e for e in xm.parse_kernel_log(text) if e["kind"] == "xid"]
    classified = _remote.load_xid(HERE) is not None
    actions = {}
    if classified:
        for f in xm.classify(events, gpus or []):
            code = int(f["code"].split("-", 1)[1])
            actions[code] = xm.worst_action([actions.get(code, "none"), f["action"]])
    by_xid = {}
    for ev in events:
        code, pci, n = ev["code"], ev["pci"], ev["line"]
        e = by_xid.get(code)
        if e is None:
            if not classified:
                name, action, fatal = "catalog not shipped", "monitor", False
            else:
                name, action = xm.xid_info(code)["name"], actions.get(code, "monitor")
                fatal = xm.LEVEL_OF[action] == "fail"
            e = by_xid[code] = {"xid": code, "name": name, "fatal": fatal, "action": action,
                                "count": 0, "pci": [], "first": lines[n - 1].strip()[:400]}
        e["count"] += 1
        if pci not in e["pci"]:
            e["pci"].append(pci)
        e["last"] = lines[n - 1].strip()[:400]
    return [by_xid[k] for k in sorted(by_xid)]


# --------------------------------------------------------------------------- analysis


def answering(data):
    """The GPUs whose rows were read (a row nvidia-smi could not read is left out)."""
    return [g for g in data.get("gpus") or [] if not g.get("error")]


def judge(data, expect_gpus=None, expect_idle=False, environ=None):
    """What the gathered facts say about the GPUs that answered: their count against
    ``expect_gpus``, unreadable rows, ECC, row remaps, retired pages, clock events, MIG,
    persistence, memory held (a warning with ``expect_idle``). A pure function of ``data`` (the
    result's data as gathered) and the expectations, returning the findings: tests judge
    recorded facts with it, no fake binary. ``environ``: where CUDA_VISIBLE_DEVICES is read
    for a hint (default: this process's)."""
    environ = os.environ if environ is None else environ
    findings = []
    gpus = answering(data)
    bad_rows = [g for g in data.get("gpus") or [] if g.get("error")]
    busy_level = "warn" if expect_idle else "info"
    visible = len(gpus)

    if expect_gpus is not None and data.get("source"):
        if visible < expect_gpus:
            env = dict((k, environ[k]) for k in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
                       if k in environ)
            hint = "compare `nvidia-smi -L` and `lspci -d 10de:` with the expected count; a GPU " \
                   "missing from both fell off the bus (Xid 79)"
            if env:
                hint += "; note %s" % ", ".join("%s=%s" % kv for kv in sorted(env.items()))
            findings.append(finding("fail", "gpu-count-low", "%d of %s visible" % (visible, count_gpus(expect_gpus)),
                                    hint=hint, short="%d of %s visible" % (visible, count_gpus(expect_gpus))))
        elif visible > expect_gpus:
            findings.append(finding("warn", "gpu-count-high",
                                    "%s visible, %d expected" % (count_gpus(visible), expect_gpus),
                                    hint="update `gpus:` in hosts.yaml if the machine changed",
                                    short="%s visible, %d expected" % (count_gpus(visible), expect_gpus)))
    for g in bad_rows:
        findings.append(gpu_finding("warn", "gpu-row-error", g, " could not be read: %s" % g["error"],
                                    short_rest=" unreadable"))

    for g in gpus:
        ecc = g.get("ecc_errors") or {}
        if ecc.get("uncorrected_volatile"):
            findings.append(gpu_finding(
                "fail", "ecc-uncorrectable", g,
                ": %d uncorrectable ECC errors since the driver loaded (%s in its lifetime)"
                % (ecc["uncorrected_volatile"], _q(ecc.get("uncorrected_aggregate"))),
                hint="drain the GPU; see the kernel log for Xid 48/94/95, then reset it (`nvidia-smi -r`) "
                     "so pending remaps apply; repeated errors mean RMA",
                short_rest=": uncorrectable ECC errors"))
        elif ecc.get("uncorrected_aggregate"):
            findings.append(gpu_finding(
                "warn", "ecc-uncorrectable-history", g,
                ": %d uncorrectable ECC errors in its lifetime, none since the driver loaded"
                % ecc["uncorrected_aggregate"],
                hint="watch the count; if it grows, drain the GPU and check row remapping",
                short_rest=": past uncorrectable ECC errors"))
        rr = g.get("remapped_rows") or {}
        if rr.get("failure"):
            findings.append(gpu_finding(
                "fail", "remap-failure", g, ": a row remapping failed (no spare rows left)",
                hint="the GPU's memory can no longer repair itself: drain it and request an RMA",
                short_rest=": row remap failure"))
        if rr.get("pending"):
            findings.append(gpu_finding(
                "warn", "remap-pending", g,
                ": row remapping pending (%s correctable, %s uncorrectable rows remapped)"
                % (_q(rr.get("correctable")), _q(rr.get("uncorrectable"))),
                hint=reset_hint, short_rest=": row remap pending"))
        rp = g.get("retired_pages") or {}
        if rp.get("pending"):
            findings.append(gpu_finding(
                "warn", "retired-pages-pending", g,
                ": memory pages waiting to be retired (%s single-bit, %s double-bit pages retired)"
                % (_q(rp.get("sbe")), _q(rp.get("dbe"))),
                hint="reboot (or reset the GPU) so the pages are retired",
                short_rest=": page retirement pending"))
        findings.extend(clock_findings(g))

    mig_pending = [g.get("index") for g in gpus if (g.get("mig_mode") or {}).get("pending") is not None
                   and (g.get("mig_mode") or {}).get("current") is not None
                   and g["mig_mode"]["pending"] != g["mig_mode"]["current"]]
    if mig_pending:
        findings.append(finding(
            "warn", "mig-pending", "%s: MIG mode changes at the next GPU reset" % fmt_indices(mig_pending),
            hint="reset the GPU (`nvidia-smi -r`) or reboot to apply, or set the mode back",
            short="%s: MIG change pending" % fmt_indices(mig_pending), gpus=mig_pending))
    pm_off = [g.get("index") for g in gpus if g.get("persistence_mode") is False]
    if pm_off:
        findings.append(finding(
            "warn", "persistence-off", "%s: persistence mode off" % fmt_indices(pm_off),
            hint="enable it with `nvidia-smi -pm 1` or, better, run nvidia-persistenced: without it the "
                 "driver tears down and re-initialises the GPU for every client (slow starts, lost state)",
            short="persistence mode off", gpus=pm_off))

    procs = data.get("processes")
    if procs is not None:
        for g in gpus:
            mine = [p for p in procs if p.get("gpu") == g.get("index")]
            used = g.get("memory_used_mib")
            if mine:
                held = sum(p["used_memory_mib"] or 0 for p in mine)
                mine.sort(key=lambda p: -(p["used_memory_mib"] or 0))
                top = mine[0]
                who = "pid %s (%s)" % (top["pid"], top.get("command") or top.get("name") or "?")
                if len(mine) == 1:
                    rest = " busy: %s held by %s" % (fmt_mib(held), who)
                    short_rest = " busy (%s, pid %s)" % (fmt_mib(held), top["pid"])
                else:
                    rest = " busy: %s held by %d processes, most by %s %s" % (
                        fmt_mib(held), len(mine), who, fmt_mib(top["used_memory_mib"]))
                    short_rest = " busy (%s, %d processes)" % (fmt_mib(held), len(mine))
                findings.append(gpu_finding(busy_level, "gpu-busy", g, rest, short_rest=short_rest))
            elif used is not None and used >= UNATTRIBUTED_MIB and not g.get("display_active"):
                findings.append(gpu_finding(
                    busy_level, "gpu-memory-unattributed", g,
                    ": %s in use and no process visible: memory held by processes not visible in "
                    "this PID namespace" % fmt_mib(used),
                    hint="run gpu-status on the host (or a container sharing its PID namespace) to see them",
                    short_rest=": %s held by processes not visible here" % fmt_mib(used)))
    return findings


def reset_hint(indices):
    """How to apply a pending row remap on these GPUs (``nvidia-smi -r`` takes one GPU per -i)."""
    if not indices:
        how = "`nvidia-smi -r -i INDEX`"
    elif len(indices) == 1:
        how = "`nvidia-smi -r -i %d`" % indices[0]
    else:
        how = "`nvidia-smi -r -i N` for N in %s" % ",".join(str(i) for i in indices)
    return "reset the GPU (%s, no processes on it) or reboot to apply the remap" % how


# The HW slowdown reasons (nvml.h): while one is engaged the hardware cuts the core clocks by a
# factor of 2 or more. The reasons and the clock are separate readings, and a slowdown can come
# and go between them: what the clock said is reported next to the reason, not assumed.
HW_SLOWDOWNS = [
    # (reason, level, code, what, the usual cause, what to check)
    ("hw_thermal_slowdown", "fail", "clocks-hw-thermal", "HW thermal slowdown",
     "the GPU is too hot", "check fans, airflow and inlet temperature"),
    ("hw_power_brake_slowdown", "fail", "clocks-hw-power-brake", "HW power brake slowdown",
     "the power supply asserted the external power brake", "check PSUs and power cabling"),
    ("hw_slowdown", "warn", "clocks-hw-slowdown", "HW slowdown",
     "the GPU is too hot or draws too much power (it can also show briefly during a clock change)",
     "check cooling and power"),
]


def clock_findings(g):
    """Findings for the clock-event reasons of one GPU, true to its clock reading: a HW slowdown
    halves the clocks or more while it is engaged, but the reason and the clock are two readings;
    "active ... SM clock 810 of 1980 MHz" only when the clock shows it."""
    names = (g.get("clocks_event_reasons") or {}).get("names") or []
    sm, top = g.get("clocks_sm_mhz"), g.get("clocks_max_sm_mhz")
    temp = " at %d C" % g["temperature_c"] if g.get("temperature_c") is not None else ""
    clocks = ", SM clock %d of %d MHz" % (sm, top) if sm is not None and top else ""
    out = []
    for reason, level, code, what, cause, check in HW_SLOWDOWNS:
        if reason not in names:
            continue
        if reason == "hw_slowdown" and {"hw_thermal_slowdown", "hw_power_brake_slowdown"} & set(names):
            continue   # the specific reason says it better
        shown = temp if reason != "hw_power_brake_slowdown" else ""
        engaged = (g.get("clocks_event_counters_us") or {}).get(reason)
        total = "; engaged %s in all" % fmt_us(engaged) if engaged else ""
        if not clocks:
            rest = ": %s reported%s (no SM clock reading beside it)%s" % (what, shown, total)
            hint = "%s; while engaged the hardware cuts the clocks by half or more: %s" % (cause, check)
        elif sm * 2 <= top:
            rest = ": %s active%s%s%s" % (what, shown, clocks, total)
            hint = "%s; the hardware cut its clocks to half or less: %s" % (cause, check)
        else:
            rest = ": %s reported%s, yet the SM clock read %d of %d MHz%s" % (what, shown, sm, top, total)
            hint = ("%s; while engaged the hardware cuts the clocks by half or more, and this reading "
                    "caught them at %d%%, so it comes and goes: %s, and read again under load"
                    % (cause, round(100.0 * sm / top), check))
        out.append(gpu_finding(level, code, g, rest, hint=hint, short_rest=": " + what))
    if "sw_thermal_slowdown" in names:
        out.append(gpu_finding(
            "warn", "clocks-sw-thermal", g, ": SW thermal slowdown active%s%s" % (temp, clocks),
            hint="the GPU is above its maximum operating temperature: check cooling",
            short_rest=": SW thermal slowdown"))
    if "sw_power_cap" in names:
        draw, limit = g.get("power_draw_w"), g.get("power_limit_w")
        power = " (%.0f W of %.0f W)" % (draw, limit) if draw is not None and limit else ""
        out.append(gpu_finding(
            "info", "clocks-sw-power-cap", g, ": clocks held by the SW power cap%s" % power,
            hint="normal under full load; if the limit is below the default, see `nvidia-smi -q -d POWER`"))
    return out


def fmt_us(us):
    """Microseconds as a person reads them: 3120000 -> "3.1 s", 40000 -> "40 ms"."""
    if us >= 3600 * 10 ** 6:
        return "%.1f h" % (us / 3600e6)
    if us >= 60 * 10 ** 6:
        return "%.1f min" % (us / 60e6)
    if us >= 10 ** 6:
        return "%.1f s" % (us / 1e6)
    return "%d ms" % (us // 1000)


def _q(v):
    return "?" if v is None else str(v)


def no_tools_findings(path, expect_gpus=None):
    amd = [t for t in ("amd-smi", "rocm-smi") if find_tool(t, path)]
    gaudi = find_tool("hl-smi", path)
    out = []
    if amd:
        out.append(finding("warn", "amd-unsupported", "AMD GPUs: not supported yet (found %s)" % ", ".join(amd),
                           hint="gpu-status reads NVIDIA GPUs only; use `%s` directly for now" % amd[0],
                           short="AMD GPUs: not supported yet"))
    if gaudi:
        out.append(finding("warn", "gaudi-unsupported", "Gaudi: not supported yet (found hl-smi)",
                           hint="gpu-status reads NVIDIA GPUs only; use `hl-smi` directly for now",
                           short="Gaudi: not supported yet"))
    if not out:
        # A machine that should have GPUs (hosts.yaml gpus: N) and has no driver tools fails.
        level = "fail" if expect_gpus else "warn"
        expected = " on a machine expected to have %s" % count_gpus(expect_gpus) if expect_gpus else ""
        out.append(finding(level, "no-nvidia-tools",
                           "no NVIDIA driver tools found (nvidia-smi, %s)%s" % (NVML_LIBRARY, expected),
                           hint="install the NVIDIA driver; inside a container, start it with the NVIDIA "
                                "runtime (--gpus all) so nvidia-smi and the library are mounted",
                           short="no NVIDIA driver tools found (nvidia-smi, %s)" % NVML_LIBRARY))
    return out


def summarise(data, findings):
    gpus = [g for g in data.get("gpus") or [] if not g.get("error")]
    problems = [f for f in findings if _remote.level_rank(f["level"]) >= 1]
    problems.sort(key=lambda f: -_remote.level_rank(f["level"]))
    notes = [f for f in findings if f["level"] == "info" and f.get("_short")]
    parts = []
    grouped = {}
    for f in problems + notes:
        if f["code"] in GROUP_SHORT and f.get("gpus"):
            grouped.setdefault(f["code"], []).extend(f["gpus"])
    done = set()
    for f in problems + notes:
        code = f["code"]
        if len(set(grouped.get(code, []))) > 1:
            if code not in done:
                done.add(code)
                parts.append(GROUP_SHORT[code] % fmt_indices(grouped[code]))
            continue
        s = f.get("_short") or f["message"]
        if s not in parts:
            parts.append(s)
    shown = "; ".join(parts[:3]) + ("; +%d more" % (len(parts) - 3) if len(parts) > 3 else "")
    if not gpus:
        return shown or "no GPUs found"
    counts = []
    for g in gpus:
        name = g.get("name") or "unknown GPU"
        for c in counts:
            if c[0] == name:
                c[1] += 1
                break
        else:
            counts.append([name, 1])
    head = " + ".join("%d\u00d7 %s" % (n, name) for name, n in counts)
    if data.get("driver_version"):
        head += ", driver %s" % data["driver_version"]
    if problems:
        return "%s: %s" % (head, shown)
    if notes:
        return "%s: healthy; %s" % (head, shown)
    return head + ": all healthy"


# --------------------------------------------------------------------------- entry point


def run(args) -> dict:
    findings = []
    data = {"source": None, "gpu_count": 0, "expected_gpus": args.expect_gpus, "driver_version": None,
            "cuda_version": None, "gpus": [], "lost_gpus": [], "processes": []}

    if args.nvidia_smi:
        smi = args.nvidia_smi if os.path.exists(args.nvidia_smi) else which(args.nvidia_smi)
    else:
        smi = find_tool("nvidia-smi")
    # the live kernel log is read while nvidia-smi answers (each can take a second on a big node)
    live_log = Background(read_kernel_log) if not (args.no_kernel_log or args.kernel_log_file) else None
    if smi:
        facts, findings = collect_nvidia_smi(smi, args.timeout, parse_known(args.known))
        data.update(facts)
    else:
        api, how = load_nvml(args.nvml)
        if api is not None:
            facts, findings = collect_nvml(api, how)
            data.update(facts)
        else:
            data["nvml"] = {"error": how}
            if args.nvidia_smi:
                findings.append(finding("warn", "no-nvidia-tools",
                                        "nvidia-smi not found at %s, and no NVML (%s)" % (args.nvidia_smi, how),
                                        short="nvidia-smi not found at %s" % args.nvidia_smi))
            else:
                findings.extend(no_tools_findings(None, args.expect_gpus))

    if not args.no_kernel_log:
        got = live_log.result() if live_log else read_kernel_log(args.kernel_log_file)
        source = got["source"]
        if source is not None and source.startswith("file:"):
            source = source[len("file:"):]          # gpu-status has always named the file alone
        if source is None:
            data["kernel_log"] = {"source": None, "error": got["error"]}
        else:
            text = got["text"]
            inventory = [{"index": g.get("index"), "pci": g.get("pci_bus_id")}
                         for g in (data.get("gpus") or []) + (data.get("lost_gpus") or [])]
            xids = scan_xids(text, inventory)
            data["kernel_log"] = {"source": source, "xids": xids}
            xm = _remote.load_xid(HERE) if xids else None
            for x in xids:
                what = "Xid %d%s" % (x["xid"], " (%s)" % x["name"] if x["name"] else "")
                f = finding(
                    "fail" if x["fatal"] else "warn", "xid-fatal" if x["fatal"] else "xid",
                    "%s seen %d time%s in the kernel log (%s), last: %s"
                    % (what, x["count"], "" if x["count"] == 1 else "s", ", ".join(x["pci"]), x["last"]),
                    hint=(xm.HINTS.get(x["action"]) if xm else None) or
                    "look the Xid up in NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors)",
                    short="%s in kernel log" % what, gpus=xid_gpus(x["pci"], data))
                f["action"] = x["action"]
                findings.append(f)

    data["gpu_count"] = len(answering(data))
    findings.extend(judge(data, args.expect_gpus, args.expect_idle))
    for f in findings:
        if "action" not in f:
            f["action"] = "drain" if f["code"] == "no-nvidia-tools" and f["level"] == "fail" else \
                CODE_ACTION.get(f["code"], "monitor")
    findings = fold_gpu_findings(findings)
    findings.sort(key=lambda f: -_remote.level_rank(f["level"]))  # worst first, stable within a level
    worst = max([_remote.level_rank(f["level"]) for f in findings] + [0])
    status = {0: "ok", 1: "warn", 2: "fail", 3: "error"}[worst]
    summary = summarise(data, findings)
    for f in findings:
        f.pop("_short", None)
    return {"status": status, "summary": summary, "findings": findings, "data": data}


if __name__ == "__main__":
    result = run(build_parser().parse_args())
    print(json.dumps(result, indent=2))
    sys.exit(_remote.exit_code(result))
