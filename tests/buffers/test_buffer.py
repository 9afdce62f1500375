import pytest
import torch
from conftest import ALL_BACKENDS, FAST_BACKENDS, HAS_CUDA, HAS_TRITON, assert_same_words
from hypothesis import given, settings
from hypothesis import strategies as st

from buffers import (
    FORGET_ONE,
    NO_FORGET_LIMIT,
    TILE_ROWS,
    BufferError,
    FixedPointOverflowError,
    ForgetLimit,
    InformationBuffer,
    backends,
)
from buffers.fixed import checked_add, quantize_forget, to_fixed

# The backends the CPU can run, compared bit for bit with each other (Triton in its interpreter).
CPU_BACKENDS = ["numba", "torch"] + (["triton"] if HAS_TRITON and not HAS_CUDA else [])


@pytest.fixture(params=ALL_BACKENDS)
def impl(request) -> tuple[str, str]:
    """(device, backend): every backend, Triton interpreted on CPU where there is no GPU."""
    return request.param


@pytest.fixture(params=FAST_BACKENDS)
def fast_impl(request) -> tuple[str, str]:
    return request.param


def _buffer(impl, batch, units, **kwargs) -> InformationBuffer:
    device, backend = impl
    return InformationBuffer(batch, units, device=device, backend=backends.resolve(backend, device), **kwargs)


def _cpu_buffers(batch, units, **kwargs) -> list[InformationBuffer]:
    """One buffer of each backend the CPU runs."""
    return [InformationBuffer(batch, units, backend=backends.resolve(b, "cpu"), **kwargs) for b in CPU_BACKENDS]


#: Forget limits the property tests draw from: all, or a few for the slower tests.
LIMITS = [ForgetLimit(bits) for bits in (1, 2, 3, 5, None)]
FEW_LIMITS = [ForgetLimit(bits) for bits in (1, 3, None)]
THREE_BITS = ForgetLimit(3)


def _steps(impl, steps: int) -> int:
    """Fewer steps in Triton's interpreter (~20 ms a launch), so each test stays within seconds."""
    return min(steps, 10) if impl == ("cpu", "triton") else steps


def _random_state(gen, batch, width, device):
    return torch.randint(-(2 ** 31), 2 ** 31 - 1, (batch, width), generator=gen, dtype=torch.int32).to(device)


def _random_z(gen, shape, zmin, device):
    """Numerators with the edge values 1 (or zmin) and 2^R_Z over-represented."""
    z = torch.randint(zmin, FORGET_ONE + 1, shape, generator=gen)
    edge = torch.rand(shape, generator=gen)
    z = torch.where(edge < 0.1, zmin, z)
    z = torch.where(edge > 0.9, FORGET_ONE, z)
    return z.to(device)


def _random_mask(gen, kind, batch, width, device):
    if kind == "rows":
        return (torch.rand(batch, generator=gen) < 0.8).to(device)
    if kind == "lanes":
        return (torch.rand(batch, width, generator=gen) < 0.8).to(device)
    return None


def _assert_same_words(a: InformationBuffer, b: InformationBuffer) -> None:
    assert_same_words(a, b)
    assert a.optimal_bits() == pytest.approx(b.optimal_bits(), rel=1e-12)


def _run_round_trip(impl, batch, units, steps, seed, limit=NO_FORGET_LIMIT, widths=None, mask_kind="rows",
                    tile_rows=TILE_ROWS):
    """Push `steps` rounds over groups of the given widths, pop them all, compare every state."""
    device = impl[0]
    gen = torch.Generator().manual_seed(seed)
    widths = widths or [units]
    zmin = limit.min_numerator
    buf = _buffer(impl, batch, units, limit=limit, tile_rows=tile_rows)
    states = [_random_state(gen, batch, w, device) for w in widths]
    initial = [s.clone() for s in states]
    history = []
    for _ in range(steps):
        for g, w in enumerate(widths):
            z = _random_z(gen, (batch, w), zmin, device)
            mask = _random_mask(gen, mask_kind, batch, w, device)
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
       limit=st.sampled_from(LIMITS), mask_kind=st.sampled_from(["rows", "lanes", "none"]),
       backend=st.sampled_from(["numba", "torch"]), tile_rows=st.integers(1, 4))
