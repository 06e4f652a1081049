#!/usr/bin/env python3
"""The Python stacks of a live CPython process, read from outside with the standard library
only: ``python3 pyframes.py PID`` prints them as JSON, in the shape of ``py-spy dump --json``.

What it reads: ``/proc/PID/maps`` for the mapped CPython (a ``libpython3.X.so`` or the executable
itself when libpython is linked in statically, PIE or not), that file's ELF symbol tables
(``.dynsym``, then ``.symtab``) for ``_PyRuntime`` and ``Py_Version``, then the process's memory
through ``os.pread`` on ``/proc/PID/mem``: the interpreters, their thread states, each thread's
chain of ``_PyInterpreterFrame`` and each frame's code object (qualified name, file name, and the
line decoded from ``co_linetable`` at the frame's current instruction). The process is neither
stopped nor ptrace-attached: a thread that runs while it is read may come out torn, and is read
again (at most 3 times) before it is reported with an ``<error>`` frame; blocked threads, the case
this is for, read the same as py-spy reads them.

Versions: CPython 3.11 (offsets checked on 3.11.2 and 3.11.7), 3.12 (3.12.1's), 3.13 (from the
``_Py_DebugOffsets`` table at the start of ``_PyRuntime``, checked for sanity); 64-bit
little-endian Linux, default (GIL, non-debug) builds. Anything else raises ``ReadError``: another
CPython version or a free-threaded 3.13 by name ("use py-spy"), a process that is not CPython, and
structures that do not read as the version's (a debug or patched build, garbage). Opening
``/proc/PID/mem`` (or maps) without the right to ptrace the target raises the kernel's
``PermissionError`` untouched.

As py-spy 0.4.3 gives them: ``name`` is the code's qualified name (``Outer.method``); C-stack
shim frames (owner FRAME_OWNED_BY_CSTACK, 3.12+; 3.11 has none) are skipped; ``is_entry`` is
3.11's frame flag (false on 3.12+), ``is_shim_entry`` true on the outermost frame only;
``short_filename`` is the path below the outermost directory without an ``__init__.py``
(``torch/distributed/distributed_c10d.py``, ``concurrent/futures/_base.py``, ``threading.py``),
looked at through ``/proc/PID/root``; for a file that cannot be seen from here, the path after
``site-packages/`` or ``dist-packages/``, else the base name. Unlike py-spy: ``active`` is null
(py-spy asks the OS whether the thread runs); ``thread_name`` is "MainThread" for the
interpreter's main thread (``_PyRuntime.main_thread``), null for the others (py-spy reads the
``threading`` module's names); ``owns_gil`` is null when the GIL state cannot be read; the
main thread comes first.

Limits: everything read from the target is untrusted and bounded: 64 threads (the main thread
always among them), 256 frames per thread (the innermost kept), 1024 bytes per string, 256 KiB of
line table per code object, 32 MiB and 200000 reads per dump, 10 s; cycles in the lists are
detected. Nothing but ``ReadError`` and ``PermissionError`` comes out of ``dump``.
"""

import array
import errno
import json
import os
import re
import struct
import sys
import time

MAX_THREADS = 64            # threads reported (the main thread first)
MAX_THREAD_NODES = 4096     # thread states looked at to find the main thread among them
MAX_INTERPRETERS = 16
MAX_FRAMES = 256            # frames reported per thread (innermost first)
MAX_FRAME_STEPS = 1024      # frames walked per thread, shim frames included
MAX_STRING = 1024           # bytes of a str's data read
MAX_LINETABLE = 256 * 1024
MAX_READ_BYTES = 32 * 1024 * 1024
MAX_READS = 200000
MAX_SECONDS = 10.0
THREAD_TRIES = 3
MAX_ELF_SECTION = 256 * 1024 * 1024

ERROR_FRAME = "<error>"


class ReadError(Exception):
    """The stacks cannot be read: the message says why, in one line."""


# --- the target's memory -------------------------------------------------------------------

