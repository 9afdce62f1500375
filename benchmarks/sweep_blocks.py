"""The persistent sweeps' launch options on a GPU, side by side with the per-step kernels and cuDNN, in one run.

    python benchmarks/sweep_blocks.py [--variants 64x8 128x8 16x8 32x8 64x4] [--lstm-variant 64x8]
        [--sentences 64 2048] [--length 25] [--deadline 300] [--jsonl FILE]

Why. The persistent sweeps (``--sweep-kernels persistent``, revnmt/rnn/kernels/triton_sweeps.py) compute every
product of a program's 16 sentences with ``tl.dot`` in IEEE float32, ``BLOCK_K`` of the inner dimension at a time,
with 8 warps a program. A variant ``KxW`` runs them with ``BLOCK_K = K`` and ``W`` warps (it replaces the module's
``_options``: the library fixes one set, since the blocks set the products' bits; this script only explores). If a
step's time follows the blocks, the products' loop bounds it; if it hardly moves, something else does.

What. One training step (forward and backward, no optimizer update) of the paper's IWSLT-size model (2 layers, 600
units, 600-dim embeddings; RevGRU emb+slice with 60 slice units, decoder chunks of 8 steps; Multi30K's vocabularies)
on the budget planner's synthetic batch of B sentences of ``--length`` tokens: the first step (with Triton's
compilation) and the median of the next three, for, in this order, cuDNN's GRU (hidden attention), RevGRU's
persistent sweeps in each variant, RevLSTM's in ``--lstm-variant``, and RevGRU on the per-step kernels (the
default). ``--deadline`` seconds end the run. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from batch_scaling import time_steps

from revnmt.model import ExecutionConfig, ModelConfig, build_model
from revnmt.rnn.kernels import triton_sweeps


def _model(rnn: str, sweep_kernels: str, device: torch.device):
    torch.manual_seed(0)
    reversible = rnn.startswith("rev")
    config = ModelConfig(rnn=rnn, emb_dim=600, hidden_size=600, layers=2,
                         attention="emb+slice" if reversible else "hidden", slice_dim=60, src_vocab=5896,
                         tgt_vocab=7886)
    execution = ExecutionConfig(decoder_chunk_steps=8, sweep_kernels=sweep_kernels) if reversible else ExecutionConfig()
    return build_model(config, execution).to(device).train()


def _variant(text: str) -> dict:
    block_k, warps = (int(part) for part in text.split("x"))
    return {"BLOCK_K": block_k, "num_warps": warps}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", nargs="+", default=["64x8", "128x8", "16x8", "32x8", "64x4"],
                        help="BLOCK_KxWARPS for RevGRU's persistent sweeps")
    parser.add_argument("--lstm-variant", default="64x8", help="BLOCK_KxWARPS for RevLSTM's")
    parser.add_argument("--sentences", type=int, nargs="+", default=[64, 2048])
    parser.add_argument("--length", type=int, default=25)
    parser.add_argument("--deadline", type=float, default=300.0, help="seconds; no new batch after them")
    parser.add_argument("--jsonl", type=Path, help="a JSON line per step timed")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    start = time.time()
    out = args.jsonl.open("w") if args.jsonl else None
    fixed_options = triton_sweeps._options
    override: dict = {}
    triton_sweeps._options = lambda tile_rows, lanes: {**fixed_options(tile_rows, lanes), **override}
    print(torch.cuda.get_device_name(device), torch.__version__, flush=True)

    def run(label: str, rnn: str, sweep_kernels: str = "steps") -> None:
        model = _model(rnn, sweep_kernels, device)
        for sentences in args.sentences:
            if time.time() - start > args.deadline:
                print(f"{label}: past the deadline", flush=True)
                return
            times = time_steps(model, sentences, args.length, device)
            first, step = times[0], statistics.median(times[1:])
            row = {"label": label, "rnn": rnn, "sweep_kernels": sweep_kernels if rnn.startswith("rev") else None,
                   "options": dict(override) if sweep_kernels == "persistent" else None, "sentences": sentences,
                   "length": args.length, "first_s": first, "step_ms": step * 1e3,
                   "tokens_per_s": sentences * args.length / step}
            if out:
                out.write(json.dumps(row) + "\n")
                out.flush()
            print(f"{label:28s} {rnn:8s} B={sentences:5d}: first {first:6.2f} s  step {step * 1e3:8.1f} ms  "
                  f"{row['tokens_per_s']:10,.0f} tok/s  (t={time.time() - start:.0f}s)", flush=True)
        del model
        torch.cuda.empty_cache()

    run("cudnn", "gru")
    for text in args.variants:
        override = _variant(text)
        run(f"persistent BK={override['BLOCK_K']} nw={override['num_warps']}", "revgru", "persistent")
    override = _variant(args.lstm_variant)
    run(f"persistent BK={override['BLOCK_K']} nw={override['num_warps']}", "revlstm", "persistent")
    override = {}
    run("per-step kernels", "revgru")
    print(f"done at {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
