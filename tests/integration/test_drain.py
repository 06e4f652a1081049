"""node-check --drain/--undrain (issue 12 item 9) on the lab's real 4-node Slurm cluster: the
login host `main` over SSH (user mlsh, `become: sudo`), scontrol there through mldiag's own
connection; every state checked with a real `scontrol show node` run here as root. Results are
made by hand (the findings node-check would report), and at the end the real `mldiag node-check`
on node n2 with a saved kernel log; each test leaves every node IDLE."""

import datetime
import json
import re
import shutil
import time
from functools import partial
from pathlib import Path

import pytest

from diagnostics.builtin.node_check import drain
from diagnostics.inventory import topology
from diagnostics.transport.ssh import SshPool
from diagnostics.core.results import Result
from tests import programs
from tests.programs import node_check_finding as finding, node_check_result as result

REPO = Path(__file__).resolve().parents[2]
mldiag = partial(programs.mldiag, timeout=180)

HOSTS = """\
defaults: {connect_timeout: 5, timeout: 60}
hosts:
  cluster-a:
    address: main
    become: sudo
    slurm: {partition: debug, nodes: 4}
  cluster-nosudo:
    address: main
    slurm: {nodes: 4}
  box: {address: main}
"""
NOW = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.timezone.utc)
REASON = "mldiag: xid-79, nvlink-down (node-check by mlsh 2026-12-01T10:00Z)"


@pytest.fixture(scope="module")
def topo(lab):
    lab.need("slurm")
    return topology.load(str(lab.hosts_yaml(HOSTS)))


@pytest.fixture
def cluster(lab):
    """The lab's cluster, every node IDLE before and after the test (other tests share it)."""
    c = lab.slurm

    def all_idle():
        for node, state in c.node_states().items():
            if state != "idle":
                c.cmd("scontrol", "update", f"nodename={node}", "state=resume")
        c.wait_idle(timeout=30)

    all_idle()
    yield c
    all_idle()


def slurm_state(cluster, node):
    """(State, Reason) as the real `scontrol show node -o` says, run here as root."""
    line = cluster.cmd("scontrol", "show", "node", "-o", node, check=True).stdout
    state = re.search(r"\bState=(\S+)", line).group(1)
    reason = re.search(r"\bReason=(.*?) \[[^\]]*@[^\]]*\]\s*$", line)
    return state, reason.group(1) if reason else None


def settled_state(cluster, node, timeout=20.0):
    """slurm_state once Slurm has pinged a resumed node: a RESUME marks it NOT_RESPONDING until
    its slurmd answers (slurmctld pings it at once)."""
    end = time.monotonic() + timeout
    while True:
        state = slurm_state(cluster, node)
        if "NOT_RESPONDING" not in state[0] or time.monotonic() > end:
            return state
        time.sleep(0.2)


def check(topo, names, results, **flags):
    steps = drain.plan(results, topo.select(names), now=NOW)
    pool = SshPool()
    try:
        outcomes = drain.run(steps, pool=pool, **flags)
        assert pool.opened == 1          # one connection to the login host for all its calls
        return outcomes
    finally:
        pool.close()


FAILING_N2 = [result("cluster-a:n1"), result("cluster-a:n2", "fail", finding("xid-79", "rma"),
                                             finding("nvlink-down", "drain")),
              result("cluster-a:n3", "fail", finding("xid-48", "reset-gpu")),
              result("cluster-a:n4"), result("box")]