def test_round_trip_property(batch, units, steps, seed, limit, mask_kind, backend, tile_rows):
    _run_round_trip(("cpu", backend), batch, units, steps, seed, limit=limit, mask_kind=mask_kind,
                    tile_rows=tile_rows)


@pytest.mark.skipif(len(CPU_BACKENDS) < 3, reason="triton is not installed, or CUDA runs the real kernels")
@settings(max_examples=6, deadline=None)
@given(batch=st.integers(1, 4), units=st.integers(1, 6), steps=st.integers(1, 10), seed=st.integers(0, 2 ** 31),
       limit=st.sampled_from(FEW_LIMITS), mask_kind=st.sampled_from(["rows", "lanes", "none"]),
       tile_rows=st.integers(1, 4))
def test_round_trip_property_triton_interpreted(batch, units, steps, seed, limit, mask_kind, tile_rows):
    _run_round_trip(("cpu", "triton"), batch, units, steps, seed, limit=limit, mask_kind=mask_kind,
                    tile_rows=tile_rows)


@settings(max_examples=6, deadline=None)
@given(batch=st.integers(1, 5), units=st.integers(1, 9), steps=st.integers(1, 8), seed=st.integers(0, 2 ** 31),
       limit=st.sampled_from(FEW_LIMITS), widths=st.lists(st.integers(1, 25), min_size=1, max_size=2),
       tile_rows=st.integers(1, 4), mask_kind=st.sampled_from(["rows", "lanes", "none"]))
def test_backends_agree_bit_for_bit_on_numerators(batch, units, steps, seed, limit, widths, tile_rows, mask_kind):
    # Several groups of different widths share one buffer; every output, word, the stack, its height
    # and the flags must be the same whatever the backend, after every push and every pop.
    gen = torch.Generator().manual_seed(seed)
    zmin = limit.min_numerator
    bufs = _cpu_buffers(batch, units, limit=limit, tile_rows=tile_rows)
    states = [_random_state(gen, batch, w, "cpu") for w in widths]
    history = []
    for _ in range(steps):
        for g, w in enumerate(widths):
            z, mask = _random_z(gen, (batch, w), zmin, "cpu"), _random_mask(gen, mask_kind, batch, w, "cpu")
            outs = [buf.push_mul(states[g], z, mask) for buf in bufs]
            assert all(torch.equal(out, outs[0]) for out in outs)
            history.append((g, z, mask))
            states[g] = outs[0]
    for buf in bufs[1:]:
        _assert_same_words(buf, bufs[0])
    for g, z, mask in reversed(history):
        outs = [buf.pop_div(states[g], z, mask) for buf in bufs]
        assert all(torch.equal(out, outs[0]) for out in outs)
        states[g] = outs[0]
    assert all(buf.is_empty() for buf in bufs)


@settings(max_examples=6, deadline=None)
@given(batch=st.integers(1, 5), units=st.integers(1, 9), steps=st.integers(1, 6), seed=st.integers(0, 2 ** 31),
       limit=st.sampled_from(FEW_LIMITS), widths=st.lists(st.integers(1, 25), min_size=1, max_size=2),
       tile_rows=st.integers(1, 4), data=st.data())
