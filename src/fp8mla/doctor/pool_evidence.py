"""Is a per-layer cast pool-proportional? The evidence, in the order it is weighed.

A decode step's attention reads the active tokens' KV entries. A cast whose size is set by the
preallocated pool instead (``pool.to(torch.bfloat16)`` every layer) runs about once per layer
per step, over the same large element count every step, and that count is far larger than
what the step's attention reads. The active token count comes, in order of preference, from the
``active_tokens``/``context`` options, from recorded shapes (KV-shaped tensors with fewer rows
than the pool: the gathered entries, the attention's inputs), or is bounded by the attention
kernels' time at the device's peak bandwidth.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fp8mla.doctor import dtypes
from fp8mla.doctor.casts import CastGroup

__all__ = ["Evidence", "KvShapes", "classify", "kv_shapes"]

MIN_ELEMENTS = 1 << 20  # smaller casts are never worth a finding of their own
FAR_LARGER = 4.0  # pool slots ÷ active tokens above which a cast is pool-proportional
MLA_WIDTH = 576  # kv_lora_rank 512 + rope 64: the latent row an MLA cache stores per token
_MLA_WIDTHS = (512, MLA_WIDTH, 656)  # 656: FP8 latent + scales + BF16 rope (FlashMLA's layout)


@dataclass
class Evidence:
    """The verdict on one cast group and the sentences that justify it."""

    pool: bool
    reasons: list[str] = field(default_factory=list)
    slots: int | None = None
    active_tokens: int | None = None
    active_source: str | None = None


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


def _fmt(n: float) -> str:
    return f"{n / 1e6:,.1f} M" if n >= 1e6 else f"{n:,.0f}"


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
) -> Evidence:
    """Weigh the evidence that ``group`` is a pool-proportional cast."""
    ev = Evidence(pool=False)
    elements = group.elements
    if not group.is_cast or elements is None or nsteps == 0:
        return ev
    per_step = group.per_step(nsteps)
    calls = sum(per_step) / nsteps
    if layers:
        ratio = calls / layers
        if round(ratio) not in (1, 2) or abs(ratio - round(ratio)) > 0.25:
            ev.reasons.append(
                f"{calls:g} calls per step is not once (or twice) per layer ({layers} layers)"
            )
            return ev
        per_layer = "once" if round(ratio) == 1 else "twice"
        ev.reasons.append(f"runs {calls:g} times per step: {per_layer} per layer ({layers} layers)")
    elif calls < 2:
        return ev
    if not group.constant:
        ev.reasons.append(
            "its element count changes between calls: it follows the active "
            "tokens (a gathered cast), not a fixed pool"
        )
        return ev
    if elements < MIN_ELEMENTS:
        ev.reasons.append(f"{_fmt(elements)} elements per call is small")
        return ev
    steps_with_calls = sum(1 for c in per_step if c)
    ev.reasons.append(
        f"every call converts the same {elements:,} elements "
        f"({len(group.calls)} calls over {steps_with_calls} steps)"
    )
    shape = group.shape
    rows = shape[0] if shape and len(shape) >= 2 else None
    width = shape[-1] if shape else MLA_WIDTH
    # Pool slots in tokens: an MLA row of 512/576/656 values is one token, whatever the paging.
    if width in _MLA_WIDTHS and elements % width == 0:
        ev.slots = elements // width
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
    dst_size = dtypes.size(group.dst) or 2
    if attention_us_per_step and peak_tbps and layers:
        per_layer_us = attention_us_per_step / layers
        readable = peak_tbps * 1e12 * per_layer_us * 1e-6 / dst_size
        ratio = elements / readable if readable else float("inf")
        if ratio >= 2.0:
            ev.pool = True
            ev.reasons.append(
                f"one layer's attention kernels run {per_layer_us:.1f} µs: even at {peak_source} "
                f"they could read at most {_fmt(readable)} {group.dst or 'converted'} elements, "
                f"{ratio:.1f}× fewer than the cast writes"
            )
        else:
            ev.reasons.append(
                f"one layer's attention ({per_layer_us:.1f} µs) could read this much; pass "
                f"--active-tokens to decide"
            )
        return ev
    kv_like = bool(shape and len(shape) >= 3) or width in _MLA_WIDTHS
    if kv_like:
        ev.pool = True
        ev.reasons.append(
            f"no attention reads to compare with; its shape {list(shape) if shape else width} "
            f"is KV-cache-like and constant every layer and step (pass --active-tokens to "
            f"confirm)"
        )
    return ev
