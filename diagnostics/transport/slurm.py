"""Slurm: ``ssh login → srun (one step per node) → [sudo] → [container] → interpreter``.

A ``slurm:`` host is a login node. Running there is three moves, all through the login
host's one SSH connection:
1. ``salloc --no-shell`` gets one allocation of the nodes (queue wait is bounded by ``-I``,
   the diagnostic's timeout; it does not count against the diagnostic's own timeout);
2. one ``srun --jobid J -w NODE --overlap`` step per node streams the bundle through stdin
   to that node — compute nodes need not share the login node's /tmp — so a dead node fails
   its own step while the others report (one ``srun -N4`` step would fail as a whole);
3. ``scancel J`` in every outcome; interrupted while salloc still waits in the queue,
   ``scancel --name`` with the allocation's own job name (a salloc without a terminal is not
   ended by its SSH channel closing).
Timeouts are enforced on the node by the runtime and by the client: srun's ``-t`` is only
checked about once a minute.

``SlurmAllocation`` makes moves 1 and 3; each node becomes a ``NodeRow`` (the target under the
row's name, and its ``SrunStep``) that the runner runs as ``chain_for(target, pool, step)``.
"""

import re
import secrets
import threading
import time
import traceback
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence

from ..core import nodeset
from ..inventory.topology import NAME, Slurm, Target
from .base import Classification, Transport, TransportError, Wrapper, find_line, first_line

_GRANTED = re.compile(r"Granted job allocation (\d+)")
# `scontrol show node -o`: one line per node, NodeName=... NodeAddr=... (the address slurmctld
# and the other nodes reach it at); an address is a host name or an IP, nothing else
_NODE_ADDR = re.compile(r"(?:^|\s)NodeName=(\S+)\s.*?(?:^|\s)NodeAddr=(\S+)")
_ADDRESS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,252}")


def node_names(slurm: Slurm) -> Optional[List[str]]:
    """The nodelist of hosts.yaml, expanded (brackets never reach a command line)."""
    if not slurm.nodelist:
        return None
    return nodeset.expand(slurm.nodelist)


def allocated_nodes(squeue_output: str) -> List[str]:
    """The node names of ``squeue -o %N``'s answer: what a login node says is untrusted, so its
    size is bounded before expanding and every name must be a plain token (it becomes ``-w``).
    ValueError otherwise."""
    text = squeue_output.strip()
    nodes = nodeset.expand(text) if text else []
    if not nodes:
        raise ValueError("squeue named no nodes for the allocation")
    for node in nodes:
        if not NAME.fullmatch(node):
            raise ValueError(f"squeue named node {node[:80]!r}, not a plain node name")
    return nodes


def job_name() -> str:
    """``mldiag-<12 hex>``: one allocation's own name, so that a request still pending can be
    cancelled (``scancel --name``) without touching any other job of the user."""
    return f"mldiag-{secrets.token_hex(6)}"


def salloc_argv(slurm: Slurm, queue_timeout: float, name: str = "mldiag") -> List[str]:
    nodes = node_names(slurm)
    argv = ["salloc", "--no-shell", "-J", name, "-N", str(len(nodes) if nodes else slurm.nodes),
            f"-I{max(1, int(queue_timeout))}"]
    if slurm.partition:
        argv += ["-p", slurm.partition]
    if slurm.account:
        argv += ["-A", slurm.account]
    if slurm.reservation:
        argv += ["--reservation", slurm.reservation]
    if slurm.time:
        argv += ["-t", slurm.time]
    if slurm.gpus_per_node:
        argv += ["--gpus-per-node", str(slurm.gpus_per_node)]
    if nodes:
        argv += ["-w", ",".join(nodes)]
    return argv


def parse_granted(text: str) -> Optional[str]:
    match = _GRANTED.search(text)
    return match.group(1) if match else None


def squeue_nodes_argv(jobid: str) -> List[str]:
    return ["squeue", "-h", "-j", jobid, "-o", "%N"]


def node_addr_argv(nodes: Sequence[str]) -> List[str]:
    return ["scontrol", "show", "node", "-o", ",".join(nodes)]


