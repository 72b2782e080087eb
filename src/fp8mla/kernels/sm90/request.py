"""What a program of the SM90 Gluon attention kernels works on: its request's rows, its KV
split and the request's page table (:func:`request_span`), from the portable kernels' split
arithmetic and scales (``portable/tiles.py``)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from fp8mla.kernels.portable import tiles as T


@gluon.jit
def request_span(
    qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr, ckv_scale_ptr, kpe_scale_ptr,
    ckv_scale_val, kpe_scale_val, sm_scale_log2, b, m_tile, split, num_heads, num_indices,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
    CKV_SCALE_PTR: gl.constexpr, KPE_SCALE_PTR: gl.constexpr, TOKEN_GROUP: gl.constexpr,
    FP8_CVT: gl.constexpr, READ_KV_LEN: gl.constexpr = True, LISTS: gl.constexpr = False,
    num_tokens=None,
):  # fmt: skip
    """What a Gluon program of request ``b``, row tile ``m_tile`` and KV split ``split``
    works on: ``(q_start, qo_len, rows_total, kv_len, n_begin, n_end, page_base, n_entries,
    qk_scale, pe_factor, v_scale)``. Every partition runs the same number of KV steps: none
    for a tile past the rows or a split past the (causal) end. A negative ``kv_indptr`` start
    is as bad as a missing entry: every token of the request is then bad. ``READ_KV_LEN``
    False: ``kv_len``, ``n_begin`` and ``n_end`` are 0, for partitions that read them later
    with ``tiles.request_kv_span`` (the grid before this one writes the lengths). ``LISTS``:
    request ``b`` is sparse query token ``b`` whose page table is its index list (page size 1):
    its length, read at ``kv_len_ptr[b]``, is clamped into ``[0, n_entries]``, and a request
    past the call's ``num_tokens`` rows has none (its length is not read)."""
    q_start = gl.load(qo_indptr_ptr + b)
    qo_len = gl.load(qo_indptr_ptr + b + 1) - q_start
    rows_total = qo_len * num_heads
    qk_scale, pe_factor, v_scale = T.kv_scales(
        ckv_scale_ptr, kpe_scale_ptr, ckv_scale_val, kpe_scale_val, sm_scale_log2,
        CKV_SCALE_PTR, KPE_SCALE_PTR, TOKEN_GROUP, FP8_CVT,
    )  # fmt: skip
    span = (kv_len_ptr, b, m_tile, split, qo_len, rows_total, num_heads)
    if READ_KV_LEN and not LISTS:
        kv_len, n_begin, n_end = T.request_kv_span(span, BLOCK_M, BLOCK_N, CAUSAL)
    else:
        kv_len = 0
        n_begin = 0
        n_end = 0
    kv_start = gl.load(kv_indptr_ptr + b)
    kv_stop = gl.minimum(gl.load(kv_indptr_ptr + b + 1), num_indices)
    n_entries = gl.where(kv_start >= 0, kv_stop - kv_start, 0)
    if LISTS:
        # request b is query token b (its rows start at b): the mask needs no q_start, so the
        # length is loaded beside the indptr entries, not after them, and the split's range
        # (then the copier's first index-list load) waits for one load instead of two
        kv_len = gl.load(kv_len_ptr + b, mask=b < num_tokens, other=0)
        kv_len = gl.minimum(gl.maximum(kv_len, 0), n_entries)
        n_begin, n_end = T.kv_span(kv_len, span, BLOCK_M, BLOCK_N, CAUSAL)
    page_base = kv_indices_ptr + gl.maximum(kv_start, 0)
    return (q_start, qo_len, rows_total, kv_len, n_begin, n_end, page_base, n_entries, qk_scale,
            pe_factor, v_scale)  # fmt: skip
