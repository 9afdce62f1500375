"""Tests of revnmt.rnn.bidirectional: both directions' reversal, alignment and the backward direction's reading
order, in both families."""

import pytest
import torch
from test_reversible import _assert_close

from revnmt.rnn import (
    BidirectionalReversibleRNN,
    BidirectionalRNN,
    ReversalError,
    ReversedInput,
    ReversibleRNN,
    TensorInput,
)
from revnmt.rnn.bidirectional import reverse_padded
from revnmt.rnn.ordinary import OrdinaryRNN

IN, HID, SLICE, LENGTHS = 5, 8, 2, [6, 3, 5, 1]


def _mask(lengths=LENGTHS):
    return torch.arange(max(lengths))[:, None] < torch.tensor(lengths)[None, :]


def _bidirectional(cell, layers=1, dropout=0.0, seed=0):
    torch.manual_seed(seed)
    make = lambda: ReversibleRNN(cell, IN, HID, layers, dropout, slice_dim=SLICE, buffer_lanes=2)  # noqa: E731
    return BidirectionalReversibleRNN(make(), make())


def test_reverse_padded_reverses_each_row_within_its_length_and_undoes_itself():
    x = torch.arange(4 * 6).view(4, 6).t()[:, :, None].float()  # [T = 6, B = 4, 1], row b holds 6b … 6b + 5
    lengths = torch.tensor(LENGTHS)
    got = reverse_padded(x, lengths)
    assert got[:, 1, 0].tolist() == [8, 7, 6, 9, 10, 11]  # the 3 real steps reversed, the padding in place
    assert got[:, 3, 0].tolist() == [18, 19, 20, 21, 22, 23]
    assert torch.equal(reverse_padded(got, lengths), x)


def test_reversed_input_gives_the_steps_and_takes_their_gradients_in_reverse():
    x = torch.randn(7, 2, 3)
    inputs = TensorInput(x)
    backward = ReversedInput(inputs)
    assert torch.equal(backward.steps(0, 7), x.flip(0)) and torch.equal(backward.steps(2, 5), x.flip(0)[2:5])
    grad = torch.randn(3, 2, 3)
    backward.backward(4, grad)  # its steps 4, 5, 6 are the input's 2, 1, 0
    assert torch.equal(inputs.grad[:3], grad.flip(0)) and not inputs.grad[3:].any()


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
@pytest.mark.parametrize("layers", [1, 2])
def test_reversal_of_both_directions_matches_backprop(cell, layers):
    rnn, mask = _bidirectional(cell, layers, dropout=0.3), _mask()
    rnn.train()
    x = torch.randn(mask.shape[0], mask.shape[1], IN, requires_grad=True)
    w_fin = [[torch.randn(mask.shape[1], rnn.directions[0].state_size) for _ in range(layers)] for _ in range(2)]
    w_slice = torch.randn(mask.shape[0], mask.shape[1], 2 * SLICE)
    dropout = rnn.draw_dropout(mask.shape[1], torch.device("cpu"))

    inputs = TensorInput(x)
    tape = rnn.forward_sweep(inputs, mask, dropout=dropout)
    assert torch.equal(tape.slices[:, :, :SLICE], tape.forward.slices)
    assert torch.equal(tape.slices[:, :, SLICE:], tape.backward.slices.flip(0))  # aligned per source position
    rnn.backward_sweep(tape, inputs, grad_final=w_fin, slice_grad=w_slice)
    assert all(t.buffer.is_empty() for t in tape.directions)
    got = {n: p.grad.clone() for n, p in rnn.named_parameters()}

    rnn.zero_grad()
    _, finals, slices, _ = rnn.forward_autograd(x, mask, dropout=dropout)
    loss = (slices * w_slice).sum() + sum((f * w).sum() for fs, ws in zip(finals, w_fin) for f, w in zip(fs, ws))
    want_x, = torch.autograd.grad(loss, x, retain_graph=True)
    loss.backward()
    _assert_close(inputs.grad, want_x)
    for name, p in rnn.named_parameters():
        _assert_close(got[name], p.grad)


@pytest.mark.parametrize("direction", [0, 1])
def test_a_wrong_reconstruction_in_either_direction_raises(direction):
    rnn, mask = _bidirectional("revgru"), _mask()
    inputs = TensorInput(torch.randn(mask.shape[0], mask.shape[1], IN))
    tape = rnn.forward_sweep(inputs, mask)
    with torch.no_grad():
        rnn.directions[direction].cells[0].parameters().__next__().add_(1e-3)  # weights changed in between
    with pytest.raises(ReversalError):
        rnn.backward_sweep(tape, inputs)


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_the_backward_direction_reads_each_sentence_from_its_last_token(cell):
    # Inference sweeps (no buffer) make each row's states its own; the batch keeps its shape, so the products
    # block their rows alike. What the padding holds must not matter, and a full-length row's backward
    # direction must be its stack run over the reversed sentence.
    rnn, mask = _bidirectional(cell), _mask()
    x = torch.randn(mask.shape[0], mask.shape[1], IN)
    garbage = torch.where(mask[..., None], x, torch.randn_like(x))
    clean, dirty = (rnn.forward_sweep(TensorInput(inp), mask, reversible=False) for inp in (x, garbage))
    for a, b in zip(clean.directions, dirty.directions):
        assert all(torch.equal(s, t) for s, t in zip(a.states, b.states))
    assert torch.equal(clean.slices[mask], dirty.slices[mask])
    assert LENGTHS[0] == mask.shape[0]
    reversed_ = rnn.directions[1].forward_sweep(TensorInput(x.flip(0)), torch.ones_like(mask), reversible=False)
    assert all(torch.equal(s[0], t[0]) for s, t in zip(clean.backward.states, reversed_.states))
    assert torch.equal(clean.slices[:, 0, SLICE:], reversed_.slices.flip(0)[:, 0])


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_ordinary_pair_is_torchs_bidirectional_layer(cell):
    # One layer of each direction with nn.GRU/nn.LSTM(bidirectional=True)'s weights gives its outputs and states.
    torch.manual_seed(0)
    pair = BidirectionalRNN(OrdinaryRNN(cell, IN, HID), OrdinaryRNN(cell, IN, HID))
    both = OrdinaryRNN(cell, IN, HID)
    both.rnn = type(both.rnn)(IN, HID, bidirectional=True)
    with torch.no_grad():
        for name, value in both.rnn.named_parameters():
            source = pair.directions[1 if name.endswith("_reverse") else 0].rnn
            value.copy_(getattr(source, name.removesuffix("_reverse")))
    x, lengths = torch.randn(6, 4, IN), torch.tensor(LENGTHS)
    out, (final_f, final_b) = pair(x, lengths)
    want_out, want_final = both(x, lengths)
    torch.testing.assert_close(out, want_out)
    split = (lambda s: (s[0:1], s[1:2])) if cell == "gru" else (lambda s: ((s[0][0:1], s[1][0:1]),
                                                                           (s[0][1:2], s[1][1:2])))
    want_f, want_b = split(want_final)
    torch.testing.assert_close(final_f, want_f)
    torch.testing.assert_close(final_b, want_b)
