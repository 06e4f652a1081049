"""One diagnostic on a group of targets at once: every member started together, each told its
place (its rank, the group's size, where the ranks meet), and the group's results collected.

A collective across nodes needs its ranks to meet: the first member is the meeting point, at the
address its peers reach it by (``peer_address``) and a port picked here. Each member gets these as
arguments of its job (they travel in the job's header, never on a command line); the diagnostic
bounds its own rendezvous (nccl-check's ``--budget``): a member that never starts makes the
others' rendezvous time out, a member that dies ends the others' collective at once (gloo and
NCCL see their peer's connections close), a member that ends failing ends the others (run_group),
and Ctrl-C closes every member's connection as for any run.

Through Slurm the members are node rows of the allocation mldiag already makes (``runner.place``):
each member is its own ``srun --overlap`` step in that allocation, all started together, and
they meet at the first node's NodeAddr (``scontrol show node``, what the other nodes reach it
at). One ``srun -N2`` step over the group's nodes would merge the members' result streams into
one stdout and fail as a whole; one step per member keeps each member's result its own (the
transport's rule, transport/slurm.py), and a group fails as a whole anyway (above).
"""

import random
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from typing import Any, Callable, List, Optional, Sequence, Tuple

from . import bundle, runner
from ..core.results import Finding, Result
from ..inventory.targets import Target
from ..transport import local
from ..transport.slurm import SrunStep
from ..transport.ssh import SshPool

# Where ranks meet: a port in the range torchrun starts from, picked at random so that groups
# running at once on one node (pass 2 reuses a good node) do not collide.
PORTS = (29500, 39500)

# member_job(target, node_rank, nodes, master) -> the member's job
MemberJob = Callable[[Target, int, int, str], bundle.Job]
# a member: the target, and the Slurm step it runs as when it is a node row (runner.place)
Member = Tuple[Target, Optional[SrunStep]]


def member_job_of(job_for: Callable[[Target], Any]) -> MemberJob:
    """A member's job: the target's job, told its place (``--node-rank R --nodes N --master
    ADDR:PORT``, in its argv: the job's header, never a command line)."""
    def member_job(target: Target, rank: int, nodes: int, master: str):
        job = job_for(target)
        return replace(job, argv=tuple(job.argv) + ("--node-rank", str(rank), "--nodes", str(nodes),
                                                    "--master", master))
    return member_job


@contextmanager
def placed(targets: Sequence[Target], job_for, pool: Optional[SshPool] = None, keep_allocations=None):
    """The targets where they will run, for a fan-out of groups: (members, the rows of those
    that could not be placed), with ``pool`` (a new one, closed after, when None) and the
    allocations made here released after (``runner.place``)."""
    own_pool = pool is None
    pool = pool or SshPool()
    try:
        where, release = runner.place(targets, job_for, pool, keep_allocations)
        try:
            yield [p for p in where if not isinstance(p, Result)], [p for p in where if isinstance(p, Result)]
        finally:
            release()
    finally:
        if own_pool:
            pool.close()


def in_groups(size: int) -> Callable[..., List[Result]]:
    """A ``run_many`` for a diagnostic that runs on groups (a team diagnostic's ``GROUP_SIZE``):
    the selected targets, placed (a Slurm target: its node rows), taken ``size`` at a time in
    their order (0: all of them one group; the last group takes what is left), the groups run
    side by side, each started together."""
    def fan_out(targets: Sequence[Target], job_for, *, parallel: int = 32,
                on_result: Optional[Callable[[Result], None]] = None, pool=None, keep_allocations=None,
                **_ignored) -> List[Result]:
        with placed(targets, job_for, pool, keep_allocations) as (members, failed):
            n = size or len(members) or 1
            chunks = [members[i:i + n] for i in range(0, len(members), n)]
            member_job = member_job_of(job_for)
            with ThreadPoolExecutor(max_workers=max(1, min(len(chunks), parallel // n or 1))) as ex:
                ran = [r for rs in ex.map(lambda chunk: run_group(chunk, member_job), chunks) for r in rs]
        results = failed + ran
        for r in results:
            if on_result is not None:
                on_result(r)
        return results
    return fan_out


def peer_address(target: Target, step: Optional[SrunStep] = None) -> Optional[str]:
    """The address a group's other members reach ``target`` at: its hosts.yaml ``peer_address``,
    else a Slurm node row's NodeAddr, this machine's loopback for a local target, the host's
    address (or its ssh_config alias) for an SSH host; None for a container without one (the
    address mldiag connects to is its host's)."""
    if target.peer_address:
        return target.peer_address
    if target.container is not None:
        return None
    if step is not None:
        return step.peer_address()
    if target.local:
        return "127.0.0.1"
    if target.host is not None and target.slurm is None:
        return target.host.address or target.host.name      # an ssh_config alias: its name
    return None


def run_group(members: Sequence[Member], member_job: MemberJob, *, port: Optional[int] = None) -> List[Result]:
    """Each member's result, in the members' order, the first member the meeting point. A
    member that ends with a status other than ok while others still run (it failed, or never
    joined) ends the group: the others' connections are closed and their local runs told to stop,
    which their runtimes take as the order to kill every process of the run; their rows say they
    were ended for it (``peer-failed``)."""
    first, first_step = members[0]
    address = peer_address(first, first_step)
    if address is None:
        reason = (f"{first.name}: no address its peers reach it by is known (a container: give it "
                  "hosts.yaml's peer_address)" if first_step is None else
                  f"{first.name}: Slurm did not say its NodeAddr (scontrol show node)")
        diagnostic = member_job(first, 0, len(members), "").diagnostic
        return [Result.failure(diagnostic, m.name, "internal", reason) for m, _ in members]
    master = f"{address}:{port or random.randrange(*PORTS)}"
    jobs = [member_job(m, rank, len(members), master) for rank, (m, _) in enumerate(members)]
    pool = SshPool()                  # the group's own: closing it ends this group's runs only
    stopper = local.Stopper()
    results: List[Optional[Result]] = [None] * len(members)
    ended_by: Optional[str] = None
    try:
        with ThreadPoolExecutor(max_workers=len(members), initializer=local.answer_to,
                                initargs=(stopper,)) as ex:
            futures = {ex.submit(runner.run_one, m, j, pool, step=step): i
                       for i, ((m, step), j) in enumerate(zip(members, jobs))}
            for future in as_completed(futures):
                i = futures[future]
                result = future.result()
                if ended_by is not None and result.status != "ok":
                    result = _ended(result, ended_by)
                elif result.status != "ok" and ended_by is None and \
                        any(r is None for j, r in enumerate(results) if j != i):   # others still run
                    ended_by = members[i][0].name
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
