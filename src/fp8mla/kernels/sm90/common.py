"""Building blocks of the SM90 Gluon attention kernels that more than one kernel uses.

- partition-wide synchronization (:data:`thread_barrier`) and ``cp.async`` (:data:`async_load`)
  under the names of the installed Triton, and programmatic dependent launch
  (:func:`wait_prior`, :func:`launch_dependents`);
- the page table: raw entries loaded ahead (:func:`load_entries`) and checked when used
  (:func:`check_entries`); a bad entry's token reads the launcher's NaN row
  (:func:`cache_rows`), never outside the cache, never a finite value;
- FP8 codes to fp16 (:func:`fp8_to_f16`) and L2 prefetches;
- the scores' masks (:func:`unmasked_end`, :func:`mask_scores`), the 64-token online softmax
  (:func:`softmax_tile64`) and the stores of output rows and base-2 LSEs;
- the query staged in shared memory (:func:`stage_query`), and the FP8 query's per-row power
  of two (:func:`pow2_scale`) and row tiles (:func:`tile_rows`).

The kernels that use them: ``wgmma.py``, ``pingpong.py``, ``pingpong8.py``, ``fewrows.py``,
``fp8qk.py``; their pipelines are described in ``docs/design/``.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared

from fp8mla.kernels.portable.fp8_decode import (
    CVT_INT_E4M3,
    CVT_NATIVE,
    CVT_TRITON_INT_E4M3,
    fp8_bytes_to_f16,
    fp8_words_to_f16x2,
)

# a barrier over the calling partition's warps (renamed after Triton 3.6)
thread_barrier = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
# global → shared by cp.async (renamed after Triton 3.6)
async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

# a shared-memory view of another dtype or shape: ``_reinterpret`` in Triton 3.6, ``reinterpret``
# later
REINTERPRET_PUBLIC = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))

# the RoPE part of a stage of bf16 RoPE values (``ROPE_16BIT``): 128 bytes a token, staged as
# bytes in the latent part's 128-byte swizzle, read by wgmma as bf16 [tokens, 64] in the same
# swizzle for 16-bit elements
ROPE16_SH = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))

# the same 128-byte swizzle for 32-bit elements: a 16-bit tile's fp16 / bf16 pairs as int32
PAIRS_SH = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2))

NEG_INF = gl.constexpr(float("-inf"))
BLOCK_N = gl.constexpr(64)  # KV tokens per tile of the 64-token kernels: wgmma's M or N
CHUNK = gl.constexpr(128)  # latent columns per load / conversion step
PRODUCER_WARPS = gl.constexpr(4)  # warps of a producer warpgroup
HALF_N = gl.constexpr(32)  # tokens per P·V step of the FP8 value path (fp8_values.py)
E4M3_MAX = gl.constexpr(448.0)
LO_GAIN = gl.constexpr(16.0)  # lo = (q·s − hi) × 16: e4m3's 3 mantissa bits, one step down


@gluon.jit
def group_scales(sc_stages, st, g: gl.constexpr, col_l: gl.constexpr):
    """Stage ``st``'s 64 token scales of group ``g`` (latent columns ``[128g, 128g + 128)``)
    from its ``[64 tokens, 4]`` scales, in ``SliceLayout(1, col_l)``: ``col_l`` is a layout of
    ``[64, 1]``; one that places each token where the scores' layout holds it needs no
    exchange between threads."""
    return gl.sum(sc_stages.index(st).slice(g, 1, dim=1).load(col_l), axis=1)


# -- programmatic dependent launch (SM90+) --


@gluon.jit
def rope16_view(pe_stage, D_KPE: gl.constexpr):
    """A stage's RoPE bytes ``[tokens, 2 · D_KPE]`` (``ROPE_16BIT``) as bf16 ``[tokens, D_KPE]``
    in :data:`ROPE16_SH`."""
    if REINTERPRET_PUBLIC:
        return pe_stage.reinterpret(gl.bfloat16, [pe_stage.shape[0], D_KPE], ROPE16_SH)
    else:
        return pe_stage._reinterpret(gl.bfloat16, [pe_stage.shape[0], D_KPE], ROPE16_SH)


@gluon.jit
def pairs_view(tile):
    """A 16-bit shared tile ``[rows, D]`` in the 128-byte swizzle as int32 ``[rows, D / 2]``
    (each element a pair of 16-bit values, the lower column in the low half), the same bytes:
    the swizzle moves 16-byte units, which both views share."""
    shape: gl.constexpr = [tile.shape[0], tile.shape[1] // 2]
    if REINTERPRET_PUBLIC:
        return tile.reinterpret(gl.int32, shape, PAIRS_SH)
    else:
        return tile._reinterpret(gl.int32, shape, PAIRS_SH)


@gluon.jit
def fp8_words_to_scaled_pairs(w, sc, FP8_CVT: gl.constexpr):
    """int32 words of four FP8 codes → two int32 words of fp16 pairs (codes 0-1, 2-3) times
    their rows' fp32 group scales ``sc`` [rows], as :func:`times_group_scale` scales
    :func:`fp8_to_f16`'s values: ``(2^-8 · k) · hi + (2^-8 · k) · lo`` with ``hi + lo`` =
    ``2^8 · sc`` (the PTX and CUDA integer modes)."""
    a, b = fp8_words_to_f16x2(w, FP8_CVT)
    hi, lo = _scale_halves(sc)
    hi2 = (hi.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF) * 0x10001
    lo2 = (lo.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF) * 0x10001
    if FP8_CVT == CVT_INT_E4M3:  # the codes decode to 2^-8 · value already
        asm: gl.constexpr = """{ .reg .b32 t;
        mul.rn.f16x2 t, $2, $4;
        fma.rn.f16x2 $0, $2, $5, t;
        mul.rn.f16x2 t, $3, $4;
        fma.rn.f16x2 $1, $3, $5, t; }"""
    else:
        asm: gl.constexpr = """{ .reg .b32 t, u, v, k;
        mov.b32 k, 0x1C001C00;
        mul.rn.f16x2 u, $2, k;
        mul.rn.f16x2 v, $3, k;
        mul.rn.f16x2 t, u, $4;
        fma.rn.f16x2 $0, u, $5, t;
        mul.rn.f16x2 t, v, $4;
        fma.rn.f16x2 $1, v, $5, t; }"""
    return gl.inline_asm_elementwise(
        asm, "=r,=r,r,r,r,r", [a, b, lo2[:, None], hi2[:, None]], dtype=(gl.int32, gl.int32),
        is_pure=True, pack=1,
    )  # fmt: skip


@gluon.jit
def wait_prior():
    """``griddepcontrol.wait`` by every thread of the program: the grids this one depends
    on have ended and their memory operations are visible."""
    gl.inline_asm_elementwise(
        "griddepcontrol.wait; mov.u32 $0, 0;", "=r,r", [gl.program_id(0)], dtype=gl.int32,
        is_pure=False, pack=1,
    )  # fmt: skip


@gluon.jit
def launch_dependents():
    """``griddepcontrol.launch_dependents`` by the calling threads (one program's call
    counts once)."""
    gl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; mov.u32 $0, 0;", "=r,r", [gl.program_id(0)],
        dtype=gl.int32, is_pure=False, pack=1,
    )  # fmt: skip


# -- KV tiles through the page table --


@gluon.jit
def fp8_to_f16(b, FP8_CVT: gl.constexpr):
    """FP8 codes → fp16: Triton's cast for ``CVT_NATIVE`` (FP8 pointers), else the bit moves
    of ``portable/fp8_decode.fp8_bytes_to_f16`` on the bytes."""
    if FP8_CVT == CVT_NATIVE:
        return b.to(gl.float16)
    return fp8_bytes_to_f16(b, FP8_CVT)


@gluon.jit
def _scale_halves(sc):
    """``2^8 · sc`` (fp32 group scales) as fp16 ``hi + lo`` to 22 bits: ``hi`` its fp16
    rounding, ``lo`` the fp16 rounding of the rest (:func:`times_group_scale`)."""
    s32 = sc * 256.0
    hi = s32.to(gl.float16)
    return hi, (s32 - hi.to(gl.float32)).to(gl.float16)


@gluon.jit
def times_group_scale(k, sc, FP8_CVT: gl.constexpr):
    """:func:`fp8_to_f16`'s values ``k`` [rows, columns] times their rows' fp32 group scales
    ``sc`` [rows], in fp16 arithmetic: ``(2^-8 · k) · hi + (2^-8 · k) · lo`` with one fused
    multiply-add, where ``hi + lo`` is ``2^8 · sc`` to 22 bits (``hi`` its fp16 rounding,
    ``lo`` the fp16 rounding of the rest).

    The scales are arbitrary fp32 (GLM's caches among them). ``2^8 · sc`` stays an fp16 normal
    down to ``sc`` = 2^-22 (values of ~1e-4) where ``sc`` alone would be subnormal below 2^-14.
    ``hi`` alone would scale every value of a token's group by the same rounding error (up to
    2^-12), which the scores do not average away; with ``lo`` each value carries only its own
    fp16 rounding, as the fp32 product rounded to 16 bits does. ``2^-8 · k`` is exact for
    every code (the integer e4m3 decodings yield it as they are). A scale above ~256 (values
    past fp16's range either way) overflows."""
    hi, lo = _scale_halves(sc)
    if FP8_CVT != CVT_INT_E4M3 and FP8_CVT != CVT_TRITON_INT_E4M3:
        k = k * 0.00390625
    return gl.fma(k, hi[:, None], k * lo[:, None])


@gluon.jit
def load_entries(page_base, n_entries, pos, ok, PAGE_SIZE: gl.constexpr):
    """The raw page-table entries of the tokens at ``pos`` (0 where not ``ok`` or past the
    request's own ``n_entries``) and whether each was in the list: the load alone, so that its
    latency can pass before :func:`check_entries` uses the result."""
    entry = pos // PAGE_SIZE
    in_list = ok & (entry < n_entries)
    return gl.load(page_base + entry, mask=in_list, other=0), in_list


@gluon.jit
def check_entries(page, in_list, ok, num_pages):
    """Page ids from :func:`load_entries`' raw entries and which of them are bad: an entry past
    the request's own list or a page id outside ``[0, num_pages)``. Bad entries are never
    dereferenced; their page reads as 0."""
    bad = ok & ((~in_list) | (page.to(gl.uint32) >= num_pages))
    return gl.where(bad, 0, page), bad


@gluon.jit
def cache_rows(slot, pos, bad, stride_p, stride_s, nan_row, PAGE_SIZE: gl.constexpr):
    """Element offsets of the tokens' cache rows (``slot`` the page, ``pos`` the token's
    position): a bad page entry's token reads the launcher's NaN row instead (``nan_row``, its
    offset from the cache): never outside the cache, never finite. Arithmetic, not a select,
    so the offsets stay provably 16-aligned (16-byte loads)."""
    rows = slot * stride_p + (pos % PAGE_SIZE) * stride_s
    return rows + bad.to(gl.int64) * (nan_row - rows)


@gluon.jit
def page_entries(page_base, n_entries, num_pages, pos, ok, PAGE_SIZE: gl.constexpr):
    """Page ids of the tokens at ``pos`` (where ``ok``) and which of them are bad (see
    :func:`check_entries`); waits for the load."""
    page, in_list = load_entries(page_base, n_entries, pos, ok, PAGE_SIZE)
    return check_entries(page, in_list, ok, num_pages)


@gluon.jit
def tile_cache_rows(raw, in_list, pos, n_end, num_pages, stride_ckv_p, stride_ckv_s,
                     stride_kpe_p, stride_kpe_s, nan_row_ckv, nan_row_kpe,
                     PAGE_SIZE: gl.constexpr):  # fmt: skip
    """The cache rows (element offsets) of a tile's tokens at ``pos``, latent and RoPE, from
    their raw page-table entries (:func:`load_entries`): a bad entry's token as the NaN
    row."""
    pages, bad = check_entries(raw, in_list, pos < n_end, num_pages)
    slot = pages.to(gl.int64)
    rows = cache_rows(slot, pos, bad, stride_ckv_p, stride_ckv_s, nan_row_ckv, PAGE_SIZE)
    pe_rows = cache_rows(slot, pos, bad, stride_kpe_p, stride_kpe_s, nan_row_kpe, PAGE_SIZE)
    return rows, pe_rows


@gluon.jit
def load_chunk(ckv_ptr, rows, ok, c: gl.constexpr, ld: gl.constexpr):
    """FP8 bytes of latent columns ``[c·CHUNK, (c+1)·CHUNK)`` of the tile's ``rows`` (0 where
    not ``ok``)."""
    d = c * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, ld))
    return gl.load(ckv_ptr + rows[:, None] + d[None, :], mask=ok[:, None], other=0)


