"""The data movers of the FP8 × FP8 decode kernel (``kernels/mla_fp8qk.py``): the copier,
which stages each 64-token tile's FP8 bytes (and token-group scales) through the page table
by ``cp.async``, and the query staging the value warpgroups do before their first tile: the
query as exact e4m3 hi/lo operand rows under a power of two per row.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from fp8mla.kernels.fewrows_producer import _BARRIER, BLOCK_N, _stamp
from fp8mla.kernels.kv_fill import _ASYNC_LOAD, _cache_rows, _check_entries, _load_entries

E4M3_MAX = gl.constexpr(448.0)
LO_GAIN = gl.constexpr(16.0)  # lo = (q·s − hi) × 16: e4m3's 3 mantissa bits, one step down
# a tile's group scales [64 tokens, 4] (fp32): 8 bytes per thread
SC_L = gl.constexpr(gl.BlockedLayout([1, 2], [16, 2], [4, 1], [1, 0]))


@gluon.jit
def _copier(
    k_stages, pe_stages, sc_stages, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base,
    n_entries, num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s,
    stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s, PAGE_SIZE: gl.constexpr,
    D_CKV: gl.constexpr, D_KPE: gl.constexpr, TOKEN_GROUP: gl.constexpr, STAGES: gl.constexpr,
    P_WARPS: gl.constexpr, PROBE: gl.constexpr, trace_ptr,
):  # fmt: skip
    """Each tile of ``[n_begin, n_end)`` into stage ``j % STAGES`` by ``cp.async`` (tokens past
    ``n_end`` as 0, a bad page entry's token as the NaN row), with its tokens' four group
    scales where ``TOKEN_GROUP``; every thread's copies arrive on ``ready`` when they land, so
    up to ``STAGES`` tiles are in flight. The page-table entries are loaded a tile ahead and
    checked only when their tile is copied, so the copier never waits for a page-table load
    before its own copies (their latency under load is ~2,000 cycles)."""
    ld: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [P_WARPS, 1], [1, 0])  # [64, 128] B
    pe_ld: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [P_WARPS, 1], [1, 0])  # [64, 64] B
    rows_l: gl.constexpr = gl.SliceLayout(1, ld)
    pe_rows_l: gl.constexpr = gl.SliceLayout(1, pe_ld)
    C8: gl.constexpr = 128  # bytes per copy step: one 128-byte row chunk
    d = gl.arange(0, C8, layout=gl.SliceLayout(0, ld))
    e = gl.arange(0, D_KPE, layout=gl.SliceLayout(0, pe_ld))
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    _stamp(trace_ptr, 3, 0, 6, PROBE)
    base = n_begin + gl.arange(0, BLOCK_N, layout=rows_l)
    raw, in_list = _load_entries(page_base, n_entries, base, base < n_end, PAGE_SIZE)
    for j in range(n_tiles):
        s = j % STAGES
        pos = base + j * BLOCK_N
        ok = pos < n_end
        pages, bad = _check_entries(raw, in_list, ok, num_pages)
        _stamp(trace_ptr, 3, j, 3, PROBE)
        slot = pages.to(gl.int64)
        if PROBE & 2:  # measurement only: the same 64 tokens for every tile (L2 hits)
            slot = (pos % BLOCK_N).to(gl.int64) // PAGE_SIZE
        rows = _cache_rows(slot, pos, bad, stride_ckv_p, stride_ckv_s, nan_row_ckv, PAGE_SIZE)
        pe_rows = _cache_rows(slot, pos, bad, stride_kpe_p, stride_kpe_s, nan_row_kpe, PAGE_SIZE)
        pe_rows = gl.convert_layout(pe_rows, pe_rows_l)
        pe_ok = gl.convert_layout(ok, pe_rows_l)
        # the next tile's page entries, requested before this tile's copies
        nxt = pos + BLOCK_N
        raw, in_list = _load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
        # the value warpgroups are done with this stage (tile j - STAGES); passes at once at first
        _stamp(trace_ptr, 3, j, 0, PROBE)
        mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)
        _stamp(trace_ptr, 3, j, 1, PROBE)
        k_dst = k_stages.index(s)
        for c in gl.static_range(D_CKV // C8):
            _ASYNC_LOAD(
                k_dst.slice(c * C8, C8, dim=1), ckv_ptr + rows[:, None] + (c * C8 + d)[None, :],
                mask=ok[:, None],
            )  # fmt: skip
        _ASYNC_LOAD(
            pe_stages.index(s), kpe_ptr + pe_rows[:, None] + e[None, :], mask=pe_ok[:, None]
        )
        if TOKEN_GROUP:  # a bad entry's token: page 0's scales (its K and V are NaN anyway)
            sa_rows = slot * stride_sa_p + (pos % PAGE_SIZE) * stride_sa_s
            sa_rows = gl.convert_layout(sa_rows, gl.SliceLayout(1, SC_L))
            sa_ok = gl.convert_layout(ok, gl.SliceLayout(1, SC_L))
            g = gl.arange(0, 4, layout=gl.SliceLayout(0, SC_L))
            _ASYNC_LOAD(
                sc_stages.index(s), scale_arr_ptr + sa_rows[:, None] + g[None, :],
                mask=sa_ok[:, None],
            )  # fmt: skip
        async_copy.mbarrier_arrive(ready.index(s), increment_count=False)
        _stamp(trace_ptr, 3, j, 2, PROBE)


@gluon.jit
def _pow2_scale(amax):
    """The power of two ``s`` with ``224 < amax · s ≤ 448`` (a row of zeros: 1; at most 2^126,
    so a row below 2^-117 keeps a finite scale and rounds to zero). A power of two keeps
    ``q · s`` a bf16 value, which ``hi + lo / 16`` then holds exactly."""
    amax = gl.where(amax > 0.0, amax, E4M3_MAX)
    return gl.exp2(gl.minimum(gl.floor(gl.log2(E4M3_MAX / amax)), 126.0))


@gluon.jit
def _tile_rows(rows_total, BLOCK_M: gl.constexpr, ROW_TILES: gl.constexpr):
    """The program's row tile: its first query row of the request and the end of its rows (a
    16-row tile's score warpgroup computes 32 rows: those past the tile are neither staged nor
    stored). ``ROW_TILES``: the grid's first axis counts row tiles; else the request's rows
    are one tile, and the kernel compiles as it did before it had row tiles (whose row
    arithmetic cost the one-tile decode 3-5%; benchmarks/NOTES-2026-12-01-rounds-25-27.md,
    round 27)."""
    if ROW_TILES:
        row0 = gl.program_id(0) * BLOCK_M
        return row0, gl.minimum(rows_total, row0 + BLOCK_M)
    return 0, rows_total


@gluon.jit
def _slab_rows(q_ptr, w: gl.constexpr, q_start, row0, rows_end, num_heads, num_tokens,
               stride_t, stride_h, D: gl.constexpr, ld: gl.constexpr,
               PROBE: gl.constexpr):  # fmt: skip
    """The row tile's query rows ``row0 + 8w … row0 + 8w + 7`` (row = token × heads + head;
    rows from ``rows_end`` on as 0), ``[8, D]`` in the query's dtype (``PROBE & 4``,
    measurement only: ones, nothing loaded)."""
    r = row0 + w * 8 + gl.arange(0, 8, layout=gl.SliceLayout(1, ld))
    tok = q_start + r // num_heads
    r_ok = (r < rows_end) & (tok < num_tokens)
    rows = q_ptr + tok.to(gl.int64) * stride_t + (r % num_heads) * stride_h
    d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    if PROBE & 4:
        return gl.full([8, D], 1.0, q_ptr.dtype.element_ty, layout=ld)
    return gl.load(rows[:, None] + d[None, :], mask=r_ok[:, None], other=0.0)


@gluon.jit
def _stage_slab(q_smem, inv_smem, x, w: gl.constexpr):
    """One 8-row slab ``x`` of one part of the query into operand rows ``16w … 16w + 7`` (hi)
    and ``16w + 8 … 16w + 15`` (lo), with a power of two per row (:func:`_pow2_scale`); its
    ``1 / s`` into ``inv_smem[8w : 8w + 8]``."""
    x = x.to(gl.float32)
    s = _pow2_scale(gl.max(gl.abs(x), axis=1))
    x = x * s[:, None]
    hi = x.to(gl.float8e4nv)
    q_smem.slice(16 * w, 8, dim=0).store(hi)
    q_smem.slice(16 * w + 8, 8, dim=0).store(((x - hi.to(gl.float32)) * LO_GAIN).to(gl.float8e4nv))
    inv_smem.slice(8 * w, 8).store(1.0 / s)


@gluon.jit
def _stage_query_half(
    q_smem, qpe_smem, inv_smem, q_ready, q_nope_ptr, q_pe_ptr, q_start, rows_total, num_heads,
    num_tokens, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, H: gl.constexpr,
    D_CKV: gl.constexpr, D_KPE: gl.constexpr, BLOCK_M: gl.constexpr, ROW_TILES: gl.constexpr,
    PROBE: gl.constexpr,
):  # fmt: skip
    """Value warpgroup ``H``'s share of the query staging (slabs ``2H`` and ``2H + 1``, the row
    tile's query rows ``16H … 16H + 15``: :func:`_tile_rows`), then an arrival on ``q_ready``.
    The score warpgroup's operands ``[64, 512]`` and ``[64, 64]`` in e4m3: per query row and part
    a power of two ``s`` (:func:`_pow2_scale`), ``hi = e4m3(q·s)`` in row ``16w + g`` and
    ``lo = e4m3((q·s − hi) · 16)`` in row ``16w + 8 + g`` for the tile's query row ``8w + g``
    (exact for bf16 queries but for elements 2^12 below the row's largest); ``1 / s`` of both
    parts in ``inv_smem [2, 32]``. All rows are requested before any is converted."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    w0: gl.constexpr = 2 * H
    w1: gl.constexpr = 2 * H + 1
    row0, rows_end = _tile_rows(rows_total, BLOCK_M, ROW_TILES)
    x0 = _slab_rows(q_nope_ptr, w0, q_start, row0, rows_end, num_heads, num_tokens,
                    stride_qn_t, stride_qn_h, D_CKV, ld, PROBE)  # fmt: skip
    x1 = _slab_rows(q_nope_ptr, w1, q_start, row0, rows_end, num_heads, num_tokens,
                    stride_qn_t, stride_qn_h, D_CKV, ld, PROBE)  # fmt: skip
    p0 = _slab_rows(q_pe_ptr, w0, q_start, row0, rows_end, num_heads, num_tokens,
                    stride_qp_t, stride_qp_h, D_KPE, ld, PROBE)  # fmt: skip
    p1 = _slab_rows(q_pe_ptr, w1, q_start, row0, rows_end, num_heads, num_tokens,
                    stride_qp_t, stride_qp_h, D_KPE, ld, PROBE)  # fmt: skip
    _stage_slab(q_smem, inv_smem.index(0), x0, w0)
    _stage_slab(q_smem, inv_smem.index(0), x1, w1)
    _stage_slab(qpe_smem, inv_smem.index(1), p0, w0)
    _stage_slab(qpe_smem, inv_smem.index(1), p1, w1)
    fence_async_shared()
    _BARRIER()
    mbarrier.arrive(q_ready)
