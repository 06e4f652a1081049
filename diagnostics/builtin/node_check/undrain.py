"""node-check ``--undrain`` on Slurm: check the nodes mldiag drained inside a maintenance window.

Slurm starts no job on a node in DRAIN, so node-check cannot reach a drained node through an
allocation; and resuming it first would let any queued job land on a node that may still be
broken. The window closes that gap, as an admin does by hand:

1. ``open_windows``: per Slurm login target, ``scontrol show node -o`` (every node: which are
   drained by mldiag as this user, ``drain.Owner.owns``, within the target's nodelist or
   partition); for those, ``scontrol create reservation`` (``flags=maint,ignore_jobs``, for the
   one user the check's ``salloc`` runs as -- the login user: ``become`` applies on the nodes
   -- for the check's time) and then ``state=resume``:
   the nodes are idle but reserved, so no other job can start there. The target is narrowed
   to those nodes, with ``reservation:`` set, and node-check runs on them.
2. ``close_windows(windows, results)``: a node that passed (ok/warn, nothing at drain level)
   stays resumed; a node that failed at drain level is drained again with the new reason; any
   other node (failing below drain, not checked) is drained again with its old reason. Then
   the reservation is deleted. ``close_windows(windows, None)`` (an error or Ctrl-C during the
   check) drains every node of the window again with its old reason: a node is never left
   resumed without a check it passed.

Signals (Ctrl-C, TERM, HUP) at any point: ``open_windows`` records each window in the caller's
list as soon as its reservation exists and each node as soon as it is resumed (the scontrol
call and its record are one step, ``termination.held``), so the caller's ``finally`` can close
whatever was opened; the closing itself runs held, so neither a first nor a second signal cuts
it short (node_check_run.execute).

Each command goes to scontrol's stdin reader, as ``drain.py`` does (its module docstring says
why); every state reported is read back from ``scontrol show node``.
"""

import datetime
import math
import re
import secrets
from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Tuple

from . import drain as drain_mod
from ...core import termination
from .drain import DrainOutcome, NodeState, Owner
from ...transport import transport_for
from ...transport.base import Transport, TransportError
from ...transport.slurm import node_names
from ...transport.ssh import SshPool
from ...core.results import Result
from ...inventory.topology import NAME, Target

_PARTITIONS = re.compile(r"(?:^|\s)Partitions=(\S*)")
MARGIN_MINUTES = 5          # the reservation outlasts the check's job by this much


@dataclass
class Window:
    """A maintenance reservation holding the nodes mldiag drained, resumed for the check."""
    login: Target                    # the Slurm login target as selected
    base: str                        # the row prefix: ``cluster-a``
    name: str                        # the reservation: ``mldiag-undrain-<hex>``
    nodes: List[str]                 # resumed inside the reservation, to be checked
    before: Dict[str, NodeState]     # their state before (the old Reason, restored on failure)
    owner: Owner                     # who this run is there (the Reason of a drain again)
    opened: List[str] = field(default_factory=list)   # commands run to open it, as shown


def reservation_name() -> str:
    return f"mldiag-undrain-{secrets.token_hex(4)}"


def partitions_of(text: str) -> Dict[str, List[str]]:
    """``scontrol show node -o``: {node: [partition, ...]}."""
    found = {}
    for line in text.splitlines():
        node = drain_mod.parse_show_node(line)
        match = _PARTITIONS.search(line)
        for name in node:
            found[name] = match.group(1).split(",") if match and match.group(1) else []
    return found


def drained_by_us(text: str, slurm, owner: Owner) -> List[str]:
    """The nodes of ``scontrol show node -o``'s answer drained by mldiag as ``owner``, within
    the target's nodelist (when it has one) and partition (when it names one); plain names
    only."""
    states = drain_mod.parse_show_node(text)
    partitions = partitions_of(text)
    wanted = set(node_names(slurm) or ())
    nodes = []
    for name, state in states.items():
        if not (NAME.fullmatch(name) and owner.owns(state) and state.unavailable):
            continue
        if wanted and name not in wanted:
            continue
        if slurm.partition and slurm.partition not in partitions.get(name, []):
            continue
        nodes.append(name)
    return nodes


def job_minutes(timeout: float) -> int:
    """The check's Slurm time limit in minutes: a job must end inside its reservation."""
    return max(1, math.ceil(timeout / 60.0) + 1)


