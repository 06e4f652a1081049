"""A real Slurm cluster for the lab: munge, slurmctld and four slurmd (n1..n4) on this machine.

Each slurmd runs in its own UTS and mount namespace (`unshare --uts --mount`, propagation
private): hostname nX and a private /tmp. That /tmp is a directory of the session
(`node_tmp_dir(node)`, mode 1777) bind-mounted on /tmp, with the lab's root bound back at its
own path inside it when the root lies under /tmp, so slurm.conf, the munge socket, the spool
and a copied fakes dir stay reachable. Compute nodes do not see the login node's /tmp and the
login node does not see theirs, as on a real cluster; the rest is this machine's filesystem
(python3, the lab users, tests/fakes). slurmstepd and the job's processes inherit the node's
namespaces, which is how `node_pids` and `teardown` find them (slurmstepd overwrites its
environment with its title, so no marker variable survives there).

The login node is any shell on this machine with SLURM_CONF set: the lab's sshds set it
(SetEnv) and sudo keeps it (env_keep), so `ssh main srun ...` as mlsh works. The munge socket
is usable by every user (its directory is o+x); slurmd runs as root (SlurmdUser) and starts the
job's tasks as the submitting user.

Each node has 8 GPUs as far as Slurm knows (GRES gpu, File= character devices under the
cluster dir that are copies of /dev/null), so `--gpus-per-node=N` is accepted and sets
CUDA_VISIBLE_DEVICES. Partitions: `debug` (default) and `gpu`, both over all nodes.

Recipes and timings: notes/test-infra.md beside DESIGN.md, section "Slurm".
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .util import LabError, all_pids, cmdline, free_port, ns_of, run, state_of, wait_until

NODES = ("n1", "n2", "n3", "n4")
PARTITIONS = ("debug", "gpu")  # debug is the default partition
CPUS_PER_NODE = 4              # more than the machine has (config_overrides): room for parallel steps
GPUS_PER_NODE = 8
PROGRAMS = ["munged", "slurmctld", "slurmd", "srun", "salloc", "squeue", "scancel", "sinfo", "nsenter",
            "scontrol", "unshare", "mount", "hostname"]
PACKAGES = "slurmctld slurmd slurm-client munge"

# run by `unshare --uts --mount` as `sh -c NODE_SH sh NODE NODE_TMP [DIR DIR_IN_NODE_TMP]... -- slurmd ...`
NODE_SH = ('set -e; hostname "$1"; node_tmp="$2"; shift 2; '
           'while [ "$1" != "--" ]; do mount --bind "$1" "$2"; shift 2; done; shift; '
           'mount --rbind "$node_tmp" /tmp; exec "$@"')


class SlurmCluster:
    """munged + slurmctld + one slurmd per node, all under `dir`. See the module docstring.

    conf (slurm.conf; export it as SLURM_CONF), env ({"SLURM_CONF": ...}), nodes, partitions,
    ctld_port, node_ports {node: port}, munge_socket, log_dir (one log per daemon, *.out is
    its stderr), gpus_per_node (0 when the GPU devices could not be made), timings, mnt_ns
    {node: "mnt:[inode]"} of the node's current slurmd.
    """

    def __init__(self, dir: Path, visible_root: Optional[Path] = None, nodes=NODES, also_visible=(),
                 node_netns: Optional[Dict[str, str]] = None, node_addrs: Optional[Dict[str, str]] = None,
                 ctld_addr: Optional[str] = None, extra_conf=(),
                 node_binds: Optional[Dict[str, List[Tuple[Path, str]]]] = None):
        self.dir = Path(dir)
        # slurm.conf lines of a cluster's own (HealthCheckProgram=, Prolog=), and per node
        # directories bound at a path of the node's own (its /etc/slurm, /usr/local/bin)
        self.extra_conf = tuple(extra_conf)
        self.node_binds = {node: list(pairs) for node, pairs in (node_binds or {}).items()}
        # a cluster on a network of its own (lab.fleet_slurm()): each slurmd in a network
        # namespace (node -> `ip netns` name) at its address there, slurmctld reached at
        # ctld_addr (this machine's end of that network); default: all on this machine's
        self.node_netns = dict(node_netns or {})
        self.node_addrs = dict(node_addrs or {})
        self.ctld_addr = ctld_addr
        self.visible_root = Path(visible_root) if visible_root else None
        # more of this machine's /tmp the nodes see at their own paths (the tests' virtualenv,
        # when the checkout lies below /tmp: the interpreter with torch that a job runs)
        self.also_visible = tuple(Path(p) for p in also_visible)
        self.nodes = tuple(nodes)
        self.partitions = PARTITIONS
        self.ctld_port = 0
        self.node_ports: Dict[str, int] = {}
        self.gpus_per_node = 0
        self.timings: Dict[str, float] = {}
        self.mnt_ns: Dict[str, str] = {}
        self._dead_ns: List[str] = []  # namespaces of replaced slurmds, for teardown
        self._munged: Optional[subprocess.Popen] = None
        self._ctld: Optional[subprocess.Popen] = None
        self._slurmd: Dict[str, subprocess.Popen] = {}
        self._killed: set = set()  # nodes whose slurmd stop_node killed on purpose

    # ------------------------------------------------------------------ layout

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def env(self) -> Dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    @property
    def munge_socket(self) -> Path:
        return self.dir / "munge" / "munge.socket"

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    def node_tmp_dir(self, node: str) -> Path:
        """The directory that is /tmp on `node` (seen from the login node, i.e. this machine)."""
        return self.dir / "nodes" / node / "tmp"

    def _root_in_tmp(self) -> Optional[Path]:
        """visible_root relative to /tmp, when it lies below /tmp (then it is bound on the nodes)."""
        return _below_tmp(self.visible_root)

    def _bound(self) -> List[Tuple[Path, Path]]:
        """(directory, its path relative to /tmp) of each directory below /tmp the nodes see."""
        found = []
        for d in (self.visible_root, *self.also_visible):
            rel = _below_tmp(d)
            if rel is not None and d.is_dir():
                found.append((d.resolve(), rel))
        return found

    # ------------------------------------------------------------------ setup

    def prepare(self) -> None:
        """Directories (state and spool emptied: a fresh cluster), munge key, GPU device
        files; the configs come with start()."""
        for d in (self.dir / "state", self.dir / "spool"):
            shutil.rmtree(d, ignore_errors=True)
        for d in (self.dir, self.dir / "munge", self.dir / "state", self.dir / "spool",
                  self.log_dir, self.dir / "dev"):
            d.mkdir(mode=0o755, parents=True, exist_ok=True)
            os.chmod(d, 0o755)  # munged refuses a group/world-writable socket dir; o+x: users reach it
        key = self.dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        for node in self.nodes:
            t = self.node_tmp_dir(node)
            t.mkdir(parents=True, exist_ok=True)
            os.chmod(t, 0o1777)
            (self.dir / "spool" / node).mkdir(mode=0o755, exist_ok=True)
            for _, rel in self._bound():
                (t / rel).mkdir(mode=0o755, parents=True, exist_ok=True)
        try:
            for i in range(GPUS_PER_NODE):
                p = self.dir / "dev" / f"nvidia{i}"
                if not p.exists():
                    os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null
            self.gpus_per_node = GPUS_PER_NODE
        except OSError:
            self.gpus_per_node = 0

    def write_config(self) -> None:
        d = self.dir
        gres = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
        lines = [
            "# mldiag test lab (tests/lab/slurm.py)",
            "ClusterName=mldiaglab",
            f"SlurmctldHost={socket.gethostname()}({self.ctld_addr})" if self.ctld_addr else "SlurmctldHost=localhost",
            f"SlurmctldPort={self.ctld_port}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={d}/state",
            f"SlurmdSpoolDir={d}/spool/%n",
            f"SlurmctldPidFile={d}/slurmctld.pid",
            f"SlurmdPidFile={d}/spool/%n.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld.log",
            f"SlurmdLogFile={self.log_dir}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "KillWait=2",
            "MinJobAge=10",
            "MessageTimeout=5",
        ]
        if self.gpus_per_node:
            lines.append("GresTypes=gpu")
        for node in self.nodes:
            host, addr = (node, self.node_addrs[node]) if node in self.node_addrs else ("localhost", "127.0.0.1")
            lines.append(f"NodeName={node} NodeHostname={host} NodeAddr={addr} "
                         f"Port={self.node_ports[node]} CPUs={CPUS_PER_NODE} RealMemory=1000{gres}")
        lines.extend(self.extra_conf)
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        lines.append("PartitionName=gpu Nodes=ALL Default=NO MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        os.chmod(self.conf, 0o644)
        gres_conf = self.dir / "gres.conf"
        if self.gpus_per_node:
            gres_conf.write_text(f"NodeName={','.join(self.nodes)} Name=gpu "
                                 f"File={self.dir}/dev/nvidia[0-{self.gpus_per_node - 1}]\n")
        elif gres_conf.exists():
            gres_conf.unlink()

    def _pick_ports(self) -> None:
        ports: set = set()
        while len(ports) < 1 + len(self.nodes):  # slurmctld and slurmd bind every address
            ports.add(free_port("0.0.0.0"))
        ports_l = sorted(ports)
        self.ctld_port = ports_l[0]
        self.node_ports = dict(zip(self.nodes, ports_l[1:]))

    # ------------------------------------------------------------------ processes

    def _spawn(self, argv: List[str], name: str) -> subprocess.Popen:
        with open(self.log_dir / f"{name}.out", "ab") as out:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, env={**os.environ, **self.env})

    def _output(self, name: str) -> str:
        try:
            return (self.log_dir / f"{name}.out").read_text(errors="replace").strip()[-1500:]
        except FileNotFoundError:
            return ""

    def _check_alive(self) -> None:
        procs = [("munged", self._munged), ("slurmctld", self._ctld),
                 *((f"slurmd-{n}", p) for n, p in self._slurmd.items() if n not in self._killed)]
        for name, p in procs:
            if p is not None and p.poll() is not None:
                raise LabError(f"{name} exited {p.returncode}: {self._output(name)}")

    def _start_munged(self) -> None:
        d = self.dir
        self._munged = self._spawn(["munged", "-F", f"--key-file={d}/munge.key",
                                    f"--socket={self.munge_socket}", f"--pid-file={d}/munge/munged.pid",
                                    f"--log-file={self.log_dir}/munged.log", f"--seed-file={d}/munge/seed"],
                                   "munged")

        def up():
            self._check_alive()
            return self.munge_socket.exists()

        wait_until(up, 10, "munged's socket")

    def _start_node(self, node: str) -> None:
        binds = [str(p) for d, rel in self._bound() for p in (d, self.node_tmp_dir(node) / rel)]
        binds += [str(p) for src, dst in self.node_binds.get(node, ()) for p in (src, dst)]
        # nsenter, not `ip netns exec`: that one remounts /sys, and slurmd wants /sys/fs/cgroup
        network = ["nsenter", f"--net=/run/netns/{self.node_netns[node]}"] if node in self.node_netns else []
        argv = network + ["unshare", "--uts", "--mount", "--propagation", "private", "--", "sh", "-c", NODE_SH, "sh",
                node, str(self.node_tmp_dir(node)), *binds, "--",
                "slurmd", "-D", "-N", node, "-f", str(self.conf)]
        old = self._slurmd.get(node)
        if old is not None:
            old.poll()
            if node in self.mnt_ns:
                self._dead_ns.append(self.mnt_ns.pop(node))
        p = self._slurmd[node] = self._spawn(argv, f"slurmd-{node}")
        self._killed.discard(node)

        def ns_ready():  # unshare execs sh, which execs slurmd: same PID, once in the new namespace
            self._check_alive()
            ns = ns_of(p.pid, "mnt")
            return ns if ns and ns != ns_of(os.getpid(), "mnt") and _comm(p.pid) == "slurmd" else None

        self.mnt_ns[node] = wait_until(ns_ready, 10, f"slurmd {node} to start")

    def cmd(self, *argv: str, check: bool = False, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a Slurm client (scontrol, sinfo, squeue, ...) here as root, with this SLURM_CONF."""
        return run(list(argv), check=check, timeout=timeout, env={**os.environ, **self.env})

    def node_states(self) -> Dict[str, str]:
        """{node: sinfo's compact state} (idle, mix, alloc, comp, down*, drain, idle*, ...)."""
        out = self.cmd("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %t").stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def wait_idle(self, nodes=None, timeout: float = 30, states=("idle",)) -> None:
        """Wait until each of `nodes` (default: all) is in one of `states` (sinfo's %t)."""
        nodes = list(nodes or self.nodes)
        seen: Dict[str, str] = {}

        def ready():
            self._check_alive()
            seen.clear()
            seen.update(self.node_states())
            return all(seen.get(n) in states for n in nodes)

        try:
            wait_until(ready, timeout, f"nodes {','.join(nodes)} to be {'/'.join(states)}", interval=0.05)
        except LabError as e:
            raise LabError(f"{e} (sinfo: {seen})") from None

    def start(self, timeout: float = 30, ready=("idle",)) -> None:
        """Start munged, slurmctld and the slurmds; return when every node is idle (or in one
        of ``ready``: a HealthCheckProgram may drain a node before it registers)."""
        self.prepare()
        for attempt in range(3):
            self._pick_ports()
            self.write_config()
            try:
                self._start(timeout, ready)
                return
            except LabError as e:
                if "Address already in use" not in str(e) or attempt == 2:
                    raise
                self.stop()

    def _start(self, timeout: float, ready=("idle",)) -> None:
        t = time.monotonic()
        if self._munged is None or self._munged.poll() is not None:
            self._start_munged()
        self.timings["munged"] = round(time.monotonic() - t, 3)
        t = time.monotonic()
        self._ctld = self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")

        def ctld_up():
            self._check_alive()
            return "UP" in self.cmd("scontrol", "ping", timeout=10).stdout

        wait_until(ctld_up, timeout, "slurmctld to answer `scontrol ping`", interval=0.05)
        self.timings["slurmctld"] = round(time.monotonic() - t, 3)
        t = time.monotonic()
        for node in self.nodes:
            self._start_node(node)
        self.wait_idle(timeout=timeout, states=ready)
        self.timings["slurmd"] = round(time.monotonic() - t, 3)

    # ------------------------------------------------------------------ faults

    def node_pid(self, node: str) -> Optional[int]:
        """PID of `node`'s slurmd, None when it is not running (killed)."""
        p = self._slurmd.get(node)
        return p.pid if p is not None and p.poll() is None else None

    def stop_node(self, node: str, sig: int = signal.SIGSTOP) -> None:
        """SIGSTOP (default: a hung node) or SIGKILL (a dead one) `node`'s slurmd. Steps already
        running there go on (their slurmstepd is a separate process)."""
        pid = self.node_pid(node)
        if pid is None:
            raise LabError(f"slurmd {node} is not running")
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self._killed.add(node)
        os.kill(pid, sig)
        if sig == signal.SIGKILL:
            self._slurmd[node].wait(timeout=10)

    def start_node(self, node: str, timeout: float = 30) -> None:
        """Undo stop_node: SIGCONT a stopped slurmd or start a new one (same /tmp dir, a new
        namespace), then wait until the node is usable again: idle, or mix/alloc inside an
        allocation (resuming it if still DOWN)."""
        pid = self.node_pid(node)
        if pid is not None and state_of(pid) in ("T", "t"):
            os.kill(pid, signal.SIGCONT)
        elif pid is None:
            self._start_node(node)
        usable = ("idle", "mix", "alloc")  # mix/alloc: inside a job's allocation
        # NOTE: a job whose kill request timed out while the slurmd was stopped leaves the node
        # COMPLETING (comp*) until slurmctld retries, up to ~90 s later; `scontrol reconfigure`
        # makes every slurmd register again, which ends it at once. ReturnToService=2 does not
        # undo a drain: RESUME does.
        for kick in (None, ["scontrol", "reconfigure"],
                     ["scontrol", "update", f"NodeName={node}", "State=RESUME"]):
            if kick:
                self.cmd(*kick)
            try:
                self.wait_idle([node], timeout=1.0 if kick is None else 5.0, states=usable)
                return
            except LabError:
                pass
        self.wait_idle([node], timeout=timeout, states=usable)

    # ------------------------------------------------------------------ inspection

    def node_pids(self, node: str, include_slurmd: bool = False) -> List[int]:
        """Host PIDs of the live processes on `node` (its mount namespace): slurmstepd and the
        tasks, and its slurmd when include_slurmd."""
        ns = self.mnt_ns.get(node)
        if not ns:
            return []
        daemon = self.node_pid(node)
        return sorted(p for p in all_pids() if ns_of(p, "mnt") == ns
                      and (include_slurmd or p != daemon) and state_of(p) not in (None, "Z"))

    def node_tmp(self, node: str) -> List[str]:
        """Sorted entries of /tmp on `node` (the mount points of what it sees of ours left out)."""
        hidden = {rel.parts[0] for _, rel in self._bound()}
        return sorted(e for e in os.listdir(self.node_tmp_dir(node)) if e not in hidden)

    # ------------------------------------------------------------------ teardown

    def state(self) -> dict:
        return {"dir": str(self.dir), "mnt_ns": sorted({*self.mnt_ns.values(), *self._dead_ns})}

    def stop(self) -> None:
        teardown(self.state())
        for p in [self._munged, self._ctld, *self._slurmd.values()]:
            if p is not None:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
        self._munged = self._ctld = None
        self._slurmd.clear()
        self._killed.clear()
        self._dead_ns.clear()
        self.mnt_ns.clear()


