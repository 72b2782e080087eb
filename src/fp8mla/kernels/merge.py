"""Merge of split-KV partial results: out = Σ_s w_s o_s / Σ_s w_s with w_s = 2^(lse_s - max).

One program per (128 output columns, query row of a request, request): a one-request decode
with 32 heads still spreads over 128 programs, and each program reads its splits ``BLOCK_S`` at
a time as one block. The grid is sized by the batch capacity and the rows per request the
attention launch covers, and rows are found through ``qo_indptr``, so a CUDA graph captured
once serves later plans whose rows fit it. A NaN partial (a bad page entry) makes the row NaN.
"""

import triton
import triton.language as tl

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit(do_not_specialize=["num_tokens"])
def _mla_merge_kernel(
    mid_o_ptr,  # [splits, rows_cap, D] fp32, normalized partial outputs (row = token * H + head)
    mid_lse_ptr,  # [splits, rows_cap] fp32, base-2 partial LSE (-inf for empty splits)
    o_ptr,  # [T, H, D] output
    lse_ptr,  # [T, H] fp32
    qo_indptr_ptr,  # [B + 1] int32
    num_splits,
    num_heads,
    num_tokens,
    stride_mo_split,
    stride_ml_split,
    stride_o_t,
    stride_o_h,
    stride_lse_t,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,  # output columns per program
    BLOCK_S: tl.constexpr,  # splits read at once
    WRITE_LSE: tl.constexpr,
):
    c = tl.program_id(0)
    r = tl.program_id(1)
    b = tl.program_id(2)
    q_start = tl.load(qo_indptr_ptr + b)
    rows_total = (tl.load(qo_indptr_ptr + b + 1) - q_start) * num_heads
    tok = q_start + r // num_heads
    if (r >= rows_total) | (tok >= num_tokens):
        return
    h = r % num_heads
    row = tok.to(tl.int64) * num_heads + h
    s_idx = tl.arange(0, BLOCK_S)

    # -- the largest partial LSE; NaN anywhere makes the row NaN --
    m = tl.full([BLOCK_S], NEG_INF, tl.float32)
    nan_seen = tl.zeros([BLOCK_S], tl.int32)
    for s0 in range(0, num_splits, BLOCK_S):
        s_ok = (s0 + s_idx) < num_splits
        lse_s = tl.load(mid_lse_ptr + (s0 + s_idx) * stride_ml_split + row, mask=s_ok, other=0.0)
        nan_seen |= (lse_s != lse_s).to(tl.int32)
        m = tl.maximum(m, tl.where(s_ok, lse_s, NEG_INF))
    m_max = tl.max(m, axis=0)
    m_use = tl.where(m_max == NEG_INF, 0.0, m_max)

    # -- weighted sum of the partial outputs --
    d = c * BLOCK_D + tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    w_sum = tl.zeros([BLOCK_S], dtype=tl.float32)
    for s0 in range(0, num_splits, BLOCK_S):
        s_ok = (s0 + s_idx) < num_splits
        lse_s = tl.load(
            mid_lse_ptr + (s0 + s_idx) * stride_ml_split + row, mask=s_ok, other=NEG_INF
        )
        w = tl.where(s_ok & (lse_s > NEG_INF), tl.exp2(lse_s - m_use), 0.0)
        o_s = tl.load(
            mid_o_ptr + (s0 + s_idx)[:, None].to(tl.int64) * stride_mo_split + row * D + d[None, :],
            mask=(s_ok & (w > 0.0))[:, None],
            other=0.0,
        )
        acc += tl.sum(w[:, None] * o_s, axis=0)
        w_sum += w
    total = tl.sum(w_sum, axis=0)
    bad = tl.max(nan_seen, axis=0) > 0
    inv = tl.where(total > 0.0, 1.0 / tl.where(total > 0.0, total, 1.0), 0.0)
    out = tl.where(bad, float("nan"), acc * inv)
    tl.store(
        o_ptr + tok.to(tl.int64) * stride_o_t + h * stride_o_h + d, out.to(o_ptr.dtype.element_ty)
    )
    if WRITE_LSE:
        if c == 0:
            lse = tl.where(total > 0.0, m_use + tl.log2(tl.where(total > 0.0, total, 1.0)), m_max)
            lse = tl.where(bad, float("nan"), lse)
            tl.store(lse_ptr + tok.to(tl.int64) * stride_lse_t + h, lse)
