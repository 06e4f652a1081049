"""drain.py (issue 12 item 9): plan from hand-made results, Slurm's `scontrol show node -o`
answer parsed (the real 22.05 format), the rules (never touch anyone else's drain, resume only
ours), the exact commands, and run() against a recording stand-in for the login host's
transport. The real cluster: tests/integration/test_drain.py."""

import datetime

import pytest

from diagnostics.builtin.node_check import drain
from diagnostics.transport.base import ProcessOutput, Transport, TransportError
from diagnostics.core.results import Result
from tests.programs import node_check_finding as finding, node_check_result as result
from diagnostics.inventory.topology import Slurm, SshHost, Target

NOW = datetime.datetime(2026, 12, 1, 10, 0, 27, tzinfo=datetime.timezone.utc)
LOGIN = Target(name="cluster-a", host=SshHost(name="cluster-a", address="login.cluster-a"),
               slurm=Slurm(partition="gpu", nodes=4))
LOGIN_SUDO = Target(name="cluster-b", host=SshHost(name="cluster-b", address="login.b"),
                    become="sudo", slurm=Slurm(nodes=2, nodelist="m[1-2]"))
PLAIN = Target(name="b200", host=SshHost(name="b200", address="10.1.230.174"))
TARGETS = [LOGIN, LOGIN_SUDO, PLAIN]


def show_line(node, state="IDLE", reason=None, who="root@2026-12-01T09:00:00"):
    """One line of `scontrol show node -o` as Slurm 22.05 prints it (lab capture, shortened
    in the middle only)."""
    line = (f"NodeName={node} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 "
            f"CPULoad=0.30 AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:8 "
            f"NodeAddr=127.0.0.1 NodeHostName=localhost Port=42971 Version=22.05.8 "
            f"OS=Linux 6.18.44-fc-v657 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 "
            f"FreeMem=20949 Sockets=4 Boards=1 State={state} ThreadsPerCore=1 TmpDisk=0 Weight=1 "
            f"Owner=N/A MCS_label=N/A Partitions=debug,gpu  BootTime=2026-12-01T11:17:21 "
            f"SlurmdStartTime=2026-12-01T11:37:13 LastBusyTime=2026-12-01T11:37:13 "
            f"CfgTRES=cpu=4,mem=1000M,billing=4 AllocTRES= CapWatts=n/a CurrentWatts=0 "
            f"AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")
    if reason:
        line += f" Reason={reason} [{who}]"
    return line


# ------------------------------------------------------------------ plan

def test_plan_drains_only_drain_or_worse_and_names_the_codes_worst_first():
    results = [
        result("cluster-a:n1", "fail", finding("nvlink-down", "drain"), finding("xid-79", "rma"),
               finding("pcie-width", "reboot")),
        result("cluster-a:n2", "fail", finding("xid-48", "reset-gpu")),
        result("cluster-a:n3", "warn", finding("ib-errors", "monitor", "warn")),
        result("cluster-a:n4", "ok"),
    ]
    steps = drain.plan(results, TARGETS, now=NOW)
    assert [(s.target, s.want, s.node) for s in steps] == [
        ("cluster-a:n1", "drain", "n1"), ("cluster-a:n2", "keep", "n2"),
        ("cluster-a:n3", "resume", "n3"), ("cluster-a:n4", "resume", "n4")]
    assert steps[0].reason("ops") == "mldiag: xid-79, nvlink-down (node-check by ops 2026-12-01T10:00Z)"
    assert steps[0].login is LOGIN
    assert steps[1].why == "still failing (worst action reset-gpu)"


def test_plan_uses_data_worst_action_too_and_an_unknown_action_never_drains():
    r = result("cluster-a:n1", "fail", finding("weird", "explode"))
    assert drain.plan([r], TARGETS)[0].want == "keep"
    r = result("cluster-a:n1", "fail", data={"worst_action": "drain"})
    [step] = drain.plan([r], TARGETS, now=NOW)
    assert step.want == "drain"
    assert step.reason("ops") == "mldiag: node-check (node-check by ops 2026-12-01T10:00Z)"


