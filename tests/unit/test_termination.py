"""TERM and HUP become a KeyboardInterrupt (termination.Terminated) while a task runs."""

import os
import signal

import pytest

from diagnostics.core import termination

CAUGHT = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@pytest.mark.parametrize("sig,code,text", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                           (signal.SIGHUP, 129, "terminated (SIGHUP)")])
def test_a_signal_raises_terminated_once_then_leaves_the_signals_ignored(sig, code, text):
    with pytest.raises(KeyboardInterrupt) as caught:
        with termination.terminates_like_ctrl_c() as received:
            try:
                os.kill(os.getpid(), sig)
                signal.pthread_sigmask(signal.SIG_BLOCK, [])   # a bytecode boundary for the handler
            finally:
                os.kill(os.getpid(), sig)     # a second signal during cleanup is ignored
    assert isinstance(caught.value, termination.Terminated) and received.signal is caught.value
    assert termination.exit_code_of(caught.value) == code
    assert termination.describe(caught.value) == text
    # the process exits with 128 + sig: no later signal may end it another way
    assert all(signal.getsignal(s) is signal.SIG_IGN for s in CAUGHT)


def test_a_block_no_signal_ended_gives_the_handlers_back():
    before = {s: signal.getsignal(s) for s in CAUGHT}
    with termination.terminates_like_ctrl_c():
        assert all(signal.getsignal(s) is not before[s] for s in CAUGHT)
    assert {s: signal.getsignal(s) for s in CAUGHT} == before


def test_ctrl_c_keeps_its_own_code_and_words():
    assert termination.exit_code_of(KeyboardInterrupt()) == 130
    assert termination.describe(KeyboardInterrupt()) == "interrupted"


@pytest.mark.parametrize("first, second", [(signal.SIGINT, signal.SIGINT),
                                           (signal.SIGINT, signal.SIGTERM),
                                           (signal.SIGTERM, signal.SIGINT)])
def test_after_the_first_signal_a_second_one_of_any_kind_is_ignored(first, second):
    """A second Ctrl-C during cleanup is ignored as a second TERM is (issue 29 §4): the
    cleanup (scancel, the window closed again) is not cut short."""
    cleaned = []
    with pytest.raises(KeyboardInterrupt) as caught:
        with termination.terminates_like_ctrl_c():
            try:
                os.kill(os.getpid(), first)
                signal.pthread_sigmask(signal.SIG_BLOCK, [])
            finally:
                os.kill(os.getpid(), second)
                signal.pthread_sigmask(signal.SIG_BLOCK, [])
                cleaned.append(True)
    assert cleaned == [True]
    assert termination.exit_code_of(caught.value) == 128 + first
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_an_ignored_ctrl_c_stays_ignored():
    """A process started with SIGINT ignored (a background job of a script) keeps it so, as
    Python itself does."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with termination.terminates_like_ctrl_c():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_held_block_runs_to_its_end_then_the_signal_takes_its_path(sig):
    steps = []
    with pytest.raises(KeyboardInterrupt) as caught:
        with termination.terminates_like_ctrl_c():
            with termination.held():
                os.kill(os.getpid(), sig)
                signal.pthread_sigmask(signal.SIG_BLOCK, [])
                steps.append("after the signal")
            steps.append("after the block")       # never: the signal is raised at its end
    assert steps == ["after the signal"]
    assert termination.exit_code_of(caught.value) == 128 + sig


def test_a_held_block_that_raises_drops_what_it_held():
    with termination.terminates_like_ctrl_c() as received:
        with pytest.raises(ValueError):
            with termination.held():
                os.kill(os.getpid(), signal.SIGTERM)
                signal.pthread_sigmask(signal.SIG_BLOCK, [])
                raise ValueError("the block's own error")
        with termination.held():          # what the first block held is gone with it
            pass
    assert received.signal is None


def test_held_blocks_nest_and_the_outermost_one_raises_what_they_held():
    steps = []
    with pytest.raises(termination.Terminated):
        with termination.terminates_like_ctrl_c():
            with termination.held():
                with termination.held():
                    os.kill(os.getpid(), signal.SIGTERM)
                    signal.pthread_sigmask(signal.SIG_BLOCK, [])
                steps.append("the outer block goes on")
    assert steps == ["the outer block goes on"]


def test_held_outside_a_task_call_takes_the_default_path_after_the_block():
    caught = []
    before = signal.signal(signal.SIGHUP, lambda signum, frame: caught.append(signum))
    try:
        with termination.held():
            os.kill(os.getpid(), signal.SIGHUP)
            signal.pthread_sigmask(signal.SIG_BLOCK, [])
            assert caught == []
        assert caught == [signal.SIGHUP]
    finally:
        signal.signal(signal.SIGHUP, before)
