"""Tests of revnmt.training.progress: the reporter's windows, which the log lines and the TensorBoard curves show,
with a progress bar and without."""

import logging
import math

import pytest
import torch

from revnmt.training.progress import StepReporter

logger = logging.getLogger("test_progress")


def _epoch(reporter: StepReporter, losses: list[float | None], tokens: int = 2) -> None:
    """One epoch of updates whose summed losses are ``losses`` (None: skipped), each over ``tokens`` tokens."""
    with reporter.epoch(1, len(losses), 0):
        for step, loss in enumerate(losses, 1):
            reporter.step(step, step, None if loss is None else torch.tensor(loss), tokens, lr=0.5)


@pytest.mark.parametrize("bar", [False, True], ids=["log-lines", "bar"])
def test_windows_close_every_log_every_steps_and_at_the_end_of_the_epoch(bar, caplog):
    windows = []
    reporter = StepReporter(3, logger, lambda: "peak RSS 1 MiB", bar=bar, on_window=windows.append)
    with caplog.at_level(logging.INFO, logger.name):
        _epoch(reporter, [2.0, 4.0, 6.0, 8.0, None, 12.0, 14.0])  # per token: 1, 2, 3, 4, skipped, 6, 7
    assert [(w.step, w.loss, w.lr) for w in windows] == [(3, 2.0, 0.5), (6, 5.0, 0.5), (7, 7.0, 0.5)]
    assert windows[0].ppl == pytest.approx(math.exp(2.0)) and all(w.tokens_per_s > 0 for w in windows)
    lines = [record.getMessage() for record in caplog.records]
    if bar:  # the bar showed the epoch: one line for it, its mean over every token trained
        assert len(lines) == 1 and lines[0].startswith("epoch 1 | step 7 | batch 7/7 | loss 3.833 | ppl 46.2 |")
    else:
        assert [line.split(" | loss ")[0] for line in lines] == [f"epoch 1 | step {s} | batch {s}/7" for s in (3, 6, 7)]
        assert "loss 5.000 | ppl 148.4 | lr 5.00e-01 |" in lines[1] and lines[1].endswith("tok/s | peak RSS 1 MiB")


def test_a_window_of_skipped_updates_has_no_loss_and_an_epoch_ending_on_a_closed_window_adds_none():
    windows = []
    reporter = StepReporter(2, logger, lambda: "", bar=False, on_window=windows.append)
    _epoch(reporter, [None, None, 2.0, 2.0])
    assert [w.step for w in windows] == [2, 4] and math.isnan(windows[0].loss) and windows[1].loss == 1.0
