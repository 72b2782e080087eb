"""The producer warpgroups of the SM90 Gluon kernels: KV tiles from the paged pool into shared
memory through the page table, for the consumers that multiply them.

* :func:`_kv_producer` (FP8 pools): loads each tile's FP8 rows into registers, converts them
  to fp16 (times their token-group scales where used) and stores them into a 128-byte-swizzled
  buffer (the wgmma and ping-pong kernels);
* :func:`_kv_copier` (16-bit pools): copies each tile as it is by ``cp.async`` (the wgmma,
  ping-pong and few-row kernels);
* :func:`_kv_copier_halves` (16-bit pools, the ping-pong kernel's 64-token tiles): the same
  copies by column halves, each half of a buffer with its own ``ready`` / ``empty`` pair, so
  that a half is refilled as soon as the one warpgroup that reads it is done; the copies
  themselves arrive on ``ready`` as they land, so the copier never waits for one.

All hand buffers over on ``ready`` / ``empty`` mbarriers, take tokens past the split's end as
0 and a bad page entry's token as the launcher's NaN row (never outside the cache, never
finite), and load the page-table entries of the next tile while the current one is in flight.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from fp8mla.kernels.portable import fp8_decode as T

# a barrier over the calling partition's warps (renamed after Triton 3.6)
_BARRIER = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
# global → shared by cp.async (renamed after Triton 3.6)
_ASYNC_LOAD = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

CHUNK = gl.constexpr(128)  # latent columns per load / conversion step
PRODUCER_WARPS = gl.constexpr(4)


@gluon.jit
def _fp8_to_f16(b, FP8_CVT: gl.constexpr):
    """FP8 codes → fp16: Triton's cast for ``CVT_NATIVE`` (FP8 pointers), else the bit moves
    of ``mla_tiles.fp8_bytes_to_f16`` on the bytes."""
    if FP8_CVT == T.CVT_NATIVE:
        return b.to(gl.float16)
    return T.fp8_bytes_to_f16(b, FP8_CVT)


@gluon.jit
def _load_entries(page_base, n_entries, pos, ok, PAGE_SIZE: gl.constexpr):
    """The raw page-table entries of the tokens at ``pos`` (0 where not ``ok`` or past the
    request's own ``n_entries``) and whether each was in the list: the load alone, so that its
    latency can pass before :func:`_check_entries` uses the result."""
    entry = pos // PAGE_SIZE
    in_list = ok & (entry < n_entries)
    return gl.load(page_base + entry, mask=in_list, other=0), in_list


@gluon.jit
def _check_entries(page, in_list, ok, num_pages):
    """Page ids from :func:`_load_entries`' raw entries and which of them are bad: an entry past
    the request's own list or a page id outside ``[0, num_pages)``. Bad entries are never
    dereferenced; their page reads as 0."""
    bad = ok & ((~in_list) | (page.to(gl.uint32) >= num_pages))
    return gl.where(bad, 0, page), bad


@gluon.jit
def _cache_rows(slot, pos, bad, stride_p, stride_s, nan_row, PAGE_SIZE: gl.constexpr):
    """Element offsets of the tokens' cache rows (``slot`` the page, ``pos`` the token's
    position): a bad page entry's token reads the launcher's NaN row instead (``nan_row``, its
    offset from the cache): never outside the cache, never finite. Arithmetic, not a select,
    so the offsets stay provably 16-aligned (16-byte loads)."""
    rows = slot * stride_p + (pos % PAGE_SIZE) * stride_s
    return rows + bad.to(gl.int64) * (nan_row - rows)


@gluon.jit
def _page_entries(page_base, n_entries, num_pages, pos, ok, PAGE_SIZE: gl.constexpr):
    """Page ids of the tokens at ``pos`` (where ``ok``) and which of them are bad (see
    :func:`_check_entries`); waits for the load."""
    page, in_list = _load_entries(page_base, n_entries, pos, ok, PAGE_SIZE)
    return _check_entries(page, in_list, ok, num_pages)


@gluon.jit
def _load_chunk(ckv_ptr, rows, ok, c: gl.constexpr, ld: gl.constexpr):
    """FP8 bytes of latent columns ``[c·CHUNK, (c+1)·CHUNK)`` of the tile's ``rows`` (0 where
    not ``ok``)."""
    d = c * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, ld))
    return gl.load(ckv_ptr + rows[:, None] + d[None, :], mask=ok[:, None], other=0)


@gluon.jit
def _prefetch_l2(ptrs):
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


@gluon.jit
def _store_chunk(k_dst, x, sa, ok, c: gl.constexpr, TOKEN_GROUP: gl.constexpr,
                 FP8_CVT: gl.constexpr):  # fmt: skip
    """FP8 bytes ``x`` of latent chunk ``c`` → fp16 (times their tokens' group scale with
    ``TOKEN_GROUP``) into the shared tile ``k_dst``."""
    k = _fp8_to_f16(x, FP8_CVT)
    if TOKEN_GROUP:
        sc = gl.load(sa + c, mask=ok, other=0.0)
        k = (k.to(gl.float32) * sc[:, None]).to(gl.float16)
    k_dst.slice(c * CHUNK, CHUNK, dim=1).store(k)


@gluon.jit
def _kv_producer(
    k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base, n_entries,
    num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s,
    stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s,
    PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr,
    TOKEN_GROUP: gl.constexpr, FP8_CVT: gl.constexpr, NBUF: gl.constexpr,
    WHOLE_TILE: gl.constexpr,
):  # fmt: skip
    """The producer: each KV tile of ``[n_begin, n_end)`` from the FP8 pool → fp16 shared tile
    ``j % NBUF`` (tokens past ``n_end`` as 0, tokens with a bad page entry as the NaN row),
    with ``TOKEN_GROUP`` each 128 columns times their tokens' group scale; ``ready`` is
    signalled when a tile is in place, ``empty`` is waited for before a buffer is
    overwritten.

    Its loads are latency-bound (one warpgroup, 96 registers), so: the RoPE bytes are loaded
    with the first latent chunk, each chunk's bytes while the previous chunk is converted (all
    four chunks at once with ``WHOLE_TILE``: 32-token tiles hold them in 32 registers), and
    the next tile's latent rows are prefetched into the L2 meanwhile (measured on the H200:
    without the prefetch and early RoPE load, the consumers waited for this warpgroup)."""
    # 16 bytes per thread, 8 threads per 128-byte row chunk, 4 rows per warp
    ld: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [PRODUCER_WARPS, 1], [1, 0])
    # the RoPE rows (8 bytes per thread) and the prefetch (one 64-byte segment per thread) with
    # the same row mapping
    pe: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PRODUCER_WARPS, 1], [1, 0])
    pf: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [PRODUCER_WARPS, 1], [1, 0])
    rows_l: gl.constexpr = gl.SliceLayout(1, ld)
    pe_rows_l: gl.constexpr = gl.SliceLayout(1, pe)
    pf_rows_l: gl.constexpr = gl.SliceLayout(1, pf)
    e = gl.arange(0, D_KPE, layout=gl.SliceLayout(0, pe))
    seg_end = gl.arange(0, D_CKV // 64, layout=gl.SliceLayout(0, pf)) * 64 + 63
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    pos = n_begin + gl.arange(0, BLOCK_N, layout=rows_l)
    pages, bad = _page_entries(page_base, n_entries, num_pages, pos, pos < n_end, PAGE_SIZE)
    nxt = pos + BLOCK_N
    raw, in_list = _load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
    for j in range(n_tiles):
        n0 = n_begin + j * BLOCK_N
        buf = j % NBUF
        pos = n0 + gl.arange(0, BLOCK_N, layout=rows_l)
        ok = pos < n_end
        slot = pages.to(gl.int64)
        rows = _cache_rows(slot, pos, bad, stride_ckv_p, stride_ckv_s, nan_row_ckv, PAGE_SIZE)
        x = _load_chunk(ckv_ptr, rows, ok, 0, ld)
        if WHOLE_TILE:  # every chunk's loads in flight at once
            x1 = _load_chunk(ckv_ptr, rows, ok, 1, ld)
            x2 = _load_chunk(ckv_ptr, rows, ok, 2, ld)
            x3 = _load_chunk(ckv_ptr, rows, ok, 3, ld)
        pe_pos = gl.convert_layout(pos, pe_rows_l)
        pe_rows = _cache_rows(
            gl.convert_layout(slot, pe_rows_l), pe_pos, gl.convert_layout(bad, pe_rows_l),
            stride_kpe_p, stride_kpe_s, nan_row_kpe, PAGE_SIZE,
        )  # fmt: skip
        pe_ok = gl.convert_layout(ok, pe_rows_l)
        xp = gl.load(kpe_ptr + pe_rows[:, None] + e[None, :], mask=pe_ok[:, None], other=0)
        # the next tile: its page-table entries (loaded a tile ago: their latency has passed)
        # and its latent rows into the L2; the entries of the tile after it requested
        next_pos = pos + BLOCK_N
        pages, bad = _check_entries(raw, in_list, next_pos < n_end, num_pages)
        nxt = pos + 2 * BLOCK_N
        raw, in_list = _load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
        next_pos = gl.convert_layout(pos, pf_rows_l) + BLOCK_N
        next_rows = gl.convert_layout(pages, pf_rows_l).to(gl.int64) * stride_ckv_p
        next_rows += (next_pos % PAGE_SIZE) * stride_ckv_s
        _prefetch_l2(ckv_ptr + next_rows[:, None] + seg_end[None, :])
        sa = scale_arr_ptr  # (the token-group scales' pointers, where used)
        if TOKEN_GROUP:
            sa = scale_arr_ptr + slot * stride_sa_p + (pos % PAGE_SIZE) * stride_sa_s
        # the consumers are done with this buffer (tile j - NBUF); passes at once at first
        mbarrier.wait(empty.index(buf), ((j // NBUF) & 1) ^ 1)
        k_dst = k_bufs.index(buf)
        if WHOLE_TILE:
            _store_chunk(k_dst, x, sa, ok, 0, TOKEN_GROUP, FP8_CVT)
            _store_chunk(k_dst, x1, sa, ok, 1, TOKEN_GROUP, FP8_CVT)
            _store_chunk(k_dst, x2, sa, ok, 2, TOKEN_GROUP, FP8_CVT)
            _store_chunk(k_dst, x3, sa, ok, 3, TOKEN_GROUP, FP8_CVT)
        else:
            for c in gl.static_range(D_CKV // CHUNK):
                if c + 1 < D_CKV // CHUNK:
                    x_next = _load_chunk(ckv_ptr, rows, ok, c + 1, ld)
                k = _fp8_to_f16(x, FP8_CVT)
                if TOKEN_GROUP:
                    sc = gl.load(sa + c, mask=ok, other=0.0)
                    k = (k.to(gl.float32) * sc[:, None]).to(gl.float16)
                k_dst.slice(c * CHUNK, CHUNK, dim=1).store(k)
                if c + 1 < D_CKV // CHUNK:
                    x = x_next
        kpe_bufs.index(buf).store(_fp8_to_f16(xp, FP8_CVT))
        # all four warps' stores are visible to wgmma before one thread signals
        fence_async_shared()
        _BARRIER()
        mbarrier.arrive(ready.index(buf))


@gluon.jit
def _tile_cache_rows(raw, in_list, pos, n_end, num_pages, stride_ckv_p, stride_ckv_s,
                     stride_kpe_p, stride_kpe_s, nan_row_ckv, nan_row_kpe,
                     PAGE_SIZE: gl.constexpr):  # fmt: skip
    """The cache rows (element offsets) of a tile's tokens at ``pos``, latent and RoPE, from
    their raw page-table entries (:func:`_load_entries`): a bad entry's token as the NaN
    row."""
    pages, bad = _check_entries(raw, in_list, pos < n_end, num_pages)
    slot = pages.to(gl.int64)
    rows = _cache_rows(slot, pos, bad, stride_ckv_p, stride_ckv_s, nan_row_ckv, PAGE_SIZE)
    pe_rows = _cache_rows(slot, pos, bad, stride_kpe_p, stride_kpe_s, nan_row_kpe, PAGE_SIZE)
    return rows, pe_rows


@gluon.jit
def _kv_copier(
    k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, page_base, n_entries, num_pages,
    nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s, stride_kpe_p,
    stride_kpe_s, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, D_CKV: gl.constexpr,
    D_KPE: gl.constexpr, P_WARPS: gl.constexpr, NBUF: gl.constexpr,
):  # fmt: skip
    """The producer for 16-bit pools (the SM90 kernels): each tile of ``[n_begin, n_end)``
    copied as it is into shared buffer
    ``j % NBUF`` by ``cp.async`` (no registers, no conversion; tokens past ``n_end`` as 0, a bad
    page entry's token as the launcher's 16-bit NaN row). Two tiles in flight: tile ``j`` is
    requested before tile ``j - 1`` is waited for and handed over."""
    # 16 bytes (8 elements) per thread, 8 threads per 128-byte row chunk, 4 rows per warp
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [P_WARPS, 1], [1, 0])
    rows_l: gl.constexpr = gl.SliceLayout(1, ld)
    C16: gl.constexpr = 64  # columns per copy step: one 128-byte row chunk
    d = gl.arange(0, C16, layout=gl.SliceLayout(0, ld))
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    pos = n_begin + gl.arange(0, BLOCK_N, layout=rows_l)
    raw, in_list = _load_entries(page_base, n_entries, pos, pos < n_end, PAGE_SIZE)
    for j in range(n_tiles):
        buf = j % NBUF
        pos = n_begin + j * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_l)
        ok = (pos < n_end)[:, None]
        rows, pe_rows = _tile_cache_rows(raw, in_list, pos, n_end, num_pages, stride_ckv_p,
                                         stride_ckv_s, stride_kpe_p, stride_kpe_s, nan_row_ckv,
                                         nan_row_kpe, PAGE_SIZE)  # fmt: skip
        # the next tile's page entries, before this one's copies; checked only when used, so
        # their latency passes behind this tile's copies instead of before them
        nxt = pos + BLOCK_N
        raw, in_list = _load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
        # the consumers are done with this buffer (tile j - NBUF); passes at once at first
        mbarrier.wait(empty.index(buf), ((j // NBUF) & 1) ^ 1)
        k_dst = k_bufs.index(buf)
        for c in gl.static_range(D_CKV // C16):
            _ASYNC_LOAD(
                k_dst.slice(c * C16, C16, dim=1), ckv_ptr + rows[:, None] + (c * C16 + d)[None, :],
                mask=ok,
            )  # fmt: skip
        _ASYNC_LOAD(kpe_bufs.index(buf), kpe_ptr + pe_rows[:, None] + d[None, :], mask=ok)
        async_copy.commit_group()
        if j > 0:  # tile j - 1 in place: visible to wgmma, then handed over
            async_copy.wait_group(1)
            fence_async_shared()
            _BARRIER()
            mbarrier.arrive(ready.index((j - 1) % NBUF))
    if n_tiles > 0:
        async_copy.wait_group(0)
        fence_async_shared()
        _BARRIER()
        mbarrier.arrive(ready.index((n_tiles - 1) % NBUF))


@gluon.jit
def _copy_half(k_dst, kpe_dst, k_src, pe_src, ok, d, HI: gl.constexpr, D_CKV: gl.constexpr):
    """``cp.async`` of one column half of a tile from its rows' pointers ``k_src`` / ``pe_src``
    ``[BLOCK_N, 1]``: latent columns ``[0, D_CKV/2)`` (``HI`` False) or ``[D_CKV/2, D_CKV)``
    and the RoPE part (``HI``)."""
    C16: gl.constexpr = 64
    C0: gl.constexpr = (D_CKV // 2) * HI
    for c in gl.static_range(D_CKV // 2 // C16):
        _ASYNC_LOAD(
            k_dst.slice(C0 + c * C16, C16, dim=1), k_src + (C0 + c * C16 + d)[None, :], mask=ok
        )
    if HI:
        _ASYNC_LOAD(kpe_dst, pe_src + d[None, :], mask=ok)


@gluon.jit
def _kv_copier_halves(
    k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, page_base, n_entries, num_pages,
    nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s, stride_kpe_p,
    stride_kpe_s, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, D_CKV: gl.constexpr,
    D_KPE: gl.constexpr, P_WARPS: gl.constexpr, NBUF: gl.constexpr,
):  # fmt: skip
    """:func:`_kv_copier` by column halves, for the ping-pong kernel's tiles: half ``h`` of
    buffer ``b`` (``h`` 0: latent columns ``[0, D_CKV/2)``; 1: the rest and the RoPE part) is
    handed over on ``ready[2b + h]`` and freed on ``empty[2b + h]`` by the one consumer
    warpgroup whose output columns it holds (the tile's scores, which read both halves, are
    done before either warpgroup applies the tile). Tile ``j``'s owner (warpgroup ``j % 2``)
    frees its half first, so that half is copied first.

    Each half is handed over as it lands by its copies themselves: every copier thread's
    ``cp.async.mbarrier.arrive`` on the half's ``ready`` (which counts ``P_WARPS`` × 32
    arrivals; the consumers fence the bytes to wgmma's async proxy after their wait). The
    copier never waits for a copy, so a half is requested as soon as it is freed, whatever
    the previous tile's copies are doing (H200, bf16 pool, against waiting for each tile's
    copies before the next: 64 × 128 × 4,096 149.1-152.1 vs 154.3-158.9 µs;
    benchmarks/NOTES-2026-12-01-rounds-28-29.md, round 29)."""
    gl.static_assert(D_KPE == 64, "the RoPE part is one 64-column copy")
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [P_WARPS, 1], [1, 0])
    rows_l: gl.constexpr = gl.SliceLayout(1, ld)
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    pos = n_begin + gl.arange(0, BLOCK_N, layout=rows_l)
    raw, in_list = _load_entries(page_base, n_entries, pos, pos < n_end, PAGE_SIZE)
    for j in range(n_tiles):
        buf = j % NBUF
        phase = ((j // NBUF) & 1) ^ 1
        pos = n_begin + j * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_l)
        ok = (pos < n_end)[:, None]
        rows, pe_rows = _tile_cache_rows(raw, in_list, pos, n_end, num_pages, stride_ckv_p,
                                         stride_ckv_s, stride_kpe_p, stride_kpe_s, nan_row_ckv,
                                         nan_row_kpe, PAGE_SIZE)  # fmt: skip
        k_src = ckv_ptr + rows[:, None]
        pe_src = kpe_ptr + pe_rows[:, None]
        nxt = pos + BLOCK_N
        raw, in_list = _load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
        first = j % 2  # the owner's half
        for h in gl.static_range(2):
            side = first ^ h
            mbarrier.wait(empty.index(2 * buf + side), phase)
            if side == 0:
                _copy_half(k_bufs.index(buf), kpe_bufs.index(buf), k_src, pe_src, ok, d, False,
                           D_CKV)  # fmt: skip
            else:
                _copy_half(k_bufs.index(buf), kpe_bufs.index(buf), k_src, pe_src, ok, d, True,
                           D_CKV)  # fmt: skip
            async_copy.mbarrier_arrive(ready.index(2 * buf + side), increment_count=False)
