"""TERM and HUP become a KeyboardInterrupt (termination.Terminated) while a task runs."""

import os
import signal

import pytest

from diagnostics import termination


@pytest.mark.parametrize("sig,code,text", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                           (signal.SIGHUP, 129, "terminated (SIGHUP)")])
def test_a_signal_raises_terminated_once_then_handlers_come_back(sig, code, text):
    before = signal.getsignal(sig)
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
    assert signal.getsignal(sig) is before


def test_ctrl_c_keeps_its_own_code_and_words():
    assert termination.exit_code_of(KeyboardInterrupt()) == 130
    assert termination.describe(KeyboardInterrupt()) == "interrupted"
