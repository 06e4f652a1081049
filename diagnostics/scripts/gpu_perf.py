#!/usr/bin/env python3
"""gpu-perf: each GPU of a node measured under load, against its model's figures and its peers.

node-check reads what a node reports; a GPU that throttles only under load, an HBM stack that
lost bandwidth, a PCIe link that trained slow but still says nothing are found only by making
the GPU work. This runs the work and judges what it measured:

- ``gemm_<dtype>``: dense matrix multiply throughput (TFLOPS: 2·n³ per product), bf16, fp16,
  tf32 and, where the GPU has it, fp8 (``torch._scaled_mm``); on a node without a GPU, the
  CPU's fp32 and bf16 (the same code: the lab measures it for real);
- ``hbm``: device memory bandwidth, a tensor copied on the device (GB/s, 10⁹ bytes, read and
  written counted: 2 × size per copy, as STREAM's copy counts);
- ``h2d`` / ``d2h``: host↔device bandwidth per GPU over pinned memory (GB/s, the bytes moved),
  one GPU at a time (GPUs share PCIe switches: measured together they would measure the switch);
- ``nvbandwidth``: NVIDIA's nvbandwidth, where installed (``--nvbandwidth PATH`` or on PATH),
  its host↔device copy-engine tests parsed by nvbandwidth.py (full tier).
GEMM and HBM run on every GPU at once, as DCGM's stress tests do: a node that throttles when all
its GPUs draw power shows it then.

Tiers, named by the time they may take (``--tier``; ``--budget`` lowers it):

========  ======  =====================================  ====================
tier      budget  tests                                  each measurement
========  ======  =====================================  ====================
quick     30 s    gemm (bf16; fp32 on a CPU), hbm        up to 1 s
standard  120 s   gemm (every dtype), hbm, h2d, d2h      up to 4 s
full      900 s   standard's, and nvbandwidth            up to 20 s
========  ======  =====================================  ====================

The plan is sized to the budget before anything runs (``plan()``: the time each measurement
gets shrinks until every one fits, with ``STARTUP_S`` kept for torch's import and the GPUs'
start); the measuring is done by a child process (this file, ``--worker``) that writes one JSON
line per measurement, and the child is killed at the budget: what it measured by then is
judged, what it did not is ``budget-spent``. ``dcgmi diag -r 3`` is node-check's
(``--dcgm-level 3``): the qualify runbook runs it in the full tier.

Judged per GPU (``judge()``, pure), the first figure that applies:
1. hosts.yaml ``expect: {gemm_tflops, hbm_gbps, h2d_gbps}`` (bf16 GEMM; d2h with h2d's figure);
2. the GPU model's row in ``gpu_perf_figures.json`` (its sources are in it): ``hbm_gbps_min``,
   ``h2d_gbps_min``, ``d2h_gbps_min``; GEMM below ``GEMM_PEAK_FRACTION`` of the datasheet's
   dense peak for the dtype;
and, with or without a figure, against the node's other GPUs: a GPU below ``--peer-pct``
(default 85) % of the median of the GPUs measured alike is ``below-peers``. A slow GPU is a
fail whose action is drain: it makes every job on the node as slow as it is.

Standard library at import, Python 3.8+; torch only in the child. Run by hand:
``python3 gpu_perf.py --tier quick`` prints the result as JSON.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import _remote

TIERS = {
    "quick": {"budget": 30.0, "slice": 1.0, "tests": ("gemm", "hbm")},
    "standard": {"budget": 120.0, "slice": 4.0, "tests": ("gemm", "hbm", "h2d", "d2h")},
    "full": {"budget": 900.0, "slice": 20.0, "tests": ("gemm", "hbm", "h2d", "d2h", "nvbandwidth")},
}
STARTUP_S = 10.0           # a CUDA context and the first kernels on each of 8 GPUs, kept aside
MIN_SLICE_S = 0.2
GEMM_DTYPES = {"quick": ("bf16",), "standard": ("bf16", "fp16", "tf32", "fp8"),
               "full": ("bf16", "fp16", "tf32", "fp8")}
CPU_DTYPES = {"quick": ("fp32",), "standard": ("fp32", "bf16"), "full": ("fp32", "bf16")}
GEMM_PEAK_FRACTION = 0.5   # cuBLAS reaches 65-80 % of the dense peak at n=8192; below half is broken
DEFAULT_PEER_PCT = 85
UNITS = {"gemm": "TFLOPS", "hbm": "GB/s", "h2d": "GB/s", "d2h": "GB/s"}
HINT = ("a GPU slower under load than it should be: look for throttling (mldiag gpu-status: "
        "clocks_event_reasons), its PCIe link and power (mldiag node-check), then drain it")


def build_parser():
    p = argparse.ArgumentParser(prog="gpu_perf.py", description="Each GPU measured under load.")
    p.add_argument("--tier", choices=sorted(TIERS), default="quick")
    p.add_argument("--budget", type=float, default=None, help="seconds (default: the tier's)")
    p.add_argument("--peer-pct", type=float, default=DEFAULT_PEER_PCT)
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--nvbandwidth", default=None, help="the nvbandwidth binary (default: on PATH)")
    p.add_argument("--expect-gemm", type=float, default=None, help="bf16 GEMM TFLOPS per GPU")
    p.add_argument("--expect-hbm", type=float, default=None, help="device copy GB/s per GPU")
    p.add_argument("--expect-h2d", type=float, default=None, help="host<->device GB/s per GPU")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)   # the plan, as JSON
    return p


# --------------------------------------------------------------------------- the plan

def plan(tier, budget, gpus, cuda):
    """What to measure and for how long each, fitting ``budget`` seconds: {"tier", "budget",
    "slice", "gemm": [dtypes], "tests": [...], "device": "cuda"|"cpu", "gpus": n}. The parallel
    phases (GEMM per dtype, HBM) cost one slice each; h2d and d2h one slice per GPU each, a
    quarter slice long; nvbandwidth whatever is left."""
    spec = TIERS[tier]
    budget = min(float(budget or spec["budget"]), spec["budget"])
    tests = [t for t in spec["tests"] if cuda or t in ("gemm", "hbm")]
    dtypes = list(GEMM_DTYPES[tier] if cuda else CPU_DTYPES[tier])
    units = len(dtypes) + 1 + (0.5 * max(1, gpus) if "h2d" in tests else 0) \
        + (0.5 * max(1, gpus) if "d2h" in tests else 0)
    room = budget - (STARTUP_S if cuda else 1.0) - (0.25 * budget if "nvbandwidth" in tests else 0)
    slice_s = max(MIN_SLICE_S, min(spec["slice"], room / (units * 1.5)))    # 1.5: warm-up, allocation
    return {"tier": tier, "budget": budget, "slice": round(slice_s, 3), "gemm": dtypes, "tests": tests,
            "device": "cuda" if cuda else "cpu", "gpus": gpus}


# --------------------------------------------------------------------------- the child

def _timed(fn, slice_s, sync):
    """Run ``fn`` (one unit of work) for about ``slice_s`` seconds after one unit of warm-up:
    (units, seconds). A unit slower than the whole slice is measured by its warm-up alone (an
    honest lower bound), so that no measurement overruns its slice by more than one unit."""
    t0 = time.perf_counter()
    fn()
    sync()
    warm = time.perf_counter() - t0
    if warm >= slice_s:
        return 1, warm
    batch, done, t0 = 1, 0, time.perf_counter()
    while True:
        for _ in range(batch):
            fn()
        sync()
        done += batch
        took = time.perf_counter() - t0
        if took >= slice_s:
            return done, took
        batch = min(batch * 2, 64)


def _gemm(torch, device, dtype, slice_s, sync):
    n = 8192 if device != "cpu" else 512
    if dtype == "fp8":
        if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
            raise RuntimeError("this torch has no fp8 matmul")
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()     # column-major, as required
        one = torch.tensor(1.0, device=device)

        def fn():
            torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        real = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
                "fp32": torch.float32}[dtype]
        if device != "cpu":
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        a = torch.randn(n, n, device=device, dtype=real)
        b = torch.randn(n, n, device=device, dtype=real)
        c = torch.empty(n, n, device=device, dtype=real)

        def fn():
            torch.matmul(a, b, out=c)
    units, took = _timed(fn, slice_s, sync)
    return 2.0 * n ** 3 * units / took / 1e12, units, took


def _copy(torch, device, slice_s, sync):
    size = (1 << 30) if device != "cpu" else (256 << 20)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty(size, dtype=torch.uint8, device=device)

    def fn():
        dst.copy_(src)
    units, took = _timed(fn, slice_s, sync)
    return 2.0 * size * units / took / 1e9, units, took


def _host_copy(torch, device, direction, slice_s, sync):
    size = 256 << 20
    host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(size, dtype=torch.uint8, device=device)

    def fn():
        if direction == "h2d":
            dev.copy_(host, non_blocking=True)
        else:
            host.copy_(dev, non_blocking=True)
    units, took = _timed(fn, slice_s, sync)
    return float(size) * units / took / 1e9, units, took


def _say(doc):
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def worker(ask):
    """The child: torch imported, the plan made for the GPUs it sees (``ask``: {"tier", "budget",
    "device"}), then measured; one JSON line for the start, one per measurement or failure."""
    import threading
    t0 = time.monotonic()
    import torch
    gpus = torch.cuda.device_count() if ask["device"] != "cpu" and torch.cuda.is_available() else 0
    if ask["device"] == "cuda" and not gpus:
        _say({"event": "no-gpu", "torch": torch.__version__})
        return
    the_plan = plan(ask["tier"], ask["budget"] - (time.monotonic() - t0), gpus or 1, bool(gpus))
    cuda = the_plan["device"] == "cuda"
    devices = ["cuda:%d" % i for i in range(gpus)] if cuda else ["cpu"]
    names = [torch.cuda.get_device_name(i) for i in range(gpus)] if cuda else ["cpu"]
    _say({"event": "start", "torch": torch.__version__, "names": names, "plan": the_plan})
    slice_s = the_plan["slice"]

    def on(index, test, fn):
        device = devices[index]
        sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
        try:
            if cuda:
                torch.cuda.set_device(device)
            value, units, took = fn(device, sync)
            _say({"event": "result", "gpu": index, "test": test, "value": value, "units": units,
                  "seconds": round(took, 4)})
        except Exception as e:                       # one GPU's failure is its finding
            _say({"event": "error", "gpu": index, "test": test, "message": "%s: %s" % (type(e).__name__, e)})

    def all_at_once(test, fn):
        threads = [threading.Thread(target=on, args=(i, test, fn)) for i in range(len(devices))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    for dtype in the_plan["gemm"]:
        all_at_once("gemm_" + dtype, lambda d, s, dtype=dtype: _gemm(torch, d, dtype, slice_s, s))
    if "hbm" in the_plan["tests"]:
        all_at_once("hbm", lambda d, s: _copy(torch, d, slice_s, s))
    for direction in ("h2d", "d2h"):
        if direction in the_plan["tests"]:
            for i in range(len(devices)):
                on(i, direction, lambda d, s, direction=direction: _host_copy(torch, d, direction, slice_s / 4, s))
    _say({"event": "done"})


# --------------------------------------------------------------------------- the parent

def finding(code, message, level="fail", action="drain", gpus=None):
    f = {"level": level, "code": code, "message": message, "action": action}
    if gpus is not None:
        f["gpus"] = list(gpus)
    if level in ("fail", "warn") and action == "drain":
        f["hint"] = HINT
    return f


def read_events(text):
    """The child's lines that are its JSON events; anything else (a warning torch printed) is
    left out."""
    events = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("event"), str):
                events.append(doc)
    return events


def measured_table(events):
    """{gpu index: {test: value}} from the child's events."""
    out = {}
    for e in events:
        if e["event"] == "result" and isinstance(e.get("gpu"), int) and isinstance(e.get("value"), (int, float)):
            out.setdefault(e["gpu"], {})[str(e.get("test"))] = float(e["value"])
    return out


