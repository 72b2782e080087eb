"""Findings: what costs time per step, why, and what to change.

Kinds:

- ``pool_proportional_cast``: a dtype cast of the whole KV pool, about once per layer per step.
- ``dtype_cast``: another cast costing ≥ 1% of the step (a gathered cast, an activation cast).
- ``copy``: a same-dtype device copy costing ≥ 1% of the step.
- ``memcpy``: copy-engine transfers (host↔device) inside the step costing ≥ 1% of it.
- ``launch_bound``: the device idles ≥ 30% of the step between short kernels.

Severity follows the share of step time: ``high`` ≥ 20%, ``medium`` ≥ 5%, else ``low``.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from fp8mla.doctor.casts import CastGroup
from fp8mla.doctor.families import short_name
from fp8mla.doctor.pool import Evidence
from fp8mla.doctor.steps import Step

__all__ = ["cast_finding", "launch_bound_finding", "memcpy_findings", "severity"]

MIN_SHARE = 0.01
IDLE_SHARE = 0.30
MIN_LAUNCHES = 10


def calls_text(calls: float) -> str:
    """``78`` for whole numbers, ``25.2`` otherwise."""
    return f"{calls:.0f}" if abs(calls - round(calls)) < 0.05 else f"{calls:.1f}"


def severity(share: float) -> str:
    """``high`` ≥ 20% of step time, ``medium`` ≥ 5%, else ``low``."""
    return "high" if share >= 0.20 else "medium" if share >= 0.05 else "low"


def _finding(kind: str, title: str, share: float, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "kind": kind,
        "severity": severity(share),
        "title": title,
        "kernel": None,
        "kernel_short": None,
        "op": None,
        "calls_per_step": None,
        "elements_per_call": None,
        "elements_source": None,
        "elements_note": None,
        "shape": None,
        "src_dtype": None,
        "dst_dtype": None,
        "bytes_per_step": None,
        "bytes_estimated": False,
        "time_per_step_ms": None,
        "share_of_step": round(share, 4),
        "bandwidth_gbps": None,
        "source": None,
        "cuda_graph": False,
        "pool_slots": None,
        "active_tokens": None,
        "active_tokens_source": None,
        "evidence": [],
        "suggestion": "",
    }
    base.update(fields)
    return base


def _fix_pool(group: CastGroup, ev: Evidence, saved_ms: float, share: float) -> str:
    src = group.src or "FP8"
    dst = group.dst or "bfloat16"
    unit = "rows" if ev.active_source == "recorded shapes" else "tokens"
    pool = group.shape[0] if unit == "rows" and group.shape else ev.slots
    rows = (
        f" ({ev.active_tokens:,} instead of {pool:,} {unit} per layer)"
        if ev.active_tokens and pool
        else ""
    )
    return (
        f"Read the {src} cache inside the attention kernel instead of converting the whole pool "
        f"every layer: e.g. fp8mla.BatchMLAPagedAttentionWrapper, planned with "
        f"kv_data_type=torch.float8_e4m3fn, reads the FP8 pages directly. If the kernel must "
        f"take {dst}, gather the active entries first and cast only those "
        f"(pool[kv_indices].to(torch.{dst})){rows}. Removes ≈{saved_ms:.1f} ms per step "
        f"({share:.0%})."
    )


def cast_finding(
    group: CastGroup, ev: Evidence, *, nsteps: int, wall_us: float
) -> dict[str, Any] | None:
    """The finding for one cast/copy group, or None when it costs under 1% of the step."""
    time_us = group.time_per_step(nsteps)
    share = time_us / wall_us if wall_us else 0.0
    if share < MIN_SHARE and not ev.pool:
        return None
    per_call, assumed = group.bytes_per_call()
    calls = group.calls_per_step(nsteps)
    per_step = per_call * calls if per_call is not None else None
    total_time = sum(c.time for c in group.calls)
    bandwidth = per_call * len(group.calls) / total_time / 1e3 if per_call and total_time else None
    elements = group.elements
    fields: dict[str, Any] = {
        "kernel": group.name,
        "kernel_short": short_name(group.name),
        "op": group.op_name,
        "calls_per_step": round(calls, 3),
        "elements_per_call": elements,
        "elements_source": group.source,
        "elements_note": group.note,
        "shape": list(group.shape) if group.shape else None,
        "src_dtype": group.src,
        "dst_dtype": group.dst,
        "bytes_per_step": int(per_step) if per_step is not None else None,
        "bytes_estimated": assumed,
        "time_per_step_ms": round(time_us / 1e3, 4),
        "bandwidth_gbps": round(bandwidth, 1) if bandwidth else None,
        "source": group.frame,
        "cuda_graph": group.graph,
        "evidence": list(ev.reasons),
        "pool_slots": ev.slots,
        "active_tokens": ev.active_tokens,
        "active_tokens_source": ev.active_source,
    }
    if group.src and group.dst:
        words = f"{group.src}→{group.dst} cast"
    else:
        words = f"cast to {group.dst}" if group.dst else "dtype cast"
    if ev.pool:
        title = f"Whole-pool {words} every layer"
        fix = _fix_pool(group, ev, time_us / 1e3, share)
        return _finding("pool_proportional_cast", title, share, suggestion=fix, **fields)
    if group.is_cast:
        title = f"{words[0].upper()}{words[1:]}, {calls_text(calls)} per step"
        fix = (
            "Fold the conversion into the kernel that consumes the tensor (read the stored "
            "dtype in-kernel), or keep the tensor in the dtype its consumer wants."
        )
        return _finding("dtype_cast", title, share, suggestion=fix, **fields)
    title = f"Device copy ({group.dst or 'same dtype'}), {calls_text(calls)} per step"
    fix = (
        "Look for .contiguous()/.clone()/copy_ of a large buffer in the step loop: pass views, "
        "preallocate the destination once, or let the consumer read strided input."
    )
    return _finding("copy", title, share, suggestion=fix, **fields)


def memcpy_findings(steps: list[Step], wall_us: float) -> list[dict[str, Any]]:
    """Copy-engine transfers (``gpu_memcpy``/``gpu_memset``) worth ≥ 1% of the step."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])
    frames: dict[str, str | None] = {}
    for step in steps:
        for launch in step.launches:
            if launch.family != "memcpy" or launch.kind == "op":
                continue
            acc = by_name[launch.name]
            acc[0] += 1
            acc[1] += launch.dur
            acc[2] += launch.nbytes or 0
            frames.setdefault(launch.name, launch.frame)
    out = []
    n = len(steps)
    for name, (count, time_us, nbytes) in by_name.items():
        share = time_us / n / wall_us if wall_us else 0.0
        if share < MIN_SHARE:
            continue
        if "DtoD" in name or "Device -> Device" in name:
            fix = (
                "Device-to-device copies inside the step: update buffers in place, pass "
                "views, or preallocate the destination instead of copying every step."
            )
        else:
            fix = (
                "Keep step inputs on the device (or in pinned memory with non_blocking=True) "
                "and avoid .item()/.cpu() inside the step: each transfer stalls the stream."
            )
        per_step = calls_text(count / n)
        out.append(
            _finding(
                "memcpy",
                f"{name.strip()}, {per_step} per step",
                share,
                kernel=name,
                kernel_short=name.strip(),
                calls_per_step=round(count / n, 3),
                bytes_per_step=int(nbytes / n) if nbytes else None,
                time_per_step_ms=round(time_us / n / 1e3, 4),
                source=frames.get(name),
                evidence=[f"{per_step} transfers per step take {time_us / n / 1e3:.2f} ms"],
                suggestion=fix,
            )
        )
    return out


