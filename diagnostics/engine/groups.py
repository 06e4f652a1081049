"""One diagnostic on a group of targets at once: every member started together, each told its
place (its rank, the group's size, where the ranks meet), and the group's results collected.

A collective across nodes needs its ranks to meet: the first member is the meeting point, at the
address its peers reach it by (``peer_address``) and a port picked here. Each member gets these as
arguments of its job (they travel in the job's header, never on a command line); the diagnostic
bounds its own rendezvous (nccl-check's ``--budget``): a member that never starts makes the
others' rendezvous time out, a member that dies ends the others' collective at once (gloo and
NCCL see their peer's connections close), a member that ends failing ends the others (run_group),
and Ctrl-C closes every member's connection as for any run. Through Slurm a group would be one ``srun`` step over its nodes: not built yet.
"""

import random
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Callable, List, Optional, Sequence

from . import bundle, runner
from ..core.results import Finding, Result
from ..inventory.targets import Target
from ..transport import local
from ..transport.ssh import SshPool

# Where ranks meet: a port in the range torchrun starts from, picked at random so that groups
# running at once on one node (pass 2 reuses a good node) do not collide.
PORTS = (29500, 39500)

# member_job(target, node_rank, nodes, master) -> the member's job
MemberJob = Callable[[Target, int, int, str], bundle.Job]


def peer_address(target: Target) -> Optional[str]:
    """The address a group's other members reach ``target`` at: this machine's loopback for a
    local target, the host's address (or its ssh_config alias) for an SSH host; None for a container or a Slurm node (their
    address is not the one mldiag connects to)."""
    if target.local and target.container is None:
        return "127.0.0.1"
    if target.host is not None and target.container is None and target.slurm is None:
        return target.host.address or target.host.name      # an ssh_config alias: its name
    return None


def run_group(members: Sequence[Target], member_job: MemberJob, *, port: Optional[int] = None) -> List[Result]:
    """Each member's result, in the members' order, the first member the meeting point. A
    member that ends with a status other than ok while others still run (it failed, or never
    joined) ends the group: the others' connections are closed and their local runs told to stop,
    which their runtimes take as the order to kill every process of the run; their rows say they
    were ended for it (``peer-failed``)."""
    address = peer_address(members[0])
    if address is None:
        reason = (f"{members[0].name}: no address its peers reach it by is known (a container or a "
                  "Slurm node cannot be a group's first member yet)")
        diagnostic = member_job(members[0], 0, len(members), "").diagnostic
        return [Result.failure(diagnostic, m.name, "internal", reason) for m in members]
    master = f"{address}:{port or random.randrange(*PORTS)}"
    jobs = [member_job(m, rank, len(members), master) for rank, m in enumerate(members)]
    pool = SshPool()                  # the group's own: closing it ends this group's runs only
    stopper = local.Stopper()
    results: List[Optional[Result]] = [None] * len(members)
    ended_by: Optional[str] = None
    try:
        with ThreadPoolExecutor(max_workers=len(members), initializer=local.answer_to,
                                initargs=(stopper,)) as ex:
            futures = {ex.submit(runner.run_one, m, j, pool): i for i, (m, j) in enumerate(zip(members, jobs))}
            for future in as_completed(futures):
                i = futures[future]
                result = future.result()
                if ended_by is not None and result.status != "ok":
                    result = _ended(result, ended_by)
                elif result.status != "ok" and ended_by is None and \
                        any(r is None for j, r in enumerate(results) if j != i):   # others still run
                    ended_by = members[i].name
                    stopper.stop()
                    pool.close()
                results[i] = result
    finally:
        stopper.stop()
        pool.close()
    return [r for r in results if r is not None]


def _ended(result: Result, by: str) -> Result:
    """The row of a member ended because ``by`` failed: its own failure is not the story."""
    return Result(diagnostic=result.diagnostic, target=result.target, status="warn",
                  summary=f"ended: {by}, of the same group, failed",
                  findings=[Finding(level="warn", code="peer-failed", action="none",
                                    message=f"ended when {by}, of the same group, failed "
                                            f"(its own run: {result.summary or result.status})")],
                  data={"ended_by": by}, duration_s=result.duration_s)
