"""Casts and copies per step: element counts, dtypes, bytes, bandwidth.

Element counts come from the op's recorded input shapes when there are any; otherwise from the
launch grid and what each ATen elementwise launcher does per block:

- ``unrolled_elementwise_kernel<f, array, N, ...>``: ``block.x × N`` (N = 4 on CUDA: 512 per
  block for the usual 128 threads), exact to within one block.
- ``elementwise_kernel<nt, vt, ...>`` (and ``_manual_unroll``, ``index_elementwise_kernel``):
  ``nt × vt`` per block, exact to within one block.
- ``vectorized_elementwise_kernel<vec, ...>``: ``block.x × work``, where the per-thread work
  depends on the torch version and the dtypes (4 to 16); 8 is assumed and the count is marked
  uncertain.

Other kernels (Triton, vendor libraries) have no known work per block: their element count is
unknown unless shapes were recorded.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field

from fp8mla.doctor import dtypes
from fp8mla.doctor.records import Launch, Op
from fp8mla.doctor.steps import Step

__all__ = ["CastCall", "CastGroup", "elements_from_grid", "group_casts", "op_cast"]

_UNROLLED = re.compile(
    r"unrolled_elementwise_kernel<.*?(?:std::array|at::detail::Array)<char\s?\*,\s*\d+u?l?>,\s*(\d+)\s*,"
)
_LEGACY = re.compile(
    r"\b(?:elementwise_kernel|elementwise_kernel_manual_unroll|index_elementwise_kernel)<(\d+),\s*(\d+),"
)
_VECTORIZED = re.compile(r"vectorized_elementwise_kernel<(\d+),")


@dataclass
class CastCall:
    """One logical cast/copy: one op instance (its launches merged) or one kernel."""

    step: int
    start: float
    time: float  # µs of device (or CPU) time
    elements: int | None
    source: str | None  # "shapes" | "grid" | "grid-uncertain"
    note: str | None
    shape: tuple[int, ...] | None
    nbytes: int | None = None  # memcpy-style activities report bytes, not elements


@dataclass
class CastGroup:
    """Calls of the same kernel, dtypes and Python frame across the steps."""

    name: str
    op_name: str | None
    frame: str | None
    src: str | None
    dst: str | None
    is_cast: bool
    graph: bool
    calls: list[CastCall] = field(default_factory=list)

    def per_step(self, nsteps: int) -> list[int]:
        """Calls in each step."""
        counts = [0] * nsteps
        for call in self.calls:
            counts[call.step] += 1
        return counts

    def calls_per_step(self, nsteps: int) -> float:
        """Mean calls per step."""
        return len(self.calls) / nsteps if nsteps else 0.0

    def time_per_step(self, nsteps: int) -> float:
        """Mean µs per step."""
        return sum(c.time for c in self.calls) / nsteps if nsteps else 0.0

    @property
    def elements(self) -> int | None:
        """Median element count per call, or None when unknown."""
        known = [c.elements for c in self.calls if c.elements is not None]
        return int(statistics.median(known)) if known else None

    @property
    def constant(self) -> bool:
        """Every call covers the same element count (within 0.1%)."""
        known = [c.elements for c in self.calls if c.elements is not None]
        return bool(known) and max(known) <= min(known) * 1.001

    @property
    def shape(self) -> tuple[int, ...] | None:
        """The most common source shape, or None."""
        shapes = [c.shape for c in self.calls if c.shape]
        return max(set(shapes), key=shapes.count) if shapes else None

    @property
    def source(self) -> str | None:
        """Where the element counts come from: shapes, grid, grid-uncertain."""
        sources = [c.source for c in self.calls if c.source]
        return max(set(sources), key=sources.count) if sources else None

    @property
    def note(self) -> str | None:
        """How a grid-based count was computed, if it was."""
        return next((c.note for c in self.calls if c.note), None)

    def bytes_per_call(self) -> tuple[int | None, bool]:
        """(bytes read + written per call, whether a dtype size had to be assumed)."""
        elements = self.elements
        if elements is None:
            known = [c.nbytes for c in self.calls if c.nbytes]
            return (int(statistics.median(known)) * 2, False) if known else (None, False)
        src, dst = dtypes.size(self.src), dtypes.size(self.dst)
        assumed = src is None or dst is None
        if src is None and dst is None:
            src = dst = 2
        elif src is None:
            src = 1 if self.is_cast and dst and dst > 1 else dst  # an FP8 source is the case
        elif dst is None:
            dst = src
        return elements * (src + dst), assumed


def _shape(value: object) -> tuple[int, ...] | None:
    if isinstance(value, (tuple, list)) and value and all(type(v) is int for v in value):
        return tuple(value)
    return None


def op_cast(op: Op) -> tuple[str | None, str | None, tuple[int, ...] | None]:
    """(source dtype, destination dtype, source shape) from a copy-like op's arguments."""
    types = op.types or ()
    dims = op.dims or ()
    if op.name in ("aten::copy_", "aten::_copy_from"):
        dst = dtypes.normalize(types[0]) if types else None
        src = dtypes.normalize(types[1]) if len(types) > 1 else None
        shape = _shape(dims[1]) if len(dims) > 1 else None
        return src, dst, shape or (_shape(dims[0]) if dims else None)
    src = dtypes.normalize(types[0]) if types else None
    dst = None
    for text in (op.concrete or ())[1:]:
        dst = dtypes.from_code(text)
        if dst:
            break
    return src, dst, _shape(dims[0]) if dims else None


