"""The ``pingpong8`` kernel: Hopper (SM90) MLA attention of FP8 pools for many query rows, in
Gluon: the ping-pong order of ``pingpong.py`` on 64-token FP8 tiles used as they are.

One program owns 64 query rows (all 128 heads of a token take two programs) and runs three
warpgroups:

* a **copier** (``fp8_stage.fp8_copier``, the default partition) moves each 64-token tile's
  FP8 rows through the page table into one of ``STAGES`` shared stages by ``cp.async``; no
  registers, no conversion;
* two **consumer** warpgroups (``ROLE`` 0 and 1). Tile ``j`` is *owned* by warpgroup
  ``j % 2``: it computes ``S_j [64, 64] = Q·K_jᵀ`` alone on FP8 tensor cores, its online
  softmax from the running maximum the other published for tile ``j - 1``, and publishes
  tile ``j``'s maximum, rescale factor and ``P_j`` (fp16) in shared memory. Each warpgroup
  accumulates 256 of the 512 output columns over every tile, transposed as in the FP8 × FP8
  decode kernel (``fp8qk.py``): ``Oᵀ [256, 64 rows] += Vᵀ·Pᵀ`` with ``Vᵀ`` as
  wgmma's register operand, read from the stage's FP8 bytes and converted in registers
  (``fp8_values.value_operand``), and ``Pᵀ`` read from shared memory. So an FP8 tile is never
  converted in shared memory: the scores read its bytes as e4m3/e5m2, and each consumer
  converts only its own 256 value columns, in registers, when it applies the tile.

**Scores.** The query is held as two e4m3 operands under a power of two per row and part,
``q·s = hi + lo`` (exact for bf16 queries but for elements ~2^10 below the row's largest,
whose last bits fall in e4m3's subnormals). Each part of ``S`` is one accumulator chain: the
``lo`` columns, then the ``hi`` columns against the same key bytes, so the tensor cores add
the two and the accumulator keeps the query's 64 rows as wgmma's M (the FP8 × FP8 decode
kernel puts hi and lo in separate rows, which takes twice the accumulator registers, too many
beside a 64-row ``Oᵀ``). Hopper's FP8 wgmma accumulates at reduced precision: the latent part
is summed in ``QK_PARTS`` column ranges, each chain then added in fp32 (one long chain
measured LSE errors of 3.9e-3), the RoPE part
apart (its scale differs); the small lo products go first, so that each chain rounds at the
hi products' magnitude only once per hi step (hi first failed the LSE bound of 2e-3).

**Order.** A warpgroup's tile ``j``: its scores first, which need nothing of the other
warpgroup's, so they run while the other scores or applies its own tile; then the running
maximum of tile ``j - 1`` awaited, the softmax, ``P_j`` and the statistics published; then
the other's tile ``j - 1`` applied (``Oᵀ`` rescaled by its factor, ``P_{j-1}·V_{j-1}``
added), then tile ``j``. So the two warpgroups wait on each other only for the softmax's
maximum (applying tile ``j - 1`` before the scores, as the 16-bit ping-pong kernel does, is
slower here: ``docs/design/sm90-pingpong8.md``).

Each warpgroup publishes its tiles' ``P`` (two halves) and statistics in ``SLOTS`` = 2 places
of its own (tile ``j`` in ``(j // 2) % 2``), four allocations apart from the other's: its
stores and its loads of the other's values then touch different allocations, and the compiler
puts no barrier of the warpgroup's four warps between them (seven barriers a tile instead of
nine). Tile
``j``'s are read by the other warpgroup after it published tile ``j + 1``, and rewritten by the
owner at tile ``j + 4``, after the other published tile ``j + 3``. A stage is free once both
warpgroups applied its tile (``empty`` counts two).

Shared memory for ``STAGES`` = 3: the stages 114 KB (37 KB each with the RoPE part, 1 KB of
token-group scales), the query's hi and lo operands 72 KB, ``P`` 32 KB (about 220 KB: one
program per SM). Same arguments and results as ``mla_pingpong_kernel``; ``BLOCK_M`` 64,
``BLOCK_N`` 64, FP8 pools (e4m3 or e5m2, as ``FP8_CVT`` names them) with per-tensor or
token-group scales, a 64-dim RoPE part; launched with 4 warps (the consumers' 8 come on top).
On SM90 the planner launches it as a programmatic dependent (``WAIT_PRIOR``; its programs set
up their barriers before the grid ahead of it ends) and it lets its own dependents launch
early (``common.wait_prior``, ``common.launch_dependents``). Gluon has no interpreter: SM90
only.

``PV_FP8`` (on request, per-tensor scales): ``P·V`` on FP8 tensor cores. The owner publishes
``P × 256`` in e4m3, and each consumer's ``Vᵀ`` operand is the stage's bytes moved between its
registers (``fp8_values.value_operand8``: four tokens of a column to a register), never
converted. ``P`` rounded once to e4m3 costs ~1e-2 of the output against float64, as FlashMLA's
FP8 path does; the 16-bit ``P·V`` keeps the bf16 output's 1.7e-3.

``ROPE_16BIT`` (the sparse path's packed ``fp8_ds_mla`` rows, ``dsa/sparse_sm90.py``): the
RoPE part is bf16, staged as its 128 bytes a token (each stage 4 KB more) and multiplied in
one bf16 wgmma group against the query's RoPE part, which each consumer holds in registers
as the product's operand (loaded once a program, ``QPE16``) so that the stages still fit.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from fp8mla.kernels.portable import fp8_decode as T
from fp8mla.kernels.sm90.common import (
    BLOCK_N,
    HALF_N,
    NEG_INF,
    group_scales,
    launch_dependents,
    rope16_view,
    softmax_tile64,
    store_lse,
    thread_barrier,
    unmasked_end,
    wait_prior,
)
from fp8mla.kernels.sm90.fp8_stage import (
    fp8_copier,
    rope16_query,
    stage_query_blocks,
    stage_query_fp8,
)
from fp8mla.kernels.sm90.fp8_values import HALF, store_output, value_operand, value_operand8
from fp8mla.kernels.sm90.request import request_span

ROWS = gl.constexpr(64)  # query rows per program: the scores' M, the value products' N


SLOTS = gl.constexpr(2)  # each warpgroup's own tiles whose P and statistics are kept


COPIER_WARPS = gl.constexpr(4)

# ``PV_FP8``: P is published in e4m3 times this power of two (its largest value, 1, then well
# inside e4m3's 448, its small values above the subnormals down to ~6e-5); the output is
# divided by it at the end
P8_SCALE = gl.constexpr(256.0)

# ``ROPE_16BIT``: the RoPE product in bf16 (wgmma's K step 16; the FP8 products' 32), its
# accumulator the same registers as the scores' (converted without moving), the query's RoPE
# part as its register operand
PE_ACC16 = gl.constexpr(
    gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
)
QPE16 = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=PE_ACC16, k_width=2))


CONSUMER_REGS = gl.constexpr(232)  # each consumer; the copier (the default partition) keeps 40


@gluon.jit
def _chain(q_blocks, z, kt, c0: gl.constexpr, W: gl.constexpr, Q_FP8: gl.constexpr,
           s_layout: gl.constexpr):  # fmt: skip
    """One part of the scores in flight: columns ``[c0, c0 + W)`` of the lo operand, then of
    the hi operand (column blocks of 128 in ``q_blocks``: hi ``[0, NB)``, lo ``[NB, 2 NB)``;
    ``z`` is 0), against the same key columns, one accumulator (two wgmma groups). The small
    lo products first: the tensor cores' reduced-precision accumulation then rounds at the hi
    products' magnitude only once per hi step. ``Q_FP8``: the query is the caller's e4m3, one
    operand (``q_blocks`` holds ``NB`` blocks), one wgmma group."""
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    hi = q_blocks.index(z + c0 // 128).slice(c0 % 128, W, dim=1)
    if Q_FP8:
        return warpgroup_mma(hi, kt.slice(c0, W, dim=0), s_zero, use_acc=False, is_async=True)
    NB: gl.constexpr = q_blocks.shape[0] // 2
    lo = q_blocks.index(z + NB + c0 // 128).slice(c0 % 128, W, dim=1)
    a = warpgroup_mma(lo, kt.slice(c0, W, dim=0), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(hi, kt.slice(c0, W, dim=0), a, is_async=True)


# a [64, 1] column of a stage's token scales, a token per lane (group_scales); read this way
# and exchanged into the scores' layout, the kernel spilled about 1.3 KB against 2.4 KB with
# each thread reading its own tokens in the accumulator's layout (Triton 3.6)
SC_COL8 = gl.constexpr(gl.BlockedLayout([1, 1], [32, 1], [4, 1], [1, 0]))


@gluon.jit
def _group_scale(sc_stages, st, g: gl.constexpr, s_layout: gl.constexpr):
    """The token-group scale of latent columns ``[128g, 128g + 128)`` for the stage's 64
    tokens, along ``S``'s columns."""
    return gl.convert_layout(group_scales(sc_stages, st, g, SC_COL8), gl.SliceLayout(0, s_layout))


