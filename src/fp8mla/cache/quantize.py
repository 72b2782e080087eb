"""Quantization of new KV rows into the cache's storage format (the PyTorch path)."""

from __future__ import annotations

import torch

from fp8mla.formats import FP8_MAX, SCALE_GROUP, is_fp8

# Smallest per-group scale: keeps all-zero groups finite (their values quantize to 0).
MIN_GROUP_SCALE = 1e-12


def group_scales(ckv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Per token, per 128 latent channels: ``amax / FP8_MAX`` as fp32 ``[n, D // 128]``, the
    amax over the group's finite values (a NaN or ±inf does not spoil the group's scale)."""
    mag = ckv.float().unflatten(-1, (-1, SCALE_GROUP)).abs()
    amax = torch.where(mag < float("inf"), mag, 0.0).amax(dim=-1)
    # Divide by a tensor: PyTorch turns division by a Python scalar into a multiplication by
    # its reciprocal on CUDA, one ulp away from the write kernel's (and IEEE's) division.
    return (amax / torch.full_like(amax, FP8_MAX[dtype])).clamp_min(MIN_GROUP_SCALE)


def quantize(
    x: torch.Tensor, dtype: torch.dtype, scale: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """``x / scale`` rounded to ``dtype``. FP8: finite values beyond the range and ±inf
    saturate to the largest finite value; NaN stays NaN (the format's NaN code, as PyTorch's
    cast writes it). 16-bit: a plain cast. The Triton writer follows the same rule."""
    if not is_fp8(dtype):
        return x.to(dtype)
    limit = FP8_MAX[dtype]
    xf = x.float()
    divisor = scale.to(xf) if isinstance(scale, torch.Tensor) else torch.full_like(xf, scale)
    return (xf / divisor).clamp(-limit, limit).to(dtype)


def quantize_token_groups(
    ckv: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group quantization: ``(ckv_q [n, D], scales [n, D // 128])``."""
    scales = group_scales(ckv, dtype)
    scaled = ckv.float().unflatten(-1, (-1, SCALE_GROUP)) / scales[..., None]
    return quantize(scaled.flatten(-2), dtype), scales
