"""The score warpgroup of the FP8 × FP8 decode kernel (``fp8qk.py``): per tile
``S = Q₈·K₈ᵀ`` on FP8 tensor cores from the stage's bytes (the RoPE part and four 128-column
latent parts, each summed by the tensor cores and added in fp32), the online softmax, and
``P`` with the rescale factor handed to the value warpgroups through shared memory. With
per-tensor scales software pipelined: the next tile's first products run during this tile's
softmax. With token-group scales (whose registers would spill so) each tile's products run in
two steps inside the tile: the RoPE part with the first latent pair, then the second pair
while the first is scaled.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from fp8mla.kernels.portable import tiles as TL
from fp8mla.kernels.sm90.common import (
    BLOCK_N,
    HALF_N,
    LO_GAIN,
    NEG_INF,
    group_scales,
    launch_dependents,
    mask_scores,
    rope16_view,
    store_lse,
    thread_barrier,
    tile_rows,
    unmasked_end,
    wait_prior,
)

RQ = gl.constexpr(32)  # query rows of the score warpgroup (hi and lo: wgmma's M of 64)
# the accumulator of a 16-bit RoPE product (K steps of 16; the FP8 products' take 32): the
# same registers as theirs, so the hi + lo sum reads it alike
PE_ACC_16BIT = gl.constexpr(
    gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
)


# S's accumulator [64, 64] as [32 query rows, 64 tokens] once the hi/lo rows are added: each
# thread holds 16 tokens of one query row (the quad's four lanes hold the row's 64)
S_ROWS = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 8], [0, 16], [0, 32]],
        lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[8, 0], [16, 0]],
        block_bases=[],
        shape=[32, 64],
    )
)


# a [64, 1] column of token scales placed as S_ROWS places the tokens (group_scales)
SC_COL = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[1, 0], [8, 0], [16, 0], [32, 0]],
        lane_bases=[[2, 0], [4, 0], [0, 0], [0, 0], [0, 0]],
        warp_bases=[[0, 0], [0, 0]],
        block_bases=[],
        shape=[64, 1],
    )
)


@gluon.jit
def _add_hi_lo(acc):
    """wgmma's ``[64, 64]`` accumulator → ``[32 query rows, 64 tokens]`` (``S_ROWS``): each
    query row's hi row plus its lo row / 16 (one thread holds both)."""
    acc = gl.permute(gl.reshape(acc, [4, 2, 8, BLOCK_N]), (0, 2, 3, 1))
    s_hi, s_lo = gl.split(gl.reshape(acc, [RQ, BLOCK_N, 2]))
    return gl.convert_layout(s_hi + s_lo * (1.0 / LO_GAIN), S_ROWS, assert_trivial=True)


@gluon.jit
def _latent_pair(q_smem, kt, g: gl.constexpr, W: gl.constexpr, s_zero):
    """Start latent parts ``g`` and ``g + 1`` of the stage ``kt`` (``[512, 64 tokens]``,
    K-major; ``W`` columns each), each summed by the tensor cores on its own."""
    a0 = warpgroup_mma(q_smem.slice(g * W, W, dim=1), kt.slice(g * W, W, dim=0), s_zero,
                       use_acc=False, is_async=True)  # fmt: skip
    a1 = warpgroup_mma(q_smem.slice((g + 1) * W, W, dim=1), kt.slice((g + 1) * W, W, dim=0),
                       s_zero, use_acc=False, is_async=True)  # fmt: skip
    return a0, a1


