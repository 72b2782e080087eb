"""Launching the attention kernel variants and the split merge.

``plan()`` builds one :class:`AttentionLaunch`: the variant's kernel, its grid and every
argument that the batch fixes (index arrays, scalars, constexprs, the workspace partials).
``run()`` adds the tensors of the call and launches. Inputs are validated by the caller; this
module does no host synchronization and no allocation beyond what the caller hands it
(CUDA-graph safe), except the fp16 copy of the queries that value-split tiles with
``q_fp16_copy`` read (PyTorch's caching allocator serves it, under graph capture too).

Triton's generic launcher binds and specializes every argument on every call (tens of
microseconds of host time for ~45 arguments). :class:`KernelLauncher` keeps the compiled kernel
of the first launch and calls it directly afterwards, as long as the call's tensors keep the
specialization it was compiled for (16-byte aligned pointers, strides divisible by 16), which
the few cheap checks in :meth:`AttentionLaunch.__call__` establish; any other call takes
Triton's path.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
import triton
import triton.language as tl

try:  # Triton's runtime settings (profiling hooks live there); a submodule, imported by name
    from triton import knobs as _knobs
except ImportError:  # older Triton: no hooks to respect, and no direct path either
    _knobs = None

from fp8mla.attention.config import LaunchPlan
from fp8mla.attention.targets import Target, current_target
from fp8mla.attention.variants import get_variant
from fp8mla.formats import Scales

LN2_INV = 1.4426950408889634  # 1 / ln 2: softmax runs in base 2
MERGE_BLOCK_D = 128  # output columns per merge program


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
    alike); in the interpreter the same Triton-op integer path (its own FP8 cast turns NaN codes
    into finite values). ``portable`` forces the Triton-op integer path anywhere; ``native``
    Triton's cast; ``ptx`` falls back to ``int`` below SM89 and both fall back to ``portable``
    on AMD."""
    from fp8mla.kernels import mla_tiles as T

    if choice not in FP8_CVT_CHOICES:
        raise ValueError(f"expected fp8_cvt in {'/'.join(FP8_CVT_CHOICES)}, got {choice!r}")
    e4m3 = kv_dtype == torch.float8_e4m3fn
    if kv_dtype.itemsize != 1 or choice == "native":
        return int(T.CVT_NATIVE)
    if interpreted or device.type != "cuda" or (target is not None and not target.is_gpu):
        if interpreted:
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


class KernelLauncher:
    """One kernel with a fixed grid and launch options; arguments by name.

    ``launch(args, key)``: with a ``key`` (a hashable naming the specialization of the call's
    arguments), a kernel compiled by an earlier launch with the same key is called directly;
    with ``key=None`` every launch takes Triton's own path (the interpreter, profiling hooks,
    arguments outside the fast specialization)."""

    def __init__(
        self, fn: Any, grid: tuple[int, int, int], options: dict[str, int], device: int = 0
    ) -> None:
        self.fn = fn
        self.grid = grid
        self.options = options
        self.names: list[str] = list(getattr(fn, "arg_names", ()))
        self.defaults = {
            p.name: p.default for p in getattr(fn, "params", ()) if getattr(p, "has_default", False)
        }
        self._compiled: dict[Hashable, Any] = {}
        self._device = device  # CUDA index whose current stream a direct launch uses
        self.direct_launches = 0  # launches that skipped Triton's path (for tests)

    def launch(self, args: dict[str, Any], key: Hashable | None) -> None:
        if key is not None and self._direct_ok():
            kernel = self._compiled.get(key)
            if kernel is not None:
                ordered = [args[n] if n in args else self.defaults[n] for n in self.names]
                stream = _current_stream(self._device)
                g0, g1, g2 = self.grid
                kernel.run(g0, g1, g2, stream, kernel.function, kernel.packed_metadata,
                           None, None, None, *ordered)  # fmt: skip
                self.direct_launches += 1
                return
        kernel = self.fn[self.grid](**args, **self.options)
        if key is not None and kernel is not None and hasattr(kernel, "packed_metadata"):
            self._compiled[key] = kernel

    @staticmethod
    def _direct_ok() -> bool:
        """Profilers hook Triton's launches: leave those to Triton's path. A hook is a
        callable, None, or (Triton 3.5+) a ``HookChain`` whose ``calls`` may be empty."""
        runtime = getattr(_knobs, "runtime", None)
        if runtime is None:
            return False
        for name in ("launch_enter_hook", "launch_exit_hook"):
            hook = getattr(runtime, name, None)
            if hook is not None and (not hasattr(hook, "calls") or hook.calls):
                return False
        return True


