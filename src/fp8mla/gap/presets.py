"""Model presets, stored as the Hugging Face ``config.json`` fields they come from.

Each preset is parsed by :func:`fp8mla.gap.model_spec.spec_from_config`, the same code path a user's
``config.json`` takes, so a preset is exactly "that file, minus the fields we do not use".

DeepSeek-V3 (``deepseek-ai/DeepSeek-V3``, ``config.json``; DeepSeek-R1 shares it): every value
below is the published one. The checkpoint also carries one multi-token-prediction (MTP) module
(``num_nextn_predict_layers: 1``, stored as ``model.layers.61``); it is *excluded* from the decode
step, because plain decoding does not run it (speculative decoding with MTP would add it back).

GLM-5 (``zai-org/GLM-5``): the values are the defaults of Hugging Face transformers'
``GlmMoeDsaConfig``, whose docstring states they reproduce ``zai-org/GLM-5``, cross-checked against
NVIDIA NeMo-RL's GLM-MoE-DSA test config and a W8A8 checkpoint validator (78 layers,
``first_k_dense_replace`` 3, 256 routed + 1 shared experts, top-8) and the published totals
(744B parameters, 40B active: this preset counts 743.8B and 40.8B). Assumed rather than read from
the checkpoint's own ``config.json``: ``num_nextn_predict_layers: 1`` (transformers' GLM-5 model
drops ``model.layers.78.*`` on load, i.e. one MTP layer, excluded like DeepSeek-V3's) and
``tie_word_embeddings: false`` (the transformers default). GLM-5 uses DeepSeek Sparse Attention
(DSA): a per-layer indexer (32 heads × 128) picks ``index_topk`` 2048 tokens that MLA then reads.
"""

from __future__ import annotations

from typing import Any

DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "tie_word_embeddings": False,
}

GLM_5: dict[str, Any] = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "vocab_size": 154880,
    "hidden_size": 6144,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 78,
    "num_nextn_predict_layers": 1,  # assumed, see the module docstring
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "q_lora_rank": 2048,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "index_topk": 2048,
    "index_n_heads": 32,
    "index_head_dim": 128,
    "tie_word_embeddings": False,  # assumed, see the module docstring
}

# name -> (display name, config fields, where the values come from)
PRESETS: dict[str, tuple[str, dict[str, Any], str]] = {
    "deepseek-v3": (
        "DeepSeek-V3",
        DEEPSEEK_V3,
        "huggingface.co/deepseek-ai/DeepSeek-V3 config.json",
    ),
    "glm-5": (
        "GLM-5",
        GLM_5,
        "transformers GlmMoeDsaConfig defaults (= zai-org/GLM-5); MTP count and tied "
        "embeddings assumed",
    ),
}

ALIASES: dict[str, str] = {
    "deepseek-v3": "deepseek-v3",
    "deepseekv3": "deepseek-v3",
    "dsv3": "deepseek-v3",
    "deepseek-r1": "deepseek-v3",  # same architecture and config
    "glm-5": "glm-5",
    "glm5": "glm-5",
}
