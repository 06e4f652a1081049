"""mldiag's target-side runtime: runs one diagnostic under supervision and prints one framed result.

It arrives on the target through the exec channel's stdin, after a fixed one-line bootstrap
(``python3 -c BOOT``, see ``diagnostics/engine/bundle.py``), so nothing but that constant ever crosses a
shell.  Wire format after the bootstrap, each part preceded by its byte length and a newline:
``stage A`` (version guard and code cache, ``_stage_a.py``) · this file · header JSON · the
diagnostic and any extra files.  The channel's stdin then stays open: when it closes (the client went away or the
user pressed Ctrl-C), every process of the diagnostic is killed.

What it guarantees (docs/architecture.md, invariants 3, 5 and 9):
- a private temp directory (0700, files 0600), removed in every outcome unless ``keep``, written
  and removed through directory fds opened with O_NOFOLLOW, never by path; a parent directory
  that another user could change (writable by others without the sticky bit, or owned by
  someone else) is refused as an ``upload`` error;
- nothing secret stays on the target: ``env:`` values never reach a file, and the header, the
  result file and a run-script's $MLDIAG_RESULT file are gone before the dir is kept
  (``--keep-remote``) or removed;
- the diagnostic runs as a child in its own process group; this process is its subreaper
  (``PR_SET_CHILD_SUBREAPER``), so descendants that call ``setsid()`` still come back to us and
  are killed — until the kernel says none is left, fork-hoppers too — when the diagnostic ends,
  times out, or the client goes away;
- exactly one result frame on stdout, whatever the diagnostic printed, raised or did; of what it
  printed, a bounded head and tail are kept;
- with ``progress`` in the header (the client shows a live display), progress lines before the
  frame (``@@MLDIAG-PROGRESS nonce@@ {json}``, see ``diagnostics/core/wire.py``): the child's log
  records (INFO and up, through a pipe of their own, never the script's fds), its latest output
  line, and in script mode its output itself; at most one line per PROGRESS_INTERVAL_S, each
  bounded, all of them together bounded. Without ``progress`` none of this is set up.

Standard library only; Python 3.8+.  Runnable by hand for debugging::

    python3 _runtime.py --child TMPDIR      (internal: the diagnostic side of a spawned child)
"""

import gc
import json
import os
import select
import signal
import sys
import time

FRAME_BEGIN = "@@MLDIAG-RESULT-BEGIN %s@@"
FRAME_END = "@@MLDIAG-RESULT-END %s@@"
# The result statuses, best first: core/results.py STATUSES (tests/unit/test_order.py).
STATUSES = ("ok", "warn", "fail", "error")
PR_SET_CHILD_SUBREAPER = 36
TERM_GRACE_S = 1.0
# How long the runtime keeps killing what is left below it before it gives up and says so.
KILL_LIMIT_S = 5.0
MAX_LOG_RECORDS = 200
LOG_MESSAGE_LIMIT = 4096  # characters of one log record's message (head and tail kept)
# Bounded capture of what the diagnostic prints: the head and the tail are kept.
CAPTURE_LIMITS = {"diagnostic": 16 * 1024, "script": 256 * 1024}
PROGRESS_MARK = "@@MLDIAG-PROGRESS %s@@ "
PROGRESS_INTERVAL_S = 0.2       # at most 5 progress lines a second; newer news replaces older
PROGRESS_TEXT_LIMIT = 400       # characters of a record's text (a log message, an output line)
PROGRESS_CHUNK_LIMIT = 8 * 1024  # characters of script output in one progress line
PROGRESS_TOTAL_LIMIT = 2 * 1024 * 1024   # bytes of progress lines in a whole run
PROGRESS_FD_ENV = "MLDIAG_PROGRESS_FD"   # a spawned child's end of the log-record pipe
# `activate:` runs through sh with tokens from hosts.yaml only (validated, safe alphabet); the
# words reach sh through the environment, never through a command line.
ACTIVATE_SH = ('[ -r "$MLDIAG_ACTIVATE_SCRIPT" ] || { echo "cannot read $MLDIAG_ACTIVATE_SCRIPT" >&2; exit 96; }\n'
               '. "$MLDIAG_ACTIVATE_SCRIPT" || exit 97\n'
               '$MLDIAG_ACTIVATE_CMD || exit 98\n'
               'unset MLDIAG_ACTIVATE_SCRIPT MLDIAG_ACTIVATE_CMD\n'
               'exec "$@"\n')
EXIT_ACTIVATE_FAILED = (96, 97, 98)
# Our own files in the private temp dir; named so a user's script or --put file cannot clash.
RUNTIME_FILE, HEADER_FILE, RESULT_FILE = ".mldiag-runtime.py", ".mldiag-header.json", ".mldiag-result.json"
# run-script: where the script may report findings (its path in $MLDIAG_RESULT), read back once
# the script and all it started are gone: a regular file of at most REPORT_LIMIT bytes, never
# through a link; its text rides in the result and the client's gate (wire.py) judges it.
REPORT_FILE, REPORT_ENV = ".mldiag-script-result.json", "MLDIAG_RESULT"
REPORT_LIMIT = 1024 * 1024   # bytes; wire.MAX_REPORT_BYTES says the same (test_script_result.py)
CHILD = [None]  # pid of the running diagnostic, for the hangup handler
SUBREAPER = [False]  # whether orphaned descendants come back to us
SIGNAL_NAMES = dict((getattr(signal, n), n) for n in dir(signal)
                    if n.startswith("SIG") and not n.startswith("SIG_") and isinstance(getattr(signal, n), int))


# ----------------------------------------------------------------------------- capture


class BoundedCapture(object):
    """Keeps the first and last ``limit`` bytes of a stream and counts the rest."""

    def __init__(self, limit):
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data):
        self.total += len(data)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.limit:
                del self.tail[:len(self.tail) - self.limit]

    @property
    def dropped(self):
        return self.total - len(self.head) - len(self.tail)

    def text(self):
        out = bytes(self.head).decode("utf-8", "replace")
        if self.dropped:
            out += "\n[... %d bytes not kept ...]\n" % self.dropped
        return out + bytes(self.tail).decode("utf-8", "replace")


