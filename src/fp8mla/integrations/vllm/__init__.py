"""fp8mla as a vLLM MLA attention backend: ``--attention-backend FP8MLA``.

vLLM loads the entry-point group ``vllm.general_plugins`` in every process (API server,
engine core, workers) before it selects attention backends. fp8mla declares
:func:`register` there; it adds the name ``FP8MLA`` to vLLM's backend registry
(``register_backend``) and replaces nothing. The backend class declares its capabilities
(dtypes, KV-cache dtypes, block sizes, compute capabilities, head size), so vLLM's selector
refuses an unsupported configuration at start-up with the reason.
"""

from __future__ import annotations

NAME = "FP8MLA"
CLASS_PATH = "fp8mla.integrations.vllm.backend.FP8MLABackend"


def register() -> None:
    """Entry point of group ``vllm.general_plugins``; safe to call more than once."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if NAME in AttentionBackendEnum.__members__:
        return
    register_backend(NAME, CLASS_PATH)


__all__ = ["CLASS_PATH", "NAME", "register"]
