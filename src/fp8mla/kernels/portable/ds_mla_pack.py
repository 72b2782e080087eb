"""Quantize-on-write into the packed 656-byte MLA cache of DeepSeek Sparse Attention models.

Each token's 512 latent values become e4m3 codes with one float32 scale per 128 of them, its 64
RoPE values bf16, stored as one 656-byte row at the token's slot (:mod:`fp8mla.dsa.layout`). The
codes are rounded in integer arithmetic (or, where the GPU has one, by its saturating
round-to-nearest-even conversion), so the bytes equal the PyTorch path's on every target and in
the CPU interpreter, whose own fp32 → fp8 cast rounds wrongly.
"""

import triton
import triton.language as tl

from fp8mla.dsa import layout
from fp8mla.kernels.portable.codec import encode_bf16, encode_fp8

ROPE_DIM = tl.constexpr(layout.ROPE_DIM)
GROUP = tl.constexpr(layout.GROUP)
GROUPS = tl.constexpr(layout.GROUPS)
SCALE_OFFSET = tl.constexpr(layout.SCALE_OFFSET)
ROPE_OFFSET = tl.constexpr(layout.ROPE_OFFSET)
E4M3_MAX = tl.constexpr(layout.E4M3_MAX)
SCALE_FLOOR = tl.constexpr(layout.SCALE_FLOOR)
POW2_SCALE_FLOOR = tl.constexpr(layout.POW2_SCALE_FLOOR)
NAN_E4M3 = tl.constexpr(layout.NAN_E4M3)
NAN_BF16 = tl.constexpr(layout.NAN_BF16)

# Element type of the rows read (the ``IN_KIND`` constexpr):
IN_BF16 = tl.constexpr(0)  # bf16 read as uint16 bits: widened by a shift, RoPE copied as is
IN_FP16 = tl.constexpr(1)
IN_FP32 = tl.constexpr(2)


@triton.jit
def _load_f32(ptr, offs, mask, IN_KIND: tl.constexpr):
    """Values at ``ptr + offs`` as fp32, exactly (bf16 bits shifted into the high half)."""
    if IN_KIND == IN_BF16:
        bits = tl.load(ptr + offs, mask=mask, other=0)
        return (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr + offs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def ds_mla_pack_kernel(
    ckv_ptr,  # [n, 512] latent rows: bf16 (as uint16 bits), fp16 or fp32
    kpe_ptr,  # [n, 64] RoPE rows, same element type
    slot_ptr,  # [n] int32/int64 slot of each row; -1 and ids outside the cache are skipped
    cache_ptr,  # uint8: slot s at (s // page_size) * stride_page + (s % page_size) * stride_token
    n_tokens,
    num_slots,
    page_size,
    stride_page,  # bytes
    stride_token,  # bytes
    stride_ckv_t,  # elements
    stride_kpe_t,  # elements
    IN_KIND: tl.constexpr,
    POW2: tl.constexpr,  # scales rounded up to a power of two (DeepSeek's reference quantizer)
    NATIVE_CVT: tl.constexpr,  # the GPU's fp32 → e4m3 conversion (SM89+), else integer rounding
    BLOCK_T: tl.constexpr,  # tokens per program
):
    # -- where each token goes --
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_batch = t < n_tokens  # loads need no slot: issued alongside the slots' load
    slot = tl.load(slot_ptr + t, mask=in_batch, other=-1).to(tl.int64)
    valid = in_batch & (slot >= 0) & (slot < num_slots)
    s = tl.where(valid, slot, 0).to(tl.int32)
    page = s // page_size
    row = page.to(tl.int64) * stride_page + (s - page * page_size).to(tl.int64) * stride_token
    t64 = t.to(tl.int64)

    # -- latent part, [BLOCK_T, GROUPS, GROUP]: a scale per 128 values --
    col = tl.arange(0, GROUPS)[None, :, None] * GROUP + tl.arange(0, GROUP)[None, None, :]
    x = _load_f32(
        ckv_ptr, t64[:, None, None] * stride_ckv_t + col, in_batch[:, None, None], IN_KIND
    )
    # amax over the group's non-NaN values, ±inf included (vLLM's fmaxf reduction)
    amax = tl.max(tl.where(x != x, 0.0, tl.abs(x)), axis=2)
    scale = tl.math.div_rn(amax, E4M3_MAX)
    if POW2:
        # 2^ceil(log2(max(amax / 448, 1e-4))), the ceiling read off the bits: the exponent,
        # plus one when any mantissa bit is set (an infinite scale stays infinite)
        bits = tl.maximum(scale, POW2_SCALE_FLOOR).to(tl.uint32, bitcast=True)
        up = ((bits & 0x7FFFFF) != 0).to(tl.uint32)
        scale = (((bits >> 23) + up) << 23).to(tl.float32, bitcast=True)
    else:
        scale = tl.maximum(scale, SCALE_FLOOR)  # an all-zero group: codes 0, scale 2^-126
    q = tl.math.div_rn(x, scale[:, :, None])  # correctly rounded, as vLLM's x / scale
    # to nearest even e4m3, ±inf and finite overflow saturating to ±448, NaN as 0x7F
    if NATIVE_CVT:  # cvt.rn.satfinite.e4m3x2.f32
        code = q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        code = encode_fp8(tl.clamp(q, -E4M3_MAX, E4M3_MAX), 3, -6, 7)
    code = tl.where(q != q, NAN_E4M3, code).to(tl.uint8)
    tl.store(cache_ptr + row[:, None, None] + col, code, mask=valid[:, None, None])
    scale_ptr = (cache_ptr + row + SCALE_OFFSET).to(tl.pointer_type(tl.float32), bitcast=True)
    tl.store(scale_ptr[:, None] + tl.arange(0, GROUPS)[None, :], scale, mask=valid[:, None])

    # -- RoPE part: bf16, not quantized --
    r = tl.arange(0, ROPE_DIM)[None, :]
    if IN_KIND == IN_BF16:
        rope = tl.load(kpe_ptr + t64[:, None] * stride_kpe_t + r, mask=in_batch[:, None], other=0)
    else:
        y = tl.load(kpe_ptr + t64[:, None] * stride_kpe_t + r, mask=in_batch[:, None], other=0.0)
        y = y.to(tl.float32)
        rope = tl.where(y != y, NAN_BF16, encode_bf16(y)).to(tl.uint16)
    rope_ptr = (cache_ptr + row + ROPE_OFFSET).to(tl.pointer_type(tl.uint16), bitcast=True)
    tl.store(rope_ptr[:, None] + r, rope, mask=valid[:, None])
