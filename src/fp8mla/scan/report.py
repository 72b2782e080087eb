"""Render a :class:`~fp8mla.scan.findings.ScanResult` as text for people or JSON for tools."""

from __future__ import annotations

import json

from fp8mla.scan.findings import SEVERITY_ORDER, ScanResult


def format_json(result: ScanResult) -> str:
    """``{"findings": [{"path", "line", "function", "code", "kind", "severity", "suggestion",
    "reason"}], "skipped": [{"path", "reason"}], "files_scanned": N, "notes": [{"path",
    "note"}]}``, indented."""
    return json.dumps(result.to_dict(), indent=2)


def _summary(result: ScanResult) -> str:
    files = f"{result.files_scanned} file{'s' if result.files_scanned != 1 else ''} scanned"
    skipped = f", {len(result.skipped)} skipped" if result.skipped else ""
    hidden = f", {result.hidden} below --min-severity not shown" if result.hidden else ""
    if not result.findings:
        return f"no KV cache casts found ({files}{skipped}{hidden})"
    kinds = ", ".join(f"{n} {kind}" for kind, n in result.counts().items())
    return f"{len(result.findings)} finding(s): {kinds} ({files}{skipped}{hidden})"


def format_text(result: ScanResult) -> str:
    """Findings grouped by severity, worst first (``file:line: severity kind in function``, the
    line, why, fix), then the skipped files, notes on large files and a one-line summary."""
    blocks: list[str] = []
    for severity in SEVERITY_ORDER:
        group = [f for f in result.findings if f.severity == severity]
        if not group:
            continue
        blocks.append(f"== {severity} ({len(group)}) ==")
        for f in group:
            blocks.append(
                f"{f.path}:{f.line}: {f.severity} {f.kind} in {f.function}\n"
                f"    {f.code}\n"
                f"  why: {f.reason}\n"
                f"  fix: {f.suggestion}"
            )
    blocks.extend(f"{s.path}: skipped: {s.reason}" for s in result.skipped)
    blocks.extend(f"{n.path}: note: {n.note}" for n in result.notes)
    blocks.append(_summary(result))
    return "\n\n".join(blocks)
