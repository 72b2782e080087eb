"""FP8 → fp16 conversions of the attention kernels, over all 256 codes of both formats, NaN
codes included (a NaN in the cache must come out NaN on every path, never a finite value)."""

from __future__ import annotations

import pytest
import torch

from conftest import HAS_CUDA

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]


def all_codes(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The 256 codes as uint8, and which of them are not NaN."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    return codes, ~torch.isnan(codes.view(dtype).float())


def integer_rule(codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The integer path's arithmetic in PyTorch: fp16 bits from the byte alone."""
    b = codes.to(torch.int32)
    if dtype == torch.float8_e4m3fn:
        t = (b & 0x7F) << 7
        t = t | ((t + 0x80) & 0x4000)  # the NaN code's lane carries into the exponent
        bits = ((b & 0x80) << 8) | t
        scale = 256.0  # the 2^8 exponent offset the kernels fold into their scales
    else:
        bits = b << 8
        scale = 1.0
    return bits.to(torch.int16).view(torch.float16).float() * scale


@pytest.mark.parametrize("dtype", FORMATS, ids=str)
def test_integer_rule_is_exact_for_every_code(dtype):
    codes, finite = all_codes(dtype)
    want = codes.view(dtype).float()
    got = integer_rule(codes, dtype)
    assert torch.equal(got[finite], want[finite])
    assert got[~finite].isnan().all()
    assert finite.sum() == (254 if dtype == torch.float8_e4m3fn else 250)


@pytest.mark.skipif(not HAS_CUDA, reason="the PTX conversions need a CUDA GPU")
@pytest.mark.parametrize("dtype", FORMATS, ids=str)
@pytest.mark.parametrize("mode", ["ptx", "int"])
def test_kernel_conversions_on_gpu(dtype, mode):
    import triton
    import triton.language as tl

    from fp8mla.attention.launch import fp8_conversion
    from fp8mla.kernels.portable.fp8_decode import fp8_bytes_to_f16

    @triton.jit
    def convert(src, dst, FP8_CVT: tl.constexpr):
        i = tl.arange(0, 256)
        tl.store(dst + i, fp8_bytes_to_f16(tl.load(src + i), FP8_CVT))

    codes, finite = all_codes(dtype)
    out = torch.empty(256, dtype=torch.float16, device="cuda")
    cvt = fp8_conversion(dtype, torch.device("cuda"), False, mode)
    convert[(1,)](codes.cuda(), out, FP8_CVT=cvt)
    scale = 256.0 if (mode == "int" and dtype == torch.float8_e4m3fn) else 1.0
    got = out.float().cpu() * scale
    want = codes.view(dtype).float()
    assert torch.equal(got[finite], want[finite])
    assert got[~finite].isnan().all()  # NaN codes decode to NaN on every path
