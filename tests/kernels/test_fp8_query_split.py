"""The numerical premise of the FP8 × FP8 kernel's query (``kernels/mla_fp8qk.py``): a bf16 row
scaled by the power of two ``s`` (``224 < max |q·s| ≤ 448``) is held exactly by two e4m3
values, ``hi = e4m3(q·s)`` and ``lo = e4m3((q·s − hi) · 16)``, as ``hi + lo / 16``, for every
element down to 2^-12 of the row's largest; smaller ones keep an absolute error below the
row's largest × 2^-18; a row below 2^-117 (its scale capped at 2^126) stays finite. fp16 queries (11 significant bits) are not held exactly, which is why
the planner gives them to the few-row kernel. The same arithmetic as the kernel, in PyTorch's
float8 types (round to nearest even, as ``cvt.rn.satfinite.e4m3x2.f32``)."""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn


def split(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, hi, lo)`` for rows ``q [R, D]`` as the kernel computes them (``x = q·s``)."""
    amax = q.float().abs().amax(dim=1, keepdim=True)
    amax = torch.where(amax > 0, amax, torch.full_like(amax, 448.0))
    s = torch.exp2(torch.clamp(torch.floor(torch.log2(448.0 / amax)), max=126.0))
    x = q.float() * s
    hi = x.to(E4M3).float()
    lo = ((x - hi) * 16.0).to(E4M3).float()
    return x, hi, lo


def bf16_rows(seed: int) -> torch.Tensor:
    """Rows of bf16 queries with spread magnitudes: normal values, a few large channels, and
    elements down to 2^-20 of the row's largest."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(64, 576, generator=g)
    q[:, ::37] *= 40.0
    q *= torch.exp2(torch.randint(-20, 1, (64, 576), generator=g).float() * (q.abs() < 0.1))
    q[0] = 0.0  # a row of zeros (rows past the request's) stays zero
    q[1, :] = torch.finfo(torch.bfloat16).max / 2
    q[2, :] = torch.finfo(torch.bfloat16).tiny * 4
    return q.to(torch.bfloat16)


def test_scale_keeps_every_row_in_e4m3_range():
    q = bf16_rows(1)
    x, hi, lo = split(q)
    amax = x.abs().amax(dim=1)
    normal = q.float().abs().amax(dim=1) >= 2.0**-117
    assert torch.all((amax > 224.0) & (amax <= 448.0) | (amax == 0) | ~normal)
    assert not normal[2] and amax[2] <= 448.0  # the tiny row: capped scale, still finite
    assert torch.isfinite(hi).all() and torch.isfinite(lo).all()


def test_bf16_queries_are_held_exactly_above_2_to_minus_12_of_the_row():
    for seed in range(4):
        x, hi, lo = split(bf16_rows(seed))
        amax = x.abs().amax(dim=1, keepdim=True)
        big = x.abs() >= amax * 2.0**-12
        assert torch.equal((hi + lo / 16.0)[big], x[big])
        # below that, e4m3's subnormals: an absolute error under the row's largest × 2^-18
        err = (hi + lo / 16.0 - x).abs()
        assert torch.all(err <= amax * 2.0**-18)


def test_fp16_queries_are_not_held_exactly():
    g = torch.Generator().manual_seed(5)
    q = (torch.randn(64, 576, generator=g) * 3).to(torch.float16)
    x, hi, lo = split(q)
    assert not torch.equal(hi + lo / 16.0, x)
    # the relative error of the sum stays at e4m3's two steps: 2^-8 of the element
    rel = ((hi + lo / 16.0 - x).abs() / x.abs().clamp_min(1e-30))[x.abs() > 1.0]
    assert rel.max() <= 2.0**-8
