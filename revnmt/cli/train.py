"""revnmt-train (also ``python train.py``): parse the options into a run config, hold the save directory, run
it (:func:`revnmt.training.run.run`) and turn how it ended into an exit status."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

from revnmt.arguments import TRAIN_PROG as PROG
from revnmt.arguments import run_config
from revnmt.folders import NotOurs
from revnmt.memory.peak import track_freed_memory
from revnmt.training import Interrupted, Job, TooManyFallbacks, WorkerError, process_group
from revnmt.training.graphs import GraphCaptureError
from revnmt.training.interrupts import Signalled, raise_on_signals
from revnmt.training.progress import logging_to
from revnmt.training.run import RunError, run
from revnmt.training.save_dir import SaveDirInUse, locked_save_dir
from revnmt.training.trainer import Diverged

logger = logging.getLogger("revnmt.train")

USAGE_ERROR = 2  # the exit status of argparse errors, used for every mistake in the command or data
TRAINING_FAILED = 1  # training itself failed: a Hogwild! worker, too many reversal fallbacks, divergence


def main(argv: Sequence[str] | None = None) -> int:
    """Run revnmt-train with ``argv`` (default: the command line); return the exit status.

    Under torchrun every rank runs this; rank 0 alone holds the save directory's lock, writes the run
    directory and logs (the others show warnings and errors only).
    """
    if sys.stderr is None:  # started with stderr closed (2>&-): train.log still gets every line
        sys.stderr = open(os.devnull, "w", encoding="utf-8")
    config = run_config(argv)
    if config.training.memory_budget is not None:
        track_freed_memory()  # the RSS then follows what is alive: what the budget bounds (revnmt.memory.peak)
    job = Job.from_env()
    save_dir = Path(config.training.save_dir)
    log_file, level = (save_dir / "train.log", logging.INFO) if job.is_main else (None, logging.WARNING)
    label = f"[rank {job.rank}] " if job.distributed else ""
    with ExitStack() as stack:
        try:
            if job.is_main:
                stack.enter_context(locked_save_dir(save_dir))
            stack.enter_context(logging_to(log_file, level, label))
        except (SaveDirInUse, NotOurs) as error:
            return _fail(str(error))
        except OSError as error:
            return _fail(f"cannot create or write --save-dir {save_dir}: {error.strerror or error}")
        device = stack.enter_context(process_group(config.training.device, job))
        logger.info("%s %s", PROG, " ".join(sys.argv[1:] if argv is None else argv))
        try:
            # Outside the updates (loading, preparing data, the test set) a signal stops the run at once: what it
            # interrupts is done again by the same command. Training installs its own handlers.
            with raise_on_signals():
                run(replace(config, training=replace(config.training, device=device)), job)
            return 0
        except RunError as error:  # the user's to fix: one line, no traceback
            logger.error("%s", error)
            return USAGE_ERROR
        except Interrupted as stop:  # last.pt holds the step reached
            logger.warning("%s", stop)
            return stop.exit_status
        except (WorkerError, TooManyFallbacks, Diverged, GraphCaptureError) as error:  # last.pt: the last good one
            logger.error("%s", error)
            return TRAINING_FAILED
        except Signalled as stop:
            logger.error("%s: nothing was saved since the last checkpoint", stop)
            return stop.exit_status
        except KeyboardInterrupt:  # a second Ctrl-C in training
            logger.error("aborted: nothing was saved since the last checkpoint")
            return 128 + signal.SIGINT


def _fail(message: str) -> int:
    """An error before logging is set up: one line on stderr, argparse's style and status."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return USAGE_ERROR


if __name__ == "__main__":
    sys.exit(main())
