"""Small pieces: element estimates, dtypes, names, families, frames, layers, segmentation."""

from __future__ import annotations

import pytest

from fp8mla.doctor import dtypes
from fp8mla.doctor.casts import elements_from_grid
from fp8mla.doctor.devices import peak_bandwidth
from fp8mla.doctor.families import classify_kernel, classify_op, short_name
from fp8mla.doctor.frames import is_framework, parse_frame, stack_frame
from fp8mla.doctor.records import Launch
from fp8mla.doctor.steps import Step, infer_layers, segment
from fp8mla.doctor.synth import CAST_KERNEL

LEGACY_COPY = (
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}>"
    "(at::TensorIteratorBase&)::{lambda(int)#1}>(int, ...)"
)
VECTORIZED = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>, "
    "std::array<char*, 1ul> >(int, at::native::FillFunctor<int>, std::array<char*, 1ul>)"
)


def test_unrolled_cast_elements_from_grid():
    elements, how, note = elements_from_grid(CAST_KERNEL, (557496, 1, 1), (128, 1, 1))
    assert elements == 285_437_952 and how == "grid"
    assert "±511" in note


def test_other_launchers():
    assert elements_from_grid(LEGACY_COPY, (10, 1, 1), (128, 1, 1))[:2] == (2560, "grid")
    assert elements_from_grid(VECTORIZED, (10, 1, 1), (128, 1, 1))[1] == "grid-uncertain"
    assert elements_from_grid("_fwd_grouped_kernel_stage1", (1, 2, 8), (128, 1, 1)) is None
    assert elements_from_grid(CAST_KERNEL, None, None) is None


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("c10::BFloat16", "bfloat16"),
        ("c10::Float8_e4m3fn", "float8_e4m3fn"),
        ("float", "float32"),
        ("c10::Half", "float16"),
        ("long int", "int64"),
        ("Scalar", None),
        ("", None),
        (3, None),
    ],
)
def test_dtype_names(name, expected):
    assert dtypes.normalize(name) == expected


def test_dtype_codes_and_kernel_names():
    assert dtypes.from_code("15") == "bfloat16"
    assert dtypes.from_code("24") == "float8_e4m3fn"
    assert dtypes.from_code("False") is None
    assert dtypes.kernel_destination(CAST_KERNEL) == "bfloat16"
    assert dtypes.size("float8_e4m3fn") == 1 and dtypes.size(None) is None


def test_short_names():
    assert short_name(CAST_KERNEL) == "unrolled_elementwise_kernel<direct_copy_kernel_cuda …>"
    assert short_name("_fwd_kernel_stage2") == "_fwd_kernel_stage2"
    assert len(short_name("x" * 300)) == 90


@pytest.mark.parametrize(
    ("name", "family"),
    [
        (CAST_KERNEL, "cast_copy"),
        (LEGACY_COPY, "cast_copy"),
        (
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "communication",
        ),
        ("_fwd_grouped_kernel_stage1", "attention"),
        ("void flashinfer::BatchMLAPagedAttentionKernel<...>", "attention"),
        ("nvjet_sm90_tst_192x8_64x8_2x1_v_bz_NNT", "gemm"),
        ("Cijk_Alik_Bljk_SB_MT64x16x32", "gemm"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "norm"),
        ("triton_poi_fused_add_cos_sin_0", "elementwise"),
        ("some_custom_kernel", "other"),
    ],
)
def test_kernel_families(name, family):
    assert classify_kernel(name) == family


def test_memcpy_and_op_families():
    assert classify_kernel("Memcpy DtoH (Device -> Pageable)", "memcpy") == "memcpy"
    assert classify_op("aten::to") == "cast_copy"
    assert classify_op("aten::addmm") == "gemm"
    assert classify_op("aten::scaled_dot_product_attention") == "attention"
    assert classify_op("c10d::allreduce_") == "communication"
    assert classify_op("aten::view") == "other"


def test_frames():
    assert not is_framework("sglang/srt/layers/attention/flashinfer_mla_backend.py(412): forward")
    assert not is_framework("/home/me/decode.py(19): forward_decode")
    assert is_framework("torch/nn/modules/module.py(1750): _call_impl")
    assert is_framework("<built-in method to of Tensor object at 0x7f>")
    assert is_framework("contextlib.py(81): inner")
    assert is_framework("/usr/lib/python3/site-packages/torch/_ops.py(10): __call__")
    assert parse_frame("a/b.py(12): f") == ("a/b.py", 12, "f")
    assert stack_frame("torch/x.py(1): g;model.py(7): forward;run.py(2): main") == (
        "model.py(7): forward"
    )


def test_peak_bandwidth():
    assert peak_bandwidth("NVIDIA H200")[0] == 4.8
    assert peak_bandwidth("NVIDIA H100 80GB HBM3")[0] == 3.35
    assert peak_bandwidth("NVIDIA GH200 480GB")[0] == 4.0
    assert peak_bandwidth(None)[0] == 8.0


def _launch(name: str, start: float, dur: float = 1.0) -> Launch:
    return Launch(name, classify_kernel(name), start, start + dur, start)


