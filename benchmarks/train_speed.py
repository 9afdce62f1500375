"""Training speed as users see it: revnmt-train's own logged tokens/s, reversible against ordinary, per thread count.

    python benchmarks/train_speed.py [--threads 1 2] [--steps 300] [--skip 100] [--json FILE] [--runs DIR]
                                     [--device cpu|cuda] [--cuda-graphs on] [-- REVNMT-TRAIN OPTIONS]

Each model trains as ``revnmt-train`` does (data, forward, reversal, loss, clipping, Adam, logging) on Multi30K
(or the corpus given after ``--``) from fresh weights for ``--steps`` updates, alone on the machine, with
``OMP_NUM_THREADS`` set to each ``--threads`` value in turn (default: 1 and every core). The figure is the mean of
the tokens/s revnmt-train logs every ``--log-every`` steps after the first ``--skip`` (the warm-up: numba
compiles, the allocator fills). The models take turns at each thread count, so a machine that slows down
over the run moves both. The periodic validation is not in the figure: with the default 300 steps, none falls
inside the window (the first is at the end of an epoch of 454 batches).

The pairs are the paper's: RevGRU / RevLSTM (``emb+slice``, 3 bits) against GRU / LSTM (``hidden``). With
``--device cuda`` the ordinary models run on cuDNN and the reversible ones on the Triton kernels; ``--threads``
then sets only the host's threads, and ``--cuda-graphs on`` trains the reversible ones with revnmt-train's
``--cuda-graphs on`` (each batch shape's step replayed from CUDA graphs). Options after ``--`` (a model size,
``--prepared DIR`` to tokenize the corpus once for every run) go to every run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import cpu_name

from revnmt.data import MULTI30K_SPLITS, find_multi30k

PAIRS = {"gru": (("revgru", "emb+slice"), ("gru", "hidden")), "lstm": (("revlstm", "emb+slice"), ("lstm", "hidden"))}
_RATE = re.compile(r"\| step (\d+) \|.*\| (\d+) tok/s \|")


def train_rates(rnn: str, attention: str, threads: int, steps: int, log_every: int, save_dir: Path, device: str,
                extra: list[str]) -> list[tuple[int, int]]:
    """Run revnmt-train for ``steps`` updates; (step, tok/s) of every progress line it logged."""
    # as a module of this interpreter: the same code whether or not the package's commands are installed
    command = [sys.executable, "-m", "revnmt.cli.train", "--save-dir", str(save_dir), "--rnn", rnn,
               "--attention", attention, "--max-steps", str(steps), "--log-every", str(log_every),
               "--device", device, *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return [(int(step), int(rate)) for step, rate in _RATE.findall(done.stderr)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", nargs="+", choices=sorted(PAIRS), default=["gru"], help="cell families to compare")
    parser.add_argument("--threads", nargs="+", type=int, default=sorted({1, os.cpu_count() or 1}))
    parser.add_argument("--steps", type=int, default=300, help="updates per run")
    parser.add_argument("--skip", type=int, default=100, help="updates of warm-up left out of the figure")
    parser.add_argument("--log-every", type=int, default=100, help="steps per logged tokens/s window")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default: cpu)")
    parser.add_argument("--cuda-graphs", choices=("on", "off"), default="off",
                        help="revnmt-train's --cuda-graphs for the reversible models (default: off)")
    parser.add_argument("--runs", type=Path, help="where the run directories go (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if not any(option in extra for option in ("--train", "--data")):
        folder = find_multi30k()  # explicit prefixes: no test set to translate at the end
        extra += ["--train", str(folder / MULTI30K_SPLITS["train"]), "--valid", str(folder / MULTI30K_SPLITS["valid"])]

    runs = args.runs or Path(tempfile.mkdtemp(prefix="train-speed-"))
    report = {"command": "python benchmarks/train_speed.py " + " ".join(argv), "cpu": cpu_name(),
              "device": _device_name(args.device), "cuda_graphs": args.cuda_graphs, "cases": []}
    for threads in args.threads:
        for family in args.pairs:
            rates = {}
            for rnn, attention in PAIRS[family]:
                graphs = ["--cuda-graphs", args.cuda_graphs] if rnn.startswith("rev") else []
                logged = train_rates(rnn, attention, threads, args.steps, args.log_every,
                                     runs / f"{rnn}-{threads}-threads", args.device, extra + graphs)
                rates[rnn] = [rate for step, rate in logged if step > args.skip]
                if not rates[rnn]:
                    raise RuntimeError(f"{rnn}: no tokens/s logged after step {args.skip}")
            (rev, rev_rates), (ordinary, ordinary_rates) = rates.items()
            case = {"threads": threads, "reversible": rev, "ordinary": ordinary, "reversible_tokens_per_s": rev_rates,
                    "ordinary_tokens_per_s": ordinary_rates,
                    "ratio": statistics.mean(rev_rates) / statistics.mean(ordinary_rates)}
            report["cases"].append(case)
            print(f"{threads} thread(s): {rev} {statistics.mean(rev_rates):,.0f} tok/s, {ordinary} "
                  f"{statistics.mean(ordinary_rates):,.0f} tok/s: {case['ratio']:.2f}x", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return cpu_name()


if __name__ == "__main__":
    sys.exit(main())