def test_unreachable_rows_are_kept_as_they_are_never_drained_nor_resumed():
    r = Result.failure("node-check", "cluster-a:n2", "unreachable", "srun: error")
    [step] = drain.plan([r], TARGETS)
    assert (step.want, step.why) == ("keep", "not checked (unreachable)")


def test_rows_that_are_not_slurm_nodes_are_skipped():
    results = [result("b200", "fail", finding("xid-79", "rma")), result("gpu01"),
               Result.failure("node-check", "cluster-a", "unreachable", "salloc failed"),
               result("nosuch:n1")]
    steps = drain.plan(results, TARGETS)
    assert [(s.want, s.why) for s in steps] == [
        ("skip", "not a Slurm node"), ("skip", "not a Slurm node"),
        ("skip", "no node rows (the allocation failed): nothing to drain or resume"),
        ("skip", "not a Slurm node")]


def test_a_selected_node_row_target_finds_its_login():
    one = Target(name="cluster-a:n[3-4]", host=LOGIN.host, slurm=Slurm(nodes=2, nodelist="n3,n4"))
    [step] = drain.plan([result("cluster-a:n3", "fail", finding("x", "drain"))], [one])
    assert (step.want, step.node, step.login) == ("drain", "n3", one)


def test_codes_from_the_target_are_cleaned_and_the_reason_is_bounded():
    codes = [finding("xid-79; rm -rf /", "drain"), finding('a"b$c`d\\e', "drain")]
    [step] = drain.plan([result("cluster-a:n1", "fail", *codes)], TARGETS, now=NOW)
    assert step.reason("ops") == ("mldiag: xid-79__rm_-rf__, a_b_c_d_e "
                                  "(node-check by ops 2026-12-01T10:00Z)")
    many = [finding(f"code-number-{i:02d}", "drain") for i in range(30)]
    [step] = drain.plan([result("cluster-a:n1", "fail", *many)], TARGETS, now=NOW)
    assert len(step.reason("ops")) <= drain.REASON_MAX
    assert step.reason("ops") == ("mldiag: code-number-00, code-number-01, code-number-02, "
                                  "code-number-03, +26 more (node-check by ops 2026-12-01T10:00Z)")


# ------------------------------------------------------------------ scontrol's answer

def test_parse_show_node_reads_state_and_the_whole_reason():
    text = "\n".join([
        show_line("n1"),
        show_line("n2", "IDLE+DRAIN", "mldiag: xid-79, nvlink-down (node-check by ops 2026-12-01T10:00Z)"),
        show_line("n3", "MIXED+DRAIN", "bad fan [ticket 42]", who="alice@2026-11-30T08:00:00")
        + " Comment=State=DOWN",
        show_line("n4", "DOWN*", "Not responding", who="slurm@2026-12-01T09:12:00"),
    ])
    nodes = drain.parse_show_node(text)
    assert nodes["n1"] == drain.NodeState("n1", "IDLE", None)
    assert nodes["n2"] == drain.NodeState(
        "n2", "IDLE+DRAIN", "mldiag: xid-79, nvlink-down (node-check by ops 2026-12-01T10:00Z)", "root")
    assert nodes["n2"].tagged and nodes["n2"].unavailable
    assert nodes["n3"] == drain.NodeState("n3", "MIXED+DRAIN", "bad fan [ticket 42]", "alice")
    assert not nodes["n3"].tagged and nodes["n3"].unavailable
    assert nodes["n4"].unavailable and nodes["n4"].reason == "Not responding"
    assert not nodes["n1"].unavailable
    assert drain.parse_show_node("Node nX not found\n") == {}


