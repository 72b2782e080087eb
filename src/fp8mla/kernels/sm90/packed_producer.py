"""The SM90 ping-pong kernel's producer for the packed sparse rows (``fp8_ds_mla``: 512
e4m3 bytes with four token-group scales and a bf16 RoPE part a token): :func:`kv_producer_rolling`
converts each 32-token tile to fp16 into the consumers' buffers with every load a tile ahead,
and requests each tile's rows into the L2 two tiles ahead. The dense pools' producers are in
``producers.py``; the ping-pong kernel (``pingpong.py``) picks one by its pool.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from fp8mla.kernels.sm90.common import (
    CHUNK,
    PRODUCER_WARPS,
    cache_rows,
    check_entries,
    fp8_words_to_scaled_pairs,
    load_entries,
    page_entries,
    pairs_view,
    prefetch_l2,
    thread_barrier,
)


@gluon.jit
def _group_scales(scale_arr_ptr, slot, pos, ok, stride_sa_p, stride_sa_s,
                  PAGE_SIZE: gl.constexpr):  # fmt: skip
    """The four token-group scales of the tokens at ``pos`` in pages ``slot`` (0 where not
    ``ok``)."""
    sa = scale_arr_ptr + slot * stride_sa_p + (pos % PAGE_SIZE) * stride_sa_s
    s0 = gl.load(sa, mask=ok, other=0.0)
    s1 = gl.load(sa + 1, mask=ok, other=0.0)
    s2 = gl.load(sa + 2, mask=ok, other=0.0)
    s3 = gl.load(sa + 3, mask=ok, other=0.0)
    return s0, s1, s2, s3


@gluon.jit
def _tile_words(ckv_ptr, kpe_ptr, scale_arr_ptr, pages, bad, pos, ok, nan_row_ckv, nan_row_kpe,
                stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s,
                PAGE_SIZE: gl.constexpr, wl: gl.constexpr, pl: gl.constexpr):  # fmt: skip
    """A packed tile's loads (0 where not ``ok``, a bad page entry's token as the NaN row): its
    latent bytes as int32 words, one [tokens, 32] tensor a 128-byte chunk in layout ``wl``,
    its bf16 RoPE part as words [tokens, 32] in layout ``pl`` (the same rows a thread), and
    its four group scales."""
    slot = pages.to(gl.int64)
    rows = cache_rows(slot, pos, bad, stride_ckv_p, stride_ckv_s, nan_row_ckv, PAGE_SIZE)
    pe_rows = cache_rows(slot, pos, bad, stride_kpe_p, stride_kpe_s, nan_row_kpe, PAGE_SIZE)
    w = gl.arange(0, CHUNK // 4, layout=gl.SliceLayout(0, wl))
    at = (ckv_ptr + rows).to(gl.pointer_type(gl.int32), bitcast=True)[:, None] + w[None, :]
    m = ok[:, None]
    x0 = gl.load(at, mask=m, other=0)
    x1 = gl.load(at + CHUNK // 4, mask=m, other=0)
    x2 = gl.load(at + 2 * (CHUNK // 4), mask=m, other=0)
    x3 = gl.load(at + 3 * (CHUNK // 4), mask=m, other=0)
    pe_rows = gl.convert_layout(pe_rows, gl.SliceLayout(1, pl))
    wp = gl.arange(0, CHUNK // 4, layout=gl.SliceLayout(0, pl))
    pe_at = (kpe_ptr + pe_rows).to(gl.pointer_type(gl.int32), bitcast=True)
    xp = gl.load(
        pe_at[:, None] + wp[None, :],
        mask=gl.convert_layout(ok, gl.SliceLayout(1, pl))[:, None],
        other=0,
    )
    s0, s1, s2, s3 = _group_scales(scale_arr_ptr, slot, pos, ok, stride_sa_p, stride_sa_s,
                                   PAGE_SIZE)  # fmt: skip
    return x0, x1, x2, x3, xp, s0, s1, s2, s3


@gluon.jit
def _prefetch_packed_rows(ckv_ptr, kpe_ptr, scale_arr_ptr, pages, bad, pos, nan_row_ckv,
                          nan_row_kpe, stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s,
                          stride_sa_p, stride_sa_s, PAGE_SIZE: gl.constexpr,
                          wl: gl.constexpr):  # fmt: skip
    """Start moving a packed tile's rows into the L2 (``prefetch.global.L2``): the 8 64-byte
    segments of each row's latent bytes, and its group scales and the first, middle and last
    bytes of its RoPE part, each thread for the rows it holds in ``wl``. A bad page entry's
    token names the NaN row, a token past the split's end its page 0's row: a prefetch never
    names an address outside the cache."""
    slot = pages.to(gl.int64)
    rows = cache_rows(slot, pos, bad, stride_ckv_p, stride_ckv_s, nan_row_ckv, PAGE_SIZE)
    seg: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [PRODUCER_WARPS, 1], [1, 0])
    rows = gl.convert_layout(rows, gl.SliceLayout(1, seg))
    col = gl.arange(0, 8, layout=gl.SliceLayout(0, seg)) * 64 + 63
    prefetch_l2(ckv_ptr + rows[:, None] + col[None, :])
    # the scales and RoPE addresses, 4 a row: lanes 4-7 of a row repeat lanes 0-3's
    # (one request a warp), which keeps the rows where ``wl`` has them (no layout exchange)
    pe_rows = cache_rows(slot, pos, bad, stride_kpe_p, stride_kpe_s, nan_row_kpe, PAGE_SIZE)
    sa = slot * stride_sa_p + (pos % PAGE_SIZE) * stride_sa_s
    pe_at = gl.convert_layout((kpe_ptr + pe_rows).to(gl.int64), gl.SliceLayout(1, seg))
    sa_at = gl.convert_layout((scale_arr_ptr + sa).to(gl.int64), gl.SliceLayout(1, seg))
    c = gl.arange(0, 4, layout=gl.SliceLayout(0, seg))
    # byte offsets into the RoPE part: 0, 64, 127 (columns 1-3); column 0 the scales
    off = gl.where(c == 3, 127, (c - 1) * 64)
    at = gl.where((c == 0)[None, :], sa_at[:, None], pe_at[:, None] + off[None, :])
    prefetch_l2(at)


@gluon.jit
def _store_words(k32, x, sc, c: gl.constexpr, FP8_CVT: gl.constexpr):
    """Words ``x`` of latent chunk ``c`` → fp16 pairs times their tokens' group scales ``sc``
    into the tile's int32 view ``k32``."""
    a, b = fp8_words_to_scaled_pairs(x, sc, FP8_CVT)
    v = gl.reshape(gl.join(a, b), [x.shape[0], CHUNK // 2])
    k32.slice(c * (CHUNK // 2), CHUNK // 2, dim=1).store(v)


@gluon.jit
def kv_producer_rolling(
    k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base, n_entries,
    num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s,
    stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s,
    PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr,
    FP8_CVT: gl.constexpr, NBUF: gl.constexpr,
):  # fmt: skip
    """:func:`kv_producer` for the packed sparse rows (e4m3 bytes with token-group scales, a
    bf16 RoPE part; the consumers fence the tiles), with every load a tile ahead: tile
    ``j + 1``'s bytes, RoPE values and scales are requested before tile ``j`` is converted, so
    that their latency passes under its conversion, and tile ``j + 2``'s rows are requested
    into the L2 (its page entries loaded three tiles ahead), so that those loads find them
    there rather than in DRAM. The tiles are carried as int32 words (as bytes, the loop's
    registers spill) and stored as fp16 pairs."""
    gl.static_assert(
        D_CKV == 4 * CHUNK and 2 * D_KPE == CHUNK,
        "kv_producer_rolling takes 512 latent bytes and 64 bf16 RoPE values a row",
    )
    # a thread's latent words are two pairs 64 bytes apart (LDG.64), so that its fp16 values
    # are one 16-byte unit in each of the chunk's two 128-byte column blocks: the 8 threads
    # of a row then store 8 distinct units of one block at a time, no bank conflict (four
    # contiguous words, one LDG.128, put 2 of a row's threads on each unit's banks). The
    # RoPE words (one column block) stay four contiguous words a thread.
    wl: gl.constexpr = gl.BlockedLayout([1, 2], [4, 8], [PRODUCER_WARPS, 1], [1, 0])
    pl: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [PRODUCER_WARPS, 1], [1, 0])
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    pos = n_begin + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, wl))
    ok = pos < n_end
    pages, bad = page_entries(page_base, n_entries, num_pages, pos, ok, PAGE_SIZE)
    x0, x1, x2, x3, xp, s0, s1, s2, s3 = _tile_words(
        ckv_ptr, kpe_ptr, scale_arr_ptr, pages, bad, pos, ok, nan_row_ckv, nan_row_kpe,
        stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s,
        PAGE_SIZE, wl, pl,
    )  # fmt: skip
    nxt = pos + BLOCK_N
    pages, bad = page_entries(page_base, n_entries, num_pages, nxt, nxt < n_end, PAGE_SIZE)
    nxt = pos + 2 * BLOCK_N
    raw, in_list = load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
    for j in range(n_tiles):
        buf = j % NBUF
        pos = n_begin + j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, wl))
        # tile j + 2's page entries (loaded a tile ago) checked and its rows requested into
        # the L2, so that its loads, a tile later, find them there; the entries of the tile
        # after it requested
        far_pos = pos + 2 * BLOCK_N
        far_pages, far_bad = check_entries(raw, in_list, far_pos < n_end, num_pages)
        _prefetch_packed_rows(
            ckv_ptr, kpe_ptr, scale_arr_ptr, far_pages, far_bad, far_pos, nan_row_ckv,
            nan_row_kpe, stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s, stride_sa_p,
            stride_sa_s, PAGE_SIZE, wl,
        )  # fmt: skip
        nxt = pos + 3 * BLOCK_N
        raw, in_list = load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
        # the next tile's loads (past the split's end: masked off), from its page entries
        # checked a tile ago
        next_pos = pos + BLOCK_N
        next_ok = next_pos < n_end
        y0, y1, y2, y3, yp, t0, t1, t2, t3 = _tile_words(
            ckv_ptr, kpe_ptr, scale_arr_ptr, pages, bad, next_pos, next_ok, nan_row_ckv,
            nan_row_kpe, stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s, stride_sa_p,
            stride_sa_s, PAGE_SIZE, wl, pl,
        )  # fmt: skip
        # the consumers are done with this buffer (tile j - NBUF); passes at once at first
        mbarrier.wait(empty.index(buf), ((j // NBUF) & 1) ^ 1)
        k32 = pairs_view(k_bufs.index(buf))
        _store_words(k32, x0, s0, 0, FP8_CVT)
        _store_words(k32, x1, s1, 1, FP8_CVT)
        _store_words(k32, x2, s2, 2, FP8_CVT)
        _store_words(k32, x3, s3, 3, FP8_CVT)
        pairs_view(kpe_bufs.index(buf)).store(xp)
        # all four warps' stores done before one thread signals
        thread_barrier()
        mbarrier.arrive(ready.index(buf))
        x0, x1, x2, x3, xp, s0, s1, s2, s3 = y0, y1, y2, y3, yp, t0, t1, t2, t3
        # carried as page ids, the rows recomputed from them: 64-bit row offsets would take
        # registers that the loop, carrying two tiles, does not have
        pages, bad = far_pages, far_bad
