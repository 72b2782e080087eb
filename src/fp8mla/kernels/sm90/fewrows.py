"""The ``fewrows`` kernel: Hopper (SM90) MLA decode for few query rows (≤ 32 per request), in
Gluon: KV tokens as the wgmma M dimension, the query rows as N.

A decode request of a tensor-parallel MLA model has 16–32 query rows (heads × query tokens).
A tile of 64 query rows would waste half or more of every tensor-core instruction, and the
Triton kernels' 16-row ``mma.sync`` tiles are bound by instruction issue, not by memory. Here
every product is computed transposed, so that the 64 KV tokens of a tile fill wgmma's M:

* ``Sᵀ [64, R] = K [64, 576] · Qᵀ [576, R]`` — the converted KV tile and the query tile, both
  K-major in shared memory;
* ``Oᵀ [512, R] += Vᵀ [512, 64] · Pᵀ [64, R]`` — the same KV tile read MN-major as the
  values (``V`` is the latent part of ``K``).

One program owns all ``R`` (16 or 32) rows of one request over one KV split, and runs three
partitions:

* a **producer** (``PRODUCER_WARPS``) gathers each 64-token FP8 tile through the page table,
  converts it to fp16 into one of two shared buffers, and prefetches the next tile's rows into
  the L2; page ids outside the cache are never read: such a token reads a NaN row the launcher
  keeps instead, so the rows that attend to it are NaN, not a quiet finite answer. For 16-bit
  pools one producer copies each tile as it is (``cp.async``, two tiles in flight) and the
  products run in the pool's dtype;
* the **softmax warpgroup** (the default partition) computes ``Sᵀ``, the online softmax over
  the tile's tokens (the M dimension, across its four warps), hands ``Pᵀ`` and the rescale
  factor to the other warpgroup through shared memory, and accumulates output columns
  0–255;
* the **value warpgroup** accumulates output columns 256–511 from the same ``Pᵀ``.

Shared memory for R = 32: two fp16 KV tiles 144 KB, the query 36 KB, two ``Pᵀ`` buffers 8 KB
(about 190 KB: one program per SM). Same arguments and results as ``mla_rows_kernel``
(``portable/rows.py``) plus the bounds of the cache and of the index array; FP8 KV with
a 64-dim RoPE part; launched with 4 warps (the other partitions' warps come on top). Gluon has
no interpreter: this kernel runs on SM90 GPUs only.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from fp8mla.kernels.sm90.common import (
    BLOCK_N,
    CHUNK,
    NEG_INF,
    launch_dependents,
    store_lse,
    thread_barrier,
    wait_prior,
)
from fp8mla.kernels.sm90.producers import kv_copier, kv_producer_alternate
from fp8mla.kernels.sm90.request import request_span

HALF = gl.constexpr(256)  # output columns per consumer warpgroup


NUM_BUF = gl.constexpr(2)  # fp16 KV tiles in flight


@gluon.jit
def _stage_query_t(
    q_smem, qpe_smem, q_nope_ptr, q_pe_ptr, q_start, rows_total, num_heads, num_tokens,
    pe_factor, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
    BLOCK_R: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr,
):  # fmt: skip
    """The request's query rows (row = token × heads + head) into shared memory as fp16,
    ``q_pe`` times ``pe_factor``; rows past ``rows_total`` (or past the query tensor) as 0."""
    q_ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0])
    pe_ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    r = gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, q_ld))
    tok = q_start + r // num_heads
    r_ok = (r < rows_total) & (tok < num_tokens)
    q_rows = q_nope_ptr + tok.to(gl.int64) * stride_qn_t + (r % num_heads) * stride_qn_h
    for c in gl.static_range(D_CKV // CHUNK):
        dc = c * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, q_ld))
        q = gl.load(q_rows[:, None] + dc[None, :], mask=r_ok[:, None], other=0.0)
        q_smem.slice(c * CHUNK, CHUNK, dim=1).store(q.to(q_smem.dtype))
    rp = gl.arange(0, BLOCK_R, layout=gl.SliceLayout(1, pe_ld))
    tok_p = q_start + rp // num_heads
    rp_ok = (rp < rows_total) & (tok_p < num_tokens)
    qp_rows = q_pe_ptr + tok_p.to(gl.int64) * stride_qp_t + (rp % num_heads) * stride_qp_h
    e = gl.arange(0, D_KPE, layout=gl.SliceLayout(0, pe_ld))
    qp = gl.load(qp_rows[:, None] + e[None, :], mask=rp_ok[:, None], other=0.0)
    qpe_smem.store((qp.to(gl.float32) * pe_factor).to(qpe_smem.dtype))
    fence_async_shared()
    thread_barrier()


@gluon.jit
def _store_out_t(
    o, inv_l, o_ptr, split, q_start, rows_total, num_heads, num_tokens, col0,
    stride_o_split, stride_o_t, stride_o_h, layout: gl.constexpr, BLOCK_R: gl.constexpr,
):  # fmt: skip
    """``Oᵀ [HALF, R]`` times ``inv_l`` per row into columns ``col0 + [0, HALF)`` of the rows'
    outputs (each thread's 8 consecutive columns of one row land in one 32-byte sector)."""
    r = gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, layout))
    tok = q_start + r // num_heads
    r_ok = (r < rows_total) & (tok < num_tokens)
    base = o_ptr + split * stride_o_split + tok.to(gl.int64) * stride_o_t
    base += (r % num_heads) * stride_o_h + col0
    dcol = gl.arange(0, HALF, layout=gl.SliceLayout(1, layout))
    out = o * inv_l[None, :]
    gl.store(base[None, :] + dcol[:, None], out.to(o_ptr.dtype.element_ty), mask=r_ok[None, :])


