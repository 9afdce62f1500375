import pytest
import torch

from revnmt.data.vocab import BOS, EOS, PAD
from revnmt.memory import SavedTensorMeter
from revnmt.model import ModelConfig, Seq2Seq
from revnmt.rnn import ReversalError
from revnmt.rnn.reversible import PROJECTION_STEPS

SRC_V, TGT_V = 30, 25


def _batch(batch=4, src_lens=(7, 5, 3, 2), tgt_lens=(6, 4, 5, 1), seed=0):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, SRC_V, (batch, max(src_lens)), generator=gen)
    tgt = torch.randint(4, TGT_V, (batch, max(tgt_lens)), generator=gen)
    for i, (ls, lt) in enumerate(zip(src_lens, tgt_lens)):
        src[i, ls:] = PAD
        tgt[i, lt:] = PAD
    tgt_in = torch.cat([torch.full((batch, 1), BOS), tgt], 1)
    tgt_out = torch.cat([tgt, torch.full((batch, 1), PAD)], 1)
    tgt_out[torch.arange(batch), torch.tensor(tgt_lens)] = EOS
    return src, torch.tensor(src_lens), tgt_in, tgt_out


def _model(rnn="revgru", attention="emb+slice", layers=1, dropout=0.3, **kw):
    torch.manual_seed(0)
    options = dict(slice_dim=3, buffer_lanes=4) | kw
    cfg = ModelConfig(rnn=rnn, emb_dim=8, hidden_size=12, layers=layers, dropout=dropout, attention=attention,
                      src_vocab=SRC_V, tgt_vocab=TGT_V, **options)
    return Seq2Seq(cfg).train()


def _grads(model, fn, batch, seed=1):
    model.zero_grad()
    torch.manual_seed(seed)  # the same dropout masks for both training paths
    loss = fn(*batch, normalizer=10.0)
    return loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("rnn", ["revgru", "revlstm"])
@pytest.mark.parametrize("attention", ["hidden", "emb", "slice", "emb+slice"])
@pytest.mark.parametrize("layers", [1, 2])
def test_reversal_matches_backprop_for_the_whole_model(rnn, attention, layers, device):
    # On CUDA this is the whole training step on the GPU: the Triton buffer kernels, cuBLAS products,
    # and the exactness guard of both sweeps.
    model, batch = _model(rnn, attention, layers).to(device), [t.to(device) for t in _batch()]
    loss_rev, rev = _grads(model, model.train_step, batch)
    loss_ref, ref = _grads(model, model.train_step_autograd, batch)
    assert torch.allclose(loss_rev, loss_ref, rtol=1e-6)
    assert rev.keys() == ref.keys() == {n for n, _ in model.named_parameters()}
    for name in ref:
        got, want = rev[name].flatten().double(), ref[name].flatten().double()
        cos = torch.nn.functional.cosine_similarity(got, want, dim=0)
        assert cos >= 0.9999 and (got - want).norm() <= 1e-4 * want.norm(), name


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
def test_ordinary_models_train_and_chunked_loss_equals_full_loss(rnn):
    model, batch = _model(rnn, "hidden", dropout=0.0), _batch()
    loss, grads = _grads(model, model.train_step, batch)
    assert torch.allclose(loss, model.loss(*batch), rtol=1e-5)
    # the chunked loss backward gives autograd's gradients through the full loss
    model.zero_grad()
    src, src_len, tgt_in, tgt_out = batch
    dec_out, memory = model._forward_autograd(src.t(), src_len, tgt_in.t(), tgt_out.t(), model.draw_masks(4, "cpu"))
    (model.step_loss(dec_out.transpose(0, 1), memory, src == PAD, model.draw_masks(4, "cpu"), tgt_out) / 10).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(grads[name], p.grad, rtol=1e-4, atol=1e-7), name


def test_training_reduces_the_loss():
    model, batch = _model("revlstm", "emb+slice", dropout=0.0), _batch()
    opt = torch.optim.Adam(model.parameters(), lr=0.03)
    first = None
    for _ in range(60):
        opt.zero_grad()
        loss = model.train_step(*batch, normalizer=16.0)
        opt.step()
        first = loss.item() if first is None else first
    assert loss.item() < 0.5 * first


