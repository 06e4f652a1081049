"""What the benches share: the probe script, timing one whole process, loopback sshd fleets.

A timed command runs in a session of its own with stdout/stderr in temporary files; the bench
reaps it with ``os.wait4``, which gives that process tree's own CPU time and peak RSS (not the
bench's nor an earlier command's, as RUSAGE_CHILDREN would).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.lab import sshd  # noqa: E402
from tests.lab.util import wait_until  # noqa: E402

# The script every reference and `mldiag run-script` runs. The shebang is for `ansible -m script`,
# which runs the uploaded file as an executable.
PROBE = """#!/usr/bin/python3
import json, platform, socket, sys
print(json.dumps({"python": platform.python_version(), "host": socket.gethostname(), "argv": sys.argv[1:]}))
"""

CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    pass


@dataclass
class Sample:
    """One whole-process run: wall seconds, CPU seconds (user+sys of the process and the
    children it reaped), peak RSS in KiB (the largest single process of that tree)."""
    wall: float
    cpu: float
    maxrss_kb: int
    returncode: int
    stdout: bytes = b""
    stderr: bytes = b""


_current: Dict[str, Optional[int]] = {"pgid": None}


def current_pgid() -> Optional[int]:
    """The process group of the command `timed` is running now (None between commands)."""
    return _current["pgid"]


def kill_current() -> None:
    """Kill the process group of the command being timed, if any (Ctrl-C, SIGTERM)."""
    pgid = _current["pgid"]
    if pgid:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def timed(argv: Sequence[str], stdin_path: Optional[str] = None, env: Optional[dict] = None,
          cwd: Optional[str] = None, timeout: float = 300.0, check: bool = True) -> Sample:
    """Run argv to completion; wall time from just before the fork to the reap."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
        try:
            t0 = time.perf_counter()
            proc = subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=err, env=env, cwd=cwd,
                                    start_new_session=True)
            _current["pgid"] = proc.pid
            timer = threading.Timer(timeout, kill_current)
            timer.start()
            try:
                _, status, usage = os.wait4(proc.pid, 0)
                wall = time.perf_counter() - t0
            except BaseException:          # Ctrl-C / SIGTERM while waiting: end the command too
                kill_current()
                try:
                    os.wait4(proc.pid, 0)
                except ChildProcessError:
                    pass
                proc.returncode = -9
                raise
            finally:
                timer.cancel()
                _current["pgid"] = None
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            if stdin_path:
                stdin.close()
        out.seek(0)
        err.seek(0)
        sample = Sample(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, proc.returncode,
                        out.read(), err.read())
    if check and sample.returncode != 0:
        raise BenchError(f"{' '.join(map(str, argv[:4]))} ... exited {sample.returncode}"
                         f"{' (killed after %gs)' % timeout if wall >= timeout else ''}:\n"
                         f"{sample.stderr.decode(errors='replace')[-1500:]}"
                         f"{sample.stdout.decode(errors='replace')[-800:]}")
    return sample


def children_cpu(pids: Sequence[int]) -> float:
    """CPU seconds of the reaped children of `pids` (cutime+cstime): for an sshd listener, what
    its connections and the commands they ran have used so far."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[13]) + int(fields[14])   # cutime, cstime (fields 16, 17)
    return total / CLK_TCK


def bytecode_env(env: Dict[str, str], cache_dir: Path) -> Dict[str, str]:
    """`env` with Python's bytecode cache on, kept in `cache_dir` (not in the checkout): what an
    installed mldiag has. PYTHONDONTWRITEBYTECODE=1 (set on some machines) would recompile the
    editable `diagnostics` package in every run (≈40 ms here)."""
    env = dict(env)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(cache_dir)
    return env


def process_cpu(pid: int) -> float:
    """CPU seconds (user+sys) a live process has used so far; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK   # utime, stime (fields 14, 15)


