"""Launching the attention kernel variants and the split merge.

``plan()`` builds one :class:`AttentionLaunch`: the variant's kernel, its grid and every
argument that the batch fixes (index arrays, scalars, constexprs, the workspace partials).
``run()`` adds the tensors of the call and launches. Inputs are validated by the caller; this
module does no host synchronization and no allocation beyond what the caller hands it
(CUDA-graph safe), except the fp16 copy of the queries that value-split tiles with
``q_fp16_copy`` read (PyTorch's caching allocator serves it, under graph capture too).

Launches past the first of a specialization skip Triton's launcher: the kernels bound in C
(``native.py``), or called directly (``kernel_launcher.py``) where that is not available; the
few cheap checks in :meth:`AttentionLaunch.__call__` establish the specialization (16-byte
aligned pointers, strides divisible by 16); any other call takes Triton's path.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
import triton.language as tl

from fp8mla.attention import kernel_launcher, native
from fp8mla.attention.config import LaunchPlan
from fp8mla.attention.kernel_launcher import (
    ArgumentBinder,
    KernelLauncher,
    aligned16,
    all16,
    int_class,
)
from fp8mla.attention.planner import merge_block_s
from fp8mla.attention.targets import Target, current_target
from fp8mla.attention.variants import get_variant
from fp8mla.attention.workspace import Partials
from fp8mla.formats import Scales

LN2_INV = 1.4426950408889634  # 1 / ln 2: softmax runs in base 2


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
    from fp8mla.kernels.portable import fp8_decode as T

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


_NAN_ROWS: dict[tuple[torch.device, int], torch.Tensor] = {}
NAN_ROW_ELEMENTS = 1024 + 16  # a NaN row wider than any cache row (576), and room to align it
NAN_OFFSETS_KEPT = 1024  # cache pairs whose NaN-row offsets a launch remembers (layers × pools)


def nan_row(device: torch.device, element_size: int = 1) -> torch.Tensor:
    """NaN codes for caches of ``element_size`` bytes, ``NAN_ROW_ELEMENTS`` of them, as bytes
    on ``device``: the row a token whose page-table entry is bad reads instead of the cache in
    the Gluon kernels, so that nothing outside the cache is read and its rows turn NaN. FP8:
    0x7F (NaN in e4m3 and e5m2); 16-bit: 0xFFFF (NaN in fp16 and bf16, where 0x7F7F is a
    finite bf16)."""
    row = _NAN_ROWS.get((device, element_size))
    if row is None:
        fill = 0x7F if element_size == 1 else 0xFF
        row = torch.full((NAN_ROW_ELEMENTS * element_size,), fill, dtype=torch.uint8, device=device)
        _NAN_ROWS[device, element_size] = row
    return row


def _nan_offset(base: int, element_size: int, nan: int) -> int:
    """Element offset from the address ``base`` (of elements of ``element_size`` bytes) to a
    NaN row inside the NaN-row buffer at ``nan``, a multiple of 16 elements: the kernels' row
    offsets keep Triton's divisibility, so their loads stay 16-byte vectors."""
    start = ((base - nan) // element_size) % 16  # 0 … 15 elements into the buffer
    return (nan - base) // element_size + start


# The arguments each run() supplies, in the order AttentionLaunch.__call__ lists their values;
# every other parameter of an attention kernel is fixed at plan() or left to its default.
CALL_ARGS = (
    "q_nope_ptr", "q_pe_ptr", "ckv_ptr", "kpe_ptr", "scale_arr_ptr", "ckv_scale_ptr",
    "kpe_scale_ptr", "stride_qn_t", "stride_qn_h", "stride_qp_t", "stride_qp_h", "stride_ckv_p",
    "stride_ckv_s", "stride_kpe_p", "stride_kpe_s", "stride_sa_p", "stride_sa_s", "num_pages",
    "ckv_scale_val", "kpe_scale_val", "TOKEN_GROUP", "CKV_SCALE_PTR", "KPE_SCALE_PTR",
    "num_tokens",
)  # fmt: skip
CALL_POINTERS = CALL_ARGS[:7]  # the call's tensors, passed as addresses on the direct path
OUT_ARGS = ("o_ptr", "lse_ptr", "stride_o_t", "stride_o_h", "stride_lse_t", "WRITE_LSE")
NAN_ARGS = ("nan_row_ckv", "nan_row_kpe")  # the Gluon kernels' NaN-row offsets
CACHE_POINTERS = ("ckv_ptr", "kpe_ptr", "scale_arr_ptr", "ckv_scale_ptr", "kpe_scale_ptr")
MERGE_CALL_ARGS = ("o_ptr", "lse_ptr", "num_tokens", "stride_o_t", "stride_o_h", "stride_lse_t",
                   "WRITE_LSE")  # fmt: skip
# a split launch that merges in its grid (merge_in_grid): the output as the merge writes it
GRID_MERGE_ARGS = ("out_ptr", "out_lse_ptr", "stride_out_t", "stride_out_h", "stride_out_lse_t",
                   "WRITE_OUT_LSE")  # fmt: skip
Q_SCALE_ARGS = ("q_scale_ptr", "stride_qs_t", "q_scale_val", "Q_SCALE")  # FP8-query builds
# a launch whose page table and lengths each call gives (index_lists: the sparse index lists)
LIST_ARGS = ("kv_indices_ptr", "kv_len_ptr")


def _partial_outputs(plan: LaunchPlan, partials: Partials, heads: int) -> dict[str, Any]:
    """The attention kernel's output arguments of a split plan: the workspace's partials
    (fp16 ones with their factor where ``plan.half_partials``)."""
    if plan.half_partials != (partials.mult is not None):
        raise ValueError("expected partials with a factor exactly for a half_partials plan")
    args: dict[str, Any] = dict(
        o_ptr=partials.o,
        lse_ptr=partials.lse,
        stride_o_split=partials.o.stride(0),
        stride_o_t=heads * 512,
        stride_o_h=512,
        stride_lse_split=partials.lse.stride(0),
        stride_lse_t=heads,
        WRITE_LSE=True,
    )
    if plan.half_partials:
        args.update(mult_ptr=partials.mult, HALF_PARTIALS=True)
    return args


def _merge_launch(
    plan: LaunchPlan, partials: Partials, qo: torch.Tensor, heads: int, batch: int, index: int
) -> tuple[KernelLauncher, dict[str, Any]]:
    """The split merge of ``plan``: its launcher and the arguments bound at plan()."""
    from fp8mla.kernels.portable.merge import mla_merge_kernel

    block_s = merge_block_s(
        plan.num_splits, plan.merge_block_d, plan.merge_warps, plan.half_partials
    )
    fixed: dict[str, Any] = dict(
        mid_o_ptr=partials.o,
        mid_lse_ptr=partials.lse,
        qo_indptr_ptr=qo,
        num_splits=plan.num_splits,
        num_heads=heads,
        stride_mo_split=partials.o.stride(0),
        stride_ml_split=partials.lse.stride(0),
        D=512,
        BLOCK_D=plan.merge_block_d,
        BLOCK_S=block_s,
        WAIT_PRIOR=plan.merge_waits,
        LAUNCH_NEXT=plan.attention_waits,
        # fp16 partials' factor (None: fp32 partials; every argument is bound here, as the
        # interpreter's kernels have no defaults to fall back on)
        mid_mult_ptr=partials.mult,
    )
    grid = (512 // plan.merge_block_d, plan.rows_per_request, batch)
    options = {"num_warps": plan.merge_warps}
    if plan.merge_waits:  # Triton launches it with the programmatic-dependency attribute
        options["launch_pdl"] = True
    return KernelLauncher(mla_merge_kernel, grid, options, index), fixed


class AttentionLaunch:
    """The attention launch of one plan (and the merge when it splits the KV).

    Args:
        plan: variant, tile and grid shape.
        batch: requests in the grid (the buffer capacity under CUDA graphs).
        heads, head_dim_kpe, page_size, causal, sm_scale: the batch's attention parameters.
        indices: ``(qo_indptr, kv_indptr, kv_indices, kv_len)`` int32 on the device.
        partials: the workspace views of the partials when ``plan.num_splits > 1`` (with
            their factor where ``plan.half_partials``).
        kv_dtype: storage dtype of the cache.
        target: where it runs (``targets.INTERPRETER`` on the CPU).
        interpreted: Triton's interpreter runs the kernels.
        kernel_options: compile-time options the kernel declares with defaults (tuning).
        q_fp8: the kernel's FP8-query build (``query.QF8_*``; 0: 16-bit queries).
        index_lists: each call passes the page table and the lengths (``lists``: the sparse
            path's index lists as they are); ``indices``' two give their sizes only.
        merge_in_grid: a split plan's programs merge the splits themselves, no merge launch
            (``kernels/sm90/grid_merge.py``): only for a grid whose programs are all resident
            at once, one row tile a request, on a kernel that declares ``MERGE_IN_GRID``; 2:
            with a second program a split that only merges (twice the grid).
    """

    def __init__(
        self,
        plan: LaunchPlan,
        *,
        batch: int,
        heads: int,
        head_dim_kpe: int,
        page_size: int,
        causal: bool,
        sm_scale: float,
        indices: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
        partials: Partials | None,
        kv_dtype: torch.dtype,
        device: torch.device,
        target: Target,
        interpreted: bool,
        kernel_options: dict[str, Any] | None = None,
        q_fp8: int = 0,
        index_lists: bool = False,
        merge_in_grid: int = 0,
    ) -> None:
        cfg = plan.config
        self.plan = plan
        self.variant = get_variant(cfg.variant)
        if self.variant.one_row_tile and plan.m_tiles > 1:  # its grid has no row-tile axis
            raise ValueError(
                f"expected one row tile per request for the {cfg.variant} kernel, got "
                f"{plan.m_tiles} tiles of {cfg.block_m} rows"
            )
        self.split = plan.num_splits > 1
        self.heads = heads
        self.d_kpe = head_dim_kpe
        self.page_size = page_size
        self.kv_dtype = kv_dtype
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
            PAGE_SIZE=page_size,
            stride_o_split=0,
            stride_lse_split=0,
        )
        if self.split:
            self.fixed.update(_partial_outputs(plan, partials, heads))
        kernel_fn = self.variant.load()
        self.merge_in_grid = merge_in_grid
        if merge_in_grid:
            if not self.split or plan.m_tiles > 1 or "MERGE_IN_GRID" not in kernel_fn.arg_names:
                raise ValueError(
                    f"expected a split plan of one row tile a request on a kernel that merges "
                    f"in its grid for merge_in_grid, got {plan.num_splits} splits, "
                    f"{plan.m_tiles} row tiles, {cfg.variant}"
                )
            # each request's arrival counter (grid_merge.request_barrier): zero once, then
            # grown by the request's programs at every call
            sync = torch.zeros(max(1, batch), dtype=torch.int64, device=device)
            self.fixed.update(MERGE_IN_GRID=int(merge_in_grid), sync_ptr=sync)
        if "ROW_TILES" in getattr(kernel_fn, "arg_names", ()):  # compiled apart for > 1 tile
            self.fixed["ROW_TILES"] = plan.m_tiles > 1
        self.q_call = bool(q_fp8)  # the call passes the query scale (Q_SCALE_ARGS)
        names = getattr(kernel_fn, "arg_names", ())
        if "Q_FP8" in names:
            self.fixed["Q_FP8"] = q_fp8
            if "P_PARTS" in names:  # the portable builds: P as hi + lo, rounded by integer
                self.fixed.update(ROUND_INT=interpreted, P_PARTS=2)  # ops in the interpreter
            if not q_fp8 and self.variant.fp8_queries:  # its scale arguments in every build
                self.fixed.update(q_scale_ptr=qo, stride_qs_t=0, q_scale_val=1.0, Q_SCALE=0)
        elif q_fp8:
            raise ValueError(f"expected a kernel with an FP8-query build, got {cfg.variant}")
        options = {"num_warps": cfg.num_warps}
        if not self.variant.gluon:
            options["num_stages"] = cfg.num_stages
        if plan.attention_waits:  # a programmatic dependent of the grid before it
            options["launch_pdl"] = True
            self.fixed["WAIT_PRIOR"] = True
        if merge_in_grid:  # the request's programs wait for each other: all resident at once
            options["launch_cooperative_grid"] = True
        cap = cfg.max_registers(target.warp_size) if target.backend == "cuda" else None
        if cap is not None and not interpreted and not q_fp8:  # FP8-query builds: uncapped
            options["maxnreg"] = cap
        if q_fp8:  # the FP8-query build's own options
            options.update(dict(self.variant.fp8_query_options))
        if kernel_options:  # compile-time options the kernel declares with defaults (tuning)
            declared = kernel_launcher.declared_options(kernel_fn)
            unknown = sorted(set(kernel_options) - declared)
            if unknown:
                raise ValueError(
                    f"expected kernel_options among the {cfg.variant} kernel's "
                    f"{sorted(declared)}, got {unknown}"
                )
            self.fixed.update({k: v for k, v in kernel_options.items() if k in self.fixed})
            options.update({k: v for k, v in kernel_options.items() if k not in self.fixed})
        helpers = 2 if merge_in_grid == 2 else 1  # MERGE_IN_GRID 2: merging programs too
        grid = (plan.m_tiles * self.variant.programs_per_tile * helpers, batch, plan.num_splits)
        index = device.index if device.index is not None else 0
        if device.type == "cuda" and device.index is None:
            index = torch.cuda.current_device()
        self.kernel = KernelLauncher(kernel_fn, grid, options, index)
        self.tensor_device = index if device.type == "cuda" else -1  # Tensor.get_device()
        # the Gluon kernels point a bad page entry's token at a NaN row; the Triton kernels
        # check their split's entries after the KV loop instead
        self.nan_row = (
            nan_row(device, kv_dtype.itemsize) if "nan_row_ckv" in self.kernel.names else None
        )
        self._nan_address = self.nan_row.data_ptr() if self.nan_row is not None else 0
        self._partial_lse_address = partials.lse.data_ptr() if partials is not None else 0
        self.merge = None
        if self.split and not merge_in_grid:
            self.merge, self.merge_fixed = _merge_launch(plan, partials, qo, heads, batch, index)
            self._merge_bind = ArgumentBinder(self.merge, self.merge_fixed, MERGE_CALL_ARGS)
        call = (
            CALL_ARGS
            + (GRID_MERGE_ARGS if merge_in_grid else () if self.split else OUT_ARGS)
            + (NAN_ARGS if self.nan_row is not None else ())
            + (Q_SCALE_ARGS if self.q_call else ())
            + (LIST_ARGS if index_lists else ())
        )
        self.index_lists = index_lists
        for name in LIST_ARGS if index_lists else ():
            del self.fixed[name]
        self._bind = ArgumentBinder(self.kernel, self.fixed, call)
        self._call = call
        # (attention key, merge key) -> the two kernels bound for native.launch (None: not
        # bindable, Triton's path)
        self._native: dict[tuple[Hashable, Hashable], tuple[Any, Any] | None] = {}
        self.native_launches = 0  # run() calls launched by the bound kernels (for tests)
        self._nan_offsets: dict[tuple[int, int], tuple[int, int, bool]] = {}
        # direct launches: compiled code, and the plan's arrays keep Triton's 16-byte alignment
        fixed_tensors = [v for v in self.fixed.values() if isinstance(v, torch.Tensor)]
        self.fast = not interpreted and aligned16(*fixed_tensors)

    def __call__(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv: torch.Tensor,
        kpe: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor | None,
        scales: Scales,
        q_scale: Any = None,
        lists: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Attention of ``q [T, H, 512|64]`` over the paged cache into ``out [T, H, 512]``
        and ``lse [T, H]`` (checked by the caller); FP8 queries with ``query.QueryScale``;
        an ``index_lists`` launch with ``lists``, its page table and lengths (int32)."""
        if self.interpreted and out.dtype == torch.bfloat16:
            # Triton's interpreter rounds fp32 → bf16 toward zero (twice the error of rounding
            # to nearest): under it the kernels write fp32 and PyTorch rounds, as a GPU would
            wide = torch.empty(out.shape, dtype=torch.float32, device=out.device)
            self(q_nope, q_pe, ckv, kpe, wide, lse, scales, q_scale, lists)
            out.copy_(wide)
            return
        if self.q_call:  # e4m3 codes as bytes (SM80/86 Triton has no e4m3 pointers)
            q_nope, q_pe = q_nope.view(torch.uint8), q_pe.view(torch.uint8)
        if self.q_fp16 and q_nope.dtype == torch.bfloat16:
            q_nope = q_nope.to(torch.float16)  # contiguous [T, H, D]
        if not self.d_kpe:
            q_pe, kpe = q_nope, ckv
        cs, ks, sa = scales.ckv, scales.kpe, scales.ckv_arr
        cs_ptr = isinstance(cs, torch.Tensor)  # a 1-element device tensor the kernel reads
        ks_ptr = isinstance(ks, torch.Tensor)
        group = sa is not None
        if group and (sa.stride(0) | sa.stride(1)) % 4:
            # the SM90 copier reads a token's four scales as one 16-byte row: strides of
            # whole rows (any layout the wrapper accepts has them but a hand-made view)
            sa = sa.contiguous()
        write_lse = lse is not None
        # the call's pointer arguments (CALL_ARGS' first seven), each address read once
        a_qn, a_qp, a_ckv, a_kpe = (q_nope.data_ptr(), q_pe.data_ptr(), ckv.data_ptr(),
                                    kpe.data_ptr())  # fmt: skip
        a_sa = sa.data_ptr() if group else a_ckv
        a_cs = cs.data_ptr() if cs_ptr else a_ckv
        a_ks = ks.data_ptr() if ks_ptr else a_ckv
        a_out = out.data_ptr()
        a_lse = lse.data_ptr() if write_lse else a_out
        qs, ps, cks, kps = q_nope.stride(), q_pe.stride(), ckv.stride(), kpe.stride()
        sas = sa.stride() if group else (0, 0)
        vals = [
            a_qn, a_qp, a_ckv, a_kpe, a_sa, a_cs, a_ks, qs[0], qs[1], ps[0], ps[1], cks[0],
            cks[1], kps[0], kps[1], sas[0], sas[1], ckv.shape[0], 1.0 if cs_ptr else cs,
            1.0 if ks_ptr else ks, group, cs_ptr, ks_ptr, q_nope.shape[0],
        ]  # fmt: skip
        # the specialization a direct launch needs: 16-byte aligned pointers (fixed arrays were
        # checked at plan(); the output is the attention kernel's or the merge's), strides
        # divisible by 16; the token-group scales' two strides as Triton specializes them, in
        # the key (the packed sparse row's 164 floats is no multiple of 16)
        ptrs = a_qn | a_qp | a_ckv | a_kpe | a_sa | a_cs | a_ks | a_out | a_lse
        strides = [qs[0], qs[1], ps[0], ps[1], cks[0], cks[1], kps[0], kps[1]]
        skey = (int_class(sas[0]), int_class(sas[1])) if group else ()
        os = out.stride()
        lse_t = lse.stride(0) if write_lse else 0
        if not self.split or self.merge_in_grid:  # OUT_ARGS or GRID_MERGE_ARGS
            vals += [a_out, a_lse, os[0], os[1], lse_t, write_lse]
            strides += [os[0], os[1]] + ([lse_t] if write_lse else [])
        wide = False
        if self.nan_row is not None:
            # the NaN row's offsets from the caches (a pool's address repeats every step)
            offsets = self._nan_offsets.get((a_ckv, a_kpe))
            if offsets is None:
                offsets = self._nan_offsets_of(a_ckv, a_kpe, ckv.element_size())
            nc, nk, wide = offsets
            vals += [nc, nk]
            strides += [nc, nk]
        qs_tensor, qkey = None, ()
        if self.q_call:  # the query scale: a float, one device value or one per row
            qs_tensor = q_scale.tensor if q_scale.tensor is not None else self.qo_indptr
            vals += [qs_tensor.data_ptr(), q_scale.stride, q_scale.value, q_scale.mode]
            ptrs, qkey = ptrs | vals[-4], (q_scale.mode,)
        if self.index_lists:
            vals += [lists[0].data_ptr(), lists[1].data_ptr()]
            ptrs |= vals[-2] | vals[-1]
        key = mkey = mvals = None
        if self.fast and ptrs & 15 == 0 and all16(strides):
            key = (cs_ptr, ks_ptr, group, write_lse, wide) + qkey + skey
        if self.merge is not None:
            mvals = [a_out, a_lse if write_lse else self._partial_lse_address, out.shape[0],
                     os[0], os[1], lse_t, write_lse]  # fmt: skip
            if key is not None and all16((os[0], os[1], lse_t) if write_lse else os[:2]):
                mkey = (write_lse,)
        # both launches bound at an earlier call of the same specialization: one native call
        both = (key, mkey) if key is not None and (mvals is None or mkey is not None) else None
        bound = self._native.get(both) if both is not None and not self.q_call else None
        if bound is not None and KernelLauncher._direct_ok():
            stream = kernel_launcher.current_stream(self.kernel._device)
            if bound[2](stream, bound[0], vals, bound[1], mvals):
                self.native_launches += 1
                return
        if key is None or not self.kernel.launch_direct(self._bind(vals), key):
            # Triton's path: the tensors themselves, in the addresses' places
            tensors = [q_nope, q_pe, ckv, kpe, sa if group else ckv, cs if cs_ptr else ckv,
                       ks if ks_ptr else ckv, out, lse if write_lse else out]  # fmt: skip
            self.kernel.launch(self._args(vals, tensors, qs_tensor, lists), key)
        if self.merge is not None:
            if mkey is None or not self.merge.launch_direct(self._merge_bind(mvals), mkey):
                mvals[:2] = [out, lse if write_lse else self.partials.lse]
                self.merge.launch(dict(zip(MERGE_CALL_ARGS, mvals), **self.merge_fixed), mkey)
        if both is not None and both not in self._native and not self.q_call:
            self._bind_native(both)

    def _bind_native(self, both: tuple[Hashable, Hashable]) -> None:
        """Bind the kernels compiled for ``both`` (the attention's and the merge's keys) for
        :mod:`native` launches; None (Triton's path stays) where either cannot be bound."""
        key, mkey = both
        kernel = self.kernel._compiled.get(key)
        merge = self.merge._compiled.get(mkey) if self.merge is not None else None
        if kernel is None or (self.merge is not None and merge is None):
            return  # not compiled yet (a profiler hooked the first launches): later
        k = self.kernel
        a = native.bind(kernel, k.grid, k.names, {**k.defaults, **self.fixed}, self._call)
        b = None
        if a is not None and self.merge is not None:
            m = self.merge
            b = native.bind(merge, m.grid, m.names, {**m.defaults, **self.merge_fixed},
                            MERGE_CALL_ARGS)  # fmt: skip
        ok = a is not None and (self.merge is None or b is not None)
        self._native[both] = (a, b, native.launcher()) if ok else None

    def fast_call(
        self,
        write_lse: bool,
        scale_tensors: bool,
        q_dtype: torch.dtype,
        total_tokens: int,
        max_page: int | None,
    ) -> Any:
        """run()'s common case for this plan as one C call (``native.fast_run``), or None:
        float (or no) scales, or with ``scale_tensors`` both scales device tensors; no
        per-token scales, a RoPE part, the queries read as given, and both kernels already
        bound for that specialization (by an earlier call)."""
        key = (scale_tensors, scale_tensors, False, write_lse, False)
        mkey = (write_lse,) if self.merge is not None else None
        bound = self._native.get((key, mkey))
        if bound is None or not self.d_kpe or self.q_fp16 or self.merge_in_grid:
            return None
        a, b, _ = bound
        return native.fast_call(
            a, b, q_dtype, self.kv_dtype, self.tensor_device, total_tokens, self.heads,
            self.page_size, -1 if max_page is None else max_page, self.d_kpe, self.split,
            self.nan_row is not None, write_lse, scale_tensors, self.kv_dtype.itemsize,
            self._nan_address, self._partial_lse_address,
        )  # fmt: skip

    def _nan_offsets_of(self, a_ckv: int, a_kpe: int, element_size: int) -> tuple[int, int, bool]:
        """The NaN row's element offsets from caches at ``a_ckv`` / ``a_kpe``, and whether
        either needs 64 bits (Triton types an int argument i32 or i64 by its value: part of
        the key); remembered for the next call (up to ``NAN_OFFSETS_KEPT`` cache pairs)."""
        nan = self._nan_address
        nc = _nan_offset(a_ckv, element_size, nan)
        nk = _nan_offset(a_kpe, element_size, nan)
        wide = not (-(2**31) <= nc < 2**31 and -(2**31) <= nk < 2**31)
        if len(self._nan_offsets) >= NAN_OFFSETS_KEPT:
            self._nan_offsets.clear()
        self._nan_offsets[a_ckv, a_kpe] = offsets = (nc, nk, wide)
        return offsets

    def _args(self, vals: list[Any], tensors: list[torch.Tensor], q_scale: Any = None,
              lists: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:  # fmt: skip
        """The call's arguments by name, for Triton's path (which specializes on them): the
        direct launch's ``vals`` with ``tensors`` in place of the addresses (CALL_POINTERS'
        seven, then the output and LSE, which a split plan's call does not pass, the query
        scale's and the index lists')."""
        vals = vals.copy()
        vals[: len(CALL_POINTERS)] = tensors[: len(CALL_POINTERS)]
        if not self.split or self.merge_in_grid:  # OUT_ARGS' or GRID_MERGE_ARGS' first two
            at = len(CALL_ARGS)
            vals[at : at + 2] = tensors[len(CALL_POINTERS) :]
        args = dict(zip(self._call, vals), **self.fixed)
        if q_scale is not None:
            args["q_scale_ptr"] = q_scale
        if self.index_lists:
            args.update(zip(LIST_ARGS, lists))
        if self.fp8_cvt:  # integer decoding reads bytes: SM80/86 Triton rejects FP8 pointers
            views = {id(t): t.view(torch.uint8) for t in (args["ckv_ptr"], args["kpe_ptr"])}
            for name in CACHE_POINTERS:
                args[name] = views.get(id(args[name]), args[name])
        return args
