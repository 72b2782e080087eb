"""Synthetic torch.profiler traces of an MLA decode loop, for tests and benchmarks.

The events mimic what Kineto writes (categories, argument names, correlation and External id
links, Python frames, ``ProfilerStep#N`` markers) for a model of ``layers`` layers whose
attention backend casts an FP8 KV pool of ``pool_slots`` rows (``cast="full"``), casts only the
gathered active rows (``"gathered"``), or reads FP8 directly (``"none"``). Variants cover what
real traces differ in: no markers, no shapes, no stacks, CUDA-graph replays, nanosecond
timestamps, the torch 1.x format, CPU-only traces.

>>> write_trace("/tmp/t.json.gz", SynthSpec(layers=8, cast="full"))
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, TextIO

from fp8mla.doctor.synth_events import (
    ADD_KERNEL,
    ARGMAX_KERNEL,
    CAST_KERNEL,
    GEMM_KERNEL,
    NORM_KERNEL,
    EventWriter,
    SynthSpec,
)

__all__ = ["CAST_KERNEL", "SynthSpec", "iter_events", "write_trace"]


def _cast_elements(spec: SynthSpec, step: int) -> int:
    rows = spec.pool_slots if spec.cast == "full" else spec.active_tokens + step
    return rows * spec.row[0] * spec.row[1]


def _attention_kernels(spec: SynthSpec) -> list[tuple[str, float, list[int]]]:
    """One layer's attention: a split-KV stage and its merge (10:1 of ``attention_us``)."""
    return [
        ("_fwd_grouped_kernel_stage1", spec.attention_us * 10 / 11, [1, 2, 8]),
        ("_fwd_kernel_stage2", spec.attention_us / 11, [1, 32, 1]),
    ]


def _layer(w: EventWriter, spec: SynthSpec, step: int, parent: int) -> None:
    """One decoder layer: norm, q projection, the backend's forward_decode, o projection."""
    s = spec
    hidden = 6144
    for _ in range(s.python_noise):
        w.frame("torch/nn/modules/module.py(1750): _call_impl", w.cpu, 2.0, parent)
        w.cpu += 2.5
    ext = w.op(
        "aten::rms_norm", 20.0, [[1, hidden], [], [], []], ["c10::BFloat16", "ScalarList", "", ""]
    )
    w.launch(NORM_KERNEL, 4.0, [1, 1, 1], ext)
    w.cpu += 25.0
    ext = w.op("aten::mm", 30.0, [[1, hidden], [hidden, 18432]], ["c10::BFloat16"] * 2)
    w.launch(GEMM_KERNEL, 60.0, [2, 64, 1], ext)
    w.cpu += 35.0
    fwd = w.open_frame(
        "sglang/srt/layers/attention/flashinfer_mla_backend.py(412): forward_decode", parent
    )
    stack = "sglang/srt/layers/attention/flashinfer_mla_backend.py(412): forward_decode"
    for _ in range(s.pools if s.cast != "none" else 0):
        rows = s.pool_slots if s.cast == "full" else s.active_tokens + step
        shape = [rows, *s.row]
        if s.cast == "gathered":
            ext = w.op(
                "aten::index",
                40.0,
                [[s.pool_slots, *s.row], [rows]],
                [s.kv_type, "long int"],
                stack=stack,
            )
            w.launch(
                "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_"
                "kernel<at::native::index_kernel_impl<at::native::OpaqueType<1> > >>(long, "
                "at::native::gpu_index_kernel)",
                3.0,
                [math.ceil(rows * shape[1] * shape[2] / 512), 1, 1],
                ext,
            )
            w.cpu += 45.0
        elements = rows * shape[1] * shape[2]
        dur = elements * 3 / (s.cast_tbps * 1e6)
        w.op(
            "aten::to",
            60.0,
            [shape, [], [], [], []],
            [s.kv_type, "Scalar", "Scalar", "Scalar", ""],
            ["", "15", "False", "False", ""],
            stack=stack,
        )
        w.cpu += 2.0
        w.op(
            "aten::_to_copy",
            55.0,
            [shape, [], [], [], [], [], []],
            [s.kv_type, "Scalar", "", "", "", "Scalar", ""],
            ["", "15", "", "", "", "False", ""],
            stack=stack,
        )
        w.cpu += 10.0
        ext = w.op(
            "aten::copy_",
            35.0,
            [shape, shape, []],
            ["c10::BFloat16", s.kv_type, "Scalar"],
            ["", "", "False"],
            stack=stack,
        )
        w.launch(CAST_KERNEL, dur, [math.ceil(elements / 512), 1, 1], ext)
        w.cpu += 60.0
    if s.cast != "none":
        w.op(
            "aten::view",
            3.0,
            [[s.active_tokens + step, *s.row], []],
            ["c10::BFloat16", "ScalarList"],
            stack=stack,
        )
    w.cpu += 5.0
    w.frame("sgl_decode.py(132): decode_attention_fwd_grouped", w.cpu, 60.0, fwd[0])
    for name, dur, grid in _attention_kernels(s):
        w.launch(name, dur, grid, None, "cuLaunchKernelEx")
        w.cpu += 30.0
    w.close_frame(fwd)
    ext = w.op("aten::mm", 30.0, [[1, 16384], [16384, hidden]], ["c10::BFloat16"] * 2)
    w.launch(GEMM_KERNEL, 70.0, [2, 64, 1], ext)
    w.cpu += 35.0
    ext = w.op(
        "aten::add",
        15.0,
        [[1, hidden], [1, hidden], []],
        ["c10::BFloat16", "c10::BFloat16", "Scalar"],
    )
    w.launch(ADD_KERNEL, 1.5, [6, 1, 1], ext)
    w.cpu += 20.0


