"""The SVG charts of the HTML report: time per step by family, and one step's timeline."""

from __future__ import annotations

import html
from typing import Any

from fp8mla.doctor.families import FAMILIES

__all__ = ["COLORS", "step_bars", "timeline"]

COLORS = {
    "cast_copy": "#d62728",
    "gemm": "#1f77b4",
    "attention": "#2ca02c",
    "norm": "#9467bd",
    "elementwise": "#ff7f0e",
    "communication": "#8c564b",
    "memcpy": "#e377c2",
    "other": "#7f7f7f",
    "idle": "#d9d9d9",
}
_MAX_BARS = 60


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _legend(families: set[str]) -> str:
    return (
        '<div class="legend">'
        + "".join(
            f'<span><i class="sw" style="background:{c}"></i>{_e(FAMILIES.get(f, f))}</span>'
            for f, c in COLORS.items()
            if f in families
        )
        + "</div>"
    )


def step_bars(report: dict[str, Any]) -> str:
    steps = report["steps"]["per_step"][:_MAX_BARS]
    if not steps:
        return "<p>No steps to chart.</p>"
    label_w, bar_w, row_h = 118, 820, 22
    scale_ms = (
        max(max(s["wall_ms"], sum(f["time_ms"] for f in s["families"].values())) for s in steps)
        or 1.0
    )
    height = row_h * len(steps) + 34
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" '
        f'viewBox="0 0 {label_w + bar_w + 70} {height}" role="img" '
        f'aria-label="time per step by kernel family">'
    ]
    for i, step in enumerate(steps):
        y = 4 + i * row_h
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end" font-size="12">'
            f"{_e(step['name'][:18])}</text>"
        )
        x = float(label_w)
        segments = [(fam, v["time_ms"]) for fam, v in step["families"].items()]
        segments.append(("idle", step["wall_ms"] - step["busy_ms"]))
        for fam, ms in segments:
            if ms <= 0:
                continue
            w = bar_w * ms / scale_ms
            label = FAMILIES.get(fam, fam)
            parts.append(
                f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{row_h - 6}" '
                f'fill="{COLORS.get(fam, "#999")}"><title>{_e(step["name"])}: '
                f"{_e(label)} {ms:.3f} ms</title></rect>"
            )
            x += w
        parts.append(
            f'<text x="{x + 4:.1f}" y="{y + 14}" '
            f'font-size="11" fill="#333">{step["wall_ms"]:.2f} ms</text>'
        )
    axis_y = 4 + len(steps) * row_h + 4
    for k in range(5):
        ms = scale_ms * k / 4
        x = label_w + bar_w * k / 4
        parts.append(
            f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 5}" '
            f'stroke="#888"/><text x="{x:.1f}" y="{axis_y + 18}" font-size="11" '
            f'text-anchor="middle" fill="#555">{ms:.1f} ms</text>'
        )
    parts.append("</svg>")
    used = {fam for s in steps for fam in s["families"]} | {"idle"}
    more = report["steps"]["count"] - len(steps)
    extra = f"<p class='meta'>… and {more} more steps.</p>" if more > 0 else ""
    return f"{_legend(used)}{''.join(parts)}{extra}"


def timeline(report: dict[str, Any]) -> str:
    """One step along its time: a lane per family, where each layer starts, where the costly
    work sits."""
    tl = report.get("timeline")
    if not tl or not tl["segments"]:
        return "<p>No step to draw.</p>"
    wall = max(tl["wall_ms"], max(a + d for a, d, _ in tl["segments"])) or 1.0
    lanes = [f for f in COLORS if f != "idle" and any(s[2] == f for s in tl["segments"])]
    label_w, width, lane_h, top = 110, 1000, 18, 22
    height = top + lane_h * len(lanes) + 30
    scale = width / wall
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" viewBox="0 0 '
        f'{label_w + width + 20} {height}" role="img" aria-label="one step along its time">'
    ]
    for i, fam in enumerate(lanes):
        y = top + i * lane_h
        parts.append(
            f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end" font-size="11">'
            f"{_e(FAMILIES.get(fam, fam))}</text>"
            f'<rect x="{label_w}" y="{y}" width="{width}" height="{lane_h - 4}" fill="#f4f4f4"/>'
        )
    for start, dur, fam in tl["segments"]:
        y = top + lanes.index(fam) * lane_h if fam in lanes else top
        parts.append(
            f'<rect x="{label_w + start * scale:.2f}" y="{y}" '
            f'width="{max(dur * scale, 0.6):.2f}" height="{lane_h - 4}" '
            f'fill="{COLORS.get(fam, "#999")}"><title>{_e(FAMILIES.get(fam, fam))}: '
            f"{dur:.3f} ms at {start:.3f} ms</title></rect>"
        )
    starts = tl.get("layer_starts_ms") or []
    every = max(1, len(starts) // 20)
    bottom = top + lane_h * len(lanes)
    for n, start in enumerate(starts):
        x = label_w + start * scale
        parts.append(
            f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{bottom}" stroke="#555" '
            f'stroke-width="0.4" stroke-dasharray="2,2"/>'
        )
        if n % every == 0:
            parts.append(
                f'<text x="{x + 2:.1f}" y="{top - 8}" font-size="9" fill="#555">L{n}</text>'
            )
    for k in range(6):
        ms = wall * k / 5
        x = label_w + width * k / 5
        parts.append(
            f'<text x="{x:.1f}" y="{bottom + 16}" font-size="11" text-anchor="middle" '
            f'fill="#555">{ms:.1f} ms</text>'
        )
    parts.append("</svg>")
    layers = (
        f" Dashed lines: where each of the {len(starts)} layers starts (at each launch of "
        f"<code>{_e(tl['layer_kernel'])}</code>)."
        if starts
        else ""
    )
    note = (
        f"<p class='meta'>Step {tl['step']} ({tl['wall_ms']:.2f} ms, the median step), "
        f"one lane per kernel family.{layers}</p>"
    )
    return f"{_legend(set(lanes))}{''.join(parts)}{note}"
