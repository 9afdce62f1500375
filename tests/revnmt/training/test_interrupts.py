"""Tests of revnmt.training.interrupts: a signal becomes a stop request; a second Ctrl-C aborts; work that stops at
once stops, even when the signal lands in a finalizer."""

import os
import signal
import threading
import time

import pytest

from revnmt.training.interrupts import (
    Interrupted,
    Signalled,
    StopRequest,
    exit_on_signals,
    raise_on_signals,
    stop_on_signals,
)


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


class _SlowFinalizer:
    """An object whose ``__del__`` runs long enough for a signal to arrive inside it."""

    def __del__(self) -> None:
        deadline = time.monotonic() + 0.2
        while time.monotonic() < deadline:
            pass


def test_a_signal_that_lands_in_a_finalizer_still_stops_the_work():
    # Python drops an exception raised in __del__ ("Exception ignored in ..."): the stop must come again.
    before = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM))
    with pytest.raises(Signalled) as stopped, raise_on_signals():
        timer.start()
        _SlowFinalizer()  # dropped at once: the signal arrives while its __del__ runs
        time.sleep(5)  # where the repeated stop lands
    assert stopped.value.exit_status == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before


def test_exit_on_signals_says_one_line_and_returns_the_shells_status(capsys):
    assert exit_on_signals("revnmt-x", lambda: os.kill(os.getpid(), signal.SIGINT) or 0) == 130
    assert capsys.readouterr().err == "revnmt-x: interrupted by SIGINT\n"
