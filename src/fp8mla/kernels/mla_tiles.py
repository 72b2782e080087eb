"""Pieces shared by the MLA attention kernels: query rows, split ranges, KV tile loads."""

import triton
import triton.language as tl


@triton.jit
def _query_rows(qo_indptr_ptr, b, m_tile, num_heads, BLOCK_M: tl.constexpr):
    """Rows ``(token, head)`` of this program's tile of request ``b``.

    Returns ``(row_ok, t_local, head, tok, qo_len, rows_total)``; ``tok`` is int64."""
    q_start = tl.load(qo_indptr_ptr + b)
    qo_len = tl.load(qo_indptr_ptr + b + 1) - q_start
    rows_total = qo_len * num_heads
    r = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = r < rows_total
    t_local = r // num_heads
    head = r % num_heads
    tok = (q_start + t_local).to(tl.int64)
    return row_ok, t_local, head, tok, qo_len, rows_total


@triton.jit
def _split_range(kv_len, qo_len, m_tile, split, num_splits, num_heads,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """KV positions ``[n_begin, n_end)`` of this split; causal tiles stop at the last
    position their last row may see (bottom-right aligned)."""
    kv_end = kv_len
    if CAUSAL:
        last_t = tl.minimum((m_tile * BLOCK_M + BLOCK_M - 1) // num_heads, qo_len - 1)
        kv_end = tl.minimum(kv_len, kv_len - qo_len + last_t + 1)
    chunk = tl.cdiv(tl.cdiv(kv_end, num_splits), BLOCK_N) * BLOCK_N
    n_begin = split * chunk
    n_end = tl.minimum(n_begin + chunk, kv_end)
    return n_begin, n_end


@triton.jit
def _load_kv_tile(ckv_ptr, kpe_ptr, scale_arr_ptr, page_base, pos, n_ok,
                  stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s,
                  stride_sa_p, stride_sa_s,
                  PAGE_SIZE: tl.constexpr, D_CKV: tl.constexpr, D_KPE: tl.constexpr,
                  TOKEN_GROUP: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """Gather ``BLOCK_N`` tokens through the page table and convert to the dot dtype.

    Returns ``k [BLOCK_N, D_CKV]`` (keys and values) and ``kpe [BLOCK_N, D_KPE]`` (``k``
    again when there is no RoPE part). Masked tokens load as 0 -- whatever bytes unused
    slots hold (NaN included) are never read."""
    page = tl.load(page_base + pos // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
    off = pos % PAGE_SIZE
    d = tl.arange(0, D_CKV)
    k = tl.load(
        ckv_ptr + (page * stride_ckv_p + off * stride_ckv_s)[:, None] + d[None, :],
        mask=n_ok[:, None],
        other=0.0,
    )
    if TOKEN_GROUP:
        sc = tl.load(
            scale_arr_ptr + (page * stride_sa_p + off * stride_sa_s)[:, None] + (d // 128)[None, :],
            mask=n_ok[:, None],
            other=0.0,
        )
        k = (k.to(tl.float32) * sc).to(DOT_DTYPE)
    else:
        k = k.to(DOT_DTYPE)
    if D_KPE > 0:
        e = tl.arange(0, D_KPE)
        kpe = tl.load(
            kpe_ptr + (page * stride_kpe_p + off * stride_kpe_s)[:, None] + e[None, :],
            mask=n_ok[:, None],
            other=0.0,
        ).to(DOT_DTYPE)
    else:
        kpe = k
    return k, kpe


@triton.jit
def _scales(ckv_scale_ptr, kpe_scale_ptr, ckv_scale_val, kpe_scale_val, sm_scale_log2,
            CKV_SCALE_PTR: tl.constexpr, KPE_SCALE_PTR: tl.constexpr,
            TOKEN_GROUP: tl.constexpr):
    """``(qk_scale, pe_factor, v_scale)``: the key scale is folded into the softmax scale
    (``q_pe`` is pre-multiplied by ``pe_factor`` so one scale serves both parts) and the
    value scale is applied once to the output."""
    if CKV_SCALE_PTR:
        ckv_scale = tl.load(ckv_scale_ptr).to(tl.float32)
    else:
        ckv_scale = ckv_scale_val
    if KPE_SCALE_PTR:
        kpe_scale = tl.load(kpe_scale_ptr).to(tl.float32)
    else:
        kpe_scale = kpe_scale_val
    if TOKEN_GROUP:  # group scales are applied to the K tile itself
        return sm_scale_log2, kpe_scale, 1.0
    return sm_scale_log2 * ckv_scale, kpe_scale / ckv_scale, ckv_scale


@triton.jit
def _load_queries(q_nope_ptr, q_pe_ptr, tok, head, row_ok, stride_qn_t, stride_qn_h,
                  stride_qp_t, stride_qp_h, pe_factor,
                  D_CKV: tl.constexpr, D_KPE: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """``q_nope [BLOCK_M, D_CKV]`` and ``q_pe [BLOCK_M, D_KPE]`` (times ``pe_factor``) in the
    dot dtype; ``q_pe`` is ``q_nope`` when there is no RoPE part."""
    d = tl.arange(0, D_CKV)
    q_nope = tl.load(
        q_nope_ptr + tok[:, None] * stride_qn_t + head[:, None] * stride_qn_h + d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    ).to(DOT_DTYPE)
    if D_KPE > 0:
        e = tl.arange(0, D_KPE)
        q_pe = tl.load(
            q_pe_ptr + tok[:, None] * stride_qp_t + head[:, None] * stride_qp_h + e[None, :],
            mask=row_ok[:, None],
            other=0.0,
        ).to(tl.float32)
        q_pe = (q_pe * pe_factor).to(DOT_DTYPE)
    else:
        q_pe = q_nope
    return q_nope, q_pe
