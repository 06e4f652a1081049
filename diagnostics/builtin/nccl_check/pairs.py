"""Which node is slow, from measurements of pairs: the two-pass isolation of Google's
cluster-health-scanner, as a pure plan and verdict (the runs themselves are the engine's).

Pass 1 pairs the nodes (each pair one collective across two nodes, NIC to NIC); a pair below its
threshold is *slow*. Pass 2 pairs each node of a slow pair with a node whose pass-1 pair was not
slow (a known-good partner), in rounds of disjoint pairs. Then:

- a node slow in pass 1 and again with a known-good partner: ``node`` (its own NIC, PCIe or GPU;
  fail, drain);
- a slow pass-1 pair whose nodes are both fine with known-good partners: ``link`` (the path
  between those two: a cable, a switch port; warn, the pair is named);
- a node slow in pass 1 with no known-good partner left to try it against (every pair was
  slow): ``undetermined`` (warn: a fabric-wide problem, or a threshold that does not fit).

An odd node out in pass 1 is paired with the first node (which then runs twice).
"""

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

Pair = Tuple[str, str]


def first_pass(nodes: Sequence[str]) -> List[Pair]:
    """The nodes paired in their order: (n0, n1), (n2, n3), ...; an odd last node with n0."""
    nodes = list(dict.fromkeys(nodes))
    if len(nodes) < 2:
        return []
    pairs = [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes) - 1, 2)]
    if len(nodes) % 2:
        pairs.append((nodes[-1], nodes[0]))
    return pairs


def known_good(pass1: Mapping[Pair, bool]) -> List[str]:
    """The nodes of pass 1 that were never in a slow pair, in their order."""
    slow = suspects(pass1)
    good: List[str] = []
    for pair in pass1:
        for node in pair:
            if node not in slow and node not in good:
                good.append(node)
    return good


def suspects(pass1: Mapping[Pair, bool]) -> List[str]:
    """The nodes of the slow pairs of pass 1, in their order."""
    out: List[str] = []
    for pair, slow in pass1.items():
        if slow:
            out.extend(node for node in pair if node not in out)
    return out


def second_pass(pass1: Mapping[Pair, bool]) -> List[List[Pair]]:
    """Rounds of disjoint pairs, each pairing a suspect with a known-good node (the good nodes
    taken in turn, so that one good node is not the yardstick of every suspect); a suspect with
    no good node to pair with is left out (``verdicts`` calls it undetermined)."""
    good = known_good(pass1)
    if not good:
        return []
    rounds: List[List[Pair]] = []
    for i, suspect in enumerate(suspects(pass1)):
        partner = good[i % len(good)]
        for pairs in rounds:
            if all(suspect not in p and partner not in p for p in pairs):
                pairs.append((suspect, partner))
                break
        else:
            rounds.append([(suspect, partner)])
    return rounds


def verdicts(pass1: Mapping[Pair, bool], pass2: Mapping[Pair, bool]) -> Tuple[Dict[str, str], List[Pair]]:
    """({node: "node" | "undetermined"}, [the pass-1 pairs slow only together: link suspects])."""
    good = set(known_good(pass1))
    slow_again = {node: False for node in suspects(pass1)}
    tried = set()
    for (a, b), slow in pass2.items():
        suspect = a if b in good else b if a in good else None
        if suspect is None:
            continue
        tried.add(suspect)
        slow_again[suspect] = slow_again.get(suspect, False) or bool(slow)
    nodes: Dict[str, str] = {}
    for node, again in slow_again.items():
        if node not in tried:
            nodes[node] = "undetermined"
        elif again:
            nodes[node] = "node"
    links = [pair for pair, slow in pass1.items()
             if slow and all(node in tried and not slow_again[node] for node in pair)]
    return nodes, links


def threshold_of(busbw: Mapping[Pair, float], threshold: Optional[float] = None,
                 pct: float = 80.0) -> Optional[float]:
    """The figure a pair is slow below: ``threshold`` GB/s when one is given, else ``pct`` % of the
    median of the pairs' busbw (None with fewer than 3 pairs: no median worth the name). Pass 2
    is judged against pass 1's figure: its few pairs make no median of their own."""
    if threshold is not None:
        return threshold
    values = sorted(busbw.values())
    if len(values) < 3:
        return None
    mid = len(values) // 2
    median = values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2.0
    return median * pct / 100.0


def slow_pairs(busbw: Mapping[Pair, float], threshold: Optional[float]) -> Dict[Pair, bool]:
    """Each pair slow (below ``threshold``) or not; none is slow without a threshold."""
    return {pair: threshold is not None and value < threshold for pair, value in busbw.items()}
