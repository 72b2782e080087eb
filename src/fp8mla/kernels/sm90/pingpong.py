"""The ``pingpong`` kernel (variants ``pingpong`` and ``pingpong64``): Hopper (SM90) MLA
attention for many query rows, in Gluon: two consumer warpgroups take alternate KV tiles, so
one's softmax runs while the other's products keep the tensor cores busy.

The wgmma kernel (``wgmma.py``) has both consumer warpgroups compute every step's
``S = Q·Kᵀ`` together, split by tokens: each reads the whole query tile from shared memory
(twice the query bytes per step), and the step runs Q·Kᵀ → row maxima across the two → ``P``
→ P·V with the tensor cores idle during the softmax, and most of a step's time goes to
shared-memory reads (``docs/design/sm90-pingpong.md``).
Here one program owns 64 query rows and runs three warpgroups:

* a **producer** (``producers.kv_producer`` for FP8 pools, converting to fp16, and
  ``packed_producer.kv_producer_rolling`` for the packed sparse rows;
  ``producers.kv_copier`` for 16-bit pools, by ``cp.async``; :func:`pingpong_producer`
  picks one) fills ``NBUF`` = 4 shared buffers of ``BLOCK_N`` = 32 tokens;
* two **consumer** warpgroups (``ROLE`` 0: the default partition, 1: a worker; with FP8
  pools both are workers and the converting producer is the default partition). Tile ``j`` is
  *owned* by warpgroup ``j % 2``: it computes ``S_j [64, 32] = Q·K_jᵀ`` alone (the query read
  once per tile), its online softmax from the running maximum the other published for tile
  ``j - 1``, and publishes tile ``j``'s maximum, rescale factor and ``P_j`` (fp16) in shared
  memory. Each warpgroup accumulates 256 of the 512 output columns over *every* tile:
  ``O = O·α_j + P_j·V_j``, with ``P_j`` as wgmma's register operand on its own tiles and read
  from shared memory on the other's. Each owned tile's products start before the other's
  tile is applied, so its ``S`` lands while that P·V runs, and its softmax runs while the
  other warpgroup's products run.

Ordering, with one ``P`` buffer and one statistics slot: ``P_j`` is written by tile ``j``'s
owner and read only by the other warpgroup, which owns tile ``j + 1`` and writes ``P_{j+1}``
only after its read of ``P_j`` completed; the statistics likewise. A KV buffer is free
once both warpgroups' products of its tile are done (``empty`` counts two arrivals). Each
warpgroup sums the rows of its own tiles' ``P`` (rescaled by every tile's factor); the two
sums are added once, after the loop. Nothing is in flight across a loop iteration's end
(ptxas would serialize every wgmma otherwise).

Shared memory: the query 72 KB, four fp16 KV buffers 144 KB, ``P`` 4 KB, the statistics
1 KB (about 221 KB: one program per SM). Same arguments and results as
``mla_rows_kernel``; ``BLOCK_M`` 64 and ``BLOCK_N`` 32, launched with 4 warps (the other
partitions' 8 warps come on top), a 64-dim RoPE part. Gluon has no interpreter: SM90 only.

``ROPE_16BIT`` (FP8 pools whose rows carry their RoPE part as bf16 values: the sparse path
over the packed ``fp8_ds_mla`` cache, ``dsa/sparse_sm90.py``): the RoPE operands are bf16,
the query's RoPE part staged in bf16 and the rows' RoPE values stored by the producer as they
are; the RoPE product is a wgmma group of its own, so the latent part stays fp16.

**64-token tiles** (``BLOCK_N`` 64, 16-bit pools; the planner's choice for requests of more
than one row tile, whose programs share each KV tile through the L2). The owner's
``S_j [64, 64]`` reads the query once per 64 tokens instead of twice. Two buffers of 64
tokens (the same 144 KB). Each column half of a buffer has its own ``empty`` barrier:

* latent columns 0-255: read by warpgroup 0's products;
* columns 256-511 and the RoPE part: read by warpgroup 1's.

Each half is freed by the one warpgroup that reads it, once that warpgroup's product of the
tile is done (the owner's scores, which read both halves, finish before either product
starts). ``producers.kv_copier_halves`` refills the owner's half first; each half's copies
arrive on its ``ready`` barrier as they land, and the consumer that waits there fences them
to wgmma's async proxy. The owner's ``S_j`` starts on its half before the other's has
arrived. The owner's softmax (``softmax_tile64``) is on the other warpgroup's path: it masks
only the tiles that need it and leaves the row sums until ``P`` is published.

Tile ``j``'s buffer held tile ``j - 2``, owned by the same warpgroup, so its copy can start
only as that warpgroup's own product of tile ``j - 2`` ends. The owner therefore applies the
other's tile ``j - 1`` *before* it starts ``S_j``: waiting for that tile's statistics and
running its product hides the copy. Tile ``-1``'s product waits until tile 0 is in buffer 0.
The query then sits in a ``[1, 64, 512]`` allocation, indexed by ``j >> 30`` (zero, but not
to ptxas). Otherwise ptxas hoists the 32 wgmma descriptors of the query out of the loop into
64 registers, and they spill. The producer is the default partition: a copier of 56
registers, which leaves both consumers 224.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from fp8mla.kernels.sm90.common import (
    CHUNK,
    NEG_INF,
    PRODUCER_WARPS,
    mask_scores,
    softmax_tile64,
    stage_query,
    store_lse,
    store_rows,
    thread_barrier,
    unmasked_end,
)
from fp8mla.kernels.sm90.packed_producer import kv_producer_rolling
from fp8mla.kernels.sm90.producers import kv_copier, kv_copier_halves, kv_producer
from fp8mla.kernels.sm90.request import request_span

BUFFERED = gl.constexpr(128)  # KV tokens in shared memory: NBUF = BUFFERED // BLOCK_N buffers


PRODUCER_REGS = gl.constexpr(80)  # per thread; consumer 0 (the default partition) 232


CONSUMER_REGS = gl.constexpr(192)  # consumer 1


# FP8 pools: the converting producer is the default partition and both consumers are workers
# of CONSUMER_REGS_FP8, so the producer has what they leave (136 registers under Triton 3.6,
# where it needs ~100 to keep a tile's loads and conversions apart; as a worker of 80 or 88 it
# spilled or serialized them). The query then sits in a [1, 64, 512] allocation indexed by
# j >> 30 as for 64-token tiles: consumer 0, a worker, would otherwise hold its hoisted wgmma
# descriptors in registers it does not have.
CONSUMER_REGS_FP8 = gl.constexpr(184 if triton.__version__.startswith("3.6.") else 192)


# 64-token tiles: the producer (a copier, 56 registers) is the default partition and both
# consumers are workers of 224 (S [64, 64] and P take 32 more registers than 32-token tiles)
CONSUMER_REGS_64 = gl.constexpr(224)


@gluon.jit
def pingpong_producer(
    args, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, D_CKV: gl.constexpr,
    D_KPE: gl.constexpr, TOKEN_GROUP: gl.constexpr, FP8_CVT: gl.constexpr,
    WHOLE_TILE: gl.constexpr, NBUF: gl.constexpr, ROPE_16BIT: gl.constexpr = False,
):  # fmt: skip
    """The producer warpgroup, one of four by its pool's dtype and tile: 16-bit tiles copied
    by ``cp.async`` (:func:`kv_copier`; by column halves for 64-token tiles,
    :func:`kv_copier_halves`), FP8 tiles converted to fp16 (:func:`kv_producer`; the packed
    sparse rows by :func:`kv_producer_rolling`; unfenced: the consumers fence them), into
    its ``NBUF`` buffers. ``args``: its run-time values, one tuple."""
    (k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base, n_entries,
     num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s,
     stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s) = args  # fmt: skip
    if BLOCK_N == 64:
        kv_copier_halves(
            k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, page_base, n_entries, num_pages,
            nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s, stride_kpe_p,
            stride_kpe_s, PAGE_SIZE, BLOCK_N, D_CKV, D_KPE, PRODUCER_WARPS, NBUF,
        )  # fmt: skip
    elif ckv_ptr.dtype.element_ty.primitive_bitwidth == 16:
        kv_copier(
            k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, page_base, n_entries, num_pages,
            nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s, stride_kpe_p,
            stride_kpe_s, PAGE_SIZE, BLOCK_N, D_CKV, D_KPE, PRODUCER_WARPS, NBUF,
        )  # fmt: skip
    elif ROPE_16BIT and TOKEN_GROUP and WHOLE_TILE and D_CKV == 4 * CHUNK:
        kv_producer_rolling(
            k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base,
            n_entries, num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p,
            stride_ckv_s, stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s, PAGE_SIZE,
            BLOCK_N, D_CKV, D_KPE, FP8_CVT, NBUF,
        )  # fmt: skip
    else:
        kv_producer(
            k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base,
            n_entries, num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p,
            stride_ckv_s, stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s, PAGE_SIZE,
            BLOCK_N, D_CKV, D_KPE, TOKEN_GROUP, FP8_CVT, NBUF, WHOLE_TILE, ROPE_16BIT, False,
        )  # fmt: skip


@gluon.jit
def _release(empty, j, pred, BLOCK_N: gl.constexpr, ROLE: gl.constexpr):
    """This warpgroup is done with tile ``j``'s buffer: its share of the whole buffer (32-token
    tiles: ``empty`` counts both warpgroups) or, for 64-token tiles, the column half holding
    its output columns (``empty[2b + ROLE]``: nothing else reads it once the tile's scores are
    done)."""
    NBUF: gl.constexpr = BUFFERED // BLOCK_N
    if BLOCK_N == 32:
        mbarrier.arrive(empty.index(j % NBUF), pred=pred)
    else:
        mbarrier.arrive(empty.index(2 * (j % NBUF) + ROLE), pred=pred)


@gluon.jit
def _wait_tile(bar, phase, BLOCK_N: gl.constexpr, CONVERTED: gl.constexpr = False):
    """Wait on a tile's (or tile half's) ``ready`` barrier. Two producers hand tiles over with
    no fence of their own, and their stores are fenced to wgmma's async proxy here: the
    copier of 64-token tiles, whose ``cp.async`` copies arrive by themselves
    (``producers.kv_copier_halves``), and the converting producer of FP8 32-token tiles
    (``CONVERTED``; a fence there would also wait for its loads of the next tiles in
    flight). The other warpgroup, which applies the tile later, needs no fence of its own:
    it waits for the statistics the owner published after this wait and fence (a proxy fence
    anywhere on the chain of release and acquire orders the stores before its products)."""
    mbarrier.wait(bar, phase)
    if BLOCK_N == 64 or CONVERTED:
        fence_async_shared()


@gluon.jit
def _issue_scores(q_smem, qpe_smem, k_bufs, kpe_bufs, ready, j, s_zero, BLOCK_N: gl.constexpr,
                  ROLE: gl.constexpr, CONVERTED: gl.constexpr):  # fmt: skip
    """Start ``S_j = Q·K_jᵀ`` (latent and RoPE parts) once tile ``j`` is in its buffer: two
    wgmma groups; a 64-token tile by column halves, three groups (this warpgroup's own half,
    copied first, as soon as it lands, then the other)."""
    NBUF: gl.constexpr = BUFFERED // BLOCK_N
    buf = j % NBUF
    if BLOCK_N == 32:
        _wait_tile(ready.index(buf), (j // NBUF) & 1, BLOCK_N, CONVERTED)
        if CONVERTED:  # [1, BLOCK_M, D_CKV], indexed by a zero ptxas cannot see (as below)
            q = q_smem.index(j >> 30)
        else:
            q = q_smem
        s = warpgroup_mma(q, k_bufs.index(buf).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)  # fmt: skip
        s = warpgroup_mma(qpe_smem, kpe_bufs.index(buf).permute((1, 0)), s, is_async=True)
    else:
        _wait_tile(ready.index(2 * buf + ROLE), (j // NBUF) & 1, BLOCK_N)
        # q_smem is [1, BLOCK_M, D_CKV], indexed by a zero ptxas cannot see (j < 2^30): the
        # query's 32 wgmma descriptors are then formed in the loop, not hoisted out of it into
        # 64 registers (which spilled)
        q = q_smem.index(j >> 30)
        k = k_bufs.index(buf)
        kpe = kpe_bufs.index(buf)
        # this warpgroup's half (copied first) started before the other half lands
        s = _half_scores(q, qpe_smem, k, kpe, s_zero, ROLE == 1, False)
        _wait_tile(ready.index(2 * buf + 1 - ROLE), (j // NBUF) & 1, BLOCK_N)
        s = _half_scores(q, qpe_smem, k, kpe, s, ROLE == 0, True)
    return s


@gluon.jit
def _half_scores(q, qpe_smem, k, kpe, acc, HI: gl.constexpr, USE_ACC: gl.constexpr):
    """The part of ``S = Q·Kᵀ`` over one column half of a 64-token tile: latent columns
    ``[0, 256)``, or ``[256, 512)`` and the RoPE part (``HI``)."""
    C0: gl.constexpr = 256 * HI
    s = warpgroup_mma(
        q.slice(C0, 256, dim=1), k.slice(C0, 256, dim=1).permute((1, 0)), acc,
        use_acc=USE_ACC, is_async=True,
    )  # fmt: skip
    if HI:
        s = warpgroup_mma(qpe_smem, kpe.permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _apply_remote(o, l_i, r, k_bufs, p_smem, stat_smem, stat_bar, V0: gl.constexpr,
                  HALF: gl.constexpr, BLOCK_N: gl.constexpr, s_rows: gl.constexpr,
                  o_rows: gl.constexpr):  # fmt: skip
    """Tile ``r``, owned by the other warpgroup: wait for its statistics, rescale ``O`` and the
    row sums by its factor and start ``O += P_r·V_r`` (``P_r`` from shared memory, this
    warpgroup's ``HALF`` columns from ``V0``). Returns the product in flight, the row sums and
    tile ``r``'s running maximum. Tile -1 (before warpgroup 0's first tile) is the slot's
    initial state: maximum -inf, factor 1 and ``P`` 0 (times tile 0's values, so a NaN row
    there still turns the output NaN, as it does anyway)."""
    NBUF: gl.constexpr = BUFFERED // BLOCK_N
    mbarrier.wait(stat_bar, r & 1)
    m_r = stat_smem.index(0).load(s_rows)
    alpha = stat_smem.index(1).load(s_rows)
    o = o * gl.convert_layout(alpha, o_rows)[:, None]
    v = k_bufs.index(gl.maximum(r, 0) % NBUF).slice(V0, HALF, dim=1)
    return warpgroup_mma(p_smem, v, o, is_async=True), l_i * alpha, m_r


@gluon.jit
def _finish_remote(o, r, empty, BLOCK_N: gl.constexpr, ROLE: gl.constexpr):
    """Wait for the other warpgroup's tile ``r`` to be applied, then release its buffer (this
    warpgroup's share; tile -1 holds none) and, with it, the ``P`` buffer and statistics
    slot."""
    o = warpgroup_mma_wait(0, deps=[o])
    thread_barrier()
    _release(empty, gl.maximum(r, 0), r >= 0, BLOCK_N, ROLE)
    return o


@gluon.jit
def _softmax_tile(s, m_prev, l_i, n0, n_end, causal_limit, qk_scale, BLOCK_N: gl.constexpr,
                  CAUSAL: gl.constexpr, s_layout: gl.constexpr):  # fmt: skip
    """The online softmax of one 32-token tile's scores from the running maximum ``m_prev``:
    ``P`` (fp32), the rescale factor, the new maximum and the row sums with this tile's added.
    A bad page entry's token (the NaN row) turns its rows NaN."""
    s = mask_scores(s * qk_scale, n0, n_end, causal_limit, BLOCK_N, CAUSAL, s_layout)
    m_new = gl.maximum(m_prev, gl.max(s, axis=1))
    m_use = gl.where(m_new == NEG_INF, 0.0, m_new)
    alpha = gl.exp2(m_prev - m_use)
    p = gl.exp2(s - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _publish(p16, alpha, m_new, p_smem, stat_smem, stat_bar):
    """Tile statistics and ``P`` (the dot dtype) for the other warpgroup."""
    stat_smem.index(0).store(m_new)
    stat_smem.index(1).store(alpha)
    p_smem.store(p16)
    fence_async_shared()
    thread_barrier()
    mbarrier.arrive(stat_bar)


@gluon.jit
def _own_tile(o, l_i, m_i, j, q_smem, qpe_smem, k_bufs, kpe_bufs, ready,
              empty, p_smem, stat_smem, stat_bar, s_zero, n_begin, n_end, mask_from,
              causal_limit, qk_scale, V0: gl.constexpr, HALF: gl.constexpr, BLOCK_N: gl.constexpr,
              CAUSAL: gl.constexpr, DOT_DTYPE: gl.constexpr, ROLE: gl.constexpr,
              s_layout: gl.constexpr, o_layout: gl.constexpr,
              CONVERTED: gl.constexpr):  # fmt: skip
    """Tile ``j``, owned by this warpgroup, after the other's tile ``j - 1``: its scores start,
    the other's tile is applied while they run, the softmax runs while that product does,
    then ``P_j`` is published and applied from registers."""
    NBUF: gl.constexpr = BUFFERED // BLOCK_N
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    if BLOCK_N == 32:
        s = _issue_scores(q_smem, qpe_smem, k_bufs, kpe_bufs, ready, j, s_zero, BLOCK_N, ROLE,
                          CONVERTED)  # fmt: skip
        o, l_i, m_i = _apply_remote(o, l_i, j - 1, k_bufs, p_smem, stat_smem, stat_bar, V0,
                                    HALF, BLOCK_N, s_rows, o_rows)  # fmt: skip
        s = warpgroup_mma_wait(1, deps=[s])
    else:
        # two buffers: tile j's buffer held tile j - 2, this warpgroup's too, so its copy
        # starts only as this warpgroup's last product ends; the other's tile j - 1 is applied
        # first, its wait and product hiding that copy, and released as soon as it is done.
        # Tile -1's product (P = 0) reads buffer 0: not before tile 0 is in it (0 times
        # whatever the shared memory held could be NaN)
        if j == 0:
            _wait_tile(ready.index(0), 0, BLOCK_N)
            _wait_tile(ready.index(1), 0, BLOCK_N)
        o, l_i, m_i = _apply_remote(o, l_i, j - 1, k_bufs, p_smem, stat_smem, stat_bar, V0,
                                    HALF, BLOCK_N, s_rows, o_rows)  # fmt: skip
        s = _issue_scores(q_smem, qpe_smem, k_bufs, kpe_bufs, ready, j, s_zero, BLOCK_N, ROLE,
                          CONVERTED)  # fmt: skip
        # the other's product done (three score groups may still run): its half released
        o = warpgroup_mma_wait(3, deps=[o])
        thread_barrier()
        _release(empty, gl.maximum(j - 1, 0), j >= 1, BLOCK_N, ROLE)
        s = warpgroup_mma_wait(0, deps=[s])
    n0 = n_begin + j * BLOCK_N
    if BLOCK_N == 32:
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, n0, n_end, causal_limit, qk_scale,
                                           BLOCK_N, CAUSAL, s_layout)  # fmt: skip
        p16 = p.to(DOT_DTYPE)
        o = _finish_remote(o, j - 1, empty, BLOCK_N, ROLE)  # applied while the softmax ran
        _publish(p16, alpha, m_i, p_smem, stat_smem, stat_bar)
    else:
        p, alpha, m_i = softmax_tile64(s, m_i, n0, mask_from, n_end, causal_limit, qk_scale,
                                        BLOCK_N, CAUSAL, s_layout)  # fmt: skip
        p16 = p.to(DOT_DTYPE)
        _publish(p16, alpha, m_i, p_smem, stat_smem, stat_bar)
        l_i = l_i * alpha + gl.sum(p, axis=1)
    o = o * gl.convert_layout(alpha, o_rows)[:, None]
    p_op = gl.convert_layout(p16, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    v = k_bufs.index(j % NBUF).slice(V0, HALF, dim=1)
    o = warpgroup_mma_wait(0, deps=[warpgroup_mma(p_op, v, o, is_async=True)])
    thread_barrier()
    _release(empty, j, True, BLOCK_N, ROLE)
    return o, l_i, m_i


@gluon.jit
def _pingpong_consumer(args, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_CKV: gl.constexpr,
                 D_KPE: gl.constexpr, CAUSAL: gl.constexpr, WRITE_LSE: gl.constexpr,
                 ROLE: gl.constexpr, CONVERTED: gl.constexpr):  # fmt: skip
    """Consumer warpgroup ``ROLE``: stages its half of the query rows, owns tiles
    ``ROLE, ROLE + 2, …``, applies every tile to output columns ``[256·ROLE, 256·ROLE + 256)``,
    and stores them as ``O / l`` times the value scale (``ROLE`` 0 also the base-2 LSE).
    ``CONVERTED``: the tiles come from the converting producer, which leaves the owner to
    fence them (:func:`_wait_tile`). ``args``: the run-time values both consumers take, one
    tuple."""
    (k_bufs, kpe_bufs, ready, empty, q_smem, qpe_smem, q_ready, p_smem, stat_smem, stat_bar,
     l_smem, l_bar, q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr, m_tile, q_start, qo_len, rows_total,
     kv_len, n_begin, n_end, split, num_heads, num_tokens, qk_scale, pe_factor, v_scale,
     stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split, stride_o_t, stride_o_h,
     stride_lse_split, stride_lse_t) = args  # fmt: skip
    DOT_DTYPE: gl.constexpr = q_smem.dtype
    HALF: gl.constexpr = D_CKV // 2
    V0: gl.constexpr = ROLE * HALF
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HALF, 16]
    )
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    stage_query(
        q_smem if (BLOCK_N == 32 and not CONVERTED) else q_smem.index(0), qpe_smem, q_nope_ptr,
        q_pe_ptr, m_tile, q_start, rows_total, num_heads,
        num_tokens, pe_factor, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_M, D_CKV,
        D_KPE, ROLE * (BLOCK_M // 2), BLOCK_M // 2, 4,
    )  # fmt: skip
    mbarrier.arrive(q_ready)
    mbarrier.wait(q_ready, 0)  # both halves staged

    rs = m_tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=s_rows)
    causal_limit = kv_len - qo_len + rs // num_heads
    mask_from = unmasked_end(n_end, kv_len, qo_len, m_tile * BLOCK_M, num_heads, CAUSAL)
    m_i = gl.full([BLOCK_M], NEG_INF, gl.float32, layout=s_rows)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=s_rows)
    o = gl.zeros([BLOCK_M, HALF], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    if ROLE == 0:  # the statistics slot and P as "tile -1" (see _apply_remote)
        stat_smem.index(0).store(m_i)
        stat_smem.index(1).store(gl.full([BLOCK_M], 1.0, gl.float32, layout=s_rows))
        p_smem.store(s_zero.to(DOT_DTYPE))
        fence_async_shared()
        thread_barrier()
    for j in range(ROLE, n_tiles, 2):
        o, l_i, m_i = _own_tile(
            o, l_i, m_i, j, q_smem, qpe_smem, k_bufs, kpe_bufs, ready, empty, p_smem, stat_smem,
            stat_bar, s_zero, n_begin, n_end, mask_from, causal_limit, qk_scale, V0, HALF, BLOCK_N,
            CAUSAL, DOT_DTYPE, ROLE, s_layout, o_layout, CONVERTED,
        )  # fmt: skip
    last = n_tiles - 1
    if (last >= 0) & (last % 2 != ROLE):  # the other's last tile
        o, l_i, m_i = _apply_remote(o, l_i, last, k_bufs, p_smem, stat_smem, stat_bar, V0, HALF,
                                    BLOCK_N, s_rows, o_rows)  # fmt: skip
        o = _finish_remote(o, last, empty, BLOCK_N, ROLE)

    # the row sums of both warpgroups' tiles
    l_smem.index(ROLE).store(l_i)
    thread_barrier()
    mbarrier.arrive(l_bar)
    mbarrier.wait(l_bar, 0)
    l_i = l_i + l_smem.index(1 - ROLE).load(s_rows)

    has = l_i > 0.0
    inv_l = gl.where(has, v_scale / gl.where(has, l_i, 1.0), 0.0)
    store_rows(o, inv_l, o_ptr, V0, m_tile, q_start, rows_total, num_heads, num_tokens, split,
                stride_o_split, stride_o_t, stride_o_h, BLOCK_M, o_layout)  # fmt: skip
    if WRITE_LSE and ROLE == 0:
        store_lse(m_i, l_i, lse_ptr, split, q_start, rs, rows_total, num_heads, num_tokens,
                   stride_lse_split, stride_lse_t)  # fmt: skip


@gluon.jit(do_not_specialize=["num_tokens", "num_pages"])
def mla_pingpong_kernel(
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
    WHOLE_TILE: gl.constexpr = True,
    ROPE_16BIT: gl.constexpr = False,
):
    gl.static_assert(BLOCK_M == 64, "64 query rows per program")
    gl.static_assert(BLOCK_N == 32 or BLOCK_N == 64, "32- or 64-token KV tiles")
    gl.static_assert(D_CKV == 512, "the latent dimension is 512")
    gl.static_assert(D_KPE == 64, "the RoPE dimension is 64")
    gl.static_assert(gl.num_warps() == 4, "one consumer warpgroup in the default partition")
    IS16: gl.constexpr = ckv_ptr.dtype.element_ty.primitive_bitwidth == 16
    gl.static_assert(not (IS16 and TOKEN_GROUP), "token-group scales come with FP8 KV")
    gl.static_assert(IS16 or BLOCK_N == 32, "64-token tiles are copied, not converted: 16-bit KV")
    gl.static_assert(not (IS16 and ROPE_16BIT), "a bf16 RoPE part beside FP8 latent bytes")
    # the RoPE operands: bf16 as the packed cache holds them (ROPE_16BIT), else the dot dtype
    PE_DTYPE: gl.constexpr = gl.bfloat16 if ROPE_16BIT else DOT_DTYPE
    NBUF: gl.constexpr = BUFFERED // BLOCK_N

    sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    p_sh: gl.constexpr = gl.NVMMASharedLayout(
        swizzle_byte_width=2 * BLOCK_N, element_bitwidth=16, rank=2
    )
    vec_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    if BLOCK_N == 32 and IS16:
        q_smem = gl.allocate_shared_memory(DOT_DTYPE, [BLOCK_M, D_CKV], sh)
    else:  # indexed by j >> 30 in the loop (_issue_scores)
        q_smem = gl.allocate_shared_memory(DOT_DTYPE, [1, BLOCK_M, D_CKV], sh)
    qpe_smem = gl.allocate_shared_memory(PE_DTYPE, [BLOCK_M, D_KPE], sh)
    k_bufs = gl.allocate_shared_memory(DOT_DTYPE, [NBUF, BLOCK_N, D_CKV], sh)
    kpe_bufs = gl.allocate_shared_memory(PE_DTYPE, [NBUF, BLOCK_N, D_KPE], sh)
    p_smem = gl.allocate_shared_memory(DOT_DTYPE, [BLOCK_M, BLOCK_N], p_sh)
    stat_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M], vec_sh)  # maximum, factor
    l_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M], vec_sh)
    # per buffer (32-token tiles) or per column half of a buffer (64-token tiles): 4 either way
    NBAR: gl.constexpr = NBUF if BLOCK_N == 32 else 2 * NBUF
    ready = gl.allocate_shared_memory(gl.int64, [NBAR, 1], bar_l)
    empty = gl.allocate_shared_memory(gl.int64, [NBAR, 1], bar_l)
    q_ready = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    stat_bar = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    l_bar = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    for i in gl.static_range(NBAR):
        # 64-token tiles: every copier thread's cp.async copies arrive (producers.py)
        mbarrier.init(ready.index(i), count=1 if BLOCK_N == 32 else PRODUCER_WARPS * 32)
        mbarrier.init(empty.index(i), count=2 if BLOCK_N == 32 else 1)
    mbarrier.init(q_ready, count=2)
    mbarrier.init(stat_bar, count=1)
    mbarrier.init(l_bar, count=2)

    m_tile = gl.program_id(0)
    b = gl.program_id(1)
    split = gl.program_id(2)
    (q_start, qo_len, rows_total, kv_len, n_begin, n_end, page_base, n_entries, qk_scale,
     pe_factor, v_scale) = request_span(
        qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr, ckv_scale_ptr, kpe_scale_ptr,
        ckv_scale_val, kpe_scale_val, sm_scale_log2, b, m_tile, split, num_heads, num_indices,
        BLOCK_M, BLOCK_N, CAUSAL, CKV_SCALE_PTR, KPE_SCALE_PTR, TOKEN_GROUP, FP8_CVT,
    )  # fmt: skip

    # run-time values as one tuple per partition kind, compile-time ones beside it (a tuple
    # does not keep them constant)
    consumer = (
        k_bufs, kpe_bufs, ready, empty, q_smem, qpe_smem, q_ready, p_smem, stat_smem, stat_bar,
        l_smem, l_bar, q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr, m_tile, q_start, qo_len, rows_total,
        kv_len, n_begin, n_end, split, num_heads, num_tokens, qk_scale, pe_factor, v_scale,
        stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split, stride_o_t,
        stride_o_h, stride_lse_split, stride_lse_t,
    )  # fmt: skip
    producer = (
        k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base, n_entries,
        num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s,
        stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s,
    )  # fmt: skip
    if BLOCK_N == 32 and IS16:  # consumer 0 the default partition
        gl.warp_specialize(
            [(_pingpong_consumer, (consumer, BLOCK_M, BLOCK_N, D_CKV, D_KPE, CAUSAL, WRITE_LSE, 0,
                                   False)),
             (_pingpong_consumer, (consumer, BLOCK_M, BLOCK_N, D_CKV, D_KPE, CAUSAL, WRITE_LSE, 1,
                                   False)),
             (pingpong_producer, (producer, PAGE_SIZE, BLOCK_N, D_CKV, D_KPE, TOKEN_GROUP, FP8_CVT,
                             WHOLE_TILE, NBUF, ROPE_16BIT))],
            [4, PRODUCER_WARPS],
            [CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip
    else:  # the producer the default partition (the FP8 converter, or the 64-token copier)
        CONVERTS: gl.constexpr = ckv_ptr.dtype.element_ty.primitive_bitwidth == 8
        W_REGS: gl.constexpr = CONSUMER_REGS_FP8 if CONVERTS else CONSUMER_REGS_64
        gl.warp_specialize(
            [(pingpong_producer, (producer, PAGE_SIZE, BLOCK_N, D_CKV, D_KPE, TOKEN_GROUP, FP8_CVT,
                             WHOLE_TILE, NBUF, ROPE_16BIT)),
             (_pingpong_consumer, (consumer, BLOCK_M, BLOCK_N, D_CKV, D_KPE, CAUSAL, WRITE_LSE, 0,
                                   CONVERTS)),
             (_pingpong_consumer, (consumer, BLOCK_M, BLOCK_N, D_CKV, D_KPE, CAUSAL, WRITE_LSE, 1,
                                   CONVERTS))],
            [4, 4],
            [W_REGS, W_REGS],
        )  # fmt: skip