def test_a_failing_node_is_drained_with_the_tagged_reason(topo, cluster):
    outcomes = check(topo, ["cluster-a", "box"], FAILING_N2, drain=True)
    assert slurm_state(cluster, "n2") == ("IDLE+DRAIN", REASON)
    for node in ("n1", "n3", "n4"):
        assert slurm_state(cluster, node) == ("IDLE", None)
    assert drain.lines(outcomes) == [
        f'cluster-a:n2: drained (now State=IDLE+DRAIN): sudo -n -- scontrol update nodename=n2 '
        f'state=drain reason="{REASON}"',
        "not a Slurm node: skipped: box"]
    assert not drain.failed(outcomes)
    # a second run finds it drained by mldiag: nothing more to do
    again = check(topo, ["cluster-a"], FAILING_N2[:4], drain=True)
    assert drain.commands(again) == []
    assert drain.lines(again) == [
        "Slurm: nothing to drain or resume",
        f"cluster-a:n2: already drained by mldiag (State=IDLE+DRAIN, Reason={REASON})"]


def test_a_node_drained_by_someone_else_is_left_alone(topo, cluster):
    cluster.cmd("scontrol", "update", "nodename=n2", "state=drain", "reason=bad fan, ticket 42",
                check=True)
    before = slurm_state(cluster, "n2")
    outcomes = check(topo, ["cluster-a"], FAILING_N2[:4], drain=True, undrain=True)
    assert slurm_state(cluster, "n2") == before == ("IDLE+DRAIN", "bad fan, ticket 42")
    assert drain.commands(outcomes) == []
    assert ("cluster-a:n2: left alone: drained by someone else (State=IDLE+DRAIN, "
            "Reason=bad fan, ticket 42)") in drain.lines(outcomes)
    # now passing: --undrain still leaves someone else's drain alone
    passing = [result(f"cluster-a:n{i}") for i in range(1, 5)]
    check(topo, ["cluster-a"], passing, undrain=True)
    assert slurm_state(cluster, "n2") == before


def test_undrain_resumes_only_the_nodes_mldiag_drained_and_that_pass_now(topo, cluster):
    check(topo, ["cluster-a"], FAILING_N2[:4], drain=True)                  # ours: n2
    cluster.cmd("scontrol", "update", "nodename=n4", "state=drain", "reason=maintenance",
                check=True)                                                  # theirs: n4
    cluster.cmd("scontrol", "update", "nodename=n3", "state=drain",
                "reason=mldiag: xid-48 (node-check 2026-11-30T09:00Z)", check=True)  # ours: n3
    # n3 still fails (reset-gpu, below drain): it stays drained; n2 passes now
    now = [result("cluster-a:n1"), result("cluster-a:n2"),
           result("cluster-a:n3", "fail", finding("xid-48", "reset-gpu")), result("cluster-a:n4")]
    outcomes = check(topo, ["cluster-a"], now, undrain=True)
    assert settled_state(cluster, "n2") == ("IDLE", None)
    assert slurm_state(cluster, "n3") == ("IDLE+DRAIN", "mldiag: xid-48 (node-check 2026-11-30T09:00Z)")
    assert slurm_state(cluster, "n4") == ("IDLE+DRAIN", "maintenance")
    assert drain.commands(outcomes) == ["sudo -n -- scontrol update nodename=n2 state=resume"]
    # right after a RESUME Slurm says IDLE+NOT_RESPONDING until the node answers its ping
    assert re.fullmatch(r"cluster-a:n2: resumed \(now State=IDLE(\+NOT_RESPONDING)?\): "
                        r"sudo -n -- scontrol update nodename=n2 state=resume", drain.lines(outcomes)[0])
    assert drain.lines(outcomes)[1:] == [
        "cluster-a:n3: stays drained: still failing (worst action reset-gpu) (State=IDLE+DRAIN, "
        "Reason=mldiag: xid-48 (node-check 2026-11-30T09:00Z))",
        "cluster-a:n4: left alone: drained by someone else (State=IDLE+DRAIN, Reason=maintenance)"]


