import json
import logging
from dataclasses import replace

import pytest
import torch

from revnmt.checkpoints import RESUMING, Checkpoint, Numerics, numbered_checkpoints, save_checkpoint
from revnmt.checkpoints.files import read_checkpoint_file
from revnmt.data import DataConfig, DataOptions, Vocabulary, load_data, make_batch
from revnmt.memory.peak import PeakMeter
from revnmt.memory.sizes import format_bytes
from revnmt.model import ExecutionConfig, ModelConfig, build_model
from revnmt.rnn import ReversalError
from revnmt.training.trainer import VALID_COLUMNS, compute_gradients
from revnmt.translation.translator import Translator

# What a trained checkpoint's file holds (and "memory_plan", with a --memory-budget).
CHECKPOINT_KEYS = {"format", "model_config", "model", "src_vocab", "tgt_vocab", "data", "optimizer", "scheduler",
                   "trainer", "rng", "args", "data_fingerprint", "numerics"}
# What Trainer.checkpoint() wrote before checkpoints had a format version (format 1), in its order.
FORMAT_1_KEYS = ("model_config", "model", "src_vocab", "tgt_vocab", "data", "data_fingerprint", "optimizer",
                 "scheduler", "trainer", "rng", "args", "memory_plan")


def _same_tensors(a, b) -> bool:
    """Exact equality of nested state (dicts, lists, tensors, numbers)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same_tensors(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


@pytest.mark.parametrize("legacy", [False, True], ids=["current", "format-1"])
def test_interrupted_run_resumes_exactly(train, tmp_path, legacy):
    # 7 batches per epoch: the run is cut inside epoch 1 and continues past an end-of-epoch
    # validation (LR schedule, patience) into epoch 2; dropout draws from the restored RNG.
    options = ["--dropout", "0.3", "--epochs", "3"]
    assert train(tmp_path / "cut", *options, "--max-steps", "3") == 0
    assert Checkpoint.load(tmp_path / "cut" / "last.pt").step == 3
    if legacy:  # as revnmt wrote it before checkpoints had a format version
        stored = read_checkpoint_file(tmp_path / "cut" / "last.pt")
        save_checkpoint(tmp_path / "cut" / "last.pt", {key: stored.get(key) for key in FORMAT_1_KEYS})
    assert train(tmp_path / "cut", *options, "--max-steps", "10") == 0
    assert train(tmp_path / "whole", *options, "--max-steps", "10") == 0

    cut, whole = (Checkpoint.load(tmp_path / run / "last.pt", needs=RESUMING) for run in ("cut", "whole"))
    assert _same_tensors(cut.weights, whole.weights)
    cut, whole = cut.training, whole.training
    assert _same_tensors(cut.optimizer, whole.optimizer)
    assert cut.scheduler == whole.scheduler
    assert _same_tensors(cut.rng, whole.rng)
    # Times differ between runs; the extra validation may find a best.
    cut, whole = (replace(training.trainer, elapsed_s=0.0, train_s=0.0, best_bleu=0.0, best_step=0)
                  for training in (cut, whole))
    assert cut == whole == replace(cut, epoch=2, batch_in_epoch=3, step=10)


def test_save_dir_holds_config_vocabularies_checkpoints_and_logs(train, toy, tmp_path):
    run = tmp_path / "run"
    assert train(run, "--max-steps", "4", "--test", toy["test"], "--test-beam", "2") == 0
    assert {p.name for p in run.iterdir()} == {".lock", ".revnmt", "data", "config.json", "src.vocab", "tgt.vocab",
                                               "last.pt", "best.pt", "train.log", "valid.tsv", "test.hyp", "test.json"}
    config = json.loads((run / "config.json").read_text())
    assert config["train"] == toy["train"] and config["lowercase"] is False and config["hidden_size"] == 16

    assert set(read_checkpoint_file(run / "best.pt")) == CHECKPOINT_KEYS  # weights_only
    checkpoint = Checkpoint.load(run / "best.pt", needs=RESUMING)
    assert checkpoint.data == DataOptions("en", "de", lowercase=False, max_len=50)
    assert Vocabulary.load(run / "src.vocab").itos == checkpoint.src_vocab
    assert Vocabulary.load(run / "tgt.vocab").itos == checkpoint.tgt_vocab
    assert "man" in checkpoint.src_vocab and "mann" in checkpoint.tgt_vocab

    rows = [line.split("\t") for line in (run / "valid.tsv").read_text().splitlines()]
    assert tuple(rows[0]) == VALID_COLUMNS and len(rows) == 2 and rows[1][:2] == ["1", "4"]
    log = (run / "train.log").read_text()
    assert "epoch 1 | step 2 | batch 2/7 | loss" in log and "dev sacreBLEU: BLEU = " in log
    assert "test (" in log and "signature" in log
    assert len((run / "test.hyp").read_text().splitlines()) == 10
    scores = json.loads((run / "test.json").read_text())
    assert scores["test"] == toy["test"] and scores["beam"] == 2 and "case:mixed" in scores["signature"]
    assert f"sacreBLEU: BLEU = {scores['sacrebleu']:.2f}" in log
    assert f"tokenized lowercased BLEU (paper): {scores['tokenized_bleu']:.2f}" in log
    trainer = checkpoint.training.trainer
    assert trainer.train_tokens > 0 and 0 < trainer.train_s < trainer.elapsed_s
    assert checkpoint.numerics == Numerics.of("cpu") and f"; {checkpoint.numerics.describe()}" in log


def test_finished_run_is_not_trained_again(train, tmp_path):
    assert train(tmp_path / "run", "--max-steps", "2") == 0
    before = Checkpoint.load(tmp_path / "run" / "last.pt")
    assert train(tmp_path / "run", "--max-steps", "2") == 0
    assert _same_tensors(Checkpoint.load(tmp_path / "run" / "last.pt").weights, before.weights)


def test_patience_and_min_lr_stop_training(train, tmp_path, caplog):
    # At these learning rates nothing changes, so neither dev BLEU nor dev loss improves after epoch 1.
    with caplog.at_level(logging.INFO):
        assert train(tmp_path / "patience", "--lr", "1e-9", "--min-lr", "1e-10", "--patience", "1") == 0
    assert "no dev BLEU improvement in 1 validations (--patience 1)" in caplog.text
    assert Checkpoint.load(tmp_path / "patience" / "last.pt").training.trainer.epoch == 3
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert train(tmp_path / "min_lr", "--optimizer", "sgd", "--lr", "1e-6", "--min-lr", "6e-7") == 0
    assert "learning rate 5.00e-07 is below --min-lr 6e-07" in caplog.text


def test_data_errors_are_one_line_messages(train, tmp_path, capsys):
    (tmp_path / "short.en").write_text("a man\nthe dog\n")
    (tmp_path / "short.de").write_text("ein mann\n")
    for prefix, message in ((str(tmp_path / "missing"), "no 'en' side of corpus"),
                            (str(tmp_path / "short"), "parallel files differ in length")):
        assert train(tmp_path / "run", train_prefix=prefix) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 2  # command + error
    assert train(tmp_path / "run", "--min-freq", "1000") == 2
    assert "no en token occurs --min-freq 1000 times" in capsys.readouterr().err


def test_resuming_with_other_options_is_refused(train, tmp_path, capsys):
    assert train(tmp_path / "run", "--max-steps", "1", "--label-smoothing", "0.1") == 0
    capsys.readouterr()
    assert train(tmp_path / "run", "--max-steps", "2", "--batch-size", "16", "--hidden-size", "32") == 2
    err = capsys.readouterr().err
    assert "--batch-size 32 -> 16" in err and "--hidden-size 16 -> 32" in err and "--label-smoothing 0.1 -> 0.0" in err


@pytest.fixture
def budget(train, tmp_path) -> int:
    """A --memory-budget, in MiB, for this (pytest) process's peak RSS: room above what it holds once a training step
    has loaded the runtime (numba's compiled loops, the math libraries), which in a fresh process adds some 180 MiB."""
    assert train(tmp_path / "warm-up", "--max-steps", "1") == 0
    return (PeakMeter("cpu").current() + 256 * 2 ** 20) // 2 ** 20


def test_memory_budget_chooses_the_batch_and_resumes_with_the_same_plan(train, tmp_path, budget):
    save_dir = tmp_path / "budget"
    assert train(save_dir, "--memory-budget", f"{budget}MiB", "--max-steps", "2") == 0
    plan = Checkpoint.load(save_dir / "last.pt").memory_plan
    assert plan["budget_bytes"] == budget * 2 ** 20 and plan["batch_tokens"] > 0
    assert plan["predicted_peak_bytes"] <= plan["budget_bytes"]
    log = (save_dir / "train.log").read_text()
    assert f"memory budget {format_bytes(budget * 2 ** 20)} of peak RSS" in log
    assert f"of {format_bytes(budget * 2 ** 20)} budget" in log  # every log line shows the peak beside it
    assert train(save_dir, "--memory-budget", f"{budget}MiB", "--max-steps", "3") == 0
    assert Checkpoint.load(save_dir / "last.pt").memory_plan["batch_tokens"] == plan["batch_tokens"]


def test_a_tampered_memory_plan_stops_the_resume_in_one_line_and_keeps_the_checkpoint(train, tmp_path, budget, capsys):
    save_dir = tmp_path / "budget"
    assert train(save_dir, "--memory-budget", f"{budget}MiB", "--max-steps", "1") == 0
    stored = read_checkpoint_file(save_dir / "last.pt")
    stored["memory_plan"]["batch_tokens"] = -5  # a plan revnmt never writes: no batch would hold a pair
    save_checkpoint(save_dir / "last.pt", stored)
    tampered = (save_dir / "last.pt").read_bytes()
    capsys.readouterr()
    assert train(save_dir, "--memory-budget", f"{budget}MiB", "--max-steps", "2") == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith(f"cannot load checkpoint {save_dir / 'last.pt'}: its memory plan "
                                                   "is not one revnmt wrote: batch_tokens is -5"), errors
    assert (save_dir / "last.pt").read_bytes() == tampered  # the refused resume wrote nothing over it


def test_a_checkpointed_ordinary_model_trains_under_a_memory_budget_and_translates(train, tmp_path, budget):
    save_dir = tmp_path / "checkpointed"
    assert train(save_dir, "--rnn", "gru", "--attention", "emb+slice", "--checkpoint-steps", "auto",
                 "--memory-budget", f"{budget}MiB", "--max-steps", "2") == 0
    checkpoint = Checkpoint.load(save_dir / "last.pt", needs=("args",))
    assert checkpoint.args["checkpoint_steps"] == "auto" and checkpoint.memory_plan["batch_tokens"] > 0
    translator = Translator.from_checkpoint(save_dir)  # recomputing states is for backward: translation needs none
    assert len(translator.translate(["A man runs .", "The dog sleeps ."], beam=2)) == 2


def test_memory_budget_too_small_for_the_model_stops_with_what_it_needs(train, tmp_path):
    assert train(tmp_path / "small", "--memory-budget", "1KiB") == 2
    assert "a budget of at least" in (tmp_path / "small" / "train.log").read_text()


@pytest.mark.parametrize("rnn", ["gru", "revgru", "revlstm"])
def test_the_gradients_of_a_batch_in_parts_add_up_to_the_whole_batchs(toy, rnn):
    # Parts are what --update-freq accumulates (consecutive batches) and what a shrunk plan trains (after a step
    # over the budget, batches above plan.step_tokens): their gradients add up to the one large batch's, up to
    # the order of float summation.
    data = load_data(DataConfig(train=toy["train"], valid=toy["valid"], min_freq=1))
    torch.manual_seed(0)
    model = build_model(ModelConfig(rnn=rnn, emb_dim=16, hidden_size=16, attention="hidden", dropout=0.0,
                                    src_vocab=len(data.src_vocab), tgt_vocab=len(data.tgt_vocab)),
                        ExecutionConfig(buffer_lanes=4))
    indices = list(range(12))
    whole = make_batch(data.train, indices)
    parts = [make_batch(data.train, indices[:5]), make_batch(data.train, indices[5:])]
    loss = compute_gradients(model, [whole]).loss
    grads = [p.grad.clone() for p in model.parameters()]
    assert torch.allclose(compute_gradients(model, parts).loss, loss)
    assert all(torch.allclose(p.grad, g, atol=1e-6) for p, g in zip(model.parameters(), grads))


def test_update_freq_accumulates_consecutive_batches_into_one_update(train, tmp_path, monkeypatch):
    import revnmt.training.trainer as trainer

    updates: dict[int, list[list[int]]] = {1: [], 2: []}
    for freq, calls in updates.items():
        def recording(model, parts, step, calls=calls):
            calls.append([index for part in parts for index in part.indices])
            return compute_gradients(model, parts, step)

        monkeypatch.setattr(trainer, "compute_gradients", recording)
        assert train(tmp_path / str(freq), "--update-freq", str(freq), "--epochs", "1") == 0
    # 7 batches: 4 updates, the last of one batch; each update trains two consecutive batches of the same order
    one, two = updates[1], updates[2]
    assert len(one) == 7 and len(two) == 4
    assert two == [one[0] + one[1], one[2] + one[3], one[4] + one[5], one[6]]
    assert Checkpoint.load(tmp_path / "2" / "last.pt").step == 4


def test_a_run_that_accumulates_resumes_exactly(train, tmp_path):
    # 7 batches per epoch in updates of 2 (the 4th of one): cut inside epoch 1, resumed across the epoch's end
    options = ["--dropout", "0.3", "--epochs", "3", "--update-freq", "2"]
    assert train(tmp_path / "cut", *options, "--max-steps", "3") == 0
    assert Checkpoint.load(tmp_path / "cut" / "last.pt").training.trainer.batch_in_epoch == 6
    assert train(tmp_path / "cut", *options, "--max-steps", "6") == 0
    assert train(tmp_path / "whole", *options, "--max-steps", "6") == 0
    cut, whole = (Checkpoint.load(tmp_path / run / "last.pt", needs=RESUMING) for run in ("cut", "whole"))
    assert _same_tensors(cut.weights, whole.weights)
    assert _same_tensors(cut.training.optimizer, whole.training.optimizer)
    assert (cut.training.trainer.epoch, cut.training.trainer.batch_in_epoch) == (2, 4)


def test_a_memory_budget_reaches_an_effective_batch_by_accumulating(train, tmp_path, budget):
    save_dir = tmp_path / "budget"
    target = 1_000_000  # more than any batch of the toy corpus: accumulated
    assert train(save_dir, "--memory-budget", f"{budget}MiB", "--batch-tokens", str(target), "--max-steps", "1") == 0
    fitted = Checkpoint.load(save_dir / "last.pt").memory_plan["batch_tokens"]
    freq, tokens = -(-target // fitted), -(-target // -(-target // fitted))
    assert f"batches of up to {tokens} padded tokens, {freq} accumulated per update" in (save_dir / "train.log"
                                                                                         ).read_text()


def _validated_steps(run) -> list[int]:
    rows = (run / "valid.tsv").read_text().splitlines()[1:]
    return [int(row.split("\t")[VALID_COLUMNS.index("step")]) for row in rows]


def test_valid_every_validates_between_epoch_ends_with_everything_a_validation_does(train, tmp_path):
    run = tmp_path / "every"
    assert train(run, "--valid-every", "3", "--epochs", "2", "--keep-checkpoints", "10") == 0
    # 7 batches per epoch: every 3 updates, and at each epoch's end
    assert _validated_steps(run) == [3, 6, 7, 9, 12, 14]
    assert [c.name for c in numbered_checkpoints(run)] == [f"step-{s:08d}.pt" for s in (3, 6, 7, 9, 12, 14)]
    training = Checkpoint.load(run / "last.pt", needs=RESUMING).training
    assert training.scheduler["last_epoch"] == 6  # every validation stepped the LR schedule
    log = (run / "train.log").read_text()
    assert "validation in epoch 1, step 3:" in log and "validation after epoch 1, step 7:" in log


def test_a_run_that_validates_every_n_updates_resumes_exactly(train, tmp_path):
    options = ["--dropout", "0.3", "--epochs", "3", "--valid-every", "3", "--lr-patience", "0", "--lr-decay", "0.9"]
    assert train(tmp_path / "cut", *options, "--max-steps", "4") == 0  # a stop between scheduled validations
    assert train(tmp_path / "cut", *options, "--max-steps", "11") == 0
    assert train(tmp_path / "whole", *options, "--max-steps", "11") == 0
    cut, whole = (Checkpoint.load(tmp_path / run / "last.pt", needs=RESUMING) for run in ("cut", "whole"))
    assert _same_tensors(cut.weights, whole.weights)
    assert _same_tensors(cut.training.optimizer, whole.training.optimizer)
    assert cut.training.scheduler == whole.training.scheduler
    assert _validated_steps(tmp_path / "cut") == [3, 4, 6, 7, 9, 11]  # the stop's own validation at step 4 besides
    assert _validated_steps(tmp_path / "whole") == [3, 6, 7, 9, 11]
    cut, whole = (replace(c.training.trainer, elapsed_s=0.0, train_s=0.0, best_bleu=0.0, best_step=0)
                  for c in (cut, whole))
    assert cut == whole


def _reversible_model_and_batch(toy):
    data = load_data(DataConfig(train=toy["train"], valid=toy["valid"], min_freq=1))
    torch.manual_seed(0)
    model = build_model(ModelConfig(rnn="revgru", emb_dim=16, hidden_size=16, attention="emb+slice", slice_dim=4,
                                    dropout=0.3, src_vocab=len(data.src_vocab), tgt_vocab=len(data.tgt_vocab)),
                        ExecutionConfig(buffer_lanes=4)).train()
    return model, make_batch(data.train, list(range(12)))


def _grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_a_failed_reversal_falls_back_to_backprop_with_the_same_dropout_masks(toy, monkeypatch):
    model, batch = _reversible_model_and_batch(toy)
    torch.manual_seed(1)
    reversal = compute_gradients(model, [batch])
    by_reversal = _grads(model)
    torch.manual_seed(1)
    model.zero_grad()
    reference = model.train_step_autograd(batch.src, batch.src_len, batch.tgt_in, batch.tgt_out, batch.n_tokens)
    by_backprop = _grads(model)
    after = torch.get_rng_state()

    def failing(*args, **kwargs):  # fails after drawing the masks and accumulating part of the gradients
        model.draw_masks(batch.src.shape[0], batch.src.device)
        next(model.parameters()).grad = torch.ones_like(next(model.parameters()))
        raise ReversalError("injected")

    monkeypatch.setattr(model, "train_step", failing)
    torch.manual_seed(1)
    fallback = compute_gradients(model, [batch])
    assert isinstance(fallback.reversal_error, ReversalError) and reversal.reversal_error is None
    # exactly backpropagation's gradients with the masks reversal drew, and the generator where it would be
    assert torch.equal(fallback.loss, reference.loss) and torch.equal(torch.get_rng_state(), after)
    assert all(torch.equal(got, want) for got, want in zip(_grads(model), by_backprop))
    # which are reversal's, up to float rounding
    assert all(torch.allclose(got, want, atol=1e-6, rtol=1e-4) for got, want in zip(by_backprop, by_reversal))


def test_a_saved_position_past_the_end_of_its_epoch_is_refused(train, toy, tmp_path):
    run = tmp_path / "run"
    assert train(run, "--max-steps", "2", "--save-every", "1") == 0
    checkpoint = Checkpoint.load(run / "last.pt")
    checkpoint.training.trainer.batch_in_epoch = 8  # 7 batches an epoch
    checkpoint.save(run / "last.pt")
    assert train(run, "--max-steps", "4") == 2
    assert Checkpoint.load(run / "last.pt").step == 2


def test_resuming_applies_a_new_learning_rate_and_schedule(train, tmp_path, caplog):
    run = tmp_path / "run"
    assert train(run, "--max-steps", "2") == 0
    with caplog.at_level(logging.INFO):
        assert train(run, "--max-steps", "3", "--lr", "0.01", "--lr-decay", "0.1", "--lr-patience", "2") == 0
    assert "changed on resume: --lr 0.001 -> 0.01" in caplog.text
    training = Checkpoint.load(run / "last.pt").training
    assert training.optimizer["param_groups"][0]["lr"] == 0.01
    assert (training.scheduler["factor"], training.scheduler["patience"]) == (0.1, 2)
    assert json.loads((run / "config.json").read_text())["lr_decay"] == 0.1


def test_numbered_checkpoints_of_the_last_validations_are_kept_across_resumes(train, tmp_path, caplog):
    run = tmp_path / "run"
    assert train(run, "--max-steps", "3", "--keep-checkpoints", "2") == 0  # a validation at the stop
    assert [path.name for path in numbered_checkpoints(run)] == ["step-00000003.pt"]
    assert train(run, "--epochs", "2", "--keep-checkpoints", "2") == 0  # validations at steps 7 and 14
    kept = numbered_checkpoints(run)
    assert [path.name for path in kept] == ["step-00000007.pt", "step-00000014.pt"]
    for path, step in zip(kept, (7, 14)):
        # complete: translating and resuming need nothing else
        assert set(read_checkpoint_file(path)) == CHECKPOINT_KEYS and Checkpoint.load(path, needs=RESUMING).step == step
        assert Translator.from_checkpoint(path).translate(["A man runs ."], beam=2)
    assert _same_tensors(Checkpoint.load(kept[-1]).weights, Checkpoint.load(run / "last.pt").weights)
    with caplog.at_level(logging.INFO):
        assert train(run, "--epochs", "3", "--keep-checkpoints", "1") == 0
    assert "changed on resume: --keep-checkpoints 2 -> 1" in caplog.text
    assert [path.name for path in numbered_checkpoints(run)] == ["step-00000021.pt"]
