"""node-check ``--taint`` / ``--condition`` / ``--untaint`` on Kubernetes: the mirror of Slurm's
``--drain`` / ``--undrain`` (drain.py) for kubectl targets (a pod).

The node is the one the pod runs on now (the pod's ``.spec.nodeName``), asked through the
same host, ``become`` and namespace the target's ``kubectl exec`` uses (kubectl's current
context there). On a drain-level finding (worst action ``drain`` or ``rma``, as drain.py
decides) the node gets:

- ``--taint``: the taint ``mldiag.io/unhealthy:NoSchedule`` (``kubectl taint node N KEY:EFFECT``):
  no new pod is scheduled there; the pods running there stay (NoSchedule evicts nothing).
- ``--condition``: the node condition ``MldiagUnhealthy`` (status ``True``, reason
  ``NodeCheckFailed``, the codes in its message), as node-problem-detector reports one, by a
  strategic merge patch of the node's status (``kubectl patch node N --subresource status``:
  kubectl 1.24 or later, KEP-2590: alpha in 1.24, beta in 1.27, GA in 1.33).

``--untaint``: a node whose checked pods all pass (ok/warn, nothing at drain level; a pod
failing below drain or not checked keeps it as it is) loses mldiag's taint (``KEY:EFFECT-``)
and mldiag's condition (``$patch: delete`` on its type). Nothing else is ever removed:
``kubectl taint node N KEY:EFFECT-`` removes only the taints with that key *and* effect
(kubectl's ``deleteTaint``), so another team's key, ``node.kubernetes.io/unschedulable`` (a
cordon), or a ``mldiag.io/unhealthy:NoExecute`` someone set by hand stay. Kubernetes records
no author in a taint: the key is what says it is mldiag's (``NodeState.tainted``).

Several pods on one node (one per GPU, say) decide together: one at drain level taints the
node (the codes of all of them), and the node is untainted only when every pod checked on it
passes.

Without a flag (a dry run) nothing changes: the commands come back as "would run", after the
same reads (``kubectl get pods … -o json``, ``kubectl get nodes … -o json``). A read that fails
there (a user with ``pods/exec`` but no right to read nodes, which is common) is said and does
not change the exit status; with a flag it does (the change asked for did not happen).

The safe alphabet (docs/architecture.md, invariant 1) has no ``=``, ``{``, quote or space, so:
the taint carries no value (``KEY=VALUE`` would need ``=``; the codes are in the condition's
message and in mldiag's output); the pod's node is read from ``-o json`` (a jsonpath template
needs braces); the condition's patch goes in a file (``--patch-file``, created 0600 with
``Transport.put``, removed after). The line shown for it is the shell command that sends the
same patch with ``-p``.

Everything kubectl answers is untrusted: the node name must be a DNS-1123 subdomain (what
Kubernetes allows a node's name) before it reaches a command line, anything else is refused
with the name shown inert; the JSON is read field by field, a field of the wrong type ignored.
"""

import datetime
import io
import json
import re
import secrets
import shlex
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, TextIO, Tuple

from . import drain as drain_mod
from ...core import nodeset
from ...core.errors import EXIT_ERROR, InputError
from ...core.outcome import Outcome
from ...core.results import Result, action_rank
from ...inventory.topology import SshHost, Target
from ...transport.base import Transport, TransportError
from ...transport.ssh import SshPool

KEY = "mldiag.io/unhealthy"
EFFECT = "NoSchedule"
TAINT = f"{KEY}:{EFFECT}"            # kubectl taint's KEY:EFFECT (no value: no '=' on a command line)
CONDITION = "MldiagUnhealthy"        # the node condition's type
REASON = "NodeCheckFailed"           # its reason (CamelCase, as the kubelet's and NPD's are)
MESSAGE_MAX = 256                    # the condition's message: codes past it become "+N more"
CHUNK = 50                           # names per `kubectl get` (a node's JSON can be 100 KB)
DEFAULT_TIMEOUT = 30.0               # seconds per kubectl call
PATCH_DIR = "/tmp"                   # where the condition's patch file is put, on kubectl's host

