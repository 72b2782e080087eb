"""The portable integer FP8 decoding (Triton integer ops: AMD and any GPU without FP8
instructions), which unlike the inline-PTX paths also runs in the CPU interpreter."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from fp8mla.attention.launch import fp8_conversion
from fp8mla.attention.planner import KernelConfig
from fp8mla.attention.targets import TARGETS
from fp8mla.kernels.portable.fp8_decode import fp8_bytes_to_f16
from fp8mla.testing import make_batch

from attention_utils import assert_matches_reference, run_wrapper
from conftest import INTERPRETED

FORMATS = [torch.float8_e4m3fn, torch.float8_e5m2]


@triton.jit
def _convert_kernel(src, dst, FP8_CVT: tl.constexpr):
    i = tl.arange(0, 256)
    tl.store(dst + i, fp8_bytes_to_f16(tl.load(src + i), FP8_CVT))


@pytest.mark.parametrize("dtype", FORMATS, ids=str)
def test_all_codes_through_the_kernel_helper(device, dtype):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    finite = ~torch.isnan(codes.view(dtype).float())
    out = torch.empty(256, dtype=torch.float16, device=device)
    cvt = fp8_conversion(dtype, torch.device(device), INTERPRETED, "portable")
    _convert_kernel[(1,)](codes.to(device), out, FP8_CVT=cvt)
    scale = 256.0 if dtype == torch.float8_e4m3fn else 1.0  # folded into the kernels' scales
    got = out.float().cpu() * scale
    assert torch.equal(got[finite], codes.view(dtype).float()[finite])
    assert got[~finite].isnan().all()  # NaN codes decode to NaN


@pytest.mark.parametrize("scale_mode", ["tensor", "token_group"])
@pytest.mark.parametrize("dtype", FORMATS, ids=str)
def test_attention_with_portable_decoding(device, dtype, scale_mode):
    """Unused slots of the pool hold NaN codes: masked loads must keep them out."""
    batch = make_batch(
        [0, 17, 97, 300],
        16,
        page_size=16,
        kv_dtype=dtype,
        scale_mode=scale_mode,
        device=device,
        generator=torch.Generator().manual_seed(5),
    )
    cfg = KernelConfig(16, 32, 4, 1, fp8_cvt="portable")
    out, lse = run_wrapper(batch, config=cfg)
    assert_matches_reference(batch, out, lse)


def test_auto_picks_the_integer_paths_per_target():
    from fp8mla.kernels.portable import fp8_decode as T

    cuda = torch.device("cuda")  # a device object only: nothing is asked of CUDA
    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    for name, t in TARGETS.items():
        got = fp8_conversion(e4, cuda, False, "auto", t), fp8_conversion(e5, cuda, False, "auto", t)
        want = (
            (T.CVT_TRITON_INT_E4M3, T.CVT_TRITON_INT_E5M2)
            if t.is_hip
            else (T.CVT_INT_E4M3, T.CVT_INT_E5M2)
        )
        assert got == tuple(int(w) for w in want), name
    # no PTX on AMD; cvt needs SM89+; the interpreter takes the Triton-op integer path (its own
    # FP8 cast turns NaN codes into finite values) unless told otherwise
    assert fp8_conversion(e4, cuda, False, "ptx", TARGETS["gfx942"]) == T.CVT_TRITON_INT_E4M3
    assert fp8_conversion(e4, cuda, False, "ptx", TARGETS["sm86"]) == T.CVT_INT_E4M3
    assert fp8_conversion(e4, cuda, False, "ptx", TARGETS["sm89"]) == T.CVT_PTX_E4M3
    assert fp8_conversion(e4, torch.device("cpu"), True) == T.CVT_TRITON_INT_E4M3
    assert fp8_conversion(e5, torch.device("cpu"), True) == T.CVT_TRITON_INT_E5M2
    assert fp8_conversion(e4, torch.device("cpu"), True, "native") == T.CVT_NATIVE
    assert fp8_conversion(torch.bfloat16, cuda, False, "portable", TARGETS["sm90"]) == T.CVT_NATIVE
    with pytest.raises(ValueError, match="expected fp8_cvt"):
        fp8_conversion(e4, cuda, False, "fast", TARGETS["sm90"])
