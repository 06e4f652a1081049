"""mldiag's target-side runtime: runs one diagnostic under supervision and prints one framed result.

It arrives on the target through the exec channel's stdin, after a fixed one-line bootstrap
(``python3 -c BOOT``, see ``diagnostics/bundle.py``), so nothing but that constant ever crosses a
shell.  Wire format after the bootstrap, each part preceded by its byte length and a newline:
``stage A`` (version guard) · this file · header JSON · the diagnostic and any
extra files.  The channel's stdin then stays open: when it closes (the client went away or the
user pressed Ctrl-C), every process of the diagnostic is killed.

What it guarantees (DESIGN.md §3 invariants 3 and 5):
- a private temp directory (0700, files 0600), removed in every outcome unless ``keep``;
- the diagnostic runs as a child in its own process group; this process is its subreaper
  (``PR_SET_CHILD_SUBREAPER``), so descendants that call ``setsid()`` still come back to us and
  are killed when the diagnostic ends, times out, or the client goes away;
- exactly one result frame on stdout, whatever the diagnostic printed, raised or did.

Standard library only; Python 3.8+.  Runnable by hand for debugging::

    python3 _runtime.py --child TMPDIR      (internal: the diagnostic side of a spawned child)
"""

import json
import os
import select
import signal
import sys
import time

FRAME_BEGIN = "@@MLDIAG-RESULT-BEGIN %s@@"
FRAME_END = "@@MLDIAG-RESULT-END %s@@"
PR_SET_CHILD_SUBREAPER = 36
TERM_GRACE_S = 1.0
REAP_LIMIT_S = 5.0
MAX_LOG_RECORDS = 200
# Bounded capture of what the diagnostic prints: the head and the tail are kept.
CAPTURE_LIMITS = {"diagnostic": 16 * 1024, "script": 256 * 1024}
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


# ----------------------------------------------------------------------------- processes


def set_subreaper():
    """Become the subreaper of everything we start (Linux); False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:
        return False


def descendants(root_pid):
    """PIDs of every live descendant of ``root_pid``, read from /proc (Linux)."""
    children = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # comm may contain spaces and parentheses: the ppid follows the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) < 2 or fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    found, todo = [], [root_pid]
    while todo:
        for pid in children.get(todo.pop(), ()):
            found.append(pid)
            todo.append(pid)
    return found


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
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
    every live descendant is below one of our children, so there is nothing to kill."""
    try:
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return False
    except ChildProcessError:
        return True


def kill_tree(child_pid, grace):
    """Kill the diagnostic and every descendant (setsid ones included); returns how many."""
    if SUBREAPER[0] and no_children_left():   # the common case: skip scanning /proc
        return 0
    me = os.getpid()
    victims = set(descendants(me))
    if not os.path.isdir("/proc"):  # no /proc: the process group is the best we have
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(child_pid, sig)
            except OSError:
                pass
        return 1
    if grace > 0 and victims:
        signal_all(victims, signal.SIGTERM)
        end = time.time() + grace
        while time.time() < end and descendants(me):
            reap_children()
            time.sleep(0.02)
    end = time.time() + REAP_LIMIT_S
    while True:
        alive = descendants(me)
        victims.update(alive)
        if not alive or time.time() > end:
            break
        signal_all(alive, signal.SIGKILL)
        time.sleep(0.01)
        reap_children()
    reap_children()
    return len(victims)


# ----------------------------------------------------------------------------- child side


def _install_log_capture(records):
    """Warnings and log records (WARNING and up) go to the result's ``log``. The logging handler
    is installed when something imports logging (at once if it is already imported): a
    diagnostic that never logs does not pay logging's import (~12 ms of CPU on every target)."""
    import warnings

    def add(level, source, message):
        if len(records) < MAX_LOG_RECORDS:
            records.append({"level": level, "source": source, "message": message})

    def showwarning(message, category, filename, lineno, file=None, line=None):
        add("WARNING", category.__name__, "%s (%s:%s)" % (message, filename, lineno))

    warnings.showwarning = showwarning
    warnings.simplefilter("default")  # DeprecationWarnings too: they explain future breakage
    if "logging" in sys.modules:
        _add_log_handler(sys.modules["logging"], add)
    else:
        sys.meta_path.insert(0, _WhenLoggingIsImported(add))