def head_and_tail(text, limit=LOG_MESSAGE_LIMIT):
    """``text`` cut to about ``limit`` characters: the first half and the last half are kept (the
    first error and the final state are both worth reading), with a note of what was cut."""
    if len(text) <= limit:
        return text
    half = (limit - 64) // 2   # room for the note: the whole stays within limit
    return "%s\n[... %d characters not kept ...]\n%s" % (text[:half], len(text) - 2 * half, text[-half:])


# ----------------------------------------------------------------------------- processes


def set_subreaper():
    """Become the subreaper of everything we start (Linux); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _prctl()(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:
        return False


def _prctl():
    """libc's prctl through _ctypes, the C module under ctypes: importing the ctypes package
    (struct, its endian and type classes) costs ~1.3 ms of CPU more on every target. A function
    prototype is a CFuncPtr subclass, as ctypes' CFUNCTYPE builds it; ctypes where _ctypes
    differs."""
    try:
        import _ctypes

        class CInt(_ctypes._SimpleCData):
            _type_ = "i"

        class Prototype(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
            _restype_ = CInt

        return Prototype(_ctypes.dlsym(_ctypes.dlopen(None), "prctl"))
    except Exception:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl


def _process_table():
    """{ppid: [(pid, pgrp), ...]} of every live (non-zombie) process, from one /proc scan."""
    children = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return children
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # comm may contain spaces and parentheses: state, ppid, pgrp follow the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) < 3 or fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append((int(name), int(fields[2])))
    return children


def descendants(root_pid, groups=None):
    """PIDs of every live descendant of ``root_pid``, read from /proc (Linux); the process group
    of each is added to ``groups`` when given."""
    children = _process_table()
    found, todo = [], [root_pid]
    while todo:
        for pid, pgrp in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
            if groups is not None:
                groups.add(pgrp)
    return found


def direct_children(pid):
    """This process's children (zombies too) from /proc/PID/task/PID/children: microseconds, where a
    /proc scan takes milliseconds. Read for the main thread only, the one orphans are reparented to
    (the runtime starts no threads). None where the kernel lacks the file (CONFIG_PROC_CHILDREN)."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid), "rb") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return None


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def kill_groups(groups, sig):
    """Signal whole process groups: the kernel delivers to every member at once and a fork racing
    with it is restarted, so a lineage that stays in one group cannot hop out. Never our own group
    (a descendant may join it) nor init's."""
    mine = os.getpgrp()
    for group in groups:
        if group > 1 and group != mine:
            try:
                os.killpg(group, sig)
            except OSError:
                pass


def reap_children():
    """Collect exit statuses of every child that has ended; returns {pid: status}."""
    statuses = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        statuses[pid] = status
    return statuses


def no_children_left():
    """True when this process has no child at all (reaping any that ended): as the subreaper,
    every live descendant is below one of our children, so there is nothing to kill. The kernel
    answers this in one call (ECHILD), unlike a /proc scan, which a fast-forking process can slip
    through between two reads."""
    try:
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return False
    except ChildProcessError:
        return True


def _sweep(me, victims, groups):
    """One /proc scan of everything below us: freeze it (SIGSTOP: a stopped process cannot fork
    while we signal the others), then SIGKILL each process and each of their process groups."""
    found = descendants(me, groups)
    victims.update(found)
    signal_all(found, signal.SIGSTOP)
    signal_all(found, signal.SIGKILL)
    kill_groups(groups, signal.SIGKILL)
    return found


def kill_tree(child_pid, grace):
    """Kill the diagnostic and every descendant (setsid ones and fork-hoppers included).

    Returns (how many processes were signalled, pids still alive when we gave up). As the
    subreaper we keep killing until the kernel says no child is left; each orphan lands on us as
    a direct child, which we read and kill within microseconds, so a process that forks and exits
    every half millisecond is caught. A process that SIGKILL cannot end (stuck in the kernel, state
    D) is given up on after KILL_LIMIT_S and reported. Without the subreaper (prctl refused) orphans
    leave our tree for init: we then stop when a scan after a kill finds nothing."""
    if SUBREAPER[0] and no_children_left():   # the common case: skip scanning /proc
        return 0, []
    me = os.getpid()
    if not os.path.isdir("/proc"):  # no /proc: the process group is the best we have
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(child_pid, sig)
            except OSError:
                pass
        return 1, []
    victims, groups = set(), set()
    if grace > 0:
        victims.update(descendants(me, groups))
        signal_all(victims, signal.SIGTERM)
        end = time.time() + grace
        while time.time() < end and descendants(me):
            reap_children()
            time.sleep(0.02)
    end = time.time() + KILL_LIMIT_S
    found = _sweep(me, victims, groups)
    pause = 0.0
    while time.time() < end:
        reap_children()
        if not SUBREAPER[0]:
            if not found:      # a scan after the kill found none
                break
            time.sleep(0.005)
            found = _sweep(me, victims, groups)
            continue
        if no_children_left():
            break
        kids = direct_children(me)
        if kids is None:       # no children file: scan all of /proc instead
            kids = _sweep(me, victims, groups)
        fresh = [k for k in kids if k not in victims]
        if fresh:              # an orphan just reparented to us: kill it now, before it forks
            victims.update(fresh)
            signal_all(fresh, signal.SIGKILL)
            pause = 0.0
        else:                  # only dying processes (or zombies being reaped): let them go
            if pause >= 0.02:  # ...and now and then look below them for ones we never saw
                _sweep(me, victims, groups)
            time.sleep(pause)
            pause = min(0.05, pause * 2 or 0.0005)
            signal_all(kids, signal.SIGKILL)
    reap_children()
    left = descendants(me) if not no_children_left() else []
    return len(victims), left


# ----------------------------------------------------------------------------- private temp dir

# Directories are opened with these flags: never through a symlink, never inherited by an exec.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
STICKY = 0o1000


class UnsafeTempParent(Exception):
    """The directory the private temp dir would go in can be changed by someone else."""


