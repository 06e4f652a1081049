"""node-check ``--drain`` / ``--undrain`` on Slurm: drain what fails with a
tagged reason, resume only what mldiag drained and now passes, never touch anyone else's drain.

Two steps, so that the decision is made on results collected first and on Slurm's own answer:

- ``plan(results, targets)`` (pure): per result row, what mldiag wants — ``drain`` (its worst
  action is ``drain`` or ``rma``; the reason names the codes), ``resume`` (ok/warn without a
  drain-level action: resumed if mldiag drained it), ``keep`` (failing below drain, or not
  checked), or ``skip`` (not a Slurm node: a target without ``slurm:`` settings).
- ``run(steps, drain=, undrain=)``: per Slurm login host, one ``scontrol show node -o N1,N2,…``
  and one ``id -un`` through mldiag's own connection to it (what the node rows ran through,
  ``salloc``/``srun``), then what the rules allow: a node drained or down that is not ours
  (``Owner.owns``) is left alone; ``state=resume`` only for one that is. Without
  ``drain``/``undrain`` (a dry run) nothing is changed: the exact commands are returned as
  "would run". Each update is read back with ``scontrol show node``, so what is reported is
  Slurm's state, not our hope.

Whose drain it is: the Reason names the login user mldiag ran as, ``mldiag: xid-79 (node-check
by mlsh 2026-12-01T10:00Z)``, and Slurm appends the user who set it, ``[root@…]`` (unforgeable:
slurmctld's own record of the caller's uid). A drain is ours when both agree with this run: the
Reason's ``by USER`` is the login user (``id -un`` there) and Slurm's setter is the user our
scontrol runs as (that user; ``root`` with ``become: sudo``, as ``sudo -n --`` runs). So another
user's drain, a hand-written ``mldiag:`` Reason set by someone else, or a Reason naming us set
by another account is left alone. A Reason of the old form (before the ``by USER`` part) is ours
only when Slurm's setter is our scontrol user. A team sharing one service account shares one
owner: each resumes the others' drains (which is what one account means to Slurm as well).

How scontrol is reached: the login target's transport (ssh, its jumps) and, with
``become: sudo``, ``sudo -n`` — the chain of the rows without the ``srun`` step and the
container (scontrol runs on the login node itself). ``scontrol show node -o NODES`` is a plain
argv (node names are hosts.yaml's checked tokens). An update carries a reason with spaces, which
the safe-alphabet rule keeps off every command line (docs/architecture.md, invariant 1), so it goes to
scontrol's own command reader on its stdin: the command line is just ``scontrol`` (``sudo -n --
scontrol``) and stdin is ``update nodename=N state=drain reason="mldiag: …"`` then ``quit``.
scontrol reads double quotes there (single quotes would become part of the Reason, and the
Reason would no longer start with ``mldiag:``), and the reason's alphabet has nothing a shell
or scontrol would read inside double quotes, so the line shown is also exactly a shell command
that does the same.
"""

import contextlib
import datetime
import re
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ...core import nodeset
from ...views.render import safe_text
from ...transport import transport_for
from ...transport.base import Transport, TransportError, first_line
from ...transport.ssh import SshPool
from ...transport.sudo import Sudo
from ...core.results import Result, action_rank, worst_of_actions
from ...inventory.topology import NAME, Target

DRAIN_RANK = action_rank("drain")
TAG = "mldiag:"
# Slurm stores any length, but sinfo -R, squeue and most dashboards show about 50 characters:
# codes are dropped from the end (", +N more") to stay within this bound.
REASON_MAX = 128
CODE_MAX = 40
SHOW_CHUNK = 256            # nodes per `scontrol show node` call
DEFAULT_TIMEOUT = 30.0      # seconds per scontrol call
_UNSAFE_CODE = re.compile(r"[^A-Za-z0-9_.-]")
# scontrol's State word: IDLE, IDLE+DRAIN, MIXED+DRAIN, DOWN*+DRAIN, DOWN+NOT_RESPONDING, ...
UNAVAILABLE = {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"}
# the Reason runs to Slurm's " [user@time]" suffix (fields such as Comment= may follow it) or the
# end; the *last* such suffix: one inside someone else's Reason text must not pass for Slurm's
_REASON_SET = re.compile(r"(?:^|\s)Reason=(.*)\s+\[([^\]\s@]*)@[^\]\s]*\](?=\s+\w+=|\s*$)")
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)\s*$")
# ours: "mldiag: CODES (node-check by USER TIME)"; the old form: "... (node-check TIME)"
_OWNER = re.compile(r" \(node-check by ([A-Za-z0-9_.-]+) \d{4}-\d\d-\d\dT\d\d:\d\dZ\)$")
_FIELD = re.compile(r"(?:^|\s)(NodeName|State)=(\S*)")


