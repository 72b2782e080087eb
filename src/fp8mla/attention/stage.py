"""Staging a batch's FP8 KV in fp16 once, for batches whose row tiles read each token many times.

A 4,096-token extend chunk at 128 heads is 8,192 row tiles of 64 rows over the same cached
prefix. The many-row FP8 kernels convert each KV tile in every row tile that reads it; its
producer's conversion, not the tensor cores, then sets the pace. Converting the batch's pages
once into the float workspace (``kernels/kv_stage.py``) and running the 16-bit kernel over
them computes the same function (FP8 values are exact in fp16; the per-tensor scales apply as
for the pool, per-token scales during the conversion).

The planner decides (:func:`fp8mla.attention.planner.stage_fp8`); this module sizes the
staging buffer, places it in the workspace and launches the conversion.
"""

from __future__ import annotations

import torch

from fp8mla.attention.launch import fp8_conversion
from fp8mla.attention.plan_state import PlanState
from fp8mla.attention.planner import choose_config, stage_fp8, stage_reuse
from fp8mla.attention.targets import Target, launch_target
from fp8mla.formats import HEAD_DIM_CKV, is_fp8
from fp8mla.runtime import interpreted

STAGE_ALIGN = 256  # bytes: the staging buffer's start in the workspace
STAGE_DTYPE = torch.float16


def staged_bytes(entries: int, page_size: int, head_dim_kpe: int) -> int:
    """Bytes of the staging buffer for ``entries`` page-table entries (at least one page)."""
    return max(entries, 1) * page_size * (HEAD_DIM_CKV + head_dim_kpe) * STAGE_DTYPE.itemsize


