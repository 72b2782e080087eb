"""Merge of split-KV partial results: out = Σ_s w_s o_s / Σ_s w_s with w_s = 2^(lse_s - max).

One program per (``BLOCK_D`` output columns, query row of a request, request): the planner
takes all 512 columns per program when the batch has rows enough to fill the GPU, and
narrower blocks for small batches, so that a one-request decode with 32 heads still spreads
over 128 programs. Splits are read ``BLOCK_S`` at a time in one pass with a running maximum, the
partial outputs loaded beside their LSEs (no load waits on another but the request's row
range). The grid is sized by the batch capacity and the rows per request the attention launch
covers, and rows are found through ``qo_indptr``, so a CUDA graph captured once serves later
plans whose rows fit it. A NaN partial (a bad page entry) makes the row NaN. With
``mid_mult_ptr`` the partial outputs are fp16 without the V scale, and the merged row is
multiplied by the factor there (``attention.workspace.Partials``).

With ``WAIT_PRIOR`` the merge is launched as a programmatic dependent of the attention kernel
(``kernels/grid_dependency.py``): its programs may be resident before the attention ends, and
each waits for the attention grid before its first global read (so this grid ends only after
that one, which the next grid, itself a dependent, relies on). With ``LAUNCH_NEXT`` it lets the
next grid launch from its start.
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.grid_dependency import launch_next_grid, wait_prior_grid

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit(do_not_specialize=["num_tokens"])
def mla_merge_kernel(
    mid_o_ptr,  # [splits, rows_cap, D] fp32 (or fp16), partial outputs (row = token * H + head)
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
    WAIT_PRIOR: tl.constexpr = False,  # launched as the attention kernel's dependent (SM90+)
    LAUNCH_NEXT: tl.constexpr = False,  # the next grid (the next attention) may launch now
    mid_mult_ptr=None,  # [1] fp32: the factor of fp16 partials (the V scale the kernel used)
):
    if LAUNCH_NEXT:
        launch_next_grid()
    c = tl.program_id(0)
    r = tl.program_id(1)
    b = tl.program_id(2)
    if WAIT_PRIOR:  # the partials are the attention kernel's (every program waits: this
        wait_prior_grid()  # grid ends only after that one, which the next grid relies on)
    q_start = tl.load(qo_indptr_ptr + b)
    rows_total = (tl.load(qo_indptr_ptr + b + 1) - q_start) * num_heads
    tok = q_start + r // num_heads
    if (r >= rows_total) | (tok >= num_tokens):
        return
    h = r % num_heads
    row = tok.to(tl.int64) * num_heads + h
    s_idx = tl.arange(0, BLOCK_S)
    d = c * BLOCK_D + tl.arange(0, BLOCK_D)

    m = tl.max(tl.full([BLOCK_S], NEG_INF, tl.float32), axis=0)  # running max of live LSEs
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    total = tl.sum(tl.zeros([BLOCK_S], tl.float32), axis=0)
    nan_seen = tl.zeros([BLOCK_S], tl.int32)
    for s0 in range(0, num_splits, BLOCK_S):
        s = s0 + s_idx
        s_ok = s < num_splits
        lse_s = tl.load(mid_lse_ptr + s * stride_ml_split + row, mask=s_ok, other=NEG_INF)
        o_s = tl.load(
            mid_o_ptr + s[:, None].to(tl.int64) * stride_mo_split + row * D + d[None, :],
            mask=s_ok[:, None],
            other=0.0,
        ).to(tl.float32)
        nan_seen |= (lse_s != lse_s).to(tl.int32)
        live = lse_s > NEG_INF  # false for empty splits and NaN
        m_new = tl.maximum(m, tl.max(tl.where(live, lse_s, NEG_INF), axis=0))
        m_use = tl.where(m_new == NEG_INF, 0.0, m_new)
        alpha = tl.exp2(m - m_use)  # 0 while nothing was live
        w = tl.where(live, tl.exp2(lse_s - m_use), 0.0)
        # an empty split's partial is never read into the sum, whatever its bytes
        acc = acc * alpha + tl.sum(tl.where(live[:, None], w[:, None] * o_s, 0.0), axis=0)
        total = total * alpha + tl.sum(w, axis=0)
        m = m_new
    bad = tl.max(nan_seen, axis=0) > 0
    inv = tl.where(total > 0.0, 1.0 / tl.where(total > 0.0, total, 1.0), 0.0)
    if mid_mult_ptr is not None:  # fp16 partials: the V scale the attention kernel left out
        inv = tl.where(total > 0.0, inv * tl.load(mid_mult_ptr), 0.0)  # an empty row stays 0
    out = tl.where(bad, float("nan"), acc * inv)
    tl.store(
        o_ptr + tok.to(tl.int64) * stride_o_t + h * stride_o_h + d, out.to(o_ptr.dtype.element_ty)
    )
    if WRITE_LSE:
        if c == 0:
            lse = tl.where(total > 0.0, m + tl.log2(tl.where(total > 0.0, total, 1.0)), NEG_INF)
            lse = tl.where(bad, float("nan"), lse)
            tl.store(lse_ptr + tok.to(tl.int64) * stride_lse_t + h, lse)
