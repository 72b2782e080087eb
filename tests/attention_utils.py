"""Shared helpers of the attention tests: run the wrapper, compare with the reference."""

from __future__ import annotations

import math

import torch

from fp8mla import BatchMLAPagedAttentionWrapper
from fp8mla.reference import mla_reference
from fp8mla.testing import PagedBatch, rel_err

from conftest import INTERPRETED

SM_SCALE = 1 / math.sqrt(192)  # DeepSeek-V3


def out_tolerance(q_dtype: torch.dtype) -> float:
    """Relative error bar of the output against float64 on the same cache bytes. The
    interpreter rounds fp32 → bf16 toward zero, which alone costs about 1 bf16 ulp."""
    if q_dtype == torch.bfloat16:
        return 5e-3 if INTERPRETED else 3e-3
    return 2e-3 if INTERPRETED else 1e-3


def workspace(device, nbytes: int = 32 << 20) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def run_wrapper(
    batch: PagedBatch,
    *,
    causal=False,
    backend="triton",
    num_splits=None,
    ckv=None,
    kpe=None,
    out=None,
    lse=None,
    config=None,
    kernel_options=None,
):
    """Plan and run ``batch`` through the wrapper; ``kernel_options``: compile-time options
    of the planned attention kernel overridden (``plan(kernel_options=...)``: layouts,
    stages)."""
    w = BatchMLAPagedAttentionWrapper(workspace(batch.q_nope.device), backend=backend)
    w.plan(
        *batch.plan_args(),
        batch.num_heads,
        512,
        batch.q_pe.shape[-1],
        batch.page_size,
        causal,
        SM_SCALE,
        batch.q_nope.dtype,
        batch.ckv.dtype,
        num_splits=num_splits,
        kernel_config=config,
        kernel_options=kernel_options,
    )
    return w.run(
        batch.q_nope,
        batch.q_pe,
        batch.ckv if ckv is None else ckv,
        batch.kpe if kpe is None else kpe,
        out=out,
        lse=lse,
        return_lse=True,
        **batch.scale_kwargs(),
    )


def reference(batch: PagedBatch, *, causal=False):
    return mla_reference(
        batch.q_nope,
        batch.q_pe,
        batch.ckv,
        batch.kpe,
        *batch.plan_args(),
        sm_scale=SM_SCALE,
        causal=causal,
        ckv_scale=batch.ckv_scale,
        kpe_scale=batch.kpe_scale,
        ckv_scale_arr=batch.ckv_scale_arr,
    )


def reference_rows(batch, req: int, first: int, count: int):
    """float64 reference of query tokens ``[first, first + count)`` of request ``req`` under
    bottom-right causal masking: the same rows as a request of ``count`` tokens whose KV ends
    where the last of them stops seeing."""
    qo = batch.qo_indptr.tolist()
    q0, qo_len = qo[req] + first, qo[req + 1] - qo[req]
    kv_len = int(batch.kv_len[req]) - (qo_len - first - count)
    pages = batch.kv_indices[int(batch.kv_indptr[req]) : int(batch.kv_indptr[req + 1])]
    i32 = dict(dtype=torch.int32, device=batch.kv_len.device)
    return mla_reference(
        batch.q_nope[q0 : q0 + count],
        batch.q_pe[q0 : q0 + count],
        batch.ckv,
        batch.kpe,
        torch.tensor([0, count], **i32),
        torch.tensor([0, pages.numel()], **i32),
        pages,
        torch.tensor([kv_len], **i32),
        sm_scale=SM_SCALE,
        causal=True,
        **batch.scale_kwargs(),
    )


def assert_matches_reference(batch: PagedBatch, out, lse, *, causal=False) -> float:
    ref_out, ref_lse = reference(batch, causal=causal)
    assert out.dtype == batch.q_nope.dtype and out.shape == ref_out.shape
    assert torch.isfinite(out).all(), "NaN/inf in the output"
    err = rel_err(out, ref_out)
    assert err <= out_tolerance(out.dtype), f"relative error {err:.2e}"
    empty = torch.isinf(ref_lse)
    assert torch.all(out[empty.to(out.device)] == 0), "empty rows must be zero"
    if lse is None:  # a run without LSE
        return err
    assert torch.equal(torch.isinf(lse.cpu()), empty.cpu()), "LSE -inf pattern differs"
    lse_diff = (lse.double() - ref_lse)[~empty].abs()
    assert lse_diff.numel() == 0 or lse_diff.max().item() < 2e-3
    return err