def _cpu_layer(w: EventWriter, spec: SynthSpec, step: int, parent: int) -> None:
    """A CPU-only layer: the cast is three nested ops whose copy_ does the work."""
    s = spec
    w.op("aten::matmul", 80.0, [[1, s.width], [s.width, s.width]], ["c10::BFloat16"] * 2)
    w.cpu += 90.0
    fwd = w.open_frame("backend.py(7): forward_decode", parent)
    if s.cast != "none":
        rows = s.pool_slots if s.cast == "full" else s.active_tokens + step
        shape = [rows, 1, s.width]
        dur = rows * s.width * 3 / 6000.0  # ~6 GB/s: CPU FP8 conversion
        w.op(
            "aten::to",
            dur + 40,
            [shape, [], [], [], []],
            ["c10::Float8_e4m3fn", "Scalar", "Scalar", "Scalar", ""],
            ["", "15", "False", "False", ""],
        )
        w.cpu += 5.0
        w.op(
            "aten::_to_copy",
            dur + 30,
            [shape] + [[]] * 6,
            ["c10::Float8_e4m3fn", "Scalar", "", "", "", "Scalar", ""],
        )
        w.cpu += 10.0
        w.op(
            "aten::copy_",
            dur,
            [shape, shape, []],
            ["c10::BFloat16", "c10::Float8_e4m3fn", "Scalar"],
        )
        w.cpu += dur + 40.0
    w.op("aten::index", 60.0, [[s.pool_slots, 1, s.width], []], ["c10::BFloat16", ""])
    w.cpu += 70.0
    w.op(
        "aten::view",
        3.0,
        [[s.active_tokens + step, 1, s.width], []],
        ["c10::BFloat16", "ScalarList"],
    )
    w.cpu += 10.0
    w.op(
        "aten::matmul",
        100.0,
        [[1, s.width], [s.width, s.active_tokens + step]],
        ["c10::BFloat16"] * 2,
    )
    w.cpu += 110.0
    w.close_frame(fwd)


