"""``--attention-backend fp8mla`` on DeepSeek Sparse Attention (DSA) models: start-up rules and
the SGLang hooks that put fp8mla's DSA backend in place.

SGLang picks a DSA model's kernels with ``--dsa-prefill-backend`` / ``--dsa-decode-backend``
inside its own ``dsa`` backend; those choices are a fixed list with no extension point, so
fp8mla replaces the whole backend through ``register_attention_backend`` (the same name,
``fp8mla``, that serves dense MLA models). Three places of SGLang key on backend names or call
DeepGEMM directly, and are hooked through its official plugin APIs:

- ``calculate_mla_kv_cache_dim`` (pool layout): keys the 656-byte FP8 rows on the ``dsa_*``
  kernel names (``trtllm``, SM100's default, and the ROCm ones get raw 576-byte rows). Under
  fp8mla it answers 656 for an FP8 DSA pool (:func:`mla_kv_cache_dim`, ``HookRegistry`` AROUND);
- ``Indexer._get_topk_paged`` / ``_get_topk_ragged`` (the indexer's DeepGEMM logits and
  top-k): :mod:`.dsa_indexer`;
- the resolution step ``handle_other_validations`` (``register_resolution_hook``): runs the
  server-args checks, so what fp8mla cannot serve is refused before any process starts, in one
  line naming the option (:func:`check_dsa_server_args`; dense models: ``check_server_args``),
  and turns SGLang's default prefill CUDA graphs off for DSA models (:func:`eager_prefill`).

SGLang applies ``HookRegistry`` hooks once all plugins are loaded (``load_plugins``).
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import torch

from fp8mla.dsa.layout import NOPE_DIM, ROPE_DIM, TOKEN_BYTES
from fp8mla.integrations.common import IntegrationConfigError
from fp8mla.integrations.sglang import NAME, check_server_args

logger = logging.getLogger(__name__)

KV_DIM_TARGET = "sglang.srt.mem_cache.kv_cache_configurator.calculate_mla_kv_cache_dim"
INDEXER = "sglang.srt.layers.attention.dsa.dsa_indexer.Indexer"
VALIDATION_STEP = "handle_other_validations"

# SGLang's --kv-cache-dtype / --dtype spellings fp8mla serves on DSA models ("auto" resolves to
# fp8_e4m3 or bfloat16 in SGLang's DSA pass before the checks run)
_KV_CACHE_DTYPES = {"auto", "fp8_e4m3", "bfloat16", "bf16"}
_DTYPES = {"auto", "half", "float16", "bfloat16", "bf16", "fp16"}
PAGE_SIZE = 64


def _refuse(msg: str) -> None:
    raise IntegrationConfigError(f"fp8mla (sglang): {msg}")


def _backends(view: Any) -> tuple:
    """(prefill, decode) attention backends; the split flags fall back to the base one."""
    base = getattr(view, "attention_backend", None)
    prefill = getattr(view, "prefill_attention_backend", None) or base
    decode = getattr(view, "decode_attention_backend", None) or base
    return prefill, decode


def check_dsa_server_args(view: Any) -> dict:
    """SGLang server-args pass for a DSA model: refuse what fp8mla cannot serve there.

    Returns ``{}`` (it decides nothing); raises ``IntegrationConfigError`` with one line."""
    prefill, decode = _backends(view)
    if NAME not in (prefill, decode):
        return {}
    if (prefill, decode) != (NAME, NAME):
        _refuse(f"on a DeepSeek Sparse Attention model fp8mla serves prefill and decode "
                f"together; got --prefill-attention-backend {prefill} "
                f"--decode-attention-backend {decode} (use --attention-backend fp8mla)")  # fmt: skip
    kv = str(getattr(view, "kv_cache_dtype", "auto") or "auto")
    if kv not in _KV_CACHE_DTYPES:
        _refuse(f"--kv-cache-dtype {kv} is not supported for DeepSeek Sparse Attention; use "
                "fp8_e4m3 (the 656-byte cache) or bfloat16")  # fmt: skip
    dtype = str(getattr(view, "dtype", "auto") or "auto")
    if dtype not in _DTYPES:
        _refuse(f"--dtype {dtype} is not supported; use bfloat16 or float16")
    page = getattr(view, "page_size", None)
    if page is not None and int(page) != PAGE_SIZE:
        _refuse(f"--page-size {page} is not supported for DeepSeek Sparse Attention; use "
                f"{PAGE_SIZE}")  # fmt: skip
    if int(getattr(view, "dcp_size", 1) or 1) > 1:
        _refuse(f"--dcp-size {view.dcp_size} (decode context parallelism) is not supported")
    algo = getattr(view, "speculative_algorithm", None)
    if algo:
        _refuse(f"--speculative-algorithm {algo} is not supported for DeepSeek Sparse "
                "Attention (fp8mla runs no draft or verify indexer)")  # fmt: skip
    for flag, what in (
        ("enable_hisparse", "hierarchical sparse KV offload"),
        ("enable_prefill_cp", "prefill context parallelism"),
        ("enable_two_batch_overlap", "two-batch overlap"),
    ):
        if getattr(view, flag, False):
            _refuse(f"--{flag.replace('_', '-')} ({what}) is not supported for DeepSeek Sparse "
                    "Attention")  # fmt: skip
    asked = getattr(view, "cuda_graph_backend_prefill", None)
    if asked not in (None, "disabled"):
        _refuse(f"--cuda-graph-backend-prefill {asked} is not supported for DeepSeek Sparse "
                "Attention; fp8mla captures decode graphs only")  # fmt: skip
    return {}


def eager_prefill(server_args: Any) -> None:
    """Turn SGLang's default prefill CUDA graphs (breakable, on CUDA) off: fp8mla's DSA backend
    captures decode only. A declaration, as SGLang's own graph passes make for
    configurations they do not serve; decode graphs stay as they are."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    graphs = resolving_view(server_args).cuda_graph_config
    if graphs is None or graphs.prefill.backend == Backend.DISABLED:
        return
    logger.warning("fp8mla: prefill CUDA graphs are off for DeepSeek Sparse Attention "
                   "(decode graphs stay on)")  # fmt: skip
    declare_resolution(server_args, "fp8mla.eager_prefill",
                       cuda_graph_config=with_phase(graphs, Phase.PREFILL,
                                                    backend=Backend.DISABLED))  # fmt: skip


