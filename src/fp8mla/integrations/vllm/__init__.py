"""fp8mla as vLLM MLA attention backends: ``--attention-backend FP8MLA`` (dense MLA) and
``--attention-backend FP8MLA_SPARSE`` (DeepSeek Sparse Attention: DeepSeek-V3.2, GLM-5).

vLLM loads the entry-point group ``vllm.general_plugins`` in every process (API server,
engine core, workers) before it selects attention backends. fp8mla declares
:func:`register` there; it adds the names ``FP8MLA`` and ``FP8MLA_SPARSE`` to vLLM's backend
registry (``register_backend``) and puts fp8mla's lightning indexer in place of vLLM's
``SparseAttnIndexer`` (``CustomOp.register_oot``), which stays vLLM's own unless
``FP8MLA_SPARSE`` is selected. The backend classes declare their capabilities (dtypes,
KV-cache dtypes, block sizes, compute capabilities, head size), so vLLM's selector refuses an
unsupported configuration at start-up with the reason.
"""

from __future__ import annotations

NAME = "FP8MLA"
CLASS_PATH = "fp8mla.integrations.vllm.backend.FP8MLABackend"
SPARSE_NAME = "FP8MLA_SPARSE"
SPARSE_CLASS_PATH = "fp8mla.integrations.vllm.sparse_backend.FP8MLASparseBackend"


def register() -> None:
    """Entry point of group ``vllm.general_plugins``; safe to call more than once."""
    from vllm.logger import init_logger
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    for name, path in ((NAME, CLASS_PATH), (SPARSE_NAME, SPARSE_CLASS_PATH)):
        if name not in AttentionBackendEnum.__members__:
            register_backend(name, path)
    from fp8mla.integrations.vllm.indexer import register_indexer

    if not register_indexer():
        init_logger(__name__).warning(
            "fp8mla: another plugin replaced vLLM's SparseAttnIndexer; %s keeps its indexer",
            SPARSE_NAME,
        )


__all__ = ["CLASS_PATH", "NAME", "SPARSE_CLASS_PATH", "SPARSE_NAME", "register"]
