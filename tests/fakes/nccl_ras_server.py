#!/usr/bin/env python3
"""A fake NCCL RAS server: what one NCCL process's RAS thread answers on its client port,
byte for byte for what a client exchanges, built from NVIDIA/nccl's source (the excerpts it
follows, with their lines and commit, are in nccl_ras_server.SOURCE.md beside this file).

It mirrors ``src/ras/client_support.cc`` (NVIDIA/nccl @ 5067397c, v2.30.7):

- ``rasClientEventLoop``: commands are lines ended by ``\\n`` (a ``\\r`` before it dropped),
  matched without regard to case: ``CLIENT PROTOCOL <n>`` -> ``SERVER PROTOCOL 2``;
  ``TIMEOUT <n>`` -> ``OK`` or ``ERROR: Invalid timeout value <v>``; ``SET FORMAT text|json``
  -> ``OK`` or ``ERROR: Invalid format <f>`` (a job of NCCL before 2.28.7: ``ERROR: Unknown
  command <cmd>``); ``STATUS`` / ``VERBOSE STATUS`` -> the report, then the connection is
  closed; anything else -> ``ERROR: Unknown command <cmd>``; 1024 bytes without a newline ->
  the connection is closed. ``MONITOR`` is not mirrored (answered as unknown).
- ``rasClientRunInit`` and ``rasClientRunComms`` (text): the version lines, the job summary (the
  case of one count of processes per node and GPUs per process), ``Communicators... (T s)``,
  the group table, Errors (INCOMPLETE and DEAD processes, ``#g-c`` INCOMPLETE and ERROR with
  ``rasClientBreakDownErrors``) and Warnings (TIMEOUT, ``#g-c`` MISMATCH: status and
  per-collective operation counts), the outlier rule ``rasCountIsOutlier`` and the sort orders
  (``rasAuxCommsCompareRev``, ``rasValCountsCompareRev``, ``rasAuxCommRanksValueCompare``); the
  report goes out in the same pieces NCCL enqueues. Before 2.28 the time is printed ``%.2f``.
- ``rasDumpCommsToJSON`` and the ``json*`` writers: the JSON report.

A job is a ``Job`` (its processes, communicators, the processes that did not answer, the dead
ones, RAS's leg timeouts); ``SCENARIOS`` names the ones the tests use: ``healthy`` (one
communicator of 8 ranks over 2 nodes), ``missing-rank`` (rank 5's process does not answer),
``rank-behind`` (rank 3 launched 990 AllReduce operations, the others 1000), ``comm-error``,
``legacy`` (healthy, NCCL 2.26.2: no SET FORMAT), and misbehaviours: ``drip`` (every byte alone,
``drip_delay`` s apart), ``flood`` (endless bytes after STATUS), ``close-early`` (closed on the
greeting), ``close-mid`` (half of the report, then closed), ``wrong-greeting`` (an HTTP
server's answer), ``silent`` (accepts, never answers).

In tests: ``port, stop = serve("missing-rank")`` (a thread; ``stop()`` ends it). By hand:
``python3 tests/fakes/nccl_ras_server.py missing-rank --port 28028``, then
``python3 diagnostics/scripts/nccl_ras.py`` or ``echo status | nc localhost 28028``.
"""

import argparse
import socket
import threading
import time

PROTOCOL = 2
OPS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")   # ncclFuncStr
STATUS_STR = ("NOCOMM", "INIT", "RUNNING", "FINALIZE", "ABORT")
ERROR_STR = ("OK", "MISMATCH", "ERROR", "ERROR,MISMATCH", "INCOMPLETE", "INCOMPLETE,MISMATCH",
             "INCOMPLETE,ERROR", "INCOMPLETE,ERROR,MISMATCH")
ACS_NOCOMM, ACS_INIT, ACS_RUNNING, ACS_FINALIZE, ACS_ABORT = 1, 2, 4, 8, 16
ACE_MISMATCH, ACE_ERROR, ACE_INCOMPLETE = 1, 2, 4
IN_PROGRESS = 7
ERROR_TEXT = {1: "Unhandled CUDA error", 2: "System error", 3: "Internal error", 4: "Invalid argument",
              5: "Invalid usage", 6: "Remote process error", 7: "NCCL operation in progress"}
DETAIL_THRESHOLD, OUTLIER_FRACTION, VERBOSE_OUTLIER_FRACTION = 10, 0.25, 0.5


