"""Merge of split-KV partial results: out = Σ_s w_s o_s / Σ_s w_s with w_s = 2^(lse_s - max)."""

import triton
import triton.language as tl


@triton.jit
def _mla_merge_kernel(
    mid_o_ptr,  # [splits, rows, D] fp32, normalized partial outputs
    mid_lse_ptr,  # [splits, rows] fp32, base-2 partial LSE (-inf for empty splits)
    o_ptr,  # [T, H, D] output
    lse_ptr,  # [T, H] fp32
    num_splits,
    num_heads,
    stride_mo_split,
    stride_ml_split,
    stride_o_t,
    stride_o_h,
    stride_lse_t,
    D: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    row = tl.program_id(0)
    t = (row // num_heads).to(tl.int64)
    h = row % num_heads
    d = tl.arange(0, D)

    # -- the largest partial LSE --
    m = float("-inf")
    for s in range(0, num_splits):
        m = tl.maximum(m, tl.load(mid_lse_ptr + s * stride_ml_split + row))
    m_use = tl.where(m == float("-inf"), 0.0, m)

    # -- weighted sum of the partial outputs --
    acc = tl.zeros([D], dtype=tl.float32)
    w_sum = 0.0
    for s in range(0, num_splits):
        w = tl.exp2(tl.load(mid_lse_ptr + s * stride_ml_split + row) - m_use)
        acc += w * tl.load(mid_o_ptr + s * stride_mo_split + row.to(tl.int64) * D + d)
        w_sum += w
    inv = tl.where(w_sum > 0.0, 1.0 / tl.where(w_sum > 0.0, w_sum, 1.0), 0.0)
    tl.store(o_ptr + t * stride_o_t + h * stride_o_h + d, (acc * inv).to(o_ptr.dtype.element_ty))
    if WRITE_LSE:
        lse = tl.where(w_sum > 0.0, m_use + tl.log2(tl.where(w_sum > 0.0, w_sum, 1.0)), m)
        tl.store(lse_ptr + t * stride_lse_t + h, lse)