def check_temp_parent(fd, path):
    """Refuse a parent in which another user could rename our private dir and put a symlink in
    its place: one that others can write without the sticky bit, or one owned by someone who is
    neither root nor us (a directory's owner may rename anything in it, sticky bit or not). The
    checks are on the directory actually opened (fstat of ``fd``), so nothing can change between
    check and use; a symlink leading to it is followed, as mkdtemp and OpenSSH's StrictModes
    (which checks the resolved path) do: /tmp is a symlink on some systems."""
    st = os.fstat(fd)
    mode = st.st_mode & 0o7777
    if mode & 0o022 and not mode & STICKY:
        who = "every user" if mode & 0o002 else "group %d" % st.st_gid
        raise UnsafeTempParent(
            "refusing temp dir parent %s: it is writable by %s without the sticky bit (mode %04o), "
            "so another user could swap our private dir for a symlink; use a directory only this "
            "user can write, or one with the sticky bit like /tmp (mode 1777), as tmpdir: in "
            "hosts.yaml" % (path, who, mode))
    if st.st_uid not in (0, os.geteuid()):
        raise UnsafeTempParent(
            "refusing temp dir parent %s: it is owned by uid %d, neither root nor this user (uid "
            "%d), and its owner could swap our private dir for a symlink; set tmpdir: in "
            "hosts.yaml to a directory of this user's or root's" % (path, st.st_uid, os.geteuid()))


class PrivateDir(object):
    """The diagnostic's private temp dir (0700), held open from its creation: files go in and the
    tree comes out through directory fds opened with O_NOFOLLOW, never by path (as coreutils' rm
    and systemd-tmpfiles do), so a symlink swapped in for the dir or anything in it cannot
    redirect a write or a removal. ``path`` is only for the child (MLDIAG_TMPDIR, its cwd) and
    for messages."""

    def __init__(self, path, fd, parent_fd, name):
        self.path, self.fd, self.parent_fd, self.name = path, fd, parent_fd, name
        st = os.fstat(fd)
        self.ident = (st.st_dev, st.st_ino)

    @classmethod
    def create(cls, parent=None):
        """mkdtemp without the tempfile module (its import costs every target): 0700, random name,
        in ``parent`` (hosts.yaml tmpdir:) or the first of $TMPDIR, /tmp, /var/tmp, the cwd that
        we can write in. A parent that is not safe is refused (UnsafeTempParent), not skipped."""
        roots = [parent] if parent else [os.environ.get("TMPDIR"), "/tmp", "/var/tmp", os.getcwd()]
        error = None
        for root in [r for r in roots if r]:
            try:
                parent_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
            except OSError as exc:
                error = exc
                continue
            try:
                check_temp_parent(parent_fd, root)
                for _ in range(5):
                    name = "mldiag-" + os.urandom(6).hex()
                    try:
                        os.mkdir(name, 0o700, dir_fd=parent_fd)
                    except FileExistsError:
                        continue
                    fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
                    if os.fstat(fd).st_uid != os.geteuid():   # swapped between mkdir and open
                        os.close(fd)
                        raise UnsafeTempParent("refusing temp dir %s/%s: not ours after mkdir" % (root, name))
                    return cls(os.path.join(root, name), fd, parent_fd, name)
            except OSError as exc:
                error = exc
            except BaseException:
                os.close(parent_fd)
                raise
            os.close(parent_fd)
        raise error or OSError("no writable temp directory")

    def write(self, name, data):
        """Create ``name`` (a plain file name: the bundle has no subdirectories) holding ``data``,
        mode 0600; never through a symlink, never over an existing file."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError("unsafe name in bundle: %r" % name)
        with os.fdopen(os.open(name, FILE_FLAGS, 0o600, dir_fd=self.fd), "wb") as f:
            f.write(data)

    def read(self, name):
        """The bytes of our file ``name`` (None when missing)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.fd)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def discard(self, name):
        try:
            os.unlink(name, dir_fd=self.fd)
        except OSError:
            pass

    def remove(self):
        """Remove the tree; returns notes on what could not be removed (empty when all went). The
        dir's own entry is removed by name from its parent's fd only while it is still our dir:
        if someone moved it and put something else there, that is left alone."""
        notes = []
        left = remove_contents(self.fd)
        if left:
            notes.append("%d entr%s in the temp dir %s could not be removed"
                         % (left, "y" if left == 1 else "ies", self.path))
        try:
            st = os.stat(self.name, dir_fd=self.parent_fd, follow_symlinks=False)
            same = (st.st_dev, st.st_ino) == self.ident
        except OSError:
            same = False
        if not same:
            notes.append("the temp dir %s was moved or replaced while the diagnostic ran: its "
                         "contents were removed, the entry now at that path was left alone" % self.path)
        elif not left:
            try:
                os.rmdir(self.name, dir_fd=self.parent_fd)
            except OSError as exc:
                notes.append("could not remove the temp dir %s: %s" % (self.path, exc))
        self.close()
        return notes

    def close(self):
        for fd in (self.fd, self.parent_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fd = self.parent_fd = -1


def remove_contents(top_fd):
    """Empty the directory open as ``top_fd``, depth first, through fds only; returns how many
    entries stayed. shutil.rmtree's fd walk without importing shutil (it pulls in bz2, lzma and
    fnmatch: ~6 ms of CPU on every target), iterative (no recursion limit), and: a directory is
    opened with O_NOFOLLOW and must still be the one listed (an entry swapped for a symlink is
    unlinked, its target untouched); another file system mounted inside is not entered; a
    read-only directory (0500) is made writable first (it is ours)."""
    top = os.fstat(top_fd)
    left = 0
    stack = [(top_fd, None, list(os.scandir(top_fd)))]   # (fd, name in the parent, entries to do)
    while stack:
        fd, name, entries = stack[-1]
        if not entries:
            stack.pop()
            if name is not None:
                os.close(fd)
                try:
                    os.rmdir(name, dir_fd=stack[-1][0])
                except OSError:
                    left += 1
            continue
        entry = entries.pop()
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue       # gone already
        if st.st_mode & 0o170000 != 0o040000:   # not a directory: a file, a symlink, a fifo...
            try:
                os.unlink(entry.name, dir_fd=fd)
            except OSError:
                left += 1
            continue
        if st.st_dev != top.st_dev:
            left += 1      # a mount point: never empty another file system
            continue
        try:
            sub = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
        except OSError:    # swapped for a symlink (ELOOP), a file, or unreadable
            try:
                os.unlink(entry.name, dir_fd=fd)
            except OSError:
                left += 1
            continue
        try:
            now = os.fstat(sub)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise OSError("swapped")
            if now.st_mode & 0o700 != 0o700:
                os.fchmod(sub, 0o700)
            sub_entries = list(os.scandir(sub))
        except OSError:
            os.close(sub)
            left += 1
            continue
        stack.append((sub, entry.name, sub_entries))
    return left


# ----------------------------------------------------------------------------- child side


def _install_log_capture(records, progress=None, script=False):
    """Warnings and log records (WARNING and up) go to the result's ``log``. The logging handler
    is installed when something imports logging (at once if it is already imported): a
    diagnostic that never logs does not pay logging's import (~12 ms of CPU on every target).
    ``progress`` (a ProgressPipe, when the client shows progress): every record of INFO and up,
    from any logger that lets it through, and every warning, is sent to the supervisor too.
    ``script`` (run-script): records are seen without a handler on the root logger, so the
    script's logging behaves as under a plain ``python script.py`` (its ``basicConfig`` takes
    effect; with no configuration, warnings reach its stderr through logging's last resort)."""
    import warnings

    def add(level, source, message):
        if len(records) < MAX_LOG_RECORDS:
            records.append({"level": level, "source": source, "message": head_and_tail(message)})

    def showwarning(message, category, filename, lineno, file=None, line=None):
        text = "%s (%s:%s)" % (message, filename, lineno)
        add("WARNING", category.__name__, text)
        if progress is not None:
            progress.send("WARNING", category.__name__, text)

    warnings.showwarning = showwarning
    warnings.simplefilter("default")  # DeprecationWarnings too: they explain future breakage
    if "logging" in sys.modules:
        _add_log_handler(sys.modules["logging"], add, progress, script)
    else:
        sys.meta_path.insert(0, _WhenLoggingIsImported(add, progress, script))


def _message(record):
    try:
        return record.getMessage()
    except Exception:
        return repr(record.msg)


def _add_log_handler(logging, add, progress=None, script=False):
    class Capture(logging.Handler):
        def emit(self, record):
            add(record.levelname, record.name, _message(record))

    if not script:
        logging.getLogger().addHandler(Capture(logging.WARNING))
    if progress is None and not script:
        return
    # Every record a logger handles passes through Logger.callHandlers once (it walks up to the
    # root itself): records of loggers that do not propagate (vLLM's) are seen too, and the
    # logger levels, the handlers and what the script prints stay exactly as they were.
    call_handlers = logging.Logger.callHandlers
    info, warning = logging.INFO, logging.WARNING

    def callHandlers(self, record):
        try:
            if record.levelno >= info:
                message = _message(record)
                if script and record.levelno >= warning:
                    add(record.levelname, record.name, message)
                if progress is not None:
                    progress.send(record.levelname, record.name, message)
        except Exception:
            pass
        return call_handlers(self, record)

    logging.Logger.callHandlers = callHandlers


class ProgressPipe(object):
    """The child's end of the log-record pipe: one JSON line per record, written whole (at most
    PIPE_BUF bytes, so never interleaved with another thread's) and never waited for: when the
    pipe is full the record is dropped (the result's ``log`` keeps WARNING and up regardless)."""

    def __init__(self, fd):
        self.fd = fd
        os.set_blocking(fd, False)

    def send(self, level, source, message):
        for limit in (PROGRESS_TEXT_LIMIT, 64):
            data = (json.dumps({"level": str(level)[:20], "source": str(source)[:80],
                                "message": str(message)[:limit]}) + "\n").encode("ascii")
            if len(data) <= 4096:
                break
        else:
            return
        try:
            os.write(self.fd, data)
        except OSError:
            pass


class _WhenLoggingIsImported(object):
    """A meta path finder that only watches: it lets the normal finder find ``logging`` and
    adds our handler right after the module has executed, then steps aside."""

    def __init__(self, add, progress=None, script=False):
        self.add, self.progress, self.script = add, progress, script

    def find_spec(self, name, path=None, target=None):
        if name != "logging":
            return None
        sys.meta_path.remove(self)
        import _frozen_importlib_external  # always loaded: the path finder itself
        spec = _frozen_importlib_external.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute, add, progress, script = spec.loader.exec_module, self.add, self.progress, self.script

        def exec_module(module):
            execute(module)
            _add_log_handler(module, add, progress, script)

        spec.loader.exec_module = exec_module
        return spec


def describe_exception(exc):
    """type, message and traceback — never an empty message (``repr`` stands in)."""
    import traceback
    message = str(exc)
    if not message.strip():
        message = repr(exc)
    return {"type": type(exc).__module__ + "." + type(exc).__name__
            if type(exc).__module__ not in ("builtins", "exceptions") else type(exc).__name__,
            "message": message,
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))}


