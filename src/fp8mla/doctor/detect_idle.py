"""Detector: a device that idles within the step, and whether launches or other host work
keep it waiting."""

from __future__ import annotations

import statistics

from fp8mla.doctor.context import TraceContext
from fp8mla.doctor.finding import LAUNCH_BOUND, Finding, calls_text

__all__ = ["detect_launch_bound"]

IDLE_SHARE = 0.30
MIN_LAUNCHES = 10
LAUNCH_GAP_US = 200.0  # idle per launch above this is more than issuing a kernel from Python


def detect_launch_bound(ctx: TraceContext) -> list[Finding]:
    """A finding when the GPU idles ≥ 30% of steps of ≥ 10 launches (GPU traces only)."""
    steps = ctx.steps
    if ctx.mode != "gpu" or not steps:
        return []
    idle = statistics.mean(s.idle_share for s in steps)
    counts = [len(s.launches) for s in steps]
    if idle < IDLE_SHARE or statistics.mean(counts) < MIN_LAUNCHES:
        return []
    durations = [x.dur for s in steps for x in s.launches if x.kind == "kernel"]
    median_us = statistics.median(durations) if durations else 0.0
    launches = statistics.mean(counts)
    graphs = any(x.graph for s in steps for x in s.launches)
    wall_ms = statistics.mean(s.wall for s in steps) / 1e3
    gap_us = idle * wall_ms * 1e3 / launches
    each = "the window" if ctx.per == "in the window" else "each step"
    evidence = [
        f"the GPU is idle {idle:.0%} of {each} ({idle * wall_ms:.2f} of {wall_ms:.2f} ms)",
        f"{calls_text(counts, 'launches', ctx.per)}, median kernel {median_us:.1f} µs, "
        f"{gap_us:,.0f} µs of idle time per launch",
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
    elif gap_us > LAUNCH_GAP_US:
        title = f"GPU idle {idle:.0%} of {each}, waiting on host work between kernels"
        fix = (
            f"The GPU waits {gap_us:,.0f} µs per launch on average, longer than issuing a "
            "kernel takes even from Python: the host does other work between kernels (data "
            "loading, synchronizations such as .item() or .cpu(), Python-side logic). Profile "
            "the host side of the step; a CUDA graph removes only the launch and dispatch "
            "overhead."
        )
    else:
        title = "Launch-bound steps: the GPU waits between short kernels"
        fix = (
            "Kernels are short and launched one by one: capture the step in a CUDA graph "
            "(torch.cuda.CUDAGraph / torch.compile(mode='reduce-overhead') / the engine's "
            "cuda-graph option) so the GPU does not wait on the host."
        )
    return [
        Finding(
            kind=LAUNCH_BOUND,
            title=title,
            share_of_step=idle,
            calls_per_step=round(launches, 1),
            calls_range=[min(counts), max(counts)],
            time_per_step_ms=round(idle * wall_ms, 4),
            cuda_graph=graphs,
            evidence=evidence,
            suggestion=fix,
        )
    ]
