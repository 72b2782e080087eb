"""DeepSeek Sparse Attention (DSA) over the packed 656-byte FP8 MLA cache: the cache format
(:mod:`fp8mla.dsa.layout`), its writer and reader, sparse MLA attention over each query
token's chosen tokens, and the lightning indexer that chooses them (:mod:`fp8mla.dsa.indexer`:
``paged_mqa_logits``, ``mqa_logits``, ``topk``, ``paged_topk``, ``to_slots``; its key cache
in :mod:`fp8mla.dsa.index_cache`)."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "paged_mqa_logits": "fp8mla.dsa.indexer",
    "mqa_logits": "fp8mla.dsa.indexer",
    "topk": "fp8mla.dsa.indexer",
    "paged_topk": "fp8mla.dsa.indexer",
    "to_slots": "fp8mla.dsa.indexer",
    "pack_index_keys": "fp8mla.dsa.index_cache",
    "unpack_index_keys": "fp8mla.dsa.index_cache",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fp8mla.dsa' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
