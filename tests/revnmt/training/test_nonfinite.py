"""Divergence is a fault, not a result: an update whose loss or gradients are not finite (or whose fixed-point
state overflows) is skipped and logged, --max-nonfinite of them in a row stop the run, a non-finite dev score
never makes best.pt, and non-finite weights are never saved."""

import logging
import math
from collections.abc import Callable

import pytest
import torch

import revnmt.training.trainer as trainer_module
from buffers import FixedPointOverflowError
from revnmt.arguments import build_parser
from revnmt.checkpoints import Checkpoint, save_checkpoint
from revnmt.data import DataConfig, load_data, make_batch
from revnmt.model import ExecutionConfig, ModelConfig, build_model
from revnmt.training import RunConfig, Trainer, TrainingConfig
from revnmt.training.schedule import build_optimizer
from revnmt.training.trainer import Validation, clip_and_step, compute_gradients


def _model_and_optimizer(optimizer: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, build_optimizer(TrainingConfig(save_dir="unused", optimizer=optimizer), model.parameters())


def _backward(model: torch.nn.Module) -> torch.Tensor:
    loss = model(torch.ones(4, 3)).square().sum()
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("clip", [0.0, 5.0])
@pytest.mark.parametrize("fault", ["loss", "gradient"])
def test_a_non_finite_loss_or_gradient_skips_the_step_and_drops_the_gradients(optimizer, clip, fault):
    model, opt = _model_and_optimizer(optimizer)
    before = [p.detach().clone() for p in model.parameters()]
    loss = _backward(model)
    if fault == "loss":
        loss = loss * math.nan  # the gradients stay finite
    else:
        model.bias.grad[0] = math.inf
    assert not clip_and_step(opt, clip, loss)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(p.grad is None for p in model.parameters()) and not opt.state  # Adam's moments and count untouched

    loss = _backward(model)  # the next, finite one steps as ever
    assert clip_and_step(opt, clip, loss)
    assert not any(torch.equal(p, b) for p, b in zip(model.parameters(), before))


@pytest.mark.parametrize("clip", [0.0, 1e-3])
def test_a_finite_update_is_the_plain_clipped_step(clip):
    (model, opt), (twin, twin_opt) = _model_and_optimizer("adam"), _model_and_optimizer("adam")
    for _ in range(3):
        assert clip_and_step(opt, clip, _backward(model))
        _backward(twin)
        if clip:
            torch.nn.utils.clip_grad_norm_(twin.parameters(), clip)
        twin_opt.step()
        opt.zero_grad()
        twin_opt.zero_grad()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))


def _reversible(toy) -> tuple[torch.nn.Module, object, object]:
    data = load_data(DataConfig(train=toy["train"], valid=toy["valid"], min_freq=1))
    torch.manual_seed(0)
    model = build_model(ModelConfig(rnn="revgru", emb_dim=16, hidden_size=16, attention="emb+slice", slice_dim=4,
                                    src_vocab=len(data.src_vocab), tgt_vocab=len(data.tgt_vocab)),
                        ExecutionConfig(buffer_lanes=4))
    with torch.no_grad():
        for param in model.parameters():
            param.fill_(math.nan)  # diverged weights: the fixed-point state leaves its range at once
    return model, data, make_batch(data.train, list(range(12)))


def test_a_fixed_point_overflow_leaves_a_nan_loss_and_zero_gradients(toy):
    model, _, batch = _reversible(toy)
    gradients = compute_gradients(model, [batch])
    assert isinstance(gradients.overflow, FixedPointOverflowError) and math.isnan(gradients.loss)
    assert gradients.skip_reason().startswith("fixed-point overflow")
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_a_fixed_point_overflow_in_validation_is_a_nan_score(toy, tmp_path):
    model, data, _ = _reversible(toy)
    config = RunConfig(DataConfig(train=toy["train"], valid=toy["valid"], min_freq=1), model.cfg,
                       TrainingConfig(save_dir=str(tmp_path)))
    result = Trainer(config, data, model).evaluate()
    assert math.isnan(result.loss) and math.isnan(result.bleu) and model.training


def _failing(monkeypatch, name: str, when: Callable[[int], bool], fault: Callable) -> None:
    """Apply ``fault`` to the first argument of the trainer's function ``name`` after each call whose number
    (from 1, over the test) ``when`` accepts."""
    original, calls = getattr(trainer_module, name), []

    def wrapper(*args):
        result = original(*args)
        calls.append(1)
        if when(len(calls)):
            fault(args[0])
        return result

    monkeypatch.setattr(trainer_module, name, wrapper)


