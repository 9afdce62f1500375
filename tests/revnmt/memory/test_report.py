
import pytest
import torch

from revnmt.data import Batch
from revnmt.data.vocab import BOS, EOS, PAD
from revnmt.memory.report import (
    CHECKPOINT_CANDIDATES,
    LABELS,
    analytic_bits,
    comparison_configs,
    format_report,
    measured_steps,
    memory_report,
    ordinary_counterpart,
)
from revnmt.model import ExecutionConfig, ModelConfig, build_model


def _batch(batch=6, src_len=9, tgt_len=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (batch, src_len), generator=gen)
    src[1:, -2:] = PAD
    tgt = torch.randint(4, 40, (batch, tgt_len - 1), generator=gen)
    tgt_in = torch.cat([torch.full((batch, 1), BOS), tgt], 1)
    tgt_out = torch.cat([tgt, torch.full((batch, 1), EOS)], 1)
    return Batch(src, (src != PAD).sum(1), tgt_in, tgt_out, (tgt_out != PAD).sum(1), int((tgt_out != PAD).sum()),
                 list(range(batch)))


@pytest.mark.parametrize("rnn", ["revgru", "revlstm"])
@pytest.mark.parametrize("directions", [1, 2])
def test_analytic_bits_follow_the_definitions(rnn, directions):
    torch.manual_seed(0)
    cfg = ModelConfig(rnn=rnn, emb_dim=16, hidden_size=20, attention="emb+slice", slice_dim=4, src_vocab=40,
                      tgt_vocab=40, encoder="bidirectional" if directions == 2 else "unidirectional")
    model = build_model(cfg, ExecutionConfig(buffer_lanes=5))
    batch = _batch()
    sides = analytic_bits(model, [batch])
    per_unit = 2 if rnn == "revlstm" else 1
    # an ordinary bidirectional encoder keeps both directions' states
    assert sides["encoder"].baseline_bits == 32 * 9 * 6 * 20 * per_unit * directions
    assert sides["decoder"].baseline_bits == 32 * 8 * 6 * 20 * per_unit
    slice_bits = 32 * 9 * 6 * 4 * directions
    enc = sides["encoder"]
    # actual = buffer words (>= one 64-bit word per lane, per direction) + overflow log + stored slices
    assert enc.actual_bits >= slice_bits + 64 * 6 * 5 * directions
    assert slice_bits < enc.optimal_bits < enc.actual_bits
    assert sides["decoder"].optimal_bits < sides["decoder"].actual_bits < sides["decoder"].baseline_bits


def test_report_compares_with_what_a_user_would_pick_instead():
    torch.manual_seed(0)
    cfg = ModelConfig(rnn="revgru", emb_dim=16, hidden_size=20, attention="emb", src_vocab=40, tgt_vocab=40)
    assert ordinary_counterpart(cfg).rnn == "gru" and ordinary_counterpart(cfg).attention == "hidden"
    others = comparison_configs(cfg, 4)
    same_attention = others["ordinary_same_attention"][0]
    assert (same_attention.rnn, same_attention.attention) == ("gru", "emb")
    assert others["checkpointed"] == (same_attention, ExecutionConfig(checkpoint_steps=4))
    report = memory_report(build_model(cfg), [_batch(src_len=30, tgt_len=30)])
    saved = report["model"]["saved_bytes_per_token"]
    assert saved["ordinary"] > 2 * saved["reversible"] > 0
    # checkpointing the same model saves less than keeping every step, and reversal less than both
    assert saved["ordinary_same_attention"] > saved["checkpointed"] > saved["reversible"]
    # the chosen segment length is the candidate that keeps the fewest bytes for backward
    candidates = report["checkpoint_candidates"]
    assert set(candidates) == {str(k) for k in CHECKPOINT_CANDIDATES}
    assert candidates[str(report["checkpoint_steps"])] == min(candidates.values())
    # the steps' own account of what they held outside autograd is a figure of its own
    held = report["model"]["held_bytes_per_token"]
    assert all(held[name] > 0 for name in LABELS)
    assert held["checkpointed"] > held["ordinary_same_attention"]  # what the checkpoints hold
    assert "held outside" in format_report(report) and "checkpointed (K = " in format_report(report)
    assert report["model"]["peak_bytes"] is None  # CPU: no allocator figure is invented
    assert report["decoder"]["actual_ratio"] > 1
    assert "encoder" in format_report(report)


def test_ordinary_models_have_no_analytic_bits():
    cfg = ModelConfig(rnn="gru", emb_dim=16, hidden_size=20, attention="hidden", src_vocab=40, tgt_vocab=40)
    with pytest.raises(ValueError, match="reversible"):
        analytic_bits(build_model(cfg), [_batch()])


def test_each_length_is_reported_apart_and_they_add_up_to_the_whole():
    torch.manual_seed(0)
    cfg = ModelConfig(rnn="revgru", emb_dim=16, hidden_size=20, attention="emb", src_vocab=40, tgt_vocab=40)
    batches = [_batch(src_len=12, tgt_len=8), _batch(src_len=5, tgt_len=6, seed=1), _batch(src_len=12, tgt_len=10)]
    assert [batch.length for batch in batches] == [12, 6, 12]  # the longer side, the target with its EOS
    report = memory_report(build_model(cfg), batches)
    rows = report["by_length"]
    assert rows["length"] == [6, 12] and rows["batches"] == [1, 2]
    assert sum(rows["target_tokens"]) == report["target_tokens"]
    for figure in ("saved_bytes_per_token", "held_bytes_per_token"):
        for name in LABELS:  # the lengths' figures, weighted by their tokens, are the whole's
            whole = sum(f * t for f, t in zip(rows[figure][name], rows["target_tokens"])) / report["target_tokens"]
            assert whole == pytest.approx(report["model"][figure][name])
    measured = measured_steps(build_model(cfg), batches)
    assert measured.lengths == (12, 6, 12) and measured.tokens == tuple(b.n_tokens for b in batches)
