"""gpu-status's NVML fallback, for a target where nvidia-smi is missing: pynvml when it is
installed, else a ctypes binding of the part of libnvidia-ml.so.1 gpu-status reads, with
pynvml's names and conventions. Standard library only; a companion of gpu_status.py (shipped
beside it, loaded by ``gpu_status.load_nvml`` only when nvidia-smi is missing).
"""

NVML_LIBRARY = "libnvidia-ml.so.1"


class NvmlError(Exception):
    """An NVML call returned something other than NVML_SUCCESS."""

    def __init__(self, value, text=""):
        Exception.__init__(self, text or "NVML error %d" % value)
        self.value = value


def load_nvml(mode="auto", cdll_loader=None):
    """The NVML API, as (api, how) or (None, why not).

    ``api`` follows pynvml's names and conventions (NVMLError, nvmlInit, nvmlDeviceGet...).
    """
    if mode == "off":
        return None, "NVML not tried (--nvml off)"
    why = []
    if mode in ("auto", "pynvml"):
        try:
            import pynvml  # nvidia-ml-py
            return pynvml, "pynvml"
        except ImportError as e:
            why.append("pynvml: %s" % e)
    if mode in ("auto", "ctypes"):
        try:
            if cdll_loader is None:
                import ctypes
                cdll_loader = ctypes.CDLL
            lib = cdll_loader(NVML_LIBRARY)
            return CtypesNvml(lib), "ctypes:" + NVML_LIBRARY
        except (OSError, ImportError) as e:
            why.append("%s: %s" % (NVML_LIBRARY, e))
    return None, "; ".join(why)