def reservation_line(name: str, nodes: Sequence[str], user: str, minutes: int) -> str:
    for token in (name, user, *nodes):
        if not NAME.fullmatch(token):
            raise ValueError(f"not a plain name: {token!r}")
    return (f"create reservation reservationname={name} starttime=now "
            f"duration={minutes + MARGIN_MINUTES} nodes={','.join(nodes)} users={user} "
            f"flags=maint,ignore_jobs")


def narrowed(window: Window, minutes: int) -> Target:
    """The login target restricted to the window's nodes, its salloc inside the reservation."""
    slurm = replace(window.login.slurm, nodes=len(window.nodes), nodelist=",".join(window.nodes),
                    reservation=window.name, time=str(minutes))
    return replace(window.login, name=window.base, slurm=slurm)


def _scontrol(login: Target, transport: Transport, line: str, timeout: float) -> Optional[str]:
    """Run one scontrol command through its stdin reader; the problem, or None."""
    argv = drain_mod.login_prefix(login) + ["scontrol"]
    _, _, problem = drain_mod.run_on_login(transport, argv, f"{line}\nquit\n".encode(), timeout)
    return problem


def open_windows(targets: Sequence[Target], job_timeout, windows: List[Window], *,
                 pool: Optional[SshPool] = None, timeout: float = drain_mod.DEFAULT_TIMEOUT,
                 transport: Optional[drain_mod.TransportFor] = None
                 ) -> Tuple[List[Target], List[str]]:
    """(the targets to run on, lines to show); each window opened is added to ``windows`` as
    it opens (the caller closes them, however this ends: the module docstring).
    ``job_timeout(target)``: the check's timeout on that target, which sizes the reservation.
    ``transport``: how a login target is reached (default: ``hops.transport_for`` on
    ``pool``)."""
    transport_of = transport or (lambda t: transport_for(t, pool))
    run_on: List[Target] = []
    shown: List[str] = []
    for target in targets:
        if target.slurm is None:
            run_on.append(target)
            continue
        window, lines = _open(target, job_timeout(target), transport_of, timeout, windows)
        shown += lines
        if window is None:
            run_on.append(target)
        else:
            run_on.append(narrowed(window, job_minutes(job_timeout(target))))
    return run_on, shown


def _open(target: Target, check_timeout: float, transport_of, timeout: float,
          windows: List[Window]) -> Tuple[Optional[Window], List[str]]:
    base = target.name.partition(":")[0]
    try:
        transport = transport_of(target)
    except TransportError as exc:      # reported as a line; the check still runs (and says it)
        return None, [f"{base}: --undrain: cannot reach the login host: {exc.layer}: {exc.message}"]
    _, text, problem = drain_mod.run_on_login(transport, ["scontrol", "show", "node", "-o"], b"", timeout)
    if problem:
        return None, [f"{base}: --undrain: scontrol show node: {problem}"]
    # salloc runs as the login user itself (``become`` applies on the nodes, inside srun);
    # the same user says which drains are ours
    owner, problem = drain_mod.whoami(target, transport, timeout)
    if owner is None:
        return None, [f"{base}: --undrain: {problem}"]
    nodes = drained_by_us(text, target.slurm, owner)
    if not nodes:
        return None, [f"{base}: --undrain: no node drained by mldiag as {owner.user}"]
    before = {n: s for n, s in drain_mod.parse_show_node(text).items() if n in nodes}
    name = reservation_name()
    line = reservation_line(name, nodes, owner.user, job_minutes(check_timeout))
    window = Window(target, base, name, [], before, owner, [drain_mod.command_text(target, line)])
    with termination.held():     # the reservation exists exactly when the caller knows it
        problem = _scontrol(target, transport, line, timeout)
        if not problem:
            windows.append(window)
    if problem:
        return None, [f"{base}: --undrain: no maintenance reservation, {','.join(nodes)} stay "
                      f"drained unchecked: scontrol failed ({problem}): "
                      f"{drain_mod.command_text(target, line)}"]
    lines = [f"{base}: maintenance reservation {name} for {','.join(nodes)} "
             f"(user {owner.user}): {window.opened[0]}"]
    for node in nodes:
        resume = drain_mod.update_line(node, "resume")
        with termination.held():     # a resumed node is one the caller drains again
            problem = _scontrol(target, transport, resume, timeout)
            if not problem:
                window.nodes.append(node)
        if problem:
            lines.append(f"{base}:{node}: stays drained unchecked: resume failed ({problem})")
        else:
            lines.append(f"{base}:{node}: resumed inside {name} for the check: "
                         f"{drain_mod.command_text(target, resume)}")
    if not window.nodes:     # nothing to check: the reservation goes now (else the caller's)
        with termination.held():
            if not _scontrol(target, transport, f"delete reservationname={name}", timeout):
                windows.remove(window)
        return None, lines
    return window, lines


