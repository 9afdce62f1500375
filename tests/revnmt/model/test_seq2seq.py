"""Tests of revnmt.model.seq2seq and revnmt.model.factory: what every family shares."""

import pytest
import torch
from toy_model import Toy

from revnmt.checkpoints import Checkpoint, save_checkpoint
from revnmt.data import DataOptions
from revnmt.data.vocab import BOS, PAD, SPECIALS
from revnmt.model import (
    ExecutionConfig,
    OrdinarySeq2Seq,
    RecomputedSeq2Seq,
    ReversibleSeq2Seq,
    Seq2Seq,
    build_model,
)

toy = Toy()


def _checkpoint(model: Seq2Seq) -> Checkpoint:
    """A checkpoint of ``model``, with vocabularies of its sizes."""
    vocabs = [[*SPECIALS, *(f"w{i}" for i in range(size - len(SPECIALS)))]
              for size in (model.cfg.src_vocab, model.cfg.tgt_vocab)]
    return Checkpoint(model.cfg, model.state_dict(), *vocabs, DataOptions("en", "de", lowercase=False, max_len=None))


@pytest.mark.parametrize("rnn,family", [("revgru", ReversibleSeq2Seq), ("revlstm", ReversibleSeq2Seq),
                                        ("gru", OrdinarySeq2Seq), ("lstm", OrdinarySeq2Seq)])
def test_the_factory_builds_the_family_of_each_rnn(rnn, family):
    model = build_model(toy.config(rnn, "emb+slice"))
    if family is OrdinarySeq2Seq:
        assert type(build_model(toy.config(rnn), ExecutionConfig(checkpoint_steps="auto"))) is RecomputedSeq2Seq
    assert type(model) is family and isinstance(model, Seq2Seq)
    with pytest.raises(TypeError):  # the shared base alone has no recurrent layers
        Seq2Seq(toy.config(rnn))


@pytest.mark.parametrize("rnn", ["revgru", "lstm"])
def test_a_checkpoint_state_round_trips(rnn, tmp_path):
    model = toy.model(rnn, "emb+slice").eval()
    # checkpoints name these modules: renaming one would orphan every saved model
    assert {key.split(".")[0] for key in model.state_dict()} == {"src_emb", "tgt_emb", "encoder", "decoder",
                                                                 "attention", "generator"}
    _checkpoint(model).save(tmp_path / "best.pt")
    loaded = Checkpoint.load(tmp_path / "best.pt").trained_model().eval()
    assert type(loaded) is type(model) and loaded.cfg == model.cfg
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    src, src_len, tgt_in, tgt_out = toy.batch()
    assert torch.equal(loaded.loss(src, src_len, tgt_in, tgt_out), model.loss(src, src_len, tgt_in, tgt_out))


def test_a_checkpoint_from_before_label_smoothing_loads_without_it(tmp_path):
    model = toy.model("revgru", "emb+slice").eval()
    stored = _checkpoint(model).to_dict()
    del stored["format"], stored["model_config"]["label_smoothing"]  # as written then
    save_checkpoint(tmp_path / "best.pt", stored)
    loaded = Checkpoint.load(tmp_path / "best.pt").trained_model()
    assert loaded.cfg.label_smoothing == 0.0 and loaded.cfg == model.cfg


def test_decode_step_shapes_and_beam_reorder():
    for rnn in ("revgru", "lstm"):
        model = toy.model(rnn, "emb+slice" if rnn.startswith("rev") else "hidden").eval()
        src, src_len, *_ = toy.batch()
        enc = model.encode(src, src_len)
        logp, state = model.decode_step(enc, enc.state, torch.full((4,), BOS))
        assert logp.shape == (4, toy.tgt_vocab) and torch.allclose(logp.exp().sum(-1), torch.ones(4))
        model.reorder_state(state, torch.tensor([0, 0, 1, 3]))


def test_align_follows_the_decoding_and_points_into_each_source():
    for rnn in ("revgru", "lstm"):
        model = toy.model(rnn, "emb+slice" if rnn.startswith("rev") else "hidden").eval()
        src, src_len, *_ = toy.batch()
        tgt = torch.randint(4, toy.tgt_vocab, (len(src), 5))
        positions = model.align(src, src_len, tgt)
        assert positions.shape == tgt.shape and (positions >= 0).all()
        assert (positions < src_len.unsqueeze(1)).all()  # never a padding position
        # the first output is predicted from BOS alone: its alignment is that of the first decode step
        enc = model.encode(src, src_len)
        out, _ = model.decoder_step(enc.state, torch.full((len(src),), BOS))
        assert torch.equal(positions[:, 0], model.attention.weights(out, enc.memory, enc.pad_mask).argmax(-1))