def version_tuple(v):
    return tuple(int(x) for x in v.split(".")[:3])


class Job(object):
    """What the RAS thread knows: ``peers`` (rasPeers, in address order: {host, port, pid,
    cuda_devs, nvml_devs}), ``comms`` (rasCollComms: {hash, host_hash, pid_hash, size, ranks:
    [{rank, peer, cuda_dev, nvml_dev, init_state, async_error, finalize, destroy, abort,
    counts: [5]}], missing: [{rank, peer, cuda_dev, nvml_dev}]}), ``silent`` (peers that sent
    no data: not in coll->peers), ``dead`` (rasDeadPeers), ``leg_timeouts``, ``seconds``."""

    def __init__(self, peers, comms, silent=(), dead=(), leg_timeouts=0, seconds=0.0,
                 version="2.30.7", cuda="12.9", cuda_runtime=12090, cuda_driver=12090,
                 timestamp="2026-06-11 12:00:00"):
        self.peers, self.comms = peers, comms
        self.silent, self.dead = set(silent), set(dead)
        self.leg_timeouts, self.seconds = leg_timeouts, seconds
        self.version, self.cuda = version, cuda
        self.cuda_runtime, self.cuda_driver, self.timestamp = cuda_runtime, cuda_driver, timestamp

    @property
    def has_json(self):
        return version_tuple(self.version) >= (2, 28, 7)

    def responded(self, peer):
        return peer not in self.silent and peer not in self.dead


# --------------------------------------------------------------------------- the scenarios

