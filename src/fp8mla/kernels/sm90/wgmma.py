"""The ``wgmma`` kernel: Hopper (SM90) MLA attention for many query rows, in Gluon: a converting
warpgroup feeds two that share one Q·Kᵀ.

The Triton kernels cannot place their warps on Hopper: for a 64-row tile Triton gives both
warpgroups the same 64 rows, so each computes the whole score tile and holds half of the output
(or one warpgroup holds all 512 output columns and spills). Here the layouts and the roles are
explicit. One program owns 64 query rows and runs three warpgroups:

* a **producer** (4 warps, 96 registers per thread; ``producers.py``) reads each
  64-token FP8 tile from the pool through the page table, converts it to fp16 and stores it
  into one of two shared KV buffers (a 16-bit tile is copied by ``cp.async``); meanwhile it
  loads the next tile's page-table entries and prefetches its rows into the L2. ``mbarrier``
  pairs (ready / empty) hand the buffers over, so the next tile is converted while the current
  one is multiplied;
* two **consumer** warpgroups (the default partition, 8 warps) split the columns of every
  product. ``S = Q·Kᵀ`` ``[64, BLOCK_N]``: each computes ``BLOCK_N / 2`` of the KV tokens; the
  row maximum crosses the two through shared memory every step (one barrier), the row sums
  only once, after the loop. ``O += P·V`` ``[64, 512]``: each accumulates 256 output columns
  in registers (128 fp32 per thread), reading the whole ``P`` from shared memory. The fp16 KV
  tile serves both products: keys for Q·Kᵀ (K-major) and values for P·V (the same bytes,
  MN-major).

The query tile is converted to fp16 and staged in shared memory once. The softmax runs in
base 2 as in the Triton kernels; ``S`` and the output are fp32 accumulators.

Shared memory (RoPE part included): the query 72 KB, two fp16 KV tiles 144 KB, P 8 KB, the
row maxima 0.5 KB (224.5 KB: one program per SM). Same arguments and results as
``mla_rows_kernel`` (``portable/rows.py``); ``BLOCK_M`` and ``BLOCK_N`` are 64,
``num_warps`` 8 (the producer's 4 warps come on top), the KV FP8 (read as bytes) with a 64-dim
RoPE part. Gluon has no interpreter: this kernel runs on SM90 GPUs only, and the planner picks
it only there.
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
    CHUNK,
    NEG_INF,
    PRODUCER_WARPS,
    mask_scores,
    stage_query,
    store_rows,
    thread_barrier,
)
from fp8mla.kernels.sm90.producers import kv_copier, kv_producer
from fp8mla.kernels.sm90.request import request_span

NUM_BUF = gl.constexpr(2)  # fp16 KV tiles in flight


PRODUCER_REGS = gl.constexpr(96)  # per thread (two page-table sets in flight); consumers 208


@gluon.jit
def _attn_consumer(
    k_bufs, kpe_bufs, ready, empty, q_smem, qpe_smem, p_smem,
    q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr, m_tile, q_start, qo_len, rows_total, kv_len,
    n_begin, n_end, split, num_heads, num_tokens, qk_scale, pe_factor, v_scale,
    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split, stride_o_t, stride_o_h,
    stride_lse_split, stride_lse_t,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr,
    CAUSAL: gl.constexpr, DOT_DTYPE: gl.constexpr, WRITE_LSE: gl.constexpr,
):  # fmt: skip
    """The two consumer warpgroups: stage the query tile, then per KV tile wait for ``ready``,
    ``S = Q·Kᵀ``, online softmax, ``O += P·V``, and signal ``empty``; finally O / l times the
    value scale and the base-2 LSE."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, D_CKV // 2, 16]
    )
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

    stage_query(
        q_smem, qpe_smem, q_nope_ptr, q_pe_ptr, m_tile, q_start, rows_total, num_heads,
        num_tokens, pe_factor, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, BLOCK_M, D_CKV, D_KPE,
        0, BLOCK_M, 8,
    )  # fmt: skip

    rs = m_tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=s_rows)
    causal_limit = kv_len - qo_len + rs // num_heads
    m_i = gl.full([BLOCK_M], NEG_INF, gl.float32, layout=s_rows)
    o = gl.zeros([BLOCK_M, D_CKV], gl.float32, layout=o_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    # Row statistics per warpgroup: S viewed as [BLOCK_M, 2, BLOCK_N / 2] (the middle dimension
    # is the warpgroup) reduces over its last dimension without leaving the warp.
    # The row sums stay per warpgroup ([BLOCK_M, 2]): both shares are scaled by the same alpha,
    # so they are added once after the loop instead of crossing every step.
    l_part = gl.sum(gl.reshape(s_zero, [BLOCK_M, 2, BLOCK_N // 2]), axis=2)
    l_rows: gl.constexpr = gl.SliceLayout(1, l_part.type.layout)
    # The row maxima do cross every step: each warpgroup writes its column of this buffer, and
    # after one barrier each reads both (Gluon's cross-warp reduction spends two barriers).
    m_smem = gl.allocate_shared_memory(
        gl.float32, [BLOCK_M, 2], gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    )
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    for j in range(n_tiles):
        n0 = n_begin + j * BLOCK_N
        buf = j % NUM_BUF
        mbarrier.wait(ready.index(buf), (j // NUM_BUF) & 1)
        k_smem = k_bufs.index(buf)
        s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma(qpe_smem, kpe_bufs.index(buf).permute((1, 0)), s, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s])

        # a bad page entry's token holds the NaN row: its scores and values turn rows NaN
        s = mask_scores(s * qk_scale, n0, n_end, causal_limit, BLOCK_N, CAUSAL, s_layout)
        m_smem.store(gl.max(gl.reshape(s, [BLOCK_M, 2, BLOCK_N // 2]), axis=2))
        thread_barrier()
        m0 = gl.reshape(m_smem.slice(0, 1, dim=1).load(s_layout), [BLOCK_M])
        m1 = gl.reshape(m_smem.slice(1, 1, dim=1).load(s_layout), [BLOCK_M])
        m_new = gl.maximum(m_i, gl.convert_layout(gl.maximum(m0, m1), s_rows))
        m_use = gl.where(m_new == NEG_INF, 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        p = gl.exp2(s - m_use[:, None])
        p_sum = gl.sum(gl.reshape(p, [BLOCK_M, 2, BLOCK_N // 2]), axis=2)
        l_part = l_part * gl.convert_layout(alpha, l_rows)[:, None] + p_sum
        m_i = m_new
        p_smem.store(p.to(DOT_DTYPE))
        o = o * gl.convert_layout(alpha, o_rows)[:, None]
        fence_async_shared()
        thread_barrier()
        # waited for in this step: an accumulator in flight across the loop's back edge makes
        # ptxas copy its registers and serialize every wgmma (C7515)
        o = warpgroup_mma_wait(0, deps=[warpgroup_mma(p_smem, k_smem, o, is_async=True)])
        # both warpgroups are done with this KV buffer and with P before one thread signals
        thread_barrier()
        mbarrier.arrive(empty.index(buf))

    l_i = gl.convert_layout(gl.sum(l_part, axis=1), s_rows)
    has = l_i > 0.0
    inv_l = gl.where(has, v_scale / gl.where(has, l_i, 1.0), 0.0)
    store_rows(o, inv_l, o_ptr, 0, m_tile, q_start, rows_total, num_heads, num_tokens, split,
                stride_o_split, stride_o_t, stride_o_h, BLOCK_M, o_layout)  # fmt: skip
    if WRITE_LSE:
        lse = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), NEG_INF)
        lse = gl.where(l_i != l_i, l_i, lse)  # NaN (a bad page entry) stays NaN
        rs_ok = (rs < rows_total) & (q_start + rs // num_heads < num_tokens)
        lse_ptrs = lse_ptr + split * stride_lse_split
        lse_ptrs += (q_start + rs // num_heads).to(gl.int64) * stride_lse_t + rs % num_heads
        gl.store(lse_ptrs, lse, mask=rs_ok)


@gluon.jit(do_not_specialize=["num_tokens", "num_pages"])
def mla_wgmma_kernel(
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
):
    gl.static_assert(BLOCK_M == 64 and BLOCK_N == 64, "64 query rows × 64 KV tokens per step")
    gl.static_assert(D_CKV == 4 * CHUNK, "the latent dimension is 512")
    gl.static_assert(D_KPE == 64, "the RoPE dimension is 64")
    gl.static_assert(gl.num_warps() == 8, "two consumer warpgroups")
    IS16: gl.constexpr = ckv_ptr.dtype.element_ty.primitive_bitwidth == 16
    gl.static_assert(not (IS16 and TOKEN_GROUP), "token-group scales come with FP8 KV")

    sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    q_smem = gl.allocate_shared_memory(DOT_DTYPE, [BLOCK_M, D_CKV], sh)
    qpe_smem = gl.allocate_shared_memory(DOT_DTYPE, [BLOCK_M, D_KPE], sh)
    k_bufs = gl.allocate_shared_memory(DOT_DTYPE, [NUM_BUF, BLOCK_N, D_CKV], sh)
    kpe_bufs = gl.allocate_shared_memory(DOT_DTYPE, [NUM_BUF, BLOCK_N, D_KPE], sh)
    p_smem = gl.allocate_shared_memory(DOT_DTYPE, [BLOCK_M, BLOCK_N], sh)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_BUF, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_BUF):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)

    m_tile = gl.program_id(0)
    b = gl.program_id(1)
    split = gl.program_id(2)
    (q_start, qo_len, rows_total, kv_len, n_begin, n_end, page_base, n_entries, qk_scale,
     pe_factor, v_scale) = request_span(
        qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr, ckv_scale_ptr, kpe_scale_ptr,
        ckv_scale_val, kpe_scale_val, sm_scale_log2, b, m_tile, split, num_heads, num_indices,
        BLOCK_M, BLOCK_N, CAUSAL, CKV_SCALE_PTR, KPE_SCALE_PTR, TOKEN_GROUP, FP8_CVT,
    )  # fmt: skip

    if IS16:
        gl.warp_specialize(
            [
                (
                    _attn_consumer,
                    (
                        k_bufs, kpe_bufs, ready, empty, q_smem, qpe_smem, p_smem,
                        q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr, m_tile, q_start, qo_len, rows_total,
                        kv_len, n_begin, n_end, split, num_heads, num_tokens, qk_scale, pe_factor,
                        v_scale,
                        stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split,
                        stride_o_t, stride_o_h, stride_lse_split, stride_lse_t,
                        BLOCK_M, BLOCK_N, D_CKV, D_KPE, CAUSAL, DOT_DTYPE, WRITE_LSE,
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
            [PRODUCER_WARPS],
            [PRODUCER_REGS],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (
                    _attn_consumer,
                    (
                        k_bufs, kpe_bufs, ready, empty, q_smem, qpe_smem, p_smem,
                        q_nope_ptr, q_pe_ptr, o_ptr, lse_ptr, m_tile, q_start, qo_len, rows_total,
                        kv_len, n_begin, n_end, split, num_heads, num_tokens, qk_scale, pe_factor,
                        v_scale,
                        stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split,
                        stride_o_t, stride_o_h, stride_lse_split, stride_lse_t,
                        BLOCK_M, BLOCK_N, D_CKV, D_KPE, CAUSAL, DOT_DTYPE, WRITE_LSE,
                    ),
                ),
                (
                    kv_producer,
                    (
                        k_bufs, kpe_bufs, ready, empty, ckv_ptr, kpe_ptr, scale_arr_ptr, page_base,
                        n_entries, num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end, stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s,
                        stride_sa_p, stride_sa_s, PAGE_SIZE, BLOCK_N, D_CKV, D_KPE, TOKEN_GROUP,
                        FP8_CVT, NUM_BUF, False,
                    ),
                ),
            ],
            [PRODUCER_WARPS],
            [PRODUCER_REGS],
        )  # fmt: skip
