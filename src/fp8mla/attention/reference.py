"""Paged MLA attention in float64 on PyTorch: the test oracle and the CPU fallback.

Semantics are FlashInfer's ``BatchMLAPagedAttentionWrapper``:

- ``q_nope [tokens, H, 512]``, ``q_pe [tokens, H, 64]``;
- ``ckv_cache [num_pages, page_size, 512]``, ``kpe_cache [num_pages, page_size, 64]`` (any
  strides, e.g. views of one ``[num_slots, 1, 576]`` engine buffer);
- ``qo_indptr [B+1]``: request b owns query tokens ``qo_indptr[b]:qo_indptr[b+1]``;
- ``kv_indptr [B+1]`` indexes ``kv_indices``, which hold **page** ids;
- ``kv_len [B]``: KV tokens of each request (its last page may be partly filled);
- keys are ``concat(ckv, kpe)`` (576 wide), values are ``ckv`` (512 wide);
- causal masks are bottom-right aligned: query i of n sees KV positions ``<= kv_len - n + i``;
- the log-sum-exp is in base 2 (natural base with ``lse_base="e"``);
- a request with ``kv_len == 0`` gets zero output and ``-inf`` LSE;
- a request with a KV token whose page-table entry falls outside its own ``kv_indptr`` range
  or outside ``kv_indices``, or names a page outside the cache, gets NaN output and LSE (the
  kernels read a NaN row for that token: never a quiet finite answer from a bad index).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

import torch

from fp8mla.formats import SCALE_GROUP, Scales

if TYPE_CHECKING:
    from fp8mla.attention.plan_state import PlanState

LOG2E = 1.4426950408889634  # 1 / ln 2


def dequantize(
    values: torch.Tensor,
    scale: float | torch.Tensor | None = None,
    scale_arr: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``values [..., D]`` in storage dtype → ``dtype``, times a per-tensor ``scale`` or a
    per-group ``scale_arr [..., D // 128]`` (one scale per 128 channels)."""
    out = values.to(dtype)
    if scale_arr is not None:
        groups = out.shape[-1] // SCALE_GROUP
        out = out.unflatten(-1, (groups, SCALE_GROUP)) * scale_arr.to(dtype)[..., None]
        out = out.flatten(-2)
    if scale is not None:
        out = out * (float(scale) if not isinstance(scale, torch.Tensor) else scale.to(dtype))
    return out


