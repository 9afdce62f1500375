"""The decoder's chunked reverse sweep: training speed against memory per token, by chunk size.

    python benchmarks/decoder_chunks.py                           # RevGRU emb+slice, chunks 1 2 4 8
    python benchmarks/decoder_chunks.py --rnn revlstm --chunks 2 4 --json FILE

A reversible decoder undoes ``decoder_chunk_steps`` steps, then runs attention and the loss of their
outputs in one batched call and backpropagates them. For each chunk size the reversible model trains
side by side with its ordinary counterpart (``hidden`` attention) on the same synthetic batches of
Multi30K-sized vocabularies (``revnmt.profiling.speed.tokens_per_second``: the models take turns batch
by batch), and its bytes per target token are measured as ``revnmt-memory`` does: what autograd saves
and what the step holds outside autograd, two levels kept apart. Figures vary with the machine and
its load; compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from revnmt.memory.budget import synthetic_batch
from revnmt.memory.report import ordinary_counterpart, per_token_memory
from revnmt.model import ExecutionConfig, ModelConfig, build_model

SRC_VOCAB, TGT_VOCAB = 5_896, 7_886  # Multi30K's at --min-freq 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rnn", choices=["revgru", "revlstm"], default="revgru")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8], help="decoder chunk sizes to compare")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8, 14, 25],
                        help="tokens per sentence of the batches, taken in turn (Multi30K's are 14 on average)")
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--batches", type=int, default=9, help="timed batches, after 2 of warm-up")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    from revnmt.profiling.speed import tokens_per_second

    cpu = torch.device("cpu")
    lengths = [args.lengths[i % len(args.lengths)] for i in range(args.batches + 2)]
    batches = [synthetic_batch(args.batch, n, SRC_VOCAB, TGT_VOCAB, cpu, seed=i) for i, n in enumerate(lengths)]
    base = ModelConfig(rnn=args.rnn, attention="emb+slice", src_vocab=SRC_VOCAB, tgt_vocab=TGT_VOCAB)
    models = {f"chunk {k}": build_model(base, ExecutionConfig(decoder_chunk_steps=k)) for k in args.chunks}
    models["ordinary"] = build_model(ordinary_counterpart(base))

    def step(model):
        def run(batch):
            model.zero_grad(set_to_none=True)
            model.train_step(batch.src, batch.src_len, batch.tgt_in, batch.tgt_out, normalizer=float(batch.n_tokens))
        return run

    for model in models.values():
        model.train()
    speed = tokens_per_second({name: step(model) for name, model in models.items()}, batches)
    memory_batches = batches[: len(args.lengths)]
    rows = []
    print(f"| {args.rnn} decoder chunk | tokens/s | / ordinary | saved B/token | held B/token | total |")
    print("|---:|---:|---:|---:|---:|---:|")
    for k in args.chunks:
        name = f"chunk {k}"
        saved, held, _ = per_token_memory(models[name], memory_batches)
        row = {"chunk_steps": k, "tokens_per_s": speed[name], "ratio_to_ordinary": speed[name] / speed["ordinary"],
               "saved_bytes_per_token": saved, "held_bytes_per_token": held}
        rows.append(row)
        print(f"| {k} | {row['tokens_per_s']:,.0f} | {row['ratio_to_ordinary']:.2f} | {saved:,.0f} | {held:,.0f} | "
              f"{saved + held:,.0f} |", flush=True)
    print(f"ordinary ({ordinary_counterpart(base).rnn}, hidden attention): {speed['ordinary']:,.0f} tokens/s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "device": f"cpu ({torch.get_num_threads()} threads)", "rnn": args.rnn, "batch": args.batch,
            "lengths": args.lengths, "timed_batches": args.batches, "ordinary_tokens_per_s": speed["ordinary"],
            "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
