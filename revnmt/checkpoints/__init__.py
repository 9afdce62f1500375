"""Checkpoints: what one holds, typed and versioned (:mod:`.record`: :class:`Checkpoint`, the one reader and writer
of the format), the files a run writes (:mod:`.files`: written atomically, read only once checked), what makes two
checkpoints compatible (:mod:`.compatibility`), and averaging several into one (:mod:`.averaging`)."""

from revnmt.checkpoints.averaging import average_checkpoints
from revnmt.checkpoints.files import (
    BEST_CHECKPOINT,
    LAST_CHECKPOINT,
    CheckpointError,
    numbered_checkpoint_name,
    numbered_checkpoints,
    prune_numbered_checkpoints,
    resolve_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from revnmt.checkpoints.record import (
    FORMAT,
    RESUMING,
    AveragedFrom,
    Checkpoint,
    Numerics,
    TrainerState,
    TrainingState,
)

__all__ = ["BEST_CHECKPOINT", "FORMAT", "LAST_CHECKPOINT", "RESUMING", "AveragedFrom", "Checkpoint", "CheckpointError",
           "Numerics", "TrainerState", "TrainingState", "average_checkpoints", "numbered_checkpoint_name",
           "numbered_checkpoints", "prune_numbered_checkpoints", "resolve_checkpoint", "rng_state", "save_checkpoint",
           "set_rng_state"]
