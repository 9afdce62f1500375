"""What a training step's memory peak is made of: the live tensors at the peak, by where they were allocated.

    python benchmarks/step_memory.py [--rnn revgru] [--layers 2] [--emb-dim 600] [--hidden-size 600]
        [--slice-dim 60] [--sentences 256 1024] [--lengths 10 25 50] [--top 15] [--json FILE]

For every (sentences, length) synthetic batch (``revnmt.memory.budget.synthetic_batch``, the budget planner's
probes) one training step runs under a dispatch mode that follows every tensor storage the step creates until it
is freed (level 3's allocated part, the tensors only: the C heap, numba's numpy scratch and the math libraries'
work buffers are not seen). At the peak of live bytes it records each live storage's allocation site (the
innermost revnmt frame and its caller) and prints them, per target token, largest first, beside the step's
measured peak RSS above what the process held before it (the budget planner's probe). The vocabularies are
Multi30K's sizes (5,896 and 7,886 tokens) unless given.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from revnmt.memory.budget import probe_step_bytes, synthetic_batch
from revnmt.memory.peak import PeakMeter, track_freed_memory
from revnmt.model import ModelConfig, build_model
from revnmt.profiling.live_bytes import LiveBytesBySite


def measure(model, sentences: int, length: int, top: int) -> dict:
    """Peak live tensor bytes of one step by site, and its RSS peak, per target token."""
    cfg = model.cfg
    batch = synthetic_batch(sentences, length, cfg.src_vocab, cfg.tgt_vocab, torch.device("cpu"))
    tokens = sentences * length
    rss = probe_step_bytes(model, batch, PeakMeter("cpu"))
    model.zero_grad(set_to_none=True)
    with LiveBytesBySite() as meter:
        model.train_step(batch.src, batch.src_len, batch.tgt_in, batch.tgt_out, normalizer=float(tokens))
    model.zero_grad(set_to_none=True)
    sites = [{"bytes_per_token": size / tokens, "site": site} for site, size in meter.at_peak.most_common(top)]
    return {"sentences": sentences, "length": length, "rss_per_token": rss / tokens,
            "live_peak_per_token": meter.peak / tokens, "sites": sites}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rnn", default="revgru")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--emb-dim", type=int, default=600)
    parser.add_argument("--hidden-size", type=int, default=600)
    parser.add_argument("--attention", default="emb+slice")
    parser.add_argument("--slice-dim", type=int, default=60)
    parser.add_argument("--src-vocab", type=int, default=5896)
    parser.add_argument("--tgt-vocab", type=int, default=7886)
    parser.add_argument("--sentences", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--lengths", type=int, nargs="+", default=[10, 25, 50])
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    track_freed_memory()
    torch.manual_seed(0)
    model = build_model(ModelConfig(rnn=args.rnn, emb_dim=args.emb_dim, hidden_size=args.hidden_size,
                                    layers=args.layers, attention=args.attention, slice_dim=args.slice_dim,
                                    src_vocab=args.src_vocab, tgt_vocab=args.tgt_vocab))
    probe_step_bytes(model, synthetic_batch(2, 4, args.src_vocab, args.tgt_vocab, torch.device("cpu")),
                     PeakMeter("cpu"))  # warm-up: compile what compiles lazily
    results = []
    for sentences in args.sentences:
        for length in args.lengths:
            result = measure(model, sentences, length, args.top)
            results.append(result)
            print(f"\n{args.rnn}, {sentences} sentences x {length} tokens: peak RSS above before "
                  f"{result['rss_per_token']:,.0f} B/token, live tensors at their peak "
                  f"{result['live_peak_per_token']:,.0f} B/token")
            for row in result["sites"]:
                print(f"  {row['bytes_per_token']:>9,.0f}  {row['site']}")
            sys.stdout.flush()
    if args.json:
        args.json.write_text(json.dumps({"config": vars(args) | {"json": str(args.json)}, "steps": results},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