def machine_busy() -> float:
    """CPU seconds all CPUs of the machine have been busy (or stolen by the hypervisor) since boot."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------- sshd fleets

MAX_LISTEN = 16   # ListenAddress lines one sshd takes


class FleetServer(sshd.SshServer):
    """A lab sshd (same settings as the lab's `main`: user mlsh, generous limits, LogLevel
    VERBOSE, the lab's PATH with the fakes) listening on several loopback addresses."""

    addresses: List[str]

    def write_config(self, **kw) -> None:
        super().write_config(**kw)
        text = self.config_path.read_text()
        listen = "\n".join(f"ListenAddress {a}" for a in self.addresses)
        self.config_path.write_text(text.replace(f"ListenAddress {self.address}", listen))

    def start(self, timeout: float = 10) -> None:
        super().start(timeout)
        wait_until(lambda: all(f"Server listening on {a} port {self.port}." in self.log_text()
                               for a in self.addresses), timeout, f"sshd '{self.name}' to listen")


@dataclass
class FleetTarget:
    alias: str
    address: str
    port: int
    server: FleetServer


def _port_free_on_all(addresses: Sequence[str]) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = s.getsockname()[1]
        try:
            for a in addresses[1:]:
                with socket.socket() as s:
                    s.bind((a, port))
            return port
        except OSError:
            continue
    raise BenchError(f"no port free on all of {addresses[0]}..{addresses[-1]}")


def fleet_address(n: int) -> str:
    """The n-th loopback address from 127.0.0.1 on, skipping each /24's .0 and .255: 127.0.0.254
    is n=254, 127.0.1.1 the next (the bench's first target is n=101)."""
    block, host = divmod(n - 1, 254)
    return f"127.{block >> 8 & 255}.{block & 255}.{host + 1}"


def start_fleet(lab, count: int, first: int = 101, prefix: str = "t") -> List[FleetTarget]:
    """`count` targets on 127.0.0.FIRST.. (on into 127.0.1.x past .254) served by
    ceil(count/16) real sshds; the servers join `lab.servers` (so `lab.close()` stops them and a
    crashed run's are reaped like the lab's)."""
    if first + count - 1 > 254 * 256:
        raise BenchError("too many fleet targets for 127.0.0.0/16")
    version = sshd.openssh_version()
    setenv = {"PATH": lab.path, **lab.session_env}
    targets: List[FleetTarget] = []
    width = max(2, len(str(count)))
    for g, start in enumerate(range(0, count, MAX_LISTEN)):
        addresses = [fleet_address(first + i) for i in range(start, min(count, start + MAX_LISTEN))]
        d = lab.dir / "sshd" / f"fleet{g}"
        d.mkdir(parents=True)
        s = FleetServer(name=f"fleet{g}", address=addresses[0], port=0, dir=d, generous=True)
        s.addresses = addresses
        s.host_key_pub = sshd.keygen(s.host_key, f"mldiag-bench-fleet{g}")
        s.aliases = {"mlsh": s.name}
        s.start_on_a_free_port(lambda: _port_free_on_all(addresses),
                               authorized_keys_dir=lab.dir / "authorized_keys", setenv=setenv,
                               version=version)
        lab.servers[s.name] = s
        lab._write_state()   # NOTE: records the pids, so a killed bench's sshds are reaped too
        for i, a in enumerate(addresses):
            targets.append(FleetTarget(f"{prefix}{start + i + 1:0{width}d}", a, s.port, s))
    return targets


def fleet_files(lab, targets: Sequence[FleetTarget], work: Path) -> Path:
    """known_hosts (hashed, as the lab's) and an ssh_config with a Host block per target that
    also Includes the lab's (for `main` & co). Returns the ssh_config path."""
    known = work / "known_hosts"
    known.write_text("".join(
        f"{sshd.hashed_host(sshd.known_hosts_name(t.address, t.port))} "
        f"{' '.join(t.server.host_key_pub.split()[:2])}\n" for t in targets))
    cfg = work / "ssh_config"
    lines = [f"Include {lab.ssh_config}", ""]
    for t in targets:
        lines += [f"Host {t.alias}", f"  HostName {t.address}", f"  Port {t.port}", "  User mlsh",
                  f"  IdentityFile {lab.identity}", "  IdentitiesOnly yes",
                  f"  UserKnownHostsFile {known}", "  StrictHostKeyChecking yes", "  BatchMode yes", ""]
    cfg.write_text("\n".join(lines))
    return cfg


class ConnectionCounter:
    """Counts 'Connection from' lines (LogLevel VERBOSE) added to sshd logs since the last call."""

    def __init__(self, servers):
        self.servers = list(servers)
        self.offsets = {s.name: self._size(s) for s in self.servers}

    @staticmethod
    def _size(s) -> int:
        try:
            return s.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def take(self) -> int:
        n = 0
        for s in self.servers:
            try:
                with open(s.log_path, "rb") as f:
                    f.seek(self.offsets[s.name])
                    data = f.read()
            except FileNotFoundError:
                continue
            self.offsets[s.name] += len(data)
            n += data.count(b"Connection from ")
        return n
