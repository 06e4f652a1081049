"""node-check's DCGM check: ``dcgmi diag -r N -j`` parsed into findings with an action.

Runs on the target, standard library only, Python 3.8+, imported by node_check.py from the
run's private directory (no import of the local package). ``check()`` is the module API of
the node-check contract; ``parse_diag_json()`` and ``diag_findings()`` are the pure parsers the
unit tests drive with recorded outputs.

Run levels and timeouts
-----------------------
NVIDIA's dcgmi-diag reference (docs.nvidia.com/datacenter/dcgm/latest/reference/
command-line-reference/dcgmi/dcgmi-diag.html, "Test selection"): level 1 "quick deployment
checks, normally lasting seconds", level 2 "medium validation, normally lasting approximately
two minutes", level 3 "long hardware diagnostics, normally lasting approximately 15 minutes"
(DCGM 2.x/3.x user guides said 30 minutes), level 4 "extended, longer-running hardware
diagnostics" (older guides: 1-2 hours). The timeout leaves room for DCGM's own start-up (an
embedded host engine, CUDA contexts on 8 GPUs) and for slower or larger machines:

=====  ==============================  =========
level  documented duration             timeout
=====  ==============================  =========
1      seconds                         120 s
2      about 2 minutes                 600 s
3      about 15 min (30 in older docs) 3600 s
4      hours (1-2 h in older docs)     14400 s
=====  ==============================  =========

``timeout_for(level)`` returns it, so the job's own timeout can be raised to match.

Output formats
--------------
Both JSON shapes ``dcgmi diag -j`` has printed are read:

- current (DCGM 3.3+/4.x, dcgmi/Diag.cpp ``HelperJsonBuildOutput``; schema
  testing/python3/dcgm_diag_schema.json): ``{"DCGM Diagnostic": {"test_categories": [{"category",
  "tests": [{"name", "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0,
  "status": "Pass|Fail|Skip", "warnings": [{"warning", "error_id", "error_category",
  "error_severity"}], "info": [...]}], "test_summary": {"status", "warnings"?}}]}],
  "runtime_error"?}, "entity_groups": [...], "metadata": {"version", "Driver Version Detected"}}``.
  Errors not tied to an entity are in ``test_summary.warnings``. In JSON a test that warned shows
  as "Fail" (``HelperDisplayDiagResult`` prints "Warn" only in the table); "Warn" is read too.
- per GPU (DCGM 1.7 - 3.2): ``{"DCGM GPU Diagnostic": {"test_categories": [...{"results":
  [{"gpu_ids": "0,1", "status": "PASS|FAIL|SKIP|WARN", "warnings": [...], "info": [...]}]}],
  "version": "1.7"}}``; warnings are objects with ``error_id`` or, in older releases, strings.

GPU numbers: a finding's ``gpus`` are nvidia-smi indices. DCGM numbers GPUs itself (usually
the same); where the current shape lists each GPU's ``serial_num`` in ``entity_groups`` and every
one matches exactly one GPU of node-check's inventory (option ``gpus``), DCGM's ids are mapped
to the inventory's indices by serial; otherwise they are kept.

Text before the JSON (DCGM 3.x dcgmi diag prints "Error: unable to establish a connection to the
specified host: localhost" and then runs with an embedded host engine) is skipped.

Findings
--------
====================  =====  ======================================================================
code                  level  when
====================  =====  ======================================================================
dcgm-<test>           fail   a test failed on a GPU (one finding per test and message, GPUs folded);
                      warn   ... or warned; action from the DCGM error code (below)
dcgm-absent           info   ``dcgmi`` is not on PATH: install DCGM (action none)
dcgm-no-hostengine    warn   dcgmi could not reach nv-hostengine (action monitor)
dcgm-error            warn   dcgmi ran but reported an error (``runtime_error``, a non-JSON answer)
tool-hung             fail   dcgmi did not answer within ``timeout_for(level)`` (action reboot)
not-checked           info   dcgmi hung earlier in this run, not called again
====================  =====  ======================================================================

Actions
-------
Each warning of a failed test carries ``error_id``: a ``dcgmError_t`` number (DCGM's
dcgmlib/dcgm_errors.h, names in ``FR_NAMES``). The name is looked up in NVIDIA NVSentinel's
DCGM error -> action map (distros/kubernetes/nvsentinel/charts/gpu-health-monitor/files/
dcgmerrorsmapping.csv, Apache-2.0, copied into ``NVSENTINEL_ACTIONS``; the unit tests compare
it with the CSV file) and NVSentinel's action is turned into ours by ``FROM_NVSENTINEL``:
COMPONENT_RESET -> reset-gpu, RESTART_VM and RESTART_BM -> reboot, CONTACT_SUPPORT -> rma,
NONE -> monitor. One deliberate change: NVSentinel's catch-all CONTACT_SUPPORT also covers
codes that describe the node's software or configuration, not its hardware (persistence mode
off, graphics processes, a denylisted driver, a library that cannot be opened, CUDA
environment variables, permissions, the fabric manager not initialised, ...); sending such a
GPU back would be wrong, so those in ``CONFIG_CODES`` map to ``drain`` (fix the node, then
rerun). An unknown code, or a failure without one, is ``drain``. A finding's action is the
worst of its warnings' actions.

Facts: ``dcgm.version`` (from the diag JSON; no second dcgmi call: ``dcgmi -v`` also contacts
the host engine).
"""