class _Memory:
    """``pread`` on /proc/PID/mem, under a budget of bytes, reads and time."""

    def __init__(self, pid, proc):
        self.pid, self.proc = pid, proc
        self.fd = _open_proc(proc, pid, "mem", os.O_RDONLY)
        self.bytes = 0
        self.reads = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def close(self):
        os.close(self.fd)

    def read(self, addr, size, at_least=None):
        """``size`` bytes at ``addr`` (at least ``at_least`` of them when that is given: a read
        that may run past the end of a mapping)."""
        need = size if at_least is None else at_least
        if not isinstance(addr, int) or addr <= 0 or addr + size >= 1 << 63:
            raise ReadError("bad address 0x%x in the target's memory" % (addr or 0))
        self.reads += 1
        self.bytes += size
        if self.reads > MAX_READS or self.bytes > MAX_READ_BYTES:
            raise ReadError("read budget exhausted (%d reads, %d bytes): the structures read "
                            "are not what they seem" % (self.reads, self.bytes))
        if time.monotonic() > self.deadline:
            raise ReadError("reading took over %d s" % MAX_SECONDS)
        try:
            data = os.pread(self.fd, size, addr)
        except PermissionError:
            raise
        except OSError as e:
            if need < size and e.errno in (errno.EIO, errno.EFAULT):
                return self.read(addr, need)
            raise ReadError("cannot read the target's memory at 0x%x: %s"
                            % (addr, e.strerror or e)) from None
        if len(data) < need:
            if not data and not os.path.exists("%s/%d" % (self.proc, self.pid)):
                raise ReadError("process %d went away" % self.pid)
            raise ReadError("cannot read the target's memory at 0x%x (%d of %d bytes)"
                            % (addr, len(data), need))
        return data

    def ptr(self, addr):
        return struct.unpack("<Q", self.read(addr, 8))[0]


def _open_proc(proc, pid, name, flags=os.O_RDONLY):
    path = "%s/%d/%s" % (proc, pid, name)
    try:
        return os.open(path, flags)
    except PermissionError:
        raise
    except FileNotFoundError:
        raise ReadError("no process %d" % pid) from None
    except OSError as e:
        if e.errno == errno.ESRCH:
            raise ReadError("no process %d" % pid) from None
        raise ReadError("cannot open %s: %s" % (path, e.strerror or e)) from None


def _read_proc_text(proc, pid, name, limit=64 * 1024 * 1024):
    fd = _open_proc(proc, pid, name)
    try:
        chunks, total = [], 0
        while total < limit:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except PermissionError:
        raise
    except OSError as e:
        raise ReadError("cannot read %s/%d/%s: %s" % (proc, pid, name, e.strerror or e)) from None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "surrogateescape")


# --- where CPython is mapped, and its symbols ----------------------------------------------

_MAPS_LINE = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) ([0-9a-f]+) (\S+) (\d+)\s+(.*)$")
_LIBPYTHON = re.compile(r"^libpython(\d+)\.(\d+)")
_PYTHON_NAME = re.compile(r"python(\d+)\.(\d+)")


class _Mapped:
    """A file mapped into the target: where its offset 0 sits, and how to open it."""

    def __init__(self, path, inode, start, end):
        self.path, self.inode, self.start, self.end = path, inode, start, end


def _mapped_pythons(proc, pid):
    """The files that may hold ``_PyRuntime``: libpython first, then the executable."""
    maps = _read_proc_text(proc, pid, "maps")
    try:
        exe = os.readlink("%s/%d/exe" % (proc, pid))
    except PermissionError:
        raise
    except OSError:
        exe = None
    if exe and exe.endswith(" (deleted)"):
        exe = exe[:-len(" (deleted)")]
    first = {}
    for line in maps.splitlines():
        if "python" not in line and (not exe or exe not in line):
            continue
        m = _MAPS_LINE.match(line)
        if not m or not m.group(7).startswith("/"):
            continue
        path = m.group(7)
        if path.endswith(" (deleted)"):
            path = path[:-len(" (deleted)")]
        if int(m.group(4), 16) != 0 or path in first:
            continue
        first[path] = _Mapped(path, int(m.group(6)), int(m.group(1), 16), int(m.group(2), 16))
    libs = [f for p, f in first.items() if _LIBPYTHON.match(os.path.basename(p))]
    exes = [f for p, f in first.items() if p == exe]
    others = [f for p, f in first.items()
              if f not in libs and f not in exes and os.path.basename(p).startswith("python")]
    return libs + exes + others, exe


def _open_mapped(proc, pid, mapped):
    """The mapped file itself: through map_files (the very file), the target's root (its mount
    namespace), or its path here; the inode checked where the kernel gave one."""
    tries = ["%s/%d/map_files/%x-%x" % (proc, pid, mapped.start, mapped.end),
             "%s/%d/root%s" % (proc, pid, mapped.path), mapped.path]
    for path in tries:
        try:
            f = open(path, "rb")
        except OSError:
            continue
        try:
            if mapped.inode and os.fstat(f.fileno()).st_ino != mapped.inode:
                f.close()
                continue
        except OSError:
            f.close()
            continue
        return f
    return None


