"""A run's training curves for TensorBoard (``--tensorboard``), in ``SAVE_DIR/tensorboard``.

They are written through ``torch.utils.tensorboard``, which needs the ``tensorboard`` package: an optional extra
(``pip install 'revnmt[tensorboard]'``), imported only by a run that asks for curves. Every point lies at its
update step:

- ``train/loss``, ``train/ppl`` (per target token), ``train/lr``, ``train/tokens_per_s``, ``train/peak_memory_MiB``
  (the run's peak so far, measured as its log lines measure it) and ``train/reversal_fallbacks`` (batches trained by
  backpropagation so far), each time a progress window closes: every ``--log-every`` steps and at an epoch's end;
- ``dev/loss``, ``dev/ppl`` and ``dev/bleu`` (sacreBLEU) at each validation.

A resumed run continues the same curves. Its writer opens a new event file that starts with a purge step, one past
its checkpoint's step: TensorBoard then drops what an interrupted run wrote after its last checkpoint (steps the
resumed run trains again), and the curves go on from the checkpoint as if the run had never stopped. The
checkpoint's own step keeps its points (the window a Ctrl-C cut short, the validation the checkpoint was saved
after), as the resumed run draws nothing there again; a validation that a signal cut short had drawn nothing, and
the resumed run draws it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from .progress import Window

TENSORBOARD_DIR = "tensorboard"  # in the run's directory
MIB = 2**20


class TensorBoardMissing(RuntimeError):
    """``--tensorboard`` was asked for, and the tensorboard package is not installed."""


def require_tensorboard() -> type:
    """``torch.utils.tensorboard.SummaryWriter``; TensorBoardMissing, saying what to install, without the package
    (or with one that cannot be imported: too old, or at odds with its dependencies, which the message then
    quotes)."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as error:
        why = "" if isinstance(error, ModuleNotFoundError) else f" ({error})"
        raise TensorBoardMissing(f"--tensorboard needs the tensorboard package: pip install 'revnmt[tensorboard]'{why}"
                                 ) from None
    return SummaryWriter


class Curves:
    """The writer of one run's curves in ``folder``, from the update after ``step`` on (see the module's
    docstring); a context manager that closes it, writing what it still holds, however the run ends."""

    def __init__(self, folder: str | os.PathLike[str], step: int, peak_bytes: Callable[[], int]) -> None:
        """``peak_bytes`` measures the run's peak memory so far. OSError, saying why, if ``folder`` cannot be made
        or is not a folder itself (a symlink, a file)."""
        summary_writer = require_tensorboard()
        folder = Path(folder)
        _own_folder(folder)
        self._writer = summary_writer(str(folder), purge_step=step + 1)
        self._peak_bytes = peak_bytes

    def train(self, window: Window, reversal_fallbacks: int) -> None:
        """The points of a closed progress window, with the run's peak memory and reversal fallbacks so far."""
        for tag, value in (("loss", window.loss), ("ppl", window.ppl), ("lr", window.lr),
                           ("tokens_per_s", window.tokens_per_s), ("peak_memory_MiB", self._peak_bytes() / MIB),
                           ("reversal_fallbacks", reversal_fallbacks)):
            self._writer.add_scalar(f"train/{tag}", value, window.step)

    def dev(self, step: int, loss: float, ppl: float, bleu: float) -> None:
        """The points of the validation after update ``step``, written to disk at once: validations are rare,
        and their scores are what a user watches for."""
        for tag, value in (("loss", loss), ("ppl", ppl), ("bleu", bleu)):
            self._writer.add_scalar(f"dev/{tag}", value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> Curves:
        return self

    def __exit__(self, error_type: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _own_folder(folder: Path) -> None:
    """Make ``folder``, or check that it is a folder itself: a symlink there (to a folder elsewhere) is refused,
    never written through, as the run's other files are not."""
    try:
        folder.mkdir()
    except FileExistsError:
        pass
    mode = os.lstat(folder).st_mode
    if stat.S_ISLNK(mode):
        raise OSError(errno.ELOOP, "it is a symbolic link, which revnmt does not write through: remove it")
    if not stat.S_ISDIR(mode):
        raise OSError(errno.ENOTDIR, "it is not a folder: remove it")
