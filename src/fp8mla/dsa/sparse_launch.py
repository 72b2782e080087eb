"""Launching the sparse MLA kernel of one plan (and its split merge).

:class:`SparseLaunch` holds what ``plan()`` fixed -- the grid, the constexprs, the workspace
partials -- and ``__call__`` adds the call's tensors: the cache's views and strides, the
queries, the index list, the outputs. The caller has validated them; nothing here reads device
memory on the host or allocates (CUDA-graph safe), except the fp32 staging of a bf16 output
under the interpreter, whose own fp32 → bf16 rounding truncates.

Launches after the first of a specialization call the compiled kernel directly
(``fp8mla.attention.kernel_launcher``), keyed by everything Triton specializes on.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
import triton.language as tl

from fp8mla.attention.kernel_launcher import KernelLauncher
from fp8mla.attention.launch import LN2_INV, fp8_conversion
from fp8mla.attention.targets import Target
from fp8mla.attention.workspace import Partials
from fp8mla.dsa.sparse_cache import SparseCache
from fp8mla.dsa.sparse_plan import SparsePlan, sparse_table

KERNEL = "fp8mla.kernels.portable.sparse_mla:sparse_mla_kernel"
MERGE = "fp8mla.kernels.portable.sparse_mla:sparse_mla_merge_kernel"
TORCH_TO_TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
MERGE_WARPS = 4


def dot_dtypes(q_dtype: torch.dtype, cache: SparseCache | torch.dtype, interpreted: bool):
    """``(DOT_DTYPE, ROPE_DTYPE)``: the latent dots in fp16 for the packed cache (its e4m3
    values are exact there) or in the 16-bit cache's dtype, the RoPE dot in the query's dtype;
    fp32 under the interpreter, whose bf16 arithmetic is unreliable."""
    if interpreted:
        return tl.float32, tl.float32
    dtype = cache.dtype if isinstance(cache, SparseCache) else cache
    latent = tl.float16 if dtype.itemsize == 1 else TORCH_TO_TL[dtype]
    return latent, TORCH_TO_TL[q_dtype]


def stride_unit(cache: SparseCache) -> int:
    """Bytes per stride unit of the kernel: 16 when the cache's strides allow it (Triton then
    knows every row starts 16-byte aligned and loads it in 16-byte vectors), else the largest
    power of two of the element sizes the kernel reads (4: the packed cache's float32 scales;
    2: a 16-bit cache)."""
    _, page, token = cache.addressing()
    for unit in (16, 8, 4):
        if page % unit == 0 and token % unit == 0:
            return unit
    return 2


def specialization(value: Any) -> Hashable:
    """What Triton specializes a launch on for this argument value: a tensor's dtype and
    16-byte alignment, an int's 1 / multiple of 16 / 64-bit-ness, a constexpr's value."""
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, bool) or value is None or isinstance(value, tl.dtype):
        return value
    if isinstance(value, int):
        return (value == 1, value % 16 == 0, -(2**31) <= value < 2**31)
    if isinstance(value, float):
        return float
    return value


class SparseLaunch:
    """The kernels of one plan.

    Args:
        plan: tile, grid and splits.
        sm_scale: the softmax scale.
        q_dtype: the queries' dtype.
        kv_dtype: the cache's dtype (uint8/int8/float8_e4m3fn: packed; bf16/fp16: 16-bit).
        partials: the workspace's split partials when ``plan.split``.
        device, target: where it runs (``targets.INTERPRETER`` under the interpreter).
        interpreted: Triton's interpreter runs the kernels.
        fp8_cvt: how e4m3 bytes become fp16 (``fp8mla.attention.launch.fp8_conversion``).
    """

    def __init__(
        self,
        plan: SparsePlan,
        *,
        sm_scale: float,
        q_dtype: torch.dtype,
        kv_dtype: torch.dtype,
        partials: Partials | None,
        device: torch.device,
        target: Target,
        interpreted: bool,
        fp8_cvt: str = "auto",
    ) -> None:
        import importlib

        self.plan = plan
        self.partials = partials
        self.interpreted = interpreted
        self.packed = kv_dtype.itemsize == 1
        if fp8_cvt == "auto":  # the target's table's choice for this kernel
            fp8_cvt = sparse_table(target).fp8_cvt
        self.cvt = (
            fp8_conversion(torch.float8_e4m3fn, device, interpreted, fp8_cvt, target)
            if self.packed
            else 0
        )
        from fp8mla.kernels.portable import fp8_decode as F

        integer = self.cvt in (int(F.CVT_INT_E4M3), int(F.CVT_TRITON_INT_E4M3))
        latent, rope = dot_dtypes(q_dtype, kv_dtype, interpreted)
        tile = plan.tile
        self.fixed: dict[str, Any] = dict(
            num_heads=plan.num_heads,
            topk=plan.topk,
            split_len=plan.split_len,
            sm_scale_log2=float(sm_scale) * LN2_INV,
            BLOCK_H=tile.block_h,
            BLOCK_N=tile.block_n,
            head_groups=plan.head_groups,
            num_splits=plan.num_splits,
            VALUE_SPLIT=tile.value_split,
            PACKED=self.packed,
            SPLIT=plan.split,
            DOT_DTYPE=latent,
            ROPE_DTYPE=rope,
            FP8_CVT=self.cvt,
            DECODE_SCALE=256.0 if integer else 1.0,
        )
        if plan.split:
            self.fixed.update(
                o_ptr=partials.o,
                lse_ptr=partials.lse,
                stride_o_split=partials.o.stride(0),
                stride_o_t=plan.num_heads * partials.o.shape[2],
                stride_o_h=partials.o.shape[2],
                stride_lse_split=partials.lse.stride(0),
                stride_lse_t=plan.num_heads,
                WRITE_LSE=True,
            )
        index = device.index if device.index is not None else 0
        if device.type == "cuda" and device.index is None:
            index = torch.cuda.current_device()
        module = importlib.import_module(KERNEL.split(":")[0])
        options = {"num_warps": tile.num_warps, "num_stages": tile.num_stages}
        cap = tile.max_registers(target.warp_size) if target.backend == "cuda" else None
        if cap is not None and not interpreted:
            options["maxnreg"] = cap
        self.kernel = KernelLauncher(module.sparse_mla_kernel, (plan.programs, 1, 1), options,
                                     index)  # fmt: skip
        self.merge = None
        if plan.split:
            grid = (plan.num_tokens * plan.num_heads, 512 // plan.merge_block_d, 1)
            self.merge = KernelLauncher(module.sparse_mla_merge_kernel, grid,
                                        {"num_warps": MERGE_WARPS}, index)  # fmt: skip
            self.merge_fixed: dict[str, Any] = dict(
                part_o_ptr=partials.o,
                part_lse_ptr=partials.lse,
                num_heads=plan.num_heads,
                stride_po_split=partials.o.stride(0),
                stride_pl_split=partials.lse.stride(0),
                num_splits=plan.num_splits,
                BLOCK_S=plan.merge_block_s,
                BLOCK_D=plan.merge_block_d,
            )

    def __call__(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        cache: SparseCache,
        indices: torch.Tensor,
        topk_length: torch.Tensor | None,
        out: torch.Tensor,
        lse: torch.Tensor | None,
    ) -> None:
        """Attention of ``q [T, H, 512 | 64]`` over ``cache`` into ``out [T, H, 512]`` and
        ``lse [T, H]`` (natural log), ``indices [T, topk]`` int32 (checked by the caller)."""
        if self.interpreted and out.dtype == torch.bfloat16:
            # the interpreter rounds fp32 → bf16 toward zero: the kernels write fp32 and
            # PyTorch rounds to nearest, as a GPU does
            wide = torch.empty(out.shape, dtype=torch.float32, device=out.device)
            self(q_nope, q_pe, cache, indices, topk_length, wide, lse)
            out.copy_(wide)
            return
        tokens = q_nope.shape[0]
        if tokens == 0:
            return
        page_size, page, token = cache.addressing()
        unit = stride_unit(cache)
        data = cache.data
        if self.packed:
            from fp8mla.kernels.portable import fp8_decode as F

            kv = data.view(torch.float8_e4m3fn) if self.cvt == int(F.CVT_NATIVE) else data
            scale, rope = data.view(torch.float32), data.view(torch.bfloat16)
        else:
            kv = scale = rope = data
        args: dict[str, Any] = dict(
            q_nope_ptr=q_nope,
            q_pe_ptr=q_pe,
            kv_ptr=kv,
            scale_ptr=scale,
            rope_ptr=rope,
            indices_ptr=indices,
            topk_length_ptr=topk_length if topk_length is not None else indices,
            stride_qn_t=q_nope.stride(0),
            stride_qn_h=q_nope.stride(1),
            stride_qp_t=q_pe.stride(0),
            stride_qp_h=q_pe.stride(1),
            stride_idx_t=indices.stride(0),
            stride_page=page // unit,
            stride_tok=token // unit,
            num_tokens=tokens,
            num_slots=cache.num_slots,
            PAGE_SIZE=page_size,
            UNIT=unit,
            HAS_TOPK_LENGTH=topk_length is not None,
            **self.fixed,
        )
        if not self.plan.split:
            args.update(
                o_ptr=out,
                lse_ptr=lse if lse is not None else out,
                stride_o_split=0,
                stride_o_t=out.stride(0),
                stride_o_h=out.stride(1),
                stride_lse_split=0,
                stride_lse_t=lse.stride(0) if lse is not None else 0,
                WRITE_LSE=lse is not None,
            )
        self._launch(self.kernel, args)
        if self.merge is not None:
            margs = dict(
                o_ptr=out,
                lse_ptr=lse if lse is not None else out,
                num_rows=tokens * self.plan.num_heads,
                stride_o_t=out.stride(0),
                stride_o_h=out.stride(1),
                stride_lse_t=lse.stride(0) if lse is not None else 0,
                WRITE_LSE=lse is not None,
                **self.merge_fixed,
            )
            self._launch(self.merge, margs)

    def _launch(self, launcher: KernelLauncher, args: dict[str, Any]) -> None:
        """Triton's path under the interpreter; else keyed by the arguments' specialization,
        so that later calls of the same one launch the compiled kernel directly."""
        key = None
        if not self.interpreted:
            key = tuple(specialization(args[n]) for n in launcher.names if n in args)
        launcher.launch(args, key)