def _elf_read(f, offset, size):
    if not 0 <= size <= MAX_ELF_SECTION or not 0 <= offset < 1 << 40:
        raise ReadError("implausible ELF section (offset %d, size %d)" % (offset, size))
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ReadError("truncated ELF file")
    return data


def _elf_symbols(f, names):
    """{name: st_value} of the defined symbols among ``names`` (.dynsym first, then .symtab),
    and the virtual address that file offset 0 is loaded at, less the load bias."""
    ehdr = _elf_read(f, 0, 64)
    if ehdr[:4] != b"\x7fELF":
        raise ReadError("not an ELF file")
    if ehdr[4] != 2 or ehdr[5] != 1:
        raise ReadError("not a 64-bit little-endian ELF file")
    (e_phoff, e_shoff) = struct.unpack_from("<QQ", ehdr, 32)
    (e_phentsize, e_phnum, e_shentsize, e_shnum) = struct.unpack_from("<HHHH", ehdr, 54)
    base_vaddr = None
    if e_phentsize >= 56 and e_phnum:
        phdrs = _elf_read(f, e_phoff, e_phentsize * e_phnum)
        for i in range(e_phnum):
            p_type, _, p_offset, p_vaddr = struct.unpack_from("<IIQQ", phdrs, i * e_phentsize)
            if p_type == 1 and p_offset == 0:           # PT_LOAD holding file offset 0
                base_vaddr = p_vaddr
                break
            if p_type == 1 and base_vaddr is None:
                base_vaddr = (p_vaddr - p_offset) & ~0xfff
    if base_vaddr is None:
        raise ReadError("ELF file without a loadable segment")
    found = {}
    if e_shentsize < 64 or not e_shnum or not e_shoff:
        return found, base_vaddr
    shdrs = _elf_read(f, e_shoff, e_shentsize * e_shnum)
    sections = [struct.unpack_from("<IIQQQQII", shdrs, i * e_shentsize) for i in range(e_shnum)]
    for wanted_type in (11, 2):                          # SHT_DYNSYM, SHT_SYMTAB
        for (_, sh_type, _, _, sh_offset, sh_size, sh_link, _) in sections:
            if sh_type != wanted_type or sh_link >= len(sections):
                continue
            missing = [n for n in names if n not in found]
            if not missing:
                return found, base_vaddr
            strsec = sections[sh_link]
            strtab = _elf_read(f, strsec[4], strsec[5])
            symtab = _elf_read(f, sh_offset, sh_size - sh_size % 24)
            st_names = array.array("I")
            st_names.frombytes(symtab)
            if sys.byteorder != "little":
                st_names.byteswap()
            st_names = st_names[0::6].tolist()
            for name in missing:
                needle = name.encode() + b"\0"
                pos = strtab.find(needle)
                while pos != -1 and name not in found:
                    start = 0
                    while True:
                        try:
                            i = st_names.index(pos, start)
                        except ValueError:
                            break
                        shndx, value = struct.unpack_from("<HQ", symtab, i * 24 + 6)
                        if shndx != 0 and value:
                            found[name] = value
                            break
                        start = i + 1
                    pos = strtab.find(needle, pos + 1)
    return found, base_vaddr


def _find_runtime(proc, pid):
    """(address of _PyRuntime, address of Py_Version or None, path of the file that has them)."""
    candidates, exe = _mapped_pythons(proc, pid)
    problems = []
    for mapped in candidates:
        f = _open_mapped(proc, pid, mapped)
        if f is None:
            problems.append("cannot open %s" % mapped.path)
            continue
        try:
            with f:
                symbols, base_vaddr = _elf_symbols(f, ("_PyRuntime", "Py_Version"))
        except (OSError, ReadError, struct.error, ValueError, OverflowError, IndexError,
                MemoryError) as e:
            problems.append("%s: %s" % (mapped.path, e))
            continue
        if "_PyRuntime" not in symbols:
            continue
        bias = mapped.start - base_vaddr
        version = symbols.get("Py_Version")
        return bias + symbols["_PyRuntime"], (bias + version if version else None), mapped.path
    for mapped in candidates:
        m = _PYTHON_NAME.search(os.path.basename(mapped.path))
        if m and (int(m.group(1)), int(m.group(2))) < (3, 7):      # no _PyRuntime before 3.7
            raise ReadError("CPython %s.%s (%s, without _PyRuntime) is not known to the "
                            "standard-library reader; use py-spy"
                            % (m.group(1), m.group(2), mapped.path))
    what = exe or "an unknown executable"
    why = ("; " + "; ".join(problems)) if problems else ""
    raise ReadError("pid %d (%s) is not a CPython process: no _PyRuntime symbol in its "
                    "executable or a mapped libpython%s" % (pid, what, why))


