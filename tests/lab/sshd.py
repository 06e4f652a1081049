"""Real OpenSSH servers for the lab: host keys, sshd_config, known_hosts, ssh_config."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

from .util import LabError, all_pids, descendants, kill_all, ppid_of, run, wait_until

SSHD = "/usr/sbin/sshd"

# Generous limits for the main server: OpenSSH's defaults (MaxSessions 10,
# MaxStartups 10:30:100) drop parallel connections past 10. The `defaults`
# server writes neither line.
GENEROUS_LIMITS = ("MaxSessions 100", "MaxStartups 200:30:400")


def openssh_version() -> tuple:
    out = run(["ssh", "-V"], check=False)
    m = re.search(r"OpenSSH_(\d+)\.(\d+)", out.stderr + out.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def keygen(path: Path, comment: str) -> str:
    """A new ed25519 key pair at `path` (+ .pub); returns the public key line."""
    for p in (path, path.with_name(path.name + ".pub")):
        if p.exists():
            p.unlink()
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    return path.with_name(path.name + ".pub").read_text().strip()


def hashed_host(name: str, salt: Optional[bytes] = None) -> str:
    """known_hosts hashed host field, as `ssh-keygen -H` writes it."""
    salt = salt if salt is not None else os.urandom(20)
    digest = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(digest).decode()}"


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


@dataclass
class SshServer:
    """One lab sshd.

    name: role in the lab (main, defaults, jump, inner); address/port: where it
    listens (inside `netns` when set); alias: its ssh_config Host for user mlsh,
    aliases: user -> Host alias; log_path: sshd's own log (LogLevel VERBOSE);
    generous: whether MaxSessions/MaxStartups lines were written; proxy_jump: the
    alias it is reached through (ProxyJump), if any.
    """

    name: str
    address: str
    port: int
    dir: Path
    generous: bool
    netns: Optional[str] = None
    proxy_jump: Optional[str] = None
    aliases: Dict[str, str] = field(default_factory=dict)
    host_key_pub: str = ""
    proc: Optional[subprocess.Popen] = None
    sftp: bool = True       # False: no Subsystem line, as on hosts that disable SFTP

    @property
    def alias(self) -> str:
        return self.aliases.get("mlsh", self.name)

    @property
    def config_path(self) -> Path:
        return self.dir / "sshd_config"

    @property
    def log_path(self) -> Path:
        return self.dir / "sshd.log"

    @property
    def host_key(self) -> Path:
        return self.dir / "ssh_host_ed25519_key"

    @property
    def pid_path(self) -> Path:
        return self.dir / "sshd.pid"

    @property
    def pid(self) -> Optional[int]:
        """PID of the listening sshd (killing it leaves established sessions alive)."""
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def connection_count(self) -> int:
        """TCP connections this sshd accepted so far (its VERBOSE 'Connection from' lines)."""
        return self.log_text().count("Connection from ")

    def session_pids(self) -> List[int]:
        """PIDs of the per-connection sshd processes (children of the listener)."""
        if not self.pid:
            return []
        return [p for p in all_pids() if ppid_of(p) == self.pid]

    # ------------------------------------------------------------ config

    def write_config(self, *, authorized_keys_dir: Path, setenv: Dict[str, str],
                     version: tuple) -> None:
        for key, value in setenv.items():
            if re.search(r'[\s"\\]', value):
                raise LabError(f"SetEnv {key}={value!r}: no spaces or quotes allowed")
        lines = [
            f"# mldiag lab sshd '{self.name}'",
            f"Port {self.port}",
            f"ListenAddress {self.address}",
            "AddressFamily inet",
            f"HostKey {self.host_key}",
            f"PidFile {self.pid_path}",
            "LogLevel VERBOSE",
            f"AuthorizedKeysFile {authorized_keys_dir}/%u",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "SetEnv " + " ".join(f"{k}={v}" for k, v in setenv.items()),
        ]
        if self.sftp:
            lines.append("Subsystem sftp internal-sftp")
        if self.generous:
            lines += GENEROUS_LIMITS
        if version >= (9, 8):
            # NOTE: newer sshd penalises sources that fail auth; the fault tests do that on purpose.
            lines.append("PerSourcePenalties no")
        self.config_path.write_text("\n".join(lines) + "\n")

    # ------------------------------------------------------------ process

    def start(self, timeout: float = 10) -> None:
        argv = [SSHD, "-D", "-f", str(self.config_path), "-E", str(self.log_path)]
        if self.netns:
            argv = ["ip", "netns", "exec", self.netns] + argv  # ip execs sshd: same PID
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)
        ready = f"Server listening on {self.address} port {self.port}."

        def up():
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace")
                raise LabError(f"sshd '{self.name}' exited {self.proc.returncode}: "
                               f"{err.strip()} {self.log_text().strip()[-1500:]}")
            return ready in self.log_text()

        wait_until(up, timeout, f"sshd '{self.name}' to listen on {self.address}:{self.port}")

    def start_on_a_free_port(self, pick_port: Optional[Callable[[], int]], *, attempts: int = 5,
                             **config) -> None:
        """write_config(**config) and start; when another process takes the port between
        picking and binding, pick again (``pick_port`` None: the port is fixed)."""
        for attempt in range(attempts):
            if pick_port is not None:
                self.port = pick_port()
            self.write_config(**config)
            try:
                self.start()
                return
            except LabError as e:
                self.stop()
                if pick_port is None or "Address already in use" not in str(e) or attempt == attempts - 1:
                    raise

    def stop(self) -> None:
        """Stop the listener and every process below it (sessions, their commands)."""
        if not self.proc:
            return
        tree = descendants([self.proc.pid])
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        kill_all(tree)
        try:
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()


def ssh_config_text(servers: Iterable[SshServer], identity: Path, known_hosts: Path) -> str:
    """One Host block per (server, user) alias; every setting explicit in each block."""
    out = ["# mldiag test lab: use with `ssh -F THIS_FILE ALIAS`", ""]
    for s in servers:
        for user, alias in s.aliases.items():
            names = [alias] + ([f"{s.name}-{user}"] if alias == s.name else [])
            out += [
                f"Host {' '.join(names)}",
                f"  HostName {s.address}",
                f"  Port {s.port}",
                f"  User {user}",
                f"  IdentityFile {identity}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {known_hosts}",
                "  StrictHostKeyChecking yes",
                "  BatchMode yes",
            ]
            if s.proxy_jump:
                out.append(f"  ProxyJump {s.proxy_jump}")
            out.append("")
    return "\n".join(out)


def known_hosts_text(servers: Iterable[SshServer]) -> str:
    """Hashed known_hosts lines (`|1|salt|hmac`), one per server."""
    lines = []
    for s in servers:
        keytype, key = s.host_key_pub.split()[:2]
        lines.append(f"{hashed_host(known_hosts_name(s.address, s.port))} {keytype} {key}")
    return "\n".join(lines) + "\n"
