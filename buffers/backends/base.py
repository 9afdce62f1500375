"""What every buffer backend implements (:class:`BufferBackend`); the backends themselves are listed and
chosen in :mod:`buffers.backends`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from ..words import WordStack


class BufferBackend(ABC):
    """The per-step operations of an information buffer.

    The buffer front (:class:`~buffers.InformationBuffer`) checks arguments, reserves stack slots
    and records widths; a backend only computes, reading and writing the words in place. Errors
    found on the device go to ``words.status`` (see :mod:`buffers.words`).

    ``push_mul``/``pop_div`` take a group [batch, width], int64 numerators already checked and ``active``
    [batch, width] (or None: all lanes); ``push_update``/``pop_update`` take a whole update of [batch, width]
    (float z and u, row mask [batch], the first ``stored`` columns skipping the buffer). The push of a
    group writes flag rows ``first_flag, first_flag + 1, ...`` (one flag per tile); its pop reads the same.
    Pushes return (output, bits destroyed over active lanes, as a float or a device scalar).
    """

    name: ClassVar[str]

    @abstractmethod
    def check_device(self, device: torch.device) -> None:
        """Raise ValueError unless this backend runs on ``device``."""

    @abstractmethod
    def push_mul(self, words: WordStack, h: torch.Tensor, zl: torch.Tensor, active: torch.Tensor | None,
                 first_flag: int) -> tuple[torch.Tensor, torch.Tensor | float]: ...

    @abstractmethod
    def pop_div(self, words: WordStack, h: torch.Tensor, zl: torch.Tensor, active: torch.Tensor | None,
                first_flag: int) -> torch.Tensor: ...

    @abstractmethod
    def push_update(self, words: WordStack, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, mask: torch.Tensor,
                    stored: int, first_flag: int) -> tuple[torch.Tensor, torch.Tensor | float]: ...

    @abstractmethod
    def pop_update(self, words: WordStack, h: torch.Tensor, z: torch.Tensor, u: torch.Tensor, mask: torch.Tensor,
                   stored: int, first_flag: int) -> torch.Tensor: ...