def test_a_dry_run_prints_the_exact_commands_and_changes_nothing(lab, topo, cluster):
    cluster.cmd("scontrol", "update", "nodename=n4", "state=drain",
                "reason=mldiag: xid-79 (node-check 2026-11-30T09:00Z)", check=True)   # ours, passes now
    before = {n: slurm_state(cluster, n) for n in cluster.nodes}
    outcomes = check(topo, ["cluster-a", "box"], FAILING_N2)
    assert {n: slurm_state(cluster, n) for n in cluster.nodes} == before
    assert drain.lines(outcomes) == [
        f'cluster-a:n2: --drain would run: sudo -n -- scontrol update nodename=n2 state=drain '
        f'reason="{REASON}"',
        "cluster-a:n4: --undrain would run: sudo -n -- scontrol update nodename=n4 state=resume",
        "not a Slurm node: skipped: box"]
    # the printed commands are exact: pasted into a shell on the login host, they do it
    for command in drain.commands(outcomes):
        proc = lab.ssh("main", command)
        assert proc.returncode == 0, proc.stderr
    assert slurm_state(cluster, "n2") == ("IDLE+DRAIN", REASON)
    assert settled_state(cluster, "n4") == ("IDLE", None)


def test_without_slurm_rights_the_update_fails_visibly_and_nothing_changes(topo, cluster):
    results = [result("cluster-nosudo:n1", "fail", finding("xid-79", "drain"))]
    outcomes = check(topo, ["cluster-nosudo"], results, drain=True)
    assert slurm_state(cluster, "n1") == ("IDLE", None)
    [o] = outcomes
    assert o.status == "failed" and drain.failed(outcomes)
    assert o.message.startswith("scontrol failed (exit 1: "), o.message
    assert o.command == ('scontrol update nodename=n1 state=drain '
                         'reason="mldiag: xid-79 (node-check by mlsh 2026-12-01T10:00Z)"')


# ------------------------------------------------------------ hostile text, whose drain (issue 29 §4)

HOSTILE = ['xid-79"\nupdate nodename=n3 state=drain reason="mldiag: forged',
           "nodename=n4 state=drain", 'reason="mldiag: x" ; scontrol update nodename=n1',
           "'; reboot; '", "`id`$(id)\\", "x\rnodename=n1 reason=mldiag:\u2028"]


def test_a_targets_text_cannot_change_which_node_is_drained_nor_forge_the_tag(topo, cluster):
    """n2's result (a document as a target sends it) carries codes and messages made to look
    like scontrol's syntax and mldiag's tag: n2 alone is drained, with a Reason of mldiag's own
    form that names the login user; no other node changes."""
    doc = {"diagnostic": "node-check", "target": "cluster-a:n2", "status": "fail", "summary": "",
           "findings": [{"level": "fail", "code": code, "message": code + " " + code[::-1],
                         "action": "drain"} for code in HOSTILE]}
    results = [result("cluster-a:n1"), Result.from_dict(doc), result("cluster-a:n3"),
               result("cluster-a:n4")]
    outcomes = check(topo, ["cluster-a"], results, drain=True)
    assert [o.status for o in outcomes] == ["nothing", "ran", "nothing", "nothing"]
    state, why = slurm_state(cluster, "n2")
    assert state == "IDLE+DRAIN"
    assert re.fullmatch(r"mldiag: [A-Za-z0-9_.-]+(, [A-Za-z0-9_.-]+)*(, \+\d+ more)? "
                        r"\(node-check by mlsh 2026-12-01T10:00Z\)", why), why
    assert len(why) <= drain.REASON_MAX
    for node in ("n1", "n3", "n4"):
        assert slurm_state(cluster, node) == ("IDLE", None)