def launch_bound_finding(
    steps: list[Step], mode: str, *, with_stack: bool = False
) -> dict[str, Any] | None:
    """A finding when the device idles ≥ 30% of steps of ≥ 10 launches (GPU traces only)."""
    if mode != "gpu" or not steps:
        return None
    idle = statistics.mean(s.idle_share for s in steps)
    if idle < IDLE_SHARE or statistics.mean(len(s.launches) for s in steps) < MIN_LAUNCHES:
        return None
    durations = [x.dur for s in steps for x in s.launches if x.kind == "kernel"]
    median_us = statistics.median(durations) if durations else 0.0
    launches = statistics.mean(len(s.launches) for s in steps)
    graphs = any(x.graph for s in steps for x in s.launches)
    wall_ms = statistics.mean(s.wall for s in steps) / 1e3
    evidence = [
        f"the GPU is idle {idle:.0%} of each step ({idle * wall_ms:.2f} of {wall_ms:.2f} ms)",
        f"{launches:,.0f} launches per step, median kernel {median_us:.1f} µs",
    ]
    if with_stack:
        evidence.append(
            "the trace was recorded with_stack=True, which slows the host's "
            "launches: confirm the idle share on a trace without stacks"
        )
    if graphs:
        title = "GPU idle between CUDA-graph replays"
        fix = (
            "The step already replays CUDA graphs: the idle time is host work between "
            "replays (scheduling, sampling, synchronizations). Overlap it with the next "
            "step or move it off the critical path."
        )
    else:
        title = "Launch-bound decode step"
        fix = (
            "Kernels are short and launched one by one: capture the decode step in a CUDA "
            "graph (torch.cuda.CUDAGraph / torch.compile(mode='reduce-overhead') / the "
            "engine's cuda-graph option) so the GPU does not wait on the host."
        )
    return _finding(
        "launch_bound",
        title,
        idle,
        calls_per_step=round(launches, 1),
        time_per_step_ms=round(idle * wall_ms, 4),
        cuda_graph=graphs,
        evidence=evidence,
        suggestion=fix,
    )
