import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
import torch

from revnmt.data import BatchSampler
from revnmt.memory.budget import (
    CALIBRATION_SHARE,
    BudgetError,
    BudgetGuard,
    BudgetPlan,
    CostModel,
    Measured,
    StepCost,
    _largest_batch,
    accumulation_for,
    base_bytes,
    fit_costs,
    optimizer_bytes,
    plan_budget,
    probe_step,
    probe_step_bytes,
    synthetic_batch,
)
from revnmt.memory.peak import PeakMeter, release_free_memory, track_freed_memory
from revnmt.model import ExecutionConfig, ModelConfig, build_model
from revnmt.rnn.products import uses_onednn

CPU = torch.device("cpu")
LENGTHS = np.repeat(np.arange(4, 31), 20)  # 20 pairs of every length from 4 to 30
MiB = 2 ** 20


def _model(rnn="revgru", attention="emb+slice", device=CPU):
    # Large enough that a step's cost stands well above the RSS's page-level noise.
    torch.manual_seed(0)
    return build_model(ModelConfig(rnn=rnn, emb_dim=128, hidden_size=256, attention=attention, slice_dim=16,
                                   src_vocab=2000, tgt_vocab=4000), ExecutionConfig(buffer_lanes=4)).to(device)


@pytest.fixture(autouse=True)
def _freed_memory_is_returned():
    track_freed_memory()


def _budget_above_base(model, room: int) -> int:
    """A budget that leaves ``room`` bytes for the steps above what this test process holds."""
    return int((base_bytes(model, "adam", PeakMeter(CPU)) + room) / 0.9)


def test_optimizer_state_is_counted_per_parameter():
    model = _model()
    params = sum(p.numel() for p in model.parameters()) * 4
    assert optimizer_bytes(model, "adam") == 2 * params and optimizer_bytes(model, "sgd") == 0


