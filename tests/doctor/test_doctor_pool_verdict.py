"""Whole-pool verdicts from the trace's own evidence, and fix text that follows the pool."""

from __future__ import annotations

import pytest

from fp8mla.doctor import diagnose, format_text
from fp8mla.doctor.synth import SynthSpec, write_trace

# An engine's decode step replayed from a CUDA graph: no shapes, no Python frames, no markers.
ENGINE = dict(cuda_graph=True, shapes=False, stacks=False, markers=False, steps=3)


def _report(tmp_path, **spec):
    path = write_trace(str(tmp_path / "t.json.gz"), SynthSpec(**spec))
    return diagnose(path)


def _casts(report):
    return [f for f in report["findings"] if f["kind"] in ("pool_proportional_cast", "dtype_cast")]


def test_graph_replay_is_judged_whole_pool_without_hints(tmp_path):
    # 131,072 slots × 576 = 75.5 M values per call, 61 layers, 20 µs of attention per layer:
    # even at the H200's peak, one layer's attention could read 48 M bf16 values.
    report = _report(tmp_path, layers=61, pool_slots=131_072, attention_us=20.0, **ENGINE)
    (cast,) = _casts(report)
    assert cast["kind"] == "pool_proportional_cast"
    assert cast["elements_per_call"] == 131_072 * 576 and cast["src_dtype"] is None
    assert any("never reads" in e for e in cast["evidence"])
    assert any("11.3× the attention time" in e for e in cast["evidence"])
    assert cast["pool_slots"] == 131_072 and cast["active_tokens"] is None


def test_without_enough_evidence_the_finding_says_what_would_decide(tmp_path):
    spec = dict(layers=61, pool_slots=131_072, attention_us=60.0, **ENGINE)
    report = _report(tmp_path, **spec)
    (cast,) = _casts(report)
    assert cast["kind"] == "dtype_cast"
    assert cast["title"].endswith("possibly the whole KV pool")
    decide = [e for e in cast["evidence"] if e.startswith("to decide: ")]
    assert len(decide) == 3
    assert "fewer than 32,768 tokens" in decide[0]  # a quarter of the pool's 131,072 tokens
    assert cast["suggestion"].startswith("If it converts the whole pool: ")
    # ... and the hint it names decides it.
    path = write_trace(str(tmp_path / "u.json.gz"), SynthSpec(**spec))
    (cast,) = _casts(diagnose(path, active_tokens=4096))
    assert cast["kind"] == "pool_proportional_cast" and cast["active_tokens"] == 4096
    (cast,) = _casts(diagnose(path, active_tokens=100_000))
    assert cast["kind"] == "dtype_cast" and "not of the pool" in cast["evidence"][-1]


def test_no_attention_kernels_leaves_the_verdict_open():
    # Without shapes and without attention kernels to bound the reads, nothing decides.
    from fp8mla.doctor.casts import CastCall, CastGroup
    from fp8mla.doctor.pool_evidence import classify

    group = CastGroup("k", None, None, None, "bfloat16", True, True)
    for step in range(3):
        for _ in range(8):
            group.calls.append(CastCall(step, 0.0, 100.0, 75_497_472, "grid", None, None))
    ev = classify(
        group,
        nsteps=3,
        layers=8,
        shapes=set(),
        active_tokens=None,
        context=None,
        attention_us_per_step=0.0,
        peak_tbps=4.8,
        peak_source="the H200's 4.8 TB/s peak",
    )
    assert not ev.pool and ev.open and ev.decide


@pytest.mark.parametrize("kv_dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fix_names_the_pools_own_dtype(tmp_path, kv_dtype):
    (cast,) = _casts(_report(tmp_path, layers=4, kv_dtype=kv_dtype))
    assert cast["kind"] == "pool_proportional_cast" and cast["src_dtype"] == kv_dtype
    other = {"float8_e4m3fn": "float8_e5m2", "float8_e5m2": "float8_e4m3fn"}[kv_dtype]
    assert f"kv_data_type=torch.{kv_dtype}" in cast["suggestion"]
    assert other not in cast["suggestion"]
    assert "fp8mla.BatchMLAPagedAttentionWrapper" in cast["suggestion"]


def test_fix_for_separate_k_and_v_pools_is_not_the_mla_wrapper(tmp_path):
    (cast,) = _casts(_report(tmp_path, layers=4, layout="mha", pool_slots=200_000))
    assert cast["kind"] == "pool_proportional_cast"
    assert cast["title"] == "Whole-pool float8_e4m3fn→bfloat16 cast (K and V) every layer"
    assert cast["shape"] == [200_000, 8, 128] and cast["pool_slots"] == 200_000
    fix = cast["suggestion"]
    assert fix.startswith("Read the float8_e4m3fn K and V pools inside the attention kernel")
    assert "BatchDecodeWithPagedKVCacheWrapper" in fix and "kv_data_type=torch.float8_e4m3fn" in fix
    assert "cannot take separate K and V" in fix
    assert "k_pool[kv_indices]" in fix and "v_pool[kv_indices]" in fix


def test_without_shapes_the_fix_says_what_the_trace_does_not_record(tmp_path):
    report = _report(tmp_path, layers=61, pool_slots=131_072, attention_us=20.0, **ENGINE)
    (cast,) = _casts(report)
    assert (
        "torch.float8_e4m3fn or torch.float8_e5m2: the trace does not record it"
        in (cast["suggestion"])
    )
    assert "MLA latent pools only" in cast["suggestion"]
    text = format_text(report)
    assert "? → bfloat16 (source dtype unknown: the trace has no shapes" in text
