"""The sweeps' products: oneDNN's linear on CPU, checked against torch's and for what exact reversal needs of it."""

import pytest
import torch

from revnmt.rnn import products

onednn = pytest.mark.skipif(not products.uses_onednn(torch.device("cpu")), reason="this torch has no oneDNN")


def test_linear_is_torch_linear_within_float32_rounding():
    torch.manual_seed(0)
    x, weight, bias = torch.randn(2, 64, 300), torch.randn(750, 300), torch.randn(750)
    close = dict(rtol=1e-5, atol=1e-4)  # sums of 300 products of magnitude ~1: float32 rounds at ~2e-6 of ~20
    torch.testing.assert_close(products.linear(x, weight, bias), torch.nn.functional.linear(x, weight, bias), **close)
    torch.testing.assert_close(products.linear(x[0], weight.t().contiguous().t()), x[0] @ weight.t(), **close)


@onednn
def test_same_call_same_bits_wherever_the_data_lies():
    # The reverse recomputes the forward's gates; the same product of the same values must give the same
    # bits whether its operands are fresh tensors or views at odd offsets (slots inside bigger tensors).
    torch.manual_seed(0)
    weight = torch.randn(750, 150)
    for rows in (1, 3, 64, 65):
        x = torch.randn(rows, 150)
        want = products.linear(x, weight)
        odd = torch.empty(rows * 150 + 7)[7:].view(rows, 150).copy_(x)
        odd_weight = torch.empty(weight.numel() + 3)[3:].view_as(weight).copy_(weight)
        assert torch.equal(products.linear(odd, weight), want)
        assert torch.equal(products.linear(x, odd_weight), want)
        assert torch.equal(products.linear(x, weight), want)  # and again


@onednn
def test_a_sliced_weight_is_refused():
    # oneDNN takes a column slice of a bigger weight down a path hundreds of times slower.
    weight = torch.randn(750, 450)
    with pytest.raises(ValueError, match="contiguous weight"):
        products.linear(torch.randn(4, 150), weight[:, 300:])


def test_linear_differentiates_as_torch_linear_with_the_same_values():
    torch.manual_seed(0)
    x, weight, bias = (torch.randn(3, 5, 12), torch.randn(20, 12), torch.randn(20))
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    refs = [t.clone().requires_grad_() for t in (x, weight, bias)]
    grad = torch.randn(3, 5, 20)
    out = products.linear(*leaves)
    with torch.no_grad():
        assert torch.equal(out, products.linear(x, weight, bias))  # autograd's value is the sweeps'
    out.backward(grad)
    torch.nn.functional.linear(*refs).backward(grad)
    for got, want in zip(leaves, refs):
        torch.testing.assert_close(got.grad, want.grad)


def test_accumulate_adds_the_product():
    torch.manual_seed(0)
    out, x, weight = torch.randn(4, 6), torch.randn(4, 5), torch.randn(6, 5)
    want = out + x @ weight.t()
    products.accumulate(out, x, weight)
    torch.testing.assert_close(out, want)
    products.accumulate(out, x.t().contiguous().t(), weight.t().contiguous().t())  # transposed operands
    torch.testing.assert_close(out, want + x @ weight.t())


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")  # flags() also sets oneDNN's TF32 switch
def test_torchs_onednn_switch_turns_it_off():
    # torch.backends.mkldnn.flags(enabled=False) gives torch's own products, as off the CPU.
    x, weight = torch.randn(4, 5), torch.randn(6, 5)
    with torch.backends.mkldnn.flags(enabled=False):
        assert not products.uses_onednn(x.device)
        assert torch.equal(products.linear(x, weight), torch.nn.functional.linear(x, weight))
