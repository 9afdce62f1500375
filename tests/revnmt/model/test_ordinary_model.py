"""Tests of revnmt.model.ordinary: the chunked loss backward is autograd through the whole loss."""

import pytest
import torch
import torch.nn.functional as F
from toy_model import Toy

from revnmt.data.vocab import PAD

toy = Toy()


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_ordinary_models_train_and_chunked_loss_equals_full_loss(rnn, label_smoothing):
    model, batch = toy.model(rnn, "hidden", dropout=0.0, label_smoothing=label_smoothing), toy.batch()
    loss, grads = toy.grads(model, model.train_step, batch)
    assert torch.allclose(loss, model.loss(*batch), rtol=1e-5)  # the unsmoothed loss, as validation's
    # the chunked loss backward gives autograd's gradients through the full (smoothed) loss of all logits
    model.zero_grad()
    src, src_len, tgt_in, tgt_out = batch
    dec_out, memory = model.forward_graph(src.t(), src_len, tgt_in.t(), tgt_out.t(), model.draw_masks(4, "cpu"))
    logits = model.generator(model.attention(dec_out.transpose(0, 1), memory, src == PAD)).flatten(0, 1)
    full = F.cross_entropy(logits, tgt_out.flatten(), ignore_index=PAD, reduction="sum",
                           label_smoothing=label_smoothing)
    (full / 10).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(grads[name], p.grad, rtol=1e-4, atol=1e-7), name
    assert torch.allclose(loss, F.cross_entropy(logits, tgt_out.flatten(), ignore_index=PAD, reduction="sum"))


def test_a_step_holds_the_gradients_of_its_detached_leaves():
    model, batch = toy.model("lstm", "hidden", dropout=0.0), toy.batch()
    result = model.train_step(*batch, normalizer=1.0)
    src, _, tgt_in, _ = batch
    dec_out, memory = tgt_in.numel() * 12 * 4, src.numel() * 12 * 4
    assert result.held_bytes >= dec_out + memory
