"""mldiag's stage A: the first code a target runs, right after the one-line bootstrap.

The bootstrap (``python3 -c BOOT``, ``diagnostics/core/wire.py``) reads this file from the exec
channel's stdin and runs it with ``b`` bound to that stdin. It refuses a Python older than 3.8
in a way the client recognises (so it must itself parse as Python 3.0), then reads the runtime
(``_runtime.py``) from the stream, runs it and hands it the rest of stdin.

The code cache. Compiling the runtime costs about 10 ms of CPU on every run, a diagnostic
script as much again: on a fleet of loopback targets that is a fifth of mldiag's work on the
target. So our own code, compiled, is kept per user and per Python on the target, under
``~/.cache/mldiag/code`` (the home directory of the effective user, from the password
database; ``$XDG_CACHE_HOME/mldiag/code`` where that names a directory of the user's own), and
loaded from there when the client names the same digest again. What is kept:
- only mldiag's own code (the runtime, its diagnostics and their companions), named by the
  SHA-256 the client computed of the source it sent, the Python's bytecode magic and its
  optimisation level; never a user's script or arguments, never anything of a run;
- written 0600 through a 0700 directory of the user's own, with O_EXCL|O_NOFOLLOW and an atomic
  rename; read only from a regular file of the user's own, through no link, bounded in size;
- at most MAX_ENTRIES files: older ones are removed when a new one is written.
A cache that is missing, unwritable (read-only home, no home), not the user's own, or
damaged is passed by: the source is compiled as before. ``code_cache: false`` in hosts.yaml
turns it off for a target (the client then sends no digest).

Runnable by hand only through the bootstrap; tests load it as a module (``__name__`` is not
``__main__`` then) and call ``load_code`` directly.
"""

import sys

MAX_ENTRIES = 64
MAX_CODE_BYTES = 8 * 1024 * 1024
CACHE_PATH = (".cache", "mldiag", "code")   # below the effective user's home directory


def _own_dir(parent_fd, name, create):
    """``name`` below ``parent_fd``: a directory of the effective user's own that nobody else may
    write, not reached through a link; made 0700 when missing and ``create``. None otherwise."""
    import os
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            return None
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
            fd = os.open(name, flags, dir_fd=parent_fd)
        except OSError:
            return None
    except OSError:
        return None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        return None
    return fd


def cache_dir(create=True):
    """An fd of the cache directory, or None: ``$XDG_CACHE_HOME/mldiag/code`` when that variable
    is an absolute path to a directory of the effective user's own, else
    ``~/.cache/mldiag/code`` below the effective user's home directory (from the password
    database, not $HOME: under sudo that may still be the caller's), which must be the user's own
    too: nothing is ever written into another user's directory."""
    import os
    start, path = os.environ.get("XDG_CACHE_HOME") or "", CACHE_PATH[1:]
    if not start.startswith("/"):
        try:
            import pwd
            start, path = pwd.getpwuid(os.geteuid()).pw_dir, CACHE_PATH
        except (ImportError, KeyError):
            return None
    if not start or not start.startswith("/"):
        return None
    try:
        fd = os.open(start, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return None
        for name in path:
            inner = _own_dir(fd, name, create)
            os.close(fd)
            fd = inner
            if fd is None:
                return None
        result, fd = fd, None
        return result
    finally:
        if fd is not None:
            os.close(fd)


def entry_name(digest):
    """The cache file of ``digest`` for this Python: digest, bytecode magic, optimisation."""
    magic = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER
    return "%s-%s-o%d" % (digest, magic.hex(), sys.flags.optimize)


def _read(dir_fd, name):
    import os
    import stat
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size > MAX_CODE_BYTES:
            return None
        chunks, left = [], st.st_size
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write(dir_fd, name, data):
    import os
    part = ".%s.%d.part" % (name, os.getpid())
    try:
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                     0o600, dir_fd=dir_fd)
    except OSError:
        return
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.close(fd)
        fd = None
        os.replace(part, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        part = None
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)
        if part is not None:
            try:
                os.unlink(part, dir_fd=dir_fd)
            except OSError:
                pass
    _prune(dir_fd, keep=name)


def _prune(dir_fd, keep):
    """Past MAX_ENTRIES files, the least recently written go (the one just written stays)."""
    import os
    try:
        names = os.listdir(dir_fd)
        if len(names) <= MAX_ENTRIES:
            return
        aged = []
        for n in names:
            if n != keep:
                try:
                    aged.append((os.stat(n, dir_fd=dir_fd, follow_symlinks=False).st_mtime, n))
                except OSError:
                    pass
        aged.sort()
        for _, n in aged[:len(names) - MAX_ENTRIES]:
            try:
                os.unlink(n, dir_fd=dir_fd)
            except OSError:
                pass
    except OSError:
        pass


def _renamed(code, filename):
    """``code`` with ``filename`` as its and every nested code object's file (the cached code was
    compiled from an earlier run's path; tracebacks and linecache read this one)."""
    consts = tuple(_renamed(c, filename) if isinstance(c, type(code)) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def load_code(source, filename, digest=""):
    """The code object of ``source``: from the cache when ``digest`` names it there, else compiled
    (and kept, when the cache can be written). ``digest``: the client's SHA-256 of ``source``
    (hex); empty: no cache."""
    if not digest or len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        return compile(source, filename, "exec", dont_inherit=True)
    import marshal
    import os
    fd = cache_dir()
    if fd is None:
        return compile(source, filename, "exec", dont_inherit=True)
    try:
        name = entry_name(digest)
        data = _read(fd, name)
        if data is not None:
            try:
                code = marshal.loads(data)
                if isinstance(code, type(_renamed.__code__)):
                    return code if code.co_filename == filename else _renamed(code, filename)
            except (ValueError, EOFError, TypeError):
                pass
        code = compile(source, filename, "exec", dont_inherit=True)
        _write(fd, name, marshal.dumps(code))
        return code
    finally:
        os.close(fd)


if __name__ == "__main__" and "b" in globals():
    if sys.version_info < (3, 8):
        sys.stdout.write("\n%s %s %s@@\n" % ("@@MLDIAG-OLD-PYTHON", ".".join(map(str, sys.version_info[:3])),
                                             sys.executable))
        sys.stdout.flush()
        raise SystemExit(0)
    # The cyclic GC is off in this process, the supervisor: it makes no garbage cycles worth a
    # pass, and passes over what the runtime imports cost ~2 ms of CPU a run. The diagnostic's
    # own process collects again (the runtime's start_child).
    import gc
    gc.disable()
    head = b.readline().split()   # noqa: F821 (the bootstrap's stdin): "SIZE [DIGEST]"
    src = b.read(int(head[0]))    # noqa: F821
    g = {"__name__": "mldiag_runtime", "__builtins__": __builtins__}
    exec(load_code(src, "mldiag/_runtime.py", head[1].decode("ascii") if len(head) > 1 else ""), g)
    g["RUNTIME_SOURCE"] = src
    g["load_code"] = load_code
    g["main"](b)   # noqa: F821
    # The frame is out (written with os.write) and the private dir is gone: end here, without
    # the interpreter's teardown (freeing every module: ~3.5 ms of CPU on every run). An
    # exception from main takes the ordinary way out, with its traceback.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    import os
    os._exit(0)
