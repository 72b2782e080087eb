"""The ``fp8qk`` kernel: Hopper (SM90) MLA decode of FP8 pools for ≤ 32 query rows per request
(more in 32-row tiles), in Gluon, with the pool's FP8 bytes used as they are: ``Q·Kᵀ`` on FP8
tensor cores, no fp16 copy of the tile.

The few-row kernel (``fewrows.py``) converts every FP8 tile into an fp16 copy in shared
memory; the producers that load, convert and store it set its pace, and the FP8 pool gains
nothing from its smaller bytes there (``docs/design/sm90-fp8qk.md``). Here:

* a **copier** warpgroup (``fp8_stage.fp8_copier``; the query staging is there too) moves each
  64-token tile's FP8 rows through the page table into one of ``STAGES`` shared stages by
  ``cp.async`` (16 bytes at a time, to their 128-byte-swizzled places; no registers, no
  conversion); each thread's copies arrive on the stage's barrier when they land. A bad page
  entry's token reads the launcher's NaN row;
* the **score warpgroup** (the default partition, ``fp8qk_score.py``) computes
  ``S [64, 64 tokens] = Q₈ · K₈ᵀ`` in FP8 × FP8 wgmma straight from the stage. The query is
  held in shared memory as two e4m3 halves scaled per row by a power of two,
  ``q·s = hi + lo/16`` (exact for bf16 queries), as wgmma's 64 rows: rows ``16w + g`` hi and
  ``16w + 8 + g`` lo of query row ``8w + g``, so one thread holds both and adds them. The
  latent part is summed in four 128-column parts, each by the tensor cores and then in fp32
  (Hopper's FP8 wgmma accumulates at reduced precision: one 512-column sum measured LSE errors
  of 3.9e-3, four parts 0.9e-3), the RoPE part apart (its scale differs). Then the online
  softmax over the tile's tokens (a row's 64 tokens sit in the four lanes of a quad); ``P``
  (fp16) and the rescale factor go to shared memory. With per-tensor scales the next tile's
  first products run on the tensor cores during this tile's softmax;
* two **value warpgroups** first stage the query (half each), then each owns 256 of the 512
  output columns: ``Oᵀ [256, R] += Vᵀ · Pᵀ`` with ``Vᵀ`` as wgmma's register operand, read
  from the stage's FP8 bytes (8 adjacent bytes per thread and token, converted to fp16 in
  registers; ``fp8_values.py``), in two 32-token steps, the output columns permuted so that a
  thread's 8 accumulator rows are 8 adjacent bytes of the FP8 row. A split's
  partial output is stored in fp16 (``HALF_PARTIALS``: half the bytes this kernel writes and
  the merge reads) as ``o / l`` without the V scale: an average of FP8 values, within fp16's
  range for e4m3 and e5m2 (with token-group scales, of the fp16 ``V`` operand's values); the
  merge multiplies by the V scale, which the kernel stores beside the partials. With
  ``MERGE_IN_GRID`` (a cooperative launch of few requests) the request's programs then meet
  and merge the partials themselves, no merge launch (``grid_merge.py``).

Shared memory for ``STAGES`` = 4: the stages 160 KB (37 KB each with the RoPE part, 1 KB of
token-group scales where used), the query 36 KB, ``P`` 8 KB (about 190 KB: one program per
SM). Same arguments and results as ``mla_fewrows_kernel``; a request of more query rows
than ``BLOCK_M`` runs as row tiles, one program each along the grid's first axis (a build of
its own, ``ROW_TILES``, so that the one-tile decode keeps its code). FP8 pools (e4m3 or e5m2,
as ``FP8_CVT`` names them) with per-tensor or token-group scales and a 64-dim RoPE part;
launched with 4 warps (the other partitions' warps come on top). Gluon has no interpreter: this kernel
runs on SM90 GPUs only.
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
from fp8mla.kernels.portable import tiles as TL
from fp8mla.kernels.sm90.common import (
    BLOCK_N,
    HALF_N,
    ROPE16_SH,
    launch_dependents,
    thread_barrier,
    wait_prior,
)
from fp8mla.kernels.sm90.fp8_stage import fp8_copier, stage_query_half
from fp8mla.kernels.sm90.fp8_values import HALF, store_output, value_operand
from fp8mla.kernels.sm90.fp8qk_score import RQ, score_warpgroup
from fp8mla.kernels.sm90.grid_merge import merge_rows, request_barrier
from fp8mla.kernels.sm90.request import request_span


@gluon.jit
def _value_wg(
    k_stages, sc_stages, ready, empty, q_smem, qpe_smem, q_ready, p_smem, a_smem, p_ready, p_free,
    stat_smem, stat_ready, q_nope_ptr, q_pe_ptr, o_ptr, q_start, rows_total, n_begin, n_end,
    split, num_heads, num_tokens, v_scale, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
    stride_o_split, stride_o_t, stride_o_h, mult_ptr, q_scale_ptr, stride_qs_t, q_scale_val,
    H: gl.constexpr, BLOCK_R: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr,
    TOKEN_GROUP: gl.constexpr, STAGES: gl.constexpr, FP8_CVT: gl.constexpr,
    HALF_PARTIALS: gl.constexpr, ROW_TILES: gl.constexpr, ROPE_16BIT: gl.constexpr,
    Q_FP8: gl.constexpr, Q_SCALE: gl.constexpr, CAUSAL: gl.constexpr, LATE: gl.constexpr, late,
    MERGE_IN_GRID: gl.constexpr, o_done,
):  # fmt: skip
    """Value warpgroup ``H``: its half of the query staging, then output columns
    ``256H + π(m)`` of ``Oᵀ += Vᵀ·Pᵀ`` in two 32-token steps per tile, ``Vᵀ`` read from the
    stage's FP8 bytes into wgmma's register operand (the second step's bytes are read and
    converted while the first step's products run). ``LATE``: the KV range read after the
    query staging, once the grid that writes the lengths has ended (``common.wait_prior``)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_R, 16]
    )
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)  # along the query rows (N)
    stage_query_half(
        q_smem, qpe_smem, stat_smem, q_ready, q_nope_ptr, q_pe_ptr, q_start, rows_total,
        num_heads, num_tokens, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, H, D_CKV,
        D_KPE, BLOCK_R, ROW_TILES, ROPE_16BIT, Q_FP8, Q_SCALE, q_scale_ptr, stride_qs_t,
        q_scale_val,
    )  # fmt: skip
    if LATE:  # the compaction's lists and counts, from here on
        wait_prior()
        _, n_begin, n_end = TL.request_kv_span(late, BLOCK_R, BLOCK_N, CAUSAL)
    o = gl.zeros([HALF, BLOCK_R], gl.float32, layout=mma)
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    j0 = 0
    if TOKEN_GROUP and MERGE_IN_GRID:
        # a few-token decode's program has one tile or a few, and this warpgroup waits for
        # tile 0's P with nothing to do: tile 0's first operand is built before it (in the
        # loop the group scales' operand waits for P, where building it earlier would spill)
        j0 = 1
        if n_tiles > 0:
            mbarrier.wait(ready.index(0), 0)
            a0 = value_operand(k_stages, sc_stages, 0, 0, H, TOKEN_GROUP, FP8_CVT, a_l)
            mbarrier.wait(p_ready.index(0), 0)
            alpha = a_smem.index(0).slice(0, BLOCK_R).load(col_l)
            o = o * alpha[None, :]
            o = warpgroup_mma(a0, p_smem.index(0).slice(0, BLOCK_R, dim=0).permute((1, 0)), o,
                              is_async=True)  # fmt: skip
            o = warpgroup_mma_wait(0, deps=[o, a0])[0]
            a1 = value_operand(k_stages, sc_stages, 0, 1, H, TOKEN_GROUP, FP8_CVT, a_l)
            thread_barrier()
            mbarrier.arrive(empty.index(0))
            o = warpgroup_mma(a1, p_smem.index(1).slice(0, BLOCK_R, dim=0).permute((1, 0)), o,
                              is_async=True)  # fmt: skip
            o = warpgroup_mma_wait(0, deps=[o, a1])[0]
            thread_barrier()
            mbarrier.arrive(p_free.index(0))
    for j in range(j0, n_tiles):
        st = j % STAGES
        b = j % 2
        mbarrier.wait(ready.index(st), (j // STAGES) & 1)
        if not TOKEN_GROUP:  # the first half's operand needs only the stage: built
            # while P is on its way (with the group scales, its registers would spill)
            a0 = value_operand(k_stages, sc_stages, st, 0, H, TOKEN_GROUP, FP8_CVT, a_l)
        mbarrier.wait(p_ready.index(b), (j // 2) & 1)
        alpha = a_smem.index(b).slice(0, BLOCK_R).load(col_l)
        o = o * alpha[None, :]
        if TOKEN_GROUP:
            a0 = value_operand(k_stages, sc_stages, st, 0, H, TOKEN_GROUP, FP8_CVT, a_l)
        o = warpgroup_mma(a0, p_smem.index(2 * b).slice(0, BLOCK_R, dim=0).permute((1, 0)), o,
                          is_async=True)  # fmt: skip
        # the first half's products done before the second half's operand is built: its
        # registers are free again, so 136 per value warpgroup suffice and ptxas does not
        # serialize the kernel's wgmma (C7512) with the score warpgroup's four sums
        o = warpgroup_mma_wait(0, deps=[o, a0])[0]
        a1 = value_operand(k_stages, sc_stages, st, 1, H, TOKEN_GROUP, FP8_CVT, a_l)
        thread_barrier()
        mbarrier.arrive(empty.index(st))  # the stage's bytes are in registers
        o = warpgroup_mma(a1, p_smem.index(2 * b + 1).slice(0, BLOCK_R, dim=0).permute((1, 0)),
                          o, is_async=True)  # fmt: skip
        o = warpgroup_mma_wait(0, deps=[o, a1])[0]
        thread_barrier()
        mbarrier.arrive(p_free.index(b))
    mbarrier.wait(stat_ready, 0)
    l_i = stat_smem.index(1).slice(0, BLOCK_R).load(col_l)
    has = l_i > 0.0
    if HALF_PARTIALS:  # o / l stored, the V scale beside it for the merge
        inv_l = gl.where(has, 1.0 / gl.where(has, l_i, 1.0), 0.0)
        if H == 0:
            gl.store(mult_ptr, v_scale)
    else:
        inv_l = gl.where(has, v_scale / gl.where(has, l_i, 1.0), 0.0)
    store_output(
        o * inv_l[None, :], o_ptr, q_start, rows_total, split, num_heads, num_tokens,
        stride_o_split, stride_o_t, stride_o_h, H, BLOCK_R, ROW_TILES,
    )  # fmt: skip
    if MERGE_IN_GRID:  # the partials stored: the score partition releases them (grid_merge)
        thread_barrier()
        mbarrier.arrive(o_done)


@gluon.jit(do_not_specialize=["num_tokens", "num_pages"])
def mla_fp8qk_kernel(
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
    BLOCK_M: gl.constexpr,  # query rows per request (16 or 32): the value wgmma's N
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
    STAGES: gl.constexpr = 4,  # FP8 tiles in flight (37 KB each)
    COPIER_WARPS: gl.constexpr = 4,
    COPIER_REGS: gl.constexpr = 48,
    VALUE_REGS: gl.constexpr = 136,
    # the latent part of Q·Kᵀ in QK_PARTS column ranges, each summed by the tensor cores (at
    # their reduced FP8 accumulation precision) and added to the others in fp32
    QK_PARTS: gl.constexpr = 4,
    # when the split merge (this grid's programmatic dependent) may be scheduled: 0 at the
    # grid's end, 1 at the start, 2 after the program's last tile is scored (its programs then
    # land on SMs this grid has left, not piled on the few it never took)
    LAUNCH_DEPENDENTS: gl.constexpr = 2,
    # launched as a programmatic dependent of the grid before it on the stream: 1 (True) the
    # barriers are set up, then griddepcontrol.wait before the first global read; 2 that grid
    # writes only the requests' lengths and page-table entries (the sparse path's compaction):
    # the query is staged first, each partition waits where it first reads them
    WAIT_PRIOR: gl.constexpr = False,
    # the split partials in fp16 without the V scale, which goes to mult_ptr (one fp32) for
    # the merge (attention.workspace.Partials)
    HALF_PARTIALS: gl.constexpr = False,
    # the grid's first axis counts row tiles of BLOCK_M rows (requests of more rows than one
    # tile); False: one tile per request, the kernel compiled without the row arithmetic
    ROW_TILES: gl.constexpr = False,
    # the RoPE part of the cache is bf16 (the packed fp8_ds_mla row of DeepSeek Sparse Attention
    # models) while the latent part is FP8: kpe_ptr and its strides in bytes, its product with
    # the query's RoPE part in bf16; False: the RoPE part is FP8 as the latent part
    ROPE_16BIT: gl.constexpr = False,
    # each request is a sparse query token whose page table is its own index list, as the
    # caller gives it (page size 1, token-group scales): a -1 entry is no token (never read,
    # its scores masked), the request's length at kv_len_ptr is clamped to its list, and
    # requests past num_tokens have none (dsa/sparse_sm90.py)
    SPARSE_LISTS: gl.constexpr = False,
    mult_ptr=None,
    # nonzero: e4m3 queries, their codes as bytes, times a scale per row
    # (``fp8_stage.stage_query_half``: Q_SCALE 0 ``q_scale_val``, 1 ``q_scale_ptr[0]``, 2
    # ``q_scale_ptr[token · stride_qs_t + head]``)
    Q_FP8: gl.constexpr = 0,
    Q_SCALE: gl.constexpr = 0,
    q_scale_ptr=None,
    stride_qs_t=None,
    q_scale_val=None,
    # the split merge in this grid (grid_merge.py; a plan whose programs are all resident at
    # once, one row tile a request): the request's programs meet at a barrier on sync_ptr
    # (a 64-bit counter a request, zero at plan()), then each merges a share of its rows
    # into out_ptr (and the base-2 LSE into out_lse_ptr with WRITE_OUT_LSE); 2: the grid's
    # first axis has two programs a split, the second merging only, rows in column halves
    MERGE_IN_GRID: gl.constexpr = False,
    WRITE_OUT_LSE: gl.constexpr = False,
    out_ptr=None,
    out_lse_ptr=None,
    stride_out_t=None,
    stride_out_h=None,
    stride_out_lse_t=None,
    sync_ptr=None,
):
    gl.static_assert(BLOCK_M == 16 or BLOCK_M == 32, "16 or 32 query rows per request")
    gl.static_assert(BLOCK_N == 64, "64 KV tokens per tile")
    gl.static_assert(D_CKV == 2 * HALF, "the latent dimension is 512")
    gl.static_assert(D_KPE == 64, "the RoPE dimension is 64")
    gl.static_assert(gl.num_warps() == 4, "the score warpgroup is the default partition")
    gl.static_assert(
        FP8_CVT == T.CVT_PTX_E4M3 or FP8_CVT == T.CVT_PTX_E5M2, "FP8 bytes read as e4m3 or e5m2"
    )
    if LAUNCH_DEPENDENTS == 1:
        # the split merge (launched as this grid's dependent) may be scheduled from now on:
        # its programs wait on SMs this grid leaves idle, not behind a launch after its end
        launch_dependents()
    KV8: gl.constexpr = gl.float8e4nv if FP8_CVT == T.CVT_PTX_E4M3 else gl.float8e5
    ckv8 = ckv_ptr.to(gl.pointer_type(KV8), bitcast=True)
    kpe8 = kpe_ptr.to(gl.pointer_type(KV8), bitcast=True)

    k_sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    pe_sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=8, rank=2)
    p_sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
    vec_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    vec2_sh: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    k_stages = gl.allocate_shared_memory(KV8, [STAGES, BLOCK_N, D_CKV], k_sh)
    if ROPE_16BIT:  # the bf16 RoPE values as bytes (128 a token), read as bf16 by the scores
        pe_stages = gl.allocate_shared_memory(KV8, [STAGES, BLOCK_N, 2 * D_KPE], k_sh)
    else:
        pe_stages = gl.allocate_shared_memory(KV8, [STAGES, BLOCK_N, D_KPE], pe_sh)
    sc_stages = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N, 4], vec2_sh)
    if SPARSE_LISTS:  # each tile's index-list entries, staged beside its bytes
        ent_stages = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_N], vec_sh)
    else:  # (not read: the partitions' argument)
        ent_stages = sc_stages
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 * RQ, D_CKV], k_sh)
    if ROPE_16BIT:
        qpe_smem = gl.allocate_shared_memory(gl.bfloat16, [2 * RQ, D_KPE], ROPE16_SH)
    else:
        qpe_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 * RQ, D_KPE], pe_sh)
    p_smem = gl.allocate_shared_memory(gl.float16, [4, RQ, HALF_N], p_sh)  # 2 tiles × 2 halves
    a_smem = gl.allocate_shared_memory(gl.float32, [2, RQ], vec_sh)
    stat_smem = gl.allocate_shared_memory(gl.float32, [2, RQ], vec_sh)
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_l)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_l)
    p_ready = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
    p_free = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
    stat_ready = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l).index(0)
    q_ready = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l).index(0)
    o_done = gl.allocate_shared_memory(gl.int64, [1, 1], bar_l).index(0)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=COPIER_WARPS * 32)  # every copier thread's copies
        mbarrier.init(empty.index(i), count=2)  # both value warpgroups
    for i in gl.static_range(2):
        mbarrier.init(p_ready.index(i), count=1)
        mbarrier.init(p_free.index(i), count=2)
    mbarrier.init(stat_ready, count=1)
    mbarrier.init(q_ready, count=2)  # both value warpgroups stage half of the query
    mbarrier.init(o_done, count=2)  # both value warpgroups' partials stored (MERGE_IN_GRID)
    fence_async_shared()
    thread_barrier()

    if WAIT_PRIOR == 1:  # a programmatic dependent: no global read before the prior grid ends
        wait_prior()
    LATE: gl.constexpr = WAIT_PRIOR == 2
    gl.static_assert(not MERGE_IN_GRID or not (ROW_TILES or LATE), "one row tile a request")
    gl.static_assert(
        not SPARSE_LISTS or (PAGE_SIZE == 1 and TOKEN_GROUP and not LATE),
        "index lists: page size 1, token-group scales, lengths read at the start",
    )
    m_tile = 0
    if ROW_TILES:
        m_tile = gl.program_id(0)
    b = gl.program_id(1)
    split = gl.program_id(2)
    (q_start, qo_len, rows_total, kv_len, n_begin, n_end, page_base, n_entries, qk_scale,
     pe_factor, v_scale) = request_span(
        qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr, ckv_scale_ptr, kpe_scale_ptr,
        ckv_scale_val, kpe_scale_val, sm_scale_log2, b, m_tile, split, num_heads, num_indices,
        BLOCK_M, BLOCK_N, CAUSAL, CKV_SCALE_PTR, KPE_SCALE_PTR, TOKEN_GROUP, FP8_CVT, not LATE,
        SPARSE_LISTS, num_tokens,
    )  # fmt: skip
    rows_merged = rows_total
    if MERGE_IN_GRID == 2:  # the grid's second program of a split only merges: no KV range,
        # no rows of its own to store (its partitions run no tile and write nothing)
        helper = gl.program_id(0) > 0
        n_end = gl.where(helper, n_begin, n_end)
        rows_total = gl.where(helper, 0, rows_total)
    # LATE: each partition reads its length and KV range after wait_prior, from these
    late = (kv_len_ptr, b, m_tile, split, qo_len, rows_total, num_heads)

    gl.warp_specialize(
        [
            (
                score_warpgroup,
                (
                    k_stages, pe_stages, sc_stages, ready, q_smem, qpe_smem, q_ready, p_smem,
                    a_smem, p_ready, p_free, stat_smem, stat_ready, lse_ptr, q_start, qo_len,
                    rows_total, kv_len, n_begin, n_end, split, num_heads, num_tokens, qk_scale,
                    pe_factor, stride_lse_split, stride_lse_t, D_CKV, D_KPE, CAUSAL, WRITE_LSE,
                    TOKEN_GROUP, STAGES, QK_PARTS, LAUNCH_DEPENDENTS, BLOCK_M, ROW_TILES, LATE,
                    late, SPARSE_LISTS, ent_stages,
                ),
            ),
            (
                _value_wg,
                (
                    k_stages, sc_stages, ready, empty, q_smem, qpe_smem, q_ready, p_smem, a_smem,
                    p_ready, p_free, stat_smem, stat_ready, q_nope_ptr, q_pe_ptr, o_ptr, q_start,
                    rows_total, n_begin, n_end, split, num_heads, num_tokens, v_scale,
                    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split,
                    stride_o_t, stride_o_h, mult_ptr, q_scale_ptr, stride_qs_t, q_scale_val, 0,
                    BLOCK_M, D_CKV, D_KPE, TOKEN_GROUP, STAGES, FP8_CVT, HALF_PARTIALS,
                    ROW_TILES, ROPE_16BIT, Q_FP8, Q_SCALE, CAUSAL, LATE, late,
                    MERGE_IN_GRID, o_done,
                ),
            ),
            (
                _value_wg,
                (
                    k_stages, sc_stages, ready, empty, q_smem, qpe_smem, q_ready, p_smem, a_smem,
                    p_ready, p_free, stat_smem, stat_ready, q_nope_ptr, q_pe_ptr, o_ptr, q_start,
                    rows_total, n_begin, n_end, split, num_heads, num_tokens, v_scale,
                    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split,
                    stride_o_t, stride_o_h, mult_ptr, q_scale_ptr, stride_qs_t, q_scale_val, 1,
                    BLOCK_M, D_CKV, D_KPE, TOKEN_GROUP, STAGES, FP8_CVT, HALF_PARTIALS,
                    ROW_TILES, ROPE_16BIT, Q_FP8, Q_SCALE, CAUSAL, LATE, late,
                    MERGE_IN_GRID, o_done,
                ),
            ),
            (
                fp8_copier,
                (
                    k_stages, pe_stages, sc_stages, ready, empty, ckv8, kpe8, scale_arr_ptr,
                    page_base, n_entries, num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end,
                    stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s, stride_sa_p,
                    stride_sa_s, PAGE_SIZE, D_CKV, D_KPE, TOKEN_GROUP, STAGES, COPIER_WARPS,
                    ROPE_16BIT, LATE, late, BLOCK_M, CAUSAL, SPARSE_LISTS, ent_stages,
                ),
            ),
        ],
        [4, 4, COPIER_WARPS],
        [VALUE_REGS, VALUE_REGS, COPIER_REGS],
    )  # fmt: skip
    if MERGE_IN_GRID:
        # the scores' LSE stored by this partition, both value warpgroups' partials by
        # theirs: the request's programs meet, then each merges its rows
        mbarrier.wait(o_done, 0)
        thread_barrier()
        splits = gl.num_programs(2)
        programs = gl.num_programs(0) * splits  # MERGE_IN_GRID 2: twice the splits
        request_barrier(sync_ptr + b, programs)
        thread_barrier()
        factor = 1.0
        if HALF_PARTIALS:  # fp16 partials without the V scale
            factor = v_scale
        merge_rows(
            o_ptr, lse_ptr, out_ptr, out_lse_ptr, q_start, rows_merged,
            gl.program_id(0) * splits + split, programs, splits, num_heads, num_tokens,
            stride_o_split, stride_o_t, stride_o_h, stride_lse_split, stride_lse_t,
            stride_out_t, stride_out_h, stride_out_lse_t, factor, WRITE_OUT_LSE, D_CKV, 16,
            2 if MERGE_IN_GRID == 2 else 1,
        )  # fmt: skip
