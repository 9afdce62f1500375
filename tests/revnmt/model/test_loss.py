import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from revnmt.model import loss as loss_module
from revnmt.model.loss import linear_cross_entropy, logit_work_bytes
from revnmt.profiling.launches import LaunchCounter


def _inputs(vocab: int, rows: int = 9, dim: int = 5):
    torch.manual_seed(0)
    hidden = torch.randn(rows, dim, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, dim, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(vocab, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, vocab, (rows,))
    target[[2, 5]] = 0  # ignored rows
    return hidden, weight, bias, target


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.5])
@pytest.mark.parametrize("vocab", [7, 50])
def test_matches_cross_entropy_of_the_full_logits(vocab, eps, monkeypatch):
    monkeypatch.setattr(loss_module, "VOCAB_CHUNK", 16)  # several chunks, the last one partial
    hidden, weight, bias, target = _inputs(vocab)
    grad_out = torch.tensor(0.7, dtype=torch.float64)
    ours = linear_cross_entropy(hidden, weight, bias, target, ignore_index=0, label_smoothing=eps)
    ours_grads = torch.autograd.grad(ours.objective, (hidden, weight, bias), grad_out)
    logits = F.linear(hidden, weight, bias)
    ref = F.cross_entropy(logits, target, ignore_index=0, label_smoothing=eps, reduction="sum")
    ref_grads = torch.autograd.grad(ref, (hidden, weight, bias), grad_out)
    assert torch.allclose(ours.objective, ref)
    for got, want in zip(ours_grads, ref_grads):
        assert torch.allclose(got, want)
    # the reported loss is the unsmoothed one, and has no gradient
    assert torch.allclose(ours.nll, F.cross_entropy(logits, target, ignore_index=0, reduction="sum"))
    assert not ours.nll.requires_grad
    assert torch.autograd.gradcheck(lambda h, w, b: linear_cross_entropy(h, w, b, target, 0, eps).objective,
                                    (hidden, weight, bias))


def test_without_smoothing_the_objective_is_the_nll_exactly():
    hidden, weight, bias, target = _inputs(50)
    loss = linear_cross_entropy(hidden, weight, bias, target, ignore_index=0)
    assert torch.equal(loss.objective, loss.nll) and loss.objective.requires_grad


def test_ignored_rows_contribute_nothing_to_the_smoothed_loss():
    hidden, weight, bias, target = _inputs(50)
    keep = target != 0
    full = linear_cross_entropy(hidden, weight, bias, target, 0, 0.1)
    kept = linear_cross_entropy(hidden[keep], weight, bias, target[keep], 0, 0.1)
    assert torch.allclose(full.objective, kept.objective) and torch.allclose(full.nll, kept.nll)
    grad = torch.autograd.grad(full.objective, hidden)[0]
    assert torch.equal(grad[~keep], torch.zeros_like(grad[~keep]))


class _LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operator creates."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_no_tensor_outgrows_the_logit_block(eps, monkeypatch):
    # The smoothed loss needs each row's sum of logits and a constant in the gradient: neither pass may
    # build a [rows, V] tensor. The sizes make the block (9 × 16) larger than the weight's gradient (50 × 2)
    # and smaller than the full logits (9 × 50).
    monkeypatch.setattr(loss_module, "VOCAB_CHUNK", 16)
    hidden, weight, bias, target = _inputs(50, dim=2)
    with _LargestTensor() as largest:
        linear_cross_entropy(hidden, weight, bias, target, 0, eps).objective.backward()
    assert largest.numel * hidden.element_size() <= logit_work_bytes(9, 50, hidden.element_size())
    assert logit_work_bytes(9, 50, hidden.element_size()) < 9 * 50 * hidden.element_size()


def test_the_logit_block_does_not_grow_with_the_rows():
    cpu = loss_module.logit_block("cpu")
    assert loss_module.vocab_chunk(64, cpu) == loss_module.VOCAB_CHUNK
    for rows in (65, 512, 4096):
        chunk = loss_module.vocab_chunk(rows, cpu)
        assert chunk < loss_module.VOCAB_CHUNK
        assert rows * chunk <= cpu or chunk == loss_module.MIN_VOCAB_CHUNK


def test_a_gpu_takes_the_widest_chunk_for_a_decoder_chunk_of_a_large_batch():
    # On a GPU each chunk is launches the host pays for: the chunks of a loss over many rows (a decoder chunk's steps
    # of a batch) stay as few as over 64, so that the launches do not grow with the decoder's chunk.
    gpu = loss_module.logit_block("cuda")
    assert loss_module.logit_block("cuda", asked=1000) == 1000 and gpu > loss_module.logit_block("cpu")
    assert loss_module.vocab_chunk(8192, gpu) == loss_module.VOCAB_CHUNK
    assert loss_module.vocab_chunk(8192 * 4, gpu) < loss_module.VOCAB_CHUNK


def test_the_block_sets_the_chunks_a_loss_computes(monkeypatch):
    # A block asked for (--logit-block) reaches the loss: fewer, wider chunks, the same loss and gradients to float
    # rounding (the chunks' order of sums differs).
    monkeypatch.setattr(loss_module, "MIN_VOCAB_CHUNK", 1)
    hidden, weight, bias, target = _inputs(50)
    runs = []
    for block in (9 * 16, 9 * 50):
        h = hidden.detach().clone().requires_grad_()
        with LaunchCounter() as counter:
            loss = linear_cross_entropy(h, weight, bias, target, 0, 0.1, block=block)
        loss.objective.backward()
        runs.append((counter.names.count("aten::logsumexp"), loss.objective.detach(), h.grad))
    (narrow, loss_a, grad_a), (wide, loss_b, grad_b) = runs
    assert (narrow, wide) == (4, 1)  # 50 columns in chunks of 16 (MIN_VOCAB_CHUNK lowered here), then in one
    torch.testing.assert_close(loss_a, loss_b)
    torch.testing.assert_close(grad_a, grad_b)


def test_the_backward_pass_never_reads_the_host(monkeypatch):
    # On a GPU a host read is a wait for the device: the loss's backward runs inside the decoder's reverse sweep.
    monkeypatch.setattr(loss_module, "VOCAB_CHUNK", 16)
    hidden, weight, bias, target = _inputs(50)
    loss = linear_cross_entropy(hidden, weight, bias, target, ignore_index=0, label_smoothing=0.1)
    with LaunchCounter() as counter:
        loss.objective.backward()
    assert counter.count > 0 and counter.host_reads == 0
