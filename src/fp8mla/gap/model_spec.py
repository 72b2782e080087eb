"""MLA model shapes: presets and Hugging Face ``config.json`` files, read into one dataclass.

Understood architectures (by ``architectures[0]`` or ``model_type``): DeepSeek-V2/V3/V3.2
(``deepseek_v2``, ``deepseek_v3``, ``deepseek_v32``; Kimi-K2 ships ``DeepseekV3ForCausalLM`` with
``model_type: kimi_k2``) and GLM-5 (``glm_moe_dsa``). A multimodal config whose language model sits
under ``text_config`` is unwrapped first. Anything else raises ``ValueError``.

Key spellings handled: DeepSeek's ``first_k_dense_replace`` + ``moe_layer_freq`` and GLM's
``mlp_layer_types`` (``"dense"`` / ``"sparse"`` per layer); ``num_local_experts`` as an alias of
``n_routed_experts``; DSA indexers from ``index_topk`` / ``index_n_heads`` / ``index_head_dim``,
with ``indexer_types`` (``"full"`` layers own an indexer) where present.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp8mla._files import InputError, read_input
from fp8mla.gap.presets import ALIASES, PRESETS

SUPPORTED_ARCHITECTURES = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "GlmMoeDsaForCausalLM",
)
SUPPORTED_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2", "glm_moe_dsa")


@dataclass(frozen=True)
class ModelSpec:
    """The shapes a decode step's byte count needs. Layer counts exclude MTP layers."""

    name: str
    source: str
    hidden_size: int
    num_layers: int
    dense_layers: int
    moe_layers: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    vocab_size: int
    mtp_layers_excluded: int = 0
    index_topk: int | None = None
    index_n_heads: int = 0
    index_head_dim: int = 0
    indexer_layers: int = 0

    @property
    def kv_width(self) -> int:
        """Values per token per layer in the latent KV cache (512 + 64 = 576 for these models)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def has_dsa(self) -> bool:
        """True when attention is DeepSeek Sparse Attention (an indexer picks top-k tokens)."""
        return bool(self.index_topk) and self.indexer_layers > 0


_MAX_VALUE = 1 << 31  # no shape of a model this size or larger
_MAX_LAYERS = 4096


def _int(cfg: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise ValueError(f"config.json has no {key!r} (is this an MLA model?)")
    high = _MAX_LAYERS if key == "num_hidden_layers" else _MAX_VALUE
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise ValueError(
            f"config.json {key!r}: expected an integer in 0–{high:,}, got {value!r:.40}"
        )
    return value


def _layer_kinds(cfg: Mapping[str, Any], num_layers: int, n_routed: int) -> tuple[int, int]:
    """(dense layers, MoE layers) among the ``num_layers`` main decoder layers."""
    types = cfg.get("mlp_layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) < num_layers:
            raise ValueError(
                f"config.json 'mlp_layer_types': expected a list of {num_layers} entries, "
                f"got {types!r}"
            )
        moe = sum(1 for t in types[:num_layers] if t == "sparse")
        return num_layers - moe, moe
    if n_routed == 0:
        return num_layers, 0
    first_dense = _int(cfg, "first_k_dense_replace", 0)
    freq = _int(cfg, "moe_layer_freq", 1) or 1
    moe = sum(1 for i in range(num_layers) if i >= first_dense and i % freq == 0)
    return num_layers - moe, moe


def spec_from_config(cfg: Mapping[str, Any], name: str, source: str) -> ModelSpec:
    """Read a Hugging Face ``config.json`` mapping; ``ValueError`` for unknown architectures."""
    if isinstance(cfg.get("text_config"), Mapping):
        cfg = {**cfg["text_config"], "architectures": cfg.get("architectures")}
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    model_type = cfg.get("model_type")
    if arch not in SUPPORTED_ARCHITECTURES and model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported architecture {arch!r} (model_type {model_type!r}); fp8mla gap knows "
            f"MLA models: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    num_layers = _int(cfg, "num_hidden_layers")
    n_routed = _int(cfg, "n_routed_experts", cfg.get("num_local_experts", 0) or 0)
    dense, moe = _layer_kinds(cfg, num_layers, n_routed)
    q_lora = cfg.get("q_lora_rank")
    index_topk = cfg.get("index_topk") or None
    indexer_layers = 0
    if index_topk:
        types = cfg.get("indexer_types")
        if isinstance(types, list) and types:
            indexer_layers = sum(1 for t in types[:num_layers] if t == "full")
        else:
            indexer_layers = num_layers
    return ModelSpec(
        name=name,
        source=source,
        hidden_size=_int(cfg, "hidden_size"),
        num_layers=num_layers,
        dense_layers=dense,
        moe_layers=moe,
        intermediate_size=_int(cfg, "intermediate_size") if dense else 0,
        moe_intermediate_size=_int(cfg, "moe_intermediate_size") if moe else 0,
        n_routed_experts=n_routed,
        num_experts_per_tok=_int(cfg, "num_experts_per_tok") if moe else 0,
        n_shared_experts=_int(cfg, "n_shared_experts", 0) if moe else 0,
        num_attention_heads=_int(cfg, "num_attention_heads"),
        q_lora_rank=None if q_lora is None else _int(cfg, "q_lora_rank"),
        kv_lora_rank=_int(cfg, "kv_lora_rank"),
        qk_nope_head_dim=_int(cfg, "qk_nope_head_dim"),
        qk_rope_head_dim=_int(cfg, "qk_rope_head_dim"),
        v_head_dim=_int(cfg, "v_head_dim"),
        vocab_size=_int(cfg, "vocab_size"),
        mtp_layers_excluded=_int(cfg, "num_nextn_predict_layers", 0),
        index_topk=None if not index_topk else _int(cfg, "index_topk"),
        index_n_heads=_int(cfg, "index_n_heads", 0) if index_topk else 0,
        index_head_dim=_int(cfg, "index_head_dim", 0) if index_topk else 0,
        indexer_layers=indexer_layers,
    )


def load_model(model: str) -> ModelSpec:
    """A preset name (``glm-5``, ``deepseek-v3``, ...) or a path to ``config.json`` (or its
    folder)."""
    key = ALIASES.get(model.strip().lower())
    if key is not None:
        display, cfg, source = PRESETS[key]
        return spec_from_config(cfg, display, f"preset {key}: {source}")
    path = Path(model)
    if model and path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"{model}: a directory without a config.json")
        path = path / "config.json"
    elif not model or not os.path.lexists(path):
        raise ValueError(
            f"unknown model {model!r}: not a preset ({', '.join(sorted(PRESETS))}) and no such file"
        )
    try:
        text = read_input(path).decode("utf-8")
        cfg = json.loads(text)
    except InputError as exc:
        raise ValueError(f"{path}: {exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
    name = path.parent.name or str(path)
    return spec_from_config(cfg, name, str(path))
