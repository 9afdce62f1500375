"""What a CPU training process holds between steps as it meets new batch shapes, by the size of oneDNN's caches.

    python benchmarks/onednn_caches.py [--entries 1024 64 1] [--steps 16] [--rnn revgru] [--hidden-size 300]
        [--tokens 1000] [--json FILE]

Each product of a new shape (a new row count) makes oneDNN compile a kernel, which two caches keep: oneDNN's
primitive cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``) and torch's ideep cache (``LRU_CACHE_CAPACITY``), 1,024
entries each by default. revnmt bounds both (``revnmt.rnn.products.ONEDNN_CACHE_ENTRIES``). Each setting of
``--entries`` (both caches at that size) runs in processes of its own, since the libraries read their sizes at their
first product:

- the *held* run: the model (revnmt-train's defaults, with ``--rnn`` and ``--hidden-size``) trains with Adam on
  ``--steps`` synthetic batches of about ``--tokens`` padded tokens, each of a length drawn from 8 to 30, so nearly
  every step meets a new shape, as a sampler's batches do. After every step it reads the RSS as it is (VmRSS) and
  after ``revnmt.memory.peak.release_free_memory`` (what the heap can give back); the step time is its forward,
  backward and update;
- the *cached* run: steps on shapes A, B, then A again, with ``ONEDNN_VERBOSE=all``; the kernels the third step
  compiles (``create:cache_miss``) say whether a step's products stay cached at that size (0) or are compiled
  again at every step.

Printed per setting: the trimmed RSS after the first and the last step, its growth per step over the second half
of the steps, the median step time, and the third step's compiled kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from revnmt.rnn.products import ONEDNN_CACHES

MiB = 2 ** 20


def _child(args: argparse.Namespace) -> None:
    """One setting's run in this process: the steps, then one JSON line of what was measured."""
    import torch

    from revnmt.memory.budget import synthetic_batch
    from revnmt.memory.peak import PeakMeter, release_free_memory
    from revnmt.model import build_model
    from revnmt.model.config import ModelConfig

    torch.manual_seed(0)
    vocab = 8000
    model = build_model(ModelConfig(rnn=args.rnn, emb_dim=args.hidden_size, hidden_size=args.hidden_size,
                                    slice_dim=min(20, args.hidden_size // 2), src_vocab=vocab, tgt_vocab=vocab))
    optimizer = torch.optim.Adam(model.parameters())
    cpu = torch.device("cpu")
    meter = PeakMeter(cpu)
    rng = random.Random(0)
    lengths = [rng.randint(8, 30) for _ in range(args.steps)] if args.child == "held" else [12, 25, 12]
    raw, trimmed, seconds = [], [], []
    for step, length in enumerate(lengths):
        batch = synthetic_batch(max(1, args.tokens // length), length, vocab, vocab, cpu, seed=step)
        print(f"=== step {step}", flush=True)  # the cached run's ONEDNN_VERBOSE lines are counted per step
        start = time.perf_counter()
        model.train_step(batch.src, batch.src_len, batch.tgt_in, batch.tgt_out, normalizer=float(batch.n_tokens))
        optimizer.step()
        model.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - start)
        del batch
        raw.append(meter.current())
        release_free_memory(cpu)  # garbage collected and the heap trimmed, after the step's timing
        trimmed.append(meter.current())
    print("RESULT " + json.dumps({"lengths": lengths, "rss": raw, "rss_trimmed": trimmed, "seconds": seconds}),
          flush=True)


def _run(args: argparse.Namespace, entries: int, kind: str) -> tuple[dict, list[str]]:
    env = dict(os.environ, **{name: str(entries) for name in ONEDNN_CACHES})
    if kind == "cached":
        env["ONEDNN_VERBOSE"] = "all"
    command = [sys.executable, __file__, "--child", kind, "--steps", str(args.steps), "--rnn", args.rnn,
               "--hidden-size", str(args.hidden_size), "--tokens", str(args.tokens)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the {kind} run with {entries} entries failed:\n{done.stderr[-3000:]}")
    lines = done.stdout.splitlines()
    result = json.loads(next(line for line in lines if line.startswith("RESULT "))[len("RESULT "):])
    return result, lines


def _compiled_in_last_step(lines: list[str]) -> int:
    """The kernels compiled (``create:cache_miss``) after the last ``=== step`` marker."""
    last = max(i for i, line in enumerate(lines) if line.startswith("=== step"))
    return sum("create:cache_miss" in line for line in lines[last:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, nargs="+", default=[1024, 64, 1],
                        help="cache sizes to compare, each for both caches (1024: the libraries' default)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rnn", default="revgru")
    parser.add_argument("--hidden-size", type=int, default=300)
    parser.add_argument("--tokens", type=int, default=1000, help="padded tokens a batch, about")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument("--child", choices=["held", "cached"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return

    threads = os.environ.get("OMP_NUM_THREADS", "all cores")
    print(f"{args.rnn}, {args.hidden_size} units, {args.steps} steps of about {args.tokens} padded tokens, CPU, "
          f"threads: {threads}")
    print(f"{'entries':>8} {'held, step 1':>13} {'held, last':>11} {'growth a step':>14} {'step, median':>13} "
          f"{'kernels compiled again':>23}")
    report = {"rnn": args.rnn, "hidden_size": args.hidden_size, "steps": args.steps, "tokens": args.tokens,
              "threads": threads, "settings": {}}
    for entries in args.entries:
        held, _ = _run(args, entries, "held")
        _, lines = _run(args, entries, "cached")
        trimmed, half = held["rss_trimmed"], args.steps // 2
        growth = (trimmed[-1] - trimmed[half - 1]) / (args.steps - half)
        compiled = _compiled_in_last_step(lines)
        report["settings"][entries] = held | {"growth_per_step": growth, "compiled_in_repeated_step": compiled}
        print(f"{entries:>8} {trimmed[0] / MiB:>9.1f} MiB {trimmed[-1] / MiB:>7.1f} MiB {growth / MiB:>10.2f} MiB "
              f"{statistics.median(held['seconds']) * 1e3:>10.0f} ms {compiled:>23}", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
