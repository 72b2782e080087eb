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
    per_step: dict[str, list[int]] = defaultdict(lambda: [0] * len(steps))
    frames: dict[str, str | None] = {}
    for i, step in enumerate(steps):
        for launch in step.launches:
            if launch.family != "memcpy" or launch.kind == "op":
                continue
            acc = by_name[launch.name]
            acc[0] += 1
            acc[1] += launch.dur
            acc[2] += launch.nbytes or 0
            per_step[launch.name][i] += 1
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
        counts = per_step[name]
        how_often = calls_text(counts, per=ctx.per)
        out.append(
            Finding(
                kind=MEMCPY,
                title=f"{name.strip()}, {how_often}",
                share_of_step=share,
                kernel=name,
                kernel_short=name.strip(),
                calls_per_step=round(count / n, 3),
                calls_range=[min(counts), max(counts)],
                bytes_per_step=int(nbytes / n) if nbytes else None,
                time_per_step_ms=round(time_us / n / 1e3, 4),
                source=frames.get(name),
                evidence=[
                    f"{calls_text(counts, 'transfers', ctx.per)} take "
                    f"{time_us / n / 1e3:.2f} ms {ctx.per}"
                    + (" on average" if len(set(counts)) > 1 else "")
                ],
                suggestion=fix,
            )
        )
    return out
