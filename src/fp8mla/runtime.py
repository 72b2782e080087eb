"""Where kernels run: compiled on a GPU, interpreted on a CPU, or the PyTorch path."""

from __future__ import annotations

import os
from typing import Literal

import torch

Backend = Literal["auto", "triton", "torch"]
BACKENDS = ("auto", "triton", "torch")


def interpreted() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(backend: str, device: torch.device) -> Literal["triton", "torch"]:
    """``"auto"`` picks Triton for CUDA tensors and PyTorch otherwise; an explicit
    ``"triton"`` on CPU tensors needs the interpreter."""
    if backend not in BACKENDS:
        raise ValueError(f"expected backend in {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if backend == "triton" and device.type != "cuda" and not interpreted():
        raise ValueError(
            f"expected CUDA tensors for backend='triton' (or TRITON_INTERPRET=1 set before "
            f"importing fp8mla to run kernels on the CPU), got tensors on {device}"
        )
    return backend  # type: ignore[return-value]
