"""Invoke and paramiko without what their imports load and a run never uses.

Measured with ``python -X importtime`` (2-core loopback machine, warm caches), a direct
``mldiag run-script`` on one target spent about 60 ms of its 0.33 s importing three things:
- ``unittest.mock`` (and with it ``asyncio`` and ``unittest``), 20-30 ms: ``invoke.context``
  imports its ``Mock`` at import time, for ``MockContext``, a testing aid;
- Invoke's vendored copy of PyYAML, 15-19 ms, for Invoke config files, while mldiag imports
  PyYAML itself for hosts.yaml. Invoke falls back to the installed ``yaml`` when its vendored
  copy is missing (``invoke/util.py``: packagers that unbundle it), so it is built to work on
  that one;
- ``importlib.metadata``, 12-24 ms: paramiko computes ``__version__`` (its client banner,
  ``SSH-2.0-paramiko_<version>``) with ``importlib.metadata.version("paramiko")``, which imports
  ``email``, ``csv``, ``zipfile``... and scans ``sys.path``.

Each stand-in is in ``sys.modules`` only while that one import runs and is taken out again
afterwards, so nothing imported later sees it; each is skipped when the real module is already
loaded (the test suite, ``inv``). A stand-in answers only the one name the library takes from it
and hands every other attribute to the real module: a library version that takes more from it
still works, it just pays for the real import again.
"""

import gc
import os
import sys
import threading
import types
from contextlib import contextmanager
from typing import Callable, Dict, Optional

_lock = threading.Lock()   # the stand-ins are process-wide: one import at a time installs them
_freezing = False          # set by the console script (``entry``): see ``freeze_what_imports_load``


def freeze_what_imports_load() -> None:
    """From now on, what an import through here loads (paramiko, at the first connection) is
    moved out of the cyclic GC's reach once loaded, as ``entry`` does with mldiag's own imports:
    modules, classes and functions that live until exit, which every full collection of the run
    would otherwise walk again. Only the console script asks for this; a library caller's (the
    test suite's) collector is left as it is."""
    global _freezing
    _freezing = True


class _LazyStandIn(types.ModuleType):
    """A module with some names of its own; any other name loads the real module (once the
    stand-in is out of sys.modules) and is taken from it."""

    def __init__(self, name: str, own: Dict[str, object]):
        super().__init__(name)
        self.__dict__.update(own)

    def __getattr__(self, attr):
        if attr.startswith("__") and attr.endswith("__"):
            # the import system's own questions (``__path__``: is it a package?) are not a use
            raise AttributeError(attr)
        return getattr(_real(self.__name__), attr)


def _real(name: str):
    """The real module ``name``, the stand-in taken out of sys.modules first."""
    import importlib
    if isinstance(sys.modules.get(name), _LazyStandIn):
        del sys.modules[name]
    return importlib.import_module(name)


def _import_with(name: str, stand_ins: Dict[str, Callable[[], object]]):
    """``import name`` with each absent module of ``stand_ins`` replaced by what its factory
    makes, for the duration of that import only."""
    loaded = sys.modules.get(name)
    if loaded is not None and not getattr(getattr(loaded, "__spec__", None), "_initializing", False):
        return loaded   # the common case, once per connection: no lock
    with _lock:
        if name in sys.modules:
            return sys.modules[name]
        placed = {}
        for module_name, make in stand_ins.items():
            if module_name not in sys.modules:
                module = make()
                if module is not None:
                    sys.modules[module_name] = placed[module_name] = module
        try:
            __import__(name)
        finally:
            for module_name, module in placed.items():
                if sys.modules.get(module_name) is module:
                    del sys.modules[module_name]
        if _freezing:
            gc.freeze()
        return sys.modules[name]


class _Mock:
    """``invoke.context.Mock``: ``unittest.mock.Mock`` itself, imported when ``MockContext``
    first makes one."""

    def __new__(cls, *args, **kwargs):
        from unittest.mock import Mock
        return Mock(*args, **kwargs)


def _mock_stand_in():
    return _LazyStandIn("unittest.mock", {"Mock": _Mock})


def _installed_yaml():
    try:
        with _lazy_patterns_of("yaml.reader"):
            import yaml   # PyYAML: a dependency of mldiag (hosts.yaml)
    except ImportError:
        return None   # Invoke imports its own copy as before
    return yaml


class LazyPattern:
    """``re.compile(pattern, flags)``, compiled when first used (two threads that use it first
    together may both compile it: the same pattern either way)."""

    def __init__(self, pattern, flags=0):
        self._args = (pattern, flags)
        self._compiled = None

    def __getattr__(self, attr):
        if self._compiled is None:
            import re
            self._compiled = re.compile(*self._args)
        value = getattr(self._compiled, attr)
        setattr(self, attr, value)   # the next use finds it without this call
        return value


@contextmanager
def _lazy_patterns_of(module_name: str):
    """While this runs, ``re.compile`` called from the module ``module_name`` returns a
    LazyPattern. PyYAML's pure-Python reader compiles its NON_PRINTABLE class (all of Unicode
    but the printable planes) at import: ~5.5 ms of every run, for a reader that mldiag, which
    parses with libyaml's CSafeLoader where it is installed, never uses there."""
    import re
    real = re.compile

    def compile(pattern, flags=0):
        if sys._getframe(1).f_globals.get("__name__") == module_name:
            return LazyPattern(pattern, flags)
        return real(pattern, flags)

    re.compile = compile
    try:
        yield
    finally:
        re.compile = real


def import_invoke():
    """The invoke package, imported without ``unittest.mock`` and with the installed PyYAML."""
    return _import_with("invoke", {"unittest.mock": _mock_stand_in,
                                   "invoke.vendor.yaml": _installed_yaml})


def distribution_version(package: str, search: Optional[str] = None) -> Optional[str]:
    """The ``Version:`` of the one ``<package>-*.dist-info`` beside the installed package (the
    directory ``importlib.metadata`` would find it in), or None when that is not exactly one
    readable directory: the caller then asks ``importlib.metadata`` itself."""
    if search is None:
        from importlib.util import find_spec
        spec = find_spec(package)
        if spec is None or not spec.origin:
            return None
        search = os.path.dirname(os.path.dirname(spec.origin))
    wanted = _normalized(package)
    try:
        found = [entry for entry in os.listdir(search) if entry.endswith(".dist-info")
                 and _normalized(entry[:-len(".dist-info")].rsplit("-", 1)[0]) == wanted]
    except OSError:
        return None
    if len(found) != 1:
        return None
    try:
        with open(os.path.join(search, found[0], "METADATA"), encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break    # the end of the headers
                key, _, value = line.partition(":")
                if key.lower() == "version" and value.strip():
                    return value.strip()
    except OSError:
        return None
    return None


def _normalized(name: str) -> str:
    """A distribution name as wheel directories spell it (PEP 503 without the dashes)."""
    return "".join("_" if c in "-." else c for c in name.lower())


def _metadata_stand_in():
    def version(distribution_name):
        found = distribution_version(distribution_name)
        if found is not None:
            return found
        return _real("importlib.metadata").version(distribution_name)

    return _LazyStandIn("importlib.metadata", {"version": version})


def import_paramiko():
    """``import paramiko``, its version read from its dist-info directly (and Invoke, which
    ``paramiko.config`` imports for ``Match exec``, as ``import_invoke`` does)."""
    import_invoke()
    return _import_with("paramiko", {"importlib.metadata": _metadata_stand_in})