def test_the_suffix_slurm_appends_is_the_last_one_a_reason_cannot_forge_it():
    """Someone else's Reason may hold text shaped like Slurm's suffix: the setter is the one
    Slurm appended last, so a forged ``[ops@…]`` inside the text does not pass for it."""
    forged = "mldiag: x (node-check by ops 2026-12-01T10:00Z) [ops@2026-12-01T10:00:00]"
    [node] = drain.parse_show_node(show_line("n1", "IDLE+DRAIN", forged,
                                             who="alice@2026-12-01T10:01:00")).values()
    assert (node.reason, node.set_by) == (forged, "alice")
    assert not OWNER.owns(node)
    # the same with fields after the suffix (22.05 puts none there; later releases may)
    line = show_line("n1", "IDLE+DRAIN", forged, who="alice@2026-12-01T10:01:00") + " Comment=x"
    assert drain.parse_show_node(line)["n1"].set_by == "alice"


def test_a_reason_with_a_newline_cannot_forge_another_nodes_line():
    """A Reason holding a newline and a whole `NodeName=n2 … Reason=mldiag: … [ops@…]` line:
    n2 then has two lines, neither is believed, and n2 counts as someone else's."""
    forged_n2 = show_line("n2", "IDLE+DRAIN", "mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)",
                          who="ops@2026-12-01T10:00:00")
    text = "\n".join([show_line("n1", "IDLE+DRAIN", "fan\n" + forged_n2,
                                who="alice@2026-12-01T10:00:00"),
                      show_line("n2", "IDLE")])
    for order in (text, "\n".join(reversed(text.split("\n")))):
        nodes = drain.parse_show_node(order)
        assert not OWNER.owns(nodes["n2"]) and nodes["n2"].unavailable
        assert not OWNER.owns(nodes["n1"])


@pytest.mark.parametrize("reason, set_by, owner, ours", [
    # the new form: the Reason names the login user, Slurm the user scontrol ran as
    ("mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)", "ops", ("ops", "ops"), True),
    ("mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)", "root", ("ops", "root"), True),
    ("mldiag: xid-79 (node-check by alice 2026-12-01T10:00Z)", "root", ("ops", "root"), False),
    ("mldiag: xid-79 (node-check by alice 2026-12-01T10:00Z)", "alice", ("ops", "ops"), False),
    ("mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)", "alice", ("ops", "ops"), False),
    ("mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)", None, ("ops", "ops"), False),
    ("mldiag: xid-79 (node-check by ops)", "ops", ("ops", "ops"), False),     # garbled: no
    # the old form (no "by USER"): ours only when Slurm says our scontrol user set it
    ("mldiag: xid-79 (node-check 2026-11-30T10:00Z)", "root", ("ops", "root"), True),
    ("mldiag: xid-79 (node-check 2026-11-30T10:00Z)", "ops", ("ops", "ops"), True),
    ("mldiag: xid-79 (node-check 2026-11-30T10:00Z)", "alice", ("ops", "ops"), False),
    ("mldiag: xid-79 (node-check 2026-11-30T10:00Z)", "root", ("ops", "ops"), False),
    ("mldiag:fan, ticket 42", "alice", ("ops", "ops"), False),
    ("maintenance", "ops", ("ops", "ops"), False),
])
def test_a_drain_is_ours_only_when_the_reason_and_slurm_both_name_this_run(reason, set_by, owner,
                                                                          ours):
    state = drain.NodeState("n1", "IDLE+DRAIN", reason, set_by)
    assert drain.Owner(*owner).owns(state) is ours


def test_the_reason_names_the_login_user_and_refuses_a_name_that_is_not_plain():
    assert drain.reason_text(["xid-79"], "2026-12-01T10:00Z", "mlsh") == \
        "mldiag: xid-79 (node-check by mlsh 2026-12-01T10:00Z)"
    with pytest.raises(ValueError):
        drain.reason_text(["xid-79"], "2026-12-01T10:00Z", 'ops" state=resume')
    assert drain.Owner.of(LOGIN, "ops") == drain.Owner("ops", "ops")
    assert drain.Owner.of(LOGIN_SUDO, "ops") == drain.Owner("ops", "root")
    # a code too long for the bound still leaves the owner part whole
    [step] = drain.plan([result("cluster-a:n1", "fail", finding("x" * 200, "drain"))], TARGETS,
                        now=NOW)
    long = step.reason("ops")
    assert len(long) <= drain.REASON_MAX and long.endswith(" (node-check by ops 2026-12-01T10:00Z)")
    assert OWNER.owns(drain.NodeState("n1", "IDLE+DRAIN", long, "ops"))


