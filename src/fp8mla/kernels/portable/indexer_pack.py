"""Quantize-on-write into the lightning indexer's key cache (``fp8mla.dsa.index_cache``).

Each token's 128 key values become e4m3 codes with one float32 scale, written into its page's
code block (``offset * 128``) and scale block (``page_size * 128 + offset * 4``). The codes are
rounded in integer arithmetic (or, where the GPU has one, by its saturating round-to-nearest-
even conversion), so the bytes equal the PyTorch path's on every target and in the CPU
interpreter, whose own fp32 → fp8 cast rounds wrongly.
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.codec import encode_fp8

HEAD_DIM = tl.constexpr(128)
E4M3_MAX = tl.constexpr(448.0)
AMAX_FLOOR = tl.constexpr(1e-4)  # rounded to float32 where it meets the float32 amax
NAN_E4M3 = tl.constexpr(0x7F)

# Element type of the keys read (the ``IN_KIND`` constexpr):
IN_BF16 = tl.constexpr(0)  # bf16 read as uint16 bits, widened by a shift
IN_FP16 = tl.constexpr(1)
IN_FP32 = tl.constexpr(2)


@triton.jit
def index_pack_kernel(
    k_ptr,  # [n, 128] keys: bf16 (as uint16 bits), fp16 or fp32
    slot_ptr,  # [n] int32/int64 slot of each key; -1 and ids outside the cache are skipped
    cache_ptr,  # uint8: page p at p * page_stride
    n_tokens,
    num_slots,
    page_stride,  # bytes
    stride_k_t,  # elements
    PAGE_SIZE: tl.constexpr,
    IN_KIND: tl.constexpr,
    POW2: tl.constexpr,  # scales rounded up to a power of two (vLLM's ue8m0)
    NATIVE_CVT: tl.constexpr,  # the GPU's fp32 → e4m3 conversion (SM89+), else integer rounding
    BLOCK_T: tl.constexpr,  # tokens per program
):
    # -- where each token goes --
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_batch = t < n_tokens
    slot = tl.load(slot_ptr + t, mask=in_batch, other=-1).to(tl.int64)
    valid = in_batch & (slot >= 0) & (slot < num_slots)
    s = tl.where(valid, slot, 0)
    page = s // PAGE_SIZE
    offset = s - page * PAGE_SIZE
    base = page * page_stride
    d = tl.arange(0, HEAD_DIM)[None, :]

    # -- the key as fp32, exactly --
    src = k_ptr + t.to(tl.int64)[:, None] * stride_k_t + d
    if IN_KIND == IN_BF16:
        bits = tl.load(src, mask=in_batch[:, None], other=0)
        x = (bits.to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        x = tl.load(src, mask=in_batch[:, None], other=0.0).to(tl.float32)

    # -- scale: max(amax, 1e-4) / 448 over the non-NaN values (vLLM's fmaxf), ±inf included --
    amax = tl.max(tl.where(x != x, 0.0, tl.abs(x)), axis=1)
    scale = tl.math.div_rn(tl.maximum(amax, AMAX_FLOOR), E4M3_MAX)
    if POW2:
        # 2^ceil(log2(scale)) read off the bits: the exponent, plus one when any mantissa bit
        # is set (an infinite scale stays infinite)
        sb = scale.to(tl.uint32, bitcast=True)
        up = ((sb & 0x7FFFFF) != 0).to(tl.uint32)
        scale = (((sb >> 23) + up) << 23).to(tl.float32, bitcast=True)

    # -- codes: correctly rounded quotient, to nearest even e4m3, saturating, NaN as 0x7F --
    q = tl.math.div_rn(x, scale[:, None])
    if NATIVE_CVT:  # cvt.rn.satfinite.e4m3x2.f32
        code = q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        code = encode_fp8(tl.clamp(q, -E4M3_MAX, E4M3_MAX), 3, -6, 7)
    code = tl.where(q != q, NAN_E4M3, code).to(tl.uint8)
    tl.store(cache_ptr + (base + offset * HEAD_DIM)[:, None] + d, code, mask=valid[:, None])
    scale_at = cache_ptr + base + PAGE_SIZE * HEAD_DIM + offset * 4
    tl.store(scale_at.to(tl.pointer_type(tl.float32), bitcast=True), scale, mask=valid)