def _infinite_gradient(model) -> None:
    next(model.parameters()).grad.view(-1)[0] = math.inf


def test_skipped_updates_are_logged_and_the_run_goes_on(train, tmp_path, monkeypatch, caplog):
    _failing(monkeypatch, "compute_gradients", {2, 3}.__contains__, _infinite_gradient)
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        assert train(run, "--max-steps", "6") == 0
    assert "batch 1 of epoch 1 (step 2): non-finite loss or gradients; the update was skipped (1 in a row)" \
        in caplog.text
    assert "batch 2 of epoch 1 (step 3): non-finite loss or gradients; the update was skipped (2 in a row)" \
        in caplog.text
    training = Checkpoint.load(run / "last.pt").training
    assert training.trainer.step == 6 and training.trainer.nonfinite_in_a_row == 0
    assert all(int(state["step"]) == 4 for state in training.optimizer["state"].values())  # 2 never made
    assert (run / "best.pt").exists()

    # A checkpoint from before the count existed (and before checkpoints had a format version) resumes.
    stored = Checkpoint.load(run / "last.pt").to_dict()
    del stored["format"], stored["trainer"]["nonfinite_in_a_row"]
    save_checkpoint(run / "last.pt", stored)
    assert train(run, "--max-steps", "7") == 0
    assert Checkpoint.load(run / "last.pt").step == 7


def test_max_nonfinite_updates_in_a_row_stop_the_run_and_the_count_resumes(train, tmp_path, monkeypatch, capsys):
    _failing(monkeypatch, "compute_gradients", lambda call: call >= 3, _infinite_gradient)
    run = tmp_path / "run"
    assert train(run, "--max-steps", "20", "--save-every", "1", "--max-nonfinite", "3") == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith("training diverged at step 5: 3 updates in a row had a non-finite loss or "
                                         "gradients (--max-nonfinite 3); the checkpoint of step 4 is kept (resuming "
                                         "with a lower --lr or --clip may avoid the fault)")
    assert "Traceback" not in err and not (run / "best.pt").exists()
    checkpoint = Checkpoint.load(run / "last.pt")
    assert checkpoint.step == 4 and checkpoint.training.trainer.nonfinite_in_a_row == 2
    assert all(torch.isfinite(weights).all() for weights in checkpoint.weights.values())

    # The count goes on in the resumed run: two more skipped updates make 4 in a row.
    assert train(run, "--max-steps", "20", "--save-every", "1", "--max-nonfinite", "4") == 1
    err = capsys.readouterr().err
    assert "changed on resume: --max-nonfinite 3 -> 4" in err
    assert "training diverged at step 6: 4 updates in a row" in err.splitlines()[-1]


def test_non_finite_weights_stop_the_run_before_they_are_saved(train, tmp_path, monkeypatch, capsys):
    def nan_weights(optimizer) -> None:  # an update with finite gradients can still overflow the weights
        with torch.no_grad():
            optimizer.param_groups[0]["params"][0].fill_(math.nan)

    _failing(monkeypatch, "clip_and_step", lambda call: call == 3, nan_weights)
    run = tmp_path / "run"
    assert train(run, "--max-steps", "5", "--save-every", "2", "--max-nonfinite", "100") == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith("training diverged at step 4: the weights are not finite; the checkpoint of "
                                         "step 2 is kept (resuming with a lower --lr or --clip may avoid the fault)")
    assert Checkpoint.load(run / "last.pt").step == 2 and not (run / "best.pt").exists()


def test_a_non_finite_dev_score_never_makes_best(train, tmp_path, monkeypatch, caplog):
    real, scores = Trainer.evaluate, iter([Validation(math.nan, 50.0), Validation(1.0, math.inf)])
    monkeypatch.setattr(Trainer, "evaluate", lambda self: next(scores, None) or real(self))
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO):
        assert train(run, "--epochs", "3") == 0  # 7 batches an epoch: validations at steps 7, 14, 21
    assert "step 7: dev loss nan | ppl nan | BLEU 50.00 (not finite) (best -1.00 at step 0)" in caplog.text
    assert "step 14: dev loss 1.000 | ppl 2.72 | BLEU inf (not finite) (best -1.00 at step 0)" in caplog.text
    assert Checkpoint.load(run / "best.pt").step == 21  # the first finite validation


def test_max_nonfinite_may_change_on_resume_and_says_so_in_help():
    parser = build_parser()
    assert parser.parse_args(["--train", "x", "--valid", "y", "--save-dir", "z"]).max_nonfinite == 10
    assert "--max-nonfinite" in parser.epilog