def _add_log_handler(logging, add):
    class Capture(logging.Handler):
        def emit(self, record):
            try:
                add(record.levelname, record.name, record.getMessage())
            except Exception:
                add(record.levelname, record.name, repr(record.msg))

    logging.getLogger().addHandler(Capture(logging.WARNING))


class _WhenLoggingIsImported(object):
    """A meta path finder that only watches: it lets the normal finder find ``logging`` and
    adds our handler right after the module has executed, then steps aside."""

    def __init__(self, add):
        self.add = add

    def find_spec(self, name, path=None, target=None):
        if name != "logging":
            return None
        sys.meta_path.remove(self)
        import _frozen_importlib_external  # always loaded: the path finder itself
        spec = _frozen_importlib_external.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute, add = spec.loader.exec_module, self.add

        def exec_module(module):
            execute(module)
            _add_log_handler(module, add)

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


def _run_path(path, run_name):
    """runpy.run_path for a plain .py file, without runpy's imports (pkgutil, typing,
    importlib.util: ~5 ms of CPU on every target). The module is in sys.modules under
    ``run_name`` while it runs (pickle and multiprocessing find ``__main__`` classes there)."""
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    module = type(sys)(run_name)
    module.__dict__.update(__file__=path, __cached__=None, __loader__=None, __package__=None,
                           __spec__=None)
    sys.modules[run_name] = module
    exec(code, module.__dict__)
    return module.__dict__