def elements_from_grid(
    name: str, grid: tuple[int, int, int] | None, block: tuple[int, int, int] | None
) -> tuple[int, str, str] | None:
    """(elements, "grid" or "grid-uncertain", explanation) from a launch's grid, or None."""
    if not grid:
        return None
    blocks = grid[0] * grid[1] * grid[2]
    threads = block[0] * block[1] * block[2] if block else 128
    m = _LEGACY.search(name)
    if m:
        per_block = int(m.group(1)) * int(m.group(2))
        return blocks * per_block, "grid", f"{blocks:,} blocks × {per_block} (±{per_block - 1})"
    if "unrolled_elementwise_kernel" in name:
        m = _UNROLLED.search(name)
        per_thread = int(m.group(1)) if m else 4
        per_block = threads * per_thread
        how = "grid" if m else "grid-uncertain"
        return (
            blocks * per_block,
            how,
            f"{blocks:,} blocks × {threads} threads × {per_thread} (±{per_block - 1})",
        )
    m = _VECTORIZED.search(name)
    if m:
        per_block = threads * 8
        return (
            blocks * per_block,
            "grid-uncertain",
            f"{blocks:,} blocks × {threads} threads × 4–16 per thread (8 assumed)",
        )
    return None


def _describe(launch: Launch) -> tuple[str | None, str | None, tuple[int, ...] | None, bool]:
    src = dst = shape = None
    if launch.copy is not None:
        src, dst, shape = op_cast(launch.copy)
    if dst is None and launch.kind == "kernel":
        dst = dtypes.kernel_destination(launch.name)
    if src is not None and dst is not None:
        is_cast = src != dst
    else:
        is_cast = "LoadWithCast" in launch.name or "_to_copy" in launch.name
    return src, dst, shape, is_cast


def group_casts(steps: list[Step]) -> list[CastGroup]:
    """Cast/copy launches of the steps, merged per op instance and grouped by call site."""
    groups: dict[tuple[object, ...], CastGroup] = {}
    for step in steps:
        merged: dict[int, CastCall] = {}
        for launch in step.launches:
            if launch.family != "cast_copy":
                continue
            src, dst, shape, is_cast = _describe(launch)
            key = (launch.name, src, dst, launch.frame, is_cast)
            group = groups.get(key)
            if group is None:
                group = groups[key] = CastGroup(
                    launch.name,
                    launch.op.name if launch.op else None,
                    launch.frame,
                    src,
                    dst,
                    is_cast,
                    launch.graph,
                )
            elements = source = note = None
            if shape:
                elements, source = math.prod(shape), "shapes"
            else:
                estimate = elements_from_grid(launch.name, launch.grid, launch.block)
                if estimate:
                    elements, source, note = estimate
            # One op split into several launches (tensors over 2^31 elements) is one call.
            op_key = id(launch.op) if launch.op is not None and not launch.graph else None
            call = merged.get(op_key) if op_key is not None else None
            if call is not None and source != "shapes":
                call.time += launch.dur
                if elements is not None and call.elements is not None:
                    call.elements += elements
                continue
            if call is not None:
                call.time += launch.dur
                continue
            call = CastCall(
                step.index, launch.start, launch.dur, elements, source, note, shape, launch.nbytes
            )
            if op_key is not None:
                merged[op_key] = call
            group.calls.append(call)
    return list(groups.values())