def parse_node_addrs(text: str) -> Dict[str, str]:
    """{node: NodeAddr} of ``scontrol show node -o``'s answer, for the lines whose name and
    address are plain tokens (what a login node says is untrusted: an address becomes a
    rendezvous argument)."""
    found = {}
    for line in text.splitlines()[:100000]:
        m = _NODE_ADDR.search(line)
        if m and NAME.fullmatch(m.group(1)) and _ADDRESS.fullmatch(m.group(2)):
            found[m.group(1)] = m.group(2)
    return found


def scancel_argv(jobid: str) -> List[str]:
    return ["scancel", jobid]


def scancel_name_argv(name: str) -> List[str]:
    """Cancel the user's jobs named ``name`` (pending or running)."""
    return ["scancel", "--name", name]


class SrunStep(Wrapper):
    """One job step on one node of an existing allocation."""

    kind = "srun"

    def __init__(self, jobid: str, node: str, addresses: Optional[Callable[[], Dict[str, str]]] = None):
        self.jobid = jobid
        self.node = node
        self._addresses = addresses       # the allocation's nodes' addresses, asked when needed

    def peer_address(self) -> Optional[str]:
        """The address the allocation's other nodes reach this node at (its NodeAddr), or None
        when Slurm did not say."""
        return self._addresses().get(self.node) if self._addresses is not None else None

    def wrap(self, argv: Sequence[str]) -> List[str]:
        return ["srun", "--jobid", self.jobid, "-N1", "-n1", "-w", self.node, "--overlap",
                "--quiet", "--"] + list(argv)

    def describe(self) -> str:
        return f"srun -w {self.node}"

    def classify(self, exit_code, stderr) -> Classification:
        line = find_line(stderr, "srun: error", "srun: fatal", "slurmstepd: error",
                         "Unable to create step", "Job step aborted")
        if line:
            return "unreachable", f"slurm node {self.node}: {line}"
        if exit_code is not None and exit_code >= 128 and find_line(stderr, "srun:"):
            return "unreachable", f"slurm node {self.node}: srun exit {exit_code}"
        return None


class SrunSteps(Wrapper):
    """A login target before its allocation: "one step per node" is what will run, but which
    job and nodes only salloc says.  It describes the plan; it never runs (each node row runs
    its own ``SrunStep``): running it would run on the login node itself."""

    kind = "srun"

    def __init__(self, slurm: Slurm):
        self.slurm = slurm

    def wrap(self, argv: Sequence[str]) -> List[str]:
        raise RuntimeError("a Slurm login target runs as node rows: allocate it first")

    def describe(self) -> str:
        nodes = self.slurm.nodelist if node_names(self.slurm) else f"{self.slurm.nodes} nodes"
        partition = f" -p {self.slurm.partition}" if self.slurm.partition else ""
        return f"srun{partition} ({nodes}, one step per node)"


@dataclass(frozen=True)
class NodeRow:
    """One node of an allocation as a row of its own: the login target under the row's name
    (``cluster-a:n3``, what ``-H cluster-a:n3`` selects) and the step that places it there.
    The placement stays beside the target, never in it: a Target is what hosts.yaml says."""
    target: Target
    step: SrunStep