# DNS-1123 (k8s.io/apimachinery/pkg/util/validation): a node or pod name is a subdomain
# (<= 253), a namespace a label (<= 63). Neither can start with '-': never read as an option.
_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def is_subdomain(name: object) -> bool:
    return isinstance(name, str) and len(name) <= 253 and bool(_SUBDOMAIN.fullmatch(name))


def is_label(name: object) -> bool:
    return isinstance(name, str) and len(name) <= 63 and bool(re.fullmatch(_LABEL, name))


def taint_text(key: str, value: str, effect: str) -> str:
    """A taint as kubectl writes it (``Taint.ToString``): ``key=value:effect``, ``key:effect``."""
    return f"{key}={value}:{effect}" if value else f"{key}:{effect}"


# ------------------------------------------------------------------ planning (pure)

@dataclass(frozen=True)
class TaintStep:
    """What mldiag wants for one result row. ``want``: taint | untaint | keep | skip."""
    target: str
    want: str
    pod: Optional[Target] = None     # the kubectl target (its host runs kubectl)
    codes: Tuple[str, ...] = ()      # for taint: the drain-level codes
    when: str = ""                   # for taint: the check's time (drain.stamp)
    why: str = ""                    # for keep/skip: one line


def _pod_target(name: str, targets: Sequence[Target]) -> Optional[Target]:
    for t in targets:
        if t.name == name and t.container is not None and t.container.runtime == "kubectl":
            return t
    return None


def plan(results: Sequence[Result], targets: Sequence[Target],
         now: Optional[datetime.datetime] = None) -> List[TaintStep]:
    """One step per result row, in order. ``targets``: the selected targets, which say which
    rows are pods (a container target with ``runtime: kubectl``)."""
    when = drain_mod.stamp(now)
    steps = []
    for r in results:
        pod = _pod_target(r.target, targets)
        if pod is None:
            steps.append(TaintStep(r.target, "skip", why="not a Kubernetes pod"))
            continue
        c = pod.container
        if not is_subdomain(c.id) or (c.namespace is not None and not is_label(c.namespace)):
            steps.append(TaintStep(r.target, "skip", why="not a plain pod name (kubectl exec "
                                   "picks the pod of a TYPE/NAME: mldiag cannot tell its node)"))
            continue
        worst = drain_mod.worst_action(r)
        if r.status == "error":
            layer = r.error.layer if r.error else "error"
            steps.append(TaintStep(r.target, "keep", pod, why=f"not checked ({layer})"))
        elif action_rank(worst) >= drain_mod.DRAIN_RANK:
            steps.append(TaintStep(r.target, "taint", pod, codes=tuple(drain_mod.drain_codes(r)),
                                   when=when))
        elif r.status in ("ok", "warn"):
            steps.append(TaintStep(r.target, "untaint", pod))
        else:
            steps.append(TaintStep(r.target, "keep", pod,
                                   why=f"still failing (worst action {worst})"))
    return steps


def merged(steps: Sequence[TaintStep]) -> TaintStep:
    """The steps of the pods on one node, as one: any taint taints (with every pod's codes),
    else any keep keeps, else untaint."""
    taints = [s for s in steps if s.want == "taint"]
    if taints:
        codes = tuple(dict.fromkeys(code for s in taints for code in s.codes))
        return TaintStep(steps[0].target, "taint", steps[0].pod, codes=codes, when=taints[0].when)
    keeps = [s for s in steps if s.want == "keep"]
    if keeps:
        return keeps[0]
    return steps[0]


def condition_message(codes: Sequence[str], pods: Sequence[str], when: str) -> str:
    """``mldiag: xid-79, nvlink-down (node-check of ml/trainer-0 2026-12-01T10:00Z)``, at most
    MESSAGE_MAX characters (codes that do not fit become ``+N more``)."""
    tail = f" (node-check of {nodeset.fold(pods)} {when})"
    if len(tail) > MESSAGE_MAX // 2:
        tail = f" (node-check of {len(pods)} pods {when})"
    return drain_mod.tagged(codes, tail, MESSAGE_MAX)


