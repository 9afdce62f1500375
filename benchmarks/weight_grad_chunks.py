"""Training-step time of a reversible layer per chunk of recurrent weight gradients (Backend.weight_grad_steps).

    python benchmarks/weight_grad_chunks.py [--chunks 1 2 4 8 16] [--steps 14 50] [--repeats 10]

One 300-unit layer, batch 64, forward and backward sweep with a loss on every output, as in
benchmarks/layers.py. The chunk sizes take turns within each repetition; the median after one
warm-up is printed in ms. The chunk size is set on the layer's backend for the measurement only.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from revnmt.rnn import ReversibleRNN, TensorInput


def _step(rnn: ReversibleRNN, x: torch.Tensor, w: torch.Tensor, mask: torch.Tensor) -> None:
    inputs = TensorInput(x)
    tape = rnn.forward_sweep(inputs, mask)
    rnn.backward_sweep(tape, inputs, output_grads=lambda s, out: w[s])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--steps", type=int, nargs="+", default=[14, 50])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    print(f"training step ms by weight-gradient chunk, batch 64, 300 units, cpu ({torch.get_num_threads()} threads)")
    for cell in ("revgru", "revlstm"):
        for steps in args.steps:
            torch.manual_seed(0)
            rnn = ReversibleRNN(cell, 300, 300)
            backend = rnn.backend_on(torch.device("cpu"))
            x, w = torch.randn(steps, 64, 300), torch.randn(steps, 64, 300)
            mask = torch.ones(steps, 64, dtype=torch.bool)

            times: dict[int, list[float]] = {n: [] for n in args.chunks}
            for _ in range(args.repeats):
                for n in args.chunks:
                    # The backend with another chunk: the sweeps read it from backend_on.
                    variant = dataclasses.replace(backend, weight_grad_steps=n)
                    rnn.backend_on = lambda device, variant=variant: variant
                    start = time.perf_counter()
                    _step(rnn, x, w, mask)
                    times[n].append(time.perf_counter() - start)
            cells = "  ".join(f"{n}: {statistics.median(t[1:]) * 1e3:.1f}" for n, t in times.items())
            print(f"{cell:8} T={steps:<3} {cells}", flush=True)


if __name__ == "__main__":
    main()
