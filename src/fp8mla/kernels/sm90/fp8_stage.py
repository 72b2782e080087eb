"""The data movers of the SM90 FP8 × FP8 kernels (``fp8qk.py``, ``pingpong8.py``):

- :func:`fp8_copier` stages each 64-token tile's FP8 bytes (and token-group scales) through
  the page table by ``cp.async``;
- :func:`stage_query_half` (the FP8 × FP8 decode kernel's value warpgroups) and
  :func:`stage_query_blocks` (the FP8 ping-pong kernel's consumers) stage the query before the
  first tile, as exact e4m3 hi/lo operands under a power of two per row;
- :func:`stage_query_fp8` (the FP8 ping-pong kernel's consumers, for e4m3 queries) stages the
  caller's e4m3 query bytes as they are, one operand, with its scale per row;
- :func:`rope16_query` (the FP8 ping-pong kernel's consumers, the packed cache's bf16 RoPE
  part) loads the query's RoPE part into registers.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from fp8mla.kernels.portable import tiles as TL
from fp8mla.kernels.sm90.common import (
    BLOCK_N,
    LO_GAIN,
    REINTERPRET_PUBLIC,
    async_load,
    cache_rows,
    check_entries,
    load_entries,
    pow2_scale,
    thread_barrier,
    tile_rows,
    wait_prior,
)


@gluon.jit
def fp8_copier(
    k_stages, pe_stages, sc_stages, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base,
    n_entries, num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s,
    stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s, PAGE_SIZE: gl.constexpr,
    D_CKV: gl.constexpr, D_KPE: gl.constexpr, TOKEN_GROUP: gl.constexpr, STAGES: gl.constexpr,
    P_WARPS: gl.constexpr, ROPE_16BIT: gl.constexpr = False, LATE: gl.constexpr = False,
    late=None, BLOCK_M: gl.constexpr = 0, CAUSAL: gl.constexpr = False,
    LISTS: gl.constexpr = False, ent_stages=None,
):  # fmt: skip
    """Each tile of ``[n_begin, n_end)`` into stage ``j % STAGES`` by ``cp.async`` (tokens past
    ``n_end`` as 0, a bad page entry's token as the NaN row), with its tokens' four group
    scales where ``TOKEN_GROUP``; every thread's copies arrive on ``ready`` when they land, so
    up to ``STAGES`` tiles are in flight. The page-table entries are loaded a tile ahead and
    checked only when their tile is copied, so the copier never waits for a page-table load
    before its own copies (their latency under load is ~2,000 cycles). ``ROPE_16BIT``: the
    RoPE part is 16-bit (the packed ``fp8_ds_mla`` row's bf16 values): its 128 bytes a token are
    copied as bytes, as a latent chunk is (``kpe_ptr`` and its strides in bytes). ``LATE``:
    ``[n_begin, n_end)`` read here, once the grid that writes the lengths and page-table
    entries has ended (``common.wait_prior``; ``late``, ``BLOCK_M`` and ``CAUSAL``: the
    arguments of ``tiles.request_kv_span``). ``LISTS``: the page table is a sparse token's
    index list (page size 1), whose ``-1`` entries are no token: their bytes are never read
    (copied as 0, so that the values the score warpgroup masks out stay finite), and each
    tile's entries are copied into ``ent_stages`` beside its bytes (the score warpgroup reads
    them there to mask the ``-1`` ones, never waiting for a global load)."""
    if LATE:
        wait_prior()
        _, n_begin, n_end = TL.request_kv_span(late, BLOCK_M, BLOCK_N, CAUSAL)
    ld: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [P_WARPS, 1], [1, 0])  # [64, 128] B
    if ROPE_16BIT:
        pe_ld: gl.constexpr = ld
    else:
        pe_ld: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [P_WARPS, 1], [1, 0])  # [64, 64] B
    rows_l: gl.constexpr = gl.SliceLayout(1, ld)
    # A tile's token-group scales, [64 tokens, 4] float32: 16 bytes a token, one 16-byte copy
    # a thread. In ``ld`` token 16k + 4w + r is register k of warp w's lanes with row bits r
    # (lane bits 3-4), the same in all 8 of their column lanes c (lane bits 0-2). Lane c < 4
    # picks its register k = c in registers (``sel3``: no exchange between threads) and copies
    # token 16c + 4w + r (``cp3``; lanes c >= 4 repeat lanes c - 4 and copy nothing). Four
    # copies a thread (one per register), or an exchange of the addresses through shared
    # memory, made the scales a third of the copier's time.
    gl.static_assert(P_WARPS == 4, "the copier's layouts assume 4 warps")
    sel3: gl.constexpr = gl.DistributedLinearLayout(  # [k, 4w + r, c]
        reg_bases=[[1, 0, 0], [2, 0, 0]],
        lane_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 0], [0, 1, 0], [0, 2, 0]],
        warp_bases=[[0, 4, 0], [0, 8, 0]], block_bases=[], shape=[4, 16, 4],
    )  # fmt: skip
    cp3: gl.constexpr = gl.DistributedLinearLayout(  # [4w + r, c, group]
        reg_bases=[[0, 0, 1], [0, 0, 2]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [0, 0, 0], [1, 0, 0], [2, 0, 0]],
        warp_bases=[[4, 0, 0], [8, 0, 0]], block_bases=[], shape=[16, 4, 4],
    )  # fmt: skip
    k_l: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, sel3))  # the register k
    c_l: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(0, sel3))  # the lane's column c
    g_l: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(0, cp3))  # the scale group
    pe_rows_l: gl.constexpr = gl.SliceLayout(1, pe_ld)
    C8: gl.constexpr = 128  # bytes per copy step: one 128-byte row chunk
    d = gl.arange(0, C8, layout=gl.SliceLayout(0, ld))
    e = gl.arange(0, D_KPE * (1 + ROPE_16BIT), layout=gl.SliceLayout(0, pe_ld))
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    base = n_begin + gl.arange(0, BLOCK_N, layout=rows_l)
    ent_l: gl.constexpr = gl.BlockedLayout([1], [32], [P_WARPS], [0])
    ent_base = n_begin + gl.arange(0, BLOCK_N, layout=ent_l)
    raw, in_list = load_entries(page_base, n_entries, base, base < n_end, PAGE_SIZE)
    for j in range(n_tiles):
        s = j % STAGES
        pos = base + j * BLOCK_N
        ok = pos < n_end
        pages, bad = check_entries(raw, in_list, ok, num_pages)
        if LISTS:  # a -1 entry is no token: not bad, not read
            live = ok & (raw != -1)
            bad = bad & live
        else:
            live = ok
        slot = pages.to(gl.int64)
        rows = cache_rows(slot, pos, bad, stride_ckv_p, stride_ckv_s, nan_row_ckv, PAGE_SIZE)
        pe_rows = cache_rows(slot, pos, bad, stride_kpe_p, stride_kpe_s, nan_row_kpe, PAGE_SIZE)
        pe_rows = gl.convert_layout(pe_rows, pe_rows_l)
        pe_ok = gl.convert_layout(live, pe_rows_l)
        # the next tile's page entries, requested before this tile's copies
        nxt = pos + BLOCK_N
        raw, in_list = load_entries(page_base, n_entries, nxt, nxt < n_end, PAGE_SIZE)
        # the value warpgroups are done with this stage (tile j - STAGES); passes at once at first
        mbarrier.wait(empty.index(s), ((j // STAGES) & 1) ^ 1)
        k_dst = k_stages.index(s)
        for c in gl.static_range(D_CKV // C8):
            async_load(
                k_dst.slice(c * C8, C8, dim=1), ckv_ptr + rows[:, None] + (c * C8 + d)[None, :],
                mask=live[:, None],
            )  # fmt: skip
        async_load(pe_stages.index(s), kpe_ptr + pe_rows[:, None] + e[None, :], mask=pe_ok[:, None])
        if TOKEN_GROUP:  # a bad entry's token: page 0's scales (its K and V are NaN anyway)
            sa_rows = slot * stride_sa_p + (pos % PAGE_SIZE) * stride_sa_s
            sa3 = gl.convert_layout(gl.reshape(sa_rows, [4, 16]), gl.SliceLayout(2, sel3),
                                    assert_trivial=True)[:, :, None]  # fmt: skip
            ok3 = gl.convert_layout(gl.reshape(live.to(gl.int32), [4, 16]),
                                    gl.SliceLayout(2, sel3), assert_trivial=True)[:, :, None]  # fmt: skip
            k = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=k_l), 1), 2)
            c = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=c_l), 0), 0)
            mine = k == c
            sa2 = gl.sum(gl.where(mine, sa3, 0), axis=0)  # [4w + r, c]: row 16c + 4w + r
            ok2 = gl.sum(gl.where(mine, ok3, 0), axis=0) != 0
            sa2 = gl.convert_layout(sa2, gl.SliceLayout(2, cp3), assert_trivial=True)
            # the launcher passes scale strides that are multiples of 4 floats: 16-byte rows
            # (one copy each where the array is 16-byte aligned)
            sa2 = gl.multiple_of(sa2, [4, 4])
            ok2 = gl.convert_layout(ok2, gl.SliceLayout(2, cp3), assert_trivial=True)
            g = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=g_l), 0), 0)
            dst = sc_stages.index(s).reshape([4, 16, 4]).permute((1, 0, 2))
            async_load(dst, scale_arr_ptr + sa2[:, :, None] + g, mask=ok2[:, :, None])
        if LISTS:
            ent_pos = ent_base + j * BLOCK_N
            async_load(ent_stages.index(s), page_base + ent_pos, mask=ent_pos < n_end)
        async_copy.mbarrier_arrive(ready.index(s), increment_count=False)


@gluon.jit
def _slab_rows(q_ptr, w: gl.constexpr, q_start, row0, rows_end, num_heads, num_tokens,
               stride_t, stride_h, D: gl.constexpr, ld: gl.constexpr):  # fmt: skip
    """The row tile's query rows ``row0 + 8w … row0 + 8w + 7`` (row = token × heads + head;
    rows from ``rows_end`` on as 0), ``[8, D]`` in the query's dtype."""
    r = row0 + w * 8 + gl.arange(0, 8, layout=gl.SliceLayout(1, ld))
    tok = q_start + r // num_heads
    r_ok = (r < rows_end) & (tok < num_tokens)
    rows = q_ptr + tok.to(gl.int64) * stride_t + (r % num_heads) * stride_h
    d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    return gl.load(rows[:, None] + d[None, :], mask=r_ok[:, None], other=0.0)


