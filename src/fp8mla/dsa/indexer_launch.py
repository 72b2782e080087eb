"""Launchers of the lightning indexer's Triton kernels (``kernels/portable/indexer_*.py``): the
arguments, grids and workspaces; inputs are checked by ``fp8mla.dsa.indexer``."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mla.attention.planner import device_sm_count
from fp8mla.attention.targets import Target, launch_target
from fp8mla.dsa.index_cache import IndexCacheView
from fp8mla.dsa.indexer_plan import (
    HIST_BITS,
    IndexerTable,
    fused_plan,
    indexer_table,
    logits_grid,
    logits_warps,
    pow2_at_least,
    select_warps,
    topk_plan,
)
from fp8mla.runtime import interpreted

DOT_MODES = {"fp8": 0, "fp16": 1, "fp32": 2}
DECODE_2_POW_16 = 65536.0  # each integer-decoded e4m3 operand carries 2^-8


@dataclass(frozen=True)
class Launch:
    """Where kernels of one call run: the target, its table, SMs, the e4m3 decoding."""

    target: Target
    table: IndexerTable
    sms: int
    fp8_cvt: int

    @property
    def dot(self) -> int:
        return DOT_MODES[self.table.logits.dot]

    @property
    def decode_scale(self) -> float:
        return (
            DECODE_2_POW_16 if self.table.logits.dot == "fp16" and self.fp8_cvt in (3, 5) else 1.0
        )


def launch_for(device: torch.device) -> Launch:
    from fp8mla.attention.launch import fp8_conversion

    interp = interpreted()
    target = launch_target(device, interp)
    table = indexer_table(target)
    cvt = 0
    if table.logits.dot == "fp16":
        cvt = fp8_conversion(torch.float8_e4m3fn, device, interp, "auto", target)
    return Launch(target, table, device_sm_count(device), cvt)


def _head_pad(heads: int, rows: int) -> int:
    """Heads a row takes in the query tile: a power of two, the tile at least 16 wide."""
    return max(pow2_at_least(heads), pow2_at_least(-(-16 // rows)))


def paged_logits(
    q: torch.Tensor,
    weights: torch.Tensor,
    view: IndexCacheView,
    block_table: torch.Tensor,
    lens: torch.Tensor,
    out: torch.Tensor,
    launch: Launch,
) -> None:
    from fp8mla.kernels.portable.indexer_logits import paged_logits_kernel

    batch, next_n, heads, _ = q.shape
    tile = launch.table.logits
    max_len = out.shape[1]
    chunk, programs = logits_grid(batch, max_len, launch.sms, tile)
    np_ = pow2_at_least(next_n)
    hp = _head_pad(heads, np_)
    paged_logits_kernel[(programs, batch)](
        q, weights, view.data, block_table, lens, out,
        q.stride(0), q.stride(1), q.stride(2), weights.stride(0), block_table.stride(0),
        out.stride(0), view.page_stride, view.num_pages, heads, max_len, chunk,
        PAGE_SIZE=view.page_size, NEXT_N=next_n, NP=np_, HP=hp, BLOCK_N=tile.block_n,
        DOT=launch.dot, FP8_CVT=launch.fp8_cvt, DECODE_SCALE=launch.decode_scale,
        num_warps=logits_warps(tile, np_ * hp), num_stages=tile.num_stages,
    )  # fmt: skip


def ragged_logits(
    q: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    key_scales: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    out: torch.Tensor,
    launch: Launch,
) -> None:
    from fp8mla.kernels.portable.indexer_logits import ragged_logits_kernel

    rows, heads, _ = q.shape
    tile = launch.table.logits
    per = pow2_at_least(-(-128 // pow2_at_least(heads)))  # rows a program: 128-wide tiles
    per = min(per, pow2_at_least(rows))
    hp = _head_pad(heads, per)
    row_blocks = -(-rows // per)
    chunk, programs = logits_grid(row_blocks, keys.shape[0], launch.sms, tile)
    ragged_logits_kernel[(programs, row_blocks)](
        q, weights, keys, key_scales, ks, ke, out,
        q.stride(0), q.stride(1), weights.stride(0), keys.stride(0), out.stride(0),
        rows, keys.shape[0], heads, chunk,
        ROWS=per, HP=hp, BLOCK_N=tile.block_n, DOT=launch.dot, FP8_CVT=launch.fp8_cvt,
        DECODE_SCALE=launch.decode_scale, num_warps=logits_warps(tile, per * hp),
        num_stages=tile.num_stages,
    )  # fmt: skip


@dataclass
class Slots:
    """What the last top-k level needs to write cache slots too."""

    out: torch.Tensor  # [rows, k] int32
    block_table: torch.Tensor
    rows_per_request: int
    page_size: int
    num_pages: int


def _merge(pos, keys, counts, regions, stride, capr, k, kp, group, levels, out, slots, launch):
    """Merge levels over ``regions`` regions a row (entries ``stride`` apart, at most ``capr``
    each), the last writing ``out`` (and the slots)."""
    from fp8mla.kernels.portable.indexer_topk import topk_merge_kernel

    rows = out.shape[0]
    dev = out.device
    for groups in levels:
        final = groups == 1
        if final:
            o, key_o, cnt_o = out, keys, counts  # no region output
        else:
            o = torch.empty(rows, groups, kp, dtype=torch.int32, device=dev)
            key_o = torch.empty(rows, groups, kp, dtype=torch.int32, device=dev)
            cnt_o = torch.empty(rows, groups, dtype=torch.int32, device=dev)
        g = pow2_at_least(min(group, regions))
        s = slots if final else None
        topk_merge_kernel[(groups, rows)](
            pos, keys, counts,
            o, key_o, cnt_o, s.out if s else o, s.block_table if s else counts,
            out.stride(0), s.block_table.stride(0) if s else 0, s.rows_per_request if s else 1,
            regions, stride, s.num_pages if s else 0, k,
            G=g, CAPR=capr, KP=kp, FINAL=final, WRITE_SLOTS=s is not None,
            PAGE_SIZE=s.page_size if s else 1, RADIX_BITS=launch.table.radix_bits,
            num_warps=select_warps(g * capr, launch.table),
        )  # fmt: skip
        pos, keys, counts, regions, stride, capr = o, key_o, cnt_o, groups, kp, kp


def topk(
    logits: torch.Tensor,
    starts: torch.Tensor | None,
    ends: torch.Tensor,
    k: int,
    out: torch.Tensor,
    launch: Launch,
    slots: Slots | None = None,
) -> None:
    """Top-k of ``logits [rows, cols]`` over ``[starts, ends)`` into ``out [rows, k]``."""
    from fp8mla.kernels.portable.indexer_topk import topk_chunk_kernel

    rows, cols = logits.shape
    select = launch.table.select_entries
    plan = topk_plan(rows, cols, k, launch.sms, select)
    dev = logits.device
    path = plan.path(launch.table, rows, launch.sms)
    if path == "histogram":
        _histogram_topk(logits, starts, ends, k, out, launch, plan, slots)
        return
    if path == "digits":
        _digits_topk(logits, starts, ends, k, out, launch, slots)
        return
    if plan.single:
        pos, keys, counts = out, out, ends  # unused pointers of the FINAL build
    else:
        pos = torch.empty(rows, plan.regions, plan.kp, dtype=torch.int32, device=dev)
        keys = torch.empty(rows, plan.regions, plan.kp, dtype=torch.int32, device=dev)
        counts = torch.empty(rows, plan.regions, dtype=torch.int32, device=dev)
    s = slots if plan.single else None
    topk_chunk_kernel[(plan.regions, rows)](
        logits, starts if starts is not None else ends, ends, pos, keys, counts,
        s.out if s else pos, s.block_table if s else ends,
        logits.stride(0), out.stride(0), s.block_table.stride(0) if s else 0,
        s.rows_per_request if s else 1, cols, s.num_pages if s else 0, k,
        HAS_START=starts is not None, CHUNK=plan.chunk, KP=plan.kp, FINAL=plan.single,
        WRITE_SLOTS=s is not None, PAGE_SIZE=s.page_size if s else 1,
        RADIX_BITS=launch.table.radix_bits,
        num_warps=select_warps(plan.chunk, launch.table),
    )  # fmt: skip
    if not plan.single:
        _merge(pos, keys, counts, plan.regions, plan.kp, plan.kp, k, plan.kp, plan.group,
               plan.levels, out, slots, launch)  # fmt: skip


def _digits_topk(logits, starts, ends, k, out, launch, slots) -> None:
    """The digits path of :func:`topk` (``kernels/portable/indexer_topk.py``): five grids
    over the row's chunks of ``digit_chunk`` columns, the k-th key's four digits and then
    the output."""
    from fp8mla.kernels.portable.indexer_topk import DIGITS, topk_digit_kernel

    rows, cols = logits.shape
    dev = logits.device
    chunk = launch.table.digit_chunk
    chunks = -(-cols // chunk)
    hist = torch.empty(rows, chunks, DIGITS, 256, dtype=torch.int32, device=dev)
    above = torch.empty(rows, chunks, DIGITS, dtype=torch.int32, device=dev)
    start = starts if starts is not None else ends
    s = slots
    for p in range(DIGITS + 1):
        topk_digit_kernel[(chunks, rows)](
            logits, start, ends, hist, above, out, s.out if s else out,
            s.block_table if s else ends, logits.stride(0), out.stride(0),
            s.block_table.stride(0) if s else 0, s.rows_per_request if s else 1, cols,
            s.num_pages if s else 0, k,
            HAS_START=starts is not None, CHUNK=chunk, CP=pow2_at_least(chunks),
            KP=pow2_at_least(k, 16), PASS=p, WRITE_SLOTS=s is not None,
            PAGE_SIZE=s.page_size if s else 1, num_warps=launch.table.digit_warps,
        )  # fmt: skip


def _histogram_topk(logits, starts, ends, k, out, launch, plan, slots) -> None:
    """The histogram path of :func:`topk` (``kernels/portable/indexer_topk.py``): the chunks'
    histograms, each chunk's keys above the row's threshold, one gathering program a row."""
    from fp8mla.kernels.portable.indexer_topk import (
        topk_gather_kernel,
        topk_hist_kernel,
        topk_prune_kernel,
    )

    rows, cols = logits.shape
    dev = logits.device
    i32 = torch.int32
    hist = torch.empty(rows, plan.regions, 1 << HIST_BITS, dtype=i32, device=dev)
    pos = torch.empty(rows, plan.regions, plan.kp, dtype=i32, device=dev)
    keys = torch.empty(rows, plan.regions, plan.kp, dtype=i32, device=dev)
    counts = torch.empty(rows, plan.regions, dtype=i32, device=dev)
    stage = launch.table.select_entries
    stage_pos = torch.empty(rows, stage, dtype=i32, device=dev)
    stage_keys = torch.empty(rows, stage, dtype=i32, device=dev)
    start = starts if starts is not None else ends
    warps = select_warps(plan.chunk, launch.table)
    grid = (plan.regions, rows)
    topk_hist_kernel[grid](
        logits, start, ends, hist, logits.stride(0), cols,
        HAS_START=starts is not None, CHUNK=plan.chunk, NB_BITS=HIST_BITS, num_warps=warps,
    )  # fmt: skip
    topk_prune_kernel[grid](
        logits, start, ends, hist, pos, keys, counts, logits.stride(0), cols, k,
        HAS_START=starts is not None, CHUNK=plan.chunk, KP=plan.kp, NB_BITS=HIST_BITS,
        RADIX_BITS=launch.table.radix_bits,
        num_warps=warps,
    )  # fmt: skip
    s = slots
    topk_gather_kernel[(1, rows)](
        pos, keys, counts, stage_pos, stage_keys, out, s.out if s else out,
        s.block_table if s else counts, out.stride(0), s.block_table.stride(0) if s else 0,
        s.rows_per_request if s else 1, plan.regions, s.num_pages if s else 0, k,
        KP=plan.kp, STAGE=stage, WRITE_SLOTS=s is not None,
        PAGE_SIZE=s.page_size if s else 1, RADIX_BITS=launch.table.radix_bits,
        num_warps=select_warps(stage, launch.table),
    )  # fmt: skip


def fused_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    view: IndexCacheView,
    block_table: torch.Tensor,
    lens: torch.Tensor,
    max_context_len: int,
    k: int,
    out: torch.Tensor,
    launch: Launch,
    slots: Slots | None = None,
) -> None:
    """Logits and top-k in one pass (``indexer_fused``), then the merge levels."""
    from fp8mla.kernels.portable.indexer_fused import paged_topk_kernel

    batch, next_n, heads, _ = q.shape
    tile = launch.table.logits
    plan = fused_plan(batch, max_context_len, k, launch.sms, tile, launch.table.select_entries)
    rows, dev = batch * next_n, q.device
    pos = torch.empty(rows, plan.regions, plan.cap, dtype=torch.int32, device=dev)
    keys = torch.empty(rows, plan.regions, plan.cap, dtype=torch.int32, device=dev)
    counts = torch.empty(rows, plan.regions, dtype=torch.int32, device=dev)
    np_ = pow2_at_least(next_n)
    paged_topk_kernel[(plan.regions, batch)](
        q, weights, view.data, block_table, lens, pos, keys, counts,
        q.stride(0), q.stride(1), q.stride(2), weights.stride(0), block_table.stride(0),
        view.page_stride, view.num_pages, heads, max_context_len, plan.chunk, k,
        PAGE_SIZE=view.page_size, NEXT_N=next_n, NP=np_, HP=_head_pad(heads, np_),
        BLOCK_N=tile.block_n, DOT=launch.dot, FP8_CVT=launch.fp8_cvt,
        DECODE_SCALE=launch.decode_scale, CAP=plan.cap, RADIX_BITS=launch.table.radix_bits,
        num_warps=launch.table.fused_warps,
        num_stages=tile.num_stages,
    )  # fmt: skip
    levels = plan.levels or (1,)
    _merge(pos, keys, counts, plan.regions, plan.cap, plan.kp, k, plan.kp, plan.group, levels,
           out, slots, launch)  # fmt: skip


def to_slots(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    req_ids: torch.Tensor | None,
    num_pages: int,
    out: torch.Tensor,
) -> None:
    from fp8mla.kernels.portable.indexer_topk import to_slots_kernel

    t, k = positions.shape
    batch = block_table.shape[0]
    block = min(1024, pow2_at_least(k, 16))
    to_slots_kernel[(-(-k // block), t)](
        positions, req_ids if req_ids is not None else positions, block_table, out,
        positions.stride(0), out.stride(0), block_table.stride(0), max(1, t // max(batch, 1)),
        batch, block_table.shape[1], num_pages, k,
        HAS_REQ=req_ids is not None, PAGE_SIZE=page_size, BLOCK=block, num_warps=4,
    )  # fmt: skip
