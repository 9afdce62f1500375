"""Benchmark the information buffer: push/pop throughput and how close storage gets to the optimum.

    python benchmarks/buffer_throughput.py [--device cpu|cuda] [--json FILE]

Prints lane-steps per second (one lane-step = one (row, unit) multiplied exactly once) for
push_mul and pop_div, and, for gates like a trained model's (σ of N(1, 1.5) under 3-bit max
forgetting), the bits the buffer allocates against the information-theoretic optimum
(Σ −log2 z*). Storage figures are analytic bit counts of the buffer's words (level 1 of the memory
levels in docs/memory.md), not allocator readings.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from buffers import (
    FORGET_ONE,
    HIDDEN_RADIX,
    TILE_ROWS,
    ForgetLimit,
    InformationBuffer,
    checked_add,
    quantize_forget,
    restrict_forget,
    to_fixed,
)


def trained_like_gates(steps: int, batch: int, units: int, max_bits: int, device: torch.device,
                       seed: int = 0) -> list[torch.Tensor]:
    """Quantized forget numerators z* = round(1024·(m·σ(a) + 1 − m)), a ~ N(1, 1.5)."""
    gen = torch.Generator().manual_seed(seed)
    pre = torch.randn(steps, batch, units, generator=gen) * 1.5 + 1.0
    limit = ForgetLimit(max_bits)
    z = quantize_forget(restrict_forget(torch.sigmoid(pre), limit), limit)
    return list(z.to(device))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def throughput(device: torch.device, batch: int, units: int, steps: int, max_bits: int) -> dict:
    """Lane-steps per second for push and pop over a full sequence (after one warm-up run)."""
    zs = trained_like_gates(steps, batch, units, max_bits, device)
    h0 = torch.randint(-(1 << HIDDEN_RADIX), 1 << HIDDEN_RADIX, (batch, units), dtype=torch.int32, device=device)
    mask = torch.ones(batch, dtype=torch.bool, device=device)
    result = {}
    for _ in range(2):  # the first pass warms up allocator and kernels
        buf = InformationBuffer(batch, units, device=device, limit=ForgetLimit(max_bits))
        _sync(device)
        t0 = time.perf_counter()
        h = h0
        for z in zs:
            h = buf.push_mul(h, z, mask)
        _sync(device)
        t1 = time.perf_counter()
        for z in reversed(zs):
            h = buf.pop_div(h, z, mask)
        _sync(device)
        t2 = time.perf_counter()
        if not (torch.equal(h, h0) and buf.is_empty()):
            raise AssertionError("buffer round trip was not exact")
        lane_steps = steps * batch * units
        result = {"push_lane_steps_per_s": lane_steps / (t1 - t0), "pop_lane_steps_per_s": lane_steps / (t2 - t1),
                  "host_syncs": buf.syncs, "steps": steps}
    return result


def storage(device: torch.device, batch: int, units: int, steps: int, groups: int, max_bits: int,
            lanes: int, tile: int) -> dict:
    """Allocated and optimal bits after `steps` steps of `groups` state groups sharing the buffer.

    Each step is a GRU-like update h ← z·h + (1 − z)·g with g uniform in (−1, 1), so the states
    keep full-entropy low bits as a real RNN's do (a constant state would have nothing to lose).
    """
    zs = trained_like_gates(steps * groups, batch, units, max_bits, device, seed=1)
    gen = torch.Generator().manual_seed(2)
    buf = InformationBuffer(batch, lanes, device=device, limit=ForgetLimit(max_bits), tile_rows=tile)
    h = to_fixed(torch.rand(batch, units, generator=gen) * 2 - 1).to(device)
    for z in zs:
        g = (torch.rand(batch, units, generator=gen) * 2 - 1).to(device)
        h = checked_add(buf.push_mul(h, z), to_fixed((1 - z / FORGET_ONE) * g))
    return {"steps": steps, "groups": groups, "lanes": lanes, "tile": tile,
            "words_per_lane": buf.words_in_use() / (batch * lanes),
            "allocated_bits": buf.allocated_bits(), "reserved_bits": buf.reserved_bits(),
            "optimal_bits": buf.optimal_bits(), "allocated_over_optimal": buf.allocated_bits() / buf.optimal_bits(),
            "baseline_over_allocated": 32 * steps * groups * batch * units / buf.allocated_bits()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: every available device)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--units", type=int, default=150)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--max-bits", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    devices = [args.device] if args.device else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    report = {"batch": args.batch, "units": args.units, "max_bits": args.max_bits, "throughput": {}, "storage": []}
    print(f"InformationBuffer, batch {args.batch} x {args.units} units, gates sigma(N(1, 1.5)) at "
          f"{args.max_bits}-bit max forgetting")
    for name in devices:
        dev = torch.device(name)
        tp = throughput(dev, args.batch, args.units, args.steps, args.max_bits)
        report["throughput"][name] = tp
        print(f"  {name:5s} push {tp['push_lane_steps_per_s'] / 1e6:8.1f} M lane-steps/s   "
              f"pop {tp['pop_lane_steps_per_s'] / 1e6:8.1f} M lane-steps/s   "
              f"host syncs {tp['host_syncs']} in {tp['steps']} pushes")

    print("\n  steps  groups  lanes   tile  words/lane  allocated/optimal  32-bit-states/allocated")
    s, u, b, t = args.steps, args.units, args.batch, TILE_ROWS
    cases = [(s, 1, u, t), (s, 2, u, t), (4 * s, 1, u, t), (20 * s, 1, u, t), (s, 1, 32, t), (s, 2, 32, t),
             (s, 2, 16, b), (s, 2, 16, t), (s, 2, 3, b), (s, 2, 3, t)]
    for steps, groups, lanes, tile in cases:
        row = storage(torch.device(devices[0]), args.batch, u, steps, groups, args.max_bits, lanes, tile)
        report["storage"].append(row)
        print(f"  {steps:5d}  {groups:6d}  {lanes:5d}  {tile:5d}  {row['words_per_lane']:10.1f}  "
              f"{row['allocated_over_optimal']:17.2f}  {row['baseline_over_allocated']:23.1f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
