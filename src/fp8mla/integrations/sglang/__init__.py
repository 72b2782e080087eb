"""fp8mla as an SGLang attention backend: ``--attention-backend fp8mla``.

SGLang loads the entry-point group ``sglang.srt.plugins`` in every process before it parses
arguments (``sglang.srt.plugins.load_plugins``). fp8mla declares :func:`register` there, so
with fp8mla installed next to SGLang the name ``fp8mla`` is a choice of
``--attention-backend``, ``--decode-attention-backend`` and ``--prefill-attention-backend``.
It serves dense MLA models (``backend.FP8MLAAttnBackend``) and DeepSeek Sparse Attention
models, DeepSeek-V3.2 and GLM-5 (``dsa_backend.FP8MLADSABackend``, in place of SGLang's ``dsa``
backend). :func:`register` only extends SGLang's own extension points:

- ``ATTENTION_BACKENDS`` (``register_attention_backend``): the factory;
- ``arg_groups.choices.add_attention_backend_choices``: the CLI choice;
- DeepSeek-family models: ``FORWARD_ABSORB_CORE_ATTENTION_BACKENDS`` (the backend receives
  ``q_nope``/``q_rope`` and the latent K separately) and ``AttentionBackendRegistry`` (every
  batch takes the absorbed MLA path; fp8mla has no MHA prefill);
- the resolution step ``handle_other_validations`` (``register_resolution_hook``), which runs
  the server-args pass that refuses what fp8mla cannot serve at start-up, in one line naming
  the option (:func:`check_server_args`; ``dsa_config.check_dsa_server_args`` on DSA models);
- DSA models: ``HookRegistry`` hooks on the pool layout and the indexer (``dsa_config``).
"""

from __future__ import annotations

from typing import Any

NAME = "fp8mla"

_OPTIONS = {
    "q_dtype": "--dtype",
    "kv_dtype": "--kv-cache-dtype",
    "page_size": "--page-size",
}
# SGLang's --kv-cache-dtype / --dtype spellings that fp8mla serves.
_KV_CACHE_DTYPES = {"auto", "fp8_e4m3", "fp8_e5m2", "bf16", "bfloat16", "fp16", "float16"}
_DTYPES = {"auto", "half", "float16", "bfloat16", "bf16", "fp16"}


def _uses_fp8mla(view: Any) -> bool:
    names = (
        getattr(view, "attention_backend", None),
        getattr(view, "prefill_attention_backend", None),
        getattr(view, "decode_attention_backend", None),
    )
    return NAME in names


def check_server_args(view: Any) -> dict:
    """SGLang server-args pass: refuse, before any process starts, what fp8mla cannot serve.

    Returns ``{}`` (it decides nothing); raises ``IntegrationConfigError`` with one line.
    """
    from fp8mla.integrations.common import IntegrationConfigError

    if not _uses_fp8mla(view):
        return {}

    def refuse(msg: str) -> None:
        raise IntegrationConfigError(f"fp8mla (sglang): {msg}")

    kv = str(getattr(view, "kv_cache_dtype", "auto") or "auto")
    if kv not in _KV_CACHE_DTYPES:
        refuse(f"--kv-cache-dtype {kv} is not supported; use fp8_e4m3, fp8_e5m2 or auto")
    dtype = str(getattr(view, "dtype", "auto") or "auto")
    if dtype not in _DTYPES:
        refuse(f"--dtype {dtype} is not supported; use bfloat16 or float16")
    page = getattr(view, "page_size", None)
    if page is not None and not 1 <= int(page) <= 128:
        refuse(f"--page-size {page} is not supported; use 1 to 128")
    if int(getattr(view, "dcp_size", 1) or 1) > 1:
        refuse(f"--dcp-size {view.dcp_size} (decode context parallelism) is not supported")
    if getattr(view, "speculative_algorithm", None):
        topk = getattr(view, "speculative_eagle_topk", None)
        if topk is not None and int(topk) > 1:
            refuse(f"--speculative-eagle-topk {topk} (tree drafts) is not supported; use 1")
        draft = getattr(view, "speculative_draft_attention_backend", None)
        if draft in (None, NAME):
            refuse(
                "speculative decoding needs --speculative-draft-attention-backend "
                "(flashinfer or triton) for the draft model; fp8mla runs the target's verify"
            )
    return {}


def create_backend(runner: Any):
    """``ATTENTION_BACKENDS["fp8mla"]``: the backend for one ``ModelRunner`` (the DSA one
    for DeepSeek Sparse Attention models)."""
    from sglang.srt.configs.model_config import is_deepseek_dsa

    from fp8mla.integrations.common import IntegrationConfigError

    if not getattr(runner, "use_mla_backend", False):
        raise IntegrationConfigError(
            "fp8mla (sglang): --attention-backend fp8mla serves MLA models only "
            "(DeepSeek-V2/V3, Kimi-K2, GLM-5); choose another backend for this model"
        )
    if is_deepseek_dsa(runner.model_config.hf_config):
        from fp8mla.integrations.sglang.dsa_backend import FP8MLADSABackend

        return FP8MLADSABackend(runner)
    from fp8mla.integrations.sglang.backend import FP8MLAAttnBackend

    return FP8MLAAttnBackend(runner)


def _absorbed_mla(attn: Any, forward_batch: Any):
    """DeepSeek-family dispatch: every batch (prefill too) takes the absorbed MLA path."""
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import (
        AttnForwardMethod,
    )

    return AttnForwardMethod.MLA


def register() -> None:
    """Entry point of group ``sglang.srt.plugins``; idempotent."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.arg_groups.overrides import POST_PROCESS_PASSES, register_post_process
    from sglang.srt.layers.attention.attention_registry import (
        ATTENTION_BACKENDS,
        register_attention_backend,
    )
    from sglang.srt.models.deepseek_common.attention_backend_handler import (
        AttentionBackendRegistry,
    )
    from sglang.srt.models.deepseek_common.utils import FORWARD_ABSORB_CORE_ATTENTION_BACKENDS

    if NAME not in ATTENTION_BACKENDS:
        register_attention_backend(NAME)(create_backend)
    if NAME not in choices.ATTENTION_BACKEND_CHOICES:
        choices.add_attention_backend_choices([NAME])
    if NAME not in FORWARD_ABSORB_CORE_ATTENTION_BACKENDS:
        FORWARD_ABSORB_CORE_ATTENTION_BACKENDS.append(NAME)
    AttentionBackendRegistry.register(NAME, _absorbed_mla)
    # SGLang 0.5.23 keeps this registry but its resolution pipeline does not iterate it; the
    # resolution hook of dsa_config.register_dsa_hooks runs the pass at start-up
    if check_server_args not in POST_PROCESS_PASSES:
        register_post_process(check_server_args)
    from fp8mla.integrations.sglang.dsa_config import register_dsa_hooks

    register_dsa_hooks()


__all__ = ["NAME", "check_server_args", "create_backend", "register"]