def _kind(test):
    return test.split("_", 1)[0]


def figure_for(test, expect, row, primary="gemm_bf16"):
    """(the figure ``test`` is held to, where it comes from) or (None, None). hosts.yaml's GEMM
    figure is for the ``primary`` dtype (bf16; fp32 on a CPU)."""
    kind = _kind(test)
    if kind == "gemm":
        if test == primary and expect.get("gemm") is not None:
            return expect["gemm"], "expect"
        peaks = (row or {}).get("gemm_tflops_peak") or {}
        peak = _value(peaks.get(test[len("gemm_"):]))
        if peak is not None:
            return peak * GEMM_PEAK_FRACTION, "%g %% of the datasheet's %g TFLOPS" % (100 * GEMM_PEAK_FRACTION, peak)
        return None, None
    key = "h2d" if kind in ("h2d", "d2h") else kind
    if expect.get(key) is not None:
        return expect[key], "expect"
    value = _value((row or {}).get("%s_gbps_min" % kind))
    if value is not None:
        return value, (row or {}).get("sku") or "its model's figure"
    return None, None


def _value(entry):
    """A figure of the table: a number, or {"value": number, ...} with its source."""
    if isinstance(entry, dict):
        entry = entry.get("value")
    return float(entry) if isinstance(entry, (int, float)) and not isinstance(entry, bool) else None


