"""Launcher of the fused KV write kernel."""

from __future__ import annotations

import torch

from fp8mla.formats import FP8_MAX, SCALE_GROUP

# (MBITS, EMIN, BIAS) of each FP8 format.
FP8_FIELDS = {torch.float8_e4m3fn: (3, -6, 7), torch.float8_e5m2: (2, -14, 15)}
# How the kernel stores each storage dtype, and the view it stores through.
STORE_KIND = {
    torch.float8_e4m3fn: (0, torch.uint8),
    torch.float8_e5m2: (0, torch.uint8),
    torch.bfloat16: (1, torch.uint16),
    torch.float16: (2, torch.float16),
}


def kv_write_triton(
    cache: torch.Tensor,
    scale_arr: torch.Tensor | None,
    slots: torch.Tensor,
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    ckv_scale: float,
    kpe_scale: float,
) -> None:
    """Quantize ``ckv [n, 512]`` / ``kpe [n, 64]`` into ``cache [num_slots, 1, 576]`` at
    ``slots [n]`` in one launch; per-token-group scales go to ``scale_arr [num_slots, 4]``.
    Inputs are validated by the caller (:class:`fp8mla.cache.MLAKVCache`)."""
    from fp8mla.kernels.portable.kv_write import kv_write_kernel

    n = slots.numel()
    if n == 0:
        return
    ckv = ckv if ckv.stride(-1) == 1 else ckv.contiguous()
    kpe = kpe if kpe.numel() == 0 or kpe.stride(-1) == 1 else kpe.contiguous()
    token_group = scale_arr is not None
    kind, view_dtype = STORE_KIND[cache.dtype]
    mbits, emin, bias = FP8_FIELDS.get(cache.dtype, (0, 0, 0))
    bits = cache.view(view_dtype)
    kv_write_kernel[(n,)](
        ckv,
        kpe,
        slots,
        bits,
        scale_arr if token_group else ckv,
        ckv.stride(0),
        kpe.stride(0) if kpe.dim() == 2 else 0,
        bits.stride(0),
        scale_arr.stride(0) if token_group else 0,
        float(ckv_scale),
        float(kpe_scale),
        D_CKV=ckv.shape[-1],
        D_KPE=kpe.shape[-1],
        GROUP=SCALE_GROUP,
        FP8_MAX=FP8_MAX.get(cache.dtype, 0.0),
        MBITS=mbits,
        EMIN=emin,
        BIAS=bias,
        STORE_KIND=kind,
        TOKEN_GROUP=token_group,
        num_warps=4,
    )
