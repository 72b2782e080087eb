"""Random paged MLA batches for tests, benchmarks and examples.

Random data only (never zeros): zeros hide unwritten outputs and wrong indexing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fp8mla.cache.quantize import quantize, quantize_token_groups
from fp8mla.formats import FP8_DTYPES, HEAD_DIM_CKV, HEAD_DIM_KPE, is_fp8


@dataclass
class PagedBatch:
    """A batch of requests over a paged cache, in FlashInfer's layout."""

    q_nope: torch.Tensor  # [T, H, 512]
    q_pe: torch.Tensor  # [T, H, 64]
    ckv: torch.Tensor  # [num_pages, page_size, 512] (a view of ``pool``)
    kpe: torch.Tensor  # [num_pages, page_size, 64] (a view of ``pool``)
    pool: torch.Tensor  # [num_pages * page_size, 1, 576] engine layout
    qo_indptr: torch.Tensor  # [B + 1] int32
    kv_indptr: torch.Tensor  # [B + 1] int32
    kv_indices: torch.Tensor  # [nnz] int32 page ids
    kv_len: torch.Tensor  # [B] int32
    page_size: int
    ckv_scale: float = 1.0
    kpe_scale: float = 1.0
    ckv_scale_arr: torch.Tensor | None = None  # [num_pages, page_size, 4]

    @property
    def batch(self) -> int:
        return self.kv_len.numel()

    @property
    def num_heads(self) -> int:
        return self.q_nope.shape[1]

    def scale_kwargs(self) -> dict[str, object]:
        if self.ckv_scale_arr is not None:
            return {"ckv_scale_arr": self.ckv_scale_arr, "kpe_scale": self.kpe_scale}
        return {"ckv_scale": self.ckv_scale, "kpe_scale": self.kpe_scale}

    def plan_args(self) -> tuple[torch.Tensor, ...]:
        return self.qo_indptr, self.kv_indptr, self.kv_indices, self.kv_len


def make_batch(
    kv_lens: Sequence[int],
    num_heads: int,
    *,
    qo_lens: Sequence[int] | int = 1,
    page_size: int = 1,
    kv_dtype: torch.dtype = torch.float8_e4m3fn,
    q_dtype: torch.dtype = torch.bfloat16,
    scale_mode: str = "tensor",
    extra_pages: int = 3,
    pool_pages: int | None = None,
    fill_unused_nan: bool = True,
    head_dim_kpe: int = HEAD_DIM_KPE,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> PagedBatch:
    """Build a random batch: requests with ``kv_lens`` tokens placed on random pages of a
    pool (``pool_pages`` pages, default just enough plus ``extra_pages``), unused slots NaN
    (FP8/16-bit NaN codes) when ``fill_unused_nan``; queries ~ N(0, 1)."""
    device = torch.device(device)
    g = generator
    qo = [qo_lens] * len(kv_lens) if isinstance(qo_lens, int) else list(qo_lens)
    if len(qo) != len(kv_lens):
        raise ValueError(f"expected {len(kv_lens)} qo_lens, got {len(qo)}")
    pages_per = [-(-n // page_size) for n in kv_lens]
    used = sum(pages_per)
    num_pages = pool_pages if pool_pages is not None else used + extra_pages
    if num_pages < used:
        raise ValueError(f"expected pool_pages >= {used}, got {num_pages}")
    width = HEAD_DIM_CKV + head_dim_kpe
    # Values of a realistic latent cache: unit-scale normal, a few larger channels.
    cpu_rows = torch.randn(num_pages * page_size, width, generator=g)
    scale_arr = None
    ckv_scale = kpe_scale = 1.0
    if scale_mode == "token_group":
        q_ckv, s = quantize_token_groups(cpu_rows[:, :HEAD_DIM_CKV], kv_dtype)
        q_kpe = quantize(cpu_rows[:, HEAD_DIM_CKV:], kv_dtype)
        scale_arr = s.view(num_pages, page_size, -1).to(device)
        rows = torch.cat([q_ckv, q_kpe], dim=1)
    elif is_fp8(kv_dtype):
        ckv_scale, kpe_scale = 0.05, 0.04  # values stored ×20 / ×25, dequantized by the scale
        rows = torch.cat(
            [
                quantize(cpu_rows[:, :HEAD_DIM_CKV], kv_dtype, ckv_scale),
                quantize(cpu_rows[:, HEAD_DIM_CKV:], kv_dtype, kpe_scale),
            ],
            dim=1,
        )
    else:
        rows = cpu_rows.to(kv_dtype)
    page_ids = torch.randperm(num_pages, generator=g)[:used]
    if fill_unused_nan:
        filled = torch.zeros(num_pages * page_size, dtype=torch.bool)
        start = 0
        for n, p in zip(kv_lens, pages_per):
            pos = torch.arange(n)
            filled[page_ids[start + pos // page_size] * page_size + pos % page_size] = True
            start += p
        nan_code = 0x7F if kv_dtype in FP8_DTYPES else None
        if nan_code is not None:
            rows.view(torch.uint8)[~filled] = nan_code
        else:
            rows[~filled] = float("nan")
    pool = rows.view(num_pages * page_size, 1, width).to(device)
    paged = pool.view(num_pages, page_size, width)
    cum = lambda v: torch.tensor([0, *torch.tensor(v).cumsum(0).tolist()], dtype=torch.int32)
    tokens = sum(qo)
    return PagedBatch(
        q_nope=torch.randn(tokens, num_heads, HEAD_DIM_CKV, generator=g).to(q_dtype).to(device),
        q_pe=torch.randn(tokens, num_heads, head_dim_kpe, generator=g).to(q_dtype).to(device),
        ckv=paged[..., :HEAD_DIM_CKV],
        kpe=paged[..., HEAD_DIM_CKV:],
        pool=pool,
        qo_indptr=cum(qo).to(device),
        kv_indptr=cum(pages_per).to(device),
        kv_indices=page_ids.to(torch.int32).to(device),
        kv_len=torch.tensor(list(kv_lens), dtype=torch.int32).to(device),
        page_size=page_size,
        ckv_scale=ckv_scale,
        kpe_scale=kpe_scale,
        ckv_scale_arr=scale_arr,
    )


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN anywhere gives NaN)."""
    out, ref = out.double(), ref.double().to(out.device)
    denom = ref.norm().item()
    return (out - ref).norm().item() / (denom if denom > 0 else 1.0)
