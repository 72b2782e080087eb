"""Lightning-indexer benchmark cases (DeepSeek Sparse Attention's token selection), and what
each one reads and computes.

A case is ``batch`` requests of ``next_n`` query tokens, each over ``context`` cached keys of
the paged index cache (132 bytes a key, pages of 64), with ``heads`` indexer heads (64 for
DeepSeek-V3.2, 32 for GLM-5) and a top-``k`` selection. The DSA layer case adds sparse MLA
attention over the selected tokens, beside dense decode over the whole context.
"""

from __future__ import annotations

from dataclasses import dataclass

from fp8mla.dsa.index_cache import HEAD_DIM, KEY_BYTES

INDEXER_PAGE_SIZE = 64
LAYER_ROTATIONS = 8  # requests a CUDA-graph replay cycles through (their keys exceed the L2)


@dataclass(frozen=True)
class IndexerCase:
    batch: int
    next_n: int
    heads: int
    context: int
    k: int = 2048
    page_size: int = INDEXER_PAGE_SIZE
    goal: str = ""

    @property
    def rows(self) -> int:
        """Query tokens of one call."""
        return self.batch * self.next_n

    @property
    def name(self) -> str:
        return f"B{self.batch}_next{self.next_n}_H{self.heads}_ctx{self.context}"


def key_bytes(case: IndexerCase) -> int:
    """Bytes of the index cache one call reads: 132 per cached key per request."""
    return case.batch * case.context * KEY_BYTES


def logits_bytes(case: IndexerCase) -> int:
    """Bytes of the ``[rows, context]`` float32 logits (what the fused path never writes)."""
    return case.rows * case.context * 4


def logits_flops(case: IndexerCase) -> int:
    """``2 · rows · H · 128 · context``: the q·k products (ReLU and the head sum not counted)."""
    return 2 * case.rows * case.heads * HEAD_DIM * case.context


VS_VLLM = ">= 2x vllm-triton (logits + torch.topk)"
INDEXER_CASES: list[IndexerCase] = [
    IndexerCase(64, 1, 64, 32768, goal=VS_VLLM),  # DeepSeek-V3.2 decode, 64 streams
    IndexerCase(1, 1, 32, 131072, goal=VS_VLLM),  # GLM-5, one stream at 128K
]
# The whole DSA layer (indexer + sparse attention, GLM-5's 32 heads a GPU at TP2) beside dense
# fp8mla decode over the same 131,072 tokens
LAYER_CASE = IndexerCase(1, 1, 32, 131072, goal=">= 5x faster than dense fp8mla decode")


def quick_cases() -> list[IndexerCase]:
    """A short run: the two shapes at shorter contexts."""
    return [IndexerCase(16, 1, 64, 16384), IndexerCase(1, 1, 32, 32768)]