# --- layouts per version -------------------------------------------------------------------

_COMMON = dict(ob_type=8, tp_name=24, str_length=16, str_state=32, bytes_size=16, bytes_sval=32,
               co_filename=112, co_name=120, co_qualname=128, co_linetable=136)

_LAYOUTS = {
    # Offsets from the 3.11 headers (identical in 3.11.2 and 3.11.7).
    (3, 11): dict(_COMMON, rt_interp_head=40, rt_main_thread=80, rt_tstate_current=576,
                  interp_gil=None, interp_next=0, interp_threads_head=16,
                  ts_next=8, ts_interp=16, ts_thread_id=152, ts_native_tid=160,
                  ts_cframe=56, cframe_current=8, ts_current_frame=None,
                  fr_code=32, fr_previous=48, fr_instr=56, fr_is_entry=68, fr_owner=69,
                  owner_cstack=None, co_firstlineno=72, co_code_adaptive=184,
                  ascii_size=48, compact_size=72),
    # Offsets from the 3.12.1 headers.
    (3, 12): dict(_COMMON, rt_interp_head=40, rt_main_thread=64, rt_tstate_current=None,
                  interp_gil=384, gil_holder=8, gil_locked=16, interp_next=0,
                  interp_threads_head=72, ts_next=8, ts_interp=16, ts_thread_id=136,
                  ts_native_tid=144, ts_cframe=56, cframe_current=0, ts_current_frame=None,
                  fr_code=0, fr_previous=8, fr_instr=56, fr_is_entry=None, fr_owner=70,
                  owner_cstack=3, co_firstlineno=68, co_code_adaptive=192,
                  ascii_size=40, compact_size=56),
}

# _Py_DebugOffsets of 3.13: field names in their order after cookie, version, free_threaded.
_DEBUG_OFFSETS_313 = (
    ("runtime", ("size", "finalizing", "interpreters_head")),
    ("interp", ("size", "id", "next", "threads_head", "gc", "imports_modules", "sysdict",
                "builtins", "ceval_gil", "gil_runtime_state", "gil_runtime_state_enabled",
                "gil_runtime_state_locked", "gil_runtime_state_holder")),
    ("ts", ("size", "prev", "next", "interp", "current_frame", "thread_id", "native_thread_id",
            "datastack_chunk", "status")),
    ("frame", ("size", "previous", "executable", "instr_ptr", "localsplus", "owner")),
    ("code", ("size", "filename", "name", "qualname", "linetable", "firstlineno", "argcount",
              "localsplusnames", "localspluskinds", "co_code_adaptive")),
    ("pyobject", ("size", "ob_type")),
    ("type", ("size", "tp_name", "tp_repr", "tp_flags")),
    ("tuple", ("size", "ob_item", "ob_size")),
    ("list", ("size", "ob_item", "ob_size")),
    ("dict", ("size", "ma_keys", "ma_values")),
    ("float", ("size", "ob_fval")),
    ("long", ("size", "lv_tag", "ob_digit")),
    ("bytes", ("size", "ob_size", "ob_sval")),
    ("unicode", ("size", "state", "length", "asciiobject_size")),
    ("gc", ("size", "collecting")),
)


