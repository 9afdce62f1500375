"""The kernel launches of one training step and each Triton launch's grid, recorded on a CPU without a GPU.

    python benchmarks/launch_trace.py [--rnn revgru revlstm] [--batch 64 8192] [--lengths 25 100] [--json FILE]
        [--decoder-chunk-steps 2] [--sweep-kernels persistent] [--run-kernels] [--layers 2] [--emb-dim 600]
        [--hidden-size 600] [--slice-dim 60] [--src-vocab 5896] [--tgt-vocab 7886]

Why. A reversible step on a GPU is bound by its launches at small batches (each costs the host microseconds,
whatever it does: docs/gpu.md) and at large ones by its smallest grids: a launch of one program runs on one
streaming multiprocessor while the others idle, and the buffer's walks are such launches today. A read of a
device value on the host inside a sweep makes the host wait for the GPU and keeps the sweep from being captured
in a CUDA graph. All three are decided on the host from the shapes, so they can be counted here, and the changes
that aim at them (per-tile buffer stacks, sync-free sweeps) measured without a GPU.

What. For every model (``--rnn``), batch size (``--batch``, sentences) and length (``--lengths``, tokens), one
training step (``model.train_step``: the encoder's and the decoder's forward sweeps, the decoder's reverse with
attention and loss by chunks of ``--decoder-chunk-steps``, the encoder's reverse) of the IWSLT-size model on the
triton backend, on CPU tensors (``TRITON_INTERPRET=1``), on the budget planner's synthetic batch
(``revnmt.memory.budget.synthetic_batch``, every sentence T tokens), after a warm-up step on a tiny batch (it makes
the tables the kernels read once per device).
:class:`~revnmt.profiling.launches.LaunchCounter` records:

- launches per training step: every ATen op but views and allocations (on CUDA about one kernel launch each;
  the products counted as CUDA runs them, oneDNN off) and every Triton kernel run, and per time step (÷ T);
- every Triton launch's grid (all are the fused step kernels' or the buffer's): the smallest and the largest
  number of programs, and each kernel's grids with their launches;
- host reads inside the four sweeps (``.item()``, ``int()``, ``tolist()``, ``torch.equal``, indexing with a mask,
  ...: ``revnmt.profiling.launches.reads_host``), with the buffers checking bad input lazily, as on CUDA, and the
  reads of the checks the sweeps leave (``checks``, ``host_reads_at_checks``: the model reads its forward sweeps'
  error codes and stack heights together after the decoder's forward sweep, and both exactness guards after the
  encoder's reverse, :func:`revnmt.rnn.tape.settle`);
- forward sweeps run again because their stack outgrew the room it was given before the sweep (``reruns``,
  :class:`buffers.StackRoom`).

The Triton kernels are traced, not run (``LaunchCounter(run_kernels=False)``): their grids and number depend on the
shapes only, and at B = 8,192 and 600 units the interpreter, which runs one program at a time in Python, would take
far too long (a RevGRU step at B = 2 takes it half an hour). Their outputs read as zeros, so the states stay zero,
the reversal rebuilds them and the buffer's words never overflow onto its stack: no sweep outgrows its room, as
none does once the room has learned the data. ``--run-kernels`` runs the kernels in Triton's interpreter instead,
for small shapes only; tests/benchmarks/test_launch_trace_benchmark.py holds the two traces equal at a tiny shape,
and the traces of two batches of one shape equal to each other.

With ``--json FILE`` it writes a list of records, one per (model, B, T): ``rnn``, ``batch``, ``length``,
``launches`` (per step), ``launches_per_time_step``, ``triton_launches``, ``min_programs`` and ``max_programs``
(over the Triton launches), ``host_reads`` (inside the sweeps; ``checks`` and ``host_reads_at_checks`` when the
sweeps' checks are read, ``host_reads_in_step`` in the whole step), ``reruns``, each sweep's launches and reads
(``sweeps``) and each kernel's grids (``grids``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch
from machine import cpu_name

from revnmt.memory.budget import synthetic_batch
from revnmt.model import ExecutionConfig, ModelConfig, build_model
from revnmt.model import reversible as reversible_model
from revnmt.model.loss import logit_block
from revnmt.profiling.launches import LaunchCounter, check_lazily
from revnmt.rnn import ReversibleRNN
from revnmt.rnn.backends import SWEEP_KERNELS
from revnmt.rnn.tape import settle

# torch.backends.mkldnn.flags() also sets oneDNN's TF32 switch, which warns on a CPU-only torch.
warnings.filterwarnings("ignore", "TF32 acceleration on top of oneDNN")

#: The model's sizes unless given: the paper's IWSLT size (as benchmarks/batch_scaling.py builds it), Multi30K's
#: vocabularies.
IWSLT = {"layers": 2, "emb_dim": 600, "hidden_size": 600, "slice_dim": 60, "src_vocab": 5896, "tgt_vocab": 7886}
_WARM_UP = (2, 3)  # sentences, tokens


@contextlib.contextmanager
def _sweeps_noted(model, counter: LaunchCounter, reruns: Counter) -> Iterator[None]:
    """Every sweep of ``model`` noted as a section of ``counter``'s launches ("encoder forward", ...), every read of
    the checks the sweeps left (:func:`revnmt.rnn.tape.settle`, called by the model after its forward sweeps and
    after its reverses: the forward sweeps' error codes and stack heights, the reverses' exactness guards) as a
    section "checks", and the times each stack's forward sweep ran again because its stack outgrew its room,
    counted in ``reruns`` ("encoder", "decoder")."""
    def noted(method, kind: str):
        def sweep(rnn: ReversibleRNN, *args, **kwargs):
            with counter.section(f"{_stack(model, rnn)} {kind}"):
                return method(rnn, *args, **kwargs)
        return sweep

    def checks_noted(*tapes):
        with counter.section("checks"):
            return settle(*tapes)

    stacks = [module for module in model.modules() if isinstance(module, ReversibleRNN)]
    before = [rnn.stack_room.reruns for rnn in stacks]
    with (mock.patch.object(ReversibleRNN, "forward_sweep", noted(ReversibleRNN.forward_sweep, "forward")),
          mock.patch.object(ReversibleRNN, "backward_sweep", noted(ReversibleRNN.backward_sweep, "reverse")),
          mock.patch.object(reversible_model, "settle", checks_noted)):
        yield
    for rnn, runs in zip(stacks, before):
        reruns[_stack(model, rnn)] += rnn.stack_room.reruns - runs


def _stack(model, rnn: ReversibleRNN) -> str:
    return "decoder" if rnn is model.decoder else "encoder"


def traced_model(rnn: str, layers: int, emb_dim: int, hidden_size: int, slice_dim: int, src_vocab: int,
                 tgt_vocab: int, decoder_chunk_steps: int = ExecutionConfig.decoder_chunk_steps,
                 sweep_kernels: str = "persistent"):
    """A reversible model with ``emb+slice`` attention on the triton backend in training mode, its sweeps run by
    ``sweep_kernels``, its buffers checking bad input lazily and its loss taking logit blocks as on CUDA."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(rnn=rnn, emb_dim=emb_dim, hidden_size=hidden_size, layers=layers,
                                    attention="emb+slice", slice_dim=slice_dim, src_vocab=src_vocab,
                                    tgt_vocab=tgt_vocab),
                        ExecutionConfig(buffer_backend="triton", decoder_chunk_steps=decoder_chunk_steps,
                                        logit_block=logit_block("cuda"), sweep_kernels=sweep_kernels))
    for rev in (module for module in model.modules() if isinstance(module, ReversibleRNN)):
        check_lazily(rev)
    return model.train()


