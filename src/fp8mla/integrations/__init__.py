"""fp8mla inside serving engines, through their official plugin entry points.

- :mod:`fp8mla.integrations.sglang`: attention backend ``fp8mla`` for SGLang
  (entry-point group ``sglang.srt.plugins``): ``--attention-backend fp8mla``.
- :mod:`fp8mla.integrations.vllm`: MLA backend ``FP8MLA`` for vLLM (entry-point group
  ``vllm.general_plugins``): ``--attention-backend FP8MLA``.

Nothing here imports an engine at module level: the entry points are declared in
fp8mla's package metadata and only load when the engine itself loads its plugins, so
installing fp8mla next to an engine is all it takes (no packaging extra; the engines'
own dependencies are theirs to pin). See ``docs/engines.md``.
"""

from fp8mla.integrations.common import (
    BACKEND_ENV,
    FP8_QUERIES_ENV,
    IntegrationConfigError,
    check_mla_config,
    fp8_queries_enabled,
    kernel_backend,
    pages_from_tokens,
)

__all__ = [
    "BACKEND_ENV",
    "FP8_QUERIES_ENV",
    "IntegrationConfigError",
    "check_mla_config",
    "fp8_queries_enabled",
    "kernel_backend",
    "pages_from_tokens",
]
