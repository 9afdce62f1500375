"""Fit training into a memory budget: the largest batch, in tokens, whose step fits.

What the budget bounds is what a user's limit sees (:mod:`revnmt.memory.peak`): on CPU the process's
peak resident memory (RSS), on CUDA the caching allocator's peak reserved memory on the device. It
is measured, not guessed:

- the *base*: what the process holds before the first step (the runtime, the data, vocabularies and
  model, after one warm-up step has compiled what compiles lazily), plus the optimizer state that
  the first update will allocate;
- the *step cost*: a few probe steps on synthetic batches of the model itself, at short and long
  sentences and two batch sizes, each measured as its peak above what was held before it, fitted by

    step_bytes(B, L) = fixed + per_sentence·B + per_token·B·L

(B sentences padded to L tokens). A token budget T allows batches of B = T/L sentences of length L,
and the per-sentence part of the cost (one step's graph for a reversible model) grows as sentences
get shorter, so the worst case is not simply the longest length bucket. Every length present in the
data is checked, with B bounded by T/L and by the number of pairs at most L long (no batch can hold
more): the worst batch the sampler can form in any epoch.

With CUDA graphs (``--cuda-graphs on``) a step keeps memory after it: each batch shape's graphs keep
their tapes and static inputs from one replay to the next (``Measured.kept``), and their pool keeps the largest
captured step's working memory beside the eager steps' cache. The probes then measure a shape's first two steps
as training takes them (an eager warm-up, then the capture into a fresh pool), and the plan counts the kept
bytes of every other shape the cache may hold: ``step(B, L) + (shapes - 1) · kept(B, L)``, each fitted as above.

Training checks the measured peak after every step (:class:`BudgetGuard`); a step above the budget
shrinks the batches for the rest of the run.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np
import torch

from revnmt.data import BOS, EOS, Batch
from revnmt.model import Seq2Seq
from revnmt.model.seq2seq import LOSS_CHUNK_STEPS
from revnmt.rnn.products import uses_onednn

from .peak import PeakMeter, measuring_many, release_free_memory, track_freed_memory
from .sizes import format_bytes

logger = logging.getLogger(__name__)

SAFETY_MARGIN = 0.10  # of the budget, for allocator fragmentation and what the probes cannot see
CALIBRATIONS = 2  # rounds of measured steps near the planned batch size, to correct the cost fitted on small probes
CALIBRATION_SHARE = 0.25  # of the planned batch's tokens in those steps
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

    def scaled(self, factor: float) -> StepCost:
        return StepCost(self.fixed * factor, self.per_sentence * factor, self.per_token * factor)


@dataclass
class BudgetPlan:
    """What the budget allows; recorded in the log and the checkpoint."""

    budget_bytes: int
    base_bytes: int  # held between steps (measured: before the first, then while training) with the optimizer state
    batch_tokens: int  # the largest padded batch size in tokens whose step fits
    max_length: int  # the longest pair that fits alone (longer ones are skipped)
    predicted_peak_bytes: int  # base + the step cost of the worst batch the sampler can form
    eval_batch_size: int  # sentences per validation / beam-search batch that fit as well
    measured_by: str  # "RSS" (the process, CPU) or "CUDA reserved" (the device's allocator)
    cost: dict
    worst_batch: tuple[int, int] | None = None  # (sentences, length) of the costliest batch the plan allows
    step_tokens: int | None = None  # set when training outgrew the plan: larger batches train in parts
    # with CUDA graphs: the batch shapes whose graphs are kept at once, and what one keeps at most between steps
    shapes: int = 1
    kept_bytes: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, fields: dict) -> BudgetPlan:
        """The plan of a checkpoint (``to_dict``); BudgetError if a field is missing or not what a plan holds (a
        checkpoint is read, not trusted)."""
        known = {k: v for k, v in fields.items() if k in cls.__dataclass_fields__}

        def whole(value, low: int = 0) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= low

        checks = {"budget_bytes": whole, "base_bytes": whole, "batch_tokens": lambda v: whole(v, 1),
                  "max_length": lambda v: whole(v, 1), "predicted_peak_bytes": whole,
                  "eval_batch_size": lambda v: whole(v, 1), "measured_by": lambda v: isinstance(v, str),
                  "cost": lambda v: isinstance(v, dict),
                  "worst_batch": lambda v: v is None or (isinstance(v, (list, tuple)) and len(v) == 2
                                                         and all(whole(x, 1) for x in v)),
                  "step_tokens": lambda v: v is None or whole(v, 1), "shapes": lambda v: whole(v, 1),
                  "kept_bytes": whole}
        for name, valid in checks.items():
            if name in known and not valid(known[name]):
                raise BudgetError(f"its memory plan is not one revnmt wrote: {name} is "
                                  f"{known[name]!r}")
        try:
            plan = cls(**known)
        except TypeError as error:  # a field it must have is missing
            raise BudgetError(f"its memory plan is not one revnmt wrote ({error})") from error
        if plan.worst_batch is not None:
            plan.worst_batch = tuple(plan.worst_batch)
        return plan

    def describe(self) -> str:
        parts = "" if self.step_tokens is None else f", trained in parts of up to {self.step_tokens} tokens"
        graphs = "" if not self.kept_bytes else (f" and by the CUDA graphs of up to {self.shapes} batch shapes, "
                                                 f"{format_bytes(self.kept_bytes)} each")
        return (f"memory budget {format_bytes(self.budget_bytes)} of peak {self.measured_by}: batches of up to "
                f"{self.batch_tokens} tokens{parts}, pairs up to {self.max_length} tokens; held between steps "
                f"{format_bytes(self.base_bytes)}{graphs}, predicted peak {format_bytes(self.predicted_peak_bytes)}")

    def held_bytes(self) -> int:
        """What the plan lets training hold between steps: the base, and every kept shape's graphs."""
        return self.base_bytes + self.shapes * self.kept_bytes


