"""Shapes of the demo's decode loop."""

from __future__ import annotations

from dataclasses import dataclass, replace


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
