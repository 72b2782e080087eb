"""Hopper (SM90) MLA attention of FP8 pools for many query rows, in Gluon: the ping-pong order
of ``kernels/mla_pingpong.py`` on 64-token FP8 tiles used as they are.

One program owns 64 query rows (all 128 heads of a token take two programs) and runs three
warpgroups:

* a **copier** (``fp8qk_stage._copier``, the default partition) moves each 64-token tile's
  FP8 rows through the page table into one of ``STAGES`` shared stages by ``cp.async``; no
  registers, no conversion;
* two **consumer** warpgroups (``ROLE`` 0 and 1). Tile ``j`` is *owned* by warpgroup
  ``j % 2``: it computes ``S_j [64, 64] = Q·K_jᵀ`` alone on FP8 tensor cores, its online
  softmax from the running maximum the other published for tile ``j - 1``, and publishes
  tile ``j``'s maximum, rescale factor and ``P_j`` (fp16) in shared memory. Each warpgroup
  accumulates 256 of the 512 output columns over every tile, transposed as in the FP8 × FP8
  decode kernel (``kernels/mla_fp8qk.py``): ``Oᵀ [256, 64 rows] += Vᵀ·Pᵀ`` with ``Vᵀ`` as
  wgmma's register operand, read from the stage's FP8 bytes and converted in registers
  (``mla_fp8qk._value_operand``), and ``Pᵀ`` read from shared memory. So an FP8 tile is never
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
measured LSE errors of 3.9e-3; ``benchmarks/NOTES-2026-12-01.md``, round 15), the RoPE part
apart (its scale differs); the small lo products go first, so that each chain rounds at the
hi products' magnitude only once per hi step (hi first failed the LSE bound of 2e-3).

**Order.** A warpgroup's tile ``j``: its scores first, which need nothing of the other
warpgroup's, so they run while the other scores or applies its own tile; then the running
maximum of tile ``j - 1`` awaited, the softmax, ``P_j`` and the statistics published; then
the other's tile ``j - 1`` applied (``Oᵀ`` rescaled by its factor, ``P_{j-1}·V_{j-1}``
added), then tile ``j``. So the two warpgroups wait on each other only for the softmax's
maximum (H200, 64 × 128 × 4,096, round 32's kernel: 158.5-160.9 µs; applying tile
``j - 1`` before the scores, as the 16-bit ping-pong kernel does, measured 190-193 µs in an
earlier run with the same parts; ``benchmarks/NOTES.md`` round 32; its cycle stamps, round
33, show each warpgroup busy with its own steps, the other's maximum published long before).

Each warpgroup publishes its tiles' ``P`` (two halves) and statistics in ``SLOTS`` = 2 places
of its own (tile ``j`` in ``(j // 2) % 2``), four allocations apart from the other's: its
stores and its loads of the other's values then touch different allocations, and the compiler
puts no barrier of the warpgroup's four warps between them (round 33: with the stage waits of
``_apply_tile`` gone, seven barriers a tile instead of nine, 161.3 → 157.4-158.7 µs). Tile
``j``'s are read by the other warpgroup after it published tile ``j + 1``, and rewritten by the
owner at tile ``j + 4``, after the other published tile ``j + 3``. A stage is free once both
warpgroups applied its tile (``empty`` counts two).

Shared memory for ``STAGES`` = 3: the stages 114 KB (37 KB each with the RoPE part, 1 KB of
token-group scales), the query's hi and lo operands 72 KB, ``P`` 32 KB (about 220 KB: one
program per SM). Same arguments and results as ``_mla_attn_pingpong_kernel``; ``BLOCK_M`` 64,
``BLOCK_N`` 64, FP8 pools (e4m3 or e5m2, as ``FP8_CVT`` names them) with per-tensor or
token-group scales, a 64-dim RoPE part; launched with 4 warps (the consumers' 8 come on top).
On SM90 the planner launches it as a programmatic dependent (``WAIT_PRIOR``; its programs set
up their barriers before the grid ahead of it ends) and it lets its own dependents launch
early (``kernels/grid_dependency.py``). Gluon has no interpreter: SM90 only.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from fp8mla.kernels.fewrows_producer import _BARRIER, BLOCK_N, _stamp
from fp8mla.kernels.fp8qk_stage import SC_L, _copier, _pow2_scale
from fp8mla.kernels.mla_fp8qk import HALF, _store_output, _value_operand
from fp8mla.kernels.mla_pingpong import _softmax_tile64
from fp8mla.kernels.mla_wgmma import (
    NEG_INF,
    _request_span,
    _store_lse,
    _unmasked_end,
)
from fp8mla.kernels.portable import fp8_decode as T
from fp8mla.kernels.portable.grid_dependency import launch_dependents, wait_prior

ROWS = gl.constexpr(64)  # query rows per program: the scores' M, the value products' N
HALF_N = gl.constexpr(32)  # tokens per value product step
SLOTS = gl.constexpr(2)  # each warpgroup's own tiles whose P and statistics are kept
COPIER_WARPS = gl.constexpr(4)
CONSUMER_REGS = gl.constexpr(232)  # each consumer; the copier (the default partition) keeps 40
# a shared-memory view of another shape: ``_reinterpret`` in Triton 3.6, ``reinterpret`` later
_REINTERPRET_PUBLIC = gl.constexpr(hasattr(gl.shared_memory_descriptor, "reinterpret"))


@gluon.jit
def _stage_query8(q_blocks, qpe_smem, inv_smem, q_nope_ptr, q_pe_ptr, q_start, row0, rows_end,
                  num_heads, num_tokens, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
                  D_CKV: gl.constexpr, D_KPE: gl.constexpr, ROLE: gl.constexpr):  # fmt: skip
    """Consumer ``ROLE``'s half of the query staging: slabs ``4·ROLE … 4·ROLE + 3`` of eight
    rows (the program's rows ``row0 + …``; rows from ``rows_end`` on as 0), per row and part a
    power of two ``s`` (``fp8qk_stage._pow2_scale``), ``hi = e4m3(q·s)`` into the hi operand's
    column blocks (``q_blocks[0 : NB]``, ``NB = D_CKV / 128``) and ``lo = e4m3(q·s − hi)`` into
    the lo operand's (``q_blocks[NB : 2 NB]``), the RoPE part likewise into ``qpe_smem``, ``1 / s``
    of both parts into ``inv_smem [2, 64]``.

    One slab's code in a run-time loop, the next slab's rows loaded while one is converted.
    Unrolled, the staging was ~30 KB of instructions per consumer, run once per program (so
    fetched cold), and the second consumer finished ~13,000 cycles after the first: 24,800
    cycles from a consumer's start to both halves staged, against 10,400 as this loop;
    153.7-154.1 µs a call against 146.4-147.1 for a first form of the loop in the same run
    (H200, 64 × 128 × 4,096; ``benchmarks/NOTES.md`` round 34). A run-time slab is stored
    through the operands' swizzle atoms (8 rows × 128 bytes, 1 KB each and in order within a
    column block of ``q_blocks``), each column block loaded and stored apart (a reshape and
    split of one ``[8, 4, 128]`` slab put hi values into the lo blocks)."""
    gl.static_assert(D_CKV == 512, "four column blocks of 128")
    # 8 rows x 128 columns, 8 a thread (the RoPE part's 64 columns: each element held by two)
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    # the operands as swizzle atoms of 8 rows x 128 bytes: block b's rows 8w ... at 8b + w
    if _REINTERPRET_PUBLIC:
        atoms = q_blocks.reinterpret(gl.float8e4nv, [8 * 8, 8, 128], q_blocks.type.layout)
        pe_atoms = qpe_smem.reinterpret(gl.float8e4nv, [2 * 8, 8, D_KPE], qpe_smem.type.layout)
        inv8 = inv_smem.reinterpret(gl.float32, [2 * 8, 8], inv_smem.type.layout)
    else:
        atoms = q_blocks._reinterpret(gl.float8e4nv, [8 * 8, 8, 128], q_blocks.type.layout)
        pe_atoms = qpe_smem._reinterpret(gl.float8e4nv, [2 * 8, 8, D_KPE], qpe_smem.type.layout)
        inv8 = inv_smem._reinterpret(gl.float32, [2 * 8, 8], inv_smem.type.layout)
    a = (q_nope_ptr, q_start, row0, rows_end, num_heads, num_tokens, stride_qn_t, stride_qn_h)
    pa = (q_pe_ptr, q_start, row0, rows_end, num_heads, num_tokens, stride_qp_t, stride_qp_h)
    w = 4 * ROLE
    x0 = _rows8(a, w, 0, 128, ld)
    x1 = _rows8(a, w, 128, 128, ld)
    x2 = _rows8(a, w, 256, 128, ld)
    x3 = _rows8(a, w, 384, 128, ld)
    p = _rows8(pa, w, 0, D_KPE, ld)
    for w in range(4 * ROLE, 4 * ROLE + 4):
        n0 = _rows8(a, w + 1, 0, 128, ld)
        n1 = _rows8(a, w + 1, 128, 128, ld)
        n2 = _rows8(a, w + 1, 256, 128, ld)
        n3 = _rows8(a, w + 1, 384, 128, ld)
        pn = _rows8(pa, w + 1, 0, D_KPE, ld)
        x0 = x0.to(gl.float32)
        x1 = x1.to(gl.float32)
        x2 = x2.to(gl.float32)
        x3 = x3.to(gl.float32)
        m01 = gl.maximum(gl.max(gl.abs(x0), axis=1), gl.max(gl.abs(x1), axis=1))
        m23 = gl.maximum(gl.max(gl.abs(x2), axis=1), gl.max(gl.abs(x3), axis=1))
        s = _pow2_scale(gl.maximum(m01, m23))
        _stage_block(atoms, x0, s, w)
        _stage_block(atoms, x1, s, 8 + w)
        _stage_block(atoms, x2, s, 16 + w)
        _stage_block(atoms, x3, s, 24 + w)
        inv8.index(w).store(1.0 / s)
        p = p.to(gl.float32)
        s = _pow2_scale(gl.max(gl.abs(p), axis=1))
        _stage_block(pe_atoms, p, s, w)
        inv8.index(8 + w).store(1.0 / s)
        x0 = n0
        x1 = n1
        x2 = n2
        x3 = n3
        p = pn


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
def _chain(q_blocks, z, kt, c0: gl.constexpr, W: gl.constexpr, s_layout: gl.constexpr):
    """One part of the scores in flight: columns ``[c0, c0 + W)`` of the lo operand, then of
    the hi operand (column blocks of 128 in ``q_blocks``: hi ``[0, NB)``, lo ``[NB, 2 NB)``;
    ``z`` is 0), against the same key columns, one accumulator (two wgmma groups). The small
    lo products first: the tensor cores' reduced-precision accumulation then rounds at the hi
    products' magnitude only once per hi step."""
    NB: gl.constexpr = q_blocks.shape[0] // 2
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    lo = q_blocks.index(z + NB + c0 // 128).slice(c0 % 128, W, dim=1)
    hi = q_blocks.index(z + c0 // 128).slice(c0 % 128, W, dim=1)
    a = warpgroup_mma(lo, kt.slice(c0, W, dim=0), s_zero, use_acc=False, is_async=True)
    return warpgroup_mma(hi, kt.slice(c0, W, dim=0), a, is_async=True)


@gluon.jit
def _group_scale(sc_stages, st, g: gl.constexpr, tok_l: gl.constexpr):
    """The token-group scale of latent columns ``[128g, 128g + 128)`` for the stage's 64
    tokens, along ``S``'s columns."""
    sc = sc_stages.index(st).load(SC_L)
    col = gl.arange(0, 4, layout=gl.SliceLayout(0, SC_L))[None, :]
    return gl.convert_layout(gl.sum(gl.where(col == g, sc, 0.0), axis=1), tok_l)


@gluon.jit
def _scores8(q_blocks, qpe_smem, k_stages, pe_stages, sc_stages, st, z, pe_ratio,
             PARTS: gl.constexpr, D_CKV: gl.constexpr, TOKEN_GROUP: gl.constexpr,
             s_layout: gl.constexpr, PROBE: gl.constexpr = 0):  # fmt: skip
    """``S [64 rows, 64 tokens]`` of stage ``st`` in units of the latent part's scale (the
    caller multiplies by it): the RoPE part times ``pe_ratio`` (its scale over the latent
    part's, per row) plus the latent part in ``PARTS`` chains, each awaited and added in fp32
    (times its tokens' group scales where ``TOKEN_GROUP``). (A chain started before the one
    before it is added holds a second accumulator: 1.1 KB spilled beside ``Oᵀ``.)"""
    W: gl.constexpr = D_CKV // PARTS
    tok_l: gl.constexpr = gl.SliceLayout(0, s_layout)
    if PROBE & 1:  # measurement only: the tile without its scores' products
        return gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout) + pe_ratio[:, None]
    kt = k_stages.index(st).permute((1, 0))  # [512, 64 tokens], K-major
    pt = pe_stages.index(st).permute((1, 0))
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    acc = warpgroup_mma(qpe_smem.index(z + 1), pt, s_zero, use_acc=False, is_async=True)
    acc = warpgroup_mma(qpe_smem.index(z), pt, acc, is_async=True)
    s = warpgroup_mma_wait(0, deps=[acc]) * pe_ratio[:, None]
    for g in gl.static_range(PARTS):
        a = warpgroup_mma_wait(0, deps=[_chain(q_blocks, z, kt, g * W, W, s_layout)])
        if TOKEN_GROUP:
            s = s + a * _group_scale(sc_stages, st, (g * W) // 128, tok_l)[None, :]
        else:
            s = s + a
    return s


@gluon.jit
def _apply(o, k_stages, sc_stages, p_halves, st, sl, TOKEN_GROUP: gl.constexpr,
           FP8_CVT: gl.constexpr, ROLE: gl.constexpr, a_l: gl.constexpr,
           PROBE: gl.constexpr = 0):  # fmt: skip
    """``Oᵀ += Vᵀ·Pᵀ`` for the tile in stage ``st`` whose ``P`` halves are in slot ``sl`` of
    ``p_halves``: this consumer's 256 value columns, both 32-token operands built from the
    stage's FP8 bytes first (their loads in flight together), then both products issued and
    awaited once. (H200, 64 × 128 × 4,096, same runs: 153.5-156.2 µs against 157.4-158.7 for
    each step's operand built once the step before is done, its registers free again;
    benchmarks/NOTES.md round 33.)"""
    a0 = _value_operand(k_stages, sc_stages, st, 0, ROLE, TOKEN_GROUP, FP8_CVT, a_l, PROBE)
    a1 = _value_operand(k_stages, sc_stages, st, 1, ROLE, TOKEN_GROUP, FP8_CVT, a_l, PROBE)
    o = warpgroup_mma(a0, p_halves[0].index(sl).permute((1, 0)), o, is_async=True)
    o = warpgroup_mma(a1, p_halves[1].index(sl).permute((1, 0)), o, is_async=True)
    return warpgroup_mma_wait(0, deps=[o, a0, a1])[0]


@gluon.jit
def _apply_tile(o, r, alpha, k_stages, sc_stages, empty, owner,
                STAGES: gl.constexpr, SLOTS: gl.constexpr, TOKEN_GROUP: gl.constexpr,
                FP8_CVT: gl.constexpr, ROLE: gl.constexpr, o_cols: gl.constexpr,
                a_l: gl.constexpr, PROBE: gl.constexpr = 0):  # fmt: skip
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
               FP8_CVT, ROLE, a_l, PROBE)  # fmt: skip
    _BARRIER()
    mbarrier.arrive(empty.index(st))
    return o


@gluon.jit
def _published(r, owner, stat_bar, SLOTS: gl.constexpr, s_rows: gl.constexpr):
    """Tile ``r``'s running maximum and rescale factor once its owner published them."""
    mbarrier.wait(stat_bar, r & 1)
    sl = (r // 2) % SLOTS
    return owner[2].index(sl).load(s_rows), owner[3].index(sl).load(s_rows)


@gluon.jit
def _own_tile(o, l_i, m_i, j, q_blocks, qpe_smem, k_stages, pe_stages, sc_stages, ready, empty,
              mine, theirs, stat_bar, nope_scale, pe_ratio, n_begin, n_end, mask_from,
              causal_limit, STAGES: gl.constexpr, SLOTS: gl.constexpr, PARTS: gl.constexpr,
              D_CKV: gl.constexpr, CAUSAL: gl.constexpr, TOKEN_GROUP: gl.constexpr,
              FP8_CVT: gl.constexpr, ROLE: gl.constexpr,
              s_layout: gl.constexpr, s_rows: gl.constexpr, o_cols: gl.constexpr,
              a_l: gl.constexpr, PROBE: gl.constexpr = 0, trace_ptr=None):  # fmt: skip
    """Tile ``j``, owned by this warpgroup: its scores (which need nothing of the other's, so
    they run while the other warpgroup scores or applies its own tile), then the running
    maximum of tile ``j - 1`` awaited, the online softmax (only a tile that reaches
    ``mask_from`` is masked; a bad page entry's NaN turns its rows NaN), ``P_j`` and the
    statistics published, and tiles ``j - 1`` (the other's) and ``j`` applied."""
    st = j % STAGES
    _stamp(trace_ptr, 1 + ROLE, j, 0, PROBE)
    mbarrier.wait(ready.index(st), (j // STAGES) & 1)
    fence_async_shared()  # the copier's cp.async bytes, to wgmma's async proxy
    _stamp(trace_ptr, 1 + ROLE, j, 1, PROBE)
    # the query's descriptors formed here, not hoisted out of the loop (j >> 30 is 0)
    s = _scores8(q_blocks, qpe_smem, k_stages, pe_stages, sc_stages, st, j >> 30, pe_ratio,
                 PARTS, D_CKV, TOKEN_GROUP, s_layout, PROBE)  # fmt: skip
    _stamp(trace_ptr, 1 + ROLE, j, 2, PROBE)
    if j >= 1:  # the other's tile j - 1: its maximum, and its factor for the row sums
        m_i, alpha_r = _published(j - 1, theirs, stat_bar, SLOTS, s_rows)
        l_i = l_i * alpha_r
    _stamp(trace_ptr, 1 + ROLE, j, 3, PROBE)
    # (the scale per row is positive: the maximum of the unscaled scores, scaled after)
    p, alpha, m_new = _softmax_tile64(s, m_i, n_begin + j * BLOCK_N, mask_from, n_end,
                                      causal_limit, nope_scale, BLOCK_N, CAUSAL, s_layout,
                                      True)  # fmt: skip
    sl = (j // 2) % SLOTS
    p0, p1 = gl.split(gl.permute(gl.reshape(p.to(gl.float16), [ROWS, 2, HALF_N]), (0, 2, 1)))
    mine[0].index(sl).store(p0)
    mine[1].index(sl).store(p1)
    mine[2].index(sl).store(m_new)
    mine[3].index(sl).store(alpha)
    fence_async_shared()
    l_i = l_i * alpha + gl.sum(p, axis=1)
    _BARRIER()
    mbarrier.arrive(stat_bar)
    _stamp(trace_ptr, 1 + ROLE, j, 4, PROBE)
    if j >= 1:  # the other's tile j - 1, published before this one
        o = _apply_tile(o, j - 1, None, k_stages, sc_stages, empty, theirs,
                        STAGES, SLOTS, TOKEN_GROUP, FP8_CVT, ROLE, o_cols, a_l,
                        PROBE)  # fmt: skip
    _stamp(trace_ptr, 1 + ROLE, j, 5, PROBE)
    o = _apply_tile(o, j, alpha, k_stages, sc_stages, empty, mine, STAGES,
                    SLOTS, TOKEN_GROUP, FP8_CVT, ROLE, o_cols, a_l, PROBE)  # fmt: skip
    _stamp(trace_ptr, 1 + ROLE, j, 6, PROBE)
    return o, l_i, m_new


@gluon.jit
def _pp8_consumer(args, D_CKV: gl.constexpr, D_KPE: gl.constexpr, CAUSAL: gl.constexpr,
                  WRITE_LSE: gl.constexpr, TOKEN_GROUP: gl.constexpr, FP8_CVT: gl.constexpr,
                  STAGES: gl.constexpr, PARTS: gl.constexpr, ROLE: gl.constexpr,
                  PROBE: gl.constexpr):  # fmt: skip
    """Consumer warpgroup ``ROLE``: stages its half of the query rows, owns tiles ``ROLE,
    ROLE + 2, …``, applies every tile to output columns ``256·ROLE + π(m)``
    (``mla_fp8qk._store_output``), and stores them as ``O / l`` times the value scale
    (``ROLE`` 0 also the base-2 LSE). ``args``: the run-time values, one tuple."""
    (k_stages, pe_stages, sc_stages, ready, empty, q_blocks, qpe_smem, inv_smem, q_ready, slots0,
     slots1, stat_bar, l_smem, l_bar, q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr, m_tile, q_start,
     qo_len, rows_total, kv_len, n_begin, n_end, split, num_heads, num_tokens, qk_scale,
     pe_factor, v_scale, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split,
     stride_o_t, stride_o_h, stride_lse_split, stride_lse_t, trace_ptr) = args  # fmt: skip
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, ROWS, 16]
    )
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_cols: gl.constexpr = gl.SliceLayout(0, o_layout)  # along the query rows (N)

    _stamp(trace_ptr, 1 + ROLE, 0, 7, PROBE)
    _stamp(trace_ptr, 0, 0, 4 * ROLE, PROBE, True)
    if ROLE == 0:  # P and statistics: this warpgroup's own tiles', and the other's
        mine = slots0
        theirs = slots1
    else:
        mine = slots1
        theirs = slots0
    row0 = m_tile * ROWS
    rows_end = gl.minimum(rows_total, row0 + ROWS)
    _stage_query8(q_blocks, qpe_smem, inv_smem, q_nope_ptr, q_pe_ptr, q_start, row0, rows_end,
                  num_heads, num_tokens, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
                  D_CKV, D_KPE, ROLE)  # fmt: skip
    _stamp(trace_ptr, 1 + ROLE, 3, 7, PROBE)
    fence_async_shared()
    _BARRIER()
    mbarrier.arrive(q_ready)
    mbarrier.wait(q_ready, 0)  # both halves staged
    _stamp(trace_ptr, 1 + ROLE, 4, 7, PROBE)
    inv_s = inv_smem.index(0).load(s_rows)
    # the latent part's products to log2 units, per row; the RoPE part's relative to it
    nope_scale = inv_s * qk_scale
    pe_ratio = inv_smem.index(1).load(s_rows) / inv_s * pe_factor

    rs = row0 + gl.arange(0, ROWS, layout=s_rows)
    causal_limit = kv_len - qo_len + rs // num_heads
    mask_from = _unmasked_end(n_end, kv_len, qo_len, row0, num_heads, CAUSAL)
    m_i = gl.full([ROWS], NEG_INF, gl.float32, layout=s_rows)
    l_i = gl.zeros([ROWS], gl.float32, layout=s_rows)
    o = gl.zeros([HALF, ROWS], gl.float32, layout=o_layout)
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    _stamp(trace_ptr, 1 + ROLE, 5, 7, PROBE)
    for j in range(ROLE, n_tiles, 2):
        o, l_i, m_i = _own_tile(
            o, l_i, m_i, j, q_blocks, qpe_smem, k_stages, pe_stages, sc_stages, ready, empty,
            mine, theirs, stat_bar, nope_scale, pe_ratio, n_begin, n_end, mask_from,
            causal_limit, STAGES, SLOTS, PARTS, D_CKV, CAUSAL, TOKEN_GROUP, FP8_CVT, ROLE,
            s_layout, s_rows, o_cols, a_l, PROBE, trace_ptr,
        )  # fmt: skip
    last = n_tiles - 1
    if (last >= 0) & (last % 2 != ROLE):  # the other's last tile
        m_i, alpha_r = _published(last, theirs, stat_bar, SLOTS, s_rows)
        l_i = l_i * alpha_r
        o = _apply_tile(o, last, None, k_stages, sc_stages, empty, theirs, STAGES,
                        SLOTS, TOKEN_GROUP, FP8_CVT, ROLE, o_cols, a_l, PROBE)  # fmt: skip
    _stamp(trace_ptr, 1 + ROLE, 1, 7, PROBE)
    _stamp(trace_ptr, 0, 0, 4 * ROLE + 1, PROBE, True)

    # the row sums of both warpgroups' tiles
    l_smem.index(ROLE).store(l_i)
    _BARRIER()
    mbarrier.arrive(l_bar)
    mbarrier.wait(l_bar, 0)
    l_o = l_smem.index(0).load(o_cols) + l_smem.index(1).load(o_cols)
    has = l_o > 0.0
    inv_l = gl.where(has, v_scale / gl.where(has, l_o, 1.0), 0.0)
    _store_output(
        o * inv_l[None, :], o_ptr, q_start, rows_total, split, num_heads, num_tokens,
        stride_o_split, stride_o_t, stride_o_h, ROLE, ROWS, True, 0, None,
    )  # fmt: skip
    if WRITE_LSE and ROLE == 0:
        l_t = l_i + l_smem.index(1).load(s_rows)
        _store_lse(m_i, l_t, lse_ptr, split, q_start, rs, rows_total, num_heads, num_tokens,
                   stride_lse_split, stride_lse_t)  # fmt: skip
    _stamp(trace_ptr, 1 + ROLE, 2, 7, PROBE)
    _stamp(trace_ptr, 0, 0, 4 * ROLE + 2, PROBE, True)


@gluon.jit(do_not_specialize=["num_tokens", "num_pages"])
def _mla_attn_pp8_kernel(
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
    # their reduced FP8 accumulation precision) and added to the others in fp32 (in one A/B
    # at 64 × 128 × 4,096, an earlier order: 8 parts 175.8-176.9 µs, 4 parts 169.2-170.9;
    # the same errors, LSE within 2e-3 on the GPU suite)
    QK_PARTS: gl.constexpr = 4,
    # measurement only (benchmarks/probe_manyrows.py): 8 the cycle stamps into ``trace_ptr``
    # (fewrows_producer._stamp: parts 1-2 the consumers, 3 the copier, 0 the consumers'
    # nanosecond stamps of their start, loop end and stores), 1 the tiles without
    # their scores' products, 2 every tile from the pool's first rows (L2 hits), 128 the value
    # products without their operands' loads (wrong answers but for 8)
    PROBE: gl.constexpr = 0,
    trace_ptr=None,
):
    gl.static_assert(BLOCK_M == 64, "64 query rows per program")
    gl.static_assert(BLOCK_N == 64, "64 KV tokens per tile")
    gl.static_assert(D_CKV == 2 * HALF, "the latent dimension is 512")
    gl.static_assert(D_KPE == 64, "the RoPE dimension is 64")
    gl.static_assert(
        D_CKV // QK_PARTS <= 128, "a scores part within one column block (and scale group)"
    )
    gl.static_assert(gl.num_warps() == 4, "four warps in the default partition")
    gl.static_assert(
        FP8_CVT == T.CVT_PTX_E4M3 or FP8_CVT == T.CVT_PTX_E5M2, "FP8 bytes read as e4m3 or e5m2"
    )
    KV8: gl.constexpr = gl.float8e4nv if FP8_CVT == T.CVT_PTX_E4M3 else gl.float8e5
    ckv8 = ckv_ptr.to(gl.pointer_type(KV8), bitcast=True)
    kpe8 = kpe_ptr.to(gl.pointer_type(KV8), bitcast=True)

    k_sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    pe_sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    p_sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    vec_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    vec2_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    k_stages = gl.allocate_shared_memory(KV8, [STAGES, BLOCK_N, D_CKV], k_sh)
    pe_stages = gl.allocate_shared_memory(KV8, [STAGES, BLOCK_N, D_KPE], pe_sh)
    sc_stages = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N, 4], vec2_sh)
    # the query's hi and lo operands in column blocks of 128: hi [0, 4), lo [4, 8)
    q_blocks = gl.allocate_shared_memory(gl.float8e4nv, [2 * D_CKV // 128, ROWS, 128], k_sh)
    qpe_smem = gl.allocate_shared_memory(gl.float8e4nv, [2, ROWS, D_KPE], pe_sh)
    inv_smem = gl.allocate_shared_memory(gl.float32, [2, ROWS], vec_sh)
    # each warpgroup's P (two halves) and statistics (maximum, factor) of its last SLOTS
    # tiles, each in an allocation of its own: stores to one, loads of another, no barrier
    slots0 = (
        gl.allocate_shared_memory(gl.float16, [SLOTS, ROWS, HALF_N], p_sh),
        gl.allocate_shared_memory(gl.float16, [SLOTS, ROWS, HALF_N], p_sh),
        gl.allocate_shared_memory(gl.float32, [SLOTS, ROWS], vec_sh),
        gl.allocate_shared_memory(gl.float32, [SLOTS, ROWS], vec_sh),
    )
    slots1 = (
        gl.allocate_shared_memory(gl.float16, [SLOTS, ROWS, HALF_N], p_sh),
        gl.allocate_shared_memory(gl.float16, [SLOTS, ROWS, HALF_N], p_sh),
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
    _BARRIER()

    if WAIT_PRIOR:
        wait_prior()
    # the grid launched as this one's programmatic dependent (the split merge, the next
    # layer's call) may be scheduled from now on: its programs wait on the SMs this grid
    # leaves idle or has ended on (one program per SM), set up, instead of being launched
    # after this grid's end (H200, 64 × 128 × 4,096, same runs: 145.9 and 150.8 µs a call
    # against 147.0 and 152.3 without; benchmarks/NOTES.md round 35)
    launch_dependents()
    m_tile = gl.program_id(0)
    b = gl.program_id(1)
    split = gl.program_id(2)
    (q_start, qo_len, rows_total, kv_len, n_begin, n_end, page_base, n_entries, qk_scale,
     pe_factor, v_scale) = _request_span(
        qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr, ckv_scale_ptr, kpe_scale_ptr,
        ckv_scale_val, kpe_scale_val, sm_scale_log2, b, m_tile, split, num_heads, num_indices,
        BLOCK_M, BLOCK_N, CAUSAL, CKV_SCALE_PTR, KPE_SCALE_PTR, TOKEN_GROUP, FP8_CVT,
    )  # fmt: skip

    consumer = (
        k_stages, pe_stages, sc_stages, ready, empty, q_blocks, qpe_smem, inv_smem, q_ready, slots0,
        slots1, stat_bar, l_smem, l_bar, q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr, m_tile, q_start,
        qo_len, rows_total, kv_len, n_begin, n_end, split, num_heads, num_tokens, qk_scale,
        pe_factor, v_scale, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split,
        stride_o_t, stride_o_h, stride_lse_split, stride_lse_t, trace_ptr,
    )  # fmt: skip
    gl.warp_specialize(
        [(_copier, (k_stages, pe_stages, sc_stages, ready, empty, ckv8, kpe8, scale_arr_ptr,
                    page_base, n_entries, num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end,
                    stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s, stride_sa_p,
                    stride_sa_s, PAGE_SIZE, D_CKV, D_KPE, TOKEN_GROUP, STAGES, COPIER_WARPS, PROBE,
                    trace_ptr)),
         (_pp8_consumer, (consumer, D_CKV, D_KPE, CAUSAL, WRITE_LSE, TOKEN_GROUP, FP8_CVT, STAGES,
                          QK_PARTS, 0, PROBE)),
         (_pp8_consumer, (consumer, D_CKV, D_KPE, CAUSAL, WRITE_LSE, TOKEN_GROUP, FP8_CVT, STAGES,
                          QK_PARTS, 1, PROBE))],
        [4, 4],
        [CONSUMER_REGS, CONSUMER_REGS],
    )  # fmt: skip