import json
import re

from _remote import ACTION_RANK, ACTIONS  # noqa: F401 (ACTIONS: dcgm.ACTIONS, what its table maps to)

CHECK = "dcgm"
TIMEOUTS = {1: 120.0, 2: 600.0, 3: 3600.0, 4: 14400.0}
DEFAULT_LEVEL = 1
INSTALL_HINT = ("install NVIDIA DCGM (package datacenter-gpu-manager, datacenter-gpu-manager-4-* "
                "for DCGM 4) and start its host engine: systemctl enable --now nvidia-dcgm "
                "(nv-hostengine must run)")
HOSTENGINE_HINT = ("start DCGM's host engine (systemctl start nvidia-dcgm, or nv-hostengine) "
                   "and rerun; check `journalctl -u nvidia-dcgm`")
HUNG_HINT = ("dcgmi or nv-hostengine is stuck, often on a GPU in a bad state: check "
             "`systemctl status nvidia-dcgm` and the kernel log for Xid errors")


# dcgmError_t, index = error_id. 0-111: NVIDIA/DCGM dcgmlib/dcgm_errors.h (commit 18b87c71);
# 112-116: NVIDIA/go-dcgm's HealthCheckErrorCode constants (the same enum, later entries).
FR_NAMES = (
    "DCGM_FR_OK", "DCGM_FR_UNKNOWN", "DCGM_FR_UNRECOGNIZED", "DCGM_FR_PCI_REPLAY_RATE",
    "DCGM_FR_VOLATILE_DBE_DETECTED", "DCGM_FR_VOLATILE_SBE_DETECTED",
    "DCGM_FR_PENDING_PAGE_RETIREMENTS", "DCGM_FR_RETIRED_PAGES_LIMIT",
    "DCGM_FR_RETIRED_PAGES_DBE_LIMIT", "DCGM_FR_CORRUPT_INFOROM",
    "DCGM_FR_CLOCK_THROTTLE_THERMAL", "DCGM_FR_POWER_UNREADABLE", "DCGM_FR_CLOCK_THROTTLE_POWER",
    "DCGM_FR_NVLINK_ERROR_THRESHOLD", "DCGM_FR_NVLINK_DOWN", "DCGM_FR_NVSWITCH_FATAL_ERROR",
    "DCGM_FR_NVSWITCH_NON_FATAL_ERROR", "DCGM_FR_NVSWITCH_DOWN", "DCGM_FR_NO_ACCESS_TO_FILE",
    "DCGM_FR_NVML_API", "DCGM_FR_DEVICE_COUNT_MISMATCH", "DCGM_FR_BAD_PARAMETER",
    "DCGM_FR_CANNOT_OPEN_LIB", "DCGM_FR_DENYLISTED_DRIVER", "DCGM_FR_NVML_LIB_BAD",
    "DCGM_FR_GRAPHICS_PROCESSES", "DCGM_FR_HOSTENGINE_CONN", "DCGM_FR_FIELD_QUERY",
    "DCGM_FR_BAD_CUDA_ENV", "DCGM_FR_PERSISTENCE_MODE", "DCGM_FR_LOW_BANDWIDTH",
    "DCGM_FR_HIGH_LATENCY", "DCGM_FR_CANNOT_GET_FIELD_TAG", "DCGM_FR_FIELD_VIOLATION",
    "DCGM_FR_FIELD_THRESHOLD", "DCGM_FR_FIELD_VIOLATION_DBL", "DCGM_FR_FIELD_THRESHOLD_DBL",
    "DCGM_FR_UNSUPPORTED_FIELD_TYPE", "DCGM_FR_FIELD_THRESHOLD_TS",
    "DCGM_FR_FIELD_THRESHOLD_TS_DBL", "DCGM_FR_THERMAL_VIOLATIONS",
    "DCGM_FR_THERMAL_VIOLATIONS_TS", "DCGM_FR_TEMP_VIOLATION", "DCGM_FR_THROTTLING_VIOLATION",
    "DCGM_FR_INTERNAL", "DCGM_FR_PCIE_GENERATION", "DCGM_FR_PCIE_WIDTH", "DCGM_FR_ABORTED",
    "DCGM_FR_TEST_DISABLED", "DCGM_FR_CANNOT_GET_STAT", "DCGM_FR_STRESS_LEVEL",
    "DCGM_FR_CUDA_API", "DCGM_FR_FAULTY_MEMORY", "DCGM_FR_CANNOT_SET_WATCHES",
    "DCGM_FR_CUDA_UNBOUND", "DCGM_FR_ECC_DISABLED", "DCGM_FR_MEMORY_ALLOC", "DCGM_FR_CUDA_DBE",
    "DCGM_FR_MEMORY_MISMATCH", "DCGM_FR_CUDA_DEVICE", "DCGM_FR_ECC_UNSUPPORTED",
    "DCGM_FR_ECC_PENDING", "DCGM_FR_MEMORY_BANDWIDTH", "DCGM_FR_TARGET_POWER",
    "DCGM_FR_API_FAIL", "DCGM_FR_API_FAIL_GPU", "DCGM_FR_CUDA_CONTEXT", "DCGM_FR_DCGM_API",
    "DCGM_FR_CONCURRENT_GPUS", "DCGM_FR_TOO_MANY_ERRORS", "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD",
    "DCGM_FR_NVLINK_ERROR_CRITICAL", "DCGM_FR_ENFORCED_POWER_LIMIT", "DCGM_FR_MEMORY_ALLOC_HOST",
    "DCGM_FR_GPU_OP_MODE", "DCGM_FR_NO_MEMORY_CLOCKS", "DCGM_FR_NO_GRAPHICS_CLOCKS",
    "DCGM_FR_HAD_TO_RESTORE_STATE", "DCGM_FR_L1TAG_UNSUPPORTED", "DCGM_FR_L1TAG_MISCOMPARE",
    "DCGM_FR_ROW_REMAP_FAILURE", "DCGM_FR_UNCONTAINED_ERROR", "DCGM_FR_EMPTY_GPU_LIST",
    "DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS", "DCGM_FR_UNCORRECTABLE_ROW_REMAP",
    "DCGM_FR_PENDING_ROW_REMAP", "DCGM_FR_BROKEN_P2P_MEMORY_DEVICE",
    "DCGM_FR_BROKEN_P2P_WRITER_DEVICE", "DCGM_FR_NVSWITCH_NVLINK_DOWN",
    "DCGM_FR_EUD_BINARY_PERMISSIONS", "DCGM_FR_EUD_NON_ROOT_USER", "DCGM_FR_EUD_SPAWN_FAILURE",
    "DCGM_FR_EUD_TIMEOUT", "DCGM_FR_EUD_ZOMBIE", "DCGM_FR_EUD_NON_ZERO_EXIT_CODE",
    "DCGM_FR_EUD_TEST_FAILED", "DCGM_FR_FILE_CREATE_PERMISSIONS", "DCGM_FR_PAUSE_RESUME_FAILED",
    "DCGM_FR_PCIE_H_REPLAY_VIOLATION", "DCGM_FR_GPU_EXPECTED_NVLINKS_UP",
    "DCGM_FR_NVSWITCH_EXPECTED_NVLINKS_UP", "DCGM_FR_XID_ERROR", "DCGM_FR_SBE_VIOLATION",
    "DCGM_FR_DBE_VIOLATION", "DCGM_FR_PCIE_REPLAY_VIOLATION", "DCGM_FR_SBE_THRESHOLD_VIOLATION",
    "DCGM_FR_DBE_THRESHOLD_VIOLATION", "DCGM_FR_PCIE_REPLAY_THRESHOLD_VIOLATION",
    "DCGM_FR_CUDA_FM_NOT_INITIALIZED", "DCGM_FR_SXID_ERROR", "DCGM_FR_GFLOPS_THRESHOLD_VIOLATION",
    "DCGM_FR_NAN_VALUE", "DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR",
    "DCGM_FR_BROKEN_P2P_PCIE_MEMORY_DEVICE", "DCGM_FR_BROKEN_P2P_PCIE_WRITER_DEVICE",
    "DCGM_FR_BROKEN_P2P_NVLINK_MEMORY_DEVICE", "DCGM_FR_BROKEN_P2P_NVLINK_WRITER_DEVICE",
)

