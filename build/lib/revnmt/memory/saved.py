"""Measure the activation memory autograd keeps for backward, via saved-tensor hooks."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from types import TracebackType

import torch
from torch.autograd.graph import saved_tensors_hooks

# A storage is identified by its device and address: CPU and CUDA addresses may coincide.
StorageKey = tuple[torch.device, int]


def _storage_key(tensor: torch.Tensor) -> StorageKey:
    return tensor.device, tensor.untyped_storage().data_ptr()


class _Saved:
    """What the graph holds instead of a saved tensor; its death means the graph let go of it."""

    __slots__ = ("tensor", "_meter", "_key")

    def __init__(self, tensor: torch.Tensor, meter: SavedTensorMeter, key: StorageKey) -> None:
        # Detached: an op's saved output would otherwise hold, through its grad_fn, the graph node
        # that holds this holder: a cycle through C++ that the garbage collector cannot see, so
        # the graph would never be freed. Autograd reattaches the grad_fn on unpacking.
        self.tensor = tensor.detach()
        self._meter = meter
        self._key = key

    def __del__(self) -> None:
        self._meter._release(self._key)


class SavedTensorMeter:
    """Counts the bytes of the tensors autograd saves for backward while the context is active.

    What it measures: every tensor an op saves for its backward (including tensors given to
    ``ctx.save_for_backward``) is charged its whole storage, once per storage however many
    ops or views save it, since a saved view keeps its entire storage alive. Storages of the
    ``exclude`` tensors (pass ``model.parameters()``) are not charged: ``mm`` saves its weight,
    but the weight is not an activation. The exclusion is by storage address captured at
    construction, so build the meter after moving the model to its device.

    - ``live_bytes``: saved storages some graph still references. It falls when a graph is
      freed (by ``backward()`` or by dropping its outputs), also after the context has exited.
    - ``peak_bytes``: the largest ``live_bytes`` seen.
    - ``total_bytes``: everything charged while active; a storage saved again after every graph
      holding it was freed is charged again.

    Blind spots: tensors kept outside autograd's saved tensors are invisible, e.g. attributes
    set on ``ctx`` or state held in Python objects (such as the information buffers of a
    reversible RNN); count those explicitly. So are temporaries that are never saved,
    gradients, optimizer state and allocator overhead: this is not the process's peak memory.
    Graphs built under inner ``saved_tensors_hooks`` (e.g. non-reentrant
    ``torch.utils.checkpoint``) are hidden, since only the innermost hooks apply.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._excluded = {_storage_key(tensor) for tensor in exclude}
        self.total_bytes = 0
        self.live_bytes = 0
        self.peak_bytes = 0
        # Storage -> [number of live _Saved holders, bytes]. A holder keeps its storage alive,
        # so a key cannot be reused by a new allocation while it is in here.
        self._live: dict[StorageKey, list[int]] = {}
        # CUDA backward runs on autograd's own threads, which free graphs (and holders) there.
        self._lock = threading.Lock()
        self._hooks: saved_tensors_hooks | None = None

    def __enter__(self) -> SavedTensorMeter:
        self._hooks = saved_tensors_hooks(self._pack, _unpack)
        self._hooks.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._hooks is not None
        self._hooks.__exit__(exc_type, exc, traceback)
        self._hooks = None

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor | _Saved:
        key = _storage_key(tensor)
        if key in self._excluded:
            return tensor
        with self._lock:
            entry = self._live.get(key)
            if entry is None:
                nbytes = tensor.untyped_storage().nbytes()
                self._live[key] = [1, nbytes]
                self.total_bytes += nbytes
                self.live_bytes += nbytes
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            else:
                entry[0] += 1
        return _Saved(tensor, self, key)

    def _release(self, key: StorageKey) -> None:
        with self._lock:
            entry = self._live[key]
            entry[0] -= 1
            if entry[0] == 0:
                del self._live[key]
                self.live_bytes -= entry[1]


def _unpack(packed: torch.Tensor | _Saved) -> torch.Tensor:
    return packed.tensor if isinstance(packed, _Saved) else packed
