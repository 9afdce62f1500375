import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from buffers import FORGET_ONE, BufferError, InformationBuffer

# (device, fused): the compiled CPU loops, the tensor ops on CPU, and the tensor ops on CUDA.
IMPLEMENTATIONS = [
    pytest.param(("cpu", True), id="cpu-fused"),
    pytest.param(("cpu", False), id="cpu-tensor"),
    pytest.param(("cuda", False), id="cuda",
                 marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")),
]


@pytest.fixture(params=IMPLEMENTATIONS)
def impl(request) -> tuple[str, bool]:
    return request.param


def _random_state(gen, batch, width, device):
    return torch.randint(-(2 ** 31), 2 ** 31 - 1, (batch, width), generator=gen, dtype=torch.int32).to(device)


def _random_z(gen, shape, zmin, device):
    """Numerators with the edge values 1 (or zmin) and 2^R_Z over-represented."""
    z = torch.randint(zmin, FORGET_ONE + 1, shape, generator=gen)
    edge = torch.rand(shape, generator=gen)
    z = torch.where(edge < 0.1, zmin, z)
    z = torch.where(edge > 0.9, FORGET_ONE, z)
    return z.to(device)


def _run_round_trip(impl, batch, units, steps, seed, max_bits=None, widths=None, mask_kind="rows", share_rows=False):
    """Push `steps` rounds over groups of the given widths, pop them all, compare every state."""
    device, fused = impl
    gen = torch.Generator().manual_seed(seed)
    widths = widths or [units]
    zmin = 1 if max_bits is None else FORGET_ONE >> max_bits
    buf = InformationBuffer(batch, units, device=device, max_bits=max_bits, fused=fused, share_rows=share_rows)
    states = [_random_state(gen, batch, w, device) for w in widths]
    initial = [s.clone() for s in states]
    history = []
    for _ in range(steps):
        for g, w in enumerate(widths):
            z = _random_z(gen, (batch, w), zmin, device)
            if mask_kind == "rows":
                mask = (torch.rand(batch, generator=gen) < 0.8).to(device)
            elif mask_kind == "lanes":
                mask = (torch.rand(batch, w, generator=gen) < 0.8).to(device)
            else:
                mask = None
            before = states[g]
            states[g] = buf.push_mul(before, z, mask)
            if mask is not None:
                frozen = ~(mask if mask.dim() == 2 else mask[:, None].expand(batch, w))
                assert torch.equal(states[g][frozen], before[frozen])  # padding untouched
            history.append((g, z, mask, before))
    for g, z, mask, before in reversed(history):
        states[g] = buf.pop_div(states[g], z, mask)
        assert torch.equal(states[g], before)
    assert all(torch.equal(s, i) for s, i in zip(states, initial))
    assert buf.is_empty()
    return buf


@settings(max_examples=40, deadline=None)
@given(batch=st.integers(1, 5), units=st.integers(1, 9), steps=st.integers(1, 60), seed=st.integers(0, 2 ** 31),
       max_bits=st.sampled_from([1, 2, 3, 5, None]), mask_kind=st.sampled_from(["rows", "lanes", "none"]),
       fused=st.booleans(), share_rows=st.booleans())
def test_round_trip_property(batch, units, steps, seed, max_bits, mask_kind, fused, share_rows):
    _run_round_trip(("cpu", fused), batch, units, steps, seed, max_bits=max_bits, mask_kind=mask_kind,
                    share_rows=share_rows)


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 5), units=st.integers(1, 9), steps=st.integers(1, 80), seed=st.integers(0, 2 ** 31),
       max_bits=st.sampled_from([1, 3, None]), widths=st.lists(st.integers(1, 25), min_size=1, max_size=3),
       share_rows=st.booleans())