class SlurmAllocation:
    """A login target's allocation: one ``NodeRow`` per node, released with ``release()``.

    ``failure`` is set instead when there is none (a TransportError, or a bug of ours with
    ``failure_traceback``)."""

    def __init__(self, target: Target, login: Callable[[], Transport], queue_timeout: float,
                 grace: float):
        self.target = target
        self._login_for = login          # makes the login node's transport (salloc, squeue, scancel)
        self.login: Optional[Transport] = None
        self.queue_timeout = queue_timeout
        self.grace = grace               # beyond the queue wait, before giving up on the link
        self.jobid: Optional[str] = None
        self.rows: List[NodeRow] = []
        self.failure: Optional[Exception] = None
        self.failure_traceback: Optional[str] = None
        self.duration_s = 0.0
        self._lock = threading.Lock()
        self._released = False
        self._requested = False          # salloc was sent: a job (pending or granted) may exist
        self.job_name = job_name()       # unique: a pending request is cancelled by its name
        self._addrs: Optional[Dict[str, str]] = None

    @property
    def base(self) -> str:
        return self.target.name.split(":", 1)[0]

    def allocate(self) -> "SlurmAllocation":
        """Ask for the allocation (once: an allocation granted for an earlier step of a
        runbook is returned as it is)."""
        if self.rows and self.failure is None and not self._released:
            return self
        started = time.monotonic()
        try:
            self.rows = [NodeRow(replace(self.target, name=f"{self.base}:{node}"),
                                 SrunStep(self.jobid, node, self.addresses)) for node in self._allocate()]
        except TransportError as exc:
            self.failure = exc
        except Exception as exc:
            self.failure, self.failure_traceback = exc, traceback.format_exc()
        self.duration_s = time.monotonic() - started
        return self

    def _allocate(self) -> List[str]:
        base, slurm = self.base, self.target.slurm
        login = self._login_for()        # resolving it (ssh -G) happens here, in the worker
        with self._lock:
            if self._released:
                raise TransportError("unreachable", f"salloc on {base}: the run was interrupted")
            self.login, self._requested = login, True
        deadline = time.monotonic() + self.queue_timeout + self.grace
        out = self.login.run(salloc_argv(slurm, self.queue_timeout, self.job_name), b"", deadline)
        text = (out.stderr + out.stdout).decode("utf-8", "replace")
        with self._lock:
            self.jobid = parse_granted(text)
            released_meanwhile = self._released
        if released_meanwhile:   # released while salloc ran: granted meanwhile, or not
            self._cancel()
            raise TransportError("unreachable", f"salloc on {base}: the run was interrupted")
        if not self.jobid:
            reason = first_line("\n".join(l for l in text.splitlines() if "error" in l.lower())
                                or text) or f"exit {out.exit_code}"
            raise TransportError("unreachable", f"salloc on {base} got no allocation: {reason}",
                                 text[-4000:])
        nodes = node_names(slurm)
        if nodes:
            return nodes
        out = self.login.run(squeue_nodes_argv(self.jobid), b"", deadline)
        try:
            return allocated_nodes(out.stdout.decode("utf-8", "replace"))
        except ValueError as exc:
            raise TransportError("unreachable", f"allocation {self.jobid} on {base}: {exc}",
                                 (out.stderr + out.stdout[:4000]).decode("utf-8", "replace"))

    def addresses(self) -> Dict[str, str]:
        """Each node's NodeAddr, asked once (``scontrol show node -o``, on the login node): where a
        group's ranks meet (engine/groups.py). {} when the login node does not answer."""
        with self._lock:
            if self._addrs is not None:
                return self._addrs
        found: Dict[str, str] = {}
        if self.login is not None and self.rows:
            try:
                out = self.login.run(node_addr_argv([r.step.node for r in self.rows]), b"",
                                     time.monotonic() + 30)
                found = parse_node_addrs(out.stdout.decode("utf-8", "replace"))
            except Exception:
                found = {}
        with self._lock:
            self._addrs = found
        return found

    def release(self) -> None:
        """``scancel`` the allocation; called once the run is over, in every outcome. While
        salloc still waits in the queue (an interrupted run), the pending request is cancelled
        by its job name: closing the SSH channel does not end a salloc that has no terminal."""
        with self._lock:
            self._released = True
            requested = self._requested
        if requested:
            self._cancel()

    def _cancel(self) -> None:
        argv = scancel_argv(self.jobid) if self.jobid else scancel_name_argv(self.job_name)
        try:
            self.login.run(argv, b"", time.monotonic() + 30)
        except Exception:
            pass


def allocate_all(targets: Sequence[Target], allocation_for: Callable[[Target], SlurmAllocation],
                 submit, allocations: List[SlurmAllocation]) -> List[object]:
    """Each Slurm login target becomes its allocation (made in parallel through ``submit``);
    other targets stay.  Each allocation joins ``allocations`` before it is waited for, so an
    interrupt during the queue wait still releases it."""
    pending = {}
    for i, t in enumerate(targets):
        if t.slurm is not None:
            allocation = allocation_for(t)
            allocations.append(allocation)
            pending[i] = submit(allocation.allocate)
    return [pending[i].result() if i in pending else t for i, t in enumerate(targets)]
