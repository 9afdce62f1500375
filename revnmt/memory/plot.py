"""The memory report as a picture (``revnmt-memory --plot``), drawn from the report's dict or its saved JSON.

Left: bytes per target token of one training step against the batches' length, for the reversible model and the
two models a user short of memory would train instead (:data:`~revnmt.memory.report.USER_CHOICES`): what autograd
saves (level 2, measured), and that plus what the step holds outside autograd by its own tally, drawn apart and
named as such. Right, with ``--memory-budget``: the tokens per batch each model fits under the budget (level 3),
and with ``--effective-batch-tokens`` the accumulation each needs and the measured time of an update.

matplotlib is an optional extra (``pip install 'revnmt[plot]'``), imported only to draw, with its Agg canvas: no
display, and no change to the backend of a program that draws with pyplot itself.
"""

from __future__ import annotations

import os
from typing import Any

from revnmt.atomic import output_file

from .report import USER_CHOICES
from .sizes import format_bytes

INSTALL = "pip install 'revnmt[plot]'"
DPI = 100

CELL_NAMES = {"revgru": "RevGRU", "gru": "GRU", "revlstm": "RevLSTM", "lstm": "LSTM"}
#: How each of the models a user chooses between is drawn.
COLORS = {"reversible": "tab:blue", "ordinary": "tab:gray", "checkpointed": "tab:orange"}


def model_label(rnn: str, attention: str, bits: str | int | None) -> str:
    """'RevGRU, emb+slice, 3 bits' or 'GRU, hidden'."""
    label = f"{CELL_NAMES.get(rnn, rnn)}, {attention}"
    return f"{label}, {bits} bits" if bits not in ("", None) else label


def require_matplotlib() -> None:
    """ImportError, saying how to install it, if matplotlib is missing."""
    _matplotlib()


def _matplotlib() -> tuple[Any, Any, Any]:
    """matplotlib's Figure class, the Agg canvas class to render it, and its ticker module."""
    try:
        import matplotlib.ticker
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError(f"drawing needs matplotlib: {INSTALL}") from None
    return Figure, FigureCanvasAgg, matplotlib.ticker


def model_names(report: dict) -> dict[str, str]:
    """The report's models as the figure names them: 'RevGRU, emb+slice, 3 bits', 'GRU, hidden', 'GRU,
    emb+slice, checkpointed (K = 16)'."""
    cfg = report["config"]
    ordinary = cfg["rnn"].removeprefix("rev")
    return {"reversible": model_label(cfg["rnn"], cfg["attention"], cfg["max_forget_bits"]),
            "ordinary": model_label(ordinary, "hidden", None),
            "checkpointed": f"{model_label(ordinary, cfg['attention'], None)}, checkpointed "
                            f"(K = {report['checkpoint_steps']})"}


def plot_report(report: dict, path: str | os.PathLike[str]) -> None:
    """Draw ``report`` (``revnmt-memory``'s, as its ``--json`` saves it) as a PNG at ``path``, written as
    revnmt writes every output (:func:`revnmt.atomic.output_file`)."""
    figure_class, canvas_class, ticker = _matplotlib()
    budget = report.get("budget")
    # constrained: room for the titles, long tick labels and the legend below, within the figure's size
    fig = figure_class(figsize=(12.0, 4.6) if budget else (6.5, 4.6), layout="constrained")
    canvas_class(fig)
    # the budget's panel is wider: its bars carry names on the left and figures on the right
    axes = fig.subplots(1, 2, width_ratios=(1, 1.3)) if budget else [fig.subplots()]
    names = model_names(report)
    _draw_by_length(axes[0], report, names)
    if budget:
        _draw_budget(axes[1], report, names)
    axes[0].xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # lengths are whole tokens
    axes[0].yaxis.set_major_formatter(ticker.StrMethodFormatter("{x:,.0f}"))  # thousands separated
    axes[-1].xaxis.set_major_formatter(ticker.StrMethodFormatter("{x:,.0f}"))
    if budget:
        axes[1].xaxis.set_major_locator(ticker.MaxNLocator(nbins=4))  # room for six-digit labels
    with output_file(path) as file:
        fig.savefig(file, format="png", dpi=DPI)


def _draw_by_length(ax: Any, report: dict, names: dict[str, str]) -> None:
    """Bytes per target token against the batches' length: autograd's saved bytes (solid) and those plus the
    bytes held outside autograd (dashed), each model in its color."""
    rows = report["by_length"]
    for name in USER_CHOICES:
        saved = rows["saved_bytes_per_token"][name]
        both = [s + h for s, h in zip(saved, rows["held_bytes_per_token"][name])]
        ax.plot(rows["length"], saved, color=COLORS[name], marker="o", markersize=3, linewidth=1.6, label=names[name])
        ax.plot(rows["length"], both, color=COLORS[name], linestyle="--", linewidth=1.2)
    # the line styles' key, drawn without data
    ax.plot([], [], color="black", linewidth=1.6, label="solid: autograd saves (level 2, measured)")
    ax.plot([], [], color="black", linestyle="--", linewidth=1.2,
            label="dashed: + held outside autograd (the step's own tally)")
    sentences = f"batches of {report['batch_size']} sentences, " if "batch_size" in report else ""
    ax.set_title(f"Bytes per target token of a training step\n({sentences}{report['batches']} batches, "
                 f"{report['target_tokens']:,} target tokens)", fontsize=10)
    ax.set_xlabel("batch length: its longest pair, tokens")
    ax.set_ylabel("bytes per target token")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, frameon=False)


def _draw_budget(ax: Any, report: dict, names: dict[str, str]) -> None:
    """Tokens per batch each model fits under the budget; with an effective batch, the accumulation each needs
    and the measured time of an update."""
    budget, effective = report["budget"], report.get("effective_batch")
    fits = [budget["batch_tokens"][name] for name in USER_CHOICES]
    ax.barh(range(len(fits)), fits, color=[COLORS[name] for name in USER_CHOICES], height=0.6)
    for i, name in enumerate(USER_CHOICES):
        text = f"fits {fits[i]:,}"
        if effective:
            row = effective["models"][name]
            text += f"\nan update: {row['update_freq']} × {row['batch_tokens']:,} in {row['seconds_per_update']:.3g} s"
        ax.annotate(text, (fits[i], i), xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(range(len(fits)), [names[name] for name in USER_CHOICES], fontsize=9)
    ax.invert_yaxis()  # the reversible model on top
    ax.set_xlim(right=max(fits) * (2.0 if effective else 1.3))  # room for the labels right of the bars
    measured_by = budget["measured_by"]
    ax.set_xlabel(f"padded tokens per batch that fits (level 3: {measured_by})")
    title = f"Tokens per batch under a {format_bytes(budget['bytes'])} budget"
    if effective:
        title += f"\nand updates of {effective['tokens']:,} tokens, timed on {effective['device']}"
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
