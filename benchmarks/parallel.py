"""Hogwild! training speed: updates per second and time to a fixed dev loss, 1 vs 2 workers, side by side.

    python benchmarks/parallel.py [--workers 1 2] [--train-limit 3000] [--epochs 5] [--target-loss 4.4] [--json FILE]

Trains the same small RevGRU (revnmt-train's options below) on the first --train-limit Multi30K pairs
with each number of Hogwild worker processes on the CPU; with several GPUs present, also with one
worker on one GPU against one worker per GPU. Every run starts from the same weights and stops
after the epoch whose dev loss (first --valid-limit dev pairs) reaches --target-loss, or after
--epochs. Reported per run: updates per second of training time (validation excluded: the main
process validates alone, the same work for every run), training seconds and wall seconds (worker
start-up and validations included) until the target was reached (to epoch granularity).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

import torch

from revnmt.arguments import run_config
from revnmt.data import MULTI30K_SPLITS, find_multi30k, load_data, load_parallel
from revnmt.model import build_model
from revnmt.training.hogwild import HogwildTrainer
from revnmt.training.trainer import Validation

SMALL_MODEL = ["--emb-dim", "128", "--hidden-size", "128", "--slice-dim", "20", "--dropout", "0.2"]


class TimedTrainer(HogwildTrainer):
    """Times each epoch's training and stops once the dev loss reaches ``target``."""

    def __init__(self, *args, target: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.target, self.train_s, self.curve = target, 0.0, []
        self.start = time.perf_counter()

    def _train_epoch(self) -> bool:
        start = time.perf_counter()
        done = super()._train_epoch()
        self.train_s += time.perf_counter() - start
        return done

    def evaluate(self) -> Validation:
        result = super().evaluate()
        self.curve.append({"epoch": self.state.epoch, "step": self.state.step, "dev_loss": result.loss,
                           "train_s": self.train_s, "wall_s": time.perf_counter() - self.start})
        return result

    def stop_reason(self) -> str | None:
        if self.curve and self.curve[-1]["dev_loss"] <= self.target:
            return f"dev loss reached {self.target}"
        return super().stop_reason()


def run(name: str, argv: list[str], target: float) -> dict:
    """Train with revnmt-train's options ``argv``; the figures of the run."""
    with tempfile.TemporaryDirectory() as save_dir:
        config = run_config([*argv, "--save-dir", save_dir])
        data = load_data(config.data)
        config = config.with_vocab_sizes(len(data.src_vocab), len(data.tgt_vocab))
        torch.manual_seed(config.training.seed)
        model = build_model(config.model, config.execution).to(config.training.device)
        trainer = TimedTrainer(config, data, model, target=target)
        trainer.train()
    reached = next((point for point in trainer.curve if point["dev_loss"] <= target), None)
    return {"run": name, "workers": config.training.hogwild, "devices": config.training.devices,
            "updates": trainer.state.step,
            "train_s": trainer.train_s, "updates_per_s": trainer.state.step / trainer.train_s,
            "final_dev_loss": trainer.curve[-1]["dev_loss"], "target_loss": target,
            "epochs_to_target": reached and reached["epoch"], "train_s_to_target": reached and reached["train_s"],
            "wall_s_to_target": reached and reached["wall_s"], "curve": trainer.curve}


def _dev_subset(folder: Path, pairs: int) -> str:
    """The first ``pairs`` Multi30K dev pairs as plain files in ``folder``; their prefix."""
    dev = load_parallel(find_multi30k() / MULTI30K_SPLITS["valid"], "en", "de")
    (folder / "val.en").write_text("".join(line + "\n" for line in dev.src[:pairs]), encoding="utf-8")
    (folder / "val.de").write_text("".join(line + "\n" for line in dev.tgt[:pairs]), encoding="utf-8")
    return str(folder / "val")


def _format(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="Hogwild worker counts on the CPU")
    parser.add_argument("--train-limit", type=int, default=3000, help="training pairs")
    parser.add_argument("--valid-limit", type=int, default=200, help="dev pairs")
    parser.add_argument("--epochs", type=int, default=5, help="at most this many epochs per run")
    parser.add_argument("--target-loss", type=float, default=4.4, help="dev loss per token to reach")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    options = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")

    with tempfile.TemporaryDirectory() as folder:
        common = ["--train", str(find_multi30k() / MULTI30K_SPLITS["train"]), "--valid",
                  _dev_subset(Path(folder), options.valid_limit), "--lowercase", "--train-limit",
                  str(options.train_limit), "--epochs", str(options.epochs), *SMALL_MODEL]
        runs = [("CPU", n, [*common, "--device", "cpu", "--hogwild", str(n)]) for n in options.workers]
        gpus = torch.cuda.device_count()
        if gpus > 1:
            runs += [("GPU", n, [*common, "--device", "cuda", "--hogwild", str(n), "--devices",
                                 ",".join(map(str, range(n)))]) for n in (1, gpus)]
        print("command: python " + " ".join(sys.argv))
        print("revnmt-train options: " + " ".join(common) + f" --device D --hogwild N [--devices 0,..]; "
              f"{torch.get_num_threads()} CPU threads split among the workers; torch {torch.__version__}\n")
        results, baselines = [], {}
        for kind, n, argv in runs:
            r = run(f"{kind}, {n} worker{'s' * (n > 1)}", argv, options.target_loss)
            results.append(r)
            print(f"{r['run']:<16} {r['updates']:>5} updates  {r['updates_per_s']:6.2f} updates/s  "
                  f"final dev loss {r['final_dev_loss']:.3f}  to dev loss {options.target_loss}: "
                  f"{_format(r['epochs_to_target'], 'd')} epochs, {_format(r['train_s_to_target'], '.1f')} s "
                  f"training, {_format(r['wall_s_to_target'], '.1f')} s wall", flush=True)
            base = baselines.setdefault(kind, r)  # the first run of each kind is the baseline
            if r is not base:
                to_target = (base["wall_s_to_target"] / r["wall_s_to_target"]
                             if base["wall_s_to_target"] and r["wall_s_to_target"] else None)
                print(f"  vs {base['run']}: updates/s x{r['updates_per_s'] / base['updates_per_s']:.2f}, "
                      f"wall time to the target x{_format(to_target, '.2f')}")
    if options.json:
        options.json.write_text(json.dumps({"command": sys.argv, "train_options": common, "runs": results},
                                           indent=2) + "\n")


if __name__ == "__main__":
    main()
