"""undrain.py's pure parts: which nodes a window takes (ours only, within the target's nodelist
and partition), the reservation command, the check's time limit inside it, the narrowed
target and its salloc, the old Reason restored only when it is safe. The real cluster:
tests/integration/test_drain.py."""

import datetime

import pytest

from diagnostics.builtin.node_check import drain, undrain
from diagnostics.transport.base import ProcessOutput
from diagnostics.transport.slurm import salloc_argv
from diagnostics.core.results import Finding, Result
from diagnostics.inventory.topology import Slurm, SshHost, Target
from tests.unit.test_drain import FakeLogin, show_line

OURS = "mldiag: xid-48 (node-check 2026-12-01T10:00Z)"
SHOW = "\n".join([
    show_line("n1"),
    show_line("n2", "IDLE+DRAIN", OURS),
    show_line("n3", "IDLE+DRAIN", "bad fan, ticket 42"),
    show_line("n4", "DOWN+DRAIN", OURS).replace("Partitions=debug,gpu", "Partitions=debug"),
    show_line("n5", "IDLE", OURS),                    # a stale reason on a node back in service
    show_line("n;6", "IDLE+DRAIN", OURS),             # not a plain name: never on a command line
]) + "\n"


OWNER = drain.Owner("mlsh", "root")     # login(): become sudo, so scontrol runs as root


def login(**slurm):
    return Target(name="cluster-a", host=SshHost(name="cluster-a", address="login.a"),
                  become="sudo", slurm=Slurm(**slurm))


@pytest.mark.parametrize("slurm, nodes", [
    (dict(nodes=4), ["n2", "n4"]),
    (dict(nodes=4, partition="gpu"), ["n2"]),            # n4 is only in debug
    (dict(nodes=2, nodelist="n[3-4]"), ["n4"]),          # n3 is someone else's
    (dict(nodes=1, nodelist="n1"), []),
])
def test_a_window_takes_only_nodes_mldiag_drained_within_the_target(slurm, nodes):
    assert undrain.drained_by_us(SHOW, Slurm(**slurm), OWNER) == nodes


def test_the_reservation_is_maintenance_for_one_user_and_outlasts_the_check():
    assert undrain.job_minutes(60) == 2 and undrain.job_minutes(300) == 6
    assert undrain.job_minutes(1) == 2
    line = undrain.reservation_line("mldiag-undrain-0a1b2c3d", ["n2", "n4"], "mlsh", 6)
    assert line == ("create reservation reservationname=mldiag-undrain-0a1b2c3d starttime=now "
                    "duration=11 nodes=n2,n4 users=mlsh flags=maint,ignore_jobs")
    with pytest.raises(ValueError):
        undrain.reservation_line("mldiag-undrain-x", ["n2"], "ro ot", 6)
    assert undrain.reservation_name().startswith("mldiag-undrain-")
    assert undrain.reservation_name() != undrain.reservation_name()


def test_the_check_runs_on_the_window_nodes_inside_the_reservation():
    target = login(partition="gpu", nodes=4, account="ml")
    window = undrain.Window(target, "cluster-a", "mldiag-undrain-0a1b2c3d", ["n2", "n4"], {}, OWNER)
    narrow = undrain.narrowed(window, 6)
    assert narrow.name == "cluster-a" and narrow.become == "sudo"
    assert salloc_argv(narrow.slurm, 30, "mldiag-x") == [
        "salloc", "--no-shell", "-J", "mldiag-x", "-N", "2", "-I30", "-p", "gpu", "-A", "ml",
        "--reservation", "mldiag-undrain-0a1b2c3d", "-t", "6", "-w", "n2,n4"]
    assert target.slurm.nodelist is None                 # the selected target is unchanged


def test_an_old_reason_goes_back_only_when_it_is_ours_and_safe():
    now = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)
    fresh = "mldiag: node-check (node-check by mlsh 2026-12-01T12:00Z)"
    assert undrain._restorable(OURS, now, "mlsh") == OURS
    assert undrain._restorable('mldiag: x" state=resume', now, "mlsh") == fresh
    assert undrain._restorable("mldiag: $(reboot)", now, "mlsh") == fresh
    assert undrain._restorable("someone's words", now, "mlsh") == fresh


def test_partitions_are_read_per_node():
    assert undrain.partitions_of(SHOW)["n4"] == ["debug"]
    assert undrain.partitions_of(SHOW)["n1"] == ["debug", "gpu"]


# ------------------------------------------------------------------ open and close, against a stand-in

class WindowLogin(FakeLogin):
    """The login host as scontrol answers it: `show node -o` (all nodes), `id -un`, and the
    stdin reader's create reservation / update / delete; every call recorded."""

    def __init__(self, states, fail=None):
        self.states = dict(states)              # node -> (State, Reason)
        self.reservations = set()
        self.calls = []
        self.fail = fail                        # a command word that fails: create, delete

    def run(self, argv, payload, deadline, *, on_stdout=None):
        text = payload.decode()
        self.calls.append((list(argv), text))
        core = argv[3:] if argv[:3] == ["sudo", "-n", "--"] else argv
        if core == ["id", "-un"]:
            return ProcessOutput(b"mlsh\n", b"", 0)
        if core[:4] == ["scontrol", "show", "node", "-o"]:
            wanted = core[4].split(",") if len(core) > 4 else list(self.states)
            return ProcessOutput("\n".join(show_line(n, *self.states[n]) for n in wanted
                                           if n in self.states).encode(), b"", 0)
        assert core == ["scontrol"] and text.endswith("\nquit\n"), (argv, text)
        line = text[:-len("\nquit\n")]
        word = line.split()[0]
        if word == self.fail:
            return ProcessOutput(b"", f"{word}: Access denied".encode(), 1)
        fields = dict(w.split("=", 1) for w in line.split(" ") if "=" in w and '"' not in w)
        if word == "create":
            self.reservations.add(fields["reservationname"])
        elif word == "delete":
            self.reservations.discard(fields["reservationname"])
        elif fields["state"] == "resume":
            self.states[fields["nodename"]] = ("IDLE", None)
        else:
            self.states[fields["nodename"]] = ("IDLE+DRAIN", line.split('reason="', 1)[1][:-1])
        return ProcessOutput(b"", b"", 0)