def _layout_313(mem, runtime, version_hex):
    count = sum(len(fields) for _, fields in _DEBUG_OFFSETS_313)
    raw = mem.read(runtime, 24 + 8 * count)
    if raw[:8] != b"xdebugpy":
        raise ReadError("_PyRuntime of CPython 3.13 does not start with its debug offsets "
                        "(cookie %r)" % raw[:8])
    version, free_threaded = struct.unpack_from("<QQ", raw, 8)
    if version >> 16 != 0x030D:
        raise ReadError("_PyRuntime's debug offsets are for version 0x%x, not 3.13" % version)
    if free_threaded:
        raise ReadError("a free-threaded CPython 3.13 build is not known to the standard-library "
                        "reader; use py-spy")
    values = struct.unpack_from("<%dQ" % count, raw, 24)
    d, i = {}, 0
    for group, fields in _DEBUG_OFFSETS_313:
        for field in fields:
            d[group + "." + field] = values[i]
            i += 1
    # A table shifted by a layout change reads as nonsense: check what this reader relies on.
    sane = (d["pyobject.ob_type"] == 8 and d["bytes.ob_sval"] == 32 and d["bytes.ob_size"] == 16
            and d["unicode.asciiobject_size"] in (40, 48) and d["unicode.length"] == 16
            and all(v < 1 << 20 for v in values)
            and 0 < d["frame.owner"] < d["frame.size"] <= 256
            and d["code.co_code_adaptive"] < d["code.size"] <= 1024)
    if not sane:
        raise ReadError("CPython 0x%x's debug offsets are not in the 3.13 shape this reader "
                        "knows; use py-spy" % version_hex)
    gil = d["interp.gil_runtime_state"]
    return dict(ob_type=d["pyobject.ob_type"], tp_name=d["type.tp_name"],
                str_length=d["unicode.length"], str_state=d["unicode.state"],
                bytes_size=d["bytes.ob_size"], bytes_sval=d["bytes.ob_sval"],
                co_filename=d["code.filename"], co_name=d["code.name"],
                co_qualname=d["code.qualname"], co_linetable=d["code.linetable"],
                co_firstlineno=d["code.firstlineno"], co_code_adaptive=d["code.co_code_adaptive"],
                rt_interp_head=d["runtime.interpreters_head"],
                rt_main_thread=d["runtime.interpreters_head"] + 24,  # 3.13.0: 656 = 632 + 24
                rt_tstate_current=None, interp_gil=d["interp.ceval_gil"],
                gil_holder=d["interp.gil_runtime_state_holder"] - gil,
                gil_locked=d["interp.gil_runtime_state_locked"] - gil,
                interp_next=d["interp.next"], interp_threads_head=d["interp.threads_head"],
                ts_next=d["ts.next"], ts_interp=d["ts.interp"], ts_thread_id=d["ts.thread_id"],
                ts_native_tid=d["ts.native_thread_id"], ts_cframe=None, cframe_current=None,
                ts_current_frame=d["ts.current_frame"],
                fr_code=d["frame.executable"], fr_previous=d["frame.previous"],
                fr_instr=d["frame.instr_ptr"], fr_is_entry=None, fr_owner=d["frame.owner"],
                owner_cstack=3, ascii_size=d["unicode.asciiobject_size"],
                compact_size=d["unicode.asciiobject_size"] + 16)


# --- the reader ----------------------------------------------------------------------------

def _addr2line(table, firstlineno, target):
    """The line of the code unit at byte offset ``target``, from a 3.11+ location table
    (Objects/locations.md); None when the table ends before ``target``."""
    line = firstlineno
    addr = 0
    i, n = 0, len(table)

    def varint():
        nonlocal i
        if i >= n:
            raise IndexError
        b = table[i]
        i += 1
        value, shift = b & 63, 0
        while b & 64:
            if i >= n or shift > 60:
                raise IndexError
            b = table[i]
            i += 1
            shift += 6
            value |= (b & 63) << shift
        return value

    def svarint():
        v = varint()
        return -(v >> 1) if v & 1 else v >> 1

    if target < 0:
        return firstlineno
    try:
        while i < n:
            b = table[i]
            i += 1
            code = (b >> 3) & 15
            end = addr + ((b & 7) + 1) * 2
            if code == 15:                       # no location
                delta = 0
            elif code == 14:                     # long form
                delta = svarint()
                varint()
                varint()
                varint()
            elif code == 13:                     # no column
                delta = svarint()
            elif code >= 10:                     # one-line forms
                delta = code - 10
                i += 2
            else:                                # short forms
                delta = 0
                i += 1
            line += delta
            if addr <= target < end:
                return line
            addr = end
    except IndexError:
        return None
    return None