def mla_kv_cache_dim(original, *, model_config, kv_cache_dtype):
    """AROUND hook of SGLang's ``calculate_mla_kv_cache_dim``: the 656-byte ``fp8_ds_mla`` row
    for an FP8 DSA pool when fp8mla serves the model, whatever the ``dsa_*`` kernel names say;
    SGLang's answer otherwise."""
    from sglang.srt.configs.model_config import is_deepseek_dsa
    from sglang.srt.runtime_context import attention_backends

    if (
        kv_cache_dtype == torch.float8_e4m3fn
        and (model_config.kv_lora_rank, model_config.qk_rope_head_dim) == (NOPE_DIM, ROPE_DIM)
        and is_deepseek_dsa(model_config.hf_config)
        and NAME in attention_backends()
    ):
        return TOKEN_BYTES
    return original(model_config=model_config, kv_cache_dtype=kv_cache_dtype)


def indexer_without_deepgemm() -> None:
    """SGLang's ``Indexer`` imports DeepGEMM when it is built, for the SM count of its
    schedule. fp8mla's indexer needs no DeepGEMM; where it is not installed, set SGLang's own
    switch for that case (``SGLANG_FP8_PAGED_MQA_LOGITS_TORCH``: the count is read off the
    device). Its other effect, a PyTorch logits path, is SGLang's ``dsa`` backend's, unused."""
    from sglang.srt.environ import envs

    if importlib.util.find_spec("deep_gemm") is None:
        envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.set(True)
        logger.info("fp8mla: DeepGEMM is not installed; SGLang's DSA indexer reads the SM "
                    "count off the device (SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1)")  # fmt: skip


def validate_at_startup(server_args: Any, previous) -> None:
    """Resolution step ``handle_other_validations``, wrapped: SGLang's step, then fp8mla's
    server-args pass (the DSA one on a DSA model) when fp8mla serves a phase."""
    from sglang.srt.arg_groups.overrides import (
        model_config_of,
        resolved_view,
        run_post_process_pass,
    )
    from sglang.srt.configs.model_config import is_deepseek_dsa

    previous(server_args)
    if NAME not in _backends(resolved_view(server_args)):
        return
    dsa = is_deepseek_dsa(model_config_of(server_args).hf_config)
    run_post_process_pass(server_args, check_dsa_server_args if dsa else check_server_args)
    if dsa:
        eager_prefill(server_args)
        indexer_without_deepgemm()


_registered: list[str] = []  # targets already hooked in this process (register() runs again)


def register_dsa_hooks() -> None:
    """Register the hooks of the module docstring once per process."""
    if _registered:
        return
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from fp8mla.integrations.sglang.dsa_indexer import topk_paged, topk_ragged

    for target, hook in (
        (KV_DIM_TARGET, mla_kv_cache_dim),
        (f"{INDEXER}._get_topk_paged", topk_paged),
        (f"{INDEXER}._get_topk_ragged", topk_ragged),
    ):
        HookRegistry.register(target, hook, HookType.AROUND)
        _registered.append(target)
    register_resolution_hook(VALIDATION_STEP)(validate_at_startup)
    _registered.append(VALIDATION_STEP)


__all__ = ["check_dsa_server_args", "eager_prefill", "indexer_without_deepgemm",
           "mla_kv_cache_dim", "register_dsa_hooks", "validate_at_startup"]  # fmt: skip
