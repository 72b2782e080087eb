"""What every detector reads: one trace's launches, steps, layer count and the user's hints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fp8mla.doctor.records import Launch, TraceData
from fp8mla.doctor.steps import Segmentation, Step

__all__ = ["TraceContext"]


@dataclass
class TraceContext:
    """One trace after linking and step segmentation.

    ``wall_us`` is the mean step wall time; ``attention_us`` the mean attention time per step
    (GPU traces only); ``peak_tbps`` the device's peak bandwidth and ``peak_source`` where that
    number comes from. ``active_tokens``/``context`` are the user's hints (None when not given).
    """

    data: TraceData
    launches: list[Launch]
    mode: str  # "gpu" | "cpu"
    segmentation: Segmentation
    info: dict[str, Any]
    layers: int | None
    layers_method: str
    layers_detail: str
    active_tokens: int | None = None
    context: int | None = None
    wall_us: float = 0.0
    attention_us: float | None = None
    peak_tbps: float | None = None
    peak_source: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def steps(self) -> list[Step]:
        return self.segmentation.steps

    @property
    def nsteps(self) -> int:
        return len(self.segmentation.steps)

    @property
    def per(self) -> str:
        """``per step``, or ``in the window`` when no repeating step was found."""
        return "in the window" if self.segmentation.method == "whole-trace" else "per step"
