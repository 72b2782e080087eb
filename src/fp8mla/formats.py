"""KV-cache storage formats: dtypes, FP8 ranges, names and scale groups."""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPES: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)
KV_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, *FP8_DTYPES)
Q_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)

# Largest finite value of each FP8 format (e4m3fn has no infinities; e5m2 follows fp16).
FP8_MAX: dict[torch.dtype, float] = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}

# Per-token-group scales cover this many latent channels (DeepSeek's fine-grained quantization).
SCALE_GROUP = 128

HEAD_DIM_CKV = 512
HEAD_DIM_KPE = 64

# Tokens per page of a paged cache. The page size is a compile-time constant of every kernel
# (each one is a build of its own), so the library takes the range its tests build and run:
# 1 to 128, which holds the page sizes engines use for MLA pools (vLLM's and SGLang's 1-64).
MAX_PAGE_SIZE = 128

_NAMES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp8": torch.float8_e4m3fn,
    "e4m3": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
    "fp8_e5m2": torch.float8_e5m2,
    "float8_e5m2": torch.float8_e5m2,
}


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"fp8_e4m3"``, ``"bf16"``, ``"torch.float8_e5m2"`` … → ``torch.dtype``."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).lower().removeprefix("torch.")
    if key not in _NAMES:
        raise ValueError(f"expected one of {sorted(_NAMES)}, got {name!r}")
    return _NAMES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float8_e4m3fn`` → ``"float8_e4m3fn"`` (the spelling used in case names)."""
    return str(dtype).removeprefix("torch.")


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class Scales:
    """Dequantization scales of one attention run: per-tensor floats or 1-element fp32 device
    tensors (read by the kernel), or per-token, per-128-channel ``ckv_arr``."""

    ckv: float | torch.Tensor = 1.0
    kpe: float | torch.Tensor = 1.0
    ckv_arr: torch.Tensor | None = None  # [num_pages, page_size, 512 // SCALE_GROUP] fp32
