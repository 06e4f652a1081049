"""stacks --window: the straggler of a slow job, from every rank's share of samples spent waiting
inside a collective (scripts/stacks.py samples them; wait_frames.json says which frames wait).

In a job whose ranks meet in collectives every step, the ranks that are on time wait for the
one that is late: their wait share is high, its own is low. A rank whose share is far below the
median of its peers' is the straggler, named with where it spends the time the others wait:

- at least ``MIN_RANKS`` ranks sampled ``MIN_SAMPLES`` times or more (fewer make no median);
- its peers wait: their median share is at least ``PEERS_WAIT`` (a job whose ranks seldom wait
  has no straggler to find this way, whatever the spread);
- it waits far less: at most ``RATIO`` of that median, and ``GAP`` or more below it;
- and that is not the luck of a short window: a rank that waited as often as its peers would
  show so few waiting samples with probability under ``ALPHA`` (binomial tail). A 1 s window at
  10/s is about 10 samples and a few steps: 0 of 12 against peers at 30 % happens 1.4 % of the
  time, and an equal job sampled in 20 windows of 4 ranks gave exactly that once (CI, stop 38).
Its score is the gap (0-1: the share of the window its peers spent waiting that it did not).
A job whose every rank showed one and the same stack in every sample is hung, not slow: nobody
is named here (the fold names the odd rank of a hung job). All ranks equal: each waits for
whoever is last this step, the shares stay close, nobody is named
(tests/integration/test_stragglers.py: 20 windows of an equal job).
"""

import math
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

from ...core.results import Finding, Result
from .fold import processes_of

MIN_RANKS = 3
MIN_SAMPLES = 5
PEERS_WAIT = 0.3
RATIO = 0.5
GAP = 0.25
ALPHA = 0.001
SPIN_UTIL = 90.0
SPIN_POWER = 0.5
WORK_POWER = 0.65
IDLE_UTIL = 70.0
GPU_MIN_SAMPLES = 2
SLOW_CODES = ("straggler", "straggler-node")      # the findings that make a job slow, not hung
HINT = ("the others wait for this rank every step: look at what it does instead (its busy frame: "
        "data loading, a slower GPU or CPU, a noisy neighbour), then mldiag gpu-status / node-check "
        "on its node")
HINT_NODE = ("the other nodes' GPUs wait for this one's: gpu-perf and node-check on it (a throttling or "
             "slower GPU computes longer), or its data loading when its GPUs starve")


@dataclass(frozen=True)
class RankWindow:
    target: str
    pid: int
    rank: Optional[int]
    samples: int
    wait_share: float
    busy_frame: Optional[str]
    distinct_stacks: int


def windows(results: Sequence[Result]) -> List[RankWindow]:
    """Every sampled process of every target (data.processes[].window), validated: a target's
    data is its own word."""
    out = []
    for result, proc in processes_of(results):
        w = proc.get("window")
        if not isinstance(w, dict):
            continue
        samples, share = w.get("samples"), w.get("wait_share")
        if not (_count(samples) and isinstance(share, (int, float)) and not isinstance(share, bool)
                and 0.0 <= share <= 1.0):
            continue
        pid, rank, frame = proc.get("pid"), proc.get("rank"), w.get("busy_frame")
        out.append(RankWindow(result.target, pid if _count(pid) else 0, rank if _count(rank, 0) else None,
                              samples, float(share), frame[:300] if isinstance(frame, str) else None,
                              w["distinct_stacks"] if _count(w.get("distinct_stacks")) else 0))
    return out


