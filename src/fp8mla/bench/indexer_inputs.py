"""Device-side inputs of the indexer benchmark: one paged index cache written by
``pack_index_keys`` (power-of-two scales, as DeepSeek-V3.2's engines write it), requests on
random pages of it, e4m3 queries and float32 weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mla.bench.indexer_cases import IndexerCase
from fp8mla.dsa.index_cache import HEAD_DIM, KEY_BYTES, pack_index_keys

CHUNK = 1 << 18  # keys written at once (bounds the temporaries)


def index_cache(pages: int, page_size: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """``[pages, page_size, 1, 132]`` uint8 holding N(0, 1) keys (spread over a few octaves
    token to token) in every slot."""
    g = torch.Generator(device=device).manual_seed(seed)
    cache = torch.empty(pages, page_size, 1, KEY_BYTES, dtype=torch.uint8, device=device)
    slots = pages * page_size
    for start in range(0, slots, CHUNK):
        n = min(CHUNK, slots - start)
        spread = torch.exp(torch.randn(n, 1, generator=g, device=device) * 0.5)
        keys = torch.randn(n, HEAD_DIM, generator=g, device=device) * spread
        at = torch.arange(start, start + n, device=device)
        pack_index_keys(keys.to(torch.bfloat16), cache, at, validate=False)
    return cache


@dataclass
class IndexerInputs:
    """One call: ``q [B, next_n, H, 128]`` e4m3, ``weights [B * next_n, H]`` float32, the cache,
    ``block_table [B, pages]`` int32, ``lens [B, next_n]`` int32 (each token one more than
    the one before: the last sees the whole context)."""

    case: IndexerCase
    cache: torch.Tensor
    q: torch.Tensor
    weights: torch.Tensor
    block_table: torch.Tensor
    lens: torch.Tensor

    @property
    def context_lens_1d(self) -> torch.Tensor:
        """DeepGEMM's and vLLM's 1-D form: the last token's length."""
        return self.lens[:, -1].contiguous()


def indexer_inputs(case: IndexerCase, cache: torch.Tensor, seed: int = 0,
                   pages: torch.Tensor | None = None) -> IndexerInputs:  # fmt: skip
    """Requests on random pages of ``cache`` (or on ``pages [B, pages a request]``)."""
    dev = cache.device
    g = torch.Generator(device=dev).manual_seed(seed + 1)
    per = -(-case.context // case.page_size)
    if pages is None:
        pages = torch.randperm(cache.shape[0], generator=g, device=dev)[: case.batch * per]
        pages = pages.view(case.batch, per)
    q = torch.randn(case.batch, case.next_n, case.heads, HEAD_DIM, generator=g, device=dev)
    q = (q * 32).clamp(-448, 448).to(torch.float8_e4m3fn)
    weights = torch.randn(case.rows, case.heads, generator=g, device=dev) * case.heads**-0.5
    n = torch.arange(case.next_n, device=dev)
    lens = (case.context - case.next_n + 1 + n).expand(case.batch, -1)
    return IndexerInputs(case, cache, q, weights, pages.to(torch.int32).contiguous(),
                         lens.to(torch.int32).contiguous())  # fmt: skip
