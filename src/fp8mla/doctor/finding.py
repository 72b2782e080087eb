"""What the doctor reports: the finding kinds, their severity, and the :class:`Finding` record.

Kinds:

- ``pool_proportional_cast``: a dtype cast of the whole KV pool, about once per layer per step.
- ``dtype_cast``: another cast costing ≥ 1% of the step (a gathered cast, an activation cast).
- ``copy``: a same-dtype device copy costing ≥ 1% of the step.
- ``memcpy``: copy-engine transfers (host↔device) inside the step costing ≥ 1% of it.
- ``launch_bound``: the device idles ≥ 30% of the step between short kernels.

Severity follows the share of step time: ``high`` ≥ 20%, ``medium`` ≥ 5%, else ``low``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Final

__all__ = [
    "COPY",
    "DTYPE_CAST",
    "KINDS",
    "LAUNCH_BOUND",
    "MEMCPY",
    "POOL_PROPORTIONAL_CAST",
    "SEVERITIES",
    "Finding",
    "calls_text",
    "range_text",
    "severity",
]

POOL_PROPORTIONAL_CAST: Final = "pool_proportional_cast"
DTYPE_CAST: Final = "dtype_cast"
COPY: Final = "copy"
MEMCPY: Final = "memcpy"
LAUNCH_BOUND: Final = "launch_bound"
KINDS: Final = (POOL_PROPORTIONAL_CAST, DTYPE_CAST, COPY, MEMCPY, LAUNCH_BOUND)
CAST_KINDS: Final = frozenset({POOL_PROPORTIONAL_CAST, DTYPE_CAST})
"""Kinds whose source lines ``--source-root`` looks up."""

SEVERITIES: Final = ("high", "medium", "low")


def severity(share: float) -> str:
    """``high`` ≥ 20% of step time, ``medium`` ≥ 5%, else ``low``."""
    return "high" if share >= 0.20 else "medium" if share >= 0.05 else "low"


def calls_text(counts: list[int], unit: str = "", per: str = "per step") -> str:
    """How often per step, from the count in each step, never as a fraction: ``78 per step``
    when every step has the same count, else ``700–850 per step (4,645 in 6 steps)``."""
    unit = f" {unit}" if unit else ""
    if not counts:
        return f"0{unit} {per}"
    lo, hi = min(counts), max(counts)
    if lo == hi:
        return f"{lo:,}{unit} {per}"
    return f"{lo:,}–{hi:,}{unit} {per} ({sum(counts):,} in {len(counts)} steps)"


def range_text(calls: float | None, calls_range: list[int] | None) -> str:
    """``78`` or ``700–850`` (a JSON finding's per-step count, for display)."""
    if calls_range and calls_range[0] != calls_range[1]:
        return f"{calls_range[0]:,}–{calls_range[1]:,}"
    if calls_range:
        return f"{calls_range[0]:,}"
    return "?" if calls is None else f"{round(calls):,}"


@dataclass(kw_only=True)
class Finding:
    """One thing that costs step time, why the doctor thinks so, and what to change.

    Fields are the ``findings[]`` entries of the ``--json`` schema (``docs/doctor.md``), in
    that order; :meth:`to_dict` gives the JSON form. ``severity`` follows ``share_of_step``
    unless given. ``source_file`` and ``source_lines`` exist only in reports made with
    ``--source-root``/``--package``; they are added to the JSON by
    :func:`fp8mla.doctor.extras.attach_extras`.
    """

    kind: str
    severity: str = ""
    title: str
    kernel: str | None = None
    kernel_short: str | None = None
    op: str | None = None
    calls_per_step: float | None = None
    calls_range: list[int] | None = None
    elements_per_call: int | None = None
    elements_source: str | None = None
    elements_note: str | None = None
    shape: list[int] | None = None
    src_dtype: str | None = None
    dst_dtype: str | None = None
    bytes_per_step: int | None = None
    bytes_estimated: bool = False
    time_per_step_ms: float | None = None
    share_of_step: float
    bandwidth_gbps: float | None = None
    source: str | None = None
    cuda_graph: bool = False
    pool_slots: int | None = None
    active_tokens: int | None = None
    active_tokens_source: str | None = None
    evidence: list[str] = field(default_factory=list)
    suggestion: str = ""
    partial: bool = False  # from a damaged trace read with allow_partial: its totals are partial

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"expected a finding kind in {KINDS}, got {self.kind!r}")
        if not self.severity:
            self.severity = severity(self.share_of_step)
        self.share_of_step = round(self.share_of_step, 4)

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready dict (keys in schema order; lists copied)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, list) else value
        return out
