"""Hop chains: ``transport (local | ssh) → [sudo] → [container] → interpreter``."""

from dataclasses import dataclass
from typing import List, Optional, Sequence

from ..topology import Target
from .base import Classification, Wrapper
from .containers import for_container
from .interpreter import Interpreter
from .local import LocalTransport
from .ssh import SshPool, SshTransport
from .sshconfig import resolve
from .sudo import Sudo


@dataclass
class Chain:
    target: Target
    transport: object                    # LocalTransport | SshTransport
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

    def put(self, data: bytes, dest: str, *, timeout: float = 60.0) -> None:
        """Place ``data`` at ``dest`` (mode 0600) in the innermost level, one level at a time:
        to the host (SFTP or a local file), then pushed in by the container's own tool.
        The streamed bundle does not need this; it is the general file-transfer path."""
        import time
        from .ssh import TransportError
        container = self.wrappers[-1] if self.wrappers and self.wrappers[-1].kind != "sudo" else None
        if container is None:
            self.transport.put(data, dest)
            return
        deadline = time.monotonic() + timeout
        made = self.transport.run(["mktemp", "-d"], b"", deadline)
        stage = made.stdout.decode().strip()
        if made.exit_code != 0 or not stage.startswith("/"):
            raise TransportError("upload", f"mktemp -d on the host failed: {made.stderr.decode()[-300:]}")
        try:
            if getattr(container, "put_reads_stdin", False):
                argv, payload = container.put_argv("/dev/stdin", dest), data
            else:
                self.transport.put(data, f"{stage}/file")
                argv, payload = container.put_argv(f"{stage}/file", dest), b""
            for hop in reversed(self.wrappers[:-1]):
                argv = hop.wrap(argv)
            out = self.transport.run(argv, payload, deadline)
            if out.exit_code != 0:
                layer, reason = self.classify(out.exit_code, out.stderr.decode(errors="replace")) or (
                    "upload", out.stderr.decode(errors="replace").strip()[-300:])
                raise TransportError(layer, f"put {dest}: {reason}")
        finally:
            self.transport.run(["rm", "-rf", "--", stage], b"", deadline)

    def classify(self, exit_code: Optional[int], stderr: str, stdout: str = "") -> Classification:
        """The outermost hop that recognises the failure names it; else the interpreter's."""
        for hop in self.wrappers:
            found = hop.classify(exit_code, stderr)
            if found:
                return found
        return self.interpreter.classify(exit_code, stderr, stdout)


def bootstrap_python(target: Target) -> str:
    """With ``activate:``, the bootstrap runs before activation: a bare name like ``python``
    may only exist afterwards, so it starts under ``python3`` (an absolute path is kept)."""
    if target.activate and not target.python.startswith("/"):
        return "python3"
    return target.python


def describe_target(target: Target) -> str:
    """The chain as the ``hosts`` task prints it, without opening anything."""
    if target.local:
        parts = ["local"]
    else:
        h = target.host
        user = f"{h.user}@" if h.user else ""
        port = f":{h.port}" if h.port else ""
        parts = [f"ssh {user}{h.address or h.name}{port}"]
        vias, jump = [], h.jump
        while jump is not None:
            vias.append(jump.name)
            jump = jump.jump
        if vias:
            parts[0] += f" (via {', '.join(reversed(vias))})"
    if target.slurm:
        from .slurm import node_names
        nodes = target.slurm.nodelist if node_names(target.slurm) else f"{target.slurm.nodes} nodes"
        partition = f" -p {target.slurm.partition}" if target.slurm.partition else ""
        parts.append(f"srun{partition} ({nodes}, one step per node)")
    if target.become:
        parts.append("sudo")
    if target.container:
        parts.append(for_container(target.container).describe())
    if target.activate:
        parts.append("activate " + " ".join(target.activate))
    parts.append(target.python)
    return " → ".join(parts)


def chain_for(target: Target, pool: SshPool) -> Chain:
    if target.local:
        transport = LocalTransport()
    else:
        transport = SshTransport(resolve(target.host), pool)
    wrappers: List[Wrapper] = []
    if target.slurm_step:
        from .slurm import SrunStep
        wrappers.append(SrunStep(*target.slurm_step))
    if target.become:
        wrappers.append(Sudo())
    if target.container:
        wrappers.append(for_container(target.container))
    return Chain(target, transport, wrappers, Interpreter(bootstrap_python(target)))