def _compiled(path, digest):
    """The code of the file at ``path``: through stage A's code cache (``load_code``, in our
    globals when stage A started us) when the client named the file's ``digest``, else compiled."""
    with open(path, "rb") as f:
        source = f.read()
    load = globals().get("load_code")
    if load is not None and digest:
        return load(source, path, digest)
    return compile(source, path, "exec", dont_inherit=True)


def _run_path(path, run_name, digest=""):
    """runpy.run_path for a plain .py file, without runpy's imports (pkgutil, typing,
    importlib.util: ~5 ms of CPU on every target). The module is in sys.modules under
    ``run_name`` while it runs (pickle and multiprocessing find ``__main__`` classes there).
    ``digest``: see ``_compiled``."""
    code = _compiled(path, digest)
    module = type(sys)(run_name)
    module.__dict__.update(__file__=path, __cached__=None, __loader__=None, __package__=None,
                           __spec__=None)
    sys.modules[run_name] = module
    exec(code, module.__dict__)
    return module.__dict__


def run_child(header, tmpdir, dir_fd=None, progress_fd=None):
    """The diagnostic's side: runs in the child process, writes the result file, never returns.
    The result goes in through ``dir_fd`` (the private dir, inherited by a forked child, opened
    before the diagnostic starts by a spawned one), never through the path: whatever the
    diagnostic does to its directory, the result cannot be written elsewhere. ``progress_fd``:
    the log-record pipe (a spawned child finds it in its environment: it is made close-on-exec
    again here and the variable removed, so what the diagnostic runs never inherits it)."""
    if dir_fd is None:
        dir_fd = os.open(tmpdir, os.O_RDONLY | os.O_DIRECTORY)
    if progress_fd is None and PROGRESS_FD_ENV in os.environ:
        try:
            progress_fd = int(os.environ.pop(PROGRESS_FD_ENV))
            os.set_inheritable(progress_fd, False)
        except (ValueError, OSError):
            progress_fd = None
    st = os.fstat(dir_fd)
    ident = (st.st_dev, st.st_ino)
    records = []
    outcome = {"exit_code": 0, "doc": None, "exception": None, "log": records}
    script = os.path.join(tmpdir, header["script"])
    argv = list(header.get("argv") or [])
    started = time.time()
    try:
        os.chdir(tmpdir)
        sys.argv = [script] + argv
        sys.path.insert(0, tmpdir)
        digests = header.get("code_digests") or {}
        _install_log_capture(records, ProgressPipe(progress_fd) if progress_fd is not None else None,
                             header.get("mode") == "script")
        if header.get("mode") == "script":
            _run_path(script, "__main__", digests.get(header["script"], ""))
        else:
            module = _run_path(script, "mldiag_diagnostic", digests.get(header["script"], ""))
            parsed = header.get("args")
            if isinstance(parsed, dict):
                # the client parsed argv with this script's own parser (bundle.parsed_args):
                # no argparse here. sys.implementation's type is types.SimpleNamespace.
                args = type(sys.implementation)(**parsed)
            else:
                args = module["build_parser"]().parse_args(argv)
            outcome["doc"] = module["run"](args)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            sys.stderr.write("%s\n" % (code,))
            code = 1
        outcome["exit_code"] = code
        if header.get("mode") != "script":
            outcome["exception"] = describe_exception(exc)
            outcome["exception"]["message"] = "diagnostic called sys.exit(%r)" % (exc.code,)
    except BaseException as exc:  # everything: KeyboardInterrupt, GeneratorExit, ...
        outcome["exit_code"] = 1
        outcome["exception"] = describe_exception(exc)
        if header.get("mode") == "script":
            sys.stderr.write(outcome["exception"]["traceback"])
    outcome["duration_s"] = time.time() - started
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    try:
        data = json.dumps(outcome, default=repr)
    except Exception as exc:  # a result that cannot be encoded is itself a crash
        outcome["doc"] = None
        outcome["exception"] = describe_exception(exc)
        data = json.dumps(outcome, default=repr)
    dir_fd = _same_dir(dir_fd, ident) or _same_dir(os.open(tmpdir, os.O_RDONLY | os.O_DIRECTORY), ident)
    part = RESULT_FILE + ".part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.rename(part, RESULT_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os._exit(0)