# ------------------------------------------------------------------ the rules

def steps_for(*wants):
    return {want: drain.DrainStep("cluster-a:n1", want, LOGIN, "n1", codes=("xid-79",),
                                  when="2026-12-01T10:00Z",
                                  why="still failing (worst action reboot)")
            for want in wants}


OWNER = drain.Owner("ops", "ops")      # LOGIN's: no become, scontrol runs as the login user
IDLE = drain.NodeState("n1", "IDLE")
OURS = drain.NodeState("n1", "IDLE+DRAIN", "mldiag: xid-79 (node-check by ops 2026-11-30T10:00Z)",
                       "ops")
THEIRS = drain.NodeState("n1", "IDLE+DRAIN", "maintenance")
DOWN = drain.NodeState("n1", "DOWN*", "Not responding")


@pytest.mark.parametrize("want, state, status, command", [
    ("drain", IDLE, "would-run",
     'scontrol update nodename=n1 state=drain reason="mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)"'),
    ("drain", THEIRS, "left-alone", None),
    ("drain", DOWN, "left-alone", None),
    ("drain", OURS, "nothing", None),
    ("resume", OURS, "would-run", "scontrol update nodename=n1 state=resume"),
    ("resume", THEIRS, "left-alone", None),
    ("resume", DOWN, "left-alone", None),
    ("resume", IDLE, "nothing", None),
    ("keep", OURS, "nothing", None),
    ("keep", IDLE, "nothing", None),
    ("keep", THEIRS, "left-alone", None),
])
def test_decide(want, state, status, command):
    outcome = drain.decide(steps_for(want)[want], state, OWNER)
    assert (outcome.status, outcome.command) == (status, command)
    if status == "left-alone":
        assert outcome.message.startswith("left alone: ")
        assert "by someone else" in outcome.message


def test_decide_messages():
    s = steps_for("drain", "keep")
    assert drain.decide(s["drain"], THEIRS, OWNER).message == \
        "left alone: drained by someone else (State=IDLE+DRAIN, Reason=maintenance)"
    assert drain.decide(s["drain"], DOWN, OWNER).message == \
        "left alone: down by someone else (State=DOWN*, Reason=Not responding)"
    assert drain.decide(s["keep"], OURS, OWNER).message == (
        "stays drained: still failing (worst action reboot) (State=IDLE+DRAIN, "
        "Reason=mldiag: xid-79 (node-check by ops 2026-11-30T10:00Z))")
    assert drain.decide(s["drain"], None, OWNER).status == "error"


def test_update_lines_refuse_anything_a_shell_or_scontrol_would_read():
    assert drain.update_line("n1", "resume") == "update nodename=n1 state=resume"
    for reason in ['a"b', "a$b", "a`b`", "a\\b", "a!b", "a'b", "a\nb"]:
        with pytest.raises(ValueError):
            drain.update_line("n1", "drain", reason)
    with pytest.raises(ValueError):
        drain.update_line("n1;id", "drain", "x")


def test_become_sudo_prefixes_the_command():
    [step] = drain.plan([result("cluster-b:m1", "fail", finding("xid-79", "drain"))], TARGETS,
                        now=NOW)
    outcome = drain.decide(step, drain.NodeState("m1", "IDLE"), drain.Owner("ops", "root"))
    assert outcome.command == ('sudo -n -- scontrol update nodename=m1 state=drain '
                               'reason="mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)"')


# ------------------------------------------------------------------ run, against a stand-in