def node_result(target, status, *codes_actions):
    findings = []
    for code, action in codes_actions:
        f = Finding(level="fail", code=code, message=code)
        f.action = action
        findings.append(f)
    return Result(diagnostic="node-check", target=target, status=status, summary="",
                  findings=findings)


def opened(fake, target):
    windows = []
    run_on, lines = undrain.open_windows([target, PLAIN], lambda t: 300.0, windows,
                                         transport=lambda t: fake)
    return run_on, windows, lines


PLAIN = Target(name="b200", host=SshHost(name="b200", address="10.1.230.174"))
NOW = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)


def fleet():
    return WindowLogin({"n1": ("IDLE", None), "n2": ("IDLE+DRAIN", OURS),
                        "n3": ("IDLE+DRAIN", "bad fan, ticket 42"), "n4": ("IDLE+DRAIN", OURS)})


def test_a_window_reserves_resumes_and_narrows_then_keeps_only_what_passed():
    fake = fleet()
    run_on, [window], lines = opened(fake, login(nodes=4))
    assert [t.name for t in run_on] == ["cluster-a", "b200"] and run_on[1] is PLAIN
    assert (run_on[0].slurm.nodelist, run_on[0].slurm.nodes, run_on[0].slurm.time) == ("n2,n4", 2, "6")
    assert run_on[0].slurm.reservation == window.name and fake.reservations == {window.name}
    assert fake.states["n2"] == fake.states["n4"] == ("IDLE", None)      # resumed inside it
    assert fake.states["n3"] == ("IDLE+DRAIN", "bad fan, ticket 42")
    assert lines[0].startswith(f"cluster-a: maintenance reservation {window.name} for n2,n4 "
                               "(user mlsh): sudo -n -- scontrol create reservation ")

    results = [node_result("cluster-a:n2", "ok"),
               node_result("cluster-a:n4", "fail", ("ib-port-down", "drain"))]
    out = undrain.close_windows([window], results, transport=lambda t: fake, now=NOW)
    assert [(o.target, o.status, o.message) for o in out] == [
        ("cluster-a:n2", "ran", f"resumed: passed the check in {window.name}"),
        ("cluster-a:n4", "ran", "drained again")]
    assert fake.states["n2"] == ("IDLE", None)
    assert fake.states["n4"] == ("IDLE+DRAIN",
                                "mldiag: ib-port-down (node-check by mlsh 2026-12-01T12:00Z)")
    assert fake.reservations == set()
    assert out[1].after.state == "IDLE+DRAIN"


def test_an_interrupted_check_drains_every_window_node_again_with_its_old_reason():
    fake = fleet()
    _, [window], _ = opened(fake, login(nodes=4))
    out = undrain.close_windows([window], None, transport=lambda t: fake, now=NOW)
    assert [(o.target, o.message) for o in out] == [
        ("cluster-a:n2", "stays drained: the check did not finish"),
        ("cluster-a:n4", "stays drained: the check did not finish")]
    assert fake.states["n2"] == fake.states["n4"] == ("IDLE+DRAIN", OURS)
    assert fake.reservations == set()


def test_a_failing_below_drain_or_unchecked_node_keeps_its_old_reason():
    fake = fleet()
    _, [window], _ = opened(fake, login(nodes=4))
    out = undrain.close_windows([window], [node_result("cluster-a:n2", "fail", ("xid-79", "reboot"))],
                                transport=lambda t: fake, now=NOW)
    assert [o.message for o in out] == ["stays drained: still failing (worst action reboot)",
                                        "stays drained: no result"]
    assert fake.states["n2"] == fake.states["n4"] == ("IDLE+DRAIN", OURS)


def test_no_reservation_no_window_and_the_nodes_stay_drained():
    fake = fleet()
    fake.fail = "create"
    run_on, windows, lines = opened(fake, login(nodes=4))
    assert windows == [] and run_on[0].slurm.reservation is None and run_on[0].slurm.nodelist is None
    assert fake.states["n2"] == ("IDLE+DRAIN", OURS)
    assert lines[0].startswith("cluster-a: --undrain: no maintenance reservation, n2,n4 stay drained "
                               "unchecked: scontrol failed (exit 1: create: Access denied)")


def test_a_reservation_left_behind_is_a_failed_outcome():
    fake = fleet()
    _, [window], _ = opened(fake, login(nodes=4))
    fake.fail = "delete"
    out = undrain.close_windows([window], [node_result("cluster-a:n2", "ok"),
                                           node_result("cluster-a:n4", "ok")],
                                transport=lambda t: fake, now=NOW)
    assert drain.failed(out)
    assert out[-1].message.startswith(f"maintenance reservation {window.name} not deleted")


def test_nothing_of_ours_drained_no_window():
    fake = WindowLogin({"n1": ("IDLE", None), "n3": ("IDLE+DRAIN", "bad fan, ticket 42")})
    run_on, windows, lines = opened(fake, login(nodes=2))
    assert windows == [] and lines == ["cluster-a: --undrain: no node drained by mldiag as mlsh"]
    assert [c[0] for c in fake.calls] == [["scontrol", "show", "node", "-o"], ["id", "-un"]]
