"""fp8mla: Multi-head Latent Attention that reads a paged FP8 KV cache directly.

Public API (imported lazily, so ``import fp8mla`` and the trace tools need no torch):

- :class:`BatchMLAPagedAttentionWrapper` -- FlashInfer-compatible ``plan()``/``run()``.
- :func:`mla_decode` -- one-call functional form.
- :class:`MLAKVCache` -- per-layer paged KV pool that quantizes on write.
- :mod:`fp8mla.reference` -- float64 PyTorch reference (test oracle, CPU fallback).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_LAZY = {
    "BatchMLAPagedAttentionWrapper": "fp8mla.attention.wrapper",
    "mla_decode": "fp8mla.attention.functional",
    "MLAKVCache": "fp8mla.cache",
    "PoolExhaustedError": "fp8mla.cache",
    "mla_reference": "fp8mla.reference",
    "pack_ds_mla": "fp8mla.dsa.format",
    "unpack_ds_mla": "fp8mla.dsa.format",
    "pack_index_keys": "fp8mla.dsa.index_cache",
    "sparse_mla": "fp8mla.dsa.sparse",
    "SparseMLAWrapper": "fp8mla.dsa.sparse",
}

_SUBMODULES = (
    "attention",
    "reference",
    "testing",
    "cache",
    "formats",
    "doctor",
    "scan",
    "gap",
    "bench",
    "demo",
)

__all__ = ["__version__", *_LAZY]

if TYPE_CHECKING:  # pragma: no cover
    from fp8mla.attention.functional import mla_decode  # noqa: F401
    from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper  # noqa: F401
    from fp8mla.cache import MLAKVCache, PoolExhaustedError  # noqa: F401
    from fp8mla.dsa.format import pack_ds_mla, unpack_ds_mla  # noqa: F401
    from fp8mla.dsa.index_cache import pack_index_keys  # noqa: F401
    from fp8mla.dsa.sparse import SparseMLAWrapper, sparse_mla  # noqa: F401
    from fp8mla.reference import mla_reference  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"fp8mla.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fp8mla' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
