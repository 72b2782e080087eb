"""Packed caches and index lists for the sparse MLA tests.

``packed_cache`` writes random e4m3 codes (never the NaN codes), random positive float32 scales
and random bf16 RoPE values straight into the 656-byte rows -- arbitrary scales, which is what
the attention's reader must handle (``fp8mla.dsa.layout``); ``poison`` fills the slots no index
names with NaN bytes. A plain module (not a ``conftest.py``: a second one would shadow
``tests/conftest.py`` for ``from conftest import ...`` elsewhere in the suite).
"""

from __future__ import annotations

import math

import torch

from fp8mla.dsa.layout import GROUPS, NOPE_DIM, ROPE_DIM, ROPE_OFFSET, SCALE_OFFSET, TOKEN_BYTES

SHAPES = ("pages", "flashmla", "pool")  # [pages, ps, 656], [pages, ps, 1, 656], [slots, 1, 656]
SM_SCALE = 1 / math.sqrt(192) * 1.874  # DeepSeek-V3.2's scale with its YaRN factor


def packed_rows(
    num_slots: int,
    generator: torch.Generator,
    scale_range: tuple[float, float] = (2.0**-12, 2.0**-4),
) -> torch.Tensor:
    """``[num_slots, 656]`` uint8 on the generator's device: random finite e4m3 codes,
    per-group scales log-uniform in ``scale_range`` (arbitrary float32 values, not powers of
    two), N(0, 1) bf16 RoPE."""
    g, dev = generator, generator.device
    codes = torch.randint(0, 256, (num_slots, NOPE_DIM), generator=g, device=dev, dtype=torch.int32)
    codes = torch.where((codes & 0x7F) == 0x7F, codes - 1, codes).to(torch.uint8)  # no NaN
    lo, hi = math.log(scale_range[0]), math.log(scale_range[1])
    unit = torch.rand(num_slots, GROUPS, generator=g, device=dev, dtype=torch.float64)
    scales = torch.exp(unit * (hi - lo) + lo)
    rope = torch.randn(num_slots, ROPE_DIM, generator=g, device=dev).to(torch.bfloat16)
    rows = torch.empty(num_slots, TOKEN_BYTES, dtype=torch.uint8, device=dev)
    rows[:, :NOPE_DIM] = codes
    rows[:, SCALE_OFFSET:ROPE_OFFSET] = scales.float().view(torch.uint8).view(num_slots, -1)
    rows[:, ROPE_OFFSET:] = rope.view(torch.uint8).view(num_slots, -1)
    return rows


def as_shape(rows: torch.Tensor, page_size: int, shape: str) -> torch.Tensor:
    """``rows [slots, 656]`` as an engine's tensor of that ``shape`` (same bytes, a view)."""
    slots = rows.shape[0]
    if shape == "pages":
        return rows.view(slots // page_size, page_size, TOKEN_BYTES)
    if shape == "flashmla":
        return rows.view(slots // page_size, page_size, 1, TOKEN_BYTES)
    if shape == "pool":
        return rows.view(slots, 1, TOKEN_BYTES)
    raise ValueError(f"expected a shape in {SHAPES}, got {shape!r}")


def packed_cache(
    num_slots: int,
    page_size: int = 64,
    shape: str = "pages",
    *,
    seed: int = 0,
    scale_range: tuple[float, float] = (2.0**-12, 2.0**-4),
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """A random packed cache of ``num_slots`` slots (a multiple of ``page_size``), made on
    ``device``."""
    g = torch.Generator(device=device).manual_seed(seed)
    return as_shape(packed_rows(num_slots, g, scale_range), page_size, shape)


def poison(cache: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """A copy of ``cache`` whose slots not in ``keep`` hold NaN bytes everywhere: e4m3 NaN
    codes, NaN scales, NaN RoPE values."""
    out = cache.clone()
    rows = out.view(-1, TOKEN_BYTES)
    mask = torch.ones(rows.shape[0], dtype=torch.bool, device=rows.device)
    ids = keep[(keep >= 0) & (keep < rows.shape[0])].long().to(rows.device)
    mask[ids] = False
    rows[mask] = 0x7F
    rows[mask, ROPE_OFFSET:] = 0xFF  # bf16 NaN (0x7F7F is a finite bf16)
    return out


def random_indices(
    tokens: int,
    topk: int,
    num_slots: int,
    *,
    seed: int = 0,
    pad: float = 0.0,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``[tokens, topk]`` int32 random slot ids (with repeats possible), a ``pad`` share -1."""
    g = torch.Generator(device=device).manual_seed(seed)
    idx = torch.randint(0, num_slots, (tokens, topk), generator=g, dtype=torch.int32, device=device)
    if pad:
        drop = torch.rand(tokens, topk, generator=g, device=device) < pad
        idx[drop] = -1
    return idx


def queries(
    tokens: int, heads: int, dtype: torch.dtype = torch.bfloat16, *, seed: int = 0, device="cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """``q_nope [tokens, heads, 512]``, ``q_pe [tokens, heads, 64]``, N(0, 1)."""
    g = torch.Generator(device=device).manual_seed(seed + 1000)
    q_nope = torch.randn(tokens, heads, NOPE_DIM, generator=g, device=device).to(dtype)
    q_pe = torch.randn(tokens, heads, ROPE_DIM, generator=g, device=device).to(dtype)
    return q_nope, q_pe
