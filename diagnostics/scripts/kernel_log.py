#!/usr/bin/env python3
"""kernel_log: the kernel log, read -- the one reader of every script that reads it.

Standard library only, Python 3.8+. Shipped beside gpu_status.py (which reads this boot's log
while nvidia-smi answers) and node_check.py (whose xid.py reads a window of it once for all
checks). Apart from xid.py, whose parser and catalog a healthy log never needs: this file is
what gpu-status loads on every run (a compile each time, the run's private directory being new),
xid.py only when a log holds an NVRM line.

``read(run_tool, since, path, timeout, max_bytes)``: a saved file, node-check's window
(``since``) or this boot's log (``since=None``), as ``{"source", "text", "error", "hung"}``.

Run by hand: ``python3 kernel_log.py [SPAN]`` prints what it read (this boot's log without SPAN).
"""

from __future__ import annotations

import errno
import json
import os
import sys
import time

import _remote

DEFAULT_TIMEOUT = 10.0
MAX_LOG_BYTES = 16 * 1024 * 1024      # the last 16 MiB of a log are read, whatever its size


def _tail(text, limit=MAX_LOG_BYTES):
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    return cut[cut.find("\n") + 1:] if "\n" in cut else cut


def _secs(x):
    return ("%g" % x) if x == int(x) else ("%.1f" % x)


# journalctl(1) without -q prints this when nothing matches; with no journal files or no read
# access it says why on stderr besides ("No journal files were found.", "Hint: You are
# currently not seeing messages ...")
NO_ENTRIES = "-- No entries --"


def read(run_tool, since="24h", path=None, timeout=DEFAULT_TIMEOUT, max_bytes=MAX_LOG_BYTES):
    """The kernel log to classify: ``{"source": "file:PATH"|"/dev/kmsg"|"journalctl"|"dmesg"|None,
    "text", "error": str|None, "hung": [message, ...]}``. ``run_tool(argv, timeout) -> Tool`` runs a
    command (``_remote.Tool``).

    ``path`` (``--kernel-log-file``) first, its last ``max_bytes``. Else, with ``since`` a span
    (node-check's window): ``journalctl -k --since=-24h -o short-iso --no-pager``
    (systemd.time(7): a relative time is the span prefixed with "-"); its bare ``-- No entries
    --`` is a quiet window, not a fallback; when journalctl is missing, fails or prints nothing
    usable (no journal, no access), ``dmesg --time-format=iso`` (util-linux), then plain
    ``dmesg`` (busybox, old util-linux). With ``since`` None, this boot's log, ``timeout``
    bounding all sources together: see read_boot_log. A tool that does not answer within its
    time is named in ``hung``."""
    if path:
        return _read_file(path, max_bytes)
    if since is None:
        return read_boot_log(run_tool, timeout, max_bytes)
    span = str(since).strip().lstrip("-") or "24h"
    return _read_from_tools(run_tool, [["journalctl", "-k", "--since=-%s" % span, "-o", "short-iso", "--no-pager"],
                                       ["dmesg", "--time-format=iso"], ["dmesg"]],
                            max_bytes, [], time_left=lambda: timeout)


def _read_file(path, max_bytes):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError as e:
        return {"source": None, "text": "", "error": "%s: %s" % (path, e.strerror or e), "hung": []}
    text = data.decode("utf-8", "replace")
    if size > max_bytes and "\n" in text:
        text = text[text.find("\n") + 1:]
    return {"source": "file:%s" % path, "text": text, "error": None, "hung": []}


def _read_from_tools(run_tool, argvs, max_bytes, why, time_left, deadline=None, skip=lambda argv: None):
    """The first of ``argvs`` that prints a log; ``time_left()`` each one's timeout (none is
    started with less than MIN_TOOL_TIME left before ``deadline``), ``skip(argv)`` why not to run
    one (None: run it)."""
    hung = []
    for argv in argvs:
        shown = " ".join(argv[:2]) if argv[0] == "journalctl" else " ".join(argv)
        if argv == ["dmesg"] and any(w.startswith("dmesg:") and "not found" in w for w in why):
            continue
        reason = skip(argv)
        if reason:
            why.append("%s: %s" % (argv[0], reason))
            continue
        timeout = time_left()
        if deadline is not None and timeout <= MIN_TOOL_TIME:
            why.append("%s: no time left" % argv[0])
            continue
        t = run_tool(argv, timeout)
        if t.status == "missing":
            why.append("%s: not found" % argv[0])
            continue
        if t.status == "timeout":
            hung.append("`%s` did not answer within %s s" % (shown, _secs(timeout)))
            why.append("%s: no answer within %s s" % (shown, _secs(timeout)))
            if argv[0] == "dmesg":
                break
            continue
        if t.status == "skipped":
            why.append("%s: not run (it hung earlier in this run)" % argv[0])
            continue
        out = t.out or ""
        if argv[0] == "journalctl" and t.rc == 0 and out.strip() == NO_ENTRIES and not (t.err or "").strip():
            # a readable journal with nothing in the window: that is the answer (dmesg would
            # show the whole ring buffer since boot, Xids older than the window among it)
            return {"source": argv[0], "text": "", "error": None, "hung": hung}
        if t.rc == 0 and out.strip() and out.strip() != NO_ENTRIES:
            return {"source": argv[0], "text": _tail(out, max_bytes), "error": None, "hung": hung}
        said = next((l.strip() for l in ((t.err or "") + "\n" + out).splitlines() if l.strip()), "")
        why.append("%s: %s" % (shown, said[:200] or ("exit %s" % t.rc if t.rc else "no output")))
    return {"source": None, "text": "", "error": "; ".join(why) or "no kernel log", "hung": hung}


