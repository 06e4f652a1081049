"""node-check's client side (diagnostics/builtin/node_check/run.py): bad flags refused before any target
is touched, and --drain/--undrain with no Slurm node among the targets is an error, not a
silent no-op. The target is a real local run of the node-check script (this machine: no GPU)."""

import errno
import io
import json
import os
import signal
import tempfile
import time

import pytest

from diagnostics.engine import execute
from diagnostics.builtin.node_check import run as node_check_run, undrain as undrain_mod
from diagnostics.core import termination
from diagnostics.core.errors import EXIT_ERROR, InputError
from diagnostics.core.outcome import Outcome
from diagnostics.core.results import Finding, Result
from tests.unit.test_undrain import WindowLogin


def opts(hosts_file, **more):
    return execute.Options(host=["here"], hosts_file=str(hosts_file), **more)


@pytest.mark.parametrize("flags, message", [
    (dict(prom="metrics.txt"), "--prom metrics.txt: the file name must end in .prom"),
    (dict(drain=True, undrain=True), "--drain and --undrain: give one of them"),
])
def test_bad_flags_are_refused_before_the_target_runs(hosts, tmp_path, flags, message):
    path, marker = hosts
    with pytest.raises(InputError) as caught:
        node_check_run.execute(opts(path), {}, out=io.StringIO(), **flags)
    assert str(caught.value).startswith(message)
    assert not marker.exists()
    assert not (tmp_path / "metrics.txt").exists()


def test_a_bad_dcgm_level_is_refused_before_the_target_runs(hosts):
    path, marker = hosts
    with pytest.raises(InputError, match="--dcgm-level: expected 1, 2 or 3, got '7'"):
        node_check_run.execute(opts(path), {"dcgm_level": "7"}, out=io.StringIO())
    assert not marker.exists()


def test_a_file_that_is_not_a_baseline_is_refused_before_the_target_runs(hosts, tmp_path):
    path, marker = hosts
    bad = tmp_path / "baseline.json"
    bad.write_text("[1, 2, 3]\n")
    with pytest.raises(InputError, match="baseline.json"):
        node_check_run.execute(opts(path), {}, baseline=str(bad), out=io.StringIO())
    assert not marker.exists()


def test_drain_with_no_slurm_node_is_an_error_that_keeps_the_results(hosts):
    path, marker = hosts
    out = io.StringIO()
    outcome = node_check_run.execute(opts(path, json=True), {"no_dcgm": True}, drain=True, out=out)
    assert marker.exists()                               # the node was checked ...
    docs = json.loads(out.getvalue())
    assert [d["target"] for d in docs] == ["here"] and docs[0]["status"] != "error", docs
    assert outcome.exit_code == EXIT_ERROR               # ... but the drain asked for did not happen
    assert outcome.messages[-1] == "--drain/--undrain: no Slurm node was checked"


def test_without_drain_flags_a_run_with_no_slurm_node_says_nothing_of_slurm(hosts):
    path, _ = hosts
    out = io.StringIO()
    outcome = node_check_run.execute(opts(path, no_color=True), {"no_dcgm": True}, out=out)
    assert "Slurm" not in out.getvalue()
    assert out.getvalue().splitlines()[1].split()[0] == "here", out.getvalue()
    assert outcome.exit_code < EXIT_ERROR and not outcome.messages


# ------------------------------------------------------------ each output is its own (issue 29 §0)
# A --prom or --save-baseline file that cannot be written is said, naming the file, and the
# Slurm step after it still runs: one output's failure never skips another.

