"""Shapes of the demo's decode loop."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

KV_ROW = 576  # values per token: 512 latent + 64 RoPE


@dataclass(frozen=True)
class DemoConfig:
    layers: int
    heads: int
    hidden: int
    pool_slots: int
    context: int
    batch: int
    steps: int
    mlp: int  # MLP width (a shared-expert-sized FFN per layer)
    cuda_graph: bool
    device: str

    @property
    def active_tokens(self) -> int:
        return self.batch * self.context

    def memory_bytes(self) -> int:
        """Bytes the demo holds at its peak: every layer's FP8 pool, the bf16 copy of one pool
        that the full-pool cast makes, and the bf16 weights (shared by the layers)."""
        h, heads = self.hidden, self.heads
        pools = self.layers * self.pool_slots * KV_ROW
        cast = self.pool_slots * KV_ROW * 2
        weights = 2 * (h * heads * KV_ROW + h * KV_ROW + heads * 512 * h + 2 * h * self.mlp)
        return pools + cast + weights


def available_memory(device: str) -> int | None:
    """Bytes of memory free for the demo on ``device`` (``cuda``: the GPU's free memory;
    ``cpu``: MemAvailable, else the physical memory), or None when unknown."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


# GLM-5 at tensor-parallel 2 on one H200: 78 layers, 32 query heads per GPU, hidden 6144,
# the engine's 495,552-slot FP8 pool per layer, 4,096 tokens of context.
GPU_DEFAULT = DemoConfig(
    layers=78,
    heads=32,
    hidden=6144,
    pool_slots=495_552,
    context=4096,
    batch=1,
    steps=20,
    mlp=2048,
    cuda_graph=True,
    device="cuda",
)

# Scaled down so that `make demo` finishes in well under three minutes on two CPU cores.
CPU_DEFAULT = DemoConfig(
    layers=8,
    heads=16,
    hidden=1024,
    pool_slots=100_000,
    context=1024,
    batch=2,
    steps=3,
    mlp=1024,
    cuda_graph=False,
    device="cpu",
)


def default_config(device: str) -> DemoConfig:
    return GPU_DEFAULT if device.startswith("cuda") else CPU_DEFAULT


def with_overrides(base: DemoConfig, **kw: object) -> DemoConfig:
    return replace(base, **{k: v for k, v in kw.items() if v is not None})
