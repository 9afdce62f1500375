"""Tests of revnmt.model.recomputed: the ordinary model's training step, with its recurrent layers recomputed."""


import pytest
import torch
from toy_model import Toy

from revnmt.model import ExecutionConfig, ModelConfig, OrdinarySeq2Seq, RecomputedSeq2Seq, build_model

toy = Toy()


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("attention", ["hidden", "emb", "slice", "emb+slice"])
def test_checkpointed_training_gives_the_ordinary_models_loss_and_gradients(rnn, attention):
    ordinary = toy.model(rnn, attention, layers=2, dropout=0.0)
    checkpointed = toy.model(rnn, attention, layers=2, dropout=0.0, checkpoint_steps=2)
    assert type(checkpointed) is RecomputedSeq2Seq
    checkpointed.load_state_dict(ordinary.state_dict())  # the same parameters, the same keys
    batch = toy.batch()
    loss, grads = toy.grads(ordinary, ordinary.train_step, batch)
    loss_ck, grads_ck = toy.grads(checkpointed, checkpointed.train_step, batch)
    assert torch.allclose(loss, loss_ck, rtol=1e-6)
    assert grads.keys() == grads_ck.keys()
    for name in grads:
        assert torch.allclose(grads[name], grads_ck[name], rtol=1e-4, atol=1e-7), name


def test_the_batchs_dropout_masks_are_those_of_the_ordinary_model():
    ordinary = toy.model("gru", "emb+slice", dropout=0.3)
    checkpointed = toy.model("gru", "emb+slice", dropout=0.3, checkpoint_steps="auto")
    checkpointed.load_state_dict(ordinary.state_dict())
    batch = toy.batch()
    loss, grads = toy.grads(ordinary, ordinary.train_step, batch)
    loss_ck, grads_ck = toy.grads(checkpointed, checkpointed.train_step, batch)
    assert torch.allclose(loss, loss_ck, rtol=1e-6)
    assert all(torch.allclose(grads[n], grads_ck[n], rtol=1e-4, atol=1e-7) for n in grads)


def test_translation_and_validation_are_the_ordinary_models():
    ordinary = toy.model("lstm", "slice").eval()
    checkpointed = build_model(ordinary.cfg, ExecutionConfig(checkpoint_steps=3)).eval()
    checkpointed.load_state_dict(ordinary.state_dict())
    src, src_len, tgt_in, tgt_out = toy.batch()
    assert torch.equal(ordinary.loss(src, src_len, tgt_in, tgt_out), checkpointed.loss(src, src_len, tgt_in, tgt_out))
    enc, enc_ck = ordinary.encode(src, src_len), checkpointed.encode(src, src_len)
    assert torch.equal(enc.memory, enc_ck.memory)


def test_the_step_counts_what_the_checkpoints_hold():
    ordinary = toy.model("gru", "hidden", dropout=0.0)
    checkpointed = toy.model("gru", "hidden", dropout=0.0, checkpoint_steps=2)
    batch = toy.batch()
    src, _, tgt_in, _ = batch
    held = ordinary.train_step(*batch, normalizer=1.0).held_bytes
    held_ck = checkpointed.train_step(*batch, normalizer=1.0).held_bytes
    assert held_ck == held + checkpointed.encoder.held_bytes(src.shape[1], 4) + \
        checkpointed.decoder.held_bytes(tgt_in.shape[1], 4)


@pytest.mark.parametrize("options, message", [
    ({"rnn": "revgru", "checkpoint_steps": 4}, "--checkpoint-steps is for ordinary RNNs"),
    ({"rnn": "gru", "checkpoint_steps": 0}, "--checkpoint-steps must be a positive number of steps or auto"),
    ({"rnn": "gru", "checkpoint_steps": "sqrt"}, "--checkpoint-steps must be a positive number of steps or auto"),
])
def test_bad_checkpointing_options_are_refused(options, message):
    rnn = options.pop("rnn")
    with pytest.raises(ValueError, match=message):
        build_model(ModelConfig(rnn=rnn, src_vocab=10, tgt_vocab=10), ExecutionConfig(**options))


def test_a_checkpointed_models_weights_load_into_the_ordinary_model():
    checkpointed = toy.model("gru", "hidden", checkpoint_steps="auto")
    ordinary = build_model(toy.config("gru", "hidden"))
    assert type(ordinary) is OrdinarySeq2Seq
    ordinary.load_state_dict(checkpointed.state_dict())
