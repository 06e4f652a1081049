"""Suite-wide: every command line any test sends to a hop is recorded, then checked last.

``MLDIAG_RECORD_COMMANDS`` (diagnostics/transport/base.py) is set for the whole session, so the
runner in this process and every ``mldiag``/``inv`` subprocess a test starts append each command
line, exactly as sent, to one file. tests/integration/test_command_lines.py reads it after all
other tests have run (it is moved to the end of the run below).
"""

import os
import shutil
import signal
import tempfile

import pytest

RECORD_ENV = "MLDIAG_RECORD_COMMANDS"
CHECKER = "test_command_lines.py"
_record_dir = None


def pytest_configure(config):
    global _record_dir
    # what a test module reads at its import (a runbook's steps) finds the built-ins too; each
    # test gets them again from builtin_registry below
    from diagnostics.builtin import BUILTIN
    from diagnostics.engine import registry
    registry.use(BUILTIN)
    if os.environ.get(RECORD_ENV):      # an outer run records already: keep its file
        return
    _record_dir = tempfile.mkdtemp(prefix="recorded-commands-")
    os.environ[RECORD_ENV] = os.path.join(_record_dir, "commands.jsonl")
    # what mldiag remembers between runs (diagnostics/builtin/gpu_status/smi_memory.py): the session's own, never
    # the user's ~/.cache
    if "MLDIAG_CACHE_DIR" not in os.environ:
        os.environ["MLDIAG_CACHE_DIR"] = os.path.join(_record_dir, "cache")


@pytest.fixture(autouse=True)
def signal_handlers_back():
    """Each test starts with the handlers a terminal's pytest has, and leaves them so.

    A task call that a signal ended leaves TERM, HUP and INT ignored, as the process it ends is
    on its way out (diagnostics/core/termination.py); a test calls tasks in this process, so the next
    test gets this process's handlers back. And Ctrl-C is Python's KeyboardInterrupt during a
    test even where pytest itself was started with SIGINT ignored (a background job of a
    non-interactive shell, as a CI runner may start it): the in-process Ctrl-C tests would
    otherwise send SIGINT into the void, as tests/programs.py says of the children it starts.
    tests/unit/test_termination.py ignores it itself where that case is the subject."""
    caught = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
    before = {s: signal.getsignal(s) for s in caught}
    if before[signal.SIGINT] is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


def pytest_collection_modifyitems(session, config, items):
    """The command-line check runs after every other test (it reads what they sent)."""
    last = [item for item in items if os.path.basename(str(item.fspath)) == CHECKER]
    rest = [item for item in items if os.path.basename(str(item.fspath)) != CHECKER]
    items[:] = rest + last


def pytest_unconfigure(config):
    if _record_dir:
        shutil.rmtree(_record_dir, ignore_errors=True)
        os.environ.pop(RECORD_ENV, None)
        if os.environ.get("MLDIAG_CACHE_DIR", "").startswith(_record_dir):
            os.environ.pop("MLDIAG_CACHE_DIR")


@pytest.fixture(autouse=True)
def builtin_registry():
    """Each test starts with the registry the program starts with, the built-ins
    (``diagnostics.builtin.BUILTIN``: the engine installs none itself, cli/program.py and api.py
    do), whatever an earlier test made current."""
    from diagnostics.builtin import BUILTIN
    from diagnostics.engine import registry
    previous = registry.use(BUILTIN)
    yield
    registry.use(previous)
