"""Ctrl-C and a scheduler's SIGTERM stop a run cleanly: the current step finishes, ``last.pt`` is written at
the step reached, and the run exits with 128 + the signal's number (130, 143), as shells report a process
ended by that signal. A second Ctrl-C aborts at once.

The handler only sets a flag; the training loop reads it between updates (:meth:`StopRequest.requested`),
so no update is ever cut in half and the checkpoint resumes as exactly as a periodic one. It does not log:
a handler runs between any two bytecodes of the main thread, also inside a log record's write to stderr,
and a second write into the same buffered stream then fails ("reentrant call"). The trainer logs the stop.

Work that has nothing to save stops at once instead, with the same statuses (:func:`raise_on_signals`): the
commands revnmt-translate, revnmt-average, revnmt-memory and revnmt-prepare (:func:`exit_on_signals`), and a
run's own loading, data preparation, dev translation and test translation, which a resume does again.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """Training stopped on a signal after saving; ``exit_status`` is what the command returns."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(f"interrupted at step {step}; resume with the same command")
        self.signum, self.step = signum, step

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class StopRequest:
    """The signal a run was asked to stop by (None while it was not); set by :func:`stop_on_signals`."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def requested(self) -> bool:
        return self.signum is not None

    def request(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum


@contextmanager
def stop_on_signals(stop: StopRequest) -> Iterator[StopRequest]:
    """Turn SIGINT and SIGTERM into ``stop.request(signum)`` for the duration of the block (a second SIGINT
    raises KeyboardInterrupt: abort now). Outside the main thread, where Python cannot set handlers,
    nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        if stop.requested() and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the user insists: no save
        stop.request(signum)

    previous = {signum: signal.signal(signum, handle) for signum in HANDLED}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def ignore_signals() -> None:
    """For worker processes (Hogwild!): a terminal's Ctrl-C reaches the whole process group, but only the
    main process decides when to stop, and tells its workers."""
    for signum in HANDLED:
        signal.signal(signum, signal.SIG_IGN)


class Signalled(BaseException):
    """SIGINT or SIGTERM, raised where the main thread is by :func:`raise_on_signals`. A BaseException, as
    KeyboardInterrupt is, so that no ``except Exception`` takes it for an error of the work it stops."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum, self.exit_status = signum, 128 + signum


#: How soon a stop raised inside a finalizer, where Python drops it, is raised again (see raise_on_signals).
REDELIVERY_S = 0.01


@contextmanager
def raise_on_signals() -> Iterator[None]:
    """Raise SIGINT and SIGTERM as :class:`Signalled` wherever the main thread is, for the duration of the block:
    for work that has nothing to finish or save first (loading, translating, averaging), which then unwinds as an
    error does (an atomic file's temporary is removed, the old file kept). Later signals are ignored while it
    unwinds, which takes moments, so that a second Ctrl-C cannot cut its cleaning up short.

    "Wherever" includes a finalizer: a ``__del__`` (the memory meter's saved-tensor holders run one each time
    autograd frees a saved tensor) or a weakref callback, where Python prints an exception as "ignored" and
    goes on. Such a stop would be lost, and with the signals then ignored the command would run to its end.
    Python reports what it dropped to ``sys.unraisablehook``: there a dropped :class:`Signalled` re-arms the
    handlers and the same signal is sent again a moment later, to land in ordinary code."""
    main = threading.main_thread().ident

    def handle(signum: int, frame: FrameType | None) -> None:
        for handled in HANDLED:
            signal.signal(handled, signal.SIG_IGN)
        raise Signalled(signum)

    def dropped(report: sys.UnraisableHookArgs) -> None:
        if not isinstance(report.exc_value, Signalled):
            previous_hook(report)
            return
        for handled in HANDLED:
            signal.signal(handled, handle)
        again = threading.Timer(REDELIVERY_S, signal.pthread_kill, (main, report.exc_value.signum))
        again.daemon = True  # never holds up the exit it asks for
        again.start()

    previous = {}
    previous_hook, sys.unraisablehook = sys.unraisablehook, dropped
    try:
        for signum in HANDLED:
            previous[signum] = signal.signal(signum, handle)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = previous_hook


def exit_on_signals(prog: str, run: Callable[[], int]) -> int:
    """``run()``'s exit status, for a command that stops at once on SIGINT or SIGTERM (revnmt-translate,
    revnmt-average, revnmt-memory, revnmt-prepare; see :func:`raise_on_signals`): then one line
    (``PROG: interrupted by SIGTERM``) and 128 + the signal's number."""
    try:
        with raise_on_signals():
            return run()
    except Signalled as stop:
        print(f"{prog}: {stop}", file=sys.stderr)
        return stop.exit_status