class FakeLogin(Transport):
    """The login host: answers `scontrol show node -o` from `states`, applies updates read from
    stdin as scontrol would, and records every call."""
    kind = "fake"

    def __init__(self, states, fail_update=None, down=False, user="ops"):
        self.states = dict(states)
        self.user = user
        self.calls = []
        self.fail_update = fail_update
        self.down = down

    def run(self, argv, payload, deadline, *, on_stdout=None):
        self.calls.append((list(argv), payload.decode()))
        if self.down:
            raise TransportError("unreachable", "login.cluster-a: connection refused")
        sudo = argv[:3] == ["sudo", "-n", "--"]
        core = argv[3:] if sudo else argv
        if core == ["id", "-un"]:
            return ProcessOutput(f"{'root' if sudo else self.user}\n".encode(), b"", 0)
        if core[:4] == ["scontrol", "show", "node", "-o"]:
            lines, missing = [], []
            for n in core[4].split(","):
                if n in self.states:
                    st = self.states[n]
                    lines.append(show_line(n, st.state, st.reason,
                                           f"{st.set_by}@2026-12-01T09:00:00"))
                else:
                    missing.append(f"Node {n} not found")
            return ProcessOutput("\n".join(lines).encode(), "\n".join(missing).encode(),
                                 1 if missing else 0)
        assert core == ["scontrol"]
        update, quit_, end = payload.decode().split("\n")
        assert (quit_, end) == ("quit", "")
        if self.fail_update:
            return ProcessOutput(b"", self.fail_update.encode(), 1)
        words = dict(w.split("=", 1) for w in update.split(" ", 4)[1:4])
        node = words["nodename"]
        if words["state"] == "drain":
            reason = update.split('reason="', 1)[1].rstrip('"')
            self.states[node] = drain.NodeState(node, "IDLE+DRAIN", reason,
                                                "root" if sudo else self.user)
        else:
            self.states[node] = drain.NodeState(node, "IDLE")
        return ProcessOutput(b"scontrol: ", b"", 0)

    def put(self, data, path):
        raise NotImplementedError

    def describe(self):
        return "fake"

    def close(self):
        pass


def fleet_results():
    return [result("cluster-a:n1", "fail", finding("xid-79", "rma")),      # drain
            result("cluster-a:n2", "fail", finding("xid-79", "drain")),    # theirs: left alone
            result("cluster-a:n3", "ok"),                                   # ours: resume
            result("cluster-a:n4", "ok"),                                   # nothing
            result("b200", "ok"), result("gpu01", "ok")]


def fleet_states():
    return {"n1": drain.NodeState("n1", "IDLE"),
            "n2": drain.NodeState("n2", "IDLE+DRAIN", "maintenance", "root"),
            "n3": drain.NodeState("n3", "IDLE+DRAIN",
                                  "mldiag: xid-79 (node-check by ops 2026-11-30T10:00Z)", "ops"),
            "n4": drain.NodeState("n4", "IDLE")}


def test_a_dry_run_asks_slurm_once_and_changes_nothing():
    login = FakeLogin(fleet_states())
    steps = drain.plan(fleet_results(), TARGETS, now=NOW)
    outcomes = drain.run(steps, transport=lambda t: login)
    assert login.calls == [(["scontrol", "show", "node", "-o", "n1,n2,n3,n4"], ""),
                           (["id", "-un"], "")]
    assert drain.commands(outcomes) == [
        'scontrol update nodename=n1 state=drain reason="mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)"',
        "scontrol update nodename=n3 state=resume"]
    assert drain.lines(outcomes) == [
        'cluster-a:n1: --drain would run: scontrol update nodename=n1 state=drain '
        'reason="mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)"',
        "cluster-a:n2: left alone: drained by someone else (State=IDLE+DRAIN, Reason=maintenance)",
        "cluster-a:n3: --undrain would run: scontrol update nodename=n3 state=resume",
        "not a Slurm node: skipped: b200,gpu01"]
    assert not drain.failed(outcomes)


