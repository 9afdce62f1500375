import pytest
import torch
import torch.nn.functional as F

from revnmt.model import loss as loss_module
from revnmt.model.loss import linear_cross_entropy


@pytest.mark.parametrize("vocab", [7, 50])
def test_matches_cross_entropy_of_the_full_logits(vocab, monkeypatch):
    monkeypatch.setattr(loss_module, "VOCAB_CHUNK", 16)  # several chunks, the last one partial
    torch.manual_seed(0)
    hidden = torch.randn(9, 5, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, 5, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(vocab, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, vocab, (9,))
    target[[2, 5]] = 0  # ignored rows
    grad_out = torch.tensor(0.7, dtype=torch.float64)
    ours = linear_cross_entropy(hidden, weight, bias, target, ignore_index=0)
    ours_grads = torch.autograd.grad(ours, (hidden, weight, bias), grad_out)
    ref = F.cross_entropy(F.linear(hidden, weight, bias), target, ignore_index=0, reduction="sum")
    ref_grads = torch.autograd.grad(ref, (hidden, weight, bias), grad_out)
    assert torch.allclose(ours, ref)
    for got, want in zip(ours_grads, ref_grads):
        assert torch.allclose(got, want)
    assert torch.autograd.gradcheck(lambda h, w, b: linear_cross_entropy(h, w, b, target, 0), (hidden, weight, bias))


def test_the_logit_block_does_not_grow_with_the_rows():
    assert loss_module.vocab_chunk(64) == loss_module.VOCAB_CHUNK
    for rows in (65, 512, 4096):
        chunk = loss_module.vocab_chunk(rows)
        assert chunk < loss_module.VOCAB_CHUNK
        assert rows * chunk <= loss_module.LOGIT_BLOCK or chunk == loss_module.MIN_VOCAB_CHUNK