@gluon.jit
def prefetch_l2(ptrs):
    """Start moving the lines at ``ptrs`` into the L2 (``prefetch.global.L2``; the result is a
    dummy)."""
    return gl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.u32 $0, 0;",
        "=r,l",
        [ptrs],
        dtype=gl.int32,
        is_pure=False,
        pack=1,
    )


# -- scores, softmax and stores --


@gluon.jit
def unmasked_end(n_end, kv_len, qo_len, row0, num_heads, CAUSAL: gl.constexpr):
    """The end of the tokens that every row from ``row0`` on sees: the split's end, or with a
    causal mask also row ``row0``'s limit (rows further on see more). A KV tile that ends at
    or before it needs no mask."""
    if CAUSAL:
        return gl.minimum(n_end, kv_len - qo_len + row0 // num_heads + 1)
    return n_end


@gluon.jit
def mask_scores(s, n0, n_end, causal_limit, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
                 s_layout: gl.constexpr):  # fmt: skip
    """Scores ``s [rows, BLOCK_N]`` of the tile at ``n0`` with the tokens a row does not see
    as -inf: those at or past ``n_end`` and, with a causal mask, past the row's
    ``causal_limit``. (A bad page entry's token holds the NaN row: its scores stay NaN.)"""
    pos = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    visible = (pos < n_end)[None, :]
    if CAUSAL:
        visible = visible & (pos[None, :] <= causal_limit[:, None])
    return gl.where(visible, s, NEG_INF)


@gluon.jit
def softmax_tile64(s, m_prev, n0, mask_from, n_end, causal_limit, qk_scale, BLOCK_N: gl.constexpr,
                    CAUSAL: gl.constexpr, s_layout: gl.constexpr,
                    ROW_SCALE: gl.constexpr = False):  # fmt: skip
    """:func:`_softmax_tile` for 64-token tiles, whose softmax lies on the other warpgroup's
    path (it waits for ``P``): ``P`` (fp32), the rescale factor and the new maximum; the caller
    adds the row sums once ``P`` is published.

    Only a tile that reaches ``mask_from`` (the split's end, or the first causal limit of the
    program's rows) is masked. The maximum is taken of the raw scores and scaled after
    (``qk_scale`` > 0), so each score costs one fused multiply-add and one exp2 (the
    32-token ping-pong tiles, whose softmax runs beside the other warpgroup's product, keep a
    softmax of their own: ``docs/design/sm90-pingpong.md``).
    ``ROW_SCALE``: ``qk_scale`` is one scale per row (the FP8 ping-pong kernel's query halves
    carry a power of two per row), else one for all."""
    if n0 + BLOCK_N > mask_from:
        s = mask_scores(s, n0, n_end, causal_limit, BLOCK_N, CAUSAL, s_layout)
    m_new = gl.maximum(m_prev, gl.max(s, axis=1) * qk_scale)
    m_use = gl.where(m_new == NEG_INF, 0.0, m_new)
    alpha = gl.exp2(m_prev - m_use)
    if ROW_SCALE:
        p = gl.exp2(s * qk_scale[:, None] - m_use[:, None])
    else:
        p = gl.exp2(s * qk_scale - m_use[:, None])
    return p, alpha, m_new


@gluon.jit
def store_lse(m_i, l_i, lse_ptr, split, q_start, r, rows_total, num_heads, num_tokens,
               stride_lse_split, stride_lse_t):  # fmt: skip
    """The base-2 log-sum-exp of rows ``r`` (row = token × heads + head) into
    ``lse [splits, T, H]`` at ``split``: -inf for a row that saw no token, NaN (a bad page
    entry) kept; rows past ``rows_total`` or the last token not written."""
    has = l_i > 0.0
    lse = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), NEG_INF)
    lse = gl.where(l_i != l_i, l_i, lse)  # NaN (a bad page entry) stays NaN
    tok = q_start + r // num_heads
    r_ok = (r < rows_total) & (tok < num_tokens)
    lse_ptrs = lse_ptr + split * stride_lse_split + tok.to(gl.int64) * stride_lse_t
    gl.store(lse_ptrs + r % num_heads, lse, mask=r_ok)


