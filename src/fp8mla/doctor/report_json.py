"""The ``--json`` report dict (``docs/doctor.md``, ``schema_version`` 1) built from an analysed
trace; the pipeline in :mod:`fp8mla.doctor.analyze` never builds dicts itself."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

from fp8mla.doctor.context import TraceContext
from fp8mla.doctor.families import FAMILIES, short_name
from fp8mla.doctor.finding import Finding
from fp8mla.doctor.records import Launch, TraceData
from fp8mla.doctor.steps import Step

__all__ = ["SCHEMA_VERSION", "build_report", "directory_report", "trace_info"]

SCHEMA_VERSION = 1


def _ms(us: float) -> float:
    return round(us / 1e3, 4)


def trace_info(data: TraceData, launches: list[Launch], mode: str) -> dict[str, Any]:
    """The ``trace`` section: device, format, counts, what was recorded."""
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


def _steps(ctx: TraceContext) -> dict[str, Any]:
    steps = ctx.steps
    walls = [s.wall for s in steps]
    busy = [s.busy for s in steps]
    return {
        "count": len(steps),
        "method": ctx.segmentation.method,
        "detail": ctx.segmentation.detail,
        "mean_ms": _ms(ctx.wall_us),
        "median_ms": _ms(statistics.median(walls)) if walls else 0.0,
        "min_ms": _ms(min(walls)) if walls else 0.0,
        "max_ms": _ms(max(walls)) if walls else 0.0,
        "busy_ms": _ms(statistics.mean(busy)) if busy else 0.0,
        "idle_share": round(statistics.mean(s.idle_share for s in steps), 4) if steps else 0.0,
        "per_step": [_step_dict(s) for s in steps],
    }


MAX_SEGMENTS = 1500  # timeline detail: enough for a step of 78 layers, small in the JSON


def _timeline(ctx: TraceContext) -> dict[str, Any] | None:
    """One representative step (the median wall time) as family segments along its time, with
    where each layer starts: what the HTML report draws to show where in the step time goes."""
    steps = ctx.steps
    if not steps:
        return None
    step = sorted(steps, key=lambda s: s.wall)[len(steps) // 2]
    launches = sorted(step.launches, key=lambda x: x.start)
    join_us = step.wall / MAX_SEGMENTS if len(launches) > MAX_SEGMENTS else 0.5
    segments: list[list[Any]] = []
    for x in launches:
        start, end = x.start - step.start, x.end - step.start
        last = segments[-1] if segments else None
        if last and last[2] == x.family and start - last[1] <= join_us:
            last[1] = max(last[1], end)
        else:
            segments.append([start, end, x.family])
    starts: list[float] = []
    layer_kernel = None
    if ctx.layers:
        counts = Counter(x.name for x in launches)
        layer_kernel = next((x.name for x in launches if counts[x.name] == ctx.layers), None)
        starts = [_ms(x.start - step.start) for x in launches if x.name == layer_kernel]
    return {
        "step": step.index,
        "wall_ms": _ms(step.wall),
        "segments": [[_ms(a), _ms(b - a), fam] for a, b, fam in segments],
        "layer_starts_ms": starts,
        "layer_kernel": short_name(layer_kernel) if layer_kernel else None,
    }


def build_report(ctx: TraceContext, findings: list[Finding]) -> dict[str, Any]:
    """The report dict of one trace. For a damaged trace read with ``allow_partial``,
    ``partial`` says what is damaged and how many events were read, and ``steps``, every
    finding, family and top kernel carry ``"partial": true``: their totals cover only the
    events before the damage."""
    data = ctx.data
    partial = bool(data.truncated)
    report = {
        "schema_version": SCHEMA_VERSION,
        "path": data.path,
        "partial": {"damage": data.damage, "events_read": data.events} if partial else None,
        "trace": ctx.info,
        "steps": _steps(ctx),
        "layers": ctx.layers,
        "layers_method": ctx.layers_method,
        "layers_detail": ctx.layers_detail,
        "families": _families(ctx.steps, ctx.wall_us),
        "top_kernels": _top_kernels(ctx.steps, ctx.wall_us),
        "findings": [f.to_dict() for f in findings],
        "warnings": list(ctx.warnings),
        "timeline": _timeline(ctx),
    }
    for row in (report["steps"], *report["families"], *report["top_kernels"], *report["findings"]):
        row["partial"] = partial
    return report


def _summary(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in ranks if "error" not in r]
    means = {r["path"]: r["steps"]["mean_ms"] for r in ok if r["steps"]["count"]}
    kinds: dict[str, dict[str, Any]] = {}
    for r in ok:
        for kind in {f["kind"] for f in r["findings"]}:  # ranks with the kind, not findings
            kinds.setdefault(kind, {"kind": kind, "ranks": 0, "max_share": 0.0})["ranks"] += 1
        for f in r["findings"]:
            k = kinds[f["kind"]]
            k["max_share"] = max(k["max_share"], f["share_of_step"])
    mean = statistics.mean(means.values()) if means else 0.0
    return {
        "ranks": len(ranks),
        "analysed": len(ok),
        "partial": [r["path"] for r in ok if r.get("partial")],
        "failed": [{"path": r["path"], "error": r["error"]} for r in ranks if "error" in r],
        "mean_ms": round(mean, 4),
        "slowest": max(means, key=means.__getitem__) if means else None,
        "spread": round((max(means.values()) - min(means.values())) / mean, 4) if mean else 0.0,
        "findings": sorted(kinds.values(), key=lambda k: -k["max_share"]),
    }


def directory_report(path: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The report of a directory: one report (or ``{"path", "error"}``) per rank, a summary."""
    return {
        "schema_version": SCHEMA_VERSION,
        "path": path,
        "ranks": ranks,
        "summary": _summary(ranks),
    }
