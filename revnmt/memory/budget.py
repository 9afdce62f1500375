"""Fit training into a memory budget: the largest batch, in tokens, whose step fits.

The cost of a training step is measured, not guessed: a few probe steps on synthetic batches of
the model itself, at short and long sentences and two batch sizes, fitted by

    step_bytes(B, L) = fixed + per_sentence·B + per_token·B·L

(B sentences padded to L tokens). On CUDA a probe's cost is the allocator's peak during the step
above what was allocated before it. On CPU it is what the step accounts for: the peak of what
autograd saves plus what the model holds outside autograd (buffers, slices, attention memory).
Parameters, gradients and optimizer state are a fixed cost counted separately.

A token budget T allows batches of B = T/L sentences of length L, and the per-sentence part of
the cost (one step's graph for a reversible model) grows as sentences get shorter, so the worst
case is not simply the longest length bucket. Every length present in the data is checked, with
B bounded by T/L and by the number of pairs at most L long (no batch can hold more): the worst
batch the sampler can form in any epoch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from revnmt.data import BOS, EOS, Batch
from revnmt.model import Seq2Seq
from revnmt.model.seq2seq import LOSS_CHUNK_STEPS

from .saved import SavedTensorMeter
from .sizes import format_bytes

SAFETY_MARGIN = 0.10  # of the budget, for allocator fragmentation and what the probes cannot see
OPTIMIZER_STATES = {"adam": 2, "sgd": 0}  # tensors of parameter size an optimizer keeps


class BudgetError(ValueError):
    """The budget cannot hold even the model or a single sentence."""


@dataclass
class StepCost:
    """Fitted bytes of one training step beyond the fixed (parameter) cost."""

    fixed: float
    per_sentence: float
    per_token: float

    def __call__(self, sentences: float, length: float) -> float:
        return self.fixed + self.per_sentence * sentences + self.per_token * sentences * length


@dataclass
class BudgetPlan:
    """What the budget allows; recorded in the log and the checkpoint."""

    budget_bytes: int
    static_bytes: int  # parameters, gradients, optimizer state
    batch_tokens: int  # the largest padded batch size in tokens whose step fits
    max_length: int  # the longest pair that fits alone (longer ones are skipped)
    predicted_peak_bytes: int  # static + the step cost of the worst batch the sampler can form
    eval_batch_size: int  # sentences per validation / beam-search batch that fit as well
    measured_by: str  # "cuda allocator" or "cpu accounting"
    cost: dict

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return (f"memory budget {format_bytes(self.budget_bytes)} ({self.measured_by}): batches of up to "
                f"{self.batch_tokens} tokens, pairs up to {self.max_length} tokens; parameters, gradients and "
                f"optimizer {format_bytes(self.static_bytes)}, predicted peak {format_bytes(self.predicted_peak_bytes)}")


def static_bytes(model: Seq2Seq, optimizer: str) -> int:
    """Parameters, their gradients and the optimizer's per-parameter state."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return params * (2 + OPTIMIZER_STATES[optimizer])