def judge(table, expect=None, row=None, peer_pct=DEFAULT_PEER_PCT, primary="gemm_bf16"):
    """Findings about what each GPU measured (``table``: {gpu: {test: value}}): below its figure
    (``expect`` {"gemm","hbm","h2d"}, else the model's ``row``), below its peers. Pure."""
    expect = expect or {}
    findings = []
    tests = sorted(set(t for values in table.values() for t in values))
    for test in tests:
        unit = UNITS[_kind(test)]
        got = dict((gpu, values[test]) for gpu, values in sorted(table.items()) if test in values)
        figure, source = figure_for(test, expect, row, primary)
        low = []
        if figure is not None:
            low = [g for g, v in got.items() if v < figure]
            if low:
                findings.append(finding(
                    "%s-low" % _kind(test), "%s: %s %s, below the %.1f %s %s" % (
                        test, ", ".join("GPU %s %.1f" % (g, got[g]) for g in low), unit, figure, unit,
                        "this node is expected to reach" if source == "expect" else "(%s)" % source), gpus=low))
        if len(got) >= 2:
            median = statistics.median(got.values())
            slow = [g for g, v in got.items() if median > 0 and v < median * peer_pct / 100.0 and g not in low]
            if slow:
                findings.append(finding("below-peers", "%s: %s, below %g %% of the median of the node's %d GPUs "
                                                       "(%.1f %s)" % (test, ", ".join(
                                                           "GPU %s %.1f (%.0f %%)" % (g, got[g], 100 * got[g] / median)
                                                           for g in slow), peer_pct, len(got), median, unit),
                                        gpus=slow))
    return findings


