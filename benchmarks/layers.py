"""Training-step time of reversible layers against nn.GRU / nn.LSTM, side by side in one run.

    python benchmarks/layers.py [--device cpu|cuda] [--backend auto|numba|torch|triton] [--json FILE] [--breakdown]
    python benchmarks/layers.py --count-kernels [--device cpu|cuda] [--json FILE]
    python benchmarks/layers.py --batch-sizes 1 8 64 256 [--steps 50] [--json FILE]
    python benchmarks/layers.py --products [--device cpu|cuda] [--json FILE]

One training step = forward + backward of a 1-layer, 300-unit layer over a [T, 64, 300] input with
a loss on every output (so every step's output gradient is needed, as in a decoder). Reversible
layers train by reversal (forward sweep, then reverse-and-recompute sweep); ordinary ones by
autograd. The median of several timed repetitions after a warm-up is reported; the two layers'
repetitions alternate.

``--breakdown`` also profiles the reversal step (cProfile, CPU) and splits its time into matrix
products, the compiled loops (the buffer's and the fused steps') and everything else (small tensor
ops, Python). cProfile slows every Python call, so the step takes longer under it and "everything
else" is inflated; the products' and loops' times are those of the calls themselves.

``--batch-sizes`` times the step at every batch size instead of ``--batch`` and prints training tokens
per second (batch × T per step) of both layers and how each scales from the first batch size: a layer
whose step costs about the same at every batch size (launch- or Python-bound) scales with the batch.

``--products`` times the matrix products of a step (batch 64, 300 units, RevLSTM's shapes, chunks of 2 steps
for the input projection) both ways, ``torch.mm`` (the BLAS torch was built with) and ``revnmt.rnn.products.linear``
(the sweeps' products: oneDNN on a CPU), and prints GFLOP/s of each: the seam's choice, measured.

``--count-kernels`` times nothing: it counts the ops each buffer backend dispatches per layer and time step in
the forward and the reverse sweep (RevGRU and RevLSTM, batch 64, 300 units, T = 20, errors kept on the device as
on CUDA); the reverse as a decoder's (a loss gradient on every output, reversed by chunks: each step but a chunk's
first is undone, then backpropagated) and as an encoder's (no output gradients). Every ATen op but views and
``empty*`` counts, which on CUDA is about one kernel launch each, and every Triton kernel run counts one (what
Triton's interpreter dispatches inside a run is not counted).
The numba backend's compiled calls are not dispatched through torch and count 0 (they are CPU loops, no
launches). Without a GPU the Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1`` is set for this
mode on a machine without CUDA): slow, but the count is the same. The products are counted as CUDA runs them
(torch's, with oneDNN switched off on a CPU: ``revnmt.rnn.products``), where a product and its sum are one
``addmm_``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

import buffers
from revnmt.profiling.launches import count_kernels
from revnmt.rnn import ReversibleRNN, TensorInput, backends, products
from revnmt.rnn.ordinary import OrdinaryRNN

# torch.backends.mkldnn.flags() (--count-kernels) also sets oneDNN's TF32 switch, which warns on a CPU-only torch.
warnings.filterwarnings("ignore", "TF32 acceleration on top of oneDNN")


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"


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
               repeats: int, backend: str, breakdown: bool = False) -> dict:
    torch.manual_seed(0)
    x = torch.randn(steps, batch, hidden, device=device, requires_grad=True)
    w = torch.randn(steps, batch, hidden, device=device)
    mask = torch.ones(steps, batch, dtype=torch.bool, device=device)
    rev = ReversibleRNN("rev" + cell, hidden, hidden, max_forget_bits=3, buffer_lanes=lanes,
                        buffer_backend=backend).to(device)
    ordinary = OrdinaryRNN(cell, hidden, hidden).to(device)

    def rev_step():
        inputs = TensorInput(x)
        tape = rev.forward_sweep(inputs, mask)
        rev.backward_sweep(tape, inputs, output_grads=lambda s, out: w[s])

    def ordinary_step():
        out, _ = ordinary(x)
        (out * w).sum().backward()

    rev_ms, ord_ms = _time_pair(rev_step, ordinary_step, device, repeats)
    case = {"cell": "rev" + cell, "T": steps, "batch": batch, "backend": rev.backend_on(device).name,
            "buffer_lanes": rev.lanes_on(device), "reversible_ms": rev_ms,
            "ordinary_ms": ord_ms,
            "ratio": rev_ms / ord_ms, "reversible_tokens_per_s": 1000 * batch * steps / rev_ms,
            "ordinary_tokens_per_s": 1000 * batch * steps / ord_ms}
    if breakdown:
        case["breakdown_ms"] = profile_breakdown(rev_step, repeats)
    return case


_PRODUCTS = ("torch.mm", "torch._C._nn.linear", "'addmm_'", "'addmm'", "_linear_pointwise")  # the last: oneDNN


def profile_breakdown(step, repeats: int) -> dict:
    """Per-step ms of ``step`` under cProfile: matrix products, compiled loops (the buffer's and the fused
    steps'), the rest."""
    profiler = cProfile.Profile()
    profiler.runcall(lambda: [step() for _ in range(repeats)])
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (calls, prim calls, own time, cumulative, callers)}
    total = sum(own for _, _, own, _, _ in stats.values())
    products = sum(own for (_, _, name), (_, _, own, _, _) in stats.items() if any(p in name for p in _PRODUCTS))
    loops = sum(own for (file, _, _), (_, _, own, _, _) in stats.items()
                if file.endswith(("numba_loops.py", "numba_steps.py")))
    per_step = 1000 / repeats
    return {"profiled_step": total * per_step, "matrix_products": products * per_step,
            "buffer_loops": loops * per_step, "other": (total - products - loops) * per_step}