def set_patch(message: str, now: datetime.datetime) -> Dict[str, object]:
    """The strategic merge patch that sets mldiag's condition (conditions merge on ``type``)."""
    at = now.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"status": {"conditions": [{
        "type": CONDITION, "status": "True", "reason": REASON, "message": message,
        "lastHeartbeatTime": at, "lastTransitionTime": at}]}}


def delete_patch() -> Dict[str, object]:
    """The strategic merge patch that removes mldiag's condition, and only it."""
    return {"status": {"conditions": [{"$patch": "delete", "type": CONDITION}]}}


def patch_bytes(patch: Dict[str, object]) -> bytes:
    return json.dumps(patch, separators=(",", ":")).encode()


# ------------------------------------------------------------------ kubectl's answers (pure)

@dataclass(frozen=True)
class NodeState:
    """A node as ``kubectl get nodes -o json`` says: its taints, and mldiag's condition."""
    name: str
    taints: Tuple[Tuple[str, str, str], ...] = ()       # (key, value, effect)
    condition: Optional[Tuple[str, str]] = None         # mldiag's: (status, message)

    @property
    def tainted(self) -> bool:
        """mldiag's taint is there (its key and effect: whoever set it, it is mldiag's key)."""
        return any(k == KEY and e == EFFECT for k, _, e in self.taints)

    @property
    def others(self) -> List[str]:
        """Every taint that is not mldiag's, as kubectl writes it."""
        return [taint_text(k, v, e) for k, v, e in self.taints if not (k == KEY and e == EFFECT)]

    @property
    def flagged(self) -> bool:
        return self.condition is not None and self.condition[0] == "True"

    def shown(self) -> str:
        taints = ",".join(taint_text(*t) for t in self.taints) or "<none>"
        condition = f", {CONDITION}={self.condition[0]}" if self.condition else ""
        return f"Taints={taints}{condition}"


