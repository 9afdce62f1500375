import numpy as np
import pytest
import torch

from revnmt.data import BatchSampler
from revnmt.memory.budget import (BudgetError, StepCost, fit_step_cost, plan_budget, probe_step_bytes, static_bytes,
                                  synthetic_batch)
from revnmt.model import ModelConfig, Seq2Seq

CPU = torch.device("cpu")
LENGTHS = np.repeat(np.arange(4, 31), 20)  # 20 pairs of every length from 4 to 30


def _model(rnn="revgru", attention="emb+slice"):
    torch.manual_seed(0)
    return Seq2Seq(ModelConfig(rnn=rnn, emb_dim=32, hidden_size=32, attention=attention, slice_dim=4,
                               src_vocab=300, tgt_vocab=400, buffer_lanes=4))


def test_static_bytes_count_parameters_gradients_and_optimizer_state():
    model = _model()
    params = sum(p.numel() for p in model.parameters()) * 4
    assert static_bytes(model, "adam") == 4 * params and static_bytes(model, "sgd") == 2 * params


@pytest.mark.parametrize("rnn,attention", [("revgru", "emb+slice"), ("gru", "hidden")])
def test_the_fitted_cost_predicts_an_unseen_batch(rnn, attention):
    model = _model(rnn, attention)
    cost = fit_step_cost(model, 4, 30, CPU)
    measured = probe_step_bytes(model, synthetic_batch(5, 17, 300, 400, CPU))
    assert cost(5, 17) == pytest.approx(measured, rel=0.15)


def test_the_worst_batches_the_sampler_can_form_fit_the_budget():
    model, budget = _model(), 24 * 2 ** 20
    plan = plan_budget(model, budget, "adam", LENGTHS, CPU)
    assert plan.predicted_peak_bytes <= budget and plan.max_length == 30
    for length in (4, 12, 30):  # as many pairs as the token budget allows and the data holds
        sentences = min(plan.batch_tokens // length, int((LENGTHS <= length).sum()))
        batch = synthetic_batch(sentences, length, 300, 400, CPU)
        assert static_bytes(model, "adam") + probe_step_bytes(model, batch) <= budget


def test_reversible_fits_more_tokens_than_ordinary_under_one_budget():
    budget = 24 * 2 ** 20
    rev = plan_budget(_model(), budget, "adam", LENGTHS, CPU).batch_tokens
    ordinary = plan_budget(_model("gru", "hidden"), budget, "adam", LENGTHS, CPU).batch_tokens
    assert rev > 2 * ordinary


def test_budgets_too_small_say_what_is_needed():
    model = _model()
    with pytest.raises(BudgetError, match="a budget of at least"):
        plan_budget(model, 1024, "adam", LENGTHS, CPU)
    just_model = int(static_bytes(model, "adam") / 0.9) + 2048
    with pytest.raises(BudgetError, match="not even one"):
        plan_budget(model, just_model, "adam", LENGTHS, CPU)


def test_every_batch_the_sampler_forms_is_within_the_plan():
    model, budget = _model(), int(2.2 * 2 ** 20)
    plan = plan_budget(model, budget, "adam", LENGTHS, CPU)
    cost = StepCost(**plan.cost)
    sampler = BatchSampler(LENGTHS, batch_tokens=plan.batch_tokens, seed=3)
    assert len(sampler.batches(1)) > 3  # the budget, not the data, limits the batch
    for epoch in (1, 2, 3):
        for batch in sampler.batches(epoch):
            assert plan.static_bytes + cost(len(batch), LENGTHS[batch].max()) <= plan.predicted_peak_bytes + 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_peak_of_the_planned_batch_stays_under_the_budget():
    device, budget = torch.device("cuda"), 256 * 2 ** 20
    model = _model().to(device)
    plan = plan_budget(model, budget, "adam", LENGTHS, device)
    optimizer = torch.optim.Adam(model.parameters())
    torch.cuda.reset_peak_memory_stats()
    for length in (4, 12, 30):
        sentences = min(plan.batch_tokens // length, int((LENGTHS <= length).sum()))
        batch = synthetic_batch(sentences, length, 300, 400, device)
        model.train_step(batch.src, batch.src_len, batch.tgt_in, batch.tgt_out, float(batch.n_tokens))
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    assert torch.cuda.max_memory_allocated() <= budget
