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
"""

import re
import secrets
from typing import List, Optional, Sequence

from .. import nodeset
from ..topology import NAME, Slurm
from .base import Classification, Wrapper, find_line

_GRANTED = re.compile(r"Granted job allocation (\d+)")


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


def scancel_argv(jobid: str) -> List[str]:
    return ["scancel", jobid]


def scancel_name_argv(name: str) -> List[str]:
    """Cancel the user's jobs named ``name`` (pending or running)."""
    return ["scancel", "--name", name]


class SrunStep(Wrapper):
    """One job step on one node of an existing allocation."""

    kind = "srun"

    def __init__(self, jobid: str, node: str):
        self.jobid = jobid
        self.node = node

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