def _objects(text: str, kind: str) -> List[dict]:
    """``kubectl get … -o json``: the one object of ``kind`` (a single name), or the items of
    kubectl's ``List`` (several names; kubectl's get.go printGeneric)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return []
    if not isinstance(doc, dict):
        return []
    items = doc.get("items") if doc.get("kind") == "List" else [doc]
    return [i for i in items if isinstance(i, dict) and i.get("kind") == kind] \
        if isinstance(items, list) else []


def _field(obj: object, *path: str) -> object:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def parse_pods(text: str, namespace: Optional[str]) -> Dict[str, str]:
    """{pod name: its ``.spec.nodeName`` as kubectl gave it ('' when not scheduled)}; a pod of
    another namespace than the one asked is not an answer. The node name is NOT checked here
    (``pod_nodes`` refuses a bad one, saying so)."""
    found: Dict[str, str] = {}
    for pod in _objects(text, "Pod"):
        name, ns = _field(pod, "metadata", "name"), _field(pod, "metadata", "namespace")
        if not isinstance(name, str) or (namespace is not None and ns != namespace):
            continue
        node = _field(pod, "spec", "nodeName")
        found[name] = node if isinstance(node, str) else ""
    return found


def parse_nodes(text: str) -> Dict[str, NodeState]:
    """{node: NodeState} of ``kubectl get nodes -o json``: each taint's key, value and effect
    (a taint that is not three strings is kept as someone else's), and mldiag's condition."""
    nodes: Dict[str, NodeState] = {}
    for node in _objects(text, "Node"):
        name = _field(node, "metadata", "name")
        if not isinstance(name, str):
            continue
        taints = []
        for t in _field(node, "spec", "taints") or ():
            key, value, effect = (_field(t, f) for f in ("key", "value", "effect"))
            taints.append((key if isinstance(key, str) else "?", value if isinstance(value, str)
                           else "", effect if isinstance(effect, str) else "?"))
        condition = None
        conditions = _field(node, "status", "conditions")
        for c in conditions if isinstance(conditions, list) else ():
            if _field(c, "type") == CONDITION:
                status, message = _field(c, "status"), _field(c, "message")
                condition = (status if isinstance(status, str) else "?",
                             message if isinstance(message, str) else "")
        nodes[name] = NodeState(name, tuple(taints), condition)
    return nodes


# ------------------------------------------------------------------ commands

def kubectl(pod: Target, *args: str) -> List[str]:
    """kubectl on the pod target's host, as its ``kubectl exec`` runs (``sudo -n --`` with
    ``become: sudo``)."""
    return drain_mod.login_prefix(pod) + ["kubectl", *args]


def get_pods_argv(pod: Target, names: Sequence[str]) -> List[str]:
    ns = pod.container.namespace
    return kubectl(pod, "get", "pods", *(["-n", ns] if ns else []), *names, "-o", "json")


def get_nodes_argv(pod: Target, nodes: Sequence[str]) -> List[str]:
    return kubectl(pod, "get", "nodes", *nodes, "-o", "json")


def taint_argv(pod: Target, node: str, remove: bool = False) -> List[str]:
    if not is_subdomain(node):
        raise ValueError(f"not a Kubernetes node name: {node!r}")
    return kubectl(pod, "taint", "node", node, TAINT + ("-" if remove else ""))


def patch_argv(pod: Target, node: str, path: str) -> List[str]:
    if not is_subdomain(node):
        raise ValueError(f"not a Kubernetes node name: {node!r}")
    return kubectl(pod, "patch", "node", node, "--subresource", "status", "--type", "strategic",
                   "--patch-file", path)


def patch_shown(pod: Target, node: str, patch: bytes) -> str:
    """The shell command that sends the same patch with ``-p`` (what the user would type)."""
    return shlex.join(kubectl(pod, "patch", "node", node, "--subresource", "status", "--type",
                              "strategic", "-p", patch.decode()))


@dataclass
class TaintOutcome:
    """What happened (or would) on one node, for the pods ``targets``. ``status``: would-run |
    ran | failed | nothing | skipped | error."""
    targets: Tuple[str, ...]
    status: str
    message: str
    node: Optional[str] = None
    flag: Optional[str] = None       # the flag that runs ``argv``
    command: Optional[str] = None    # as shown: a shell command doing the same
    argv: Optional[List[str]] = None  # as run (the condition's patch in a file)
    patch: Optional[bytes] = None    # the condition's patch (the file's bytes)
    others: Tuple[str, ...] = ()     # the node's taints that are not mldiag's (left alone)
    before: Optional[NodeState] = None
    after: Optional[NodeState] = None


def decide(steps: Sequence[TaintStep], state: Optional[NodeState], node: str,
           now: datetime.datetime) -> List[TaintOutcome]:
    """What the rules allow on ``node`` for the steps of the pods on it (``merged``), given
    kubectl's ``state`` of it. Commands come back ``would-run``."""
    base = dict(targets=tuple(s.target for s in steps), node=node, before=state)
    if state is None:
        return [TaintOutcome(status="error", message=f"kubectl get nodes does not know {node}",
                             **base)]
    step = merged(steps)
    pod = step.pod
    out: List[TaintOutcome] = []
    if step.want == "taint":
        if state.tainted:
            out.append(TaintOutcome(status="nothing", message=f"already tainted {TAINT}", **base))
        else:
            argv = taint_argv(pod, node)
            out.append(TaintOutcome(status="would-run", message="taint", flag="--taint", argv=argv,
                                    command=shlex.join(argv), **base))
        if state.flagged:
            out.append(TaintOutcome(status="nothing", message=f"{CONDITION} already True",
                                    **base))
        else:
            pods = [_pod_name(s.pod) for s in steps if s.want == "taint"]
            patch = patch_bytes(set_patch(condition_message(step.codes, pods, step.when), now))
            out.append(_patch_outcome(pod, node, patch, "--condition", "condition", base))
    elif step.want == "untaint":
        others = tuple(state.others)
        if state.tainted:
            argv = taint_argv(pod, node, remove=True)
            out.append(TaintOutcome(status="would-run", message="untaint", flag="--untaint",
                                    argv=argv, command=shlex.join(argv), others=others, **base))
        if state.condition is not None:
            out.append(_patch_outcome(pod, node, patch_bytes(delete_patch()), "--untaint",
                                      "remove condition", base))
    elif state.tainted or state.flagged:   # keep: failing below drain, or not checked
        out.append(TaintOutcome(status="nothing", message=f"stays as it is: {step.why} "
                                f"({state.shown()})", **base))
    return out or [TaintOutcome(status="nothing", message="", **base)]