def eight_ranks(counts=None, silent=(), version="2.30.7", errors=None, leg_timeouts=0, seconds=0.0):
    """8 processes of one GPU each on 2 nodes (10.0.0.1: ranks 0-3, 10.0.0.2: ranks 4-7), one
    communicator of all 8. ``counts``: rank -> the AllReduce count (default 1000); ``silent``:
    ranks whose process does not answer; ``errors``: rank -> (init_state, async_error)."""
    peers = [{"host": "10.0.0.%d" % (1 + r // 4), "port": 40000 + r, "pid": 4001 + r,
              "cuda_devs": [r % 4], "nvml_devs": [r % 4]} for r in range(8)]
    comm = {"hash": 0x9e17999afaa87dbb, "host_hash": 0xb7e7187447156001, "pid_hash": 0xb8242ed28a71381e,
            "size": 8, "ranks": [], "missing": []}
    for r in range(8):
        if r in silent:
            comm["missing"].append({"rank": r, "peer": r, "cuda_dev": r % 4, "nvml_dev": r % 4})
            continue
        init, async_ = (errors or {}).get(r, (0, 0))
        comm["ranks"].append({"rank": r, "peer": r, "cuda_dev": r % 4, "nvml_dev": r % 4, "init_state": init,
                              "async_error": async_, "finalize": False, "destroy": False, "abort": False,
                              "counts": [1, 0, 20, 0, (counts or {}).get(r, 1000)]})
    return Job(peers, [comm], silent=silent, version=version, leg_timeouts=leg_timeouts, seconds=seconds)


SCENARIOS = {
    "healthy": lambda: eight_ranks(),
    "legacy": lambda: eight_ranks(version="2.26.2"),
    "missing-rank": lambda: eight_ranks(silent={5}, leg_timeouts=1, seconds=0.05),
    "rank-behind": lambda: eight_ranks(counts={3: 990}),
    "legacy-rank-behind": lambda: eight_ranks(counts={3: 990}, version="2.26.2"),
    "comm-error": lambda: eight_ranks(errors={6: (0, 6)}),
}
MISBEHAVIOURS = ("drip", "flood", "close-early", "close-mid", "wrong-greeting", "silent")


# --------------------------------------------------------------------------- the text report

def popcount(x):
    return bin(x).count("1")


def high_bit(status):
    """(sizeof(unsigned int)*8 - 1) - COMPILER_CLZ(status): the index into statusStr."""
    return status.bit_length() - 1


def gpu_str(cuda, nvml):
    """rasGpuToString."""
    return "%d" % cuda + (" (NVML %d)" % nvml if cuda != nvml else "")


def gpus_str(cuda_devs, nvml_devs):
    """rasGpuDevsToString."""
    s = ",".join(str(d) for d in sorted(cuda_devs))
    if sorted(cuda_devs) != sorted(nvml_devs):
        s += " (NVML " + ",".join(str(d) for d in sorted(nvml_devs)) + ")"
    return s


def is_outlier(count, verbose, total=-1):
    """rasCountIsOutlier."""
    if count == 1:
        return True
    if verbose:
        return count < total * VERBOSE_OUTLIER_FRACTION if total != -1 else True
    return count <= DETAIL_THRESHOLD and (total == -1 or count <= total * OUTLIER_FRACTION)


def host_key(host):
    return tuple(int(x) for x in host.split("."))


def text_pieces(job, verbose=False):
    """The text report as NCCL enqueues it: a list of messages."""
    pieces = []
    out = ["NCCL version %s compiled with CUDA %s\n" % (job.version, job.cuda),
           "CUDA runtime version %d, driver version %d\n\n" % (job.cuda_runtime, job.cuda_driver)]
    pieces.append("".join(out))
    out = []
    # rasClientRunInit: the job summary (peers in address order; a node: consecutive same host)
    nodes = []
    for i, p in enumerate(job.peers):
        if i == 0 or p["host"] != job.peers[i - 1]["host"]:
            nodes.append([])
        nodes[-1].append(p)
    gpus = [len(p["cuda_devs"]) for p in job.peers]
    per_node = set(len(n) for n in nodes)
    if len(set(gpus)) != 1 or len(per_node) != 1:
        raise NotImplementedError("the fake mirrors the consistent job summary only")
    out.append("Job summary\n===========\n\n")
    out.append("  Nodes  Processes         GPUs  Processes     GPUs\n"
               "(total)   per node  per process    (total)  (total)\n"
               "%7d  %9d  %11d  %9d  %7d\n" % (len(nodes), len(nodes[0]), gpus[0], len(job.peers), sum(gpus)))
    out.append("\nCommunicators...")
    pieces.append("".join(out))
    pieces.extend(comms_pieces(job, verbose))
    return pieces


def aux_comm(job, comm, n_peers_missing):
    """rasClientRunComms' first pass over one communicator."""
    aux = {"comm": comm, "status": 0, "errors": 0, "incomplete": 0}
    if comm["missing"]:
        if n_peers_missing == 0 and not job.dead:
            aux["errors"] |= ACE_MISMATCH
            aux["status"] |= ACS_NOCOMM
        else:
            for m in comm["missing"]:
                if job.responded(m["peer"]):
                    aux["errors"] |= ACE_MISMATCH
                    aux["status"] |= ACS_NOCOMM
                else:
                    aux["errors"] |= ACE_INCOMPLETE
                    aux["incomplete"] += 1
    ranks = sorted(comm["ranks"], key=lambda r: (r["peer"], r["rank"]))
    aux["first_counts"] = list(ranks[0]["counts"]) if ranks else [0] * len(OPS)
    n_nodes, per_node, run, prev = 0, [], 0, None
    for r in ranks:
        host = job.peers[r["peer"]]["host"]
        if prev is None or host != prev:
            if prev is not None:
                per_node.append(run)
            n_nodes, run = n_nodes + 1, 0
        run, prev = run + 1, host
    if ranks:
        per_node.append(run)
    aux["nodes"], aux["per_node_min"], aux["per_node_max"] = n_nodes, min(per_node or [64]), max(per_node or [0])
    for r in ranks:
        aux["status"] |= rank_status(r)
        if r["counts"] != aux["first_counts"]:
            aux["errors"] |= ACE_MISMATCH
        if r["init_state"] not in (0, IN_PROGRESS) or r["async_error"] not in (0, IN_PROGRESS):
            aux["errors"] |= ACE_ERROR
    if popcount(aux["status"]) > 1:
        aux["errors"] |= ACE_MISMATCH
    return aux


def rank_status(r):
    if r["abort"]:
        return ACS_ABORT
    if r["finalize"] or r["destroy"]:
        return ACS_FINALIZE
    return ACS_RUNNING if r["init_state"] == 0 else ACS_INIT


def rank_where(job, r):
    p = job.peers[r["peer"]]
    return "GPU %s managed by process %d on node %s" % (gpu_str(r["cuda_dev"], r["nvml_dev"]), p["pid"], p["host"])


def comms_pieces(job, verbose):
    pieces = []
    out = []
    n_peers_missing = len(job.peers) - len(job.dead) - len([i for i in range(len(job.peers)) if job.responded(i)])
    auxes = [aux_comm(job, c, n_peers_missing) for c in job.comms]
    # rasAuxCommsCompareRev: size, nodes, the status's highest bit, errors (all largest first), nRanks
    auxes.sort(key=lambda a: (-a["comm"]["size"], -a["nodes"], -high_bit(a["status"]), -a["errors"],
                              len(a["comm"]["ranks"])))
    groups = []
    for a in auxes:
        g = groups[-1] if groups else None
        if (g is None or a["comm"]["size"] != g[0]["comm"]["size"] or a["nodes"] != g[0]["nodes"]
                or high_bit(a["status"]) != high_bit(g[0]["status"]) or a["errors"] != g[0]["errors"]):
            groups.append([a])
        else:
            g.append(a)
    fmt = " (%.3fs)\n=============\n\n" if version_tuple(job.version) >= (2, 28) else " (%.2fs)\n=============\n\n"
    out.append(fmt % job.seconds)
    if job.comms:
        out.append("Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n"
                   "    #  in group  per comm  per node  per comm  in group\n")
    else:
        out.append("No communicator data collected!\n")
    for gi, g in enumerate(groups):
        lo, hi = min(a["per_node_min"] for a in g), max(a["per_node_max"] for a in g)
        devs = set((job.peers[r["peer"]]["host"], job.peers[r["peer"]]["pid"], r["nvml_dev"])
                   for a in g for r in a["comm"]["ranks"])
        out.append("%5d  %8d  %8d  %8s  %8d  %8d  %8s  %6s\n" % (
            gi, len(g), g[0]["nodes"], "%d" % lo if lo == hi else "%d-%d" % (lo, hi), g[0]["comm"]["size"],
            len(devs), STATUS_STR[high_bit(g[0]["status"])], ERROR_STR[g[0]["errors"]]))
    pieces.append("".join(out))
    out = ["\nErrors\n======\n\n"]
    if n_peers_missing > 0:
        out.append("INCOMPLETE\n  Missing communicator data from %d job process%s\n" % (
            n_peers_missing, "es" if n_peers_missing > 1 else ""))
        if is_outlier(n_peers_missing, verbose):
            for p in sorted((job.peers[i] for i in job.silent if i not in job.dead),
                            key=lambda p: (host_key(p["host"]), p["pid"])):
                out.append(process_line(p))
        out.append("\n")
    if job.dead:
        out.append("DEAD\n  %d job process%s considered dead (unreachable via the RAS network)\n" % (
            len(job.dead), "es are" if len(job.dead) > 1 else " is"))
        if is_outlier(len(job.dead), verbose):
            for p in sorted((job.peers[i] for i in job.dead), key=lambda p: (host_key(p["host"]), p["pid"])):
                out.append(process_line(p))
        out.append("\n")
    for gi, g in enumerate(groups):
        for ci, a in enumerate(g):
            comm = a["comm"]
            if a["errors"] & ACE_INCOMPLETE:
                out.append("#%d-%d (%016x) INCOMPLETE\n  Missing communicator data from %d rank%s\n" % (
                    gi, ci, comm["hash"], a["incomplete"], "s" if a["incomplete"] > 1 else ""))
                if is_outlier(a["incomplete"], verbose):
                    for m in comm["missing"]:
                        if not job.responded(m["peer"]):
                            p = job.peers[m["peer"]]
                            out.append("  Rank %d -- GPU %s managed by process %d on node %s\n" % (
                                m["rank"], gpu_str(m["cuda_dev"], m["nvml_dev"]), p["pid"], p["host"]))
                out.append("\n")
            if a["errors"] & ACE_ERROR:
                out.append("#%d-%d (%016x) ERROR\n" % (gi, ci, comm["hash"]))
                for key, word, is_async in (("init_state", "Initialization", False), ("async_error", "Asynchronous", True)):
                    errs = [0] * 10
                    for r in comm["ranks"]:
                        errs[r[key]] += 1
                    n = len(comm["ranks"]) - (errs[0] + errs[IN_PROGRESS])
                    if n > 0:
                        out.append("  %s error%s on %d rank%s\n" % (word, "s" if n > 1 else "", n, "s" if n > 1 else ""))
                        out.extend(break_down(job, comm, errs, key, verbose))
                out.append("\n")
    pieces.append("".join(out))
    out = ["Warnings\n========\n\n"]
    if job.leg_timeouts > 0:
        out.append("TIMEOUT\n  Encountered %d communication timeout%s while gathering communicator data\n\n" % (
            job.leg_timeouts, "s" if job.leg_timeouts > 1 else ""))
    for gi, g in enumerate(groups):
        for ci, a in enumerate(g):
            if a["errors"] & ACE_MISMATCH:
                out.extend(mismatch(job, gi, ci, a, verbose))
    pieces.append("".join(out))
    return pieces


def process_line(p):
    return "  Process %d on node %s managing GPU%s %s\n" % (
        p["pid"], p["host"], "s" if len(p["cuda_devs"]) > 1 else "", gpus_str(p["cuda_devs"], p["nvml_devs"]))


def break_down(job, comm, errs, key, verbose):
    """rasClientBreakDownErrors."""
    out = []
    while True:
        best, best_i = 0, 0
        for i in range(1, IN_PROGRESS):
            if best < errs[i]:
                best, best_i = errs[i], i
        if best_i == 0:
            return out
        if best > 1:
            out.append("  %d ranks reported %s\n" % (best, ERROR_TEXT[best_i]))
        if is_outlier(best, verbose):
            for r in comm["ranks"]:
                if r[key] == best_i:
                    if best > 1:
                        out.append("  Rank %d -- %s\n" % (r["rank"], rank_where(job, r)))
                    else:
                        out.append("  Rank %d reported %s -- %s\n" % (r["rank"], ERROR_TEXT[best_i], rank_where(job, r)))
        errs[best_i] = 0


def value_groups(items):
    """[(value, [item, ...])] sorted as rasValCountsCompareRev: the most frequent first, then the
    larger value; items in each as they came (sorted by value, then commRank)."""
    groups = {}
    for value, item in items:
        groups.setdefault(value, []).append(item)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), -kv[0]))