def _graph_step(w: EventWriter, spec: SynthSpec, step: int, parent: int) -> None:
    """One CUDA-graph replay: every kernel of the step shares one cudaGraphLaunch correlation."""
    s = spec
    corr = w.corr
    w.corr += 1
    w.frame("sglang/srt/model_executor/cuda_graph_runner.py(700): replay", w.cpu, 20.0, parent)
    w.event(w.cat["rt"], "cudaGraphLaunch", w.cpu + 2.0, 12.0, {"correlation": corr})
    t = max(w.gpu, w.cpu + 20.0)
    elements = _cast_elements(s, step)
    for _ in range(s.layers):
        kernels = [(NORM_KERNEL, 4.0, [1, 1, 1]), (GEMM_KERNEL, 60.0, [2, 64, 1])]
        if s.cast != "none":
            cast = (
                CAST_KERNEL,
                elements * 3 / (s.cast_tbps * 1e6),
                [math.ceil(elements / 512), 1, 1],
            )
            kernels += [cast] * s.pools
        kernels += [
            *_attention_kernels(s),
            (GEMM_KERNEL, 70.0, [2, 64, 1]),
            (ADD_KERNEL, 1.5, [6, 1, 1]),
        ]
        for name, dur, grid in kernels:
            w.event(
                w.cat["k"],
                name,
                t,
                dur,
                {"device": 0, "stream": 7, "correlation": corr, "grid": grid, "block": [128, 1, 1]},
                0,
                7,
            )
            t += dur + 1.0
    w.gpu = t
    w.cpu += 40.0


def iter_events(spec: SynthSpec) -> Iterator[str]:
    """The JSON text of each event of the trace, step by step."""
    w = EventWriter(spec)
    root = w.open_frame("decode.py(20): <module>", None)
    w.cpu += 5.0
    for step in range(spec.steps):
        start = w.cpu
        loop = w.open_frame("decode.py(60): step", root[0])
        if spec.cpu_only:
            for _ in range(spec.layers):
                _cpu_layer(w, spec, step, loop[0])
        elif spec.cuda_graph:
            _graph_step(w, spec, step, loop[0])
        else:
            for _ in range(spec.layers):
                _layer(w, spec, step, loop[0])
        if not spec.cpu_only:  # sampling, then the host waits for the token
            ext = w.op("aten::argmax", 20.0, [[1, 155648], [], []], ["c10::BFloat16", "", ""])
            w.launch(ARGMAX_KERNEL, 5.0, [1, 1, 1], None if spec.cuda_graph else ext)
            w.cpu = max(w.cpu + 25.0, w.gpu + 10.0)
        w.close_frame(loop)
        w.cpu += 300.0  # scheduling between steps
        if spec.markers:
            w.event(
                "user_annotation",
                f"ProfilerStep#{step + 2}",
                start,
                w.cpu - start - 1.0,
                {"External id": 0},
            )
        if step == spec.steps - 1:
            w.close_frame(root)
        yield from w.out
        w.out.clear()


def _header(spec: SynthSpec) -> str:
    props = [] if spec.cpu_only else [{"id": 0, "name": spec.device, "numSms": 132}]
    meta = {
        "schemaVersion": 1,
        "deviceProperties": props,
        "record_shapes": int(spec.shapes),
        "with_stack": int(spec.stacks),
        "displayTimeUnit": "ns" if spec.nanoseconds else "ms",
    }
    return json.dumps(meta)[:-1] + ', "traceEvents": [\n'


def write_trace(path: str, spec: SynthSpec | None = None, **overrides: Any) -> str:
    """Write a synthetic trace (gzipped when ``path`` ends in ``.gz``); returns ``path``."""
    spec = replace(spec or SynthSpec(), **overrides)
    opener = (
        (lambda: gzip.open(path, "wt", encoding="utf-8", compresslevel=1))
        if path.endswith(".gz")
        else (lambda: open(path, "w", encoding="utf-8"))
    )
    with opener() as f:
        _write(f, spec)
    return path


def _write(f: TextIO, spec: SynthSpec) -> None:
    f.write(_header(spec))
    first = True
    batch: list[str] = []
    for event in iter_events(spec):
        batch.append(event)
        if len(batch) >= 4096:
            f.write(("" if first else ",\n") + ",\n".join(batch))
            first = False
            batch.clear()
    if batch:
        f.write(("" if first else ",\n") + ",\n".join(batch))
    f.write("\n]}\n")
