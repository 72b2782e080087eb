"""Integer-arithmetic conversions of the kernels against PyTorch's casts, exhaustively."""

from __future__ import annotations

import pytest
import torch

from fp8mla.cache import MLAKVCache
from fp8mla.formats import FP8_MAX


def all_bf16_values() -> torch.Tensor:
    """Every finite bf16 value (65,536 codes less NaN/inf) as fp32: covers every FP8 code,
    every rounding tie between neighbouring FP8 codes, and the subnormal ranges."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    values = bits.view(torch.bfloat16).float()
    return values[torch.isfinite(values)]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16], ids=str)
def test_kernel_write_rounds_like_torch(device, dtype):
    values = all_bf16_values()
    if dtype in FP8_MAX:
        values = values.clamp(-FP8_MAX[dtype], FP8_MAX[dtype])
    else:  # fp32 inputs with random low bits exercise bf16 rounding
        noise = torch.randint(0, 1 << 16, values.shape, generator=torch.Generator().manual_seed(0))
        values = (values.view(torch.int32) | noise.to(torch.int32)).view(torch.float32)
        values = values[torch.isfinite(values) & (values.abs() < 1e38)]
    rows = -(-values.numel() // 512)
    padded = torch.zeros(rows * 512)
    padded[: values.numel()] = values
    ckv = padded.view(rows, 512).to(device)
    kpe = torch.randn(rows, 64, generator=torch.Generator().manual_seed(1)).to(device)
    cache = MLAKVCache(rows, dtype=dtype, device=device, backend="triton")
    cache.write(torch.arange(rows, device=device), ckv, kpe)
    stored = cache.buffer.view(rows, -1)
    want_ckv, want_kpe = ckv.to(dtype), kpe.to(dtype)
    as_int = torch.uint8 if dtype in FP8_MAX else torch.int16
    assert torch.equal(stored[:, :512].contiguous().view(as_int).cpu(), want_ckv.view(as_int).cpu())
    assert torch.equal(stored[:, 512:].contiguous().view(as_int).cpu(), want_kpe.view(as_int).cpu())
