"""``--prom FILE``: node-check's results as a Prometheus textfile-collector file.

node-exporter's textfile collector (``--collector.textfile.directory``) reads every ``*.prom``
file in its directory on each scrape, so a team's dashboards and alerts see node-check's
checks beside the node's other metrics. The file is written the way the collector's README
asks -- to a temporary name in the same directory, then renamed over FILE -- so a scrape
never reads half a file; the temporary name does not end in ``.prom``, so the collector never
reads it either.

Safety: FILE must end in ``.prom``; an existing FILE that is a symbolic link (or anything but a
regular file) is refused, never followed; the temp file is created relative to the directory's
fd with ``O_CREAT|O_EXCL|O_NOFOLLOW`` under a fresh random name (mode 0644: node-exporter runs
as another user), and renamed within that fd, so a link planted under FILE after the check is
replaced itself, not written through. Problems are ``InputError`` (exit 4) naming FILE.

Metrics (all gauges; every sample has ``target``, the mldiag target name):

==============================================  =========================================================
mldiag_node_check_status{target}                0 ok, 1 warn, 2 fail, 3 error (target not checked)
mldiag_node_check_worst_action{target}          0 none, 1 monitor, 2 app, 3 reset-gpu, 4 reboot,
                                                5 drain, 6 rma
mldiag_node_check_duration_seconds{target}      how long the target's node-check took
mldiag_node_check_findings{target}              number of findings
mldiag_node_check_check_status{target,check}    per check (data.checks): 0 ok, 1 warn, 2 fail, 3 hung,
                                                -1 skipped
mldiag_node_check_check_duration_seconds{...}   per check: seconds it took
mldiag_node_check_finding{target,check,code,    one sample per finding and GPU or port (gpu="" and port=""
  gpu,port,action,level}                        when it names neither); the value is how many findings
                                                share those labels (usually 1)
==============================================  =========================================================

Label values are escaped as the text exposition format asks (backslash, double quote and line
feed); messages are not exported (unbounded text; they stay in the result JSON).
"""

import errno
import math
import os
import secrets
import stat
from typing import Dict, Iterable, List, Optional, Tuple

from ...core import wire
from ...core.errors import InputError
from ...core.results import ACTIONS, STATUSES, Result, action_rank, status_rank, worst_of_actions

PREFIX = "mldiag_node_check_"
# a check's status: a result status's rank; hung as error; skipped below ok
CHECK_STATUS = {**{s: status_rank(s) for s in STATUSES}, "hung": status_rank("error"), "skipped": -1}
_OPEN_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_OPEN_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TEMP_TRIES = 8

HELP = {
    "status": "node-check result of the target: 0 ok, 1 warn, 2 fail, 3 error (not checked).",
    "worst_action": ("Worst action of the target's findings: 0 none, 1 monitor, 2 app, "
                     "3 reset-gpu, 4 reboot, 5 drain, 6 rma."),
    "duration_seconds": "Seconds node-check took on the target.",
    "findings": "Number of node-check findings on the target.",
    "check_status": "Result of one check on the target: 0 ok, 1 warn, 2 fail, 3 hung, -1 skipped.",
    "check_duration_seconds": "Seconds one check took on the target.",
    "finding": ("A node-check finding, one sample per GPU or port it names; the value is how "
                "many findings share the labels."),
}


def escape_label_value(value) -> str:
    """A label value as the text exposition format writes it: \\\\, \\" and \\n escaped; a lone
    surrogate (the wire lets none in) first as its ``\\udXXX`` text, so the file encodes."""
    text = wire.encodable(str(value))
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    try:
        number = float(value)
    except OverflowError:       # an int past a float's range (the wire's gate refuses them)
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    return repr(int(value)) if number.is_integer() else repr(number)


def _sample(name: str, labels: Iterable[Tuple[str, object]], value: float) -> str:
    inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels)
    return f"{PREFIX}{name}{{{inner}}} {_number(value)}"


def _finding_attr(f, name: str):
    """``Finding.action`` etc. once results.Finding carries them; a dict key or None before."""
    if isinstance(f, dict):
        return f.get(name)
    return getattr(f, name, None)


def _worst_action(result: Result) -> Optional[str]:
    data = result.data if isinstance(result.data, dict) else {}
    if data.get("worst_action") in ACTIONS:
        return data["worst_action"]
    worst = worst_of_actions(_finding_attr(f, "action") for f in result.findings)
    return worst or ("none" if result.status != "error" else None)