def test_drain_runs_only_the_drains_through_scontrols_stdin_and_reads_back():
    login = FakeLogin(fleet_states())
    outcomes = drain.run(drain.plan(fleet_results(), TARGETS, now=NOW), drain=True,
                         transport=lambda t: login)
    assert login.calls[2] == (["scontrol"], 'update nodename=n1 state=drain '
                              'reason="mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)"\nquit\n')
    assert login.calls[3] == (["scontrol", "show", "node", "-o", "n1"], "")
    assert len(login.calls) == 4
    assert login.states["n2"].reason == "maintenance"      # theirs: untouched
    assert login.states["n3"].unavailable                  # no --undrain: still drained
    by = {o.target: o for o in outcomes}
    assert (by["cluster-a:n1"].status, by["cluster-a:n1"].after.state) == ("ran", "IDLE+DRAIN")
    assert drain.lines(outcomes)[0] == (
        'cluster-a:n1: drained (now State=IDLE+DRAIN): scontrol update nodename=n1 state=drain '
        'reason="mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)"')
    assert by["cluster-a:n3"].status == "would-run"


def test_undrain_resumes_only_ours():
    login = FakeLogin(fleet_states())
    outcomes = drain.run(drain.plan(fleet_results(), TARGETS, now=NOW), undrain=True,
                         transport=lambda t: login)
    assert [c for c in login.calls if c[0] == ["scontrol"]] == [
        (["scontrol"], "update nodename=n3 state=resume\nquit\n")]
    assert login.states["n3"] == drain.NodeState("n3", "IDLE")
    assert login.states["n2"].reason == "maintenance"
    assert login.states["n1"] == drain.NodeState("n1", "IDLE")    # no --drain: not drained
    assert "cluster-a:n3: resumed (now State=IDLE): scontrol update nodename=n3 state=resume" \
        in drain.lines(outcomes)


def test_undrain_leaves_another_users_tagged_drain_alone():
    """Drains with mldiag's tag by another user (the Reason's `by alice`, or Slurm's setter
    alice on an old-form Reason) are someone else's: never resumed, said why."""
    login = FakeLogin({
        "n1": drain.NodeState("n1", "IDLE+DRAIN",
                              "mldiag: xid-79 (node-check by alice 2026-11-30T10:00Z)", "alice"),
        "n2": drain.NodeState("n2", "IDLE+DRAIN", "mldiag: xid-79 (node-check 2026-11-30T10:00Z)",
                              "alice"),
        "n3": drain.NodeState("n3", "IDLE+DRAIN", "mldiag: xid-79 (node-check 2026-11-30T10:00Z)",
                              "ops")})
    results = [result(f"cluster-a:n{i}") for i in (1, 2, 3)]
    outcomes = drain.run(drain.plan(results, TARGETS, now=NOW), undrain=True,
                         transport=lambda t: login)
    assert [o.status for o in outcomes] == ["left-alone", "left-alone", "ran"]
    assert login.states["n1"].unavailable and login.states["n2"].unavailable
    assert not login.states["n3"].unavailable
    assert outcomes[1].message == (
        "left alone: drained by someone else, set by alice (State=IDLE+DRAIN, "
        "Reason=mldiag: xid-79 (node-check 2026-11-30T10:00Z))")


def test_a_login_host_that_cannot_say_who_we_are_changes_nothing():
    class Nameless(FakeLogin):
        def run(self, argv, payload, deadline, *, on_stdout=None):
            if argv == ["id", "-un"]:
                return ProcessOutput(b"no such user; x\n", b"", 0)
            return super().run(argv, payload, deadline)
    login = Nameless(fleet_states())
    outcomes = drain.run(drain.plan(fleet_results()[:4], TARGETS, now=NOW), drain=True,
                         undrain=True, transport=lambda t: login)
    assert [o.status for o in outcomes] == ["error"] * 4 and drain.failed(outcomes)
    assert outcomes[0].message == ("cluster-a: cannot tell which user mldiag runs as: "
                                   "'no such user; x'")
    assert [c for c in login.calls if c[0] == ["scontrol"]] == []