def _pod_name(pod: Target) -> str:
    c = pod.container
    return f"{c.namespace}/{c.id}" if c.namespace else c.id


def _patch_outcome(pod: Target, node: str, patch: bytes, flag: str, message: str,
                   base: dict) -> TaintOutcome:
    return TaintOutcome(status="would-run", message=message, flag=flag, patch=patch,
                        command=patch_shown(pod, node, patch), **base)


# ------------------------------------------------------------------ running

TransportFor = drain_mod.TransportFor


def run(steps: Sequence[TaintStep], *, taint: bool = False, condition: bool = False,
        untaint: bool = False, pool: Optional[SshPool] = None,
        timeout: float = DEFAULT_TIMEOUT, transport: Optional[TransportFor] = None,
        now: Optional[datetime.datetime] = None) -> List[TaintOutcome]:
    """Apply ``plan``'s steps: the commands of each flag given run, the others come back as
    ``would-run``. Per kubectl host (and ``become``): the pods' nodes, then the nodes' taints
    and conditions, then the commands, then the nodes read back. ``transport``: how a pod
    target's host is reached (default ``transport_for`` on ``pool``)."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    given = {"--taint": taint, "--condition": condition, "--untaint": untaint}
    outcomes: List[TaintOutcome] = []
    skipped: List[TaintOutcome] = []
    hosts: Dict[Tuple[bool, Optional[SshHost], bool], List[TaintStep]] = {}
    for step in steps:
        if step.pod is None:
            skipped.append(TaintOutcome((step.target,), "skipped", step.why))
        else:
            hosts.setdefault((step.pod.local, step.pod.host, bool(step.pod.become)), []).append(step)
    with drain_mod.reaching(pool, transport) as (transport_of, planned_on):
        for group in hosts.values():
            outcomes += _run_host(group, given, transport_of, timeout, now, planned_on)
    return outcomes + skipped


# klog's lines, which kubectl writes before its own message (five of them before "The connection
# to the server … was refused"): `E1207 04:35:09.626605   31495 memcache.go:265] …`
_KLOG = re.compile(rb"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^\]\n]*\] [^\n]*\n?", re.M)


class _Said:
    """A transport whose stderr is kubectl's own words: klog's lines left out, so the first
    line is the message kubectl ends with (drain.run_on_login reports the first)."""

    def __init__(self, transport: Transport):
        self.transport = transport

    def run(self, argv, payload, deadline, **kw):
        out = self.transport.run(argv, payload, deadline, **kw)
        return replace(out, stderr=_KLOG.sub(b"", out.stderr))


def _call(transport: Transport, argv: List[str], timeout: float):
    return drain_mod.run_on_login(_Said(transport), argv, b"", timeout)


def _run_host(steps: List[TaintStep], given: Dict[str, bool], transport_of: TransportFor,
              timeout: float, now: datetime.datetime, pool: Optional[SshPool]
              ) -> List[TaintOutcome]:
    try:
        transport = transport_of(steps[0].pod)
    except TransportError as exc:
        return [_error(s, f"{exc.layer}: {exc.message}") for s in steps]
    with drain_mod.held_open(transport, pool):
        return _decide_and_apply(steps, given, transport, timeout, now)


def _decide_and_apply(steps: List[TaintStep], given: Dict[str, bool], transport: Transport,
                      timeout: float, now: datetime.datetime) -> List[TaintOutcome]:
    first = steps[0].pod
    errors: List[TaintOutcome] = []
    # the pods' nodes, one `kubectl get pods` per namespace (and chunk)
    by_node: Dict[str, List[TaintStep]] = {}
    by_ns: Dict[Optional[str], List[TaintStep]] = {}
    for s in steps:
        by_ns.setdefault(s.pod.container.namespace, []).append(s)
    for group in by_ns.values():
        for i in range(0, len(group), CHUNK):
            chunk = group[i:i + CHUNK]
            names = list(dict.fromkeys(s.pod.container.id for s in chunk))
            _, stdout, problem = _call(transport, get_pods_argv(chunk[0].pod, names), timeout)
            found = parse_pods(stdout, chunk[0].pod.container.namespace)
            for s in chunk:
                node, why = pod_node(s.pod, found, problem)
                if node is None:
                    errors.append(_error(s, why))
                else:
                    by_node.setdefault(node, []).append(s)
    if not by_node:
        return errors
    # the nodes' taints and conditions
    states, problem = node_states(transport, first, list(by_node), timeout)
    if problem:
        return errors + [_error(s, f"cannot read node {node}: {problem}", node)
                         for node, group in by_node.items() for s in group]
    outcomes: List[TaintOutcome] = []
    for node, group in by_node.items():
        outcomes += decide(group, states.get(node), node, now)
    touched = [o for o in outcomes if o.status == "would-run" and given.get(o.flag)]
    for o in touched:
        _apply(o, first, transport, timeout)
    if touched:
        after, _ = node_states(transport, first, list(dict.fromkeys(o.node for o in touched)),
                               timeout)
        for o in touched:
            o.after = after.get(o.node)
    return errors + outcomes


def pod_node(pod: Target, found: Dict[str, str], problem: Optional[str]
             ) -> Tuple[Optional[str], str]:
    """(the pod's node, or None; why not). A node name that is not a DNS-1123 subdomain is
    refused here: it never reaches a command line."""
    c = pod.container
    where = f"pod {_pod_name(pod)}"
    if c.id not in found:
        return None, f"{where}: kubectl get pods: {problem or 'not in its answer'}"
    node = found[c.id]
    if not node:
        return None, f"{where} is not scheduled on a node (no .spec.nodeName)"
    if not is_subdomain(node):
        return None, (f"{where}: refused: kubectl says it runs on node {_clip(repr(node))}, "
                      f"which is not a Kubernetes node name (a DNS-1123 subdomain)")
    return node, ""


def node_states(transport: Transport, pod: Target, nodes: Sequence[str], timeout: float
                ) -> Tuple[Dict[str, NodeState], Optional[str]]:
    """kubectl's state of ``nodes`` (those it knows) and a problem, if no answer came."""
    states: Dict[str, NodeState] = {}
    for i in range(0, len(nodes), CHUNK):
        chunk = list(nodes[i:i + CHUNK])
        _, stdout, problem = _call(transport, get_nodes_argv(pod, chunk), timeout)
        found = parse_nodes(stdout)
        if problem and not found:    # an unknown node is exit 1 with the others still shown
            return states, f"kubectl get nodes: {problem}"
        if not problem and not found:
            return states, "kubectl get nodes: no JSON answer"
        states.update({n: s for n, s in found.items() if n in chunk})
    return states, None


# kubectl's own words for a change that was already made (taint.go, utils.go): the goal is met
_ALREADY = {"--taint": "already has", "--untaint": f'taint "{TAINT}" not found'}


def _apply(o: TaintOutcome, pod: Target, transport: Transport, timeout: float) -> None:
    if o.patch is None:
        _, _, problem = _call(transport, o.argv, timeout)
    else:
        path = f"{PATCH_DIR}/mldiag-node-condition-{secrets.token_hex(8)}.json"
        o.argv = patch_argv(pod, o.node, path)
        try:
            transport.put(o.patch, path)
        except (TransportError, OSError) as exc:
            o.status, o.message = "failed", f"the patch file {path} not written ({_reason(exc)})"
            return
        try:
            _, _, problem = _call(transport, o.argv, timeout)
        finally:
            _call(transport, ["rm", "-f", "--", path], timeout)
    if problem and o.patch is None and _ALREADY[o.flag] in problem:
        o.status, o.message = "nothing", ("already tainted" if o.flag == "--taint"
                                          else "already untainted")
        return
    o.status = "failed" if problem else "ran"
    done = {"taint": "tainted", "untaint": "untainted", "condition": f"{CONDITION} set",
            "remove condition": f"{CONDITION} removed"}[o.message]
    o.message = f"kubectl failed ({problem})" if problem else done


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TransportError):
        return f"{exc.layer}: {exc.message}"
    return getattr(exc, "strerror", None) or str(exc)