def render(results: List[Result]) -> str:
    """The file's text: HELP and TYPE once per metric, then its samples, in target order."""
    families: Dict[str, List[str]] = {name: [] for name in HELP}
    for r in results:
        t = (("target", r.target),)
        families["status"].append(_sample("status", t, status_rank(r.status)))
        worst = _worst_action(r)
        if worst is not None:
            families["worst_action"].append(_sample("worst_action", t, action_rank(worst)))
        families["duration_seconds"].append(_sample("duration_seconds", t, r.duration_s or 0))
        families["findings"].append(_sample("findings", t, len(r.findings)))
        # NOTE: data is free-form (the schema checks only its findings): a target may send any
        # shape there, so each level is checked before it is read
        checks = r.data.get("checks") if isinstance(r.data, dict) else None
        for name, info in sorted(checks.items() if isinstance(checks, dict) else ()):
            if not isinstance(info, dict):
                continue
            labels = t + (("check", name),)
            if isinstance(info.get("status"), str) and info["status"] in CHECK_STATUS:
                families["check_status"].append(
                    _sample("check_status", labels, CHECK_STATUS[info["status"]]))
            if isinstance(info.get("seconds"), (int, float)) and not isinstance(info["seconds"], bool):
                families["check_duration_seconds"].append(
                    _sample("check_duration_seconds", labels, info["seconds"]))
        counts: Dict[Tuple, int] = {}
        for f in r.findings:
            base = (_finding_attr(f, "check") or "", _finding_attr(f, "code") or "")
            tail = (_finding_attr(f, "action") or "", _finding_attr(f, "level") or "")
            places = [(str(g), "") for g in (_finding_attr(f, "gpus") or [])]
            places += [("", str(p)) for p in (_finding_attr(f, "ports") or [])]
            for gpu, port in places or [("", "")]:
                key = base + (gpu, port) + tail
                counts[key] = counts.get(key, 0) + 1
        for (check, code, gpu, port, action, level), n in counts.items():
            families["finding"].append(_sample("finding", t + (
                ("check", check), ("code", code), ("gpu", gpu), ("port", port),
                ("action", action), ("level", level)), n))
    lines = []
    for name, samples in families.items():
        lines.append(f"# HELP {PREFIX}{name} {HELP[name]}")
        lines.append(f"# TYPE {PREFIX}{name} gauge")
        lines.extend(samples)
    return "\n".join(lines) + "\n"


def check_path(path: str) -> None:
    """InputError unless PATH names a ``*.prom`` file (checked before anything connects)."""
    name = os.path.basename(os.path.abspath(path))
    if not name.endswith(".prom") or name == ".prom":
        raise InputError(f"--prom {path}: the file name must end in .prom (node-exporter's "
                         f"textfile collector reads only *.prom)")


def write(path: str, results: List[Result]) -> None:
    """Write ``render(results)`` to PATH atomically, never through a symbolic link."""
    shown = f"--prom {path}"
    check_path(path)
    directory, name = os.path.split(os.path.abspath(path))
    text = render(results).encode("utf-8")
    try:
        dfd = os.open(directory, _OPEN_DIR)
    except OSError as exc:
        raise InputError(f"{shown}: directory {directory}: {exc.strerror}")
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise InputError(f"{shown}: {exc.strerror}")
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise InputError(f"{shown}: a symbolic link; refusing to write through it "
                             f"(name the file itself)")
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise InputError(f"{shown}: exists and is not a regular file")
        temp, fd = _new_temp(dfd, name, shown)
        try:
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fh.fileno(), 0o644)       # whatever the umask: node-exporter reads it
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(temp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException as exc:
            try:
                os.unlink(temp, dir_fd=dfd)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise InputError(f"{shown}: {exc.strerror or exc}")
            raise
    finally:
        os.close(dfd)


def _new_temp(dfd: int, name: str, shown: str) -> Tuple[str, int]:
    """A fresh ``.NAME.XXXX.tmp`` beside NAME (not ``*.prom``: the collector skips it)."""
    for _ in range(_TEMP_TRIES):
        temp = f".{name}.{secrets.token_hex(6)}.tmp"
        try:
            return temp, os.open(temp, _OPEN_NEW, 0o644, dir_fd=dfd)
        except FileExistsError:
            continue
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                continue
            raise InputError(f"{shown}: cannot create a file in its directory: {exc.strerror}")
    raise InputError(f"{shown}: could not create a temporary file in its directory")
