"""Plots of the committed Multi30K results, for the documentation.

    python benchmarks/plots.py [--results benchmarks/results/multi30k] [--budget-report FILE] [--out docs/img]

Reads ``results.json`` (written by ``benchmarks/multi30k.py --results DIR``) and each run's ``memory.json``
in DIR, and a ``revnmt-memory --json`` report made with a memory budget, and writes three PNGs to the output folder:

- ``bleu-per-epoch.png``: dev BLEU (sacreBLEU, greedy decoding) after every epoch of the four core models;
- ``memory-per-token.png``: bytes autograd saves per target token (peak of a training step, level 2 of the
  memory levels in docs/memory.md) for every reversible model measured, beside the ordinary model of the
  same size that the same report measured;
- ``memory-budget.png``: the budget report as ``revnmt-memory --plot`` draws it (``revnmt.memory.plot``).

Nothing is trained or measured: the figures are those of the result files.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from revnmt.memory.plot import CELL_NAMES, DPI, model_label, plot_report  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "multi30k"
DEFAULT_BUDGET_REPORT = ROOT / "benchmarks" / "results" / "budget" / "multi30k-revgru-accumulation-cpu.json"
DEFAULT_OUT = ROOT / "docs" / "img"

#: The four core models of benchmarks/multi30k.py, in the order they are drawn, with their line styles.
CORE = {
    "revgru-emb+slice-3bit": ("tab:blue", "-"),
    "gru-hidden": ("tab:blue", "--"),
    "revlstm-emb+slice-3bit": ("tab:orange", "-"),
    "lstm-hidden": ("tab:orange", "--"),
}


def load_results(results_dir: Path) -> dict:
    """``results.json`` of a benchmarks/multi30k.py results folder."""
    return json.loads((results_dir / "results.json").read_text())


def plot_bleu_per_epoch(results: dict, out: Path) -> Path:
    """Dev BLEU per epoch of the core models; the best epoch of each is marked."""
    runs = {r["model"]: r for r in results["results"]}
    missing = [name for name in CORE if name not in runs]
    if missing:
        raise ValueError(f"results.json has no run of {', '.join(missing)}")
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for name, (color, style) in CORE.items():
        run = runs[name]
        bleu = run["dev_bleu_by_epoch"]
        epochs = range(1, len(bleu) + 1)
        ax.plot(epochs, bleu, color=color, linestyle=style, linewidth=1.6,
                label=f"{model_label(run['rnn'], run['attention'], run['bits'])} (best {max(bleu):.2f})")
        best = bleu.index(max(bleu))
        ax.plot(best + 1, bleu[best], marker="o", color=color, markersize=5)
    ax.set_title("Multi30K En→De: dev BLEU after each epoch (dot: best epoch)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("dev BLEU (sacreBLEU, greedy decoding)")
    ax.set_xlim(left=1)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    path = out / "bleu-per-epoch.png"
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def load_memory_reports(results: dict, results_dir: Path) -> list[tuple[str, dict]]:
    """(model name, memory.json) of every run that has one, in results.json's order."""
    reports = []
    for run in results["results"]:
        path = results_dir / run["model"] / "memory.json"
        if path.is_file():
            reports.append((run["model"], json.loads(path.read_text())))
    if not reports:
        raise ValueError(f"no run in {results_dir} has a memory.json")
    return reports


def plot_memory_per_token(reports: list[tuple[str, dict]], out: Path) -> Path:
    """Bytes autograd saves per target token: each reversible model beside its ordinary counterpart."""
    fig, ax = plt.subplots(figsize=(8.0, 0.9 * len(reports) + 1.9))
    height = 0.38
    labels = []
    for i, (_, report) in enumerate(reports):
        cfg, saved = report["config"], report["model"]["saved_bytes_per_token"]
        labels.append(model_label(cfg["rnn"], cfg["attention"], cfg["max_forget_bits"]))
        ordinary = f"{CELL_NAMES[cfg['rnn'].removeprefix('rev')]}, hidden"
        ax.barh(i - height / 2, saved["reversible"], height, color="tab:blue",
                label="reversible model" if i == 0 else None)
        ax.barh(i + height / 2, saved["ordinary"], height, color="tab:gray",
                label="ordinary model of the same size (GRU or LSTM, hidden attention)" if i == 0 else None)
        ratio = saved["ordinary"] / saved["reversible"]
        ax.annotate(f"{saved['reversible']:,.0f}  ({ratio:.1f}× less)", (saved["reversible"], i - height / 2),
                    xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        ax.annotate(f"{saved['ordinary']:,.0f}  ({ordinary})", (saved["ordinary"], i + height / 2),
                    xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(range(len(reports)), labels, fontsize=9)
    ax.invert_yaxis()  # first model on top
    ax.set_xlabel("bytes autograd saves per target token (peak of a training step)")
    ax.set_title(f"Multi30K: bytes autograd saves for backward, {reports[0][1]['batches']} training batches",
                 fontsize=11)
    ax.set_xlim(right=ax.get_xlim()[1] * 1.35)  # room for the labels right of the bars
    ax.xaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.4, -0.13), ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    path = out / "memory-per-token.png"
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_memory_budget(report: dict, out: Path) -> Path:
    """A ``revnmt-memory`` report with a budget, drawn as ``revnmt-memory --plot`` draws it."""
    path = out / "memory-budget.png"
    plot_report(report, path)
    return path


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS,
                        help="benchmarks/multi30k.py results folder (default: benchmarks/results/multi30k)")
    parser.add_argument("--budget-report", type=Path, default=DEFAULT_BUDGET_REPORT,
                        help="revnmt-memory --json report with --memory-budget (default: "
                        f"{DEFAULT_BUDGET_REPORT.relative_to(ROOT)})")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the PNGs go (default: docs/img)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        results = load_results(args.results)
        reports = load_memory_reports(results, args.results)
        budget_report = json.loads(args.budget_report.read_text())
        args.out.mkdir(parents=True, exist_ok=True)
        for path in (plot_bleu_per_epoch(results, args.out), plot_memory_per_token(reports, args.out),
                     plot_memory_budget(budget_report, args.out)):
            print(path)
    except (OSError, ValueError, KeyError) as error:
        print(f"benchmarks/plots.py: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