def close_windows(windows: Sequence[Window], results: Optional[Sequence[Result]], *,
                  pool: Optional[SshPool] = None, timeout: float = drain_mod.DEFAULT_TIMEOUT,
                  now: Optional[datetime.datetime] = None,
                  transport: Optional[drain_mod.TransportFor] = None) -> List[DrainOutcome]:
    """Decide each window node on its result (None: the check did not finish), apply, delete
    the reservation; one outcome per node (and one for a reservation not deleted)."""
    transport_of = transport or (lambda t: transport_for(t, pool))
    by_target = {r.target: r for r in results or ()}
    outcomes: List[DrainOutcome] = []
    for window in windows:
        outcomes += _close(window, by_target, results is None, transport_of, timeout, now)
    return outcomes


def _close(window: Window, by_target: Dict[str, Result], aborted: bool, transport_of,
           timeout: float, now) -> List[DrainOutcome]:
    login = window.login
    try:
        transport = transport_of(login)
    except TransportError as exc:
        return [DrainOutcome(target=f"{window.base}:{node}", status="failed", login=window.base,
                             node=node, message=f"still resumed inside maintenance reservation "
                             f"{window.name}: the login host is gone ({exc.layer}: {exc.message}); "
                             f"drain it by hand") for node in window.nodes]
    outcomes = []
    for node in window.nodes:
        row = f"{window.base}:{node}"
        result = by_target.get(row)
        old = window.before[node].reason or ""
        base = dict(target=row, login=window.base, node=node, before=window.before[node])
        if result is None:
            why = "the check did not finish" if aborted else "no result"
            step = drain_mod.DrainStep(row, "keep", login, node, why=why)
        else:
            step = drain_mod.plan([result], [login], now)[0]
        if step.want == "resume":
            outcomes.append(DrainOutcome(status="ran", message=f"resumed: passed the check in "
                                         f"{window.name}", flag="--undrain",
                                         command=drain_mod.command_text(
                                             login, drain_mod.update_line(node, "resume")), **base))
            continue
        if step.want == "drain":
            reason, message = step.reason(window.owner.user), "drained again"
        else:
            reason, message = _restorable(old, now, window.owner.user), f"stays drained: {step.why}"
        line = drain_mod.update_line(node, "drain", reason)
        problem = _scontrol(login, transport, line, timeout)
        outcomes.append(DrainOutcome(status="failed" if problem else "ran",
                                     message=f"{message}; scontrol failed ({problem})" if problem
                                     else message, flag="--undrain", line=line,
                                     command=drain_mod.command_text(login, line), **base))
    problem = _scontrol(login, transport, f"delete reservationname={window.name}", timeout)
    if problem:
        outcomes.append(DrainOutcome(target=window.base, status="failed", login=window.base,
                                     message=f"maintenance reservation {window.name} not "
                                     f"deleted: scontrol failed ({problem})",
                                     command=drain_mod.command_text(
                                         login, f"delete reservationname={window.name}")))
    after, _ = drain_mod.node_states(transport, window.nodes, timeout)
    for outcome in outcomes:
        if outcome.node:
            outcome.after = after.get(outcome.node)
    return outcomes


def _restorable(reason: str, now, user: str) -> str:
    """The old Reason when scontrol's safe alphabet allows it back, else a fresh tag (the old
    one came from Slurm: it is not trusted onto scontrol's reader unchecked)."""
    fresh = drain_mod.reason_text([], drain_mod.stamp(now), user)
    try:
        drain_mod.update_line("x", "drain", reason)
        return reason if reason.startswith(drain_mod.TAG) else fresh
    except ValueError:
        return fresh

