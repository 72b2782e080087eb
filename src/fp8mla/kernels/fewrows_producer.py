"""The FP8 producers of the few-row kernel (``kernels/mla_fewrows.py``): each loads every
other 64-token tile's FP8 rows through the page table into registers (page entries three
tiles ahead, an L2 prefetch of its next tile), converts them once and stores the fp16 tile
into the consumers' shared buffer; and ``_stamp``, the measurement switch's cycle stamps.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from fp8mla.kernels.kv_fill import (
    _BARRIER,
    _cache_rows,
    _check_entries,
    _fp8_to_f16,
    _load_entries,
    _page_entries,
    _prefetch_l2,
)

BLOCK_N = gl.constexpr(64)  # KV tokens per tile: wgmma's M
CHUNK = gl.constexpr(128)  # latent columns per load / conversion step


@gluon.jit
def _stamp(trace_ptr, part: gl.constexpr, tile, event: gl.constexpr, PROBE: gl.constexpr,
           NS: gl.constexpr = False):  # fmt: skip
    """Measurement only (``PROBE & 8``): the SM's cycle counter (``NS``: the GPU's global
    nanosecond timer) into ``trace[program, part, min(tile, 63), event]`` (int64
    ``[programs, 4, 64, 8]``)."""
    if PROBE & 8:
        pid = (gl.program_id(0) * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(
            2
        ) + gl.program_id(2)
        if NS:
            asm: gl.constexpr = "mov.u64 $0, %globaltimer;"
        else:
            asm: gl.constexpr = "mov.u64 $0, %clock64;"
        t = gl.inline_asm_elementwise(asm, "=l,r", [tile], dtype=gl.int64, is_pure=False, pack=1)
        gl.store(trace_ptr + ((pid * 4 + part) * 64 + gl.minimum(tile, 63)) * 8 + event, t)


@gluon.jit
def _producer(
    k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base, n_entries,
    num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s,
    stride_sa_p, stride_sa_s,
    FIRST: gl.constexpr, PAGE_SIZE: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr,
    TOKEN_GROUP: gl.constexpr, FP8_CVT: gl.constexpr, P_WARPS: gl.constexpr,
    PF_MODE: gl.constexpr, PROBE: gl.constexpr, trace_ptr,
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
    pages, bad = _page_entries(page_base, n_entries, num_pages, pos, pos < n_end, PAGE_SIZE)
    pos2 = pos + 2 * BLOCK_N
    pages2, bad2 = _page_entries(page_base, n_entries, num_pages, pos2, pos2 < n_end, PAGE_SIZE)
    pos4 = pos + 4 * BLOCK_N
    raw4, in4 = _load_entries(page_base, n_entries, pos4, pos4 < n_end, PAGE_SIZE)
    for i in range(my_tiles):
        _stamp(trace_ptr, 2 + FIRST, FIRST + 2 * i, 0, PROBE)
        pos = n_begin + (FIRST + 2 * i) * BLOCK_N + gl.arange(0, BLOCK_N, layout=rows_l)
        ok = pos < n_end
        slot = pages.to(gl.int64)
        rows = _cache_rows(slot, pos, bad, stride_ckv_p, stride_ckv_s, nan_row_ckv, PAGE_SIZE)
        if PROBE & 2:  # measurement only: every tile reads the pool's first rows (cached)
            rows = (pos % BLOCK_N).to(gl.int64) * stride_ckv_p
        # -- every byte of this tile requested at once --
        x0 = gl.load(ckv_ptr + rows[:, None] + d[None, :], mask=ok[:, None], other=0)
        x1 = gl.load(ckv_ptr + rows[:, None] + (CHUNK + d)[None, :], mask=ok[:, None], other=0)
        x2 = gl.load(ckv_ptr + rows[:, None] + (2 * CHUNK + d)[None, :], mask=ok[:, None], other=0)
        x3 = gl.load(ckv_ptr + rows[:, None] + (3 * CHUNK + d)[None, :], mask=ok[:, None], other=0)
        pe_pos = gl.convert_layout(pos, pe_rows_l)
        pe_ok = gl.convert_layout(ok, pe_rows_l)
        pe_rows = _cache_rows(
            gl.convert_layout(slot, pe_rows_l), pe_pos, gl.convert_layout(bad, pe_rows_l),
            stride_kpe_p, stride_kpe_s, nan_row_kpe, PAGE_SIZE,
        )  # fmt: skip
        if PROBE & 2:
            pe_rows = (pe_pos % BLOCK_N).to(gl.int64) * stride_kpe_p
        xp = gl.load(kpe_ptr + pe_rows[:, None] + e[None, :], mask=pe_ok[:, None], other=0)
        if TOKEN_GROUP:
            sa = scale_arr_ptr + slot * stride_sa_p + (pos % PAGE_SIZE) * stride_sa_s
        # -- this producer's next tile into the L2; the page entries of its third next --
        _prefetch_tile(ckv_ptr, kpe_ptr, pages2, pos + 2 * BLOCK_N, stride_ckv_p, stride_ckv_s,
                       stride_kpe_p, stride_kpe_s, PAGE_SIZE, D_CKV, PF_MODE, P_WARPS)  # fmt: skip
        pos6 = pos + 6 * BLOCK_N
        raw6, in6 = _load_entries(page_base, n_entries, pos6, pos6 < n_end, PAGE_SIZE)
        _stamp(trace_ptr, 2 + FIRST, FIRST + 2 * i, 3, PROBE)
        # -- the consumers are done with this buffer (this producer's previous tile) --
        mbarrier.wait(empty.index(FIRST), (i & 1) ^ 1)
        _stamp(trace_ptr, 2 + FIRST, FIRST + 2 * i, 1, PROBE)
        if PROBE & 4:  # measurement only: one chunk converted and stored instead of four
            k_dst.slice(0, CHUNK, dim=1).store(_fp8_to_f16(x0 ^ x1 ^ x2 ^ x3, FP8_CVT))
        else:
            for c in gl.static_range(D_CKV // CHUNK):
                if c == 0:
                    x = x0
                elif c == 1:
                    x = x1
                elif c == 2:
                    x = x2
                else:
                    x = x3
                k = _fp8_to_f16(x, FP8_CVT)
                if TOKEN_GROUP:
                    sc = gl.load(sa + c, mask=ok, other=0.0)
                    k = (k.to(gl.float32) * sc[:, None]).to(gl.float16)
                k_dst.slice(c * CHUNK, CHUNK, dim=1).store(k)
                if c == 0:
                    _stamp(trace_ptr, 2 + FIRST, FIRST + 2 * i, 4, PROBE)
        kpe_dst.store(_fp8_to_f16(xp, FP8_CVT))
        # all warps' stores are visible to wgmma before one thread signals
        fence_async_shared()
        _BARRIER()
        mbarrier.arrive(ready.index(FIRST))
        _stamp(trace_ptr, 2 + FIRST, FIRST + 2 * i, 2, PROBE)
        # entries are checked a step after their load (its latency has passed by then)
        pages, bad = pages2, bad2
        pos4 = pos + 4 * BLOCK_N
        pages2, bad2 = _check_entries(raw4, in4, pos4 < n_end, num_pages)
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
        _prefetch_l2(ckv_ptr + (p * stride_ckv_p + q * stride_ckv_s)[:, None] + col[None, :])
        if PF_MODE == 1:
            p1 = gl.convert_layout(pages, one).to(gl.int64)
            q1 = gl.convert_layout(pos, one) % PAGE_SIZE
            pe = kpe_ptr + p1 * stride_kpe_p + q1 * stride_kpe_s
            _prefetch_l2(pe)
            _prefetch_l2(pe + 32)
