"""Building blocks of the portable Triton attention kernels (``rows.py``, ``vsplit.py``):
query rows, split ranges, the page table and its bounds, KV tile loads, the online softmax
and the scales.

Every kernel bounds what it reads by the arrays it is given at launch time, whatever the index
arrays hold then: query rows past ``num_tokens`` are skipped; a page-table entry past the
request's own entries or past ``num_indices``, or a page id outside ``[0, num_pages)``, is
never dereferenced: the loads clamp their indices (:func:`safe_pages`) and one pass over the
split's entries after the KV loop (:func:`scan_pages`) makes the rows of that request NaN: a
visible wrong answer, never a quiet finite one.
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.fp8_decode import (
    CVT_INT_E4M3,
    CVT_NATIVE,
    CVT_TRITON_INT_E4M3,
    fp8_bytes_to_f16,
)

# Values that change between calls of one plan are not specialized on (a direct launch of the
# compiled kernel stays valid for them).
DYNAMIC_ARGS = ["num_tokens", "num_pages"]


@triton.jit
def query_rows(qo_indptr_ptr, b, m_tile, num_heads, num_tokens, BLOCK_M: tl.constexpr):
    """Rows ``(token, head)`` of this program's tile of request ``b``; rows whose token lies
    past the query tensor (``num_tokens``) are not ``row_ok``.

    Returns ``(row_ok, t_local, head, tok, qo_len, rows_total)``; ``tok`` is int64."""
    q_start = tl.load(qo_indptr_ptr + b)
    qo_len = tl.load(qo_indptr_ptr + b + 1) - q_start
    rows_total = qo_len * num_heads
    r = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    t_local = r // num_heads
    head = r % num_heads
    tok = (q_start + t_local).to(tl.int64)
    row_ok = (r < rows_total) & (tok < num_tokens)
    return row_ok, t_local, head, tok, qo_len, rows_total


@triton.jit
def page_table(kv_indptr_ptr, kv_indices_ptr, b, num_indices):
    """Request ``b``'s page-table entries: ``(page_base, n_entries)``. Entries outside
    ``kv_indices`` (an offset past its end, or a negative one) do not count, and the base
    stays inside ``kv_indices`` (which the launcher never passes empty)."""
    kv_start = tl.load(kv_indptr_ptr + b)
    kv_stop = tl.minimum(tl.load(kv_indptr_ptr + b + 1), num_indices)
    n_entries = tl.where((kv_start >= 0) & (kv_start < num_indices), kv_stop - kv_start, 0)
    base = tl.minimum(tl.maximum(kv_start, 0), num_indices - 1)
    return kv_indices_ptr + base, n_entries


SCAN_BLOCK = tl.constexpr(1024)  # page-table entries checked per step of the scan


@triton.jit
def scan_pages(page_base, n_entries, num_pages, n_begin, n_end, PAGE_SIZE: tl.constexpr):
    """Whether any page-table entry the split ``[n_begin, n_end)`` reads is bad: past the
    request's own entries, or a page id outside ``[0, num_pages)``. One pass over the split's
    entries (4 bytes per page, beside 576+ bytes of KV per token, hot in the L2) after the KV
    loop, whose loads only clamp their indices (:func:`safe_pages`); run before the loop it
    made ptxas allocate SM80's 64-row FP8 tile 32 registers. ``SCAN_BLOCK`` entries a step:
    each step waits for its loads (an unpipelined loop), so a split takes one or two steps."""
    e_end = tl.cdiv(n_end, PAGE_SIZE)
    bad = tl.zeros([SCAN_BLOCK], dtype=tl.int32)
    for e0 in range(n_begin // PAGE_SIZE, e_end, SCAN_BLOCK):
        e = e0 + tl.arange(0, SCAN_BLOCK)
        ok = e < e_end
        listed = ok & (e < n_entries)
        page = tl.load(page_base + e, mask=listed, other=0)
        bad |= (ok & ((~listed) | (page.to(tl.uint32) >= num_pages))).to(tl.int32)
    return tl.max(bad, axis=0) > 0


@triton.jit
def safe_pages(page_base, n_entries, num_pages, pos, n_ok, PAGE_SIZE: tl.constexpr):
    """Page ids of the tokens at ``pos`` (where ``n_ok``), every index clamped into range: the
    entry into the request's own, the page id into ``[0, num_pages)``. A clamped token reads the wrong row, but the split's
    :func:`scan_pages` has then made its output NaN; nothing outside the arrays is read."""
    entry = tl.minimum(pos // PAGE_SIZE, tl.maximum(n_entries - 1, 0))
    page = tl.load(page_base + entry, mask=n_ok, other=0)
    return tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)


@triton.jit
def split_range(
    kv_len,
    qo_len,
    m_tile,
    split,
    num_splits,
    num_heads,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):
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
def request_kv_span(span, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """``(kv_len, n_begin, n_end)`` of one program of a split-KV grid (the splits along its
    third axis): its request's length read at ``kv_len_ptr[b]`` and its split's KV range
    (:func:`split_range`), empty for a row tile past the request's ``rows_total`` rows.
    ``span``: ``(kv_len_ptr, b, m_tile, split, qo_len, rows_total, num_heads)``."""
    kv_len = tl.load(span[0] + span[1])
    n_begin, n_end = kv_span(kv_len, span, BLOCK_M, BLOCK_N, CAUSAL)
    return kv_len, n_begin, n_end


@triton.jit
def kv_span(kv_len, span, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """``(n_begin, n_end)`` of one program of a split-KV grid over a request of ``kv_len``
    tokens (:func:`request_kv_span`'s range, the length given)."""
    _, b, m_tile, split, qo_len, rows_total, num_heads = span
    n_begin, n_end = split_range(
        kv_len, qo_len, m_tile, split, tl.num_programs(2), num_heads, BLOCK_M, BLOCK_N, CAUSAL
    )
    n_end = tl.where(m_tile * BLOCK_M < rows_total, tl.maximum(n_end, n_begin), n_begin)
    return n_begin, n_end


@triton.jit
def load_kv_tile(
    ckv_ptr,
    kpe_ptr,
    scale_arr_ptr,
    page_base,
    n_entries,
    num_pages,
    pos,
    n_ok,
    stride_ckv_p,
    stride_ckv_s,
    stride_kpe_p,
    stride_kpe_s,
    stride_sa_p,
    stride_sa_s,
    PAGE_SIZE: tl.constexpr,
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    TOKEN_GROUP: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    FP8_CVT: tl.constexpr,
):
    """Gather ``BLOCK_N`` tokens through the page table and convert to the dot dtype.

    Returns ``k [BLOCK_N, D_CKV]`` (keys and values) and ``kpe [BLOCK_N, D_KPE]`` (``k`` again
    when there is no RoPE part). Masked tokens load as 0 -- whatever bytes unused slots hold
    (NaN included) are never read; indices are clamped into range (:func:`safe_pages`)."""
    page = safe_pages(page_base, n_entries, num_pages, pos, n_ok, PAGE_SIZE)
    off = pos % PAGE_SIZE
    k = load_kv_cols(
        ckv_ptr, scale_arr_ptr, page, off, n_ok, 0, stride_ckv_p, stride_ckv_s, stride_sa_p,
        stride_sa_s, D_CKV, TOKEN_GROUP, DOT_DTYPE, FP8_CVT,
    )  # fmt: skip
    if D_KPE > 0:
        kpe = load_kpe(
            kpe_ptr, page, off, n_ok, stride_kpe_p, stride_kpe_s, D_KPE, DOT_DTYPE, FP8_CVT
        )
    else:
        kpe = k
    return k, kpe


@triton.jit
def load_kv_cols(
    ckv_ptr,
    scale_arr_ptr,
    page,
    off,
    n_ok,
    c0,
    stride_ckv_p,
    stride_ckv_s,
    stride_sa_p,
    stride_sa_s,
    COLS: tl.constexpr,
    TOKEN_GROUP: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    FP8_CVT: tl.constexpr,
):
    """Latent columns ``[c0, c0 + COLS)`` of ``BLOCK_N`` tokens (``page``/``off`` from the page
    table), converted to the dot dtype: ``[BLOCK_N, COLS]``. ``c0`` is a multiple of ``COLS``,
    and of 128 when ``TOKEN_GROUP``. Masked tokens load as 0."""
    d = tl.arange(0, COLS)
    rows = (page * stride_ckv_p + off * stride_ckv_s)[:, None] + (c0 + d)[None, :]
    if FP8_CVT != CVT_NATIVE:
        k = fp8_bytes_to_f16(tl.load(ckv_ptr + rows, mask=n_ok[:, None], other=0), FP8_CVT)
    else:
        k = tl.load(ckv_ptr + rows, mask=n_ok[:, None], other=0.0)
    if TOKEN_GROUP:  # one scale per 128 channels
        sa = scale_arr_ptr + page * stride_sa_p + off * stride_sa_s + c0 // 128
        sc = tl.load(sa, mask=n_ok, other=0.0)[:, None] + tl.zeros([1, COLS], tl.float32)
        for g in tl.static_range(1, COLS // 128):
            sc = tl.where(
                (d >= g * 128)[None, :], tl.load(sa + g, mask=n_ok, other=0.0)[:, None], sc
            )
        k = (k.to(tl.float32) * sc).to(DOT_DTYPE)
    else:
        k = k.to(DOT_DTYPE)
    return k


@triton.jit
def load_kpe(
    kpe_ptr,
    page,
    off,
    n_ok,
    stride_kpe_p,
    stride_kpe_s,
    D_KPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    FP8_CVT: tl.constexpr,
):
    """RoPE part ``[BLOCK_N, D_KPE]`` of ``BLOCK_N`` tokens in the dot dtype."""
    e = tl.arange(0, D_KPE)
    kpe_rows = (page * stride_kpe_p + off * stride_kpe_s)[:, None] + e[None, :]
    if FP8_CVT != CVT_NATIVE:
        kpe = tl.load(kpe_ptr + kpe_rows, mask=n_ok[:, None], other=0)
        return fp8_bytes_to_f16(kpe, FP8_CVT).to(DOT_DTYPE)
    return tl.load(kpe_ptr + kpe_rows, mask=n_ok[:, None], other=0.0).to(DOT_DTYPE)


NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def online_softmax(s, m_i, l_i, visible, AXIS: tl.constexpr):
    """One online-softmax step (base 2) over the KV tokens, axis ``AXIS`` of the scaled scores
    ``s``: returns ``(p, alpha, m_i, l_i)``, ``alpha`` rescaling what was accumulated before.
    Rows with nothing visible yet keep ``m = -inf`` and ``p = 0``. A visible NaN score (a token
    with a bad page entry) makes its row's sum and output NaN."""
    s = tl.where(visible, s, NEG_INF)
    m_new = tl.maximum(m_i, tl.max(s, axis=AXIS))
    m_use = tl.where(m_new == NEG_INF, 0.0, m_new)
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - tl.expand_dims(m_use, AXIS))
    l_i = l_i * alpha + tl.sum(p, axis=AXIS)
    return p, alpha, m_new, l_i


@triton.jit
def out_factor(l_i, v_scale):
    """What the accumulator is multiplied by: the value scale over the softmax sum, 0 for
    rows that saw no token, NaN for rows whose sum is NaN."""
    has = l_i > 0.0
    return tl.where(has | (l_i != l_i), v_scale / tl.where(has, l_i, l_i + 1.0), 0.0)


@triton.jit
def nan_if(x, bad):
    """``x``, or NaN when the program read a bad page-table entry (``bad``, a scalar)."""
    return tl.where(bad, float("nan"), x)


@triton.jit
def log_sum_exp2(m_i, l_i):
    """Base-2 log-sum-exp of the scores, -inf for rows that saw no token (computed after the
    output stores, so it is not live across them)."""
    has = l_i > 0.0
    lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), NEG_INF)
    return tl.where(l_i != l_i, l_i, lse)  # NaN (a bad page entry) stays NaN


