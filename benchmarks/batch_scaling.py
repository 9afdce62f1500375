"""Step time and memory as the batch grows: a reversible model against its ordinary twin, one training step each.

    python benchmarks/batch_scaling.py --device cuda [--rnn gru revgru] [--sentences 64 512 2048 8192 32768]
        [--lengths 25 10] [--decoder-chunk-steps 2 8] [--sweep-kernels steps persistent] [--cuda-graphs off on]
        [--deadline 140] [--json FILE]

For every model, length and batch size (sentences) it times a training step (forward and backward, no optimizer
update) on the budget planner's synthetic batches (``revnmt.memory.budget.synthetic_batch``): the first step, which
compiles what compiles lazily (Triton's kernels on CUDA), and the median of the last three, with the target tokens
per second and the CUDA allocator's peak allocated bytes (on CPU: ``null``). The model is the paper's IWSLT size
unless given (2 layers, 600 units, 600-dim embeddings, ``emb+slice`` with 60 slice units for the reversible cells,
``hidden`` attention for the ordinary ones), Multi30K's vocabularies. A reversible model runs once per
``--sweep-kernels`` (what runs its sweeps: the per-step kernels or the persistent ones, docs/gpu.md) and
``--decoder-chunk-steps`` (decoder steps reversed before their attention and loss run: on a GPU the launches of a
step fall with a longer chunk, docs/gpu.md#the-launch-trace) and ``--cuda-graphs`` (on: the step captured in CUDA
graphs after one eager step, then replayed, ``revnmt.training.graphs``; the last three steps are replays). A batch
that runs out of memory ends that model's sweep at that length; so does a first step over 90 s, and ``--deadline``
seconds end the run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from revnmt.memory.budget import synthetic_batch
from revnmt.model import ExecutionConfig, ModelConfig, build_model
from revnmt.rnn.backends import SWEEP_KERNELS
from revnmt.training.graphs import GraphedSteps, TrainStep

_SLOW_FIRST_STEP = 90.0  # seconds: larger batches would take longer still


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(model, sentences: int, length: int, device: torch.device, steps: int = 4,
               train_step: TrainStep | None = None) -> list[float]:
    """Seconds of each of ``steps`` training steps on one synthetic batch (fewer if the first is very slow), each
    trained by ``train_step`` (default: ``model.train_step``)."""
    train_step = train_step or model.train_step
    cfg = model.cfg
    batch = synthetic_batch(sentences, length, cfg.src_vocab, cfg.tgt_vocab, device)
    tensors = (batch.src, batch.src_len, batch.tgt_in, batch.tgt_out)
    times = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        _sync(device)
        start = time.perf_counter()
        train_step(*tensors, normalizer=float(batch.n_tokens))
        _sync(device)
        times.append(time.perf_counter() - start)
        if times[0] > _SLOW_FIRST_STEP:
            break
    return times


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rnn", nargs="+", default=["gru", "revgru"])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--emb-dim", type=int, default=600)
    parser.add_argument("--hidden-size", type=int, default=600)
    parser.add_argument("--slice-dim", type=int, default=60)
    parser.add_argument("--src-vocab", type=int, default=5896)
    parser.add_argument("--tgt-vocab", type=int, default=7886)
    parser.add_argument("--sentences", type=int, nargs="+", default=[64, 512, 2048, 8192, 32768])
    parser.add_argument("--lengths", type=int, nargs="+", default=[25, 10])
    parser.add_argument("--decoder-chunk-steps", type=int, nargs="+", default=[ExecutionConfig.decoder_chunk_steps],
                        help="reversible models: each value a run of its own (revnmt-train's option)")
    parser.add_argument("--sweep-kernels", nargs="+", default=[ExecutionConfig.sweep_kernels],
                        choices=SWEEP_KERNELS, help="reversible models: each value a run of its own (revnmt-train's "
                        "option)")
    parser.add_argument("--cuda-graphs", nargs="+", default=[ExecutionConfig.cuda_graphs], choices=("on", "off"),
                        help="reversible models on a GPU: each value a run of its own (revnmt-train's option)")
    parser.add_argument("--deadline", type=float, default=float("inf"), help="seconds; no new batch after them")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if "on" in args.cuda_graphs and device.type != "cuda":
        parser.error("--cuda-graphs on needs --device cuda")
    deadline = time.time() + args.deadline
    rows = []
    reversible = lambda rnn, values: values if rnn.startswith("rev") else [None]  # noqa: E731
    runs = [(rnn, chunk, kernels, graphs) for rnn in args.rnn
            for kernels in reversible(rnn, args.sweep_kernels)
            for chunk in reversible(rnn, args.decoder_chunk_steps)
            for graphs in reversible(rnn, args.cuda_graphs)]
    for rnn, chunk, kernels, graphs in runs:
        torch.manual_seed(0)
        attention = "emb+slice" if rnn.startswith("rev") else "hidden"
        execution = (ExecutionConfig() if chunk is None
                     else ExecutionConfig(decoder_chunk_steps=chunk, sweep_kernels=kernels))
        model = build_model(ModelConfig(rnn=rnn, emb_dim=args.emb_dim, hidden_size=args.hidden_size,
                                        layers=args.layers, attention=attention, slice_dim=args.slice_dim,
                                        src_vocab=args.src_vocab, tgt_vocab=args.tgt_vocab), execution).to(device)
        model.train()
        label = rnn if chunk is None else (f"{rnn} c{chunk}" + (" pers" if kernels == "persistent" else "")
                                           + (" graphs" if graphs == "on" else ""))
        # graphs: one eager step (which compiles), the capture, then three replays
        graphed = GraphedSteps(model, shapes=1, warmup=1) if graphs == "on" else None
        for length in args.lengths:
            for sentences in args.sentences:
                if time.time() > deadline:
                    break
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                try:
                    times = (time_steps(model, sentences, length, device, 5, graphed) if graphed
                             else time_steps(model, sentences, length, device))
                except torch.OutOfMemoryError as error:
                    print(f"{label:16s} {sentences:6d} x {length:3d}: out of memory "
                          f"({str(error).splitlines()[0][:80]})", flush=True)
                    break
                step = statistics.median(times[-3:]) if len(times) > 1 else None
                peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
                rows.append({"rnn": rnn, "decoder_chunk_steps": chunk, "sweep_kernels": kernels, "cuda_graphs": graphs,
                             "sentences": sentences, "length": length,
                             "first_step_s": times[0], "step_s": step,
                             "tokens_per_s": sentences * length / step if step else None,
                             "peak_allocated_bytes": peak})
                figures = (f"step {step * 1e3:9.1f} ms  {sentences * length / step:10,.0f} tok/s" if step
                           else "(first step too slow to go on)")
                memory = f"  peak {peak / 2 ** 20:9,.0f} MiB" if peak is not None else ""
                print(f"{label:16s} {sentences:6d} x {length:3d}: first {times[0]:7.2f} s  {figures}{memory}",
                      flush=True)
                if step is None:
                    break
        del model, graphed
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        config = {k: v for k, v in vars(args).items() if k != "json"}
        config["deadline"] = None if args.deadline == float("inf") else args.deadline
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        args.json.write_text(json.dumps({"device": name, "config": config, "steps": rows}, indent=2) + "\n")

if __name__ == "__main__":
    main()