MIN_TOOL_TIME = 0.2     # seconds: less left of a budget is not worth starting a tool
KMSG = "/dev/kmsg"
JOURNAL_DIRS = ("/var/log/journal", "/run/log/journal")   # journald's Storage= persistent, volatile


def read_boot_log(run_tool, budget_s, max_bytes=MAX_LOG_BYTES, find=None):
    """This boot's kernel log, all sources within ``budget_s`` together (gpu-status reads it
    while nvidia-smi answers): /dev/kmsg first (no process to start), then ``dmesg``, then
    ``journalctl -k -b``. dmesg is not run where /dev/kmsg was refused (kernel.dmesg_restrict
    refuses dmesg's syslog(2) alike) unless it is setuid or has file capabilities; journalctl
    is not run without a system journal this user may read (kernel messages are only there).
    ``find(name)``: where a tool is (default: PATH)."""
    find = find or _remote.which
    deadline = time.monotonic() + budget_s
    why = []
    refused = False
    try:
        return {"source": KMSG, "text": read_kmsg(deadline, max_bytes), "error": None, "hung": []}
    except OSError as e:
        why.append("%s: %s" % (KMSG, e.strerror or e))
        refused = e.errno in (errno.EPERM, errno.EACCES)

    def skip(argv):
        if argv[0] == "dmesg" and refused:
            exe = find("dmesg")
            if exe and not privileged(exe):
                # a process that can only fail (on every non-root call of an ordinary host)
                return "not run (dmesg_restrict: it reads the buffer %s refused)" % KMSG
        if argv[0] == "journalctl" and find("journalctl") and not system_journal_readable():
            # without the system journal journalctl -k can only print nothing (it says why on stderr)
            return "not run (no system journal readable by this user in %s)" % " or ".join(JOURNAL_DIRS)
        return None
    return _read_from_tools(run_tool, [["dmesg"], ["journalctl", "-k", "-b", "-q", "--no-pager", "-o", "short-monotonic"]],
                            max_bytes, why, lambda: deadline - time.monotonic(), deadline, skip)


def system_journal_readable(dirs=None, readable=lambda path: os.access(path, os.R_OK)):
    """Whether journalctl could show this user a kernel message: some machine's system journal
    (``system.journal``, archived ``system@...journal``) that ``readable`` says we may read
    (``os.access`` honours the ACLs journald gives the adm and wheel groups)."""
    for base in (JOURNAL_DIRS if dirs is None else dirs):
        try:
            machines = os.listdir(base)
        except OSError:
            continue
        for machine in machines:
            try:
                names = os.listdir(os.path.join(base, machine))
            except OSError:
                continue
            for name in names:
                if name.startswith("system") and name.endswith((".journal", ".journal~")) \
                        and readable(os.path.join(base, machine, name)):
                    return True
    return False


def privileged(exe):
    """A setuid ``dmesg``, or one with file capabilities (CAP_SYSLOG), may read what we may not."""
    try:
        if os.stat(exe).st_mode & 0o4000:     # S_ISUID
            return True
        os.getxattr(exe, "security.capability")
        return True
    except (OSError, AttributeError):
        return False


def read_kmsg(deadline, max_bytes=MAX_LOG_BYTES):
    """All records in the kernel ring buffer, read without blocking, as dmesg-like lines."""
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    lines = []
    total = 0
    try:
        while time.monotonic() < deadline and total < max_bytes:
            try:
                rec = os.read(fd, 16384)
            except BlockingIOError:
                break  # EAGAIN: the end of the buffer
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten while reading: go on with the next
                    continue
                if e.errno == errno.EINVAL:
                    break
                raise
            if not rec:
                break
            total += len(rec)
            text = rec.decode("utf-8", "replace")
            head, _, msg = text.partition(";")
            parts = head.split(",")
            ts = ""
            if len(parts) >= 3 and parts[2].isdigit():
                ts = "[%12.6f] " % (int(parts[2]) / 1e6)
            lines.append(ts + msg.split("\n", 1)[0])
    finally:
        os.close(fd)
    return "\n".join(lines)


def _run_by_hand(argv, timeout):
    """A ``run_tool`` for running this file by hand: subprocess, bounded by ``timeout``."""
    import subprocess
    exe = _remote.which(argv[0])
    if exe is None:
        return _remote.Tool("missing", None, "", "", 0.0)
    t0 = time.monotonic()
    try:
        p = subprocess.run([exe] + argv[1:], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return _remote.Tool("timeout", None, "", "", time.monotonic() - t0)
    return _remote.Tool("ok", p.returncode, p.stdout.decode("utf-8", "replace"),
                        p.stderr.decode("utf-8", "replace"), time.monotonic() - t0)


if __name__ == "__main__":
    got = read(_run_by_hand, since=sys.argv[1] if len(sys.argv) > 1 else None)
    got["text"] = got["text"][-4000:]
    print(json.dumps(got, indent=2))
