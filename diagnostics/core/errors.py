"""One exception base for everything mldiag itself rejects, and the exit codes.

The engine (``cli``, ``runbook_run``) raises these or returns an ``outcome.Outcome``; only the
task layer (``tasks.MldiagTask``) turns either into Invoke's ``Exit`` and a process exit code.
"""

from typing import Optional

EXIT_OK = 0
EXIT_WARN = 1
EXIT_FAIL = 2
EXIT_ERROR = 3
EXIT_BAD_INPUT = 4
EXIT_INTERRUPTED = 130   # Ctrl-C; TERM and HUP end with 128 + the signal (termination.py)


class MldiagError(Exception):
    """Base of mldiag's own errors. ``exit_code`` is what the process ends with."""

    exit_code = EXIT_ERROR


class InputError(MldiagError):
    """Bad input that mldiag checks itself: hosts.yaml, an unknown target, a flag value.

    ``str()`` is the whole user-facing message, e.g.
    ``hosts.yaml:14: hosts.pve1.containers.trainbox.runtime: 'ptc' is not one of pct, docker, ...``
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, file: Optional[str] = None, line: Optional[int] = None,
                 key: Optional[str] = None):
        self.file = file
        self.line = line
        self.key = key
        self.reason = message
        prefix = ""
        if file is not None:
            prefix = f"{file}:{line}: " if line is not None else f"{file}: "
        if key:
            prefix += f"{key}: "
        super().__init__(prefix + message)


class TargetInputError(InputError):
    """Bad input found while building one target's job (e.g. no model for check-attn): a task
    reports it (exit 4), a runbook skips that step on that target."""


class Interrupted(MldiagError):
    """Ctrl-C, TERM or HUP ended a run before every target finished. ``str()`` is the message,
    e.g. ``interrupted (1 of 2 targets finished, saved in out)``; ``exit_code`` is 130, or
    128 + the signal (143, 129). Built by ``termination.interrupted``."""

    def __init__(self, message: str, exit_code: int = EXIT_INTERRUPTED):
        super().__init__(message)
        self.exit_code = exit_code
