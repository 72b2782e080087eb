"""Three ways an attention backend can read the FP8 KV pool (one layer's call each).

These are the functions the profiler names as the launcher of each copy kernel, so their
names are what ``fp8mla doctor`` reports as the source of a pool-proportional cast.
"""

from __future__ import annotations

import torch

from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper
from fp8mla.cache import MLAKVCache

STRATEGIES = ("full-pool cast", "gather-then-cast", "fp8mla direct")


def full_pool_cast(
    cache: MLAKVCache,
    wrapper: BatchMLAPagedAttentionWrapper,
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """What engines ship: ``pool.to(q.dtype)`` of the whole pool, then a bf16 kernel."""
    kv = cache.engine_view.to(q_nope.dtype)
    return wrapper.run(
        q_nope,
        q_pe,
        kv[..., :512],
        kv[..., 512:],
        out=out,
        ckv_scale=cache.ckv_scale,
        kpe_scale=cache.kpe_scale,
    )


def gather_then_cast(
    cache: MLAKVCache,
    wrapper: BatchMLAPagedAttentionWrapper,
    slots: torch.Tensor,
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """The known patch: cast only the active entries (planned over a compact copy)."""
    kv = cache.engine_view.index_select(0, slots).to(q_nope.dtype)
    return wrapper.run(
        q_nope,
        q_pe,
        kv[..., :512],
        kv[..., 512:],
        out=out,
        ckv_scale=cache.ckv_scale,
        kpe_scale=cache.kpe_scale,
    )


def fp8mla_direct(
    cache: MLAKVCache,
    wrapper: BatchMLAPagedAttentionWrapper,
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """fp8mla: the kernel reads the FP8 pool in place; nothing is cast."""
    return wrapper.run(q_nope, q_pe, cache.ckv, cache.kpe, out=out, **cache.run_kwargs())