def test_decoder_saved_bytes_do_not_grow_with_target_length():
    model = _model("revgru", "emb+slice", dropout=0.0)

    def peak(tgt_len):
        batch = _batch(batch=2, src_lens=(5, 4), tgt_lens=(tgt_len, tgt_len))
        with SavedTensorMeter(exclude=[*model.parameters(), *batch]) as meter:
            model.train_step(*batch, normalizer=1.0)
        return meter.peak_bytes

    # Nothing per step but the padding mask of the target (one byte per token, like the ids). The
    # input projection's chunk grows with the length up to PROJECTION_STEPS, so both lengths exceed it.
    short, long = PROJECTION_STEPS + 4, 3 * PROJECTION_STEPS + 4
    assert 0 <= peak(long) - peak(short) <= 2 * (long - short)


def test_weight_change_between_forward_and_backward_is_caught(monkeypatch):
    model, batch = _model("revgru", "emb"), _batch()
    sweep = model.decoder.backward_sweep

    def tampered(*args, **kwargs):
        with torch.no_grad():
            model.decoder.cells[0].g[1].weight.mul_(1.01)
        return sweep(*args, **kwargs)

    monkeypatch.setattr(model.decoder, "backward_sweep", tampered)
    with pytest.raises(ReversalError):
        model.train_step(*batch, normalizer=1.0)


def test_decode_step_shapes_and_beam_reorder():
    for rnn in ("revgru", "lstm"):
        model = _model(rnn, "emb+slice" if rnn.startswith("rev") else "hidden").eval()
        src, src_len, *_ = _batch()
        enc = model.encode(src, src_len)
        logp, state = model.decode_step(enc, enc.state, torch.full((4,), BOS))
        assert logp.shape == (4, TGT_V) and torch.allclose(logp.exp().sum(-1), torch.ones(4))
        model.reorder_state(state, torch.tensor([0, 0, 1, 3]))


def test_align_follows_the_decoding_and_points_into_each_source():
    for rnn in ("revgru", "lstm"):
        model = _model(rnn, "emb+slice" if rnn.startswith("rev") else "hidden").eval()
        src, src_len, *_ = _batch()
        tgt = torch.randint(4, TGT_V, (len(src), 5))
        positions = model.align(src, src_len, tgt)
        assert positions.shape == tgt.shape and (positions >= 0).all()
        assert (positions < src_len.unsqueeze(1)).all()  # never a padding position
        # the first output is predicted from BOS alone: its alignment is that of the first decode step
        enc = model.encode(src, src_len)
        out, _ = model._decoder_step(enc.state, torch.full((len(src),), BOS))
        assert torch.equal(positions[:, 0], model.attention.weights(out, enc.memory, enc.pad_mask).argmax(-1))


@pytest.mark.parametrize("kwargs,match", [
    (dict(attention="bogus"), "unknown --attention"),
    (dict(attention="slice", slice_dim=7), "slice-dim"),
    (dict(rnn="rnn"), "unknown --rnn"),
    (dict(max_forget_bits=4), "max-forget-bits"),
    (dict(dropout=1.5), "dropout"),
])
def test_bad_options_give_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _model(**kwargs)


@pytest.mark.parametrize("rnn", ["revgru", "revlstm", "gru"])
def test_encoding_a_sentence_does_not_depend_on_its_batch_mates(rnn):
    # Translation should not change with the batch a sentence comes in: the reversible encoder runs
    # without the (shared) buffer at inference. Same lengths, so the products have the same shapes.
    model = _model(rnn).eval()
    src, src_len, _, _ = _batch()
    other = src.clone()
    other[1:] = torch.where(src[1:] == PAD, PAD, (src[1:] + 1 - 4) % (SRC_V - 4) + 4)
    a, b = model.encode(src, src_len), model.encode(other, src_len)
    assert torch.equal(a.memory[0], b.memory[0]) and not torch.equal(a.memory[1:], b.memory[1:])
    states = (a.state, b.state) if rnn.startswith("rev") else ([a.state], [b.state])
    for s_a, s_b in zip(*states):
        row = (slice(None), 0) if s_a.dim() == 3 else 0  # nn.GRU's state is [layers, B, H]
        assert torch.equal(s_a[row], s_b[row])
