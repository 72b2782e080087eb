"""The terminal report: most costly finding first, then the per-step breakdown."""

from __future__ import annotations

import os
import textwrap
from typing import Any

from fp8mla._files import escape_controls
from fp8mla.doctor.finding import range_text
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


def partial_text(report: dict[str, Any]) -> str:
    """`` (partial)`` after each total of a report of a damaged trace, else ``""``."""
    return " (partial)" if report.get("partial") else ""


def _finding(i: int, f: dict[str, Any], step_ms: float, per: str = "per step") -> list[str]:
    mark = " (partial)" if f.get("partial") else ""
    out = [
        f"{i}. [{f['severity'].upper()}] {f['title']}: {f['time_per_step_ms'] or 0:.2f} ms "
        f"{per}{mark} ({f['share_of_step']:.1%} of {step_ms:.2f} ms)"
    ]
    if f.get("kernel"):
        if f.get("op") == f["kernel"]:  # CPU-only traces: the op is the unit of work
            out += _wrap("op", f["kernel"])
        else:
            op = f" (launched by {f['op']})" if f.get("op") else ""
            out += _wrap("kernel", f"{f['kernel_short']}{op}")
    calls = range_text(f.get("calls_per_step"), f.get("calls_range"))
    if f.get("elements_per_call") is not None:
        shape = f" {f['shape']}" if f.get("shape") else ""
        how = f["elements_source"] or "?"
        note = f"; {f['elements_note']}" if f.get("elements_note") else ""
        out += _wrap(
            "calls",
            f"{calls} {per} × {_count(f['elements_per_call'])} elements{shape} (from {how}{note})",
        )
    elif f.get("calls_per_step") is not None:
        out += _wrap("calls", f"{calls} {per}")
    if f.get("src_dtype") or f.get("dst_dtype"):
        out += _wrap("dtypes", dtypes_text(f))
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


def dtypes_text(f: dict[str, Any]) -> str:
    """``float8_e4m3fn → bfloat16``; an unknown side is ``?`` and says why."""
    text = f"{f.get('src_dtype') or '?'} → {f.get('dst_dtype') or '?'}"
    if not f.get("src_dtype"):
        text += " (source dtype unknown: the trace has no shapes for this launch)"
    return text


def count_text(value: float) -> str:
    """A per-step count for a table: ``78``, or ``~11`` for a mean over steps that differ."""
    return f"{value:,.0f}" if abs(value - round(value)) < 1e-9 else f"~{round(value):,}"


def steps_text(report: dict[str, Any]) -> str:
    """What the trace is: how many steps of how many launches, found how."""
    steps = report["steps"]
    launches = [s["launches"] for s in steps["per_step"]]
    if not launches:
        return "nothing to analyse"
    what = "launches" if report["trace"]["mode"] == "gpu" else "top-level ops"
    size = (
        f"{launches[0]:,}"
        if min(launches) == max(launches)
        else f"{min(launches):,}–{max(launches):,}"
    )
    if max(launches) == 1:
        what = "launch" if what == "launches" else "top-level op"
    if steps["method"] == "whole-trace":
        return f"one window of {size} {what}: no repeating step found ({steps['detail']})"
    plural = "step" if steps["count"] == 1 else "steps"
    return f"{steps['count']} {plural} of {size} {what} ({steps['method']}: {steps['detail']})"


def layers_text(report: dict[str, Any]) -> str:
    if not report["layers"]:
        return "no layer structure found"
    how = "given" if report["layers_method"] == "option" else "from launch counts"
    return f"{report['layers']} layers ({how})"


def no_findings_text(report: dict[str, Any]) -> str:
    """The sentence for a report without findings, consistent with its own numbers."""
    steps = report["steps"]
    if report["trace"]["mode"] != "gpu":
        return "No findings among the CPU ops: no large casts or copies."
    text = "No findings: no pool-sized casts, no casts, copies or transfers over 1% of the step"
    idle = steps["idle_share"]
    if idle < 0.30:
        return f"{text}, and the GPU is busy {1 - idle:.0%} of the step."
    per_step = sum(s["launches"] for s in steps["per_step"]) / max(steps["count"], 1)
    launches = "launch" if per_step == 1 else "launches"
    return (
        f"{text}. The GPU is idle {idle:.0%} of the step with only {count_text(per_step)} "
        f"{launches} per step: the step time is set outside the GPU (host work, waiting), "
        f"which this trace does not break down."
    )


