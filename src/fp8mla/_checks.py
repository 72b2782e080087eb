"""Input validation shared by the launchers, the wrapper and the reference.

Every check raises ``ValueError("expected …, got …")`` naming the argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch


def check_tensor(
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    dtypes: Iterable[torch.dtype] | None = None,
    device: torch.device | None = None,
    shape: Sequence[int | None] | None = None,
) -> torch.Tensor:
    """Validate a tensor argument; ``None`` entries in ``shape`` match any size."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"expected {name} to be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"expected {name} with {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise ValueError(f"expected {name} of dtype {names}, got {t.dtype}")
    if device is not None and not same_device(t.device, device):
        raise ValueError(f"expected {name} on {device}, got {t.device}")
    if shape is not None:
        if t.dim() != len(shape) or any(
            s is not None and s != d for s, d in zip(shape, t.shape, strict=True)
        ):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"expected {name} of shape {want}, got {list(t.shape)}")
    return t


def same_device(a: torch.device, b: torch.device) -> bool:
    """``cuda`` and ``cuda:0`` are the same device when the current device is 0."""
    if a.type != b.type:
        return False
    if a.index == b.index:
        return True
    if a.type == "cuda":
        current = torch.cuda.current_device()
        return (a.index if a.index is not None else current) == (
            b.index if b.index is not None else current
        )
    return a.index is None or b.index is None


def check_index(name: str, t: object, *, length: int | None = None) -> torch.Tensor:
    """An index array: 1-D int32 (FlashInfer's convention), optionally of a given length."""
    t = check_tensor(name, t, ndim=1)
    if t.dtype != torch.int32:
        raise ValueError(f"expected {name} of dtype int32, got {t.dtype}")
    if length is not None and t.numel() != length:
        raise ValueError(f"expected {name} of length {length}, got {t.numel()}")
    return t


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.numel() and t.stride(-1) != 1:
        raise ValueError(f"expected {name} with unit stride in the last dim, got {t.stride()}")
