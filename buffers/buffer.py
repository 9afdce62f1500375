"""The information buffer: where a reversible RNN keeps the bits that forgetting destroys.

:class:`InformationBuffer` is the front: it checks arguments, keeps the stack large enough and the
pops in mirror order (:class:`~buffers.words.WordStack`, where the layout is described), and hands
the arithmetic to a backend (:mod:`buffers.backends`: compiled CPU loops, tensor ops, or Triton
kernels), given to it ready made: a caller that makes a buffer per batch resolves the backend once.
All backends give the same words and states bit for bit.
"""

from __future__ import annotations

import torch

from . import backends
from .backends import BufferBackend
from .fixed import FORGET_ONE, NO_FORGET_LIMIT, ForgetLimit
from .plans import PopPlan, PushPlan, SliceUpdate
from .words import BAD_NUMERATOR, TILE_ROWS, BufferError, WordStack, numerator_message


class InformationBuffer:
    """Stacks of int64 words, one per (batch row, unit) lane, for exactly reversible multiplication.

    Args:
        batch: rows of every tensor pushed.
        units: lanes per row. A state group narrower than this uses the first lanes, a wider one
            is pushed onto them in chunks of ``units`` columns, so groups of any width can share one buffer.
        device: where the words live.
        limit: the most bits a push may forget (z* ≥ ``limit.min_numerator``); no limit but R_Z by default.
            A tighter limit lets the host read the stack heights less often. Numerators below it are rejected.
        backend: what runs the arithmetic, :func:`buffers.backends.resolve` of a name and this device (checked
            here to run on it); None: ``"auto"`` resolved (numba on CPU; triton on CUDA where importable, else
            torch). Same results bit for bit.
        tile_rows: sentences per tile (see :mod:`buffers.words`): a tile's lanes overflow together, onto a
            stack of the tile's own, and tiles never see each other's words. Larger tiles waste more words on
            rows that forget less than the tile's fullest (or are padding); on a GPU a tile is one program's work.
        levels: stack levels for a caller that knows its pushes ahead (a sweep): the stack keeps this room, and
            never reads the device to grow it; :meth:`settle` then says whether it held (see :mod:`buffers.words`).
            None: the stack grows as it fills, reading the heights on the host when it might be full.
        eager_checks: raise bad input at once, reading an error flag on the host after every call
            (default on CPU, where that costs nothing), or keep it on the device until the next host
            read that the stack needs anyway, or :meth:`check` (default elsewhere: a read per call
            would stall CUDA every time step).
    """

    def __init__(self, batch: int, units: int, device: torch.device | str | None = None,
                 limit: ForgetLimit = NO_FORGET_LIMIT, backend: BufferBackend | None = None,
                 tile_rows: int = TILE_ROWS, levels: int | None = None, eager_checks: bool | None = None) -> None:
        if batch < 1 or units < 1 or tile_rows < 1 or (levels is not None and levels < 0):
            raise ValueError(f"InformationBuffer needs batch, units and tile_rows >= 1 and levels >= 0, got {batch}, "
                             f"{units}, {tile_rows}, {levels}")
        # canonical, as tensors report it ("cuda" becomes "cuda:0"), so the device checks compare like with like
        self.device = torch.empty(0, device=device if device is not None else "cpu").device
        if backend is None:
            backend = backends.resolve("auto", self.device)
        else:
            backend.check_device(self.device)
        self.backend = backend
        self.batch, self.units = batch, units
        eager = self.device.type == "cpu" if eager_checks is None else eager_checks
        self.words = WordStack(batch, units, self.device, limit, tile_rows, eager, levels)

    # ------------------------------------------------------------------ the update (the per-step API)

    def push_update(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, mask: torch.Tensor,
                    stored: int = 0) -> torch.Tensor:
        """h ← z·h + u, exactly reversible, in one backend call.

        The same bit for bit as ``quantize_forget``, ``to_fixed``, :meth:`push_mul` and
        ``checked_add`` in turn. ``h`` is int32 [batch, w]; ``z`` (the forget gate, in [0, 1]) and
        ``u`` (the additive term) are floats of that shape; ``mask`` bool [batch] leaves padded
        rows unchanged, in h and in the buffer. The first ``stored`` columns are kept exactly
        elsewhere (e.g. an attention slice): they take the plain floor product and skip the buffer.
        """
        self._check_update("push_update", h, z, u, mask, stored)
        plan = PushPlan(self.words, [(h.shape[1], stored)])
        out, lost = self.backend.push_update(self.words, h, z, u, mask, stored, plan.flags[0])
        plan.done(lost)
        return out

    def pop_update(self, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, mask: torch.Tensor,
                   stored: int = 0) -> torch.Tensor:
        """The exact inverse of the matching :meth:`push_update`, but for the first ``stored`` columns,
        which hold h − u: the caller restores them from where they were kept."""
        self._check_update("pop_update", h, z, u, mask, stored)
        plan = PopPlan(self.words, [(h.shape[1], stored)])
        out = self.backend.pop_update(self.words, h, z, u, mask, stored, plan.flags[0])
        plan.done()
        return out

    # ------------------------------------------------------------------ fused updates (buffers.plans)

    def plan_push(self, *updates: SliceUpdate, limit: ForgetLimit) -> PushPlan:
        """The books of a fused call that pushes ``updates`` ((width, stored) each, in push order) of gates
        under ``limit``: the stack made large enough, each update's first flag, and :meth:`PushPlan.done` to
        record them."""
        self._check_limit(limit)
        return PushPlan(self.words, updates)

    def plan_pop(self, *updates: SliceUpdate, limit: ForgetLimit) -> PopPlan:
        """The books of a fused call that pops ``updates`` (given in push order) of gates under ``limit``,
        checked to mirror the last pushes: each update's first flag, and :meth:`PopPlan.done` to record the
        pops."""
        self._check_limit(limit)
        return PopPlan(self.words, updates)

    # ------------------------------------------------------------------ Algorithm 1 on numerators

    def push_mul(self, h: torch.Tensor, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Return h·z/2^R_Z (int32), storing the bits the product loses.

        ``h`` is int32 [batch, w], ``z`` integer numerators of the same shape in
        [``limit.min_numerator``, 2^R_Z], ``mask`` bool [batch] or [batch, w]: False leaves a lane (padding)
        bit-for-bit unchanged, in ``h`` and in the buffer. A group narrower than the buffer uses
        its first lanes; a wider one is pushed onto the lanes in chunks of ``units`` columns, one
        push per chunk, so that few lanes fill whole words instead of many lanes holding a
        mostly empty one each.
        """
        zl, active = self._numerators("push_mul", h, z, mask)
        plan = PushPlan(self.words, [(h.shape[1], 0)])
        out, lost = self.backend.push_mul(self.words, h, zl, active, plan.flags[0])
        plan.done(lost)
        return out

    def pop_div(self, h: torch.Tensor, z: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """The exact inverse of the matching (last unpopped) :meth:`push_mul`; same z and mask."""
        zl, active = self._numerators("pop_div", h, z, mask)
        plan = PopPlan(self.words, [(h.shape[1], 0)])
        out = self.backend.pop_div(self.words, h, zl, active, plan.flags[0])
        plan.done()
        return out

    # ------------------------------------------------------------------ state and accounting

    @property
    def pushes(self) -> int:
        """Pushes (one per chunk of lanes) not yet popped."""
        return self.words.pushes

    @property
    def syncs(self) -> int:
        """Host reads of the stack height so far (see :mod:`buffers.words`)."""
        return self.words.syncs

    def reserve_pushes(self, pushes: int) -> None:
        """Make room in the overflow-flag log for ``pushes`` more pushes at once: a caller that knows how many
        it will make (a sweep knows its length) saves the log's doublings, a copy each. The flags are a byte per
        push; the words are still sized as they fill."""
        self.words.reserve_flags(pushes)

    def check(self) -> None:
        """Raise bad input recorded on the device since the last check (one host read)."""
        self.words.check()

    @property
    def capacity(self) -> int:
        """Stack levels each tile may fill now (a fixed room's ``levels``)."""
        return self.words.capacity

    def settle(self, *scalars: torch.Tensor) -> list[int]:
        """After a sweep: raise bad input recorded on the device, else return the highest tile's stack height (then
        the values of any integer device ``scalars`` passed), one host read of them all. A height above
        :attr:`capacity` means a fixed room was too small and its pushes lost words: the sweep must run again
        with at least that room."""
        return self.words.settle(*scalars)

    def to_settle(self, *scalars: torch.Tensor) -> list[torch.Tensor]:
        """:meth:`settle`'s reads as device scalars, for a caller that reads several buffers' in one host read and
        passes each its values (:meth:`conclude`)."""
        return self.words.to_settle(*scalars)

    def conclude(self, values: list[int]) -> list[int]:
        """:meth:`settle` from values read already (those :meth:`to_settle` named): raise bad input, else return
        the height and the scalars' values."""
        return self.words.conclude(values)

    def live_words(self) -> torch.Tensor:
        """Live words not zero, a device scalar (no host read): 0, with every height 0 and no push left, is
        an empty buffer."""
        return self.words.curr.count_nonzero()

    def is_empty(self) -> bool:
        """True when every push has been popped and every word is back to zero (one host sync)."""
        return self.words.is_empty()

    def heights(self) -> list[int]:
        """Each tile's stack height: its words per lane in use but the live one (one host sync)."""
        return self.words.heights()

    def words_in_use(self) -> int:
        """Words in use over all lanes: each tile's stacked ones plus its live one (one host sync)."""
        return self.words.words_in_use()

    def allocated_bits(self) -> int:
        """Bits of information storage in use: every lane's words plus the overflow log.

        This counts words that hold (or are ready to hold) forgotten bits; spare stack slots
        allocated ahead of need are in :meth:`reserved_bits`. The overflow flags count 8 bits each (a byte per push
        and tile).
        """
        return self.words.allocated_bits()

    def reserved_bits(self) -> int:
        """Bits of device memory the buffer's tensors occupy, spare capacity and bookkeeping included."""
        return self.words.reserved_bits()

    def optimal_bits(self) -> float:
        """Σ −log2(z* / 2^R_Z) over active lanes of the pushes not yet popped: the information
        the multiplications destroyed, hence the least any exact scheme must store."""
        return self.words.optimal_bits()

    # ------------------------------------------------------------------ argument checks

    def _check_limit(self, limit: ForgetLimit) -> None:
        """A fused call clamps its numerators to its own limit: it must be the buffer's, which sizes the stack."""
        if limit is not self.words.limit and limit != self.words.limit:  # one object per stack: no field compare
            raise ValueError(f"a fused update under {limit} on a buffer made for {self.words.limit}: the buffer "
                             "sizes its stack by its own limit, which the update must share")

    def _check_update(self, op: str, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, mask: torch.Tensor,
                      stored: int) -> None:
        if not isinstance(h, torch.Tensor) or h.dtype != torch.int32 or h.dim() != 2 or h.shape[0] != self.batch:
            raise ValueError(f"{op}: h must be an int32 tensor [{self.batch}, width]")
        if z.shape != h.shape or u.shape != h.shape or not (z.dtype.is_floating_point and u.dtype.is_floating_point):
            raise ValueError(f"{op}: z and u must be float tensors of h's shape {list(h.shape)}")
        if mask.dtype != torch.bool or mask.shape != (self.batch,):
            raise ValueError(f"{op}: mask must be a bool tensor [{self.batch}]")
        if not 0 <= stored <= h.shape[1]:
            raise ValueError(f"{op}: stored must be in [0, {h.shape[1]}], got {stored}")
        self._check_devices(op, h=h, z=z, u=u, mask=mask)

    def _check_devices(self, op: str, **tensors: torch.Tensor) -> None:
        for name, t in tensors.items():
            if t.device != self.device:
                raise ValueError(f"{op}: {name} is on {t.device} but the buffer is on {self.device}")

    def _numerators(self, op: str, h: torch.Tensor, z: torch.Tensor, mask: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Checked arguments of push_mul/pop_div: z as int64 with padded lanes set to 2^R_Z (a no-op, so
        padding needs no valid z), and the active lanes [batch, width] (None: all)."""
        if not isinstance(h, torch.Tensor) or h.dtype != torch.int32:
            raise TypeError(f"{op}: h must be an int32 fixed-point tensor, got {getattr(h, 'dtype', type(h))}")
        if not isinstance(z, torch.Tensor) or z.dtype.is_floating_point or z.dtype.is_complex or z.dtype == torch.bool:
            raise TypeError(f"{op}: z must be an integer tensor of numerators, got {getattr(z, 'dtype', type(z))}")
        if h.dim() != 2 or h.shape[0] != self.batch or h.shape[1] == 0:
            raise ValueError(f"{op}: h must have shape [{self.batch}, width], got {list(h.shape)}")
        if z.shape != h.shape:
            raise ValueError(f"{op}: z must have the shape of h {list(h.shape)}, got {list(z.shape)}")
        self._check_devices(op, h=h, z=z, **({} if mask is None else {"mask": mask}))
        zl, active = z.long(), None
        if mask is not None:
            if mask.dtype != torch.bool:
                raise TypeError(f"{op}: mask must be a bool tensor, got {mask.dtype}")
            if mask.shape == (self.batch,):
                mask = mask.unsqueeze(1)
            elif mask.shape != h.shape:
                raise ValueError(f"{op}: mask must have shape [{self.batch}] or {list(h.shape)}, "
                                 f"got {list(mask.shape)}")
            active = mask.expand_as(h)
            zl = torch.where(mask, zl, FORGET_ONE)
        min_numerator = self.words.limit.min_numerator
        bad = (zl < min_numerator) | (zl > FORGET_ONE)
        if self.words.eager_checks:
            if bool(bad.any()):  # before anything is pushed: a rejected call changes nothing
                raise ValueError(numerator_message(min_numerator))
        else:
            self.words.record_error(bad, BAD_NUMERATOR)
        return zl.clamp(min_numerator, FORGET_ONE), active


__all__ = ["BufferError", "InformationBuffer"]
