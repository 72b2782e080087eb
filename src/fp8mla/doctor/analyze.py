"""``diagnose()``: one trace file (or a directory of per-rank traces) → the report dict.

The dict is the ``--json`` schema documented in ``docs/doctor.md`` (``schema_version`` 1).
"""

from __future__ import annotations

import os
import statistics
from collections import Counter, defaultdict
from typing import Any

from fp8mla.doctor.casts import group_casts
from fp8mla.doctor.collect import collect
from fp8mla.doctor.devices import peak_bandwidth
from fp8mla.doctor.errors import TraceError
from fp8mla.doctor.families import FAMILIES, short_name
from fp8mla.doctor.findings import cast_finding, launch_bound_finding, memcpy_findings
from fp8mla.doctor.link import build_launches
from fp8mla.doctor.load import ProgressFn
from fp8mla.doctor.model import Launch, TraceData
from fp8mla.doctor.pool import classify
from fp8mla.doctor.progress import stderr_progress
from fp8mla.doctor.steps import Step, infer_layers, segment

__all__ = ["SCHEMA_VERSION", "analyze_trace", "diagnose", "trace_files"]

SCHEMA_VERSION = 1
_TRACE_SUFFIXES = (".json", ".json.gz")


def _ms(us: float) -> float:
    return round(us / 1e3, 4)


def _step_dict(step: Step) -> dict[str, Any]:
    return {
        "index": step.index,
        "name": step.name,
        "wall_ms": _ms(step.wall),
        "busy_ms": _ms(step.busy),
        "idle_share": round(step.idle_share, 4),
        "launches": len(step.launches),
        "families": {
            fam: {"launches": int(n), "time_ms": _ms(t)}
            for fam, (n, t) in sorted(step.families.items(), key=lambda kv: -kv[1][1])
        },
    }


def _families(steps: list[Step], wall_us: float) -> list[dict[str, Any]]:
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for step in steps:
        for fam, (n, t) in step.families.items():
            totals[fam][0] += n
            totals[fam][1] += t
    n = len(steps)
    rows = [
        {
            "family": fam,
            "label": FAMILIES.get(fam, fam),
            "launches_per_step": round(c / n, 2),
            "time_per_step_ms": _ms(t / n),
            "share_of_step": round(t / n / wall_us, 4) if wall_us else 0.0,
        }
        for fam, (c, t) in totals.items()
    ]
    return sorted(rows, key=lambda r: -r["time_per_step_ms"])


def _top_kernels(steps: list[Step], wall_us: float, limit: int = 10) -> list[dict[str, Any]]:
    acc: dict[str, list[Any]] = {}
    for step in steps:
        for launch in step.launches:
            entry = acc.setdefault(launch.name, [0, 0.0, launch.family, Counter()])
            entry[0] += 1
            entry[1] += launch.dur
            if launch.frame:
                entry[3][launch.frame] += 1
    n = len(steps)
    rows = []
    for name, (count, time_us, family, frames) in acc.items():
        rows.append(
            {
                "kernel": name,
                "kernel_short": short_name(name),
                "family": family,
                "calls_per_step": round(count / n, 2),
                "time_per_step_ms": _ms(time_us / n),
                "share_of_step": round(time_us / n / wall_us, 4) if wall_us else 0.0,
                "source": frames.most_common(1)[0][0] if frames else None,
            }
        )
    rows.sort(key=lambda r: -r["time_per_step_ms"])
    return rows[:limit]


def _trace_info(data: TraceData, launches: list[Launch], mode: str) -> dict[str, Any]:
    graph = sum(1 for x in launches if x.graph)
    old = any(op.stack for op in data.ops[:2000]) or (
        bool(data.kernels)
        and sum(1 for k in data.kernels if k.ext is not None and k.ext == k.corr) * 2
        > len(data.kernels)
    )
    return {
        "device": data.device,
        "mode": mode,
        "format": "torch 1.x" if old else "torch 2.x",
        "events": data.events,
        "kernels": len(data.kernels),
        "cpu_ops": len(data.ops),
        "time_unit": data.time_unit,
        "time_unit_reason": data.time_unit_reason,
        "truncated": data.truncated,
        "has_shapes": str(data.metadata.get("record_shapes")) == "1" or bool(data.shapes),
        "has_stacks": bool(data.frames) or any(op.stack for op in data.ops[:2000]),
        "cuda_graph_kernels": graph,
    }