def worst_action(result: Result) -> str:
    """The worst action of the result's findings (and of ``data.worst_action``, if it says so);
    ``none`` when none is one we know (core/results.py: an unknown action never drains)."""
    data = result.data if isinstance(result.data, dict) else {}
    actions = [getattr(f, "action", None) for f in result.findings] + [data.get("worst_action")]
    return worst_of_actions(actions) or "none"


def drain_codes(result: Result) -> List[str]:
    """The codes of the findings at drain level or worse, worst action first, each once, each
    reduced to [A-Za-z0-9_.-] (they come from the target)."""
    found = [(-action_rank(getattr(f, "action", None)), i, f.code)
             for i, f in enumerate(result.findings)
             if action_rank(getattr(f, "action", None)) >= DRAIN_RANK]
    codes: List[str] = []
    for _, _, code in sorted(found):
        clean = _UNSAFE_CODE.sub("_", str(code or ""))[:CODE_MAX] or "unknown"
        if clean not in codes:
            codes.append(clean)
    return codes


def stamp(now: Optional[datetime.datetime] = None) -> str:
    """``2026-12-01T10:00Z``: the node-check's time in UTC, to the minute."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")


def reason_text(codes: Sequence[str], when: str, user: str) -> str:
    """``mldiag: xid-79, nvlink-down (node-check by mlsh 2026-12-01T10:00Z)``, at most
    REASON_MAX characters: codes that do not fit become ``+N more``. ``user``: the login user
    (a checked name), which says whose drain it is."""
    if not NAME.fullmatch(user):
        raise ValueError(f"not a plain user name: {user!r}")
    return tagged(codes, f" (node-check by {user} {when})", REASON_MAX)


def tagged(codes: Sequence[str], tail: str, limit: int) -> str:
    """``mldiag: CODE, CODE, +N more`` then ``tail``, at most ``limit`` characters: the codes
    that do not fit become ``+N more`` (a Slurm Reason, taint.py's node condition message)."""
    codes = list(codes) or ["node-check"]
    for keep in range(len(codes), 0, -1):
        shown = ", ".join(codes[:keep]) + (f", +{len(codes) - keep} more" if keep < len(codes) else "")
        text = f"{TAG} {shown}{tail}"
        if len(text) <= limit:
            return text
    return f"{TAG} {codes[0]}"[:limit - len(tail)] + tail


# ------------------------------------------------------------------ planning (pure)

@dataclass(frozen=True)
class DrainStep:
    """What mldiag wants for one result row. ``want``: drain | resume | keep | skip."""
    target: str                      # the row: ``cluster-a:n3``
    want: str
    login: Optional[Target] = None   # the Slurm login target scontrol runs through
    node: Optional[str] = None       # the Slurm node name
    codes: Tuple[str, ...] = ()      # for drain: the codes its Reason names
    when: str = ""                   # for drain: the check's time (``stamp``)
    why: str = ""                    # for keep/skip: one line

    def reason(self, user: str) -> str:
        """The Reason a drain writes, for the login user ``user``."""
        return reason_text(self.codes, self.when, user)


def _login_of(name: str, targets: Sequence[Target]) -> Tuple[Optional[Target], Optional[str]]:
    """(login target, node) for a Slurm row ``base:node``; (None, None) otherwise."""
    base, sep, node = name.partition(":")
    if not sep or not node or not NAME.fullmatch(node):
        return None, None
    for t in targets:
        if t.slurm is not None and t.name.partition(":")[0] == base:
            return t, node
    return None, None


def plan(results: Sequence[Result], targets: Sequence[Target],
         now: Optional[datetime.datetime] = None) -> List[DrainStep]:
    """One step per result row, in order (see the module docstring). ``targets``: the selected
    targets (``Topology.select``), which say which rows are Slurm nodes and through which login
    host. ``now``: the time in the reason (default: now)."""
    when = stamp(now)
    steps = []
    for r in results:
        login, node = _login_of(r.target, targets)
        if login is None:
            slurm_login = any(t.slurm is not None and t.name == r.target for t in targets)
            why = ("no node rows (the allocation failed): nothing to drain or resume"
                   if slurm_login else "not a Slurm node")
            steps.append(DrainStep(r.target, "skip", why=why))
            continue
        steps.append(step_for(r, login, node, when))
    return steps


def step_for(result: Result, login: Target, node: str, when: str) -> DrainStep:
    """What mldiag wants for the Slurm node ``node`` given its result (the rule of the module
    docstring; node-check's rows and the node-local health check alike)."""
    worst = worst_action(result)
    if result.status == "error":
        layer = result.error.layer if result.error else "error"
        return DrainStep(result.target, "keep", login, node, why=f"not checked ({layer})")
    if action_rank(worst) >= DRAIN_RANK:
        return DrainStep(result.target, "drain", login, node, codes=tuple(drain_codes(result)),
                         when=when)
    if result.status in ("ok", "warn"):
        return DrainStep(result.target, "resume", login, node)
    return DrainStep(result.target, "keep", login, node,
                     why=f"still failing (worst action {worst})")


# ------------------------------------------------------------------ Slurm's answer (pure)

@dataclass(frozen=True)
class NodeState:
    name: str
    state: str                       # scontrol's State word, e.g. IDLE+DRAIN
    reason: Optional[str] = None     # the Reason text, without its [user@time] suffix
    set_by: Optional[str] = None     # the user of that suffix: who set the Reason, says Slurm

    @property
    def unavailable(self) -> bool:
        """Drained, draining, down or failed (by anyone)."""
        words = {w.strip("*~#!%$@^-") for w in self.state.upper().split("+")}
        return bool(words & UNAVAILABLE)

    @property
    def tagged(self) -> bool:
        """The Reason starts with mldiag's tag (whoever wrote it: ``Owner.owns`` decides)."""
        return bool(self.reason) and self.reason.startswith(TAG)


@dataclass(frozen=True)
class Owner:
    """Who this run is on one login host: ``user``, the login user (``id -un``: the Reason's
    ``by USER``), and ``writer``, the user our scontrol runs as (Slurm's ``[user@time]``)."""
    user: str
    writer: str

    @classmethod
    def of(cls, login: Target, user: str) -> "Owner":
        # NOTE: `sudo -n --` without -u runs as root (sudoers' runas_default aside)
        return cls(user, "root" if login.become else user)

    def owns(self, state: NodeState) -> bool:
        """Is ``state``'s Reason a drain of ours? (The module docstring gives the rule.)"""
        if not state.tagged or state.set_by != self.writer:
            return False
        named = _OWNER.search(state.reason or "")
        if named:
            return named.group(1) == self.user
        return "(node-check by " not in (state.reason or "")   # the old form (a garbled new one: no)


def parse_show_node(text: str) -> Dict[str, NodeState]:
    """``scontrol show node -o``'s lines → {node: NodeState}. The Reason is the rest of the
    line after ``Reason=`` (it may hold spaces), less its ``[user@time]`` suffix."""
    nodes = {}
    for line in text.splitlines():
        fields: Dict[str, str] = {}
        for key, value in _FIELD.findall(line):
            fields.setdefault(key, value)     # Slurm's own field comes before any Reason text
        name = fields.get("NodeName")
        if not name:
            continue
        reason = set_by = None
        match = _REASON_SET.search(line)
        if match:
            reason, set_by = match.group(1).strip() or None, match.group(2) or None
        else:
            match = _REASON.search(line)
            reason = match.group(1).strip() or None if match else None
        if name in nodes:
            # NOTE: a second line for a node: a Reason that holds a newline and a forged line
            # after it. Neither line can be believed, so the node is marked by someone else.
            nodes[name] = NodeState(name, "UNKNOWN+DRAIN", "two lines for this node")
            continue
        nodes[name] = NodeState(name, fields.get("State", ""), reason, set_by)
    return nodes


# ------------------------------------------------------------------ commands

def update_line(node: str, state: str, reason: Optional[str] = None) -> str:
    """scontrol's update command (its stdin reader's syntax, a shell's too: see the module
    docstring). The node is a checked name; the reason has no quote, backslash, ``$``, ``!``
    or backtick (ours: ``reason_text`` of cleaned codes), asserted here."""
    if not NAME.fullmatch(node):
        raise ValueError(f"not a plain node name: {node!r}")
    line = f"update nodename={node} state={state}"
    if reason is not None:
        if not re.fullmatch(r"[A-Za-z0-9_.,:()+ -]*", reason):
            raise ValueError(f"reason outside scontrol's safe alphabet: {reason!r}")
        line += f' reason="{reason}"'
    return line


def login_prefix(login: Target) -> List[str]:
    """What a command on the login node starts with: sudo's, with ``become: sudo``."""
    return Sudo().wrap([]) if login.become else []


def command_text(login: Target, line: str) -> str:
    """The update as one shell command line: ``[sudo -n --] scontrol update …``."""
    return " ".join(login_prefix(login) + ["scontrol", line])


def show_argv(nodes: Sequence[str]) -> List[str]:
    return ["scontrol", "show", "node", "-o", ",".join(nodes)]


@dataclass
class DrainOutcome:
    """What happened (or would) for one row. ``status``: would-run | ran | failed | left-alone |
    nothing | skipped | error."""
    target: str
    status: str
    message: str
    command: Optional[str] = None    # the exact command (would-run, ran, failed)
    line: Optional[str] = None       # the update as scontrol's stdin reader gets it
    flag: Optional[str] = None       # --drain or --undrain: the flag that runs ``command``
    login: Optional[str] = None
    node: Optional[str] = None
    before: Optional[NodeState] = None
    after: Optional[NodeState] = None

    def to_dict(self) -> Dict[str, object]:
        """For ``--json`` consumers: what was (or would be) done, and Slurm's word on it."""
        def state(s: Optional[NodeState]):
            return {"state": s.state, "reason": s.reason} if s else None
        return {"target": self.target, "status": self.status, "message": self.message,
                "command": self.command, "flag": self.flag, "login": self.login,
                "node": self.node, "before": state(self.before), "after": state(self.after)}


def decide(step: DrainStep, state: Optional[NodeState], owner: Optional[Owner]) -> DrainOutcome:
    """What the rules allow for ``step`` given Slurm's ``state`` of its node and who this run
    is on its login host (pure; ``owner`` None only for a skip). A command comes back as status
    ``would-run``; ``run`` turns it into ``ran``/``failed`` when its flag was given."""
    base = dict(target=step.target, login=step.login.name if step.login else None,
                node=step.node, before=state)
    if step.want == "skip":
        return DrainOutcome(status="skipped", message=step.why, **base)
    if state is None:
        return DrainOutcome(status="error", message=f"not a node of this Slurm cluster "
                            f"(scontrol show node on {base['login']} does not know {step.node})",
                            **base)
    shown = f"State={state.state}" + (f", Reason={_clip(state.reason)}" if state.reason else "")
    ours = owner is not None and owner.owns(state)
    if not ours and (state.reason or state.unavailable):
        if step.want in ("drain", "resume") or state.unavailable:
            return DrainOutcome(status="left-alone", message=f"left alone: {_by_someone(state)} "
                                f"({shown})", **base)
        return DrainOutcome(status="nothing", message="", **base)
    if step.want == "drain":
        if ours and state.unavailable:
            return DrainOutcome(status="nothing", message=f"already drained by mldiag ({shown})",
                                **base)
        line = update_line(step.node, "drain", step.reason(owner.user))
        return DrainOutcome(status="would-run", message="drain", flag="--drain", line=line,
                            command=command_text(step.login, line), **base)
    if step.want == "resume":
        if ours and state.unavailable:
            line = update_line(step.node, "resume")
            return DrainOutcome(status="would-run", message="resume", flag="--undrain",
                                line=line, command=command_text(step.login, line), **base)
        return DrainOutcome(status="nothing", message="", **base)
    # keep: failing below drain, or not checked
    if ours and state.unavailable:
        return DrainOutcome(status="nothing", message=f"stays drained: {step.why} ({shown})",
                            **base)
    return DrainOutcome(status="nothing", message="", **base)


def _clip(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _by_someone(state: NodeState) -> str:
    words = {w.strip("*~#!%$@^-") for w in state.state.upper().split("+")}
    what = "drained" if words & {"DRAIN", "DRAINED", "DRAINING"} else \
        "down" if words & {"DOWN", "FAIL", "FAILING"} else "marked"
    # a Reason with mldiag's tag left alone: say who set it (the rule compares that too)
    setter = f", set by {state.set_by}" if state.tagged and state.set_by else ""
    return f"{what} by someone else{setter}"


# ------------------------------------------------------------------ running

TransportFor = Callable[[Target], Transport]


def run_on_login(transport: Transport, argv: List[str], payload: bytes, timeout: float):
    """One command on the login node (drain and undrain): (exit code or None, stdout,
    one-line problem or None)."""
    try:
        out = transport.run(argv, payload, time.monotonic() + timeout)
    except TransportError as exc:
        return None, "", f"{exc.layer}: {exc.message}"
    stdout = out.stdout.decode("utf-8", "replace")
    stderr = out.stderr.decode("utf-8", "replace")
    if out.timed_out:
        return None, stdout, f"no answer within {timeout:g} s"
    if out.lost:
        return None, stdout, out.lost
    if out.exit_code != 0:
        return out.exit_code, stdout, (f"exit {out.exit_code}: "
                                       f"{first_line(stderr) or first_line(stdout) or 'no message'}")
    return 0, stdout, None


def whoami(login: Target, transport: Transport, timeout: float) -> Tuple[Optional[Owner], str]:
    """(who this run is on the login host, or None; the problem when None)."""
    _, who, problem = run_on_login(transport, ["id", "-un"], b"", timeout)
    user = who.strip()
    if problem or not NAME.fullmatch(user):
        return None, f"cannot tell which user mldiag runs as: {problem or repr(user[:40])}"
    return Owner.of(login, user), ""


def node_states(transport: Transport, nodes: Sequence[str], timeout: float
            ) -> Tuple[Dict[str, NodeState], Optional[str]]:
    """Slurm's state of ``nodes`` (those it knows) and a problem, if no answer came."""
    states: Dict[str, NodeState] = {}
    for i in range(0, len(nodes), SHOW_CHUNK):
        chunk = list(nodes[i:i + SHOW_CHUNK])
        code, stdout, problem = run_on_login(transport, show_argv(chunk), b"", timeout)
        found = parse_show_node(stdout)
        if problem and not found:    # an unknown node is exit 1 with the others still shown
            return states, f"scontrol show node: {problem}"
        states.update({n: s for n, s in found.items() if n in chunk})
    return states, None


def run(steps: Sequence[DrainStep], *, drain: bool = False, undrain: bool = False,
        pool: Optional[SshPool] = None, timeout: float = DEFAULT_TIMEOUT,
        transport: Optional[TransportFor] = None) -> List[DrainOutcome]:
    """Apply ``plan``'s steps: drain with ``drain``, resume with ``undrain``; the commands of
    a flag not given come back as ``would-run`` (nothing changed). One outcome per step, in
    order. ``pool``: the run's SshPool (its connections are reused; default: a new one, closed
    here). ``transport``: how a login target is reached (default ``hops.transport_for``)."""
    outcomes: List[Optional[DrainOutcome]] = [None] * len(steps)
    by_login: Dict[str, List[int]] = {}
    for i, step in enumerate(steps):
        if step.login is None:
            outcomes[i] = decide(step, None, None)
        else:
            by_login.setdefault(step.login.name.partition(":")[0], []).append(i)
    with reaching(pool, transport) as (transport_of, planned_on):
        for base, indices in by_login.items():
            login = steps[indices[0]].login
            for i, outcome in zip(indices, _run_login(login, [steps[i] for i in indices],
                                                      drain, undrain, transport_of, timeout,
                                                      planned_on)):
                outcomes[i] = outcome
    return [o for o in outcomes if o is not None]


@contextlib.contextmanager
def reaching(pool: Optional[SshPool], transport: Optional[TransportFor]
             ) -> Iterator[Tuple[TransportFor, Optional[SshPool]]]:
    """(how a target's machine is reached, the pool to plan its connection on or None):
    ``transport`` when given (no pool), else ``hops.transport_for`` on ``pool`` (a new one,
    closed at the end, when None). Drain's login hosts and taint.py's kubectl hosts alike."""
    if transport is not None:
        yield transport, None
        return
    own = pool is None
    pool = pool or SshPool()
    try:
        yield (lambda t: transport_for(t, pool)), pool
    finally:
        if own:
            pool.close()


@contextlib.contextmanager
def held_open(transport: Transport, pool: Optional[SshPool]) -> Iterator[None]:
    """Keep ``transport``'s connection open across the commands run inside: planned on the
    pool (a pool whose planned targets are done closes a connection after each command)."""
    endpoint = getattr(transport, "endpoint", None) if pool is not None else None
    if endpoint is not None:
        pool.plan(endpoint)
    try:
        yield
    finally:
        if endpoint is not None:
            pool.finished(endpoint)


def _run_login(login: Target, steps: List[DrainStep], drain: bool, undrain: bool,
               transport_of: TransportFor, timeout: float,
               pool: Optional[SshPool]) -> List[DrainOutcome]:
    try:
        transport = transport_of(login)
    except TransportError as exc:
        return [_error(s, f"{exc.layer}: {exc.message}") for s in steps]
    with held_open(transport, pool):
        return _decide_and_apply(login, transport, steps, drain, undrain, timeout)


def _decide_and_apply(login: Target, transport: Transport, steps: List[DrainStep], drain: bool,
                      undrain: bool, timeout: float) -> List[DrainOutcome]:
    nodes = list(dict.fromkeys(s.node for s in steps))
    states, problem = node_states(transport, nodes, timeout)
    if problem:
        return [_error(s, f"cannot read the node's Slurm state on {login.name}: {problem}")
                for s in steps]
    owner, problem = whoami(login, transport, timeout)
    if owner is None:
        return [_error(s, f"{login.name}: {problem}") for s in steps]
    outcomes = [decide(s, states.get(s.node), owner) for s in steps]
    touched = []
    for outcome in outcomes:
        if outcome.status != "would-run" or not (
                (outcome.flag == "--drain" and drain) or (outcome.flag == "--undrain" and undrain)):
            continue
        argv = login_prefix(login) + ["scontrol"]
        # NOTE: `quit` ends scontrol's reader (stdin stays open until the command ends: its EOF
        # is how a runtime learns that the client went away); the exit code is the update's
        _, _, problem = run_on_login(transport, argv, f"{outcome.line}\nquit\n".encode(), timeout)
        outcome.status = "failed" if problem else "ran"
        outcome.message = (f"scontrol failed ({problem})" if problem else
                           "drained" if outcome.flag == "--drain" else "resumed")
        touched.append(outcome)
    if touched:
        after, _ = node_states(transport, [o.node for o in touched], timeout)
        for outcome in touched:
            outcome.after = after.get(outcome.node)
    return outcomes


def _error(step: DrainStep, message: str) -> DrainOutcome:
    return DrainOutcome(target=step.target, status="error", message=message,
                        login=step.login.name if step.login else None, node=step.node)


# ------------------------------------------------------------------ output

def failed(outcomes: Iterable[DrainOutcome]) -> bool:
    """Did a command fail, or a login host not answer?"""
    return any(o.status in ("failed", "error") for o in outcomes)


def commands(outcomes: Iterable[DrainOutcome]) -> List[str]:
    """The exact commands, run or (dry run) that would run, in order."""
    return [o.command for o in outcomes if o.command]


def lines(outcomes: Sequence[DrainOutcome]) -> List[str]:
    """What to print, one line each: every command (run, failed, or would run with which flag),
    every node left alone and why, and once, the rows that are not Slurm nodes (folded)."""
    out: List[Optional[str]] = []
    skipped: Dict[str, List[str]] = {}
    for o in outcomes:
        if o.status == "skipped":
            skipped.setdefault(o.message, []).append(o.target)
        else:
            out.append(outcome_line(o, o.target, f" (now State={o.after.state})" if o.after else ""))
    # NOTE: a login host that did not answer is not "nothing to do": its error line says so
    nothing = not any(o.command for o in outcomes) and not failed(outcomes) and any(
        o.status not in ("skipped",) for o in outcomes)
    return framed(out, skipped, "Slurm: nothing to drain or resume" if nothing else None)


def outcome_line(o, who: str, now: str, tail: str = "") -> Optional[str]:
    """One outcome's line (a DrainOutcome, or taint.py's TaintOutcome): the command run, failed
    or that would run with its flag, else its message (None: nothing to say). ``now``: the
    state read back after the command; ``tail``: more said after a command."""
    if o.status == "would-run":
        return f"{who}: {o.flag} would run: {o.command}{tail}"
    if o.status == "ran":
        return f"{who}: {o.message}{now}: {o.command}{tail}"
    if o.status == "failed":
        return f"{who}: {o.message}: {o.command}"
    return f"{who}: {o.message}" if o.message else None


def framed(out: Sequence[Optional[str]], skipped: Dict[str, List[str]],
           heading: Optional[str]) -> List[str]:
    """The lines to print: ``out`` (less the Nones), then each reason rows were skipped with
    those rows (folded), ``heading`` first when given; each made one inert line (Reasons,
    states, taints and stderr are the remote side's words)."""
    lines_ = [line for line in out if line is not None]
    lines_ += [f"{why}: skipped: {nodeset.fold(names)}" for why, names in skipped.items()]
    return [safe_text(line) for line in ([heading] if heading else []) + lines_]
