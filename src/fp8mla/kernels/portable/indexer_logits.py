"""Lightning-indexer logits on every target: ``I[t, s] = k_scale[s] · Σ_h w[t, h] ·
ReLU(q[t, h] · k[s])`` with e4m3 queries and keys of 128 values and float32 weights.

One program serves all heads of a few query rows (the ``next_n`` tokens of one request in the
paged kernel, ``ROWS`` consecutive tokens in the ragged one) over a range of keys, one tile of
``BLOCK_N`` keys a step: the tile's scores are one dot, keys × (rows·heads) -- the keys the
MMA's M dimension, the query heads its N -- then ReLU, the weighted sum over each row's heads
on the CUDA cores, and the key scale. How the e4m3 codes reach the dot (``DOT``):

- ``DOT_FP8``: e4m3 × e4m3 on the tensor cores (CUDA SM89+); on SM90 each wgmma's 32-deep
  product is added to the fp32 accumulator apart (``max_num_imprecise_acc=32``: Hopper's FP8
  accumulation inside the tensor core keeps fewer bits);
- ``DOT_FP16``: codes decoded to fp16 exactly (``fp8_decode``; the integer modes give 2^-8 ×
  the value, so the product carries 2^-16 and ``DECODE_SCALE`` = 2^16 puts it back) -- SM80/86
  and AMD;
- ``DOT_FP32``: codes widened to fp32 (the CPU interpreter).

Positions past a row's length (outside ``[start, end)`` in the ragged kernel) get -inf and are
never read: a key tile is loaded only for positions some row of the program still sees.
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.fp8_decode import CVT_NATIVE, fp8_bytes_to_f16

HEAD_DIM = tl.constexpr(128)
NEG_INF = tl.constexpr(float("-inf"))

# How codes reach the dot (the ``DOT`` constexpr):
DOT_FP8 = tl.constexpr(0)
DOT_FP16 = tl.constexpr(1)
DOT_FP32 = tl.constexpr(2)

# Values that change between calls of one shape are not specialized on.
LOGITS_DYNAMIC_ARGS = ["num_pages", "num_keys", "num_rows"]


@triton.jit
def dot_operand(codes, DOT: tl.constexpr, FP8_CVT: tl.constexpr):
    """uint8 e4m3 codes as the dot's operand dtype (exact in every mode)."""
    if DOT == DOT_FP8:
        op = codes.to(tl.float8e4nv, bitcast=True)
    elif DOT == DOT_FP16:
        if FP8_CVT == CVT_NATIVE:
            op = codes.to(tl.float8e4nv, bitcast=True).to(tl.float16)
        else:
            op = fp8_bytes_to_f16(codes, FP8_CVT)
    else:
        op = codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    return op


@triton.jit
def row_logits(
    k_op,  # [BLOCK_N, 128] keys in the dot dtype
    q_op,  # [NP * HP, 128] query rows (row n's heads at n * HP ...), dot dtype
    w,  # [NP * HP] float32 head weights, 0 for padding heads and rows
    k_scale,  # [BLOCK_N] float32
    NP: tl.constexpr,  # rows, a power of two
    HP: tl.constexpr,  # heads per row, a power of two
    DOT: tl.constexpr,
    DECODE_SCALE: tl.constexpr,
):
    """``[BLOCK_N, NP]`` logits of the tile's keys for each row."""
    # -- q·k: keys × (rows·heads), fp32 accumulation --
    if DOT == DOT_FP8:
        s = tl.dot(k_op, tl.trans(q_op), max_num_imprecise_acc=32)
    elif DOT == DOT_FP16:
        s = tl.dot(k_op, tl.trans(q_op))
    else:
        s = tl.dot(k_op, tl.trans(q_op), input_precision="ieee")
    # -- ReLU, weighted sum over each row's heads, key scale --
    s = tl.maximum(s, 0.0) * w[None, :]
    if NP == 1:
        logit = tl.sum(s, axis=1)[:, None]
    else:
        logit = tl.sum(tl.reshape(s, [s.shape[0], NP, HP]), axis=2)
    return logit * (k_scale * DECODE_SCALE)[:, None]


@triton.jit
def load_query(q_ptr, q_rows, HP: tl.constexpr, num_heads, ok, DOT: tl.constexpr,
               FP8_CVT: tl.constexpr):  # fmt: skip
    """The ``[NP * HP, 128]`` query rows at ``q_rows + h * stride`` as dot operands; rows not
    ``ok`` and heads past ``num_heads`` load as 0."""
    m = tl.arange(0, q_rows.shape[0])
    live = ok & (m % HP < num_heads)
    codes = tl.load(q_ptr + q_rows[:, None] + tl.arange(0, HEAD_DIM)[None, :],
                    mask=live[:, None], other=0)  # fmt: skip
    return dot_operand(codes, DOT, FP8_CVT), live


