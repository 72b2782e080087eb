"""``fp8mla gap``: the memory-bound floor of an MLA decode step, and what a full-pool cast costs.

Pure Python (no torch). Public API:

- :func:`estimate` -- bytes a decode step moves per GPU (weights, active experts, KV), the floor
  time per output token, and with a measured TPOT the gap and a full-pool cast's share of it.
- :class:`GapReport` -- its result: ``to_dict()`` (JSON-safe) and ``format_text()``.
- :data:`PRESETS` (models) and :data:`GPUS` (GPUs) -- the built-in presets.
"""

from __future__ import annotations

from fp8mla.gap.estimate import estimate
from fp8mla.gap.gpus import GPUS, GpuSpec, lookup_gpu
from fp8mla.gap.model_spec import ModelSpec, load_model, spec_from_config
from fp8mla.gap.presets import PRESETS
from fp8mla.gap.report import GapReport

__all__ = [
    "GPUS",
    "PRESETS",
    "GapReport",
    "GpuSpec",
    "ModelSpec",
    "estimate",
    "load_model",
    "lookup_gpu",
    "spec_from_config",
]
