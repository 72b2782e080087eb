"""``estimate()``: the memory-bound floor of one decode step, and the gap to a measured TPOT.

floor_ms = (weight bytes + KV bytes per GPU) ÷ bandwidth. A decode step emits one token per
request, so the floor per step is the floor per output token (TPOT). With ``measured_tpot_ms`` the
report gives ``gap_ms = measured − floor`` and, with ``pool_slots``, the time a full-pool FP8→bf16
cast of every layer's pool would take (bytes read + written ÷ the floor's bandwidth: a lower bound
on the cast) and its share of the gap. Where the GPU preset has a measured cast rate (H200:
1.03 TB/s for ``pool.to(torch.bfloat16)``), the cast time at that rate is reported as well.
"""

from __future__ import annotations

import math

from fp8mla.gap.gpus import lookup_gpu
from fp8mla.gap.model_spec import load_model
from fp8mla.gap.report import GapReport
from fp8mla.gap.traffic import (
    KV_BYTES,
    WEIGHT_BYTES,
    cast_bytes,
    kv_bytes,
    kv_tokens_per_layer,
    pool_bytes,
    touched_experts,
    weight_breakdown,
)


def _positive_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer ≥ {minimum}, got {value!r}")
    return value


def _positive_float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}: expected a positive number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a positive number, got {value!r}")
    return float(value)


def _choice(name: str, value: str, options: dict[str, float]) -> str:
    if value not in options:
        raise ValueError(f"{name}: expected one of {', '.join(options)}, got {value!r}")
    return value


def estimate(
    model: str,
    gpu: str | None = None,
    *,
    bandwidth_tbps: float | None = None,
    weights: str = "fp8",
    kv_dtype: str = "fp8_e4m3",
    tp: int = 1,
    batch: int = 1,
    context: int = 4096,
    measured_tpot_ms: float | None = None,
    pool_slots: int | None = None,
    dense_attention: bool = False,
) -> GapReport:
    """Bytes a decode step moves per GPU, its floor time, and the gap to a measured TPOT.

    ``model``: a preset (``glm-5``, ``deepseek-v3``) or a path to a Hugging Face ``config.json``.
    ``gpu``: a preset (``h100``, ``h200``, ``b200``, ``rtx-pro-6000``); ``bandwidth_tbps``
    overrides its datasheet bandwidth (one of the two is required). ``dense_attention``: treat a
    DSA model (GLM-5) as reading the whole context, for engines that run it as plain MLA.
    Bad input raises ``ValueError``.
    """
    weights = _choice("weights", weights, WEIGHT_BYTES)
    kv_dtype = _choice("kv_dtype", kv_dtype, KV_BYTES)
    tp = _positive_int("tp", tp)
    batch = _positive_int("batch", batch)
    context = _positive_int("context", context, minimum=0)
    spec = load_model(model)
    if spec.num_attention_heads % tp:
        raise ValueError(
            f"tp: expected a size that divides {spec.name}'s {spec.num_attention_heads} "
            f"attention heads, got {tp}"
        )
    gpu_spec = lookup_gpu(gpu) if gpu is not None else None
    if bandwidth_tbps is not None:
        bandwidth = _positive_float("bandwidth_tbps", bandwidth_tbps)
        source = "given (--bandwidth)"
    elif gpu_spec is not None:
        bandwidth, source = gpu_spec.datasheet_tbps, f"{gpu_spec.name} datasheet"
    else:
        raise ValueError("give a GPU preset (gpu) or a bandwidth (bandwidth_tbps)")

    parts = weight_breakdown(spec, weights, tp, batch)
    latent, index = kv_bytes(spec, kv_dtype, batch, context, dense_attention)
    weight_total = sum(parts.values())
    total = weight_total + latent + index
    per_ms = bandwidth * 1e9  # bytes per millisecond
    tokens = kv_tokens_per_layer(spec, context, dense_attention)
    attention = "dense MLA"
    if spec.has_dsa:
        attention = "dense MLA (DSA ignored)" if dense_attention else f"DSA top-{spec.index_topk}"
    report = GapReport(
        model=spec.name,
        model_source=spec.source,
        gpu=gpu_spec.name if gpu_spec else None,
        bandwidth_tbps=bandwidth,
        bandwidth_source=source,
        weights=weights,
        kv_dtype=kv_dtype,
        tp=tp,
        batch=batch,
        context=context,
        num_layers=spec.num_layers,
        attention=attention,
        kv_tokens_per_layer=tokens,
        kv_values_per_token=spec.kv_width,
        routed_experts_per_layer=touched_experts(
            spec.n_routed_experts, spec.num_experts_per_tok, batch
        ),
        weight_breakdown=parts,
        weight_bytes=weight_total,
        kv_latent_bytes=latent,
        kv_index_bytes=index,
        kv_bytes=latent + index,
        total_bytes=total,
        floor_ms=total / per_ms,
    )
    resident = weight_breakdown(spec, weights, tp, batch, resident=True)
    report.resident_weight_bytes = sum(resident.values())
    if gpu_spec is not None:
        report.gpu_memory_bytes = gpu_spec.memory_gb * 1e9
        report.copy_tbps_measured = gpu_spec.copy_tbps_measured
        if gpu_spec.copy_tbps_measured:
            report.floor_ms_at_copy_rate = total / (gpu_spec.copy_tbps_measured * 1e9)
        report.cast_tbps_measured = gpu_spec.cast_tbps_measured
    if pool_slots is not None:
        report.pool_slots = _positive_int("pool_slots", pool_slots)
        report.pool_bytes = pool_bytes(spec, kv_dtype, pool_slots)
        report.cast_bytes = cast_bytes(spec, kv_dtype, pool_slots)
        report.cast_ms = report.cast_bytes / per_ms
        if report.cast_tbps_measured:
            report.cast_ms_at_measured_rate = report.cast_bytes / (report.cast_tbps_measured * 1e9)
    if measured_tpot_ms is not None:
        report.measured_ms = _positive_float("measured_tpot_ms", measured_tpot_ms)
        report.gap_ms = report.measured_ms - report.floor_ms
        if report.gap_ms > 0 and report.cast_ms is not None:
            report.cast_share_of_gap = report.cast_ms / report.gap_ms
            if report.cast_ms_at_measured_rate is not None:
                report.cast_share_at_measured_rate = report.cast_ms_at_measured_rate / report.gap_ms
    _annotate(report, spec.mtp_layers_excluded)
    return report


