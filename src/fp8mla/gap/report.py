"""The result of :func:`~fp8mla.gap.estimate.estimate` and its plain-text rendering
(1 GB = 10^9 bytes)."""

from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any

from fp8mla.gap.traffic import KV_BYTES

__all__ = ["GapReport", "format_report"]


@dataclass
class GapReport:
    """One estimate. Bytes are per GPU per decode step; times in ms; bandwidths in TB/s (10^12 B/s).

    ``to_dict()`` keys: the inputs (``model``, ``gpu``, ``weights``, ``kv_dtype``, ``tp``,
    ``batch``, ``context``), ``weight_bytes`` (with ``weight_breakdown``), ``kv_bytes`` (=
    ``kv_latent_bytes`` + ``kv_index_bytes``), ``total_bytes``, ``bandwidth_tbps``, ``floor_ms``;
    ``measured_ms``, ``gap_ms``, ``cast_bytes``, ``cast_ms``, ``cast_share_of_gap`` (null unless
    measured / pool given), plus ``assumptions`` and ``notes`` (lists of strings).
    """

    model: str
    model_source: str
    gpu: str | None
    bandwidth_tbps: float
    bandwidth_source: str
    weights: str
    kv_dtype: str
    tp: int
    batch: int
    context: int
    num_layers: int
    attention: str
    kv_tokens_per_layer: int
    kv_values_per_token: int
    routed_experts_per_layer: float
    weight_breakdown: dict[str, float]
    weight_bytes: float
    kv_latent_bytes: float
    kv_index_bytes: float
    kv_bytes: float
    total_bytes: float
    floor_ms: float
    copy_tbps_measured: float | None = None
    floor_ms_at_copy_rate: float | None = None
    resident_weight_bytes: float = 0.0
    gpu_memory_bytes: float | None = None
    measured_ms: float | None = None
    gap_ms: float | None = None
    pool_slots: int | None = None
    pool_bytes: float | None = None
    cast_bytes: float | None = None
    cast_ms: float | None = None
    cast_share_of_gap: float | None = None
    cast_tbps_measured: float | None = None
    cast_ms_at_measured_rate: float | None = None
    cast_share_at_measured_rate: float | None = None
    assumptions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (numbers, strings, null, lists, dicts)."""
        return asdict(self)

    def format_text(self) -> str:
        """The human-readable report ``fp8mla gap`` prints."""
        return format_report(self)


_LABELS = {
    "attention": "attention (MLA projections)",
    "indexer": "DSA indexer",
    "dense_mlp": "dense MLP",
    "routed_experts": "routed experts",
    "shared_experts": "shared experts",
    "router": "router",
    "norms": "norms",
    "lm_head": "lm_head",
}


def _wrap(text: str, bullet: str = "") -> list[str]:
    return textwrap.wrap(
        text, width=100, initial_indent="  " + bullet, subsequent_indent="  " + " " * len(bullet)
    )


def _gb(value: float) -> str:
    return f"{value / 1e9:9.3f} GB"


def _row(label: str, value: str, note: str = "") -> str:
    return f"  {label:<36}{value}" + (f"  {note}" if note else "")


def format_report(r: GapReport) -> str:
    """The text ``fp8mla gap`` prints: bytes, floor, gap, cast share, assumptions, notes."""
    on = f" on {r.gpu}" if r.gpu else ""
    lines = [
        f"{r.model} decode step: {r.weights} weights, {r.kv_dtype} KV, TP {r.tp}, "
        f"batch {r.batch}, context {r.context}{on}",
        *_wrap(f"model: {r.model_source}; {r.num_layers} layers, attention {r.attention}"),
        "",
        "bytes one decode step moves, per GPU",
        _row("weights", _gb(r.weight_bytes)),
    ]
    for key, value in r.weight_breakdown.items():
        if value == 0:
            continue
        note = f"({r.routed_experts_per_layer:.2f} per layer)" if key == "routed_experts" else ""
        lines.append(_row("  " + _LABELS.get(key, key), _gb(value), note))
    kv_note = f"(latent {r.kv_latent_bytes / 1e9:.3f}"
    if r.kv_index_bytes:
        kv_note += f" + DSA index keys {r.kv_index_bytes / 1e9:.3f}"
    kv_note += ")"
    lines += [
        _row("KV cache", _gb(r.kv_bytes), kv_note),
        _row("total", _gb(r.total_bytes)),
        "",
        _row(
            "floor per output token",
            f"{r.floor_ms:9.3f} ms",
            f"at {r.bandwidth_tbps:.2f} TB/s ({r.bandwidth_source})",
        ),
    ]
    if r.floor_ms_at_copy_rate is not None and r.copy_tbps_measured != r.bandwidth_tbps:
        lines.append(
            _row(
                "",
                f"{r.floor_ms_at_copy_rate:9.3f} ms",
                f"at {r.copy_tbps_measured:.2f} TB/s (measured {r.gpu} device copy)",
            )
        )
    if r.measured_ms is not None and r.gap_ms is not None:
        ratio = r.measured_ms / r.floor_ms if r.floor_ms else float("inf")
        lines += [
            _row("measured TPOT", f"{r.measured_ms:9.3f} ms", f"({ratio:.1f}× the floor)"),
            _row("gap", f"{r.gap_ms:9.3f} ms", "(measured − floor)"),
        ]
    if r.cast_bytes is not None and r.pool_slots is not None:
        read = KV_BYTES[r.kv_dtype]
        lines += [
            "",
            f"full-pool cast: {r.pool_slots:,} slots × {r.num_layers} layers × "
            f"{r.kv_values_per_token} values × ({read:g} B read + 2 B write) = "
            f"{r.cast_bytes / 1e9:.2f} GB per step",
        ]
        casts = [(r.bandwidth_tbps, "floor bandwidth", r.cast_ms, r.cast_share_of_gap)]
        if r.cast_tbps_measured is not None and r.cast_bytes:
            casts.append(
                (
                    r.cast_tbps_measured,
                    f"{r.gpu} measured cast",
                    r.cast_ms_at_measured_rate,
                    r.cast_share_at_measured_rate,
                )
            )
        for tbps, what, ms, share in casts:
            tail = f"= {share:.1%} of the gap" if share is not None else ""
            lines.append(_row(f"  at {tbps:.2f} TB/s ({what})", f"{ms or 0.0:9.3f} ms", tail))
    lines += ["", "assumptions"]
    for a in r.assumptions:
        lines += _wrap(a, "- ")
    if r.notes:
        lines.append("notes")
        for n in r.notes:
            lines += _wrap(n, "! ")
    return "\n".join(lines)
