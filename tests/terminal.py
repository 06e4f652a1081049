"""A real terminal for the tests that need one: a private tmux server per screen.

``Screen`` starts a command in a detached tmux pane of a fixed size, lets a test read the pane
as a user sees it (``text()``: the rendered screen; ``text(escapes=True)``: with colour codes)
while the command runs, and gives its exit status once it ends (the pane stays: remain-on-exit).
Only the standard library and the ``tmux`` binary (installed by .ci/run).
"""

import os
import shutil
import subprocess
import tempfile
import time
from typing import Callable, Mapping, Optional, Sequence

from tests.programs import MLDIAG, INV, REPO, program_env

TMUX = shutil.which("tmux")
# $0 is the status file; the command's exit status is written there (whole line: then it is
# complete), and the shell stays so the pane keeps what the command left on the screen.
_KEEP_PANE = '"$@"; echo $? > "$0.part" && mv "$0.part" "$0"; exec sleep 100000'


class Screen:
    """One command on a ``width`` x ``height`` terminal (TERM=xterm-256color unless ``env``
    says otherwise)."""

    def __init__(self, argv: Sequence[str], *, cwd: str = REPO, env: Optional[Mapping[str, str]] = None,
                 unset: Sequence[str] = (), width: int = 120, height: int = 40):
        if TMUX is None:
            raise RuntimeError("tmux is not installed (.ci/run installs it)")
        self._dir = tempfile.mkdtemp(prefix="mldiag-tmux-")
        self.socket = os.path.join(self._dir, "sock")
        conf = os.path.join(self._dir, "tmux.conf")
        with open(conf, "w") as f:
            f.write("set -g history-limit 5000\n"
                    "set -g default-terminal xterm-256color\nset -g status off\n")
        # NO_COLOR and TMUX of the shell running the tests never leak in; a test sets NO_COLOR
        # through ``env`` when it wants it.
        inherited = ("TMUX", "NO_COLOR", "COLUMNS", "LINES")
        full_env = program_env({"TERM": "xterm-256color", **(env or {})},
                               [*unset, *(n for n in inherited if n not in (env or {}))])
        # NOTE: the pane's environment is the server's, and the server is started by this
        # call: every variable reaches the command as given here.
        self._status = os.path.join(self._dir, "status")
        # NOTE: the command runs under a shell that then sleeps, so the pane (and the screen as
        # the command left it) stays; tmux's remain-on-exit would scroll its own "Pane is dead"
        # line into the screen.
        subprocess.run([TMUX, "-S", self.socket, "-f", conf, "new-session", "-d",
                        "-x", str(width), "-y", str(height), "-c", str(cwd), "--",
                        "/bin/sh", "-c", _KEEP_PANE, self._status,
                        *[str(a) for a in argv]], env=full_env, check=True, timeout=30)

    def _tmux(self, *args: str) -> str:
        return subprocess.run([TMUX, "-S", self.socket, *args], capture_output=True,
                              text=True, timeout=30).stdout

    def text(self, *, escapes: bool = False, history: bool = False) -> str:
        """The screen as shown: trailing blanks and empty last lines dropped. ``history``:
        with what scrolled off the top."""
        args = ["capture-pane", "-p"] + (["-e"] if escapes else []) + (["-S", "-"] if history else [])
        lines = [line.rstrip() for line in self._tmux(*args).split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines) + "\n" if lines else ""

    def exit_status(self) -> Optional[int]:
        """The command's exit status once it has ended; None while it runs."""
        try:
            with open(self._status) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        return int(text) if text.endswith("\n") else None

    def wait_for(self, predicate: Callable[[str], bool], timeout: float = 60, **text_kw) -> str:
        """Poll the screen until ``predicate(text)``; the screen, or AssertionError with it."""
        end = time.monotonic() + timeout
        while True:
            shown = self.text(**text_kw)
            if predicate(shown):
                return shown
            if time.monotonic() > end:
                raise AssertionError(f"screen never matched within {timeout} s:\n{shown}")
            time.sleep(0.05)

    def wait_exit(self, timeout: float = 120) -> int:
        end = time.monotonic() + timeout
        while (status := self.exit_status()) is None:
            if time.monotonic() > end:
                raise AssertionError(f"still running after {timeout} s:\n{self.text()}")
            time.sleep(0.05)
        return status

    def close(self) -> None:
        subprocess.run([TMUX, "-S", self.socket, "kill-server"], capture_output=True, timeout=30)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "Screen":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def mldiag_screen(*argv, **kw) -> Screen:
    """``mldiag ARGV...`` on a terminal (keywords as for ``Screen``)."""
    return Screen(MLDIAG + [str(a) for a in argv], **kw)


def inv_screen(*argv, **kw) -> Screen:
    return Screen(INV + [str(a) for a in argv], **kw)


def run_on_screen(*argv, program: str = "mldiag", timeout: float = 120, **kw):
    """Run to the end on a terminal: (exit status, final screen)."""
    make = mldiag_screen if program == "mldiag" else inv_screen
    with make(*argv, **kw) as screen:
        status = screen.wait_exit(timeout)
        return status, screen.text()