def _same_dir(fd, ident):
    """``fd`` if it still is the private dir (the diagnostic may have closed every fd, and the
    number may now be another file's), else None."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return fd if (st.st_dev, st.st_ino) == ident else None


# ----------------------------------------------------------------------------- parent side


def _extract(blob, files, private):
    """Write the bundle's files (names and sizes from the header) into the private dir, 0600."""
    view, offset = memoryview(blob), 0
    for name, size in files:
        private.write(name, view[offset:offset + size])
        offset += size
    if offset != len(blob):
        raise ValueError("bundle size mismatch: %d bytes listed, %d received" % (offset, len(blob)))


def header_on_disk(header):
    """The header a spawned child reads from the private dir: without ``env`` (values such as
    HF_TOKEN reach the child through its environment only, never a file on the target)."""
    return json.dumps(dict((k, v) for k, v in header.items() if k != "env")).encode("utf-8")


def _spawn_argv(header, tmpdir):
    """argv of a separately exec'd child (needed when the target has ``activate:``)."""
    runtime = os.path.join(tmpdir, RUNTIME_FILE)
    argv = [header.get("python") or sys.executable, runtime, "--child", tmpdir]
    if header.get("activate"):
        argv = ["sh", "-c", ACTIVATE_SH, "mldiag-activate"] + argv
    return argv


def needs_spawn(header):
    """A separately exec'd child: for ``activate:``, and for an ``env:`` that only a starting
    interpreter or dynamic loader reads (PYTHONPATH, PYTHONHOME, LD_LIBRARY_PATH, LD_PRELOAD...),
    which a forked child would silently ignore."""
    return bool(header.get("activate")) or any(
        k.startswith(("PYTHON", "LD_")) for k in (header.get("env") or {}))


def start_child(header, tmpdir, out_w, err_w, close_fds, dir_fd, progress_w=None):
    """fork (fast: no second interpreter) or fork+exec when an activation is needed. A forked
    child keeps ``dir_fd`` (the private dir) for its result; an exec closes it (O_CLOEXEC).
    ``progress_w``, the log-record pipe, stays open in the child (inherited across the exec of a
    spawned one, its number in MLDIAG_PROGRESS_FD); stdin, stdout and stderr are the usual ones."""
    spawn = needs_spawn(header)
    argv = _spawn_argv(header, tmpdir) if spawn else None
    extra = dict(header.get("env") or {})   # what the child's environment adds to ours
    extra["MLDIAG_TMPDIR"] = tmpdir
    extra["MLDIAG_TARGET"] = str(header.get("target") or "")
    if header.get("mode") == "script":
        extra[REPORT_ENV] = os.path.join(tmpdir, REPORT_FILE)
    if header.get("activate"):
        words = header["activate"]
        extra["MLDIAG_ACTIVATE_SCRIPT"] = words[0]
        extra["MLDIAG_ACTIVATE_CMD"] = " ".join(words[1:])
    env = dict(os.environ)
    env.update(extra)
    pid = os.fork()
    if pid:
        return pid
    try:  # child
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        if progress_w is not None and spawn:
            os.set_inheritable(progress_w, True)
            env[PROGRESS_FD_ENV] = str(progress_w)
        for fd in [f for f in close_fds if f > 2] + [devnull, out_w, err_w]:
            try:
                os.close(fd)
            except OSError:
                pass
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        if spawn:
            os.execvpe(argv[0], argv, env)
        os.environ.update(extra)   # not clear() and all again: each name is a putenv(3)
        # the diagnostic's process collects garbage again (stage A turned the collector off for
        # the supervisor); what it inherited is frozen: no pass walks it or copies its pages
        gc.freeze()
        gc.enable()
        run_child(header, tmpdir, dir_fd, progress_w)
    except BaseException:
        try:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(127)


