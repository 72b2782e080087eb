"""What a demo run found and measured."""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8mla.demo.config import DemoConfig

__all__ = ["ROW_NAMES", "DemoResult", "StrategyResult"]

ROW_NAMES = ("full-pool cast", "gather-then-cast", "fp8mla direct")


@dataclass
class StrategyResult:
    name: str
    ms_per_step: float
    tokens_per_s: float
    bytes_per_step: int
    speedup: float = 1.0
    rel_err: float = 0.0


@dataclass
class DemoResult:
    config: DemoConfig
    rows: list[StrategyResult]
    finding: dict | None
    trace_path: str
    notes: list[str] = field(default_factory=list)