class Measured(NamedTuple):
    """A probe's measurement of a batch's training step: its peak above what was held before it, and what it keeps
    held after it for the steps of its shape to come (a CUDA graph's tapes and static inputs; nothing eagerly)."""

    peak: int
    kept: int = 0


#: How the plan measures a training step on a batch (:func:`probe_step`, or the CUDA graphs'
#: :func:`revnmt.training.graphs.probe_graphed_step`).
Probe = Callable[[Seq2Seq, Batch, PeakMeter], Measured]


def optimizer_bytes(model: Seq2Seq, optimizer: str) -> int:
    """The optimizer's per-parameter state, which its first update allocates."""
    return sum(p.numel() * p.element_size() for p in model.parameters()) * OPTIMIZER_STATES[optimizer]


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


def measured_bytes(model: Seq2Seq, meter: PeakMeter, run: Callable[[], object]) -> int:
    """Bytes ``run()`` (training steps of ``model``) takes above what was held before it, as ``meter`` measures
    them. It starts as training's steps do, without gradients (``zero_grad(set_to_none=True)``), so their
    allocation is part of its cost."""
    model.train()
    model.zero_grad(set_to_none=True)
    release_free_memory(meter.device)
    before = meter.current()
    meter.reset()
    run()
    if meter.device.type == "cuda":
        torch.cuda.synchronize(meter.device)
    cost = meter.peak() - before
    model.zero_grad(set_to_none=True)
    return cost


def probe_step_bytes(model: Seq2Seq, batch: Batch, meter: PeakMeter) -> int:
    """Bytes one training step takes above what was held before it, as ``meter`` measures them."""
    return measured_bytes(model, meter, lambda: model.train_step(batch.src, batch.src_len, batch.tgt_in,
                                                                  batch.tgt_out, normalizer=float(batch.n_tokens)))