def test_backends_agree_bit_for_bit_on_updates(batch, units, steps, seed, limit, widths, tile_rows, data):
    # Whole updates h ← z·h + u as the cells make them: float gates (with values that round half-way),
    # padded rows, stored columns that skip the buffer.
    gen = torch.Generator().manual_seed(seed)
    stored = [data.draw(st.integers(0, w)) for w in widths]
    bufs = _cpu_buffers(batch, units, limit=limit, tile_rows=tile_rows)
    states = [_random_state(gen, batch, w, "cpu") >> 3 for w in widths]
    history = []
    for _ in range(steps):
        for g, w in enumerate(widths):
            z = torch.rand(batch, w, generator=gen)
            halfway = (torch.randint(0, FORGET_ONE, (batch, w), generator=gen) + 0.5) / FORGET_ONE
            z = torch.where(torch.rand(batch, w, generator=gen) < 0.2, halfway, z)
            u = torch.randn(batch, w, generator=gen)
            mask = torch.rand(batch, generator=gen) < 0.8
            outs = [buf.push_update(states[g], z, u, mask, stored[g]) for buf in bufs]
            assert all(torch.equal(out, outs[0]) for out in outs)
            history.append((g, z, u, mask, states[g]))
            states[g] = outs[0]
    for buf in bufs[1:]:
        _assert_same_words(buf, bufs[0])
    for g, z, u, mask, before in reversed(history):
        outs = [buf.pop_update(states[g], z, u, mask, stored[g]) for buf in bufs]
        assert all(torch.equal(out, outs[0]) for out in outs)
        assert torch.equal(outs[0][:, stored[g]:], before[:, stored[g]:])
        states[g] = before
    assert all(buf.is_empty() for buf in bufs)


def test_ten_thousand_steps_add_many_words(fast_impl):
    device = fast_impl[0]
    buf = _buffer(fast_impl, 3, 4)
    gen = torch.Generator().manual_seed(1)
    h0 = _random_state(gen, 3, 4, device)
    h, zs, reads = h0, [], {}
    for step in range(1, 10_001):
        zs.append(torch.randint(1, FORGET_ONE + 1, (3, 4), generator=gen).to(device))
        h = buf.push_mul(h, zs[-1], None)
        reads[step] = buf.syncs
    assert buf.heights()[0] > 250  # uniform z* forgets ~1.44 bits a step: ~300 words of 53+ bits were pushed
    # The stack height is read far less often than once a step, and the free margin kept after a read grows with
    # the height, so the reads grow with log(steps): the last 7,500 pushes read less often than the first 2,500
    # (here 74 reads in all, the proven bound outrunning the true height 7-fold with no forget limit).
    assert reads[10_000] < 2 * reads[2_500] and reads[10_000] < 100
    for z in reversed(zs):
        h = buf.pop_div(h, z, None)
    assert torch.equal(h, h0) and buf.is_empty()


def test_a_fixed_room_never_grows_or_reads_and_a_full_one_still_counts_the_height(impl):
    # A fixed room of two levels: pushes never read the device to grow it. Past two overflows of a tile its words
    # are stored nowhere, but the pushes' products (the new states) are those of a buffer with room, and the tile's
    # height still counts every overflow, so settle() tells the caller how much room the pushes needed.
    device = impl[0]
    fixed, growing = _buffer(impl, 5, 2, tile_rows=2, levels=2), _buffer(impl, 5, 2, tile_rows=2)
    gen = torch.Generator().manual_seed(4)
    h_fixed = h_growing = _random_state(gen, 5, 6, device)
    for _ in range(_steps(impl, 60)):
        z = torch.randint(1, 5, (5, 6), generator=gen).to(device)  # 6 to 8 bits forgotten: frequent overflows
        h_fixed, h_growing = fixed.push_mul(h_fixed, z), growing.push_mul(h_growing, z)
        assert torch.equal(h_fixed, h_growing)
    heights = growing.heights()
    assert min(heights) > 2 and fixed.heights() == heights
    assert fixed.syncs == 0 and fixed.capacity == 2 and fixed.words.stack.shape[0] == 3
    assert fixed.settle() == [max(heights)]
    first_two = growing.words.stack[:2].cpu()
    assert torch.equal(fixed.words.stack[:2].cpu(), first_two)  # the levels that fitted hold the same words
    assert fixed.settle(torch.tensor(7, device=device), torch.tensor(-1, device=device)) == [max(heights), 7, -1]