def _error(step: TaintStep, message: str, node: Optional[str] = None) -> TaintOutcome:
    return TaintOutcome((step.target,), "error", message, node=node)


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


# ------------------------------------------------------------------ output

def failed(outcomes: Sequence[TaintOutcome]) -> bool:
    return any(o.status in ("failed", "error") for o in outcomes)


def commands(outcomes: Sequence[TaintOutcome]) -> List[str]:
    """The commands, run or (dry run) that would run, in order, as shown."""
    return [o.command for o in outcomes if o.command]


def lines(outcomes: Sequence[TaintOutcome]) -> List[str]:
    """What to print, one line each (the node's words made inert): each command (run, failed,
    or would run with which flag), each node kept as it is, each error, and once the rows that
    are not pods (folded)."""
    out: List[Optional[str]] = []
    skipped: Dict[str, List[str]] = {}
    for o in outcomes:
        if o.status == "skipped":
            skipped.setdefault(o.message, []).extend(o.targets)
            continue
        who = nodeset.fold(o.targets) + (f" (node {o.node})" if o.node else "")
        left = f"; left alone: {', '.join(o.others)} (not mldiag's)" if o.others else ""
        out.append(drain_mod.outcome_line(o, who, f" (now {o.after.shown()})" if o.after else "",
                                          left))
    nothing = not any(o.command for o in outcomes) and not failed(outcomes) and any(
        o.status != "skipped" for o in outcomes)
    return drain_mod.framed(out, skipped, "Kubernetes: nothing to taint or untaint" if nothing
                            else None)