def probe_step(model: Seq2Seq, batch: Batch, meter: PeakMeter) -> Measured:
    """The eager training step's :class:`Measured`: its peak, keeping nothing.

    On oneDNN (:func:`revnmt.rnn.products.uses_onednn`) the step is measured the second time it runs on its shape.
    The first run of each row count makes oneDNN's kernels for it, which its caches keep (up to
    :data:`revnmt.rnn.products.ONEDNN_CACHE_ENTRIES` of them): that is held memory, which the plan counts where it
    measures what is held (:func:`held_bytes`), not the cost of every step. Counted as a step's cost, it swamps
    the small probes and shrinks the plan many times over."""
    if uses_onednn(meter.device):
        probe_step_bytes(model, batch, meter)
    return Measured(probe_step_bytes(model, batch, meter))


def measure_steps(model: Seq2Seq, points: list[tuple[int, int]], meter: PeakMeter, probe: Probe = probe_step
                  ) -> list[Measured]:
    """What ``probe`` measures of a step on each (sentences, length) batch, each logged: a large model's steps on
    long sentences take minutes on a CPU, and planning shows its progress."""
    cfg = model.cfg
    measured = []
    for b, length in points:
        measured.append(probe(model, synthetic_batch(b, length, cfg.src_vocab, cfg.tgt_vocab, meter.device), meter))
        kept = f", keeping {format_bytes(measured[-1].kept)}" if measured[-1].kept else ""
        logger.info("memory budget: a step on %d pairs of %d tokens takes %s of %s%s", b, length,
                    format_bytes(measured[-1].peak), meter.what, kept)
    return measured


def fit(points: list[tuple[int, int]], costs: list[int]) -> StepCost:
    """The cost model fitted to measured steps by least squares (no term below zero)."""
    design = np.array([[1.0, b, b * length] for b, length in points])
    fixed, per_sentence, per_token = np.linalg.lstsq(design, np.array(costs, dtype=float), rcond=None)[0]
    return StepCost(max(float(fixed), 0.0), max(float(per_sentence), 0.0), max(float(per_token), 0.0))


class CostModel(NamedTuple):
    """The fitted cost of a step (its peak) and of what it keeps, and how many shapes' kept bytes are held at once:
    the worst batch of a token budget costs the most ``step`` of its batches, and ``shapes - 1`` times the most
    ``kept`` beside it (the other shapes' graphs)."""

    step: StepCost
    kept: StepCost = StepCost(0, 0, 0)
    shapes: int = 1

    def worst(self, batches: list[tuple[int, int]]) -> float:
        return max(self.step(*b) for b in batches) + (self.shapes - 1) * max(self.kept(*b) for b in batches)

    @classmethod
    def fitted(cls, points: list[tuple[int, int]], measured: list[Measured], shapes: int) -> CostModel:
        return cls(fit(points, [m.peak for m in measured]), fit(points, [m.kept for m in measured]), shapes)


def held_bytes(model: Seq2Seq, optimizer: str, meter: PeakMeter) -> int:
    """What the process holds between steps, all it can free given back, plus the optimizer state
    that the first update allocates."""
    release_free_memory(meter.device)
    return meter.current() + optimizer_bytes(model, optimizer)


def base_bytes(model: Seq2Seq, optimizer: str, meter: PeakMeter) -> int:
    """What the process holds before the first step, after a warm-up step (compiled kernels, the
    runtime's lazily made state), plus the optimizer state the first update adds."""
    cfg = model.cfg
    probe_step_bytes(model, synthetic_batch(2, 4, cfg.src_vocab, cfg.tgt_vocab, meter.device), meter)
    return held_bytes(model, optimizer, meter)