# NVIDIA NVSentinel, distros/kubernetes/nvsentinel/charts/gpu-health-monitor/files/
# dcgmerrorsmapping.csv at 798f0b12 (Apache License 2.0): DCGM error -> NVSentinel action.
NVSENTINEL_ACTIONS = {
    "DCGM_FR_UNKNOWN": "CONTACT_SUPPORT", "DCGM_FR_UNRECOGNIZED": "CONTACT_SUPPORT",
    "DCGM_FR_PCI_REPLAY_RATE": "CONTACT_SUPPORT", "DCGM_FR_VOLATILE_DBE_DETECTED": "COMPONENT_RESET",
    "DCGM_FR_VOLATILE_SBE_DETECTED": "NONE", "DCGM_FR_PENDING_PAGE_RETIREMENTS": "NONE",
    "DCGM_FR_RETIRED_PAGES_LIMIT": "CONTACT_SUPPORT",
    "DCGM_FR_RETIRED_PAGES_DBE_LIMIT": "CONTACT_SUPPORT",
    "DCGM_FR_CORRUPT_INFOROM": "COMPONENT_RESET", "DCGM_FR_CLOCKS_EVENT_THERMAL": "CONTACT_SUPPORT",
    "DCGM_FR_CLOCK_THROTTLE_THERMAL": "NONE", "DCGM_FR_POWER_UNREADABLE": "RESTART_VM",
    "DCGM_FR_CLOCKS_EVENT_POWER": "NONE", "DCGM_FR_CLOCK_THROTTLE_POWER": "NONE",
    "DCGM_FR_NVLINK_ERROR_THRESHOLD": "NONE", "DCGM_FR_NVLINK_DOWN": "RESTART_VM",
    "DCGM_FR_NVSWITCH_FATAL_ERROR": "CONTACT_SUPPORT", "DCGM_FR_NVSWITCH_NON_FATAL_ERROR": "NONE",
    "DCGM_FR_NVSWITCH_DOWN": "COMPONENT_RESET", "DCGM_FR_NO_ACCESS_TO_FILE": "CONTACT_SUPPORT",
    "DCGM_FR_NVML_API": "CONTACT_SUPPORT", "DCGM_FR_DEVICE_COUNT_MISMATCH": "CONTACT_SUPPORT",
    "DCGM_FR_BAD_PARAMETER": "CONTACT_SUPPORT", "DCGM_FR_CANNOT_OPEN_LIB": "CONTACT_SUPPORT",
    "DCGM_FR_DENYLISTED_DRIVER": "CONTACT_SUPPORT", "DCGM_FR_NVML_LIB_BAD": "CONTACT_SUPPORT",
    "DCGM_FR_GRAPHICS_PROCESSES": "CONTACT_SUPPORT", "DCGM_FR_HOSTENGINE_CONN": "CONTACT_SUPPORT",
    "DCGM_FR_FIELD_QUERY": "RESTART_VM", "DCGM_FR_BAD_CUDA_ENV": "CONTACT_SUPPORT",
    "DCGM_FR_PERSISTENCE_MODE": "CONTACT_SUPPORT", "DCGM_FR_LOW_BANDWIDTH": "CONTACT_SUPPORT",
    "DCGM_FR_HIGH_LATENCY": "CONTACT_SUPPORT", "DCGM_FR_CANNOT_GET_FIELD_TAG": "CONTACT_SUPPORT",
    "DCGM_FR_FIELD_VIOLATION": "RESTART_VM", "DCGM_FR_FIELD_THRESHOLD": "RESTART_VM",
    "DCGM_FR_FIELD_VIOLATION_DBL": "RESTART_VM", "DCGM_FR_FIELD_THRESHOLD_DBL": "RESTART_VM",
    "DCGM_FR_UNSUPPORTED_FIELD_TYPE": "RESTART_VM", "DCGM_FR_FIELD_THRESHOLD_TS": "RESTART_VM",
    "DCGM_FR_FIELD_THRESHOLD_TS_DBL": "RESTART_VM", "DCGM_FR_THERMAL_VIOLATIONS": "CONTACT_SUPPORT",
    "DCGM_FR_THERMAL_VIOLATIONS_TS": "CONTACT_SUPPORT", "DCGM_FR_TEMP_VIOLATION": "CONTACT_SUPPORT",
    "DCGM_FR_CLOCKS_EVENT_VIOLATION": "RESTART_VM", "DCGM_FR_THROTTLING_VIOLATION": "RESTART_VM",
    "DCGM_FR_INTERNAL": "CONTACT_SUPPORT", "DCGM_FR_PCIE_GENERATION": "CONTACT_SUPPORT",
    "DCGM_FR_PCIE_WIDTH": "CONTACT_SUPPORT", "DCGM_FR_ABORTED": "NONE",
    "DCGM_FR_TEST_DISABLED": "NONE", "DCGM_FR_CANNOT_GET_STAT": "CONTACT_SUPPORT",
    "DCGM_FR_STRESS_LEVEL": "RESTART_VM", "DCGM_FR_CUDA_API": "CONTACT_SUPPORT",
    "DCGM_FR_FAULTY_MEMORY": "CONTACT_SUPPORT", "DCGM_FR_CANNOT_SET_WATCHES": "RESTART_VM",
    "DCGM_FR_CUDA_UNBOUND": "RESTART_VM", "DCGM_FR_ECC_DISABLED": "CONTACT_SUPPORT",
    "DCGM_FR_MEMORY_ALLOC": "RESTART_VM", "DCGM_FR_CUDA_DBE": "CONTACT_SUPPORT",
    "DCGM_FR_MEMORY_MISMATCH": "CONTACT_SUPPORT", "DCGM_FR_CUDA_DEVICE": "CONTACT_SUPPORT",
    "DCGM_FR_ECC_UNSUPPORTED": "CONTACT_SUPPORT", "DCGM_FR_ECC_PENDING": "RESTART_VM",
    "DCGM_FR_MEMORY_BANDWIDTH": "RESTART_VM", "DCGM_FR_TARGET_POWER": "NONE",
    "DCGM_FR_API_FAIL": "RESTART_VM", "DCGM_FR_API_FAIL_GPU": "RESTART_VM",
    "DCGM_FR_CUDA_CONTEXT": "CONTACT_SUPPORT", "DCGM_FR_DCGM_API": "CONTACT_SUPPORT",
    "DCGM_FR_CONCURRENT_GPUS": "CONTACT_SUPPORT", "DCGM_FR_TOO_MANY_ERRORS": "CONTACT_SUPPORT",
    "DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD": "CONTACT_SUPPORT",
    "DCGM_FR_NVLINK_ERROR_CRITICAL": "CONTACT_SUPPORT",
    "DCGM_FR_ENFORCED_POWER_LIMIT": "CONTACT_SUPPORT", "DCGM_FR_MEMORY_ALLOC_HOST": "RESTART_VM",
    "DCGM_FR_GPU_OP_MODE": "CONTACT_SUPPORT", "DCGM_FR_NO_MEMORY_CLOCKS": "CONTACT_SUPPORT",
    "DCGM_FR_NO_GRAPHICS_CLOCKS": "NONE", "DCGM_FR_HAD_TO_RESTORE_STATE": "RESTART_VM",
    "DCGM_FR_L1TAG_UNSUPPORTED": "CONTACT_SUPPORT", "DCGM_FR_L1TAG_MISCOMPARE": "CONTACT_SUPPORT",
    "DCGM_FR_ROW_REMAP_FAILURE": "CONTACT_SUPPORT", "DCGM_FR_UNCONTAINED_ERROR": "RESTART_VM",
    "DCGM_FR_EMPTY_GPU_LIST": "CONTACT_SUPPORT",
    "DCGM_FR_DBE_PENDING_PAGE_RETIREMENTS": "RESTART_VM",
    "DCGM_FR_UNCORRECTABLE_ROW_REMAP": "NONE", "DCGM_FR_PENDING_ROW_REMAP": "COMPONENT_RESET",
    "DCGM_FR_BROKEN_P2P_MEMORY_DEVICE": "CONTACT_SUPPORT",
    "DCGM_FR_BROKEN_P2P_WRITER_DEVICE": "CONTACT_SUPPORT",
    "DCGM_FR_NVSWITCH_NVLINK_DOWN": "CONTACT_SUPPORT",
    "DCGM_FR_EUD_BINARY_PERMISSIONS": "CONTACT_SUPPORT",
    "DCGM_FR_EUD_NON_ROOT_USER": "CONTACT_SUPPORT", "DCGM_FR_EUD_SPAWN_FAILURE": "CONTACT_SUPPORT",
    "DCGM_FR_EUD_TIMEOUT": "CONTACT_SUPPORT", "DCGM_FR_EUD_ZOMBIE": "CONTACT_SUPPORT",
    "DCGM_FR_EUD_NON_ZERO_EXIT_CODE": "CONTACT_SUPPORT",
    "DCGM_FR_EUD_TEST_FAILED": "CONTACT_SUPPORT",
    "DCGM_FR_FILE_CREATE_PERMISSIONS": "CONTACT_SUPPORT",
    "DCGM_FR_PAUSE_RESUME_FAILED": "CONTACT_SUPPORT",
    "DCGM_FR_PCIE_H_REPLAY_VIOLATION": "CONTACT_SUPPORT",
    "DCGM_FR_GPU_EXPECTED_NVLINKS_UP": "CONTACT_SUPPORT",
    "DCGM_FR_NVSWITCH_EXPECTED_NVLINKS_UP": "CONTACT_SUPPORT", "DCGM_FR_XID_ERROR": "NONE",
    "DCGM_FR_SBE_VIOLATION": "CONTACT_SUPPORT", "DCGM_FR_DBE_VIOLATION": "CONTACT_SUPPORT",
    "DCGM_FR_PCIE_REPLAY_VIOLATION": "CONTACT_SUPPORT",
    "DCGM_FR_SBE_THRESHOLD_VIOLATION": "CONTACT_SUPPORT",
    "DCGM_FR_DBE_THRESHOLD_VIOLATION": "CONTACT_SUPPORT",
    "DCGM_FR_PCIE_REPLAY_THRESHOLD_VIOLATION": "CONTACT_SUPPORT",
    "DCGM_FR_CUDA_FM_NOT_INITIALIZED": "CONTACT_SUPPORT", "DCGM_FR_SXID_ERROR": "RESTART_VM",
    "DCGM_FR_GFLOPS_THRESHOLD_VIOLATION": "CONTACT_SUPPORT", "DCGM_FR_NAN_VALUE": "CONTACT_SUPPORT",
    "DCGM_FR_FABRIC_MANAGER_TRAINING_ERROR": "CONTACT_SUPPORT",
    "DCGM_FR_BROKEN_P2P_PCIE_MEMORY_DEVICE": "CONTACT_SUPPORT",
    "DCGM_FR_BROKEN_P2P_PCIE_WRITER_DEVICE": "CONTACT_SUPPORT",
    "DCGM_FR_BROKEN_P2P_NVLINK_MEMORY_DEVICE": "CONTACT_SUPPORT",
    "DCGM_FR_BROKEN_P2P_NVLINK_WRITER_DEVICE": "CONTACT_SUPPORT", "DCGM_FR_TEST_SKIPPED": "NONE",
    "DCGM_FR_SRAM_THRESHOLD": "CONTACT_SUPPORT",
    "DCGM_FR_NVLINK_EFFECTIVE_BER_THRESHOLD": "CONTACT_SUPPORT",
    "DCGM_FR_FALLEN_OFF_BUS": "RESTART_BM", "DCGM_FR_NVLINK_SYMBOL_BER_THRESHOLD": "CONTACT_SUPPORT",
    "DCGM_FR_IMEX_UNHEALTHY": "CONTACT_SUPPORT", "DCGM_FR_FABRIC_PROBE_STATE": "CONTACT_SUPPORT",
    "DCGM_FR_BINARY_PERMISSIONS": "CONTACT_SUPPORT", "DCGM_FR_GPU_RECOVERY_RESET": "COMPONENT_RESET",
    "DCGM_FR_GPU_RECOVERY_REBOOT": "RESTART_BM", "DCGM_FR_GPU_RECOVERY_DRAIN_P2P": "CONTACT_SUPPORT",
    "DCGM_FR_GPU_RECOVERY_DRAIN_RESET": "COMPONENT_RESET", "DCGM_FR_NCCL_ERROR": "COMPONENT_RESET",
    "DCGM_FR_ERROR_SENTINEL": "NONE", "GPU_TEMP_HW_SLOWDOWN_VIOLATION": "CONTACT_SUPPORT",
}

