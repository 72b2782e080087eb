"""The doctor's pipeline: ``diagnose()`` reads one trace file (or a directory of per-rank
traces), and ``analyze_trace()`` turns collected events into findings.

collect (stream the file) → link (kernels to ops and frames) → segment (steps) → the
detectors in :data:`DETECTORS` → :func:`~fp8mla.doctor.report_json.build_report` →
:func:`~fp8mla.doctor.extras.attach_extras` (source lines, the floor).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any

from fp8mla._progress import file_progress
from fp8mla.doctor.collect import collect
from fp8mla.doctor.context import TraceContext
from fp8mla.doctor.detect_casts import detect_casts
from fp8mla.doctor.detect_idle import detect_launch_bound
from fp8mla.doctor.detect_memcpy import detect_memcpy
from fp8mla.doctor.devices import peak_bandwidth
from fp8mla.doctor.errors import DamagedTrace, TraceError
from fp8mla.doctor.extras import attach_extras
from fp8mla.doctor.finding import Finding
from fp8mla.doctor.floor import FloorSpec
from fp8mla.doctor.link import build_launches
from fp8mla.doctor.load import ProgressFn
from fp8mla.doctor.records import TraceData
from fp8mla.doctor.report_json import (
    SCHEMA_VERSION,
    build_report,
    directory_report,
    trace_info,
)
from fp8mla.doctor.steps import infer_layers, segment

__all__ = ["DETECTORS", "SCHEMA_VERSION", "analyze_trace", "diagnose", "trace_files"]

_TRACE_SUFFIXES = (".json", ".json.gz")

Detector = Callable[[TraceContext], list[Finding]]
DETECTORS: tuple[Detector, ...] = (detect_casts, detect_memcpy, detect_launch_bound)
"""Every detector runs on every trace; the report lists their findings, costliest first."""


def _context(
    data: TraceData, layers: int | None, active_tokens: int | None, context: int | None
) -> TraceContext:
    launches, mode = build_launches(data)
    seg = segment(launches, data.markers)
    steps = seg.steps
    info = trace_info(data, launches, mode)
    warnings = list(data.warnings)
    if mode == "cpu":
        warnings.append(_cpu_mode_reason(data))
    if not info["has_shapes"]:
        warnings.append("recorded without record_shapes: element counts come from launch grids")
    if not info["has_stacks"]:
        warnings.append("recorded without with_stack: the Python source of launches is unknown")
    if info["cuda_graph_kernels"]:
        warnings.append(
            f"{info['cuda_graph_kernels']:,} kernels are CUDA-graph replays "
            f"(no shapes: element counts from launch grids)"
        )
    if data.time_unit == "ns":
        warnings.append(f"timestamps read as nanoseconds ({data.time_unit_reason})")
    if not steps:
        warnings.append("no kernels or CPU ops to analyse")
    if layers:
        n_layers, layers_method, layers_detail = layers, "option", "given with --layers"
    else:
        n_layers, layers_detail = infer_layers(steps)
        layers_method = "launches-per-step"
    walls = [s.wall for s in steps]
    attention_us = (
        statistics.mean(s.families.get("attention", [0, 0.0])[1] for s in steps)
        if steps and mode == "gpu"
        else None
    )
    peak_tbps, peak_source = peak_bandwidth(data.device) if mode == "gpu" else (None, None)
    return TraceContext(
        data=data,
        launches=launches,
        mode=mode,
        segmentation=seg,
        info=info,
        layers=n_layers,
        layers_method=layers_method,
        layers_detail=layers_detail,
        active_tokens=active_tokens,
        context=context,
        wall_us=statistics.mean(walls) if walls else 0.0,
        attention_us=attention_us,
        peak_tbps=peak_tbps,
        peak_source=peak_source,
        warnings=warnings,
    )


_OTHER_DEVICES = ("mtia", "xpu", "hpu", "npu", "tpu", "musa", "mlu")


def _cpu_mode_reason(data: TraceData) -> str:
    """Why a trace is analysed on its CPU ops: no kernels, or device events the doctor does
    not read (another accelerator's, or CUPTI profiler ranges whose times include replays)."""
    unread = data.unread_categories
    device = {c: n for c, n in unread.items() if c.lower().startswith(_OTHER_DEVICES)}
    if device:
        listed = ", ".join(f"{c} ({n:,} events)" for c, n in sorted(device.items()))
        return (
            f"the device activity in this trace ({listed}) is another accelerator's, which the "
            f"doctor does not read (it reads CUDA and ROCm kernels): analysing CPU ops instead"
        )
    ranges = unread.get("cuda_profiler_range")
    if ranges:
        return (
            f"the GPU kernels were recorded only as CUPTI profiler ranges (cuda_profiler_range, "
            f"{ranges:,} events), whose times include the profiler's kernel replays: they are "
            f"not read; analysing CPU ops instead"
        )
    return "no GPU kernels in the trace: analysing CPU ops instead"


def analyze_trace(
    data: TraceData,
    *,
    layers: int | None = None,
    active_tokens: int | None = None,
    context: int | None = None,
) -> dict[str, Any]:
    """Analyse collected trace data into the report dict; see :func:`diagnose` for the options."""
    ctx = _context(data, layers, active_tokens, context)
    findings = [f for detect in DETECTORS for f in detect(ctx)]
    findings.sort(key=lambda f: -f.share_of_step)
    return build_report(ctx, findings)


def trace_files(directory: str) -> list[str]:
    """The trace files (``*.json``, ``*.json.gz``) directly inside ``directory``, sorted."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        raise TraceError(f"{directory}: cannot list ({exc.strerror or exc})") from None
    files = [
        os.path.join(directory, n)
        for n in names
        if n.lower().endswith(_TRACE_SUFFIXES) and os.path.isfile(os.path.join(directory, n))
    ]
    if not files:
        raise TraceError(f"{directory}: no trace files (*.json, *.json.gz) in this directory")
    return files


def diagnose(
    path: str | os.PathLike[str],
    *,
    layers: int | None = None,
    active_tokens: int | None = None,
    context: int | None = None,
    source_root: str | os.PathLike[str] | None = None,
    package: str | None = None,
    floor: FloorSpec | None = None,
    progress: bool | ProgressFn = False,
    allow_partial: bool = False,
) -> dict[str, Any]:
    """Read one profiler trace (or a directory of per-rank traces) and diagnose it.

    Args:
        path: a Chrome-trace JSON file (plain or gzipped), or a directory of them.
        layers: the model's layer count, overriding the inferred one.
        active_tokens: KV tokens the step's attention reads (all requests together).
        context: tokens of context, used as the active token count when ``active_tokens`` is
            not given.
        source_root: a source tree holding the Python files the trace's stacks name; the
            pool-proportional findings get the offending lines (via ``fp8mla.scan``).
        package: an importable package name whose source tree serves as ``source_root``.
        floor: a :class:`~fp8mla.doctor.floor.FloorSpec`; adds the step's memory-bound floor
            (via ``fp8mla.gap``) as ``report["floor"]``.
        progress: True for progress lines on stderr for large files, or a callback
            ``(bytes_done, bytes_total)``.
        allow_partial: analyse the complete events before the damage of a damaged (truncated,
            corrupt) trace instead of raising :class:`~fp8mla.doctor.errors.DamagedTrace`; the
            report's ``partial`` says what was damaged, and every total covers only those
            events.

    Returns:
        The report dict (``--json`` schema); for a directory ``{"ranks": [...], "summary":
        {...}}`` with one report (or ``{"path", "error"}``) per file.

    Raises:
        TraceError: the path is missing, unreadable, empty or not a trace (a
            :class:`~fp8mla.doctor.errors.DamagedTrace` when it is damaged and not
            ``allow_partial``).
    """
    for name, value in (("layers", layers), ("active_tokens", active_tokens), ("context", context)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise TraceError(f"{name}: expected a positive integer, got {value!r}")
    target = os.fspath(path)
    options = {"layers": layers, "active_tokens": active_tokens, "context": context}
    if os.path.isdir(target):
        ranks = []
        for file in trace_files(target):
            try:
                ranks.append(_diagnose_file(file, options, progress, allow_partial))
            except DamagedTrace:
                raise  # a damaged rank is not a file that is no trace: it must not pass
            except TraceError as exc:
                ranks.append({"path": file, "error": str(exc)})
        if all("error" in r for r in ranks):
            raise TraceError(f"{target}: no readable trace ({ranks[0]['error']})")
        report = directory_report(target, ranks)
    else:
        report = _diagnose_file(target, options, progress, allow_partial)
    attach_extras(report, source_root=source_root, package=package, floor=floor)
    return report


def _diagnose_file(
    path: str, options: dict[str, Any], progress: bool | ProgressFn, allow_partial: bool
) -> dict[str, Any]:
    callback = file_progress(path, "fp8mla doctor") if progress is True else (progress or None)
    return analyze_trace(collect(path, callback, allow_partial=allow_partial), **options)