class _Reader:
    def __init__(self, pid, proc, mem, layout, version):
        self.pid, self.proc, self.mem, self.L, self.version = pid, proc, mem, layout, version
        self.types = {}          # type address -> tp_name
        self.strings = {}        # str address -> text
        self.codes = {}          # code address -> (name, filename, short, firstlineno, table addr)
        self.tables = {}         # bytes address -> (size, data read so far)
        self.shorts = {}
        self.exists = {}
        L = layout
        self.frame_len = max(L["fr_code"], L["fr_previous"], L["fr_instr"]) + 8
        self.frame_len = max(self.frame_len, L["fr_owner"] + 1)
        self.ts_len = max(L["ts_next"], L["ts_interp"], L["ts_thread_id"], L["ts_native_tid"],
                          L["ts_cframe"] or 0, L["ts_current_frame"] or 0) + 8
        self.code_len = max(L["co_filename"], L["co_name"], L["co_qualname"], L["co_linetable"],
                            L["co_firstlineno"]) + 8
        self.root = self._target_root()

    # objects

    @staticmethod
    def _pointer(addr, what):
        if not addr or addr & 7 or addr >= 1 << 63:
            raise ReadError("bad %s pointer 0x%x" % (what, addr))
        return addr

    def _type_name(self, obj_header):
        tp = struct.unpack_from("<Q", obj_header, self.L["ob_type"])[0]
        name = self.types.get(tp)
        if name is None:
            self._pointer(tp, "type")
            tp_name = self.mem.ptr(tp + self.L["tp_name"])
            if not tp_name or tp_name >= 1 << 63:
                raise ReadError("bad type name pointer 0x%x" % tp_name)
            raw = self.mem.read(tp_name, 64, at_least=1)
            name = re.sub(r"[^!-~]", "?", raw.split(b"\0", 1)[0].decode("ascii", "replace"))
            self.types[tp] = name
        return name

    def string(self, addr):
        text = self.strings.get(addr)
        if text is not None:
            return text
        L = self.L
        self._pointer(addr, "str")
        head = self.mem.read(addr, L["compact_size"] + 8, at_least=L["ascii_size"])
        if self._type_name(head) != "str":
            raise ReadError("object at 0x%x is not a str" % addr)
        length = struct.unpack_from("<q", head, L["str_length"])[0]
        state = struct.unpack_from("<I", head, L["str_state"])[0]
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if kind not in (1, 2, 4) or not 0 <= length < 1 << 31:
            raise ReadError("str at 0x%x has kind %d, length %d" % (addr, kind, length))
        size = min(length * kind, MAX_STRING // kind * kind)
        if compact:
            data_addr = addr + (L["ascii_size"] if ascii_ else L["compact_size"])
        else:
            if len(head) < L["compact_size"] + 8:
                raise ReadError("str at 0x%x is cut short" % addr)
            data_addr = struct.unpack_from("<Q", head, L["compact_size"])[0]
        if data_addr + size <= addr + len(head) and compact:
            data = head[data_addr - addr:data_addr - addr + size]
        else:
            data = self.mem.read(data_addr, size) if size else b""
        text = data.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], "replace")
        self.strings[addr] = text
        return text

    def code(self, addr):
        code = self.codes.get(addr)
        if code is not None:
            return code
        L = self.L
        self._pointer(addr, "code")
        raw = self.mem.read(addr, self.code_len)
        kind = self._type_name(raw)
        if kind != "code":
            if self.version < (3, 13):     # 3.13's f_executable may be something else: skipped
                raise ReadError("the code object of a frame at 0x%x is a %s" % (addr, kind))
            code = False
        else:
            filename_p, name_p, qualname_p, table_p = (
                struct.unpack_from("<Q", raw, L[k])[0]
                for k in ("co_filename", "co_name", "co_qualname", "co_linetable"))
            firstlineno = struct.unpack_from("<i", raw, L["co_firstlineno"])[0]
            filename = self.string(filename_p)
            try:
                name = self.string(qualname_p)
            except ReadError:
                name = self.string(name_p)
            code = (name, filename, firstlineno, table_p)
        self.codes[addr] = code
        return code

    def line(self, code_addr, code, instr):
        _, _, firstlineno, table_p = code
        target = instr - (code_addr + self.L["co_code_adaptive"]) if instr else -1
        if not -2 <= target < 1 << 28:
            return 0
        entry = self.tables.get(table_p)
        if entry is None:
            self._pointer(table_p, "co_linetable")
            head = self.mem.read(table_p, self.L["bytes_sval"])
            if self._type_name(head) != "bytes":
                raise ReadError("co_linetable at 0x%x is not bytes" % table_p)
            size = struct.unpack_from("<q", head, self.L["bytes_size"])[0]
            if not 0 <= size < 1 << 31:
                raise ReadError("co_linetable at 0x%x has size %d" % (table_p, size))
            entry = self.tables[table_p] = [min(size, MAX_LINETABLE), b""]
        size = entry[0]
        want = min(size, max(256, target * 2 + 64))
        while True:
            if len(entry[1]) < want:
                entry[1] = self.mem.read(table_p + self.L["bytes_sval"], want)
            line = _addr2line(entry[1], firstlineno, target)
            if line is not None or want >= size:
                return line if line is not None else 0
            want = min(size, want * 4)

    # paths

    def _target_root(self):
        root = "%s/%d/root" % (self.proc, self.pid)
        try:
            there, here = os.stat(root), os.stat("/")
        except OSError:
            return ""
        return "" if (there.st_dev, there.st_ino) == (here.st_dev, here.st_ino) else root

    def _exists(self, path):
        seen = self.exists.get(path)
        if seen is None:
            seen = self.exists[path] = os.path.exists(self.root + path)
        return seen

    def short_filename(self, filename):
        short = self.shorts.get(filename)
        if short is not None:
            return short
        if not filename.startswith("/"):
            short = filename
        elif not self._exists(filename):
            # Not to be seen from here: py-spy's result for an installed package's file.
            cut = max(filename.rfind("/site-packages/"), filename.rfind("/dist-packages/"))
            if cut >= 0:
                short = filename[filename.index("/", cut + 1) + 1:]
            else:
                short = os.path.basename(filename)
        else:
            # py-spy's: below the outermost directory that has no __init__.py.
            path = filename
            while True:
                parent = os.path.dirname(path)
                if parent == path:
                    break
                path = parent
                if not self._exists(os.path.join(parent, "__init__.py")):
                    break
            short = filename[len(path):].lstrip("/") or filename
        self.shorts[filename] = short
        return short

    # threads and frames

    def first_frame(self, ts_addr):
        L = self.L
        if L["ts_current_frame"] is not None:
            return self.mem.ptr(ts_addr + L["ts_current_frame"])
        cframe = self.mem.ptr(ts_addr + L["ts_cframe"])
        if not cframe:
            return 0
        return self.mem.ptr(self._pointer(cframe, "cframe") + L["cframe_current"])

    def frames(self, ts_addr):
        """The thread's frames, innermost first; on a torn or bad read, ReadError carrying what
        was read before it (``.frames``)."""
        L = self.L
        frames = []
        seen = set()
        try:
            addr = self.first_frame(ts_addr)
            steps = 0
            while addr:
                steps += 1
                if addr in seen:
                    raise ReadError("the frame list of a thread loops")
                if steps > MAX_FRAME_STEPS or len(frames) >= MAX_FRAMES:
                    break
                seen.add(addr)
                raw = self.mem.read(self._pointer(addr, "frame"), self.frame_len)
                code_addr, previous, instr = (struct.unpack_from("<Q", raw, L[k])[0]
                                              for k in ("fr_code", "fr_previous", "fr_instr"))
                owner = raw[L["fr_owner"]]
                if L["owner_cstack"] is not None and owner == L["owner_cstack"]:
                    addr = previous
                    continue
                code = self.code(code_addr)
                if code and code[1] not in ("", "<shim>"):
                    frames.append({
                        "name": code[0],
                        "filename": code[1],
                        "module": None,
                        "short_filename": self.short_filename(code[1]),
                        "line": self.line(code_addr, code, instr),
                        "locals": None,
                        "is_entry": bool(L["fr_is_entry"] is not None and raw[L["fr_is_entry"]]),
                        "is_shim_entry": False,
                    })
                addr = previous
        except ReadError as e:
            e.frames = frames
            raise
        if frames:
            frames[-1]["is_shim_entry"] = True        # as py-spy: the outermost frame
        return frames

    def gil_holder(self, runtime, interp):
        """The thread state holding the GIL of ``interp`` (0: none), or None if unknown."""
        L = self.L
        try:
            if L["rt_tstate_current"] is not None:
                return self.mem.ptr(runtime + L["rt_tstate_current"])
            gil = self.mem.ptr(interp + L["interp_gil"])
            if not gil:
                return None
            gil = self._pointer(gil, "GIL")
            locked = struct.unpack("<i", self.mem.read(gil + L["gil_locked"], 4))[0]
            return self.mem.ptr(gil + L["gil_holder"]) if locked else 0
        except ReadError:
            return None

    def thread_states(self, runtime):
        """[(interp, tstate address, thread_id, native_tid)], interpreters in list order."""
        L = self.L
        out = []
        interp = self.mem.ptr(runtime + L["rt_interp_head"])
        seen_interps = set()
        while interp and len(seen_interps) < MAX_INTERPRETERS:
            if interp in seen_interps:
                break
            seen_interps.add(interp)
            self._pointer(interp, "interpreter")
            ts = self.mem.ptr(interp + L["interp_threads_head"])
            seen = set()
            while ts and len(seen) < MAX_THREAD_NODES and ts not in seen:
                seen.add(ts)
                raw = self.mem.read(self._pointer(ts, "thread state"), self.ts_len)
                nxt, back, tid, native = (struct.unpack_from("<Q", raw, L[k])[0] for k in
                                          ("ts_next", "ts_interp", "ts_thread_id",
                                           "ts_native_tid"))
                if back != interp:
                    raise ReadError("thread state 0x%x does not point back to its interpreter "
                                    "0x%x: not the CPython %d.%d layout this reader knows (a "
                                    "debug or patched build?)" % ((ts, interp) + self.version))
                out.append((interp, ts, tid, native))
                ts = nxt
            interp = self.mem.ptr(interp + L["interp_next"])
        return out