class CtypesNvml(object):
    """The part of NVML's C API gpu-status reads, with pynvml's Python conventions.

    Written from nvml.h's documented signatures: nvmlDevice_t is an opaque pointer, every
    function returns nvmlReturn_t (0 = NVML_SUCCESS), char buffers are caller-allocated.
    """

    NVMLError = NvmlError
    SUCCESS = 0
    ERROR_INSUFFICIENT_SIZE = 7
    ERROR_FUNCTION_NOT_FOUND = 13
    VALUE_NOT_AVAILABLE_ULL = 0xFFFFFFFFFFFFFFFF
    DEVICE_NAME_BUFFER = 96         # NVML_DEVICE_NAME_V2_BUFFER_SIZE
    UUID_BUFFER = 96                # NVML_DEVICE_UUID_V2_BUFFER_SIZE
    DRIVER_VERSION_BUFFER = 80      # NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

    def __init__(self, lib):
        import ctypes as C
        self._C = C
        self._lib = lib
        self._fns = {}

        class PciInfo(C.Structure):  # nvmlPciInfo_t (v3)
            _fields_ = [("busIdLegacy", C.c_char * 16), ("domain", C.c_uint), ("bus", C.c_uint),
                        ("device", C.c_uint), ("pciDeviceId", C.c_uint),
                        ("pciSubSystemId", C.c_uint), ("busId", C.c_char * 32)]

        class Memory(C.Structure):  # nvmlMemory_t, bytes
            _fields_ = [("total", C.c_ulonglong), ("free", C.c_ulonglong), ("used", C.c_ulonglong)]

        class Utilization(C.Structure):  # nvmlUtilization_t, percent
            _fields_ = [("gpu", C.c_uint), ("memory", C.c_uint)]

        class ProcessInfo(C.Structure):  # nvmlProcessInfo_t as used by the _v3 (and _v2) calls
            _fields_ = [("pid", C.c_uint), ("usedGpuMemory", C.c_ulonglong),
                        ("gpuInstanceId", C.c_uint), ("computeInstanceId", C.c_uint)]

        self.PciInfo, self.Memory, self.Utilization, self.ProcessInfo = PciInfo, Memory, Utilization, ProcessInfo

    # -- plumbing

    def _fn(self, names, argtypes, restype=None):
        C = self._C
        for name in names:
            if name in self._fns:
                return self._fns[name]
            try:
                fn = getattr(self._lib, name)
            except AttributeError:
                continue
            fn.argtypes = argtypes
            fn.restype = restype if restype is not None else C.c_int
            self._fns[name] = fn
            return fn
        raise NvmlError(self.ERROR_FUNCTION_NOT_FOUND, "Function Not Found: %s" % names[0])

    def _check(self, rc):
        if rc != self.SUCCESS:
            raise NvmlError(rc, self._error_string(rc))

    def _error_string(self, rc):
        try:
            fn = self._fn(["nvmlErrorString"], [self._C.c_int], self._C.c_char_p)
            s = fn(rc)
            return s.decode("utf-8", "replace") if s else "NVML error %d" % rc
        except NvmlError:
            return "NVML error %d" % rc

    def _string(self, names, size, *args):
        C = self._C
        buf = C.create_string_buffer(size)
        argtypes = [C.c_void_p] * len(args) + [C.c_char_p, C.c_uint]
        self._check(self._fn(names, argtypes)(*(list(args) + [buf, size])))
        return buf.value.decode("utf-8", "replace")

    def _uint(self, names, handle, *extra):
        C = self._C
        v = C.c_uint(0)
        argtypes = [C.c_void_p] + [C.c_int] * len(extra) + [C.POINTER(C.c_uint)]
        self._check(self._fn(names, argtypes)(handle, *(list(extra) + [C.byref(v)])))
        return v.value

    # -- the API (pynvml names)

    def nvmlInit(self):
        self._check(self._fn(["nvmlInit_v2", "nvmlInit"], [])())

    def nvmlShutdown(self):
        self._check(self._fn(["nvmlShutdown"], [])())

    def nvmlSystemGetDriverVersion(self):
        return self._string(["nvmlSystemGetDriverVersion"], self.DRIVER_VERSION_BUFFER)

    def nvmlSystemGetCudaDriverVersion_v2(self):
        C = self._C
        v = C.c_int(0)
        fn = self._fn(["nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"],
                      [C.POINTER(C.c_int)])
        self._check(fn(C.byref(v)))
        return v.value

    def nvmlDeviceGetCount(self):
        C = self._C
        v = C.c_uint(0)
        self._check(self._fn(["nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"],
                             [C.POINTER(C.c_uint)])(C.byref(v)))
        return v.value

    def nvmlDeviceGetHandleByIndex(self, index):
        C = self._C
        h = C.c_void_p()
        self._check(self._fn(["nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"],
                             [C.c_uint, C.POINTER(C.c_void_p)])(index, C.byref(h)))
        return h

    def nvmlDeviceGetName(self, h):
        return self._string(["nvmlDeviceGetName"], self.DEVICE_NAME_BUFFER, h)

    def nvmlDeviceGetUUID(self, h):
        return self._string(["nvmlDeviceGetUUID"], self.UUID_BUFFER, h)

    def nvmlDeviceGetPciInfo(self, h):
        C = self._C
        info = self.PciInfo()
        self._check(self._fn(["nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"],
                             [C.c_void_p, C.POINTER(self.PciInfo)])(h, C.byref(info)))
        return info

    def nvmlDeviceGetMemoryInfo(self, h):
        C = self._C
        mem = self.Memory()
        self._check(self._fn(["nvmlDeviceGetMemoryInfo"], [C.c_void_p, C.POINTER(self.Memory)])(h, C.byref(mem)))
        return mem

    def nvmlDeviceGetUtilizationRates(self, h):
        C = self._C
        u = self.Utilization()
        self._check(self._fn(["nvmlDeviceGetUtilizationRates"],
                             [C.c_void_p, C.POINTER(self.Utilization)])(h, C.byref(u)))
        return u

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._uint(["nvmlDeviceGetTemperature"], h, sensor)

    def nvmlDeviceGetPowerUsage(self, h):
        return self._uint(["nvmlDeviceGetPowerUsage"], h)

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._uint(["nvmlDeviceGetEnforcedPowerLimit"], h)

    def nvmlDeviceGetPersistenceMode(self, h):
        return self._uint(["nvmlDeviceGetPersistenceMode"], h)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        C = self._C
        v = C.c_ulonglong(0)
        fn = self._fn(["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"],
                      [C.c_void_p, C.POINTER(C.c_ulonglong)])
        self._check(fn(h, C.byref(v)))
        return v.value

    def nvmlDeviceGetCudaComputeCapability(self, h):
        C = self._C
        major, minor = C.c_int(0), C.c_int(0)
        self._check(self._fn(["nvmlDeviceGetCudaComputeCapability"],
                             [C.c_void_p, C.POINTER(C.c_int), C.POINTER(C.c_int)])(
            h, C.byref(major), C.byref(minor)))
        return major.value, minor.value

    def _two_uints(self, name, h):
        C = self._C
        a, b = C.c_uint(0), C.c_uint(0)
        self._check(self._fn([name], [C.c_void_p, C.POINTER(C.c_uint), C.POINTER(C.c_uint)])(
            h, C.byref(a), C.byref(b)))
        return a.value, b.value

    def nvmlDeviceGetMigMode(self, h):
        return self._two_uints("nvmlDeviceGetMigMode", h)

    def nvmlDeviceGetEccMode(self, h):
        return self._two_uints("nvmlDeviceGetEccMode", h)

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        C = self._C
        v = C.c_ulonglong(0)
        self._check(self._fn(["nvmlDeviceGetTotalEccErrors"],
                             [C.c_void_p, C.c_int, C.c_int, C.POINTER(C.c_ulonglong)])(
            h, error_type, counter_type, C.byref(v)))
        return v.value

    def nvmlDeviceGetRemappedRows(self, h):
        C = self._C
        vals = [C.c_uint(0) for _ in range(4)]
        self._check(self._fn(["nvmlDeviceGetRemappedRows"], [C.c_void_p] + [C.POINTER(C.c_uint)] * 4)(
            h, *[C.byref(v) for v in vals]))
        return tuple(v.value for v in vals)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        """[objects with .pid and .usedGpuMemory (bytes, None when not available)]."""
        C = self._C
        fn = self._fn(["nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"],
                      [C.c_void_p, C.POINTER(C.c_uint), C.POINTER(self.ProcessInfo)])
        count = C.c_uint(0)
        rc = fn(h, C.byref(count), None)
        if rc == self.SUCCESS:
            return []
        if rc != self.ERROR_INSUFFICIENT_SIZE:
            self._check(rc)
        for _ in range(3):  # processes may start between the two calls
            size = count.value + 8
            count = C.c_uint(size)
            infos = (self.ProcessInfo * size)()
            rc = fn(h, C.byref(count), infos)
            if rc == self.SUCCESS:
                out = []
                for i in range(count.value):
                    mem = infos[i].usedGpuMemory
                    out.append(_Proc(infos[i].pid, None if mem == self.VALUE_NOT_AVAILABLE_ULL else mem))
                return out
            if rc != self.ERROR_INSUFFICIENT_SIZE:
                self._check(rc)
        self._check(rc)
        return []

    def nvmlSystemGetProcessName(self, pid):
        C = self._C
        buf = C.create_string_buffer(1024)
        self._check(self._fn(["nvmlSystemGetProcessName"], [C.c_uint, C.c_char_p, C.c_uint])(pid, buf, 1024))
        return buf.value.decode("utf-8", "replace")


class _Proc(object):
    def __init__(self, pid, used):
        self.pid = pid
        self.usedGpuMemory = used
