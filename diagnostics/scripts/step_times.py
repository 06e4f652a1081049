#!/usr/bin/env python3
"""step-times: per-rank training step times from a job's logs, and a straggler score.

Reads the end of one log per rank (``--log PATH`` repeated, or ``--log-pattern
'/path/rank{rank}.log' --ranks N``), finds the trainer's step-time lines in it, and compares
the ranks: a rank whose recent steps are clearly slower than its peers' is a ``straggler``; a
rank whose recent steps are clearly slower than its own earlier ones has ``slowed``.

Formats (``--format``, or detected; tests/fixtures/step_logs/README.md names a real log of each):

  megatron    Megatron-LM's ``iteration N/ M | ... | elapsed time per iteration (ms): X |``
              (and the ``(s):`` variant of Megatron-DeepSpeed); the value is the mean over
              the log interval, the step N
  deepspeed   DeepSpeed's wall-clock breakdown ``time (ms) | fwd: A | bwd: B | ... | step: C``
              (or ``forward:``/``backward:``): A + B + C; the pipeline engine's ``steps: N loss:
              L iter time (s): X samples/sec: Y``: X. The step is the last ``step=N, skipped=``
              line before. Where neither is in the log, the throughput timer's
              ``global_step=G, ..., CurrSamplesPerSec=R``: 1/R seconds per sample (unit s/sample)
  torchtitan  ``step: N  loss: ...  memory: ...  tps: T  tflops: ...  mfu: ...%``: its line gives
              no step time, so 1/T seconds per token per device (unit s/token); ranks that
              process the same tokens per step compare as their step times do
  lightning   PyTorch Lightning's progress bar ``Epoch E:  22%|...| 4/18 [00:17<01:02,  4.47s/it,
              ...]``: the bar's rate (``s/it``, or 1/``it/s``), step = the bar's count in its epoch
  hf-trainer  the HF Trainer's tqdm bar (no ``Epoch E:`` before it; any plain tqdm bar reads
              so): its rate per step; where no bar has a rate, the final log dict's
              ``'train_steps_per_second': R``: one mean step of 1/R seconds (step None).
              ``data.trainer_summary`` keeps ``train_runtime``/``train_steps_per_second``
  fallback    ``step N ... X ms`` / ``X s`` (``iter``/``iteration`` too, ``:``/``=``
              allowed after the word); a number after ``dt``/``time``/``took``/``elapsed`` is
              taken first, else the first ``X ms``/``X s`` after the step number

A tqdm bar's rate is tqdm's smoothed rate (an exponential moving average), not one step's.
Consecutive redraws of the same bar count (one step) keep the last. Lines are also split at
``\\r`` (tqdm redraws), ANSI colour codes are removed, each line is read in its first 64 KiB.

Detection: every format's parser runs over the text; the one with the most steps is the
format, a tie going to the first of megatron, deepspeed, torchtitan, lightning, hf-trainer;
``fallback`` only when none of them finds a step.

Scoring (``score``): each rank's recent median (its last ``--window`` steps, default 10) is
compared with its peers' (every other rank with at least 3 steps): ratio = median / the peers'
median of medians; z = (median - peers' median) / scale, where scale is 1.4826 x the peers'
MAD (median absolute deviation of their medians), floored at 1% of the peers' median (identical
peers would otherwise make any difference infinite). A rank is a **straggler** when z >= 3.5
AND ratio >= 1.10 AND at least 3 ranks have steps. Against its own history (the steps before
the window, at least 3): the same z and ratio of its recent median to its earlier median with
that history's MAD; z >= 3.5 AND ratio >= 1.10: **slowed**. A rank with fewer than 3 steps is
``too-few-steps`` and takes part in nothing.

Findings: ``straggler`` fail, action ``monitor`` (a log says where to look, not what broke:
check that rank's node with node-check / gpu-perf before draining it); ``slowed`` warn,
``monitor`` (one finding naming every such rank: all ranks slowed together is the job or the
fabric, not one node); ``no-steps`` warn, ``none`` (a log without step lines, or none that
could be read: the wrong ``--format``, a log that only rank 0 writes); ``mixed-units`` warn
(ranks whose logs give different measures are not compared); ``too-few-ranks`` info;
``not-here`` info (with ``--log-pattern``, ranks whose log does not exist on this target while
others' do: on a job whose nodes each write their own ranks' logs, the same pattern is given to
every node, and the client compares the ranks across all of them:
diagnostics/builtin/step_times.py).

In synchronous data parallel training every rank waits for the slowest at each collective,
so the step times they log converge: a straggler then shows as the whole job slowing (each
rank ``slowed``), and a peer difference points at time a rank spends outside the collectives
(its data loader, its logging, its host).

Standard library only; Python 3.8+; runs standalone: ``python3 step_times.py --log LOG ...``.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import sys

import _remote

TIMEOUT = 60
DEFAULT_MAX_BYTES = 16777216             # 16 MiB: read at most this much from the end of each log
DEFAULT_LAST = 200                     # steps kept per rank (the newest)
DEFAULT_WINDOW = 10                    # the recent steps scored
MIN_STEPS = 3                          # a rank with fewer steps is not scored
MIN_RANKS = 3                          # ranks with steps needed to compare peers
Z_THRESHOLD = 3.5
RATIO_THRESHOLD = 1.10
MAD_TO_SIGMA = 1.4826
SCALE_FLOOR = 0.01                     # the scale is at least 1% of the reference median
MAX_LINE = 64 * 1024

FORMATS = ("megatron", "deepspeed", "torchtitan", "lightning", "hf-trainer", "fallback")
UNITS = {"s": "seconds per step", "s/token": "seconds per token (1/tps)",
         "s/sample": "seconds per sample (1/samples per second)"}

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUM = r"(\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
_MEGATRON = re.compile(r"\biteration\s+(\d+)\s*/\s*(?:\d+|infinity)\s*\|.*?"
                       r"elapsed time per iteration \((ms|s)\):\s*" + _NUM)
_DS_WALL = re.compile(r"time \(ms\) \|(.*)$")
_DS_FIELD = re.compile(r"(?:^|\|)\s*([A-Za-z_]+):\s*" + _NUM)
_DS_STEP = re.compile(r"\bstep=(\d+), skipped=")
_DS_PIPE = re.compile(r"\bsteps:\s*(\d+)\s+loss:\s*\S+\s+iter time \(s\):\s*" + _NUM)
_DS_TPUT = re.compile(r"\bglobal_step=(\d+),\s*RunningAvgSamplesPerSec=\S+\s*CurrSamplesPerSec=" + _NUM)
_TITAN = re.compile(r"\bstep:\s*(\d+)\s+loss:\s*\S+.*?\btps:\s*(\d[\d,]*(?:\.\d+)?)")
_TQDM = re.compile(r"(?:(Epoch\s+\d+):\s*)?\d+%\|[^|\n]{0,200}\|\s*(\d+)/(?:\d+|\?)\s*"
                   r"\[[^\]<]{0,40}<[^\],]{0,40},\s*" + _NUM + r"(s/it|it/s)")
_HF_RUNTIME = re.compile(r"['\"]train_runtime['\"]:\s*" + _NUM)
_HF_STEPS_PER_S = re.compile(r"['\"]train_steps_per_second['\"]:\s*" + _NUM)
_FALLBACK = re.compile(r"(?i)\b(?:step|iter|iteration)\s*[:=]?\s*(\d+)\b(.*)$")
_FALLBACK_NAMED = re.compile(r"(?i)\b(?:dt|time|took|elapsed|step_time)\b\s*[:=]?\s*\(?\s*" + _NUM
                             + r"\s?(ms|s)\b")
_FALLBACK_ANY = re.compile(r"(?<![\w.])" + _NUM + r"\s?(ms|s)\b")


# --------------------------------------------------------------------------- reading

def read_tail(path, max_bytes=DEFAULT_MAX_BYTES):
    """The last ``max_bytes`` of ``path`` as text (undecodable bytes as U+FFFD), from the first
    whole line in that window: a multi-GB log costs no more than its end. Raises OSError."""
    max_bytes = max(1, int(max_bytes))
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        start = max(0, size - max_bytes)
        f.seek(start)
        data = f.read(size - start)
    if start > 0:
        cut = data.find(b"\n")
        data = data[cut + 1:] if cut >= 0 else b""
    return data.decode("utf-8", errors="replace")


def _lines(text):
    """The text's lines, split at \\n and \\r too (tqdm redraws), ANSI codes removed, each cut
    to its first MAX_LINE characters."""
    for raw in text.replace("\r\n", "\n").split("\n"):
        for part in raw.split("\r"):
            if "\x1b" in part:
                part = _ANSI.sub("", part)
            yield part[:MAX_LINE]


def _float(text):
    try:
        value = float(text.replace(",", ""))
    except (ValueError, AttributeError):
        return None
    if value != value or value in (float("inf"), float("-inf")) or value <= 0:
        return None
    return value


# --------------------------------------------------------------------------- parsers
# Each takes the list of lines and returns (steps, unit, extra): steps [{"step", "seconds"}]

def _matches(lines, pattern, entry):
    """[entry(match)] for each line ``pattern`` finds in, where ``entry`` gives one (not None)."""
    out = []
    for line in lines:
        m = pattern.search(line)
        made = entry(m) if m else None
        if made is not None:
            out.append(made)
    return out


def _timed(step, value, unit):
    """{"step", "seconds"} of a value in ``unit`` (ms or s), None for no usable value."""
    value = _float(value)
    if value is None:
        return None
    return {"step": step, "seconds": value / 1000.0 if unit.lower() == "ms" else value}


def _parse_megatron(lines):
    return _matches(lines, _MEGATRON, lambda m: _timed(int(m.group(1)), m.group(3), m.group(2))), "s", {}


def _parse_deepspeed(lines):
    steps, rates = [], []
    current = None
    for line in lines:
        m = _DS_STEP.search(line)
        if m:
            current = int(m.group(1))
            continue
        m = _DS_PIPE.search(line)
        if m:
            value = _float(m.group(2))
            if value is not None:
                steps.append({"step": int(m.group(1)), "seconds": value})
            continue
        m = _DS_TPUT.search(line)
        if m:
            rate = _float(m.group(2))
            if rate is not None:
                rates.append({"step": int(m.group(1)), "seconds": 1.0 / rate})
            continue
        m = _DS_WALL.search(line)
        if m:
            fields = dict((k, v) for k, v in _DS_FIELD.findall(m.group(1)))
            names = (("fwd", "bwd", "step"), ("forward", "backward", "step"))
            for fwd, bwd, opt in names:
                if fwd in fields and bwd in fields and opt in fields:
                    parts = [_float(fields[k]) for k in (fwd, bwd)] + [_float(fields[opt]) or 0.0]
                    if None not in parts:
                        steps.append({"step": current, "seconds": sum(parts) / 1000.0})
                    break
    if steps:
        return steps, "s", {}
    return rates, "s/sample", {}


def _titan_entry(m):
    tps = _float(m.group(2))
    return None if tps is None else {"step": int(m.group(1)), "seconds": 1.0 / tps, "tps": tps}


def _parse_torchtitan(lines):
    return _matches(lines, _TITAN, _titan_entry), "s/token", {}


def _tqdm_steps(lines, lightning):
    steps = []
    for line in lines:
        for m in _TQDM.finditer(line):
            if bool(m.group(1)) != lightning:
                continue
            rate = _float(m.group(3))
            if rate is None:
                continue
            seconds = rate if m.group(4) == "s/it" else 1.0 / rate
            entry = {"step": int(m.group(2)), "seconds": seconds}
            if lightning:
                entry["epoch"] = int(m.group(1).split()[-1])
            if steps and steps[-1]["step"] == entry["step"] and steps[-1].get("epoch") == entry.get("epoch"):
                steps[-1] = entry          # a redraw of the same count: the last one stands
            else:
                steps.append(entry)
    return steps


def _parse_lightning(lines):
    return _tqdm_steps(lines, True), "s", {}


def _parse_hf(lines):
    steps = _tqdm_steps(lines, False)
    summary = {}
    for line in lines:
        if "train_runtime" in line:
            m = _HF_RUNTIME.search(line)
            r = _HF_STEPS_PER_S.search(line)
            if m and _float(m.group(1)) is not None:
                summary["train_runtime"] = _float(m.group(1))
            if r and _float(r.group(1)) is not None:
                summary["train_steps_per_second"] = _float(r.group(1))
    if not steps and summary.get("train_steps_per_second"):
        steps = [{"step": None, "seconds": 1.0 / summary["train_steps_per_second"]}]
    return steps, "s", ({"trainer_summary": summary} if summary else {})


def _fallback_entry(m):
    t = _FALLBACK_NAMED.search(m.group(2)) or _FALLBACK_ANY.search(m.group(2))
    return _timed(int(m.group(1)), t.group(1), t.group(2)) if t else None


def _parse_fallback(lines):
    return _matches(lines, _FALLBACK, _fallback_entry), "s", {}


PARSERS = {"megatron": _parse_megatron, "deepspeed": _parse_deepspeed, "torchtitan": _parse_torchtitan,
           "lightning": _parse_lightning, "hf-trainer": _parse_hf, "fallback": _parse_fallback}


def parse(text, fmt=None):
    """Step times in ``text``: {"format", "unit", "steps": [{"step": int|None, "seconds": float}],
    ...}. ``fmt`` one of FORMATS, else detected (the module docstring's rule). Never raises: any
    input that is not text (bytes are decoded) reads as empty."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    if not isinstance(text, str):
        text = ""
    lines = list(_lines(text))
    if fmt in PARSERS:
        candidates = [fmt]
    else:
        candidates = [f for f in FORMATS if f != "fallback"]
    best = None
    for name in candidates:
        try:
            steps, unit, extra = PARSERS[name](lines)
        except Exception:               # a parser's bug must not end the diagnostic
            steps, unit, extra = [], "s", {}
        if best is None or len(steps) > len(best[1]):
            best = (name, steps, unit, extra)
    if fmt not in PARSERS and not best[1]:
        steps, unit, extra = _parse_fallback(lines)
        best = ("fallback", steps, unit, extra) if steps else (None, [], "s", {})
    name, steps, unit, extra = best
    result = {"format": name, "unit": unit, "steps": steps}
    result.update(extra)
    return result


# --------------------------------------------------------------------------- scoring

def _median(values):
    s = sorted(values)
    n = len(s)
    if not n:
        return None
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0


def _robust_z(value, reference):
    """(z, median, scale) of ``value`` against ``reference``: median and 1.4826 x MAD, the scale
    floored at SCALE_FLOOR x the median."""
    med = _median(reference)
    mad = _median([abs(v - med) for v in reference])
    scale = max(MAD_TO_SIGMA * mad, SCALE_FLOOR * abs(med))
    if scale <= 0:
        return 0.0, med, scale
    return (value - med) / scale, med, scale


def _natural(label):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", str(label))]


def score(per_rank, window=DEFAULT_WINDOW):
    """Each rank's recent steps against its peers' and against its own earlier ones (the module
    docstring's rule). ``per_rank``: {rank label: [seconds, oldest first]}. Returns {"ranks":
    {label: {...}}, "stragglers": [...], "slowed": [...], "peers_compared": bool,
    "thresholds": {...}}."""
    window = max(MIN_STEPS, int(window))
    ranks = {}
    recent = {}
    for label in sorted(per_rank, key=_natural):
        values = [v for v in (per_rank[label] or []) if isinstance(v, (int, float)) and v > 0 and v == v]
        n = len(values)
        entry = {"steps": n, "verdict": "no-steps" if not n else "too-few-steps"}
        ranks[label] = entry
        if n < MIN_STEPS:
            continue
        k = min(window, n)
        recent[label] = _median(values[-k:])
        entry.update({"verdict": "ok", "median": recent[label],
                      "window": {"recent_steps": k, "first": n - k + 1, "last": n, "of": n}})
        history = values[:-k]
        if len(history) >= MIN_STEPS:
            z, med, _ = _robust_z(recent[label], history)
            entry.update({"history_median": med, "ratio_to_history": recent[label] / med,
                          "z_history": z, "history_steps": len(history)})
    compared = len(recent) >= MIN_RANKS
    stragglers, slowed = [], []
    for label, med in recent.items():
        entry = ranks[label]
        if compared:
            peers = [m for other, m in recent.items() if other != label]
            z, peer_median, _ = _robust_z(med, peers)
            entry.update({"peer_median": peer_median, "ratio": med / peer_median, "z": z})
            if z >= Z_THRESHOLD and med / peer_median >= RATIO_THRESHOLD:
                entry["verdict"] = "straggler"
                stragglers.append(label)
                continue
        if entry.get("z_history", 0) >= Z_THRESHOLD and entry.get("ratio_to_history", 0) >= RATIO_THRESHOLD:
            entry["verdict"] = "slowed"
            slowed.append(label)
    return {"ranks": ranks, "stragglers": stragglers, "slowed": slowed, "peers_compared": compared,
            "thresholds": {"z": Z_THRESHOLD, "ratio": RATIO_THRESHOLD, "min_steps": MIN_STEPS,
                           "min_ranks": MIN_RANKS, "window": window, "mad_to_sigma": MAD_TO_SIGMA,
                           "scale_floor": SCALE_FLOOR}}


# --------------------------------------------------------------------------- the diagnostic

def _positive_int(text):
    """argparse's type for a count: a whole number of at least 1."""
    digits = str(text).strip()
    if not re.match(r"[0-9]+\Z", digits) or int(digits) < 1:
        raise argparse.ArgumentTypeError("a whole number of at least 1, not %r" % text)
    return int(digits)


def build_parser():
    p = argparse.ArgumentParser(
        prog="step_times.py",
        description="Per-rank training step times from a job's logs (Megatron-LM, DeepSpeed, "
                    "torchtitan, PyTorch Lightning, HF Trainer, 'step N ... X ms'), and the ranks "
                    "that are clearly slower than their peers or than their own earlier steps.")
    p.add_argument("--log", action="append", help="one rank's log (repeatable, in rank order)")
    p.add_argument("--log-pattern", help="the ranks' logs, {rank} standing for the rank: /logs/rank{rank}.log")
    p.add_argument("--ranks", type=_positive_int, help="with --log-pattern: ranks 0..N-1")
    p.add_argument("--format", choices=FORMATS, help="the logs' format (default: detected per log)")
    p.add_argument("--last", type=_positive_int, default=DEFAULT_LAST,
                   help="use each rank's last N steps (default %d)" % DEFAULT_LAST)
    p.add_argument("--window", type=_positive_int, default=DEFAULT_WINDOW,
                   help="the recent steps scored against the peers and the rank's history (default %d)"
                        % DEFAULT_WINDOW)
    p.add_argument("--max-bytes", type=_positive_int, default=DEFAULT_MAX_BYTES,
                   help="read at most this many bytes from the end of each log (default %d)" % DEFAULT_MAX_BYTES)
    return p


def _targets(args):
    """[(label, path)] or a usage message."""
    logs = list(getattr(args, "log", None) or [])
    pattern = getattr(args, "log_pattern", None)
    ranks = getattr(args, "ranks", None)
    if pattern:
        if "{rank}" not in pattern:
            return None, "--log-pattern must hold {rank}"
        if not ranks:
            return None, "--log-pattern needs --ranks N"
        return [(str(r), pattern.replace("{rank}", str(r))) for r in range(ranks)], None
    if not logs:
        return None, "give --log PATH (one per rank) or --log-pattern with --ranks"
    return [(str(i), path) for i, path in enumerate(logs)], None


def _fmt_seconds(value, unit):
    if unit == "s":
        return "%.3g s" % value if value >= 1 else "%.3g ms" % (value * 1000)
    return "%.3g %s" % (value, unit)


def run(args):
    targets, problem = _targets(args)
    if problem:
        return {"status": "fail", "summary": problem,
                "findings": [{"level": "fail", "code": "usage", "message": problem, "action": "none"}],
                "data": {}}
    fmt = getattr(args, "format", None)
    last = getattr(args, "last", DEFAULT_LAST)
    window = getattr(args, "window", DEFAULT_WINDOW)
    max_bytes = getattr(args, "max_bytes", DEFAULT_MAX_BYTES)
    pattern_given = getattr(args, "log_pattern", None)
    findings, logs, per_rank, units = [], {}, {}, {}
    absent = []
    for label, path in targets:
        info = {"path": path}
        logs[label] = info
        try:
            text = read_tail(path, max_bytes)
        except OSError as e:
            info["error"] = e.strerror or type(e).__name__
            if pattern_given and e.errno == errno.ENOENT:
                absent.append((label, path))      # another node's rank, maybe: said once below
                continue
            findings.append({"level": "warn", "code": "no-steps", "action": "none",
                             "message": "rank %s: log not readable: %s (%s)" % (label, path, info["error"])})
            continue
        parsed = parse(text, fmt)
        steps = parsed["steps"][-last:]
        info.update({"format": parsed["format"], "unit": parsed["unit"], "steps_found": len(parsed["steps"]),
                     "steps_used": len(steps),
                     "first_step": steps[0]["step"] if steps else None,
                     "last_step": steps[-1]["step"] if steps else None})
        if "trainer_summary" in parsed:
            info["trainer_summary"] = parsed["trainer_summary"]
        if not steps:
            findings.append({"level": "warn", "code": "no-steps", "action": "none",
                             "message": "rank %s: no step times in the last %d bytes of %s%s"
                                        % (label, max_bytes, path, " as %s" % fmt if fmt else ""),
                             "hint": "check --format; some launchers write step lines on one rank only"})
            continue
        per_rank[label] = [s["seconds"] for s in steps]
        units[label] = parsed["unit"]
    if absent and len(absent) < len(targets):
        findings.append({"level": "info", "code": "not-here", "action": "none",
                         "message": "rank(s) %s: no log on this target (%s): another node's, when each "
                                    "node writes its own ranks' logs" % (
                                        ",".join(label for label, _ in absent), absent[0][1])})
    elif absent:
        findings.append({"level": "warn", "code": "no-steps", "action": "none",
                         "message": "no rank's log on this target: %s (%d ranks)" % (
                             pattern_given.replace("{rank}", "*"), len(absent)),
                         "hint": "check --log-pattern and --ranks"})
    unit_set = sorted(set(units.values()))
    scored = None
    if len(unit_set) > 1:
        findings.append({"level": "warn", "code": "mixed-units", "action": "none",
                         "message": "the ranks' logs give different measures (%s): not compared"
                                    % ", ".join("rank %s %s" % (k, v) for k, v in sorted(units.items())),
                         "hint": "give --format so that every rank is read the same way"})
    elif per_rank:
        unit = unit_set[0]
        scored = score(per_rank, window)
        for label in scored["stragglers"]:
            e = scored["ranks"][label]
            findings.append({
                "level": "fail", "code": "straggler", "action": "monitor",
                "message": "rank %s is a straggler: median %s over its last %d steps, %.2fx its peers' %s (z %.1f)"
                           % (label, _fmt_seconds(e["median"], unit), e["window"]["recent_steps"], e["ratio"],
                              _fmt_seconds(e["peer_median"], unit), e["z"]),
                "hint": "check that rank's node (node-check, gpu-perf) before draining it: a log says where, "
                        "not what"})
        if scored["slowed"]:
            parts = []
            for label in scored["slowed"]:
                e = scored["ranks"][label]
                parts.append("rank %s %s -> %s (%.2fx)" % (label, _fmt_seconds(e["history_median"], unit),
                                                          _fmt_seconds(e["median"], unit), e["ratio_to_history"]))
            everyone = len(scored["slowed"]) == sum(1 for e in scored["ranks"].values() if "median" in e)
            findings.append({
                "level": "warn", "code": "slowed", "action": "monitor",
                "message": "%s slower than earlier in the log: %s"
                           % ("every rank is" if everyone and len(scored["slowed"]) > 1 else
                              "%d rank(s)" % len(scored["slowed"]), "; ".join(parts)),
                "hint": "all ranks together: the job, its data or the fabric; one rank: its node"})
        if not scored["peers_compared"]:
            findings.append({"level": "info", "code": "too-few-ranks", "action": "none",
                             "message": "%d rank(s) with at least %d steps: peers not compared (needs %d)"
                                        % (sum(1 for e in scored["ranks"].values() if "median" in e),
                                           MIN_STEPS, MIN_RANKS)})
    status = _remote.worst_status(findings)
    n_ok = len(per_rank)
    if scored and scored["stragglers"]:
        summary = "straggler(s): rank %s of %d" % (", ".join(scored["stragglers"]), len(targets))
    elif scored and scored["slowed"]:
        summary = "no straggler among %d rank(s); %d slowed" % (n_ok, len(scored["slowed"]))
    elif n_ok:
        summary = "no straggler among %d rank(s) with step times" % n_ok
    else:
        summary = "no step times in %d log(s)" % len(targets)
    return {"status": status, "summary": summary, "findings": findings,
            "data": {"logs": logs, "unit": unit_set[0] if len(unit_set) == 1 else None,
                     "score": scored}}


if __name__ == "__main__":
    _result = run(build_parser().parse_args())
    print(json.dumps(_result, indent=2))
    sys.exit(_remote.exit_code(_result))
