"""Sparse MLA attention (DeepSeek Sparse Attention) over the packed 656-byte FP8 cache, on
every target: each query token attends to its own list of cache slots, shared by its heads.

One program per (query token, split of the token's index list, group of ``BLOCK_H`` heads,
value half), on a 1-D grid ordered value half fastest, then head group, so that the programs
reading the same slots run side by side and the later ones find the rows in the L2. With
``VALUE_SPLIT=2`` two programs share a head group, each computing the scores and 256 of the
512 output columns (a 64- or 128-row tile's full-width accumulator does not fit the
registers). Every step gathers ``BLOCK_N`` slots' rows through the index list -- 512 e4m3
bytes, 4 float32 scales and 64 bf16 RoPE values each (``fp8mla.dsa.layout``) -- and serves
all ``BLOCK_H`` heads of the token with them:

- the e4m3 bytes become fp16 exactly (``fp8_decode``; the integer modes yield 2^-8 × the value,
  ``DECODE_SCALE`` puts the 2^8 back) and stay unscaled: both dots read the same tile;
- ``S = Σ_g (q_g · k_gᵀ) × scale_g + q_pe · k_peᵀ``, one dot per 128-value scale group, the
  token's group scales applied to the fp32 scores (exact: no rounding of scaled values);
- ``O_g += (P × scale_g / ref_g) · v_g`` per group: the scales ride on the probabilities, each
  group normalized by the largest scale it has seen (``ref_g``, rescaling its accumulator as
  the online softmax does), so the fp16 operand stays ≤ 1 whatever the scales' magnitude;
- the RoPE part is read as bf16 and dotted in the query's 16-bit dtype.

A 16-bit cache (``[slots, 576]`` bf16/fp16, ``PACKED=False``) runs the same loop without scales.
Entries past ``topk_length`` are not read; ``-1`` is no token; an index below -1 or past the
cache's slots is never read either, and makes the token's rows NaN. A token with nothing to
attend to gets out 0 and LSE +inf (-inf in a split's base-2 partial). With more than one split
each program writes an fp32 partial and its base-2 LSE, and ``sparse_mla_merge_kernel``
combines them into the output and the natural-log LSE.
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.fp8_decode import CVT_NATIVE, fp8_bytes_to_f16
from fp8mla.kernels.portable.tiles import NEG_INF, log_sum_exp2, nan_if, online_softmax, out_factor

# The packed row (fp8mla.dsa.layout): NoPE bytes [0, 512), scales at byte 512 (float32 word
# 128), RoPE at byte 528 (bf16 element 264). A 16-bit cache row is NoPE [0, 512), RoPE 512…576.
GROUP = tl.constexpr(128)  # latent values per scale
SCALE_WORD = tl.constexpr(128)  # float32 index of the first scale in a packed row
ROPE_HALF = tl.constexpr(264)  # 16-bit index of the first RoPE value in a packed row
ROPE_HALF_16BIT = tl.constexpr(512)  # 16-bit index of the first RoPE value in a 16-bit row
D_ROPE = tl.constexpr(64)
LN2 = tl.constexpr(0.6931471805599453)  # ln 2: base-2 LSE to natural log
REF_FLOOR = tl.constexpr(1.1754943508222875e-38)  # 2^-126: the smallest normal float32

# Values that change between calls of one plan are not specialized on.
SPARSE_DYNAMIC_ARGS = ["num_tokens", "num_slots"]


@triton.jit
def slot_rows(
    idx_ptr,
    pos,
    n_end,
    num_slots,
    stride_page,
    stride_tok,
    PAGE_SIZE: tl.constexpr,
):
    """Rows of the index-list positions ``pos`` (< ``n_end`` are listed): ``(row, valid,
    bad)``, ``row`` the int64 address of the slot's row in units of the launcher's ``UNIT``
    bytes (0 where not ``valid``), ``valid`` a listed id in ``[0, num_slots)``, ``bad`` a listed
    id below -1 or past the cache (never read; it makes the token's rows NaN)."""
    listed = pos < n_end
    idx = tl.load(idx_ptr + pos, mask=listed, other=-1)
    valid = listed & (idx >= 0) & (idx < num_slots)
    bad = listed & ((idx < -1) | (idx >= num_slots))
    slot = tl.where(valid, idx, 0).to(tl.int64)
    if PAGE_SIZE == 1:  # every slot its own page (contiguous pages of any size are one)
        row = slot * stride_page
    else:
        row = (slot // PAGE_SIZE) * stride_page + (slot % PAGE_SIZE) * stride_tok
    return row, valid, bad


@triton.jit
def load_latent(
    kv_ptr,
    row,
    valid,
    g,
    UNIT: tl.constexpr,
    PACKED: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    FP8_CVT: tl.constexpr,
):
    """Latent values ``[128 g, 128 g + 128)`` of the rows ``[BLOCK_N, 128]`` in the dot dtype,
    unscaled (packed: e4m3 codes as fp16, × 2^-8 in the integer modes). Rows not ``valid``
    load as 0 and read nothing."""
    d = g * GROUP + tl.arange(0, GROUP)
    if PACKED:
        offs = (row * UNIT)[:, None] + d[None, :]
        if FP8_CVT == CVT_NATIVE:  # an e4m3 pointer: Triton's cast decodes
            codes = tl.load(kv_ptr + offs, mask=valid[:, None], other=0.0)
            latent = codes.to(tl.float16)
        else:  # bytes
            codes = tl.load(kv_ptr + offs, mask=valid[:, None], other=0)
            latent = fp8_bytes_to_f16(codes, FP8_CVT)
        return latent.to(DOT_DTYPE)
    offs = (row * (UNIT // 2))[:, None] + d[None, :]
    return tl.load(kv_ptr + offs, mask=valid[:, None], other=0.0).to(DOT_DTYPE)


@triton.jit
def load_scale(scale_ptr, row, valid, g, UNIT: tl.constexpr):
    """Scale ``g`` (float32) of the packed rows ``[BLOCK_N]``; 0 where not ``valid``."""
    return tl.load(scale_ptr + row * (UNIT // 4) + SCALE_WORD + g, mask=valid, other=0.0)


@triton.jit
def load_rope(
    rope_ptr, row, valid, UNIT: tl.constexpr, PACKED: tl.constexpr, ROPE_DTYPE: tl.constexpr
):
    """The 64 RoPE values of the rows ``[BLOCK_N, 64]`` in ``ROPE_DTYPE``."""
    e = tl.arange(0, D_ROPE)
    if PACKED:
        first = ROPE_HALF
    else:
        first = ROPE_HALF_16BIT
    offs = (row * (UNIT // 2))[:, None] + (first + e)[None, :]
    return tl.load(rope_ptr + offs, mask=valid[:, None], other=0.0).to(ROPE_DTYPE)


@triton.jit
def load_query_group(q_ptr, q_row, head_ok, g, WIDTH: tl.constexpr, DTYPE: tl.constexpr):
    """Columns ``[WIDTH g, WIDTH g + WIDTH)`` of the heads' query rows (``q_row`` their
    addresses) in ``DTYPE``; padding heads load as 0."""
    d = g * WIDTH + tl.arange(0, WIDTH)
    q = tl.load(q_ptr + q_row[:, None] + d[None, :], mask=head_ok[:, None], other=0.0)
    return q.to(DTYPE)


@triton.jit
def scaled_values(acc, ref, p, alpha, scale, valid, v):
    """One group's ``acc += (P × scale / ref) · v`` with the online softmax's ``alpha``:
    ``ref`` becomes the largest |scale| the group has seen (at least ``REF_FLOOR``) and the
    accumulator is rescaled to it, so the 16-bit operand ``P × scale / ref`` is at most 1.
    Returns the new ``(acc, ref)``; the output is ``acc × ref``."""
    seen = tl.max(tl.where(valid, tl.abs(scale), 0.0), axis=0)
    ref_new = tl.maximum(ref, seen)
    inv = 1.0 / ref_new
    pv = (p * (scale * inv)[None, :]).to(v.dtype)
    acc = tl.dot(pv, v, acc * (alpha * (ref * inv))[:, None])
    return acc, ref_new


@triton.jit
def store_group(o_rows, acc, factor, head_ok, g, bad):
    """Columns ``[128 g, 128 g + 128)`` of the heads' output rows (``o_rows`` their
    addresses): ``acc × factor``, NaN when the token named a slot outside the cache."""
    d = g * GROUP + tl.arange(0, GROUP)
    val = nan_if(acc * factor[:, None], bad)
    tl.store(o_rows[:, None] + d[None, :], val.to(o_rows.dtype.element_ty), mask=head_ok[:, None])


@triton.jit(do_not_specialize=SPARSE_DYNAMIC_ARGS)
def sparse_mla_kernel(
    q_nope_ptr,  # [T, H, 512] bf16/fp16
    q_pe_ptr,  # [T, H, 64]
    kv_ptr,  # packed: the cache as bytes (or e4m3 with CVT_NATIVE); 16-bit: the cache
    scale_ptr,  # packed: the cache as float32 words (unused for a 16-bit cache)
    rope_ptr,  # packed: the cache as bf16; 16-bit: the cache
    indices_ptr,  # [T, topk] int32 slot ids (-1: none)
    topk_length_ptr,  # [T] int32 (HAS_TOPK_LENGTH only)
    o_ptr,  # [T, H, 512] out, or [splits, rows, 512] fp32 partials (row = t * H + h)
    lse_ptr,  # [T, H] fp32 natural LSE, or [splits, rows] fp32 base-2 partial LSEs
    stride_qn_t,
    stride_qn_h,
    stride_qp_t,
    stride_qp_h,
    stride_idx_t,
    stride_page,  # cache page stride in units of UNIT bytes
    stride_tok,  # cache token stride in units of UNIT bytes
    stride_o_split,
    stride_o_t,
    stride_o_h,
    stride_lse_split,
    stride_lse_t,
    num_tokens,  # query tokens of this call: programs of later tokens exit
    num_heads,
    num_slots,  # slot ids [0, num_slots) name a token of the cache
    topk,
    split_len,  # index-list entries per split, a multiple of BLOCK_N
    head_groups,  # programs of BLOCK_H heads per token
    num_splits,  # splits of each token's index list
    sm_scale_log2,  # sm_scale / ln 2 (softmax in base 2)
    PAGE_SIZE: tl.constexpr,  # 1: slot s at s × stride_page (SparseCache.addressing)
    UNIT: tl.constexpr,  # bytes per stride unit (16 where the cache allows: vector loads)
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VALUE_SPLIT: tl.constexpr,  # 1, or 2: two programs per head group, 256 output columns each
    PACKED: tl.constexpr,  # the 656-byte FP8 cache (else a 16-bit [slots, 576] cache)
    HAS_TOPK_LENGTH: tl.constexpr,
    SPLIT: tl.constexpr,  # write base-2 partials for the merge (else the output itself)
    WRITE_LSE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,  # fp16 (packed), the cache's dtype (16-bit), fp32 (interpreter)
    ROPE_DTYPE: tl.constexpr,  # the query's dtype (fp32 in the interpreter)
    FP8_CVT: tl.constexpr,  # fp8_decode.CVT_*: how e4m3 bytes become fp16
    DECODE_SCALE: tl.constexpr,  # 256.0 when FP8_CVT yields 2^-8 × the value, else 1.0
):
    # -- which program: value half fastest, then head group, split, token (the programs
    # that read the same rows side by side) --
    pid = tl.program_id(0)
    half = pid % VALUE_SPLIT
    rest = pid // VALUE_SPLIT
    hg = rest % head_groups
    rest = rest // head_groups
    split = rest % num_splits
    t = (rest // num_splits).to(tl.int64)
    if t >= num_tokens:
        return
    heads = hg * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < num_heads
    # scale groups in the order this program takes them: its own output groups first (all
    # four without a value split; with one, half h owns groups 2h and 2h + 1)
    if VALUE_SPLIT == 1:
        g0, g1, g2, g3 = 0, 1, 2, 3
    else:
        g0 = 2 * half
        g1 = g0 + 1
        g2 = 2 - g0
        g3 = g2 + 1

    # -- this split's part of the token's index list --
    n_len = topk
    if HAS_TOPK_LENGTH:
        n_len = tl.minimum(tl.maximum(tl.load(topk_length_ptr + t), 0), topk)
    n_begin = split * split_len
    n_end = tl.minimum(n_begin + split_len, n_len)
    idx_ptr = indices_ptr + t * stride_idx_t

    # -- the heads' queries, loaded once --
    qn_off = t * stride_qn_t + heads * stride_qn_h
    q0 = load_query_group(q_nope_ptr, qn_off, head_ok, g0, GROUP, DOT_DTYPE)
    q1 = load_query_group(q_nope_ptr, qn_off, head_ok, g1, GROUP, DOT_DTYPE)
    q2 = load_query_group(q_nope_ptr, qn_off, head_ok, g2, GROUP, DOT_DTYPE)
    q3 = load_query_group(q_nope_ptr, qn_off, head_ok, g3, GROUP, DOT_DTYPE)
    qp_off = t * stride_qp_t + heads * stride_qp_h
    q_pe = load_query_group(q_pe_ptr, qp_off, head_ok, 0, D_ROPE, ROPE_DTYPE)

    m_i = tl.full([BLOCK_H], NEG_INF, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_H, GROUP], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_H, GROUP], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_H, GROUP], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_H, GROUP], dtype=tl.float32)
    ref0 = REF_FLOOR
    ref1 = REF_FLOOR
    ref2 = REF_FLOOR
    ref3 = REF_FLOOR
    bad_seen = tl.zeros([BLOCK_N], dtype=tl.int32)
    for n0 in range(n_begin, n_end, BLOCK_N):
        pos = n0 + tl.arange(0, BLOCK_N)
        row, valid, bad = slot_rows(
            idx_ptr, pos, n_end, num_slots, stride_page, stride_tok, PAGE_SIZE
        )
        bad_seen |= bad.to(tl.int32)
        # -- q·k: one dot per scale group, the token's scales on the fp32 scores; each group's
        # tile converted where its dot needs it (fewer converted tiles live at once) --
        k0 = load_latent(kv_ptr, row, valid, g0, UNIT, PACKED, DOT_DTYPE, FP8_CVT)
        if PACKED:
            sc0 = load_scale(scale_ptr, row, valid, g0, UNIT)
            sc1 = load_scale(scale_ptr, row, valid, g1, UNIT)
            sc2 = load_scale(scale_ptr, row, valid, g2, UNIT)
            sc3 = load_scale(scale_ptr, row, valid, g3, UNIT)
            s = tl.dot(q0, tl.trans(k0)) * (sc0 * DECODE_SCALE)[None, :]
            k1 = load_latent(kv_ptr, row, valid, g1, UNIT, PACKED, DOT_DTYPE, FP8_CVT)
            s += tl.dot(q1, tl.trans(k1)) * (sc1 * DECODE_SCALE)[None, :]
            k2 = load_latent(kv_ptr, row, valid, g2, UNIT, PACKED, DOT_DTYPE, FP8_CVT)
            s += tl.dot(q2, tl.trans(k2)) * (sc2 * DECODE_SCALE)[None, :]
            k3 = load_latent(kv_ptr, row, valid, g3, UNIT, PACKED, DOT_DTYPE, FP8_CVT)
            s += tl.dot(q3, tl.trans(k3)) * (sc3 * DECODE_SCALE)[None, :]
        else:
            s = tl.dot(q0, tl.trans(k0))
            k1 = load_latent(kv_ptr, row, valid, g1, UNIT, PACKED, DOT_DTYPE, FP8_CVT)
            s = tl.dot(q1, tl.trans(k1), s)
            k2 = load_latent(kv_ptr, row, valid, g2, UNIT, PACKED, DOT_DTYPE, FP8_CVT)
            s = tl.dot(q2, tl.trans(k2), s)
            k3 = load_latent(kv_ptr, row, valid, g3, UNIT, PACKED, DOT_DTYPE, FP8_CVT)
            s = tl.dot(q3, tl.trans(k3), s)
        kpe = load_rope(rope_ptr, row, valid, UNIT, PACKED, ROPE_DTYPE)
        s = tl.dot(q_pe, tl.trans(kpe), s)
        p, alpha, m_i, l_i = online_softmax(s * sm_scale_log2, m_i, l_i, valid[None, :], 1)
        # -- p·v for this program's groups: v is the latent part of the same tiles --
        if PACKED:
            acc0, ref0 = scaled_values(acc0, ref0, p, alpha, sc0, valid, k0)
            acc1, ref1 = scaled_values(acc1, ref1, p, alpha, sc1, valid, k1)
            if VALUE_SPLIT == 1:
                acc2, ref2 = scaled_values(acc2, ref2, p, alpha, sc2, valid, k2)
                acc3, ref3 = scaled_values(acc3, ref3, p, alpha, sc3, valid, k3)
        else:
            pv = p.to(DOT_DTYPE)
            acc0 = tl.dot(pv, k0, acc0 * alpha[:, None])
            acc1 = tl.dot(pv, k1, acc1 * alpha[:, None])
            if VALUE_SPLIT == 1:
                acc2 = tl.dot(pv, k2, acc2 * alpha[:, None])
                acc3 = tl.dot(pv, k3, acc3 * alpha[:, None])

    # -- epilogue: normalize, undo the scale normalization, write out and LSE --
    bad_token = tl.max(bad_seen, axis=0) > 0
    inv_l = out_factor(l_i, 1.0)  # 0 for heads that saw no token
    if SPLIT:
        o_rows = o_ptr + split * stride_o_split + t * stride_o_t + heads * stride_o_h
    else:
        o_rows = o_ptr + t * stride_o_t + heads * stride_o_h
    if PACKED:
        f0 = inv_l * (ref0 * DECODE_SCALE)
        f1 = inv_l * (ref1 * DECODE_SCALE)
        f2 = inv_l * (ref2 * DECODE_SCALE)
        f3 = inv_l * (ref3 * DECODE_SCALE)
    else:
        f0 = inv_l
        f1 = inv_l
        f2 = inv_l
        f3 = inv_l
    store_group(o_rows, acc0, f0, head_ok, g0, bad_token)
    store_group(o_rows, acc1, f1, head_ok, g1, bad_token)
    if VALUE_SPLIT == 1:
        store_group(o_rows, acc2, f2, head_ok, g2, bad_token)
        store_group(o_rows, acc3, f3, head_ok, g3, bad_token)
    if WRITE_LSE and half == 0:
        lse2 = nan_if(log_sum_exp2(m_i, l_i), bad_token)  # base 2, -inf for no token
        if SPLIT:
            tl.store(lse_ptr + split * stride_lse_split + t * stride_lse_t + heads, lse2,
                     mask=head_ok)  # fmt: skip
        else:
            lse = tl.where(lse2 == NEG_INF, float("inf"), lse2 * LN2)
            tl.store(lse_ptr + t * stride_lse_t + heads, lse, mask=head_ok)


@triton.jit(do_not_specialize=["num_rows"])
def sparse_mla_merge_kernel(
    part_o_ptr,  # [splits, rows_cap, 512] fp32 partial outputs (row = t * H + h)
    part_lse_ptr,  # [splits, rows_cap] fp32 base-2 partial LSEs (-inf: the split saw nothing)
    o_ptr,  # [T, H, 512] output
    lse_ptr,  # [T, H] fp32 natural LSE
    num_rows,  # T × H rows of this call
    num_heads,
    stride_po_split,
    stride_pl_split,
    stride_o_t,
    stride_o_h,
    stride_lse_t,
    num_splits,
    BLOCK_S: tl.constexpr,  # num_splits rounded up to a power of two
    BLOCK_D: tl.constexpr,  # output columns per program
    WRITE_LSE: tl.constexpr,
):
    """``out = Σ_s w_s o_s / Σ_s w_s`` with ``w_s = 2^(lse_s - max)``, one program per (row,
    ``BLOCK_D`` columns), every split read at once. A split that saw nothing is never read
    (whatever its partial holds); a NaN partial (a slot outside the cache) makes the row NaN;
    a row no split saw gets out 0 and LSE +inf."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    if r >= num_rows:
        return
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    r64 = r.to(tl.int64)
    lse_s = tl.load(part_lse_ptr + s * stride_pl_split + r64, mask=s_ok, other=NEG_INF)
    bad = tl.max((lse_s != lse_s).to(tl.int32), axis=0) > 0
    live = lse_s > NEG_INF  # false for empty splits and NaN
    m = tl.max(tl.where(live, lse_s, NEG_INF), axis=0)
    m_use = tl.where(m == NEG_INF, 0.0, m)
    w = tl.where(live, tl.exp2(lse_s - m_use), 0.0)
    total = tl.sum(w, axis=0)
    d = c * BLOCK_D + tl.arange(0, BLOCK_D)
    o_s = tl.load(
        part_o_ptr + s[:, None].to(tl.int64) * stride_po_split + r64 * 512 + d[None, :],
        mask=live[:, None],
        other=0.0,
    )
    inv = tl.where(total > 0.0, 1.0 / tl.where(total > 0.0, total, 1.0), 0.0)
    out = nan_if(tl.sum(w[:, None] * o_s, axis=0) * inv, bad)
    t = r64 // num_heads
    h = r64 % num_heads
    tl.store(o_ptr + t * stride_o_t + h * stride_o_h + d, out.to(o_ptr.dtype.element_ty))
    if WRITE_LSE:
        if c == 0:
            lse = tl.where(total > 0.0, (m + tl.log2(tl.where(total > 0.0, total, 1.0))) * LN2,
                           float("inf"))  # fmt: skip
            tl.store(lse_ptr + t * stride_lse_t + h, nan_if(lse, bad))
