"""Reading Hugging Face ``config.json`` files, and ``estimate()``'s input checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fp8mla.gap import estimate, load_model
from fp8mla.gap.presets import DEEPSEEK_V3, GLM_5


def _write(tmp_path: Path, cfg: dict[str, Any], name: str = "model") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "config.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return path


def test_config_file_matches_preset(tmp_path: Path) -> None:
    path = _write(tmp_path, DEEPSEEK_V3, "DeepSeek-V3")
    from_file = estimate(str(path), "h200", tp=8)
    preset = estimate("deepseek-v3", "h200", tp=8)
    assert from_file.model == "DeepSeek-V3"
    assert from_file.total_bytes == preset.total_bytes
    # a folder holding config.json works too
    assert estimate(str(path.parent), "h200", tp=8).total_bytes == preset.total_bytes


def test_small_deepseek_style_config(tmp_path: Path) -> None:
    cfg = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "kimi_k2",
        "vocab_size": 1000,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "n_shared_experts": 2,
        "n_routed_experts": 16,
        "num_experts_per_tok": 4,
        "first_k_dense_replace": 1,
        "q_lora_rank": None,  # DeepSeek-V2-Lite style: a full q_proj
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
    }
    spec = load_model(str(_write(tmp_path, cfg)))
    assert (spec.dense_layers, spec.moe_layers, spec.kv_width) == (1, 3, 40)
    r = estimate(
        str(_write(tmp_path, cfg, "b")),
        bandwidth_tbps=1.0,
        weights="bf16",
        tp=1,
        batch=1,
        context=10,
    )
    # attention per layer: q_proj 256·8·24, kv_a 256·40, kv_b 32·8·32, o 8·16·256, all bf16
    attention = 4 * (256 * 8 * 24 + 256 * 40 + 32 * 8 * 32 + 8 * 16 * 256) * 2
    norms = (4 * (2 * 256 + 32) + 256) * 2
    dense = 1 * 3 * 256 * 512 * 2
    experts = 3 * (4 + 2) * 3 * 256 * 64 * 2  # 3 MoE layers × (top-4 + 2 shared)
    router = 3 * 16 * 256 * 2
    lm_head = 1000 * 256 * 2
    assert r.weight_bytes == attention + norms + dense + experts + router + lm_head
    assert r.kv_bytes == 10 * 4 * 40
    assert r.total_bytes / 1e9 == pytest.approx(r.floor_ms)


def test_glm_style_keys_and_text_config(tmp_path: Path) -> None:
    cfg = {k: v for k, v in GLM_5.items() if k != "first_k_dense_replace"}
    cfg["mlp_layer_types"] = ["dense"] * 5 + ["sparse"] * 73
    cfg["num_local_experts"] = cfg.pop("n_routed_experts")
    wrapped = {"architectures": ["GlmMoeDsaForCausalLM"], "text_config": cfg}
    spec = load_model(str(_write(tmp_path, wrapped)))
    assert (spec.dense_layers, spec.moe_layers, spec.n_routed_experts) == (5, 73, 256)
    assert spec.has_dsa and spec.index_topk == 2048 and spec.indexer_layers == 78
    shared = dict(GLM_5, indexer_types=["full", "shared"] * 39)
    assert load_model(str(_write(tmp_path, shared, "s"))).indexer_layers == 39


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (
            {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
            "unsupported architecture",
        ),
        ({k: v for k, v in DEEPSEEK_V3.items() if k != "kv_lora_rank"}, "kv_lora_rank"),
        (dict(DEEPSEEK_V3, hidden_size="7168"), "hidden_size"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_configs(tmp_path: Path, cfg: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_model(str(_write(tmp_path, cfg)))


def test_unreadable_and_missing(tmp_path: Path) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="cannot read"):
        load_model(str(bad))
    with pytest.raises(ValueError, match="unknown model"):
        load_model(str(tmp_path / "nope.json"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weights": "int4"}, "weights"),
        ({"kv_dtype": "fp16"}, "kv_dtype"),
        ({"tp": 0}, "tp"),
        ({"tp": 3}, "expected a size that divides"),
        ({"batch": 0}, "batch"),
        ({"context": -1}, "context"),
        ({"bandwidth_tbps": 0.0}, "bandwidth"),
        ({"bandwidth_tbps": float("nan")}, "bandwidth"),
        ({"measured_tpot_ms": -5.0}, "measured"),
        ({"pool_slots": 0}, "pool_slots"),
        ({"gpu": "a100"}, "unknown GPU"),
        ({"gpu": None}, "bandwidth_tbps"),
    ],
)
def test_bad_inputs(kwargs: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {"gpu": "h200", **kwargs}
    gpu = args.pop("gpu")
    with pytest.raises(ValueError, match=message):
        estimate("glm-5", gpu, **args)


def test_measured_below_floor_and_context_zero() -> None:
    r = estimate("deepseek-v3", "H100", tp=8, context=0, measured_tpot_ms=0.5, pool_slots=10)
    assert r.kv_bytes == 0
    assert r.gap_ms is not None and r.gap_ms < 0
    assert r.cast_share_of_gap is None
    assert any("below the floor" in n for n in r.notes)
    json.dumps(r.to_dict())  # JSON-safe
