"""``fp8mla gap`` against hand-computed numbers for both presets.

Every expected value is written out from the published config values, independently of the
implementation's code paths. Units: bytes, ms; 1 TB/s = 1e12 B/s, so ms = bytes / (TB/s · 1e9).
"""

from __future__ import annotations

import pytest

from fp8mla.gap import estimate

FP8 = 1 + 4 / (128 * 128)  # one fp32 scale per 128×128 block
NVFP4 = 0.5 + 1 / 16  # 4 bits + one fp8 scale per 16 values
REL = 1e-9


def test_deepseek_v3_fp8_tp8_batch1_ctx4096_h200() -> None:
    tp = 8
    # attention, per layer: q_b 1536·128·(128+64), kv_b 512·128·(128+128), o 128·128·7168 split 8
    # ways; q_a 7168·1536 and kv_a 7168·(512+64) replicated
    attention = 61 * (
        (1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7168) * FP8 / tp
        + (7168 * 1536 + 7168 * 576) * FP8
    )
    assert attention == pytest.approx(2_235_257_648, rel=REL)
    norms = (61 * (2 * 7168 + 1536 + 512) + 7168) * 2  # bf16, replicated
    dense = 3 * (3 * 7168 * 18432) * FP8 / tp  # first_k_dense_replace = 3
    routed = 58 * 8 * (3 * 7168 * 2048) * FP8 / tp  # 58 MoE layers, top-8
    shared = 58 * 1 * (3 * 7168 * 2048) * FP8 / tp
    router = 58 * 256 * 7168 * 2  # bf16, replicated
    lm_head = 129280 * 7168 * 2 / tp  # bf16, vocab-parallel
    weights = attention + norms + dense + routed + shared + router + lm_head
    kv = 1 * 4096 * 61 * 576 * 1  # batch × context × layers × 576 values × 1 B
    total = weights + kv
    assert weights == pytest.approx(5_704_797_552, rel=REL)
    assert kv == 143_917_056
    assert total / (4.8 * 1e9) == pytest.approx(1.218482, rel=1e-6)

    r = estimate(
        "deepseek-v3", "h200", weights="fp8", kv_dtype="fp8_e4m3", tp=8, batch=1, context=4096
    )
    assert r.weight_bytes == pytest.approx(weights, rel=REL)
    assert r.weight_breakdown["routed_experts"] == pytest.approx(routed, rel=REL)
    assert r.weight_breakdown["lm_head"] == pytest.approx(lm_head, rel=REL)
    assert r.kv_bytes == kv and r.kv_index_bytes == 0
    assert r.total_bytes == pytest.approx(total, rel=REL)
    assert r.bandwidth_tbps == 4.8
    assert r.floor_ms == pytest.approx(total / 4.8e9, rel=REL)
    assert r.floor_ms_at_copy_rate == pytest.approx(total / 4.27e9, rel=REL)
    assert r.measured_ms is None and r.gap_ms is None and r.cast_ms is None