def test_settle_raises_what_the_device_recorded():
    buf = InformationBuffer(2, 3, limit=THREE_BITS, eager_checks=False, levels=4)
    buf.push_mul(torch.ones(2, 3, dtype=torch.int32), torch.full((2, 3), 1, dtype=torch.int64))  # below 3 bits' floor
    with pytest.raises(ValueError, match="forget numerators must lie in"):
        buf.settle()


@pytest.mark.parametrize("tile_rows", [TILE_ROWS, 4])
def test_groups_of_different_widths_share_one_buffer(impl, tile_rows):
    # e.g. h1 with an attention slice (narrower), h2, c1, c2 of a two-layer RevLSTM; 6 rows are one tile, or two
    _run_round_trip(impl, batch=6, units=10, steps=_steps(impl, 80) // 2, seed=3, limit=THREE_BITS,
                    widths=[7, 10, 10, 10, 7, 10], tile_rows=tile_rows)


def test_wide_groups_fold_onto_few_lanes(impl):
    # 150-column halves on a 32-lane buffer: chunks of 32, 32, 32, 32, 22 columns per push
    buf = _run_round_trip(impl, batch=4, units=32, steps=_steps(impl, 30), seed=5, limit=THREE_BITS,
                          widths=[150, 150, 20])
    assert buf.pushes == 0


def test_folding_fills_words_better():
    gen = torch.Generator().manual_seed(0)
    narrow, wide = InformationBuffer(8, 16, limit=THREE_BITS), InformationBuffer(8, 160, limit=THREE_BITS)
    h = _random_state(gen, 8, 160, "cpu")
    for _ in range(40):
        z = _random_z(gen, (8, 160), 128, "cpu")
        narrow.push_mul(h, z)
        wide.push_mul(h, z)
    assert narrow.optimal_bits() == pytest.approx(wide.optimal_bits())
    assert narrow.allocated_bits() < wide.allocated_bits()