FROM_NVSENTINEL = {"COMPONENT_RESET": "reset-gpu", "RESTART_VM": "reboot", "RESTART_BM": "reboot",
                   "CONTACT_SUPPORT": "rma", "NONE": "monitor"}

# The node's software or configuration, not its hardware: NVSentinel says CONTACT_SUPPORT, we
# say drain (fix the node, rerun the diagnostic) -- never rma.
CONFIG_CODES = frozenset((
    "DCGM_FR_NO_ACCESS_TO_FILE", "DCGM_FR_BAD_PARAMETER", "DCGM_FR_CANNOT_OPEN_LIB",
    "DCGM_FR_DENYLISTED_DRIVER", "DCGM_FR_NVML_LIB_BAD", "DCGM_FR_GRAPHICS_PROCESSES",
    "DCGM_FR_HOSTENGINE_CONN", "DCGM_FR_BAD_CUDA_ENV", "DCGM_FR_PERSISTENCE_MODE",
    "DCGM_FR_CONCURRENT_GPUS", "DCGM_FR_EUD_BINARY_PERMISSIONS", "DCGM_FR_EUD_NON_ROOT_USER",
    "DCGM_FR_FILE_CREATE_PERMISSIONS", "DCGM_FR_CUDA_FM_NOT_INITIALIZED",
    "DCGM_FR_BINARY_PERMISSIONS", "DCGM_FR_ECC_DISABLED",
))
FALLBACK_ACTION = "drain"

