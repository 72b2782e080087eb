"""Queries prepared for the attention kernels in one pass (``attention/query.py`` launches it).

One program takes ``ROWS`` query rows (token, head), both parts (``q_nope`` 512 and ``q_pe``
64 wide), and writes one of:

- e4m3 codes and a scale per row (``QUANT`` and ``OUT_FP8``): 16-bit queries quantized as
  ``amax / 448`` of the row's 576 values, the codes ``q / scale`` rounded to nearest (ties to
  even), for the attention kernel's FP8-query build;
- bf16 values ``q × scale`` (not ``OUT_FP8``): e4m3 queries with their scale (per tensor or
  per row) for the 16-bit-query kernels, or, with ``QUANT``, 16-bit queries rounded through
  e4m3 first (the same function as the FP8-query build computes).

Rounding is done in integer operations (``codec.py``): the same on every target and under
the interpreter.
"""

import triton
import triton.language as tl

from fp8mla.kernels.portable.codec import encode_bf16, encode_fp8
from fp8mla.kernels.portable.fp8_decode import CVT_TRITON_INT_E4M3, fp8_bytes_to_f16
from fp8mla.kernels.portable.fp8_query import E4M3_MAX, QS_ROWS, QS_TENSOR


@triton.jit
def _load_part(
    q_ptr, tok, head, ok, stride_t, stride_h, row_scale, D: tl.constexpr, IN_FP8: tl.constexpr
):
    """``[ROWS, D]`` of one part in fp32 times the row's scale (e4m3 codes decoded exactly)."""
    d = tl.arange(0, D)
    at = q_ptr + tok[:, None] * stride_t + head[:, None] * stride_h + d[None, :]
    if IN_FP8:
        x = fp8_bytes_to_f16(tl.load(at, mask=ok[:, None], other=0), CVT_TRITON_INT_E4M3)
        x = x.to(tl.float32) * 256.0  # the integer decoding yields 2^-8 × the value
    else:
        x = tl.load(at, mask=ok[:, None], other=0.0).to(tl.float32)
    return x * row_scale[:, None]


@triton.jit
def _round_e4m3(x, inv):
    """``x × inv`` rounded to e4m3 codes (uint8) and back to fp32 values."""
    codes = encode_fp8(tl.minimum(tl.maximum(x * inv[:, None], -E4M3_MAX), E4M3_MAX), 3, -6, 7)
    values = fp8_bytes_to_f16(codes, CVT_TRITON_INT_E4M3).to(tl.float32) * 256.0
    return codes, values


@triton.jit
def _store_part(
    out_ptr, codes, values, tok, head, ok, stride_t, stride_h, D: tl.constexpr,
    OUT_FP8: tl.constexpr,
):  # fmt: skip
    """The part's e4m3 codes (``OUT_FP8``) or its values as bf16 bits."""
    d = tl.arange(0, D)
    at = out_ptr + tok[:, None] * stride_t + head[:, None] * stride_h + d[None, :]
    if OUT_FP8:
        tl.store(at, codes, mask=ok[:, None])
    else:
        tl.store(at, encode_bf16(values), mask=ok[:, None])


@triton.jit(do_not_specialize=["num_tokens", "scale_val"])
def q_quant_kernel(
    q_nope_ptr,  # [T, H, D_CKV] bf16/fp16, or e4m3 codes as bytes (IN_FP8)
    q_pe_ptr,  # [T, H, D_KPE]
    scale_ptr,  # fp32: the input's scale, one value (SCALE == QS_TENSOR) or [T, H] (QS_ROWS)
    out_nope_ptr,  # [T, H, D_CKV]: e4m3 codes (OUT_FP8) or bf16 bits, as integers
    out_pe_ptr,  # [T, H, D_KPE], the same strides
    out_scale_ptr,  # [T, H] fp32: each row's scale (QUANT and OUT_FP8)
    stride_qn_t,
    stride_qn_h,
    stride_qp_t,
    stride_qp_h,
    stride_s_t,
    stride_o_t,  # both outputs'
    stride_o_h,
    num_heads,
    num_tokens,
    scale_val,  # the input's scale as a float (SCALE == QS_VALUE)
    D_CKV: tl.constexpr,
    D_KPE: tl.constexpr,
    ROWS: tl.constexpr,
    IN_FP8: tl.constexpr,
    SCALE: tl.constexpr,  # fp8_query.QS_*
    QUANT: tl.constexpr,
    OUT_FP8: tl.constexpr,
):
    # -- the program's rows and their input scale --
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    tok = r // num_heads
    head = r % num_heads
    ok = tok < num_tokens
    if SCALE == QS_ROWS:
        row_scale = tl.load(scale_ptr + tok * stride_s_t + head, mask=ok, other=1.0)
    elif SCALE == QS_TENSOR:
        row_scale = tl.zeros([ROWS], tl.float32) + tl.load(scale_ptr).to(tl.float32)
    else:
        row_scale = tl.zeros([ROWS], tl.float32) + scale_val
    xn = _load_part(q_nope_ptr, tok, head, ok, stride_qn_t, stride_qn_h, row_scale, D_CKV,
                    IN_FP8)  # fmt: skip
    if D_KPE > 0:
        xp = _load_part(q_pe_ptr, tok, head, ok, stride_qp_t, stride_qp_h, row_scale, D_KPE,
                        IN_FP8)  # fmt: skip
    # -- quantize: the row's amax over both parts maps to 448 --
    if QUANT:
        amax = tl.max(tl.abs(xn), axis=1)
        if D_KPE > 0:
            amax = tl.maximum(amax, tl.max(tl.abs(xp), axis=1))
        # correctly rounded divisions (a GPU's `/` is approximate), as PyTorch's quantize_rows
        scale = tl.where(amax > 0.0, tl.math.div_rn(amax, E4M3_MAX), 1.0)
        inv = tl.math.div_rn(1.0, scale)
        cn, xn = _round_e4m3(xn, inv)
        xn = xn * scale[:, None]
        if D_KPE > 0:
            cp, xp = _round_e4m3(xp, inv)
            xp = xp * scale[:, None]
        if OUT_FP8:
            tl.store(out_scale_ptr + r, scale, mask=ok)
    else:
        cn = xn
        cp = xp if D_KPE > 0 else xn
    # -- store --
    _store_part(out_nope_ptr, cn, xn, tok, head, ok, stride_o_t, stride_o_h, D_CKV, OUT_FP8)
    if D_KPE > 0:
        _store_part(out_pe_ptr, cp, xp, tok, head, ok, stride_o_t, stride_o_h, D_KPE, OUT_FP8)
