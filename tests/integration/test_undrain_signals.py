"""Signals at each phase of node-check --undrain (issue 29 §4) on the lab's real 4-node Slurm
cluster: TERM, HUP or Ctrl-C while the maintenance window is open (the node resumed inside its
reservation, the check running on it) and right as the reservation appears. Whatever the phase:
the run ends as that signal ends one (128 + signal, 130 for Ctrl-C), the reservation is
deleted, the node ends drained again with its old Reason (it passed no check), and no job or
process of the check is left. The phases are found by watching: the check is running once its
`--kernel-log-file`, a FIFO here, has a reader (node-check on the node opened it, and it stays
blocked in read() while our end is open and silent); the reservation, with `scontrol show
reservation` run here as root. Every phase, exactly placed, is also a unit test
(tests/unit/test_node_check_run.py)."""

import errno
import os
import signal
import uuid
from functools import partial

import pytest

from tests.integration.test_drain import reservations, slurm_state, topo  # noqa: F401 (a fixture)
from tests.lab.util import wait_until
from tests.programs import running_mldiag, signal_and_wait

wait_for = partial(wait_until, interval=0.05)
OURS = "mldiag: xid-48 (node-check by mlsh 2026-12-01T10:00Z)"


@pytest.fixture
def cluster(lab):
    """n2 drained by mldiag (as mlsh) before the test; every node IDLE and no reservation after
    it (other tests share the cluster)."""
    c = lab.slurm

    def all_idle():
        for name in _reservation_names(c):
            c.cmd("scontrol", "delete", f"reservationname={name}")
        for node, state in c.node_states().items():
            if state != "idle":
                c.cmd("scontrol", "update", f"nodename={node}", "state=resume")
        c.wait_idle(timeout=30)

    all_idle()
    c.cmd("scontrol", "update", "nodename=n2", "state=drain", f"reason={OURS}", check=True)
    yield c
    all_idle()


def _reservation_names(cluster):
    out = cluster.cmd("scontrol", "show", "reservation", "-o").stdout
    return [w.split("=", 1)[1] for w in out.split() if w.startswith("ReservationName=")]


def mldiag_jobs(lab):
    names = lab.ssh("main", "squeue", "-h", "-u", "mlsh", "-o", "%j").stdout.split()
    return [name for name in names if name.startswith("mldiag")]


def has_reader(fifo):
    """Does something hold the FIFO open for reading? (A writer's non-blocking open says.)"""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return None
        raise
    return fd


def undrain(topo, fifo):
    return running_mldiag("node-check", "--hosts-file", topo.path, "-H", "cluster-a", "--no-dcgm",
                          "--no-color", "--kernel-log-file", str(fifo), "--undrain")


def assert_window_closed(lab, cluster, fifo, drained=("n2",)):
    """The end state every phase must reach."""
    wait_for(lambda: not mldiag_jobs(lab), 20, "the check's job to be gone")
    assert reservations(cluster) == "No reservations in the system"
    for node in cluster.nodes:
        if node in drained:
            wait_for(lambda: slurm_state(cluster, node)[0] == "IDLE+DRAIN", 20,
                     f"{node} to settle drained")
            assert slurm_state(cluster, node) == ("IDLE+DRAIN", OURS)
        else:
            assert slurm_state(cluster, node) == ("IDLE", None)
    wait_for(lambda: has_reader(fifo) is None, 20, "node-check on n2 to be gone")


@pytest.fixture
def fifo(lab):
    path = lab.dir / f"undrain-{uuid.uuid4().hex[:8]}.log"
    os.mkfifo(path)
    path.chmod(0o666)           # node-check reads it as mlsh on the node
    yield path
    path.unlink()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_during_the_check_in_the_window_drains_the_node_again(lab, topo, cluster, fifo,
                                                                       sig):
    writer = []
    with undrain(topo, fifo) as proc:
        try:
            def check_is_reading():
                assert proc.poll() is None, proc.communicate()
                fd = has_reader(fifo)
                if fd is not None:
                    writer.append(fd)
                return fd is not None
            wait_for(check_is_reading, 90, "node-check on n2 to open its kernel log")
            # the window is open: n2 resumed inside its reservation, the check running there
            assert slurm_state(cluster, "n2")[1] is None and "mldiag-undrain-" in reservations(cluster)
            out, err = signal_and_wait(proc, sig, 90)
        finally:
            for fd in writer:
                os.close(fd)
    assert proc.returncode == 128 + sig, (proc.returncode, out, err)
    assert "mldiag: cluster-a:n2: stays drained: the check did not finish" in err, err
    name = "interrupted" if sig == signal.SIGINT else f"terminated ({signal.Signals(sig).name})"
    assert err.splitlines()[-1].startswith(f"mldiag: {name}"), err
    assert_window_closed(lab, cluster, fifo)


def test_term_as_the_reservation_appears_leaves_no_reservation_and_the_node_drained(lab, topo,
                                                                                 cluster, fifo):
    """Every node drained by mldiag: the signal lands between the reservation's creation and
    the check's start (mostly among the four resumes; the exact place varies from run to
    run, the unit tests place it exactly): each of those steps is held until its record is
    kept, so the end state is the same as in any other phase."""
    for node in ("n1", "n3", "n4"):
        cluster.cmd("scontrol", "update", f"nodename={node}", "state=drain", f"reason={OURS}",
                    check=True)
    with undrain(topo, fifo) as proc:
        def reserved():
            assert proc.poll() is None, proc.communicate()
            return _reservation_names(cluster)
        wait_for(reserved, 60, "the maintenance reservation")
        out, err = signal_and_wait(proc, signal.SIGTERM, 90)
    assert proc.returncode == 143, (proc.returncode, out, err)
    assert err.splitlines()[-1].startswith("mldiag: terminated (SIGTERM)"), err
    assert_window_closed(lab, cluster, fifo, drained=cluster.nodes)