def test_whose_drain_it_is_another_users_tagged_drain_is_left_alone(topo, cluster):
    """Drains that use mldiag's tag but are not this run's: another user's (`by alice`) is
    left alone by --undrain, ours (`by mlsh`, set by root as our `sudo -n -- scontrol` is)
    is resumed. Through the target without sudo (scontrol as mlsh), the same Reasons set by
    root are not ours either: Slurm's own record says who set them."""
    theirs = "mldiag: xid-79 (node-check by alice 2026-11-30T09:00Z)"
    ours = "mldiag: xid-79 (node-check by mlsh 2026-11-30T09:00Z)"
    old = "mldiag: xid-79 (node-check 2026-11-30T09:00Z)"
    for node, reason in (("n2", theirs), ("n3", ours), ("n4", old)):
        cluster.cmd("scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}",
                    check=True)
    passing = [result(f"cluster-a:n{i}") for i in range(1, 5)]
    dry = check(topo, ["cluster-nosudo"], [result(f"cluster-nosudo:n{i}") for i in range(1, 5)])
    assert drain.commands(dry) == []
    assert [o.message for o in dry if o.status == "left-alone"] == [
        f"left alone: drained by someone else, set by root (State=IDLE+DRAIN, Reason={reason})"
        for reason in (theirs, ours, old)]
    outcomes = check(topo, ["cluster-a"], passing, undrain=True)
    assert drain.commands(outcomes) == ["sudo -n -- scontrol update nodename=n3 state=resume",
                                        "sudo -n -- scontrol update nodename=n4 state=resume"]
    assert slurm_state(cluster, "n2") == ("IDLE+DRAIN", theirs)
    assert settled_state(cluster, "n3") == ("IDLE", None)
    assert settled_state(cluster, "n4") == ("IDLE", None)
    assert ("cluster-a:n2: left alone: drained by someone else, set by root (State=IDLE+DRAIN, "
            f"Reason={theirs})") in drain.lines(outcomes)


# ------------------------------------------------------------ through the task: mldiag node-check
# The real node-check on node n2 of the cluster, its kernel log a saved one (tests/fixtures/xid):
# Xid 48 with Xid 63 on the same GPU is NVIDIA's DRAIN_AND_RESET, so the node's worst action is
# drain; the boot log of an 8x H100 node has no Xid.

def saved_log(lab, name):
    """A copy of a saved kernel log the job on the compute node can read (the lab dir is bound
    back into each node's private /tmp; the checkout may be under a 0700 home)."""
    dest = lab.dir / f"drain-{name}"
    shutil.copyfile(REPO / "tests" / "fixtures" / "xid" / name, dest)
    dest.chmod(0o644)
    return dest


def node_check(topo, *flags, log):
    return mldiag("node-check", "--hosts-file", topo.path, "-H", "cluster-a:n2", "--no-dcgm",
                  "--no-color", "--kernel-log-file", str(log), *flags)


def test_the_task_prints_the_drain_it_would_run_then_drains_with_the_tagged_reason(lab, topo, cluster):
    xid48 = saved_log(lab, "gpud-dmesg-time-format-iso.log")
    dry = node_check(topo, log=xid48)
    assert dry.returncode == 2, dry.stdout + dry.stderr
    out = dry.stdout
    assert out.splitlines()[1].split()[:2] == ["cluster-a:n2", "fail"], out
    assert "\nACTION  TARGETS       WHY\ndrain   cluster-a:n2  xid-48\n" in out, out
    reason = re.search(r'reason="(mldiag: xid-48 \(node-check by mlsh \d{4}-\d\d-\d\dT\d\d:\d\dZ\))"', out)
    assert reason, out
    assert out.endswith(
        "\nSlurm:\n  cluster-a:n2: --drain would run: sudo -n -- scontrol update nodename=n2 "
        f'state=drain reason="{reason.group(1)}"\n'), out
    assert slurm_state(cluster, "n2") == ("IDLE", None)        # a dry run changes nothing

    done = node_check(topo, "--drain", "--json", log=xid48)
    assert done.returncode == 2, done.stdout + done.stderr
    [doc] = json.loads(done.stdout)                            # stdout stays the JSON document
    assert doc["target"] == "cluster-a:n2" and doc["data"]["worst_action"] == "drain"
    state, why = slurm_state(cluster, "n2")
    assert state == "IDLE+DRAIN" and re.fullmatch(r"mldiag: xid-48 \(node-check by mlsh \S+Z\)", why), why
    assert f"mldiag: cluster-a:n2: drained (now State=IDLE+DRAIN): sudo -n -- scontrol update " \
           f'nodename=n2 state=drain reason="{why}"' in done.stderr, done.stderr
    for node in ("n1", "n3", "n4"):
        assert slurm_state(cluster, node) == ("IDLE", None)


