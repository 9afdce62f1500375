"""The information buffer's tiles: words in use, allocated and flagged after a forward sweep, per tile size.

Runs the forward sweep of an IWSLT-size reversible stack (2 layers of 600 units, 256-dim inputs, a 60-unit
attention slice, 3-bit forgetting, random weights and inputs) over a batch of sentences of random lengths between
T/2 and T, sorted longest first as the bucketing sampler's batches are, and reads the buffer when it is fullest.
The stack's room is given before the sweep, learned from the sweeps before it (buffers.room), so each shape is
swept twice, on two batches of it: the first teaches the room, the second is measured, as every sweep of a training
run but its first few is.

- words in use: each tile's stacked words and its live one, over all lanes (what the buffer must hold);
- allocated: the stack's levels (the room and the spare one above it), all tiles alike, plus the live words (what
  it does hold);
- heights: the highest tile's and the mean, the room (levels given before the sweep) and the proven bound (every
  push forgetting 3 bits in every lane), which a room taken from the arithmetic alone would have to be;
- flag bytes: a bit per push and tile;
- reruns: measured sweeps that outgrew their room and ran again.

    python benchmarks/buffer_tiles.py --json FILE

Times nothing: a CPU answers for every device (the words are the same bits on each backend).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from revnmt.rnn import ReversibleRNN, TensorInput

INPUT, HIDDEN, SLICE, LAYERS = 256, 600, 60, 2


def measure(cell: str, batch: int, steps: int, lanes: int, tile: int, seed: int = 0) -> dict:
    """The buffer of one forward sweep, at its fullest, after a sweep of another batch of the shape (see the module
    docstring)."""
    torch.manual_seed(seed)
    rnn = ReversibleRNN(cell, INPUT, HIDDEN, num_layers=LAYERS, slice_dim=SLICE, max_forget_bits=3,
                        buffer_lanes=lanes, buffer_backend="numba", buffer_tile=tile)
    measured = _batch(batch, steps, None)
    with torch.no_grad():
        rnn.forward_sweep(*_batch(batch, steps, torch.Generator().manual_seed(seed + 1)))  # teaches the room
        reruns = rnn.stack_room.reruns
        words = rnn.forward_sweep(*measured).buffer.words
    heights = words.heights()
    return {"cell": cell, "batch": batch, "steps": steps, "lanes": words.lanes, "tile": words.tile_rows,
            "words_in_use": words.words_in_use(), "allocated_words": words.stack.numel() + words.curr.numel(),
            "max_height": max(heights), "mean_height": sum(heights) / len(heights), "room": words.capacity,
            "proven_height": words.proven_height(words.pushes),
            "flag_bytes": (words.pushes * words.tiles + 7) // 8, "reruns": rnn.stack_room.reruns - reruns}


def _batch(batch: int, steps: int, generator: torch.Generator | None) -> tuple[TensorInput, torch.Tensor]:
    """Random inputs of ``batch`` sentences of random lengths in [T/2, T], the longest T, sorted longest first."""
    lengths = torch.randint(steps // 2, steps + 1, (batch,), generator=generator).sort(descending=True).values
    lengths[0] = steps
    mask = torch.arange(steps)[:, None] < lengths[None]
    return TensorInput(torch.randn(steps, batch, INPUT, generator=generator)), mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", default=["revgru", "revlstm"], choices=["revgru", "revlstm"])
    parser.add_argument("--shapes", nargs="+", default=["64x25", "256x25", "64x50"], help="BATCHxSTEPS")
    parser.add_argument("--lanes", type=int, nargs="+", default=[3, 16], help="lanes per sentence (3: numba's "
                        "default, 16: triton's and torch's)")
    parser.add_argument("--tiles", type=int, nargs="+", default=[4, 8, 16], help="sentences per tile")
    parser.add_argument("--json", type=Path, help="also write the records to this file")
    args = parser.parse_args()
    records = []
    print("cell       B    T  lanes  tile  words in use   allocated  max h  mean h  room  proven h  flag bytes  reruns")
    for cell in args.cells:
        for shape in args.shapes:
            batch, steps = map(int, shape.split("x"))
            for lanes in args.lanes:
                for tile in args.tiles:
                    r = measure(cell, batch, steps, lanes, tile)
                    records.append(r)
                    print(f"{cell:8s} {batch:4d} {steps:4d} {r['lanes']:6d} {r['tile']:5d} {r['words_in_use']:13,d} "
                          f"{r['allocated_words']:11,d} {r['max_height']:6d} {r['mean_height']:7.1f} {r['room']:5d} "
                          f"{r['proven_height']:9d} {r['flag_bytes']:11,d} {r['reruns']:7d}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    main()
