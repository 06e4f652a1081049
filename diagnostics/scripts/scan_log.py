#!/usr/bin/env python3
"""scan-log: tail a log file and classify what went wrong in it.

Reads the last ``--lines`` lines of ``--path`` (seeking from the end, so a
multi-GB log costs no more than its tail; undecodable bytes become U+FFFD) and
reports, one finding per kind, with its count and first/last line:

  traceback    Python tracebacks, with their exception line (an exception whose
               message is empty -- ``ValueError`` alone, ``Exception: `` -- is
               flagged, that is where the cause hides)
  empty-error  ``ERROR ...:`` lines with nothing after the colon (``ERROR in
               batch 0-3:`` -- an exception whose str() was empty); a line
               directly followed by a traceback is not counted
  nan-loss     NaN/inf loss values as the trainers print them: a key holding
               "loss" then ``=``, ``:``, ``is`` or blanks, then nan/inf/infinity in
               any case, signed, quoted or wrapped -- ``loss=nan`` (tqdm postfixes,
               fairseq's simple format, Lightning's ``train_loss=nan``,
               ``train/loss=nan``), ``{'loss': nan}`` (HF Trainer), ``"loss": "nan"``
               (fairseq json), ``| loss nan |`` (fairseq's epoch lines),
               ``lm loss: NAN`` (Megatron-LM's ``{:.6E}``), ``loss nan,`` (nanoGPT),
               ``[Loss] nan``, ``loss=tensor(nan, ...)``; and the messages that say
               so without a value: Megatron-LM's ``number of nan iterations: N``
               (N > 0) and ``found NaN/Inf in local forward loss calculation``,
               DeepSpeed's ``Current loss scale already at minimum``, fairseq's
               ``Minimum loss scale reached``, Lightning's ``The loss returned in
               `training_step` is nan``, Keras' ``Invalid loss, terminating
               training``. Not a loss: ``loss_scale``/``loss scale`` values,
               ``nan_count=0``, a path holding ``loss_nan``. A NaN/inf gradient
               norm alone (``grad_norm: nan``) is not a finding: under fp16 dynamic
               loss scaling it is the normal overflow signal (the step is skipped,
               the scale lowered); an overflow that never recovers ends in the
               minimum-loss-scale errors above, which are.
  cuda-oom     CUDA out of memory (``torch.OutOfMemoryError``, ``CUDA out of memory``)
  nccl         NCCL errors and collective timeouts (``NCCL error``,
               ``ncclInternalError``, ``Watchdog caught collective operation
               timeout``, error-level ProcessGroupNCCL lines), and gloo's
               collective timeouts (``gloo/transport/... Timed out waiting``)
  xid-fatal    NVIDIA Xid events whose action in xid_catalog.json is a GPU reset or
               worse (xid.py's rules from NVIDIA's Xid catalog: 79, 48, 119, ...), and a
               GPU that fell off the bus in the driver's words without an Xid line
               (NVIDIA's three-line ``NVRM: The NVIDIA GPU ...`` message, split or
               joined, its one-line variant, ``NVRM: GPU 18:00.0: GPU has fallen off
               the bus.``): Xid 79 at the message's first line, as node-check reads it
  xid          any other Xid (usually an application fault, e.g. 13, 31, 43): warn
  killed       killed processes (``Killed``, oom-killer, ``exit code -9``, ``signal 9``)

Every kind is ``fail`` except ``xid`` (``warn``). Every finding carries an ``action`` (the
node-check scale none < monitor < app < reset-gpu < reboot < drain < rma): the training
failures (traceback, empty-error, nan-loss, cuda-oom, nccl, killed) are ``app`` -- the job's
to fix, not the node's; an Xid finding takes the worst action of its Xids from the catalog
(48 with 63/64 on the same GPU: drain); log-not-found / log-unreadable: ``none``. The Xid
catalog is xid.py + xid_catalog.json, shipped beside this script (the one catalog of
node-check and gpu-status; the Xid events are its parser's, over the whole window, and each
line's action its ``event_action``: the Fatal of an NVLink5 line, Xid 154's recovery action);
run by hand without them, ``NVRM: Xid`` lines are all ``xid`` (warn, monitor), the finding
says "catalog not shipped" and the driver's words are not read. A window without an NVRM
line loads neither. Counts are lines, not events (a message over several lines is one): one
NCCL timeout is typically reported on several lines. Source lines inside a
traceback (frames, code, carets) are not classified, its exception line is.
Line numbers are the file's own (1-based) when the part before the tail is at
most 256 MiB; beyond that counting would cost more than the scan, and they are
relative to the scanned window (``data.line_numbers`` says which). At most
``--max-bytes`` (64 MiB) are read from the end, whatever ``--lines`` asks.

Standard library only; Python 3.8+; runs standalone: ``python3 scan_log.py --path LOG``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

import _remote

DEFAULT_LINES = 2000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024   # never read more than this from the end of the file
COUNT_PREFIX_LIMIT = 256 * 1024 * 1024  # count newlines before the tail up to this many bytes
KEEP_HEAD = 25                          # matches kept per kind: the first KEEP_HEAD ...
KEEP_TAIL = 25                          # ... and the last KEEP_TAIL
MAX_TEXT = 400                          # characters kept per matched line
MAX_MSG_TEXT = 160                      # characters of a line quoted in a finding message
MAX_MATCH = 60                          # characters kept of the part of a line that matched
MAX_CLASSIFY = 64 * 1024                # longer lines are classified on their first and last 32 KiB
_BLOCK = 64 * 1024
_AHEAD = 3                               # lines looked ahead for a multi-line exception message
_WAIT_CHAIN = 10                         # lines an ended traceback waits for a chained one
_WAIT_FRAMES = 1000                      # lines a traceback in its frames waits for its next line

# kind -> (level, singular label, plural label, hint); the order is the report order
KINDS = collections.OrderedDict([
    ("traceback", ("fail", "Python traceback", "Python tracebacks",
                   "read the first traceback (usually the root cause); later ones are often its consequences")),
    ("empty-error", ("fail", "ERROR line with an empty message", "ERROR lines with an empty message",
                     "the exception's str() was empty: log repr(e) and the traceback "
                     "(logger.exception / traceback.format_exc()) instead of f'{e}'")),
    ("nan-loss", ("fail", "NaN/inf loss line", "NaN/inf loss lines",
                  "check learning rate and warmup, fp16 overflow (try bf16), the data of the first bad step; "
                  "torch.autograd.set_detect_anomaly(True) for one step finds the op")),
    ("cuda-oom", ("fail", "CUDA out-of-memory line", "CUDA out-of-memory lines",
                  "lower the batch size / sequence length or enable activation checkpointing; "
                  "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation; "
                  "vLLM: lower --gpu-memory-utilization or --max-model-len")),
    ("nccl", ("fail", "NCCL/gloo error/timeout line", "NCCL/gloo error/timeout lines",
              "a collective timeout usually means one rank died or hung earlier: find the first failing rank; "
              "rerun with NCCL_DEBUG=INFO (and TORCH_NCCL_TRACE_BUFFER_SIZE for the flight recorder)")),
    ("xid-fatal", ("fail", "fatal Xid line", "fatal Xid lines",
                   "a GPU hardware/driver fault: check `nvidia-smi -q` (ECC, remapped rows); "
                   "the GPU usually needs a reset, the node a drain")),
    ("xid", ("warn", "Xid line", "Xid lines",
             "look the Xid up in NVIDIA's Xid catalog; 13, 31 and 43 are usually application faults")),
    ("killed", ("fail", "killed-process line", "killed-process lines",
                "the process got SIGKILL: usually the host OOM killer (check dmesg / journalctl -k) "
                "or a scheduler memory/time limit")),
])

KIND_ACTION = {"traceback": "app", "empty-error": "app", "nan-loss": "app", "cuda-oom": "app",
               "nccl": "app", "xid-fatal": "reset-gpu", "xid": "monitor", "killed": "app"}
HERE = os.path.dirname(os.path.abspath(__file__))


def load_xid():
    """xid.py from this script's directory (shipped there with xid_catalog.json), its catalog
    loaded; None when either is missing (the script still runs, Xids unclassified)."""
    return _remote.load_xid(HERE)


_TB_HEADER = re.compile(r"^(.*?)Traceback \(most recent call last\):\s*$")
_CHAIN = re.compile(r"^(During handling of the above exception, another exception occurred:"
                    r"|The above exception was the direct cause of the following exception:)\s*$")
_EXC_LINE = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:(:)(.*))?$")
_SEPARATOR = re.compile(r"^\s*(?:={3,}|-{3,})\s*$")
_ERROR_WORD = re.compile(r"\b(?:ERROR|Error)\b")
# A loss value that is NaN or infinite, as the trainers print it: KEY SEP VALUE where KEY is one
# word holding "loss" (loss, train_loss, val_loss, nll_loss; "train/loss" ends in the word
# "loss"; "lm loss" too), optionally quoted or bracketed ('loss', "loss", [Loss]); SEP is ":",
# "=", "is" or plain blanks (fairseq's "| loss nan |", nanoGPT's "loss nan,"); VALUE is nan,
# inf or infinity in any case, signed, optionally quoted or wrapped (tensor(nan, ...),
# array(nan), [nan]). KEY is matched as any one word and tested for "loss" in code: a pattern
# like \w*loss\w* backtracks over every "loss" inside a long word (quadratic on a line of
# "lossloss..."); \w+ gives up one character at a time, so a line costs linear time.
_NONFINITE_VALUE = re.compile(
    r"(?i)\b(\w+)['\"\]]?(?:\s*(?:[:=]|\bis\b)\s*|\s+)['\"]?(?:(?:tensor|array)\(\s*|\[\s*)?"
    r"[-+]?(?:nan|inf(?:inity)?)\b")
# Messages that say the loss went NaN/inf without printing its value (lower case, substrings):
_NAN_LOSS_PHRASES = (
    "loss scale already at minimum",        # DeepSpeed's fp16 loss scaler: overflow at every step
    "minimum loss scale reached",           # fairseq's (and ParlAI's) FloatingPointError, the same
    "invalid loss, terminating training",   # Keras' TerminateOnNaN callback
    "found nan in local forward loss",      # Megatron-LM --check-for-nan-in-loss-and-grad
    "found inf in local forward loss",
)
# Megatron-LM counts the skipped iterations whose loss was NaN/inf (training_log); any but 0
_MEGATRON_NAN_ITERS = re.compile(r"number of nan iterations:\s*0*[1-9]")
# PyTorch Lightning's check_finite_loss: "The loss returned in `training_step` is tensor(nan...)"
_LIGHTNING_NONFINITE = re.compile(
    r"(?i)loss returned in `\w+` is (?:tensor\(\s*)?[-+]?(?:nan|inf)\b")
_CUDA_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED"
    r"|cudaErrorMemoryAllocation|HIP out of memory|No available memory for the cache blocks")
_NCCL_WORDS = ("Watchdog caught collective operation timeout", "watchdog got stuck",
               "DistBackendError", "NCCL communicator was aborted")
_NCCL_ENUM = re.compile(
    r"\bnccl(?:UnhandledCudaError|SystemError|InternalError|InvalidArgument|InvalidUsage|RemoteError)\b")
_NCCL_C10_ERROR = re.compile(r"\[E\d*\s[^\]]{0,120}ProcessGroupNCCL")   # error-level c10 log line
# gloo's collective timeout (the CPU backend): "[.../gloo/transport/tcp/unbound_buffer.cc:78]
# Timed out waiting 8000ms for recv operation to complete"
_GLOO_TIMEOUT = re.compile(r"gloo/transport/\S*\]\s*Timed out waiting \d+ms for (?:recv|send) operation")
_XID = re.compile(r"NVRM: Xid \(([^)]*)\):\s*(\d+)")   # without xid.py beside this script only
# str.splitlines() breaks a line at these too (besides "\n", "\r\n")
_OTHER_LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
_KILLED = re.compile(
    r"(?i:\boom[-_ ]kill)|Killed process \d+|\b\d+\s+Killed\b|(?:^|[\s:\]])Killed\s*$"
    r"|\b(?:exit|return)\s*code\s*[:=]?\s*(?:-9|137)\b|\bexited with (?:exit )?code (?:-9|137)\b"
    r"|\bexit status (?:-9|137)\b|\b[Ss]ignal\s*9\b|\bSIGKILL\b|\btask \d+: Out Of Memory")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scan_log.py",
        description="Tail a log file and classify tracebacks, empty error messages, NaN/inf loss, "
                    "CUDA OOM, NCCL errors/timeouts, Xid events and killed processes; "
                    "prints one JSON result.")
    p.add_argument("--path", required=True, help="the log file to scan")
    p.add_argument("--lines", type=_positive_int, default=DEFAULT_LINES,
                   help="scan the last N lines (default %d)" % DEFAULT_LINES)
    p.add_argument("--max-bytes", type=_positive_int, default=DEFAULT_MAX_BYTES,
                   help="read at most this many bytes from the end of the file, even when that is "
                        "fewer than --lines lines (default %d)" % DEFAULT_MAX_BYTES)
    return p


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not an integer" % text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1, got %d" % value)
    return value


# --------------------------------------------------------------------------- reading

def tail_lines(path: str, n: int, max_bytes: int = DEFAULT_MAX_BYTES,
               count_limit: int = COUNT_PREFIX_LIMIT):
    """The last ``n`` lines of ``path`` as bytes (no newlines), reading backwards.

    Returns ``(lines, first_line_no, size, window_start)``: ``first_line_no`` is the
    1-based line number of ``lines[0]`` in the file, or None when the part before
    the window is larger than ``count_limit`` bytes (not counted).
    """
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        pos = size
        chunks = []
        newlines = 0
        ends_with_newline = None
        while pos > 0 and size - pos < max_bytes:
            step = min(_BLOCK, pos, max_bytes - (size - pos))
            pos -= step
            f.seek(pos)
            chunk = f.read(step)
            if ends_with_newline is None:
                ends_with_newline = chunk.endswith(b"\n")
            chunks.append(chunk)
            newlines += chunk.count(b"\n")
            # n complete lines: n newlines, plus the one ending the line before them
            # (when the file ends with a newline, the last one ends the last line)
            if newlines >= n + (1 if ends_with_newline else 0):
                break
        buf = b"".join(reversed(chunks))
        parts = buf.split(b"\n") if buf else []
        if buf.endswith(b"\n"):
            parts.pop()
        dropped = 0
        if pos > 0 and parts:
            parts.pop(0)          # a partial line (or the one before the window)
            dropped = 1
        if len(parts) > n:
            dropped += len(parts) - n
            parts = parts[-n:]
        kept = sum(len(p) + 1 for p in parts) - (0 if (not parts or buf.endswith(b"\n")) else 1)
        window_start = size - kept
        if pos == 0:
            first = dropped + 1
        elif pos <= count_limit:
            f.seek(0)
            before = 0
            remaining = pos
            while remaining > 0:
                block = f.read(min(1024 * 1024, remaining))
                if not block:
                    break
                before += block.count(b"\n")
                remaining -= len(block)
            first = before + dropped + 1
        else:
            first = None
    return parts, first, size, window_start


def _decode(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace")
    if text.endswith("\r"):
        text = text[:-1]
    return text


def _clip(text: str, limit: int = MAX_TEXT) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


# --------------------------------------------------------------------------- tracebacks

_TIME_TOKEN = re.compile(r"\d{1,4}[-/]\d{1,2}(?:[-/]\d{1,4})?|\d{1,2}:\d{2}(?::\d{2})?(?:[.,]\d+)?|\d+\.\d+")


def _prefix_pattern(prefix: str):
    """The prefix with its dates, times and decimal seconds generalised: a logged
    traceback (vLLM) repeats the log prefix on each line and the clock moves on.
    Other digits (``[rank3]:``, ``pid=2874``) name the stream and stay exact."""
    out = []
    pos = 0
    for m in _TIME_TOKEN.finditer(prefix):
        out.append(re.escape(prefix[pos:m.start()]))
        out.append(r"[\d:.,/-]+")
        pos = m.end()
    out.append(re.escape(prefix[pos:]))
    return re.compile("".join(out))


class _Traceback(object):
    __slots__ = ("prefix", "pattern", "line", "state", "exc_line", "exc_text", "exception",
                 "message", "empty", "chain", "last_seen")

    def __init__(self, prefix: str, line: int):
        self.prefix = prefix
        self.pattern = _prefix_pattern(prefix)
        self.line = line
        self.state = "frames"       # frames -> after_exc -> (chain -> frames ...)
        self.exc_line = None
        self.exc_text = None
        self.exception = None
        self.message = None
        self.empty = False
        self.chain = []
        self.last_seen = line

    def to_entry(self) -> dict:
        if self.exc_text is None:
            text = "Traceback (most recent call last): (cut off before its exception line)"
        else:
            text = self.exc_text
            if self.empty:
                text += " (empty message)"
        entry = {"line": self.line, "text": _clip(text), "exception": self.exception,
                 "message": None if self.message is None else _clip(self.message),
                 "empty_message": self.empty, "exception_line": self.exc_line}
        if self.chain:
            entry["chained_from"] = [_clip(c, 200) for c in self.chain]
        return entry


def _strip_prefix(tb: _Traceback, line: str):
    """The line without ``tb``'s prefix, or None when the line is not ``tb``'s."""
    if not tb.prefix:
        return line
    if line.startswith(tb.prefix):
        return line[len(tb.prefix):]
    m = tb.pattern.match(line)
    if m:
        return line[m.end():]
    return None


def _owner(open_tbs, line: str):
    """The open traceback this line continues, its body, and whether the match was
    exact: the longest exact prefix first, then the most recent traceback whose
    generalised prefix matches, then one without a prefix."""
    best = None
    for tb in open_tbs:
        if tb.prefix and line.startswith(tb.prefix):
            if best is None or len(tb.prefix) > len(best.prefix):
                best = tb
    if best is not None:
        return best, line[len(best.prefix):], True
    for tb in sorted(open_tbs, key=lambda t: -t.last_seen):
        if tb.prefix:
            m = tb.pattern.match(line)
            if m:
                return tb, line[m.end():], False
    for tb in open_tbs:
        if not tb.prefix:
            return tb, line, True
    return None, None, False


def _continue(tb: _Traceback, body: str, lineno: int, ahead):
    """Feed one line to an open traceback; ``ahead`` holds the next lines' bodies
    (None where a line is not this traceback's). Returns (consumed,
    is_exception_line, closed)."""
    if tb.state == "frames":
        if not body.strip() or body[:1].isspace() or _CHAIN.match(body) \
                or _TB_HEADER.match(body):
            return True, False, False
        m = _EXC_LINE.match(body.rstrip())
        if m:
            tb.exc_line = lineno
            tb.exc_text = body.strip()
            tb.exception = m.group(1)
            message = (m.group(3) or "").strip() if m.group(2) else ""
            if not message and m.group(2) and ahead and _SEPARATOR.match(ahead[0]):
                # a message that starts with a newline (torchrun's ChildFailedError:
                # "Type: " then a ruled block): its first line stands for it
                for following in ahead[1:]:
                    if following is not None and following.strip() \
                            and not _SEPARATOR.match(following):
                        message = following.strip()
                        tb.exc_text = "%s %s \u2026" % (tb.exc_text, message)
                        break
                else:
                    message = "(multi-line message)"
            tb.message = message
            tb.empty = not message
            tb.state = "after_exc"
            return True, True, False
        return False, False, True      # not a traceback line: cut off without its exception
    if tb.state == "after_exc":
        if not body.strip():
            return True, False, False
        if _CHAIN.match(body):
            tb.state = "chain"
            return True, False, False
        return False, False, True
    # chain: waiting for the next "Traceback (most recent call last):"
    if not body.strip():
        return True, False, False
    if _TB_HEADER.match(body):
        tb.chain.append(tb.exc_text or "?")
        tb.state = "frames"
        tb.exc_line = tb.exc_text = tb.exception = tb.message = None
        tb.empty = False
        return True, False, False
    return False, False, True


# --------------------------------------------------------------------------- classification

class _Bucket(object):
    __slots__ = ("count", "head", "tail")

    def __init__(self):
        self.count = 0
        self.head = []
        self.tail = collections.deque(maxlen=KEEP_TAIL)

    def add(self, entry: dict) -> None:
        self.count += 1
        if len(self.head) < KEEP_HEAD:
            self.head.append(entry)
        else:
            self.tail.append(entry)

    def entries(self):
        return self.head + list(self.tail)

    def omitted(self) -> int:
        return self.count - len(self.head) - len(self.tail)


def classify(lines, first_line_no: int = 1) -> "collections.OrderedDict[str, _Bucket]":
    """Classify decoded lines; line numbers start at ``first_line_no``."""
    buckets = collections.OrderedDict((k, _Bucket()) for k in KINDS)
    open_tbs = []
    done_tbs = []
    n = len(lines)
    for i, line in enumerate(lines):
        lineno = first_line_no + i
        structural = False
        if open_tbs:
            # a finished traceback waits a few lines for "During handling ...", one still
            # in its frames a long while (other streams interleave); then it is done
            stale = [t for t in open_tbs
                     if lineno - t.last_seen > (_WAIT_FRAMES if t.state == "frames" else _WAIT_CHAIN)]
            for t in stale:
                open_tbs.remove(t)
                done_tbs.append(t)
        tb, body, exact = _owner(open_tbs, line) if open_tbs else (None, None, False)
        if tb is not None:
            ahead = [_strip_prefix(tb, lines[j]) for j in range(i + 1, min(i + 1 + _AHEAD, n))]
            consumed, is_exc, closed = _continue(tb, body, lineno, ahead)
            if closed and exact:
                # only a line of the same stream ends a traceback; a line that merely
                # looks alike (same log format, another clock reading) does not
                open_tbs.remove(tb)
                done_tbs.append(tb)
            if consumed:
                tb.last_seen = lineno
                structural = not is_exc
        if not structural:
            m = _TB_HEADER.match(line)
            if m:
                prefix = m.group(1)
                for other in [t for t in open_tbs if t.prefix == prefix]:
                    open_tbs.remove(other)
                    done_tbs.append(other)
                open_tbs.append(_Traceback(prefix, lineno))
                continue
        if structural:
            continue
        _classify_line(buckets, line, lineno, lines[i + 1] if i + 1 < n else None)
    for kind, entry in _xid_matches(lines, first_line_no):
        buckets[kind].add(entry)
    done_tbs.extend(open_tbs)
    for tb in sorted(done_tbs, key=lambda t: t.line):
        buckets["traceback"].add(tb.to_entry())
    return buckets


def _is_nccl(line: str, low: str) -> bool:
    if "nccl error" in low or any(w in line for w in _NCCL_WORDS):
        return True
    if "gloo" in line and _GLOO_TIMEOUT.search(line):
        return True
    if "nccl" in line and _NCCL_ENUM.search(line):
        return True
    return "ProcessGroupNCCL" in line and "[E" in line and bool(_NCCL_C10_ERROR.search(line))


def _nan_loss(line: str, low: str):
    """The part of a line that says the loss is NaN/inf (``lm loss: NAN``), or None."""
    if "nan iterations" in low:
        m = _MEGATRON_NAN_ITERS.search(low)
        if m:
            return line[m.start():m.end()]
    if "loss" not in low:
        return None
    for phrase in _NAN_LOSS_PHRASES:
        at = low.find(phrase)
        if at >= 0:
            return line[at:at + len(phrase)]
    if "loss returned in" in low:
        m = _LIGHTNING_NONFINITE.search(line)
        if m:
            return m.group(0)
    for m in _NONFINITE_VALUE.finditer(line):
        key = m.group(1).lower()
        if "loss" in key and "scale" not in key:     # loss_scale: inf is fp16's normal overflow
            return m.group(0)
    return None


def _ends(line: str, joint: str) -> str:
    """A line as it is classified: one longer than MAX_CLASSIFY (a megabyte "line" of binary
    junk, a progress bar) is its first and last half of that, ``joint`` between them."""
    if len(line) <= MAX_CLASSIFY:
        return line
    half = MAX_CLASSIFY // 2
    return line[:half] + joint + line[-half:]


def _xid_matches(lines, first_line_no: int):
    """The window's Xid matches in line order, as ``(kind, entry)``: xid.py's Xid events, read
    by node-check's parser over the whole window (an ``NVRM: Xid`` line; a GPU that fell off
    the bus in the driver's words, Xid 79 at the first line of its message, unless an Xid 79
    line of that GPU is near), each with its line's action; without xid.py, the ``NVRM: Xid``
    lines, unclassified (monitor)."""
    if not any("NVRM" in line for line in lines):
        # every Xid line and every "fallen off the bus" message is an NVRM line: a log without
        # one (a training log, a healthy node's) loads no xid.py or catalog
        return []
    xm = load_xid()
    matches = []
    if xm is None:
        for i, line in enumerate(lines):
            m = _XID.search(_ends(line, "\n"))
            if m:
                device = m.group(1)[4:] if m.group(1).startswith("PCI:") else m.group(1)
                matches.append(("xid", {"line": first_line_no + i, "text": _clip(line), "xid": int(m.group(2)),
                                        "device": device, "action": "monitor"}))
        return matches
    # xid.py numbers the lines of str.splitlines(): the other breaks it knows (a tqdm "\r"
    # inside a line, a form feed) are blanked so that its line n is the window's line n
    text = _OTHER_LINE_BREAKS.sub(" ", "\n".join(_ends(line, " ") for line in lines))
    catalog = xm.load_catalog()     # once: each lookup without it builds the catalog's path again
    for ev in xm.parse_kernel_log(text):
        if ev["kind"] != "xid":
            continue
        action = xm.event_action(ev, catalog)
        derived = bool(ev.get("derived"))
        entry = {"line": first_line_no + ev["line"] - 1,
                 # a message over several lines: as xid.py joined it (the first line alone
                 # says only "The NVIDIA GPU 0000:b3:00.0")
                 "text": _clip(ev["text"] if derived else lines[ev["line"] - 1]),
                 "xid": ev["code"], "device": ev["pci"], "action": action}
        if derived:
            entry["derived"] = True
        matches.append(("xid-fatal" if xm.LEVEL_OF[action] == "fail" else "xid", entry))
    return matches


def _classify_line(buckets, line: str, lineno: int, next_line) -> None:
    raw = line
    line = _ends(line, "\n")
    low = line.lower()        # cheap substring tests first: most lines match nothing
    hits = []
    if line.rstrip().endswith(":") and _ERROR_WORD.search(line) and not _TB_HEADER.match(line) \
            and not (next_line is not None and _TB_HEADER.match(next_line)):
        hits.append(("empty-error", None))
    said = _nan_loss(line, low) if ("loss" in low or "nan iterations" in low) else None
    if said:
        hits.append(("nan-loss", {"match": _clip(" ".join(said.split()), MAX_MATCH)}))
    if ("memory" in low or "alloc" in low) and _CUDA_OOM.search(line):
        hits.append(("cuda-oom", None))
    if ("nccl" in low or "watchdog" in low or "distbackend" in low or "gloo" in low) \
            and _is_nccl(line, low):
        hits.append(("nccl", None))
    if ("kill" in low or "-9" in low or "137" in low or "signal" in low or "out of memory" in low) \
            and _KILLED.search(line):
        hits.append(("killed", None))
    if hits:
        text = _clip(raw)
        for kind, extra in hits:
            entry = {"line": lineno, "text": text}
            if extra:
                entry.update(extra)
            buckets[kind].add(entry)


# --------------------------------------------------------------------------- result

def _where(entry: dict, word: str) -> str:
    text = "%s %d" % (word, entry["line"])
    exc = entry.get("exception_line")
    if exc is not None and exc != entry["line"]:
        text += " (exception at %d)" % exc
    return text


def _quote(entry: dict) -> str:
    """A matched line as a finding message quotes it: its start, and where the part that matched
    lies past that (Megatron's "lm loss: NAN" 200 characters in), "… " and that part."""
    text = entry["text"]
    clipped = _clip(text, MAX_MSG_TEXT)
    said = entry.get("match")
    if not said or said in clipped.rstrip("\u2026") or said not in " ".join(text.split()):
        return clipped
    head = _clip(text, max(MAX_MSG_TEXT - len(said) - 2, 20)).rstrip("\u2026").rstrip()
    return head + " \u2026 " + said


def _finding(kind: str, bucket: _Bucket, where: str) -> dict:
    level, one, many, hint = KINDS[kind]
    entries = bucket.entries()
    first, last = entries[0], entries[-1]
    label = one if bucket.count == 1 else many
    msg = "%d %s" % (bucket.count, label)
    if kind == "traceback":
        empty = sum(1 for e in entries if e.get("empty_message"))
        if empty:
            msg += " (%d with an empty exception message)" % empty
            hint = ("an exception with an empty str() hides its cause: log repr(e) and the "
                    "traceback, not str(e); " + hint)
    if kind in ("xid", "xid-fatal"):
        counts = collections.OrderedDict()
        for e in entries:
            key = "%d on %s" % (e["xid"], e["device"])
            counts[key] = counts.get(key, 0) + 1
        msg += " (Xid %s)" % ", ".join(k if c == 1 else "%s \u00d7%d" % (k, c) for k, c in counts.items())
        derived = sum(1 for e in entries if e.get("derived"))
        if derived:
            msg += " (%d from the driver's \"fallen off the bus\" message, no Xid line)" % derived
        if load_xid() is None:
            msg += " (catalog not shipped)"
    msg += " \u2014 first at %s: %s" % (_where(first, where), _quote(first))
    if bucket.count > 1:
        msg += "; last at %s: %s" % (_where(last, where), _quote(last))
    return {"level": level, "code": kind, "message": msg, "hint": hint, "action": KIND_ACTION[kind]}


def _xid_actions(findings, buckets):
    """Each Xid finding's action: the worst of its Xids', after xid.py's rules across lines
    (48 with 63 or 64 on the same device: drain), over the lines kept of both Xid kinds. A rule
    that makes a line's Xid fatal is the fatal finding's only: an NVLink5 Xid graded by its
    line (149 Nonfatal on one GPU, Fatal on another) stays a warning beside its fatal kin."""
    if not (buckets["xid-fatal"].count or buckets["xid"].count):
        return                      # loads no xid.py or catalog (a compile and a parse)
    xm = load_xid()
    if xm is None:
        return
    events = [{"kind": "xid", "code": e["xid"], "pci": e["device"], "text": e["text"], "line": e["line"],
               "time": None} for k in ("xid-fatal", "xid") for e in buckets[k].entries()]
    by_code = {"xid-fatal": {}, "xid": {}}       # finding -> {Xid: worst action of its level}
    for f in xm.classify(events, []):
        code = int(f["code"].split("-", 1)[1])
        of_level = by_code["xid-fatal" if f["level"] == "fail" else "xid"]
        of_level[code] = xm.worst_action([of_level.get(code, "none"), f["action"]])
    for f in findings:
        if f["code"] in by_code:
            f["action"] = xm.worst_action([by_code[f["code"]].get(e["xid"], e["action"])
                                           for e in buckets[f["code"]].entries()])


def _empty_data(path: str, args) -> dict:
    return {
        "path": path, "exists": False, "size_bytes": None,
        "lines_requested": args.lines, "lines_scanned": 0,
        "first_line": None, "last_line": None, "line_numbers": "absolute",
        "window_truncated": False, "window_start_byte": None,
        "counts": collections.OrderedDict((k, 0) for k in KINDS), "total": 0,
        "matches": collections.OrderedDict((k, []) for k in KINDS),
        "omitted": collections.OrderedDict((k, 0) for k in KINDS),
    }


def run(args) -> dict:
    path = args.path
    data = _empty_data(path, args)
    max_bytes = getattr(args, "max_bytes", DEFAULT_MAX_BYTES)
    if not os.path.exists(path):
        return {"status": "fail", "summary": "log not found: %s" % path,
                "findings": [{"level": "fail", "code": "log-not-found",
                              "message": "log not found: %s" % path,
                              "hint": "check the path on the target (it is resolved there, not locally)",
                              "action": "none"}],
                "data": data}
    try:
        raw, first, size, window_start = tail_lines(path, args.lines, max_bytes, COUNT_PREFIX_LIMIT)
    except (IsADirectoryError, PermissionError, OSError) as e:
        reason = e.strerror or type(e).__name__
        data["exists"] = True
        return {"status": "fail", "summary": "log not readable: %s (%s)" % (path, reason),
                "findings": [{"level": "fail", "code": "log-unreadable",
                              "message": "log not readable: %s (%s)" % (path, reason),
                              "hint": "run as a user that can read it (hosts.yaml: become: sudo)",
                              "action": "none"}],
                "data": data}
    lines = [_decode(r) for r in raw]
    absolute = first is not None
    start = first if absolute else 1
    buckets = classify(lines, start)
    where = "line" if absolute else "window line"

    data.update({
        "exists": True, "size_bytes": size, "lines_scanned": len(lines),
        "first_line": start if lines else None,
        "last_line": (start + len(lines) - 1) if lines else None,
        "line_numbers": "absolute" if absolute else "relative",
        "window_truncated": window_start > 0, "window_start_byte": window_start,
        "counts": collections.OrderedDict((k, b.count) for k, b in buckets.items()),
        "total": sum(b.count for b in buckets.values()),
        "matches": collections.OrderedDict((k, b.entries()) for k, b in buckets.items()),
        "omitted": collections.OrderedDict((k, b.omitted()) for k, b in buckets.items()),
    })
    findings = [_finding(k, b, where) for k, b in buckets.items() if b.count]
    _xid_actions(findings, buckets)
    levels = [f["level"] for f in findings]
    status = "fail" if "fail" in levels else ("warn" if "warn" in levels else "ok")
    if not lines:
        summary = "%s is empty" % path
    else:
        scope = "all %d lines" % len(lines) if window_start == 0 else "last %d lines" % len(lines)
        if findings:
            parts = []
            for k, b in buckets.items():
                if b.count:
                    one, many = KINDS[k][1], KINDS[k][2]
                    parts.append("%d %s" % (b.count, one if b.count == 1 else many))
            summary = "%s in %s of %s" % (", ".join(parts), scope, path)
        else:
            summary = "no problems in %s of %s" % (scope, path)
    return {"status": status, "summary": summary, "findings": findings, "data": data}



if __name__ == "__main__":
    _result = run(build_parser().parse_args())
    print(json.dumps(_result, indent=2))
    sys.exit(_remote.exit_code(_result))