@pytest.mark.parametrize("kwargs,match", [
    (dict(attention="bogus"), r"--attention must be one of hidden, emb, slice, emb\+slice, got .bogus."),
    (dict(attention="slice", slice_dim=7), "slice-dim"),
    (dict(rnn="rnn"), "--rnn must be one of revgru, revlstm, gru, lstm, got .rnn."),
    (dict(max_forget_bits=4), "max-forget-bits"),
    (dict(dropout=1.5), "dropout"),
    (dict(encoder="both"), "--encoder must be one of unidirectional, bidirectional, got .both."),
    (dict(tie_embeddings=True), "emb-dim must equal"),
    (dict(share_embeddings=True), "one vocabulary"),
    (dict(label_smoothing=1.0), r"--label-smoothing must be in \[0, 1\), got 1.0"),
    (dict(label_smoothing=-0.1), "--label-smoothing must be in"),
])
def test_bad_options_give_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        toy.model(**kwargs)


@pytest.mark.parametrize("rnn", ["revgru", "revlstm", "gru", "lstm"])
def test_a_bidirectional_model_round_trips_and_decodes(rnn, tmp_path):
    model = toy.model(rnn, "emb+slice", layers=2, encoder="bidirectional").eval()
    assert model.cfg.memory_dim == 8 + 2 * 3  # the embeddings and both directions' slices
    assert {key.split(".")[0] for key in model.state_dict()} >= {"encoder", "bridge"}
    _checkpoint(model).save(tmp_path / "best.pt")
    loaded = Checkpoint.load(tmp_path / "best.pt").trained_model().eval()
    src, src_len, tgt_in, tgt_out = toy.batch()
    assert torch.equal(loaded.loss(src, src_len, tgt_in, tgt_out), model.loss(src, src_len, tgt_in, tgt_out))
    enc = model.encode(src, src_len)
    assert enc.memory.shape == (4, src.shape[1], 14)
    logp, state = model.decode_step(enc, enc.state, torch.full((4,), BOS))
    assert logp.shape == (4, toy.tgt_vocab)
    model.reorder_state(state, torch.tensor([0, 0, 1, 3]))


def test_the_bridge_starts_the_decoder_from_both_directions():
    # The decoder's initial state is tanh(W [forward; backward] + b) of the encoder's final states, per layer;
    # for an LSTM of both families, of the whole [h | c] state.
    for rnn in ("revlstm", "lstm"):
        model = toy.model(rnn, "hidden", encoder="bidirectional").eval()
        assert model.bridge.layers[0].in_features == 2 * 2 * 12 and model.bridge.layers[0].out_features == 2 * 12
        src, src_len, *_ = toy.batch()
        with torch.no_grad():
            model.bridge.layers[0].weight.zero_()
            model.bridge.layers[0].bias.fill_(0.25)
        state = model.encode(src, src_len).state
        h = state[0] if rnn == "revlstm" else torch.cat([state[0][0], state[1][0]], -1)
        values = h.float() / (1 << 23) if rnn == "revlstm" else h
        torch.testing.assert_close(values, torch.full_like(values, float(torch.tanh(torch.tensor(0.25)))))


def test_tied_and_shared_embeddings_are_one_matrix_after_loading(tmp_path):
    joint = Toy(src_vocab=25, tgt_vocab=25)
    model = joint.model("gru", "hidden", hidden_size=8, tie_embeddings=True, share_embeddings=True)
    assert model.generator.weight is model.tgt_emb.weight is model.src_emb.weight
    _checkpoint(model).save(tmp_path / "best.pt")
    loaded = Checkpoint.load(tmp_path / "best.pt").trained_model()
    assert loaded.generator.weight is loaded.tgt_emb.weight is loaded.src_emb.weight
    assert torch.equal(loaded.generator.weight, model.generator.weight)
    untied = joint.model("gru", "hidden", hidden_size=8)
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in model.parameters()) == 2 * 25 * 8


@pytest.mark.parametrize("encoder", ["unidirectional", "bidirectional"])
@pytest.mark.parametrize("rnn", ["revgru", "revlstm", "gru"])
def test_encoding_a_sentence_does_not_depend_on_its_batch_mates(rnn, encoder):
    # Translation should not change with the batch a sentence comes in: the reversible encoder runs
    # without the (shared) buffer at inference. Same lengths, so the products have the same shapes.
    model = toy.model(rnn, encoder=encoder).eval()
    src, src_len, _, _ = toy.batch()
    other = src.clone()
    other[1:] = torch.where(src[1:] == PAD, PAD, (src[1:] + 1 - 4) % (toy.src_vocab - 4) + 4)
    a, b = model.encode(src, src_len), model.encode(other, src_len)
    assert torch.equal(a.memory[0], b.memory[0]) and not torch.equal(a.memory[1:], b.memory[1:])
    states = (a.state, b.state) if rnn.startswith("rev") else ([a.state], [b.state])
    for s_a, s_b in zip(*states):
        row = (slice(None), 0) if s_a.dim() == 3 else 0  # nn.GRU's state is [layers, B, H]
        assert torch.equal(s_a[row], s_b[row])
