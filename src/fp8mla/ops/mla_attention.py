"""Launcher of the paged MLA attention kernel and the split-KV merge.

Inputs are validated by the caller (the wrapper's ``plan``/``run``); this module only maps
tensors to kernel arguments, so it does no host synchronization and no allocation beyond what
the caller hands it (CUDA-graph safe), except the fp16 copy of the queries that value-split
tiles with ``q_fp16_copy`` read (PyTorch's caching allocator serves it, under graph capture too).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fp8mla.ops.planner import LaunchPlan
from fp8mla.ops.targets import Target, current_target

LN2_INV = 1.4426950408889634  # 1 / ln 2: softmax runs in base 2


@dataclass
class Scales:
    """Dequantization scales of one run: floats, device scalars, or per-token groups."""

    ckv: float | torch.Tensor = 1.0
    kpe: float | torch.Tensor = 1.0
    ckv_arr: torch.Tensor | None = None  # [num_pages, page_size, 4] fp32


def dot_dtype(kv_dtype: torch.dtype, interpreted: bool) -> tl.dtype:
    """Operand dtype of the tensor-core dots. FP8 converts exactly to fp16; the interpreter
    computes in fp32 because its bf16 arithmetic is unreliable."""
    if interpreted:
        return tl.float32
    return tl.bfloat16 if kv_dtype == torch.bfloat16 else tl.float16


FP8_CVT_CHOICES = ("auto", "native", "ptx", "int", "portable")


def fp8_conversion(
    kv_dtype: torch.dtype,
    device: torch.device,
    interpreted: bool,
    choice: str = "auto",
    target: Target | None = None,
) -> int:
    """The kernels' ``FP8_CVT`` mode for ``target`` (the device's when None).

    ``auto``: integer bit moves on every GPU -- inline PTX on CUDA (SM80/86 have no FP8
    instructions; on the H200 the integer path measured faster than ``cvt``, whose issue rate
    limits the memory-bound case), the same moves in Triton integer ops on AMD (no inline PTX;
    only gfx950 decodes OCP FP8 in hardware, and one decoder for all AMD parts keeps them
    alike); Triton's own cast in the interpreter. ``portable`` forces the Triton-op integer
    path anywhere, the interpreter included; ``ptx`` falls back to ``int`` below SM89 and
    both fall back to ``portable`` on AMD."""
    from fp8mla.kernels import mla_tiles as T

    if choice not in FP8_CVT_CHOICES:
        raise ValueError(f"expected fp8_cvt in {'/'.join(FP8_CVT_CHOICES)}, got {choice!r}")
    e4m3 = kv_dtype == torch.float8_e4m3fn
    if kv_dtype.itemsize != 1 or choice == "native":
        return int(T.CVT_NATIVE)
    if interpreted or device.type != "cuda":
        if choice == "portable" and interpreted:
            return int(T.CVT_TRITON_INT_E4M3 if e4m3 else T.CVT_TRITON_INT_E5M2)
        return int(T.CVT_NATIVE)
    target = target or current_target(device)
    if choice == "portable" or target.is_hip:
        return int(T.CVT_TRITON_INT_E4M3 if e4m3 else T.CVT_TRITON_INT_E5M2)
    if choice == "auto" or (choice == "ptx" and not target.native_fp8):
        choice = "int"
    if choice == "ptx":
        return int(T.CVT_PTX_E4M3 if e4m3 else T.CVT_PTX_E5M2)
    return int(T.CVT_INT_E4M3 if e4m3 else T.CVT_INT_E5M2)


def launch_mla_attention(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_len: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    mid_o: torch.Tensor | None,
    mid_lse: torch.Tensor | None,
    *,
    plan: LaunchPlan,
    batch: int,
    causal: bool,
    sm_scale: float,
    scales: Scales,
    interpreted: bool,
) -> None:
    """Attention of ``q [T, H, 512|64]`` over the paged cache into ``out [T, H, 512]`` and
    ``lse [T, H]``; with ``plan.num_splits > 1`` through ``mid_o [S, T*H, 512]`` /
    ``mid_lse [S, T*H]`` fp32 partials and the merge kernel."""
    from fp8mla.kernels import mla_attention as kernels
    from fp8mla.kernels.merge import _mla_merge_kernel

    tokens, heads, d_ckv = q_nope.shape
    d_kpe = kpe.shape[-1]
    cfg = plan.config
    split = plan.num_splits > 1
    write_lse = split or lse is not None
    if split:
        o_dst, lse_dst = mid_o, mid_lse
        so = (mid_o.stride(0), heads * d_ckv, d_ckv)
        sl = (mid_lse.stride(0), heads)
    else:
        o_dst = out
        lse_dst = lse if lse is not None else out  # unused when not written
        so = (0, out.stride(0), out.stride(1))
        sl = (0, lse.stride(0) if lse is not None else 0)
    ckv_is_ptr = isinstance(scales.ckv, torch.Tensor)
    kpe_is_ptr = isinstance(scales.kpe, torch.Tensor)
    token_group = scales.ckv_arr is not None
    sa = scales.ckv_arr
    grid = (plan.m_tiles * cfg.programs_per_tile, batch, plan.num_splits)
    fp8_cvt = fp8_conversion(ckv.dtype, ckv.device, interpreted, cfg.fp8_cvt)
    dot = dot_dtype(ckv.dtype, interpreted)
    if cfg.q_fp16_copy and dot == tl.float16 and q_nope.dtype == torch.bfloat16:
        q_nope = q_nope.to(torch.float16)  # contiguous [T, H, D]: strides follow below
    if fp8_cvt:  # integer decoding reads bytes: SM80/86 Triton rejects FP8 pointer arguments
        ckv, kpe = ckv.view(torch.uint8), kpe.view(torch.uint8)
    # the Gluon kernel's pipeline is written out in it: no num_stages
    stages = {} if cfg.wgmma else {"num_stages": cfg.num_stages}
    if cfg.wgmma:
        from fp8mla.kernels.mla_wgmma import _mla_attn_wgmma_kernel as kernel
    elif cfg.value_split:
        kernel = kernels._mla_attn_vsplit_kernel
    elif cfg.swap_ab:
        kernel = kernels._mla_attn_swap_kernel
    else:
        kernel = kernels._mla_attn_rows_kernel
    kernel[grid](
        q_nope,
        q_pe if d_kpe else q_nope,
        ckv,
        kpe if d_kpe else ckv,
        sa if token_group else ckv,
        scales.ckv if ckv_is_ptr else ckv,
        scales.kpe if kpe_is_ptr else ckv,
        qo_indptr,
        kv_indptr,
        kv_indices,
        kv_len,
        o_dst,
        lse_dst,
        q_nope.stride(0),
        q_nope.stride(1),
        q_pe.stride(0) if d_kpe else 0,
        q_pe.stride(1) if d_kpe else 0,
        ckv.stride(0),
        ckv.stride(1),
        kpe.stride(0) if d_kpe else 0,
        kpe.stride(1) if d_kpe else 0,
        sa.stride(0) if token_group else 0,
        sa.stride(1) if token_group else 0,
        *so,
        *sl,
        heads,
        sm_scale * LN2_INV,
        1.0 if ckv_is_ptr else float(scales.ckv),
        1.0 if kpe_is_ptr else float(scales.kpe),
        PAGE_SIZE=ckv.shape[1],
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        D_CKV=d_ckv,
        D_KPE=d_kpe,
        CAUSAL=causal,
        TOKEN_GROUP=token_group,
        CKV_SCALE_PTR=ckv_is_ptr,
        KPE_SCALE_PTR=kpe_is_ptr,
        DOT_DTYPE=dot,
        WRITE_LSE=write_lse,
        FP8_CVT=fp8_cvt,
        num_warps=cfg.num_warps,
        **stages,
    )
    if not split:
        return
    launch_merge(mid_o, mid_lse, out, lse, qo_indptr, plan, batch, heads)


MERGE_BLOCK_D = 128


def launch_merge(
    mid_o: torch.Tensor,
    mid_lse: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    qo_indptr: torch.Tensor,
    plan: LaunchPlan,
    batch: int,
    heads: int,
) -> None:
    """The split merge over the launch's capacity: ``plan.m_tiles × block_m`` rows per request
    of ``batch`` requests (rows past a request's own exit at once)."""
    from fp8mla.kernels.merge import _mla_merge_kernel

    d = out.shape[-1]
    rows_per_request = plan.m_tiles * plan.config.block_m
    block_s = min(16, triton.next_power_of_2(plan.num_splits))
    _mla_merge_kernel[(d // MERGE_BLOCK_D, rows_per_request, batch)](
        mid_o,
        mid_lse,
        out,
        lse if lse is not None else mid_lse,
        qo_indptr,
        plan.num_splits,
        heads,
        out.shape[0],
        mid_o.stride(0),
        mid_lse.stride(0),
        out.stride(0),
        out.stride(1),
        lse.stride(0) if lse is not None else 0,
        D=d,
        BLOCK_D=MERGE_BLOCK_D,
        BLOCK_S=block_s,
        WRITE_LSE=lse is not None,
        num_warps=4,
    )
