"""``--html``: one self-contained page (inline CSS and SVG, no scripts, no network) with the
per-step breakdown chart and the findings."""

from __future__ import annotations

import html
import os
from typing import Any

from fp8mla.doctor.families import FAMILIES
from fp8mla.doctor.finding import range_text
from fp8mla.doctor.floor import floor_text as report_floor_text
from fp8mla.doctor.html_charts import step_bars, timeline
from fp8mla.doctor.report_text import (
    count_text,
    dtypes_text,
    layers_text,
    no_findings_text,
    steps_text,
)

__all__ = ["render_html"]

_SEVERITY = {"high": "#c0392b", "medium": "#d68910", "low": "#5d6d7e"}

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;
color:#222;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
.meta{color:#555}.note{color:#7a5c00;background:#fff8e1;padding:4px 8px;margin:4px 0;
border-radius:4px}
.card{border:1px solid #ddd;border-left:6px solid #999;border-radius:6px;padding:10px 14px;
margin:12px 0}
.card h3{margin:0 0 6px;font-size:16px}.sev{color:#fff;border-radius:4px;padding:1px 7px;
font-size:12px;margin-right:6px}
table{border-collapse:collapse;margin:6px 0}td,th{padding:3px 10px;text-align:left;
vertical-align:top}th{color:#555;font-weight:600}tr.alt{background:#f7f7f7}
td.num{text-align:right;font-variant-numeric:tabular-nums}code{font-size:12.5px;
word-break:break-all}.fix{background:#eef7ee;padding:6px 10px;border-radius:4px}
.legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:11px;
height:11px;margin-right:4px;vertical-align:-1px;border-radius:2px}
pre{background:#f6f6f6;padding:10px;overflow:auto;font-size:12.5px}
.partial{color:#fff;background:#c0392b;padding:6px 10px;margin:6px 0;border-radius:4px}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _finding(i: int, f: dict[str, Any], step_ms: float) -> str:
    color = _SEVERITY.get(f["severity"], "#999")
    mark = " (partial)" if f.get("partial") else ""
    rows = []

    def row(label: str, value: str) -> None:
        rows.append(f"<tr><th>{_e(label)}</th><td>{value}</td></tr>")

    row(
        "time per step",
        f"{f['time_per_step_ms'] or 0:.3f} ms ({f['share_of_step']:.1%} of the step)",
    )
    if f.get("time_per_step_ms") and step_ms:
        after = max(step_ms - f["time_per_step_ms"], 0.0)
        row(
            "step after the fix",
            f"≈{after:.2f} ms instead of {step_ms:.2f} ms ({step_ms / max(after, 1e-9):.1f}× "
            "faster), if the time this finding costs is removed and nothing else changes"
            if after
            else f"≈0 of {step_ms:.2f} ms",
        )
    if f.get("kernel"):
        row(
            "kernel",
            f"<code>{_e(f['kernel_short'])}</code>"
            + (f" via <code>{_e(f['op'])}</code>" if f.get("op") else ""),
        )
    if f.get("calls_per_step") is not None:
        row("calls per step", _e(range_text(f["calls_per_step"], f.get("calls_range"))))
    if f.get("elements_per_call") is not None:
        shape = f" {_e(f['shape'])}" if f.get("shape") else ""
        row(
            "elements per call",
            f"{f['elements_per_call']:,}{shape} "
            f"<span class='meta'>(from {_e(f['elements_source'])})</span>",
        )
    if f.get("src_dtype") or f.get("dst_dtype"):
        row("dtypes", _e(dtypes_text(f)))
    if f.get("bytes_per_step") is not None:
        gbps = f.get("bandwidth_gbps")
        bw = f", {gbps:,.0f} GB/s" if gbps and gbps >= 100 else f", {gbps:.2g} GB/s" if gbps else ""
        row("traffic per step", f"{f['bytes_per_step'] / 1e9:,.3f} GB{bw}")
    if f.get("kernel"):
        row("source", f"<code>{_e(f.get('source') or 'unknown')}</code>")
    for line in f.get("source_lines") or []:
        row("", f"<code>{_e(line['path'])}:{line['line']}: {_e(line['code'])}</code>")
    evidence = "".join(f"<li>{_e(r)}</li>" for r in f.get("evidence") or [])
    return (
        f'<div class="card" style="border-left-color:{color}"><h3><span class="sev" '
        f'style="background:{color}">{_e(f["severity"].upper())}</span>{i}. '
        f"{_e(f['title'])}{mark}</h3><table>{''.join(rows)}</table>"
        f"{f'<ul>{evidence}</ul>' if evidence else ''}"
        f'<div class="fix"><b>Fix:</b> {_e(f["suggestion"])}</div></div>'
    )


def _table(headers: list[str], rows: list[list[str]], numeric: set[int]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join(
        f"<tr{' class=alt' if r % 2 else ''}>"
        + "".join(f"<td{' class=num' if c in numeric else ''}>{v}</td>" for c, v in enumerate(row))
        + "</tr>"
        for r, row in enumerate(rows)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _section(report: dict[str, Any]) -> str:
    t, steps = report["trace"], report["steps"]
    device = f"{t['device']} · " if t["device"] else ("GPU · " if t["mode"] == "gpu" else "")
    mode = "GPU kernels" if t["mode"] == "gpu" else "CPU ops only"
    per = "in the window" if steps["method"] == "whole-trace" else "per step"
    mark = " (partial)" if report.get("partial") else ""
    out = [
        f"<h1>fp8mla doctor: {_e(os.path.basename(report['path']))}</h1>",
        f"<p class='meta'>{_e(device + mode)} · {_e(steps_text(report))} · "
        f"{steps['mean_ms']:.2f} ms {per}{mark} · {_e(layers_text(report))} · "
        f"{steps['idle_share']:.0%} idle</p>",
    ]
    if report.get("partial"):
        damaged = report["partial"]
        out.append(
            f"<div class='partial'><b>Partial report:</b> the trace is damaged "
            f"({_e(damaged['damage'])}); every figure on this page covers only the "
            f"{damaged['events_read']:,} complete events before the damage.</div>"
        )
    out += [
        f"<div class='note'>{_e(w)}</div>"
        for w in report["warnings"]
        if not (report.get("partial") and w.startswith("PARTIAL:"))
    ]
    out.append(f"<h2>Findings{mark}</h2>")
    if report["findings"]:
        out += [_finding(i, f, steps["mean_ms"]) for i, f in enumerate(report["findings"], 1)]
    else:
        out.append(f"<p>{_e(no_findings_text(report))}</p>")
    out += [
        f"<h2>Where in the step the time goes{mark}</h2>",
        timeline(report),
        f"<h2>Time per step by kernel family{mark}</h2>",
        step_bars(report),
    ]
    fam_rows = [
        [
            _e(r["label"]),
            count_text(r["launches_per_step"]),
            f"{r['time_per_step_ms']:.3f}",
            f"{r['share_of_step']:.1%}",
        ]
        for r in report["families"]
    ]
    out.append(_table(["family", "launches/step", "ms/step", "share"], fam_rows, {1, 2, 3}))
    out.append(f"<h2>Top kernels{mark}</h2>")
    top_rows = [
        [
            f"<code>{_e(r['kernel_short'])}</code>",
            _e(FAMILIES.get(r["family"], "")),
            count_text(r["calls_per_step"]),
            f"{r['time_per_step_ms']:.3f}",
            f"{r['share_of_step']:.1%}",
            f"<code>{_e(r['source'] or '')}</code>",
        ]
        for r in report["top_kernels"]
    ]
    out.append(
        _table(
            ["kernel", "family", "calls/step", "ms/step", "share", "source"], top_rows, {2, 3, 4}
        )
    )
    return "\n".join(out)


def render_html(report: dict[str, Any], floor_text: str | None = None) -> str:
    """The report (file or directory) as one self-contained HTML page."""
    if "ranks" in report:
        s = report["summary"]
        body = [
            f"<h1>fp8mla doctor: {_e(report['path'])}</h1>",
            f"<p class='meta'>{s['analysed']} of {s['ranks']} traces analysed · "
            f"{s['mean_ms']:.2f} ms per step · spread {s['spread']:.1%}</p>",
        ]
        if s.get("partial"):
            body.append(
                f"<div class='partial'><b>Partial:</b> {len(s['partial'])} trace(s) damaged; "
                f"their figures cover only the events before the damage.</div>"
            )
        for rank in report["ranks"]:
            if "error" in rank:
                body.append(f"<div class='note'>{_e(rank['path'])}: {_e(rank['error'])}</div>")
            else:
                body.append(f"<hr>{_section(rank)}")
        title = report["path"]
    else:
        body = [_section(report)]
        title = report["path"]
    floor_text = floor_text or report_floor_text(report)
    if floor_text:
        body.append(f"<h2>Floor</h2><pre>{_e(floor_text)}</pre>")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>fp8mla doctor: {_e(os.path.basename(title))}</title>"
        f"<style>{_CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
