"""Hop chains: ``transport (local | ssh) → [srun] → [sudo] → [container] → interpreter``.

``chain_for`` is the one place a target becomes a chain: the runner runs what it builds, and
``inv hosts`` prints that same chain's ``describe()``.  Building a chain opens nothing.
"""

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..inventory.topology import SshHost, Target
from .base import Classification, Transport, Wrapper
from .containers import for_container
from .held import HeldTransport
from .interpreter import Interpreter
from .local import LocalTransport
from .slurm import SrunStep, SrunSteps
from .ssh import SshPool, SshTransport
from .sshconfig import resolve
from .sudo import Sudo


@dataclass
class Chain:
    target: Target
    transport: Transport
    wrappers: List[Wrapper]              # outermost first
    interpreter: Interpreter

    def argv(self) -> List[str]:
        argv = self.interpreter.argv()
        for hop in reversed(self.wrappers):
            argv = hop.wrap(argv)
        return argv

    def describe(self) -> str:
        parts = [self.transport.describe()] + [w.describe() for w in self.wrappers]
        return " → ".join(parts + [self.interpreter.describe()])

    def classify(self, exit_code: Optional[int], stderr: str, stdout: str = "") -> Classification:
        """The outermost hop that recognises the failure names it; else the interpreter's."""
        for hop in self.wrappers:
            found = hop.classify(exit_code, stderr)
            if found:
                return found
        return self.interpreter.classify(exit_code, stderr, stdout)


def _as_written(host: SshHost) -> str:
    user = f"{host.user}@" if host.user else ""
    port = f":{host.port}" if host.port else ""
    return f"ssh {user}{host.address or host.name}{port}"


def transport_for(target: Target, pool: SshPool) -> Transport:
    """The target's machine: local, or its SSH endpoint (resolved through ``ssh -G``, not
    connected: the pool connects on the first run)."""
    if target.local:
        return LocalTransport()
    direct = SshTransport(resolve(target.host), pool, shown=_as_written(target.host))
    holder = pool.holder() if pool.hold and direct.endpoint.persist > 0 else None
    return HeldTransport(direct, holder) if holder is not None else direct


def chain_for(target: Target, pool: SshPool, step: Optional[SrunStep] = None) -> Chain:
    """The target's chain; ``step`` places it on one node of a Slurm allocation.  A Slurm
    login target without one gets the planned ``SrunSteps`` hop (described, never run)."""
    wrappers: List[Wrapper] = []
    if step is not None:
        wrappers.append(step)
    elif target.slurm is not None:
        wrappers.append(SrunSteps(target.slurm))
    if target.become:
        wrappers.append(Sudo())
    if target.container:
        wrappers.append(for_container(target.container))
    return Chain(target, transport_for(target, pool), wrappers,
                 Interpreter(target.python, target.activate))


# ssh -G runs at once for `inv hosts` (a child each; cached per alias within the process)
_DESCRIBE_WORKERS = 8


def describe_targets(targets: Sequence[Target]) -> List[str]:
    """What ``inv hosts`` prints per target: the chain the runner would build, described,
    with nothing opened."""
    pool = SshPool()   # never connects: nothing here runs a command
    with ThreadPoolExecutor(max_workers=_DESCRIBE_WORKERS) as ex:
        return list(ex.map(lambda t: chain_for(t, pool).describe(), targets))