def _gpu_names():
    """nvidia-smi's GPU names (the model row is found by them), [] without it."""
    smi = _remote.which("nvidia-smi")
    if not smi:
        return []
    try:
        p = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], stdin=subprocess.DEVNULL,
                           capture_output=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if p.returncode != 0:
        return []
    return [line.strip() for line in p.stdout.decode("utf-8", "replace").splitlines() if line.strip()]


def measure(ask, deadline):
    """Run the child within the deadline: (events, findings about the run itself)."""
    argv = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(ask)]
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        outputs, failed, late = _remote.wait_children([child], deadline)
    finally:
        _remote.kill_child(child)
    out, err = outputs[0]
    events = read_events(out)
    findings = []
    if any(e["event"] == "no-gpu" for e in events):
        findings.append(finding("not-measured", "torch sees no CUDA GPU here", level="warn", action="none"))
    elif late:
        findings.append(finding("budget-spent", "the measurement did not finish within its %g s budget: "
                                "what it measured by then is judged" % ask["budget"],
                                level="warn", action="none"))
    elif not any(e["event"] == "start" for e in events):
        lines = [line for line in err.strip().splitlines() if line.strip()]
        findings.append(finding("not-measured", "torch could not be started here: %s" % (
            lines[-1] if lines else "exit %s" % child.returncode), level="warn", action="none"))
    elif failed or not any(e["event"] == "done" for e in events):
        lines = [line for line in err.strip().splitlines() if line.strip()]
        findings.append(finding("not-measured", "the measuring process exited %s: %s" % (
            child.returncode, lines[-1] if lines else "no message"), level="warn", action="none"))
    for e in events:
        if e["event"] == "error":
            findings.append(finding("not-measured", "GPU %s %s: %s" % (e.get("gpu"), e.get("test"), e.get("message")),
                                    level="warn" if not str(e.get("test")).startswith("gemm_fp8") else "info",
                                    action="none", gpus=[e["gpu"]] if isinstance(e.get("gpu"), int) else None))
    return events, findings


