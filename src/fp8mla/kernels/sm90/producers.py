"""The producer warpgroups of the SM90 Gluon kernels: KV tiles from the paged pool into shared
memory through the page table, for the consumers that multiply them.

* :func:`kv_producer` (FP8 pools): loads each tile's FP8 rows into registers, converts them
  to fp16 (times their token-group scales where used) and stores them into a 128-byte-swizzled
  buffer (the wgmma and ping-pong kernels);
* :func:`kv_copier` (16-bit pools): copies each tile as it is by ``cp.async`` (the wgmma,
  ping-pong and few-row kernels);
* :func:`kv_copier_halves` (16-bit pools, the ping-pong kernel's 64-token tiles): the same
  copies by column halves, each half of a buffer with its own ``ready`` / ``empty`` pair, so
  that a half is refilled as soon as the one warpgroup that reads it is done; the copies
  themselves arrive on ``ready`` as they land, so the copier never waits for one;

All hand buffers over on ``ready`` / ``empty`` mbarriers, take tokens past the split's end as
0 and a bad page entry's token as the launcher's NaN row (never outside the cache, never
finite), and load the page-table entries of the next tile while the current one is in flight.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from fp8mla.kernels.sm90.common import (
    BLOCK_N,
    CHUNK,
    PRODUCER_WARPS,
    async_load,
    cache_rows,
    check_entries,
    fp8_to_f16,
    load_chunk,
    load_entries,
    page_entries,
    prefetch_l2,
    thread_barrier,
    tile_cache_rows,
    times_group_scale,
)


@gluon.jit
def _store_chunk(k_dst, x, sc, c: gl.constexpr, TOKEN_GROUP: gl.constexpr,
                 FP8_CVT: gl.constexpr):  # fmt: skip
    """FP8 bytes ``x`` of latent chunk ``c`` → fp16 (times their tokens' group scales ``sc``
    with ``TOKEN_GROUP``) into the shared tile ``k_dst``."""
    k = fp8_to_f16(x, FP8_CVT)
    if TOKEN_GROUP:
        k = times_group_scale(k, sc, FP8_CVT)
    k_dst.slice(c * CHUNK, CHUNK, dim=1).store(k)


@gluon.jit
def kv_producer(
    k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base, n_entries,
    num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s,
    stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s,
    PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr,
    TOKEN_GROUP: gl.constexpr, FP8_CVT: gl.constexpr, NBUF: gl.constexpr,
    WHOLE_TILE: gl.constexpr, ROPE_16BIT: gl.constexpr = False, FENCE: gl.constexpr = True,
):  # fmt: skip
    """The producer: each KV tile of ``[n_begin, n_end)`` from the FP8 pool → fp16 shared tile
    ``j % NBUF`` (tokens past ``n_end`` as 0, tokens with a bad page entry as the NaN row),
    with ``TOKEN_GROUP`` each 128 columns times their tokens' group scale; ``ready`` is
    signalled when a tile is in place, ``empty`` is waited for before a buffer is
    overwritten. ``ROPE_16BIT``: the RoPE part is bf16 values, ``2 · D_KPE`` bytes a token at
    ``kpe_ptr`` (the packed sparse cache's), stored as they are into bf16 ``kpe_bufs``.
    ``FENCE``: its stores fenced to the async proxy before ``ready``; without it the consumer
    that waits there fences them, and the fence (which waits for every memory operation of
    the thread, the next tiles' page-table loads included) is off this warpgroup's path.

    Its loads are latency-bound (one warpgroup of four warps), so: the RoPE bytes are loaded
    with the first latent chunk, each chunk's bytes while the previous chunk is converted (all
    four chunks at once with ``WHOLE_TILE``: 32-token tiles hold them in 32 registers) and
    the token-group scales with them, and the next tile's latent rows and scales are
    prefetched into the L2 meanwhile (without the prefetch and the early loads, the consumers
    waited for this warpgroup)."""
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
    pages, bad = page_entries(page_base, n_entries, num_pages, pos, pos < n_end, PAGE_SIZE)
    nxt = pos + BLOCK_N
    raw, in_list = load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
    for j in range(n_tiles):
        n0 = n_begin + j * BLOCK_N
        buf = j % NBUF
        pos = n0 + gl.arange(0, BLOCK_N, layout=rows_l)
        ok = pos < n_end
        slot = pages.to(gl.int64)
        rows = cache_rows(slot, pos, bad, stride_ckv_p, stride_ckv_s, nan_row_ckv, PAGE_SIZE)
        x = load_chunk(ckv_ptr, rows, ok, 0, ld)
        if WHOLE_TILE:  # every chunk's loads in flight at once
            x1 = load_chunk(ckv_ptr, rows, ok, 1, ld)
            x2 = load_chunk(ckv_ptr, rows, ok, 2, ld)
            x3 = load_chunk(ckv_ptr, rows, ok, 3, ld)
        # the token-group scales (where used) with the bytes, before the buffer is waited for,
        # so that their latency passes with the bytes' (the next tile's lines are in the L2)
        sa = scale_arr_ptr
        s0 = 0.0  # (unused without TOKEN_GROUP)
        s1 = 0.0
        s2 = 0.0
        s3 = 0.0
        if TOKEN_GROUP:
            sa = scale_arr_ptr + slot * stride_sa_p + (pos % PAGE_SIZE) * stride_sa_s
            s0 = gl.load(sa, mask=ok, other=0.0)
            if WHOLE_TILE:
                s1 = gl.load(sa + 1, mask=ok, other=0.0)
                s2 = gl.load(sa + 2, mask=ok, other=0.0)
                s3 = gl.load(sa + 3, mask=ok, other=0.0)
        pe_pos = gl.convert_layout(pos, pe_rows_l)
        pe_rows = cache_rows(
            gl.convert_layout(slot, pe_rows_l), pe_pos, gl.convert_layout(bad, pe_rows_l),
            stride_kpe_p, stride_kpe_s, nan_row_kpe, PAGE_SIZE,
        )  # fmt: skip
        pe_ok = gl.convert_layout(ok, pe_rows_l)
        if ROPE_16BIT:  # the row's byte offset, then bf16 elements
            pe_at = (kpe_ptr + pe_rows).to(gl.pointer_type(gl.bfloat16), bitcast=True)
            xp = gl.load(pe_at[:, None] + e[None, :], mask=pe_ok[:, None], other=0.0)
        else:
            xp = gl.load(kpe_ptr + pe_rows[:, None] + e[None, :], mask=pe_ok[:, None], other=0)
        # the next tile: its page-table entries (loaded a tile ago: their latency has passed)
        # and its latent rows into the L2; the entries of the tile after it requested
        next_pos = pos + BLOCK_N
        pages, bad = check_entries(raw, in_list, next_pos < n_end, num_pages)
        nxt = pos + 2 * BLOCK_N
        raw, in_list = load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
        next_pos = gl.convert_layout(pos, pf_rows_l) + BLOCK_N
        next_rows = gl.convert_layout(pages, pf_rows_l).to(gl.int64) * stride_ckv_p
        next_rows += (next_pos % PAGE_SIZE) * stride_ckv_s
        prefetch_l2(ckv_ptr + next_rows[:, None] + seg_end[None, :])
        if TOKEN_GROUP:  # and its group scales, which the latent rows' prefetch does not reach
            next_sa = gl.convert_layout(pages, pf_rows_l).to(gl.int64) * stride_sa_p
            prefetch_l2(scale_arr_ptr + next_sa + (next_pos % PAGE_SIZE) * stride_sa_s)
        # the consumers are done with this buffer (tile j - NBUF); passes at once at first
        mbarrier.wait(empty.index(buf), ((j // NBUF) & 1) ^ 1)
        k_dst = k_bufs.index(buf)
        if WHOLE_TILE:
            _store_chunk(k_dst, x, s0, 0, TOKEN_GROUP, FP8_CVT)
            _store_chunk(k_dst, x1, s1, 1, TOKEN_GROUP, FP8_CVT)
            _store_chunk(k_dst, x2, s2, 2, TOKEN_GROUP, FP8_CVT)
            _store_chunk(k_dst, x3, s3, 3, TOKEN_GROUP, FP8_CVT)
        else:
            for c in gl.static_range(D_CKV // CHUNK):
                if c + 1 < D_CKV // CHUNK:
                    x_next = load_chunk(ckv_ptr, rows, ok, c + 1, ld)
                sc = s0
                if TOKEN_GROUP and c > 0:
                    sc = gl.load(sa + c, mask=ok, other=0.0)
                _store_chunk(k_dst, x, sc, c, TOKEN_GROUP, FP8_CVT)
                if c + 1 < D_CKV // CHUNK:
                    x = x_next
        if ROPE_16BIT:
            kpe_bufs.index(buf).store(xp)
        else:
            kpe_bufs.index(buf).store(fp8_to_f16(xp, FP8_CVT))
        # all four warps' stores done (and fenced to wgmma, with FENCE) before one thread
        # signals
        if FENCE:
            fence_async_shared()
        thread_barrier()
        mbarrier.arrive(ready.index(buf))


@gluon.jit
def kv_copier(
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
    raw, in_list = load_entries(page_base, n_entries, pos, pos < n_end, PAGE_SIZE)
    for j in range(n_tiles):
        buf = j % NBUF
        pos = n_begin + j * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_l)
        ok = (pos < n_end)[:, None]
        rows, pe_rows = tile_cache_rows(raw, in_list, pos, n_end, num_pages, stride_ckv_p,
                                         stride_ckv_s, stride_kpe_p, stride_kpe_s, nan_row_ckv,
                                         nan_row_kpe, PAGE_SIZE)  # fmt: skip
        # the next tile's page entries, before this one's copies; checked only when used, so
        # their latency passes behind this tile's copies instead of before them
        nxt = pos + BLOCK_N
        raw, in_list = load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
        # the consumers are done with this buffer (tile j - NBUF); passes at once at first
        mbarrier.wait(empty.index(buf), ((j // NBUF) & 1) ^ 1)
        k_dst = k_bufs.index(buf)
        for c in gl.static_range(D_CKV // C16):
            async_load(
                k_dst.slice(c * C16, C16, dim=1), ckv_ptr + rows[:, None] + (c * C16 + d)[None, :],
                mask=ok,
            )  # fmt: skip
        async_load(kpe_bufs.index(buf), kpe_ptr + pe_rows[:, None] + d[None, :], mask=ok)
        async_copy.commit_group()
        if j > 0:  # tile j - 1 in place: visible to wgmma, then handed over
            async_copy.wait_group(1)
            fence_async_shared()
            thread_barrier()
            mbarrier.arrive(ready.index((j - 1) % NBUF))
    if n_tiles > 0:
        async_copy.wait_group(0)
        fence_async_shared()
        thread_barrier()
        mbarrier.arrive(ready.index((n_tiles - 1) % NBUF))


@gluon.jit
def _copy_half(k_dst, kpe_dst, k_src, pe_src, ok, d, HI: gl.constexpr, D_CKV: gl.constexpr):
    """``cp.async`` of one column half of a tile from its rows' pointers ``k_src`` / ``pe_src``
    ``[BLOCK_N, 1]``: latent columns ``[0, D_CKV/2)`` (``HI`` False) or ``[D_CKV/2, D_CKV)``
    and the RoPE part (``HI``)."""
    C16: gl.constexpr = 64
    C0: gl.constexpr = (D_CKV // 2) * HI
    for c in gl.static_range(D_CKV // 2 // C16):
        async_load(
            k_dst.slice(C0 + c * C16, C16, dim=1), k_src + (C0 + c * C16 + d)[None, :], mask=ok
        )
    if HI:
        async_load(kpe_dst, pe_src + d[None, :], mask=ok)


@gluon.jit
def kv_copier_halves(
    k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, page_base, n_entries, num_pages,
    nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s, stride_kpe_p,
    stride_kpe_s, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, D_CKV: gl.constexpr,
    D_KPE: gl.constexpr, P_WARPS: gl.constexpr, NBUF: gl.constexpr,
):  # fmt: skip
    """:func:`kv_copier` by column halves, for the ping-pong kernel's tiles: half ``h`` of
    buffer ``b`` (``h`` 0: latent columns ``[0, D_CKV/2)``; 1: the rest and the RoPE part) is
    handed over on ``ready[2b + h]`` and freed on ``empty[2b + h]`` by the one consumer
    warpgroup whose output columns it holds (the tile's scores, which read both halves, are
    done before either warpgroup applies the tile). Tile ``j``'s owner (warpgroup ``j % 2``)
    frees its half first, so that half is copied first.

    Each half is handed over as it lands by its copies themselves: every copier thread's
    ``cp.async.mbarrier.arrive`` on the half's ``ready`` (which counts ``P_WARPS`` × 32
    arrivals; the consumers fence the bytes to wgmma's async proxy after their wait). The
    copier never waits for a copy, so a half is requested as soon as it is freed, whatever
    the previous tile's copies are doing (faster than waiting for each tile's copies before
    the next: ``docs/design/sm90-pingpong.md``)."""
    gl.static_assert(D_KPE == 64, "the RoPE part is one 64-column copy")
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [P_WARPS, 1], [1, 0])
    rows_l: gl.constexpr = gl.SliceLayout(1, ld)
    d = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    pos = n_begin + gl.arange(0, BLOCK_N, layout=rows_l)
    raw, in_list = load_entries(page_base, n_entries, pos, pos < n_end, PAGE_SIZE)
    for j in range(n_tiles):
        buf = j % NBUF
        phase = ((j // NBUF) & 1) ^ 1
        pos = n_begin + j * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_l)
        ok = (pos < n_end)[:, None]
        rows, pe_rows = tile_cache_rows(raw, in_list, pos, n_end, num_pages, stride_ckv_p,
                                         stride_ckv_s, stride_kpe_p, stride_kpe_s, nan_row_ckv,
                                         nan_row_kpe, PAGE_SIZE)  # fmt: skip
        k_src = ckv_ptr + rows[:, None]
        pe_src = kpe_ptr + pe_rows[:, None]
        nxt = pos + BLOCK_N
        raw, in_list = load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
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


@gluon.jit
def kv_producer_alternate(
    k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base, n_entries,
    num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s,
    stride_sa_p, stride_sa_s,
    FIRST: gl.constexpr, PAGE_SIZE: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr,
    TOKEN_GROUP: gl.constexpr, FP8_CVT: gl.constexpr, P_WARPS: gl.constexpr,
    PF_MODE: gl.constexpr,
):  # fmt: skip
    """Tiles ``FIRST, FIRST + 2, …`` of ``[n_begin, n_end)`` from the FP8 pool → fp16 shared
    buffer ``FIRST`` (tokens past ``n_end`` as 0, tokens with a bad page entry as the launcher's
    NaN row). Two producers alternate, so each has two consumer steps per tile. Per tile: all of its
    bytes are requested before the buffer is waited for, its successor (two tiles on) is
    prefetched into the L2 (``PF_MODE``: see the kernel), and the page entries of the tile two
    after that are loaded, to be checked a step later — no load waits for another issued in the
    same step."""
    # 16 bytes per thread, 8 threads per 128-byte row chunk, 4 rows per warp
    ld: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [P_WARPS, 1], [1, 0])
    pe: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [P_WARPS, 1], [1, 0])
    rows_l: gl.constexpr = gl.SliceLayout(1, ld)
    pe_rows_l: gl.constexpr = gl.SliceLayout(1, pe)
    e = gl.arange(0, D_KPE, layout=gl.SliceLayout(0, pe))
    d = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, ld))
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    my_tiles = gl.maximum(n_tiles - FIRST + 1, 0) // 2
    k_dst = k_bufs.index(FIRST)
    kpe_dst = kpe_bufs.index(FIRST)
    pos = n_begin + FIRST * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_l)
    pages, bad = page_entries(page_base, n_entries, num_pages, pos, pos < n_end, PAGE_SIZE)
    pos2 = pos + 2 * BLOCK_N
    pages2, bad2 = page_entries(page_base, n_entries, num_pages, pos2, pos2 < n_end, PAGE_SIZE)
    pos4 = pos + 4 * BLOCK_N
    raw4, in4 = load_entries(page_base, n_entries, pos4, pos4 < n_end, PAGE_SIZE)
    for i in range(my_tiles):
        pos = n_begin + (FIRST + 2 * i) * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_l)
        ok = pos < n_end
        slot = pages.to(gl.int64)
        rows = cache_rows(slot, pos, bad, stride_ckv_p, stride_ckv_s, nan_row_ckv, PAGE_SIZE)
        # -- every byte of this tile requested at once --
        x0 = gl.load(ckv_ptr + rows[:, None] + d[None, :], mask=ok[:, None], other=0)
        x1 = gl.load(ckv_ptr + rows[:, None] + (CHUNK + d)[None, :], mask=ok[:, None], other=0)
        x2 = gl.load(ckv_ptr + rows[:, None] + (2 * CHUNK + d)[None, :], mask=ok[:, None], other=0)
        x3 = gl.load(ckv_ptr + rows[:, None] + (3 * CHUNK + d)[None, :], mask=ok[:, None], other=0)
        pe_pos = gl.convert_layout(pos, pe_rows_l)
        pe_ok = gl.convert_layout(ok, pe_rows_l)
        pe_rows = cache_rows(
            gl.convert_layout(slot, pe_rows_l), pe_pos, gl.convert_layout(bad, pe_rows_l),
            stride_kpe_p, stride_kpe_s, nan_row_kpe, PAGE_SIZE,
        )  # fmt: skip
        xp = gl.load(kpe_ptr + pe_rows[:, None] + e[None, :], mask=pe_ok[:, None], other=0)
        if TOKEN_GROUP:
            sa = scale_arr_ptr + slot * stride_sa_p + (pos % PAGE_SIZE) * stride_sa_s
        # -- this producer's next tile into the L2; the page entries of its third next --
        _prefetch_tile(ckv_ptr, kpe_ptr, pages2, pos + 2 * BLOCK_N, stride_ckv_p, stride_ckv_s,
                       stride_kpe_p, stride_kpe_s, PAGE_SIZE, D_CKV, PF_MODE, P_WARPS)  # fmt: skip
        pos6 = pos + 6 * BLOCK_N
        raw6, in6 = load_entries(page_base, n_entries, pos6, pos6 < n_end, PAGE_SIZE)
        # -- the consumers are done with this buffer (this producer's previous tile) --
        mbarrier.wait(empty.index(FIRST), (i & 1) ^ 1)
        for c in gl.static_range(D_CKV // CHUNK):
            if c == 0:
                x = x0
            elif c == 1:
                x = x1
            elif c == 2:
                x = x2
            else:
                x = x3
            k = fp8_to_f16(x, FP8_CVT)
            if TOKEN_GROUP:
                sc = gl.load(sa + c, mask=ok, other=0.0)
                k = times_group_scale(k, sc, FP8_CVT)
            k_dst.slice(c * CHUNK, CHUNK, dim=1).store(k)
        kpe_dst.store(fp8_to_f16(xp, FP8_CVT))
        # all warps' stores are visible to wgmma before one thread signals
        fence_async_shared()
        thread_barrier()
        mbarrier.arrive(ready.index(FIRST))
        # entries are checked a step after their load (its latency has passed by then)
        pages, bad = pages2, bad2
        pos4 = pos + 4 * BLOCK_N
        pages2, bad2 = check_entries(raw4, in4, pos4 < n_end, num_pages)
        raw4, in4 = raw6, in6


@gluon.jit
def _prefetch_bulk(ptrs, BYTES: gl.constexpr):
    """``cp.async.bulk.prefetch.L2`` of ``BYTES`` (512 or 64) bytes from each of ``ptrs``
    rounded down to 16 bytes (the instruction's alignment; a row of an odd-strided view loses
    at most its last 15 bytes from the hint, and nothing past the row is named): one
    instruction per row, every sector of it."""
    if BYTES == 512:
        asm: gl.constexpr = (
            "{ .reg .b64 a; and.b64 a, $1, -16; cp.async.bulk.prefetch.L2.global [a], 512; }"
            " mov.u32 $0, 0;"
        )
    else:
        asm: gl.constexpr = (
            "{ .reg .b64 a; and.b64 a, $1, -16; cp.async.bulk.prefetch.L2.global [a], 64; }"
            " mov.u32 $0, 0;"
        )
    return gl.inline_asm_elementwise(asm, "=r,l", [ptrs], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _prefetch_tile(
    ckv_ptr, kpe_ptr, pages, pos, stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s,
    PAGE_SIZE: gl.constexpr, D_CKV: gl.constexpr, PF_MODE: gl.constexpr, P_WARPS: gl.constexpr,
):  # fmt: skip
    """The tokens at ``pos`` (page ids ``pages``, a bad entry as page 0) into the L2.
    ``PF_MODE`` 0: one ``prefetch.global.L2`` per 64 bytes of the latent part; 1: one per
    32-byte sector of both parts; 2: one bulk prefetch per row and part (latent, RoPE)."""
    one: gl.constexpr = gl.BlockedLayout([1], [32], [P_WARPS], [0])
    if PF_MODE == 2:
        p = gl.convert_layout(pages, one).to(gl.int64)
        q = gl.convert_layout(pos, one) % PAGE_SIZE
        _prefetch_bulk(ckv_ptr + p * stride_ckv_p + q * stride_ckv_s, 512)
        _prefetch_bulk(kpe_ptr + p * stride_kpe_p + q * stride_kpe_s, 64)
    else:
        STEP: gl.constexpr = 64 if PF_MODE == 0 else 32
        sec: gl.constexpr = gl.BlockedLayout([1, 1], [32 // (D_CKV // STEP), D_CKV // STEP],
                                             [P_WARPS, 1], [1, 0])  # fmt: skip
        rl: gl.constexpr = gl.SliceLayout(1, sec)
        p = gl.convert_layout(pages, rl).to(gl.int64)
        q = gl.convert_layout(pos, rl) % PAGE_SIZE
        col = gl.arange(0, D_CKV // STEP, layout=gl.SliceLayout(0, sec)) * STEP + (STEP - 1)
        prefetch_l2(ckv_ptr + (p * stride_ckv_p + q * stride_ckv_s)[:, None] + col[None, :])
        if PF_MODE == 1:
            p1 = gl.convert_layout(pages, one).to(gl.int64)
            q1 = gl.convert_layout(pos, one) % PAGE_SIZE
            pe = kpe_ptr + p1 * stride_kpe_p + q1 * stride_kpe_s
            prefetch_l2(pe)
            prefetch_l2(pe + 32)
