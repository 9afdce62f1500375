"""Training runs: typed options, the resumable training loop, Hogwild! workers and torchrun ranks,
and their progress reports. The command line is :mod:`revnmt.cli.train`."""

from .config import (
           CHANGEABLE_ON_RESUME,
           DEFAULT_BATCH_SIZE,
           DEFAULT_LR,
           RUN_DEFINING_OPTIONS,
           RunConfig,
           TrainingConfig,
)
from .distributed import DistributedTrainer, Job, process_group
from .hogwild import HogwildTrainer, WorkerError
from .interrupts import Interrupted
from .trainer import TooManyFallbacks, Trainer

__all__ = ["CHANGEABLE_ON_RESUME", "DEFAULT_BATCH_SIZE", "DEFAULT_LR", "RUN_DEFINING_OPTIONS", "DistributedTrainer",
           "HogwildTrainer", "Interrupted", "Job", "RunConfig", "TooManyFallbacks", "Trainer", "TrainingConfig",
           "WorkerError", "process_group"]
