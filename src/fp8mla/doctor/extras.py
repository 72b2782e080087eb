"""What a report gets besides the trace's own analysis, attached in one place: the source lines
of cast findings (``--source-root``/``--package``, via ``fp8mla.scan``) and the step's
memory-bound floor (``--model``/``--gpu``, via ``fp8mla.gap``)."""

from __future__ import annotations

import os
from typing import Any

from fp8mla.doctor.floor import FloorSpec, floor_estimate

__all__ = ["attach_extras"]


def attach_extras(
    report: dict[str, Any],
    *,
    source_root: str | os.PathLike[str] | None = None,
    package: str | None = None,
    floor: FloorSpec | None = None,
) -> None:
    """Add ``source_file``/``source_lines`` to cast findings and ``floor`` to the report, in
    place. Problems (a root that is not a directory, a file not found, a rejected model) become
    entries of the report's ``warnings``, never exceptions."""
    if source_root is not None or package is not None:
        from fp8mla.doctor.sources import attach_sources

        attach_sources(report, source_root=source_root, package=package)
    if floor is not None:
        try:
            report["floor"] = floor_estimate(report, floor)
        except (ValueError, OSError) as exc:
            report.setdefault("warnings", []).append(f"floor estimate failed: {exc}")
