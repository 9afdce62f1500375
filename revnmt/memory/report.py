"""How much activation memory a model keeps for backpropagation, measured three ways.

1. Analytic bits (as the paper counts): what an ordinary RNN keeps (32 bits per unit per step,
   h and c for LSTMs) against what the reversible model really holds (allocated buffer words,
   overflow log, stored attention slices) and the optimum (Σ −log2 z over forgotten bits, plus
   the slices). Taken right after the forward sweeps, when the buffers are fullest.
2. Bytes autograd saves for backward during one training step (saved-tensor hooks, peak of the
   live saved storages), per target token, for the reversible model and what a user would pick
   instead (:func:`comparison_configs`): the ordinary model of the same size with ``hidden``
   attention, the ordinary model with the reversible model's attention, and the latter with
   gradient checkpointing at the best segment length. Python-held state (the buffers, the
   checkpoints) is not in this figure.
3. The CUDA allocator's peak during one training step, when run on a GPU (else null).

Next to level 2, never added to it, the report gives the bytes per target token that each step
holds outside autograd by its own account (``StepResult.held_bytes``: buffers, stored slices, the
gradients of detached leaves, working sets). It is a tally, not a measurement, and its peak and
autograd's need not fall at the same moment of the step. Both are also given for the batches of each
length apart (``by_length``), a batch's length being its longest pair's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import torch

from revnmt.data import Batch
from revnmt.model import ExecutionConfig, ModelConfig, ReversibleSeq2Seq, Seq2Seq, build_model

from .saved import SavedTensorMeter


@dataclass
class SideBits:
    """Analytic bits of one side (encoder or decoder), summed over the measured batches."""

    baseline_bits: int = 0
    actual_bits: int = 0
    optimal_bits: float = 0.0

    def as_dict(self) -> dict:
        return {"baseline_bits": self.baseline_bits, "actual_bits": self.actual_bits,
                "optimal_bits": self.optimal_bits,
                "actual_ratio": self.baseline_bits / self.actual_bits if self.actual_bits else None,
                "optimal_ratio": self.baseline_bits / self.optimal_bits if self.optimal_bits else None}


def _ordinary_bits(cfg: ModelConfig, steps: int, batch: int, directions: int = 1) -> int:
    """What an ordinary RNN of this size keeps: 32 bits per unit, step, row, layer and direction (×2 for LSTM)."""
    return 32 * steps * batch * cfg.state_size * cfg.layers * directions


@torch.no_grad()
def analytic_bits(model: Seq2Seq, batches: Iterable[Batch]) -> dict[str, SideBits]:
    """Level 1 for a reversible model, in training mode (dropout on, as the gates see it in training)."""
    if not isinstance(model, ReversibleSeq2Seq):
        raise ValueError("analytic bits are defined for reversible models; ordinary ones keep baseline_bits")
    was_training = model.training
    model.train()
    sides = {"encoder": SideBits(), "decoder": SideBits()}
    for batch in batches:
        src, tgt_in, tgt_out = batch.src.t(), batch.tgt_in.t(), batch.tgt_out.t()
        masks = model.draw_masks(src.shape[1], src.device)
        _, _, enc_tape, dec_tape, _ = model.forward_sweeps(src, tgt_in, tgt_out, masks)
        for name, tape, steps, directions in (("encoder", enc_tape, src.shape[0], model.cfg.directions),
                                              ("decoder", dec_tape, tgt_in.shape[0], 1)):
            stored = tape.stored_bits()
            side = sides[name]
            side.baseline_bits += _ordinary_bits(model.cfg, steps, src.shape[1], directions)
            side.actual_bits += stored["buffer_bits"] + stored["slice_bits"]
            side.optimal_bits += stored["optimal_buffer_bits"] + stored["slice_bits"]
    model.train(was_training)
    return sides


@dataclass(frozen=True)
class StepMemory:
    """The memory of one training step, at each level the report gives."""

    saved_bytes: int  # peak of the bytes autograd saves (measured)
    held_bytes: int  # held outside autograd at the step's peak (the step's own account)
    cuda_peak: int | None  # the CUDA allocator's peak; None on CPU


def step_memory(model: Seq2Seq, batch: Batch) -> StepMemory:
    """The memory of one training step on ``batch``."""
    model.train()
    tensors = (batch.src, batch.src_len, batch.tgt_in, batch.tgt_out)
    cuda = batch.src.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    # parameters and the batch's ids are not activations: exclude their storages
    with SavedTensorMeter(exclude=[*model.parameters(), *tensors]) as meter:
        result = model.train_step(*tensors, normalizer=float(batch.n_tokens))
    peak = None
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    model.zero_grad(set_to_none=True)
    return StepMemory(meter.peak_bytes, result.held_bytes, peak)


#: Segment lengths tried for the checkpointed model; the report keeps the best (see memory_report).
CHECKPOINT_CANDIDATES = ("auto", 2, 4, 8, 16)


def ordinary_counterpart(cfg: ModelConfig) -> ModelConfig:
    """The ordinary model of the same size: GRU for RevGRU, LSTM for RevLSTM, ``hidden`` attention."""
    return replace(cfg, rnn=cfg.rnn.removeprefix("rev"), attention="hidden")


def comparison_configs(cfg: ModelConfig, checkpoint_steps: int | str) -> dict[str, tuple[ModelConfig, ExecutionConfig]]:
    """The models a report compares with the reversible model of ``cfg``, by name, as what :func:`build_model`
    takes: the ordinary model (``hidden`` attention), the ordinary model with the same attention (which separates
    what the attention saves from what reversal saves), and that model checkpointed every ``checkpoint_steps``."""
    same_attention = replace(cfg, rnn=cfg.rnn.removeprefix("rev"))
    run = ExecutionConfig()
    return {"reversible": (cfg, run), "ordinary": (ordinary_counterpart(cfg), run),
            "ordinary_same_attention": (same_attention, run),
            "checkpointed": (same_attention, ExecutionConfig(checkpoint_steps=checkpoint_steps))}


@dataclass(frozen=True)
class MeasuredSteps:
    """One training step's memory on each of some batches, with each batch's length (``Batch.length``: its longest
    pair's, as the batch sampler and the budget count it) and target tokens."""

    steps: tuple[StepMemory, ...]
    lengths: tuple[int, ...]
    tokens: tuple[int, ...]

    def per_token(self, length: int | None = None) -> tuple[float, float, int | None]:
        """(saved bytes, held bytes) per target token over the batches (those of this ``length`` if given), and
        the CUDA allocator's peak."""
        kept = [i for i, n in enumerate(self.lengths) if length in (None, n)]
        tokens = sum(self.tokens[i] for i in kept)
        peaks = [self.steps[i].cuda_peak for i in kept if self.steps[i].cuda_peak is not None]
        return (sum(self.steps[i].saved_bytes for i in kept) / tokens,
                sum(self.steps[i].held_bytes for i in kept) / tokens, max(peaks) if peaks else None)


def measured_steps(model: Seq2Seq, batches: list[Batch]) -> MeasuredSteps:
    """The memory of one training step on each of ``batches``."""
    return MeasuredSteps(tuple(step_memory(model, batch) for batch in batches),
                         tuple(batch.length for batch in batches),
                         tuple(batch.n_tokens for batch in batches))


def per_token_memory(model: Seq2Seq, batches: list[Batch]) -> tuple[float, float, int | None]:
    """(saved bytes, held bytes) per target token over ``batches``, and the CUDA allocator's peak."""
    return measured_steps(model, batches).per_token()


def best_checkpoint_steps(cfg: ModelConfig, batches: list[Batch]) -> tuple[int | str, dict[str, MeasuredSteps]]:
    """The segment length among :data:`CHECKPOINT_CANDIDATES` whose checkpointed step keeps the fewest
    bytes per target token for backward (saved by autograd plus held by the checkpoints), and every
    candidate's :func:`measured_steps`, by ``str(steps)``."""
    measured = {}
    for steps in CHECKPOINT_CANDIDATES:
        model = build_model(*comparison_configs(cfg, steps)["checkpointed"]).to(batches[0].src.device)
        measured[str(steps)] = measured_steps(model, batches)
    best = min(measured, key=lambda k: sum(measured[k].per_token()[:2]))
    return (best if best == "auto" else int(best)), measured


def memory_report(model: Seq2Seq, batches: list[Batch]) -> dict:
    """The report of ``revnmt-memory`` (see the module docstring for the levels)."""
    sides = analytic_bits(model, batches)
    device = batches[0].src.device
    steps, candidates = best_checkpoint_steps(model.cfg, batches)
    measured = {}
    for name, configs in comparison_configs(model.cfg, steps).items():
        if name == "checkpointed":  # measured already, as the best candidate
            measured[name] = candidates[str(steps)]
        else:
            measured[name] = measured_steps(model if name == "reversible" else build_model(*configs).to(device),
                                            batches)
    figures = {name: m.per_token() for name, m in measured.items()}
    cuda = device.type == "cuda"
    return {"encoder": sides["encoder"].as_dict(), "decoder": sides["decoder"].as_dict(),
            "model": {"saved_bytes_per_token": {name: saved for name, (saved, _, _) in figures.items()},
                      "held_bytes_per_token": {name: held for name, (_, held, _) in figures.items()},
                      "peak_bytes": {name: peak for name, (_, _, peak) in figures.items()} if cuda else None},
            "by_length": _by_length(measured),
            "checkpoint_steps": steps,
            "checkpoint_candidates": {k: sum(kept.per_token()[:2]) for k, kept in candidates.items()},
            "batches": len(batches), "target_tokens": sum(b.n_tokens for b in batches)}


def _by_length(measured: dict[str, MeasuredSteps]) -> dict:
    """Each model's bytes per target token on the batches of each length apart, by increasing length."""
    batches = next(iter(measured.values()))  # every model measured the same batches
    lengths = sorted(set(batches.lengths))
    figures = {name: [m.per_token(n) for n in lengths] for name, m in measured.items()}
    return {"length": lengths, "batches": [batches.lengths.count(n) for n in lengths],
            "target_tokens": [sum(t for m, t in zip(batches.lengths, batches.tokens) if m == n) for n in lengths],
            "saved_bytes_per_token": {name: [saved for saved, _, _ in rows] for name, rows in figures.items()},
            "held_bytes_per_token": {name: [held for _, held, _ in rows] for name, rows in figures.items()}}


#: The models a user short of memory chooses between: the reversible model, its ordinary twin (which reaches a larger
#: batch by gradient accumulation) and the checkpointed twin. The fourth compared model, the ordinary one with the
#: reversible model's attention, only separates what the attention saves from what reversal saves.
USER_CHOICES = ("reversible", "ordinary", "checkpointed")

#: How the report names each compared model.
LABELS = {"reversible": "reversible", "ordinary": "ordinary, hidden attention",
          "ordinary_same_attention": "ordinary, same attention",
          "checkpointed": "ordinary, same attention, checkpointed"}


def format_report(report: dict) -> str:
    """A plain-text table of a report."""
    lines = [f"{'':8s} {'baseline bits':>14s} {'actual bits':>12s} {'optimal bits':>13s} "
             f"{'actual ratio':>13s} {'optimal ratio':>14s}"]
    for side in ("encoder", "decoder"):
        r = report[side]
        lines.append(f"{side:8s} {r['baseline_bits']:14,d} {r['actual_bits']:12,d} {r['optimal_bits']:13,.0f} "
                     f"{r['actual_ratio']:13.2f} {r['optimal_ratio']:14.2f}")
    model = report["model"]
    lines.append("")
    lines.append(f"{'per target token, peak over a training step':48s} {'autograd saves':>15s} "
                 f"{'held outside':>13s}" + (f" {'CUDA peak':>12s}" if model["peak_bytes"] else ""))
    for name, label in LABELS.items():
        if name == "checkpointed":
            label = f"{label} (K = {report['checkpoint_steps']})"
        cuda = f" {model['peak_bytes'][name]:12,d}" if model["peak_bytes"] else ""
        lines.append(f"{label:48s} {model['saved_bytes_per_token'][name]:15,.0f} "
                     f"{model['held_bytes_per_token'][name]:13,.0f}{cuda}")
    lines.append("(autograd's saved bytes are measured; the bytes held outside autograd are each step's own "
                 "tally; K is the candidate whose sum of the two is smallest)")
    if model["peak_bytes"]:
        lines.append("(CUDA peak: not per token, the allocator's peak bytes allocated during the costliest step, "
                     "weights and gradients included)")
    lines.append(f"({report['batches']} batches, {report['target_tokens']} target tokens)")
    return "\n".join(lines)