@triton.jit
def kv_scales(
    ckv_scale_ptr,
    kpe_scale_ptr,
    ckv_scale_val,
    kpe_scale_val,
    sm_scale_log2,
    CKV_SCALE_PTR: tl.constexpr,
    KPE_SCALE_PTR: tl.constexpr,
    TOKEN_GROUP: tl.constexpr,
    FP8_CVT: tl.constexpr,
):
    """``(qk_scale, pe_factor, v_scale)``: the key scale is folded into the softmax scale
    (``q_pe`` is pre-multiplied by ``pe_factor`` so one scale serves both parts) and the
    value scale is applied once to the output. The integer e4m3 conversion yields 2^-8 × the
    value; its 2^8 rides along with the scales."""
    if CKV_SCALE_PTR:
        ckv_scale = tl.load(ckv_scale_ptr).to(tl.float32)
    else:
        ckv_scale = ckv_scale_val
    if KPE_SCALE_PTR:
        kpe_scale = tl.load(kpe_scale_ptr).to(tl.float32)
    else:
        kpe_scale = kpe_scale_val
    if TOKEN_GROUP:  # group scales are applied to the K tile itself
        ckv_scale = 1.0
    if FP8_CVT == CVT_INT_E4M3 or FP8_CVT == CVT_TRITON_INT_E4M3:  # tiles hold 2^-8 × values
        ckv_scale = ckv_scale * 256.0
        kpe_scale = kpe_scale * 256.0
    return sm_scale_log2 * ckv_scale, kpe_scale / ckv_scale, ckv_scale


