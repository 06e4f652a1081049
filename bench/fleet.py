#!/usr/bin/env python3
"""Fleet bench: mldiag next to OpenSSH and Ansible on 1/8/32 loopback targets and 8 containers.

Whole-process wall time, every reference measured in the same run.

    .venv/bin/python bench/fleet.py [--runs 5] [--sizes 1,8,32] [--quick]    (as root)

Starts the test lab (tests/lab) and, beside it, real sshds serving targets t01..t64 on
127.0.0.101.. (16 ListenAddress per sshd; user mlsh, /bin/sh login shell, the lab's PATH with the
fake nvidia-smi; MaxSessions 100, MaxStartups 200:30:400). Per size N it times, alternating so
machine drift hits every command alike:
  ssh                 N=1: ssh -F CFG t01 python3 - < probe.py; N>1: one `ssh ... &` per target, wait
  ssh-c25519          the same with -o KexAlgorithms=curve25519-sha256
  ansible             ansible -i INV all -m script -a probe.py -f N (its own venv: bench/.venv-ansible)
  mldiag run-script   mldiag run-script probe.py -H t01,...
  mldiag gpu-status   mldiag gpu-status -H t01,...
  ssh-cm              N=1: ssh with ControlMaster auto, ControlPersist (the user's own ssh
                      keeping its connection), next to mldiag run-script/gpu-status held:
                      mldiag with the same ssh_config, so through its connection holder
                      (held rows also at 32 targets and at the --gpu-sizes)
  gpu-2call           (--gpu-sizes, default 1,16) the ssh-c25519 loop running a probe that asks
                      nvidia-smi gpu-status's question by hand in two calls (query-gpu,
                      query-compute-apps), next to mldiag gpu-status on the same targets; at
                      1 target one plain `ssh ... python3 - < gpu_probe.py`, as the ssh row
at --big-sizes (default 256; loopback addresses run on into 127.0.1.x) the ssh-c25519 loop next
to mldiag run-script (at its default --parallel 32; --parallel P), in worker processes (one per core, the default) and in one
process (MLDIAG_WORKERS=1), the tree's summed PSS sampled;
and, for 8 containers on one host (the lab's CT 200 behind `main`, `become: sudo`, `runtime: pct`,
eight entries with the same id), the two mldiag commands next to 8 parallel
`ssh main sudo -n pct exec 200 -- /root/venv/bin/python - < probe.py`, counting the SSH
connections each run opens (the sshd's LogLevel VERBOSE log). At 64 targets it reports the peak
RSS of the mldiag process. Prints one table: medians, minimums, ratios against the references,
the command tree's CPU time, the server side's CPU time (the sshd listeners' reaped children),
the rest of the machine's CPU time meanwhile, and connections per run. A full run takes about
13 minutes on 2 cores; it stops by itself and tears everything down, also on Ctrl-C.

    .venv/bin/python bench/fleet.py --targets 1000     (as root)

is the scale run instead: over 1,000 targets on 63 sshds, --runs times (default 1) after a warm-up
on 64 of them, the ssh-c25519 loop next to `mldiag run-script probe.py -H 't[0001-1000]'` in worker
processes and in one; it prints wall time, the client's CPU, the largest process's peak RSS and
the peak of the whole tree's summed PSS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (CLK_TCK, PROBE, REPO, BenchError, ConnectionCounter, Sample, bytecode_env,  # noqa: E402
                    children_cpu, current_pgid, fleet_files, kill_current, load_avg, machine_busy, process_cpu,
                    start_fleet, timed)
from tests.lab import Lab  # noqa: E402
from tests.lab.util import (LabError, LabUnavailable, all_pids, cmdline, kill_all,  # noqa: E402
                           ppid_of)

ANSIBLE_VENV = Path(__file__).resolve().parent / ".venv-ansible"
CT_VENV_PYTHON = "/root/venv/bin/python"
C25519 = ["-o", "KexAlgorithms=curve25519-sha256"]
REFS = ("ssh", "ssh-c25519", "ansible", "gpu-2call", "ssh-cm")
# DESIGN.md §7 and issue 14: (size, reference) -> the ratio goal for mldiag's rows
# A pair: issue 14's goal and DESIGN.md §7's stricter one (issue 14 calls it the stretch).
GOALS = {("1", "ssh"): 1.2, ("1", "ansible"): 0.4, ("32", "ssh-c25519"): (1.3, 1.1),
         ("32", "ansible"): 0.25, ("16", "gpu-2call"): 1.3, ("256", "ssh-c25519"): 1.3,
         # DESIGN.md §7's one-target gpu-status goal read as the same question asked by a
         # script through raw ssh (the `ssh` row's probe asks nvidia-smi nothing)
         ("1", "gpu-2call"): 1.2}
HELD = "mldiag run-script held"       # through the connection holder (ssh_config ControlPersist)
HELD_GPU = "mldiag gpu-status held"
PERSIST_S = 900    # the held rows' ControlPersist: longer than a round of the bench
ONE_PROCESS = "mldiag run-script 1p"
HELPERS: List["DetachedCpu"] = []   # ended when the bench ends   # the 256 row's mldiag in one process (MLDIAG_WORKERS=1)


def gpu_probe() -> str:
    """gpu-status's question asked by hand: nvidia-smi twice (the GPUs with the same fields
    gpu-status asks a current driver, then the compute processes), one JSON line."""
    sys.path.insert(0, str(REPO / "diagnostics" / "scripts"))
    try:
        import gpu_status
    finally:
        sys.path.pop(0)
    fields = ",".join(f for _, f in gpu_status.newest_fields())
    return f"""#!/usr/bin/python3
