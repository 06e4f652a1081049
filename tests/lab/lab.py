"""The mldiag test lab: real sshd hosts, a jump chain in network namespaces, LXC
containers behind a `pct` stand-in, a podman container and a 4-node Slurm cluster —
built in a few seconds, torn down without leftovers. See `Lab` for what a test can use."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from . import lxc, netns, nodecheck, rootfs, sshd, slurm, users
from .podman import Podman
from .util import (LabError, LabUnavailable, all_pids, cmdline, descendants, environ_has,
                   free_port, kill_all, missing_programs, ns_of, run, state_of, world_readable)

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "fakes"
FIXTURES = REPO / "tests" / "fixtures"
PCT_CONF = Path("/etc/mldiag-lab/pct.conf")
SESSION_ENV = "MLDIAG_LAB_SESSION"  # set in every lab ssh session (and kept by sudo): finds strays
PCT_ENV = "MLDIAG_PCT_LXCPATH"      # the session's LXC path, for tests/fakes/pct
# set by the lab's sshds (SetEnv) and kept by sudo for the lab users (env_keep)
SESSION_VARS = (SESSION_ENV, PCT_ENV, "CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF",
                "MLDIAG_FAKE_NVIDIA_SMI*",  # the fake nvidia-smi's knobs pass sudo too
                "SLURM_CONF")

CT_RUNNING, CT_STOPPED = 200, 201
FLEET_NODES = 6          # lab.fleet(): nodes on one cluster network, for collectives across nodes
VENV = "/root/venv"
PODBOX = "podbox"

# user -> alias suffix; the bare server name is user mlsh
SSH_USERS = ("mlsh", "mlzsh", "nosudo", "root")

PROGRAMS = {
    "ssh": ["/usr/sbin/sshd", "ssh", "ssh-keygen", "sudo", "visudo", "useradd", "usermod",
            "/usr/bin/zsh", "/bin/sh", "/usr/bin/python3"],
    "netns": ["ip", "sysctl", "iptables", "tc"],
    "lxc": ["lxc-start", "lxc-attach", "lxc-info", "lxc-stop", "ldd", "/usr/bin/python3.11"],
    "podman": ["/usr/bin/podman", "runc", "conmon"],
    "slurm": slurm.PROGRAMS,
}
PACKAGES = ("openssh-server openssh-client zsh sudo lxc podman runc conmon iptables iproute2 "
            "procps psmisc python3 python3-venv " + slurm.PACKAGES)


class Lab:
    """A running test lab (one per pytest session). Everything lives under `dir`.

    SSH
      ssh_config   Path: Host aliases for every (server, user): `ssh -F lab.ssh_config ALIAS`.
                   ALIAS is the server name for user mlsh (`main`, `defaults`, `jump`, `inner`)
                   or `<server>-<user>` for mlsh/mlzsh/nosudo/root (`main-mlzsh`, `inner-nosudo`).
      known_hosts  Path: hashed (`|1|...`) entries for every server.
      identity     Path: the client's ed25519 private key (identity_pub: its .pub).
      home         Path: a HOME with .ssh/{config,known_hosts,id_ed25519} for tools that read
                   ~/.ssh through $HOME (paramiko/Fabric); OpenSSH itself ignores $HOME.
      main         SshServer on 127.0.0.2, MaxSessions 100 / MaxStartups 200:30:400.
      defaults     SshServer on 127.0.0.3 with OpenSSH's default limits (no such lines).
      nosftp       SshServer on 127.0.0.4 without an SFTP subsystem (hosts that disable it).
      jump, inner  SshServers in network namespaces: inner is reachable only through jump
                   (`inner` aliases carry `ProxyJump jump`); see tests/lab/netns.py.
      servers      {name: SshServer}. Each has .address .port .alias .aliases {user: alias}
                   .log_path (LogLevel VERBOSE) .connection_count() .pid .netns .config_path.
      users        {name: LabUser}: mlsh (/bin/sh, sudo), mlzsh (zsh, sudo), nosudo (/bin/sh).
      path         the PATH every ssh session gets (SetEnv): fakes_dir, then the system dirs;
                   sudo's secure_path for the lab users starts with fakes_dir too.
      session_env  the other variables each ssh session gets and sudo keeps: MLDIAG_LAB_SESSION,
                   MLDIAG_PCT_LXCPATH (pct's LXC path), CONTAINERS_CONF, CONTAINERS_STORAGE_CONF,
                   SLURM_CONF (with the slurm part).
    Containers
      lxc_path     LXC path of the CTs; pct (fakes_dir/pct) takes it from $MLDIAG_PCT_LXCPATH,
                   else from /etc/mldiag-lab/pct.conf (for root shells outside ssh).
      ct_running   200: running, venv at /root/venv (made with the CT's /usr/bin/python3.11).
      ct_stopped   201: defined, stopped.
      podbox       'podbox': podman container (runc) with /usr/bin/python3.11; `sudo -n podman ...`
                   works for mlsh/mlzsh (CONTAINERS_CONF* point /usr/bin/podman at the lab's config);
                   podman: the Podman helper (lab.podman("ps") runs podman with that config).
      rootfs       the cached base rootfs both kinds of container overlay.
      node_check_cts()  CTs 210 `h200-ok` and 211 `h200-bad` for node-check (tests/lab/nodecheck.py):
                   recorded /sys/class/infiniband and made /sys/bus/pci/devices trees at their real
                   paths, fake nvidia-smi/dmesg (+ journalctl, dcgmi on 210), saved kernel logs in
                   /var/log/mldiag-lab; started on the first call, python /usr/bin/python3 (no venv).
    Slurm (part "slurm"; tests/lab/slurm.py)
      slurm        SlurmCluster: munged, slurmctld and slurmd n1..n4, each slurmd in its own UTS and
                   mount namespace (hostname nX, a private /tmp); the `main` host (this machine)
                   is the login node: `ssh main srun -N4 ...` runs as mlsh on the nodes (sudo keeps
                   SLURM_CONF). Partitions debug (default) and gpu over all nodes, 4 CPUs and
                   8 GPUs (GRES, /dev/null copies; `--gpus-per-node` sets CUDA_VISIBLE_DEVICES) each.
                   .conf (= $SLURM_CONF) .nodes .partitions .cmd("squeue", ...) (as root here)
                   .node_states() .node_pid(n) .node_pids(n) (slurmstepd + tasks) .log_dir .timings.
      slurm_nodes  ("n1", "n2", "n3", "n4").
      slurm_stop_node(n, sig=SIGSTOP)  hang (SIGSTOP) or kill (SIGKILL) node n's slurmd;
      slurm_start_node(n)              undo it, return when n is usable again (idle, mix, alloc).
      slurm_tmp(n) sorted entries of /tmp on node n (slurm.node_tmp_dir(n) is that dir here).
    Files (the lab's copies under dir/repo, readable by every lab user: see _stage_test_files;
    a test names these, never a path inside the checkout, for anything a lab user or a CT reads)
      fakes_dir    tests/fakes (pct, nvidia-smi): first on every PATH; bind-mounted read-only at
                   the same path in the containers, with tests/fixtures (extra_binds: the fake
                   nvidia-smi's captures); /usr/bin/nvidia-smi there links to its nvidia-smi.
      fixtures_dir tests/fixtures (beside fakes_dir, where the fakes look for their captures).
      hostile_dir  tests/fixtures/hostile: the fake interpreters of the hostile-target tests.
      dir, sid, startup_s, timings.
    """

    def __init__(self, root: Path, fakes_dir: Path = FAKES, extra_binds: Optional[List[Path]] = None,
                 strict: bool = True, fixtures_dir: Path = FIXTURES):
        self.root = Path(root)
        self.sid = secrets.token_hex(3)
        self.fakes_dir = Path(fakes_dir)      # the checkout's until _stage_test_files copies it
        self.fixtures_dir = Path(fixtures_dir)
        if extra_binds is None:  # the fake nvidia-smi reads its captures from tests/fixtures
            extra_binds = [FIXTURES]
        self.extra_binds = [Path(p) for p in extra_binds if Path(p).is_dir()]
        self.strict = strict
        self.unavailable: Dict[str, str] = {}
        self.on_unavailable: Callable[[str], None] = self._raise_unavailable
        self.timings: Dict[str, float] = {}
        self.startup_s = 0.0
        self.servers: Dict[str, sshd.SshServer] = {}
        self.users = users.USERS
        self.jumpnet: Optional[netns.JumpNet] = None
        self.fleetnet: Optional[netns.FleetNet] = None
        self._fleet_lock = threading.Lock()
        self.fleet_cluster: Optional[slurm.SlurmCluster] = None
        self.own_clusters: Dict[str, slurm.SlurmCluster] = {}   # own_slurm(): a test's cluster
        self.podman: Optional[Podman] = None
        self.ct_running, self.ct_stopped, self.podbox = CT_RUNNING, CT_STOPPED, PODBOX
        self.venv_python = f"{VENV}/bin/python"
        self._ct_pids: Dict[int, int] = {}
        self._podbox_pid: Optional[int] = None
        self.slurm: Optional[slurm.SlurmCluster] = None
        self.slurm_nodes = slurm.NODES
        self._state_lock = threading.Lock()
        self.rootfs: Optional[Path] = None
        self._hosts_n = 0
        self._closed = False
        self._node_cts: Optional[Dict[int, nodecheck.NodeCT]] = None
        self._node_cts_lock = threading.Lock()
        self._extra_vmids: List[int] = []
        self._machine_lock: Optional[int] = None  # fd of root/running.lock, held while it runs

    # ------------------------------------------------------------------ layout

    @property
    def dir(self) -> Path:
        return self.root / f"session-{self.sid}"

    @property
    def lxc_path(self) -> Path:
        return self.dir / "lxc"

    @property
    def ssh_config(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def identity(self) -> Path:
        return self.dir / "client" / "id_ed25519"

    @property
    def identity_pub(self) -> Path:
        return self.dir / "client" / "id_ed25519.pub"

    @property
    def home(self) -> Path:
        return self.dir / "home"

    @property
    def hostile_dir(self) -> Path:
        """The lab's copy of tests/fixtures/hostile (fake interpreters a target's `python:`
        names), runnable by every lab user."""
        return self.fixtures_dir / "hostile"

    @property
    def path(self) -> str:
        return f"{self.fakes_dir}:/usr/local/bin:/usr/bin:/bin"

    @property
    def secure_path(self) -> str:
        return f"{self.fakes_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

    @property
    def session_env(self) -> Dict[str, str]:
        env = {SESSION_ENV: self.sid, PCT_ENV: str(self.lxc_path)}
        if self.podman:
            env.update(self.podman.config_env)
        if self.slurm:
            env.update(self.slurm.env)
        return env

    main = property(lambda self: self.servers["main"])
    defaults = property(lambda self: self.servers["defaults"])
    jump = property(lambda self: self.servers["jump"])
    inner = property(lambda self: self.servers["inner"])
    nosftp = property(lambda self: self.servers["nosftp"])

    # ------------------------------------------------------------------ start

    @classmethod
    def start(cls, root: Optional[Path] = None, **kw) -> "Lab":
        """Build and start the lab; on failure tear down what was started and re-raise."""
        root = Path(root or default_root())
        lab = cls(root, **kw)
        try:
            lab._start()
        except BaseException:
            lab.close()
            raise
        return lab

    def _step(self, name: str, fn, *args):
        t = time.monotonic()
        try:
            return fn(*args)
        finally:
            self.timings[name] = round(time.monotonic() - t, 3)

    def _start(self) -> None:
        t0 = time.monotonic()
        if os.geteuid() != 0:
            raise LabUnavailable("the lab needs root (users, sudoers, LXC, network namespaces)")
        # MLDIAG_LAB_SKIP=podman,lxc: treat parts as missing (a developer box where one misbehaves)
        skip = {p.strip() for p in os.environ.get("MLDIAG_LAB_SKIP", "").split(",") if p.strip()}
        for part, progs in PROGRAMS.items():
            if part in skip:
                self._unavailable(part, "disabled by MLDIAG_LAB_SKIP")
                continue
            missing = missing_programs(progs)
            if missing:
                self._unavailable(part, f"missing {', '.join(missing)} "
                                        f"(apt-get install -y --no-install-recommends {PACKAGES})")
        if "ssh" in self.unavailable:
            raise LabUnavailable(self.unavailable["ssh"])
        self.root.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        self._hold_the_machine()
        self._step("reap_stale", reap_stale_sessions, self.root)
        self.dir.mkdir(mode=0o755)
        self._write_state()
        self._step("stage", self._stage_test_files)
        self._step("users", users.ensure_users)
        self._step("keys", self._make_keys)
        if "netns" not in self.unavailable:
            self._step("netns", self._start_netns)
        self._step("sudoers", self._install_globals)
        # podman (the slowest part) and Slurm start in threads while LXC and the sshds come up
        background: List[tuple] = []

        def in_background(name: str, fn, *args) -> None:
            errors: list = []

            def body():
                try:
                    self._step(name, fn, *args)
                except BaseException as e:  # re-raised below, in this thread
                    errors.append(e)

            thread = threading.Thread(target=body, name=f"lab-{name}")
            thread.start()
            background.append((thread, errors))

        if "slurm" not in self.unavailable:
            # first: its node namespaces then copy fewer of the containers' mounts
            self.slurm = slurm.SlurmCluster(self.dir / "slurm", visible_root=self.root,
                                            also_visible=[Path(sys.prefix)])
            self._write_state()
            in_background("slurm", self._start_slurm)
        base = None
        if not {"lxc", "podman"} <= set(self.unavailable):
            try:
                base = self.rootfs = self._step("rootfs", rootfs.base_rootfs, self.root / "cache")
            except LabUnavailable as e:
                for part in ("lxc", "podman"):
                    self._unavailable(part, str(e))
        if "podman" not in self.unavailable:
            self.podman = Podman(self.dir / "podman")
            self.podman.write_config()
            self._write_state()
            in_background("podman", self._start_podman, base)
        try:
            if "lxc" not in self.unavailable:
                self._step("lxc", self._start_lxc, base)
            self._step("sshd", self._start_sshds)
        finally:
            for thread, _ in background:
                thread.join()
        for _, errors in background:
            if errors:
                raise errors[0]
        self._write_state()
        self.startup_s = round(time.monotonic() - t0, 3)

    def _unavailable(self, part: str, reason: str) -> None:
        if self.strict:
            raise LabUnavailable(f"{part}: {reason}")
        self.unavailable[part] = reason

    @staticmethod
    def _raise_unavailable(reason: str) -> None:
        raise LabUnavailable(reason)

    def need(self, *parts: str) -> None:
        """Call on_unavailable (pytest: skip, or fail under CI) if a part is missing."""
        for part in parts:
            if part in self.unavailable:
                self.on_unavailable(f"lab part {part!r} unavailable: {self.unavailable[part]}")

    def _hold_the_machine(self) -> None:
        """Take root/running.lock until close (or the process's end: the kernel drops it). One
        lab at a time: a second one would rewrite the lab users' sudoers rules, whose
        secure_path names its own copy of tests/fakes, and leave them naming that copy, gone
        when it closes, under the first lab's users."""
        fd = os.open(self.root / "running.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            running = ", ".join(str(d) for d in running_labs(self.root)) or "one starting"
            raise LabError(f"another lab is running on this machine ({running}): one lab at a "
                           f"time (docs/testing.md); wait for it to end") from None
        self._machine_lock = fd

    def _stage_test_files(self) -> None:
        """Copy the checkout's files that the lab's other users and its containers read into
        the lab dir, world-readable, and point fakes_dir, fixtures_dir, hostile_dir and the
        extra binds under tests/ at the copies.

        Always, whatever the checkout's modes: a clone in a private directory (a home dir of mode
        0700) is out of reach of the lab users (mlsh runs tests/fixtures/hostile/python), a
        checkout under /tmp is out of reach of the Slurm nodes (each has a private /tmp where only
        the lab dir is bound back), files a umask of 077 wrote are unreadable even where every
        directory above is searchable, and a path with a space cannot be a hosts.yaml `python:`.
        One copy of ~5 MB (tens of ms) covers every case with one layout.
        Whole directories are copied (never a list of files), so a fixture added later travels
        too; the layout is kept (tests/fakes beside tests/fixtures), where the fakes look."""
        def copy_of(src: Path) -> Path:
            try:
                dest = self.dir / "repo" / src.relative_to(REPO)
            except ValueError:
                dest = self.dir / "binds" / src.relative_to(src.anchor)
            if not dest.exists():
                shutil.copytree(src, dest, symlinks=True)
                world_readable(dest)
                for d in dest.parents:  # made by copytree, under this process's umask
                    if d == self.dir:
                        break
                    os.chmod(d, 0o755)
            return dest

        tests_dir = REPO / "tests"
        self.fixtures_dir = copy_of(self.fixtures_dir)
        self.fakes_dir = copy_of(self.fakes_dir)
        # Binds under tests/ are read on the host too (the lab users read the fixtures beside the
        # fakes); other binds (e.g. a venv's site-packages) are read inside the CTs by root.
        self.extra_binds = [copy_of(b) if tests_dir in [b, *b.parents] else b
                            for b in self.extra_binds]

    def _make_keys(self) -> None:
        (self.dir / "client").mkdir(mode=0o700)
        sshd.keygen(self.identity, f"mldiag-lab-{self.sid}")
        auth = self.dir / "authorized_keys"
        auth.mkdir(mode=0o755)
        pub = self.identity_pub.read_text()
        for user in SSH_USERS:
            (auth / user).write_text(pub)
            os.chmod(auth / user, 0o644)

    def _start_netns(self) -> None:
        try:
            self.jumpnet = netns.setup(self.sid)
        except LabError as e:
            self._unavailable("netns", f"cannot build network namespaces: {e}")
        self._write_state()

    def _install_globals(self) -> None:
        # NOTE: per-session values travel in SetEnv, but secure_path names this session's copy
        # of tests/fakes: hence one lab at a time (_hold_the_machine).
        users.install_sudoers(users.sudoers_text(self.users.values(), self.secure_path, SESSION_VARS))
        PCT_CONF.parent.mkdir(parents=True, exist_ok=True)
        PCT_CONF.write_text(f"# written by the mldiag test lab, session {self.dir}\n"
                            f"lxcpath: {self.lxc_path}\n")

    def _binds(self) -> List[Path]:
        return [self.fakes_dir, *self.extra_binds]

    def _start_lxc(self, base: Path) -> None:
        self.lxc_path.mkdir(mode=0o755)
        links = {"/usr/bin/nvidia-smi": str(self.fakes_dir / "nvidia-smi")}
        for vmid in (CT_RUNNING, CT_STOPPED):
            lxc.define(self.lxc_path, vmid, base, self._binds(), links)
        try:
            pid = lxc.start(self.lxc_path, CT_RUNNING, self.dir / f"lxc-{CT_RUNNING}.log")
        except LabError as e:
            self._unavailable("lxc", str(e))
            return
        self._ct_pids[CT_RUNNING] = pid
        self._write_state()
        lxc.attach(self.lxc_path, CT_RUNNING, ["/usr/bin/python3.11", "-m", "venv", "--without-pip", VENV])

    def _start_podman(self, base: Path) -> None:
        try:
            self._podbox_pid = self.podman.start(PODBOX, base, self._binds())
        except LabError as e:
            self._unavailable("podman", str(e))
            return
        # a symlink, as in the CTs: the fake finds its fixtures beside its real path
        self.podman("exec", PODBOX, "ln", "-s", str(self.fakes_dir / "nvidia-smi"), "/usr/bin/nvidia-smi")

    def _start_slurm(self) -> None:
        try:
            self.slurm.start()
        except LabError as e:
            self.slurm.stop()
            self._unavailable("slurm", f"cannot start the Slurm cluster: {e}")
        finally:
            self._write_state()

    def _start_sshds(self) -> None:
        version = sshd.openssh_version()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        specs = [("main", "127.0.0.2", True, None, None), ("defaults", "127.0.0.3", False, None, None),
                 ("nosftp", "127.0.0.4", True, None, None)]
        if self.jumpnet:
            j = self.jumpnet
            specs += [("jump", j.jump_addr, True, j.ns_jump, None),
                      ("inner", j.inner_addr, True, j.ns_inner, "jump")]
        for name, address, generous, ns, via in specs:
            d = self.dir / "sshd" / name
            d.mkdir(parents=True)
            s = sshd.SshServer(name=name, address=address, port=22 if ns else 0, dir=d,
                               generous=generous, netns=ns, proxy_jump=via, sftp=name != "nosftp")
            s.aliases = {u: (name if u == "mlsh" else f"{name}-{u}") for u in SSH_USERS}
            s.host_key_pub = sshd.keygen(s.host_key, f"mldiag-lab-{name}")
            self.servers[name] = s
        setenv = {"PATH": self.path, **self.session_env}
        for s in self.servers.values():
            pick = None if s.netns else (lambda s=s: free_port(s.address))
            s.start_on_a_free_port(pick, authorized_keys_dir=self.dir / "authorized_keys",
                                   setenv=setenv, version=version)
            self._write_state()
        self._write_ssh_files()

    def _write_ssh_files(self) -> None:
        """known_hosts and ssh_config for every server, in the lab's dir and its home's ~/.ssh."""
        self.known_hosts.write_text(sshd.known_hosts_text(self.servers.values()))
        self.ssh_config.write_text(sshd.ssh_config_text(self.servers.values(), self.identity,
                                                         self.known_hosts))
        ssh_dir = self.home / ".ssh"
        ssh_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
        shutil.copy(self.identity, ssh_dir / "id_ed25519")
        shutil.copy(self.identity_pub, ssh_dir / "id_ed25519.pub")
        shutil.copy(self.known_hosts, ssh_dir / "known_hosts")
        (ssh_dir / "config").write_text(sshd.ssh_config_text(
            self.servers.values(), ssh_dir / "id_ed25519", ssh_dir / "known_hosts"))

    def fleet(self) -> List[sshd.SshServer]:
        """FLEET_NODES nodes on one cluster network (tests/lab/netns.py: FleetNet), an sshd in
        each (servers ``f1`` ...; address and port 22 in its namespace, reached directly: the
        client's namespace holds the bridge); built on the first call, later calls return them."""
        self.need("netns")
        with self._fleet_lock:
            if self.fleetnet is None:
                self.fleetnet = netns.setup_fleet(self.sid, FLEET_NODES)
                self._write_state()
                setenv = {"PATH": self.path, **self.session_env}
                version = sshd.openssh_version()
                for i, (ns, address) in enumerate(zip(self.fleetnet.nodes, self.fleetnet.addrs)):
                    name = f"f{i + 1}"
                    d = self.dir / "sshd" / name
                    d.mkdir(parents=True)
                    s = sshd.SshServer(name=name, address=address, port=22, dir=d, generous=True, netns=ns)
                    s.aliases = {u: (name if u == "mlsh" else f"{name}-{u}") for u in SSH_USERS}
                    s.host_key_pub = sshd.keygen(s.host_key, f"mldiag-lab-{name}")
                    self.servers[name] = s
                    s.start_on_a_free_port(None, authorized_keys_dir=self.dir / "authorized_keys",
                                           setenv=setenv, version=version)
                    self._write_state()
                self._write_ssh_files()
            return [self.servers[f"f{i + 1}"] for i in range(FLEET_NODES)]

    def fleet_slurm(self, nodes: int = FLEET_NODES) -> slurm.SlurmCluster:
        """A second Slurm cluster whose nodes ``s1`` ... are the first ``nodes`` fleet nodes: each
        slurmd in its node's network namespace at its fleet address, slurmctld on this machine
        reached at the bridge's address (what ``slow_fleet_link`` slows is then a Slurm node's
        link). Its login node is this machine with SLURM_CONF set to its ``conf`` (a hosts.yaml
        ``local: true`` target with ``slurm:``). Built on the first call."""
        self.need("slurm")
        self.fleet()
        with self._fleet_lock:
            if self.fleet_cluster is None:
                names = [f"s{i + 1}" for i in range(nodes)]
                self.fleet_cluster = slurm.SlurmCluster(
                    self.dir / "fleet-slurm", visible_root=self.root, nodes=names, also_visible=[Path(sys.prefix)],
                    node_netns=dict(zip(names, self.fleetnet.nodes)), node_addrs=dict(zip(names, self.fleetnet.addrs)),
                    ctld_addr=self.fleetnet.bridge_addr)
                self._write_state()
                try:
                    self.fleet_cluster.start()
                finally:
                    self._write_state()
            return self.fleet_cluster

    def own_slurm(self, name: str, nodes, extra_conf=(), node_binds=None, also_visible=(),
                  ready=("idle",)) -> slurm.SlurmCluster:
        """A Slurm cluster of a test's own (a slurm.conf with lines no other test wants, such as
        HealthCheckProgram=), on this machine's network like the main one, started now and
        torn down with the lab or by ``stop_own_slurm``. ``node_binds``: {node: [(directory,
        path on the node)]}."""
        self.need("slurm")
        cluster = slurm.SlurmCluster(self.dir / f"slurm-{name}", visible_root=self.root, nodes=nodes,
                                     also_visible=[Path(sys.prefix), *also_visible],
                                     extra_conf=extra_conf, node_binds=node_binds)
        self.own_clusters[name] = cluster
        self._write_state()
        try:
            cluster.start(ready=ready)
        finally:
            self._write_state()
        return cluster

    def stop_own_slurm(self, name: str) -> None:
        cluster = self.own_clusters.pop(name, None)
        if cluster is not None:
            cluster.stop()
            self._write_state()

    def slow_fleet_link(self, node: int, rate: str = "50mbit") -> None:
        """Fleet node ``node`` (0-based) gets a slow link: ``rate``, both directions. 50 Mbit/s:
        the unslowed pairs' gloo all-reduce is CPU-bound on a busy 2-core machine, 0.07-0.29 GB/s
        (CI, stop 38); at 200 Mbit/s (0.022 GB/s) the slow pair came within the 25 % threshold of
        their median."""
        netns.slow_link(self.fleetnet, node, rate)

    def restore_fleet_link(self, node: int) -> None:
        netns.restore_link(self.fleetnet, node)

    def node_check_cts(self) -> Dict[int, "nodecheck.NodeCT"]:
        """The node-check CTs (tests/lab/nodecheck.py: 210 `h200-ok`, 211 `h200-bad`), defined
        and started on the first call; later calls return them at once."""
        self.need("lxc")
        with self._node_cts_lock:
            if self._node_cts is None:
                t = time.monotonic()
                try:
                    nodes = nodecheck.build(self.dir / "nodecheck", self.fixtures_dir)
                except LabUnavailable as e:  # a recording missing: skip, or fail under CI
                    self.on_unavailable(f"node-check CTs: {e}")
                    raise
                for node in nodes.values():
                    nodecheck.define(self.lxc_path, self.rootfs, self._binds(), self.fakes_dir,
                                     self.fixtures_dir, node)
                self._extra_vmids = list(nodes)
                self._write_state()
                for vmid in nodes:
                    self._ct_pids[vmid] = lxc.start(self.lxc_path, vmid, self.dir / f"lxc-{vmid}.log")
                self._node_cts = nodes
                self.timings["node_check_cts"] = round(time.monotonic() - t, 3)
        return self._node_cts

    # ------------------------------------------------------------------ helpers for tests

    def ssh_argv(self, alias: str, *argv: str) -> List[str]:
        """`ssh -F ssh_config ALIAS ARGV...` as an argv list (ARGV is joined by ssh: quote it)."""
        return ["ssh", "-F", str(self.ssh_config), alias, *argv]

    def ssh(self, alias: str, *argv: str, input: Optional[str] = None, timeout: float = 30):
        """Run ssh_argv(...) and return the CompletedProcess (text, not checked)."""
        return subprocess.run(self.ssh_argv(alias, *argv), input=input, capture_output=True,
                              text=True, timeout=timeout)

    def hosts_yaml(self, text: str) -> Path:
        """Write `text` as hosts.yaml in a fresh directory of its own; returns the file's Path."""
        self._hosts_n += 1
        d = Path(tempfile.mkdtemp(prefix=f"hosts{self._hosts_n}-", dir=self.dir))
        p = d / "hosts.yaml"
        p.write_text(text)
        return p

    def netns_argv(self, server: str, argv: List[str]) -> List[str]:
        """argv run inside `server`'s network namespace (jump/inner), e.g. for iptables faults."""
        ns = self.servers[server].netns
        if not ns:
            raise LabError(f"server {server} runs in the root network namespace")
        return ["ip", "netns", "exec", ns, *argv]

    def _container_pid(self, vmid: int) -> int:
        self.need("lxc")
        pid = lxc.init_pid(self.lxc_path, vmid)
        if pid is None:
            raise LabError(f"CT {vmid} is not running")
        return pid

    @staticmethod
    def _pids_in_ns_of(init: int, include_init: bool) -> List[int]:
        target = ns_of(init, "pid")
        return sorted(p for p in all_pids()
                      if (include_init or p != init) and ns_of(p, "pid") == target
                      and state_of(p) not in (None, "Z"))

    def container_pids(self, vmid: int = CT_RUNNING, include_init: bool = False) -> List[int]:
        """Host PIDs of the live processes inside CT `vmid` (its init left out by default)."""
        return self._pids_in_ns_of(self._container_pid(vmid), include_init)

    def container_cmdlines(self, vmid: int = CT_RUNNING, include_init: bool = False) -> List[List[str]]:
        """argv of each process inside CT `vmid` (see container_pids)."""
        return [c for c in (cmdline(p) for p in self.container_pids(vmid, include_init)) if c is not None]

    def container_tmp(self, vmid: int = CT_RUNNING) -> List[str]:
        """Sorted entries of /tmp inside CT `vmid`."""
        return sorted(os.listdir(f"/proc/{self._container_pid(vmid)}/root/tmp"))

    def _podman_pid(self, name: str) -> int:
        self.need("podman")
        if name == PODBOX and self._podbox_pid and state_of(self._podbox_pid):
            return self._podbox_pid
        return self.podman.pid(name)

    def podman_pids(self, name: str = PODBOX, include_init: bool = False) -> List[int]:
        return self._pids_in_ns_of(self._podman_pid(name), include_init)

    def podman_cmdlines(self, name: str = PODBOX, include_init: bool = False) -> List[List[str]]:
        """argv of each process inside podman container `name` (its init left out by default)."""
        return [c for c in (cmdline(p) for p in self.podman_pids(name, include_init)) if c is not None]

    def podman_tmp(self, name: str = PODBOX) -> List[str]:
        return sorted(os.listdir(f"/proc/{self._podman_pid(name)}/root/tmp"))

    def _slurm(self) -> slurm.SlurmCluster:
        self.need("slurm")
        if self.slurm is None:
            raise LabError("the Slurm cluster was not started")
        return self.slurm

    def slurm_stop_node(self, node: str, sig: int = signal.SIGSTOP) -> None:
        """Hang (SIGSTOP, the default) or kill (SIGKILL) node `node`'s slurmd; steps already
        running there go on. slurm_start_node undoes it."""
        self._slurm().stop_node(node, sig)

    def slurm_start_node(self, node: str, timeout: float = 30) -> None:
        """SIGCONT or restart node `node`'s slurmd; return when the node is usable again
        (idle, or mix/alloc when a job holds it)."""
        self._slurm().start_node(node, timeout)

    def slurm_tmp(self, node: str) -> List[str]:
        """Sorted entries of /tmp on Slurm node `node` (not the login node's /tmp)."""
        return self._slurm().node_tmp(node)

    def host_tmp(self, user: str) -> List[str]:
        """Sorted entries of the host's /tmp owned by `user` (lab users have no TMPDIR)."""
        uid = pwd.getpwnam(user).pw_uid
        out = []
        for name in os.listdir("/tmp"):
            try:
                if os.lstat(os.path.join("/tmp", name)).st_uid == uid:
                    out.append(name)
            except FileNotFoundError:
                pass
        return sorted(out)

    def session_processes(self) -> List[int]:
        """PIDs of processes started through the lab's sshds (below a listener, or carrying
        this session's MLDIAG_LAB_SESSION, which sudo keeps), listeners excluded."""
        listeners = [s.pid for s in self.servers.values() if s.pid]
        pids = set(descendants(listeners))
        me = os.getpid()
        for p in all_pids():
            if p != me and environ_has(p, SESSION_ENV, self.sid):
                pids.add(p)
        return sorted(p for p in pids if state_of(p) not in (None, "Z"))

    def kill_session_sshd(self, server: str = "main", user: Optional[str] = None,
                          sig: int = signal.SIGKILL) -> int:
        """Kill the per-connection sshd processes of `server` (optionally only `user`'s),
        cutting those connections; the listener and the commands they ran stay. Returns
        how many sshd processes were signalled."""
        s = self.servers[server]
        victims = []
        for child in s.session_pids():
            title = " ".join(cmdline(child) or [])
            if user is not None and not title.startswith(f"sshd: {user} "):
                continue
            victims.append(child)
            victims += [p for p in descendants([child]) if _comm(p) == "sshd"]
        for p in victims:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        return len(victims)

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Stop everything this session started; remove its namespaces and directory."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self.dir.exists():  # failed before it built anything
                return
            stray = self.session_processes() if self.servers else []
            for s in self.servers.values():
                s.stop()
            kill_all(stray)
            if self.slurm:
                self.slurm.stop()
            if self.fleet_cluster:
                self.fleet_cluster.stop()
            for cluster in list(self.own_clusters.values()):
                cluster.stop()
            teardown_state(self._state(), remove_dir=True)
        finally:
            if self._machine_lock is not None:
                os.close(self._machine_lock)  # drops the flock
                self._machine_lock = None

    def _state(self) -> dict:
        return {
            "owner": os.getpid(), "sid": self.sid, "dir": str(self.dir),
            "sshd": [s.pid for s in list(self.servers.values()) if s.pid],  # list(): atomic vs. threads
            "lxc_path": str(self.lxc_path), "vmids": [CT_RUNNING, CT_STOPPED, *self._extra_vmids],
            "podman": ({"conf": str(self.podman.conf), "storage_conf": str(self.podman.storage_conf),
                        "names": [PODBOX]} if self.podman else None),
            "jumpnet": self.jumpnet.__dict__ if self.jumpnet else None,
            "fleetnet": self.fleetnet.__dict__ if self.fleetnet else None,
            "slurm": self.slurm.state() if self.slurm else None,
            "fleet_slurm": self.fleet_cluster.state() if self.fleet_cluster else None,
            "own_slurm": [c.state() for c in list(self.own_clusters.values())],
        }

    def _write_state(self) -> None:
        with self._state_lock:  # the background parts write it too
            if self.dir.is_dir():
                (self.dir / "state.json").write_text(json.dumps(self._state()))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def summary(self) -> str:
        lines = [f"mldiag lab {self.sid} in {self.dir} (up in {self.startup_s:.2f}s: {self.timings})",
                 f"  ssh -F {self.ssh_config} ALIAS"]
        for s in self.servers.values():
            lines.append(f"  {s.name:9} {s.address}:{s.port} netns={s.netns or '-'} "
                         f"aliases={','.join(s.aliases.values())} log={s.log_path}")
        lines.append(f"  lxc_path {self.lxc_path} (CT {CT_RUNNING} running, {CT_STOPPED} stopped)")
        for node in (self._node_cts or {}).values():
            lines.append(f"  CT {node.vmid} {node.name}: /sys/class/infiniband <- {node.ib_tree}, "
                         f"/sys/bus/pci/devices <- {node.pci_tree}, tools {' '.join(node.tools)}")
        if self.podman:
            lines.append(f"  podman {PODBOX}: " + " ".join(f"{k}={v}" for k, v in self.podman.config_env.items()))
        if self.slurm and "slurm" not in self.unavailable:
            lines.append(f"  slurm nodes {','.join(self.slurm.nodes)} (login node: main) "
                         f"SLURM_CONF={self.slurm.conf} logs={self.slurm.log_dir}")
        for part, why in self.unavailable.items():
            lines.append(f"  UNAVAILABLE {part}: {why}")
        return "\n".join(lines)


def _comm(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def teardown_state(state: dict, remove_dir: bool) -> None:
    """Undo a session from its state.json: containers, podman, netns, global files, dir.
    Never raises: it also cleans up after a crashed session."""
    d = Path(state["dir"])
    # first: their nodes' namespaces hold copies of the other parts' mounts
    for cluster in [state.get("slurm"), state.get("fleet_slurm"), *(state.get("own_slurm") or [])]:
        if cluster:
            slurm.teardown(cluster)
    lxc_path = Path(state["lxc_path"])
    for vmid in state.get("vmids", []):
        if (lxc_path / str(vmid) / "config").exists():
            lxc.stop(lxc_path, vmid)
    pm = state.get("podman")
    if pm and Path(pm["conf"]).exists():
        env = {**os.environ, "CONTAINERS_CONF": pm["conf"], "CONTAINERS_STORAGE_CONF": pm["storage_conf"]}
        for name in pm.get("names", []):
            run(["/usr/bin/podman", "rm", "-f", "-t", "0", name], check=False, env=env)
        # NOTE: conmon runs `podman container cleanup` when the container exits, after
        # `rm` returned; it re-mounts the storage. Wait for those (they name our dir).
        _wait_gone(lambda: [p for p in all_pids() if str(d) in " ".join(cmdline(p) or [])
                            and p != os.getpid()], timeout=10)
    if state.get("jumpnet"):
        netns.teardown(netns.JumpNet(**state["jumpnet"]))
    if state.get("fleetnet"):
        netns.teardown_fleet(netns.FleetNet(**state["fleetnet"]))
    # the global files go with the last session on this machine
    if not _live_sessions(d.parent, but=d):
        for f in (users.SUDOERS_FILE, PCT_CONF):
            try:
                f.unlink()
            except FileNotFoundError:
                pass
    if remove_dir:
        _umount_below(d)
        shutil.rmtree(d, ignore_errors=True)
        if d.exists():  # something mounted meanwhile: once more
            _umount_below(d)
            shutil.rmtree(d, ignore_errors=True)


def _wait_gone(find: Callable[[], List[int]], timeout: float) -> None:
    """Wait until find() returns no PIDs; then kill what is left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not find():
            return
        time.sleep(0.05)
    kill_all(find())


def _umount_below(d: Path) -> None:
    prefix = str(d) + "/"
    try:
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    except OSError:
        return
    for m in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        run(["umount", "-l", m], check=False)


def default_root() -> Path:
    """Where Lab.start puts its session dirs unless told otherwise."""
    return Path(f"/tmp/mldiag-lab-{os.getuid()}")


def running_labs(root: Optional[Path] = None) -> List[Path]:
    """The session dirs of the labs running now under `root` (their owner process alive)."""
    return _live_sessions(Path(root or default_root()), but=None)


def _live_sessions(root: Path, but: Optional[Path]) -> List[Path]:
    out = []
    for state_file in root.glob("session-*/state.json"):
        if state_file.parent == but:
            continue
        try:
            owner = json.loads(state_file.read_text()).get("owner")
        except (OSError, ValueError):
            continue
        if owner and state_of(owner) not in (None, "Z"):
            out.append(state_file.parent)
    return out


def reap_stale_sessions(root: Path) -> None:
    """Clean up sessions whose owner process is gone (a killed pytest), so re-runs start clean."""
    for state_file in root.glob("session-*/state.json"):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        owner = state.get("owner")
        if owner and state_of(owner) not in (None, "Z"):
            continue  # a live session (another pytest): leave it alone
        for pid in state.get("sshd", []):
            if state_of(pid) and state["dir"] in " ".join(cmdline(pid) or []):
                kill_all([pid, *descendants([pid])])
        teardown_state(state, remove_dir=True)