def test_sudo_login_runs_scontrol_under_sudo_n():
    login = FakeLogin({"m1": drain.NodeState("m1", "IDLE")})
    steps = drain.plan([result("cluster-b:m1", "fail", finding("xid-79", "drain"))], TARGETS, now=NOW)
    drain.run(steps, drain=True, transport=lambda t: login)
    assert login.calls[0][0] == ["scontrol", "show", "node", "-o", "m1"]   # reading needs no root
    assert login.calls[1][0] == ["id", "-un"]      # the login user: the Reason's "by USER"
    assert login.calls[2][0] == ["sudo", "-n", "--", "scontrol"]


def test_a_failed_update_and_an_unreachable_login_are_reported():
    login = FakeLogin(fleet_states(), fail_update="slurm_update error: Invalid user id")
    outcomes = drain.run(drain.plan(fleet_results()[:1], TARGETS, now=NOW), drain=True,
                         transport=lambda t: login)
    assert outcomes[0].status == "failed" and drain.failed(outcomes)
    assert drain.lines(outcomes) == [
        'cluster-a:n1: scontrol failed (exit 1: slurm_update error: Invalid user id): '
        'scontrol update nodename=n1 state=drain reason="mldiag: xid-79 (node-check by ops 2026-12-01T10:00Z)"']
    login = FakeLogin({}, down=True)
    outcomes = drain.run(drain.plan(fleet_results(), TARGETS, now=NOW), drain=True,
                         transport=lambda t: login)
    assert [o.status for o in outcomes] == ["error"] * 4 + ["skipped"] * 2
    assert outcomes[0].message == ("cannot read the node's Slurm state on cluster-a: scontrol show "
                                   "node: unreachable: login.cluster-a: connection refused")
    assert drain.failed(outcomes)


def test_a_node_slurm_does_not_know_is_said_and_the_others_still_run():
    login = FakeLogin({"n1": drain.NodeState("n1", "IDLE")})
    results = [result("cluster-a:n1", "fail", finding("xid-79", "drain")),
               result("cluster-a:n7", "fail", finding("xid-79", "drain"))]
    outcomes = drain.run(drain.plan(results, TARGETS, now=NOW), drain=True, transport=lambda t: login)
    assert [o.status for o in outcomes] == ["ran", "error"]
    assert outcomes[1].message == ("not a node of this Slurm cluster (scontrol show node on "
                                   "cluster-a does not know n7)")


def test_nothing_to_do_is_said_once():
    login = FakeLogin({"n4": drain.NodeState("n4", "IDLE")})
    outcomes = drain.run(drain.plan([result("cluster-a:n4")], TARGETS), transport=lambda t: login)
    assert drain.lines(outcomes) == ["Slurm: nothing to drain or resume"]
    assert drain.lines(drain.run(drain.plan([result("b200")], TARGETS))) == [
        "not a Slurm node: skipped: b200"]


def test_the_login_hosts_words_are_printed_inert_and_bounded():
    login = FakeLogin({"n2": drain.NodeState("n2", "IDLE+DRAIN", "\x1b[2Jgone " + "x" * 300)})
    outcomes = drain.run(drain.plan([result("cluster-a:n2", "fail", finding("xid-79", "drain"))],
                                    TARGETS), drain=True, transport=lambda t: login)
    first, line = drain.lines(outcomes)
    assert first == "Slurm: nothing to drain or resume"
    assert "\x1b" not in line and "\\x1b[2Jgone" in line
    assert len(line) < 300 and line.endswith("…)")
    assert outcomes[0].to_dict() == {
        "target": "cluster-a:n2", "status": "left-alone", "message": outcomes[0].message,
        "command": None, "flag": None, "login": "cluster-a", "node": "n2",
        "before": {"state": "IDLE+DRAIN", "reason": "\x1b[2Jgone " + "x" * 300}, "after": None}
