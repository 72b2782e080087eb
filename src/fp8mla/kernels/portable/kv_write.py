"""Fused KV-cache write: scale computation, quantization and scatter into the pool.

The cache is written through an integer view (uint8 for FP8, uint16 for bf16) with the
rounding done in integer arithmetic, so the bytes equal PyTorch's casts on every target.
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.codec import encode_bf16, encode_fp8


@triton.jit
def _quantize(
    x,
    FP8_MAX: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BIAS: tl.constexpr,
    STORE_KIND: tl.constexpr,
):
    """fp32 → storage bits. STORE_KIND 0: FP8 code (finite overflow and ±inf saturate to the
    format's largest value, NaN stays NaN); 1: bf16 bits; 2: fp16 value."""
    if STORE_KIND == 0:
        # clamp saturates ±inf and overflow; it would also turn NaN into a bound: keep NaN
        xc = tl.where(x != x, x, tl.clamp(x, -FP8_MAX, FP8_MAX))
        return encode_fp8(xc, MBITS, EMIN, BIAS)
    elif STORE_KIND == 1:
        return encode_bf16(x)
    else:
        return x.to(tl.float16)


@triton.jit
def kv_write_kernel(
    ckv_ptr,  # [n, D_CKV] new latent rows (bf16/fp16/fp32)
    kpe_ptr,  # [n, D_KPE] new RoPE rows
    slot_ptr,  # [n] destination slot of each row (int32/int64)
    cache_ptr,  # [num_slots, 1, D_CKV + D_KPE] storage bits (uint8 / uint16 / fp16)
    scale_arr_ptr,  # [num_slots, D_CKV // GROUP] fp32 (TOKEN_GROUP only)
    stride_ckv_t,
    stride_kpe_t,
    stride_cache_s,
    stride_scale_s,
    ckv_scale,  # per-tensor ckv scale (tensor mode)
    kpe_scale,  # per-tensor kpe scale
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    GROUP: tl.constexpr,
    FP8_MAX: tl.constexpr,
    MBITS: tl.constexpr,
    EMIN: tl.constexpr,
    BIAS: tl.constexpr,
    STORE_KIND: tl.constexpr,
    TOKEN_GROUP: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    dst = cache_ptr + slot * stride_cache_s

    # -- latent part --
    d = tl.arange(0, D_CKV)
    x = tl.load(ckv_ptr + t * stride_ckv_t + d).to(tl.float32)
    if TOKEN_GROUP:
        xg = tl.reshape(x, (D_CKV // GROUP, GROUP))
        # the group's scale comes from its finite values: a NaN stays one NaN, ±inf saturates
        ag = tl.abs(xg)
        amax = tl.max(tl.where(ag < float("inf"), ag, 0.0), axis=1)
        scale = tl.maximum(tl.math.div_rn(amax, FP8_MAX), 1e-12)  # as the torch path
        qg = tl.math.div_rn(xg, scale[:, None])
        q = _quantize(tl.reshape(qg, (D_CKV,)), FP8_MAX, MBITS, EMIN, BIAS, STORE_KIND)
        tl.store(dst + d, q)
        tl.store(scale_arr_ptr + slot * stride_scale_s + tl.arange(0, D_CKV // GROUP), scale)
    else:
        x = tl.math.div_rn(x, ckv_scale + tl.zeros_like(x))
        tl.store(dst + d, _quantize(x, FP8_MAX, MBITS, EMIN, BIAS, STORE_KIND))

    # -- RoPE part (per-tensor scale in both modes) --
    if D_KPE > 0:
        e = tl.arange(0, D_KPE)
        y = tl.load(kpe_ptr + t * stride_kpe_t + e).to(tl.float32)
        y = tl.math.div_rn(y, kpe_scale + tl.zeros_like(y))
        tl.store(dst + D_CKV + e, _quantize(y, FP8_MAX, MBITS, EMIN, BIAS, STORE_KIND))
