"""How much stack room a sweep gets before it runs, against what it needs, on a trained model's batches.

    python benchmarks/stack_room.py --checkpoint RUN [--batches 200] [--margins 1.0 1.1 1.25 1.5] [--json FILE]

Why. A forward sweep's buffer gets its stack levels before the sweep (buffers.StackRoom: the most levels per push
the sweeps before it reached, times a margin, plus spare levels), so that nothing is read on the host while it runs;
a sweep that outgrows its room runs again. A larger margin allocates more words, a smaller one runs more sweeps
twice. This measures both on the batches a training run sees, with the trained model's gates (they decide how much
is forgotten, and random weights forget otherwise).

What. For each margin, fresh rooms for every stack (the encoder's directions and the decoder), then the forward
sweeps of ``--batches`` training batches of 64 sentences in the order an epoch takes them, in training mode
(dropout on), each batch's sweeps as a training step runs them (no reverse: the room is decided by the forward).
Per stack: the sweeps, the reruns (the first sweep of a stack always reruns: it starts from no room), and the room
over the highest tile's height, summed over the sweeps but the first (the words allocated for every word needed
at the fullest tile). Times nothing.
"""

from __future__ import annotations

import argparse
import json
import logging
from dataclasses import replace
from pathlib import Path

import torch
from machine import cpu_name

from buffers import StackRoom
from revnmt.checkpoints import Checkpoint, resolve_checkpoint
from revnmt.data import BatchSampler, load_data, make_batch
from revnmt.rnn import ReversibleRNN
from revnmt.training import RunConfig


def stacks(model) -> dict[str, ReversibleRNN]:
    """The model's reversible stacks by name."""
    named = {name: module for name, module in model.named_modules() if isinstance(module, ReversibleRNN)}
    return {name.replace("directions.0", "forward").replace("directions.1", "backward"): rnn
            for name, rnn in named.items()}


@torch.no_grad()
def measure(model, batches: list, margin: float) -> dict[str, dict]:
    """Each stack's sweeps, reruns and room against height over ``batches``, its room learned with ``margin``."""
    rnns = stacks(model)
    for rnn in rnns.values():
        rnn.stack_room = StackRoom(margin=margin)
    totals = {name: {"room": 0, "height": 0} for name in rnns}
    for i, batch in enumerate(batches):
        src, tgt_in, tgt_out = batch.src.t(), batch.tgt_in.t(), batch.tgt_out.t()
        _, _, enc_tape, dec_tape, _ = model.forward_sweeps(src, tgt_in, tgt_out, model.draw_masks(src.shape[1],
                                                                                                  src.device))
        tapes = list(getattr(enc_tape, "directions", (enc_tape,))) + [dec_tape]
        for name, tape in zip(rnns, tapes):
            if i > 0:  # the first sweep learns from nothing
                totals[name]["room"] += tape.buffer.capacity
                totals[name]["height"] += max(tape.buffer.heights())
    return {name: {"sweeps": rnn.stack_room.sweeps, "reruns": rnn.stack_room.reruns,
                   "room_over_height": totals[name]["room"] / max(totals[name]["height"], 1)}
            for name, rnn in rnns.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a trained run's folder or checkpoint file")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--margins", type=float, nargs="+", default=[1.0, 1.1, 1.25, 1.5])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    path = resolve_checkpoint(args.checkpoint)
    checkpoint = Checkpoint.load(path, needs=("args",))
    run = RunConfig.from_checkpoint(checkpoint).data
    prepared = path.parent / "data"  # the ids the run prepared, where it keeps them
    data = load_data(replace(run, test=None), checkpoint.data, (checkpoint.src_vocab, checkpoint.tgt_vocab),
                     prepared=prepared if prepared.is_dir() else None, write=False)
    model = checkpoint.trained_model().train()
    sampler = BatchSampler(data.train.lengths, batch_size=args.batch_size, seed=args.seed)
    batches = [make_batch(data.train, idx) for idx in sampler.batches(0)[: args.batches]]
    print(f"{model.cfg.rnn}, {model.cfg.attention} attention, {path}; {len(batches)} training batches of "
          f"{args.batch_size} sentences; {cpu_name()}")
    print(f"{'margin':>6s}  {'stack':22s} {'sweeps':>6s} {'reruns':>6s} {'room / height':>13s}")
    records = []
    for margin in args.margins:
        torch.manual_seed(args.seed)
        for name, figures in measure(model, batches, margin).items():
            records.append({"margin": margin, "stack": name, **figures})
            print(f"{margin:6.2f}  {name:22s} {figures['sweeps']:6d} {figures['reruns']:6d} "
                  f"{figures['room_over_height']:13.2f}", flush=True)
    if args.json:
        meta = {"checkpoint": str(path), "batches": len(batches), "batch_size": args.batch_size, "machine": cpu_name(),
                "rnn": model.cfg.rnn, "attention": model.cfg.attention}
        args.json.write_text(json.dumps([meta | record for record in records], indent=2) + "\n")


if __name__ == "__main__":
    main()