def test_fused_and_tensor_paths_agree_bit_for_bit(batch, units, steps, seed, max_bits, widths, share_rows):
    gen = torch.Generator().manual_seed(seed)
    zmin = 1 if max_bits is None else FORGET_ONE >> max_bits
    fused, tensor = (InformationBuffer(batch, units, max_bits=max_bits, fused=f, share_rows=share_rows)
                     for f in (True, False))
    states = [_random_state(gen, batch, w, "cpu") for w in widths]
    history = []
    for _ in range(steps):
        for g, w in enumerate(widths):
            z, mask = _random_z(gen, (batch, w), zmin, "cpu"), torch.rand(batch, w, generator=gen) < 0.8
            out = fused.push_mul(states[g], z, mask)
            assert torch.equal(out, tensor.push_mul(states[g], z, mask))
            history.append((g, z, mask))
            states[g] = out
    assert fused.word_count() == tensor.word_count() and fused.allocated_bits() == tensor.allocated_bits()
    assert fused.optimal_bits() == pytest.approx(tensor.optimal_bits(), rel=1e-12)
    assert torch.equal(fused._curr, tensor._curr)
    for g, z, mask in reversed(history):
        out = fused.pop_div(states[g], z, mask)
        assert torch.equal(out, tensor.pop_div(states[g], z, mask))
        states[g] = out
    assert fused.is_empty() and tensor.is_empty()


def test_ten_thousand_steps_add_many_words(impl):
    device, fused = impl
    buf = InformationBuffer(3, 4, device=device, fused=fused)
    gen = torch.Generator().manual_seed(1)
    h0 = _random_state(gen, 3, 4, device)
    h, zs = h0, []
    for _ in range(10_000):
        zs.append(torch.randint(1, FORGET_ONE + 1, (3, 4), generator=gen).to(device))
        h = buf.push_mul(h, zs[-1], None)
    words = buf.word_count()
    assert words > 250  # uniform z* forgets ~1.44 bits a step: ~300 words of 53+ bits were pushed
    # The stack height is read far less often than once a step (never when fused): the free margin kept
    # after a read grows with the height, so the reads grow with log(steps) (29 here; 74 with a fixed margin).
    assert buf.syncs <= 40
    for z in reversed(zs):
        h = buf.pop_div(h, z, None)
    assert torch.equal(h, h0) and buf.is_empty()


@pytest.mark.parametrize("share_rows", [False, True])
def test_groups_of_different_widths_share_one_buffer(impl, share_rows):
    # e.g. h1 with an attention slice (narrower), h2, c1, c2 of a two-layer RevLSTM
    _run_round_trip(impl, batch=6, units=10, steps=80, seed=3, max_bits=3, widths=[7, 10, 10, 10, 7, 10],
                    share_rows=share_rows)


def test_wide_groups_fold_onto_few_lanes(impl):
    # 150-column halves on a 32-lane buffer: chunks of 32, 32, 32, 32, 22 columns per push
    buf = _run_round_trip(impl, batch=4, units=32, steps=30, seed=5, max_bits=3, widths=[150, 150, 20])
    assert buf.pushes == 0


def test_folding_fills_words_better():
    gen = torch.Generator().manual_seed(0)
    narrow, wide = InformationBuffer(8, 16, max_bits=3), InformationBuffer(8, 160, max_bits=3)
    h = _random_state(gen, 8, 160, "cpu")
    for _ in range(40):
        z = _random_z(gen, (8, 160), 128, "cpu")
        narrow.push_mul(h, z)
        wide.push_mul(h, z)
    assert narrow.optimal_bits() == pytest.approx(wide.optimal_bits())
    assert narrow.allocated_bits() < wide.allocated_bits()