def analyze_trace(
    data: TraceData,
    *,
    layers: int | None = None,
    active_tokens: int | None = None,
    context: int | None = None,
) -> dict[str, Any]:
    """Analyse collected trace data; see :func:`diagnose` for the options."""
    launches, mode = build_launches(data)
    seg = segment(launches, data.markers)
    steps = seg.steps
    nsteps = len(steps)
    info = _trace_info(data, launches, mode)
    warnings = list(data.warnings)
    if mode == "cpu":
        warnings.append("no GPU kernels in the trace: analysing CPU ops instead")
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
    wall_us = statistics.mean(walls) if walls else 0.0
    attention_us = (
        statistics.mean(s.families.get("attention", [0, 0.0])[1] for s in steps)
        if steps and mode == "gpu"
        else None
    )
    peak_tbps, peak_source = peak_bandwidth(data.device) if mode == "gpu" else (None, None)

    findings = []
    for group in group_casts(steps):
        ev = classify(
            group,
            nsteps=nsteps,
            layers=n_layers,
            shapes=data.shapes,
            active_tokens=active_tokens,
            context=context,
            attention_us_per_step=attention_us,
            peak_tbps=peak_tbps,
            peak_source=peak_source,
        )
        finding = cast_finding(group, ev, nsteps=nsteps, wall_us=wall_us)
        if finding is not None:
            findings.append(finding)
    findings.extend(memcpy_findings(steps, wall_us))
    idle = launch_bound_finding(steps, mode, with_stack=info["has_stacks"])
    if idle is not None:
        findings.append(idle)
    findings.sort(key=lambda f: -f["share_of_step"])

    busy = [s.busy for s in steps]
    return {
        "schema_version": SCHEMA_VERSION,
        "path": data.path,
        "trace": info,
        "steps": {
            "count": nsteps,
            "method": seg.method,
            "detail": seg.detail,
            "mean_ms": _ms(wall_us),
            "median_ms": _ms(statistics.median(walls)) if walls else 0.0,
            "min_ms": _ms(min(walls)) if walls else 0.0,
            "max_ms": _ms(max(walls)) if walls else 0.0,
            "busy_ms": _ms(statistics.mean(busy)) if busy else 0.0,
            "idle_share": round(statistics.mean(s.idle_share for s in steps), 4) if steps else 0.0,
            "per_step": [_step_dict(s) for s in steps],
        },
        "layers": n_layers,
        "layers_method": layers_method,
        "layers_detail": layers_detail,
        "families": _families(steps, wall_us),
        "top_kernels": _top_kernels(steps, wall_us),
        "findings": findings,
        "warnings": warnings,
    }


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


def _summary(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in ranks if "error" not in r]
    means = {r["path"]: r["steps"]["mean_ms"] for r in ok if r["steps"]["count"]}
    kinds: dict[str, dict[str, Any]] = {}
    for r in ok:
        for f in r["findings"]:
            k = kinds.setdefault(f["kind"], {"kind": f["kind"], "ranks": 0, "max_share": 0.0})
            k["ranks"] += 1
            k["max_share"] = max(k["max_share"], f["share_of_step"])
    mean = statistics.mean(means.values()) if means else 0.0
    return {
        "ranks": len(ranks),
        "analysed": len(ok),
        "failed": [{"path": r["path"], "error": r["error"]} for r in ranks if "error" in r],
        "mean_ms": round(mean, 4),
        "slowest": max(means, key=means.__getitem__) if means else None,
        "spread": round((max(means.values()) - min(means.values())) / mean, 4) if mean else 0.0,
        "findings": sorted(kinds.values(), key=lambda k: -k["max_share"]),
    }


def diagnose(
    path: str | os.PathLike[str],
    *,
    layers: int | None = None,
    active_tokens: int | None = None,
    context: int | None = None,
    source_root: str | os.PathLike[str] | None = None,
    package: str | None = None,
    progress: bool | ProgressFn = False,
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
        progress: True for progress lines on stderr for large files, or a callback
            ``(bytes_done, bytes_total)``.

    Returns:
        The report dict (``--json`` schema); for a directory ``{"ranks": [...], "summary":
        {...}}`` with one report (or ``{"path", "error"}``) per file.

    Raises:
        TraceError: the path is missing, unreadable, empty or not a trace.
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
                ranks.append(_diagnose_file(file, options, progress, source_root, package))
            except TraceError as exc:
                ranks.append({"path": file, "error": str(exc)})
        if all("error" in r for r in ranks):
            raise TraceError(f"{target}: no readable trace ({ranks[0]['error']})")
        return {
            "schema_version": SCHEMA_VERSION,
            "path": target,
            "ranks": ranks,
            "summary": _summary(ranks),
        }
    return _diagnose_file(target, options, progress, source_root, package)


def _diagnose_file(
    path: str,
    options: dict[str, Any],
    progress: bool | ProgressFn,
    source_root: Any,
    package: str | None,
) -> dict[str, Any]:
    callback = stderr_progress(path) if progress is True else (progress or None)
    data = collect(path, callback)
    report = analyze_trace(data, **options)
    if source_root is not None or package is not None:
        from fp8mla.doctor.sources import attach_sources

        attach_sources(report, source_root=source_root, package=package)
    return report
