"""Bit-exact number conversions in integer arithmetic, for any target.

They need no native FP8 instructions (so they compile for SM80/86 and AMD targets), round like
PyTorch's casts (to nearest, ties to even), and behave the same under the CPU interpreter,
whose own fp32 → bf16/fp8 conversions truncate.
"""

import triton
import triton.language as tl


@triton.jit
def encode_fp8(x, MBITS: tl.constexpr, EMIN: tl.constexpr, BIAS: tl.constexpr):
    """fp32 ``x`` (already clamped to the format's range; NaN allowed) → FP8 code as uint8,
    NaN as ``0x7F`` with its sign bit, as PyTorch's cast.

    e4m3fn: ``MBITS=3, EMIN=-6, BIAS=7``; e5m2: ``MBITS=2, EMIN=-14, BIAS=15``.
    """
    sign = (x.to(tl.uint32, bitcast=True) >> 31) & 1
    a = tl.abs(x)
    # -- the target's step size at |x|: 2^(max(exponent, EMIN) - MBITS) --
    e = ((a.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127
    e = tl.maximum(e, EMIN)
    ulp = ((e - MBITS + 127) << 23).to(tl.float32, bitcast=True)
    inv_ulp = ((127 - (e - MBITS)) << 23).to(tl.float32, bitcast=True)
    # -- round |x| / ulp to an integer, ties to even: 2^23 is fp32's integer-step threshold --
    r = (a * inv_ulp + 8388608.0) - 8388608.0
    q = r * ulp  # the rounded magnitude, exact in fp32
    # -- encode: subnormal codes count steps, normal codes take exponent and mantissa bits --
    qb = q.to(tl.uint32, bitcast=True)
    qe = ((qb >> 23) & 0xFF).to(tl.int32) - 127
    mant = ((qb >> (23 - MBITS)) & ((1 << MBITS) - 1)).to(tl.int32)
    normal = ((qe + BIAS) << MBITS) | mant
    subnormal = r.to(tl.int32)
    min_normal = tl.full([], (EMIN + 127) << 23, tl.int32).to(tl.float32, bitcast=True)
    code = tl.where(q < min_normal, subnormal, normal)
    code = tl.where(x != x, 0x7F, code)
    return (code | (sign.to(tl.int32) << 7)).to(tl.uint8)


@triton.jit
def encode_bf16(x):
    """fp32 → bf16 bits as uint16, rounded to nearest even (finite inputs)."""
    bits = x.to(tl.uint32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(tl.uint16)
