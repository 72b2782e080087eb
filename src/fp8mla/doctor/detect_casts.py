"""Detector: casts and copies done by kernels, with the pool-proportional verdict for each."""

from __future__ import annotations

from fp8mla.doctor.casts import CastGroup, group_casts
from fp8mla.doctor.context import TraceContext
from fp8mla.doctor.families import short_name
from fp8mla.doctor.finding import (
    COPY,
    DTYPE_CAST,
    POOL_PROPORTIONAL_CAST,
    Finding,
    calls_text,
)
from fp8mla.doctor.pool_evidence import Evidence, classify

__all__ = ["MIN_SHARE", "detect_casts"]

MIN_SHARE = 0.01  # casts and copies under 1% of the step are not reported (unless pool-sized)


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


def cast_finding(group: CastGroup, ev: Evidence, *, nsteps: int, wall_us: float) -> Finding | None:
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
    fields = dict(
        kernel=group.name,
        kernel_short=short_name(group.name),
        op=group.op_name,
        calls_per_step=round(calls, 3),
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
    if ev.pool:
        return Finding(
            kind=POOL_PROPORTIONAL_CAST,
            title=f"Whole-pool {words} every layer",
            suggestion=_fix_pool(group, ev, time_us / 1e3, share),
            **fields,
        )
    if group.is_cast:
        return Finding(
            kind=DTYPE_CAST,
            title=f"{words[0].upper()}{words[1:]}, {calls_text(calls)} per step",
            suggestion=(
                "Fold the conversion into the kernel that consumes the tensor (read the stored "
                "dtype in-kernel), or keep the tensor in the dtype its consumer wants."
            ),
            **fields,
        )
    return Finding(
        kind=COPY,
        title=f"Device copy ({group.dst or 'same dtype'}), {calls_text(calls)} per step",
        suggestion=(
            "Look for .contiguous()/.clone()/copy_ of a large buffer in the step loop: pass "
            "views, preallocate the destination once, or let the consumer read strided input."
        ),
        **fields,
    )


def detect_casts(ctx: TraceContext) -> list[Finding]:
    """A finding per cast/copy call site costing ≥ 1% of the step, or judged pool-sized."""
    findings = []
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
        )
        finding = cast_finding(group, ev, nsteps=ctx.nsteps, wall_us=ctx.wall_us)
        if finding is not None:
            findings.append(finding)
    return findings