_STATUSES = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip"}
_GPU_WORD = re.compile(r"\bGPU (\d+)\b")
_CONNECTION = re.compile(r"unable to (establish a connection|connect to host engine|start an "
                         r"embedded host engine)|host engine connection invalid", re.I)


def timeout_for(level) -> float:
    """Seconds to let ``dcgmi diag -r LEVEL`` run (see the module docstring's table)."""
    return TIMEOUTS.get(int(level or DEFAULT_LEVEL), TIMEOUTS[max(TIMEOUTS)])


def worst_action(actions) -> str:
    worst = "none"
    for a in actions:
        if ACTION_RANK.get(a, ACTION_RANK[FALLBACK_ACTION]) > ACTION_RANK[worst]:
            worst = a if a in ACTION_RANK else FALLBACK_ACTION
    return worst


def fr_name(error_id):
    """``DCGM_FR_*`` name of a ``dcgmError_t`` number, or None (not a known number)."""
    if isinstance(error_id, bool) or not isinstance(error_id, int):
        return None
    return FR_NAMES[error_id] if 0 <= error_id < len(FR_NAMES) else None


def action_for(code) -> str:
    """Our action for a ``DCGM_FR_*`` name (None: no code given)."""
    if code in CONFIG_CODES:
        return "drain"
    return FROM_NVSENTINEL.get(NVSENTINEL_ACTIONS.get(code), FALLBACK_ACTION)


