"""revnmt-average: average the weights of a run's last checkpoints into one checkpoint to translate with.

    revnmt-average RUN --last N -o FILE          # the last N numbered checkpoints of RUN (--keep-checkpoints)
    revnmt-average A.pt B.pt ... -o FILE         # these checkpoint files
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from revnmt.arguments import positive_int
from revnmt.atomic import check_output, same_file
from revnmt.checkpoints import average_checkpoints, numbered_checkpoints
from revnmt.training.interrupts import exit_on_signals

PROG = "revnmt-average"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """revnmt-average's options; a mistake exits with argparse's message and status 2."""
    parser = argparse.ArgumentParser(
        prog=PROG, description="Write a checkpoint whose weights are the element-wise mean of several checkpoints' "
        "(the last numbered checkpoints of a run, or given files), for revnmt-translate --checkpoint FILE. They must "
        "share vocabularies, tokenization and architecture.")
    parser.add_argument("inputs", nargs="+", metavar="RUN|FILE",
                        help="a run directory trained with --keep-checkpoints (its numbered checkpoints, "
                        "step-<step>.pt), or checkpoint files")
    parser.add_argument("--last", type=positive_int, metavar="N",
                        help="average the last N numbered checkpoints of RUN (default: all it keeps)")
    parser.add_argument("-o", "--output", required=True, metavar="FILE",
                        help="the averaged checkpoint, written atomically (never one of the inputs)")
    args = parser.parse_args(argv)
    if len(args.inputs) > 1 and any(os.path.isdir(path) for path in args.inputs):
        parser.error("give one run directory, or checkpoint files")
    if args.last is not None and not os.path.isdir(args.inputs[0]):
        parser.error("--last picks the last numbered checkpoints of a run directory: give the run directory")
    return args


def checkpoints_to_average(inputs: Sequence[str], last: int | None) -> list[Path]:
    """The checkpoint files the inputs name: a run directory's last ``last`` (else all) numbered
    checkpoints, or the files as given."""
    if not os.path.isdir(inputs[0]):
        return [Path(path) for path in inputs]
    run = inputs[0]
    found = numbered_checkpoints(run)
    if not found:
        raise ValueError(f"{run} holds no numbered checkpoints (step-<step>.pt): train it with --keep-checkpoints N")
    if last is not None and len(found) < last:
        raise ValueError(f"--last {last}: {run} holds only {len(found)} numbered checkpoints "
                         f"({', '.join(path.name for path in found)})")
    return found[-last:] if last is not None else found


def main(argv: Sequence[str] | None = None) -> int:
    """Run revnmt-average with ``argv`` (default: the command line); return the exit status."""
    args = parse_args(argv)
    return exit_on_signals(PROG, lambda: _average(args))


def _average(args: argparse.Namespace) -> int:
    """Average the checkpoints ``args`` name; the exit status."""
    try:
        paths = checkpoints_to_average(args.inputs, args.last)
        # The real file: an atomic write would replace a symbolic link with a copy.
        output = Path(os.path.realpath(args.output))
        if output.exists() and not output.is_file():
            raise ValueError(f"-o {args.output} is not a regular file")
        if any(same_file(output, path) for path in paths):
            raise ValueError(f"-o {args.output} is one of the checkpoints to average: choose another file")
        check_output(output)  # before minutes of loading
        averaged = average_checkpoints(paths)
        # Never a checkpoint that revnmt-translate would refuse. Its weights, of the shapes the inputs share, and
        # its options are the last input's: a misfit is that file's (and every input's).
        averaged.check_weights(paths[-1])
        try:
            averaged.save(output)
        except OSError as error:  # no space left, file too large, quota exceeded: the old file is kept
            raise type(error)(f"cannot write {args.output}: {error.strerror or error}") from error
    # Missing, corrupt or mismatched checkpoints and unwritable outputs are the user's to fix: one line.
    except (OSError, ValueError, RuntimeError) as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    steps = ", ".join(str(step) for step in averaged.averaged_from.steps)
    print(f"{PROG}: averaged {len(paths)} checkpoints (steps {steps}) into {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
