"""Render a :class:`~fp8mla.scan.findings.ScanResult` as text for people or JSON for tools."""

from __future__ import annotations

import json

from fp8mla._files import escape_controls
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
    """Findings grouped by severity, worst first; within a severity, one paragraph per distinct
    fix (``fix (N KIND sites): …``) with its sites under it (``file:line: severity kind in
    function``, the line, why); then notes on large files and a one-line summary. Skipped files
    are counted in the summary; the command line lists them on stderr."""
    blocks: list[str] = []
    for severity in SEVERITY_ORDER:
        group = [f for f in result.findings if f.severity == severity]
        if not group:
            continue
        blocks.append(f"== {severity} ({len(group)}) ==")
        fixes: dict[str, list] = {}
        for f in group:  # first appearance order: path/line order of the findings
            fixes.setdefault(f.suggestion, []).append(f)
        for suggestion, sites in fixes.items():
            kinds = sorted({f.kind for f in sites})
            noun = "site" if len(sites) == 1 else "sites"
            blocks.append(f"fix ({len(sites)} {'/'.join(kinds)} {noun}): {suggestion}")
            blocks.extend(
                f"{f.path}:{f.line}: {f.severity} {f.kind} in {f.function}\n"
                f"    {f.code}\n"
                f"  why: {f.reason}"
                for f in sites
            )
    blocks.extend(f"{n.path}: note: {n.note}" for n in result.notes)
    blocks.append(_summary(result))
    return escape_controls("\n\n".join(blocks))  # source lines quoted as they are, escaped