def run_nvbandwidth(binary, deadline, nb):
    """nvbandwidth's host<->device tests, parsed: ({gpu: {"h2d_gbps", ...}} or None, findings)."""
    left = deadline - time.monotonic()
    if left < 5:
        return None, [finding("budget-spent", "no time left for nvbandwidth", level="warn", action="none")]
    argv = nb.argv(binary, ["host_to_device_memcpy_ce", "device_to_host_memcpy_ce"])
    if argv is None:
        return None, [finding("not-measured", "nvbandwidth: %r is not a binary to run" % binary, level="warn",
                              action="none")]
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=left)
    except subprocess.TimeoutExpired:
        return None, [finding("budget-spent", "nvbandwidth did not finish within the budget", level="warn",
                              action="none")]
    except OSError as e:
        return None, [finding("not-measured", "nvbandwidth: %s" % (e.strerror or e), level="warn", action="none")]
    parsed = nb.parse(p.stdout.decode("utf-8", "replace"), ["host_to_device_memcpy_ce", "device_to_host_memcpy_ce"])
    if parsed.get("error") or p.returncode != 0:
        return None, [finding("not-measured", "nvbandwidth exited %s: %s" % (p.returncode, parsed.get("error")),
                              level="warn", action="none")]
    return nb.per_gpu(parsed), []


def nvbandwidth_tests(per_gpu):
    """nvbandwidth's host<->device figures as tests of the table (judged as torch's h2d/d2h are:
    Azure's figures are nvbandwidth's): {gpu: {"h2d_nvbandwidth": GB/s, "d2h_nvbandwidth": GB/s}}."""
    out = {}
    for gpu, values in (per_gpu or {}).items():
        for direction in ("h2d", "d2h"):
            value = values.get("%s_gbps" % direction) if isinstance(values, dict) else None
            if isinstance(gpu, int) and isinstance(value, (int, float)):
                out.setdefault(gpu, {})["%s_nvbandwidth" % direction] = float(value)
    return out