def _version_of(mem, version_addr, path):
    if version_addr:
        hexversion = struct.unpack("<Q", mem.read(version_addr, 8))[0]
        major, minor = hexversion >> 24, (hexversion >> 16) & 0xff
        if major == 3 and minor < 100:
            return (major, minor), hexversion
    m = _PYTHON_NAME.search(os.path.basename(path))
    if m:
        return (int(m.group(1)), int(m.group(2))), None
    raise ReadError("cannot tell which CPython version %s is (no Py_Version symbol)" % path)


def dump(pid, proc="/proc"):
    """The Python threads of process ``pid`` as ``py-spy dump --json`` lists them, the main
    thread first. ReadError when they cannot be read; PermissionError when the kernel refuses
    to let this process read the target's memory (ptrace denied)."""
    try:
        pid = int(pid)
    except (TypeError, ValueError):
        raise ReadError("not a pid: %r" % (pid,)) from None
    if pid <= 0:
        raise ReadError("not a pid: %d" % pid)
    try:
        return _dump(pid, proc)
    except ReadError as e:
        message = str(e)
        if message.isprintable():
            raise
        raise ReadError("".join(c if c.isprintable() else "?" for c in message)) from None
    except PermissionError:
        raise
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            raise PermissionError(e.errno, e.strerror, e.filename) from None
        raise ReadError("reading pid %d: %s" % (pid, e)) from None
    except (struct.error, ValueError, IndexError, KeyError, OverflowError, TypeError,
            UnicodeError, MemoryError, RecursionError) as e:
        raise ReadError("reading pid %d: unexpected data (%s: %s)"
                        % (pid, type(e).__name__, e)) from None