@gluon.jit
def _stage_slab(q_smem, inv_smem, x, w: gl.constexpr):
    """One 8-row slab ``x`` of one part of the query into operand rows ``16w … 16w + 7`` (hi)
    and ``16w + 8 … 16w + 15`` (lo), with a power of two per row (:func:`pow2_scale`); its
    ``1 / s`` into ``inv_smem[8w : 8w + 8]``."""
    x = x.to(gl.float32)
    s = pow2_scale(gl.max(gl.abs(x), axis=1))
    x = x * s[:, None]
    hi = x.to(gl.float8e4nv)
    q_smem.slice(16 * w, 8, dim=0).store(hi)
    q_smem.slice(16 * w + 8, 8, dim=0).store(((x - hi.to(gl.float32)) * LO_GAIN).to(gl.float8e4nv))
    inv_smem.slice(8 * w, 8).store(1.0 / s)


@gluon.jit
def _stage_slab8(q_smem, inv_smem, x, qs, w: gl.constexpr):
    """One 8-row slab ``x`` of one part of an e4m3 query, its codes as they are, into the hi
    rows ``16w … 16w + 7`` and zeros into the lo rows ``16w + 8 … 16w + 15`` (the scores'
    hi + lo sum then reads the product once); the rows' query scales ``qs`` into
    ``inv_smem[8w : 8w + 8]``, where a bf16 query's slab puts its ``1 / s``."""
    q_smem.slice(16 * w, 8, dim=0).store(x)
    q_smem.slice(16 * w + 8, 8, dim=0).store(gl.zeros_like(x))
    inv_smem.slice(8 * w, 8).store(qs)


