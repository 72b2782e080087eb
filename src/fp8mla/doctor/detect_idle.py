"""Detector: a device that idles between short kernels (launch-bound steps)."""

from __future__ import annotations

import statistics

from fp8mla.doctor.context import TraceContext
from fp8mla.doctor.finding import LAUNCH_BOUND, Finding

__all__ = ["detect_launch_bound"]

IDLE_SHARE = 0.30
MIN_LAUNCHES = 10


def detect_launch_bound(ctx: TraceContext) -> list[Finding]:
    """A finding when the device idles ≥ 30% of steps of ≥ 10 launches (GPU traces only)."""
    steps = ctx.steps
    if ctx.mode != "gpu" or not steps:
        return []
    idle = statistics.mean(s.idle_share for s in steps)
    if idle < IDLE_SHARE or statistics.mean(len(s.launches) for s in steps) < MIN_LAUNCHES:
        return []
    durations = [x.dur for s in steps for x in s.launches if x.kind == "kernel"]
    median_us = statistics.median(durations) if durations else 0.0
    launches = statistics.mean(len(s.launches) for s in steps)
    graphs = any(x.graph for s in steps for x in s.launches)
    wall_ms = statistics.mean(s.wall for s in steps) / 1e3
    evidence = [
        f"the GPU is idle {idle:.0%} of each step ({idle * wall_ms:.2f} of {wall_ms:.2f} ms)",
        f"{launches:,.0f} launches per step, median kernel {median_us:.1f} µs",
    ]
    if ctx.info.get("has_stacks"):
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
    return [
        Finding(
            kind=LAUNCH_BOUND,
            title=title,
            share_of_step=idle,
            calls_per_step=round(launches, 1),
            time_per_step_ms=round(idle * wall_ms, 4),
            cuda_graph=graphs,
            evidence=evidence,
            suggestion=fix,
        )
    ]