@triton.jit
def paged_key_tile(
    cache_ptr, bt_row_ptr, pos, live, num_pages, page_stride,
    PAGE_SIZE: tl.constexpr, DOT: tl.constexpr, FP8_CVT: tl.constexpr,
):  # fmt: skip
    """Keys at request positions ``pos [BLOCK_N]`` through the request's block-table row:
    ``(codes as dot operand [BLOCK_N, 128], scales [BLOCK_N])``; positions not ``live`` load
    nothing (zeros). Page ids are clamped into the cache: nothing outside it is read."""
    slot_page = pos // PAGE_SIZE
    page = tl.load(bt_row_ptr + slot_page, mask=live, other=0)
    page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
    off = pos - slot_page * PAGE_SIZE
    base = page * page_stride
    codes = tl.load(cache_ptr + (base + off * HEAD_DIM)[:, None] + tl.arange(0, HEAD_DIM)[None, :],
                    mask=live[:, None], other=0)  # fmt: skip
    scale_at = (cache_ptr + base + PAGE_SIZE * HEAD_DIM + off * 4).to(
        tl.pointer_type(tl.float32), bitcast=True
    )
    scale = tl.load(scale_at, mask=live, other=0.0)
    return dot_operand(codes, DOT, FP8_CVT), scale


@triton.jit(do_not_specialize=LOGITS_DYNAMIC_ARGS)
def paged_logits_kernel(
    q_ptr,  # [B, next_n, H, 128] e4m3 codes (uint8)
    w_ptr,  # [B * next_n, H] float32
    cache_ptr,  # uint8 pages of [PAGE_SIZE × 128 codes | PAGE_SIZE × float32 scales]
    bt_ptr,  # [B, max_pages] int32 block table
    lens_ptr,  # [B * next_n] int32 length each row sees
    out_ptr,  # [B * next_n, max_context_len] float32 logits
    stride_q_b,
    stride_q_n,
    stride_q_h,
    stride_w_row,
    stride_bt_b,
    stride_out_row,
    page_stride,  # bytes
    num_pages,
    num_heads,
    max_context_len,
    chunk,  # positions per program, a multiple of BLOCK_N
    PAGE_SIZE: tl.constexpr,
    NEXT_N: tl.constexpr,
    NP: tl.constexpr,  # NEXT_N rounded up to a power of two
    HP: tl.constexpr,  # heads rounded up to a power of two
    BLOCK_N: tl.constexpr,
    DOT: tl.constexpr,
    FP8_CVT: tl.constexpr,
    DECODE_SCALE: tl.constexpr,  # 65536.0 when FP8_CVT yields 2^-8 × the value, else 1.0
):
    pid_c = tl.program_id(0)
    b = tl.program_id(1)
    start = pid_c * chunk
    end = tl.minimum(start + chunk, max_context_len)

    # -- the request's rows: lengths, query heads, weights --
    r = tl.arange(0, NP)
    row_ok = r < NEXT_N
    lens = tl.load(lens_ptr + b * NEXT_N + r, mask=row_ok, other=0)
    lens = tl.minimum(tl.maximum(lens, 0), max_context_len)
    seen = tl.max(lens, axis=0)
    m = tl.arange(0, NP * HP)
    q_rows = b.to(tl.int64) * stride_q_b + (m // HP) * stride_q_n + (m % HP) * stride_q_h
    q_op, live_m = load_query(q_ptr, q_rows, HP, num_heads, (m // HP) < NEXT_N, DOT, FP8_CVT)
    w = tl.load(w_ptr + (b * NEXT_N + m // HP) * stride_w_row + m % HP, mask=live_m, other=0.0)
    out_rows = out_ptr + (b * NEXT_N + r).to(tl.int64) * stride_out_row
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt_b
    n = tl.arange(0, BLOCK_N)

    # -- tiles some row sees: scores --
    compute_end = tl.minimum(end, seen)
    for t0 in tl.range(start, compute_end, BLOCK_N):
        pos = t0 + n
        k_op, k_scale = paged_key_tile(cache_ptr, bt_row, pos, pos < compute_end, num_pages,
                                       page_stride, PAGE_SIZE, DOT, FP8_CVT)  # fmt: skip
        logit = row_logits(k_op, q_op, w, k_scale, NP, HP, DOT, DECODE_SCALE)
        logit = tl.where(pos[:, None] < lens[None, :], logit, NEG_INF)
        tl.store(out_rows[None, :] + pos[:, None], logit,
                 mask=row_ok[None, :] & (pos < end)[:, None])  # fmt: skip
    # -- tiles past every row's length: -inf --
    fill = tl.full([BLOCK_N, NP], NEG_INF, tl.float32)
    for t0 in tl.range(tl.maximum(start, compute_end), end, BLOCK_N):
        pos = t0 + n
        tl.store(out_rows[None, :] + pos[:, None], fill,
                 mask=row_ok[None, :] & (pos < end)[:, None])  # fmt: skip


@triton.jit(do_not_specialize=LOGITS_DYNAMIC_ARGS)
def ragged_logits_kernel(
    q_ptr,  # [S, H, 128] e4m3 codes (uint8)
    w_ptr,  # [S, H] float32
    k_ptr,  # [SK, 128] e4m3 codes (uint8)
    ks_ptr,  # [SK] float32 key scales
    start_ptr,  # [S] int32 first key of each row
    end_ptr,  # [S] int32 one past its last key
    out_ptr,  # [S, SK] float32 logits
    stride_q_s,
    stride_q_h,
    stride_w_s,
    stride_k,
    stride_out_row,
    num_rows,
    num_keys,
    num_heads,
    chunk,  # keys per program, a multiple of BLOCK_N
    ROWS: tl.constexpr,  # query rows per program, a power of two
    HP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT: tl.constexpr,
    FP8_CVT: tl.constexpr,
    DECODE_SCALE: tl.constexpr,
):
    pid_c = tl.program_id(0)
    pid_r = tl.program_id(1)
    c0 = pid_c * chunk
    c1 = tl.minimum(c0 + chunk, num_keys)

    # -- the rows: key ranges, query heads, weights --
    r = pid_r * ROWS + tl.arange(0, ROWS)
    row_ok = r < num_rows
    lo = tl.load(start_ptr + r, mask=row_ok, other=0)
    hi = tl.load(end_ptr + r, mask=row_ok, other=0)
    lo = tl.minimum(tl.maximum(lo, 0), num_keys)
    hi = tl.minimum(tl.maximum(hi, lo), num_keys)
    some = hi > lo
    first = tl.min(tl.where(some, lo, num_keys), axis=0)
    last = tl.max(tl.where(some, hi, 0), axis=0)
    m = tl.arange(0, ROWS * HP)
    row_m = pid_r * ROWS + m // HP
    q_rows = row_m.to(tl.int64) * stride_q_s + (m % HP) * stride_q_h
    q_op, live_m = load_query(q_ptr, q_rows, HP, num_heads, row_m < num_rows, DOT, FP8_CVT)
    w = tl.load(w_ptr + row_m.to(tl.int64) * stride_w_s + m % HP, mask=live_m, other=0.0)
    out_rows = out_ptr + r.to(tl.int64) * stride_out_row
    n = tl.arange(0, BLOCK_N)
    fill = tl.full([BLOCK_N, ROWS], NEG_INF, tl.float32)

    # -- tiles before any row's first key, scored tiles, tiles after every row's last --
    t_lo = tl.maximum(c0, first - first % BLOCK_N)
    t_hi = tl.minimum(c1, last)
    t_lo = tl.minimum(t_lo, tl.maximum(t_hi, c0))
    for t0 in tl.range(c0, t_lo, BLOCK_N):
        pos = t0 + n
        tl.store(out_rows[None, :] + pos[:, None], fill,
                 mask=row_ok[None, :] & (pos < t_lo)[:, None])  # fmt: skip
    for t0 in tl.range(t_lo, t_hi, BLOCK_N):
        pos = t0 + n
        live = (pos >= first) & (pos < t_hi)
        codes = tl.load(k_ptr + pos.to(tl.int64)[:, None] * stride_k + tl.arange(0, HEAD_DIM)[None, :],
                        mask=live[:, None], other=0)  # fmt: skip
        k_scale = tl.load(ks_ptr + pos, mask=live, other=0.0)
        k_op = dot_operand(codes, DOT, FP8_CVT)
        logit = row_logits(k_op, q_op, w, k_scale, ROWS, HP, DOT, DECODE_SCALE)
        inside = (pos[:, None] >= lo[None, :]) & (pos[:, None] < hi[None, :])
        logit = tl.where(inside, logit, NEG_INF)
        tl.store(out_rows[None, :] + pos[:, None], logit,
                 mask=row_ok[None, :] & (pos < c1)[:, None])  # fmt: skip
    for t0 in tl.range(tl.maximum(t_hi, t_lo), c1, BLOCK_N):
        pos = t0 + n
        tl.store(out_rows[None, :] + pos[:, None], fill,
                 mask=row_ok[None, :] & (pos >= t_hi)[:, None] & (pos < c1)[:, None])  # fmt: skip
