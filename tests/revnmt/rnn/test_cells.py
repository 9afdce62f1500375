"""The cells' input projection: one product with the concatenated input weights, in a sweep and out of one."""

import pytest
import torch

from buffers import ForgetLimit
from revnmt.rnn.cells import REV_CELLS, SweepWeights


@pytest.mark.parametrize("cell", sorted(REV_CELLS))
def test_input_weights_project_and_backpropagate_as_autograd_does(cell):
    torch.manual_seed(0)
    layer = REV_CELLS[cell](12, 16, ForgetLimit(3))
    x, grad = torch.randn(3, 5, 12), torch.randn(3, 5, layer.project_width)

    weights = SweepWeights(layer, grads=True)
    # The sweep's projection is cell.project's, bit for bit: exact reversal needs the same gates.
    assert torch.equal(weights.project(x), layer.project(x))

    x_ref = x.clone().requires_grad_()
    layer.project(x_ref).backward(grad)
    want = {name: p.grad.clone() for name, p in layer.named_parameters()}
    layer.zero_grad(set_to_none=True)

    grad_x = torch.zeros_like(x)
    for rows in (slice(0, 2), slice(2, 3)):  # two chunks of steps, as InputProjection backpropagates them
        grad_x[rows] = weights.backward(x[rows], grad[rows])
    assert all(p.grad is None for p in layer.parameters())  # collected, not yet added
    weights.flush()
    torch.testing.assert_close(grad_x, x_ref.grad)
    for name, p in layer.named_parameters():
        input_columns = p.grad if p.dim() == 1 else p.grad[:, :12]
        reference = want[name] if p.dim() == 1 else want[name][:, :12]
        torch.testing.assert_close(input_columns, reference, msg=name)
        if p.dim() == 2:  # the recurrent columns are not the projection's: left at zero
            assert not p.grad[:, 12:].any()
