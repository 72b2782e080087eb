"""Layout of the float workspace: where the split-KV partial results live."""

from __future__ import annotations

import torch


def split_capacity(workspace: torch.Tensor, splits: int, head_dim: int) -> int:
    """Query rows (tokens × heads) whose partials for ``splits`` splits fit the workspace."""
    nbytes = workspace.numel() * workspace.element_size()
    return (nbytes // 4) // max(1, splits * (head_dim + 1))


def split_partials(
    workspace: torch.Tensor, splits: int, rows: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mid_o [splits, rows_cap, head_dim]`` and ``mid_lse [splits, rows_cap]`` fp32 views of
    the workspace. ``rows_cap`` depends only on the workspace size and the split count, so
    re-plans see the same addresses and strides (what a captured CUDA graph replays)."""
    if not workspace.is_contiguous():
        raise ValueError("expected a contiguous float_workspace_buffer, got a strided one")
    nbytes = workspace.numel() * workspace.element_size()
    rows_cap = split_capacity(workspace, splits, head_dim)
    if rows > rows_cap:
        raise ValueError(
            f"expected a float_workspace_buffer of at least {splits * (head_dim + 1) * rows * 4} "
            f"bytes for {rows} query rows and {splits} splits, got {nbytes}"
        )
    flat = workspace.view(-1).view(torch.uint8)[: nbytes - nbytes % 4].view(torch.float32)
    mid_o = flat[: splits * rows_cap * head_dim].view(splits, rows_cap, head_dim)
    mid_lse = flat[splits * rows_cap * head_dim : splits * rows_cap * (head_dim + 1)]
    return mid_o, mid_lse.view(splits, rows_cap)
