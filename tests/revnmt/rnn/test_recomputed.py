"""Tests of revnmt.rnn.recomputed: a checkpointed layer is the ordinary layer, with less saved for backward."""

import pytest
import torch

from revnmt.memory import SavedTensorMeter
from revnmt.rnn.ordinary import OrdinaryRNN
from revnmt.rnn.recomputed import RecomputedRNN, segment_steps


def _pair(cell: str, steps, layers: int = 2) -> tuple[OrdinaryRNN, RecomputedRNN]:
    torch.manual_seed(0)
    ordinary = OrdinaryRNN(cell, 5, 6, layers)
    checkpointed = RecomputedRNN(cell, 5, 6, layers, steps=steps)
    checkpointed.load_state_dict(ordinary.state_dict())
    return ordinary, checkpointed


def _run(layer, x, lengths, initial):
    """Outputs, final h and the gradients of a loss on both, w.r.t. the input and the weights."""
    x = x.detach().requires_grad_()
    layer.zero_grad()
    out, final = layer(x, lengths, initial)
    h = final[0] if isinstance(final, tuple) else final
    (out.pow(2).sum() + h.sin().sum()).backward()
    return out.detach(), h.detach(), x.grad, [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("steps", [1, 3, "auto", 50])
def test_checkpointed_layer_gives_the_ordinary_outputs_and_gradients(cell, steps):
    ordinary, checkpointed = _pair(cell, steps)
    x, lengths = torch.randn(9, 4, 5), torch.tensor([9, 3, 7, 1])  # ragged: rows end inside segments
    h0 = torch.randn(2, 4, 6)
    initial = (h0, torch.randn(2, 4, 6)) if cell == "lstm" else h0
    expected, got = _run(ordinary, x, lengths, initial), _run(checkpointed, x, lengths, initial)
    for e, g in zip(expected[:3], got[:3]):
        assert torch.allclose(e, g, rtol=1e-5, atol=1e-6)
    for e, g in zip(expected[3], got[3]):
        assert torch.allclose(e, g, rtol=1e-5, atol=1e-6)


def test_without_gradients_it_is_the_ordinary_layer_exactly():
    ordinary, checkpointed = _pair("gru", 2)
    x, lengths = torch.randn(7, 3, 5), torch.tensor([7, 2, 5])
    with torch.no_grad():
        for e, g in zip(ordinary(x, lengths), checkpointed(x, lengths)):
            assert torch.equal(e, g)


def test_auto_segments_are_the_square_root_of_the_length():
    assert [segment_steps("auto", t) for t in (1, 14, 16, 50, 200)] == [1, 4, 4, 8, 15]
    assert segment_steps(5, 200) == 5
    with pytest.raises(ValueError, match="positive number of steps"):
        RecomputedRNN("gru", 5, 6, steps=0)


def test_autograd_saves_a_fraction_of_what_the_ordinary_layer_saves():
    ordinary, checkpointed = _pair("gru", "auto", layers=1)
    x = torch.randn(100, 8, 5, requires_grad=True)
    saved = []
    for layer in (ordinary, checkpointed):
        with SavedTensorMeter(exclude=[*layer.parameters(), x]) as meter:
            out, _ = layer(x)
            out.sum().backward()
        saved.append(meter.peak_bytes)
    # The ordinary layer saves its gates and states at every step; the checkpointed one only the
    # segment it is recomputing (the boundary states are held by the checkpoints: held_bytes).
    assert saved[1] * 4 < saved[0]
    assert checkpointed.held_bytes(100, 8) == 4 * (10 * 8 * 6 + 100 * 8 * 5)
