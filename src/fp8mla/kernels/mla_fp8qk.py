"""Hopper (SM90) MLA decode of FP8 pools for ≤ 32 query rows per request, in Gluon, with the
pool's FP8 bytes used as they are: ``Q·Kᵀ`` on FP8 tensor cores, no fp16 copy of the tile.

The few-row kernel (``kernels/mla_fewrows.py``) converts every FP8 tile into an fp16 copy in
shared memory; the producers that load, convert and store it set its pace, and the FP8 pool
gains nothing from its smaller bytes there (``benchmarks/NOTES-2026-12-01.md``, round 14). Here:

* a **copier** warpgroup (``kernels/fp8qk_stage.py``, with the query staging) moves each
  64-token tile's FP8 rows through the page table into one of ``STAGES`` shared stages by
  ``cp.async`` (16 bytes at a time, to their 128-byte-swizzled places; no registers, no
  conversion); each thread's copies arrive on the stage's barrier when they land. A bad page
  entry's token reads the launcher's NaN row;
* the **score warpgroup** (the default partition, ``kernels/fp8qk_score.py``) computes
  ``S [64, 64 tokens] = Q₈ · K₈ᵀ`` in FP8 × FP8 wgmma straight from the stage. The query is
  held in shared memory as two e4m3 halves scaled per row by a power of two,
  ``q·s = hi + lo/16`` (exact for bf16 queries), as wgmma's 64 rows: rows ``16w + g`` hi and
  ``16w + 8 + g`` lo of query row ``8w + g``, so one thread holds both and adds them. The
  latent part is summed in four 128-column parts, each by the tensor cores and then in fp32
  (Hopper's FP8 wgmma accumulates at reduced precision: one 512-column sum measured LSE errors
  of 3.9e-3, four parts 0.9e-3), the RoPE part apart (its scale differs). Then the online
  softmax over the tile's tokens (a row's 64 tokens sit in the four lanes of a quad); ``P``
  (fp16) and the rescale factor go to shared memory. The next tile's first products run on
  the tensor cores during this tile's softmax;
* two **value warpgroups** first stage the query (half each), then each owns 256 of the 512
  output columns: ``Oᵀ [256, R] += Vᵀ · Pᵀ`` with ``Vᵀ`` as wgmma's register operand, read
  from the stage's FP8 bytes (8 adjacent bytes per thread and token, converted to fp16 in
  registers), in two 32-token steps. The register operand fixes which (row, token) each
  thread holds; the output columns are permuted instead: accumulator row
  ``m = g + 8h + 16w + 64a + 128b`` is latent column ``π(m) = 64w + 8g + 4b + 2a + h``, so a
  thread's 8 rows are 8 adjacent bytes of the FP8 row (and 8 adjacent outputs). A split's
  partial output is stored in fp16 (``HALF_PARTIALS``: half the bytes this kernel writes and
  the merge reads) as ``o / l`` without the V scale: an average of FP8 values, within fp16's
  range for e4m3 and e5m2 (with token-group scales, of the fp16 ``V`` operand's values); the
  merge multiplies by the V scale, which the kernel stores beside the partials.

Shared memory for ``STAGES`` = 4: the stages 160 KB (37 KB each with the RoPE part, 1 KB of
token-group scales where used), the query 36 KB, ``P`` 8 KB (about 190 KB: one program per
SM). Same arguments and results as ``_mla_attn_fewrows_kernel``; a request of more query rows
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

from fp8mla.kernels.fewrows_producer import _BARRIER, BLOCK_N, _stamp
from fp8mla.kernels.fp8qk_score import HALF_N, RQ, _score_wg
from fp8mla.kernels.fp8qk_stage import _copier, _stage_query_half, _tile_rows
from fp8mla.kernels.mla_wgmma import _request_span
from fp8mla.kernels.portable import fp8_decode as T
from fp8mla.kernels.portable.grid_dependency import launch_dependents, wait_prior

HALF = gl.constexpr(256)  # output columns per value warpgroup
# measurement only: the PROBE bits that take each tile without the value warpgroups' products
# (1: no products at all, 32: the value warpgroups' alone)
NO_VALUE_PRODUCTS = gl.constexpr(1 | 32)

# Half a value tile [32 tokens, 256 latent columns] as the value warpgroups read it: 8 adjacent
# bytes per thread and token (the register operand's rows m8, m64, m128), its tokens as the
# register operand's K (k1, k8, k16 in registers, k2, k4 across lanes)
V_LOAD = gl.constexpr(
    gl.DistributedLinearLayout(
        reg_bases=[[0, 1], [0, 2], [0, 4], [1, 0], [8, 0], [16, 0]],
        lane_bases=[[2, 0], [4, 0], [0, 8], [0, 16], [0, 32]],
        warp_bases=[[0, 64], [0, 128]],
        block_bases=[],
        shape=[32, 256],
    )
)

SC_HALF = gl.constexpr(gl.BlockedLayout([1, 1], [8, 4], [4, 1], [1, 0]))  # [32 tokens, 4] scales


@gluon.jit
def _value_operand(
    k_stages, sc_stages, st, kh: gl.constexpr, H: gl.constexpr, TOKEN_GROUP: gl.constexpr,
    FP8_CVT: gl.constexpr, a_l: gl.constexpr, PROBE: gl.constexpr = 0,
):  # fmt: skip
    """``Vᵀ`` of tokens ``32kh … 32kh + 31`` of stage ``st``, latent columns ``256H + π(m)``,
    as wgmma's fp16 register operand ``[256, 32]`` (token-group scales applied; zeros with
    ``PROBE`` bit 128, a measurement of the products without the operand's loads)."""
    if PROBE & 128:
        return gl.zeros([HALF, HALF_N], gl.float16, a_l)
    v8 = k_stages.index(st).slice(H * HALF, HALF, dim=1).slice(kh * HALF_N, HALF_N, dim=0)
    v = T.fp8_bytes_to_f16(v8.load(V_LOAD).to(gl.uint8, bitcast=True), FP8_CVT)  # exact
    if TOKEN_GROUP:  # this warpgroup's two groups: columns 0-127 and 128-255
        sc = sc_stages.index(st).slice(kh * HALF_N, HALF_N, dim=0).load(SC_HALF)
        g = gl.arange(0, 4, layout=gl.SliceLayout(0, SC_HALF))[None, :]
        tok_v: gl.constexpr = gl.SliceLayout(1, V_LOAD)
        sc0 = gl.convert_layout(gl.sum(gl.where(g == 2 * H, sc, 0.0), axis=1), tok_v)
        sc1 = gl.convert_layout(gl.sum(gl.where(g == 2 * H + 1, sc, 0.0), axis=1), tok_v)
        dl = gl.arange(0, HALF, layout=gl.SliceLayout(0, V_LOAD))[None, :]
        v = (v.to(gl.float32) * gl.where(dl < 128, sc0[:, None], sc1[:, None])).to(gl.float16)
    # Vᵀ with its rows permuted: a[m, k] = v[k, π(m)]
    v = gl.reshape(v, [HALF_N, 4, 8, 2, 2, 2])  # [k, w, g, b, a, h]
    v = gl.permute(v, (3, 4, 1, 5, 2, 0))  # [b, a, w, h, g, k]
    return gl.convert_layout(gl.reshape(v, [HALF, HALF_N]), a_l)


