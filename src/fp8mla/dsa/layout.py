"""The packed FP8 MLA cache of DeepSeek Sparse Attention models (``fp8_ds_mla``).

DeepSeek-V3.2 and GLM-5 (``GlmMoeDsaForCausalLM``) store each token of the MLA cache in 656
bytes, token-major, as vLLM (``--kv-cache-dtype fp8_ds_mla``) and SGLang (the ``dsa`` backend's
pool) lay it out and FlashMLA's sparse kernels read it:

====== ===================================================================
bytes  content
====== ===================================================================
0-511  512 latent (NoPE) values, ``float8_e4m3fn``
512-527 4 ``float32`` scales; scale ``j`` covers latent values ``[128 j, 128 j + 128)``
528-655 64 RoPE values, ``bfloat16`` (not quantized)
====== ===================================================================

A value is ``e4m3[i] * scale[i // 128]``. Engines hand the cache over as a uint8 (or int8,
or ``float8_e4m3fn``) tensor of pages, ``[pages, page_size, 656]`` (vLLM),
``[pages, page_size, 1, 656]`` (FlashMLA's view) or ``[slots, 1, 656]`` (SGLang's pool); a
token is named by its global slot id ``page * page_size + offset``. :func:`token_view` reads
any of these shapes as one ``[pages, page_size, 656]`` byte view without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from fp8mla._checks import check_tensor
from fp8mla.formats import MAX_PAGE_SIZE
from fp8mla.runtime import resolve_backend

NOPE_DIM = 512  # latent values per token (the attention's values, and keys' first part)
ROPE_DIM = 64  # RoPE values per token (keys' second part)
GROUP = 128  # latent values per scale
GROUPS = NOPE_DIM // GROUP
SCALE_OFFSET = NOPE_DIM  # byte offset of the four float32 scales
ROPE_OFFSET = SCALE_OFFSET + 4 * GROUPS  # byte offset of the bf16 RoPE part (528)
TOKEN_BYTES = ROPE_OFFSET + 2 * ROPE_DIM  # 656
E4M3_MAX = 448.0  # largest finite float8_e4m3fn value

CACHE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)

# How the writer encodes values (fp8mla.dsa.format, the engines' writers):
SCALE_FLOOR = 2.0**-126  # smallest normal float32: an "arbitrary" scale is at least this (vLLM)
POW2_SCALE_FLOOR = 1e-4  # amax / 448 floor before a "pow2" scale is rounded up (DeepSeek)
NAN_E4M3 = 0x7F  # the e4m3 NaN code written, whatever the sign (GPUs' satfinite conversion)
NAN_BF16 = 0x7FC0  # the bf16 NaN written for a NaN RoPE value of an fp16/fp32 input


def slot_addressing(data: torch.Tensor) -> tuple[int, int, int]:
    """``(page_size, page_stride, token_stride)`` in bytes of a ``[pages, page_size, width]``
    cache view whose rows are contiguous, for a kernel that finds slot ``s`` at
    ``(s // page_size) * page_stride + (s % page_size) * token_stride``: pages that follow each
    other without a gap are one page of every slot (page size 1, no division in the kernel)."""
    pages, size, width = data.shape
    item = data.element_size()
    token = data.stride(1) * item if size > 1 else width * item
    if pages <= 1 or data.stride(0) * item == size * token:
        return 1, token, token
    return size, data.stride(0) * item, token


@dataclass(frozen=True)
class TokenView:
    """A packed cache read as bytes: ``data [pages, page_size, 656]`` uint8 (a view of the
    caller's tensor; strides in bytes), and its shape's meaning."""

    data: torch.Tensor
    page_size: int

    @property
    def num_slots(self) -> int:
        """Slot ids ``[0, num_slots)`` name a token of the cache."""
        return self.data.shape[0] * self.page_size

    def addressing(self) -> tuple[int, int, int]:
        """:func:`slot_addressing` of the view."""
        return slot_addressing(self.data)


def token_view(cache: torch.Tensor, *, page_size: int | None = None) -> TokenView:
    """``cache`` (``[pages, page_size, 656]``, ``[pages, page_size, 1, 656]`` or
    ``[slots, 1, 656]``; uint8, int8 or float8_e4m3fn) as a uint8 ``[pages, page_size, 656]``
    view, no copy. A ``[slots, 1, 656]`` pool is one page of ``slots`` tokens unless
    ``page_size`` names its pages (SGLang's pool at page size 64). Each token's 656 bytes must be
    contiguous and pages of a byte stride that keeps the float32 scales 4-byte aligned."""
    if not isinstance(cache, torch.Tensor):
        raise ValueError(f"expected the packed cache as a torch.Tensor, got {type(cache).__name__}")
    if cache.dtype not in CACHE_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in CACHE_DTYPES)
        raise ValueError(f"expected the packed cache's dtype in ({names}), got {cache.dtype}")
    shape = tuple(cache.shape)
    if cache.dim() == 4 and shape[2] == 1 and shape[3] == TOKEN_BYTES:
        data = cache[:, :, 0, :]
    elif cache.dim() == 3 and shape[2] == TOKEN_BYTES:
        data = cache
    else:
        raise ValueError(
            f"expected a packed cache of shape [pages, page_size, {TOKEN_BYTES}], "
            f"[pages, page_size, 1, {TOKEN_BYTES}] or [slots, 1, {TOKEN_BYTES}], got {list(shape)}"
        )
    data = data.view(torch.uint8)
    if page_size is not None:
        if data.shape[1] != 1 or data.shape[0] % page_size:
            raise ValueError(
                f"expected page_size only for a [slots, 1, {TOKEN_BYTES}] pool whose slots it "
                f"divides, got page_size {page_size} for shape {list(shape)}"
            )
        if data.shape[0] and data.stride(0) != TOKEN_BYTES:
            raise ValueError(
                f"expected a [slots, 1, {TOKEN_BYTES}] pool with contiguous tokens to take "
                f"page_size, got a token stride of {data.stride(0)} bytes"
            )
        data = data.reshape(data.shape[0] // page_size, page_size, TOKEN_BYTES)
    elif cache.dim() == 3 and shape[1] == 1:  # [slots, 1, 656]: one page of all slots
        data = data.permute(1, 0, 2)
    pages, size = data.shape[0], data.shape[1]
    if data.stride(2) != 1:
        raise ValueError("expected each token's 656 bytes to be contiguous, got a strided row")
    if pages * size and (data.stride(1) % 4 or data.stride(0) % 4 or data.data_ptr() % 4):
        raise ValueError(
            "expected the packed cache's token and page strides and address to be multiples of "
            f"4 bytes (its float32 scales are read in place), got strides {data.stride()[:2]}"
        )
    if size > MAX_PAGE_SIZE and pages > 1:
        raise ValueError(f"expected a page size of at most {MAX_PAGE_SIZE}, got {size}")
    return TokenView(data, size)


def check_slot_range(slots: torch.Tensor, num_slots: int, *, skip: bool) -> None:
    """ValueError unless every slot lies in ``[0, num_slots)`` (``skip``: or is -1, the
    padding a writer skips). Reads ``slots`` on the host: one device sync on CUDA."""
    if not slots.numel():
        return
    first = -1 if skip else 0
    lo, hi = torch.stack(torch.aminmax(slots)).tolist()
    if lo < first or hi >= num_slots:
        note = " (-1: skipped)" if skip else ""
        raise ValueError(f"expected slots in [{first}, {num_slots}){note}, got range [{lo}, {hi}]")


# the quantize-on-write formats of both packed caches: amax / 448 per group as it is
# ("arbitrary", what the engines write) or rounded up to a power of two ("pow2", DeepSeek's
# reference quantizer and DeepGEMM's ue8m0)
ScaleFormat = Literal["arbitrary", "pow2"]
SCALE_FORMATS = ("arbitrary", "pow2")
SLOT_DTYPES = (torch.int32, torch.int64)


def writer_backend(
    rows: str,
    n: int,
    slots: torch.Tensor,
    num_slots: int,
    *,
    scale_format: str,
    backend: str,
    device: torch.device,
    validate: bool,
) -> str | None:
    """The argument checks of a packed cache's writer, for ``n`` rows of the tensor named
    ``rows`` going to ``slots``: the backend that writes them (``resolve_backend``), or None
    when there is nothing to write. ``validate`` also reads ``slots`` on the host and raises
    ValueError for one outside ``[-1, num_slots)``."""
    check_tensor("slots", slots, ndim=1, dtypes=SLOT_DTYPES, device=device)
    if slots.numel() != n:
        raise ValueError(
            f"expected slots of length {n} (one per row of {rows}), got {slots.numel()}"
        )
    if scale_format not in SCALE_FORMATS:
        raise ValueError(f"expected scale_format in {SCALE_FORMATS}, got {scale_format!r}")
    which = resolve_backend(backend, device)
    if validate:
        check_slot_range(slots, num_slots, skip=True)
    if n == 0 or num_slots == 0:
        return None
    return which