def mismatch(job, gi, ci, a, verbose):
    comm = a["comm"]
    out = ["#%d-%d (%016x) MISMATCH\n" % (gi, ci, comm["hash"])]
    if popcount(a["status"]) > 1:
        out.append("  Communicator ranks have different status\n")
        items = sorted(((high_bit(rank_status(r)), r) for r in comm["ranks"]), key=lambda t: (t[0], t[1]["rank"]))
        nocomm = [m for m in comm["missing"] if job.responded(m["peer"])]
        groups = value_groups(items)
        if nocomm:
            groups.append((0, None))
            groups.sort(key=lambda kv: (-(len(kv[1]) if kv[1] is not None else len(nocomm)), -kv[0]))
        for value, ranks in groups:
            count = len(ranks) if ranks is not None else len(nocomm)
            if count > 1:
                out.append("  %d ranks have status %s\n" % (count, STATUS_STR[value]))
            if is_outlier(count, verbose, comm["size"]):
                for r in (ranks if ranks is not None else nocomm):
                    where = (rank_where(job, r) if ranks is not None else "GPU %s managed by process %d on node %s" % (
                        gpu_str(r["cuda_dev"], r["nvml_dev"]), job.peers[r["peer"]]["pid"], job.peers[r["peer"]]["host"]))
                    if count > 1:
                        out.append("  Rank %d -- %s\n" % (r["rank"], where))
                    else:
                        out.append("  Rank %d has status %s -- %s\n" % (r["rank"], STATUS_STR[value], where))
    for op in range(len(OPS)):
        if all(r["counts"][op] == a["first_counts"][op] for r in comm["ranks"]):
            continue
        out.append("  Communicator ranks have different %s operation counts\n" % OPS[op])
        items = sorted(((r["counts"][op], r) for r in comm["ranks"]), key=lambda t: (t[0], t[1]["rank"]))
        for value, ranks in value_groups(items):
            if len(ranks) > 1:
                if value > 0:
                    out.append("  %d ranks have launched up to operation %d\n" % (len(ranks), value))
                else:
                    out.append("  %d ranks have not launched any operations\n" % len(ranks))
            if is_outlier(len(ranks), verbose, comm["size"]):
                for r in ranks:
                    if len(ranks) > 1:
                        out.append("  Rank %d -- %s\n" % (r["rank"], rank_where(job, r)))
                    elif value > 0:
                        out.append("  Rank %d has launched up to operation %d -- %s\n" % (r["rank"], value, rank_where(job, r)))
                    else:
                        out.append("  Rank %d has not launched any operations -- %s\n" % (r["rank"], rank_where(job, r)))
        out.append("\n")
    return out


