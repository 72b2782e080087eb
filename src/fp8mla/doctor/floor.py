"""The memory-bound floor of the step (``fp8mla.gap``) next to what the trace measured."""

from __future__ import annotations

from typing import Any

__all__ = ["attach_floor"]


def _pool_slots(report: dict[str, Any]) -> int | None:
    for rep in report.get("ranks", [report]):
        for finding in rep.get("findings", []):
            if finding["kind"] == "pool_proportional_cast" and finding.get("pool_slots"):
                return int(finding["pool_slots"])
    return None


def _measured_ms(report: dict[str, Any]) -> float | None:
    if "summary" in report:
        value = report["summary"].get("mean_ms")
    else:
        value = report["steps"]["mean_ms"] if report["steps"]["count"] else None
    return float(value) if value else None


def attach_floor(
    report: dict[str, Any],
    model: str,
    gpu: str | None,
    *,
    weights: str = "fp8",
    kv_dtype: str = "fp8_e4m3",
    tp: int = 1,
    batch: int = 1,
    context: int = 4096,
) -> str | None:
    """Estimate the floor with ``fp8mla.gap.estimate`` (the measured mean step time as the
    TPOT, the pool-proportional cast's pool size as ``pool_slots``), store its dict under
    ``report["floor"]`` and return its text; None (with a warning in the report) when
    ``fp8mla.gap`` is missing or rejects the inputs."""
    warnings: list[str] = report.setdefault("warnings", [])
    try:
        from fp8mla.gap import estimate
    except ImportError:
        warnings.append("fp8mla.gap is not available: no floor estimate")
        return None
    try:
        gap = estimate(
            model,
            gpu,
            weights=weights,
            kv_dtype=kv_dtype,
            tp=tp,
            batch=batch,
            context=context,
            measured_tpot_ms=_measured_ms(report),
            pool_slots=_pool_slots(report),
        )
    except (ValueError, OSError) as exc:
        warnings.append(f"floor estimate failed: {exc}")
        return None
    report["floor"] = gap.to_dict()
    return gap.format_text()
