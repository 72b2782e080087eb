"""The ``rows`` kernel: paged MLA attention with the query rows as the dot's M, on every target.

One program handles ``BLOCK_M`` query rows of one request -- rows are (query token, head)
pairs, so decode (1 token × H heads), speculative decode (≤16 tokens) and extend chunks share
one kernel -- over one split of the request's KV (flash-decoding). Every KV tile is loaded once
for all rows of the program: MLA keys and values are the same latent vectors for all heads.
``S = Q·Kᵀ`` (rows × tokens), then ``O += P·V`` with V the latent part of the same tile.

FP8 tiles (e4m3/e5m2) are converted to the dot dtype (fp16, exact for both FP8 formats) in
registers; the per-tensor key scale is folded into the softmax scale and the value scale
applied once in the epilogue. Softmax probabilities stay in the 16-bit dot dtype for P·V
with 16-bit queries. ``Q_FP8`` builds read e4m3 queries with a query scale
(``fp8_query.py``: e4m3 × e4m3 dots and P in e4m3 where the target has FP8 tensor cores).
Bounds and NaN rows: ``tiles.py``. The variant is registered in ``fp8mla.attention.variants``.
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.fp8_decode import CVT_NATIVE
from fp8mla.kernels.portable.fp8_query import (
    QF8_DOT,
    QF8_NONE,
    fp8_pv,
    fp8_scores,
    load_fp8_kv_tile,
    load_fp8_query,
    score_scale,
)
from fp8mla.kernels.portable.tiles import (
    DYNAMIC_ARGS,
    NEG_INF,
    load_kv_tile,
    log_sum_exp2,
    nan_if,
    online_softmax,
    out_factor,
    program_kv,
    program_setup,
    query_rows,
    scan_pages,
)


@triton.jit(do_not_specialize=DYNAMIC_ARGS + ["stride_qs_t"])
def mla_rows_kernel(
    q_nope_ptr,  # [T, H, D_CKV] (e4m3 codes as bytes with Q_FP8)
    q_pe_ptr,  # [T, H, D_KPE]
    ckv_ptr,  # [num_pages, PAGE_SIZE, D_CKV] (strided)
    kpe_ptr,  # [num_pages, PAGE_SIZE, D_KPE] (strided)
    scale_arr_ptr,  # [num_pages, PAGE_SIZE, D_CKV // 128] fp32 (TOKEN_GROUP only)
    ckv_scale_ptr,  # fp32 scalar on device (CKV_SCALE_PTR only)
    kpe_scale_ptr,  # fp32 scalar on device (KPE_SCALE_PTR only)
    qo_indptr_ptr,  # [B + 1] int32
    kv_indptr_ptr,  # [B + 1] int32, offsets into kv_indices
    kv_indices_ptr,  # [nnz_pages] int32 page ids
    kv_len_ptr,  # [B] int32 tokens
    o_ptr,  # [T, H, D_CKV] out, or [splits, T, H, D_CKV] fp32 partials
    lse_ptr,  # [T, H] fp32, or [splits, T, H] partials
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
    num_tokens,  # rows of q and out: query positions past it are never touched
    num_pages,  # pages of the cache: page ids outside [0, num_pages) are never read
    num_indices,  # entries of kv_indices
    sm_scale_log2,  # sm_scale / ln 2 (softmax in base 2)
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
    DOT_DTYPE: tl.constexpr,  # fp16 (FP8/fp16 KV), bf16 (bf16 KV), fp32 (interpreter)
    WRITE_LSE: tl.constexpr,
    FP8_CVT: tl.constexpr,  # fp8_decode.CVT_*: how FP8 bytes become fp16
    q_scale_ptr=None,  # fp32: one value (Q_SCALE == QS_TENSOR) or [T, H] (QS_ROWS)
    stride_qs_t=0,
    q_scale_val=1.0,
    Q_FP8: tl.constexpr = 0,  # fp8_query.QF8_*: 16-bit queries, e4m3 decoded, e4m3 dots
    Q_SCALE: tl.constexpr = 0,  # fp8_query.QS_*: where the query scale comes from
    ROUND_INT: tl.constexpr = False,  # P to e4m3 by integer rounding (no FP8 cast)
    P_PARTS: tl.constexpr = 2,  # QF8_DOT: P as 1 or 2 (hi + lo) e4m3 parts (fp8_query.fp8_pv)
):
    m_tile = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    row_ok, t_local, head, tok, qo_len, rows_total = query_rows(
        qo_indptr_ptr, b, m_tile, num_heads, num_tokens, BLOCK_M
    )
    if m_tile * BLOCK_M >= rows_total:
        return
    # e4m3 × e4m3 dots: an e4m3 pool read as it is (per-token-group scales apply to a
    # converted tile: those take the decoding build)
    FP8_DOT: tl.constexpr = Q_FP8 == QF8_DOT and not TOKEN_GROUP
    if Q_FP8 == QF8_NONE:
        qk_scale, v_scale, n_begin, n_end, page_base, n_entries, q_nope, q_pe, causal_limit = (
            program_setup(
                q_nope_ptr, q_pe_ptr, ckv_scale_ptr, kpe_scale_ptr, kv_indptr_ptr, kv_indices_ptr,
                kv_len_ptr, b, m_tile, split, tok, head, row_ok, t_local, qo_len,
                stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
                num_heads, num_indices, sm_scale_log2, ckv_scale_val, kpe_scale_val,
                BLOCK_M, BLOCK_N, D_CKV, D_KPE, CAUSAL, TOKEN_GROUP, CKV_SCALE_PTR, KPE_SCALE_PTR,
                DOT_DTYPE, FP8_CVT,
            )
        )  # fmt: skip
        qk_row = qk_scale
    else:
        KV_CVT: tl.constexpr = CVT_NATIVE if FP8_DOT else FP8_CVT  # the dot reads raw e4m3
        qk_scale, pe_factor, v_scale, n_begin, n_end, page_base, n_entries, causal_limit = (
            program_kv(
                ckv_scale_ptr, kpe_scale_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr,
                b, m_tile, split, t_local, qo_len, num_heads, num_indices, sm_scale_log2,
                ckv_scale_val, kpe_scale_val, BLOCK_M, BLOCK_N, CAUSAL, TOKEN_GROUP,
                CKV_SCALE_PTR, KPE_SCALE_PTR, KV_CVT,
            )
        )  # fmt: skip
        q_nope = load_fp8_query(q_nope_ptr, tok, head, row_ok, stride_qn_t, stride_qn_h,
                                D_CKV, DOT_DTYPE, FP8_DOT)  # fmt: skip
        q_pe = q_nope
        if D_KPE > 0:
            q_pe = load_fp8_query(q_pe_ptr, tok, head, row_ok, stride_qp_t, stride_qp_h,
                                  D_KPE, DOT_DTYPE, FP8_DOT)  # fmt: skip
        # each row's factor on the fp32 scores
        qk_row = score_scale(q_scale_ptr, q_scale_val, tok, head, row_ok, stride_qs_t, qk_scale,
                             BLOCK_M, Q_SCALE, FP8_DOT)  # fmt: skip

    m_i = tl.full([BLOCK_M], NEG_INF, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_CKV], dtype=tl.float32)
    for n0 in range(n_begin, n_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        n_ok = pos < n_end
        if FP8_DOT:
            k, kpe = load_fp8_kv_tile(
                ckv_ptr, kpe_ptr, page_base, n_entries, num_pages, pos, n_ok, stride_ckv_p,
                stride_ckv_s, stride_kpe_p, stride_kpe_s, PAGE_SIZE, D_CKV, D_KPE,
            )  # fmt: skip
        else:
            k, kpe = load_kv_tile(
                ckv_ptr, kpe_ptr, scale_arr_ptr, page_base, n_entries, num_pages, pos, n_ok,
                stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s, stride_sa_p,
                stride_sa_s, PAGE_SIZE, D_CKV, D_KPE, TOKEN_GROUP, DOT_DTYPE, FP8_CVT,
            )  # fmt: skip
        # -- q·k --
        if Q_FP8 == QF8_NONE:  # q_pe carries the ratio of the two parts' key scales
            s = tl.dot(q_nope, tl.trans(k))
            if D_KPE > 0:
                s = tl.dot(q_pe, tl.trans(kpe), s)
        else:
            s = fp8_scores(q_nope, q_pe, k, kpe, pe_factor, D_KPE)
        visible = n_ok[None, :]
        if CAUSAL:
            visible = visible & (pos[None, :] <= causal_limit[:, None])
        p, alpha, m_i, l_i = online_softmax(s * qk_row, m_i, l_i, visible, 1)
        # -- p·v (v is the latent part of the same tile) --
        if FP8_DOT:
            acc = acc * alpha[:, None] + fp8_pv(p, k, P_PARTS, ROUND_INT)
        else:
            acc = tl.dot(p.to(DOT_DTYPE), k, acc * alpha[:, None])

    # -- epilogue: normalize, value scale, write out and LSE (NaN after a bad page entry) --
    bad = scan_pages(page_base, n_entries, num_pages, n_begin, n_end, PAGE_SIZE)
    inv_l = nan_if(out_factor(l_i, v_scale), bad)
    d = tl.arange(0, D_CKV)
    o_rows = o_ptr + split * stride_o_split + tok * stride_o_t + head * stride_o_h
    tl.store(
        o_rows[:, None] + d[None, :],
        (acc * inv_l[:, None]).to(o_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )
    if WRITE_LSE:
        lse = nan_if(log_sum_exp2(m_i, l_i), bad)
        tl.store(lse_ptr + split * stride_lse_split + tok * stride_lse_t + head, lse, mask=row_ok)