def split_workspace(workspace: torch.Tensor, nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(front, tail)`` byte views of the workspace: the staging buffer of ``nbytes`` at its
    end (``STAGE_ALIGN``-aligned), the rest for the split partials."""
    if not workspace.is_contiguous():
        raise ValueError("expected a contiguous float_workspace_buffer, got a strided one")
    flat = workspace.view(-1).view(torch.uint8)
    start = (flat.numel() - nbytes) // STAGE_ALIGN * STAGE_ALIGN
    start -= (flat.data_ptr() + start) % STAGE_ALIGN  # the buffer's own address aligned
    if start < 0:
        raise ValueError(
            f"expected a float_workspace_buffer of at least {nbytes + STAGE_ALIGN} bytes to "
            f"stage the batch's FP8 KV in fp16, got {flat.numel()}"
        )
    return flat[:start], flat[start : start + nbytes]


class KVStage:
    """The conversion of one plan's pages into its staging buffer.

    Args:
        region: ``staged_bytes(entries, page_size, head_dim_kpe)`` bytes of the workspace.
        front: the workspace before ``region``, where the split partials go.
        kv_indices: the plan's page-table entries on the device (int32).
        entries: page-table entries of the batch (``kv_indptr[-1]``).
        page_size, head_dim_kpe: the cache's layout.
        kv_dtype: the FP8 dtype of the cache.
        target, interpreted: where the conversion runs.

    The staged cache is ``[max(entries, 1), page_size, 512 + head_dim_kpe]`` fp16: page ``j``
    holds the pool page of entry ``j`` (NaN where that entry is out of the cache's range), so
    the attention launch reads it through :attr:`indices` (``0 … entries − 1``).
    """

    def __init__(
        self,
        region: torch.Tensor,
        front: torch.Tensor,
        kv_indices: torch.Tensor,
        *,
        entries: int,
        page_size: int,
        head_dim_kpe: int,
        kv_dtype: torch.dtype,
        device: torch.device,
        target: Target,
        interpreted: bool,
    ) -> None:
        pages = max(entries, 1)
        width = HEAD_DIM_CKV + head_dim_kpe
        import triton

        from fp8mla.kernels.portable.kv_stage import STAGE_TOKENS, kv_stage_kernel

        self.front = front
        self.buffer = region.view(STAGE_DTYPE).view(pages, page_size, width)
        self.ckv = self.buffer[..., :HEAD_DIM_CKV]
        self.kpe = self.buffer[..., HEAD_DIM_CKV:]
        self.indices = torch.arange(pages, dtype=torch.int32, device=device)
        self.entries = entries
        self.page_size = page_size
        self.d_kpe = head_dim_kpe
        self.kv_indices = kv_indices
        self.fp8_cvt = fp8_conversion(kv_dtype, device, interpreted, "ptx", target)
        self.kernel = kv_stage_kernel[(triton.cdiv(entries * page_size, STAGE_TOKENS),)]
        self.tokens = STAGE_TOKENS

    def __call__(
        self, ckv: torch.Tensor, kpe: torch.Tensor, scale_arr: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Convert the plan's pages of ``ckv [P, page_size, 512]`` / ``kpe [P, page_size,
        64]`` (FP8, checked by the caller; ``scale_arr [P, page_size, 4]`` fp32 per-token
        scales applied) and return the staged ``(ckv, kpe)`` views."""
        if self.entries == 0:
            return self.ckv, self.kpe
        if self.fp8_cvt:  # bit-level decoding reads bytes
            ckv, kpe = ckv.view(torch.uint8), kpe.view(torch.uint8)
        if not self.d_kpe:
            kpe = ckv
        group = scale_arr is not None
        sa = scale_arr if group else ckv
        sa_strides = scale_arr.stride()[:2] if group else (0, 0)
        self.kernel(
            ckv, kpe, sa, self.buffer, self.kv_indices, self.entries, ckv.shape[0],
            ckv.stride(0), ckv.stride(1), kpe.stride(0), kpe.stride(1), *sa_strides,
            PAGE_SIZE=self.page_size, D_CKV=HEAD_DIM_CKV, D_KPE=self.d_kpe,
            TOKENS=self.tokens, TOKEN_GROUP=group, FP8_CVT=self.fp8_cvt,
        )  # fmt: skip
        return self.ckv, self.kpe


def make_stage(
    state: PlanState,
    stage_kv: bool | None,
    workspace: torch.Tensor,
    *,
    graph: bool,
    device: torch.device,
) -> KVStage | None:
    """The staging of a plan's FP8 pages: forced (``stage_kv=True``: ``ValueError`` where it
    cannot be), forbidden (False), or the planner's choice (None: never under CUDA graphs,
    whose captured launch cannot change its buffers; only when the pages fit ``workspace``)."""
    if stage_kv is False or (stage_kv is None and graph):
        return None
    if stage_kv and not is_fp8(state.kv_dtype):
        raise ValueError(f"expected an FP8 cache with stage_kv=True, got {state.kv_dtype}")
    if stage_kv and graph:
        raise ValueError(
            "expected use_cuda_graph=False with stage_kv=True (the staged pages' size changes "
            "with the batch), got a CUDA-graph wrapper"
        )
    interp = interpreted()
    target = launch_target(device, interp)
    nbytes = staged_bytes(state.num_entries, state.page_size, state.head_dim_kpe)
    if stage_kv is None:
        rows = state.max_qo_len * state.num_heads
        block_m = choose_config(rows, STAGE_DTYPE, target, state.head_dim_kpe).block_m
        if not stage_fp8(target, state.kv_dtype, -(-rows // block_m)):
            return None  # not even the longest request's row tiles reach the threshold
        staged = max(1, state.num_entries) * state.page_size
        reuse = stage_reuse(state.qo_lens, state.kv_tokens, state.num_heads, block_m, staged)
        room = workspace.numel() * workspace.element_size() - STAGE_ALIGN
        if not stage_fp8(target, state.kv_dtype, reuse) or nbytes > room:
            return None
    front, region = split_workspace(workspace, nbytes)
    return KVStage(
        region, front, state.kv_indices, entries=state.num_entries, page_size=state.page_size,
        head_dim_kpe=state.head_dim_kpe, kv_dtype=state.kv_dtype, device=device,
        target=target, interpreted=interp,
    )  # fmt: skip