import json, shutil, subprocess
smi = shutil.which("nvidia-smi") or "nvidia-smi"
q = subprocess.run([smi, "--query-gpu={fields}", "--format=csv,noheader,nounits"],
                   capture_output=True, text=True)
a = subprocess.run([smi, "--query-compute-apps={gpu_status.APPS_FIELDS}",
                    "--format=csv,noheader,nounits"], capture_output=True, text=True)
print(json.dumps({{"gpus": len(q.stdout.splitlines()), "rc": [q.returncode, a.returncode]}}))
"""


@dataclass
class Case:
    size: str                      # "1", "8", "32", "64", "8 CTs"
    name: str
    argv: List[str]
    stdin: Optional[str] = None
    env: Optional[Dict[str, str]] = None
    prepare: Optional[Callable[[Dict[str, str]], Dict[str, str]]] = None   # per-run env
    after: Optional[Callable[[], float]] = None    # returns CPU seconds to add (detached helpers)
    check: Optional[Callable[[Sample], None]] = None                       # warm-up validation
    tree_rss: bool = False        # sample the summed PSS of the command's process tree
    samples: List[Sample] = field(default_factory=list)
    tree_rss_kb: List[int] = field(default_factory=list)
    server_cpu: List[float] = field(default_factory=list)
    conns: List[int] = field(default_factory=list)
    other_cpu: List[float] = field(default_factory=list)


# ---------------------------------------------------------------------------- ansible

def ensure_ansible() -> Path:
    """bench/.venv-ansible with ansible-core, made on first use (never the project's venv)."""
    ansible = ANSIBLE_VENV / "bin" / "ansible"
    if ansible.exists():
        return ansible
    print(f"creating {ANSIBLE_VENV} with ansible-core (first run only) ...", flush=True)
    base = getattr(sys, "_base_executable", None) or shutil.which("python3")
    try:
        subprocess.run([base, "-m", "venv", str(ANSIBLE_VENV)], check=True)
        subprocess.run([str(ANSIBLE_VENV / "bin" / "pip"), "install", "-q", "ansible-core"], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise BenchError(f"could not install ansible-core into {ANSIBLE_VENV} ({e}); "
                         "fix that or run with --no-ansible")
    return ansible


class AnsibleRuns:
    """Each run gets a fresh ControlPath directory (cold, like the other commands) with
    ansible's default ssh_args kept (-C, ControlMaster=auto, ControlPersist=60s) and `-F CFG`
    added; after a run its persisting masters are ended (outside the timing)."""

    def __init__(self, work: Path, cfg: Path):
        self.root = work / "ansible"
        self.root.mkdir()
        (self.root / "ansible.cfg").write_text("[defaults]\n")
        self.n = 0
        self.env = {
            "ANSIBLE_CONFIG": str(self.root / "ansible.cfg"),   # no ./ansible.cfg or ~/.ansible.cfg
            "ANSIBLE_HOME": str(self.root / "home"),
            "ANSIBLE_LOCAL_TEMP": str(self.root / "tmp"),
            "ANSIBLE_SSH_ARGS": f"-F {cfg} -C -o ControlMaster=auto -o ControlPersist=60s",
            "ANSIBLE_HOST_KEY_CHECKING": "True",                # known_hosts from CFG, as ssh does
            "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
            "ANSIBLE_NOCOLOR": "1", "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_DEPRECATION_WARNINGS": "False", "ANSIBLE_SYSTEM_WARNINGS": "False",
        }
        self.current: Optional[Path] = None

    def prepare(self, env: Dict[str, str]) -> Dict[str, str]:
        self.n += 1
        self.current = self.root / f"cp{self.n}"
        self.current.mkdir()
        return dict(env, ANSIBLE_SSH_CONTROL_PATH_DIR=str(self.current))

    def after(self) -> float:
        """End the ControlPersist masters of the last run (found by their ControlPath); returns
        the CPU time they used (they are detached: os.wait4 of ansible does not count them)."""
        if self.current is None:
            return 0.0
        masters = marked_pids(str(self.current))
        cpu = sum(process_cpu(p) for p in masters)
        kill_all(masters)
        return cpu


def marked_pids(mark: str) -> List[int]:
    """The processes (not this one) whose command line names ``mark`` (a directory of theirs)."""
    me = os.getpid()
    return [p for p in all_pids() if p != me and mark in " ".join(cmdline(p) or [])]


def inventory(work: Path, aliases: List[str], name: str) -> Path:
    p = work / f"inventory-{name}.ini"
    p.write_text("[all]\n" + "".join(f"{a}\n" for a in aliases))
    return p


class DetachedCpu:
    """CPU time of the long-lived helpers a run leaves behind and the next one uses (ssh's
    ControlMaster, mldiag's connection holder): what they used during the run (prepare takes
    the count before, after the difference; os.wait4 of the command does not see them)."""

    def __init__(self, mark: str):
        self.mark = mark
        self.before: Dict[int, float] = {}

    def _helpers(self) -> Dict[int, float]:
        return {p: process_cpu(p) for p in marked_pids(self.mark)}

    def prepare(self, env: Dict[str, str]) -> Dict[str, str]:
        self.before = self._helpers()
        return env

    def after(self) -> float:
        return sum(cpu - self.before.get(p, 0.0) for p, cpu in self._helpers().items())

    def end(self) -> None:
        kill_all(list(self._helpers()))


# ssh's ControlPath and the holder's socket must fit in 107 bytes: short directories of their own
SHORT_DIRS = {"cm": "", "run": ""}


def short_dirs() -> None:
    for name in SHORT_DIRS:
        SHORT_DIRS[name] = tempfile.mkdtemp(prefix=f"mldiag-{name}-", dir="/tmp")


def held_files(work: Path, cfg: Path) -> Path:
    """An ssh_config that keeps connections as a user's might (ControlMaster auto and
    ControlPersist, sockets under work/cm), before the bench's own config."""
    held = work / "ssh_config_cm"
    held.write_text(f"Host *\n  ControlMaster auto\n  ControlPath {SHORT_DIRS['cm']}/%C\n"
                    f"  ControlPersist {PERSIST_S}\n\nInclude {cfg}\n")
    return held


# ---------------------------------------------------------------------------- cases

def ssh_loop(cfg: Path, hosts: List[str], remote: List[str], probe: Path, outdir: Path,
             extra: List[str]) -> List[str]:
    """bash: one `ssh HOST REMOTE < probe > OUTDIR/I &` per host, then wait for each; exit 1 if
    any failed."""
    ssh = shlex.join(["ssh", "-F", str(cfg), *extra])
    lines = ['pids=""']
    for i, h in enumerate(hosts):
        lines.append(f"{ssh} {shlex.quote(h)} {shlex.join(remote)} < {shlex.quote(str(probe))} "
                     f"> {shlex.quote(str(outdir / str(i)))} 2>&1 & pids=\"$pids $!\"")
    lines.append('rc=0; for p in $pids; do wait "$p" || rc=1; done; exit $rc')
    return ["bash", "-c", "\n".join(lines)]


def check_json_files(outdir: Path, hosts: List[str]):
    """Each ssh of the loop printed the probe's JSON line."""
    def check(_sample: Sample) -> None:
        for i, h in enumerate(hosts):
            text = (outdir / str(i)).read_text()
            try:
                json.loads(text.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise BenchError(f"ssh loop: {h} answered {text[-300:]!r}")
    return check


def _check_gpu_text(host: str, text: str) -> None:
    try:
        doc = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        doc = {}
    if doc.get("rc") != [0, 0] or not doc.get("gpus"):
        raise BenchError(f"gpu probe on {host}: nvidia-smi did not answer: {text[-300:]!r}")


def check_gpu_probe(outdir: Path, hosts: List[str]):
    """Each target's probe found nvidia-smi, both calls succeeded and GPUs were listed."""
    def check(_sample: Sample) -> None:
        for i, h in enumerate(hosts):
            _check_gpu_text(h, (outdir / str(i)).read_text())
    return check


def check_gpu_answer(host: str):
    """The same, for one target's probe answering on the command's own stdout."""
    def check(sample: Sample) -> None:
        _check_gpu_text(host, sample.stdout.decode(errors="replace"))
    return check


def check_all_ok(names: List[str]):
    """mldiag's summary line says every target answered ok (e.g. `8 ok`)."""
    def check(sample: Sample) -> None:
        out = sample.stdout.decode(errors="replace")
        if not re.search(rf"(^|\n){len(names)} ok\s*$", out):
            raise BenchError(f"mldiag did not report {len(names)} ok:\n{out[-800:]}")
    return check


def build_cases(args, work: Path, cfg: Path, hosts_file: Path, probe: Path, aliases: List[str],
                ansible: Optional[Path], ansible_runs: Optional[AnsibleRuns], ct_names: List[str],
                slurm_nodes: int = 0):
    bindir = Path(sys.executable).parent
    mldiag = shutil.which("mldiag", path=str(bindir)) or "mldiag"
    # the bench's own memory of the targets' nvidia-smi (the warm-up run fills it, as a user's
    # first run does): the timed gpu-status runs are the common case
    env = bytecode_env(dict(os.environ, MLDIAG_SSH_CONFIG=str(cfg), MLDIAG_HOSTS_FILE=str(hosts_file),
                            MLDIAG_CACHE_DIR=str(work / "cache")), work / "pycache")
    cases: List[Case] = []

    def mldiag_rows(size: str, names: List[str], only_gpu: bool = False):
        hosts = ",".join(names)
        if not only_gpu:
            cases.append(Case(size, "mldiag run-script", [mldiag, "run-script", str(probe), "-H", hosts],
                              env=env, check=check_all_ok(names)))
        cases.append(Case(size, "mldiag gpu-status", [mldiag, "gpu-status", "-H", hosts], env=env,
                          check=check_all_ok(names)))

    # the user's ssh keeping its connections, and mldiag told so by the same ssh_config
    held_cfg = held_files(work, cfg)
    master, holder = DetachedCpu(SHORT_DIRS["cm"]), DetachedCpu(SHORT_DIRS["run"])
    HELPERS.extend((master, holder))
    held_env = dict(env, MLDIAG_SSH_CONFIG=str(held_cfg), XDG_RUNTIME_DIR=SHORT_DIRS["run"])

    def held_rows(size: str, names: List[str], tasks):
        for name, task in tasks:
            cases.append(Case(size, name, [mldiag, *task, "-H", ",".join(names)], env=held_env,
                              prepare=holder.prepare, after=holder.after, check=check_all_ok(names)))

    for n in args.sizes:
        size, names = str(n), aliases[:n]
        outdir = work / "out" / size
        outdir.mkdir(parents=True)
        remote = ["python3", "-"]
        if n == 1:
            for name, extra in (("ssh", []), ("ssh-c25519", C25519)):
                cases.append(Case(size, name, ["ssh", "-F", str(cfg), *extra, names[0], *remote],
                                  stdin=str(probe), env=env))
            cases.append(Case(size, "ssh-cm", ["ssh", "-F", str(held_cfg), names[0], *remote],
                              stdin=str(probe), env=env, prepare=master.prepare, after=master.after))
            held_rows(size, names, ((HELD, ["run-script", str(probe)]), (HELD_GPU, ["gpu-status"])))
        else:
            for name, extra in (("ssh", []), ("ssh-c25519", C25519)):
                cases.append(Case(size, name, ssh_loop(cfg, names, remote, probe, outdir, extra),
                                  env=env, check=check_json_files(outdir, names)))
        if ansible:
            inv = inventory(work, names, size)
            cases.append(Case(size, "ansible", [str(ansible), "-i", str(inv), "all", "-m", "script",
                                                "-a", str(probe), "-f", str(n)],
                              env=dict(env, **ansible_runs.env), prepare=ansible_runs.prepare,
                              after=ansible_runs.after))
        mldiag_rows(size, names)
        if n == 32:      # the most a holder serves (a larger fan-out connects itself)
            held_rows(size, names, ((HELD, ["run-script", str(probe)]),))

    gpu_probe_file = work / "gpu_probe.py"
    gpu_probe_file.write_text(gpu_probe())
    for n in args.gpu_sizes:
        size, names = str(n), aliases[:n]
        outdir = work / "out" / f"gpu{size}"
        outdir.mkdir(parents=True)
        if n == 1:   # one target: raw ssh with the user's own key exchange, as the `ssh` row
            cases.append(Case(size, "gpu-2call", ["ssh", "-F", str(cfg), names[0], "python3", "-"],
                              stdin=str(gpu_probe_file), env=env, check=check_gpu_answer(names[0])))
        else:
            cases.append(Case(size, "gpu-2call", ssh_loop(cfg, names, ["python3", "-"], gpu_probe_file,
                                                          outdir, C25519),
                              env=env, check=check_gpu_probe(outdir, names)))
        if n not in args.sizes:
            mldiag_rows(size, names, only_gpu=True)
        if not any(c.size == size and c.name == HELD_GPU for c in cases):
            held_rows(size, names, ((HELD_GPU, ["gpu-status"]),))

    if ct_names:
        size = f"{len(ct_names)} CTs"
        outdir = work / "out" / "ct"
        outdir.mkdir(parents=True)
        remote = ["sudo", "-n", "pct", "exec", "200", "--", CT_VENV_PYTHON, "-"]
        hosts = ["main"] * len(ct_names)
        for name, extra in (("ssh", []), ("ssh-c25519", C25519)):
            cases.append(Case(size, name, ssh_loop(cfg, hosts, remote, probe, outdir, extra), env=env,
                              check=check_json_files(outdir, hosts)))
        mldiag_rows(size, ct_names)

    if slurm_nodes:
        # the lab's Slurm cluster behind `main` as login node: one srun step on every node
        # (stdin goes to every task) next to mldiag's allocation + one step per node
        size = f"{slurm_nodes} Slurm"
        remote = ["srun", "-N", str(slurm_nodes), "--ntasks-per-node=1", "python3", "-"]
        for name, extra in (("ssh", []), ("ssh-c25519", C25519)):
            cases.append(Case(size, name, ["ssh", "-F", str(cfg), *extra, "main", *remote],
                              stdin=str(probe), env=env))
        rows = [f"cluster-a:n{i + 1}" for i in range(slurm_nodes)]
        cases.append(Case(size, "mldiag run-script", [mldiag, "run-script", str(probe), "-H", "cluster-a"],
                          env=env, check=check_all_ok(rows)))
        cases.append(Case(size, "mldiag gpu-status", [mldiag, "gpu-status", "-H", "cluster-a"], env=env,
                          check=check_all_ok(rows)))

    for n in args.big_sizes:
        size, names = str(n), aliases[:n]
        outdir = work / "out" / f"big{size}"
        outdir.mkdir(parents=True)
        cases.append(Case(size, "ssh-c25519", ssh_loop(cfg, names, ["python3", "-"], probe, outdir, C25519),
                          env=env, check=check_json_files(outdir, names)))
        argv = [mldiag, "run-script", str(probe), "-H", node_set(names)] + \
            (["--parallel", str(args.parallel)] if args.parallel else [])
        cases.append(Case(size, "mldiag run-script", argv, env=env, check=check_all_ok(names), tree_rss=True))
        cases.append(Case(size, ONE_PROCESS, argv, env=dict(env, MLDIAG_WORKERS="1"),
                          check=check_all_ok(names), tree_rss=True))

    if args.rss_targets:
        size = str(args.rss_targets)
        names = aliases[:args.rss_targets]
        if not args.quick:
            outdir = work / "out" / size
            outdir.mkdir(parents=True)
            cases.append(Case(size, "ssh-c25519", ssh_loop(cfg, names, ["python3", "-"], probe,
                                                           outdir, C25519), env=env,
                              check=check_json_files(outdir, names)))
        mldiag_rows(size, names, only_gpu=args.quick)
    return cases


def node_set(names: List[str]) -> str:
    """t001..t256 as `t[001-256]` (one -H argument, as a user writes it)."""
    width = len(names[0]) - 1
    return f"t[{names[0][1:]}-{names[-1][1:]}]" if all(len(n) - 1 == width for n in names) \
        else ",".join(names)


class TreeRss:
    """The peak of the summed memory of the process group of the command `timed` runs (mldiag,
    its worker processes, their `ssh -G` children), sampled every 50 ms from when it starts
    until `close`: PSS, in which a page shared by n processes (a forked worker's copy-on-write
    pages) counts 1/n."""

    def __init__(self):
        self.peak_kb = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
        while current_pgid() is None:        # the command is not started yet
            if self.stop.wait(0.005):
                return
        pgid = current_pgid()
        while not self.stop.wait(0.05):
            total = 0
            for pid in all_pids():
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[2]) == pgid:               # field 5: pgrp
                    total += _pss_kb(pid, int(fields[21]) * page_kb)
            self.peak_kb = max(self.peak_kb, total)

    def close(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak_kb


def _pss_kb(pid: int, rss_kb: int) -> int:
    """The process's PSS from /proc/PID/smaps_rollup (its RSS where that cannot be read)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return rss_kb


def hosts_yaml(aliases: List[str], ct_names: List[str], slurm_nodes: int = 0) -> str:
    lines = ["# written by bench/fleet.py", "hosts:"]
    lines += [f"  {a}: {{}}" for a in aliases]
    if slurm_nodes:
        lines += ["  cluster-a:", "    address: main", f"    slurm: {{nodes: {slurm_nodes}}}"]
    if ct_names:
        lines += ["  pve:", "    address: main", "    become: sudo", "    containers:"]
        lines += [f'      {c}: {{runtime: pct, id: "200", python: {CT_VENV_PYTHON}}}' for c in ct_names]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- running

def sessions(servers) -> set:
    """The servers' open connections: their per-connection sshd processes."""
    listeners = {s.pid for s in servers if s.pid}
    return {p for p in all_pids() if ppid_of(p) in listeners}


def settle(servers, kept: set = frozenset(), timeout: float = 5.0) -> None:
    """Wait until no connection is left on the servers but those in ``kept`` (held ones: ssh's
    ControlMaster, mldiag's holder): a listener adds a connection's CPU time (sshd and all it
    ran) to its own count only when it reaps that connection's sshd."""
    deadline = time.monotonic() + timeout
    while sessions(servers) - kept and time.monotonic() < deadline:
        time.sleep(0.02)


def tree_cpu(roots: set) -> float:
    """CPU seconds of the live processes below ``roots`` (roots included) and of the children
    they reaped: what a held connection's sshd and the commands it ran have used so far."""
    parent = {p: ppid_of(p) for p in all_pids()}
    total = 0
    for pid in parent:
        p = pid
        while p and p not in roots:
            p = parent.get(p)
        if not p:
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15])   # utime stime cutime cstime
    return total / CLK_TCK


def run_case(case: Case, servers, counter: ConnectionCounter, check: bool = False) -> None:
    listeners = [s.pid for s in servers if s.pid]
    env = case.prepare(case.env) if case.prepare else case.env
    counter.take()
    kept = sessions(servers)       # connections held open from before (ControlMaster, holder)
    cpu0 = children_cpu(listeners) + tree_cpu(kept)
    busy0 = machine_busy()
    extra_cpu = 0.0
    tree = TreeRss() if case.tree_rss else None
    try:
        sample = timed(case.argv, case.stdin, env, str(REPO))
    finally:
        if tree is not None:
            case.tree_rss_kb.append(tree.close())
        if case.after:
            extra_cpu = case.after()
    sample.cpu += extra_cpu
    busy = machine_busy() - busy0
    settle(servers, kept)
    if check and case.check:
        case.check(sample)
    case.samples.append(sample)
    case.server_cpu.append(children_cpu(listeners) + tree_cpu(kept) - cpu0)
    case.other_cpu.append(max(0.0, busy - sample.cpu - case.server_cpu[-1]))
    case.conns.append(counter.take())


def med(values):
    return statistics.median(values) if values else float("nan")


SPEED_PROBE = "import paramiko"


def python_speed(env: Dict[str, str]) -> float:
    """Seconds the fastest of three `python -c 'import paramiko'` took: how fast this machine
    runs an import-heavy Python start at this moment. mldiag's client is one and ssh is C, so a
    machine slowed by its neighbours (which the load average of this VM does not show) moves
    the 1-target ratios; taken before the runs and after each round, it shows in the report."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", SPEED_PROBE], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - t)
    return best


def report(cases: List[Case], args, loads: List[float], lab_note: str,
           speeds: Sequence[float] = ()) -> str:
    out = []
    out.append(f"mldiag fleet bench: whole-process wall time, median of {args.runs} runs; "
               f"{os.cpu_count()} CPUs; 1-min load average {loads[0]:.2f} before the bench, "
               f"{min(loads[1:]):.2f}..{max(loads[1:]):.2f} after each round (the bench's own "
               f"processes count there){lab_note}")
    head = (f"{'size':<6} {'command':<22} {'median s':>8} {'min s':>7} {'× ssh':>6} {'× c25519':>8} "
            f"{'× ansible':>9} {'× 2call':>7} {'× cm':>5} {'cli CPU':>7} {'srv CPU':>7} {'oth CPU':>7} {'conns':>5} "
            f"{'RSS MiB':>7}")
    out += [head, "-" * len(head)]
    by_size: Dict[str, Dict[str, Case]] = {}
    for c in cases:
        by_size.setdefault(c.size, {})[c.name] = c
    for size, row in by_size.items():
        refs = {r: med([s.wall for s in row[r].samples]) for r in REFS if r in row}
        for c in row.values():
            walls = [s.wall for s in c.samples]
            m = med(walls)

            def ratio(r):
                if r == "gpu-2call" and "gpu" not in c.name:   # the gpu question's reference
                    return "-"
                return f"{m / refs[r]:.2f}" if r in refs and refs[r] > 0 else "-"
            out.append(f"{size:<6} {c.name:<22} {m:8.3f} {min(walls):7.3f} {ratio('ssh'):>6} "
                       f"{ratio('ssh-c25519'):>8} {ratio('ansible'):>9} {ratio('gpu-2call'):>7} "
                       f"{ratio('ssh-cm'):>5} "
                       f"{med([s.cpu for s in c.samples]):7.2f} {med(c.server_cpu):7.2f} "
                       f"{med(c.other_cpu):7.2f} {int(med(c.conns)):>5} "
                       f"{max(s.maxrss_kb for s in c.samples) / 1024:7.1f}")
    out.append("")
    out.append("CPU columns are seconds, medians. cli: user+sys of the command's process tree "
               "(os.wait4; ansible, ssh-cm, held: + their ControlPersist masters or mldiag's holder); "
               "srv: what the sshd listeners' finished connections used (sshd, shell, sudo/pct, "
               "python), and what held ones used meanwhile; oth: the rest of the "
               "machine meanwhile (other sessions, kernel). conns: SSH connections accepted per "
               "run. RSS: peak of the largest single process of the tree.")
    walls = sum(s.wall for c in cases for s in c.samples)
    others = sum(sum(c.other_cpu) for c in cases)
    if any(HELD in row for row in by_size.values()):
        out.append("held: mldiag through its connection holder (ssh_config ControlPersist, as in "
                   "ssh-cm); × cm: against ssh's own ControlMaster (a C client on a held "
                   "connection: no interpreter to start).")
    out.append(f"Other work used {others / walls:.2f} of the {os.cpu_count()} CPUs on average during "
               f"the timed commands.")
    if speeds:
        out.append(f"Python's speed: `python -c '{SPEED_PROBE}'` (the fastest of 3) took "
                   f"{min(speeds) * 1000:.0f}-{max(speeds) * 1000:.0f} ms before the runs and after "
                   f"each round: the slowest {max(speeds) / min(speeds):.2f}× the fastest.")
    goals = []
    for (size, ref), goal in GOALS.items():
        row = by_size.get(size, {})
        if ref not in row:
            continue
        refm = med([s.wall for s in row[ref].samples])
        # past one target, gpu-status is read against the loop that asks nvidia-smi the same
        # (gpu-2call), not against one whose probe asks it nothing
        names = ("mldiag gpu-status", HELD_GPU) if ref == "gpu-2call" else \
            ("mldiag gpu-status", "mldiag run-script", ONE_PROCESS, HELD, HELD_GPU) if size == "1" \
            else ("mldiag run-script", ONE_PROCESS, HELD)
        goal, stretch = goal if isinstance(goal, tuple) else (goal, None)
        for name in names:
            if name in row:
                r = med([s.wall for s in row[name].samples]) / refm
                verdict = f"goal ≤ {goal}: {'met' if r <= goal else 'not met'}"
                if stretch is not None:
                    verdict += f"; stretch ≤ {stretch}: {'met' if r <= stretch else 'not met'}"
                # the same ratio per round (both commands timed within one round, a minute or
                # less apart): the machine's drift between rounds cancels out of each
                paired = [a.wall / b.wall for a, b in zip(row[name].samples, row[ref].samples)]
                goals.append(f"  {size:>2} target{'s' if size != '1' else ''}  {name:<22} "
                             f"{r:5.2f}× {ref:<10} ({verdict}); per round {med(paired):.2f}× "
                             f"({min(paired):.2f}-{max(paired):.2f})")
    if goals:
        out.append("Goals (issue 14, DESIGN.md §7): the ratio of the medians decides; 'per round' is "
                   "the median (and range) of the ratios of the runs timed in the same round")
        out += goals
    for size, row in by_size.items():
        if size.endswith("CTs"):
            for name in ("mldiag run-script", "mldiag gpu-status"):
                if name in row:
                    counts = row[name].conns
                    out.append(f"{size} on one host, {name}: SSH connections per run {counts} "
                               f"(goal: exactly 1 -> {'met' if set(counts) == {1} else 'NOT met'}); "
                               f"the ssh loop opens {int(med(row['ssh'].conns))}")
    for size, row in by_size.items():
        for name, c in row.items():
            if c.tree_rss_kb:
                out.append(f"{size} targets, {name}: peak memory of the whole tree (mldiag, its "
                           f"workers and their children, PSS summed) {max(c.tree_rss_kb) / 1024:.1f} "
                           f"MiB; largest process RSS "
                           f"{max(s.maxrss_kb for s in c.samples) / 1024:.1f} MiB")
    rss_size = str(args.rss_targets) if args.rss_targets else None
    if rss_size and rss_size in by_size:
        for name in ("mldiag gpu-status", "mldiag run-script"):
            c = by_size[rss_size].get(name)
            if c:
                rss = [s.maxrss_kb / 1024 for s in c.samples]
                out.append(f"peak RSS of the mldiag process at {rss_size} targets, {name}: "
                           f"{max(rss):.1f} MiB (median {med(rss):.1f} MiB over {len(rss)} runs)")
    return "\n".join(out)


def scale_run(args, lab, targets, work: Path) -> int:
    """--targets N: over all N fleet targets, after a warm-up on 64 of them, --runs times each:
    the ssh-c25519 loop (one `ssh &` per target), mldiag run-script (--parallel P) in worker
    processes (the default) and in one process (MLDIAG_WORKERS=1). One line per run: wall,
    client CPU, peak memory (largest process RSS; the tree's summed PSS), server and other CPU,
    connections, and the wall ratio against the loop of the same round."""
    cfg = fleet_files(lab, targets, work)
    probe = work / "probe.py"
    probe.write_text(PROBE)
    aliases = [t.alias for t in targets]
    hosts_file = work / "hosts.yaml"
    hosts_file.write_text(hosts_yaml(aliases, []))
    mldiag = shutil.which("mldiag", path=str(Path(sys.executable).parent)) or "mldiag"
    env = bytecode_env(dict(os.environ, MLDIAG_SSH_CONFIG=str(cfg), MLDIAG_HOSTS_FILE=str(hosts_file),
                            MLDIAG_CACHE_DIR=str(work / "cache")), work / "pycache")
    servers = [s for s in lab.servers.values() if s.name.startswith("fleet")]
    counter = ConnectionCounter(servers)
    parallel = [] if not args.parallel else ["--parallel", str(args.parallel)]
    size = str(len(aliases))
    warm = Case("64", "warm-up", [mldiag, "run-script", str(probe), "-H", node_set(aliases[:64])], env=env,
                check=check_all_ok(aliases[:64]))
    run_case(warm, servers, counter, check=True)
    outdir = work / "out" / "scale"
    outdir.mkdir(parents=True)
    argv = [mldiag, "run-script", str(probe), "-H", node_set(aliases)] + parallel
    loop = work / "ssh_loop.sh"    # 1,000 lines are past one argument's limit for `bash -c`
    loop.write_text(ssh_loop(cfg, aliases, ["python3", "-"], probe, outdir, C25519)[2])
    cases = [Case(size, "ssh-c25519", ["bash", str(loop)], env=env, check=check_json_files(outdir, aliases),
                  tree_rss=True),
             Case(size, "mldiag run-script", argv, env=env, check=check_all_ok(aliases), tree_rss=True),
             Case(size, ONE_PROCESS, argv, env=dict(env, MLDIAG_WORKERS="1"), check=check_all_ok(aliases),
                  tree_rss=True)]
    print(f"{size} targets on {len(servers)} sshds, mldiag {' '.join(parallel) or 'at its default --parallel'}, "
          f"{os.cpu_count()} CPUs; "
          f"load average {load_avg()}", flush=True)
    for r in range(args.runs):
        for case in cases:
            run_case(case, servers, counter, check=True)
            s = case.samples[-1]
            ratio = s.wall / cases[0].samples[-1].wall
            print(f"run {r + 1} {case.name:<20} wall {s.wall:6.2f} s ({ratio:.2f}× the loop), client CPU "
                  f"{s.cpu:5.2f} s, largest process {s.maxrss_kb / 1024:5.1f} MiB RSS, whole tree "
                  f"{case.tree_rss_kb[-1] / 1024:6.1f} MiB PSS; server CPU {case.server_cpu[-1]:.1f} s, "
                  f"other CPU {case.other_cpu[-1]:.1f} s; {case.conns[-1]} connections; load {load_avg()}",
                  flush=True)
    return 0


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--runs", type=int, help="timed runs per command (default 5; --quick: 3)")
    ap.add_argument("--sizes", default=None, help="target counts, comma list (default 1,8,32; --quick: 1,8)")
    ap.add_argument("--gpu-sizes", default="1,16",
                    help="target counts for gpu-status next to a two-call nvidia-smi ssh loop "
                         "(default 1,16; at 1 it is one plain `ssh`)")
    ap.add_argument("--big-sizes", default="256",
                    help="target counts for the worker-process rows (default 256; 0: skip)")
    ap.add_argument("--targets", type=int, default=0,
                    help="the scale run instead of the table: this many targets (e.g. 1000)")
    ap.add_argument("--parallel", type=int, default=0,
                    help="mldiag's --parallel in the --big-sizes rows and the --targets run "
                         "(default: mldiag's own, 32)")
    ap.add_argument("--containers", type=int, default=8, help="containers of one host (0: skip)")
    ap.add_argument("--rss-targets", type=int, default=64, help="targets for the peak-RSS rows (0: skip)")
    ap.add_argument("--no-ansible", action="store_true", help="skip the ansible reference")
    ap.add_argument("--no-slurm", dest="slurm", action="store_false",
                    help="skip the 4-node Slurm rows (the lab's cluster, login node `main`)")
    ap.add_argument("--quick", action="store_true",
                    help="3 runs, sizes 1,8, only gpu-status at the RSS size (2-3 minutes)")
    ap.add_argument("--save", help="write every sample as JSON to this file")
    args = ap.parse_args()
    args.runs = args.runs or (1 if args.targets else 3 if args.quick else 5)
    sizes = args.sizes or ("1,8" if args.quick else "1,8,32")
    args.sizes = sorted({int(s) for s in sizes.split(",") if s.strip()})
    args.gpu_sizes = sorted({int(s) for s in args.gpu_sizes.split(",") if s.strip() and int(s)})
    args.big_sizes = sorted({int(s) for s in args.big_sizes.split(",") if s.strip() and int(s)})
    if args.quick:
        args.big_sizes = []
    if args.runs < 1 or any(n < 1 for n in args.sizes):
        ap.error("--runs and --sizes must be positive")
    return args


def main() -> int:
    args = parse_args()
    if os.geteuid() != 0:
        print("bench/fleet.py needs root (the test lab makes users, sudoers, LXC)", file=sys.stderr)
        return 2

    def on_term(signum, frame):
        raise KeyboardInterrupt
    # NOTE: explicit, also for SIGINT: a shell starts background jobs with SIGINT ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_term)

    t0 = time.monotonic()
    loads = [os.getloadavg()[0]]
    lab = ansible_runs = None
    try:
        ansible = None if args.no_ansible else ensure_ansible()
        lab = Lab.start(strict=False)
        work = Path(tempfile.mkdtemp(prefix="mldiag-fleet-", dir=lab.dir))
        short_dirs()
        count = args.targets or max(args.sizes + args.gpu_sizes + args.big_sizes + [args.rss_targets])
        targets = start_fleet(lab, count)
        aliases = [t.alias for t in targets]
        if args.targets:
            return scale_run(args, lab, targets, work)
        ct_names = []
        if args.containers:
            if "lxc" in lab.unavailable:
                print(f"(no container rows: LXC unavailable: {lab.unavailable['lxc']})", file=sys.stderr)
            else:
                ct_names = [f"ct{i + 1}" for i in range(args.containers)]
        slurm_nodes = 0
        if args.slurm:
            if "slurm" in lab.unavailable:
                print(f"(no Slurm rows: {lab.unavailable['slurm']})", file=sys.stderr)
            else:
                slurm_nodes = len(lab.slurm_nodes)
        cfg = fleet_files(lab, targets, work)
        probe = work / "probe.py"
        probe.write_text(PROBE)
        probe.chmod(0o755)
        hosts_file = work / "hosts.yaml"
        hosts_file.write_text(hosts_yaml(aliases, ct_names, slurm_nodes))
        ansible_runs = AnsibleRuns(work, cfg) if ansible else None
        cases = build_cases(args, work, cfg, hosts_file, probe, aliases, ansible, ansible_runs, ct_names,
                            slurm_nodes)
        servers = [s for s in lab.servers.values() if s.name.startswith("fleet") or s.name == "main"]
        counter = ConnectionCounter(servers)
        print(f"lab up in {lab.startup_s:.1f}s, {len(targets)} fleet targets on "
              f"{sum(1 for s in servers if s.name.startswith('fleet'))} sshds; {len(cases)} commands "
              f"x {args.runs} runs (+1 warm-up); load average {load_avg()}", file=sys.stderr, flush=True)
        for c in cases:                          # warm-up: page cache, first `ssh -G`; checks output
            run_case(c, servers, counter, check=True)
            c.samples.clear(), c.server_cpu.clear(), c.conns.clear(), c.other_cpu.clear()
        speed_env = bytecode_env(dict(os.environ), work / "pycache")
        speeds = [python_speed(speed_env)]
        for r in range(args.runs):
            order = cases[r % len(cases):] + cases[:r % len(cases)]   # rotate: no fixed neighbours
            for c in order:
                run_case(c, servers, counter)
            loads.append(os.getloadavg()[0])
            speeds.append(python_speed(speed_env))
            print(f"run {r + 1}/{args.runs} done ({time.monotonic() - t0:.0f}s, load {load_avg()}, "
                  f"python -c '{SPEED_PROBE}' {speeds[-1] * 1000:.0f} ms)", file=sys.stderr, flush=True)
        print(report(cases, args, loads, f"; lab: {', '.join(lab.unavailable) or 'complete'}"
                                  .replace("; lab: complete", ""), speeds))
        if args.save:
            Path(args.save).write_text(json.dumps([
                {"size": c.size, "command": c.name, "wall": [s.wall for s in c.samples],
                 "cpu": [s.cpu for s in c.samples], "maxrss_kb": [s.maxrss_kb for s in c.samples],
                 "server_cpu": c.server_cpu, "other_cpu": c.other_cpu, "conns": c.conns}
                for c in cases], indent=1))
        return 0
    except KeyboardInterrupt:
        kill_current()
        print("\ninterrupted: cleaning up", file=sys.stderr)
        return 130
    except (BenchError, LabError, LabUnavailable) as e:
        print(f"bench failed: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)    # a second Ctrl-C must not skip the cleanup
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if ansible_runs is not None:
            ansible_runs.after()                        # an interrupted ansible run's masters
        for helper in HELPERS:
            helper.end()                                # ssh's master, mldiag's holder
        for d in SHORT_DIRS.values():
            if d:
                shutil.rmtree(d, ignore_errors=True)
        if lab is not None:
            lab.close()                                 # the fleet sshds are in lab.servers
        print(f"cleaned up ({time.monotonic() - t0:.0f}s in all)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