class Progress(object):
    """The supervisor's progress lines on our stdout (before the result frame): what the child
    logs and prints, throttled to one line per PROGRESS_INTERVAL_S (newer news replaces older:
    the text is always the newest), each line bounded, all of them bounded by
    PROGRESS_TOTAL_LIMIT. In script mode the output itself rides along (up to the capture's
    limit per stream), in arrival order."""

    def __init__(self, nonce, script, started):
        self.mark = (PROGRESS_MARK % nonce).encode("ascii")
        self.script, self.started = script, started
        self.limit = CAPTURE_LIMITS["script"]
        self.news = None          # the newest record text not yet sent: dict
        self.coalesced = 0        # news replaced before it was sent
        self.output = []          # [[stream, text], ...] not yet sent (script mode)
        self.streamed = {"stdout": 0, "stderr": 0}
        self.partial = {"stdout": "", "stderr": ""}
        self.decoders = {}
        self.log_buf = b""
        self.last_log = None      # the newest log message: an output line echoing it adds nothing
        self.last = 0.0
        self.sent = 0
        self.seq = 0
        self.full = False         # PROGRESS_TOTAL_LIMIT reached: nothing more is sent

    def due(self, now):
        """Seconds until the next line may go (None: nothing waits)."""
        if self.news is None and not self.output:
            return None
        return max(0.0, self.last + PROGRESS_INTERVAL_S - now)

    def _set_news(self, news):
        if self.news is not None:
            self.coalesced += 1
        self.news = news

    def feed_output(self, name, chunk):
        if self.full:
            return
        decoder = self.decoders.get(name)
        if decoder is None:   # codecs is always loaded: no import cost
            import codecs
            decoder = self.decoders[name] = codecs.getincrementaldecoder("utf-8")("replace")
        text = decoder.decode(chunk)
        if not text:
            return
        if self.script and self.streamed[name] < self.limit:
            piece = text[:self.limit - self.streamed[name]]
            self.streamed[name] += len(piece)
            if self.output and self.output[-1][0] == name:
                self.output[-1][1] += piece
            else:
                self.output.append([name, piece])
        lines = (self.partial[name] + text).split("\n")
        self.partial[name] = lines[-1][-4096:]
        for line in reversed(lines):   # the newest line with something on it; of a line
            for segment in reversed(line.split("\r")):   # redrawn with \r, its last drawing
                segment = segment.strip()
                if segment:
                    if not (self.last_log and self.last_log in segment):
                        self._set_news({"text": segment[:PROGRESS_TEXT_LIMIT], "source": name})
                    return

    def feed_log(self, chunk):
        """Lines from the child's log-record pipe (ours, but the diagnostic could write there:
        anything that is not a record is skipped)."""
        if self.full:
            return
        lines = (self.log_buf + chunk).split(b"\n")
        self.log_buf = lines.pop()[-8192:]
        for line in lines:
            try:
                rec = json.loads(line.decode("utf-8"))
                news = {"text": str(rec["message"])[:PROGRESS_TEXT_LIMIT],
                        "level": str(rec["level"])[:20], "source": str(rec["source"])[:80]}
            except Exception:
                continue
            self.last_log = news["text"]
            self._set_news(news)

    def flush(self, now, force=False):
        """Send what waits, if its time has come (``force``: now, at the end)."""
        if self.news is None and not self.output:
            return
        if not force and now < self.last + PROGRESS_INTERVAL_S:
            return
        self.last = now
        while self.news is not None or self.output:
            record = {"seq": self.seq, "t": round(now - self.started, 3)}
            if self.news is not None:
                record.update(self.news)
                if self.coalesced:
                    record["coalesced"] = self.coalesced
                self.news, self.coalesced = None, 0
            room, output = PROGRESS_CHUNK_LIMIT, []
            while self.output and room > 0:
                name, text = self.output[0]
                output.append([name, text[:room]])
                room -= len(text[:room])
                if len(text) > len(output[-1][1]):
                    self.output[0][1] = text[len(output[-1][1]):]
                else:
                    self.output.pop(0)
            if output:
                record["output"] = output
            self.seq += 1
            line = self.mark + json.dumps(record).encode("ascii") + b"\n"
            if self.sent + len(line) > PROGRESS_TOTAL_LIMIT:
                self.news, self.output, self.full = None, [], True
                return
            self.sent += len(line)
            _write_all(line)
            if not force:     # what is left of the output goes next time
                return


def _write_all(data):
    view = memoryview(data)
    while view:
        try:
            n = os.write(1, view)
        except InterruptedError:
            continue
        view = view[n:]