def run_child(header, tmpdir):
    """The diagnostic's side: runs in the child process, writes result.json, never returns."""
    records = []
    outcome = {"exit_code": 0, "doc": None, "exception": None, "log": records}
    script = os.path.join(tmpdir, header["script"])
    argv = list(header.get("argv") or [])
    started = time.time()
    try:
        os.chdir(tmpdir)
        sys.argv = [script] + argv
        sys.path.insert(0, tmpdir)
        _install_log_capture(records)
        if header.get("mode") == "script":
            _run_path(script, "__main__")
        else:
            module = _run_path(script, "mldiag_diagnostic")
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
    path = os.path.join(tmpdir, RESULT_FILE)
    fd = os.open(path + ".part", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.rename(path + ".part", path)
    os._exit(0)


# ----------------------------------------------------------------------------- parent side


def _extract(blob, files, tmpdir):
    """Write the bundle's files (names and sizes from the header) into tmpdir, mode 0600."""
    offset = 0
    for name, size in files:
        if name.startswith("/") or ".." in name.split("/") or not name:
            raise ValueError("unsafe name in bundle: %r" % name)
        dest = os.path.join(tmpdir, name)
        parent = os.path.dirname(dest)
        if not os.path.isdir(parent):
            os.makedirs(parent, 0o700)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(blob[offset:offset + size])
        offset += size
    if offset != len(blob):
        raise ValueError("bundle size mismatch: %d bytes listed, %d received" % (offset, len(blob)))


def make_private_dir(parent=None):
    """mkdtemp without the tempfile module (its import costs every target): 0700, random name."""
    roots = [parent] if parent else [os.environ.get("TMPDIR"), "/tmp", "/var/tmp", os.getcwd()]
    error = None
    for root in [r for r in roots if r]:
        for _ in range(5):
            path = os.path.join(root, "mldiag-" + os.urandom(6).hex())
            try:
                os.mkdir(path, 0o700)
                return path
            except FileExistsError:
                continue
            except OSError as exc:
                error = exc
                break
    raise error or OSError("no writable temp directory")


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


def start_child(header, tmpdir, out_w, err_w, close_fds):
    """fork (fast: no second interpreter) or fork+exec when an activation is needed."""
    spawn = needs_spawn(header)
    argv = _spawn_argv(header, tmpdir) if spawn else None
    env = dict(os.environ)
    env.update(header.get("env") or {})
    env["MLDIAG_TMPDIR"] = tmpdir
    env["MLDIAG_TARGET"] = str(header.get("target") or "")
    if header.get("activate"):
        words = header["activate"]
        env["MLDIAG_ACTIVATE_SCRIPT"] = words[0]
        env["MLDIAG_ACTIVATE_CMD"] = " ".join(words[1:])
    pid = os.fork()
    if pid:
        return pid
    try:  # child
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
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
        os.environ.clear()
        os.environ.update(env)
        run_child(header, tmpdir)
    except BaseException:
        try:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(127)


def supervise(header, tmpdir, stdin_fd):
    """Run the diagnostic child; returns (outcome dict, status, capture_out, capture_err, notes)."""
    limit = CAPTURE_LIMITS.get(header.get("mode"), CAPTURE_LIMITS["diagnostic"])
    out, err = BoundedCapture(limit), BoundedCapture(limit)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    signal.set_wakeup_fd(wake_w)
    child = start_child(header, tmpdir, out_w, err_w, [out_r, err_r, wake_r, wake_w, stdin_fd])
    CHILD[0] = child
    os.close(out_w)
    os.close(err_w)
    timeout = float(header.get("timeout") or 300)
    deadline = time.time() + timeout
    status = None
    ended = None  # "exited" | "timeout" | "client-gone"
    streams = {out_r: out, err_r: err}
    watch = [out_r, err_r, wake_r, stdin_fd]
    while ended is None:
        remaining = deadline - time.time()
        if remaining <= 0:
            ended = "timeout"
            break
        try:
            ready, _, _ = select.select(watch, [], [], min(remaining, 1.0))
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
            else:
                chunk = os.read(fd, 65536)
                if chunk:
                    streams[fd].feed(chunk)
                else:
                    watch.remove(fd)
        statuses = reap_children()
        if child in statuses:
            status = statuses[child]
            if ended is None:
                ended = "exited"
    killed = kill_tree(child, TERM_GRACE_S if ended == "timeout" else 0)
    if status is None:
        try:
            _, status = os.waitpid(child, 0)
        except ChildProcessError:
            status = None
    # Drain what the (now dead) processes left in the pipes.
    for fd, capture in streams.items():
        if fd in watch:
            os.set_blocking(fd, False)
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                capture.feed(chunk)
        os.close(fd)
    signal.set_wakeup_fd(-1)
    os.close(wake_r)
    os.close(wake_w)
    outcome = None
    try:
        with open(os.path.join(tmpdir, RESULT_FILE)) as f:
            outcome = json.load(f)
    except (OSError, ValueError):
        pass
    return {"ended": ended, "status": status, "outcome": outcome, "out": out, "err": err,
            "killed": killed, "timeout": timeout}


def _status_of(doc_status, findings):
    order = ["ok", "warn", "fail", "error"]
    if doc_status in order:
        return doc_status
    worst = 0
    for f in findings:
        level = f.get("level") if isinstance(f, dict) else None
        if level in order:
            worst = max(worst, order.index(level))
    return order[worst]


def compose(header, run, started):
    """The result document from what ``supervise`` saw."""
    mode = header.get("mode")
    result = {"schema": 1, "diagnostic": header.get("diagnostic"), "target": header.get("target"),
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
                           "traceback": tb, "stderr": err_text or None}
        if out_text and mode != "script":
            result["log"].append({"level": "INFO", "source": "stdout", "message": out_text[-4096:]})

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
        result["summary"] = "exit %d" % code if not exc else "exit %d: %s: %s" % (
            code, exc["type"], exc["message"].splitlines()[0] if exc["message"] else "")
        result["data"] = {"exit_code": code, "stdout": out_text, "stderr": err_text,
                          "stdout_bytes": run["out"].total, "stderr_bytes": run["err"].total}
        if exc:
            result["data"]["exception"] = exc
    elif outcome.get("exception"):
        exc = outcome["exception"]
        error("crashed", exc["type"], exc["message"], exc["traceback"])
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
                result["log"].append({"level": "INFO", "source": "stderr", "message": err_text[-4096:]})
            if out_text.strip():
                result["log"].append({"level": "INFO", "source": "stdout", "message": out_text[-4096:]})
    result["duration_s"] = round(time.time() - started, 3)
    return result


def emit(nonce, result):
    data = ("\n" + FRAME_BEGIN % nonce + "\n" + json.dumps(result, default=repr) + "\n"
            + FRAME_END % nonce + "\n").encode("utf-8")
    view = memoryview(data)
    while view:
        try:
            n = os.write(1, view)
        except InterruptedError:
            continue
        view = view[n:]


def _read_exact(stream, n):
    data = stream.read(n)
    if data is None or len(data) != n:
        raise EOFError("bundle truncated: expected %d bytes, got %d" % (n, len(data or b"")))
    return data


def _remove_tree(path):
    """shutil.rmtree(path, ignore_errors=True) without importing shutil (it pulls in bz2, lzma
    and fnmatch: ~6 ms of CPU on every target). Symlinks are removed, never followed."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files + dirs:
            entry = os.path.join(root, name)
            try:
                if name in files or os.path.islink(entry):
                    os.unlink(entry)
                else:
                    os.rmdir(entry)
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass
    return not os.path.exists(path)


def main(stdin):
    """Entry from the bootstrap: ``stdin`` is the binary stdin positioned after this file."""
    started = time.time()
    header = json.loads(_read_exact(stdin, int(stdin.readline())).decode("utf-8"))
    blob = _read_exact(stdin, int(stdin.readline()))
    nonce = header["nonce"]
    tmpdir = None
    # A hangup or termination of this process is the client going away: clean up, exit.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt()))
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    uploading = True
    try:
        tmpdir = make_private_dir(header.get("tmpdir"))
        _extract(blob, header.get("files") or [], tmpdir)
        if needs_spawn(header):  # the child is a separate interpreter: it needs these on disk
            for name, data in ((RUNTIME_FILE, RUNTIME_SOURCE),
                               (HEADER_FILE, json.dumps(header).encode("utf-8"))):
                fd = os.open(os.path.join(tmpdir, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
        uploading = False
        SUBREAPER[0] = set_subreaper()
        run = supervise(header, tmpdir, stdin.fileno())
        result = compose(header, run, started)
        if run["ended"] == "client-gone":
            return
    except KeyboardInterrupt:
        if CHILD[0]:
            kill_tree(CHILD[0], 0)
        return
    except BaseException as exc:
        info = describe_exception(exc)
        layer = "upload" if uploading and isinstance(exc, (OSError, EOFError)) else "internal"
        if layer == "upload":  # say where: a full or read-only temp dir is the usual cause
            info["message"] = "writing %d bytes into %s: %s" % (
                len(blob), tmpdir or header.get("tmpdir") or "a temp dir", info["message"])
        result = {"schema": 1, "diagnostic": header.get("diagnostic"), "target": header.get("target"),
                  "status": "error", "summary": "%s: %s" % (layer, info["message"]), "findings": [],
                  "data": {}, "log": [], "duration_s": round(time.time() - started, 3),
                  "error": dict(info, layer=layer, stderr=None)}
    finally:
        if tmpdir and not header.get("keep"):
            _remove_tree(tmpdir)
    if tmpdir and header.get("keep"):
        result.setdefault("data", {})["remote_tmpdir"] = tmpdir
    emit(nonce, result)


RUNTIME_SOURCE = b""  # set by the bootstrap's stage A when the source is needed on disk


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        with open(os.path.join(sys.argv[2], HEADER_FILE)) as _f:
            run_child(json.load(_f), sys.argv[2])
    else:
        sys.stderr.write(__doc__)
        sys.exit(2)