def test_small_tiles_waste_fewer_words_when_rows_forget_at_different_rates():
    # Row 0 forgets 3 bits per unit and step, the others 1: in one tile of 8 every row's lanes grow with row 0's,
    # in tiles of one each row's with its own. Same bits destroyed, fewer words.
    gen = torch.Generator().manual_seed(0)
    whole, single = InformationBuffer(8, 4, limit=THREE_BITS), InformationBuffer(8, 4, limit=THREE_BITS, tile_rows=1)
    h = _random_state(gen, 8, 40, "cpu")
    z = torch.full((8, 40), FORGET_ONE // 2)
    z[0] = FORGET_ONE // 8
    for _ in range(60):
        whole.push_mul(h, z)
        single.push_mul(h, z)
    assert whole.optimal_bits() == pytest.approx(single.optimal_bits())
    assert single.words_in_use() < 0.5 * whole.words_in_use()
    assert single.heights()[0] == whole.heights()[0] > 2 * max(single.heights()[1:])
    # ... and a flag bit per push and tile
    assert single.allocated_bits() - 64 * single.words_in_use() == single.pushes * 8  # a flag bit a push and tile


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_tile_never_sees_the_rest_of_the_batch(backend):
    # Two batches whose first tile holds the same sentences and whose other tiles differ (other states, other gates,
    # other padding): the first tile's outputs, words, stack, height and flags are the same bit for bit.
    batch, units, width, stored, tile_rows = 11, 5, 23, 3, 4
    gen = torch.Generator().manual_seed(7)
    bufs = [InformationBuffer(batch, units, limit=THREE_BITS, backend=backends.resolve(backend, "cpu"),
                              tile_rows=tile_rows) for _ in range(2)]
    h = [_random_state(gen, batch, width, "cpu") >> 3 for _ in range(2)]
    h[1][:tile_rows] = h[0][:tile_rows]
    mine = slice(0, tile_rows)
    for _ in range(_steps(("cpu", backend), 30)):
        z = [torch.rand(batch, width, generator=gen) * 0.3 for _ in range(2)]
        u = [torch.randn(batch, width, generator=gen) for _ in range(2)]
        mask = [torch.rand(batch, generator=gen) < 0.7 for _ in range(2)]
        z[0][tile_rows:] = 1.0  # the first batch's other tiles forget nothing ...
        for other in (z, u, mask):
            other[1][mine] = other[0][mine]  # ... and the second's first tile is the first's
        h = [buf.push_update(h[i], z[i], u[i], mask[i], stored) for i, buf in enumerate(bufs)]
        assert torch.equal(h[0][mine], h[1][mine])
    first, second = (buf.words for buf in bufs)
    height = first.heights()[0]
    assert height > 0 and height == second.heights()[0]
    assert first.heights()[1:] == [0, 0] and min(second.heights()[1:]) > 0  # the rest of the batches differ
    assert torch.equal(first.curr[mine], second.curr[mine])
    assert torch.equal(first.stack[:height, mine], second.stack[:height, mine])
    assert torch.equal(first.overflows()[:, 0], second.overflows()[:, 0])


def test_edge_values_round_trip(impl):
    # z* = 1 forgets 10 bits a push: a word overflows every 6 pushes, so slabs are pushed and popped.
    device = impl[0]
    extremes = torch.tensor([[-(2 ** 31), 2 ** 31 - 1, -1, 0, 1]], dtype=torch.int32, device=device)
    for z_value in (1, 2, 1023, FORGET_ONE):
        buf = _buffer(impl, 1, 5)
        z = torch.full((1, 5), z_value, device=device)
        h = extremes
        steps = 30 if z_value == 1 else _steps(impl, 30) // 2
        for _ in range(steps):
            h = buf.push_mul(h, z)
        if z_value == 1:
            assert buf.heights() == [4]  # 300 bits forgotten, 53 to 63 a word: 4 stacked and the live one
        for _ in range(steps):
            h = buf.pop_div(h, z)
        assert torch.equal(h, extremes) and buf.is_empty()


def test_z_one_is_identity_and_stores_nothing():
    buf = InformationBuffer(2, 3)
    h = torch.tensor([[5, -7, 1 << 30], [-(2 ** 31), 0, 3]], dtype=torch.int32)
    out = buf.push_mul(h, torch.full((2, 3), FORGET_ONE))
    assert torch.equal(out, h) and buf.optimal_bits() == 0.0


def test_masked_lanes_are_bit_for_bit_unchanged_in_the_buffer(impl):
    device = impl[0]
    buf = _buffer(impl, 2, 3)
    h = torch.full((2, 3), 12345, dtype=torch.int32, device=device)
    z, rows = torch.full((2, 3), 7, device=device), torch.tensor([True, False], device=device)
    buf.push_mul(h, z, rows)
    assert buf.words.curr[1].eq(0).all() and buf.words.curr[0].ne(0).any()


def test_accounting():
    batch, units, steps = 4, 6, 200
    buf = InformationBuffer(batch, units, limit=THREE_BITS)
    gen = torch.Generator().manual_seed(0)
    h, expected = _random_state(gen, batch, units, "cpu"), 0.0
    for _ in range(steps):
        z = torch.randint(128, FORGET_ONE + 1, (batch, units), generator=gen)
        mask = torch.rand(batch, generator=gen) < 0.5
        h = buf.push_mul(h, z, mask)
        expected += (-torch.log2(z.double() / FORGET_ONE) * mask[:, None]).sum().item()
    assert buf.optimal_bits() == pytest.approx(expected, rel=1e-12)
    words = buf.heights()[0] + 1  # one tile: its stacked words and the live one, in every lane
    assert buf.words_in_use() == words * batch * units
    assert buf.allocated_bits() == 64 * words * batch * units + steps  # words + one flag bit per push
    assert buf.optimal_bits() < buf.allocated_bits() <= buf.reserved_bits()
    # all lanes grow with the fastest one, but a word holds at least 53 bits of its fastest lane
    assert (words - 1) * 53 <= 3 * steps + 53


def test_bad_dtype_shape_device_and_numerators(impl):
    # Errors at the call (eager checks, as on CPU); what CUDA does by default is the next test's.
    device = impl[0]
    buf = _buffer(impl, 2, 3, limit=THREE_BITS, eager_checks=True)
    h = torch.zeros(2, 3, dtype=torch.int32, device=device)
    z = torch.full((2, 3), 512, device=device)
    with pytest.raises(TypeError, match="int32"):
        buf.push_mul(h.long(), z)
    with pytest.raises(TypeError, match="integer"):
        buf.push_mul(h, z.float())
    with pytest.raises(ValueError, match="shape"):
        buf.push_mul(torch.zeros(3, 3, dtype=torch.int32, device=device), torch.full((3, 3), 512, device=device))
    with pytest.raises(ValueError, match="shape"):
        buf.push_mul(torch.zeros(2, 0, dtype=torch.int32, device=device), torch.full((2, 0), 512, device=device))
    with pytest.raises(ValueError, match="shape of h"):
        buf.push_mul(h, torch.full((2, 2), 512, device=device))
    with pytest.raises(TypeError, match="bool"):
        buf.push_mul(h, z, torch.ones(2, device=device))
    with pytest.raises(ValueError, match="mask"):
        buf.push_mul(h, z, torch.ones(3, dtype=torch.bool, device=device))
    with pytest.raises(ValueError, match=r"\[128, 1024\]"):
        buf.push_mul(h, torch.full((2, 3), 127, device=device))  # more than the 3 bits this buffer allows
    with pytest.raises(ValueError, match=r"\[128, 1024\]"):
        buf.push_mul(h, torch.full((2, 3), 1025, device=device))
    with pytest.raises(ValueError, match=r"\[1, 1024\]"):
        _buffer(impl, 2, 3, eager_checks=True).push_mul(h, torch.zeros(2, 3, dtype=torch.int64, device=device))
    other = "cpu" if device == "cuda" else ("cuda" if HAS_CUDA else "meta")
    with pytest.raises(ValueError, match="buffer is on"):
        buf.push_mul(h.to(other), z.to(other))
    ones = torch.ones(2, dtype=torch.bool, device=device)
    with pytest.raises(ValueError, match="float"):
        buf.push_update(h, z, z.float(), ones)
    with pytest.raises(ValueError, match="stored"):
        buf.push_update(h, z.float(), z.float(), ones, stored=4)
    assert buf.pushes == 0  # nothing was half-done by the rejected calls
    # padding lanes may carry any z: they are not multiplied
    buf.push_mul(h, torch.zeros(2, 3, dtype=torch.int64, device=device), torch.tensor([False, False], device=device))


def test_pop_errors(impl):
    device = impl[0]
    buf = _buffer(impl, 2, 4, eager_checks=True)
    h = torch.zeros(2, 4, dtype=torch.int32, device=device)
    with pytest.raises(BufferError, match="empty"):
        buf.pop_div(h, torch.full((2, 4), 512, device=device))
    buf.push_mul(h, torch.full((2, 4), 512, device=device))
    with pytest.raises(BufferError, match="mirror"):
        buf.pop_div(h[:, :3], torch.full((2, 3), 512, device=device))
    with pytest.raises(BufferError, match="outside int32"):  # not the output of the push: decodes out of range
        buf.pop_div(torch.full((2, 4), 2 ** 31 - 1, dtype=torch.int32, device=device),
                    torch.full((2, 4), 1, device=device))


def test_deferred_checks_raise_at_the_next_check(impl):
    # What CUDA does by default: bad input is recorded on the device, and raised by check(),
    # by the next read of the stack height, or by is_empty(); never silently dropped.
    device = impl[0]
    h = torch.zeros(2, 3, dtype=torch.int32, device=device)
    ones = torch.ones(2, dtype=torch.bool, device=device)
    cases = [
        (lambda buf: buf.push_mul(h, torch.full((2, 3), 5, device=device)), ValueError, r"\[128, 1024\]"),
        (lambda buf: buf.push_update(h, torch.ones(2, 3, device=device), torch.full((2, 3), 300.0, device=device),
                                     ones), FixedPointOverflowError, "to_fixed"),
        (lambda buf: buf.push_update(h + (2 ** 31 - 2), torch.ones(2, 3, device=device),
                                     torch.ones(2, 3, device=device), ones), FixedPointOverflowError, "state update"),
    ]
    for call, error, message in cases:
        buf = _buffer(impl, 2, 3, limit=THREE_BITS, eager_checks=False)
        call(buf)  # nothing raised yet
        with pytest.raises(error, match=message):
            buf.check()
        buf.check()  # reported once


@pytest.mark.parametrize("tile_rows", [TILE_ROWS, 2])
def test_push_update_is_quantize_round_push_and_add_in_one_call(impl, tile_rows):
    device = impl[0]
    gen = torch.Generator().manual_seed(4)
    batch, width, stored = 5, 23, 4
    buf = _buffer(impl, batch, 6, limit=THREE_BITS, tile_rows=tile_rows)
    reference = InformationBuffer(batch, 6, limit=THREE_BITS, backend=backends.resolve("torch", "cpu"),
                                  tile_rows=tile_rows)
    h = _random_state(gen, batch, width, "cpu") >> 4
    history = []
    for _ in range(_steps(impl, 40)):
        z, u = torch.rand(batch, width, generator=gen), torch.randn(batch, width, generator=gen)
        mask = torch.rand(batch, generator=gen) < 0.8
        zq, ui = quantize_forget(z, THREE_BITS), to_fixed(u) * mask[:, None]
        lossy = torch.where(mask[:, None], (h[:, :stored].long() >> 10) * zq[:, :stored], h[:, :stored].long())
        want = checked_add(torch.cat([lossy.int(), reference.push_mul(h[:, stored:], zq[:, stored:], mask)], 1), ui)
        got = buf.push_update(h.to(device), z.to(device), u.to(device), mask.to(device), stored)
        assert torch.equal(got.cpu(), want)
        history.append((h, z, u, mask))
        h = want
    assert buf.optimal_bits() == pytest.approx(reference.optimal_bits(), rel=1e-12)
    for before, z, u, mask in reversed(history):
        back = buf.pop_update(h.to(device), z.to(device), u.to(device), mask.to(device), stored).cpu()
        assert torch.equal(back[:, stored:], before[:, stored:])  # the stored columns are the caller's to restore
        h = torch.cat([before[:, :stored], back[:, stored:]], 1)
    assert buf.is_empty()

    with pytest.raises(FixedPointOverflowError, match="to_fixed"):  # raised on CUDA by the check, not the call
        buf.push_update(h.to(device), torch.ones(batch, width, device=device),
                        torch.full((batch, width), 300.0, device=device),
                        torch.ones(batch, dtype=torch.bool, device=device))
        buf.check()


def test_backend_choice_is_checked():
    assert backends.resolve("auto", "cpu").name == "numba"
    assert backends.resolve("auto", "cuda").name == ("triton" if HAS_TRITON else "torch")
    assert backends.resolve("torch", "cuda").name == "torch"
    assert backends.resolve("torch", "cpu") is backends.by_name("torch")  # backends hold no state: one object each
    assert backends.CHOICES == ("auto", *backends.NAMES)
    with pytest.raises(ValueError, match="unknown buffer backend"):
        backends.resolve("cuda", "cpu")
    with pytest.raises(ValueError, match="CPU only"):
        backends.resolve("numba", "cuda")
    with pytest.raises(ValueError, match="CPU only"):  # a backend object is checked against the buffer's device
        InformationBuffer(2, 3, device="meta", backend=backends.by_name("numba"))


def test_a_buffer_takes_its_backend_as_given(monkeypatch):
    backend = backends.resolve("torch", "cpu")
    monkeypatch.setattr(backends, "resolve", None)  # no name is resolved again
    assert InformationBuffer(2, 3, backend=backend).backend is backend


@pytest.mark.skipif(len(CPU_BACKENDS) < 3, reason="triton is not installed, or CUDA runs the real kernels")
def test_triton_walks_a_tile_of_several_blocks_bit_for_bit():
    # The Triton walks take a tile's lanes in blocks of 4,096: a tile of 300 rows of 16 lanes is two, and lane (r, k)
    # always holds row r. Only the rows past 256 (the second block) forget, so only that block's words overflow:
    # each chunk's decision must be a reduction over every block, and every block must push and pop with it.
    batch, units, width, stored = 300, 16, 40, 5
    gen = torch.Generator().manual_seed(0)
    bufs = _cpu_buffers(batch, units, eager_checks=False, tile_rows=batch)
    forgets = torch.arange(batch)[:, None] >= 256
    h, history = _random_state(gen, batch, width, "cpu") >> 3, []
    for _ in range(6):
        z = torch.where(forgets, torch.rand(batch, width, generator=gen) * 0.01, 1.0)
        u, mask = torch.randn(batch, width, generator=gen), torch.rand(batch, generator=gen) < 0.9
        outs = [buf.push_update(h, z, u, mask, stored) for buf in bufs]
        assert all(torch.equal(out, outs[0]) for out in outs)
        history.append((z, u, mask, h))
        h = outs[0]
    assert bufs[0].heights()[0] > 0  # the tile overflowed onto its stack
    for buf in bufs[1:]:
        _assert_same_words(buf, bufs[0])
    for z, u, mask, before in reversed(history):
        outs = [buf.pop_update(h, z, u, mask, stored) for buf in bufs]
        assert all(torch.equal(out, outs[0]) for out in outs)
        assert torch.equal(outs[0][:, stored:], before[:, stored:])
        h = before
    for buf in bufs:
        buf.check()
        assert buf.is_empty()


def test_triton_needs_cuda_or_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET|triton package"):
        backends.resolve("triton", "cpu")


def test_a_fused_call_must_obey_the_buffers_forget_limit():
    # A fused kernel clamps its numerators to the limit it is given, and the buffer sizes its stack by its own.
    buf = InformationBuffer(2, 3, limit=THREE_BITS)
    buf.plan_push((3, 0), limit=ForgetLimit(3)).done(0.0)
    with pytest.raises(ValueError, match=r"under ForgetLimit\(bits=5\) on a buffer made for ForgetLimit\(bits=3\)"):
        buf.plan_push((3, 0), limit=ForgetLimit(5))
    with pytest.raises(ValueError, match=r"under ForgetLimit\(bits=1\)"):
        buf.plan_pop((3, 0), limit=ForgetLimit(1))
    buf.plan_pop((3, 0), limit=THREE_BITS).done()
    assert buf.pushes == 0


def test_bad_construction():
    with pytest.raises(ValueError):
        InformationBuffer(0, 3)
    with pytest.raises(ValueError, match="levels >= 0"):
        InformationBuffer(2, 3, levels=-1)
    with pytest.raises(ValueError):
        InformationBuffer(2, 3, limit=ForgetLimit(4))
