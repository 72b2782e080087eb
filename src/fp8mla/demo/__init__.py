"""``fp8mla demo``: profile → diagnose → fix → verify, on this machine.

Runs an MLA decode loop three ways (full-pool cast, gather-then-cast, fp8mla direct),
profiles the first with ``torch.profiler``, lets ``fp8mla doctor`` find the cast in that trace,
checks that the three agree, and prints the step time of each.
"""

from __future__ import annotations

from fp8mla.demo.config import DemoConfig
from fp8mla.demo.result import ROW_NAMES, DemoResult, StrategyResult
from fp8mla.demo.run import run_demo

__all__ = ["ROW_NAMES", "DemoConfig", "DemoResult", "StrategyResult", "run_demo"]
