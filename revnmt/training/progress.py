"""What a training run shows: logging to train.log and the console, and per-step progress.

On a terminal each epoch gets a tqdm bar (tokens/s, loss, lr, peak memory); otherwise (log files, CI) a plain
log line every ``--log-every`` steps, since a bar redrawn with carriage returns makes logs unreadable.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from revnmt.atomic import open_for_appending
from revnmt.memory.peak import PeakMeter
from revnmt.memory.sizes import format_bytes

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
BAR_REFRESH_S = 1.0  # at most this often the bar's loss is read back (a device sync)


@contextmanager
def logging_to(log_file: str | os.PathLike[str] | None, level: int = logging.INFO, label: str = "") -> Iterator[None]:
    """Send ``level`` and above to stderr and ``log_file`` (appended; none if None) for the duration
    of a run, each line after ``label`` (which tells the processes of a distributed run apart)."""
    root = logging.getLogger()
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    log_stream = None if log_file is None else open_for_appending(log_file)  # never through a symlink
    if log_stream is not None:
        handlers.append(logging.StreamHandler(log_stream))
    old_level = root.level
    for handler in handlers:
        handler.setFormatter(logging.Formatter(label.replace("%", "%%") + LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(level)
    try:
        yield
    finally:  # a run started in-process (tests) leaves the logging as it found it
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
        if log_stream is not None:
            log_stream.close()
        root.setLevel(old_level)


@dataclass(frozen=True)
class Window:
    """The updates of one progress window (since the previous one closed), as its log line and the TensorBoard
    curves show them."""

    step: int  # the window's last update
    loss: float  # mean per target token; NaN when every update was skipped
    lr: float
    tokens_per_s: float

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss, 50))


class StepReporter:
    """Mean loss per target token and throughput over windows of ``log_every`` steps (each epoch's last one
    shorter), each given to ``on_window`` as it closes.

    Without a bar each window is a log line. With one, the bar shows the epoch so far, and the epoch's end one
    log line for the whole epoch. Losses are summed on the device and read back once a window closes (or the bar
    is redrawn), so that reporting does not force a device sync every step.
    """

    def __init__(self, log_every: int, logger: logging.Logger, memory: Callable[[], str], bar: bool | None = None,
                 on_window: Callable[[Window], None] | None = None) -> None:
        """``memory`` says what the run's memory peaked at, for every log line."""
        self.log_every, self.logger, self.memory, self.on_window = log_every, logger, memory, on_window
        self.use_bar = sys.stderr.isatty() if bar is None else bar
        self._bar: tqdm | None = None
        self._reset()

    def _reset(self) -> None:
        self._loss: torch.Tensor | float = 0.0
        self._tokens = 0
        self._start = time.monotonic()

    @contextmanager
    def epoch(self, epoch: int, n_batches: int, done: int) -> Iterator[None]:
        """Report the steps of one epoch (``done`` of its ``n_batches`` already trained)."""
        self._reset()
        self._epoch, self._n_batches, self._batch, self._lr = epoch, n_batches, done, 0.0
        # The windows closed so far, read back: what the bar and the epoch's line add the open window to.
        self._epoch_loss, self._epoch_tokens, self._epoch_start = 0.0, 0, self._start
        if self.use_bar:
            # Log lines written during the epoch go above the bar instead of through it.
            with logging_redirect_tqdm(), tqdm(total=n_batches, initial=done, desc=f"epoch {epoch}", unit="batch",
                                               dynamic_ncols=True, leave=False) as self._bar:
                self._last_refresh = time.monotonic()
                yield
            self._bar = None
        else:
            yield
        if self._tokens:  # the steps since the last window closed
            self._close_window()
        if self.use_bar and self._epoch_tokens:  # the bar has gone: one line for the whole epoch
            self._log(self._mean(self._epoch_loss, self._epoch_tokens, self._epoch_start))

    def step(self, step: int, batch: int, loss: torch.Tensor | None, n_tokens: int, lr: float) -> None:
        """Account for one update: ``loss`` summed over ``n_tokens`` target tokens (None: the update was skipped,
        and counts in neither the mean loss nor the throughput)."""
        if loss is not None:
            self._loss = self._loss + loss.detach()
            self._tokens += n_tokens
        self._step, self._batch, self._lr = step, batch, lr
        if step % self.log_every == 0:
            self._close_window()
        if self._bar is not None:
            self._bar.update(1)
            if time.monotonic() - self._last_refresh >= BAR_REFRESH_S:
                epoch = self._mean(self._epoch_loss + float(self._loss), self._epoch_tokens + self._tokens,
                                   self._epoch_start)
                self._bar.set_postfix_str(self._summary(epoch))
                self._last_refresh = time.monotonic()

    def _close_window(self) -> None:
        """Read the window's loss back, log it (without a bar) and pass it on; the next window starts."""
        loss_sum = float(self._loss)
        window = self._mean(loss_sum, self._tokens, self._start)
        self._epoch_loss += loss_sum
        self._epoch_tokens += self._tokens
        if not self.use_bar:
            self._log(window)
        if self.on_window is not None:
            self.on_window(window)
        self._reset()

    def _mean(self, loss_sum: float, tokens: int, since: float) -> Window:
        """The updates from ``since`` to this step, whose losses summed to ``loss_sum`` over ``tokens`` target
        tokens."""
        return Window(self._step, loss_sum / tokens if tokens else math.nan,  # NaN: every update was skipped
                      self._lr, tokens / max(time.monotonic() - since, 1e-9))

    def _log(self, window: Window) -> None:
        self.logger.info("epoch %d | step %d | batch %d/%d | %s", self._epoch, self._step, self._batch,
                         self._n_batches, self._summary(window))

    def _summary(self, window: Window) -> str:
        return (f"loss {window.loss:.3f} | ppl {window.ppl:.1f} | lr {window.lr:.2e} | {window.tokens_per_s:.0f} "
                f"tok/s | {self.memory()}")


def peak_memory(device: torch.device) -> str:
    """The run's peak memory so far, labelled with what measured it: the process's RSS on CPU, the
    allocator's reserved memory on CUDA (what a memory limit and an out-of-memory error see)."""
    meter = PeakMeter(device)
    return f"peak {meter.what} {format_bytes(meter.peak())}"