_NAN_ROWS: dict[torch.device, torch.Tensor] = {}
NAN_ROW_ELEMENTS = 1024 + 16  # a NaN row wider than any cache row (576), and room to align it


def nan_row(device: torch.device) -> torch.Tensor:
    """FP8 NaN codes (0x7F in both formats) as bytes on ``device``: the row a token whose
    page-table entry is bad reads instead of the cache in the Gluon kernels (which read FP8
    bytes), so that nothing outside the cache is read and its rows turn NaN."""
    row = _NAN_ROWS.get(device)
    if row is None:
        row = torch.full((NAN_ROW_ELEMENTS,), 0x7F, dtype=torch.uint8, device=device)
        _NAN_ROWS[device] = row
    return row


def _nan_offset(base: torch.Tensor, nan: torch.Tensor) -> int:
    """Element offset from ``base``'s data pointer to a NaN row inside ``nan``, a multiple of
    16 elements: the kernels' row offsets keep Triton's divisibility, so their loads stay
    16-byte vectors."""
    es = base.element_size()
    start = ((base.data_ptr() - nan.data_ptr()) // es) % 16  # 0 … 15 elements into ``nan``
    return (nan.data_ptr() - base.data_ptr()) // es + start


def _current_stream(device: int) -> int:
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device)
    return torch.cuda.current_stream(device).cuda_stream


def _aligned(*tensors: torch.Tensor) -> bool:
    """All data pointers 16-byte aligned (Triton's pointer specialization)."""
    acc = 0
    for t in tensors:
        acc |= t.data_ptr()
    return acc & 15 == 0


def _strides16(*values: int) -> bool:
    """All values divisible by 16 (Triton's integer specialization; 0 and 1 are not)."""
    acc = 0
    for v in values:
        if v == 0:
            return False
        acc |= v
    return acc & 15 == 0


