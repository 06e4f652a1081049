"""Container hops, one small class per runtime: how to exec into it (the bundle rides in on
stdin, so no runtime needs its own copy command).

Each mirrors its tool's own CLI; ``classify`` knows that tool's messages for a missing or
stopped container.  ``exec_user`` becomes the tool's user flag where it has one, else ``runuser``.
"""

from typing import List, Optional, Sequence

from .base import Classification, Wrapper, find_line


class _Container(Wrapper):
    tool = "?"
    missing = ()       # stderr fragments meaning "no such container"
    stopped = ()       # ... "container not running"
    no_service = ()    # ... "the runtime's daemon or API server cannot be reached"

    def __init__(self, id: str, exec_user: Optional[str] = None):
        self.id = id
        self.exec_user = exec_user

    def _as_user(self, argv: Sequence[str]) -> List[str]:
        if self.exec_user:
            return ["runuser", "-u", self.exec_user, "--"] + list(argv)
        return list(argv)

    def describe(self) -> str:
        user = f" as {self.exec_user}" if self.exec_user else ""
        return f"{self.tool} {self.id}{user}"

    def classify(self, exit_code, stderr) -> Classification:
        line = find_line(stderr, *self.stopped)
        if line:
            return "container", f"{self.describe()}: not running ({line})"
        line = find_line(stderr, *self.missing)
        if line:
            return "container", f"{self.describe()}: not found ({line})"
        line = find_line(stderr, *self.no_service)
        if line:
            return "container", f"{self.describe()}: {self.tool} cannot reach its service ({line})"
        # sh/dash, bash, zsh, and a local exec that found no such program
        line = find_line(stderr, f"{self.tool}: not found", f"{self.tool}: command not found",
                         f"command not found: {self.tool}", f"{self.tool}: No such file")
        if line:
            return "container", f"{self.tool} is not installed on the host ({line})"
        return None


class Pct(_Container):
    """Proxmox: ``pct exec VMID -- argv`` is ``lxc-attach -n VMID -- argv`` (no shell)."""
    kind = tool = "pct"
    missing = ("does not exist",)
    stopped = ("not running",)

    def wrap(self, argv):
        return ["pct", "exec", self.id, "--"] + self._as_user(argv)


class Lxc(_Container):
    kind = tool = "lxc"
    missing = ("does not exist", "no container named")
    stopped = ("is not running", "failed to get init pid")

    def wrap(self, argv):
        return ["lxc-attach", "-n", self.id, "--"] + self._as_user(argv)

    def describe(self):
        return "lxc-attach " + super().describe().split(" ", 1)[1]


class Docker(_Container):
    kind = tool = "docker"
    missing = ("no such container",)
    stopped = ("is not running",)
    # "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker
    # daemon running?" (the CLI with no dockerd; also a socket it may not open)
    no_service = ("cannot connect to the docker daemon",
                  "permission denied while trying to connect to the docker daemon")

    def wrap(self, argv):
        user = ["-u", self.exec_user] if self.exec_user else []
        return [self.tool, "exec", "-i"] + user + [self.id] + list(argv)


class Podman(Docker):
    kind = tool = "podman"
    missing = ("no such container", "no container with name or id")
    stopped = ("container state improper", "is not running")
    # remote podman (CONTAINER_HOST) with no service: "Cannot connect to Podman. ..."
    no_service = ("cannot connect to podman", "unable to connect to podman socket")


class Kubectl(_Container):
    kind = tool = "kubectl"
    missing = ("(notfound)",)
    stopped = ("container not found", "is not running", "unable to upgrade connection")
    # "The connection to the server localhost:8080 was refused - did you specify the right
    # host or port?", "Unable to connect to the server: dial tcp ...: i/o timeout"
    no_service = ("the connection to the server", "unable to connect to the server")

    def __init__(self, id, exec_user=None, namespace=None, container=None):
        super().__init__(id, exec_user)
        self.namespace = namespace
        self.container = container

    def _flags(self):
        flags = ["-n", self.namespace] if self.namespace else []
        return flags + (["-c", self.container] if self.container else [])

    def wrap(self, argv):
        return ["kubectl", "exec", "-i"] + self._flags() + [self.id, "--"] + self._as_user(argv)

    def describe(self):
        where = f" -n {self.namespace}" if self.namespace else ""
        c = f" -c {self.container}" if self.container else ""
        return f"kubectl{where} {self.id}{c}"

    def classify(self, exit_code, stderr):
        line = find_line(stderr, "error from server (notfound)", "pods \"")
        if line:
            return "container", f"{self.describe()}: not found ({line})"
        return super().classify(exit_code, stderr)


RUNTIMES = {"pct": Pct, "lxc": Lxc, "docker": Docker, "podman": Podman, "kubectl": Kubectl}


def for_container(container) -> Wrapper:
    """The hop for a ``topology.Container``."""
    cls = RUNTIMES[container.runtime]
    if cls is Kubectl:
        return cls(container.id, container.exec_user, container.namespace, container.container)
    return cls(container.id, container.exec_user)
