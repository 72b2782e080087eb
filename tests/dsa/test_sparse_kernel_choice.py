"""Which kernel a sparse plan takes (``sparse_plan.fp8qk_serves``): the SM90 FP8 × FP8 kernel for
bf16 queries over the packed cache where the target's table says so, the portable kernel
elsewhere, and a ValueError naming the reason when ``kernel="fp8qk"`` cannot serve."""

from __future__ import annotations

import pytest
import torch

from fp8mla.attention.targets import TARGETS
from fp8mla.dsa.sparse_plan import fp8qk_serves

SM90 = TARGETS["sm90"]
BF16, FP16, U8 = torch.bfloat16, torch.float16, torch.uint8


@pytest.mark.parametrize("heads", [1, 16, 32, 64, 128])
def test_auto_takes_fp8qk_on_sm90_for_bf16_queries_over_the_packed_cache(heads):
    assert fp8qk_serves("auto", SM90, heads, BF16, U8, interpreted=False)


@pytest.mark.parametrize(
    "target, q, kv, interp",
    [(SM90, FP16, U8, False), (SM90, BF16, BF16, False), (SM90, BF16, U8, True),
     (TARGETS["sm100"], BF16, U8, False), (TARGETS["sm120"], BF16, U8, False),
     (TARGETS["gfx942"], BF16, U8, False)],
)  # fmt: skip
def test_auto_keeps_the_portable_kernel_elsewhere(target, q, kv, interp):
    assert not fp8qk_serves("auto", target, 32, q, kv, interpreted=interp)
    assert not fp8qk_serves("portable", target, 32, q, kv, interpreted=interp)


@pytest.mark.parametrize(
    "target, q, kv, why",
    [(SM90, FP16, U8, "bf16 queries"), (SM90, BF16, BF16, "packed FP8 cache"),
     (TARGETS["sm120"], BF16, U8, "SM90")],
)  # fmt: skip
def test_fp8qk_asked_where_it_cannot_serve_says_why(target, q, kv, why):
    with pytest.raises(ValueError, match=why):
        fp8qk_serves("fp8qk", target, 32, q, kv, interpreted=False)
