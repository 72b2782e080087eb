"""Detector: copy-engine transfers (``gpu_memcpy``/``gpu_memset``) inside the step."""

from __future__ import annotations

from collections import defaultdict

from fp8mla.doctor.context import TraceContext
from fp8mla.doctor.finding import MEMCPY, Finding, calls_text

__all__ = ["detect_memcpy"]

MIN_SHARE = 0.01


def detect_memcpy(ctx: TraceContext) -> list[Finding]:
    """Transfers worth ≥ 1% of the step, one finding per transfer kind."""
    steps, wall_us = ctx.steps, ctx.wall_us
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
            Finding(
                kind=MEMCPY,
                title=f"{name.strip()}, {per_step} per step",
                share_of_step=share,
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