# --------------------------------------------------------------------------- the JSON report

def json_report(job):
    """rasDumpCommsToJSON with jsonWriteHeader ... jsonWriteFooter, one string."""
    o = ["{\n", '  "nccl_version": "%s",\n' % job.version, '  "cuda_runtime_version": %d,\n' % job.cuda_runtime,
         '  "cuda_driver_version": %d,\n' % job.cuda_driver, '  "timestamp": "%s",\n' % job.timestamp,
         '  "communicators_count": %d,\n' % len(job.comms), '  "communicators": [\n']
    for ci, c in enumerate(job.comms):
        if ci:
            o.append(",\n")
        o += ["    {\n", '      "hash": "0x%x",\n' % c["hash"],
              '      "secondary_hash": "0x%x:0x%x",\n' % (c["host_hash"], c["pid_hash"]),
              '      "size": %d,\n' % c["size"], '      "ranks_count": %d,\n' % len(c["ranks"]),
              '      "missing_ranks_count": %d,\n' % len(c["missing"]), '      "ranks": [\n']
        for ri, r in enumerate(c["ranks"]):
            o += _rank_head(job, r, ri)
            o += ['            "init_state": %d,\n' % r["init_state"], '            "async_error": %d,\n' % r["async_error"],
                  '            "finalize_called": %s,\n' % _b(r["finalize"]), '            "destroy_flag": %s,\n' % _b(r["destroy"]),
                  '            "abort_flag": %s\n' % _b(r["abort"]), "          },\n", '          "collective_counts": {\n']
            for op in range(len(OPS)):
                o.append('            "%s": %d' % (OPS[op], r["counts"][op]))
                if op < len(OPS) - 1:
                    o.append(",")
                o.append("\n")
            o += ["          }\n", "        }"]
        o += ["\n      ],\n", '      "missing_ranks": [\n']
        for mi, m in enumerate(c["missing"]):
            o += _rank_head(job, m, mi)
            o += ['            "unresponsive": %s,\n' % _b(m["peer"] in job.silent or m["peer"] in job.dead),
                  '            "considered_dead": %s\n' % _b(m["peer"] in job.dead), "          }\n", "        }"]
        o += ["\n      ]\n", "    }"]
    o += ["\n  ],\n", '  "ras": {\n', '    "collection_time_sec": %.3f,\n' % job.seconds,
          '    "timeouts_count": %d\n' % job.leg_timeouts, "  }\n", "}\n"]
    return "".join(o)