def _breakdown(report: dict[str, Any]) -> list[str]:
    steps = report["steps"]
    window = steps["method"] == "whole-trace"
    mark = ", partial" if report.get("partial") else ""
    head = (
        f"The window{partial_text(report)}"
        if window
        else f"Per step (mean of {steps['count']}{mark})"
    )
    busy = "GPU busy" if report["trace"]["mode"] == "gpu" else "in top-level ops"
    idle = "GPU idle" if report["trace"]["mode"] == "gpu" else "outside them"
    what = "launches" if report["trace"]["mode"] == "gpu" else "ops"
    out = [
        f"{head}: {steps['mean_ms']:.2f} ms wall, {steps['busy_ms']:.2f} ms {busy}, "
        f"{steps['idle_share']:.0%} {idle}"
    ]
    out.append(f"  {'family':<15}{what:>10}{'time (ms)':>12}{'share':>8}")
    for row in report["families"]:
        out.append(
            f"  {row['label']:<15}{count_text(row['launches_per_step']):>10}"
            f"{row['time_per_step_ms']:>12.3f}{row['share_of_step']:>8.1%}"
        )
    out.append("")
    kinds = "kernels" if report["trace"]["mode"] == "gpu" else "ops"
    out.append(f"Top {kinds} ({'in the window' if window else 'per step'}{mark})")
    for row in report["top_kernels"][:8]:
        out.append(
            f"  {row['share_of_step']:>6.1%} {row['time_per_step_ms']:>9.3f} ms "
            f"{count_text(row['calls_per_step']) + '×':>8}  {row['kernel_short'][:70]}"
        )
    return out


def _joined(parts: list[str]) -> list[str]:
    """``a · b · c`` on indented lines, broken between the parts where it can be."""
    lines: list[str] = []
    line = ""
    for part in parts:
        candidate = f"{line} · {part}" if line else part
        if line and len(candidate) > _WIDTH - 2:
            lines.append(line)
            line = part
        else:
            line = candidate
    lines.append(line)
    out = []
    for i, text in enumerate(lines):
        first, rest = ("  ", "    ") if i == 0 else ("    ", "    ")
        out += textwrap.wrap(text, _WIDTH - 2, initial_indent=first, subsequent_indent=rest)
    return out


def _single(report: dict[str, Any]) -> list[str]:
    t = report["trace"]
    steps = report["steps"]
    mode = "GPU kernels" if t["mode"] == "gpu" else "CPU ops only"
    device = f"{t['device']} · " if t["device"] else ("GPU · " if t["mode"] == "gpu" else "")
    per = "in the window" if steps["method"] == "whole-trace" else "per step"
    out = [
        f"fp8mla doctor: {os.path.basename(report['path'])}",
        *_joined(
            [
                f"{device}{mode}",
                steps_text(report),
                f"{steps['mean_ms']:.2f} ms {per}{partial_text(report)}",
                layers_text(report),
            ]
        ),
    ]
    damaged = report.get("partial")
    if damaged:
        out += textwrap.wrap(
            f"PARTIAL REPORT: the trace is damaged ({damaged['damage']}); every figure below "
            f"covers only the {damaged['events_read']:,} complete events before the damage",
            _WIDTH - 2,
            initial_indent="  ",
            subsequent_indent="    ",
        )
    for w in report["warnings"]:
        if damaged and w.startswith("PARTIAL:"):
            continue  # said above
        out += textwrap.wrap(w, _WIDTH - 2, initial_indent="  note: ", subsequent_indent="    ")
    out.append("")
    findings = report["findings"]
    if findings:
        out.append("Findings (most costly first)")
        for i, f in enumerate(findings, 1):
            out += _finding(i, f, steps["mean_ms"], per)
            out.append("")
    elif steps["count"]:
        out += textwrap.wrap(no_findings_text(report), _WIDTH) + [""]
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
            + (f", {len(s['partial'])} of them partial (damaged)" if s.get("partial") else "")
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
    return escape_controls("\n".join(out).rstrip()) + "\n"  # names from the file, escaped
