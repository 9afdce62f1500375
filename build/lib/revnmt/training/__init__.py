"""Training runs: typed options, the resumable training loop, Hogwild! workers and torchrun ranks,
and their progress reports. The command line is :mod:`revnmt.cli.train`."""

from .config import DEFAULT_BATCH_SIZE, DEFAULT_LR, RUN_DEFINING, RunConfig, TrainingConfig
from .distributed import DistributedTrainer, Job, process_group
from .hogwild import HogwildTrainer, WorkerError
from .trainer import Trainer

__all__ = ["DEFAULT_BATCH_SIZE", "DEFAULT_LR", "RUN_DEFINING", "DistributedTrainer", "HogwildTrainer", "Job",
           "RunConfig", "Trainer", "TrainingConfig", "WorkerError", "process_group"]
