"""node-check: each node's clock against the machine running mldiag, and the nodes against each
other (NCCL's timeouts and the order of log lines across nodes depend on it).

How it is measured, and how well:

- The client reads its own monotonic clock when it builds a target's job (``stamped``: the
  spec's ``finish`` hook, called by the runner right before the run starts) and its wall clock
  and monotonic clock again when the result is in (the job's ``follow_up``, called by the runner
  right after: ``_stamp``). That gives, on this machine's wall clock, an interval
  ``[sent, received]`` (``sent_s``, ``received_s``) that contains the whole run on the node:
  one wall-clock reading and one monotonic interval, so a step of this machine's clock during
  the run cannot widen or shift it.
- node_check.py reads the node's wall clock ``wall_s`` as its last act, and says how long its run
  was on the node's monotonic clock (``run_s``): that reading was taken at a client time within
  ``[sent + run_s, received]`` (the run cannot have begun before the job was sent).
- So the node's offset (node clock minus this machine's) lies within
  ``[wall - received, wall - sent - run_s]``: ``offset_s`` is the middle, ``bound_s`` half the
  width -- the transport's part of the run (connecting, the bootstrap, the answer's way back),
  not the checks'. No more precision than that is claimed: a finding needs the offset beyond
  the threshold *after* the bound is subtracted.

Findings (check ``host``, their level and action):

==============  =====  =======  =========================================================
code            level  action   when
==============  =====  =======  =========================================================
clock-offset    warn   monitor  ``|offset_s| - bound_s`` over MAX_OFFSET_S against this
                                machine (every node about equally off: it is this
                                machine's clock, which the hint says)
clock-skew      warn   monitor  three or more nodes measured (the baseline's majority:
                                of two, the median names both), and this node's offset
                                from their median offset over MAX_OFFSET_S once both
                                bounds are subtracted
==============  =====  =======  =========================================================

``data.clock_offset`` on each measured result: ``sent_s``, ``received_s`` (this machine's wall
clock, seconds since the epoch), ``offset_s``, ``bound_s``, and over the selected nodes
``nodes_spread_s`` (the largest offset minus the smallest) with ``nodes_spread_bound_s``.
"""

import functools
import math
import statistics
import time
from dataclasses import replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ...core.results import Finding, Result
from .baseline import MIN_MAJORITY_NODES

MAX_OFFSET_S = 1.0
KEY = "clock_offset"


def stamped(job: Any, values: Mapping[str, Any]) -> Any:
    """The node-check job, timed: its ``follow_up`` stamps the result with this machine's
    bracket of the run (the job is built by the runner right before it runs)."""
    return replace(job, follow_up=functools.partial(_stamp, time.monotonic()))


def _stamp(began: float, result: Any, *, now=time.time, monotonic=time.monotonic) -> None:
    """Record ``[sent, received]`` on this machine's wall clock in the result (replacing
    whatever the target put under that key); no second job."""
    received, elapsed = now(), monotonic() - began
    if result.status != "error" and isinstance(result.data, dict):
        result.data[KEY] = {"sent_s": received - elapsed, "received_s": received}
    return None


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def offset_of(data: Any) -> Optional[Tuple[float, float]]:
    """(offset_s, bound_s) of one result's data, or None where it was not measured (no stamp,
    or the node's numbers missing or not numbers: they are the target's, untrusted)."""
    if not isinstance(data, dict):
        return None
    node, client = data.get("clock"), data.get(KEY)
    if not isinstance(node, dict) or not isinstance(client, dict):
        return None
    wall, run_s = _number(node.get("wall_s")), _number(node.get("run_s"))
    sent, received = _number(client.get("sent_s")), _number(client.get("received_s"))
    if wall is None or sent is None or received is None or received < sent:
        return None
    # a run_s longer than the whole bracket is not the node's to claim: the looser bracket then
    if run_s is None or run_s < 0 or run_s > received - sent:
        run_s = 0.0
    low, high = wall - received, wall - sent - run_s
    return (low + high) / 2, (high - low) / 2


def _ahead(offset: float) -> str:
    return "ahead of" if offset > 0 else "behind"


def findings(results: List[Result], limit: float = MAX_OFFSET_S) -> Dict[str, List[Finding]]:
    """{target: [Finding]} for the clocks measured in ``results``; each measured result's
    ``data.clock_offset`` gets its offset, bound and the nodes' spread."""
    measured = {}
    for result in results:
        if result.status == "error":
            continue
        got = offset_of(result.data)
        if got is not None:
            measured[result.target] = got
    out: Dict[str, List[Finding]] = {}
    if not measured:
        return out
    offsets = sorted(measured.values())
    spread = offsets[-1][0] - offsets[0][0]
    spread_bound = offsets[-1][1] + offsets[0][1]
    median = statistics.median(o for o, _ in offsets)
    # the median's own uncertainty: the largest bound among the middle one or two
    middle = offsets[(len(offsets) - 1) // 2: len(offsets) // 2 + 1]
    median_bound = max(b for _, b in middle)
    for result in results:
        if result.target not in measured:
            continue
        offset, bound = measured[result.target]
        result.data[KEY].update({"offset_s": round(offset, 4), "bound_s": round(bound, 4),
                                 "nodes_spread_s": round(spread, 4),
                                 "nodes_spread_bound_s": round(spread_bound, 4)})
        found = []
        if abs(offset) - bound > limit:
            found.append(Finding(
                level="warn", code="clock-offset", action="monitor", check="host",
                message=f"the clock is {abs(offset):.3f} s {_ahead(offset)} this machine's "
                        f"(± {bound:.3f} s, measured by mldiag)",
                hint="NCCL timeouts and the order of log lines across machines depend on it; every "
                     "node off by about the same amount: it is this machine's clock (chronyc "
                     "tracking here)"))
        apart = offset - median
        if len(measured) >= MIN_MAJORITY_NODES and abs(apart) - bound - median_bound > limit:
            found.append(Finding(
                level="warn", code="clock-skew", action="monitor", check="host",
                message=f"the clock is {abs(apart):.3f} s {_ahead(apart)} the median of the "
                        f"{len(measured)} nodes measured (± {bound + median_bound:.3f} s)",
                hint="NCCL timeouts and cross-node log order: see this node's chrony/timesyncd "
                     "(chronyc tracking, timedatectl timesync-status)"))
        if found:
            out[result.target] = found
    return out
