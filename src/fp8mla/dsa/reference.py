"""Sparse MLA attention in float64 on PyTorch: the test and benchmark oracle, and (in float32)
the PyTorch path of :func:`fp8mla.sparse_mla` for CPU tensors.

Query token ``t`` (heads ``h``) attends to the cache slots ``indices[t, :topk_length[t]]``:

- keys are the 576 values ``[latent (512) ‖ rope (64)]`` of each slot, values its latent part;
  a packed cache's latent value ``i`` is ``e4m3[i] × scale[i // 128]`` (``fp8mla.dsa.layout``);
- ``out[t, h] = softmax(sm_scale · q[t, h] · Kᵀ) · V`` over the listed slots, duplicates counted
  as often as they are listed, order irrelevant; ``lse[t, h]`` is the natural-log
  log-sum-exp of the scaled scores;
- ``-1`` lists no token; a token whose list holds nothing else gets out 0 and lse +inf
  (FlashMLA's convention);
- a listed id below -1 or past the cache's slots makes that token's out and lse NaN, all heads
  (no other token changes);
- entries past ``topk_length[t]`` (clamped to ``[0, topk]``) are ignored, whatever they hold.
"""

from __future__ import annotations

import math

import torch

from fp8mla.dsa.layout import NOPE_DIM
from fp8mla.dsa.sparse_cache import sparse_cache

REFERENCE_ROWS = 1 << 16  # gathered cache rows per chunk of query tokens (bounds the memory)


def listed_entries(
    indices: torch.Tensor, topk_length: torch.Tensor | None, num_slots: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(slots, valid, bad)`` of ``indices [T, topk]``: the ids as int64 (0 where not
    ``valid``), which entries name a token (listed and in ``[0, num_slots)``), and which query
    tokens list an id outside the cache (``bad [T]``)."""
    idx = indices.long()
    topk = idx.shape[1]
    listed = torch.ones_like(idx, dtype=torch.bool)
    if topk_length is not None:
        n = topk_length.long().clamp(0, topk).to(idx.device)
        listed = torch.arange(topk, device=idx.device)[None, :] < n[:, None]
    valid = listed & (idx >= 0) & (idx < num_slots)
    bad = (listed & ((idx < -1) | (idx >= num_slots))).any(dim=1)
    return torch.where(valid, idx, 0), valid, bad


def sparse_mla_reference(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    topk_length: torch.Tensor | None = None,
    *,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA attention of ``q_nope [T, H, 512]`` / ``q_pe [T, H, 64]`` over the slots
    ``indices [T, topk]`` (or ``[T, 1, topk]``) of ``cache`` (the packed 656-byte cache or a
    16-bit 576-wide one: :func:`fp8mla.dsa.sparse_cache.sparse_cache`), on the inputs' device.

    Returns ``out [T, H, 512]`` and ``lse [T, H]`` (natural log) in ``dtype`` (float64, or
    float32 for the PyTorch path); semantics in the module docstring."""
    if dtype not in (torch.float64, torch.float32):
        raise ValueError(f"expected dtype float64 or float32, got {dtype}")
    view = sparse_cache(cache)
    tokens, heads, _ = q_nope.shape
    idx = indices.reshape(tokens, indices.shape[-1])  # also for T = 0 (an empty batch)
    slots, valid, bad = listed_entries(idx, topk_length, view.num_slots)
    topk = idx.shape[1]
    out = torch.zeros(tokens, heads, NOPE_DIM, dtype=dtype, device=q_nope.device)
    lse = torch.full((tokens, heads), math.inf, dtype=dtype, device=q_nope.device)
    step = max(1, REFERENCE_ROWS // max(topk, 1))
    for t0 in range(0, tokens if topk else 0, step):
        t1 = min(tokens, t0 + step)
        latent, rope = view.dequantize(slots[t0:t1].reshape(-1), dtype)
        keep = valid[t0:t1, :, None]  # unlisted entries read slot 0: whatever it holds, 0
        latent = torch.where(keep, latent.view(t1 - t0, topk, -1), 0.0)
        rope = torch.where(keep, rope.view(t1 - t0, topk, -1), 0.0)
        s = torch.einsum("thd,tkd->thk", q_nope[t0:t1].to(dtype), latent)
        s = s + torch.einsum("thd,tkd->thk", q_pe[t0:t1].to(dtype), rope)
        s = (s * sm_scale).masked_fill(~valid[t0:t1, None, :], -math.inf)
        row_lse = torch.logsumexp(s, dim=-1)  # -inf where nothing is listed
        has = row_lse > -math.inf
        p = torch.exp(s - torch.where(has, row_lse, 0.0)[..., None])
        o = torch.einsum("thk,tkd->thd", p, latent)
        out[t0:t1] = torch.where(has[..., None], o, 0.0)
        lse[t0:t1] = torch.where(has, row_lse, math.inf)
    out[bad] = math.nan
    lse[bad] = math.nan
    return out, lse