def test_a_prom_file_that_cannot_be_written_does_not_skip_the_drain(lab, topo, cluster, tmp_path):
    """Issue 29 §0: the .prom file is written before the Slurm step; a directory in its way
    is said (exit at least 3, the file named) and n2 is drained all the same."""
    xid48 = saved_log(lab, "gpud-dmesg-time-format-iso.log")
    in_the_way = tmp_path / "node.prom"
    in_the_way.mkdir()
    r = node_check(topo, "--drain", "--prom", str(in_the_way), log=xid48)
    assert r.returncode >= 3, r.stdout + r.stderr
    assert f"mldiag: --prom {in_the_way}: " in r.stderr, r.stderr
    state, why = slurm_state(cluster, "n2")
    assert state == "IDLE+DRAIN" and re.fullmatch(r"mldiag: xid-48 \(node-check by mlsh \S+Z\)", why)
    assert "\nSlurm:\n  cluster-a:n2: drained (now State=IDLE+DRAIN): " in r.stdout, r.stdout


def reservations(cluster):
    return cluster.cmd("scontrol", "show", "reservation", "-o", check=True).stdout.strip()


def test_undrain_checks_our_drained_node_inside_a_maintenance_window(lab, topo, cluster):
    """Slurm starts no job on a DRAIN node: --undrain resumes the nodes mldiag drained inside a
    maintenance reservation of their own, checks them there, and keeps resumed only what
    passed; someone else's drain is not touched, and no reservation is left behind."""
    ours = "mldiag: xid-48 (node-check 2026-12-01T10:00Z)"
    cluster.cmd("scontrol", "update", "nodename=n2", "state=drain", f"reason={ours}", check=True)
    cluster.cmd("scontrol", "update", "nodename=n3", "state=drain", "reason=bad fan, ticket 42",
                check=True)
    clean = saved_log(lab, "gpud-dmesg.decode.iso.log.1")
    r = mldiag("node-check", "--hosts-file", topo.path, "-H", "cluster-a", "--no-dcgm",
               "--no-color", "--kernel-log-file", str(clean), "--undrain")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    rows = [line.split()[0] for line in r.stdout.split("\n\n", 1)[0].splitlines()[1:]
            if line and not line.startswith(" ")]
    assert rows == ["cluster-a:n2"], r.stdout                  # only the window's node is checked
    slurm = r.stdout.split("\nSlurm:\n", 1)[1].splitlines()
    name = re.match(r"  cluster-a: maintenance reservation (mldiag-undrain-[0-9a-f]{8}) for n2 "
                    r"\(user mlsh\): sudo -n -- scontrol create reservation reservationname=\1 "
                    r"starttime=now duration=\d+ nodes=n2 users=mlsh flags=maint,ignore_jobs$",
                    slurm[0])
    assert name, slurm
    assert slurm[1:] == [
        f"  cluster-a:n2: resumed inside {name.group(1)} for the check: sudo -n -- scontrol "
        "update nodename=n2 state=resume",
        f"  cluster-a:n2: resumed: passed the check in {name.group(1)} (now State=IDLE): sudo -n "
        "-- scontrol update nodename=n2 state=resume"], slurm
    assert settled_state(cluster, "n2") == ("IDLE", None)
    assert slurm_state(cluster, "n3") == ("IDLE+DRAIN", "bad fan, ticket 42")
    assert reservations(cluster) == "No reservations in the system"

    # still failing: drained again, now with the new finding's reason
    cluster.cmd("scontrol", "update", "nodename=n2", "state=drain", f"reason={ours}", check=True)
    xid48 = saved_log(lab, "gpud-dmesg-time-format-iso.log")
    r = mldiag("node-check", "--hosts-file", topo.path, "-H", "cluster-a", "--no-dcgm",
               "--json", "--kernel-log-file", str(xid48), "--undrain")
    assert r.returncode == 2, r.stdout + r.stderr
    assert [d["target"] for d in json.loads(r.stdout)] == ["cluster-a:n2"]
    state, why = slurm_state(cluster, "n2")
    assert state == "IDLE+DRAIN" and re.fullmatch(r"mldiag: xid-48 \(node-check by mlsh \S+Z\)", why), why
    assert re.search(r"mldiag: cluster-a:n2: drained again \(now State=IDLE\+DRAIN\): sudo -n -- "
                     r'scontrol update nodename=n2 state=drain reason="mldiag: xid-48 ', r.stderr), r.stderr
    assert reservations(cluster) == "No reservations in the system"


