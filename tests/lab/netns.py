"""Network namespaces for the jump chain: client (root ns) -> jump ns -> inner ns.

    root ns  --veth-->  jump ns  --veth-->  inner ns
    A.1/30              A.2/30, B.5/30      B.6/30

The root namespace routes only to the first /30 and holds an `unreachable`
route for the second, so a direct connect to the inner host fails at once with
"No route to host" and no packet leaves the machine; the jump namespace does not
forward IP (ip_forward=0), so the inner host is reachable only by a TCP forward
through the jump host's sshd (ProxyJump / direct-tcpip).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import List

from .util import LabError, run

# 10.213.0.0/16: one /24 per session, picked among those not already in use here.


@dataclass
class JumpNet:
    sid: str
    subnet: str          # the /24 this session uses
    ns_jump: str
    ns_inner: str
    veth_root: str       # root end of root<->jump
    veth_jump: str       # jump end of root<->jump
    veth_jump_in: str    # jump end of jump<->inner
    veth_inner: str      # inner end of jump<->inner
    root_addr: str
    jump_addr: str
    jump_inner_addr: str
    inner_addr: str
    inner_net: str       # the /30 of jump<->inner, unreachable from the root ns

    def exec_argv(self, ns: str, argv: List[str]) -> List[str]:
        return ["ip", "netns", "exec", ns] + list(argv)


def _used_24s() -> set:
    out = (run(["ip", "-4", "-o", "addr", "show"]).stdout
           + run(["ip", "-4", "route", "show", "table", "all"], check=False).stdout)
    return {m.group(1) for m in re.finditer(r"(10\.213\.\d+)\.\d+", out)}


def setup(sid: str) -> JumpNet:
    used = _used_24s()
    choices = [n for n in range(1, 255) if f"10.213.{n}" not in used]
    if not choices:
        raise LabError("no free /24 left in 10.213.0.0/16 for the jump namespaces")
    n = random.choice(choices)
    p = f"10.213.{n}"
    net = JumpNet(
        sid=sid, subnet=f"{p}.0/24",
        ns_jump=f"mldiag-{sid}-jump", ns_inner=f"mldiag-{sid}-inner",
        veth_root=f"mlr{sid}", veth_jump=f"mlj{sid}", veth_jump_in=f"mlk{sid}", veth_inner=f"mli{sid}",
        root_addr=f"{p}.1", jump_addr=f"{p}.2", jump_inner_addr=f"{p}.5", inner_addr=f"{p}.6",
        inner_net=f"{p}.4/30",
    )
    try:
        _build(net)
    except Exception:
        teardown(net)
        raise
    return net


def _build(net: JumpNet) -> None:
    J, I = net.ns_jump, net.ns_inner
    # `ip -batch -` runs many commands in one process; one batch per namespace.
    batches = {
        None: [
            f"netns add {J}",
            f"netns add {I}",
            f"link add {net.veth_root} type veth peer name {net.veth_jump} netns {J}",
            f"link add {net.veth_inner} netns {I} type veth peer name {net.veth_jump_in} netns {J}",
            f"addr add {net.root_addr}/30 dev {net.veth_root}",
            f"link set {net.veth_root} up",
            f"route add unreachable {net.inner_net}",
        ],
        J: [
            f"addr add {net.jump_addr}/30 dev {net.veth_jump}",
            f"addr add {net.jump_inner_addr}/30 dev {net.veth_jump_in}",
            "link set lo up",
            f"link set {net.veth_jump} up",
            f"link set {net.veth_jump_in} up",
        ],
        I: [
            f"addr add {net.inner_addr}/30 dev {net.veth_inner}",
            "link set lo up",
            f"link set {net.veth_inner} up",
        ],
    }
    for ns, lines in batches.items():
        run(["ip", *(["-n", ns] if ns else []), "-batch", "-"], input="\n".join(lines) + "\n")
    # NOTE: a new netns starts with forwarding off; say so explicitly, it is the point.
    run(["ip", "netns", "exec", J, "sysctl", "-q", "-w", "net.ipv4.ip_forward=0"])


def teardown(net: JumpNet) -> None:
    """Remove both namespaces (their veths go with them) and the root-ns route. Never raises."""
    run(["ip", "route", "del", "unreachable", net.inner_net], check=False)
    run(["ip", "link", "del", net.veth_root], check=False)
    for ns in (net.ns_inner, net.ns_jump):
        run(["ip", "netns", "del", ns], check=False)


# --------------------------------------------------------------------------- a fleet

@dataclass
class FleetNet:
    """Nodes of a cluster network: each a network namespace whose ``eth0`` is on one bridge in
    the root namespace (the client's side, which holds the bridge's address), so the nodes reach
    one another directly, as a cluster's nodes do, and a link can be slowed one node at a time
    (``tc ... tbf`` on either end of its veth: this kernel has no netem)."""
    sid: str
    subnet: str              # the /24 the fleet uses
    bridge: str
    bridge_addr: str
    nodes: List[str]         # namespace names
    addrs: List[str]         # each node's address, on eth0 inside its namespace
    root_ends: List[str]     # each node's veth end in the root namespace (on the bridge)


FLEET_DEV = "eth0"


def setup_fleet(sid: str, n: int) -> FleetNet:
    used = _used_24s()
    choices = [k for k in range(1, 255) if f"10.213.{k}" not in used]
    if not choices:
        raise LabError("no free /24 left in 10.213.0.0/16 for the fleet namespaces")
    p = f"10.213.{random.choice(choices)}"
    net = FleetNet(sid=sid, subnet=f"{p}.0/24", bridge=f"mlb{sid}", bridge_addr=f"{p}.1",
                   nodes=[f"mldiag-{sid}-f{i + 1}" for i in range(n)],
                   addrs=[f"{p}.{11 + i}" for i in range(n)],
                   root_ends=[f"mlf{sid}{i + 1}" for i in range(n)])
    try:
        root = [f"link add {net.bridge} type bridge", f"addr add {net.bridge_addr}/24 dev {net.bridge}",
                f"link set {net.bridge} up"]
        for ns, end in zip(net.nodes, net.root_ends):
            root += [f"netns add {ns}", f"link add {end} type veth peer name {FLEET_DEV} netns {ns}",
                     f"link set {end} master {net.bridge}", f"link set {end} up"]
        run(["ip", "-batch", "-"], input="\n".join(root) + "\n")
        for ns, addr in zip(net.nodes, net.addrs):
            lines = [f"addr add {addr}/24 dev {FLEET_DEV}", "link set lo up", f"link set {FLEET_DEV} up"]
            run(["ip", "-n", ns, "-batch", "-"], input="\n".join(lines) + "\n")
    except Exception:
        teardown_fleet(net)
        raise
    return net


def slow_link(net: FleetNet, node: int, rate: str = "200mbit") -> None:
    """Node ``node``'s link (both directions) limited to ``rate`` by a token bucket."""
    tbf = ["root", "tbf", "rate", rate, "burst", "64kbit", "latency", "400ms"]
    run(["tc", "qdisc", "replace", "dev", net.root_ends[node], *tbf])
    run(["ip", "netns", "exec", net.nodes[node], "tc", "qdisc", "replace", "dev", FLEET_DEV, *tbf])


def teardown_fleet(net: FleetNet) -> None:
    """Remove the nodes' namespaces (their veths go with them) and the bridge. Never raises."""
    for ns in net.nodes:
        run(["ip", "netns", "del", ns], check=False)
    run(["ip", "link", "del", net.bridge], check=False)


def restore_link(net: FleetNet, node: int) -> None:
    """Node ``node``'s link back to full speed. Never raises."""
    run(["tc", "qdisc", "del", "dev", net.root_ends[node], "root"], check=False)
    run(["ip", "netns", "exec", net.nodes[node], "tc", "qdisc", "del", "dev", FLEET_DEV, "root"], check=False)
