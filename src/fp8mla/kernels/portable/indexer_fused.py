"""Lightning-indexer logits and top-k in one pass over the paged key cache, for long contexts:
the ``[rows, context]`` logits are never written.

One program per (chunk of a request's positions, request) computes its chunk's logits tile by
tile as ``indexer_logits`` does, for the request's ``next_n`` rows at once, and keeps per row a
list of candidates -- (key, position) in position order, in its region of a workspace -- under
a running threshold: a tile's logits enter the list only above it. When a list has no room
left for another tile (its capacity ``CAP`` holds ``k`` and a tile) the program selects its top ``k`` (``indexer_topk.select_top``,
the earlier position first among equal keys), compacts the list to them in place and raises
the threshold to the k-th key: a later position with a key equal to it loses to every kept one,
so it is turned away too. At the chunk's end each list holds at most ``k`` entries, its chunk's
exact top-k, and ``indexer_topk.topk_merge_kernel`` merges the chunks' lists of a row.
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.indexer_logits import (
    LOGITS_DYNAMIC_ARGS,
    load_query,
    paged_key_tile,
    row_logits,
)
from fp8mla.kernels.portable.indexer_topk import order_key, shrink_list


@triton.jit
def entries_before(flags, NP: tl.constexpr):
    """Exclusive prefix sums down axis 0 of the int32 ``[BLOCK_N, NP]`` ``flags``, one column at
    a time: ``tl.cumsum`` down the 2-D tile (the logits' layout) fails an assertion in Triton
    3.6's scan lowering (ScanOpToLLVM, ``AddPartialReduce``); a column's 1-D scan compiles on
    3.6 and 3.9, in the registers the 2-D scan took on 3.9."""
    c = tl.arange(0, NP)[None, :]
    out = tl.zeros_like(flags)
    for i in tl.static_range(NP):
        col = tl.sum(tl.where(c == i, flags, 0), axis=1)
        out = tl.where(c == i, (tl.cumsum(col, axis=0) - col)[:, None], out)
    return out


@triton.jit(do_not_specialize=LOGITS_DYNAMIC_ARGS + ["k"])
def paged_topk_kernel(
    q_ptr,  # [B, next_n, H, 128] e4m3 codes (uint8)
    w_ptr,  # [B * next_n, H] float32
    cache_ptr,  # uint8 index-cache pages
    bt_ptr,  # [B, max_pages] int32
    lens_ptr,  # [B * next_n] int32
    pos_ptr,  # [B * next_n, chunks, CAP] int32 candidate positions
    key_ptr,  # [B * next_n, chunks, CAP] candidate keys (uint32 bits in int32)
    count_ptr,  # [B * next_n, chunks] int32 list sizes (<= k at the end)
    stride_q_b,
    stride_q_n,
    stride_q_h,
    stride_w_row,
    stride_bt_b,
    page_stride,
    num_pages,
    num_heads,
    max_context_len,
    chunk,  # positions per program, a multiple of BLOCK_N
    k,
    PAGE_SIZE: tl.constexpr,
    NEXT_N: tl.constexpr,
    NP: tl.constexpr,
    HP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT: tl.constexpr,
    FP8_CVT: tl.constexpr,
    DECODE_SCALE: tl.constexpr,
    CAP: tl.constexpr,  # list capacity: k + BLOCK_N rounded up to a power of two
    RADIX_BITS: tl.constexpr,  # the selection's steps (indexer_topk.kth_key)
):
    pid_c = tl.program_id(0)
    b = tl.program_id(1)
    chunks = tl.num_programs(0)
    start = pid_c * chunk
    end = tl.minimum(start + chunk, max_context_len)

    # -- the request's rows, as in the logits kernel --
    r = tl.arange(0, NP)
    row_ok = r < NEXT_N
    lens = tl.load(lens_ptr + b * NEXT_N + r, mask=row_ok, other=0)
    lens = tl.minimum(tl.maximum(lens, 0), max_context_len)
    seen = tl.max(lens, axis=0)
    m = tl.arange(0, NP * HP)
    q_rows = b.to(tl.int64) * stride_q_b + (m // HP) * stride_q_n + (m % HP) * stride_q_h
    q_op, live_m = load_query(q_ptr, q_rows, HP, num_heads, (m // HP) < NEXT_N, DOT, FP8_CVT)
    w = tl.load(w_ptr + (b * NEXT_N + m // HP) * stride_w_row + m % HP, mask=live_m, other=0.0)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt_b
    n = tl.arange(0, BLOCK_N)

    # -- one list per row --
    base = ((b * NEXT_N + r) * chunks + pid_c).to(tl.int64) * CAP
    theta = tl.zeros([NP], tl.uint32)  # below every key: the first tiles enter whole
    size = tl.zeros([NP], tl.int32)
    compute_end = tl.minimum(end, seen)
    for t0 in tl.range(start, compute_end, BLOCK_N):
        pos = t0 + n
        k_op, k_scale = paged_key_tile(cache_ptr, bt_row, pos, pos < compute_end, num_pages,
                                       page_stride, PAGE_SIZE, DOT, FP8_CVT)  # fmt: skip
        keys = order_key(row_logits(k_op, q_op, w, k_scale, NP, HP, DOT, DECODE_SCALE))
        keep = (pos[:, None] < lens[None, :]) & row_ok[None, :] & (keys > theta[None, :])
        kk = keep.to(tl.int32)
        at = base[None, :] + size[None, :] + entries_before(kk, NP)
        tl.store(pos_ptr + at, pos[:, None] + tl.zeros([BLOCK_N, NP], tl.int32), mask=keep)
        tl.store(key_ptr + at, keys.to(tl.int32, bitcast=True), mask=keep)
        size += tl.sum(kk, axis=0)
        # -- a list near its capacity: keep its top k, raise its threshold --
        for i in tl.static_range(NEXT_N):
            size_i = tl.sum(tl.where(r == i, size, 0), axis=0)
            if size_i > CAP - BLOCK_N:
                base_i = tl.sum(tl.where(r == i, base, 0), axis=0)
                kth, kept = shrink_list(pos_ptr, key_ptr, base_i, size_i, k, CAP, RADIX_BITS)
                theta = tl.where(r == i, kth, theta)
                size = tl.where(r == i, kept, size)
    # -- each list to its top k --
    for i in tl.static_range(NEXT_N):
        size_i = tl.sum(tl.where(r == i, size, 0), axis=0)
        if size_i > k:
            base_i = tl.sum(tl.where(r == i, base, 0), axis=0)
            _, kept = shrink_list(pos_ptr, key_ptr, base_i, size_i, k, CAP, RADIX_BITS)
            size = tl.where(r == i, kept, size)
    tl.store(count_ptr + (b * NEXT_N + r) * chunks + pid_c, size, mask=row_ok)
