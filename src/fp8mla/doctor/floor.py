"""The memory-bound floor of the step (``fp8mla.gap``) next to what the trace measured."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fp8mla.doctor.finding import POOL_PROPORTIONAL_CAST

__all__ = ["FloorSpec", "floor_estimate", "floor_text"]


@dataclass(frozen=True)
class FloorSpec:
    """What ``fp8mla.gap.estimate`` needs besides the trace: the model and GPU presets (or a
    ``config.json``), the weight and KV formats, the tensor-parallel size, batch and context."""

    model: str
    gpu: str
    weights: str = "fp8"
    kv_dtype: str = "fp8_e4m3"
    tp: int = 1
    batch: int = 1
    context: int = 4096

    def check(self) -> None:
        """Raise ``ValueError`` (one line) for a model, GPU or size ``fp8mla.gap`` rejects, so a
        command can refuse before it reads a trace."""
        from fp8mla.gap import estimate

        estimate(
            self.model,
            self.gpu,
            weights=self.weights,
            kv_dtype=self.kv_dtype,
            tp=self.tp,
            batch=self.batch,
            context=self.context,
        )


def _pool_slots(report: dict[str, Any]) -> int | None:
    for rep in report.get("ranks", [report]):
        for finding in rep.get("findings", []):
            if finding["kind"] == POOL_PROPORTIONAL_CAST and finding.get("pool_slots"):
                return int(finding["pool_slots"])
    return None


def _measured_ms(report: dict[str, Any]) -> float | None:
    if "summary" in report:
        value = report["summary"].get("mean_ms")
    else:
        value = report["steps"]["mean_ms"] if report["steps"]["count"] else None
    return float(value) if value else None


def floor_estimate(report: dict[str, Any], spec: FloorSpec) -> dict[str, Any]:
    """``fp8mla.gap.estimate`` for ``spec`` with the measured mean step time as the TPOT and the
    pool-proportional cast's pool size as ``pool_slots``, as ``GapReport.to_dict()``.

    Raises ``ValueError`` when ``fp8mla.gap`` rejects the inputs.
    """
    from fp8mla.gap import estimate

    gap = estimate(
        spec.model,
        spec.gpu,
        weights=spec.weights,
        kv_dtype=spec.kv_dtype,
        tp=spec.tp,
        batch=spec.batch,
        context=spec.context,
        measured_tpot_ms=_measured_ms(report),
        pool_slots=_pool_slots(report),
    )
    return gap.to_dict()


def floor_text(report: dict[str, Any]) -> str | None:
    """The text of ``report["floor"]`` as ``fp8mla gap`` prints it, or None without one."""
    floor = report.get("floor")
    if not floor:
        return None
    from fp8mla.gap import GapReport

    return GapReport(**floor).format_text()
