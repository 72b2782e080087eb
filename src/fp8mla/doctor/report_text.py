"""The terminal report: most costly finding first, then the per-step breakdown."""

from __future__ import annotations

import os
import textwrap
from typing import Any

from fp8mla.doctor.finding import calls_text
from fp8mla.doctor.floor import floor_text as report_floor_text

__all__ = ["format_text"]

_WIDTH = 100


def _bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} B"


def _rate(gbps: float) -> str:
    return f"{gbps:,.0f} GB/s" if gbps >= 100 else f"{gbps:.2g} GB/s"


def _count(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n:,} ({n / 1e6:,.1f} M)" if n >= 1e6 else f"{n:,}"


def _wrap(label: str, text: str) -> list[str]:
    indent = " " * 14
    lines = textwrap.wrap(text, _WIDTH - len(indent)) or [""]
    return [f"    {label:<10}{lines[0]}"] + [indent + line for line in lines[1:]]


def _finding(i: int, f: dict[str, Any], step_ms: float) -> list[str]:
    out = [
        f"{i}. [{f['severity'].upper()}] {f['title']}: {f['time_per_step_ms'] or 0:.2f} ms "
        f"per step ({f['share_of_step']:.1%} of {step_ms:.2f} ms)"
    ]
    if f.get("kernel"):
        if f.get("op") == f["kernel"]:  # CPU-only traces: the op is the unit of work
            out += _wrap("op", f["kernel"])
        else:
            op = f" (launched by {f['op']})" if f.get("op") else ""
            out += _wrap("kernel", f"{f['kernel_short']}{op}")
    if f.get("elements_per_call") is not None:
        shape = f" {f['shape']}" if f.get("shape") else ""
        how = f["elements_source"] or "?"
        note = f"; {f['elements_note']}" if f.get("elements_note") else ""
        out += _wrap(
            "calls",
            f"{calls_text(f['calls_per_step'])} per step × "
            f"{_count(f['elements_per_call'])} elements{shape} (from {how}{note})",
        )
    elif f.get("calls_per_step") is not None:
        out += _wrap("calls", f"{calls_text(f['calls_per_step'])} per step")
    if f.get("src_dtype") or f.get("dst_dtype"):
        out += _wrap("dtypes", f"{f['src_dtype'] or '?'} → {f['dst_dtype'] or '?'}")
    if f.get("bytes_per_step") is not None:
        bw = f", {_rate(f['bandwidth_gbps'])} achieved" if f.get("bandwidth_gbps") else ""
        est = " (a dtype size assumed)" if f.get("bytes_estimated") else ""
        out += _wrap("traffic", f"{_bytes(f['bytes_per_step'])} read + written per step{est}{bw}")
    if f.get("kernel"):
        out += _wrap("source", f.get("source") or "unknown (no Python frame in the trace)")
    for line in f.get("source_lines") or []:  # not wrapped: paths stay clickable
        out.append(f"    {'line':<10}{line['path']}:{line['line']}: {line['code']}")
    for reason in f.get("evidence") or []:
        out += _wrap("evidence", reason)
    out += _wrap("fix", f["suggestion"])
    return out


def _breakdown(report: dict[str, Any]) -> list[str]:
    steps = report["steps"]
    out = [
        f"Per step (mean of {steps['count']}): {steps['mean_ms']:.2f} ms wall, "
        f"{steps['busy_ms']:.2f} ms busy, {steps['idle_share']:.0%} idle"
    ]
    out.append(f"  {'family':<15}{'launches':>10}{'time (ms)':>12}{'share':>8}")
    for row in report["families"]:
        out.append(
            f"  {row['label']:<15}{row['launches_per_step']:>10g}"
            f"{row['time_per_step_ms']:>12.3f}{row['share_of_step']:>8.1%}"
        )
    out.append("")
    out.append("Top kernels (per step)")
    for row in report["top_kernels"][:8]:
        out.append(
            f"  {row['share_of_step']:>6.1%} {row['time_per_step_ms']:>9.3f} ms "
            f"{row['calls_per_step']:>7g}×  {row['kernel_short'][:70]}"
        )
    return out


def _single(report: dict[str, Any]) -> list[str]:
    t = report["trace"]
    steps = report["steps"]
    device = t["device"] or ("CPU only" if t["mode"] == "cpu" else "GPU")
    layers = (
        f"{report['layers']} layers ({report['layers_method']})"
        if report["layers"]
        else "layers unknown"
    )
    plural = "step" if steps["count"] == 1 else "steps"
    out = [
        f"fp8mla doctor: {os.path.basename(report['path'])}",
        f"  {device} · {steps['count']} {plural} ({steps['method']}: {steps['detail']}) · "
        f"{steps['mean_ms']:.2f} ms/step · {layers}",
    ]
    for w in report["warnings"]:
        out.append(f"  note: {w}")
    out.append("")
    findings = report["findings"]
    if findings:
        out.append("Findings (most costly first)")
        for i, f in enumerate(findings, 1):
            out += _finding(i, f, steps["mean_ms"])
            out.append("")
    elif steps["count"]:
        out += ["No problems found: no pool-sized casts, no large copies, the device is busy.", ""]
    if steps["count"]:
        out += _breakdown(report)
    return out


def format_text(report: dict[str, Any], floor_text: str | None = None) -> str:
    """Render a :func:`~fp8mla.doctor.diagnose` report (file or directory) for the terminal."""
    if "ranks" in report:
        out: list[str] = []
        for rank in report["ranks"]:
            if "error" in rank:
                out += [f"fp8mla doctor: {rank['path']}: error: {rank['error']}", ""]
            else:
                out += _single(rank) + [""]
        s = report["summary"]
        out.append(
            f"Summary: {s['analysed']} of {s['ranks']} traces analysed, "
            f"{s['mean_ms']:.2f} ms/step mean, spread {s['spread']:.1%}"
            + (f", slowest {os.path.basename(s['slowest'])}" if s["slowest"] else "")
        )
        for k in s["findings"]:
            out.append(
                f"  {k['kind']}: on {k['ranks']} rank(s), up to {k['max_share']:.1%} of the step"
            )
    else:
        out = _single(report)
    floor_text = floor_text or report_floor_text(report)
    if floor_text:
        out += ["", floor_text.rstrip()]
    return "\n".join(out).rstrip() + "\n"