def request_token_slots(
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_len: torch.Tensor, page_size: int, b: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(page id, offset in page) of each KV token of request ``b``, in order (entries past the
    request's own or past ``kv_indices`` read as page -1)."""
    n = int(kv_len[b])
    pos = torch.arange(n, device=kv_indices.device)
    start, stop = int(kv_indptr[b]), min(int(kv_indptr[b + 1]), kv_indices.numel())
    entries = start + pos // page_size
    listed = (entries < stop) & (start >= 0)
    pages = torch.full((n,), -1, dtype=torch.long, device=kv_indices.device)
    pages[listed] = kv_indices[entries[listed]].long()
    return pages, pos % page_size


def gather_kv(
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_len: torch.Tensor,
    b: int,
    ckv_scale_arr: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The active KV of request ``b`` in storage dtype: ``ckv [L, 512]``, ``kpe [L, 64]`` and,
    when given, its ``scales [L, 4]``."""
    pages, offs = request_token_slots(kv_indptr, kv_indices, kv_len, ckv_cache.shape[1], b)
    pages = torch.where((pages >= 0) & (pages < ckv_cache.shape[0]), pages, 0)  # bad: page 0
    scales = ckv_scale_arr[pages, offs] if ckv_scale_arr is not None else None
    return ckv_cache[pages, offs], kpe_cache[pages, offs], scales


def mla_reference(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_len: torch.Tensor,
    *,
    sm_scale: float,
    causal: bool = False,
    ckv_scale: float | torch.Tensor | None = None,
    kpe_scale: float | torch.Tensor | None = None,
    ckv_scale_arr: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    lse_base: Literal["2", "e"] = "2",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference paged MLA attention (see the module docstring for the layout).

    Returns ``out [tokens, H, 512]`` and ``lse [tokens, H]``, both in ``dtype`` (float64 by
    default, float32 on request), computed on the device of the inputs.
    """
    if dtype not in (torch.float64, torch.float32):
        raise ValueError(f"expected dtype float64 or float32, got {dtype}")
    if lse_base not in ("2", "e"):
        raise ValueError(f"expected lse_base '2' or 'e', got {lse_base!r}")
    tokens, heads, d_ckv = q_nope.shape
    batch = qo_indptr.numel() - 1
    if kv_indptr.numel() != batch + 1 or kv_len.numel() != batch:
        raise ValueError(
            f"expected kv_indptr of length {batch + 1} and kv_len of length {batch}, "
            f"got {kv_indptr.numel()} and {kv_len.numel()}"
        )
    out = torch.zeros(tokens, heads, d_ckv, dtype=dtype, device=q_nope.device)
    lse = torch.full((tokens, heads), -math.inf, dtype=dtype, device=q_nope.device)
    qo_host = qo_indptr.tolist()
    for b in range(batch):
        q0, q1 = qo_host[b], qo_host[b + 1]
        n, length = q1 - q0, int(kv_len[b])
        if n == 0 or length == 0:
            continue
        if causal and n > length:
            raise ValueError(
                f"expected qo_len <= kv_len for causal request {b}, got {n} > {length}"
            )
        pages, _ = request_token_slots(kv_indptr, kv_indices, kv_len, ckv_cache.shape[1], b)
        bad = (pages < 0) | (pages >= ckv_cache.shape[0])
        ckv, kpe, scales = gather_kv(
            ckv_cache, kpe_cache, kv_indptr, kv_indices, kv_len, b, ckv_scale_arr
        )
        k_nope = dequantize(ckv, ckv_scale, scales, dtype)  # [L, 512], also the values
        k_pe = dequantize(kpe, kpe_scale, None, dtype)  # [L, 64]
        s = torch.einsum("nhd,ld->nhl", q_nope[q0:q1].to(dtype), k_nope)
        if k_pe.shape[-1]:
            s = s + torch.einsum("nhd,ld->nhl", q_pe[q0:q1].to(dtype), k_pe)
        s = s * sm_scale
        if causal:
            limit = length - n + torch.arange(n, device=s.device)  # last visible position
            visible = torch.arange(length, device=s.device)[None, :] <= limit[:, None]
            s = s.masked_fill(~visible[:, None, :], -math.inf)
        if bad.any():  # a bad page-table entry: the request is NaN
            s = torch.full_like(s, math.nan)
        row_lse = torch.logsumexp(s, dim=-1)  # [n, H], natural base
        p = torch.exp(s - row_lse[..., None])
        out[q0:q1] = torch.einsum("nhl,ld->nhd", p, k_nope)
        lse[q0:q1] = row_lse * LOG2E if lse_base == "2" else row_lse
    return out, lse


def run_reference(
    st: PlanState,
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    scales: Scales,
) -> None:
    """The PyTorch backend of the wrapper (CPU fallback): the float32 reference of the
    planned batch ``st``, written into ``out``/``lse``."""
    o, s = mla_reference(
        q_nope,
        q_pe,
        ckv,
        kpe,
        st.qo_indptr[: st.num_requests + 1],
        st.kv_indptr[: st.num_requests + 1],
        st.kv_indices,
        st.kv_len[: st.num_requests],
        sm_scale=st.sm_scale,
        causal=st.causal,
        ckv_scale=scales.ckv,
        kpe_scale=scales.kpe,
        ckv_scale_arr=scales.ckv_arr,
        dtype=torch.float32,
    )
    out.copy_(o)
    if lse is not None:
        lse.copy_(s)
