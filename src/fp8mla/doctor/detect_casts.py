"""Detector: casts and copies done by kernels, with the pool-proportional verdict for each."""

from __future__ import annotations

from fp8mla.doctor.casts import CastGroup, group_casts
from fp8mla.doctor.context import TraceContext
from fp8mla.doctor.devices import peak_bandwidth
from fp8mla.doctor.families import short_name
from fp8mla.doctor.finding import (
    COPY,
    DTYPE_CAST,
    POOL_PROPORTIONAL_CAST,
    Finding,
    calls_text,
)
from fp8mla.doctor.pool_evidence import Evidence, classify
from fp8mla.doctor.pool_fix import pool_fix

__all__ = ["MIN_SHARE", "detect_casts"]

MIN_SHARE = 0.01  # casts and copies under 1% of the step are not reported (unless pool-sized)


def _millions(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:,.1f} M" if n >= 1e6 else f"{n:,}"


def cast_finding(
    group: CastGroup,
    ev: Evidence,
    *,
    nsteps: int,
    wall_us: float,
    per: str = "per step",
    peak_gbps: float | None = None,
) -> Finding | None:
    """The finding for one cast/copy group, or None when it costs under 1% of the step.

    An achieved bandwidth above ``peak_gbps`` (the device's peak) is not reported: the time it
    divides by is not the copy's (a CPU op's launch time for work done on a GPU, a partial
    trace)."""
    time_us = group.time_per_step(nsteps)
    share = time_us / wall_us if wall_us else 0.0
    if share < MIN_SHARE and not ev.pool:
        return None
    per_call, assumed = group.bytes_per_call()
    calls = group.calls_per_step(nsteps)
    per_step = per_call * calls if per_call is not None else None
    total_time = sum(c.time for c in group.calls)
    bandwidth = per_call * len(group.calls) / total_time / 1e3 if per_call and total_time else None
    if bandwidth is not None and peak_gbps is not None and bandwidth > peak_gbps:
        bandwidth = None
    counts = group.per_step(nsteps)
    fields = dict(
        kernel=group.name,
        kernel_short=short_name(group.name),
        op=group.op_name,
        calls_per_step=round(calls, 3),
        calls_range=[min(counts), max(counts)] if counts else None,
        elements_per_call=group.elements,
        elements_source=group.source,
        elements_note=group.note,
        shape=list(group.shape) if group.shape else None,
        src_dtype=group.src,
        dst_dtype=group.dst,
        bytes_per_step=int(per_step) if per_step is not None else None,
        bytes_estimated=assumed,
        time_per_step_ms=round(time_us / 1e3, 4),
        share_of_step=share,
        bandwidth_gbps=round(bandwidth, 1) if bandwidth else None,
        source=group.frame,
        cuda_graph=group.graph,
        evidence=list(ev.reasons),
        pool_slots=ev.slots,
        active_tokens=ev.active_tokens,
        active_tokens_source=ev.active_source,
    )
    if group.src and group.dst:
        words = f"{group.src}→{group.dst} cast"
    else:
        words = f"cast to {group.dst}" if group.dst else "dtype cast"
    how_often = calls_text(counts, per=per)
    if ev.pool:
        pools = " (K and V)" if ev.layout == "mha" and ev.layout_certain else ""
        return Finding(
            kind=POOL_PROPORTIONAL_CAST,
            title=f"Whole-pool {words}{pools} every layer",
            suggestion=pool_fix(group, ev, time_us / 1e3, share),
            **fields,
        )
    fold = (
        "Fold the conversion into the kernel that consumes the tensor (read the stored "
        "dtype in-kernel), or keep the tensor in the dtype its consumer wants."
    )
    if ev.open:
        fields["evidence"] = [*ev.reasons, *(f"to decide: {d}" for d in ev.decide)]
        return Finding(
            kind=DTYPE_CAST,
            title=(
                f"{words[0].upper()}{words[1:]} of {_millions(group.elements)} elements, "
                f"{how_often}: possibly the whole KV pool"
            ),
            suggestion=(
                f"If it converts the whole pool: {pool_fix(group, ev, time_us / 1e3, share)} "
                f"If it converts only the entries attention reads: {fold}"
            ),
            **fields,
        )
    if group.is_cast:
        return Finding(
            kind=DTYPE_CAST,
            title=f"{words[0].upper()}{words[1:]}, {how_often}",
            suggestion=fold,
            **fields,
        )
    where = "Copy" if group.op_name == group.name else "Device copy"
    return Finding(
        kind=COPY,
        title=f"{where} ({group.dst or 'same dtype'}), {how_often}",
        suggestion=(
            "Look for .contiguous()/.clone()/copy_ of a large buffer in the step loop: pass "
            "views, preallocate the destination once, or let the consumer read strided input."
        ),
        **fields,
    )


def detect_casts(ctx: TraceContext) -> list[Finding]:
    """A finding per cast/copy call site costing ≥ 1% of the step, or judged pool-sized."""
    findings = []
    peak_gbps = 1e3 * (ctx.peak_tbps or peak_bandwidth(ctx.data.device)[0])
    for group in group_casts(ctx.steps):
        ev = classify(
            group,
            nsteps=ctx.nsteps,
            layers=ctx.layers,
            shapes=ctx.data.shapes,
            active_tokens=ctx.active_tokens,
            context=ctx.context,
            attention_us_per_step=ctx.attention_us,
            peak_tbps=ctx.peak_tbps,
            peak_source=ctx.peak_source,
            per=ctx.per,
        )
        finding = cast_finding(
            group, ev, nsteps=ctx.nsteps, wall_us=ctx.wall_us, per=ctx.per, peak_gbps=peak_gbps
        )
        if finding is not None:
            findings.append(finding)
    return findings
