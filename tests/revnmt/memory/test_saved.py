import torch

from revnmt.memory import SavedTensorMeter

B, H, O = 8, 16, 32
FLOAT = 4  # bytes per float32


def _rnn_weights() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    W = torch.randn(H, H, generator=generator, requires_grad=True)
    U = torch.randn(H, H, generator=generator, requires_grad=True)
    return W, U


def test_linear_tanh_saves_input_and_output_but_not_weights() -> None:
    linear = torch.nn.Linear(H, O)
    x = torch.randn(B, H, requires_grad=True)
    with SavedTensorMeter(exclude=linear.parameters()) as meter:
        y = torch.tanh(linear(x))
    # addmm saves x (for the weight's gradient) and the weight (for x's, excluded); tanh saves
    # its output. The pre-activation and the bias are not saved.
    assert meter.total_bytes == meter.live_bytes == meter.peak_bytes == (B * H + B * O) * FLOAT
    y.sum().backward()
    assert meter.live_bytes == 0
    assert meter.peak_bytes == (B * H + B * O) * FLOAT

    with SavedTensorMeter() as unexcluded:
        torch.tanh(linear(x))
    assert unexcluded.total_bytes == (B * H + B * O + H * O) * FLOAT


def test_no_grad_saves_nothing() -> None:
    linear = torch.nn.Linear(H, O)
    with torch.no_grad(), SavedTensorMeter(exclude=linear.parameters()) as meter:
        torch.tanh(linear(torch.randn(B, H, requires_grad=True)))
    assert meter.total_bytes == meter.peak_bytes == 0


def test_one_storage_counts_once() -> None:
    x = torch.randn(B, H, requires_grad=True)
    with SavedTensorMeter() as meter:
        y = x * x  # saves x twice
        z = torch.sin(x[:2])  # saves its input, a view of x: same storage
    assert meter.live_bytes == B * H * FLOAT
    del y
    assert meter.live_bytes == B * H * FLOAT  # z's graph still holds x
    del z
    assert meter.live_bytes == 0


def _unrolled_rnn_peak(T: int) -> int:
    W, U = _rnn_weights()
    xs = torch.randn(T, B, H)
    h = torch.zeros(B, H)
    with SavedTensorMeter(exclude=[W, U]) as meter:
        for t in range(T):
            h = torch.tanh(xs[t] @ W + h @ U)
    h.sum().backward()
    assert meter.live_bytes == 0
    return meter.peak_bytes


def test_unrolled_rnn_peak_grows_linearly_with_steps() -> None:
    # Saved: all of xs (each xs[t] is a view of it), h_0 ... h_T (each saved by tanh as an output
    # and again by the next step's mm, counted once).
    for T in (10, 20):
        assert _unrolled_rnn_peak(T) == (T + (T + 1)) * B * H * FLOAT
    assert 1.9 < _unrolled_rnn_peak(20) / _unrolled_rnn_peak(10) < 2.0


def _truncated_rnn_meter(T: int) -> SavedTensorMeter:
    W, U = _rnn_weights()
    h = torch.zeros(B, H)
    with SavedTensorMeter(exclude=[W, U]) as meter:
        for _ in range(T):
            h = torch.tanh(torch.randn(B, H) @ W + h.detach() @ U)
            h.sum().backward()
            assert meter.live_bytes == 0
    return meter


def test_backprop_per_step_keeps_peak_independent_of_steps() -> None:
    short, long = _truncated_rnn_meter(10), _truncated_rnn_meter(40)
    # One step's graph at a time: its input x, the previous hidden state and the new one.
    assert short.peak_bytes == long.peak_bytes == 3 * B * H * FLOAT
    assert long.total_bytes == 4 * short.total_bytes == 40 * 3 * B * H * FLOAT


def test_gradients_unchanged_by_meter_including_double_backward() -> None:
    def grads(meter: SavedTensorMeter | None) -> list[torch.Tensor]:
        W, U = _rnn_weights()
        x = torch.randn(B, H, generator=torch.Generator().manual_seed(1))
        if meter is None:
            y = torch.tanh(torch.tanh(x @ W) @ U)
        else:
            with meter:
                y = torch.tanh(torch.tanh(x @ W) @ U)
        (gW,) = torch.autograd.grad(y.sum(), W, create_graph=True)
        (gU,) = torch.autograd.grad(gW.square().sum(), U)
        return [gW.detach(), gU]

    for plain, metered in zip(grads(None), grads(SavedTensorMeter())):
        assert torch.equal(plain, metered)


class _HiddenState(torch.autograd.Function):
    """Doubles its input, keeping one tensor where autograd sees it and one where it does not."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.stash = torch.zeros(1000)
        return 2 * x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return 2 * grad


def test_tensors_kept_outside_autograd_are_invisible() -> None:
    x = torch.randn(B, H, requires_grad=True)
    with SavedTensorMeter() as meter:
        _HiddenState.apply(x)
    assert meter.total_bytes == B * H * FLOAT  # ctx.stash's 4000 bytes are not seen
