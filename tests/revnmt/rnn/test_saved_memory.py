"""Training by reversal keeps one step's graph at a time: saved activations do not grow with T."""

import pytest
import torch

from revnmt.memory import SavedTensorMeter
from revnmt.rnn import ReversibleRNN, TensorInput
from revnmt.rnn.reversible import PROJECTION_STEPS


def _peak_saved(rnn, steps, reversal):
    torch.manual_seed(0)
    x = torch.randn(steps, 3, 8, requires_grad=True)
    w = torch.randn(steps, 3, rnn.hidden_size)
    mask = torch.ones(steps, 3, dtype=torch.bool)
    # the mask and inputs belong to the caller (token-level data, kept either way), not activations
    with SavedTensorMeter(exclude=[*rnn.parameters(), mask, x]) as meter:
        if reversal:
            inputs = TensorInput(x)
            rnn.backward_sweep(rnn.forward_sweep(inputs, mask), inputs, output_grad=lambda t, out: w[t])
        else:
            out, *_ = rnn.forward_autograd(x, mask)
            (out * w).sum().backward()
    return meter.peak_bytes


@pytest.mark.parametrize("cell", ["revgru", "revlstm"])
def test_saved_bytes_do_not_grow_with_sequence_length(cell):
    rnn = ReversibleRNN(cell, 8, 12, num_layers=2)
    # Beyond one chunk of input projections (PROJECTION_STEPS), nothing grows with T.
    short, long = _peak_saved(rnn, PROJECTION_STEPS, True), _peak_saved(rnn, 4 * PROJECTION_STEPS + 3, True)
    assert short > 0 and long == short
    # the same model backpropagated ordinarily keeps every step's graph
    ordinary_short, ordinary_long = _peak_saved(rnn, 10, False), _peak_saved(rnn, 40, False)
    assert ordinary_long > 3.5 * ordinary_short and ordinary_long > 20 * long