def supervise(header, private, stdin_fd, started=None):
    """Run the diagnostic child; returns (outcome dict, status, capture_out, capture_err, notes)."""
    limit = CAPTURE_LIMITS.get(header.get("mode"), CAPTURE_LIMITS["diagnostic"])
    out, err = BoundedCapture(limit), BoundedCapture(limit)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    progress = prog_r = prog_w = None
    if header.get("progress"):
        progress = Progress(header["nonce"], header.get("mode") == "script", started or time.time())
        prog_r, prog_w = os.pipe()
    signal.signal(signal.SIGCHLD, lambda *a: None)
    signal.set_wakeup_fd(wake_w)
    child = start_child(header, private.path, out_w, err_w,
                        [out_r, err_r, wake_r, wake_w, stdin_fd, private.parent_fd]
                        + ([prog_r] if progress else []), private.fd, prog_w)
    CHILD[0] = child
    os.close(out_w)
    os.close(err_w)
    if prog_w is not None:
        os.close(prog_w)
    timeout = float(header.get("timeout") or 300)
    deadline = time.time() + timeout
    status = None
    ended = None  # "exited" | "timeout" | "client-gone"
    streams = {out_r: out, err_r: err}
    names = {out_r: "stdout", err_r: "stderr"}
    watch = [out_r, err_r, wake_r, stdin_fd] + ([prog_r] if progress else [])
    while ended is None:
        now = time.time()
        remaining = deadline - now
        if remaining <= 0:
            ended = "timeout"
            break
        wait = min(remaining, 1.0)
        if progress is not None:
            due = progress.due(now)
            if due is not None:
                wait = min(wait, due)
        try:
            ready, _, _ = select.select(watch, [], [], wait)
        except InterruptedError:
            ready = []
        for fd in ready:
            if fd == wake_r:
                try:
                    os.read(wake_r, 4096)
                except OSError:
                    pass
            elif fd == stdin_fd:
                if not os.read(stdin_fd, 65536):
                    ended = "client-gone"
            elif fd == prog_r:
                chunk = os.read(fd, 65536)
                if chunk:
                    progress.feed_log(chunk)
                else:
                    watch.remove(fd)
            else:
                chunk = os.read(fd, 65536)
                if chunk:
                    streams[fd].feed(chunk)
                    if progress is not None:
                        progress.feed_output(names[fd], chunk)
                else:
                    watch.remove(fd)
        if progress is not None:
            progress.flush(time.time())
        statuses = reap_children()
        if child in statuses:
            status = statuses[child]
            if ended is None:
                ended = "exited"
    killed, left = kill_tree(child, TERM_GRACE_S if ended == "timeout" else 0)
    if status is None:
        try:
            _, status = os.waitpid(child, 0)
        except ChildProcessError:
            status = None
    # Drain what the (now dead) processes left in the pipes.
    for fd in [out_r, err_r] + ([prog_r] if progress else []):
        if fd in watch:
            os.set_blocking(fd, False)
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                if fd == prog_r:
                    progress.feed_log(chunk)
                else:
                    streams[fd].feed(chunk)
                    if progress is not None:
                        progress.feed_output(names[fd], chunk)
        os.close(fd)
    if progress is not None and ended != "client-gone":
        progress.flush(time.time(), force=True)
    signal.set_wakeup_fd(-1)
    os.close(wake_r)
    os.close(wake_w)
    outcome = None
    data = private.read(RESULT_FILE)
    private.discard(RESULT_FILE)   # it holds the unredacted result: never left on the target
    private.discard(HEADER_FILE)   # in case the child never got to remove it
    try:
        outcome = json.loads(data.decode("utf-8")) if data is not None else None
    except ValueError:
        pass
    run = {"ended": ended, "status": status, "outcome": outcome, "out": out, "err": err,
           "killed": killed, "left": left, "timeout": timeout}
    if header.get("mode") == "script":   # read after the kill: nothing of the script can swap it
        run["reported"] = read_report(private)
        private.discard(REPORT_FILE)     # like the result file: never left on the target
    return run


def read_report(private):
    """What a run-script script left at $MLDIAG_RESULT: None when nothing, else ``{"text": ...}``
    (the file's UTF-8 text, unparsed: the client's gate judges it) or ``{"problem": ...}`` (why it
    was not read). Only a regular file of at most REPORT_LIMIT bytes is read: a symlink is never
    followed, a FIFO or a device never opened (lstat first; then O_NOFOLLOW and fstat of what was
    opened, which must be the file looked at), and no more than the limit and one byte is read."""
    try:
        st = os.stat(REPORT_FILE, dir_fd=private.fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"problem": "could not be read: %s" % (exc.strerror or exc)}
    kind = st.st_mode & 0o170000
    if kind != 0o100000:
        return {"problem": "is a symbolic link, not followed" if kind == 0o120000 else "is not a regular file"}
    if st.st_size > REPORT_LIMIT:
        return {"problem": "holds %d bytes, over the limit of %d" % (st.st_size, REPORT_LIMIT)}
    chunks, size = [], 0
    try:
        fd = os.open(REPORT_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                     dir_fd=private.fd)
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                return {"problem": "was replaced while it was being read"}
            while size <= REPORT_LIMIT:   # it may have grown since: at most the limit and one byte
                chunk = os.read(fd, REPORT_LIMIT + 1 - size)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        return {"problem": "could not be read: %s" % (exc.strerror or exc)}
    if size > REPORT_LIMIT:
        return {"problem": "holds more than %d bytes, the limit" % REPORT_LIMIT}
    try:
        return {"text": b"".join(chunks).decode("utf-8")}
    except UnicodeDecodeError as exc:
        return {"problem": "is not UTF-8 text (byte %d)" % exc.start}


def _status_of(doc_status, findings):
    if doc_status in STATUSES:
        return doc_status
    worst = 0
    for f in findings:
        level = f.get("level") if isinstance(f, dict) else None
        if level in STATUSES:
            worst = max(worst, STATUSES.index(level))
    return STATUSES[worst]


def exception_line(exc):
    """``Type: first line of the message``; ``Type (empty message)`` for ``raise RuntimeError()``,
    whose message describe_exception filled with its repr (``RuntimeError()``, ``RuntimeError('')``)."""
    name = exc["type"].rsplit(".", 1)[-1]
    message = exc["message"] or ""
    if not message.strip() or message in ("%s()" % name, "%s('')" % name, '%s("")' % name):
        return "%s (empty message)" % exc["type"]
    return "%s: %s" % (exc["type"], message.splitlines()[0])