@gluon.jit
def _stage_slab16(q_smem, inv_smem, x, w: gl.constexpr):
    """One 8-row slab ``x`` of the RoPE part of the query as it is (16-bit) into operand rows
    ``16w … 16w + 7``, zeros into the lo rows ``16w + 8 … 16w + 15`` (so that the hi + lo
    sum of the scores reads the product once), and ``1`` as its ``1 / s``."""
    q_smem.slice(16 * w, 8, dim=0).store(x.to(q_smem.dtype))
    q_smem.slice(16 * w + 8, 8, dim=0).store(gl.zeros_like(x).to(q_smem.dtype))
    inv_smem.slice(8 * w, 8).store(gl.full([8], 1.0, gl.float32, gl.SliceLayout(1, x.type.layout)))


@gluon.jit
def stage_query_half(
    q_smem, qpe_smem, inv_smem, q_ready, q_nope_ptr, q_pe_ptr, q_start, rows_total, num_heads,
    num_tokens, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, H: gl.constexpr,
    D_CKV: gl.constexpr, D_KPE: gl.constexpr, BLOCK_M: gl.constexpr, ROW_TILES: gl.constexpr,
    ROPE_16BIT: gl.constexpr = False, Q_FP8: gl.constexpr = 0, Q_SCALE: gl.constexpr = 0,
    q_scale_ptr=None, stride_qs_t=None, q_scale_val=None,
):  # fmt: skip
    """Value warpgroup ``H``'s share of the query staging (slabs ``2H`` and ``2H + 1``, the row
    tile's query rows ``16H … 16H + 15``: :func:`tile_rows`), then an arrival on ``q_ready``.
    The score warpgroup's operands ``[64, 512]`` and ``[64, 64]`` in e4m3: per query row and part
    a power of two ``s`` (:func:`pow2_scale`), ``hi = e4m3(q·s)`` in row ``16w + g`` and
    ``lo = e4m3((q·s − hi) · 16)`` in row ``16w + 8 + g`` for the tile's query row ``8w + g``
    (exact for bf16 queries but for elements 2^12 below the row's largest); ``1 / s`` of both
    parts in ``inv_smem [2, 32]``. All rows are requested before any is converted.
    ``ROPE_16BIT``: the RoPE operand is 16-bit, the query's RoPE part as it is in the hi rows
    (:func:`_stage_slab16`). ``Q_FP8`` nonzero: the query is e4m3 (its codes as bytes), staged
    as it is in the hi rows with zero lo rows and its scale per row (``Q_SCALE``:
    :func:`_row_scales`) for both parts (:func:`_stage_slab8`)."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    w0: gl.constexpr = 2 * H
    w1: gl.constexpr = 2 * H + 1
    row0, rows_end = tile_rows(rows_total, BLOCK_M, ROW_TILES)
    if Q_FP8:
        gl.static_assert(not ROPE_16BIT, "e4m3 queries with an FP8 RoPE operand")
        q_nope_ptr = q_nope_ptr.to(gl.pointer_type(gl.float8e4nv), bitcast=True)
        q_pe_ptr = q_pe_ptr.to(gl.pointer_type(gl.float8e4nv), bitcast=True)
    x0 = _slab_rows(q_nope_ptr, w0, q_start, row0, rows_end, num_heads, num_tokens,
                    stride_qn_t, stride_qn_h, D_CKV, ld)  # fmt: skip
    x1 = _slab_rows(q_nope_ptr, w1, q_start, row0, rows_end, num_heads, num_tokens,
                    stride_qn_t, stride_qn_h, D_CKV, ld)  # fmt: skip
    p0 = _slab_rows(q_pe_ptr, w0, q_start, row0, rows_end, num_heads, num_tokens,
                    stride_qp_t, stride_qp_h, D_KPE, ld)  # fmt: skip
    p1 = _slab_rows(q_pe_ptr, w1, q_start, row0, rows_end, num_heads, num_tokens,
                    stride_qp_t, stride_qp_h, D_KPE, ld)  # fmt: skip
    if Q_FP8:
        rows_l: gl.constexpr = gl.SliceLayout(1, ld)
        s0 = _row_scales(q_scale_ptr, stride_qs_t, q_scale_val, q_start, row0 + 8 * w0, rows_end,
                         num_heads, num_tokens, Q_SCALE, rows_l)  # fmt: skip
        s1 = _row_scales(q_scale_ptr, stride_qs_t, q_scale_val, q_start, row0 + 8 * w1, rows_end,
                         num_heads, num_tokens, Q_SCALE, rows_l)  # fmt: skip
        _stage_slab8(q_smem, inv_smem.index(0), x0, s0, w0)
        _stage_slab8(q_smem, inv_smem.index(0), x1, s1, w1)
        _stage_slab8(qpe_smem, inv_smem.index(1), p0, s0, w0)
        _stage_slab8(qpe_smem, inv_smem.index(1), p1, s1, w1)
    elif ROPE_16BIT:
        _stage_slab(q_smem, inv_smem.index(0), x0, w0)
        _stage_slab(q_smem, inv_smem.index(0), x1, w1)
        _stage_slab16(qpe_smem, inv_smem.index(1), p0, w0)
        _stage_slab16(qpe_smem, inv_smem.index(1), p1, w1)
    else:
        _stage_slab(q_smem, inv_smem.index(0), x0, w0)
        _stage_slab(q_smem, inv_smem.index(0), x1, w1)
        _stage_slab(qpe_smem, inv_smem.index(1), p0, w0)
        _stage_slab(qpe_smem, inv_smem.index(1), p1, w1)
    fence_async_shared()
    thread_barrier()
    mbarrier.arrive(q_ready)


@gluon.jit
def stage_query_blocks(q_blocks, qpe_smem, inv_smem, q_nope_ptr, q_pe_ptr, q_start, row0, rows_end,
                  num_heads, num_tokens, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
                  D_CKV: gl.constexpr, D_KPE: gl.constexpr, ROLE: gl.constexpr,
                  ROPE_16BIT: gl.constexpr = False):  # fmt: skip
    """Consumer ``ROLE``'s half of the query staging: slabs ``4·ROLE … 4·ROLE + 3`` of eight
    rows (the program's rows ``row0 + …``; rows from ``rows_end`` on as 0), per row and part a
    power of two ``s`` (``common.pow2_scale``), ``hi = e4m3(q·s)`` into the hi operand's
    column blocks (``q_blocks[0 : NB]``, ``NB = D_CKV / 128``) and ``lo = e4m3(q·s − hi)`` into
    the lo operand's (``q_blocks[NB : 2 NB]``), the RoPE part likewise into ``qpe_smem``, ``1 / s``
    of both parts into ``inv_smem [2, 64]``.

    One slab's code in a run-time loop, the next slab's rows loaded while one is converted:
    unrolled, the staging is tens of kilobytes of instructions per consumer, run once per
    program and so fetched cold (``docs/design/sm90-pingpong8.md``). A run-time slab is stored
    through the operands' swizzle atoms (8 rows × 128 bytes, 1 KB each and in order within a
    column block of ``q_blocks``), each column block loaded and stored apart (a reshape and
    split of one ``[8, 4, 128]`` slab put hi values into the lo blocks).

    ``ROPE_16BIT``: the RoPE part is not staged here (the consumers hold it in registers as it
    is, 16-bit: ``qpe_smem`` is not read) and its ``1 / s`` is 1."""
    gl.static_assert(D_CKV == 512, "four column blocks of 128")
    # 8 rows x 128 columns, 8 a thread (the RoPE part's 64 columns: each element held by two)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    # the operands as swizzle atoms of 8 rows x 128 bytes: block b's rows 8w ... at 8b + w
    if REINTERPRET_PUBLIC:
        atoms = q_blocks.reinterpret(gl.float8e4nv, [8 * 8, 8, 128], q_blocks.type.layout)
        inv8 = inv_smem.reinterpret(gl.float32, [2 * 8, 8], inv_smem.type.layout)
    else:
        atoms = q_blocks._reinterpret(gl.float8e4nv, [8 * 8, 8, 128], q_blocks.type.layout)
        inv8 = inv_smem._reinterpret(gl.float32, [2 * 8, 8], inv_smem.type.layout)
    if not ROPE_16BIT:
        pe_l: gl.constexpr = qpe_smem.type.layout
        if REINTERPRET_PUBLIC:
            pe_atoms = qpe_smem.reinterpret(gl.float8e4nv, [2 * 8, 8, D_KPE], pe_l)
        else:
            pe_atoms = qpe_smem._reinterpret(gl.float8e4nv, [2 * 8, 8, D_KPE], pe_l)
    a = (q_nope_ptr, q_start, row0, rows_end, num_heads, num_tokens, stride_qn_t, stride_qn_h)
    pa = (q_pe_ptr, q_start, row0, rows_end, num_heads, num_tokens, stride_qp_t, stride_qp_h)
    w = 4 * ROLE
    x0 = _rows8(a, w, 0, 128, ld)
    x1 = _rows8(a, w, 128, 128, ld)
    x2 = _rows8(a, w, 256, 128, ld)
    x3 = _rows8(a, w, 384, 128, ld)
    if not ROPE_16BIT:
        p = _rows8(pa, w, 0, D_KPE, ld)
    for w in range(4 * ROLE, 4 * ROLE + 4):
        n0 = _rows8(a, w + 1, 0, 128, ld)
        n1 = _rows8(a, w + 1, 128, 128, ld)
        n2 = _rows8(a, w + 1, 256, 128, ld)
        n3 = _rows8(a, w + 1, 384, 128, ld)
        if not ROPE_16BIT:
            pn = _rows8(pa, w + 1, 0, D_KPE, ld)
        x0 = x0.to(gl.float32)
        x1 = x1.to(gl.float32)
        x2 = x2.to(gl.float32)
        x3 = x3.to(gl.float32)
        m01 = gl.maximum(gl.max(gl.abs(x0), axis=1), gl.max(gl.abs(x1), axis=1))
        m23 = gl.maximum(gl.max(gl.abs(x2), axis=1), gl.max(gl.abs(x3), axis=1))
        s = pow2_scale(gl.maximum(m01, m23))
        _stage_block(atoms, x0, s, w)
        _stage_block(atoms, x1, s, 8 + w)
        _stage_block(atoms, x2, s, 16 + w)
        _stage_block(atoms, x3, s, 24 + w)
        inv8.index(w).store(1.0 / s)
        if ROPE_16BIT:
            inv8.index(8 + w).store(gl.full([8], 1.0, gl.float32, gl.SliceLayout(1, ld)))
        else:
            p = p.to(gl.float32)
            s = pow2_scale(gl.max(gl.abs(p), axis=1))
            _stage_block(pe_atoms, p, s, w)
            inv8.index(8 + w).store(1.0 / s)
            p = pn
        x0 = n0
        x1 = n1
        x2 = n2
        x3 = n3


@gluon.jit
def stage_query_fp8(q_blocks, qpe_smem, inv_smem, q_nope_ptr, q_pe_ptr, q_scale_ptr, q_start,
                    row0, rows_end, num_heads, num_tokens, stride_qn_t, stride_qn_h,
                    stride_qp_t, stride_qp_h, stride_qs_t, q_scale_val, D_CKV: gl.constexpr,
                    D_KPE: gl.constexpr, Q_SCALE: gl.constexpr, ROLE: gl.constexpr):  # fmt: skip
    """Consumer ``ROLE``'s half of the staging of an e4m3 query (its codes as bytes:
    ``q_nope_ptr``/``q_pe_ptr`` point to uint8): slabs ``4·ROLE … 4·ROLE + 3`` of eight rows,
    their bytes as they are into the one operand's column blocks (``q_blocks[0 : D_CKV /
    128]``) and ``qpe_smem[0]`` (rows from ``rows_end`` on as 0), and each row's query scale
    for both parts into ``inv_smem [2, 64]``, the factor the row's scores are multiplied by.
    ``Q_SCALE``: 0 the value ``q_scale_val``, 1 the one value at ``q_scale_ptr``, 2 a scale per
    row at ``q_scale_ptr + token · stride_qs_t + head``. The slabs in a run-time loop, as
    :func:`stage_query_blocks` stages them."""
    gl.static_assert(D_CKV == 512, "four column blocks of 128")
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])  # 8 rows x 128 B
    pe_ld: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])  # 8 rows x 64 B
    rows_l: gl.constexpr = gl.SliceLayout(1, ld)
    if REINTERPRET_PUBLIC:
        atoms = q_blocks.reinterpret(gl.float8e4nv, [4 * 8, 8, 128], q_blocks.type.layout)
        pe_atoms = qpe_smem.reinterpret(gl.float8e4nv, [8, 8, D_KPE], qpe_smem.type.layout)
        inv8 = inv_smem.reinterpret(gl.float32, [2 * 8, 8], inv_smem.type.layout)
    else:
        atoms = q_blocks._reinterpret(gl.float8e4nv, [4 * 8, 8, 128], q_blocks.type.layout)
        pe_atoms = qpe_smem._reinterpret(gl.float8e4nv, [8, 8, D_KPE], qpe_smem.type.layout)
        inv8 = inv_smem._reinterpret(gl.float32, [2 * 8, 8], inv_smem.type.layout)
    qn8 = q_nope_ptr.to(gl.pointer_type(gl.float8e4nv), bitcast=True)
    qp8 = q_pe_ptr.to(gl.pointer_type(gl.float8e4nv), bitcast=True)
    a = (qn8, q_start, row0, rows_end, num_heads, num_tokens, stride_qn_t, stride_qn_h)
    pa = (qp8, q_start, row0, rows_end, num_heads, num_tokens, stride_qp_t, stride_qp_h)
    for w in range(4 * ROLE, 4 * ROLE + 4):
        atoms.index(w).store(_rows8(a, w, 0, 128, ld))
        atoms.index(8 + w).store(_rows8(a, w, 128, 128, ld))
        atoms.index(16 + w).store(_rows8(a, w, 256, 128, ld))
        atoms.index(24 + w).store(_rows8(a, w, 384, 128, ld))
        pe_atoms.index(w).store(_rows8(pa, w, 0, D_KPE, pe_ld))
        qs = _row_scales(q_scale_ptr, stride_qs_t, q_scale_val, q_start, row0 + w * 8, rows_end,
                         num_heads, num_tokens, Q_SCALE, rows_l)  # fmt: skip
        inv8.index(w).store(qs)
        inv8.index(8 + w).store(qs)


@gluon.jit
def _row_scales(q_scale_ptr, stride_qs_t, q_scale_val, q_start, r0, rows_end, num_heads,
                num_tokens, Q_SCALE: gl.constexpr, rows_l: gl.constexpr):  # fmt: skip
    """The query scales of rows ``r0 … r0 + 7`` (row = token × heads + head), ``[8]`` in
    ``rows_l``: ``Q_SCALE`` 0 the value ``q_scale_val``, 1 the one value at ``q_scale_ptr``,
    2 ``q_scale_ptr[token · stride_qs_t + head]`` (1 for rows from ``rows_end`` on)."""
    if Q_SCALE == 2:
        r = r0 + gl.arange(0, 8, layout=rows_l)
        tok = q_start + r // num_heads
        r_ok = (r < rows_end) & (tok < num_tokens)
        return gl.load(q_scale_ptr + tok.to(gl.int64) * stride_qs_t + r % num_heads, mask=r_ok,
                       other=1.0)  # fmt: skip
    elif Q_SCALE == 1:
        return gl.full([8], 1.0, gl.float32, layout=rows_l) * gl.load(q_scale_ptr)
    else:
        return gl.full([8], q_scale_val, gl.float32, layout=rows_l)


@gluon.jit
def _rows8(a, w, c0: gl.constexpr, CW: gl.constexpr, ld: gl.constexpr):
    """Columns ``[c0, c0 + CW)`` of query rows ``row0 + 8w … row0 + 8w + 7`` (row = token ×
    heads + head; rows from ``rows_end`` on, and slabs past the program's eight, as 0),
    ``[8, CW]``. ``a``: the part's pointer, ``q_start, row0, rows_end, num_heads,
    num_tokens`` and its two strides."""
    q_ptr, q_start, row0, rows_end, num_heads, num_tokens, stride_t, stride_h = a
    r = row0 + w * 8 + gl.arange(0, 8, layout=gl.SliceLayout(1, ld))
    tok = q_start + r // num_heads
    r_ok = (r < rows_end) & (tok < num_tokens) & (w < 8)
    rows = q_ptr + tok.to(gl.int64) * stride_t + (r % num_heads) * stride_h
    d = c0 + gl.arange(0, CW, layout=gl.SliceLayout(0, ld))
    return gl.load(rows[:, None] + d[None, :], mask=r_ok[:, None], other=0.0)


@gluon.jit
def _stage_block(atoms, x, s, a):
    """``hi = e4m3(x·s)`` into ``atoms[a]`` and ``lo = e4m3(x·s − hi)`` into the lo operand's
    atom ``a + len(atoms) / 2`` (``x [8, CW]`` fp32, ``s`` per row)."""
    x = x * s[:, None]
    hi = x.to(gl.float8e4nv)
    atoms.index(a).store(hi)
    atoms.index(a + atoms.shape[0] // 2).store((x - hi.to(gl.float32)).to(gl.float8e4nv))


@gluon.jit
def rope16_query(q_pe_ptr, q_start, row0, rows_end, num_heads, num_tokens, stride_qp_t,
                 stride_qp_h, ROWS: gl.constexpr, D_KPE: gl.constexpr,
                 qpe_l: gl.constexpr):  # fmt: skip
    """The 16-bit RoPE part of the program's ``ROWS`` query rows (row = token × heads + head;
    rows from ``rows_end`` on as 0) as a product's bf16 register operand (layout ``qpe_l``),
    loaded from global memory in that layout: no shared memory."""
    r = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, qpe_l))
    tok = q_start + r // num_heads
    ok = (r < rows_end) & (tok < num_tokens)
    rows = q_pe_ptr + tok.to(gl.int64) * stride_qp_t + (r % num_heads) * stride_qp_h
    d = gl.arange(0, D_KPE, layout=gl.SliceLayout(0, qpe_l))
    return gl.load(rows[:, None] + d[None, :], mask=ok[:, None], other=0.0).to(gl.bfloat16)