def trace_step(model, sentences: int, length: int, run_kernels: bool = False, seed: int = 0
               ) -> tuple[LaunchCounter, Counter]:
    """The launches of one training step of ``model`` on a synthetic batch (drawn with ``seed``), its sweeps noted
    as sections, and the reruns of each forward sweep."""
    cfg = model.cfg
    batch = synthetic_batch(sentences, length, cfg.src_vocab, cfg.tgt_vocab, torch.device("cpu"), seed)
    model.zero_grad(set_to_none=True)
    counter, reruns = LaunchCounter(run_kernels=run_kernels), Counter()
    with torch.backends.mkldnn.flags(enabled=False), counter, _sweeps_noted(model, counter, reruns):
        model.train_step(batch.src, batch.src_len, batch.tgt_in, batch.tgt_out, normalizer=float(batch.n_tokens))
    model.zero_grad(set_to_none=True)
    return counter, reruns


def summarize(counter: LaunchCounter, reruns: Counter, rnn: str, sentences: int, length: int) -> dict:
    """One record of the trace: launches, grids and host reads of a step, in all and by sweep."""
    grids = Counter((launch.name, launch.grid) for launch in counter.launches if launch.grid is not None)
    programs = [launch.programs for launch in counter.launches if launch.grid is not None]
    checks = [section for section in counter.sections if section.label == "checks"]
    sweeps = []
    for section in counter.sections:
        if section.label == "checks":
            continue
        launches = counter.launches[section.start:section.end]
        sweeps.append({"sweep": section.label, "launches": len(launches),
                       "triton_launches": sum(launch.grid is not None for launch in launches),
                       "host_reads": sum(launch.reads_host for launch in launches)})
    return {"rnn": rnn, "batch": sentences, "length": length, "launches": counter.count,
            "launches_per_time_step": counter.count / length, "triton_launches": len(programs),
            "min_programs": min(programs), "max_programs": max(programs),
            "host_reads": sum(sweep["host_reads"] for sweep in sweeps), "checks": len(checks),
            "host_reads_at_checks": sum(launch.reads_host for section in checks
                                        for launch in counter.launches[section.start:section.end]),
            "host_reads_in_step": counter.host_reads, "reruns": sum(reruns.values()), "sweeps": sweeps,
            "grids": [{"kernel": name, "grid": list(grid), "launches": n} for (name, grid), n in grids.items()]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rnn", nargs="+", default=["revgru", "revlstm"], choices=["revgru", "revlstm"])
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 8192], help="sentences")
    parser.add_argument("--lengths", type=int, nargs="+", default=[25], help="tokens per sentence")
    parser.add_argument("--run-kernels", action="store_true",
                        help="run the Triton kernels in the interpreter (slow: small shapes only), not only trace them")
    parser.add_argument("--decoder-chunk-steps", type=int, default=ExecutionConfig.decoder_chunk_steps,
                        help="decoder steps reversed before their attention and loss run (revnmt-train's option)")
    parser.add_argument("--sweep-kernels", choices=SWEEP_KERNELS, default="persistent",
                        help="what runs the stacks' sweeps (revnmt-train's option; here the persistent kernels unless "
                        "asked: what this trace was made to count)")
    for name, default in IWSLT.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    mode = "run in Triton's interpreter" if args.run_kernels else "traced, not run"
    print(f"one training step on {cpu_name()}, {torch.get_num_threads()} threads, triton backend, kernels {mode}; "
          f"layers {args.layers}, units {args.hidden_size}, emb+slice attention with {args.slice_dim} slice units, "
          f"decoder chunks of {args.decoder_chunk_steps} steps, sweep kernels {args.sweep_kernels}")
    print(f"{'rnn':8s} {'B':>5s} {'T':>4s} {'launches':>9s} {'per token':>9s} {'triton':>7s} {'min prog':>9s} "
          f"{'max prog':>9s} {'host reads':>10s} {'at checks':>9s} {'reruns':>6s}", flush=True)
    sizes = {name: getattr(args, name) for name in IWSLT}
    records = []
    for rnn in args.rnn:
        model = traced_model(rnn, **sizes, decoder_chunk_steps=args.decoder_chunk_steps,
                             sweep_kernels=args.sweep_kernels)
        trace_step(model, *_WARM_UP)  # the tables the kernels read, made once per device
        for length in args.lengths:
            for sentences in args.batch:
                start = time.perf_counter()
                record = summarize(*trace_step(model, sentences, length, args.run_kernels), rnn, sentences, length)
                record |= {"kernels": "run" if args.run_kernels else "traced",
                           "seconds": round(time.perf_counter() - start, 1)}
                records.append(record)
                print(f"{rnn:8s} {sentences:5d} {length:4d} {record['launches']:9,d} "
                      f"{record['launches_per_time_step']:9.1f} {record['triton_launches']:7,d} "
                      f"{record['min_programs']:9,d} {record['max_programs']:9,d} {record['host_reads']:10d} "
                      f"{record['host_reads_at_checks']:9d} {record['reruns']:6d}", flush=True)
        del model
    if args.json:
        for record in records:
            record |= {"model": sizes, "decoder_chunk_steps": args.decoder_chunk_steps,
                       "sweep_kernels": args.sweep_kernels, "machine": cpu_name()}
        args.json.write_text(json.dumps(records, indent=2) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors, on any machine; before the kernels are imported
    main()