def test_a_prom_file_that_cannot_be_written_does_not_skip_the_drain(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(node_check_run, "slurm", lambda opts, outcome, **kw: ran.append(kw) or outcome)
    in_the_way = tmp_path / "node.prom"
    in_the_way.mkdir()                                   # a directory at the path
    results = [Result(diagnostic="node-check", target="here", status="ok", summary="")]
    outcome = node_check_run.finish(execute.Options(host=["here"]), Outcome(results), None,
                                    str(in_the_way), out=io.StringIO(), drain=True)
    assert [kw["drain"] for kw in ran] == [True]         # the Slurm step ran
    assert outcome.exit_code >= EXIT_ERROR
    [message] = outcome.messages
    assert message.startswith(f"--prom {in_the_way}: "), message


@pytest.mark.parametrize("broken", [
    OverflowError("int too large to convert to float"),            # a value the writer cannot take
    OSError(errno.ENOSPC, "No space left on device"),               # a full disk
])
def test_any_failure_of_the_prom_writer_is_said_and_the_drain_still_runs(tmp_path, monkeypatch,
                                                                          broken):
    ran = []
    monkeypatch.setattr(node_check_run, "slurm", lambda opts, outcome, **kw: ran.append(kw) or outcome)
    monkeypatch.setattr(node_check_run.prom_mod, "write", lambda path, results: _raise(broken))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # the internal-error traceback file
    path = str(tmp_path / "node.prom")
    outcome = node_check_run.finish(execute.Options(host=["here"]), Outcome([], 1), None, path,
                                    out=io.StringIO(), drain=True)
    assert len(ran) == 1 and outcome.exit_code == EXIT_ERROR
    [message] = outcome.messages
    assert message.startswith(f"--prom {path}: not written: "), message
    if isinstance(broken, OSError):
        assert message == f"--prom {path}: not written: No space left on device"
    else:
        assert "internal error (a bug of ours" in message and "OverflowError" in message


def test_a_baseline_that_cannot_be_written_does_not_skip_the_prom_file_or_the_drain(tmp_path,
                                                                                  monkeypatch):
    ran = []
    monkeypatch.setattr(node_check_run, "slurm", lambda opts, outcome, **kw: ran.append(kw) or outcome)
    results = [Result(diagnostic="node-check", target="here", status="ok", summary="",
                      data={"facts": {"gpu.count": 8}})]
    missing = tmp_path / "no-such-dir" / "base.json"
    prom = tmp_path / "node.prom"
    outcome = node_check_run.finish(execute.Options(host=["here"]), Outcome(results), str(missing),
                                    str(prom), out=io.StringIO(), drain=True)
    assert len(ran) == 1 and prom.exists()
    assert outcome.exit_code >= EXIT_ERROR
    [message] = outcome.messages
    assert message.startswith(f"{missing}: --save-baseline: cannot open its directory: "), message


def _raise(exc):
    raise exc


# ------------------------------------------------------------ --undrain and signals (issue 29 §4)
# The window's phases, each with a signal at exactly that point (the stand-in login host sends
# it to this process as a command returns): whatever the phase, the reservation is deleted and
# every node of the window ends drained again with its old reason (it passed no check), and the
# signal still ends the run as it would have. The real cluster: tests/integration/test_drain.py.

OLD_REASON = "mldiag: xid-48 (node-check by mlsh 2026-12-01T10:00Z)"


class SignallingLogin(WindowLogin):
    """The login host; ``signal_after(word)`` (``create``, ``resume``, ``drain``, ``delete``)
    sends ``sig`` to this process as that command returns, ``times`` times."""

    def __init__(self, sig, after, times=1):
        super().__init__({"n1": ("IDLE", None), "n2": ("IDLE+DRAIN", OLD_REASON),
                          "n3": ("IDLE+DRAIN", OLD_REASON)})
        self.sig, self.after, self.times = sig, after, times

    def run(self, argv, payload, deadline, *, on_stdout=None):
        out = super().run(argv, payload, deadline)
        line = payload.decode().split("\n", 1)[0]
        word = "resume" if "state=resume" in line else "drain" if "state=drain" in line \
            else line.split(" ", 1)[0]
        if word == self.after and self.times:
            self.times -= 1
            os.kill(os.getpid(), self.sig)
        return out


@pytest.fixture
def cluster_hosts(tmp_path):
    path = tmp_path / "hosts.yaml"
    path.write_text("hosts:\n  cluster-a:\n    address: login.a\n    become: sudo\n"
                    "    slurm: {nodes: 4}\n")
    return path


def undrain_with(monkeypatch, hosts_file, fake, check):
    """node_check_run.execute(--undrain) with ``fake`` as the login host and ``check`` as the
    check itself (execute.execute), inside the task layer's signal handling."""
    monkeypatch.setattr(undrain_mod, "transport_for", lambda target, pool: fake)
    monkeypatch.setattr(execute, "execute", check)
    with termination.terminates_like_ctrl_c():
        return node_check_run.execute(execute.Options(host=["cluster-a"], hosts_file=str(hosts_file)),
                                      {"no_dcgm": True}, undrain=True, out=io.StringIO())


def check_that_waits(*args, **kwargs):
    time.sleep(30)                         # the signal arrives first
    raise AssertionError("no signal came")


def check_that_signals(sig):
    def check(opts, job, *, targets, **kwargs):
        os.kill(os.getpid(), sig)
        return check_that_waits()
    return check


def passed(opts, job, *, targets, **kwargs):
    return Outcome([Result(diagnostic="node-check", target=f"cluster-a:{n}", status="ok",
                           summary="") for n in targets[0].slurm.nodelist.split(",")])


def assert_window_closed(fake):
    assert fake.reservations == set()
    assert fake.states["n2"] == fake.states["n3"] == ("IDLE+DRAIN", OLD_REASON)
    assert fake.states["n1"] == ("IDLE", None)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
@pytest.mark.parametrize("after", ["create", "resume"])
def test_a_signal_while_the_window_opens_closes_what_was_opened(monkeypatch, cluster_hosts, capsys,
                                                                sig, after):
    fake = SignallingLogin(sig, after)
    with pytest.raises(KeyboardInterrupt) as caught:
        undrain_with(monkeypatch, cluster_hosts, fake, check_that_waits)
    assert termination.exit_code_of(caught.value) == 128 + sig
    assert_window_closed(fake)
    err = capsys.readouterr().err          # what the closing did is said before the run ends
    resumed = ["n2"] if after == "resume" else []     # the signal came as n2 was resumed
    assert [line.split(":")[2] for line in err.splitlines()
            if "stays drained: the check did not finish" in line] == resumed, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_during_the_check_drains_the_window_again(monkeypatch, cluster_hosts, sig):
    fake = SignallingLogin(sig, None)
    with pytest.raises(KeyboardInterrupt) as caught:
        undrain_with(monkeypatch, cluster_hosts, fake, check_that_signals(sig))
    assert termination.exit_code_of(caught.value) == 128 + sig
    assert_window_closed(fake)


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_during_the_closing_is_ignored(monkeypatch, cluster_hosts, second):
    """Ctrl-C during the check, then Ctrl-C again (or TERM) while the nodes are drained again:
    the closing runs to its end, the reservation included."""
    fake = SignallingLogin(second, "drain", times=2)
    with pytest.raises(KeyboardInterrupt) as caught:
        undrain_with(monkeypatch, cluster_hosts, fake, check_that_signals(signal.SIGINT))
    assert termination.exit_code_of(caught.value) == 130
    assert fake.times == 0                 # both signals were sent during the closing
    assert_window_closed(fake)


def n2_passes_n3_fails(opts, job, *, targets, **kwargs):
    failing = Finding(level="fail", code="xid-79", message="xid-79")
    failing.action = "drain"
    return Outcome([Result(diagnostic="node-check", target="cluster-a:n2", status="ok", summary=""),
                    Result(diagnostic="node-check", target="cluster-a:n3", status="fail",
                           summary="", findings=[failing])])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_first_signal_during_the_closing_waits_for_it_then_ends_the_run(monkeypatch,
                                                                          cluster_hosts, sig):
    """The check is done (n2 passed, n3 failed); a signal as n3 is drained again: the closing
    finishes (the reservation deleted), then the signal ends the run."""
    fake = SignallingLogin(sig, "drain")
    with pytest.raises(KeyboardInterrupt) as caught:
        undrain_with(monkeypatch, cluster_hosts, fake, n2_passes_n3_fails)
    assert termination.exit_code_of(caught.value) == 128 + sig
    assert fake.times == 0 and fake.reservations == set()
    assert fake.states["n2"] == ("IDLE", None)
    assert fake.states["n3"][0] == "IDLE+DRAIN" and fake.states["n3"][1].startswith("mldiag: xid-79 ")