@gluon.jit
def store_rows(o, inv_l, o_ptr, col0, m_tile, q_start, rows_total, num_heads, num_tokens,
                split, stride_o_split, stride_o_t, stride_o_h, BLOCK_M: gl.constexpr,
                layout: gl.constexpr):  # fmt: skip
    """A row tile's output columns ``[col0, col0 + width)``, ``o [BLOCK_M, width]`` (in
    ``layout``) times the rows' ``inv_l``, into ``o [splits, T, H, 512]`` at ``split`` in the
    output's dtype (row = token × heads + head); rows past ``rows_total`` or the last token
    not written."""
    rows_l: gl.constexpr = gl.SliceLayout(1, layout)
    ro = m_tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=rows_l)
    ro_ok = (ro < rows_total) & (q_start + ro // num_heads < num_tokens)
    o_rows_ptr = o_ptr + split * stride_o_split
    o_rows_ptr += (q_start + ro // num_heads).to(gl.int64) * stride_o_t
    o_rows_ptr += (ro % num_heads) * stride_o_h
    dcol = col0 + gl.arange(0, o.shape[1], layout=gl.SliceLayout(0, layout))
    out = o * gl.convert_layout(inv_l, rows_l)[:, None]
    gl.store(
        o_rows_ptr[:, None] + dcol[None, :], out.to(o_ptr.dtype.element_ty), mask=ro_ok[:, None]
    )


@gluon.jit
def stage_query(
    q_smem, qpe_smem, q_nope_ptr, q_pe_ptr, m_tile, q_start, rows_total, num_heads, num_tokens,
    pe_factor,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
    BLOCK_M: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr,
    ROW0: gl.constexpr, ROWS: gl.constexpr, WARPS: gl.constexpr,
):  # fmt: skip
    """Rows ``[ROW0, ROW0 + ROWS)`` of the tile's query rows (row = token × heads + head) into
    the same rows of shared memory, each part in its buffer's dtype (the dot dtype; the RoPE
    part bf16 beside a packed cache's bf16 RoPE values), ``q_pe`` times ``pe_factor``; rows
    past ``rows_total`` as 0. Run by ``WARPS`` warps (a partition's)."""
    q_ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [WARPS, 1], [1, 0])
    pe_ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    if ROWS == BLOCK_M:
        q_dst = q_smem
        qpe_dst = qpe_smem
    else:
        q_dst = q_smem.slice(ROW0, ROWS, dim=0)
        qpe_dst = qpe_smem.slice(ROW0, ROWS, dim=0)
    r = m_tile * BLOCK_M + ROW0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, q_ld))
    r_ok = (r < rows_total) & (q_start + r // num_heads < num_tokens)
    q_rows = q_nope_ptr + (q_start + r // num_heads).to(gl.int64) * stride_qn_t
    q_rows += (r % num_heads) * stride_qn_h
    for c in gl.static_range(D_CKV // CHUNK):
        d = c * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, q_ld))
        q = gl.load(q_rows[:, None] + d[None, :], mask=r_ok[:, None], other=0.0)
        q_dst.slice(c * CHUNK, CHUNK, dim=1).store(q.to(q_dst.dtype))
    rp = m_tile * BLOCK_M + ROW0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, pe_ld))
    rp_ok = (rp < rows_total) & (q_start + rp // num_heads < num_tokens)
    qp_rows = q_pe_ptr + (q_start + rp // num_heads).to(gl.int64) * stride_qp_t
    qp_rows += (rp % num_heads) * stride_qp_h
    e = gl.arange(0, D_KPE, layout=gl.SliceLayout(0, pe_ld))
    qp = gl.load(qp_rows[:, None] + e[None, :], mask=rp_ok[:, None], other=0.0)
    qpe_dst.store((qp.to(gl.float32) * pe_factor).to(qpe_dst.dtype))
    fence_async_shared()
    thread_barrier()


# -- the FP8 query: per-row powers of two, row tiles --


@gluon.jit
def pow2_scale(amax):
    """The power of two ``s`` with ``224 < amax · s ≤ 448`` (a row of zeros: 1; at most 2^126,
    so a row below 2^-117 keeps a finite scale and rounds to zero). A power of two keeps
    ``q · s`` a bf16 value, which ``hi + lo / 16`` then holds exactly."""
    amax = gl.where(amax > 0.0, amax, E4M3_MAX)
    return gl.exp2(gl.minimum(gl.floor(gl.log2(E4M3_MAX / amax)), 126.0))


@gluon.jit
def tile_rows(rows_total, BLOCK_M: gl.constexpr, ROW_TILES: gl.constexpr):
    """The program's row tile: its first query row of the request and the end of its rows (a
    16-row tile's score warpgroup computes 32 rows: those past the tile are neither staged nor
    stored). ``ROW_TILES``: the grid's first axis counts row tiles; else the request's rows
    are one tile, and the kernel is compiled without the row-tile arithmetic, which the
    one-tile decode measured slower with (``docs/design/sm90-fp8qk.md``)."""
    if ROW_TILES:
        row0 = gl.program_id(0) * BLOCK_M
        return row0, gl.minimum(rows_total, row0 + BLOCK_M)
    return 0, rows_total
