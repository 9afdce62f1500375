"""Tests of revnmt.training.interrupts: a signal becomes a stop request; a second Ctrl-C aborts."""

import os
import signal

import pytest

from revnmt.training.interrupts import Interrupted, StopRequest, stop_on_signals


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_requests_a_stop_and_the_handlers_are_restored(signum):
    before = signal.getsignal(signum)
    with stop_on_signals(StopRequest()) as stop:
        assert not stop.requested()
        os.kill(os.getpid(), signum)
        assert stop.requested() and stop.signum == signum
        os.kill(os.getpid(), signal.SIGTERM)  # a later signal does not change which one stopped the run
        assert stop.signum == signum
    assert signal.getsignal(signum) is before


def test_a_second_ctrl_c_aborts():
    with pytest.raises(KeyboardInterrupt), stop_on_signals(StopRequest()):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)


def test_the_exit_status_is_the_shells_for_the_signal():
    assert Interrupted(signal.SIGINT, 7).exit_status == 130 and Interrupted(signal.SIGTERM, 7).exit_status == 143
    assert str(Interrupted(signal.SIGINT, 7)) == "interrupted at step 7; resume with the same command"