def test_the_peak_meter_sees_a_tensor_come_and_go():
    meter = PeakMeter(CPU)
    release_free_memory(CPU)
    before = meter.current()
    meter.reset()
    block = torch.ones(64 * MiB // 4)  # 64 MiB, touched
    held = meter.current() - before
    del block
    release_free_memory(CPU)
    assert held >= 60 * MiB and meter.peak() - before >= 60 * MiB
    assert meter.current() - before < 8 * MiB  # given back to the system when freed


def _in_a_fresh_process(measure, *args):
    """``measure(*args)`` in a spawned interpreter: a comparison of RSS peaks a few MiB apart, which a process that
    hundreds of earlier tests have left its heap and the math libraries' caches to moves by as much (a fitted cost
    26% above the step it predicted, in a suite run where it is 1-8% above in a fresh process)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, *args).result()


def _predicted_and_measured(rnn: str, attention: str) -> tuple[float, int]:
    track_freed_memory()
    model, meter = _model(rnn, attention), PeakMeter(CPU)
    base_bytes(model, "adam", meter)  # warm up
    cost = fit_costs(model, 4, 30, meter).step
    measured = probe_step(model, synthetic_batch(5, 17, 2000, 4000, CPU), meter).peak  # as the same step takes again
    return cost(5, 17), measured


@pytest.mark.parametrize("rnn,attention", [("revgru", "emb+slice"), ("gru", "hidden")])
def test_the_fitted_cost_predicts_an_unseen_batch(rnn, attention):
    predicted, measured = _in_a_fresh_process(_predicted_and_measured, rnn, attention)
    assert predicted == pytest.approx(measured, rel=0.25)


def _first_again_probed_rerun() -> tuple[int, int, int, int]:
    track_freed_memory()
    model, meter = _model(), PeakMeter(CPU)
    base_bytes(model, "adam", meter)
    batch, other = synthetic_batch(7, 13, 2000, 4000, CPU), synthetic_batch(9, 11, 2000, 4000, CPU)
    first, again = probe_step_bytes(model, other, meter), probe_step_bytes(model, other, meter)
    probed = probe_step(model, batch, meter).peak
    return first, again, probed, probe_step_bytes(model, batch, meter)


@pytest.mark.skipif(not uses_onednn(CPU), reason="oneDNN's kernels for a new row count are what the probe sets aside")
def test_a_probe_measures_the_step_as_it_runs_again_not_the_kernels_its_first_run_makes():
    # oneDNN makes kernels for each new row count and keeps them: held from then on, a few MiB. Were the first run
    # measured, each probe of a new shape would count them as its own cost, and a tight budget's plan shrank to a
    # sliver of what fits (95 tokens a batch under 700 MiB for a 64-unit RevGRU that fits 59,652).
    first, again, probed, rerun = _in_a_fresh_process(_first_again_probed_rerun)
    kept = first - again  # what the first step of a shape makes and oneDNN keeps
    assert kept > MiB
    # as the step runs again: two runs of one step differ by the RSS's page-level noise (up to 1 MiB seen, on a
    # 15 MiB step), a small share of what a first run adds (about 10 MiB)
    assert abs(probed - rerun) < kept / 3


def test_the_worst_batches_the_sampler_can_form_stay_within_the_budget():
    model = _model()
    budget = _budget_above_base(model, 64 * MiB)
    plan = plan_budget(model, budget, "adam", LENGTHS, CPU)
    assert plan.predicted_peak_bytes <= budget and plan.max_length == 30
    meter = PeakMeter(CPU)
    for length in (4, 12, 30):  # as many pairs as the token budget allows and the data holds
        sentences = min(plan.batch_tokens // length, int((LENGTHS <= length).sum()))
        batch = synthetic_batch(sentences, length, 2000, 4000, CPU)
        assert plan.base_bytes + probe_step_bytes(model, batch, meter) <= budget


def _plan_both() -> tuple[int, int]:
    """Batch tokens of a reversible and an ordinary model under one budget 192 MiB above the process's base."""
    track_freed_memory()
    rev_model, ordinary_model = _model(), _model("gru", "hidden")
    budget = _budget_above_base(rev_model, 192 * MiB)
    rev = plan_budget(rev_model, budget, "adam", LENGTHS, CPU).batch_tokens
    ordinary = plan_budget(ordinary_model, budget, "adam", LENGTHS, CPU).batch_tokens
    return rev, ordinary


def test_reversible_fits_more_tokens_than_ordinary_under_one_budget():
    # With room for steps well above the probes' noise: the probes read the process's RSS, which moves by several
    # MiB between two small steps (the allocator, the math libraries' caches). With 64 MiB of room those moves
    # decided the plans as much as the models did.
    rev, ordinary = _in_a_fresh_process(_plan_both)
    assert rev > 2 * ordinary


def test_budgets_too_small_say_what_is_needed():
    model = _model()
    with pytest.raises(BudgetError, match="before its first step the process holds .* a budget of at least"):
        plan_budget(model, 64 * MiB, "adam", LENGTHS, CPU)
    with pytest.raises(BudgetError, match="not even one .* margin: a budget of at least"):
        plan_budget(model, _budget_above_base(model, 0) + MiB, "adam", LENGTHS, CPU)
    # memory-mapped data the batches will page in is held too, on CPU
    budget = _budget_above_base(model, 0) + 64 * MiB
    with pytest.raises(BudgetError, match="before its first step the process holds"):
        plan_budget(model, budget, "adam", LENGTHS, CPU, mapped_bytes=64 * MiB)


@pytest.mark.parametrize("cost", [StepCost(2 * MiB, 40_000, 3_000),  # per-sentence costs dominate short pairs
                                  StepCost(2 * MiB, 0, 12_000)])  # a per-token cost alone
def test_every_batch_the_sampler_forms_is_within_the_plan(cost):
    # The search for the largest token batch, on a known cost: no batch the sampler forms costs more
    # than the plan's costliest one, which fits the room.
    room, lengths = 6 * MiB, LENGTHS
    tokens, (sentences, length) = _largest_batch(CostModel(cost), room, lengths, np.unique(lengths), 4, 100 * MiB, 0)
    assert cost(sentences, length) <= room < cost(min(tokens // length + 1, int((lengths <= length).sum())), length) \
        or sentences == int((lengths <= length).sum())  # one more pair would not fit (or the data has no more)
    sampler = BatchSampler(lengths, batch_tokens=tokens, seed=3)
    assert len(sampler.batches(1)) > 3  # the budget, not the data, limits the batch
    for epoch in (1, 2, 3):
        for batch in sampler.batches(epoch):
            assert cost(len(batch), lengths[batch].max()) <= cost(sentences, length) + 1


def test_with_cuda_graphs_every_batch_fits_beside_the_other_shapes_kept():
    # The other kept shapes' graphs hold their tapes beside every step: the plan fits the costliest step and
    # shapes - 1 times the most any batch keeps into the room, so it fits fewer tokens than the eager step's.
    step, kept, room, lengths = StepCost(2 * MiB, 40_000, 3_000), StepCost(0, 2_000, 300), 12 * MiB, LENGTHS
    present = np.unique(lengths)
    eager, _ = _largest_batch(CostModel(step), room, lengths, present, 4, 100 * MiB, 0)
    tokens, _ = _largest_batch(CostModel(step, kept, 8), room, lengths, present, 4, 100 * MiB, 0)
    assert tokens < eager
    batches = BatchSampler(lengths, batch_tokens=tokens, seed=3).batches(1)
    costs = [(step(len(b), lengths[b].max()), kept(len(b), lengths[b].max())) for b in batches]
    assert max(c for c, _ in costs) + 7 * max(k for _, k in costs) <= room


def test_a_plan_with_kept_shapes_counts_them_in_its_peak_and_between_steps():
    # A probe that measures known costs (as the CUDA graphs' probe would measure them): the plan predicts the
    # costliest step with every other shape's kept bytes, and lets training hold every shape's between steps.
    step, kept = StepCost(MiB, 30_000, 2_500), StepCost(4_096, 1_000, 200)

    def probe(model, batch, meter):
        b, length = batch.src.shape
        return Measured(int(step(b, length)), int(kept(b, length)))

    model = _model()
    budget = _budget_above_base(model, 24 * MiB)
    plan = plan_budget(model, budget, "adam", LENGTHS, CPU, probe=probe, shapes=5)
    sentences, length = plan.worst_batch
    assert plan.shapes == 5 and plan.kept_bytes >= int(kept(sentences, length))
    # The probe's whole bytes fit the costs to within a byte, and kept_bytes is the fit rounded up: each of the 4
    # other shapes' share of the peak may be a byte less than kept_bytes.
    assert plan.predicted_peak_bytes >= plan.base_bytes + step(sentences, length) - 1 + 4 * (plan.kept_bytes - 1)
    assert plan.predicted_peak_bytes <= budget * 0.9
    assert plan.held_bytes() == plan.base_bytes + 5 * plan.kept_bytes
    assert "CUDA graphs of up to 5 batch shapes" in plan.describe()
    eager = plan_budget(model, budget, "adam", LENGTHS, CPU,
                        probe=lambda m, b, meter: Measured(probe(m, b, meter).peak))
    assert eager.kept_bytes == 0 and eager.batch_tokens > plan.batch_tokens
    # what the graphs hold for good (their gradient accumulators) is held before the first step
    with pytest.raises(BudgetError, match="before its first step the process holds"):
        plan_budget(model, budget, "adam", LENGTHS, CPU, probe=probe, shapes=5, held_for_good=budget)


class _FakeCuda:
    """What the CUDA allocator reports, set by the test: reserved bytes (with the cache of free blocks), allocated
    (live) bytes, and the reserved peak."""

    def __init__(self, monkeypatch, reserved: int, allocated: int, peak: int) -> None:
        self.reserved, self.allocated, self.peak = reserved, allocated, peak
        for name, value in {"memory_reserved": lambda device=None: self.reserved,
                            "memory_allocated": lambda device=None: self.allocated,
                            "max_memory_reserved": lambda device=None: self.peak,
                            "synchronize": lambda device=None: None,
                            "reset_peak_memory_stats": lambda device=None: None}.items():
            monkeypatch.setattr(torch.cuda, name, value)


def _cuda_plan(**fields) -> BudgetPlan:
    return BudgetPlan(**(dict(budget_bytes=1000 * MiB, base_bytes=300 * MiB, batch_tokens=4000, max_length=30,
                              predicted_peak_bytes=880 * MiB, eval_batch_size=8, measured_by="CUDA reserved",
                              cost={}) | fields))


def test_on_cuda_the_blocks_the_allocator_caches_after_a_step_are_not_held(monkeypatch):
    # After a step the CUDA allocator keeps the step's freed blocks reserved, for the next step to reuse: what the
    # process holds between steps is the allocated bytes, so a plan whose step fits is left as it is.
    cuda = _FakeCuda(monkeypatch, reserved=880 * MiB, allocated=300 * MiB, peak=880 * MiB)
    plan = _cuda_plan()
    guard = BudgetGuard(plan, torch.device("cuda"))
    assert guard.check(100, 30, 3000) and plan.step_tokens is None and plan.base_bytes == 300 * MiB
    # what is really held (allocated) grows past the plan's base: the steps get that much less room
    cuda.allocated = 400 * MiB
    assert not guard.check(100, 30, 3000)
    # the planned step (880 - 300 MiB) fits beside 400 MiB held in 500 of the 900 usable: 500 / 580 of the batch
    assert plan.base_bytes == 400 * MiB and plan.step_tokens == int(4000 * 500 / 580)
    assert plan.predicted_peak_bytes == 980 * MiB


def test_a_plan_the_data_capped_keeps_its_batches_while_what_is_held_grows_into_its_spare_room(monkeypatch):
    # Every pair fits in one batch of the plan, whose step is predicted to peak at 500 MiB of the 900 usable:
    # 100 MiB more held between steps still leaves the step its room, and the batches stay whole.
    cuda = _FakeCuda(monkeypatch, reserved=500 * MiB, allocated=300 * MiB, peak=500 * MiB)
    plan = _cuda_plan(predicted_peak_bytes=500 * MiB)
    guard = BudgetGuard(plan, torch.device("cuda"))
    cuda.allocated = 400 * MiB
    assert guard.check(100, 30, 3000) and plan.step_tokens is None
    assert (plan.base_bytes, plan.predicted_peak_bytes) == (400 * MiB, 600 * MiB)
    cuda.allocated = 700 * MiB  # the 200 MiB step fits exactly beside what is held
    assert guard.check(100, 30, 3000) and plan.step_tokens is None
    cuda.allocated = 800 * MiB  # 100 MiB of room for a 200 MiB step: half the batch
    assert not guard.check(100, 30, 3000) and plan.step_tokens == 2000


def test_the_kept_shapes_graphs_are_part_of_what_the_plan_lets_training_hold(monkeypatch):
    # With CUDA graphs the kept shapes' tapes are live between steps: up to shapes x kept_bytes above the base.
    cuda = _FakeCuda(monkeypatch, reserved=900 * MiB, allocated=300 * MiB + 4 * 20 * MiB, peak=880 * MiB)
    plan = _cuda_plan(shapes=4, kept_bytes=20 * MiB)
    guard = BudgetGuard(plan, torch.device("cuda"))
    assert guard.check(100, 30, 3000) and plan.step_tokens is None
    cuda.allocated += 100 * MiB  # beyond them: the steps get that much less room
    assert not guard.check(100, 30, 3000) and plan.base_bytes == 400 * MiB


def test_a_step_over_the_budget_shrinks_the_plan_once_and_warns(caplog):
    plan = BudgetPlan(budget_bytes=PeakMeter(CPU).current(), base_bytes=PeakMeter(CPU).current() // 2,
                      batch_tokens=4000, max_length=30, predicted_peak_bytes=0, eval_batch_size=8, measured_by="RSS",
                      cost={})
    guard = BudgetGuard(plan, CPU)
    block = torch.ones(256 * MiB // 4)  # the "step": the peak is now above the budget
    del block
    assert not guard.check(100, 30, 3000)
    assert 1 <= plan.step_tokens < 3000 and "over the" in caplog.text
    assert BudgetPlan.from_dict(plan.to_dict() | {"measured_peak": "x"}) == plan  # saved with the checkpoint


@pytest.mark.parametrize("field, value", [("batch_tokens", "4000"), ("batch_tokens", 0), ("shapes", True),
                                          ("kept_bytes", -1), ("worst_batch", [3]), ("cost", None)])
def test_a_checkpoints_memory_plan_is_checked_before_it_is_used(field, value):
    plan = _cuda_plan(worst_batch=(10, 30))
    assert BudgetPlan.from_dict(plan.to_dict()) == plan
    with pytest.raises(BudgetError, match=f"not one revnmt wrote: {field} is"):
        BudgetPlan.from_dict(plan.to_dict() | {field: value})
    with pytest.raises(BudgetError, match="not one revnmt wrote"):
        BudgetPlan.from_dict({k: v for k, v in plan.to_dict().items() if k != "base_bytes"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_reserved_peak_of_the_planned_batch_stays_under_the_budget():
    device = torch.device("cuda")
    model = _model(device=device)
    meter = PeakMeter(device)
    budget = int((base_bytes(model, "adam", meter) + 256 * MiB) / 0.9)
    plan = plan_budget(model, budget, "adam", LENGTHS, device)
    optimizer = torch.optim.Adam(model.parameters())
    release_free_memory(device)
    meter.reset()
    for length in (4, 12, 30):
        sentences = min(plan.batch_tokens // length, int((LENGTHS <= length).sum()))
        batch = synthetic_batch(sentences, length, 2000, 4000, device)
        model.train_step(batch.src, batch.src_len, batch.tgt_in, batch.tgt_out, float(batch.n_tokens))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert meter.peak() <= budget


@pytest.mark.parametrize("target, fitted, expected", [
    (4096, 10_000, (1, 4096)),  # the batch that fits holds the whole update
    (4096, 4096, (1, 4096)),
    (4097, 4096, (2, 2049)),  # one token over: two batches, the target spread evenly
    (4096, 1000, (5, 820)),
    (1, 1, (1, 1)),
])
def test_accumulation_reaches_the_target_with_the_fewest_batches_that_fit(target, fitted, expected):
    assert accumulation_for(target, fitted) == expected


def test_accumulation_never_falls_short_of_the_target_nor_exceeds_what_fits():
    for target in range(1, 300):
        for fitted in range(1, 120):
            update_freq, batch_tokens = accumulation_for(target, fitted)
            assert update_freq * batch_tokens >= target and batch_tokens <= fitted
            assert (update_freq - 1) * fitted < target  # no fewer batches would do


def test_accumulation_needs_positive_token_counts():
    with pytest.raises(ValueError, match="positive"):
        accumulation_for(0, 100)
    with pytest.raises(ValueError, match="positive"):
        accumulation_for(100, 0)


def test_the_calibration_measures_steps_at_the_length_of_the_plans_costliest_batch():
    # The small probes only estimate a large batch's cost; the steps at a share of the planned size correct it
    # where the plan is decided. A step cost known exactly (no RSS noise) makes the plan's costliest length certain:
    # with per-sentence costs, many short pairs, not the shortest or longest length, cost the most.
    cost, probed = StepCost(2 * MiB, 40_000, 3_000), []

    def known_cost(model, batch, meter):
        probed.append((len(batch.src_len), batch.src.shape[1]))
        return Measured(int(cost(*probed[-1])))

    lengths = np.repeat(np.arange(4, 31), np.arange(4, 31) ** 2)  # more pairs the longer: batches of short pairs
    model = _model()
    plan = plan_budget(model, _budget_above_base(model, 48 * MiB), "adam", lengths, CPU, probe=known_cost)
    sentences, length = plan.worst_batch
    assert length not in (4, 30)
    calibration = [(b, n) for b, n in probed[4:] if n == length]  # after the four small probes of the first fit
    assert calibration and all(b * n >= plan.batch_tokens * CALIBRATION_SHARE - n for b, n in calibration)