def sm90_launch(
    variant: str, splits: int, heads: int = 16, merge_waits: bool = False,
    attention_waits: bool = False, index_lists: bool = False,
):  # fmt: skip
    """An attention launch of ``variant`` built for SM90 on the CPU (nothing runs): two
    requests of one query token over 5 and 4 tokens in pages of 2, FP8 e4m3 (bf16 for a
    variant of 16-bit pools: :func:`pool_dtype_for`), ``splits`` KV splits (with their
    partials); with ``index_lists`` the sparse path's launch (page size 1, the page table and
    lengths given at each call). For tests of the launch path with stand-in kernels."""
    from fp8mla.attention.config import LaunchPlan
    from fp8mla.attention.launch import AttentionLaunch
    from fp8mla.attention.planner import tile_for_variant
    from fp8mla.attention.targets import TARGETS
    from fp8mla.attention.variants import get_variant
    from fp8mla.attention.workspace import split_partials

    fp8 = pool_dtype_for(variant)
    cfg = tile_for_variant(variant, heads, fp8, TARGETS["sm90"])
    half = splits > 1 and get_variant(variant).half_partials  # as the planner decides
    plan = LaunchPlan(
        cfg, 1, splits, merge_waits=merge_waits, attention_waits=attention_waits,
        half_partials=half,
    )  # fmt: skip
    i32 = dict(dtype=torch.int32)
    idx = (torch.tensor([0, 1, 2], **i32), torch.tensor([0, 5, 9], **i32),
           torch.arange(9, **i32), torch.tensor([5, 4], **i32))  # fmt: skip
    partials = None
    if splits > 1:
        workspace = torch.zeros(splits * 513 * 2 * heads, dtype=torch.float32)
        partials = split_partials(workspace, splits, 2 * heads, 512, half)
    return AttentionLaunch(
        plan, batch=2, heads=heads, head_dim_kpe=64, page_size=1 if index_lists else 2,
        causal=False, sm_scale=0.1, indices=idx, partials=partials, kv_dtype=fp8,
        device=torch.device("cpu"), target=TARGETS["sm90"], interpreted=False,
        kernel_options={"SPARSE_LISTS": True} if index_lists else None,
        index_lists=index_lists,
    )  # fmt: skip


def pool_dtype_for(variant: str) -> torch.dtype:
    """The pool dtype of tests that do not sweep dtypes (and of :func:`sm90_launch`): FP8
    e4m3, or bf16 for a variant that reads 16-bit pools only."""
    from fp8mla.attention.targets import TARGETS
    from fp8mla.attention.variants import get_variant

    fp8 = torch.float8_e4m3fn
    return torch.bfloat16 if get_variant(variant).supports(TARGETS["sm90"], fp8, 16, 64) else fp8


def sm90_launch_inputs(heads: int, pool_slots: int, lse: bool, scale, pool_dtype=None):
    """Arguments of an :func:`sm90_launch` call (its two one-token requests) on the CPU:
    ``(q_nope, q_pe, ckv, kpe, out, lse, scales)``, the queries and caches as views of
    576-wide rows, a pool of ``pool_slots`` pages of 2, an LSE when ``lse``, both scales
    ``scale`` (a float or a device-style one-element tensor), the pool FP8 e4m3 unless
    ``pool_dtype`` is given."""
    from fp8mla.formats import Scales

    pool = torch.zeros(pool_slots, 2, 576, dtype=pool_dtype or torch.float8_e4m3fn)
    q = torch.zeros(2, heads, 576, dtype=torch.bfloat16)
    out = torch.empty(2, heads, 512, dtype=torch.bfloat16)
    lse_t = torch.empty(2, heads) if lse else None
    return (q[..., :512], q[..., 512:], pool[..., :512], pool[..., 512:], out, lse_t,
            Scales(ckv=scale, kpe=scale))  # fmt: skip