def eval_bytes(model: Seq2Seq, sentences: int, length: int, beam: int) -> int:
    """An analytic bound on validation and beam search (no autograd): the larger of the decoder
    outputs, attention memory and one loss chunk's logits (validation), and the beam's rows, each
    with the memory and one step's logits and search scores."""
    cfg, floats = model.cfg, 4
    logits = cfg.tgt_vocab * floats * 3  # logits, log-softmax and one temporary
    validation = sentences * (length * (cfg.hidden_size + cfg.memory_dim) * floats + LOSS_CHUNK_STEPS * logits)
    search = sentences * beam * (length * cfg.memory_dim * floats + logits + cfg.hidden_size * 2 * floats)
    return max(validation, search)


def fit_costs(model: Seq2Seq, short: int, long: int, meter: PeakMeter, probe: Probe = probe_step,
              shapes: int = 1) -> CostModel:
    """Probe four small (sentences, length) batches and fit the cost model of a step and of what it keeps."""
    points = [(b, length) for length in (short, long) for b in (2, 8)]
    return CostModel.fitted(points, measure_steps(model, points, meter, probe), shapes)


@measuring_many()
def plan_budget(model: Seq2Seq, budget: int, optimizer: str, lengths: np.ndarray, device: torch.device,
                eval_batch_size: int = 64, beam: int = 5, mapped_bytes: int = 0, probe: Probe = probe_step,
                shapes: int = 1, held_for_good: int = 0) -> BudgetPlan:
    """The largest token batch whose training step keeps the measured peak within ``budget`` on data
    with these pair ``lengths``; BudgetError if not even the process as it stands, or one short pair, fits.

    ``mapped_bytes``: the memory-mapped data the batches read (the prepared ids). Its pages join the process's
    resident memory as the batches touch them, by the end of an epoch all of them, so on CPU, where the budget
    is the process's RSS, it is counted as held from the start.

    ``probe`` measures a step (:data:`Probe`); ``shapes``: how many batch shapes' kept bytes are held at once
    (the CUDA graphs' ``--cuda-graph-shapes``; an eager step keeps nothing); ``held_for_good``: what the steps hold
    between them from the first on, beside the model and the optimizer (the CUDA graphs' gradient accumulators)."""
    track_freed_memory()
    meter = PeakMeter(device)
    usable = budget * (1 - SAFETY_MARGIN)
    mapped = mapped_bytes if meter.device.type == "cpu" else 0  # on CUDA the budget is the device's memory
    base = base_bytes(model, optimizer, meter) + mapped + held_for_good
    if base >= usable:
        raise BudgetError(f"before its first step the process holds {format_bytes(base)} ({meter.what}: the runtime, "
                          f"data, model and {optimizer} state, plus a {SAFETY_MARGIN:.0%} margin): a budget of at "
                          f"least {format_bytes(_needed(base))} is needed, got "
                          f"{format_bytes(budget)}")
    lengths = np.maximum(np.asarray(lengths), 2)
    present = np.unique(lengths)
    min_length, max_length = int(present[0]), int(present[-1])
    cost = fit_costs(model, min_length, max(max_length, min_length + 1), meter, probe, shapes)
    room = usable - base
    # The probes are small batches and the plan's are large, whose cost per sentence and per token
    # the small ones only estimate: measure batches of a share of the planned size (a full-size step
    # can take a minute) at the shortest and the longest length and at the length of the plan's costliest
    # batch, refit on those, and again if the corrected plan moved. What the guard sees while training
    # corrects the rest.
    points, measured = [], []
    tokens = 0
    for _ in range(CALIBRATIONS):
        planned, (_, costliest) = _largest_batch(cost, room, lengths, present, min_length, budget, base)
        if abs(planned - tokens) <= 0.1 * planned:
            break
        tokens = planned
        new = sorted({(min(max(int(tokens * CALIBRATION_SHARE) // int(n), 1), int((lengths <= n).sum())), int(n))
                      for n in (present[0], costliest, present[-1]) if cost.worst([(1, n)]) <= room})
        points += new
        measured += measure_steps(model, new, meter, probe)
        cost = CostModel.fitted(points, measured, shapes)
    # Large steps leave the runtime holding more than a small one did (the math libraries' work
    # buffers grow to the largest product and stay): that is held between all later steps too.
    base = max(base, held_bytes(model, optimizer, meter) + mapped + held_for_good)
    room = usable - base
    tokens, (sentences, length) = _largest_batch(cost, room, lengths, present, min_length, budget, base)
    longest = max(int(n) for n in present if cost.worst([(1, n)]) <= room)
    eval_size = eval_batch_size
    while eval_size > 1 and eval_bytes(model, eval_size, longest, beam) > room:
        eval_size //= 2
    batches = _batches(tokens, _pairs_at_most(lengths, [int(n) for n in present if n <= longest]))
    kept = math.ceil(max(cost.kept(*b) for b in batches))  # bounds, rounded up: a fit's 1091895.99 is 1091896
    return BudgetPlan(budget, base, tokens, longest, math.ceil(base + cost.worst(batches)), eval_size, meter.what,
                      asdict(cost.step), (sentences, length), shapes=shapes, kept_bytes=kept)


def _needed(peak: float) -> int:
    """The smallest budget whose share left by :data:`SAFETY_MARGIN` holds ``peak`` bytes."""
    return int(peak / (1 - SAFETY_MARGIN)) + 1


def _pairs_at_most(lengths: np.ndarray, fitting: list[int]) -> dict[int, int]:
    """For each length L, the pairs of the data at most L long."""
    return {length: int((lengths <= length).sum()) for length in fitting}


def _batches(tokens: int, at_most: dict[int, int]) -> list[tuple[int, int]]:
    """The costliest batch of each length the sampler can form with a token budget: a batch whose longest pair has
    L tokens holds at most T // L pairs, and no more than the pairs of the data that are at most L long (in any
    epoch)."""
    return [(min(max(tokens // length, 1), pairs), length) for length, pairs in at_most.items()]


def _largest_batch(cost: CostModel, room: float, lengths: np.ndarray, present: np.ndarray, min_length: int,
                   budget: int, base: int) -> tuple[int, tuple[int, int]]:
    """The largest token budget T whose worst batch costs at most ``room``, and that worst batch's
    (sentences, length); BudgetError if not one short pair fits."""
    fitting = [int(length) for length in present if cost.worst([(1, length)]) <= room]
    if not fitting:
        step = cost.worst([(1, min_length)]) + base
        raise BudgetError(f"not even one {min_length}-token pair fits: a training step on it peaks at about "
                          f"{format_bytes(int(step))}, plus a {SAFETY_MARGIN:.0%} margin: a budget of at least "
                          f"{format_bytes(_needed(step))} is needed, got {format_bytes(budget)}")
    longest = fitting[-1]
    at_most = _pairs_at_most(lengths, fitting)

    def worst(tokens: int) -> float:
        return cost.worst(_batches(tokens, at_most))

    low, high = longest, longest * at_most[longest]  # one longest pair .. every pair in one batch
    if worst(high) <= room:
        low = high
    while low < high:  # the largest T with worst(T) <= room (worst grows with T)
        mid = (low + high + 1) // 2
        low, high = (mid, high) if worst(mid) <= room else (low, mid - 1)
    return low, max(_batches(low, at_most), key=lambda batch: cost.step(*batch))


class BudgetGuard:
    """Checks what training really takes against the plan, after every step.

    Two things can outgrow the plan: a step's peak, when a batch costs more than the fitted cost
    said, and what the process keeps between steps, which grows over the first steps (the math
    libraries' work buffers and kernels of new shapes) beyond what the planning probes left (and, with CUDA
    graphs, the kept shapes' share). What is kept is the meter's :meth:`~revnmt.memory.peak.PeakMeter.live`
    bytes: on CUDA the allocator's cache of free blocks is the next step's to reuse, not a loss of room, and on
    CPU the heap's free pages are given back before they are counted. Either shrinks the plan where the predicted
    step no longer fits beside what is held: batches larger than ``plan.step_tokens`` then train in parts whose
    gradients add up to the whole batch's, so the updates stay the same (``revnmt.training.trainer``). A step
    over the budget is reported once, with the batch that did it; the peak then restarts, so that
    the log shows what the smaller parts take.
    """

    def __init__(self, plan: BudgetPlan, device: torch.device) -> None:
        self.plan, self.meter = plan, PeakMeter(device)
        self.warned = False

    def describe_peak(self) -> str:
        """The measured peak beside the budget, for the log."""
        return (f"peak {self.meter.what} {format_bytes(self.meter.peak())} of "
                f"{format_bytes(self.plan.budget_bytes)} budget")

    def check(self, sentences: int, length: int, tokens: int) -> bool:
        """After a step on ``sentences`` pairs padded to ``length`` (``tokens`` padded tokens in its
        largest part): True if the plan still holds, else shrink it (with a warning the first time a
        step went over the budget) and return False."""
        plan = self.plan
        peak, held = self.meter.peak(), self.meter.live()
        usable = plan.budget_bytes * (1 - SAFETY_MARGIN)
        limit = plan.step_tokens or plan.batch_tokens
        # Step costs grow about linearly with the tokens of a batch: scale the limit by the room left.
        shrink = 1.0
        if peak > plan.budget_bytes:
            shrink = max(usable - plan.base_bytes, 0) / max(peak - plan.base_bytes, 1) * min(tokens, limit) / limit
        allowed = plan.held_bytes()  # the base, and the kept graphs' share of every step's room
        if held > allowed:
            # The steps have that much less room. Shrink the batches only as far as the plan's predicted step no
            # longer fits beside what is held now: a plan the data capped (every pair fits in one batch) has room to
            # spare, and a plan the budget capped has none.
            step = max(plan.predicted_peak_bytes - allowed, 1) * limit / plan.batch_tokens
            shrink = min(shrink, max(usable - held, 0) / step)
            plan.base_bytes += held - allowed
            plan.predicted_peak_bytes += held - allowed
        if shrink >= 0.98:
            return True
        plan.step_tokens = max(1, int(limit * shrink))
        if peak > plan.budget_bytes and not self.warned:
            logger.warning("a step on %d pairs padded to %d tokens peaked at %s %s, over the %s budget: batches "
                           "train in parts of up to %d tokens from now on", sentences, length,
                           format_bytes(peak), self.meter.what, format_bytes(plan.budget_bytes), plan.step_tokens)
            self.warned = True
        if peak > plan.budget_bytes:
            self.meter.reset()
        return False


class Accumulation(NamedTuple):
    """How a target batch is reached in batches that fit: ``update_freq`` batches of ``batch_tokens`` per update."""

    update_freq: int
    batch_tokens: int


def accumulation_for(target_tokens: int, fitted_tokens: int) -> Accumulation:
    """The gradient accumulation (fairseq's ``--update-freq``) that reaches an update of ``target_tokens`` padded
    tokens with batches of at most ``fitted_tokens`` (what a memory budget fits): the fewest batches that hold the
    target, and the target spread evenly over them, so that ``update_freq * batch_tokens >= target_tokens`` and
    ``batch_tokens <= fitted_tokens``."""
    if target_tokens < 1 or fitted_tokens < 1:
        raise ValueError(f"token counts must be positive, got target {target_tokens} and fitted {fitted_tokens}")
    update_freq = -(-target_tokens // fitted_tokens)  # ceilings in integers
    return Accumulation(update_freq, -(-target_tokens // update_freq))


@measuring_many()
def measure_planned_step(model: Seq2Seq, plan: BudgetPlan, device: torch.device) -> int:
    """The measured peak (what the budget bounds) of one training step on the plan's costliest batch."""
    sentences, length = plan.worst_batch
    meter = PeakMeter(device)
    probe_step_bytes(model, synthetic_batch(sentences, length, model.cfg.src_vocab, model.cfg.tgt_vocab, device),
                     meter)
    return meter.peak()