def _annotate(r: GapReport, mtp_layers: int) -> None:
    """Fill ``assumptions`` (the counting rules) and ``notes`` (warnings about this input)."""
    r.assumptions = [
        f"bandwidth {r.bandwidth_tbps:g} TB/s: {r.bandwidth_source}"
        + (
            "; datasheet peak, a device copy reaches less"
            if "datasheet" in r.bandwidth_source
            else ""
        ),
        f"weights {r.weights} ({WEIGHT_BYTES[r.weights]:.6g} B/weight) for decoder linear "
        "layers; norms, router, lm_head in bf16; embedding table not counted",
        f"TP {r.tp}: q_b/kv_b/o, MLPs, experts, lm_head split {r.tp} ways; q_a, kv_a, norms, "
        + ("router, DSA indexer" if r.weight_breakdown.get("indexer") else "router")
        + " replicated; no expert parallelism",
        f"MoE: shared experts + {r.routed_experts_per_layer:.2f} routed experts per layer "
        "(top-k at batch 1; expected distinct experts under uniform routing above)",
        f"KV: {r.batch} request(s) × {r.kv_tokens_per_layer} tokens × {r.num_layers} layers × "
        f"{r.kv_values_per_token} values × {KV_BYTES[r.kv_dtype]:g} B ({r.kv_dtype}, per-tensor scale); every TP "
        "rank reads the full latent KV",
        "floor = bytes ÷ bandwidth: memory-bound, perfect overlap, no launch or comms time",
    ]
    if r.attention.startswith("DSA"):
        r.assumptions.append(
            "DSA: MLA reads the indexer's top-k tokens; the indexer scans every token's fp8 key "
            "(+ fp32 scale); --dense-attention for engines that run plain MLA"
        )
    if mtp_layers:
        r.assumptions.append(f"{mtp_layers} MTP layer(s) excluded (no speculative decoding)")
    if r.cast_bytes is not None:
        r.assumptions.append(
            "cast = read the pool + write it as bf16, every layer, every step, at the floor's "
            "bandwidth (a lower bound on the cast's time)"
        )
    notes: list[str] = []
    if r.gpu_memory_bytes is not None:
        held = r.resident_weight_bytes + (r.pool_bytes or 0.0)
        if held > r.gpu_memory_bytes:
            notes.append(
                f"weights ({r.resident_weight_bytes / 1e9:.0f} GB/GPU)"
                + (f" + KV pool ({r.pool_bytes / 1e9:.0f} GB)" if r.pool_bytes else "")
                + f" exceed the {r.gpu}'s {r.gpu_memory_bytes / 1e9:.0f} GB: TP {r.tp} alone "
                "cannot hold the model (experts sharded over more GPUs, EP or DP-attention, "
                "are not modelled)"
            )
    if r.pool_slots is not None and r.pool_slots < r.batch * r.context:
        notes.append(f"pool_slots {r.pool_slots} < batch × context ({r.batch * r.context})")
    if r.kv_dtype == "bf16" and r.pool_slots is not None:
        notes.append("a bf16 pool needs no cast: cast bytes are 0")
    if r.gap_ms is not None and r.gap_ms <= 0:
        notes.append("measured TPOT is at or below the floor: check the bandwidth and precision")
    if r.measured_ms is not None and r.pool_slots is None:
        notes.append("pass pool_slots (--pool-slots) to size a full-pool cast against the gap")
    if r.cast_share_of_gap is not None and r.cast_share_of_gap > 1:
        notes.append("the cast alone takes longer than the gap: check the pool size")
    r.notes = notes
