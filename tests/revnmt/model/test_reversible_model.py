"""Tests of revnmt.model.reversible: training by reversal against autograd through the same model."""

import warnings

import pytest
import torch
from toy_model import Toy

from buffers import FixedPointOverflowError
from revnmt.memory import SavedTensorMeter
from revnmt.model import StepResult
from revnmt.rnn import ReversalError
from revnmt.rnn.reversible import PROJECTION_STEPS
from revnmt.rnn.tape import settle

toy = Toy()


@pytest.mark.parametrize("rnn", ["revgru", "revlstm"])
@pytest.mark.parametrize("attention", ["hidden", "emb", "slice", "emb+slice"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("encoder", ["unidirectional", "bidirectional"])
def test_reversal_matches_backprop_for_the_whole_model(rnn, attention, layers, encoder, device):
    # On CUDA this is the whole training step on the GPU: the Triton buffer kernels, cuBLAS products,
    # and the exactness guard of both sweeps (of all three stacks, with a bidirectional encoder).
    model = toy.model(rnn, attention, layers, encoder=encoder).to(device)
    _assert_grads_match(model, [t.to(device) for t in toy.batch()])


@pytest.mark.parametrize("rnn", ["revgru", "revlstm"])
def test_reversal_matches_backprop_with_tied_and_shared_embeddings(rnn):
    # One matrix gets the gradients of the encoder's and decoder's lookups and of the output layer; PAD's
    # lookups add nothing to it, as nn.Embedding's, while its output weights learn.
    tied = Toy(src_vocab=25, tgt_vocab=25)
    model = tied.model(rnn, "emb+slice", encoder="bidirectional", hidden_size=8, tie_embeddings=True,
                       share_embeddings=True)
    assert model.generator.weight is model.tgt_emb.weight is model.src_emb.weight
    _assert_grads_match(model, tied.batch())


def _assert_grads_match(model, batch):
    loss_rev, rev = toy.grads(model, model.train_step, batch)
    loss_ref, ref = toy.grads(model, model.train_step_autograd, batch)
    assert torch.allclose(loss_rev, loss_ref, rtol=1e-6)
    assert rev.keys() == ref.keys() == {n for n, _ in model.named_parameters()}
    for name in ref:
        got, want = rev[name].flatten().double(), ref[name].flatten().double()
        cos = torch.nn.functional.cosine_similarity(got, want, dim=0)
        assert cos >= 0.9999 and (got - want).norm() <= 1e-4 * want.norm(), name


@pytest.mark.parametrize("rnn", ["revgru", "revlstm"])
def test_reversal_matches_backprop_with_the_triton_kernels(rnn):
    # The fused Triton steps in the interpreter, through the whole model, whose masks come from batch-major
    # ids (src.t() != PAD, a transposed view). A kernel reading a step's mask as adjacent rows would see
    # other steps' padding: reversal stays exact (both sweeps misread alike) but the gradients are wrong.
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("CUDA runs the real kernels: the test above")
    _assert_grads_match(toy.model(rnn, "hidden", 1, buffer_backend="triton", encoder="bidirectional"), toy.batch())


@pytest.mark.parametrize("chunk_steps", [1, 3, 7])
def test_decoder_chunks_of_any_size_match_backprop(chunk_steps):
    # the toy targets are 7 tokens long: partial chunks, one chunk for all, and one step at a time
    _assert_grads_match(toy.model("revlstm", "emb+slice", 2, decoder_chunk_steps=chunk_steps), toy.batch())


@pytest.mark.parametrize("rnn", ["revgru", "revlstm"])
def test_label_smoothed_reversal_matches_backprop(rnn):
    # the smoothed loss runs inside the decoder's reverse sweep; its gradients are those of
    # train_step_autograd, whose loss is checked against F.cross_entropy in test_ordinary_model.py
    model, batch = toy.model(rnn, "emb+slice", 2, label_smoothing=0.1), toy.batch()
    _assert_grads_match(model, batch)
    smoothed = toy.grads(model, model.train_step, batch)
    plain_model = toy.model(rnn, "emb+slice", 2)
    plain = toy.grads(plain_model, plain_model.train_step, batch)
    assert torch.equal(smoothed[0], plain[0])  # the same reported loss
    assert not torch.allclose(smoothed[1]["generator.bias"], plain[1]["generator.bias"])


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_a_step_returns_its_loss_and_the_bytes_it_held(label_smoothing):
    model, batch = toy.model("revgru", "emb+slice", dropout=0.0, label_smoothing=label_smoothing), toy.batch()
    result = model.train_step(*batch, normalizer=1.0)
    # the unsmoothed loss, as validation's, whatever the step trained on
    assert isinstance(result, StepResult) and torch.allclose(result.loss, model.loss(*batch), rtol=1e-6)
    # at least the stored slices (int and float) and the gradient of the attention memory
    src = batch[0]
    slices, memory = src.numel() * 3 * 4, src.numel() * (8 + 3) * 4
    assert result.held_bytes >= 2 * slices + memory


def test_training_reduces_the_loss():
    model, batch = toy.model("revlstm", "emb+slice", dropout=0.0), toy.batch()
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    first = None
    for _ in range(60):
        opt.zero_grad()
        loss = model.train_step(*batch, normalizer=16.0).loss
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < 0.5 * first


def test_decoder_saved_bytes_do_not_grow_with_target_length():
    model = toy.model("revgru", "emb+slice", dropout=0.0)

    def peak(tgt_len):
        batch = toy.batch(batch=2, src_lens=(5, 4), tgt_lens=(tgt_len, tgt_len))
        with SavedTensorMeter(exclude=[*model.parameters(), *batch]) as meter:
            model.train_step(*batch, normalizer=1.0)
        return meter.peak_bytes

    # Nothing per step but the padding mask of the target (one byte per token, like the ids). The
    # chunks of steps grow with the length up to their size, so both lengths exceed it.
    chunk = max(PROJECTION_STEPS, model.execution.decoder_chunk_steps)
    short, long = chunk + 4, 3 * chunk + 4
    assert 0 <= peak(long) - peak(short) <= 2 * (long - short)


def test_weight_change_between_forward_and_backward_is_caught(monkeypatch):
    model, batch = toy.model("revgru", "emb"), toy.batch()
    sweep = model.decoder.backward_sweep

    def tampered(*args, **kwargs):
        with torch.no_grad():
            model.decoder.cells[0].g[1].weight.mul_(1.01)
        return sweep(*args, **kwargs)

    monkeypatch.setattr(model.decoder, "backward_sweep", tampered)
    with pytest.raises(ReversalError):
        model.train_step(*batch, normalizer=1.0)


def test_a_bridge_out_of_the_fixed_point_range_raises_with_the_forward_checks():
    # The bridge's output is rounded to the decoder's fixed-point start between the sweeps, where a training step reads
    # nothing on the host (a CUDA graph captures the sweeps and the bridge together): its range error is left on the
    # device and raised when the forward sweeps' checks are read, before any reverse.
    model, batch = toy.model("revgru", "emb+slice", encoder="bidirectional"), toy.batch()
    with torch.no_grad():
        model.bridge.layers[0].bias.fill_(float("nan"))
    reversal = model.reversal(batch[0], batch[2], batch[3], 10.0)
    assert reversal.dec_tape.checks, "the bridge's check was read already"
    with pytest.raises(FixedPointOverflowError, match="to_fixed"):
        settle(*reversal.tapes)
    with pytest.raises(FixedPointOverflowError):
        model.train_step(*batch, normalizer=10.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("rnn", ["revgru", "revlstm"])
def test_a_cuda_training_step_synchronizes_twice_at_the_forward_checks_and_at_the_guards(rnn):
    # torch.cuda.set_sync_debug_mode warns at every synchronizing call: a whole step, bidirectional encoder, bridge,
    # loss and all, waits for the GPU twice (what lets CUDA graphs capture its two stretches).
    model = toy.model(rnn, "emb+slice", 2, encoder="bidirectional").cuda()
    batch = [t.cuda() for t in toy.batch()]
    model.train_step(*batch, normalizer=10.0)  # the stacks learn their room, Triton compiles
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            model.train_step(*batch, normalizer=10.0)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    syncs = [f"{w.filename}:{w.lineno}" for w in seen if "called a synchronizing CUDA operation" in str(w.message)]
    assert len(syncs) == 2, syncs
