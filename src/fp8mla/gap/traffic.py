"""Bytes one decode step moves through one GPU's memory: weights, KV cache, and a full-pool cast.

Counting rules (each is printed by ``fp8mla gap`` so a reader can disagree with it):

* ``--weights`` precision applies to every linear layer inside the decoder blocks (attention
  projections, DSA indexer ``wq_b``/``wk``, dense MLP, routed and shared experts). Norms, the MoE
  router, the indexer's ``weights_proj`` and ``lm_head`` stay bf16, as in the published FP8
  checkpoints. Bytes per weight: bf16 2; fp8 1 + 4/(128·128) (one fp32 scale per 128×128 block);
  nvfp4 0.5 + 1/16 (4 bits plus one fp8 scale per 16 values = 4.5 bits).
* Tensor parallelism (attention-TP, experts sharded, no expert parallelism): ``q_b``/``kv_b``/``o``,
  MLPs, experts and ``lm_head`` are split ``tp`` ways; the low-rank down projections
  (``q_a``, ``kv_a``), norms, router and DSA indexer are replicated on every rank.
* MoE: a step reads the shared experts and every routed expert any request picked. Under uniform
  routing a layer touches ``E·(1 − (1 − k/E)^batch)`` of its ``E`` experts (exactly ``k`` at batch 1).
* The embedding table is not counted (a step reads ``batch`` rows of it); ``lm_head`` is.
* KV: every rank reads the whole latent KV (``kv_lora_rank + qk_rope_head_dim`` = 576 values per
  token per layer) of each of its requests; fp8 pools are per-tensor scaled (no per-token scales).
  With DSA, MLA reads ``min(context, index_topk)`` tokens and the indexer scans all ``context``
  index keys (``index_head_dim`` fp8 bytes + one fp32 scale per 128, as in DeepSeek-V3.2).
* Cast: a full-pool cast reads the pool and writes it as bf16: ``pool_slots × 576 × (b + 2)``
  bytes per layer, ``b`` the pool's bytes per value (copy convention: read + write).
"""

from __future__ import annotations

import math

from fp8mla.gap.model_spec import ModelSpec

BF16 = 2.0
WEIGHT_BYTES: dict[str, float] = {
    "bf16": 2.0,
    "fp8": 1.0 + 4.0 / (128 * 128),
    "nvfp4": 0.5 + 1.0 / 16,
}
KV_BYTES: dict[str, float] = {"bf16": 2.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0}


def touched_experts(n_routed: int, top_k: int, batch: int) -> float:
    """Expected distinct routed experts a layer reads for ``batch`` tokens, uniform routing."""
    if n_routed == 0 or top_k == 0 or batch == 0:
        return 0.0
    if batch == 1:
        return float(top_k)
    return n_routed * (1.0 - (1.0 - top_k / n_routed) ** batch)


def weight_breakdown(
    spec: ModelSpec, weights: str, tp: int, batch: int, *, resident: bool = False
) -> dict[str, float]:
    """Weight bytes per GPU by component for one decode step.

    With ``resident=True``: the bytes each GPU *holds* instead (every expert, plus the embedding).
    """
    w = WEIGHT_BYTES[weights]
    h = spec.hidden_size
    heads = spec.num_attention_heads
    qk_head = spec.qk_nope_head_dim + spec.qk_rope_head_dim
    if spec.q_lora_rank:
        q_sharded = spec.q_lora_rank * heads * qk_head  # q_b_proj
        q_replicated = h * spec.q_lora_rank  # q_a_proj
    else:
        q_sharded, q_replicated = h * heads * qk_head, 0  # q_proj
    kv_a = h * spec.kv_width  # kv_a_proj_with_mqa
    kv_b = spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim)
    o_proj = heads * spec.v_head_dim * h
    attention = spec.num_layers * ((q_sharded + kv_b + o_proj) * w / tp + (q_replicated + kv_a) * w)
    norms_per_layer = 2 * h + (spec.q_lora_rank or 0) + spec.kv_lora_rank
    norms = (spec.num_layers * norms_per_layer + h) * BF16

    indexer = 0.0
    if spec.has_dsa:
        q_in = spec.q_lora_rank or h
        quantized = q_in * spec.index_n_heads * spec.index_head_dim + h * spec.index_head_dim
        kept_bf16 = h * spec.index_n_heads + 2 * spec.index_head_dim  # weights_proj, k_norm
        indexer = spec.indexer_layers * (quantized * w + kept_bf16 * BF16)

    expert = 3 * h * spec.moe_intermediate_size  # gate, up, down
    if resident:
        routed_count = float(spec.n_routed_experts)
    else:
        routed_count = touched_experts(spec.n_routed_experts, spec.num_experts_per_tok, batch)
    parts = {
        "attention": attention,
        "indexer": indexer,
        "dense_mlp": spec.dense_layers * 3 * h * spec.intermediate_size * w / tp,
        "routed_experts": spec.moe_layers * routed_count * expert * w / tp,
        "shared_experts": spec.moe_layers * spec.n_shared_experts * expert * w / tp,
        "router": spec.moe_layers * spec.n_routed_experts * h * BF16,
        "norms": norms,
        "lm_head": spec.vocab_size * h * BF16 / tp,
    }
    if resident:
        parts["embedding"] = spec.vocab_size * h * BF16 / tp
    return parts


def kv_tokens_per_layer(spec: ModelSpec, context: int, dense_attention: bool) -> int:
    """Tokens of latent KV one request's attention reads per layer."""
    if spec.has_dsa and not dense_attention:
        return min(context, spec.index_topk or context)
    return context


def kv_bytes(
    spec: ModelSpec, kv_dtype: str, batch: int, context: int, dense_attention: bool
) -> tuple[float, float]:
    """(latent KV bytes, DSA index-key bytes) one GPU reads in one decode step."""
    tokens = kv_tokens_per_layer(spec, context, dense_attention)
    latent = batch * tokens * spec.num_layers * spec.kv_width * KV_BYTES[kv_dtype]
    index = 0.0
    if spec.has_dsa and not dense_attention:
        per_token = spec.index_head_dim + 4 * math.ceil(spec.index_head_dim / 128)
        index = float(batch * context * spec.indexer_layers * per_token)
    return latent, index


def cast_bytes(spec: ModelSpec, kv_dtype: str, pool_slots: int) -> float:
    """Bytes read + written by casting every layer's whole pool to bf16 (0 for a bf16 pool)."""
    if kv_dtype == "bf16":
        return 0.0
    per_value = KV_BYTES[kv_dtype] + BF16
    return pool_slots * spec.num_layers * spec.kv_width * per_value


def pool_bytes(spec: ModelSpec, kv_dtype: str, pool_slots: int) -> float:
    """Bytes the KV pool itself occupies on each GPU (all layers)."""
    return pool_slots * spec.num_layers * spec.kv_width * KV_BYTES[kv_dtype]