def model_row(names, nb):
    """(gpu_perf_figures.json's row for this node's GPU model, None), (None, None) for a model no
    row is for, (None, why) when the table could not be read."""
    if not names:
        return None, None
    if nb is None:
        return None, "nvbandwidth.py (which reads gpu_perf_figures.json) is not beside gpu_perf.py"
    try:
        return nb.figures_for(names[0]), None
    except (OSError, ValueError) as e:
        return None, "%s: %s" % (type(e).__name__, e)


def summarise(data, findings):
    table = data.get("measured") or {}
    if not table:
        bad = [f for f in findings if f["level"] in ("warn", "fail")]
        return "not measured: " + (bad[0]["message"] if bad else "nothing measured")
    parts = []
    tests = sorted(set(t for values in table.values() for t in values), key=lambda t: (_kind(t) != "gemm", t))
    for test in tests:
        values = [v[test] for v in table.values() if test in v]
        low, high = min(values), max(values)
        span = ("%.3g" % low) if "%.3g" % low == "%.3g" % high else "%.3g-%.3g" % (low, high)
        parts.append("%s %s %s" % (test.replace("_", " "), span, UNITS[_kind(test)]))
    head = "%d %s, %s tier: %s" % (len(table), "GPUs" if data["device"] == "cuda" else "CPU",
                                   data["tier"], ", ".join(parts))
    bad = [f for f in findings if f["level"] in ("warn", "fail")]
    return head + ("; " + ", ".join(dict.fromkeys(f["code"] for f in bad)) if bad else "")


def run(args):
    started = time.monotonic()
    budget = min(float(args.budget or TIERS[args.tier]["budget"]), TIERS[args.tier]["budget"])
    deadline = started + budget
    names = _gpu_names()
    data = {"tier": args.tier, "budget_s": budget, "device": None, "gpus": names, "measured": {}}
    ask = {"tier": args.tier, "budget": deadline - time.monotonic(), "device": args.device}
    events, findings = measure(ask, deadline)
    start = next((e for e in events if e["event"] == "start"), {})
    the_plan = start.get("plan") if isinstance(start.get("plan"), dict) else {}
    data.update(device=the_plan.get("device"), plan=the_plan or None, torch=start.get("torch"),
                names=start.get("names"))
    table = measured_table(events)
    nb = _remote.load_companion(os.path.dirname(os.path.abspath(__file__)), "nvbandwidth.py", "mldiag_nvbandwidth")
    if "nvbandwidth" in (the_plan.get("tests") or ()):
        binary = args.nvbandwidth or _remote.which("nvbandwidth")
        if binary and nb is not None:
            per_gpu, more = run_nvbandwidth(binary, deadline, nb)
            findings.extend(more)
            data["nvbandwidth"] = per_gpu
            for gpu, values in nvbandwidth_tests(per_gpu).items():
                table.setdefault(gpu, {}).update(values)
        else:
            data["nvbandwidth"] = None
            findings.append(finding("nvbandwidth-absent", "nvbandwidth is not installed here: host<->device "
                                    "measured by torch only", level="info", action="none"))
    row, why = model_row(names if data["device"] == "cuda" else [], nb)
    if why:
        data["figures_error"] = why
    data["figures"] = {"sku": row.get("sku")} if row else None
    expect = {"gemm": args.expect_gemm, "hbm": args.expect_hbm, "h2d": args.expect_h2d}
    primary = "gemm_" + ((the_plan.get("gemm") or ["bf16"])[0])
    findings.extend(judge(table, expect, row, args.peer_pct, primary))
    data["measured"] = dict((str(g), v) for g, v in sorted(table.items()))
    data["duration_s"] = round(time.monotonic() - started, 3)
    status = _remote.worst_status(findings)
    return {"status": status, "summary": summarise(data, findings), "findings": findings, "data": data}


if __name__ == "__main__":
    parsed = build_parser().parse_args()
    if parsed.worker is not None:
        worker(json.loads(parsed.worker))
        sys.exit(0)
    result = run(parsed)
    print(json.dumps(result, indent=2))
    sys.exit(_remote.exit_code(result))