def _dump(pid, proc):
    runtime, version_addr, path = _find_runtime(proc, pid)
    mem = _Memory(pid, proc)
    try:
        version, hexversion = _version_of(mem, version_addr, path)
        if version == (3, 13):
            layout = _layout_313(mem, runtime, hexversion or 0x030D0000)
        elif version in _LAYOUTS:
            layout = _LAYOUTS[version]
        else:
            raise ReadError("CPython %d.%d is not known to the standard-library reader; use "
                            "py-spy" % version)
        reader = _Reader(pid, proc, mem, layout, version)
        states = reader.thread_states(runtime)
        if not states:
            raise ReadError("pid %d runs CPython %d.%d with no thread states (starting or "
                            "exiting?)" % ((pid,) + version))
        main_id = struct.unpack("<Q", mem.read(runtime + layout["rt_main_thread"], 8))[0]
        main = [s for s in reversed(states) if main_id and s[2] == main_id]
        if not main:                       # an unexpected layout of _PyRuntime: the first thread
            main = [s for s in states if s[3] == pid]
        main = main[0] if main else None
        chosen = ([main] if main else []) + [s for s in states if s is not main]
        chosen = chosen[:MAX_THREADS]
        holders = {}
        threads, failures = [], []
        for interp, ts, tid, native in chosen:
            if interp not in holders:
                holders[interp] = reader.gil_holder(runtime, interp)
            for attempt in range(THREAD_TRIES):
                try:
                    frames = reader.frames(ts)
                    break
                except ReadError as e:
                    if attempt == THREAD_TRIES - 1:
                        failures.append(e)
                        frames = list(getattr(e, "frames", [])) + [{
                            "name": ERROR_FRAME, "filename": "", "module": None,
                            "short_filename": None, "line": 0, "locals": None,
                            "is_entry": False, "is_shim_entry": False}]
                    reader.codes.clear()
                    reader.strings.clear()
                    reader.tables.clear()
            holder = holders[interp]
            threads.append({
                "pid": pid,
                "thread_id": tid,
                "thread_name": "MainThread" if main is not None and ts == main[1] else None,
                "os_thread_id": native or None,
                "active": None,
                "owns_gil": None if holder is None else holder == ts,
                "frames": frames,
                "process_info": None,
            })
        if failures and len(failures) == len(threads):
            raise ReadError("no thread of pid %d could be read as CPython %d.%d: %s"
                            % ((pid,) + version + (failures[0],)))
        return threads
    finally:
        mem.close()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: pyframes.py PID\n")
        return 2
    try:
        threads = dump(argv[0])
    except PermissionError as e:
        sys.stderr.write("pyframes: permission denied reading %s (ptrace denied?)\n"
                         % (e.filename or "pid %s" % argv[0]))
        return 1
    except ReadError as e:
        sys.stderr.write("pyframes: %s\n" % e)
        return 1
    sys.stdout.write(json.dumps(threads, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
