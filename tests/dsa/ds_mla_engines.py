"""The engines' writers of the packed ``fp8_ds_mla`` cache, for byte comparisons with
``fp8mla.pack_ds_mla``.

- :func:`vllm_concat_and_cache_ds_mla`: a NumPy statement of vLLM's CUDA kernel
  ``concat_and_cache_ds_mla_kernel`` (csrc/libtorch_stable/cache_kernels.cu, with
  ``scaled_vec_conversion<uint8_t, __nv_bfloat16>`` of csrc/quantization/w8a8/fp8/nvidia/
  quant_utils.cuh), float32 arithmetic step by step as the kernel does it.
- :func:`sglang_codes`: a NumPy statement of the arithmetic of SGLang's Triton writer
  ``_quantize_k_cache_fast_kernel`` (sglang/kernels/ops/quantization/dsa_quant_k_cache.py).
- Run as a script (``python ds_mla_engines.py IN.npz OUT.npy``), SGLang's own
  ``quantize_k_cache_separate`` + ``set_mla_kv_buffer_triton`` in Triton's CPU interpreter,
  from the pinned engines folder, in a process of its own (importing SGLang configures
  process-wide state). The interpreter's fp32 → e4m3 cast rounds wrongly, so for that run it is
  replaced by :func:`e4m3_satfinite`, the conversion the GPU executes for Triton's cast on SM89+.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

FLT_MIN = np.float32(2.0**-126)
E4M3_MAX = 448.0
# Magnitudes of the e4m3fn codes 0x00 ... 0x7E (0x7F is NaN): subnormals m * 2^-9, then
# (1 + m / 8) * 2^(e - 7).
E4M3_VALUES = np.array(
    [(c & 7) * 2.0**-9 if c < 8 else (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 7) for c in range(127)]
)


def e4m3_satfinite(q: np.ndarray) -> np.ndarray:
    """PTX ``cvt.rn.satfinite.e4m3x2.f32`` (what vLLM's ``__nv_cvt_float_to_fp8(x,
    __NV_SATFINITE, __NV_E4M3)`` and Triton's cast execute on SM89+): round to the nearest e4m3
    value, ties to the even code, magnitudes beyond 448 (inf included) saturate to ±448, NaN is
    0x7F. Exact: float32 magnitudes and code values compare exactly in float64."""
    q = np.asarray(q, dtype=np.float32)
    mag = np.minimum(np.abs(q.astype(np.float64)), E4M3_MAX)
    hi = np.clip(np.searchsorted(E4M3_VALUES, np.nan_to_num(mag)), 1, 126)
    lo = hi - 1
    d_lo, d_hi = mag - E4M3_VALUES[lo], E4M3_VALUES[hi] - mag
    code = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo)
    code = code | (np.signbit(q).astype(np.int64) << 7)
    return np.where(np.isnan(q), 0x7F, code).astype(np.uint8)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) → float32 values, exactly (``__bfloat162float``)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def vllm_concat_and_cache_ds_mla(
    kv_c: np.ndarray, k_pe: np.ndarray, kv_cache: np.ndarray, slot_mapping: np.ndarray
) -> None:
    """vLLM's ``concat_and_cache_ds_mla_kernel`` for bf16 ``kv_c [n, 512]`` and ``k_pe [n, 64]``
    (uint16 bit patterns) into ``kv_cache`` (uint8 ``[num_blocks, block_size, 656]``), in place.

    Per token and 128-value tile: ``max_abs`` = fmaxf over ``fabsf`` of the values (fmaxf drops
    a NaN operand, so NaNs do not count, infinities do; the thread/shuffle order does not
    matter); ``tile_scale = fmaxf(max_abs / 448.f, FLT_MIN)``; each value becomes
    ``cvt_satfinite(value / tile_scale)`` (an IEEE division: vLLM builds without fast math);
    the RoPE part is copied as 32-bit words. Slot -1 is skipped."""
    n = kv_c.shape[0]
    block_size = kv_cache.shape[1]
    vals = bf16_to_f32(kv_c).reshape(n, 4, 128)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        max_abs = np.fmax.reduce(np.abs(vals), axis=2)
        tile_scale = np.fmax(max_abs / np.float32(448.0), FLT_MIN).astype(np.float32)
        codes = e4m3_satfinite(vals / tile_scale[:, :, None])
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        row = kv_cache[slot // block_size, slot % block_size]
        row[:512] = codes[i].reshape(512)
        row[512:528] = tile_scale[i].view(np.uint8)
        row[528:] = k_pe[i].view(np.uint8)


def sglang_codes(k_nope: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(codes [n, 512] uint8, scales [n, 4] float32)`` of SGLang's Triton writer at IEEE
    float32 (as the interpreter runs it) for finite bf16 ``k_nope`` (uint16 bits):
    ``y_s = max|y| / 448`` (no floor), ``q = clamp(y * (1 / y_s), -448, 448)``, Triton's cast."""
    n = k_nope.shape[0]
    y = bf16_to_f32(k_nope).reshape(n, 4, 128)
    y_s = (np.abs(y).max(axis=2) / np.float32(448.0)).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):  # a zero group: 0 × (1 / 0)
        q = np.clip(y * (np.float32(1.0) / y_s)[:, :, None], -E4M3_MAX, E4M3_MAX)
    return e4m3_satfinite(q).reshape(n, 512), y_s


def _patch_interpreter_e4m3_cast() -> None:
    import triton.language as tl
    import triton.runtime.interpreter as interp

    convert = interp._convert_float

    def gpu_convert(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.float8e4nv:
            return e4m3_satfinite(input).reshape(input.shape)
        return convert(input, input_dtype, output_dtype, rounding_mode)

    interp._convert_float = gpu_convert


def _run_sglang(src: Path, dst: Path) -> None:
    """SGLang's pool write of the rows in ``src`` (npz: ``ckv``, ``kpe`` bf16 bits, ``loc``,
    ``num_slots``) into a zeroed ``[num_slots, 1, 656]`` buffer, saved to ``dst``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: integrations
    from integrations.engines_path import use_engines

    use_engines()
    _patch_interpreter_e4m3_cast()
    import torch
    from sglang.kernels.ops.kvcache.mla_buffer import set_mla_kv_buffer_triton
    from sglang.kernels.ops.quantization.dsa_quant_k_cache import quantize_k_cache_separate

    data = np.load(src)
    ckv = torch.from_numpy(data["ckv"].view(np.int16)).view(torch.bfloat16)
    kpe = torch.from_numpy(data["kpe"].view(np.int16)).view(torch.bfloat16)
    loc = torch.from_numpy(data["loc"])
    buf = torch.zeros(int(data["num_slots"]), 1, 656, dtype=torch.uint8)
    nope, rope = quantize_k_cache_separate(ckv, kpe)
    set_mla_kv_buffer_triton(buf, loc, nope, rope)  # skips its reserved slot 0
    np.save(dst, buf.numpy())


if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"
    _run_sglang(Path(sys.argv[1]), Path(sys.argv[2]))
