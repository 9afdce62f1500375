"""The sweeps' products: oneDNN's linear on CPU, checked against torch's and for what exact reversal needs of it."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from revnmt.rnn import products

MiB = 2 ** 20
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


def _in_a_fresh_process(code: str, **env: str) -> str:
    """What ``code`` prints, run by a fresh interpreter (oneDNN reads its cache sizes at its first product)."""
    environ = {k: v for k, v in os.environ.items() if k not in products.ONEDNN_CACHES} | env
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_onednns_caches_are_bounded_unless_the_user_sized_them():
    printed = "import os, revnmt.rnn.products; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], " \
              "os.environ['LRU_CACHE_CAPACITY'])"
    assert _in_a_fresh_process(printed).split() == [str(products.ONEDNN_CACHE_ENTRIES)] * 2
    assert _in_a_fresh_process(printed, LRU_CACHE_CAPACITY="7").split() == [str(products.ONEDNN_CACHE_ENTRIES), "7"]


# Products of 120 new row counts, then 120 more: the resident memory the second 120 add once the heap is trimmed.
_GROWTH = """
    import ctypes, ctypes.util, torch
    from revnmt.rnn import products
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    weight = torch.randn(300, 150)
    def held(first):
        for rows in range(first, first + 120):
            products.linear(torch.randn(rows, 150), weight)
        libc.malloc_trim(0)
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS:")).split()[1]) * 1024
    print(-held(1) + held(121))
"""


@onednn
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the RSS from Linux's /proc")
def test_what_the_products_hold_stops_growing_with_the_row_counts_they_meet():
    bounded = int(_in_a_fresh_process(_GROWTH))
    libraries_default = int(_in_a_fresh_process(_GROWTH, ONEDNN_PRIMITIVE_CACHE_CAPACITY="1024",
                                                LRU_CACHE_CAPACITY="1024"))
    assert bounded < 2 * MiB < 8 * MiB < libraries_default  # every new kernel kept, against none past the bound


@onednn
def test_a_product_compiled_again_after_its_kernel_left_the_cache_gives_the_same_bits():
    # A sweep's reverse may meet a row count whose kernel the cache dropped since the forward: compiled again, the
    # product must still give the forward's bits, or the reverse would rebuild other gates.
    code = """
        import torch
        from revnmt.rnn import products
        torch.manual_seed(0)
        x, weight = torch.randn(37, 150), torch.randn(750, 150)
        first = products.linear(x, weight)
        for rows in range(1, 30):  # other row counts: with one entry a cache keeps only the last kernel
            products.linear(torch.randn(rows, 150), weight)
        print(torch.equal(products.linear(x, weight), first))
    """
    assert _in_a_fresh_process(code, ONEDNN_PRIMITIVE_CACHE_CAPACITY="1", LRU_CACHE_CAPACITY="1").strip() == "True"
