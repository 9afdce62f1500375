"""Activation memory against sentence length: reversal against gradient checkpointing and ordinary models.

    python benchmarks/checkpointing.py                          # T = 14, 50, 200; RevGRU emb+slice, 3 bits
    python benchmarks/checkpointing.py --rnn revlstm --lengths 14 50 200 400 --json FILE
    python benchmarks/checkpointing.py --layers 2 --hidden-size 600 --emb-dim 600 --slice-dim 60   # IWSLT size

For each length T, one synthetic batch of ``--batch`` sentences of T source and T target tokens trains
one step on each model that ``revnmt-memory`` compares (the reversible model; the ordinary model with
``hidden`` attention; the ordinary model with the reversible model's attention; that model checkpointed
at the segment length, among revnmt.memory.report.CHECKPOINT_CANDIDATES, that keeps the least for
backward at this T). Printed per target token: the bytes autograd saves (measured) and the bytes each
step holds outside autograd (its own tally: buffers, checkpoints, detached leaves' gradients), kept
apart as levels. Model sizes default to the paper's Multi30K setup; the vocabularies are Multi30K-sized.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from revnmt.memory.budget import synthetic_batch
from revnmt.memory.report import LABELS, best_checkpoint_steps, comparison_configs, per_token_memory
from revnmt.model import ModelConfig, build_model

SRC_VOCAB, TGT_VOCAB = 5_896, 7_886  # Multi30K's at --min-freq 2


def measure(cfg: ModelConfig, lengths: list[int], sentences: int) -> list[dict]:
    """One row per length: every compared model's saved and held bytes per target token."""
    rows = []
    for length in lengths:
        batch = [synthetic_batch(sentences, length, SRC_VOCAB, TGT_VOCAB, torch.device("cpu"))]
        steps, candidates = best_checkpoint_steps(cfg, batch)
        row = {"length": length, "sentences": sentences, "checkpoint_steps": steps, "saved_bytes_per_token": {},
               "held_bytes_per_token": {}}
        for name, configs in comparison_configs(cfg, steps).items():
            torch.manual_seed(0)
            if name == "checkpointed":  # measured already, as the best candidate
                saved, held, _ = candidates[str(steps)].per_token()
            else:
                saved, held, _ = per_token_memory(build_model(*configs), batch)
            row["saved_bytes_per_token"][name], row["held_bytes_per_token"][name] = saved, held
        rows.append(row)
        print(table_row(row), flush=True)
    return rows


def table_row(row: dict) -> str:
    cells = [f"{row['saved_bytes_per_token'][n]:,.0f} + {row['held_bytes_per_token'][n]:,.0f}" for n in LABELS]
    return f"| {row['length']} | {row['checkpoint_steps']} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rnn", choices=["revgru", "revlstm"], default="revgru")
    parser.add_argument("--attention", choices=["emb", "slice", "emb+slice"], default="emb+slice")
    parser.add_argument("--lengths", type=int, nargs="+", default=[14, 50, 200], help="tokens per sentence, each side")
    parser.add_argument("--batch", type=int, default=32, help="sentences per batch")
    parser.add_argument("--hidden-size", type=int, default=300, help="RNN units (the paper's Multi30K setup: 300)")
    parser.add_argument("--emb-dim", type=int, default=300, help="embedding size")
    parser.add_argument("--layers", type=int, default=1, help="encoder and decoder layers")
    parser.add_argument("--slice-dim", type=int,
                        help="stored slice units (default: 20, or half the units if fewer; the paper's IWSLT "
                        "setup: 60)")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args()
    cfg = ModelConfig(rnn=args.rnn, attention=args.attention, hidden_size=args.hidden_size, emb_dim=args.emb_dim,
                      layers=args.layers, slice_dim=args.slice_dim or min(20, args.hidden_size // 2),
                      src_vocab=SRC_VOCAB, tgt_vocab=TGT_VOCAB)
    print(f"{args.rnn} {args.attention}, {args.layers} layer(s) of {args.hidden_size} units, {args.batch} sentences of "
          f"T tokens a side; per target token, bytes autograd saves + bytes held outside autograd:")
    print("| T | best K | " + " | ".join(LABELS.values()) + " |")
    print("|---:|---:|" + "---:|" * len(LABELS))
    rows = measure(cfg, args.lengths, args.batch)
    if args.json:
        args.json.write_text(json.dumps({"config": cfg.to_dict(), "rows": rows}, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