def _one_line(text) -> str:
    return " ".join(str(text).split())


def _warning(w) -> dict:
    if isinstance(w, dict):
        error_id = w.get("error_id")
        return {"text": _one_line(w.get("warning", "")), "error_id": error_id,
                "code": fr_name(error_id)}
    return {"text": _one_line(w), "error_id": None, "code": None}


def _gpu_ids(text) -> list:
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return out


def _extract_json(text: str):
    """The JSON object in dcgmi's stdout, skipping any text printed before it."""
    decoder = json.JSONDecoder()
    pos = text.find("{")
    while pos != -1:
        try:
            obj, _ = decoder.raw_decode(text, pos)
        except ValueError:
            pos = text.find("{", pos + 1)
            continue
        if isinstance(obj, dict):
            return obj
        pos = text.find("{", pos + 1)
    return None


def parse_diag_json(text: str) -> dict:
    """Parse ``dcgmi diag -j`` output (either shape) into a flat list of results.

    Returns ``{"format": "current"|"per-gpu", "version": str|None, "runtime_error": str|None,
    "serials": {DCGM GPU id: serial}, "results": [{"category", "test", "status":
    "pass|fail|warn|skip|<other>", "entity": "GPU"|other|None, "gpus": [int]|None,
    "entities": [int], "warnings": [{"text", "error_id", "code"}], "info": [str]}]}``;
    ``gpus`` is None for a result about no GPU (a test-wide error in ``test_summary``).
    Raises ValueError when there is no diag JSON.
    """
    doc = _extract_json(text or "")
    if doc is None:
        raise ValueError("no JSON object in dcgmi's output")
    if isinstance(doc.get("DCGM Diagnostic"), dict):
        fmt, body = "current", doc["DCGM Diagnostic"]
        meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        version = meta.get("version") or body.get("version")
    elif isinstance(doc.get("DCGM GPU Diagnostic"), dict):
        fmt, body = "per-gpu", doc["DCGM GPU Diagnostic"]
        version = body.get("version")
    else:
        raise ValueError("JSON without a 'DCGM Diagnostic' or 'DCGM GPU Diagnostic' object")
    out = {"format": fmt, "version": str(version) if version not in (None, "") else None,
           "runtime_error": _one_line(body["runtime_error"]) if body.get("runtime_error") else None,
           "serials": _gpu_serials(doc), "results": []}
    for category in body.get("test_categories") or []:
        if not isinstance(category, dict):
            continue
        for test in category.get("tests") or []:
            if not isinstance(test, dict):
                continue
            name = str(test.get("name", "?"))
            for r in test.get("results") or []:
                if isinstance(r, dict):
                    out["results"].append(_result(category.get("category"), name, r, fmt))
            summary = test.get("test_summary")
            if isinstance(summary, dict) and summary.get("warnings"):
                # Errors tied to no entity: the summary also repeats the entity ones, so keep
                # only those whose text no entity result carries.
                seen = {w["text"] for e in out["results"] if e["test"] == name
                        for w in e["warnings"]}
                extra = [w for w in map(_warning, summary["warnings"]) if w["text"] not in seen]
                if extra:
                    out["results"].append({
                        "category": category.get("category"), "test": name,
                        "status": _STATUSES.get(str(summary.get("status", "")).lower(), "fail"),
                        "entity": None, "gpus": None, "entities": [], "warnings": extra,
                        "info": []})
    return out


