"""Hopper (SM90) MLA attention for many query rows, in Gluon: one Q·Kᵀ shared by two warpgroups.

The Triton kernels cannot place their warps on Hopper: for a 64-row tile Triton gives both
warpgroups the same 64 rows, so each computes the whole score tile and holds half of the output
(or one warpgroup holds all 512 output columns and spills). Here the layouts are explicit: one
program owns 64 query rows and two warpgroups split the *columns* of every product --

* ``S = Q·Kᵀ`` ``[64, BLOCK_N]``: each warpgroup computes ``BLOCK_N / 2`` of the KV tokens;
  the row maximum and sum cross the two warpgroups through shared memory;
* ``O += P·V`` ``[64, 512]``: each warpgroup accumulates 256 of the output columns in
  registers (128 fp32 per thread), reading the whole ``P`` from shared memory.

The query tile is converted to fp16 and staged in shared memory once. Each KV step converts
the FP8 tile once into one fp16 shared tile that both products read -- keys for Q·Kᵀ (K-major)
and values for P·V (the same bytes, MN-major). The FP8 bytes of the next tile are copied into a
staging buffer (``cp.async``) while the current one is multiplied, and the page-table entries
run one more tile ahead, so neither latency is exposed. The softmax runs in base 2 as in the
Triton kernels; ``S`` and the output are fp32 accumulators.

Shared memory (RoPE part included): the query 72 KB, the fp16 KV tile 72 KB, the FP8 staging
36 KB, P 8 KB (188 KB: one program per SM). Same arguments and results as ``_mla_attn_rows_kernel``
(``kernels/mla_attention.py``); ``BLOCK_M`` and ``BLOCK_N`` are 64, ``num_warps`` 8, the KV FP8
(read as bytes) with a 64-dim RoPE part. Gluon has no interpreter: this kernel runs on SM90 GPUs
only, and the planner picks it only there.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from fp8mla.kernels import mla_tiles as T

# Gluon names that changed after Triton 3.6: a CTA-wide barrier, the cp.async copy
_BARRIER = gl.thread_barrier if hasattr(gl, "thread_barrier") else gl.barrier
_ASYNC_LOAD = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared

CHUNK = gl.constexpr(128)  # latent columns per query load step
CVT_COLS = gl.constexpr(256)  # latent columns per FP8 → fp16 step (register budget)
NEG_INF = gl.constexpr(float("-inf"))


@gluon.jit
def _fp8_to_f16(b, FP8_CVT: gl.constexpr):
    """FP8 codes → fp16: Triton's cast for ``CVT_NATIVE`` (FP8 pointers), else the bit moves
    of ``mla_tiles._fp8_bytes_to_f16`` on the bytes."""
    if FP8_CVT == T.CVT_NATIVE:
        return b.to(gl.float16)
    return T._fp8_bytes_to_f16(b, FP8_CVT)


@gluon.jit
def _tile_pages(page_base, n0, n_end, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr,
                layout: gl.constexpr):  # fmt: skip
    """Page-table entries of the ``BLOCK_N`` tokens from ``n0`` (0 at or past ``n_end``), loaded
    a step ahead of the copies that need them."""
    pos = n0 + gl.arange(0, BLOCK_N, layout=layout)
    return gl.load(page_base + pos // PAGE_SIZE, mask=pos < n_end, other=0)


@gluon.jit
def _stage_kv_tile(
    kb_smem, kpeb_smem, ckv_ptr, kpe_ptr, pages, pe_pages, n0, n_end,
    stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s,
    PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr, D_CKV: gl.constexpr, D_KPE: gl.constexpr,
    cp: gl.constexpr, pe_cp: gl.constexpr,
):  # fmt: skip
    """Start copying the FP8 bytes of the ``BLOCK_N`` tokens from ``n0`` (on ``pages``, from
    :func:`_tile_pages` in the two copy layouts) into the staging buffers (``cp.async``, one
    commit group); tokens at or past ``n_end`` are filled with 0."""
    pos = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cp))
    rows = pages.to(gl.int64) * stride_ckv_p + (pos % PAGE_SIZE) * stride_ckv_s
    d = gl.arange(0, D_CKV, layout=gl.SliceLayout(0, cp))
    _ASYNC_LOAD(kb_smem, ckv_ptr + rows[:, None] + d[None, :], mask=(pos < n_end)[:, None])
    pos = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, pe_cp))
    rows = pe_pages.to(gl.int64) * stride_kpe_p + (pos % PAGE_SIZE) * stride_kpe_s
    e = gl.arange(0, D_KPE, layout=gl.SliceLayout(0, pe_cp))
    _ASYNC_LOAD(kpeb_smem, kpe_ptr + rows[:, None] + e[None, :], mask=(pos < n_end)[:, None])
    async_copy.commit_group()


@gluon.jit
def _convert_kv_tile(
    k_smem, kpe_smem, kb_smem, kpeb_smem, scale_arr_ptr, page_base, n0, n_end,
    stride_sa_p, stride_sa_s, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr,
    D_CKV: gl.constexpr, TOKEN_GROUP: gl.constexpr, FP8_CVT: gl.constexpr,
    cv: gl.constexpr, pe_cp: gl.constexpr,
):  # fmt: skip
    """The staged FP8 tile → fp16 shared tile, ``CVT_COLS`` columns at a time; with
    ``TOKEN_GROUP`` each 128 columns are multiplied by their tokens' group scale."""
    if TOKEN_GROUP:  # the tokens' scale rows, through the page table
        rows: gl.constexpr = gl.SliceLayout(1, cv)
        pos = n0 + gl.arange(0, BLOCK_N, layout=rows)
        ok = pos < n_end
        page = _tile_pages(page_base, n0, n_end, PAGE_SIZE, BLOCK_N, rows).to(gl.int64)
        sa = scale_arr_ptr + page * stride_sa_p + (pos % PAGE_SIZE) * stride_sa_s
        col = gl.arange(0, CVT_COLS, layout=gl.SliceLayout(0, cv))
    for c in gl.static_range(D_CKV // CVT_COLS):
        k = _fp8_to_f16(kb_smem.slice(c * CVT_COLS, CVT_COLS, dim=1).load(cv), FP8_CVT)
        if TOKEN_GROUP:
            g0 = sa + c * (CVT_COLS // 128)
            sc = gl.load(g0, mask=ok, other=0.0)[:, None]
            sc = sc + gl.zeros([1, CVT_COLS], gl.float32, layout=cv)
            for g in gl.static_range(1, CVT_COLS // 128):
                sg = gl.load(g0 + g, mask=ok, other=0.0)
                sc = gl.where((col >= g * 128)[None, :], sg[:, None], sc)
            k = (k.to(gl.float32) * sc).to(gl.float16)
        k_smem.slice(c * CVT_COLS, CVT_COLS, dim=1).store(k)
    kpe_smem.store(_fp8_to_f16(kpeb_smem.load(pe_cp), FP8_CVT))


@gluon.jit
def _mla_attn_wgmma_kernel(
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
    gl.static_assert(gl.num_warps() == 8, "two warpgroups")
    gl.static_assert(ckv_ptr.dtype.element_ty.primitive_bitwidth == 8, "FP8 KV")

    # -- layouts: two warpgroups split the columns of both products --
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, BLOCK_N // 2, 16]
    )
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, D_CKV // 2, 16]
    )
    s_rows: gl.constexpr = gl.SliceLayout(1, s_layout)
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    # global loads: 16 contiguous bytes per thread, 8 threads per 128-byte row chunk
    # cp.async of the FP8 tile (16 bytes per thread and copy) and its conversion
    cp: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [8, 1], [1, 0])
    cv: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [8, 1], [1, 0])
    q_ld: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [8, 1], [1, 0])
    pe_ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    pe_rows: gl.constexpr = gl.SliceLayout(1, pe_ld)
    q_rows_l: gl.constexpr = gl.SliceLayout(1, q_ld)
    sh: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    q_smem = gl.allocate_shared_memory(DOT_DTYPE, [BLOCK_M, D_CKV], sh)
    qpe_smem = gl.allocate_shared_memory(DOT_DTYPE, [BLOCK_M, D_KPE], sh)
    k_smem = gl.allocate_shared_memory(DOT_DTYPE, [BLOCK_N, D_CKV], sh)
    kpe_smem = gl.allocate_shared_memory(DOT_DTYPE, [BLOCK_N, D_KPE], sh)
    p_smem = gl.allocate_shared_memory(DOT_DTYPE, [BLOCK_M, BLOCK_N], sh)
    # FP8 bytes of the next KV tile, copied while the current one is multiplied
    kb_smem = gl.allocate_shared_memory(
        ckv_ptr.dtype.element_ty, [BLOCK_N, D_CKV], gl.NVMMASharedLayout(128, 8, rank=2)
    )
    kpeb_smem = gl.allocate_shared_memory(
        kpe_ptr.dtype.element_ty, [BLOCK_N, D_KPE], gl.NVMMASharedLayout(64, 8, rank=2)
    )

    m_tile = gl.program_id(0)
    b = gl.program_id(1)
    split = gl.program_id(2)
    q_start = gl.load(qo_indptr_ptr + b)
    qo_len = gl.load(qo_indptr_ptr + b + 1) - q_start
    rows_total = qo_len * num_heads
    if m_tile * BLOCK_M < rows_total:
        qk_scale, pe_factor, v_scale = T._scales(
            ckv_scale_ptr, kpe_scale_ptr, ckv_scale_val, kpe_scale_val, sm_scale_log2,
            CKV_SCALE_PTR, KPE_SCALE_PTR, TOKEN_GROUP, FP8_CVT,
        )  # fmt: skip

        # -- this split's KV range; causal tiles end where their last row stops seeing --
        kv_len = gl.load(kv_len_ptr + b)
        kv_end = kv_len
        if CAUSAL:
            last_t = gl.minimum((m_tile * BLOCK_M + BLOCK_M - 1) // num_heads, qo_len - 1)
            kv_end = gl.minimum(kv_len, kv_len - qo_len + last_t + 1)
        per_split = gl.cdiv(gl.cdiv(kv_end, gl.num_programs(2)), BLOCK_N) * BLOCK_N
        n_begin = split * per_split
        n_end = gl.minimum(n_begin + per_split, kv_end)
        page_base = kv_indices_ptr + gl.load(kv_indptr_ptr + b)

        # -- the query tile, in the dot dtype, into shared memory --
        r = m_tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=q_rows_l)
        r_ok = r < rows_total
        q_rows = q_nope_ptr + (q_start + r // num_heads).to(gl.int64) * stride_qn_t
        q_rows += (r % num_heads) * stride_qn_h
        for c in gl.static_range(D_CKV // CHUNK):
            d = c * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, q_ld))
            q = gl.load(q_rows[:, None] + d[None, :], mask=r_ok[:, None], other=0.0)
            q_smem.slice(c * CHUNK, CHUNK, dim=1).store(q.to(DOT_DTYPE))
        rp = m_tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=pe_rows)
        rp_ok = rp < rows_total
        qp_rows = q_pe_ptr + (q_start + rp // num_heads).to(gl.int64) * stride_qp_t
        qp_rows += (rp % num_heads) * stride_qp_h
        e = gl.arange(0, D_KPE, layout=gl.SliceLayout(0, pe_ld))
        qp = gl.load(qp_rows[:, None] + e[None, :], mask=rp_ok[:, None], other=0.0)
        qpe_smem.store((qp.to(gl.float32) * pe_factor).to(DOT_DTYPE))

        # the last KV position each row may see (bottom-right causal alignment)
        rs = m_tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=s_rows)
        causal_limit = kv_len - qo_len + rs // num_heads

        m_i = gl.full([BLOCK_M], NEG_INF, gl.float32, layout=s_rows)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=s_rows)
        o = gl.zeros([BLOCK_M, D_CKV], gl.float32, layout=o_layout)
        s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)

        cp_rows: gl.constexpr = gl.SliceLayout(1, cp)
        pe_rows_l: gl.constexpr = gl.SliceLayout(1, pe_ld)
        pages = _tile_pages(page_base, n_begin, n_end, PAGE_SIZE, BLOCK_N, cp_rows)
        pe_pages = _tile_pages(page_base, n_begin, n_end, PAGE_SIZE, BLOCK_N, pe_rows_l)
        _stage_kv_tile(
            kb_smem, kpeb_smem, ckv_ptr, kpe_ptr, pages, pe_pages, n_begin, n_end, stride_ckv_p,
            stride_ckv_s, stride_kpe_p, stride_kpe_s, PAGE_SIZE, BLOCK_N, D_CKV, D_KPE, cp, pe_ld,
        )  # fmt: skip
        # page-table entries run one tile ahead of the copies
        pages = _tile_pages(page_base, n_begin + BLOCK_N, n_end, PAGE_SIZE, BLOCK_N, cp_rows)
        pe_pages = _tile_pages(page_base, n_begin + BLOCK_N, n_end, PAGE_SIZE, BLOCK_N, pe_rows_l)
        for n0 in range(n_begin, n_end, BLOCK_N):
            # this tile's bytes have landed; both warpgroups' previous P·V is done with the fp16
            # KV tile and P
            async_copy.wait_group(0)
            _BARRIER()
            _convert_kv_tile(
                k_smem, kpe_smem, kb_smem, kpeb_smem, scale_arr_ptr, page_base, n0, n_end,
                stride_sa_p, stride_sa_s, PAGE_SIZE, BLOCK_N, D_CKV, TOKEN_GROUP, FP8_CVT, cv,
                pe_ld,
            )  # fmt: skip
            fence_async_shared()
            _BARRIER()
            # the next tile's bytes are copied while this one is multiplied
            _stage_kv_tile(
                kb_smem, kpeb_smem, ckv_ptr, kpe_ptr, pages, pe_pages, n0 + BLOCK_N, n_end,
                stride_ckv_p, stride_ckv_s, stride_kpe_p, stride_kpe_s, PAGE_SIZE, BLOCK_N,
                D_CKV, D_KPE, cp, pe_ld,
            )  # fmt: skip
            pages = _tile_pages(page_base, n0 + 2 * BLOCK_N, n_end, PAGE_SIZE, BLOCK_N, cp_rows)
            pe_pages = _tile_pages(
                page_base, n0 + 2 * BLOCK_N, n_end, PAGE_SIZE, BLOCK_N, pe_rows_l
            )
            # S = Q·Kᵀ over the latent and RoPE parts
            s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma(qpe_smem, kpe_smem.permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(0, deps=[s])

            pos = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            visible = (pos < n_end)[None, :]
            if CAUSAL:
                visible = visible & (pos[None, :] <= causal_limit[:, None])
            s = gl.where(visible, s * qk_scale, NEG_INF)
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_use = gl.where(m_new == NEG_INF, 0.0, m_new)
            alpha = gl.exp2(m_i - m_use)
            p = gl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            p_smem.store(p.to(DOT_DTYPE))
            o = o * gl.convert_layout(alpha, o_rows)[:, None]
            fence_async_shared()
            _BARRIER()
            # waited for here, not at the next step's top: nothing would run in between, and an
            # accumulator in flight across the loop's back edge makes ptxas copy its registers
            # and serialize every wgmma (C7515)
            o = warpgroup_mma_wait(0, deps=[warpgroup_mma(p_smem, k_smem, o, is_async=True)])

        # -- epilogue: O / l times the value scale; LSE (base 2) --
        has = l_i > 0.0
        inv_l = gl.where(has, v_scale / gl.where(has, l_i, 1.0), 0.0)
        ro = m_tile * BLOCK_M + gl.arange(0, BLOCK_M, layout=o_rows)
        ro_ok = ro < rows_total
        o_rows_ptr = o_ptr + split * stride_o_split
        o_rows_ptr += (q_start + ro // num_heads).to(gl.int64) * stride_o_t
        o_rows_ptr += (ro % num_heads) * stride_o_h
        dcol = gl.arange(0, D_CKV, layout=gl.SliceLayout(0, o_layout))
        out = o * gl.convert_layout(inv_l, o_rows)[:, None]
        gl.store(
            o_rows_ptr[:, None] + dcol[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=ro_ok[:, None],
        )
        if WRITE_LSE:
            lse = gl.where(has, m_i + gl.log2(gl.where(has, l_i, 1.0)), NEG_INF)
            rs_ok = rs < rows_total
            lse_ptrs = lse_ptr + split * stride_lse_split
            lse_ptrs += (q_start + rs // num_heads).to(gl.int64) * stride_lse_t + rs % num_heads
            gl.store(lse_ptrs, lse, mask=rs_ok)