@gluon.jit
def _scores8(q_blocks, qpe, k_stages, pe_stages, sc_stages, st, z, pe_ratio,
             PARTS: gl.constexpr, D_CKV: gl.constexpr, TOKEN_GROUP: gl.constexpr,
             Q_FP8: gl.constexpr, ROPE_16BIT: gl.constexpr,
             s_layout: gl.constexpr):  # fmt: skip
    """``S [64 rows, 64 tokens]`` of stage ``st`` in units of the latent part's scale (the
    caller multiplies by it): the RoPE part times ``pe_ratio`` (its scale over the latent
    part's, per row) plus the latent part in ``PARTS`` chains, each awaited and added in fp32
    (times its tokens' group scales where ``TOKEN_GROUP``). (A chain started before the one
    before it is added holds a second accumulator: 1.1 KB spilled beside ``Oᵀ``.) ``qpe``:
    the query's RoPE operands in shared memory, or with ``ROPE_16BIT`` its bf16 values in
    registers (``QPE16``) against the stage's bf16 RoPE part."""
    W: gl.constexpr = D_CKV // PARTS
    kt = k_stages.index(st).permute((1, 0))  # [512, 64 tokens], K-major
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    if ROPE_16BIT:
        pt16 = rope16_view(pe_stages.index(st), qpe.shape[1]).permute((1, 0))
        pe_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=PE_ACC16)
        acc = warpgroup_mma(qpe, pt16, pe_zero, use_acc=False, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc, qpe])[0]
        s = gl.convert_layout(acc, s_layout, assert_trivial=True) * pe_ratio[:, None]
    else:
        pt = pe_stages.index(st).permute((1, 0))
        if Q_FP8:
            acc = warpgroup_mma(qpe.index(z), pt, s_zero, use_acc=False, is_async=True)
        else:  # lo, then hi
            acc = warpgroup_mma(qpe.index(z + 1), pt, s_zero, use_acc=False, is_async=True)
            acc = warpgroup_mma(qpe.index(z), pt, acc, is_async=True)
        s = warpgroup_mma_wait(0, deps=[acc]) * pe_ratio[:, None]
    for g in gl.static_range(PARTS):
        a = warpgroup_mma_wait(0, deps=[_chain(q_blocks, z, kt, g * W, W, Q_FP8, s_layout)])
        if TOKEN_GROUP:
            s = s + a * _group_scale(sc_stages, st, (g * W) // 128, s_layout)[None, :]
        else:
            s = s + a
    return s


@gluon.jit
def _apply(o, k_stages, sc_stages, p_halves, st, sl, TOKEN_GROUP: gl.constexpr,
           FP8_CVT: gl.constexpr, ROLE: gl.constexpr, a_l: gl.constexpr,
           PV_FP8: gl.constexpr):  # fmt: skip
    """``Oᵀ += Vᵀ·Pᵀ`` for the tile in stage ``st`` whose ``P`` halves are in slot ``sl`` of
    ``p_halves``: this consumer's 256 value columns, both 32-token operands built from the
    stage's FP8 bytes first (their loads in flight together), then both products issued and
    awaited once (faster than building each step's operand once the step before is done).
    ``PV_FP8``: the operands are the stage's bytes and ``P`` is e4m3, FP8 products, each
    awaited before the next (the wait cannot take 8-bit operands to hold alive; with both
    products in flight ptxas found too few registers and serialized every wgmma)."""
    if PV_FP8:
        a0 = value_operand8(k_stages, st, 0, ROLE, a_l)
        a1 = value_operand8(k_stages, st, 1, ROLE, a_l)
        o = warpgroup_mma(a0, p_halves[0].index(sl).permute((1, 0)), o, is_async=True)
        o = warpgroup_mma_wait(0, deps=[o])
        o = warpgroup_mma(a1, p_halves[1].index(sl).permute((1, 0)), o, is_async=True)
        return warpgroup_mma_wait(0, deps=[o])
    else:  # (Triton compiles what follows a constexpr branch's return too)
        a0 = value_operand(k_stages, sc_stages, st, 0, ROLE, TOKEN_GROUP, FP8_CVT, a_l)
        a1 = value_operand(k_stages, sc_stages, st, 1, ROLE, TOKEN_GROUP, FP8_CVT, a_l)
        o = warpgroup_mma(a0, p_halves[0].index(sl).permute((1, 0)), o, is_async=True)
        o = warpgroup_mma(a1, p_halves[1].index(sl).permute((1, 0)), o, is_async=True)
        return warpgroup_mma_wait(0, deps=[o, a0, a1])[0]


@gluon.jit
def _apply_tile(o, r, alpha, k_stages, sc_stages, empty, owner,
                STAGES: gl.constexpr, SLOTS: gl.constexpr, TOKEN_GROUP: gl.constexpr,
                FP8_CVT: gl.constexpr, ROLE: gl.constexpr, o_cols: gl.constexpr,
                a_l: gl.constexpr, PV_FP8: gl.constexpr):  # fmt: skip
    """``Oᵀ ← Oᵀ·α_r + (P_r·V_r)ᵀ`` for tile ``r``, whose statistics and ``P`` its owner
    published (``owner``: that warpgroup's slots, ``r`` in slot ``(r // 2) % SLOTS``), then
    this warpgroup's share of its stage released. The stage's bytes are not awaited again:
    the owner awaited them before it published (an mbarrier wait, then the published
    statistics' arrive and wait carry it over). ``alpha``: this warpgroup's own factor of tile
    ``r`` (its registers), or None (the other's, read from its slot). (Reading the own factor
    from the slot too let the compiler load it before the other's tile is applied: 16
    registers more there, which spilled and serialized every wgmma of the kernel.)"""
    p_lo, p_hi, _, a_s = owner  # (P halves, maximum, factor)
    sl = (r // 2) % SLOTS
    st = r % STAGES
    if alpha is None:
        alpha_o = a_s.index(sl).load(o_cols)
    else:  # this warpgroup's own factor, from its registers
        alpha_o = gl.convert_layout(alpha, o_cols)
    o = _apply(o * alpha_o[None, :], k_stages, sc_stages, (p_lo, p_hi), st, sl, TOKEN_GROUP,
               FP8_CVT, ROLE, a_l, PV_FP8)  # fmt: skip
    thread_barrier()
    mbarrier.arrive(empty.index(st))
    return o


@gluon.jit
def _published(r, owner, stat_bar, SLOTS: gl.constexpr, s_rows: gl.constexpr):
    """Tile ``r``'s running maximum and rescale factor once its owner published them."""
    mbarrier.wait(stat_bar, r & 1)
    sl = (r // 2) % SLOTS
    return owner[2].index(sl).load(s_rows), owner[3].index(sl).load(s_rows)


@gluon.jit
def _own_tile(o, l_i, m_i, j, q_blocks, qpe, k_stages, pe_stages, sc_stages, ready, empty,
              mine, theirs, stat_bar, nope_scale, pe_ratio, n_begin, n_end, mask_from,
              causal_limit, STAGES: gl.constexpr, SLOTS: gl.constexpr, PARTS: gl.constexpr,
              D_CKV: gl.constexpr, CAUSAL: gl.constexpr, TOKEN_GROUP: gl.constexpr,
              FP8_CVT: gl.constexpr, ROLE: gl.constexpr, Q_FP8: gl.constexpr,
              ROPE_16BIT: gl.constexpr, s_layout: gl.constexpr, s_rows: gl.constexpr,
              o_cols: gl.constexpr, a_l: gl.constexpr, PV_FP8: gl.constexpr):  # fmt: skip
    """Tile ``j``, owned by this warpgroup: its scores (which need nothing of the other's, so
    they run while the other warpgroup scores or applies its own tile), then the running
    maximum of tile ``j - 1`` awaited, the online softmax (only a tile that reaches
    ``mask_from`` is masked; a bad page entry's NaN turns its rows NaN), ``P_j`` and the
    statistics published, and tiles ``j - 1`` (the other's) and ``j`` applied."""
    st = j % STAGES
    mbarrier.wait(ready.index(st), (j // STAGES) & 1)
    fence_async_shared()  # the copier's cp.async bytes, to wgmma's async proxy
    # the query's descriptors formed here, not hoisted out of the loop (j >> 30 is 0)
    s = _scores8(q_blocks, qpe, k_stages, pe_stages, sc_stages, st, j >> 30, pe_ratio,
                 PARTS, D_CKV, TOKEN_GROUP, Q_FP8, ROPE_16BIT, s_layout)  # fmt: skip
    if j >= 1:  # the other's tile j - 1: its maximum, and its factor for the row sums
        m_i, alpha_r = _published(j - 1, theirs, stat_bar, SLOTS, s_rows)
        l_i = l_i * alpha_r
    # (the scale per row is positive: the maximum of the unscaled scores, scaled after)
    p, alpha, m_new = softmax_tile64(s, m_i, n_begin + j * BLOCK_N, mask_from, n_end,
                                      causal_limit, nope_scale, BLOCK_N, CAUSAL, s_layout,
                                      True)  # fmt: skip
    sl = (j // 2) % SLOTS
    if PV_FP8:
        p_pub = (p * P8_SCALE).to(gl.float8e4nv)
    else:
        p_pub = p.to(gl.float16)
    p0, p1 = gl.split(gl.permute(gl.reshape(p_pub, [ROWS, 2, HALF_N]), (0, 2, 1)))
    mine[0].index(sl).store(p0)
    mine[1].index(sl).store(p1)
    mine[2].index(sl).store(m_new)
    mine[3].index(sl).store(alpha)
    fence_async_shared()
    l_i = l_i * alpha + gl.sum(p, axis=1)
    thread_barrier()
    mbarrier.arrive(stat_bar)
    if j >= 1:  # the other's tile j - 1, published before this one
        o = _apply_tile(o, j - 1, None, k_stages, sc_stages, empty, theirs,
                        STAGES, SLOTS, TOKEN_GROUP, FP8_CVT, ROLE, o_cols, a_l, PV_FP8)  # fmt: skip
    o = _apply_tile(o, j, alpha, k_stages, sc_stages, empty, mine, STAGES,
                    SLOTS, TOKEN_GROUP, FP8_CVT, ROLE, o_cols, a_l, PV_FP8)  # fmt: skip
    return o, l_i, m_new


@gluon.jit
def _pingpong8_consumer(args, D_CKV: gl.constexpr, D_KPE: gl.constexpr, CAUSAL: gl.constexpr,
                  WRITE_LSE: gl.constexpr, TOKEN_GROUP: gl.constexpr, FP8_CVT: gl.constexpr,
                  STAGES: gl.constexpr, PARTS: gl.constexpr, ROLE: gl.constexpr,
                  Q_FP8: gl.constexpr, Q_SCALE: gl.constexpr,
                  ROPE_16BIT: gl.constexpr, PV_FP8: gl.constexpr):  # fmt: skip
    """Consumer warpgroup ``ROLE``: stages its half of the query rows, owns tiles ``ROLE,
    ROLE + 2, …``, applies every tile to output columns ``256·ROLE + π(m)``
    (``fp8_values.store_output``), and stores them as ``O / l`` times the value scale
    (``ROLE`` 0 also the base-2 LSE). ``args``: the run-time values, one tuple."""
    (k_stages, pe_stages, sc_stages, ready, empty, q_blocks, qpe_smem, inv_smem, q_ready, slots0,
     slots1, stat_bar, l_smem, l_bar, q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr, m_tile, q_start,
     qo_len, rows_total, kv_len, n_begin, n_end, split, num_heads, num_tokens, qk_scale,
     pe_factor, v_scale, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split,
     stride_o_t, stride_o_h, stride_lse_split, stride_lse_t, q_scale_ptr, stride_qs_t,
     q_scale_val) = args  # fmt: skip
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32]
    )
    # the value products' K step: 32 tokens for FP8 operands (PV_FP8), 16 for fp16
    PV_K: gl.constexpr = 32 if PV_FP8 else 16
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, ROWS, PV_K]
    )
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=PV_K // 8)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_cols: gl.constexpr = gl.SliceLayout(0, o_layout)  # along the query rows (N)

    if ROLE == 0:  # P and statistics: this warpgroup's own tiles', and the other's
        mine = slots0
        theirs = slots1
    else:
        mine = slots1
        theirs = slots0
    row0 = m_tile * ROWS
    rows_end = gl.minimum(rows_total, row0 + ROWS)
    if Q_FP8:  # the caller's e4m3 bytes, each row's scale beside them
        stage_query_fp8(q_blocks, qpe_smem, inv_smem, q_nope_ptr, q_pe_ptr, q_scale_ptr, q_start,
                        row0, rows_end, num_heads, num_tokens, stride_qn_t, stride_qn_h,
                        stride_qp_t, stride_qp_h, stride_qs_t, q_scale_val, D_CKV, D_KPE,
                        Q_SCALE, ROLE)  # fmt: skip
    else:
        if ROPE_16BIT:  # all 64 rows' RoPE part, as it is, into this consumer's registers
            qpe = rope16_query(q_pe_ptr, q_start, row0, rows_end, num_heads, num_tokens,
                               stride_qp_t, stride_qp_h, ROWS, D_KPE, QPE16)  # fmt: skip
        stage_query_blocks(q_blocks, qpe_smem, inv_smem, q_nope_ptr, q_pe_ptr, q_start, row0,
                           rows_end, num_heads, num_tokens, stride_qn_t, stride_qn_h,
                           stride_qp_t, stride_qp_h, D_CKV, D_KPE, ROLE,
                           ROPE_16BIT)  # fmt: skip
    if not ROPE_16BIT:
        qpe = qpe_smem
    fence_async_shared()
    thread_barrier()
    mbarrier.arrive(q_ready)
    mbarrier.wait(q_ready, 0)  # both halves staged
    inv_s = inv_smem.index(0).load(s_rows)
    # the latent part's products to log2 units, per row; the RoPE part's relative to it
    nope_scale = inv_s * qk_scale
    pe_ratio = inv_smem.index(1).load(s_rows) / inv_s * pe_factor

    rs = row0 + gl.arange(0, ROWS, layout=s_rows)
    causal_limit = kv_len - qo_len + rs // num_heads
    mask_from = unmasked_end(n_end, kv_len, qo_len, row0, num_heads, CAUSAL)
    m_i = gl.full([ROWS], NEG_INF, gl.float32, layout=s_rows)
    l_i = gl.zeros([ROWS], gl.float32, layout=s_rows)
    o = gl.zeros([HALF, ROWS], gl.float32, layout=o_layout)
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    for j in range(ROLE, n_tiles, 2):
        o, l_i, m_i = _own_tile(
            o, l_i, m_i, j, q_blocks, qpe, k_stages, pe_stages, sc_stages, ready, empty,
            mine, theirs, stat_bar, nope_scale, pe_ratio, n_begin, n_end, mask_from,
            causal_limit, STAGES, SLOTS, PARTS, D_CKV, CAUSAL, TOKEN_GROUP, FP8_CVT, ROLE,
            Q_FP8, ROPE_16BIT, s_layout, s_rows, o_cols, a_l, PV_FP8,
        )  # fmt: skip
    last = n_tiles - 1
    if (last >= 0) & (last % 2 != ROLE):  # the other's last tile
        m_i, alpha_r = _published(last, theirs, stat_bar, SLOTS, s_rows)
        l_i = l_i * alpha_r
        o = _apply_tile(o, last, None, k_stages, sc_stages, empty, theirs, STAGES,
                        SLOTS, TOKEN_GROUP, FP8_CVT, ROLE, o_cols, a_l, PV_FP8)  # fmt: skip

    # the row sums of both warpgroups' tiles
    l_smem.index(ROLE).store(l_i)
    thread_barrier()
    mbarrier.arrive(l_bar)
    mbarrier.wait(l_bar, 0)
    l_o = l_smem.index(0).load(o_cols) + l_smem.index(1).load(o_cols)
    has = l_o > 0.0
    if PV_FP8:  # P was published times P8_SCALE
        v_scale = v_scale * (1.0 / P8_SCALE)
    inv_l = gl.where(has, v_scale / gl.where(has, l_o, 1.0), 0.0)
    store_output(
        o * inv_l[None, :], o_ptr, q_start, rows_total, split, num_heads, num_tokens,
        stride_o_split, stride_o_t, stride_o_h, ROLE, ROWS, True,
    )  # fmt: skip
    if WRITE_LSE and ROLE == 0:
        l_t = l_i + l_smem.index(1).load(s_rows)
        store_lse(m_i, l_t, lse_ptr, split, q_start, rs, rows_total, num_heads, num_tokens,
                   stride_lse_split, stride_lse_t)  # fmt: skip


@gluon.jit(do_not_specialize=["num_tokens", "num_pages"])
def mla_pingpong8_kernel(
    q_nope_ptr,
    q_pe_ptr,
    ckv_ptr,
    kpe_ptr,
    scale_arr_ptr,
    ckv_scale_ptr,
    kpe_scale_ptr,
    qo_indptr_ptr,
    kv_indptr_ptr,
    kv_indices_ptr,
    kv_len_ptr,
    o_ptr,
    lse_ptr,
    stride_qn_t,
    stride_qn_h,
    stride_qp_t,
    stride_qp_h,
    stride_ckv_p,
    stride_ckv_s,
    stride_kpe_p,
    stride_kpe_s,
    stride_sa_p,
    stride_sa_s,
    stride_o_split,
    stride_o_t,
    stride_o_h,
    stride_lse_split,
    stride_lse_t,
    num_heads,
    num_tokens,
    num_pages,
    num_indices,
    nan_row_ckv,
    nan_row_kpe,
    sm_scale_log2,
    ckv_scale_val,
    kpe_scale_val,
    PAGE_SIZE: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    D_CKV: gl.constexpr,
    D_KPE: gl.constexpr,
    CAUSAL: gl.constexpr,
    TOKEN_GROUP: gl.constexpr,
    CKV_SCALE_PTR: gl.constexpr,
    KPE_SCALE_PTR: gl.constexpr,
    DOT_DTYPE: gl.constexpr,
    WRITE_LSE: gl.constexpr,
    FP8_CVT: gl.constexpr,
    # launched as a programmatic dependent of the grid before it: no global read before it ends
    WAIT_PRIOR: gl.constexpr = False,
    STAGES: gl.constexpr = 3,  # FP8 tiles in flight (37 KB each)
    # the latent part of Q·Kᵀ in QK_PARTS column ranges, each summed by the tensor cores (at
    # their reduced FP8 accumulation precision) and added to the others in fp32
    QK_PARTS: gl.constexpr = 4,
    # nonzero: e4m3 queries, their codes as bytes, times a scale per row
    # (``fp8_stage.stage_query_fp8``: Q_SCALE 0 ``q_scale_val``, 1 ``q_scale_ptr[0]``, 2
    # ``q_scale_ptr[token · stride_qs_t + head]``)
    Q_FP8: gl.constexpr = 0,
    Q_SCALE: gl.constexpr = 0,
    # the RoPE part is 16-bit (the packed ``fp8_ds_mla`` rows' bf16 values: ``kpe_ptr`` and its
    # strides in bytes, 128 bytes a token): staged as bytes, multiplied in bf16 against the
    # query's RoPE part held in registers (bf16 queries only)
    ROPE_16BIT: gl.constexpr = False,
    # nonzero: P·V on FP8 tensor cores (per-tensor scales), P rounded once to e4m3 (~1.3e-2 of
    # the output against float64, where the 16-bit P·V gives 1.7e-3)
    PV_FP8: gl.constexpr = 0,
    q_scale_ptr=None,
    stride_qs_t=None,
    q_scale_val=None,
):
    gl.static_assert(BLOCK_M == 64, "64 query rows per program")
    gl.static_assert(BLOCK_N == 64, "64 KV tokens per tile")
    gl.static_assert(D_CKV == 2 * HALF, "the latent dimension is 512")
    gl.static_assert(D_KPE == 64, "the RoPE dimension is 64")
    gl.static_assert(
        D_CKV // QK_PARTS <= 128, "a scores part within one column block (and scale group)"
    )
    gl.static_assert(gl.num_warps() == 4, "four warps in the default partition")
    gl.static_assert(not (PV_FP8 and TOKEN_GROUP), "an FP8 P·V with per-tensor scales")
    gl.static_assert(
        FP8_CVT == T.CVT_PTX_E4M3 or FP8_CVT == T.CVT_PTX_E5M2, "FP8 bytes read as e4m3 or e5m2"
    )
    KV8: gl.constexpr = gl.float8e4nv if FP8_CVT == T.CVT_PTX_E4M3 else gl.float8e5
    ckv8 = ckv_ptr.to(gl.pointer_type(KV8), bitcast=True)
    kpe8 = kpe_ptr.to(gl.pointer_type(KV8), bitcast=True)

    k_sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    pe_sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    if PV_FP8:  # e4m3 P [64 rows, 32 tokens]: 32 bytes a row, K-major for the FP8 product
        P_T: gl.constexpr = gl.float8e4nv
        p_sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=32, element_bitwidth=8, rank=2)
    else:
        P_T: gl.constexpr = gl.float16
        p_sh: gl.constexpr = gl.NVMMASharedLayout(
            swizzle_byte_width=64, element_bitwidth=16, rank=2
        )
    vec_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    vec2_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    k_stages = gl.allocate_shared_memory(KV8, [STAGES, BLOCK_N, D_CKV], k_sh)
    if ROPE_16BIT:  # 128 bytes a token, in the latent part's swizzle (common.rope16_view)
        gl.static_assert(not Q_FP8, "a 16-bit RoPE part with bf16 queries")
        pe_stages = gl.allocate_shared_memory(KV8, [STAGES, BLOCK_N, 2 * D_KPE], k_sh)
    else:
        pe_stages = gl.allocate_shared_memory(KV8, [STAGES, BLOCK_N, D_KPE], pe_sh)
    sc_stages = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N, 4], vec2_sh)
    # the query's hi and lo operands in column blocks of 128: hi [0, 4), lo [4, 8); an e4m3
    # query is one operand, [0, 4)
    Q_OPS: gl.constexpr = 1 if Q_FP8 else 2
    q_blocks = gl.allocate_shared_memory(gl.float8e4nv, [Q_OPS * D_CKV // 128, ROWS, 128], k_sh)
    if ROPE_16BIT:  # held in the consumers' registers; the argument's place never read
        qpe_smem = q_blocks
    else:
        qpe_smem = gl.allocate_shared_memory(gl.float8e4nv, [Q_OPS, ROWS, D_KPE], pe_sh)
    inv_smem = gl.allocate_shared_memory(gl.float32, [2, ROWS], vec_sh)
    # each warpgroup's P (two halves) and statistics (maximum, factor) of its last SLOTS
    # tiles, each in an allocation of its own: stores to one, loads of another, no barrier
    slots0 = (
        gl.allocate_shared_memory(P_T, [SLOTS, ROWS, HALF_N], p_sh),
        gl.allocate_shared_memory(P_T, [SLOTS, ROWS, HALF_N], p_sh),
        gl.allocate_shared_memory(gl.float32, [SLOTS, ROWS], vec_sh),
        gl.allocate_shared_memory(gl.float32, [SLOTS, ROWS], vec_sh),
    )
    slots1 = (
        gl.allocate_shared_memory(P_T, [SLOTS, ROWS, HALF_N], p_sh),
        gl.allocate_shared_memory(P_T, [SLOTS, ROWS, HALF_N], p_sh),
        gl.allocate_shared_memory(gl.float32, [SLOTS, ROWS], vec_sh),
        gl.allocate_shared_memory(gl.float32, [SLOTS, ROWS], vec_sh),
    )
    l_smem = gl.allocate_shared_memory(gl.float32, [2, ROWS], vec_sh)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_l)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_l)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    stat_bar = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    l_bar = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=COPIER_WARPS * 32)  # every copier thread's copies
        mbarrier.init(empty.index(i), count=2)  # both consumers
    mbarrier.init(q_ready, count=2)
    mbarrier.init(stat_bar, count=1)
    mbarrier.init(l_bar, count=2)
    fence_async_shared()
    thread_barrier()

    if WAIT_PRIOR:
        wait_prior()
    # the grid launched as this one's programmatic dependent (the split merge, the next
    # layer's call) may be scheduled from now on: its programs wait on the SMs this grid
    # leaves idle or has ended on (one program per SM), set up, instead of being launched
    # after this grid's end
    launch_dependents()
    m_tile = gl.program_id(0)
    b = gl.program_id(1)
    split = gl.program_id(2)
    (q_start, qo_len, rows_total, kv_len, n_begin, n_end, page_base, n_entries, qk_scale,
     pe_factor, v_scale) = request_span(
        qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr, ckv_scale_ptr, kpe_scale_ptr,
        ckv_scale_val, kpe_scale_val, sm_scale_log2, b, m_tile, split, num_heads, num_indices,
        BLOCK_M, BLOCK_N, CAUSAL, CKV_SCALE_PTR, KPE_SCALE_PTR, TOKEN_GROUP, FP8_CVT,
    )  # fmt: skip

    consumer = (
        k_stages, pe_stages, sc_stages, ready, empty, q_blocks, qpe_smem, inv_smem, q_ready, slots0,
        slots1, stat_bar, l_smem, l_bar, q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr, m_tile, q_start,
        qo_len, rows_total, kv_len, n_begin, n_end, split, num_heads, num_tokens, qk_scale,
        pe_factor, v_scale, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split,
        stride_o_t, stride_o_h, stride_lse_split, stride_lse_t, q_scale_ptr, stride_qs_t,
        q_scale_val,
    )  # fmt: skip
    gl.warp_specialize(
        [(fp8_copier, (k_stages, pe_stages, sc_stages, ready, empty, ckv8, kpe8, scale_arr_ptr,
                    page_base, n_entries, num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end,
                    stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s, stride_sa_p,
                    stride_sa_s, PAGE_SIZE, D_CKV, D_KPE, TOKEN_GROUP, STAGES, COPIER_WARPS,
                    ROPE_16BIT)),
         (_pingpong8_consumer, (consumer, D_CKV, D_KPE, CAUSAL, WRITE_LSE, TOKEN_GROUP, FP8_CVT, STAGES,
                          QK_PARTS, 0, Q_FP8, Q_SCALE, ROPE_16BIT, PV_FP8)),
         (_pingpong8_consumer, (consumer, D_CKV, D_KPE, CAUSAL, WRITE_LSE, TOKEN_GROUP, FP8_CVT, STAGES,
                          QK_PARTS, 1, Q_FP8, Q_SCALE, ROPE_16BIT, PV_FP8))],
        [4, 4],
        [CONSUMER_REGS, CONSUMER_REGS],
    )  # fmt: skip
