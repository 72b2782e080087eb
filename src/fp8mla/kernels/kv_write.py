"""Fused KV-cache write: scale computation, quantization and scatter into the pool."""

import triton
import triton.language as tl


@triton.jit
def _kv_write_kernel(
    ckv_ptr,  # [n, D_CKV] new latent rows (bf16/fp16/fp32)
    kpe_ptr,  # [n, D_KPE] new RoPE rows
    slot_ptr,  # [n] destination slot of each row (int32/int64)
    cache_ptr,  # [num_slots, 1, D_CKV + D_KPE] storage dtype
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
    FP8_MAX: tl.constexpr,  # 0.0 for 16-bit storage (no scaling, no saturation)
    TOKEN_GROUP: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    out_ty = cache_ptr.dtype.element_ty
    dst = cache_ptr + slot * stride_cache_s

    # -- latent part --
    d = tl.arange(0, D_CKV)
    x = tl.load(ckv_ptr + t * stride_ckv_t + d).to(tl.float32)
    if TOKEN_GROUP:
        xg = tl.reshape(x, (D_CKV // GROUP, GROUP))
        amax = tl.max(tl.abs(xg), axis=1)
        scale = tl.maximum(amax / FP8_MAX, 1e-12)  # same floor as the torch path
        qg = tl.clamp(xg / scale[:, None], -FP8_MAX, FP8_MAX)
        tl.store(dst + d, tl.reshape(qg, (D_CKV,)).to(out_ty))
        tl.store(scale_arr_ptr + slot * stride_scale_s + tl.arange(0, D_CKV // GROUP), scale)
    elif FP8_MAX > 0:
        tl.store(dst + d, tl.clamp(x / ckv_scale, -FP8_MAX, FP8_MAX).to(out_ty))
    else:
        tl.store(dst + d, x.to(out_ty))

    # -- RoPE part (per-tensor scale in both modes) --
    if D_KPE > 0:
        e = tl.arange(0, D_KPE)
        y = tl.load(kpe_ptr + t * stride_kpe_t + e).to(tl.float32)
        if FP8_MAX > 0:
            y = tl.clamp(y / kpe_scale, -FP8_MAX, FP8_MAX)
        tl.store(dst + D_CKV + e, y.to(out_ty))