def report(opts: Any, outcome: Outcome, *, out: TextIO, taint: bool = False,
           condition: bool = False, untaint: bool = False) -> Outcome:
    """node-check's Kubernetes step, after the Slurm one: taint/untaint (or, without a flag,
    show what would run) for the pod rows, under a ``Kubernetes:`` heading (on stderr with
    --json). A flag with no pod checked is exit 3, as --drain with no Slurm node is."""
    from ...engine import execute as engine
    asked = taint or condition or untaint
    try:
        targets = engine.select_targets(opts, note=io.StringIO())   # said once, by the run
    except InputError:
        # NOTE: the run read the same selection a moment ago; without a flag nothing was asked
        # of this step, so a hosts file gone since costs no error here
        if asked:
            raise
        return outcome
    steps = plan(outcome.results, targets)
    if not any(step.want != "skip" for step in steps):
        if asked:
            return Outcome(outcome.results, max(outcome.exit_code, EXIT_ERROR),
                           outcome.messages + ("--taint/--condition/--untaint: no Kubernetes "
                                               "pod was checked",))
        return outcome
    outcomes = run(steps, taint=taint, condition=condition, untaint=untaint)
    shown = lines(outcomes)
    messages = outcome.messages
    if opts.json:   # stdout is the JSON document
        messages += tuple(shown)
    else:
        heading = "Kubernetes: "
        out.write("\nKubernetes:\n" + "".join(
            f"  {line[len(heading):] if line.startswith(heading) else line}\n" for line in shown))
        out.flush()
    code = outcome.exit_code
    # NOTE: without a flag nothing was asked: a read that failed (no right to read nodes) is
    # said, not an error of the run
    if asked and failed(outcomes):
        code = max(code, EXIT_ERROR)
    return Outcome(outcome.results, code, messages)