def compose(header, run, started):
    """The result document from what ``supervise`` saw."""
    mode = header.get("mode")
    result = {"schema": 2, "diagnostic": header.get("diagnostic"), "target": header.get("target"),
              "status": "error", "summary": "", "findings": [], "data": {}, "log": [],
              "error": None, "duration_s": 0.0}
    outcome = run["outcome"] or {}
    result["log"] = list(outcome.get("log") or [])
    out_text, err_text = run["out"].text(), run["err"].text()
    status = run["status"]

    def error(layer, type_, message, tb=None):
        result["status"] = "error"
        result["summary"] = "%s: %s" % (layer, message)
        result["error"] = {"layer": layer, "type": type_, "message": message,
                           "traceback": tb,
                           # a script's stderr is in data (below), shown once
                           "stderr": None if mode == "script" else (err_text or None)}
        if mode == "script":   # a script that timed out or was killed: what it printed still shows
            result["data"] = {"exit_code": None, "stdout": out_text, "stderr": err_text,
                              "stdout_bytes": run["out"].total, "stderr_bytes": run["err"].total}
        elif out_text:
            result["log"].append({"level": "INFO", "source": "stdout", "message": head_and_tail(out_text)})

    if run["left"]:   # SIGKILL could not end them (stuck in the kernel): say so, with their pids
        result["log"].append({"level": "WARNING", "source": "mldiag-runtime", "message":
                              "%d process(es) of the diagnostic still alive after %g s of SIGKILL "
                              "(stuck in the kernel?): pids %s" % (len(run["left"]), KILL_LIMIT_S,
                                                                     " ".join(map(str, run["left"])))})
    if run["ended"] == "timeout":
        error("timeout", "Timeout",
              "diagnostic ran past the %g s timeout; killed %d process(es)" % (run["timeout"], run["killed"]))
    elif run["ended"] == "client-gone":
        error("internal", "ClientGone", "the client went away")
    elif status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        error("killed", "Signal", "diagnostic killed by %s (signal %d)" % (SIGNAL_NAMES.get(sig, "?"), sig))
    elif status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) in EXIT_ACTIVATE_FAILED \
            and header.get("activate") and not run["outcome"]:
        error("interpreter", "ActivateFailed",
              "activation failed: %s (exit %d)" % (" ".join(header["activate"]), os.WEXITSTATUS(status)))
    elif not run["outcome"]:
        code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
        error("crashed", "Exit", "diagnostic process exited with code %s before reporting a result" % code)
    elif mode == "script":
        exc = outcome.get("exception")
        code = outcome.get("exit_code", 0)
        result["status"] = "ok" if code == 0 else "fail"
        result["summary"] = "exit %d: %s" % (code, exception_line(exc)) if exc else "exit %d" % code
        result["data"] = {"exit_code": code, "stdout": out_text, "stderr": err_text,
                          "stdout_bytes": run["out"].total, "stderr_bytes": run["err"].total}
        if exc:
            result["data"]["exception"] = exc
        if run.get("reported") is not None:   # judged and merged by the client (wire.py)
            result["reported"] = run["reported"]
    elif outcome.get("exception"):
        exc = outcome["exception"]
        error("crashed", exc["type"], exc["message"], exc["traceback"])
        result["summary"] = "crashed: " + exception_line(exc)
    elif header.get("returned"):   # a team's diagnostic: what run() returned is checked by
        result["status"] = "ok"    # the client, which names the file (wire.take_returned)
        result["returned"] = outcome.get("doc")
        if err_text.strip():
            result["log"].append({"level": "INFO", "source": "stderr", "message": head_and_tail(err_text)})
        if out_text.strip():
            result["log"].append({"level": "INFO", "source": "stdout", "message": head_and_tail(out_text)})
    else:
        doc = outcome.get("doc")
        if not isinstance(doc, dict):
            error("crashed", "BadResult", "run() returned %s, not a dict" % type(doc).__name__)
        else:
            findings = [f for f in (doc.get("findings") or []) if isinstance(f, dict)]
            result["findings"] = findings
            result["data"] = doc.get("data") if isinstance(doc.get("data"), dict) else {}
            result["status"] = _status_of(doc.get("status"), findings)
            result["summary"] = str(doc.get("summary") or result["status"])
            if err_text.strip():
                result["log"].append({"level": "INFO", "source": "stderr", "message": head_and_tail(err_text)})
            if out_text.strip():
                result["log"].append({"level": "INFO", "source": "stdout", "message": head_and_tail(out_text)})
    result["duration_s"] = round(time.time() - started, 3)
    return result


def emit(nonce, result):
    _write_all(("\n" + FRAME_BEGIN % nonce + "\n" + json.dumps(result, default=repr) + "\n"
                + FRAME_END % nonce + "\n").encode("utf-8"))


def _read_exact(stream, n):
    data = stream.read(n)
    if data is None or len(data) != n:
        raise EOFError("bundle truncated: expected %d bytes, got %d" % (n, len(data or b"")))
    return data


def main(stdin):
    """Entry from the bootstrap: ``stdin`` is the binary stdin positioned after this file."""
    started = time.time()
    header = json.loads(_read_exact(stdin, int(stdin.readline())).decode("utf-8"))
    blob = _read_exact(stdin, int(stdin.readline()))
    nonce = header["nonce"]
    private = None
    notes = []
    # A hangup or termination of this process is the client going away: clean up, exit.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    uploading = True
    try:
        private = PrivateDir.create(header.get("tmpdir"))
        _extract(blob, header.get("files") or [], private)
        if needs_spawn(header):  # the child is a separate interpreter: it needs these on disk
            private.write(RUNTIME_FILE, RUNTIME_SOURCE)
            private.write(HEADER_FILE, header_on_disk(header))
        uploading = False
        SUBREAPER[0] = set_subreaper()
        run = supervise(header, private, stdin.fileno(), started)
        result = compose(header, run, started)
        if run["ended"] == "client-gone":
            return
    except KeyboardInterrupt:
        if CHILD[0]:
            kill_tree(CHILD[0], 0)
        return
    except BaseException as exc:
        info = describe_exception(exc)
        layer = "upload" if uploading and isinstance(exc, (OSError, EOFError, UnsafeTempParent)) else "internal"
        if isinstance(exc, UnsafeTempParent):
            info["type"], info["traceback"] = "UnsafeTempParent", None   # a refusal: the message says it all
        elif layer == "upload":  # say where: a full or read-only temp dir is the usual cause
            info["message"] = "writing %d bytes into %s: %s" % (
                len(blob), private.path if private else header.get("tmpdir") or "a temp dir",
                info["message"])
        result = {"schema": 2, "diagnostic": header.get("diagnostic"), "target": header.get("target"),
                  "status": "error", "summary": "%s: %s" % (layer, info["message"]), "findings": [],
                  "data": {}, "log": [], "duration_s": round(time.time() - started, 3),
                  "error": dict(info, layer=layer, stderr=None)}
    finally:
        if private:
            private.discard(HEADER_FILE)
            private.discard(RESULT_FILE)
            private.discard(REPORT_FILE)
            if header.get("keep"):
                private.close()
            else:
                notes = private.remove()
    if private and header.get("keep"):
        result.setdefault("data", {})["remote_tmpdir"] = private.path
    for note in notes:
        result.setdefault("log", []).append({"level": "WARNING", "source": "mldiag-runtime", "message": note})
    emit(nonce, result)


RUNTIME_SOURCE = b""  # set by the bootstrap's stage A when the source is needed on disk


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _path = os.path.join(sys.argv[2], HEADER_FILE)
        with open(_path) as _f:
            _header = json.load(_f)
        os.unlink(_path)   # read once; nothing of the run stays on the target longer than needed
        run_child(_header, sys.argv[2])
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)