@gluon.jit
def _store_output(
    o, o_ptr, q_start, rows_total, split, num_heads, num_tokens, stride_o_split, stride_o_t,
    stride_o_h, H: gl.constexpr, BLOCK_R: gl.constexpr, ROW_TILES: gl.constexpr,
    PROBE: gl.constexpr, trace_ptr,
):  # fmt: skip
    """Value warpgroup ``H``'s output ``Oᵀ [256, R]`` (accumulator layout, already scaled) into
    columns ``256H …`` of the row tile's outputs (:func:`_tile_rows`; split ``split``'s
    partials, or the output)."""
    # accumulator row m = g + 8h + 16w + 64a + 128b is latent column 64w + 8g + 4b + 2a + h:
    # reordered in registers (each thread then holds 8 adjacent columns of a row), then put
    # in the store layout: 16-bit values as they are, fp32 4 adjacent columns per thread
    out = gl.reshape(o, [2, 2, 4, 2, 8, BLOCK_R])  # [b, a, w, h, g, n]
    out = gl.reshape(gl.permute(out, (2, 4, 0, 1, 3, 5)), [HALF, BLOCK_R])
    if o_ptr.dtype.element_ty.primitive_bitwidth == 16:
        # fp16 partials or a 16-bit output: each thread's 8 adjacent columns of a row are
        # 16 contiguous bytes, and a store instruction's lanes write 4 rows × 128 contiguous
        # bytes (whole sectors) from where the reorder left them: only the registers' order
        # changes (n: j, t, k of the accumulator; columns: h, a, b in registers, g in lanes)
        if BLOCK_R == 64:  # (the FP8 ping-pong kernel's 64 rows, kernels/mla_pp8.py)
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [4, 0], [0, 1], [0, 8], [0, 16], [0, 32]],
                lane_bases=[[0, 2], [0, 4], [8, 0], [16, 0], [32, 0]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        elif BLOCK_R == 32:
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [4, 0], [0, 1], [0, 8], [0, 16]],
                lane_bases=[[0, 2], [0, 4], [8, 0], [16, 0], [32, 0]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        else:
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [4, 0], [0, 1], [0, 8]],
                lane_bases=[[0, 2], [0, 4], [8, 0], [16, 0], [32, 0]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        out = gl.convert_layout(out, o_st, assert_trivial=True)
    else:
        # fp32: each store instruction: 16 lanes × 16 bytes = one row's 256 contiguous bytes,
        # two rows (whole 32-byte sectors; 16 bytes per lane at a 32-byte stride half-filled
        # each sector and took twice the L2 writes)
        if BLOCK_R == 64:
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [0, 2], [0, 4], [0, 8], [0, 16], [0, 32]],
                lane_bases=[[4, 0], [8, 0], [16, 0], [32, 0], [0, 1]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        elif BLOCK_R == 32:
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [0, 2], [0, 4], [0, 8], [0, 16]],
                lane_bases=[[4, 0], [8, 0], [16, 0], [32, 0], [0, 1]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        else:
            o_st: gl.constexpr = gl.DistributedLinearLayout(
                reg_bases=[[1, 0], [2, 0], [0, 2], [0, 4], [0, 8]],
                lane_bases=[[4, 0], [8, 0], [16, 0], [32, 0], [0, 1]],
                warp_bases=[[64, 0], [128, 0]], block_bases=[], shape=[HALF, BLOCK_R],
            )  # fmt: skip
        out = gl.convert_layout(out, o_st)
    _stamp(trace_ptr, 1 + H, 1, 6, PROBE)
    row0, rows_end = _tile_rows(rows_total, BLOCK_R, ROW_TILES)
    r = row0 + gl.arange(0, BLOCK_R, layout=gl.SliceLayout(0, o_st))
    tok = q_start + r // num_heads
    r_ok = (r < rows_end) & (tok < num_tokens)
    if PROBE & 16:  # measurement only: the stores issued, none writes (what their bytes cost)
        r_ok = r_ok & (num_tokens < 0)  # (a runtime value: the stores stay in the code)
    base = o_ptr + split * stride_o_split + tok.to(gl.int64) * stride_o_t
    base += (r % num_heads) * stride_o_h + H * HALF
    col = gl.arange(0, HALF, layout=gl.SliceLayout(1, o_st))
    gl.store(base[None, :] + col[:, None], out.to(o_ptr.dtype.element_ty), mask=r_ok[None, :])


@gluon.jit
def _value_wg(
    k_stages, sc_stages, ready, empty, q_smem, qpe_smem, q_ready, p_smem, a_smem, p_ready, p_free,
    stat_smem, stat_ready, q_nope_ptr, q_pe_ptr, o_ptr, q_start, rows_total, n_begin, n_end,
    split, num_heads, num_tokens, v_scale, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h,
    stride_o_split, stride_o_t, stride_o_h, mult_ptr,
    H: gl.constexpr, BLOCK_R: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr,
    TOKEN_GROUP: gl.constexpr, STAGES: gl.constexpr, FP8_CVT: gl.constexpr,
    HALF_PARTIALS: gl.constexpr, ROW_TILES: gl.constexpr, PROBE: gl.constexpr, trace_ptr,
):  # fmt: skip
    """Value warpgroup ``H``: its half of the query staging, then output columns
    ``256H + π(m)`` of ``Oᵀ += Vᵀ·Pᵀ`` in two 32-token steps per tile, ``Vᵀ`` read from the
    stage's FP8 bytes into wgmma's register operand (the second step's bytes are read and
    converted while the first step's products run)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_R, 16]
    )
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)  # along the query rows (N)
    _stamp(trace_ptr, 1 + H, 2, 6, PROBE)
    _stage_query_half(
        q_smem, qpe_smem, stat_smem, q_ready, q_nope_ptr, q_pe_ptr, q_start, rows_total,
        num_heads, num_tokens, stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, H, D_CKV,
        D_KPE, BLOCK_R, ROW_TILES, PROBE,
    )  # fmt: skip
    _stamp(trace_ptr, 1 + H, 2, 7, PROBE)
    o = gl.zeros([HALF, BLOCK_R], gl.float32, layout=mma)
    n_tiles = gl.cdiv(n_end - n_begin, BLOCK_N)
    for j in range(n_tiles):
        st = j % STAGES
        b = j % 2
        mbarrier.wait(ready.index(st), (j // STAGES) & 1)
        if PROBE & NO_VALUE_PRODUCTS:  # measurement only: the tile taken without its products
            mbarrier.wait(p_ready.index(b), (j // 2) & 1)
            _stamp(trace_ptr, 1 + H, j, 0, PROBE)
            _BARRIER()
            mbarrier.arrive(empty.index(st))
            _BARRIER()
            mbarrier.arrive(p_free.index(b))
        else:
            if not TOKEN_GROUP:  # the first half's operand needs only the stage: built
                # while P is on its way (with the group scales, its registers would spill)
                a0 = _value_operand(k_stages, sc_stages, st, 0, H, TOKEN_GROUP, FP8_CVT, a_l, PROBE)
            mbarrier.wait(p_ready.index(b), (j // 2) & 1)
            _stamp(trace_ptr, 1 + H, j, 0, PROBE)
            alpha = a_smem.index(b).slice(0, BLOCK_R).load(col_l)
            o = o * alpha[None, :]
            if TOKEN_GROUP:
                a0 = _value_operand(k_stages, sc_stages, st, 0, H, TOKEN_GROUP, FP8_CVT, a_l, PROBE)
            o = warpgroup_mma(a0, p_smem.index(2 * b).slice(0, BLOCK_R, dim=0).permute((1, 0)), o,
                              is_async=True)  # fmt: skip
            # the first half's products done before the second half's operand is built: its
            # registers are free again, so 136 per value warpgroup suffice and ptxas does not
            # serialize the kernel's wgmma (C7512) with the score warpgroup's four sums
            o = warpgroup_mma_wait(0, deps=[o, a0])[0]
            a1 = _value_operand(k_stages, sc_stages, st, 1, H, TOKEN_GROUP, FP8_CVT, a_l, PROBE)
            _BARRIER()
            mbarrier.arrive(empty.index(st))  # the stage's bytes are in registers
            o = warpgroup_mma(a1, p_smem.index(2 * b + 1).slice(0, BLOCK_R, dim=0).permute((1, 0)),
                              o, is_async=True)  # fmt: skip
            o = warpgroup_mma_wait(0, deps=[o, a1])[0]
            _BARRIER()
            mbarrier.arrive(p_free.index(b))
        _stamp(trace_ptr, 1 + H, j, 1, PROBE)
    mbarrier.wait(stat_ready, 0)
    _stamp(trace_ptr, 1 + H, 0, 6, PROBE)
    l_i = stat_smem.index(1).slice(0, BLOCK_R).load(col_l)
    has = l_i > 0.0
    if HALF_PARTIALS:  # o / l stored, the V scale beside it for the merge
        inv_l = gl.where(has, 1.0 / gl.where(has, l_i, 1.0), 0.0)
        if H == 0:
            gl.store(mult_ptr, v_scale)
    else:
        inv_l = gl.where(has, v_scale / gl.where(has, l_i, 1.0), 0.0)
    _store_output(
        o * inv_l[None, :], o_ptr, q_start, rows_total, split, num_heads, num_tokens,
        stride_o_split, stride_o_t, stride_o_h, H, BLOCK_R, ROW_TILES, PROBE, trace_ptr,
    )  # fmt: skip
    _stamp(trace_ptr, 1 + H, 0, 7, PROBE)


@gluon.jit(do_not_specialize=["num_tokens", "num_pages"])
def _mla_attn_fp8qk_kernel(
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
    # land on SMs this grid has left, not piled on the few it never took; measured on the
    # H200, benchmarks/NOTES-2026-12-01.md round 17)
    LAUNCH_DEPENDENTS: gl.constexpr = 2,
    # launched as a programmatic dependent of the grid before it on the stream: the barriers
    # are set up, then griddepcontrol.wait before the first global read
    WAIT_PRIOR: gl.constexpr = False,
    # the split partials in fp16 without the V scale, which goes to mult_ptr (one fp32) for
    # the merge (attention.workspace.Partials)
    HALF_PARTIALS: gl.constexpr = False,
    # the grid's first axis counts row tiles of BLOCK_M rows (requests of more rows than one
    # tile); False: one tile per request, the kernel compiled without the row arithmetic
    ROW_TILES: gl.constexpr = False,
    # measurement only, bits: 1 the tiles taken without the products (the copier's pace),
    # 2 every tile from the cache's first rows (loads that hit the L2), 4 the query staged
    # from ones, not loaded (the start without the query's loads), 8 cycle stamps into
    # ``trace_ptr`` (_stamp), 16 the output's stores masked off (their bytes' cost), 32 the
    # value warpgroups take each tile without their products, 64 the score warpgroup does,
    # 128 the value warpgroups' products run on a zero operand (no V loads or conversion)
    PROBE: gl.constexpr = 0,
    trace_ptr=None,
    mult_ptr=None,
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
    pe_stages = gl.allocate_shared_memory(KV8, [STAGES, BLOCK_N, D_KPE], pe_sh)
    sc_stages = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N, 4], vec2_sh)
    q_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 * RQ, D_CKV], k_sh)
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
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=COPIER_WARPS * 32)  # every copier thread's copies
        mbarrier.init(empty.index(i), count=2)  # both value warpgroups
    for i in gl.static_range(2):
        mbarrier.init(p_ready.index(i), count=1)
        mbarrier.init(p_free.index(i), count=2)
    mbarrier.init(stat_ready, count=1)
    mbarrier.init(q_ready, count=2)  # both value warpgroups stage half of the query
    fence_async_shared()
    _BARRIER()

    if WAIT_PRIOR:  # a programmatic dependent: no global read before the prior grid ends
        wait_prior()
    m_tile = 0
    if ROW_TILES:
        m_tile = gl.program_id(0)
    b = gl.program_id(1)
    split = gl.program_id(2)
    (q_start, qo_len, rows_total, kv_len, n_begin, n_end, page_base, n_entries, qk_scale,
     pe_factor, v_scale) = _request_span(
        qo_indptr_ptr, kv_indptr_ptr, kv_indices_ptr, kv_len_ptr, ckv_scale_ptr, kpe_scale_ptr,
        ckv_scale_val, kpe_scale_val, sm_scale_log2, b, m_tile, split, num_heads, num_indices,
        BLOCK_M, BLOCK_N, CAUSAL, CKV_SCALE_PTR, KPE_SCALE_PTR, TOKEN_GROUP, FP8_CVT,
    )  # fmt: skip

    gl.warp_specialize(
        [
            (
                _score_wg,
                (
                    k_stages, pe_stages, sc_stages, ready, q_smem, qpe_smem, q_ready, p_smem,
                    a_smem, p_ready, p_free, stat_smem, stat_ready, lse_ptr, q_start, qo_len,
                    rows_total, kv_len, n_begin, n_end, split, num_heads, num_tokens, qk_scale,
                    pe_factor, stride_lse_split, stride_lse_t, D_CKV, D_KPE, CAUSAL, WRITE_LSE,
                    TOKEN_GROUP, STAGES, QK_PARTS, LAUNCH_DEPENDENTS, BLOCK_M, ROW_TILES, PROBE,
                    trace_ptr,
                ),
            ),
            (
                _value_wg,
                (
                    k_stages, sc_stages, ready, empty, q_smem, qpe_smem, q_ready, p_smem, a_smem,
                    p_ready, p_free, stat_smem, stat_ready, q_nope_ptr, q_pe_ptr, o_ptr, q_start,
                    rows_total, n_begin, n_end, split, num_heads, num_tokens, v_scale,
                    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split,
                    stride_o_t, stride_o_h, mult_ptr, 0, BLOCK_M, D_CKV, D_KPE, TOKEN_GROUP,
                    STAGES, FP8_CVT, HALF_PARTIALS, ROW_TILES, PROBE, trace_ptr,
                ),
            ),
            (
                _value_wg,
                (
                    k_stages, sc_stages, ready, empty, q_smem, qpe_smem, q_ready, p_smem, a_smem,
                    p_ready, p_free, stat_smem, stat_ready, q_nope_ptr, q_pe_ptr, o_ptr, q_start,
                    rows_total, n_begin, n_end, split, num_heads, num_tokens, v_scale,
                    stride_qn_t, stride_qn_h, stride_qp_t, stride_qp_h, stride_o_split,
                    stride_o_t, stride_o_h, mult_ptr, 1, BLOCK_M, D_CKV, D_KPE, TOKEN_GROUP,
                    STAGES, FP8_CVT, HALF_PARTIALS, ROW_TILES, PROBE, trace_ptr,
                ),
            ),
            (
                _copier,
                (
                    k_stages, pe_stages, sc_stages, ready, empty, ckv8, kpe8, scale_arr_ptr,
                    page_base, n_entries, num_pages, nan_row_ckv, nan_row_kpe, n_begin, n_end,
                    stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s, stride_sa_p,
                    stride_sa_s, PAGE_SIZE, D_CKV, D_KPE, TOKEN_GROUP, STAGES, COPIER_WARPS, PROBE,
                    trace_ptr,
                ),
            ),
        ],
        [4, 4, COPIER_WARPS],
        [VALUE_REGS, VALUE_REGS, COPIER_REGS],
    )  # fmt: skip
