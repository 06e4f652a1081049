"""One exception base for everything mldiag itself rejects; exit codes are mapped in one place."""

from typing import Optional

EXIT_OK = 0
EXIT_WARN = 1
EXIT_FAIL = 2
EXIT_ERROR = 3
EXIT_BAD_INPUT = 4
EXIT_INTERRUPTED = 130


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