def _gpu_serials(doc) -> dict:
    """{DCGM GPU id: serial} from the current shape's ``entity_groups`` (empty otherwise)."""
    serials = {}
    for group in doc.get("entity_groups") or []:
        if isinstance(group, dict) and group.get("entity_group") == "GPU":
            for e in group.get("entities") or []:
                if isinstance(e, dict) and isinstance(e.get("entity_id"), int) and e.get("serial_num"):
                    serials[e["entity_id"]] = str(e["serial_num"])
    return serials


def gpu_index_map(parsed: dict, gpus) -> dict:
    """{DCGM GPU id: nvidia-smi index}, matched by serial number, when every GPU DCGM names
    matches exactly one inventory GPU; else {} (DCGM's ids are kept: usually the same)."""
    by_serial = {}
    for g in gpus or []:
        serial = str(g.get("serial") or "").strip()
        if serial and serial not in ("[N/A]", "N/A", "0"):
            by_serial.setdefault(serial, []).append(g.get("index"))
    mapping = {}
    for dcgm_id, serial in parsed.get("serials", {}).items():
        found = by_serial.get(serial, [])
        if len(found) != 1 or not isinstance(found[0], int):
            return {}
        mapping[dcgm_id] = found[0]
    return mapping if len(set(mapping.values())) == len(mapping) else {}


def renumber(parsed: dict, mapping: dict) -> dict:
    """``parsed`` with DCGM GPU ids turned into nvidia-smi indices (``gpu_index_map``)."""
    if not mapping:
        return parsed
    results = [dict(r, gpus=[mapping.get(g, g) for g in r["gpus"]], dcgm_gpus=r["gpus"])
               if r["gpus"] else r for r in parsed["results"]]
    return dict(parsed, results=results)


def _result(category, test, r, fmt) -> dict:
    status = str(r.get("status", "")).strip().lower()
    if fmt == "per-gpu":
        entity, ids = "GPU", _gpu_ids(r.get("gpu_ids", ""))
    else:
        entity = r.get("entity_group")
        ids = [r["entity_id"]] if isinstance(r.get("entity_id"), int) else []
    return {"category": category, "test": test, "status": _STATUSES.get(status, status),
            "entity": entity, "gpus": ids if entity == "GPU" else None,
            "entities": ids, "warnings": [_warning(w) for w in r.get("warnings") or []],
            "info": [_one_line(i) for i in r.get("info") or []]}


def _gpu_label(gpus) -> str:
    gpus = sorted(set(gpus))
    if len(gpus) == 1:
        return f"GPU {gpus[0]}"
    spans, start, prev = [], gpus[0], gpus[0]
    for g in gpus[1:] + [None]:
        if g is not None and g == prev + 1:
            prev = g
            continue
        spans.append(f"{start}-{prev}" if prev > start + 1 else
                     (f"{start},{prev}" if prev == start + 1 else f"{start}"))
        if g is not None:
            start = prev = g
    return "GPUs " + ",".join(spans)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "test"