def _rank_head(job, r, index):
    """The lines jsonWriteRankData and jsonWriteMissingRank both begin with."""
    p = job.peers[r["peer"]]
    return ([",\n"] if index else []) + [
        "        {\n", '          "rank": %d,\n' % r["rank"], '          "host": "%s",\n' % p["host"],
        '          "pid": %d,\n' % p["pid"], '          "cuda_dev": %d,\n' % r["cuda_dev"],
        '          "nvml_dev": %d,\n' % r["nvml_dev"], '          "status": {\n']


def _b(v):
    return "true" if v else "false"


# --------------------------------------------------------------------------- the server

class _Conn(object):
    def __init__(self, sock, scenario, job, stop, drip_delay, verbose_default=False):
        self.sock, self.scenario, self.job, self.stop = sock, scenario, job, stop
        self.drip_delay = drip_delay
        self.fmt = "text"
        self.buf = b""

    def send(self, data):
        data = data.encode("utf-8") if isinstance(data, str) else data
        if self.scenario == "drip":
            for i in range(len(data)):
                if self.stop.is_set():
                    return
                self.sock.sendall(data[i:i + 1])
                time.sleep(self.drip_delay)
        else:
            self.sock.sendall(data)

    def serve(self):
        self.sock.settimeout(0.2)
        try:
            while not self.stop.is_set():
                try:
                    chunk = self.sock.recv(1024 - len(self.buf) if len(self.buf) < 1024 else 1)
                except socket.timeout:
                    continue
                if not chunk:
                    return
                self.buf += chunk
                while b"\n" in self.buf:
                    line, self.buf = self.buf.split(b"\n", 1)
                    if line.endswith(b"\r"):
                        line = line[:-1]
                    if self.command(line.decode("utf-8", "replace")) is False:
                        return
                if len(self.buf) >= 1024:
                    return          # "RAS excessively long input line; terminating the client socket"
        except OSError:
            return
        finally:
            try:
                self.sock.close()
            except OSError:
                pass

    def command(self, cmd):
        """rasClientEventLoop's dispatch; False: the connection is to be closed."""
        low = cmd.lower()
        if self.scenario == "silent":
            return True
        if low.startswith("client protocol "):
            if self.scenario == "close-early":
                return False
            if self.scenario == "wrong-greeting":
                self.send("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return False
            self.send("SERVER PROTOCOL %d\n" % PROTOCOL)
        elif low.startswith("timeout "):
            v = cmd[len("timeout "):]
            self.send("OK\n" if _strtol_ok(v) else "ERROR: Invalid timeout value %s\n" % v)
        elif low.startswith("set format ") and self.job.has_json:
            f = cmd[len("set format "):]
            if f.lower() in ("text", "json"):
                self.fmt = f.lower()
                self.send("OK\n")
            else:
                self.send("ERROR: Invalid format %s\n" % f)
        elif low in ("status", "verbose status"):
            self.report(low == "verbose status")
            return False
        else:
            self.send("ERROR: Unknown command %s\n" % cmd)
        return True

    def report(self, verbose):
        if self.scenario == "flood":
            blob = b"Rank 0 has launched up to operation 1 -- " + b"x" * 4000 + b"\n"
            while not self.stop.is_set():
                self.sock.sendall(blob)
            return
        if self.fmt == "json":
            pieces = [json_report(self.job)]
        else:
            pieces = text_pieces(self.job, verbose)
        if self.scenario == "close-mid":
            whole = "".join(pieces)
            self.send(whole[:len(whole) // 2])
            return
        for i, piece in enumerate(pieces):
            if i == 2 and self.job.seconds:
                time.sleep(self.job.seconds)        # the RAS collective, between the pieces
            self.send(piece)


def _strtol_ok(v):
    """strtol(v, &end, 10) >= 0 with *end == '\\0' (leading blanks and a sign allowed)."""
    s = v.lstrip(" \t\n\v\f\r")
    if s[:1] in "+-" and s:
        s = s[1:]
    return s.isdigit() and s.isascii() and int(v.strip()) >= 0


def serve(scenario="healthy", port=0, host="127.0.0.1", job=None, drip_delay=0.05):
    """Serve ``scenario`` (a key of SCENARIOS, or one of MISBEHAVIOURS, which answer as
    ``healthy`` where they answer at all) on ``host:port`` in a thread. Returns (port, stop):
    ``stop()`` closes the listener and every connection and waits for the threads."""
    if job is None:
        job = SCENARIOS.get(scenario, SCENARIOS["healthy"])()
    if scenario not in SCENARIOS and scenario not in MISBEHAVIOURS:
        raise ValueError("no scenario %r" % scenario)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(64)
    listener.settimeout(0.1)
    stop_event = threading.Event()
    threads = []

    def accept_loop():
        while not stop_event.is_set():
            try:
                sock, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn = _Conn(sock, scenario, job, stop_event, drip_delay)
            t = threading.Thread(target=conn.serve, name="nccl-ras-fake-conn")
            t.daemon = True
            t.start()
            threads.append(t)

    main = threading.Thread(target=accept_loop, name="nccl-ras-fake")
    main.daemon = True
    main.start()

    def stop():
        stop_event.set()
        main.join(5)
        listener.close()
        for t in threads:
            t.join(5)

    return listener.getsockname()[1], stop


def main():
    p = argparse.ArgumentParser(description="a fake NCCL RAS server (see the module docstring)")
    p.add_argument("scenario", choices=sorted(SCENARIOS) + list(MISBEHAVIOURS))
    p.add_argument("--port", type=int, default=28028)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--print", choices=["text", "verbose", "json"], help="print the report and exit")
    args = p.parse_args()
    job = SCENARIOS.get(args.scenario, SCENARIOS["healthy"])()
    if args.print:
        print(json_report(job) if args.print == "json" else "".join(text_pieces(job, args.print == "verbose")), end="")
        return
    port, stop = serve(args.scenario, args.port, args.host)
    print("serving %s on %s:%d (Ctrl-C ends)" % (args.scenario, args.host, port), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        stop()


if __name__ == "__main__":
    main()