def test_glm5_fp8_tp2_h200_gap_and_cast_share() -> None:
    tp = 2
    attention = 78 * (
        (2048 * 64 * 256 + 512 * 64 * (192 + 256) + 64 * 256 * 6144) * FP8 / tp
        + (6144 * 2048 + 6144 * 576) * FP8
    )
    # DSA indexer, replicated: wq_b 2048·32·128 and wk 6144·128 quantized, weights_proj 6144·32
    # and k_norm 2·128 in bf16
    indexer = 78 * ((2048 * 32 * 128 + 6144 * 128) * FP8 + (6144 * 32 + 2 * 128) * 2)
    norms = (78 * (2 * 6144 + 2048 + 512) + 6144) * 2
    dense = 3 * (3 * 6144 * 12288) * FP8 / tp
    routed = 75 * 8 * (3 * 6144 * 2048) * FP8 / tp
    shared = 75 * 1 * (3 * 6144 * 2048) * FP8 / tp
    router = 75 * 256 * 6144 * 2
    lm_head = 154880 * 6144 * 2 / tp
    weights = attention + indexer + norms + dense + routed + shared + router + lm_head
    latent = 1 * 2048 * 78 * 576  # DSA: MLA reads index_topk = 2048 of the 4096 tokens
    index_keys = 1 * 4096 * 78 * (128 + 4)  # indexer scans every token: 128 fp8 + fp32 scale
    total = weights + latent + index_keys
    floor = total / 4.8e9
    assert weights == pytest.approx(22_085_753_280, rel=REL)
    assert floor == pytest.approx(4.629154, rel=1e-6)

    cast = 495552 * 78 * 576 * (1 + 2)  # read fp8 + write bf16, every layer
    assert cast == 66_792_480_768
    cast_ms = cast / 4.8e9  # 13.915 ms
    gap = 93.6 - floor  # 88.971 ms
    assert cast_ms / gap == pytest.approx(0.156401, rel=1e-5)
    cast_ms_measured_rate = cast / 1.03e9  # H200 pool.to(bf16) measured 1.03 TB/s: 64.85 ms
    assert cast_ms_measured_rate / 78 == pytest.approx(0.8287, rel=5e-3)  # 828.7 µs per layer

    r = estimate("glm-5", "h200", tp=2, measured_tpot_ms=93.6, pool_slots=495552)
    assert r.attention == "DSA top-2048"
    assert r.weight_breakdown["attention"] == pytest.approx(attention, rel=REL)
    assert r.weight_breakdown["indexer"] == pytest.approx(indexer, rel=REL)
    assert r.weight_bytes == pytest.approx(weights, rel=REL)
    assert r.kv_latent_bytes == latent and r.kv_index_bytes == index_keys
    assert r.floor_ms == pytest.approx(floor, rel=REL)
    assert r.measured_ms == 93.6
    assert r.gap_ms == pytest.approx(gap, rel=REL)
    assert r.cast_bytes == cast
    assert r.cast_ms == pytest.approx(cast_ms, rel=REL)
    assert r.cast_share_of_gap == pytest.approx(cast_ms / gap, rel=REL)
    assert r.cast_ms_at_measured_rate == pytest.approx(cast_ms_measured_rate, rel=REL)
    assert r.cast_share_at_measured_rate == pytest.approx(cast_ms_measured_rate / gap, rel=REL)
    assert any("cannot hold" in n for n in r.notes)  # 744B at fp8 over 2 GPUs > 141 GB


def test_glm5_dense_attention_reads_the_whole_context() -> None:
    r = estimate("glm-5", "h200", tp=2, dense_attention=True)
    assert r.kv_latent_bytes == 4096 * 78 * 576
    assert r.kv_index_bytes == 0
    assert r.attention.startswith("dense")


def test_published_parameter_totals() -> None:
    # bf16, TP 1: bytes / 2 = parameters. Resident = all experts + embedding; active = a batch-1
    # step. Published: DeepSeek-V3 671B total, 36.6B active (incl. the 0.9B output head, excl.
    # the embedding); GLM-5 744B total, "40B" active.
    ds = estimate("deepseek-v3", bandwidth_tbps=1.0, weights="bf16")
    assert ds.resident_weight_bytes / 2 == pytest.approx(671e9, rel=1e-3)
    assert ds.weight_bytes / 2 == pytest.approx(36.6e9, rel=2e-3)
    glm = estimate("glm-5", bandwidth_tbps=1.0, weights="bf16")
    assert glm.resident_weight_bytes / 2 == pytest.approx(744e9, rel=1e-3)
    assert glm.weight_bytes / 2 == pytest.approx(40e9, rel=0.03)


def test_batch_touches_more_experts_and_nvfp4_bytes() -> None:
    r = estimate("deepseek-v3", "b200", weights="nvfp4", tp=8, batch=2, context=1024)
    # two tokens, top-8 of 256 each, uniform routing: 256·(1 − (1 − 8/256)²) = 16 − 64/256
    assert r.routed_experts_per_layer == pytest.approx(15.75, rel=REL)
    assert r.weight_breakdown["routed_experts"] == pytest.approx(
        58 * 15.75 * (3 * 7168 * 2048) * NVFP4 / 8, rel=REL
    )
    assert r.kv_bytes == 2 * 1024 * 61 * 576
    assert r.floor_ms == pytest.approx(r.total_bytes / 8.0e9, rel=REL)


def test_bf16_kv_and_bandwidth_override() -> None:
    r = estimate(
        "deepseek-v3",
        "h200",
        bandwidth_tbps=4.27,
        kv_dtype="bf16",
        tp=8,
        measured_tpot_ms=20.0,
        pool_slots=100_000,
    )
    assert r.bandwidth_tbps == 4.27 and "given" in r.bandwidth_source
    assert r.kv_bytes == 4096 * 61 * 576 * 2
    assert r.floor_ms == pytest.approx(r.total_bytes / 4.27e9, rel=REL)
    assert r.cast_bytes == 0 and r.cast_share_of_gap == 0
    assert any("bf16 pool needs no cast" in n for n in r.notes)