def _step(counts: dict[str, int], layers: int) -> Step:
    """A step of ``layers`` layers, each launching every kernel its share of times, in order;
    what does not divide evenly (the first dense layers, sampling) comes last."""
    launches = []
    for _ in range(layers):
        for name, c in counts.items():
            launches += [_launch(name, 0)] * (c // layers)
    for name, c in counts.items():
        launches += [_launch(name, 0)] * (c % layers)
    return Step(0, "s", 0, 1, launches)


@pytest.mark.parametrize(
    ("counts", "layers"),
    [
        ({"rms_norm": 156, "nvjet_gemm": 78, "copy_kernel": 78, "add": 234, "argmax": 1}, 78),
        ({"rms_norm": 8, "matmul": 8, "flash_attn": 4, "index": 4}, 4),
        (
            {"mla_attn": 61, "rms_norm": 122, "q_gemm": 61, "o_gemm": 61, "fused_moe": 58,
             "dense_gemm": 3, "sample": 1},
            61,
        ),
    ],
)  # fmt: skip
def test_infer_layers(counts, layers):
    assert infer_layers([_step(counts, layers), _step(counts, layers)])[0] == layers


@pytest.mark.parametrize(
    "counts",
    [
        {"a": 1, "b": 1},  # nothing repeats
        {"vectorized_elementwise_kernel": 1001, "gemm": 2, "add": 3},  # one kernel in a loop
        {"gemm": 4, "add": 4, "mul": 4},  # repeats, but no other kind of work beside GEMMs
    ],
)
def test_no_layers_where_a_step_has_no_layer_structure(counts):
    steps = [_step(counts, 1), _step(counts, 1)]
    assert infer_layers(steps)[0] is None


def test_counts_that_divide_evenly_are_not_layers_without_a_repeating_sequence():
    # A training step: every kernel runs an even number of times, in no layer order.
    names = ["gemm_a", "gemm_b", "rms_norm", "add", "mul", "softmax", "flash_attn"]
    launches = [_launch(names[i % 7], 0) for i in range(7) for _ in range(2 * (i + 1))]
    steps = [Step(0, "s", 0, 1, launches)] * 2
    assert infer_layers(steps)[0] is None
    assert infer_layers([])[0] is None


def _decode_loop(steps: int, layers: int, step_gap: float, extra: bool) -> list[Launch]:
    launches, t = [], 0.0
    for _ in range(steps):
        for _ in range(layers):
            for name in ("norm", "gemm", "attn", "gemm2"):
                launches.append(_launch(name, t, 5.0))
                t += 6.0
        if extra:
            launches.append(_launch("sample", t, 2.0))
            t += 3.0
        t += step_gap
    return launches


def test_segment_by_anchor():
    seg = segment(_decode_loop(5, 6, 100.0, extra=True), [])
    assert seg.method == "repeating-structure"
    assert len(seg.steps) == 5
    assert {len(s.launches) for s in seg.steps} == {25}


def test_segment_layers_grouped_by_idle_gaps():
    """No once-per-step launch: the repeat is a layer; longer idle gaps group layers."""
    seg = segment(_decode_loop(4, 6, 500.0, extra=False), [])
    assert seg.method == "repeating-structure"
    assert len(seg.steps) == 4
    assert infer_layers(seg.steps)[0] == 6


def test_segment_whole_trace_when_nothing_repeats():
    launches = [_launch(f"k{i}", i * 10.0) for i in range(7)]
    seg = segment(launches, [])
    assert seg.method == "whole-trace" and len(seg.steps) == 1
    assert segment([], []).steps == []


def _group(shape: tuple[int, ...], calls_per_step: int, steps: int = 2):
    import math

    from fp8mla.doctor.casts import CastCall, CastGroup

    group = CastGroup(
        "aten::to", "aten::to", "b.py(1): f", "float8_e4m3fn", "bfloat16", True, False
    )
    for step in range(steps):
        for _ in range(calls_per_step):
            group.calls.append(CastCall(step, 0.0, 10.0, math.prod(shape), "shapes", None, shape))
    return group


def test_paged_pool_is_counted_in_tokens():
    from fp8mla.doctor.pool_evidence import classify

    group = _group((8000, 64, 576), 4)  # 512,000 tokens in 64-token pages
    common = dict(
        nsteps=2,
        layers=4,
        shapes=set(),
        context=None,
        attention_us_per_step=None,
        peak_tbps=None,
        peak_source=None,
    )
    ev = classify(group, active_tokens=3000, **common)
    assert ev.pool and ev.slots == 512_000
    assert classify(group, active_tokens=300_000, **common).pool is False
    # recorded shapes of the gathered pages compare rows with rows
    ev = classify(group, active_tokens=None, **{**common, "shapes": {(47, 64, 576)}})
    assert ev.pool and ev.active_tokens == 47 and ev.active_source == "recorded shapes"
    # a larger tensor of the same row shape: this cast is a gathered part of it
    assert not classify(group, active_tokens=None, **{**common, "shapes": {(80000, 64, 576)}}).pool