#: (what, rows, inner, columns) of the products of a RevLSTM step, batch 64, 300 units (half 150, 5 gates per half).
_STEP_PRODUCTS = (("input projection, 2 steps", 128, 300, 1500), ("recurrent, a half", 64, 150, 750),
                  ("d loss / d h_j, a half", 64, 750, 150), ("recurrent weight gradient", 750, 64, 150),
                  ("d loss / d input, 2 steps", 128, 1500, 300), ("input weight gradient", 1500, 128, 300))


def report_products(device: torch.device, repeats: int, json_path: Path | None) -> None:
    """GFLOP/s of ``torch.mm`` and of ``products.linear`` on a step's shapes, taking turns."""
    name = _device_name(device)
    print(f"matrix products of a RevLSTM step (batch 64, 300 units) on {name}, GFLOP/s")
    print(f"{'product':28s} {'shape':>16s} {'torch.mm':>9s} {'products.linear':>16s} {'ratio':>6s}")
    cases = []
    for what, rows, inner, cols in _STEP_PRODUCTS:
        a, w = torch.randn(rows, inner, device=device), torch.randn(cols, inner, device=device)
        mm_ms, linear_ms = _time_pair(lambda a=a, w=w: [torch.mm(a, w.t()) for _ in range(20)],
                                      lambda a=a, w=w: [products.linear(a, w) for _ in range(20)], device, repeats)
        flops = 2 * rows * inner * cols * 20
        case = {"product": what, "shape": [rows, inner, cols], "torch_mm_gflops": flops / mm_ms / 1e6,
                "products_linear_gflops": flops / linear_ms / 1e6}
        cases.append(case)
        print(f"{what:28s} {f'{rows}x{inner}x{cols}':>16s} {case['torch_mm_gflops']:9.0f} "
              f"{case['products_linear_gflops']:16.0f} {case['products_linear_gflops'] / case['torch_mm_gflops']:6.2f}")
    if json_path:
        json_path.write_text(json.dumps({"device": name, "onednn": products.uses_onednn(device), "cases": cases},
                                        indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batch-sizes", type=int, nargs="+", metavar="B",
                        help="time every batch size B (instead of --batch) and print tokens/s and their scaling")
    parser.add_argument("--hidden", type=int, default=300)
    parser.add_argument("--steps", type=int, nargs="+", default=[14, 50])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--buffer-lanes", type=int, nargs="+", default=[None],
                        help="buffer lanes per row to time (default: the layer's default for the device)")
    parser.add_argument("--backend", default="auto", choices=backends.CHOICES,
                        help="the buffer backend of the reversible layers (see revnmt.rnn.backends)")
    parser.add_argument("--count-kernels", action="store_true",
                        help="count the ops every backend dispatches per layer and step instead of timing")
    parser.add_argument("--products", action="store_true",
                        help="time a step's matrix products with torch.mm and with the sweeps' products instead")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--breakdown", action="store_true",
                        help="also split the reversal step's time into products, compiled loops and the rest")
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.count_kernels:
        report_kernel_counts(device, args.json)
        return
    if args.products:
        report_products(device, args.repeats, args.json)
        return
    if device.type == "cuda":
        # The cell must compute identically in the forward and the reverse sweep.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if args.batch_sizes:
        report_batch_scaling(args, device)
        return
    name = _device_name(device)
    report = {"device": name, "batch": args.batch, "hidden": args.hidden, "cases": []}
    print(f"training step (forward + backward), batch {args.batch}, {args.hidden} units, 1 layer, on {name}")
    print(f"{'cell':8s} {'T':>4s} {'lanes':>5s} {'reversible ms':>14s} {'ordinary ms':>12s} {'ratio':>6s} backend")
    for cell in ("gru", "lstm"):
        for steps in args.steps:
            for lanes in args.buffer_lanes:
                case = bench_case(cell, steps, args.batch, args.hidden, lanes, device, args.repeats, args.backend,
                                  args.breakdown)
                report["cases"].append(case)
                print(f"{case['cell']:8s} {steps:4d} {case['buffer_lanes']:5d} {case['reversible_ms']:14.1f} "
                      f"{case['ordinary_ms']:12.1f} {case['ratio']:6.2f} {case['backend']}")
                if "breakdown_ms" in case:
                    b = case["breakdown_ms"]
                    print(f"{'':19s}under cProfile {b['profiled_step']:.1f} ms: "
                          f"matrix products {b['matrix_products']:.1f}, "
                          f"compiled loops {b['buffer_loops']:.1f}, other {b['other']:.1f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


def report_batch_scaling(args: argparse.Namespace, device: torch.device) -> None:
    """Print (and write as JSON) training tokens/s of both layers at every ``--batch-sizes`` size."""
    name = _device_name(device)
    first = args.batch_sizes[0]
    print(f"training tokens/s (forward + backward), {args.hidden} units, 1 layer, on {name}; "
          f"scaling from batch {first}")
    print(f"{'cell':8s} {'T':>4s} {'batch':>5s} {'reversible tok/s':>17s} {'scaling':>8s} {'ordinary tok/s':>15s} "
          f"{'scaling':>8s} {'ratio':>6s}")
    cases = []
    for cell in ("gru", "lstm"):
        for steps in args.steps:
            base = None
            for batch in args.batch_sizes:
                case = bench_case(cell, steps, batch, args.hidden, args.buffer_lanes[0], device, args.repeats,
                                  args.backend)
                base = base or case
                case["reversible_scaling"] = case["reversible_tokens_per_s"] / base["reversible_tokens_per_s"]
                case["ordinary_scaling"] = case["ordinary_tokens_per_s"] / base["ordinary_tokens_per_s"]
                cases.append(case)
                print(f"{case['cell']:8s} {steps:4d} {batch:5d} {case['reversible_tokens_per_s']:17,.0f} "
                      f"{case['reversible_scaling']:7.1f}x {case['ordinary_tokens_per_s']:15,.0f} "
                      f"{case['ordinary_scaling']:7.1f}x {case['ratio']:6.2f}")
    if args.json:
        args.json.write_text(json.dumps({"device": name, "hidden": args.hidden, "batch_sizes": args.batch_sizes,
                                         "cases": cases}, indent=2) + "\n")


def report_kernel_counts(device: torch.device, json_path: Path | None) -> None:
    """Print (and write as JSON) the ops per layer-step of every backend that runs on ``device``."""
    names = ["numba", "torch", "triton"] if device.type == "cpu" else ["torch", "triton"]
    names = [n for n in names if n != "triton" or buffers.backends.triton_available()]
    print(f"ops dispatched per layer and time step (batch 64, 300 units, T = 20) on {device}")
    print(f"{'cell':8s} {'backend':8s} {'lanes':>5s} {'forward':>8s} {'reverse':>8s} "
          f"{'reverse, no output gradients':>29s}")
    kernels = []
    for cell in ("gru", "lstm"):
        for name in names:
            entry = count_kernels(cell, name, device)
            kernels.append(entry)
            print(f"{entry['cell']:8s} {name:8s} {entry['buffer_lanes']:5d} {entry['forward_per_step']:8.1f} "
                  f"{entry['reverse_per_step']:8.1f} {entry['reverse_encoder_per_step']:29.1f}")
    if json_path:
        json_path.write_text(json.dumps({"device": str(device), "batch": 64, "hidden": 300, "T": 20,
                                         "kernels": kernels}, indent=2) + "\n")


if __name__ == "__main__":
    if "--count-kernels" in sys.argv and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are imported
    main()