def test_shared_lanes_fill_evenly_when_rows_forget_at_different_rates():
    # Row 0 forgets 3 bits per unit and step, the others 1: lanes of their own grow with row 0,
    # shared lanes with the mean. Same bits destroyed, fewer words.
    gen = torch.Generator().manual_seed(0)
    own, shared = InformationBuffer(8, 4, max_bits=3), InformationBuffer(8, 4, max_bits=3, share_rows=True)
    h = _random_state(gen, 8, 40, "cpu")
    z = torch.full((8, 40), FORGET_ONE // 2)
    z[0] = FORGET_ONE // 8
    for _ in range(60):
        own.push_mul(h, z)
        shared.push_mul(h, z)
    assert own.optimal_bits() == pytest.approx(shared.optimal_bits())
    assert shared.allocated_bits() < 0.6 * own.allocated_bits()


def test_edge_values_round_trip(impl):
    device, fused = impl
    extremes = torch.tensor([[-(2 ** 31), 2 ** 31 - 1, -1, 0, 1]], dtype=torch.int32, device=device)
    for z_value in (1, 2, 1023, FORGET_ONE):
        buf = InformationBuffer(1, 5, device=device, fused=fused)
        z = torch.full((1, 5), z_value, device=device)
        h = extremes
        for _ in range(30):
            h = buf.push_mul(h, z)
        for _ in range(30):
            h = buf.pop_div(h, z)
        assert torch.equal(h, extremes) and buf.is_empty()


def test_z_one_is_identity_and_stores_nothing():
    buf = InformationBuffer(2, 3)
    h = torch.tensor([[5, -7, 1 << 30], [-(2 ** 31), 0, 3]], dtype=torch.int32)
    out = buf.push_mul(h, torch.full((2, 3), FORGET_ONE))
    assert torch.equal(out, h) and buf.optimal_bits() == 0.0


def test_masked_lanes_are_bit_for_bit_unchanged_in_the_buffer():
    buf = InformationBuffer(2, 3)
    h = torch.full((2, 3), 12345, dtype=torch.int32)
    buf.push_mul(h, torch.full((2, 3), 7), torch.tensor([True, False]))
    assert buf._curr[1].eq(0).all() and buf._curr[0].ne(0).any()
    shared = InformationBuffer(2, 3, share_rows=True)  # row 1's columns 3..5 of the folded row go to lanes 3..5
    shared.push_mul(h, torch.full((2, 3), 7), torch.tensor([True, False]))
    assert shared._curr[0, 3:].eq(0).all() and shared._curr[0, :3].ne(0).all()


def test_accounting():
    batch, units, steps = 4, 6, 200
    buf = InformationBuffer(batch, units, max_bits=3)
    gen = torch.Generator().manual_seed(0)
    h, expected = _random_state(gen, batch, units, "cpu"), 0.0
    for _ in range(steps):
        z = torch.randint(128, FORGET_ONE + 1, (batch, units), generator=gen)
        mask = torch.rand(batch, generator=gen) < 0.5
        h = buf.push_mul(h, z, mask)
        expected += (-torch.log2(z.double() / FORGET_ONE) * mask[:, None]).sum().item()
    assert buf.optimal_bits() == pytest.approx(expected, rel=1e-12)
    words = buf.word_count()
    assert buf.allocated_bits() == 64 * words * batch * units + 8 * steps  # words + one flag byte per push
    assert buf.optimal_bits() < buf.allocated_bits() <= buf.reserved_bits()
    # all lanes grow with the fastest one, but a word holds at least 53 bits of its fastest lane
    assert (words - 1) * 53 <= 3 * steps + 53


@pytest.mark.parametrize("fused", [True, False])
def test_bad_dtype_shape_device_and_numerators(fused):
    buf = InformationBuffer(2, 3, max_bits=3, fused=fused)
    h = torch.zeros(2, 3, dtype=torch.int32)
    z = torch.full((2, 3), 512)
    with pytest.raises(TypeError, match="int32"):
        buf.push_mul(h.long(), z)
    with pytest.raises(TypeError, match="integer"):
        buf.push_mul(h, z.float())
    with pytest.raises(ValueError, match="shape"):
        buf.push_mul(torch.zeros(3, 3, dtype=torch.int32), torch.full((3, 3), 512))
    with pytest.raises(ValueError, match="shape"):
        buf.push_mul(torch.zeros(2, 0, dtype=torch.int32), torch.full((2, 0), 512))
    with pytest.raises(ValueError, match="shape of h"):
        buf.push_mul(h, torch.full((2, 2), 512))
    with pytest.raises(TypeError, match="bool"):
        buf.push_mul(h, z, torch.ones(2))
    with pytest.raises(ValueError, match="mask"):
        buf.push_mul(h, z, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\[128, 1024\]"):
        buf.push_mul(h, torch.full((2, 3), 127))  # more than the 3 bits this buffer allows
    with pytest.raises(ValueError, match=r"\[128, 1024\]"):
        buf.push_mul(h, torch.full((2, 3), 1025))
    with pytest.raises(ValueError, match=r"\[1, 1024\]"):
        InformationBuffer(2, 3, fused=fused).push_mul(h, torch.zeros(2, 3, dtype=torch.int64))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="device"):
            buf.push_mul(h.cuda(), z.cuda())
    assert buf.pushes == 0  # nothing was half-done by the rejected calls
    # padding lanes may carry any z: they are not multiplied
    buf.push_mul(h, torch.zeros(2, 3, dtype=torch.int64), torch.tensor([False, False]))


@pytest.mark.parametrize("fused", [True, False])
def test_pop_errors(fused):
    buf = InformationBuffer(2, 4, fused=fused)
    h = torch.zeros(2, 4, dtype=torch.int32)
    with pytest.raises(BufferError, match="empty"):
        buf.pop_div(h, torch.full((2, 4), 512))
    buf.push_mul(h, torch.full((2, 4), 512))
    with pytest.raises(BufferError, match="mirror"):
        buf.pop_div(h[:, :3], torch.full((2, 3), 512))
    with pytest.raises(BufferError, match="outside int32"):  # not the output of the push: decodes out of range
        buf.pop_div(torch.full((2, 4), 2 ** 31 - 1, dtype=torch.int32), torch.full((2, 4), 1))


def test_bad_construction():
    with pytest.raises(ValueError):
        InformationBuffer(0, 3)
    with pytest.raises(ValueError):
        InformationBuffer(2, 3, max_bits=4.5)


@pytest.mark.parametrize("share_rows", [False, True])
def test_push_update_is_quantize_round_push_and_add_in_one_call(share_rows):
    from buffers import FixedPointOverflowError, checked_add, quantize_forget, to_fixed

    gen = torch.Generator().manual_seed(4)
    batch, width, stored = 5, 23, 4
    fused, tensor = (InformationBuffer(batch, 6, max_bits=3, fused=f, share_rows=share_rows) for f in (True, False))
    h = _random_state(gen, batch, width, "cpu") >> 4
    history = []
    for _ in range(40):
        z, u = torch.rand(batch, width, generator=gen), torch.randn(batch, width, generator=gen)
        mask = torch.rand(batch, generator=gen) < 0.8
        zq, ui = quantize_forget(z, 3), to_fixed(u) * mask[:, None]
        lossy = torch.where(mask[:, None], (h[:, :stored].long() >> 10) * zq[:, :stored], h[:, :stored].long())
        want = checked_add(torch.cat([lossy.int(), tensor.push_mul(h[:, stored:], zq[:, stored:], mask)], 1), ui)
        got = fused.push_update(h, z, u, mask, stored)
        assert torch.equal(got, want)
        history.append((h, z, u, mask))
        h = got
    assert fused.optimal_bits() == pytest.approx(tensor.optimal_bits(), rel=1e-12)
    for before, z, u, mask in reversed(history):
        back = fused.pop_update(h, z, u, mask, stored)
        assert torch.equal(back[:, stored:], before[:, stored:])  # the stored columns are the caller's to restore
        h = torch.cat([before[:, :stored], back[:, stored:]], 1)
    assert fused.is_empty()

    with pytest.raises(FixedPointOverflowError, match="to_fixed"):
        fused.push_update(h, torch.ones(batch, width), torch.full((batch, width), 300.0), torch.ones(batch, dtype=torch.bool))
    with pytest.raises(BufferError, match="compiled"):
        tensor.push_update(h, torch.ones(batch, width), torch.zeros(batch, width), torch.ones(batch, dtype=torch.bool))
