"""What running a fused numba kernel's rows in parallel (``prange``) would save, measured on the gates kernel.

    python benchmarks/row_parallel_loops.py [--json FILE]

Times RevGRU's :func:`revnmt.rnn.kernels.numba_steps.gru_gates` (batch 64, 150 units a half) as it is, one
loop over the rows, against the same loop body under ``prange`` (``parallel=True``), at 1 and 2 numba threads,
after checking that both write the same bits. The other elementwise kernels are loops of the same kind; the
buffer walks (``push_terms``/``pop_terms``) cannot run their rows apart, since every chunk of lanes decides
for all rows at once whether the words grow (docs/performance.md#using-the-second-core).
"""

from __future__ import annotations

import argparse
import json
import time

import numba
import numpy as np
from machine import cpu_name
from numba import njit, prange

from revnmt.rnn.kernels import numba_steps

sigmoid = numba_steps.sigmoid


@njit(nogil=True, error_model="numpy", parallel=True)
def gates_by_rows(pre_zr, p, col, read, s, rh):
    """``gru_gates`` with its rows spread over numba's threads: the same arithmetic per element."""
    rows, half = read.shape
    for b in prange(rows):
        row, p_row, s_row = pre_zr[b], p[b, col: col + 2 * half], s[b]
        for k in range(2 * half):
            s_row[k] = sigmoid(row[k] + p_row[k])
        for j in range(half):
            rh[b, j] = s_row[half + j] * read[b, j]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls timed per kernel and thread count")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    batch, half = 64, 150
    pre = rng.standard_normal((batch, 2 * half), dtype=np.float32)
    p = rng.standard_normal((batch, 5 * half), dtype=np.float32)
    read = rng.standard_normal((batch, half), dtype=np.float32)
    outputs = {name: (np.empty((batch, 2 * half), np.float32), np.empty((batch, half), np.float32))
               for name in ("serial", "prange")}
    kernels = {"serial": numba_steps.gru_gates, "prange": gates_by_rows}
    for name, kernel in kernels.items():
        kernel(pre, p, 0, read, *outputs[name])
    same = all(np.array_equal(a, b) for a, b in zip(outputs["serial"], outputs["prange"]))
    figures = {"cpu": cpu_name(), "threading_layer": None, "same_bits": same, "microseconds": {}}
    for threads in (1, 2):
        numba.set_num_threads(threads)
        for name, kernel in kernels.items():
            start = time.perf_counter()
            for _ in range(args.calls):
                kernel(pre, p, 0, read, *outputs[name])
            figures["microseconds"][f"{name}, {threads} thread{'s' if threads > 1 else ''}"] = round(
                (time.perf_counter() - start) / args.calls * 1e6, 2)
    figures["threading_layer"] = numba.threading_layer()
    print(f"gru_gates, batch {batch}, {half} units a half, on {figures['cpu']} (numba threading layer "
          f"{figures['threading_layer']}); same bits: {same}")
    for label, us in figures["microseconds"].items():
        print(f"  {label:20s} {us:8.2f} µs a call")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(figures, file, indent=2)


if __name__ == "__main__":
    main()