class AttentionLaunch:
    """The attention launch of one plan (and the merge when it splits the KV).

    Args:
        plan: variant, tile and grid shape.
        batch: requests in the grid (the buffer capacity under CUDA graphs).
        heads, head_dim_kpe, causal, sm_scale: the batch's attention parameters.
        indices: ``(qo_indptr, kv_indptr, kv_indices, kv_len)`` int32 on the device.
        partials: ``(mid_o, mid_lse)`` workspace views when ``plan.num_splits > 1``.
        kv_dtype: storage dtype of the cache.
        target: where it runs (``targets.INTERPRETER`` on the CPU).
        interpreted: Triton's interpreter runs the kernels.
    """

    def __init__(
        self,
        plan: LaunchPlan,
        *,
        batch: int,
        heads: int,
        head_dim_kpe: int,
        causal: bool,
        sm_scale: float,
        indices: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        partials: tuple[torch.Tensor, torch.Tensor] | None,
        kv_dtype: torch.dtype,
        device: torch.device,
        target: Target,
        interpreted: bool,
    ) -> None:
        cfg = plan.config
        self.plan = plan
        self.variant = get_variant(cfg.variant)
        self.split = plan.num_splits > 1
        self.heads = heads
        self.d_kpe = head_dim_kpe
        self.partials = partials
        self.interpreted = interpreted
        self.fp8_cvt = fp8_conversion(kv_dtype, device, interpreted, cfg.fp8_cvt, target)
        self.dot = dot_dtype(kv_dtype, interpreted)
        self.q_fp16 = cfg.q_fp16_copy and self.dot == tl.float16
        qo, kvp, idx, kvl = indices
        if idx.numel() == 0:  # the kernels clamp entries into kv_indices: never let it be empty
            idx = torch.zeros(1, dtype=torch.int32, device=device)
        self.qo_indptr = qo
        self.fixed: dict[str, Any] = dict(
            qo_indptr_ptr=qo,
            kv_indptr_ptr=kvp,
            kv_indices_ptr=idx,
            kv_len_ptr=kvl,
            num_heads=heads,
            num_indices=idx.numel(),
            sm_scale_log2=sm_scale * LN2_INV,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            D_CKV=512,
            D_KPE=head_dim_kpe,
            CAUSAL=causal,
            DOT_DTYPE=self.dot,
            FP8_CVT=self.fp8_cvt,
        )
        if self.split:
            mid_o, mid_lse = partials
            self.fixed.update(
                o_ptr=mid_o,
                lse_ptr=mid_lse,
                stride_o_split=mid_o.stride(0),
                stride_o_t=heads * 512,
                stride_o_h=512,
                stride_lse_split=mid_lse.stride(0),
                stride_lse_t=heads,
                WRITE_LSE=True,
            )
        options = {"num_warps": cfg.num_warps}
        if not self.variant.gluon:
            options["num_stages"] = cfg.num_stages
        grid = (plan.m_tiles * self.variant.programs_per_tile, batch, plan.num_splits)
        index = device.index if device.index is not None else 0
        if device.type == "cuda" and device.index is None:
            index = torch.cuda.current_device()
        self.kernel = KernelLauncher(self.variant.load(), grid, options, index)
        # the Gluon kernels point a bad page entry's token at a NaN row; the Triton kernels
        # check their split's entries after the KV loop instead
        self.nan_row = nan_row(device) if "nan_row_ckv" in self.kernel.names else None
        self.merge = None
        if self.split:
            from fp8mla.kernels.merge import _mla_merge_kernel

            block_s = min(16, triton.next_power_of_2(plan.num_splits))
            mid_o, mid_lse = partials
            self.merge_fixed: dict[str, Any] = dict(
                mid_o_ptr=mid_o,
                mid_lse_ptr=mid_lse,
                qo_indptr_ptr=qo,
                num_splits=plan.num_splits,
                num_heads=heads,
                stride_mo_split=mid_o.stride(0),
                stride_ml_split=mid_lse.stride(0),
                D=512,
                BLOCK_D=MERGE_BLOCK_D,
                BLOCK_S=block_s,
            )
            merge_grid = (512 // MERGE_BLOCK_D, plan.rows_per_request, batch)
            self.merge = KernelLauncher(_mla_merge_kernel, merge_grid, {"num_warps": 4}, index)

    def __call__(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv: torch.Tensor,
        kpe: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor | None,
        scales: Scales,
    ) -> None:
        """Attention of ``q [T, H, 512|64]`` over the paged cache into ``out [T, H, 512]``
        and ``lse [T, H]`` (checked by the caller)."""
        d_kpe = self.d_kpe
        if self.q_fp16 and q_nope.dtype == torch.bfloat16:
            q_nope = q_nope.to(torch.float16)  # contiguous [T, H, D]
        if self.fp8_cvt:  # integer decoding reads bytes: SM80/86 Triton rejects FP8 pointers
            ckv, kpe = ckv.view(torch.uint8), kpe.view(torch.uint8)
        q_pe = q_pe if d_kpe else q_nope
        kpe = kpe if d_kpe else ckv
        ckv_ptr = isinstance(scales.ckv, torch.Tensor)
        kpe_ptr = isinstance(scales.kpe, torch.Tensor)
        sa = scales.ckv_arr
        group = sa is not None
        args = dict(self.fixed)
        args.update(
            q_nope_ptr=q_nope,
            q_pe_ptr=q_pe,
            ckv_ptr=ckv,
            kpe_ptr=kpe,
            scale_arr_ptr=sa if group else ckv,
            ckv_scale_ptr=scales.ckv if ckv_ptr else ckv,
            kpe_scale_ptr=scales.kpe if kpe_ptr else ckv,
            stride_qn_t=q_nope.stride(0),
            stride_qn_h=q_nope.stride(1),
            stride_qp_t=q_pe.stride(0),
            stride_qp_h=q_pe.stride(1),
            stride_ckv_p=ckv.stride(0),
            stride_ckv_s=ckv.stride(1),
            stride_kpe_p=kpe.stride(0),
            stride_kpe_s=kpe.stride(1),
            stride_sa_p=sa.stride(0) if group else 0,
            stride_sa_s=sa.stride(1) if group else 0,
            num_tokens=q_nope.shape[0],
            num_pages=ckv.shape[0],
            ckv_scale_val=1.0 if ckv_ptr else float(scales.ckv),
            kpe_scale_val=1.0 if kpe_ptr else float(scales.kpe),
            PAGE_SIZE=ckv.shape[1],
            TOKEN_GROUP=group,
            CKV_SCALE_PTR=ckv_ptr,
            KPE_SCALE_PTR=kpe_ptr,
        )
        nan = self.nan_row
        if nan is not None:
            args.update(nan_row_ckv=_nan_offset(ckv, nan), nan_row_kpe=_nan_offset(kpe, nan))
        if not self.split:
            write_lse = lse is not None
            args.update(
                o_ptr=out,
                lse_ptr=lse if write_lse else out,
                stride_o_split=0,
                stride_o_t=out.stride(0),
                stride_o_h=out.stride(1),
                stride_lse_split=0,
                stride_lse_t=lse.stride(0) if write_lse else 0,
                WRITE_LSE=write_lse,
            )
        key = None
        if not self.interpreted:
            tensors = [q_nope, q_pe, ckv, kpe, out]
            if ckv_ptr:
                tensors.append(scales.ckv)
            if kpe_ptr:
                tensors.append(scales.kpe)
            strides = [
                args["stride_qn_t"], args["stride_qn_h"], args["stride_ckv_p"],
                args["stride_kpe_p"], args["stride_ckv_s"], args["stride_kpe_s"],
            ]  # fmt: skip
            wide = False
            if nan is not None:
                strides += [args["nan_row_ckv"], args["nan_row_kpe"]]
                # Triton types an int argument i32 or i64 by its value: part of the key
                wide = not all(-(2**31) <= args[n] < 2**31 for n in ("nan_row_ckv", "nan_row_kpe"))
            if d_kpe:
                strides += [args["stride_qp_t"], args["stride_qp_h"]]
            if not self.split:
                strides += [args["stride_o_t"], args["stride_o_h"]]
            if lse is not None:
                tensors.append(lse)
                if not self.split:
                    strides.append(args["stride_lse_t"])
            if group:
                tensors.append(sa)
            if group:
                strides += [args["stride_sa_p"], args["stride_sa_s"]]
            if _aligned(*tensors) and _strides16(*strides):
                key = (ckv_ptr, kpe_ptr, group, lse is not None, ckv.shape[1], wide)
        self.kernel.launch(args, key)
        if self.merge is not None:
            write_lse = lse is not None
            margs = dict(self.merge_fixed)
            margs.update(
                o_ptr=out,
                lse_ptr=lse if write_lse else self.partials[1],
                num_tokens=out.shape[0],
                stride_o_t=out.stride(0),
                stride_o_h=out.stride(1),
                stride_lse_t=lse.stride(0) if write_lse else 0,
                WRITE_LSE=write_lse,
            )
            mkey = None
            if key is not None:
                mstrides = [out.stride(0), out.stride(1)] + ([lse.stride(0)] if write_lse else [])
                if _strides16(*mstrides):
                    mkey = (write_lse,)
            self.merge.launch(margs, mkey)