def diag_findings(parsed: dict, level=DEFAULT_LEVEL) -> list:
    """Findings for the failed and warned tests of a parsed diag run (see module docstring).

    One finding per test and message: results whose warnings read the same once "GPU <n>" is
    taken out (and whose codes and action agree) are folded into one finding listing the GPUs.
    """
    command = f"dcgmi diag -r {int(level or DEFAULT_LEVEL)}"
    groups = {}                                    # fold key -> [result, gpus, DCGM's ids]
    for r in parsed["results"]:
        if r["status"] not in ("fail", "warn"):
            continue
        warnings = r["warnings"] or [{"text": "", "error_id": None, "code": None}]
        texts = tuple(w["text"] for w in warnings if w["text"])
        codes = tuple(sorted({w["code"] for w in warnings if w["code"]}))
        action = worst_action(action_for(w["code"]) for w in warnings)
        others = r["entities"] if r["gpus"] is None else ()
        key = (r["test"], r["status"], tuple(_GPU_WORD.sub("GPU", t) for t in texts), codes,
               action, r["entity"] if others else None, tuple(others), r["gpus"] is None)
        group = groups.setdefault(key, [dict(r, texts=texts, codes=codes, action=action), [], []])
        for g, d in zip(r["gpus"] or [], r.get("dcgm_gpus") or r["gpus"] or []):
            if g not in group[1]:
                group[1].append(g)
                group[2].append(d)
    findings = []
    for (_, _, norm, _, _, entity, others, _), (r, gpus, dcgm_ids) in groups.items():
        gpus, dcgm_ids = sorted(gpus), sorted(dcgm_ids)
        if gpus:
            where = f" on {_gpu_label(gpus)}"
            if dcgm_ids != gpus:
                where += f" (DCGM's {_gpu_label(dcgm_ids)})"
        else:
            where = f" on {entity} {','.join(map(str, others))}" if others else ""
        body = "; ".join(r["texts"] if len(gpus) <= 1 else norm) or "no reason given"
        codes = f" ({', '.join(r['codes'])})" if r["codes"] else ""
        verb = "failed" if r["status"] == "fail" else "warned"
        f = {"level": r["status"], "code": f"dcgm-{_slug(r['test'])}",
             "message": f"{command}: {r['test']} {verb}{where}: {body}{codes}",
             "action": r["action"], "check": CHECK}
        if gpus:
            f["gpus"] = gpus
        findings.append(f)
    return findings


def _finding(level, code, message, action, hint=None) -> dict:
    f = {"level": level, "code": code, "message": message, "action": action, "check": CHECK}
    if hint:
        f["hint"] = hint
    return f


def _first_line(*texts) -> str:
    for t in texts:
        for line in (t or "").splitlines():
            if line.strip():
                return _one_line(line)
    return ""


def check(expect, run_tool, dcgm_level=None, **options) -> dict:
    """Run ``dcgmi diag -r LEVEL -j`` through ``run_tool`` and turn it into findings and facts."""
    level = int(dcgm_level or DEFAULT_LEVEL)
    argv = ["dcgmi", "diag", "-r", str(level), "-j"]
    shown = " ".join(argv)
    timeout = timeout_for(level)
    tool = run_tool(argv, timeout)
    if tool.status == "missing":
        return {"findings": [_finding("info", "dcgm-absent",
                                      "dcgmi not found: DCGM diagnostics not run",
                                      "none", INSTALL_HINT)], "facts": {}}
    if tool.status == "skipped":
        return {"findings": [_finding("info", "not-checked",
                                      "not checked: dcgmi hung earlier in this run", "none")],
                "facts": {}}
    if tool.status == "timeout":
        return {"findings": [_finding("fail", "tool-hung",
                                      f"`{shown}` did not answer within {timeout:g} s",
                                      "reboot", HUNG_HINT)], "facts": {}}
    out, err = tool.out or "", tool.err or ""
    try:
        parsed = parse_diag_json(out)
    except ValueError:
        parsed = None
    if parsed is None:
        text = _first_line(out, err) or "no output"
        if _CONNECTION.search(out + "\n" + err):
            line = next((_one_line(l) for l in (out + "\n" + err).splitlines()
                         if _CONNECTION.search(l)), text)
            return {"findings": [_finding("warn", "dcgm-no-hostengine",
                                          f"`{shown}`: {line} (exit {tool.rc})",
                                          "monitor", HOSTENGINE_HINT)], "facts": {}}
        return {"findings": [_finding("warn", "dcgm-error",
                                      f"`{shown}` gave no diagnostic JSON (exit {tool.rc}): {text}",
                                      "monitor")], "facts": {}}
    findings = diag_findings(renumber(parsed, gpu_index_map(parsed, options.get("gpus"))), level)
    if parsed["runtime_error"]:
        hint = HOSTENGINE_HINT if _CONNECTION.search(parsed["runtime_error"]) else None
        findings.append(_finding("warn", "dcgm-error",
                                 f"`{shown}`: {parsed['runtime_error']}", "monitor", hint))
    facts = {"dcgm.version": parsed["version"]} if parsed["version"] else {}
    return {"findings": findings, "facts": facts}
