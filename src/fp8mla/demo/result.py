"""What a demo run found and measured."""

from __future__ import annotations

from dataclasses import dataclass, field

from fp8mla.demo.config import DemoConfig

__all__ = ["ROW_NAMES", "AttentionCheck", "DemoResult", "StrategyResult"]

ROW_NAMES = ("full-pool cast", "gather-then-cast", "fp8mla direct")


@dataclass(frozen=True)
class AttentionCheck:
    """``rel_err`` of one layer's attention computed by ``what`` against float64, and
    ``rounding``: the error of the float64 result itself rounded to the output dtype."""

    what: str
    rel_err: float
    rounding: float


@dataclass
class StrategyResult:
    """One strategy's decode step: time, bytes moved, and ``rel_err``, its final hidden state
    against fp8mla direct's."""

    name: str
    ms_per_step: float
    tokens_per_s: float
    bytes_per_step: int
    speedup: float = 1.0
    rel_err: float = 0.0


@dataclass
class DemoResult:
    """The doctor's finding on the profiled trace, the three strategies, and the attention
    check (the kernel against float64)."""

    config: DemoConfig
    rows: list[StrategyResult]
    finding: dict | None
    trace_path: str | None  # None: the trace was written to a temporary folder, now removed
    notes: list[str] = field(default_factory=list)
    attention: AttentionCheck | None = None
