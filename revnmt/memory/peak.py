"""The memory a ``--memory-budget`` bounds, measured where a user feels it.

On CPU that is the process's resident set (RSS), as the operating system and a container's memory
limit see it: its high-water mark, ``VmHWM`` in ``/proc/self/status``, which Linux resets to the
current RSS when ``5`` is written to ``/proc/self/clear_refs``. On CUDA it is the caching
allocator's reserved memory on the device, what an out-of-memory error depends on (allocated
bytes plus the cache the allocator keeps).

A freed tensor leaves the RSS only when the C allocator gives its pages back to the system. glibc
keeps freed chunks below its mmap threshold for reuse, and raises that threshold as large chunks
are freed, so a training process's RSS can stay at the largest step it ever took plus whatever the
heap held before it. :func:`release_free_memory` trims the heap before each measurement, and
:func:`track_freed_memory` pins the threshold so that tensors larger than it always go back to the
system when freed: then the RSS follows what is alive, and a step's measured peak is what the same
step will take again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import torch

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")
_M_MMAP_THRESHOLD = -3  # mallopt parameter number in glibc's malloc.h
_MMAP_THRESHOLD = 1 << 20  # tensors of 1 MiB and more are mapped, and unmapped when freed


@lru_cache(maxsize=None)
def _libc() -> ctypes.CDLL | None:
    """glibc, when this process runs on it (malloc_trim and mallopt are glibc's)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


def track_freed_memory() -> None:
    """Make freed tensors of 1 MiB or more leave the RSS at once (glibc; elsewhere nothing changes)."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)


@contextmanager
def measuring_many() -> Iterator[None]:
    """For a series of measurements (a budget's probes): what lives when it starts is set aside from Python's
    cyclic garbage collector (``gc.freeze``) until it ends, so that each :func:`release_free_memory` scans only
    what the steps made since. A full collection walks every object of a process that imported torch, some
    300,000 of them, and takes longer than a small step. Set aside is not kept alive: at the end the objects go
    back to the collector's oldest generation."""
    global _measuring
    if _measuring == 0:
        gc.collect()
        gc.freeze()
    _measuring += 1
    try:
        yield
    finally:
        _measuring -= 1
        if _measuring == 0:
            gc.unfreeze()


_measuring = 0  # how many measuring_many() are open: only the outermost freezes and unfreezes


def release_free_memory(device: torch.device) -> None:
    """Give back what is free: Python garbage, the C heap's free pages, the CUDA allocator's cache."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    _trim_heap()


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def _status_bytes(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None


class PeakMeter:
    """Current and peak memory of what the budget bounds on ``device``, with a resettable peak.

    CPU: the process's RSS and its high-water mark (Linux; elsewhere ``ru_maxrss``, which cannot be
    reset). CUDA: the allocator's reserved bytes and their peak.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.what = "CUDA reserved" if self.device.type == "cuda" else "RSS"
        self.resettable = self.device.type == "cuda" or _CLEAR_REFS.exists()

    def current(self) -> int:
        """Bytes held now."""
        if self.device.type == "cuda":
            return torch.cuda.memory_reserved(self.device)
        rss = _status_bytes("VmRSS")
        return rss if rss is not None else self.peak()

    def live(self) -> int:
        """Bytes in use now, which the next step cannot have: on CUDA the allocator's allocated bytes (the free
        blocks it caches beside them are the next step's to reuse, so what :meth:`current` holds above this is no
        loss of room), on CPU the resident memory once the C heap has given back its free pages (chunks below the
        mmap threshold stay in the heap when freed, a step's worth of them, until it is trimmed; a millisecond or
        two)."""
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device)
        _trim_heap()
        return self.current()

    def peak(self) -> int:
        """The most bytes held since the last :meth:`reset` (or since the process started)."""
        if self.device.type == "cuda":
            return torch.cuda.max_memory_reserved(self.device)
        hwm = _status_bytes("VmHWM")
        return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def capacity(self) -> int | None:
        """What there is to hold at most: the machine's physical memory (CPU), the device's (CUDA); None
        where it cannot be read. A container's limit may be lower."""
        if self.device.type == "cuda":
            return torch.cuda.get_device_properties(self.device).total_memory
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None

    def reset(self) -> None:
        """Start a new peak from what is held now."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.resettable:
            _CLEAR_REFS.write_text("5")
