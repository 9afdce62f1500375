"""Training-step time of reversible layers against nn.GRU / nn.LSTM, side by side in one run.

    python benchmarks/layers.py [--device cpu|cuda] [--json FILE] [--breakdown]

One training step = forward + backward of a 1-layer, 300-unit layer over a [T, 64, 300] input with
a loss on every output (so every step's output gradient is needed, as in a decoder). Reversible
layers train by reversal (forward sweep, then reverse-and-recompute sweep); ordinary ones by
autograd. The median of several timed repetitions after a warm-up is reported; the two layers'
repetitions alternate.

``--breakdown`` also profiles the reversal step (cProfile, CPU) and splits its time into matrix
products, the buffer's compiled loops and everything else (small tensor ops, Python). cProfile
slows every Python call, so the step takes longer under it and "everything else" is inflated;
the products' and loops' times are those of the calls themselves.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from revnmt.rnn import ReversibleRNN, TensorInput  # noqa: E402
from revnmt.rnn.ordinary import OrdinaryRNN  # noqa: E402


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time_pair(first, second, device, repeats):
    """Median ms of each function, their repetitions interleaved so that a slow phase of a shared
    machine weighs on both alike."""
    first(), second()  # warm-up
    times = ([], [])
    for _ in range(repeats):
        for fn, out in zip((first, second), times):
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            out.append(time.perf_counter() - t0)
    return tuple(1000 * statistics.median(t) for t in times)


def bench_case(cell: str, steps: int, batch: int, hidden: int, lanes: int | None, device: torch.device,
               repeats: int, breakdown: bool = False) -> dict:
    torch.manual_seed(0)
    x = torch.randn(steps, batch, hidden, device=device, requires_grad=True)
    w = torch.randn(steps, batch, hidden, device=device)
    mask = torch.ones(steps, batch, dtype=torch.bool, device=device)
    rev = ReversibleRNN("rev" + cell, hidden, hidden, max_forget_bits=3, buffer_lanes=lanes).to(device)
    ordinary = OrdinaryRNN(cell, hidden, hidden).to(device)

    def rev_step():
        inputs = TensorInput(x)
        tape = rev.forward_sweep(inputs, mask)
        rev.backward_sweep(tape, inputs, output_grad=lambda t, out: w[t])

    def ordinary_step():
        out, _ = ordinary(x)
        (out * w).sum().backward()

    rev_ms, ord_ms = _time_pair(rev_step, ordinary_step, device, repeats)
    case = {"cell": "rev" + cell, "T": steps, "buffer_lanes": rev.lanes_on(device), "reversible_ms": rev_ms,
            "ordinary_ms": ord_ms,
            "ratio": rev_ms / ord_ms}
    if breakdown:
        case["breakdown_ms"] = profile_breakdown(rev_step, repeats)
    return case


_PRODUCTS = ("torch.mm", "torch._C._nn.linear", "'addmm_'", "'addmm'")


def profile_breakdown(step, repeats: int) -> dict:
    """Per-step ms of ``step`` under cProfile: matrix products, compiled buffer loops, the rest."""
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [step() for _ in range(repeats)])
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (calls, prim calls, own time, cumulative, callers)}
    total = sum(own for _, _, own, _, _ in stats.values())
    products = sum(own for (_, _, name), (_, _, own, _, _) in stats.items() if any(p in name for p in _PRODUCTS))
    loops = sum(own for (file, _, _), (_, _, own, _, _) in stats.items() if file.endswith("cpu_kernels.py"))
    per_step = 1000 / repeats
    return {"profiled_step": total * per_step, "matrix_products": products * per_step,
            "buffer_loops": loops * per_step, "other": (total - products - loops) * per_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=300)
    parser.add_argument("--steps", type=int, nargs="+", default=[14, 50])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--buffer-lanes", type=int, nargs="+", default=[None],
                        help="buffer lanes per row to time (default: the layer's default for the device)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--breakdown", action="store_true",
                        help="also split the reversal step's time into products, buffer loops and the rest (cProfile)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        # The cell must compute identically in the forward and the reverse sweep.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    report = {"device": name, "batch": args.batch, "hidden": args.hidden, "cases": []}
    print(f"training step (forward + backward), batch {args.batch}, {args.hidden} units, 1 layer, on {name}")
    print(f"{'cell':8s} {'T':>4s} {'lanes':>5s} {'reversible ms':>14s} {'ordinary ms':>12s} {'ratio':>6s}")
    for cell in ("gru", "lstm"):
        for steps in args.steps:
            for lanes in args.buffer_lanes:
                case = bench_case(cell, steps, args.batch, args.hidden, lanes, device, args.repeats, args.breakdown)
                report["cases"].append(case)
                print(f"{case['cell']:8s} {steps:4d} {case['buffer_lanes']:5d} {case['reversible_ms']:14.1f} "
                      f"{case['ordinary_ms']:12.1f} {case['ratio']:6.2f}")
                if "breakdown_ms" in case:
                    b = case["breakdown_ms"]
                    print(f"{'':19s}under cProfile {b['profiled_step']:.1f} ms: matrix products {b['matrix_products']:.1f}, "
                          f"buffer loops {b['buffer_loops']:.1f}, other {b['other']:.1f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
