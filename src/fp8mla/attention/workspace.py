"""Layout of the float workspace: where the split-KV partial results live."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Partials:
    """Workspace views of one split plan's partial results.

    ``o [splits, rows_cap, head_dim]``: each split's normalized output; ``lse [splits,
    rows_cap]`` fp32: its base-2 LSE (-inf for an empty split). ``o`` is fp32, or fp16 with
    ``mult [1]`` fp32: the factor the merged output is multiplied by (the kernel stores
    ``o / l`` without the V scale, averages of FP8 values that fp16 holds, and the V scale
    there).
    """

    o: torch.Tensor
    lse: torch.Tensor
    mult: torch.Tensor | None = None


def split_capacity(workspace: torch.Tensor, splits: int, head_dim: int) -> int:
    """Query rows (tokens × heads) whose partials for ``splits`` splits fit the workspace."""
    nbytes = workspace.numel() * workspace.element_size()
    return (nbytes // 4) // max(1, splits * (head_dim + 1))


def split_partials(
    workspace: torch.Tensor, splits: int, rows: int, head_dim: int, half: bool = False
) -> Partials:
    """The partials' views of the workspace (fp16 outputs and their factor where ``half``).
    ``rows_cap`` depends only on the workspace size and the split count, so re-plans see the
    same addresses and strides (what a captured CUDA graph replays); fp16 outputs take the
    first half of the fp32 outputs' bytes and the factor the start of the second."""
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
    n_o = splits * rows_cap * head_dim
    lse = flat[n_o : n_o + splits * rows_cap].view(splits, rows_cap)
    if not half:
        return Partials(flat[:n_o].view(splits, rows_cap, head_dim), lse)
    o = flat[: n_o // 2].view(torch.float16).view(splits, rows_cap, head_dim)
    mult = flat[n_o // 2 : n_o // 2 + 1]
    return Partials(o, lse, mult)