def _below_tmp(d: Optional[Path]) -> Optional[Path]:
    """``d`` relative to /tmp when it lies below it, else None."""
    if d is None:
        return None
    try:
        rel = d.resolve().relative_to("/tmp")
    except ValueError:
        return None
    return rel if rel.parts else None


def _comm(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def teardown(state: dict, timeout: float = 5) -> None:
    """SIGKILL every process of the cluster described by `state` (SlurmCluster.state()): the
    daemons (their command lines name its dir) and everything in its nodes' mount namespaces
    (slurmstepd, tasks), a namespace counting only while its mounts show this cluster's node
    /tmp (an inode number can be reused once a namespace is gone). Nothing to unmount: the
    node mounts die with their namespaces. Never raises: it also cleans up after a crashed
    session."""
    d = state["dir"].rstrip("/") + "/"
    marker = "/".join(Path(d).parts[-2:]) + "/nodes/"  # session-SID/slurm/nodes/: in /tmp's mount root
    namespaces = set(state.get("mnt_ns") or [])
    me = os.getpid()

    def ours() -> List[int]:
        out, verdict = [], {}
        for p in all_pids():
            if p == me or state_of(p) in (None, "Z"):
                continue
            ns = ns_of(p, "mnt") if namespaces else None
            if ns in namespaces:
                if ns not in verdict:
                    verdict[ns] = marker in _read_text(f"/proc/{p}/mountinfo")
                if verdict[ns]:
                    out.append(p)
                    continue
            if d in " ".join(cmdline(p) or []):
                out.append(p)
        return out

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = ours()
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""
