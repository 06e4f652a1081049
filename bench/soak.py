"""Soak: many diagnostics over many targets with random faults; nothing may leak.

    sudo .venv/bin/python bench/soak.py [--diagnostics 1000] [--targets 20] [--seed 1]

Starts the test lab (tests/lab: real sshds, a jump host in network namespaces, LXC CT 200 behind
the `pct` stand-in, podman), then runs rounds of ``runner.run_many`` from this process, as the
CLI does (a fresh connection pool per round), each target getting a diagnostic drawn at random:
a healthy one, or one that raises with an empty message, exits with os._exit, segfaults, is
SIGKILLed, floods stdout, prints non-UTF-8, hangs ignoring SIGTERM past its timeout, or leaves a
setsid() grandchild behind. Some targets are broken at the transport level on purpose (a refused
port, a stopped container, a missing interpreter, sudo needing a password) and one target's SSH
session is killed mid-run now and then.

Every diagnostic carries a marker in the argv of a child it starts, so after each round the
process table (the host's /proc sees into the containers) and every temp dir level (the host's
/tmp for the lab users, CT 200's /tmp, the podman container's /tmp) are checked for leftovers.
The driving process's peak RSS, open file descriptors and threads are sampled after each round.

Prints a table per fault: count, classified as expected, median and worst time to report,
leftovers; then the totals and the driver's resource curve. Exit 0 only when every result was
classified as expected and nothing leaked.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
import signal
import statistics
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology  # noqa: E402
from tests.lab import Lab, LabError, LabUnavailable  # noqa: E402
from tests.lab.util import pids_with_marker  # noqa: E402

VENV_PY = "/root/venv/bin/python"
PARSER = 'def build_parser(): p = argparse.ArgumentParser(); p.add_argument("marker"); return p\n'
# A child that carries the marker in its argv: what the leak check looks for.
CHILD = 'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", args.marker]{extra})\n'

# fault → (diagnostic body of run(args), expected (status, layer), job timeout)
FAULTS = {
    "healthy": ("return {'summary': 'fine'}", ("ok", None), 60),
    "empty-message": ("raise KeyError()", ("error", "crashed"), 60),
    "os-exit": ("os._exit(7)", ("error", "crashed"), 60),
    "segfault": ("ctypes.string_at(0)", ("error", "killed"), 60),
    "sigkill": ("os.kill(os.getpid(), signal.SIGKILL)", ("error", "killed"), 60),
    "flood-20mb": ("sys.stdout.write(('z' * 1023 + '\\n') * 20480); return {'summary': 'fine'}",
                   ("ok", None), 60),
    "non-utf8": ("sys.stdout.buffer.write(b'\\xff\\xfe\\x80'); sys.stdout.flush(); "
                 "return {'summary': 'fine'}", ("ok", None), 60),
    "hang-ignoring-sigterm": ("signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)",
                              ("error", "timeout"), 2),
    "setsid-grandchild": ("subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); "
                          "time.sleep(600)', args.marker]); time.sleep(0.3); return {'summary': 'fine'}",
                          ("ok", None), 60),
}
# how often each is drawn (a hang costs its timeout: rarer)
WEIGHTS = {"healthy": 6, "hang-ignoring-sigterm": 1}

# broken targets: name → expected layer (the diagnostic never starts there)
BROKEN = {"refused": "unreachable", "stopped-ct": "container", "nopython-ct": "interpreter",
          "nosudo-box": "become"}


def diagnostic_source(fault: str) -> bytes:
    body, _, _ = FAULTS[fault]
    child = "" if fault in ("healthy", "setsid-grandchild") else "    " + CHILD.format(extra="")
    return ("import argparse, ctypes, os, signal, subprocess, sys, time\n" + PARSER
            + "def run(args):\n" + child + "    " + body + "\n").encode()


def hosts_yaml(lab: Lab, count: int) -> str:
    live = ["main", "main-mlzsh", "defaults", "inner", "jump"]   # hosts (inner through jump)
    # the rest are CTs; the host pve (which holds them) is a target of its own too
    cts = [f"ct{i:02d}" for i in range(count - len(live) - len(BROKEN) - 2)]
    lines = ["defaults: {connect_timeout: 5, timeout: 60}", "hosts:"]
    lines += [f"  {name}: {{}}" for name in live]
    lines += ["  refused: {address: 127.0.0.2, port: 1, user: mlsh}",
              "  nosudo-box: {address: main-nosudo, become: sudo}",
              "  pve:", "    address: main", "    become: sudo", "    containers:",
              "      podbox: {runtime: podman, id: podbox, python: /usr/bin/python3.11}",
              f"      stopped-ct: {{runtime: pct, id: \"201\", python: {VENV_PY}}}",
              "      nopython-ct: {runtime: pct, id: \"200\", python: /root/venv/bin/python9}"]
    lines += [f"      {ct}: {{runtime: pct, id: \"200\", python: {VENV_PY}}}" for ct in cts]
    return "\n".join(lines) + "\n"


def temp_dirs(lab: Lab) -> set:
    found = {f"ct200:{n}" for n in lab.container_tmp(200) if n.startswith("mldiag-")}
    for user in ("mlsh", "mlzsh", "root"):
        found |= {f"host:{n}" for n in lab.host_tmp(user) if n.startswith("mldiag-")}
    if "podman" not in lab.unavailable:
        found |= {f"podbox:{n}" for n in lab.podman_tmp() if n.startswith("mldiag-")}
    return found


def driver_sample() -> dict:
    """After a round: the pool's worker threads end just after run_many returns (it does not
    wait for idle ones), so settle first; then current RSS after a GC, peak RSS, fds, threads."""
    deadline = time.monotonic() + 2
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    gc.collect()
    with open("/proc/self/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return {"rss_mib": rss_kb / 1024,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "fds": len(os.listdir("/proc/self/fd")), "threads": threading.active_count()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--diagnostics", type=int, default=1000)
    ap.add_argument("--targets", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--kill-session-every", type=int, default=10,
                    help="kill main's mlzsh SSH session mid-run every N rounds (0: never)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench/soak.py needs root (the test lab makes users, sudoers, LXC)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    lab = None
    try:
        lab = Lab.start(strict=False)
        os.environ["MLDIAG_SSH_CONFIG"] = str(lab.ssh_config)
        topo = topology.load(str(lab.hosts_yaml(hosts_yaml(lab, args.targets))))
        targets = [t for name, t in topo.targets.items() if name != "local"]
        if "podman" in lab.unavailable:
            targets = [t for t in targets if t.name != "podbox"]
        rounds = -(-args.diagnostics // len(targets))
        print(f"lab up in {lab.startup_s:.1f}s; {len(targets)} targets x {rounds} rounds "
              f"= {rounds * len(targets)} diagnostics", file=sys.stderr, flush=True)
        before_dirs = temp_dirs(lab)
        stats = defaultdict(lambda: {"n": 0, "ok": 0, "times": [], "wrong": []})
        samples, leaks_proc, leaks_dirs = [], [], []
        for rnd in range(rounds):
            run_id = uuid.uuid4().hex[:8]
            prefix = f"mldiag-soak-{run_id}"
            drawn = {t.name: rng.choices(list(FAULTS), [WEIGHTS.get(f, 2) for f in FAULTS])[0]
                     for t in targets}
            cut = args.kill_session_every and rnd % args.kill_session_every == args.kill_session_every - 1
            if cut:
                drawn["main-mlzsh"] = "hang-ignoring-sigterm"

            def job_for(target, drawn=drawn, prefix=prefix):
                fault = drawn[target.name]
                return bundle.Job("soak", "soak.py", diagnostic_source(fault),
                                  argv=(f"{prefix}-{target.name}",), timeout=FAULTS[fault][2])
            started = time.monotonic()
            killer = None
            if cut:   # the session sshd of mlzsh@main dies while its diagnostic runs
                killer = threading.Timer(1.0, lambda: lab.kill_session_sshd("main", user="mlzsh"))
                killer.start()
            arrivals = {}
            results = runner.run_many(targets, job_for, parallel=32,
                                      on_result=lambda r: arrivals.setdefault(r.target, time.monotonic()))
            if killer:
                killer.join()
            for r in results:
                fault = drawn[r.target]
                if r.target in BROKEN:
                    kind, expected = f"[{r.target}]", ("error", BROKEN[r.target])
                elif cut and r.target == "main-mlzsh":
                    kind, expected = "sshd-session-killed", ("error", "unreachable")
                else:
                    kind, expected = fault, FAULTS[fault][1]
                got = (r.status, r.error.layer if r.error else None)
                s = stats[kind]
                s["n"] += 1
                s["times"].append(arrivals[r.target] - started)
                if got == expected:
                    s["ok"] += 1
                else:
                    s["wrong"].append((r.target, got, r.summary[:120]))
            # leftovers: give runtimes that saw their stdin close a moment to finish
            deadline = time.monotonic() + 5
            while pids_with_marker(prefix) and time.monotonic() < deadline:
                time.sleep(0.1)
            left = pids_with_marker(prefix)
            if left:
                leaks_proc.append((rnd, left))
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            dirs = temp_dirs(lab) - before_dirs
            if dirs:
                leaks_dirs.append((rnd, sorted(dirs)))
            samples.append(driver_sample())
            done = (rnd + 1) * len(targets)
            print(f"round {rnd + 1}/{rounds}: {done} diagnostics, {time.monotonic() - t0:.0f}s, "
                  f"rss {samples[-1]['rss_mib']:.1f} MiB, fds {samples[-1]['fds']}", file=sys.stderr,
                  flush=True)
        print(report(stats, samples, leaks_proc, leaks_dirs, time.monotonic() - t0))
        wrong = sum(s["n"] - s["ok"] for s in stats.values())
        return 0 if not wrong and not leaks_proc and not leaks_dirs else 1
    except KeyboardInterrupt:
        print("\ninterrupted: cleaning up", file=sys.stderr)
        return 130
    except (LabError, LabUnavailable) as e:
        print(f"soak failed: {e}", file=sys.stderr)
        return 1
    finally:
        if lab is not None:
            lab.close()


def report(stats, samples, leaks_proc, leaks_dirs, elapsed) -> str:
    lines = ["", "| fault | runs | classified as expected | median / max time to report | leftovers |",
             "|---|---|---|---|---|"]
    for kind in sorted(stats, key=lambda k: (k.startswith("["), k)):
        s = stats[kind]
        lines.append(f"| {kind} | {s['n']} | {s['ok']} | {statistics.median(s['times']):.2f} s / "
                     f"{max(s['times']):.2f} s | none |" if not s["wrong"] else
                     f"| {kind} | {s['n']} | {s['ok']} (wrong: {s['wrong'][:2]}) | "
                     f"{statistics.median(s['times']):.2f} s | - |")
    total = sum(s["n"] for s in stats.values())
    ok = sum(s["ok"] for s in stats.values())
    first, last = samples[: max(1, len(samples) // 10)], samples[-max(1, len(samples) // 10):]
    lines += ["",
              f"{total} diagnostics in {elapsed:.0f} s; classified as expected: {ok}; "
              f"leaked processes: {sum(len(p) for _, p in leaks_proc)}; "
              f"leaked temp dirs: {sum(len(d) for _, d in leaks_dirs)}",
              "driver (first tenth of the rounds → last tenth): RSS "
              f"{max(s['rss_mib'] for s in first):.1f} → {max(s['rss_mib'] for s in last):.1f} MiB "
              f"(peak {max(s['peak_mib'] for s in first):.1f} → {max(s['peak_mib'] for s in last):.1f}); "
              f"open fds {max(s['fds'] for s in first)} → {max(s['fds'] for s in last)}; "
              f"threads {max(s['threads'] for s in first)} → {max(s['threads'] for s in last)}"]
    for rnd, pids in leaks_proc[:5]:
        lines.append(f"  round {rnd}: leaked processes {pids}")
    for rnd, dirs in leaks_dirs[:5]:
        lines.append(f"  round {rnd}: leaked temp dirs {dirs}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