def _count(value: Any, least: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and least <= value < 10 ** 9


def stragglers(ranks: Sequence[RankWindow]) -> List[Dict[str, Any]]:
    """[{rank window, peers' median share, score}] of the ranks named, worst first. Pure."""
    sampled = [r for r in ranks if r.samples >= MIN_SAMPLES]
    if len(sampled) < MIN_RANKS or hung(sampled):
        return []
    named = []
    for r in sampled:
        peers = statistics.median(p.wait_share for p in sampled if p is not r)
        if (peers >= PEERS_WAIT and r.wait_share <= peers * RATIO and peers - r.wait_share >= GAP
                and chance_of_as_few(r.samples, round(r.wait_share * r.samples), peers) < ALPHA):
            named.append({"rank": r, "peers": peers, "score": round(peers - r.wait_share, 3)})
    return sorted(named, key=lambda n: -n["score"])


@dataclass(frozen=True)
class NodeGpus:
    target: str
    gpus: int
    util_pct: float                   # the median GPU's mean over the window
    power_share: float                # the median GPU's mean draw over its limit
    uuids: frozenset


def gpu_nodes(results: Sequence[Result]) -> List[NodeGpus]:
    """Each target's GPUs over the window (data.gpu_window), validated: a target's data is its
    own word. GPUs with fewer than GPU_MIN_SAMPLES queries or a figure missing are left out."""
    out = []
    for result in results:
        gw = result.data.get("gpu_window") if isinstance(result.data, dict) else None
        gpus = gw.get("gpus") if isinstance(gw, dict) else None
        if not isinstance(gpus, list):
            continue
        util, share, uuids = [], [], set()
        for g in gpus[:1024]:
            if not isinstance(g, dict) or not _count(g.get("samples"), GPU_MIN_SAMPLES):
                continue
            u, p, limit = g.get("util_pct"), g.get("power_w"), g.get("power_limit_w")
            if not (_number(u, 0, 100) and _number(p, 0, 1e5) and _number(limit, 1, 1e5)):
                continue
            util.append(float(u))
            share.append(float(p) / float(limit))
            if isinstance(g.get("uuid"), str):
                uuids.add(g["uuid"][:80])
        if util:
            out.append(NodeGpus(result.target, len(util), statistics.median(util),
                                statistics.median(share), frozenset(uuids)))
    return out


def _number(value: Any, low: float, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high


def spinning(n: NodeGpus) -> bool:
    return n.util_pct >= SPIN_UTIL and n.power_share <= SPIN_POWER


def odd_gpu_node(nodes: Sequence[NodeGpus]) -> Optional[Dict[str, Any]]:
    """{node, how ("compute" | "starve"), spinning: [nodes]} for the one node whose GPUs clearly
    do not spin while every other node's do, else None. Pure."""
    seen, distinct = set(), []
    for n in nodes:
        if n.uuids and n.uuids in seen:
            continue
        seen.add(n.uuids)
        distinct.append(n)
    spin = [n for n in distinct if spinning(n)]
    others = [n for n in distinct if not spinning(n)]
    if not spin or len(others) != 1:
        return None
    odd = others[0]
    how = "compute" if odd.power_share >= WORK_POWER else "starve" if odd.util_pct < IDLE_UTIL else None
    return {"node": odd, "how": how, "spinning": spin} if how else None


def chance_of_as_few(samples: int, waiting: int, share: float) -> float:
    """P(at most `waiting` of `samples` wait) for a rank that waits `share` of the time, as its
    peers do (binomial tail). Pure."""
    return sum(math.comb(samples, i) * share ** i * (1 - share) ** (samples - i) for i in range(waiting + 1))


def hung(ranks: Sequence[RankWindow]) -> bool:
    """Every rank stood still: one stack in all of its samples."""
    return bool(ranks) and all(r.distinct_stacks == 1 for r in ranks)


def who(r: RankWindow) -> str:
    return f"rank {r.rank if r.rank is not None else '?'} (pid {r.pid} on {r.target})"


def amend(results: List[Result]) -> None:
    """The straggler finding, on the target of each rank named (the table, --json and --save
    all say it)."""
    ranks = windows(results)
    by_target = {r.target: r for r in results}
    odd = None if hung([r for r in ranks if r.samples >= MIN_SAMPLES]) else odd_gpu_node(gpu_nodes(results))
    if odd is not None:
        n, k = odd["node"], len(odd["spinning"])
        doing = ("compute" if odd["how"] == "compute" else
                 "starve (they wait for their own host: data loading, CPU, storage)")
        result = by_target[n.target]
        result.findings.append(Finding(
            level="fail", code="straggler-node", action="none", hint=HINT_NODE,
            message=(f"{n.target}'s {n.gpus} GPUs {doing}: util {n.util_pct:.0f} %, power "
                     f"{100 * n.power_share:.0f} % of limit (median GPU over the window), while the GPUs "
                     f"of {'the other node' if k == 1 else f'the other {k} nodes'} spin in a collective (util ≥ "
                     f"{SPIN_UTIL:.0f} %, power ≤ {100 * SPIN_POWER:.0f} % of limit): the node they wait for")))
        result.status = "fail" if result.status in ("ok", "warn") else result.status
    for n in stragglers(ranks):
        r = n["rank"]
        result = by_target.get(r.target)
        if result is None:
            continue
        where = f"; its time goes to {r.busy_frame}" if r.busy_frame else ""
        result.findings.append(Finding(
            level="fail", code="straggler", action="none", hint=HINT,
            message=(f"{who(r)} waited in collectives {100 * r.wait_share:.0f} % of {r.samples} samples, "
                     f"its {len(ranks) - 1} peers {100 * n['peers']:.0f} % (median): the one they wait for, "
                     f"score {n['score']:.2f}{where}")))
        result.status = "fail" if result.status in ("ok", "warn") else result.status