@gluon.jit
def _softmax_wg(
    k_bufs, kpe_bufs, ready, empty, q_smem, qpe_smem, p_smem, a_smem, p_ready, p_free,
    stat_smem, stat_ready,
    q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr, q_start, qo_len, rows_total, kv_len, n_begin, n_end,
    split, num_heads, num_tokens, qk_scale, pe_factor, v_scale,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split, stride_o_t, stride_o_h,
    stride_lse_split, stride_lse_t,
    BLOCK_R: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr, CAUSAL: gl.constexpr,
    WRITE_LSE: gl.constexpr, COL_SOFTMAX: gl.constexpr,
):  # fmt: skip
    """The default partition: ``Sᵀ``, the online softmax over each tile's tokens, ``Pᵀ`` and the
    rescale factor to the value warpgroup, output columns 0–255, the LSE, and the row maxima and
    sums the value warpgroup's epilogue needs."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_R, 16]
    )
    row_l: gl.constexpr = gl.SliceLayout(0, mma)  # along the query rows (N)
    if COL_SOFTMAX:  # each thread: BLOCK_N / T0 tokens of one column (query row) of Sᵀ
        T1: gl.constexpr = BLOCK_R // 4
        T0: gl.constexpr = 32 // T1
        sm: gl.constexpr = gl.BlockedLayout([BLOCK_N // T0, 1], [T0, T1], [1, 4], [0, 1])
    else:
        sm: gl.constexpr = mma
    tok_l: gl.constexpr = gl.SliceLayout(1, sm)  # along the KV tokens (M)
    srow_l: gl.constexpr = gl.SliceLayout(0, sm)  # along the query rows in the softmax
    _stage_query_t(
        q_smem, qpe_smem, q_nope_ptr, q_pe_ptr, q_start, rows_total, num_heads, num_tokens,
        pe_factor, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_R, D_CKV, D_KPE,
    )  # fmt: skip
    r = gl.arange(0, BLOCK_R, layout=row_l)
    causal_limit = kv_len - qo_len + gl.arange(0, BLOCK_R, layout=srow_l) // num_heads
    m_i = gl.full([BLOCK_R], NEG_INF, gl.float32, layout=srow_l)
    s_zero = gl.zeros([BLOCK_N, BLOCK_R], gl.float32, layout=mma)
    # row sums kept per thread ([64, R], each thread its own tokens): summed once after the loop
    l_acc = gl.zeros([BLOCK_N, BLOCK_R], gl.float32, layout=sm)
    o = gl.zeros([HALF, BLOCK_R], gl.float32, layout=mma)
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    for j in range(n_tiles):
        buf = j % NUM_BUF
        phase = (j // NUM_BUF) & 1
        mbarrier.wait(ready.index(buf), phase)
        k_smem = k_bufs.index(buf)
        # -- sᵀ = k·qᵀ --
        s = warpgroup_mma(k_smem, q_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(kpe_bufs.index(buf), qpe_smem.permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])
        if COL_SOFTMAX:
            s = gl.convert_layout(s, sm)
        # -- online softmax over the tile's tokens (a bad page entry's NaN where visible) --
        pos = n_begin + j * BLOCK_N + gl.arange(0, BLOCK_N, layout=tok_l)
        visible = (pos < n_end)[:, None]
        if CAUSAL:
            visible = visible & (pos[:, None] <= causal_limit[None, :])
        s = gl.where(visible, s * qk_scale, NEG_INF)
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
        m_use = gl.where(m_new == NEG_INF, 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[None, :])
        l_acc = l_acc * alpha[None, :] + p
        m_i = m_new
        # -- pᵀ and alpha to the value warpgroup (slot free once it finished tile j - 2) --
        mbarrier.wait(p_free.index(buf), phase ^ 1)
        p_buf = p_smem.index(buf)
        p_buf.store(p.to(p_buf.dtype))
        a_smem.index(buf).store(alpha)
        fence_async_shared()
        thread_barrier()
        mbarrier.arrive(p_ready.index(buf))
        # -- oᵀ[0:256] += vᵀ·pᵀ --
        if COL_SOFTMAX:  # alpha as the value warpgroup reads it: o's layout
            alpha = a_smem.index(buf).load(row_l)
        o = o * alpha[None, :]
        v_t = k_smem.slice(0, HALF, dim=1).permute((1, 0))
        o = warpgroup_mma_wait(0, deps=[warpgroup_mma(v_t, p_buf, o, is_async=True)])
        thread_barrier()
        mbarrier.arrive(empty.index(buf))

    # -- epilogue: row sums, statistics for the value warpgroup, outputs 0-255, LSE --
    l_i = gl.sum(l_acc, axis=0)
    if COL_SOFTMAX:
        l_i = gl.convert_layout(l_i, row_l)
        m_i = gl.convert_layout(m_i, row_l)
    stat_smem.index(0).store(m_i)
    stat_smem.index(1).store(l_i)
    thread_barrier()
    mbarrier.arrive(stat_ready)
    has = l_i > 0.0
    inv_l = gl.where(has, v_scale / gl.where(has, l_i, 1.0), 0.0)
    _store_out_t(
        o, inv_l, o_ptr, split, q_start, rows_total, num_heads, num_tokens, 0, stride_o_split,
        stride_o_t, stride_o_h, mma, BLOCK_R,
    )  # fmt: skip
    if WRITE_LSE:
        store_lse(m_i, l_i, lse_ptr, split, q_start, r, rows_total, num_heads, num_tokens,
                   stride_lse_split, stride_lse_t)  # fmt: skip


@gluon.jit
def _value_wg(
    k_bufs, ready, empty, p_smem, a_smem, p_ready, p_free, stat_smem, stat_ready,
    o_ptr, q_start, rows_total, n_begin, n_end, split, num_heads, num_tokens, v_scale,
    stride_o_split, stride_o_t, stride_o_h,
    BLOCK_R: gl.constexpr,
):  # fmt: skip
    """The value warpgroup: output columns 256–511 from the softmax warpgroup's ``Pᵀ``."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_R, 16]
    )
    row_l: gl.constexpr = gl.SliceLayout(0, mma)
    o = gl.zeros([HALF, BLOCK_R], gl.float32, layout=mma)
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    for j in range(n_tiles):
        buf = j % NUM_BUF
        phase = (j // NUM_BUF) & 1
        mbarrier.wait(ready.index(buf), phase)
        mbarrier.wait(p_ready.index(buf), phase)
        alpha = a_smem.index(buf).load(row_l)
        o = o * alpha[None, :]
        v_t = k_bufs.index(buf).slice(HALF, HALF, dim=1).permute((1, 0))
        o = warpgroup_mma_wait(0, deps=[warpgroup_mma(v_t, p_smem.index(buf), o, is_async=True)])
        thread_barrier()
        mbarrier.arrive(p_free.index(buf))
        mbarrier.arrive(empty.index(buf))
    mbarrier.wait(stat_ready, 0)
    l_i = stat_smem.index(1).load(row_l)
    has = l_i > 0.0
    inv_l = gl.where(has, v_scale / gl.where(has, l_i, 1.0), 0.0)
    _store_out_t(
        o, inv_l, o_ptr, split, q_start, rows_total, num_heads, num_tokens, HALF,
        stride_o_split, stride_o_t, stride_o_h, mma, BLOCK_R,
    )  # fmt: skip


@gluon.jit(do_not_specialize=["num_tokens", "num_pages"])
def mla_fewrows_kernel(
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
    num_tokens,  # rows of q / out: query positions past it are never touched
    num_pages,  # pages of the cache: page ids outside [0, num_pages) are never read
    num_indices,  # entries of kv_indices
    nan_row_ckv,  # offset of a NaN row from ckv_ptr (read for a bad page entry)
    nan_row_kpe,  # offset of a NaN row from kpe_ptr
    sm_scale_log2,
    ckv_scale_val,
    kpe_scale_val,
    PAGE_SIZE: gl.constexpr,
    BLOCK_M: gl.constexpr,  # query rows per request (16 or 32): wgmma's N
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
    PRODUCER_WARPS: gl.constexpr = 4,
    PRODUCER_REGS: gl.constexpr = 128,
    VALUE_REGS: gl.constexpr = 104,
    PRODUCER_16_REGS: gl.constexpr = 64,  # the 16-bit pools' copying producer (no data in registers)
    # L2 prefetch of a producer's next tile: 0 one ``prefetch.global.L2`` per 64 bytes, 1 per
    # 32-byte sector, 2 one bulk prefetch per row; -1: 2 for 32 rows, 0 for 16 (the faster
    # of each on the H200: docs/design/sm90-fewrows.md)
    PF_MODE: gl.constexpr = -1,
    # 1: the online softmax in a layout where each thread holds whole token columns of Sᵀ
    # (one shared-memory round trip per tile, 7.7 KB), so a row's maximum over the tile's 64
    # tokens takes 2-3 shuffles and no cross-warp exchange; 0: in wgmma's accumulator layout
    # (24 shuffles and two barriers at 32 rows); -1: 1 for FP8 pools at 32 rows, else 0
    # (where it was faster on the H200: docs/design/sm90-fewrows.md)
    COL_SOFTMAX: gl.constexpr = -1,
    # when the split merge (this grid's programmatic dependent) may be scheduled: 0 at the
    # grid's end, 1 at the start (its grids leave SMs idle at one request)
    LAUNCH_DEPENDENTS: gl.constexpr = 1,
    # launched as a programmatic dependent of the grid before it on the stream: the barriers
    # are set up, then griddepcontrol.wait before the first global read
    WAIT_PRIOR: gl.constexpr = False,
):
    gl.static_assert(BLOCK_M == 16 or BLOCK_M == 32, "16 or 32 query rows: wgmma's N")
    gl.static_assert(BLOCK_N == 64, "64 KV tokens per tile: wgmma's M")
    gl.static_assert(D_CKV == 2 * HALF, "the latent dimension is 512")
    gl.static_assert(D_KPE == 64, "the RoPE dimension is 64")
    gl.static_assert(gl.num_warps() == 4, "the softmax warpgroup is the default partition")
    IS16: gl.constexpr = ckv_ptr.dtype.element_ty.primitive_bitwidth == 16
    gl.static_assert(not (IS16 and TOKEN_GROUP), "token-group scales come with FP8 KV")
    # the tensor cores' operand type: fp16 for FP8 KV (converted), the pool's own for 16-bit
    KV_T: gl.constexpr = ckv_ptr.dtype.element_ty if IS16 else gl.float16
    if LAUNCH_DEPENDENTS == 1:  # the split merge, this grid's dependent, may be scheduled now
        launch_dependents()

    PF: gl.constexpr = PF_MODE if PF_MODE >= 0 else (2 if BLOCK_M == 32 else 0)
    COLS: gl.constexpr = COL_SOFTMAX > 0 if COL_SOFTMAX >= 0 else (BLOCK_M == 32 and not IS16)
    sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    p_sh: gl.constexpr = gl.NVMMASharedLayout(
        swizzle_byte_width=BLOCK_M * 2, element_bitwidth=16, rank=2
    )
    vec_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])  # rows of [2, R]
    q_smem = gl.allocate_shared_memory(KV_T, [BLOCK_M, D_CKV], sh)
    qpe_smem = gl.allocate_shared_memory(KV_T, [BLOCK_M, D_KPE], sh)
    k_bufs = gl.allocate_shared_memory(KV_T, [NUM_BUF, BLOCK_N, D_CKV], sh)
    kpe_bufs = gl.allocate_shared_memory(KV_T, [NUM_BUF, BLOCK_N, D_KPE], sh)
    p_smem = gl.allocate_shared_memory(KV_T, [NUM_BUF, BLOCK_N, BLOCK_M], p_sh)
    a_smem = gl.allocate_shared_memory(gl.float32, [NUM_BUF, BLOCK_M], vec_sh)
    stat_smem = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M], vec_sh)
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], bar_l)
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], bar_l)
    p_ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], bar_l)
    p_free = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], bar_l)
    stat_ready = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l).index(0)
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)  # both consumer warpgroups
        mbarrier.init(p_ready.index(i), count=1)
        mbarrier.init(p_free.index(i), count=1)
    mbarrier.init(stat_ready, count=1)

    if WAIT_PRIOR:  # a programmatic dependent: no global read before the prior grid ends
        wait_prior()
    b = gl.program_id(1)
    split = gl.program_id(2)
    (q_start, qo_len, rows_total, kv_len, n_begin, n_end, page_base, n_entries, qk_scale,
     pe_factor, v_scale) = request_span(
        qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr, ckv_scale_ptr, kpe_scale_ptr,
        ckv_scale_val, kpe_scale_val, sm_scale_log2, b, 0, split, num_heads, num_indices,
        BLOCK_M, BLOCK_N, CAUSAL, CKV_SCALE_PTR, KPE_SCALE_PTR, TOKEN_GROUP, FP8_CVT,
    )  # fmt: skip

    if IS16:
        gl.warp_specialize(
            [
                (
                    _softmax_wg,
                    (
                        k_bufs, kpe_bufs, ready, empty, q_smem, qpe_smem, p_smem, a_smem, p_ready,
                        p_free, stat_smem, stat_ready, q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr,
                        q_start, qo_len, rows_total, kv_len, n_begin, n_end, split, num_heads,
                        num_tokens, qk_scale, pe_factor, v_scale, stride_qn_t, stride_qn_h,
                        stride_qp_t, stride_qp_h, stride_o_split, stride_o_t, stride_o_h,
                        stride_lse_split, stride_lse_t, BLOCK_M, D_CKV, D_KPE, CAUSAL, WRITE_LSE,
                        COLS,
                    ),
                ),
                (
                    _value_wg,
                    (
                        k_bufs, ready, empty, p_smem, a_smem, p_ready, p_free, stat_smem,
                        stat_ready, o_ptr, q_start, rows_total, n_begin, n_end, split, num_heads,
                        num_tokens, v_scale, stride_o_split, stride_o_t, stride_o_h, BLOCK_M,
                    ),
                ),
                (
                    kv_copier,
                    (
                        k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, page_base, n_entries,
                        num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p,
                        stride_ckv_s, stride_kpe_p, stride_kpe_s, PAGE_SIZE, BLOCK_N, D_CKV,
                        D_KPE, PRODUCER_WARPS, NUM_BUF,
                    ),
                ),
            ],
            [4, PRODUCER_WARPS],
            [VALUE_REGS, PRODUCER_16_REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (
                    _softmax_wg,
                    (
                        k_bufs, kpe_bufs, ready, empty, q_smem, qpe_smem, p_smem, a_smem, p_ready,
                        p_free, stat_smem, stat_ready, q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr,
                        q_start, qo_len, rows_total, kv_len, n_begin, n_end, split, num_heads,
                        num_tokens, qk_scale, pe_factor, v_scale, stride_qn_t, stride_qn_h,
                        stride_qp_t, stride_qp_h, stride_o_split, stride_o_t, stride_o_h,
                        stride_lse_split, stride_lse_t, BLOCK_M, D_CKV, D_KPE, CAUSAL, WRITE_LSE,
                        COLS,
                    ),
                ),
                (
                    _value_wg,
                    (
                        k_bufs, ready, empty, p_smem, a_smem, p_ready, p_free, stat_smem,
                        stat_ready, o_ptr, q_start, rows_total, n_begin, n_end, split, num_heads,
                        num_tokens, v_scale, stride_o_split, stride_o_t, stride_o_h, BLOCK_M,
                    ),
                ),
                (
                    kv_producer_alternate,
                    (
                        k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base,
                        n_entries, num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end,
                        stride_ckv_p, stride_ckv_s,
                        stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s, 0, PAGE_SIZE,
                        D_CKV, D_KPE, TOKEN_GROUP, FP8_CVT, PRODUCER_WARPS, PF,
                    ),
                ),
                (
                    kv_producer_alternate,
                    (
                        k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base,
                        n_entries, num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end,
                        stride_ckv_p, stride_ckv_s,
                        stride_kpe_p, stride_kpe_s, stride_sa_p, stride_sa_s, 1, PAGE_SIZE,
                        D_CKV, D_KPE, TOKEN_GROUP, FP8_CVT, PRODUCER_WARPS, PF,
                    ),
                ),
            ],
            [4, PRODUCER_WARPS, PRODUCER_WARPS],
            [VALUE_REGS, PRODUCER_REGS, PRODUCER_REGS],
        )  # fmt: skip