def test_undrain_with_nothing_of_ours_drained_checks_the_target_as_usual(lab, topo, cluster):
    clean = saved_log(lab, "gpud-dmesg.decode.iso.log.1")
    r = mldiag("node-check", "--hosts-file", topo.path, "-H", "cluster-a:n[1-2]", "--no-dcgm",
               "--no-color", "--kernel-log-file", str(clean), "--undrain")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert r.stdout.splitlines()[1].split()[0] == "cluster-a:n[1-2]", r.stdout
    assert r.stdout.endswith("\nSlurm:\n  cluster-a: --undrain: no node drained by mldiag as mlsh\n"
                             "  nothing to drain or resume\n"), r.stdout
    for node in ("n1", "n2"):
        assert slurm_state(cluster, node) == ("IDLE", None)


def test_a_runbook_with_drain_drains_what_any_step_says_to_drain(lab, topo, cluster, tmp_path):
    """`runbook --drain`: the steps' findings on each node row taken together, node-check's
    drain plan and tag: n2, whose node-check step found Xid 48 (drain), is drained with the
    tagged reason (so node-check --undrain resumes it); n1, ok in every step, is left alone."""
    logs = lab.dir / "runbook-drain"
    logs.mkdir(mode=0o755, exist_ok=True)
    for node, name in (("n1", "gpud-dmesg.decode.iso.log.1"), ("n2", "gpud-dmesg-time-format-iso.log")):
        shutil.copyfile(saved_log(lab, name), logs / f"cluster-a:{node}.log")
        (logs / f"cluster-a:{node}.log").chmod(0o644)
    books = tmp_path / "books"
    books.mkdir()
    (books / "check-and-ping.yaml").write_text(
        "description: a node-check on a saved log, then ping\n"
        "params:\n  logs: {description: saved kernel logs by node}\n"
        "steps:\n"
        "  - task: node-check\n    args: {kernel-log-file: '{{ params.logs }}/{{ target.name }}.log', no-dcgm: true}\n"
        "  - task: ping\n")
    r = mldiag("runbook", "check-and-ping", "--runbooks-dir", str(books), "--hosts-file", topo.path,
               "-H", "cluster-a:n[1-2]", "--param", f"logs={logs}", "--drain")
    assert r.returncode == 2, r.stdout + r.stderr
    state, why = slurm_state(cluster, "n2")
    assert state == "IDLE+DRAIN" and re.fullmatch(r"mldiag: xid-48 \(node-check by mlsh \S+Z\)", why), why
    assert slurm_state(cluster, "n1") == ("IDLE", None)
    assert "\nSlurm:\n  cluster-a:n2: drained (now State=IDLE+DRAIN): sudo -n -- scontrol update nodename=n2 " \
           f'state=drain reason="{why}"\n' in r.stdout, r.stdout


def test_a_runbook_with_drain_on_targets_that_are_no_slurm_nodes_says_so(lab, topo, tmp_path):
    r = mldiag("runbook", "node-health", "--hosts-file", topo.path, "-H", "box", "--drain")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "--drain: no Slurm node was checked" in r.stderr