@gluon.jit
def _s_issue(q_smem, qpe_smem, k_stages, pe_stages, st, s_zero, PARTS: gl.constexpr,
             D_CKV: gl.constexpr):  # fmt: skip
    """Start the products of stage ``st`` that need no result of another: the RoPE part and
    the first pair of latent parts (all of the latent part where ``PARTS == 1``), in flight
    on the tensor cores when this returns."""
    kt = k_stages.index(st).permute((1, 0))  # [512, 64 tokens], K-major
    if qpe_smem.dtype.primitive_bitwidth == 16:  # a bf16 RoPE part, staged as its bytes
        pe16 = rope16_view(pe_stages.index(st), qpe_smem.shape[1])
        # wgmma's K step is 16 for bf16 (32 for FP8): an accumulator layout of its own
        pe_zero = gl.zeros([2 * RQ, BLOCK_N], gl.float32, layout=PE_ACC_16BIT)
        acc_pe = warpgroup_mma(qpe_smem, pe16.permute((1, 0)), pe_zero, use_acc=False,
                               is_async=True)  # fmt: skip
    else:
        pt = pe_stages.index(st).permute((1, 0))
        acc_pe = warpgroup_mma(qpe_smem, pt, s_zero, use_acc=False, is_async=True)
    if PARTS == 1:
        a0 = warpgroup_mma(q_smem, kt, s_zero, use_acc=False, is_async=True)
        a1 = s_zero
    else:
        a0, a1 = _latent_pair(q_smem, kt, 0, D_CKV // PARTS, s_zero)
    return acc_pe, a0, a1


@gluon.jit
def _group_scaled(part, sc_stages, st, g: gl.constexpr):
    """Latent part ``g`` of ``S`` times its tokens' group-``g`` scales, which each thread
    reads for its 16 tokens straight from the stage."""
    tok_l: gl.constexpr = gl.SliceLayout(0, S_ROWS)
    sc = gl.convert_layout(group_scales(sc_stages, st, g, SC_COL), tok_l, assert_trivial=True)
    return part * sc[None, :]


@gluon.jit
def _s_pair(a0, a1, s, sc_stages, st, g: gl.constexpr, nope_scale, TOKEN_GROUP: gl.constexpr):
    """``s`` plus latent parts ``g`` and ``g + 1`` once their products are done (each part
    added in fp32; token-group scales per part)."""
    a0, a1 = warpgroup_mma_wait(0, deps=[a0, a1])
    part0 = _add_hi_lo(a0)
    part1 = _add_hi_lo(a1)
    if TOKEN_GROUP:
        part0 = _group_scaled(part0, sc_stages, st, g)
        part1 = _group_scaled(part1, sc_stages, st, g + 1)
    return s + (part0 + part1) * nope_scale


@gluon.jit
def _s_mid(acc_pe, a0, a1, q_smem, k_stages, st, s_zero, nope_scale, pe_scale,
           PARTS: gl.constexpr, D_CKV: gl.constexpr):  # fmt: skip
    """The scores of stage ``st`` so far (per-tensor scales), in log2 units, from the
    products :func:`_s_issue` started, and the second latent pair's products started
    (``PARTS == 4``; else none: returned as ``s_zero``)."""
    if PARTS == 1:
        a0, acc_pe = warpgroup_mma_wait(0, deps=[a0, acc_pe])
        s = _add_hi_lo(a0) * nope_scale + _add_hi_lo(acc_pe) * pe_scale
    else:
        acc_pe = warpgroup_mma_wait(2, deps=[acc_pe])  # the RoPE part first (issued first)
        s = _s_pair(a0, a1, _add_hi_lo(acc_pe) * pe_scale, None, st, 0, nope_scale, False)
    a2 = s_zero
    a3 = s_zero
    # the second pair, once the first pair's are read
    if PARTS == 4:
        kt = k_stages.index(st).permute((1, 0))
        a2, a3 = _latent_pair(q_smem, kt, 2, D_CKV // PARTS, s_zero)
    return s, a2, a3


@gluon.jit
def _s_end(s, a2, a3, nope_scale, PARTS: gl.constexpr):
    """``S [32 query rows, 64 tokens]`` (per-tensor scales): ``s`` from :func:`_s_mid` plus
    the second latent pair where ``PARTS == 4``."""
    if PARTS == 4:
        s = _s_pair(a2, a3, s, None, 0, 2, nope_scale, False)
    return s


@gluon.jit
def _scores(q_smem, qpe_smem, k_stages, pe_stages, st, s_zero, nope_scale, pe_scale,
            PARTS: gl.constexpr, D_CKV: gl.constexpr):  # fmt: skip
    """``S [32 query rows, 64 tokens]`` of stage ``st`` (per-tensor scales), its products
    started and awaited here (:func:`_s_issue`, :func:`_s_mid`, :func:`_s_end`)."""
    acc_pe, a0, a1 = _s_issue(q_smem, qpe_smem, k_stages, pe_stages, st, s_zero, PARTS, D_CKV)
    s, a2, a3 = _s_mid(acc_pe, a0, a1, q_smem, k_stages, st, s_zero, nope_scale, pe_scale,
                       PARTS, D_CKV)  # fmt: skip
    return _s_end(s, a2, a3, nope_scale, PARTS)


@gluon.jit
def _scores_grouped(q_smem, qpe_smem, k_stages, pe_stages, sc_stages, st, s_zero, nope_scale,
                    pe_scale, D_CKV: gl.constexpr):  # fmt: skip
    """``S [32 query rows, 64 tokens]`` of stage ``st`` with token-group scales (four latent
    parts, one scale group each), its products started and awaited here. The RoPE part and
    the first latent pair are issued together; the second pair as soon as the first pair's
    hi + lo sums free their accumulators, so that its products run while the first pair's
    scales are read and applied (this warpgroup's serial chain sets the 16-head sparse
    decode's tile period: design/sparse-runs.md, s12d)."""
    acc_pe, a0, a1 = _s_issue(q_smem, qpe_smem, k_stages, pe_stages, st, s_zero, 4, D_CKV)
    acc_pe = warpgroup_mma_wait(2, deps=[acc_pe])
    s = _add_hi_lo(acc_pe) * pe_scale
    a0, a1 = warpgroup_mma_wait(0, deps=[a0, a1])
    part0 = _add_hi_lo(a0)
    part1 = _add_hi_lo(a1)
    a2, a3 = _latent_pair(q_smem, k_stages.index(st).permute((1, 0)), 2, D_CKV // 4, s_zero)
    part0 = _group_scaled(part0, sc_stages, st, 0)
    part1 = _group_scaled(part1, sc_stages, st, 1)
    s = s + (part0 + part1) * nope_scale
    return _s_pair(a2, a3, s, sc_stages, st, 2, nope_scale, True)


@gluon.jit
def _softmax(s, j, m_i, l_i, n_begin, mask_from, n_end, causal_limit, CAUSAL: gl.constexpr):
    """The online softmax over tile ``j``'s scores ``s`` (a bad page entry's NaN where
    visible): ``P`` (fp32), the rescale factor, the new row maxima and sums. Only a tile that
    reaches ``mask_from`` (the split's end, or the first causal limit of the tile's rows) is
    masked: the tiles before it need no mask."""
    n0 = n_begin + j * BLOCK_N
    if n0 + BLOCK_N > mask_from:
        s = mask_scores(s, n0, n_end, causal_limit, BLOCK_N, CAUSAL, S_ROWS)
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_use = gl.where(m_new == NEG_INF, 0.0, m_new)
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _p_handoff(p, alpha, j, p_smem, a_smem, p_ready, p_free):
    """``P`` (fp16, in two 32-token halves) and the rescale factor of tile ``j`` into P
    buffer ``j % 2`` once the value warpgroups are done with it (tile ``j - 2``)."""
    b = j % 2
    mbarrier.wait(p_free.index(b), ((j // 2) & 1) ^ 1)
    p0, p1 = gl.split(gl.permute(gl.reshape(p.to(gl.float16), [RQ, 2, HALF_N]), (0, 2, 1)))
    p_smem.index(2 * b).store(p0)
    p_smem.index(2 * b + 1).store(p1)
    a_smem.index(b).store(alpha)
    fence_async_shared()
    thread_barrier()
    mbarrier.arrive(p_ready.index(b))


@gluon.jit
def score_warpgroup(
    k_stages, pe_stages, sc_stages, ready, q_smem, qpe_smem, q_ready, p_smem, a_smem, p_ready,
    p_free, stat_smem, stat_ready, lse_ptr, q_start, qo_len, rows_total, kv_len, n_begin, n_end,
    split, num_heads, num_tokens, qk_scale, pe_factor, stride_lse_split, stride_lse_t,
    D_CKV: gl.constexpr, D_KPE: gl.constexpr, CAUSAL: gl.constexpr, WRITE_LSE: gl.constexpr,
    TOKEN_GROUP: gl.constexpr, STAGES: gl.constexpr, QK_PARTS: gl.constexpr,
    LAUNCH_DEPENDENTS: gl.constexpr, BLOCK_M: gl.constexpr, ROW_TILES: gl.constexpr,
    LATE: gl.constexpr = False, late=None, LISTS: gl.constexpr = False, ent_stages=None,
):  # fmt: skip
    """The default partition: ``S = Q₈·K₈ᵀ`` per tile, the online softmax, ``P`` and the
    rescale factor to the value warpgroups, the row statistics and the LSE. With per-tensor
    scales software pipelined: tile ``j + 1``'s first products run on the tensor cores while
    tile ``j``'s softmax runs on the warpgroup (token-group scales: :func:`_scores_grouped`
    per tile). ``LATE``: the request's length and KV range read here, once the grid that
    writes them has ended (``common.wait_prior``; ``late``: the arguments of
    ``tiles.request_kv_span``). ``LISTS``: the page table is a sparse token's index list,
    whose ``-1`` entries are no token: their scores are masked, read from the tile's entries
    that the copier staged in ``ent_stages`` (it copies such a token's bytes as 0)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32]
    )
    PARTS: gl.constexpr = 4 if TOKEN_GROUP else QK_PARTS
    row_l: gl.constexpr = gl.SliceLayout(1, S_ROWS)  # along the query rows
    if LATE:
        wait_prior()
        kv_len, n_begin, n_end = TL.request_kv_span(late, BLOCK_M, BLOCK_N, CAUSAL)
    mbarrier.wait(q_ready, 0)  # the query operands, staged by the value warpgroups
    inv_s = stat_smem.index(0).load(row_l)
    inv_s_pe = stat_smem.index(1).load(row_l)
    thread_barrier()  # read before the epilogue reuses stat_smem
    # the two parts' products to S in log2 units, per row
    nope_scale = (inv_s * qk_scale)[:, None]
    pe_scale = (inv_s_pe * (qk_scale * pe_factor))[:, None]
    row0, rows_end = tile_rows(rows_total, BLOCK_M, ROW_TILES)
    causal_limit = kv_len - qo_len + (row0 + gl.arange(0, RQ, layout=row_l)) // num_heads
    mask_from = unmasked_end(n_end, kv_len, qo_len, row0, num_heads, CAUSAL)
    m_i = gl.full([RQ], NEG_INF, gl.float32, layout=row_l)
    l_i = gl.zeros([RQ], gl.float32, layout=row_l)
    s_zero = gl.zeros([2 * RQ, BLOCK_N], gl.float32, layout=mma)
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    # token-group scales: no products in flight across the softmax (their registers spill)
    gl.static_assert(not LISTS or TOKEN_GROUP, "index lists with token-group scales")
    if not TOKEN_GROUP:
        s = gl.zeros([RQ, BLOCK_N], gl.float32, layout=S_ROWS)
        if n_tiles > 0:  # tile 0's scores
            mbarrier.wait(ready.index(0), 0)
            fence_async_shared()  # the copier's cp.async bytes, to wgmma's async proxy
            s = _scores(q_smem, qpe_smem, k_stages, pe_stages, 0, s_zero, nope_scale, pe_scale,
                        PARTS, D_CKV)  # fmt: skip
        for j in range(n_tiles - 1):
            # tile j + 1's products on the tensor cores during tile j's softmax and handoff
            st = (j + 1) % STAGES
            mbarrier.wait(ready.index(st), ((j + 1) // STAGES) & 1)
            fence_async_shared()
            acc_pe, a0, a1 = _s_issue(q_smem, qpe_smem, k_stages, pe_stages, st, s_zero, PARTS,
                                      D_CKV)  # fmt: skip
            p, alpha, m_i, l_i = _softmax(s, j, m_i, l_i, n_begin, mask_from, n_end, causal_limit,
                                          CAUSAL)  # fmt: skip
            _p_handoff(p, alpha, j, p_smem, a_smem, p_ready, p_free)
            # (the second pair started before the handoff instead spills)
            s, a2, a3 = _s_mid(acc_pe, a0, a1, q_smem, k_stages, st, s_zero, nope_scale,
                               pe_scale, PARTS, D_CKV)  # fmt: skip
            s = _s_end(s, a2, a3, nope_scale, PARTS)
        if n_tiles > 0:  # the last tile's softmax
            p, alpha, m_i, l_i = _softmax(s, n_tiles - 1, m_i, l_i, n_begin, mask_from, n_end,
                                          causal_limit, CAUSAL)  # fmt: skip
            _p_handoff(p, alpha, n_tiles - 1, p_smem, a_smem, p_ready, p_free)
    else:  # each tile's scores, then its softmax
        for j in range(n_tiles):
            st = j % STAGES
            mbarrier.wait(ready.index(st), (j // STAGES) & 1)
            fence_async_shared()
            s = _scores_grouped(q_smem, qpe_smem, k_stages, pe_stages, sc_stages, st, s_zero,
                                nope_scale, pe_scale, D_CKV)  # fmt: skip
            if LISTS:
                ent = ent_stages.index(st).load(gl.SliceLayout(0, S_ROWS))
                s = gl.where(ent[None, :] == -1, NEG_INF, s)
            p, alpha, m_i, l_i = _softmax(s, j, m_i, l_i, n_begin, mask_from, n_end, causal_limit,
                                          CAUSAL)  # fmt: skip
            _p_handoff(p, alpha, j, p_smem, a_smem, p_ready, p_free)

    if LAUNCH_DEPENDENTS == 2:  # every tile scored: the split merge may be scheduled
        launch_dependents()
    # -- the row statistics for the value warpgroups' epilogue, and the LSE --
    stat_smem.index(0).store(m_i)
    stat_smem.index(1).store(l_i)
    thread_barrier()
    mbarrier.arrive(stat_ready)
    if WRITE_LSE:
        row0, rows_end = tile_rows(rows_total, BLOCK_M, ROW_TILES)
        r = row0 + gl.arange(0, RQ, layout=row_l)
        store_lse(m_i, l_i, lse_ptr, split, q_start, r, rows_end, num_heads, num_tokens,
                   stride_lse_split, stride_lse_t)  # fmt: skip
