"""Paged MLA attention over a KV cache stored as FP8 (e4m3/e5m2) or bf16/fp16.

One program handles ``BLOCK_M`` query rows of one request -- rows are (query token, head)
pairs, so decode (1 token × H heads), speculative decode (≤16 tokens) and extend chunks share
one kernel -- over one split of the request's KV (flash-decoding). Every KV tile is loaded once
for all rows of the program: MLA keys and values are the same latent vectors for all heads.

FP8 tiles are converted to the dot dtype (fp16, exact for both FP8 formats) in registers; the
per-tensor key scale is folded into the softmax scale and the value scale applied once in the
epilogue. Softmax probabilities stay in the 16-bit dot dtype for P·V (never FP8).
"""

import triton
import triton.language as tl


@triton.jit
def _mla_attn_fwd_kernel(
    q_nope_ptr,  # [T, H, D_CKV]
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
    sm_scale_log2,  # sm_scale / ln 2
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
):
    m_tile = tl.program_id(0)
    b = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)

    q_start = tl.load(qo_indptr_ptr + b)
    qo_len = tl.load(qo_indptr_ptr + b + 1) - q_start
    rows_total = qo_len * num_heads
    if m_tile * BLOCK_M >= rows_total:
        return

    # -- rows of this program: (query token, head) pairs --
    r = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = r < rows_total
    t_local = r // num_heads
    head = r % num_heads
    tok = (q_start + t_local).to(tl.int64)

    # -- scales: the key scale goes into the softmax scale, the value scale into the output --
    if CKV_SCALE_PTR:
        ckv_scale = tl.load(ckv_scale_ptr).to(tl.float32)
    else:
        ckv_scale = ckv_scale_val
    if KPE_SCALE_PTR:
        kpe_scale = tl.load(kpe_scale_ptr).to(tl.float32)
    else:
        kpe_scale = kpe_scale_val
    if TOKEN_GROUP:
        qk_scale = sm_scale_log2  # group scales are applied to the K tile
        v_scale = 1.0
    else:
        qk_scale = sm_scale_log2 * ckv_scale
        v_scale = ckv_scale

    # -- this split's KV range --
    kv_len = tl.load(kv_len_ptr + b)
    kv_end = kv_len
    if CAUSAL:
        last_t = tl.minimum((m_tile * BLOCK_M + BLOCK_M - 1) // num_heads, qo_len - 1)
        kv_end = tl.minimum(kv_len, kv_len - qo_len + last_t + 1)
    chunk = tl.cdiv(tl.cdiv(kv_end, num_splits), BLOCK_N) * BLOCK_N
    n_begin = split * chunk
    n_end = tl.minimum(n_begin + chunk, kv_end)
    page_base = kv_indices_ptr + tl.load(kv_indptr_ptr + b)

    # -- load the query tile once --
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
        if not TOKEN_GROUP:
            q_pe = q_pe * (kpe_scale / ckv_scale)  # lets one qk_scale serve both parts
        else:
            q_pe = q_pe * kpe_scale
        q_pe = q_pe.to(DOT_DTYPE)

    causal_limit = kv_len - qo_len + t_local  # last KV position each row may see
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_CKV], dtype=tl.float32)

    for n0 in range(n_begin, n_end, BLOCK_N):
        # -- gather the KV tile through the page table --
        pos = n0 + tl.arange(0, BLOCK_N)
        n_ok = pos < n_end
        page = tl.load(page_base + pos // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
        off = pos % PAGE_SIZE
        k = tl.load(
            ckv_ptr + (page * stride_ckv_p + off * stride_ckv_s)[:, None] + d[None, :],
            mask=n_ok[:, None],
            other=0.0,
        )
        if TOKEN_GROUP:
            sc = tl.load(
                scale_arr_ptr
                + (page * stride_sa_p + off * stride_sa_s)[:, None]
                + (d // 128)[None, :],
                mask=n_ok[:, None],
                other=0.0,
            )
            k = (k.to(tl.float32) * sc).to(DOT_DTYPE)
        else:
            k = k.to(DOT_DTYPE)

        # -- q·k --
        s = tl.dot(q_nope, tl.trans(k))
        if D_KPE > 0:
            kpe = tl.load(
                kpe_ptr + (page * stride_kpe_p + off * stride_kpe_s)[:, None] + e[None, :],
                mask=n_ok[:, None],
                other=0.0,
            ).to(DOT_DTYPE)
            s += tl.dot(q_pe, tl.trans(kpe))
        s = s * qk_scale
        visible = n_ok[None, :]
        if CAUSAL:
            visible = visible & (pos[None, :] <= causal_limit[:, None])
        s = tl.where(visible, s, float("-inf"))

        # -- online softmax (base 2) --
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

        # -- p·v (v is the latent part of the same tile) --
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(DOT_DTYPE), k, acc)

    # -- epilogue: normalize, apply the value scale, write out and LSE --
    has = l_i > 0.0
    inv_l = tl.where(has, v_scale / tl.where(has, l_i, 1.0), 0.0)
    out = acc * inv_l[:, None]
    o_rows = o_ptr + split * stride_o_split + tok * stride_o_t + head * stride_o_h
    tl.store(o_rows[:, None] + d[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + split * stride_lse_split + tok * stride_lse_t + head, lse, mask=row_ok)
