"""Checkpoints: the files a run writes (:mod:`.files`: written atomically, read only once checked), what makes two
checkpoints compatible (:mod:`.compatibility`), and averaging several into one (:mod:`.averaging`)."""

from revnmt.checkpoints.averaging import average_checkpoints
from revnmt.checkpoints.files import (
    BEST_CHECKPOINT,
    LAST_CHECKPOINT,
    RESUMING,
    TRANSLATING,
    CheckpointError,
    load_checkpoint,
    numbered_checkpoint_name,
    numbered_checkpoints,
    prune_numbered_checkpoints,
    resolve_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    validate_checkpoint,
)

__all__ = ["BEST_CHECKPOINT", "LAST_CHECKPOINT", "RESUMING", "TRANSLATING", "CheckpointError", "average_checkpoints",
           "load_checkpoint", "numbered_checkpoint_name", "numbered_checkpoints", "prune_numbered_checkpoints",
           "resolve_checkpoint", "rng_state", "save_checkpoint", "set_rng_state", "validate_checkpoint"]
