#!/usr/bin/env python3
"""nccl-check: one node's collective bus bandwidth, measured and judged.

Runs on the target, standard library only at import, Python 3.8+. Two ways to measure, the
first one the node has (``--backend`` picks one):

1. **nccl-tests** (``all_reduce_perf``, ``all_gather_perf``, ``alltoall_perf``; ``--nccl-tests
   PATH`` names the binary or its directory, else on PATH or in a usual build directory):
   ``BINARY -b MIN -e MAX -f 2 -g GPUS -w WARMUP -n ITERS -c 1``, its output read by
   nccl_tests.py (shipped beside this file): the rows, ``#wrong``, the NCCL WARN lines, a
   launch that failed.
2. **torch.distributed**, the same measurement in Python: one process per GPU with NCCL where
   torch sees CUDA GPUs, else ``--ranks`` processes with gloo on the CPU (the same code path,
   which is how the lab tests it for real). Sizes double from ``--min-bytes`` to
   ``--max-bytes``; each size is run ``--warmup`` times, then timed over ``--iters`` runs, and
   a size's time is the slowest rank's (as nccl-tests takes it). algbw = size / time and busbw
   = algbw x nccl-tests' bus factor (all-reduce 2(n-1)/n; all-gather and alltoall (n-1)/n),
   so the figures compare with nccl-tests'. The ranks meet on 127.0.0.1 at a free port; the
   run is bounded by ``--budget``: a rank that never joins or never finishes is killed with
   every other rank, and said.

Judged here: the busbw at the threshold's size (or the largest size measured) against
``--expect-busbw`` (hosts.yaml ``expect: {allreduce_busbw: GBPS}``), else against the GPU's
figure in nccl_thresholds.json (GPU backends only, with as many GPUs as the figure was
measured on). The client judges the fleet: a node far below the median of its peers
(``--fleet-pct``) is a finding too, where no figure is known.

Finding codes (level, action): ``busbw-low`` (fail, drain), ``wrong-values`` (fail, drain:
nccl-tests counted wrong results), ``launch-failed`` (fail, drain: the collective could not be
run; NCCL's WARN lines and the rank's last words quoted), ``rank-timeout`` (fail, drain: a rank
did not finish within the budget), ``not-measured`` (warn, none: neither nccl-tests nor torch
here). With no figure to compare against, ``data.judged`` is null and the fleet judges.

Run by hand: python3 nccl_check.py [--backend torch --ranks 4]   (prints the JSON result)
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import _remote

DIAGNOSTIC = "nccl-check"
OPS = ("all_reduce", "all_gather", "alltoall")
NCCL_TESTS_BINARIES = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
                       "alltoall": "alltoall_perf"}
NCCL_TESTS_DIRS = ["/usr/local/bin", "/opt/nccl-tests/build", "/usr/local/nccl-tests/build",
                   "/opt/nccl_tests/build", "/workspace/nccl-tests/build"]
DEFAULT_BUDGET_S = 90.0
CPU_MAX_BYTES = 64 * 1024 ** 2          # gloo on loopback: ~60 ms an all-reduce at 64 MiB, 2 ranks
GPU_MAX_BYTES = 16 * 1024 ** 3          # the size Azure's figures are measured at
DEFAULT_MIN_BYTES = 1024 ** 2
DEFAULT_CPU_RANKS = 2
STDERR_TAIL = 2000
HINTS = {
    "busbw-low": "a node below its figure: check its NVLinks and NICs (mldiag node-check), GPU "
                 "clocks and PCIe; run again once before draining",
    "wrong-values": "a collective returned wrong values: a GPU, NVLink or NIC corrupts data; "
                    "drain the node and run node-check and dcgmi diag -r 3 on it",
    "launch-failed": "the collective could not run: see NCCL's WARN lines (NCCL_DEBUG=WARN), "
                     "the NCCL and driver versions, and the GPUs visible to the job",
    "rank-timeout": "a rank hung: a GPU, NVLink or NIC that stalls a collective (see the kernel "
                    "log's Xids: mldiag node-check)",
    "not-measured": "install nccl-tests (github.com/NVIDIA/nccl-tests) or run in an environment "
                    "with torch (hosts.yaml python:)",
}
ACTIONS = {"busbw-low": "drain", "wrong-values": "drain", "launch-failed": "drain",
           "rank-timeout": "drain", "not-measured": "none"}
LEVELS = {"busbw-low": "fail", "wrong-values": "fail", "launch-failed": "fail",
          "rank-timeout": "fail", "not-measured": "warn"}


def build_parser():
    import argparse   # only here: through mldiag the client parses argv (bundle.parsed_args)
    p = argparse.ArgumentParser(prog="nccl_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("auto", "nccl-tests", "torch"), default="auto")
    p.add_argument("--op", choices=OPS, default="all_reduce")
    p.add_argument("--nccl-tests", metavar="PATH", help="the nccl-tests binary or its build directory")
    p.add_argument("--ranks", type=int, default=None,
                   help="processes (default: one per GPU; %d with gloo on the CPU)" % DEFAULT_CPU_RANKS)
    p.add_argument("--min-bytes", type=int, default=DEFAULT_MIN_BYTES)
    p.add_argument("--max-bytes", type=int, default=None,
                   help="largest size (default %d on GPUs, %d on the CPU)" % (GPU_MAX_BYTES, CPU_MAX_BYTES))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds for the whole measurement")
    p.add_argument("--expect-busbw", type=float, default=None, help="GB/s a healthy node reaches")
    # a group of nodes (the engine starts one run per node, each told its place): this node's
    # ranks are node_rank*ranks ... +ranks-1 of nodes*ranks, meeting at MASTER (ADDR:PORT)
    p.add_argument("--node-rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--nodes", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--master", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)   # a rank of the torch run
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    return p


# --------------------------------------------------------------------------- the ranks (torch)

def sizes(min_bytes, max_bytes):
    """Doubling sizes from min to max (both kept), each a multiple of 4 bytes (float32)."""
    out, n = [], max(4, min_bytes - min_bytes % 4)
    while n <= max_bytes:
        out.append(n)
        n *= 2
    return out


def worker(args):
    """One rank: join the group at --master (127.0.0.1:PORT on one node), time each size; the
    node's first rank prints the rows (each size's time is the slowest rank's, the same on every
    rank) as one JSON line. Imports torch (the parent never does)."""
    import datetime
    import torch
    import torch.distributed as dist
    rank, world = args.node_rank * args.ranks + args.worker, args.nodes * args.ranks
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", rank % torch.cuda.device_count()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method="tcp://%s" % (args.master or "127.0.0.1:%d" % args.port), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=max(5.0, args.budget)))

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    rows = []
    for size in sizes(args.min_bytes, args.max_bytes):
        count = size // 4
        if args.op == "all_reduce":
            x = torch.ones(count, dtype=torch.float32, device=device)
            call = lambda: dist.all_reduce(x)   # noqa: E731
        elif args.op == "all_gather":
            # nccl-tests' size for all-gather is the gathered buffer: each rank sends size/n
            x = torch.ones(max(1, count // world), dtype=torch.float32, device=device)
            out = [torch.empty_like(x) for _ in range(world)]
            call = lambda: dist.all_gather(out, x)   # noqa: E731
        else:
            x = torch.ones(count - count % world or world, dtype=torch.float32, device=device)
            out = torch.empty_like(x)
            call = lambda: dist.all_to_all_single(out, x)   # noqa: E731
        for _ in range(args.warmup):
            call()
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            call()
        sync()
        took = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64,
                            device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)      # a size takes as long as its slowest rank
        rows.append({"size": size, "count": count, "time_us": took.item() * 1e6})
    if args.worker == 0:
        print(json.dumps({"backend": "torch-" + backend, "torch": torch.__version__,
                          "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                          "rows": rows}))
        sys.stdout.flush()
    dist.destroy_process_group()


def free_port():
    """A port nothing listens on now (the kernel's pick); the ranks bind it a moment later."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def torch_gpus(timeout):
    """(the CUDA GPUs torch sees here, None) or (None, why torch could not say): asked in a
    child, as the ranks will ask it (this process never imports torch). nvidia-smi's list is not
    the answer: a CPU build of torch on a GPU node sees none."""
    import subprocess
    code = "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)"
    try:
        p = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "importing torch took longer than %g s" % timeout
    except OSError as e:
        return None, "%s: %s" % (sys.executable, e.strerror or e)
    out = p.stdout.decode("utf-8", "replace").strip().splitlines()
    if p.returncode == 0 and out and out[-1].isdigit():
        return int(out[-1]), None
    return None, _last_line(p.stderr.decode("utf-8", "replace")) or "exit %s" % p.returncode


def run_torch(args, ranks, max_bytes):
    """Start the ranks (this file, --worker N), wait for them within the budget; (rows doc or
    None, findings). Every rank is killed at the deadline or when one fails."""
    import subprocess
    port = free_port()
    argv = [sys.executable, os.path.abspath(__file__), "--op", args.op, "--ranks", str(ranks),
            "--min-bytes", str(args.min_bytes), "--max-bytes", str(max_bytes), "--warmup", str(args.warmup),
            "--iters", str(args.iters), "--budget", str(args.budget), "--port", str(port),
            "--node-rank", str(args.node_rank), "--nodes", str(args.nodes)]
    if args.master:
        argv += ["--master", args.master]
    env = dict(os.environ)
    if args.nodes == 1:
        # the ranks are all on this node: they meet, and gloo and NCCL bootstrap, on loopback
        # (where the node's name resolves to no address of its own, as in many containers)
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    procs = []
    deadline = time.monotonic() + args.budget
    try:
        for rank in range(ranks):
            procs.append(subprocess.Popen(argv + ["--worker", str(rank)], stdin=subprocess.DEVNULL, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          start_new_session=True))
        outputs, failed, late = _remote.wait_children(procs, deadline)
    finally:
        for p in procs:
            _remote.kill_child(p)
    findings = []
    # what the ranks that failed or hung wrote last (NCCL's WARN lines, a C++ stack): in data
    said = dict((str(r), outputs[r][1][-STDERR_TAIL:]) for r in sorted(set(late) | set(r for r, _ in failed))
                if outputs[r][1].strip())
    if late:
        findings.append(finding("rank-timeout", "rank%s %s did not finish within %g s%s"
                                % ("s" if len(late) > 1 else "", ",".join(str(r) for r in late), args.budget,
                                   _last_words(outputs, late))))
    if failed:
        rank, code = failed[0]
        findings.append(finding("launch-failed", "rank %d exited %s: %s" % (
            rank, code, _said(outputs[rank][1]) or "no message")))
    if findings:
        return {"ranks_said": said} if said else None, findings
    doc = _rank0_doc(outputs[0][0])
    if doc is None:
        return ({"ranks_said": {"0": outputs[0][1][-STDERR_TAIL:]}} if outputs[0][1].strip() else None,
                [finding("launch-failed", "rank 0 wrote no result: %s" % (_said(outputs[0][1]) or "no message"))])
    return doc, []


def _rank0_doc(text):
    for line in reversed(text.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("rows"), list):
            return doc
    return None


SAYS_WHY = ("error", "warn", "exception", "failed", "refused", "timed out", "timeout", "abort", "killed")


def _said(text):
    """The line of a rank's stderr that says why: the first naming an error (a C++ exception's
    stack follows its message), else the last."""
    for line in (text or "").splitlines():
        low = line.lower()
        if line.strip() and any(word in low for word in SAYS_WHY):
            return line.strip()[:300]
    return _last_line(text)


def _last_line(text):
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    return lines[-1][:300] if lines else ""


def _last_words(outputs, ranks):
    said = [(r, _said(outputs[r][1])) for r in ranks if _said(outputs[r][1])]
    return "" if not said else " (rank %d said: %s)" % said[0]


# --------------------------------------------------------------------------- nccl-tests

def find_nccl_tests(op, path=None):
    """The nccl-tests binary for ``op``: ``path`` (the binary, or a directory holding it), else
    on PATH or in a usual build directory; None when there is none."""
    name = NCCL_TESTS_BINARIES[op]
    if path:
        candidate = os.path.join(path, name) if os.path.isdir(path) else path
        return candidate if os.access(candidate, os.X_OK) else None
    return _remote.find_tool(name, NCCL_TESTS_DIRS)


def gpu_names():
    """The GPUs ``nvidia-smi -L`` lists (names), or [] without it."""
    smi = _remote.find_tool("nvidia-smi")
    if not smi:
        return []
    import subprocess
    try:
        out = subprocess.run([smi, "-L"], stdin=subprocess.DEVNULL, capture_output=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    names = []
    for line in out.decode("utf-8", "replace").splitlines():
        if line.startswith("GPU ") and ": " in line:
            names.append(line.split(": ", 1)[1].split(" (UUID", 1)[0].strip())
    return names


def run_nccl_tests(binary, args, gpus, max_bytes, nt):
    """(rows doc or None, findings) from one nccl-tests run over ``gpus`` GPUs."""
    import subprocess
    argv = [binary, "-b", str(args.min_bytes), "-e", str(max_bytes), "-f", "2", "-g", str(gpus),
            "-w", str(args.warmup), "-n", str(args.iters), "-c", "1"]
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=args.budget,
                           start_new_session=True)
    except subprocess.TimeoutExpired:
        return None, [finding("rank-timeout", "`%s` did not finish within %g s" % (" ".join(argv[:1]), args.budget))]
    except OSError as e:
        return None, [finding("launch-failed", "%s could not be started: %s" % (binary, e.strerror or e))]
    text = (p.stdout + b"\n" + p.stderr).decode("utf-8", "replace")
    parsed = nt.parse(text)
    findings = []
    if parsed.get("error") or p.returncode:
        warn = "; ".join(parsed.get("nccl_warn") or [])[:400]
        findings.append(finding("launch-failed", "%s exited %s: %s%s" % (
            os.path.basename(binary), p.returncode, parsed.get("error") or _last_line(text) or "no message",
            (" (NCCL WARN: %s)" % warn) if warn else "")))
    if parsed.get("wrong_total"):
        findings.append(finding("wrong-values", "%s counted %d wrong values" % (
            os.path.basename(binary), parsed["wrong_total"])))
    rows = [{"size": r["size"], "count": r["count"],
             "time_us": min(x["time_us"] for x in (r["oop"], r["ip"]) if x.get("time_us") is not None)}
            for r in parsed.get("rows") or [] if r.get("oop") and r.get("ip")]
    doc = {"backend": "nccl-tests", "binary": binary, "version": parsed.get("version"),
           "avg_busbw": parsed.get("avg_busbw"), "rows": rows} if rows else None
    return doc, findings


# --------------------------------------------------------------------------- judging

def finding(code, message, level=None, action=None):
    f = {"level": level or LEVELS[code], "code": code, "message": message, "action": action or ACTIONS[code]}
    if code in HINTS:
        f["hint"] = HINTS[code]
    return f


def with_bandwidth(rows, op, ranks, nt):
    """Each row with its algbw and busbw, as nccl-tests computes them (nccl_tests.py: GB/s,
    bytes / seconds / 1e9, times the op's bus factor)."""
    factor = nt.bus_factor(op, ranks) or 1.0
    out = []
    for r in rows:
        algbw = nt.algbw(r["size"], r["time_us"] / 1e6)
        out.append(dict(r, algbw=round(algbw, 4), busbw=round(algbw * factor, 4)))
    return out


def busbw_at(rows, size):
    """The busbw at ``size`` or, where it was not measured, at the largest size below it (the
    largest measured when ``size`` is None); (size, busbw) or (None, None) without rows."""
    eligible = [r for r in rows if size is None or r["size"] <= size]
    if not eligible:
        return None, None
    row = max(eligible, key=lambda r: r["size"])
    return row["size"], row["busbw"]


def fmt_bytes(n):
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return "%d %s" % (n // scale, unit)
    return "%d B" % n


def judge(data, expect_busbw=None, threshold=None):
    """Findings about the measured busbw: below ``expect_busbw`` (the node's own figure), else
    below ``threshold`` (the SKU's row: busbw_gbps at size_bytes)."""
    rows = data.get("rows") or []
    if not rows:
        return []
    if expect_busbw is not None:
        size, busbw = busbw_at(rows, None)
        data["judged"] = {"against": "expect", "busbw_gbps": expect_busbw, "size": size, "busbw": busbw}
        if busbw < expect_busbw:
            return [finding("busbw-low", "%s busbw %.1f GB/s at %s, below the %g GB/s this node is expected to reach"
                            % (data["op"].replace("_", "-"), busbw, fmt_bytes(size), expect_busbw))]
        return []
    if threshold is not None:
        size, busbw = busbw_at(rows, threshold["size_bytes"])
        data["judged"] = {"against": "sku", "busbw_gbps": threshold["busbw_gbps"], "size": size,
                          "busbw": busbw, "source": threshold.get("source")}
        if busbw < threshold["busbw_gbps"]:
            return [finding("busbw-low", "%s busbw %.1f GB/s at %s, below %s's %g GB/s%s" % (
                data["op"].replace("_", "-"), busbw, fmt_bytes(size), threshold["sku"], threshold["busbw_gbps"],
                "" if size == threshold["size_bytes"] else " (measured up to %s of its %s)" % (
                    fmt_bytes(size), fmt_bytes(threshold["size_bytes"]))))]
        return []
    data["judged"] = None        # no figure for this node: the client judges it against its peers
    return []


def summarise(data, findings):
    rows = data.get("rows") or []
    bad = [f for f in findings if f["level"] in ("fail", "warn")]
    if not rows:
        return ("not measured: " if bad and bad[0]["code"] == "not-measured" else "") + \
            (bad[0]["message"] if bad else "nothing measured")
    size, busbw = busbw_at(rows, None)
    unit = "GPUs" if data["backend"] != "torch-gloo" else "ranks"
    group = data.get("group")
    if data["ranks"] == 1:
        unit = unit[:-1]
    over = ("%d nodes x %d %s" % (group["nodes"], data["ranks"], unit)) if group else "%d %s" % (data["ranks"], unit)
    head = "%s over %s (%s): busbw %.2f GB/s at %s" % (data["op"].replace("_", "-"), over, data["backend"],
                                                        busbw, fmt_bytes(size))
    return head + ("; " + bad[0]["code"] if bad else "")


# --------------------------------------------------------------------------- run

def run(args):
    here = os.path.dirname(os.path.abspath(__file__))
    nt = _remote.load_companion(here, "nccl_tests.py", "mldiag_nccl_tests")
    names = gpu_names()
    data = {"op": args.op, "backend": None, "ranks": None, "gpus": names, "rows": []}
    if nt is None:          # run by hand from a directory without it
        f = finding("not-measured", "nccl_tests.py is not beside nccl_check.py")
        return {"status": "warn", "summary": "not measured: " + f["message"], "findings": [f], "data": data}
    findings = []
    binary = None
    # nccl-tests across nodes needs MPI to start it: a group is measured with torch
    if args.backend in ("auto", "nccl-tests") and names and args.nodes == 1:
        binary = find_nccl_tests(args.op, args.nccl_tests)
    import importlib.util
    has_torch = importlib.util.find_spec("torch") is not None
    max_bytes = args.max_bytes or (GPU_MAX_BYTES if names else CPU_MAX_BYTES)
    doc = None
    if binary:
        ranks = args.ranks or len(names)
        doc, findings = run_nccl_tests(binary, args, ranks, max_bytes, nt)
        data["backend"] = "nccl-tests"
    elif args.backend in ("auto", "torch") and has_torch:
        cuda, why = torch_gpus(min(30.0, args.budget))
        if cuda is None:
            ranks = None
            findings = [finding("launch-failed", "torch could not be imported here: %s" % why)]
        else:
            ranks = args.ranks or cuda or (DEFAULT_CPU_RANKS if args.nodes == 1 else 1)
            max_bytes = args.max_bytes or (GPU_MAX_BYTES if cuda else CPU_MAX_BYTES)
            doc, findings = run_torch(args, ranks, max_bytes)
        data["backend"] = (doc or {}).get("backend") or ("torch-nccl" if cuda else "torch-gloo")
    else:
        ranks = None
        why = []
        if args.backend != "torch":
            why.append("no %s%s" % (NCCL_TESTS_BINARIES[args.op], "" if names else " (and no GPUs)"))
        if args.backend != "nccl-tests":
            why.append("no torch in %s" % sys.executable)
        findings.append(finding("not-measured", ", ".join(why)))
    data["ranks"] = ranks
    if args.nodes > 1:
        data["group"] = {"node_rank": args.node_rank, "nodes": args.nodes, "master": args.master}
    if doc is not None:
        data.update((k, v) for k, v in doc.items() if k not in ("rows", "backend"))
    if doc is not None and doc.get("rows"):
        data["rows"] = with_bandwidth(doc["rows"], args.op, (ranks or 1) * args.nodes, nt)
        threshold = None
        if names and data["backend"] != "torch-gloo":
            try:
                threshold = nt.threshold_for(names[0], op=args.op, gpus=ranks)
            except (OSError, ValueError) as e:     # nccl_thresholds.json missing or unreadable
                data["thresholds_error"] = "%s: %s" % (type(e).__name__, e)
        # hosts.yaml's figure is one node's all-reduce (expect: {allreduce_busbw: GBPS}); a group's
        # bandwidth is judged by the client against the other groups'
        if args.nodes == 1:
            findings.extend(judge(data, args.expect_busbw if args.op == "all_reduce" else None, threshold))
    status = _remote.worst_status(findings)
    return {"status": status, "summary": summarise(data, findings), "findings": findings, "data": data}


if __name__ == "__main__":
    parsed = build_parser().parse_args()
    if parsed.worker is not None:
        worker(parsed)
        sys.exit(0)
    result = run(parsed)
    print(json.dumps(result, indent=2))
    sys.exit(_remote.exit_code(result))