@triton.jit
def load_queries(
    q_nope_ptr,
    q_pe_ptr,
    tok,
    head,
    row_ok,
    stride_qn_t,
    stride_qn_h,
    stride_qp_t,
    stride_qp_h,
    pe_factor,
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """``q_nope [BLOCK_M, D_CKV]`` and ``q_pe [BLOCK_M, D_KPE]`` (times ``pe_factor``) in the
    dot dtype; ``q_pe`` is ``q_nope`` when there is no RoPE part."""
    d = tl.arange(0, D_CKV)
    q_nope = tl.load(
        q_nope_ptr + tok[:, None] * stride_qn_t + head[:, None] * stride_qn_h + d[None, :],
        mask=row_ok[:, None],
        other=0.0,
    ).to(DOT_DTYPE)
    if D_KPE > 0:
        q_pe = load_q_pe(
            q_pe_ptr, tok, head, row_ok, stride_qp_t, stride_qp_h, pe_factor, D_KPE, DOT_DTYPE
        )
    else:
        q_pe = q_nope
    return q_nope, q_pe


@triton.jit
def load_q_pe(
    q_pe_ptr,
    tok,
    head,
    row_ok,
    stride_qp_t,
    stride_qp_h,
    pe_factor,
    D_KPE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """``q_pe [BLOCK_M, D_KPE]`` times ``pe_factor`` (in fp32) in the dot dtype."""
    e = tl.arange(0, D_KPE)
    q_pe = tl.load(
        q_pe_ptr + tok[:, None] * stride_qp_t + head[:, None] * stride_qp_h + e[None, :],
        mask=row_ok[:, None],
        other=0.0,
    ).to(tl.float32)
    return (q_pe * pe_factor).to(DOT_DTYPE)


@triton.jit
def program_kv(
    ckv_scale_ptr, kpe_scale_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr,
    b, m_tile, split, t_local, qo_len, num_heads, num_indices, sm_scale_log2, ckv_scale_val,
    kpe_scale_val, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    TOKEN_GROUP: tl.constexpr, CKV_SCALE_PTR: tl.constexpr, KPE_SCALE_PTR: tl.constexpr,
    FP8_CVT: tl.constexpr,
):  # fmt: skip
    """The KV side of a program before its loop: ``(qk_scale, pe_factor, v_scale)``, its
    split's KV range ``[n_begin, n_end)``, the request's page table (base, entries) and the
    last KV position each row may see under the causal mask."""
    qk_scale, pe_factor, v_scale = kv_scales(
        ckv_scale_ptr, kpe_scale_ptr, ckv_scale_val, kpe_scale_val, sm_scale_log2,
        CKV_SCALE_PTR, KPE_SCALE_PTR, TOKEN_GROUP, FP8_CVT,
    )  # fmt: skip
    kv_len = tl.load(kv_len_ptr + b)
    n_begin, n_end = split_range(
        kv_len, qo_len, m_tile, split, tl.num_programs(2), num_heads, BLOCK_M, BLOCK_N, CAUSAL
    )
    page_base, n_entries = page_table(kv_indptr_ptr, kv_indices_ptr, b, num_indices)
    causal_limit = kv_len - qo_len + t_local
    return qk_scale, pe_factor, v_scale, n_begin, n_end, page_base, n_entries, causal_limit


@triton.jit
def program_setup(
    q_nope_ptr, q_pe_ptr, ckv_scale_ptr, kpe_scale_ptr, kv_indptr_ptr, kv_indices_ptr,
    kv_len_ptr, b, m_tile, split, tok, head, row_ok, t_local, qo_len,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
    num_heads, num_indices, sm_scale_log2, ckv_scale_val, kpe_scale_val,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_CKV: tl.constexpr, D_KPE: tl.constexpr,
    CAUSAL: tl.constexpr, TOKEN_GROUP: tl.constexpr, CKV_SCALE_PTR: tl.constexpr,
    KPE_SCALE_PTR: tl.constexpr, DOT_DTYPE: tl.constexpr, FP8_CVT: tl.constexpr,
):  # fmt: skip
    """What a full-width program needs before its KV loop: :func:`program_kv` and its query
    tile."""
    qk_scale, pe_factor, v_scale, n_begin, n_end, page_base, n_entries, causal_limit = (
        program_kv(
            ckv_scale_ptr, kpe_scale_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr,
            b, m_tile, split, t_local, qo_len, num_heads, num_indices, sm_scale_log2,
            ckv_scale_val, kpe_scale_val, BLOCK_M, BLOCK_N, CAUSAL, TOKEN_GROUP, CKV_SCALE_PTR,
            KPE_SCALE_PTR, FP8_CVT,
        )
    )  # fmt: skip
    q_nope, q_pe = load_queries(
        q_nope_ptr, q_pe_ptr, tok, head, row_ok, stride_qn_t, stride_qn_h, stride_qp_t,
        stride_qp_h, pe_factor, D_CKV, D_KPE, DOT_DTYPE,
    )  # fmt: skip
    return qk_scale, v_scale, n_begin, n_end, page_base, n_entries, q_nope, q_pe, causal_limit
