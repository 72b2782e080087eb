"""The ``vsplit`` kernel: the ``rows`` kernel's function with the 512 output columns split
over two programs, for many rows (extend chunks, 128 heads), on every target.

Two programs per row tile, each computing the whole ``S`` but only its half of the output
columns. A 128-row tile then holds a 128 × 256 fp32 accumulator (128 registers per thread at
8 warps) where the full width would need twice the register file; the price is ``Q·Kᵀ``
computed twice, paid back by twice the rows per KV tile. Arguments and bounds as ``rows.py``,
FP8 queries (``Q_FP8``) as there (``fp8_query.py``).
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.fp8_decode import CVT_NATIVE
from fp8mla.kernels.portable.fp8_query import (
    QF8_DOT,
    QF8_NONE,
    fp8_pv,
    load_fp8_cols,
    load_fp8_query,
    score_scale,
)
from fp8mla.kernels.portable.tiles import (
    DYNAMIC_ARGS,
    NEG_INF,
    load_kpe,
    load_kv_cols,
    load_q_pe,
    log_sum_exp2,
    nan_if,
    online_softmax,
    out_factor,
    program_kv,
    query_rows,
    safe_pages,
    scan_pages,
)


@triton.jit
def load_half(
    ckv_ptr, scale_arr_ptr, page, off, n_ok, c0, stride_ckv_p, stride_ckv_s, stride_sa_p,
    stride_sa_s, HALF: tl.constexpr, TOKEN_GROUP: tl.constexpr, DOT_DTYPE: tl.constexpr,
    FP8_CVT: tl.constexpr, FP8_DOT: tl.constexpr,
):  # fmt: skip
    """Columns ``[c0, c0 + HALF)`` of the KV tile: e4m3 as they are for the e4m3 × e4m3 dots
    (``FP8_DOT``), else decoded to the dot dtype (``tiles.load_kv_cols``)."""
    if FP8_DOT:  # (one return: a compiled kernel types every return statement it reads)
        k = load_fp8_cols(ckv_ptr, page, off, n_ok, c0, stride_ckv_p, stride_ckv_s, HALF)
    else:
        k = load_kv_cols(
            ckv_ptr, scale_arr_ptr, page, off, n_ok, c0, stride_ckv_p, stride_ckv_s,
            stride_sa_p, stride_sa_s, HALF, TOKEN_GROUP, DOT_DTYPE, FP8_CVT,
        )  # fmt: skip
    return k


@triton.jit(do_not_specialize=DYNAMIC_ARGS + ["stride_qs_t"])
def mla_vsplit_kernel(
    q_nope_ptr,
    q_pe_ptr,
    ckv_ptr,
    kpe_ptr,
    scale_arr_ptr,
    ckv_scale_ptr,
    kpe_scale_ptr,
    qo_indptr_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    kv_len_ptr,
    o_ptr,
    lse_ptr,
    stride_qn_t,
    stride_qn_h,
    stride_qp_t,
    stride_qp_h,
    stride_ckv_p,
    stride_ckv_s,
    stride_kpe_p,
    stride_kpe_s,
    stride_sa_p,
    stride_sa_s,
    stride_o_split,
    stride_o_t,
    stride_o_h,
    stride_lse_split,
    stride_lse_t,
    num_heads,
    num_tokens,
    num_pages,
    num_indices,
    sm_scale_log2,
    ckv_scale_val,
    kpe_scale_val,
    PAGE_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    CAUSAL: tl.constexpr,
    TOKEN_GROUP: tl.constexpr,
    CKV_SCALE_PTR: tl.constexpr,
    KPE_SCALE_PTR: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    FP8_CVT: tl.constexpr,
    q_scale_ptr=None,
    stride_qs_t=0,
    q_scale_val=1.0,
    Q_FP8: tl.constexpr = 0,
    Q_SCALE: tl.constexpr = 0,
    ROUND_INT: tl.constexpr = False,
    P_PARTS: tl.constexpr = 2,
):
    """Same arguments and result as ``mla_rows_kernel``; the grid's first axis has two
    programs per row tile (``2 * m_tile + half``), each writing its 256 output columns (the
    LSE comes from half 0)."""
    HALF: tl.constexpr = D_CKV // 2
    m_tile = tl.program_id(0) // 2
    half = tl.program_id(0) % 2
    b = tl.program_id(1)
    split = tl.program_id(2)
    row_ok, t_local, head, tok, qo_len, rows_total = query_rows(
        qo_indptr_ptr, b, m_tile, num_heads, num_tokens, BLOCK_M
    )
    if m_tile * BLOCK_M >= rows_total:
        return
    # e4m3 × e4m3 dots over an e4m3 pool as it is (per-token-group scales: decoded)
    FP8_DOT: tl.constexpr = Q_FP8 == QF8_DOT and not TOKEN_GROUP
    KV_CVT: tl.constexpr = CVT_NATIVE if FP8_DOT else FP8_CVT
    qk_scale, pe_factor, v_scale, n_begin, n_end, page_base, n_entries, causal_limit = (
        program_kv(
            ckv_scale_ptr, kpe_scale_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr,
            b, m_tile, split, t_local, qo_len, num_heads, num_indices, sm_scale_log2,
            ckv_scale_val, kpe_scale_val, BLOCK_M, BLOCK_N, CAUSAL, TOKEN_GROUP, CKV_SCALE_PTR,
            KPE_SCALE_PTR, KV_CVT,
        )
    )  # fmt: skip
    # this program's output columns ("own") and the other half, both needed for S
    c_own = half * HALF
    c_oth = HALF - c_own
    dh = tl.arange(0, HALF)
    if Q_FP8 == QF8_NONE:
        q_rows = q_nope_ptr + tok[:, None] * stride_qn_t + head[:, None] * stride_qn_h
        q_own = tl.load(q_rows + c_own + dh[None, :], mask=row_ok[:, None], other=0.0)
        q_oth = tl.load(q_rows + c_oth + dh[None, :], mask=row_ok[:, None], other=0.0)
        q_own = q_own.to(DOT_DTYPE)
        q_oth = q_oth.to(DOT_DTYPE)
        if D_KPE > 0:
            q_pe = load_q_pe(
                q_pe_ptr, tok, head, row_ok, stride_qp_t, stride_qp_h, pe_factor, D_KPE,
                DOT_DTYPE,
            )  # fmt: skip
        qk_row = qk_scale
    else:  # the parts' dots apart, pe_factor on the fp32 scores
        q_own = load_fp8_query(q_nope_ptr + c_own, tok, head, row_ok, stride_qn_t,
                               stride_qn_h, HALF, DOT_DTYPE, FP8_DOT)  # fmt: skip
        q_oth = load_fp8_query(q_nope_ptr + c_oth, tok, head, row_ok, stride_qn_t,
                               stride_qn_h, HALF, DOT_DTYPE, FP8_DOT)  # fmt: skip
        if D_KPE > 0:
            q_pe = load_fp8_query(q_pe_ptr, tok, head, row_ok, stride_qp_t, stride_qp_h,
                                  D_KPE, DOT_DTYPE, FP8_DOT)  # fmt: skip
        # each row's factor on the fp32 scores
        qk_row = score_scale(q_scale_ptr, q_scale_val, tok, head, row_ok, stride_qs_t, qk_scale,
                             BLOCK_M, Q_SCALE, FP8_DOT)  # fmt: skip

    m_i = tl.full([BLOCK_M], NEG_INF, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HALF], dtype=tl.float32)
    for n0 in range(n_begin, n_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        n_ok = pos < n_end
        page = safe_pages(page_base, n_entries, num_pages, pos, n_ok, PAGE_SIZE)
        off = pos % PAGE_SIZE
        # -- q·k over both halves and the RoPE part; the own half is kept for p·v --
        k_oth = load_half(
            ckv_ptr, scale_arr_ptr, page, off, n_ok, c_oth, stride_ckv_p, stride_ckv_s,
            stride_sa_p, stride_sa_s, HALF, TOKEN_GROUP, DOT_DTYPE, FP8_CVT, FP8_DOT,
        )  # fmt: skip
        s = tl.dot(q_oth, tl.trans(k_oth))
        if D_KPE > 0:
            if FP8_DOT:
                kpe = load_fp8_cols(kpe_ptr, page, off, n_ok, 0, stride_kpe_p, stride_kpe_s,
                                    D_KPE)  # fmt: skip
            else:
                kpe = load_kpe(kpe_ptr, page, off, n_ok, stride_kpe_p, stride_kpe_s, D_KPE,
                               DOT_DTYPE, FP8_CVT)  # fmt: skip
            if Q_FP8 == QF8_NONE:  # q_pe carries the ratio of the parts' key scales
                s = tl.dot(q_pe, tl.trans(kpe), s)
            else:
                s += pe_factor * tl.dot(q_pe, tl.trans(kpe))
        k_own = load_half(
            ckv_ptr, scale_arr_ptr, page, off, n_ok, c_own, stride_ckv_p, stride_ckv_s,
            stride_sa_p, stride_sa_s, HALF, TOKEN_GROUP, DOT_DTYPE, FP8_CVT, FP8_DOT,
        )  # fmt: skip
        s = tl.dot(q_own, tl.trans(k_own), s)
        visible = n_ok[None, :]
        if CAUSAL:
            visible = visible & (pos[None, :] <= causal_limit[:, None])
        p, alpha, m_i, l_i = online_softmax(s * qk_row, m_i, l_i, visible, 1)
        if FP8_DOT:
            acc = acc * alpha[:, None] + fp8_pv(p, k_own, P_PARTS, ROUND_INT)
        else:
            acc = tl.dot(p.to(DOT_DTYPE), k_own, acc * alpha[:, None])

    bad = scan_pages(page_base, n_entries, num_pages, n_begin, n_end, PAGE_SIZE)
    inv_l = nan_if(out_factor(l_i, v_scale), bad)
    o_rows = o_ptr + split * stride_o_split + tok * stride_o_t + head * stride_o_h + c_own
    tl.store(
        o_rows[:, None] + dh[None, :],
        (acc * inv_l[:, None]).to(o_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )
    if WRITE_LSE:
        if half == 0:
            lse = nan_if(log_sum_exp2(m_i, l_i), bad)
            lse_ptrs = lse_ptr + split * stride_lse_split + tok * stride_lse_t + head
            tl.store(lse_ptrs, lse, mask=row_ok)
