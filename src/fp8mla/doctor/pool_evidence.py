"""Is a per-layer cast pool-proportional? The evidence, in the order it is weighed.

A decode step's attention reads the active tokens' KV entries. A cast whose size is set by the
preallocated pool instead (``pool.to(torch.bfloat16)`` every layer) runs about once per layer
per step (twice for separate K and V pools), over the same large element count every step, and
that count is larger than what the step's attention reads. The active token count comes, in
order of preference, from the ``active_tokens``/``context`` options, from recorded shapes
(KV-shaped tensors with fewer rows than the pool: the gathered entries, the attention's
inputs), or is bounded by the attention kernels' time at the device's peak bandwidth: elements
that one layer's attention could not have read even at the peak are elements it never reads.

When none of these decides, the verdict is left open and the evidence says what would decide
it. The pool's layout (an MLA latent pool ``[slots, 1, 576]`` or separate K/V pools
``[slots, heads, head_dim]``) comes from the cast's shape, or from how often it runs per layer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fp8mla.doctor import dtypes
from fp8mla.doctor.casts import CastGroup

__all__ = ["MLA", "MHA", "Evidence", "KvShapes", "classify", "kv_shapes"]

MIN_ELEMENTS = 1 << 20  # smaller casts are never worth a finding of their own
FAR_LARGER = 4.0  # pool slots ÷ active tokens above which a cast is pool-proportional
MLA_WIDTH = 576  # kv_lora_rank 512 + rope 64: the latent row an MLA cache stores per token
_MLA_WIDTHS = (512, MLA_WIDTH, 656)  # 656: FP8 latent + scales + BF16 rope (FlashMLA's layout)
_HEAD_DIMS = (64, 80, 96, 112, 128, 192, 256)
MLA, MHA = "mla", "mha"


@dataclass
class Evidence:
    """The verdict on one cast group and the sentences that justify it.

    ``pool``: judged a whole-pool cast. ``open``: it may be one, but the trace does not decide;
    ``decide`` then says what would. ``layout``: ``"mla"``, ``"mha"`` or None (unknown), with
    ``layout_certain`` False when it was inferred from counts rather than shapes.
    """

    pool: bool
    reasons: list[str] = field(default_factory=list)
    slots: int | None = None
    active_tokens: int | None = None
    active_source: str | None = None
    open: bool = False
    decide: list[str] = field(default_factory=list)
    layout: str | None = None
    layout_certain: bool = False


@dataclass
class KvShapes:
    """KV-shaped tensors (same trailing dims as the cast's source) seen in the recorded ops."""

    fewer_rows: int | None  # the most rows below the cast's: gathered/active entries
    more_rows: int | None  # the most rows above the cast's: the pool this cast is a part of


def kv_shapes(shapes: Iterable[tuple[Any, ...]], shape: tuple[int, ...]) -> KvShapes:
    """Among the recorded tensor shapes, those like ``shape`` but with other row counts."""
    rows, rest = shape[0], tuple(shape[1:])
    fewer = more = None
    for dims in shapes:
        if len(dims) == len(shape) and dims[1:] == rest and type(dims[0]) is int:
            n = dims[0]
            if 2 <= n < rows and (fewer is None or n > fewer):
                fewer = n
            elif n > rows and (more is None or n > more):
                more = n
    return KvShapes(fewer, more)


def _integer(dtype: str | None) -> bool:
    return bool(dtype) and (dtype.startswith(("int", "uint")) or dtype == "bool")


def _fmt(n: float) -> str:
    return f"{n / 1e6:,.1f} M" if n >= 1e6 else f"{n:,.0f}"


def _layout(
    shape: tuple[int, ...] | None, elements: int, per_layer: int | None
) -> tuple[str | None, bool, int | None]:
    """(layout, certain, values per token) from the shape, else from calls per layer."""
    if shape and len(shape) >= 2:
        width = shape[-1]
        if width in _MLA_WIDTHS:  # [slots, 1, 576] or paged [pages, page_size, 576]
            return MLA, True, width
        if len(shape) >= 3 and shape[-2] > 1 and width in _HEAD_DIMS:
            return MHA, True, shape[-2] * width  # [slots, heads, dim] or [pages, page, heads, dim]
        return None, False, None
    if per_layer == 2:  # a K pool and a V pool, each converted once per layer
        return MHA, False, None
    if per_layer == 1 and elements % MLA_WIDTH == 0:
        return MLA, False, MLA_WIDTH
    return None, False, None


def classify(
    group: CastGroup,
    *,
    nsteps: int,
    layers: int | None,
    shapes: Iterable[tuple[Any, ...]],
    active_tokens: int | None,
    context: int | None,
    attention_us_per_step: float | None,
    peak_tbps: float | None,
    peak_source: str | None,
    per: str = "per step",
) -> Evidence:
    """Weigh the evidence that ``group`` is a pool-proportional cast."""
    ev = Evidence(pool=False)
    elements = group.elements
    if not group.is_cast or elements is None or nsteps == 0:
        return ev
    if _integer(group.src) or _integer(group.dst):
        return ev  # index or mask conversions: never a KV pool's values
    if elements < MIN_ELEMENTS:
        ev.reasons.append(f"{_fmt(elements)} elements per call is small")
        return ev
    per_step = group.per_step(nsteps)
    calls = sum(per_step) / nsteps
    per_layer = None
    if layers:
        ratio = calls / layers
        if round(ratio) not in (1, 2) or abs(ratio - round(ratio)) > 0.25:
            ev.reasons.append(
                f"{calls:,.0f} calls {per} on average is not once (or twice) per layer "
                f"({layers} layers)"
            )
            return ev
        per_layer = round(ratio)
        word = "once" if per_layer == 1 else "twice"
        ev.reasons.append(f"runs {calls:,.0f} times {per}: {word} per layer ({layers} layers)")
    elif calls < 2:
        return ev
    elif len(set(per_step)) == 1:
        every = "in the window" if per == "in the window" else "in every step"
        ev.reasons.append(f"runs {per_step[0]:,} times {every} (layer count unknown)")
    if not group.constant:
        ev.reasons.append(
            "its element count changes between calls: it follows what the step processes, "
            "not a fixed pool"
        )
        return ev
    steps_with_calls = sum(1 for c in per_step if c)
    ev.reasons.append(
        f"every call converts the same {elements:,} elements "
        f"({len(group.calls)} calls over {steps_with_calls} steps)"
    )
    shape = group.shape
    rows = shape[0] if shape and len(shape) >= 2 else None
    ev.layout, ev.layout_certain, per_token = _layout(shape, elements, per_layer)
    # Pool slots in tokens: an MLA row of 512/576/656 values is one token, whatever the paging.
    if per_token and elements % per_token == 0:
        ev.slots = elements // per_token
    else:
        ev.slots = rows
    seen = kv_shapes(shapes, shape) if rows else KvShapes(None, None)
    if seen.more_rows and rows and seen.more_rows >= 2 * rows:
        ev.reasons.append(
            f"a larger KV tensor of {seen.more_rows:,} rows exists: this cast covers a gathered "
            f"part of it ({rows:,} rows), not the pool"
        )
        return ev
    if active_tokens or context:
        ev.active_tokens = active_tokens or context
        ev.active_source = "--active-tokens" if active_tokens else "--context"
        pool_size, active, unit = ev.slots, ev.active_tokens, "tokens"
    elif seen.fewer_rows and rows:
        ev.active_tokens, ev.active_source = seen.fewer_rows, "recorded shapes"
        pool_size, active, unit = rows, seen.fewer_rows, "rows"
    else:
        pool_size = active = None
    if pool_size and active:
        ratio = pool_size / active
        if ratio >= FAR_LARGER:
            ev.pool = True
            ev.reasons.append(
                f"it converts {pool_size:,} {unit} of KV per call while the step's attention "
                f"uses {active:,} ({ev.active_source}): {ratio:,.0f}× more than attention reads"
            )
        else:
            ev.reasons.append(
                f"it converts {pool_size:,} {unit}, about the {active:,} the attention uses "
                f"({ev.active_source}): a cast of gathered entries, not of the pool"
            )
        return ev
    if attention_us_per_step and peak_tbps:
        _bound_by_attention(ev, group, calls, attention_us_per_step, peak_tbps, peak_source)
        return ev
    kv_like = bool(shape and len(shape) >= 3) or (shape and shape[-1] in _MLA_WIDTHS)
    if kv_like:
        ev.pool = True
        ev.reasons.append(
            f"no attention reads to compare with; its shape {list(shape) if shape else '?'} "
            f"is KV-cache-like and constant every layer and step (pass --active-tokens to "
            f"confirm)"
        )
        return ev
    _leave_open(ev, group, "no attention kernels to compare its size with")
    return ev


def _bound_by_attention(
    ev: Evidence,
    group: CastGroup,
    calls: float,
    attention_us_per_step: float,
    peak_tbps: float,
    peak_source: str | None,
) -> None:
    """Decide by what the attention kernels could read, at most, in their measured time.

    Each call is set against the attention time that goes with it (the step's attention time
    ÷ the calls per step): one layer's, or half of it when K and V are cast separately."""
    elements = group.elements or 0
    dst_size = dtypes.size(group.dst) or 2
    per_call_us = attention_us_per_step / calls
    readable = peak_tbps * 1e12 * per_call_us * 1e-6 / dst_size
    ratio = elements / readable if readable else float("inf")
    cast_us = group.time_per_step(1) / max(len(group.calls), 1)
    dst = group.dst or "converted"
    exact = group.source in ("shapes", "grid")
    timing = (
        f"each call takes {cast_us:,.0f} µs, {cast_us / per_call_us:,.1f}× the attention time "
        f"that goes with it ({per_call_us:,.1f} µs)"
    )
    if ratio >= 2.0 or (ratio > 1.0 and exact):
        ev.pool = True
        ev.reasons.append(
            f"the attention kernels that go with one call run {per_call_us:,.1f} µs: even at "
            f"{peak_source} they could read at most {_fmt(readable)} {dst} elements, "
            f"{ratio:.1f}× fewer than the cast writes, so it converts KV that attention never "
            f"reads"
        )
        ev.reasons.append(timing)
        return
    ev.reasons.append(
        f"the attention kernels that go with one call ({per_call_us:,.1f} µs) could read up to "
        f"{_fmt(readable)} {dst} elements at {peak_source}: as many as the cast writes, so "
        f"their time does not tell a whole pool from the active entries"
    )
    ev.reasons.append(timing)
    _leave_open(ev, group, "the trace does not say how many tokens attention reads")


def _leave_open(ev: Evidence, group: CastGroup, why: str) -> None:
    """Mark the verdict open, and say what would decide it."""
    ev.open = True
    elements = group.elements or 0
    if ev.slots:
        limit = f"fewer than {ev.slots / FAR_LARGER:,.0f} tokens"
        size = f"{ev.slots:,} tokens of KV"
    else:
        limit = f"under a quarter of the {_fmt(elements)} values it converts"
        size = f"{_fmt(elements)} values"
    ev.decide = [
        f"--active-tokens N (the KV tokens one step's attention reads, all requests together): "
        f"it is a whole-pool cast if attention reads {limit}",
        "a trace of an eager step (outside CUDA graphs) recorded with record_shapes=True: the "
        "cast's shape and the attention inputs' shapes",
        "with_stack=True: the Python line that casts, which `fp8mla scan` tells apart (a whole "
        "pool buffer or gathered rows)",
    ]
    ev.reasons.append(f"{why}: possibly a whole-pool cast ({size} per call)")