def synthetic_batch(sentences: int, length: int, src_vocab: int, tgt_vocab: int, device: torch.device,
                    seed: int = 0) -> Batch:
    """A batch of random ordinary tokens with every pair exactly ``length`` long (worst padding)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, src_vocab, (sentences, length), generator=gen)
    tgt = torch.randint(4, tgt_vocab, (sentences, length - 1), generator=gen)
    tgt_in = torch.cat([torch.full((sentences, 1), BOS), tgt], 1)
    tgt_out = torch.cat([tgt, torch.full((sentences, 1), EOS)], 1)
    lengths = torch.full((sentences,), length)
    return Batch(src, lengths, tgt_in, tgt_out, lengths, sentences * length, list(range(sentences))).to(device)


def probe_step_bytes(model: Seq2Seq, batch: Batch) -> int:
    """Bytes one training step needs beyond the static cost (see the module docstring)."""
    tensors = (batch.src, batch.src_len, batch.tgt_in, batch.tgt_out)
    model.train()
    if batch.src.device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model.train_step(*tensors, normalizer=float(batch.n_tokens))
        torch.cuda.synchronize()
        cost = torch.cuda.max_memory_allocated() - before
    else:
        with SavedTensorMeter(exclude=[*model.parameters(), *tensors]) as meter:
            model.train_step(*tensors, normalizer=float(batch.n_tokens))
        cost = meter.peak_bytes + model.last_held_bytes
    model.zero_grad(set_to_none=False)  # gradients are part of the static cost: keep them allocated
    return cost


def fit_step_cost(model: Seq2Seq, short: int, long: int, device: torch.device) -> StepCost:
    """Probe four (sentences, length) points and fit the cost model by least squares."""
    points = [(b, length) for length in (short, long) for b in (2, 8)]
    costs = [probe_step_bytes(model, synthetic_batch(b, length, model.cfg.src_vocab, model.cfg.tgt_vocab, device))
             for b, length in points]
    design = np.array([[1.0, b, b * length] for b, length in points])
    fixed, per_sentence, per_token = np.linalg.lstsq(design, np.array(costs, dtype=float), rcond=None)[0]
    return StepCost(max(float(fixed), 0.0), max(float(per_sentence), 0.0), max(float(per_token), 0.0))


def eval_bytes(model: Seq2Seq, sentences: int, length: int, beam: int) -> int:
    """An analytic bound on validation and beam search (no autograd): the larger of the decoder
    outputs, attention memory and one loss chunk's logits (validation), and the beam's rows, each
    with the memory and one step's logits and search scores."""
    cfg, floats = model.cfg, 4
    logits = cfg.tgt_vocab * floats * 3  # logits, log-softmax and one temporary
    validation = sentences * (length * (cfg.hidden_size + cfg.memory_dim) * floats + LOSS_CHUNK_STEPS * logits)
    search = sentences * beam * (length * cfg.memory_dim * floats + logits + cfg.hidden_size * 2 * floats)
    return max(validation, search)


def plan_budget(model: Seq2Seq, budget: int, optimizer: str, lengths: np.ndarray, device: torch.device,
                eval_batch_size: int = 64, beam: int = 5) -> BudgetPlan:
    """The largest token batch whose training step fits ``budget`` on data with these pair
    ``lengths``; BudgetError if not even the model, or one short pair, fits."""
    usable = budget * (1 - SAFETY_MARGIN)
    static = static_bytes(model, optimizer)
    if static >= usable:
        raise BudgetError(f"the model's parameters, gradients and {optimizer} state alone need "
                          f"{format_bytes(static)} (plus a {SAFETY_MARGIN:.0%} margin): a budget of at least "
                          f"{format_bytes(int(static / (1 - SAFETY_MARGIN)) + 1)} is needed, got {format_bytes(budget)}")
    lengths = np.maximum(np.asarray(lengths), 2)
    present = np.unique(lengths)
    min_length, max_length = int(present[0]), int(present[-1])
    cost = fit_step_cost(model, min_length, max(max_length, min_length + 1), device)
    room = usable - static
    fitting = [int(length) for length in present if cost(1, length) <= room]
    if not fitting:
        raise BudgetError(f"not even one {min_length}-token pair fits: a training step needs about "
                          f"{format_bytes(int(cost(1, min_length) + static))} of the {format_bytes(budget)} budget")
    longest = fitting[-1]
    # A batch whose longest pair has L tokens holds at most T // L pairs, and no more than the pairs
    # of the data that are at most L long: the worst batch the sampler can form, in any epoch.
    at_most = {length: int((lengths <= length).sum()) for length in fitting}

    def worst(tokens: int) -> float:
        return max(cost(min(max(tokens // length, 1), at_most[length]), length) for length in fitting)

    low, high = longest, longest * at_most[longest]  # one longest pair .. every pair in one batch
    if worst(high) <= room:
        low = high
    while low < high:  # the largest T with worst(T) <= room (worst grows with T)
        mid = (low + high + 1) // 2
        low, high = (mid, high) if worst(mid) <= room else (low, mid - 1)
    eval_size = eval_batch_size
    while eval_size > 1 and eval_bytes(model, eval_size, longest, beam) > room:
        eval_size //= 2
    measured_by = "cuda allocator" if device.type == "cuda" else "cpu accounting"
    return BudgetPlan(budget, static, low, longest, int(static + worst(low)), eval_size, measured_by, asdict(cost))
