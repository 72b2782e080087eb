"""The caches sparse MLA attention reads, as one ``[pages, page_size, width]`` view each.

- The packed 656-byte FP8 cache (``fp8mla.dsa.layout``; uint8, int8 or float8_e4m3fn): ``[pages,
  page_size, 656]``, ``[pages, page_size, 1, 656]`` or ``[slots, 1, 656]``.
- A 16-bit cache of the same tokens (bf16 or fp16, 576 values: 512 latent, 64 RoPE), as engines
  with an unquantized DSA cache hold it: ``[slots, 576]``, ``[slots, 1, 576]``, ``[pages,
  page_size, 576]`` or ``[pages, page_size, 1, 576]``.

A token is named by its global slot id ``page * page_size + offset``. :func:`sparse_cache`
checks the shape and dtype and returns a :class:`SparseCache`: the view, where a kernel finds a
slot's row, and the rows of given slots dequantized (the reference and the PyTorch path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mla.dsa.layout import (
    GROUP,
    NOPE_DIM,
    ROPE_DIM,
    ROPE_OFFSET,
    SCALE_OFFSET,
    TOKEN_BYTES,
    slot_addressing,
    token_view,
)

WIDTH_16BIT = NOPE_DIM + ROPE_DIM  # values per token of a 16-bit cache (576)
DTYPES_16BIT = (torch.bfloat16, torch.float16)
PACKED_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)


@dataclass(frozen=True)
class SparseCache:
    """A cache read as ``data [pages, page_size, width]`` (a view of the caller's tensor):
    uint8 rows of 656 bytes when ``packed``, else 16-bit rows of 576 values."""

    data: torch.Tensor
    packed: bool

    @property
    def page_size(self) -> int:
        return self.data.shape[1]

    @property
    def num_slots(self) -> int:
        """Slot ids ``[0, num_slots)`` name a token of the cache."""
        return self.data.shape[0] * self.data.shape[1]

    @property
    def dtype(self) -> torch.dtype:
        """What the kernel's latent dots read: uint8 (packed) or the 16-bit dtype."""
        return self.data.dtype

    def addressing(self) -> tuple[int, int, int]:
        """:func:`fp8mla.dsa.layout.slot_addressing` of the view."""
        return slot_addressing(self.data)

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        """The rows of ``slots`` (int64, each in ``[0, num_slots)``): ``[N, width]``."""
        size = self.page_size
        return self.data[slots // size, slots % size]

    def dequantize(
        self, slots: torch.Tensor, dtype: torch.dtype = torch.float64
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(latent [N, 512], rope [N, 64])`` of ``slots`` in ``dtype``: packed values are
        ``e4m3 × scale[i // 128]`` and the bf16 RoPE part as stored."""
        rows = self.rows(slots)
        if not self.packed:
            return rows[:, :NOPE_DIM].to(dtype), rows[:, NOPE_DIM:].to(dtype)
        codes = rows[:, :NOPE_DIM].view(torch.float8_e4m3fn).float().to(dtype)
        scales = rows[:, SCALE_OFFSET:ROPE_OFFSET].contiguous().view(torch.float32).to(dtype)
        latent = (codes.unflatten(-1, (-1, GROUP)) * scales[..., None]).flatten(-2)
        rope = rows[:, ROPE_OFFSET:TOKEN_BYTES].contiguous().view(torch.bfloat16).to(dtype)
        return latent, rope


def sparse_cache(cache: torch.Tensor) -> SparseCache:
    """``cache`` as a :class:`SparseCache`; ``ValueError`` naming what is wrong."""
    if not isinstance(cache, torch.Tensor):
        raise ValueError(f"expected the cache as a torch.Tensor, got {type(cache).__name__}")
    if cache.dtype in PACKED_DTYPES:
        return SparseCache(token_view(cache).data, packed=True)
    if cache.dtype not in DTYPES_16BIT:
        names = ", ".join(str(d).removeprefix("torch.") for d in PACKED_DTYPES + DTYPES_16BIT)
        raise ValueError(f"expected the cache's dtype in ({names}), got {cache.dtype}")
    shape = list(cache.shape)
    if shape[-1:] != [WIDTH_16BIT]:
        raise ValueError(
            f"expected a 16-bit cache of shape [slots, {WIDTH_16BIT}], [slots, 1, {WIDTH_16BIT}]"
            f", [pages, page_size, {WIDTH_16BIT}] or [pages, page_size, 1, {WIDTH_16BIT}], got "
            f"{shape}"
        )
    if cache.dim() == 2:
        data = cache[None]
    elif cache.dim() == 3 and shape[1] == 1:  # [slots, 1, 576]: one page of all slots
        data = cache.permute(1, 0, 2)
    elif cache.dim() == 3:
        data = cache
    elif cache.dim() == 4 and shape[2] == 1:
        data = cache[:, :, 0, :]
    else:
        raise ValueError(
            f"expected a 16-bit cache of shape [slots, {WIDTH_16BIT}], [slots, 1, {WIDTH_16BIT}]"
            f", [pages, page_size, {WIDTH_16BIT}] or [pages, page_size, 1, {WIDTH_16BIT}], got "
            f"{shape}"
        )
    if data.numel() and data.stride(2) != 1:
        raise ValueError("expected each token's 576 values to be contiguous, got a strided row")
    return SparseCache(data, packed=False)
