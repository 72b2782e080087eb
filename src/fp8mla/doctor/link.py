"""Link each GPU activity to the runtime call that launched it, the CPU op around that call and
the Python frame that issued it; for CPU-only traces, turn top-level ops into launches.

Links, strongest first: a kernel's ``correlation`` equals its launch call's; a kernel's
``External id`` equals its op's (torch 2.x; in torch 1.x traces it repeats the correlation and is
ignored); otherwise the innermost op on the launching thread whose time range holds the call.
Kernels replayed from a CUDA graph share their ``cudaGraphLaunch``'s correlation and carry no op.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TypeVar

from fp8mla.doctor.families import classify_kernel, classify_op
from fp8mla.doctor.frames import stack_frame
from fp8mla.doctor.records import Launch, Op, PyFrame, RuntimeCall, ThreadKey, TraceData

__all__ = ["build_launches", "innermost"]

GRAPH_LAUNCHES = frozenset(
    {"cudaGraphLaunch", "cudaGraphLaunch_v10000", "cuGraphLaunch", "hipGraphLaunch"}
)
COPY_OPS = frozenset({"aten::copy_", "aten::_to_copy", "aten::to", "aten::_copy_from"})

_T = TypeVar("_T", Op, PyFrame)


def innermost(
    intervals: Sequence[_T], queries: Sequence[tuple[ThreadKey, float]]
) -> list[_T | None]:
    """For each ``(thread, time)`` query, the innermost interval on that thread holding the time.

    Intervals on one thread nest (profiler ranges do); one sweep per thread, O(n log n).
    """
    by_thread: dict[ThreadKey, list[_T]] = defaultdict(list)
    for iv in intervals:
        by_thread[iv.tid].append(iv)
    wanted: dict[ThreadKey, list[int]] = defaultdict(list)
    for qi, (tid, _) in enumerate(queries):
        wanted[tid].append(qi)
    out: list[_T | None] = [None] * len(queries)
    for tid, qis in wanted.items():
        ivs = by_thread.get(tid)
        if not ivs:
            continue
        ivs.sort(key=lambda iv: (iv.ts, -iv.end))
        qis.sort(key=lambda qi: queries[qi][1])
        stack: list[_T] = []
        i = 0
        for qi in qis:
            t = queries[qi][1]
            while i < len(ivs) and ivs[i].ts <= t:
                start = ivs[i].ts
                while stack and stack[-1].end < start:
                    stack.pop()
                stack.append(ivs[i])
                i += 1
            while stack and stack[-1].end < t:
                stack.pop()
            out[qi] = stack[-1] if stack else None
    return out


def _nest_ops(ops: list[Op]) -> list[Op]:
    """Set ``parent`` of every operator-like op; return the top-level ones in time order."""
    by_thread: dict[ThreadKey, list[Op]] = defaultdict(list)
    for op in ops:
        if "::" in op.name:  # record_function ranges ("layer_3") do not nest launches
            by_thread[op.tid].append(op)
    top: list[Op] = []
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda o: (o.ts, -o.end))
        stack: list[Op] = []
        for op in thread_ops:
            while stack and stack[-1].end <= op.ts:
                stack.pop()
            op.parent = stack[-1] if stack else None
            if op.parent is None:
                top.append(op)
            stack.append(op)
    top.sort(key=lambda o: o.ts)
    return top


def _frames_for(data: TraceData, queries: list[tuple[ThreadKey, float]]) -> list[str | None]:
    """The innermost user-code frame around each ``(thread, time)``, by name."""
    if not data.frames:
        return [None] * len(queries)
    return [f.name if f is not None else None for f in innermost(data.frames, queries)]


def build_launches(data: TraceData) -> tuple[list[Launch], str]:
    """The launches of the trace in start order, and the mode: ``"gpu"`` or ``"cpu"``."""
    if data.kernels:
        return _gpu_launches(data), "gpu"
    return _cpu_launches(data), "cpu"


def _gpu_launches(data: TraceData) -> list[Launch]:
    by_corr: dict[int, RuntimeCall] = {r.corr: r for r in data.runtimes if r.corr is not None}
    ops_by_ext = {op.ext: op for op in data.ops if op.ext is not None}
    with_ext = [k for k in data.kernels if k.ext is not None]
    # torch 1.x writes the correlation id as the kernel's "External id": not an op link.
    ext_links_ops = bool(with_ext) and (
        sum(1 for k in with_ext if k.ext != k.corr and k.ext in ops_by_ext) * 2 > len(with_ext)
    )
    calls = [by_corr.get(k.corr) if k.corr is not None else None for k in data.kernels]
    linked = [c for c in calls if c is not None]
    unique_calls = list({id(c): c for c in linked}.values())
    call_queries = [(c.tid, c.ts) for c in unique_calls]
    call_ops = dict(zip(map(id, unique_calls), innermost(data.ops, call_queries)))
    call_frames = dict(zip(map(id, unique_calls), _frames_for(data, call_queries)))
    launches: list[Launch] = []
    for k, call in zip(data.kernels, calls):
        graph = call is not None and call.name in GRAPH_LAUNCHES
        op: Op | None = None
        if not graph:
            if ext_links_ops and k.ext is not None:
                op = ops_by_ext.get(k.ext)
            if op is None and call is not None:
                op = call_ops.get(id(call))
        frame = call_frames.get(id(call)) if call is not None else None
        if frame is None and op is not None and op.stack:
            frame = stack_frame(op.stack)
        copy = op if op is not None and op.name in COPY_OPS else None
        launches.append(
            Launch(
                k.name,
                classify_kernel(k.name, k.kind),
                k.ts,
                k.ts + k.dur,
                call.ts if call is not None else k.ts,
                op,
                copy,
                frame,
                k.grid,
                k.block,
                graph,
                k.nbytes,
                k.kind,
            )
        )
    launches.sort(key=lambda launch: launch.start)
    return launches


def _cpu_launches(data: TraceData) -> list[Launch]:
    top = _nest_ops(data.ops)
    for op in data.ops:  # the copy_ (or _to_copy/to) that says what a top-level op casts
        if op.name not in COPY_OPS:
            continue
        root = op
        while root.parent is not None:
            root = root.parent
        if root.copy is None or (op.name == "aten::copy_" and root.copy.name != "aten::copy_"):
            root.copy = op
    frames = _frames_for(data, [(op.tid, op.ts) for op in top])
    launches = []
    for op, frame in zip(top, frames):
        if frame is None and op.stack:
            frame = stack_frame(op.stack)
        family = classify_op(op.name)
        # A copy inside another op (dtype promotion in aten::mul) is that op's work, not a cast.
        copy = op.copy if family == "cast_copy" else None
        launches.append(Launch(op.name, family, op.ts, op.end, op.ts, op, copy, frame, kind="op"))
    return launches
