"""Sparse MLA (DeepSeek Sparse Attention) benchmark cases, and what each one reads and computes.

Decode: ``batch`` requests of ``qo_len`` query tokens (2: a multi-token-prediction step), each
token with its own ``topk`` slots; prefill: one chunk of ``qo_len`` tokens. Every case draws its
slots at random from one packed pool of 2^20 tokens (page size 64), as the engines' pools hold
them (``fp8mla.dsa.layout``). A prefill case with a ``context`` (``T4096_H128_K2048_C32768``)
draws each token's slots from its own causal prefix instead: the chunk ends a request of that
many tokens, which sit on random slots of the pool, so a call references at most ``context``
distinct rows, as a real chunk does (the uniform cases reference nearly the whole pool).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fp8mla.dsa.layout import NOPE_DIM, ROPE_DIM, TOKEN_BYTES

SPARSE_POOL_SLOTS = 1 << 20
SPARSE_PAGE_SIZE = 64
SPARSE_LAYERS = 78  # layers of the one-stream CUDA-graph scenario (DeepSeek-V3.2, GLM-5)
PACK_TOKENS = 1 << 17  # tokens the packed writer's measurement writes per call


@dataclass(frozen=True)
class SparseCase:
    batch: int
    heads: int
    topk: int
    qo_len: int = 1
    prefill: bool = False
    pool_slots: int = SPARSE_POOL_SLOTS
    page_size: int = SPARSE_PAGE_SIZE
    goal: str = ""
    # prefill: the request's tokens up to the chunk's end, which the lists draw from (0: the
    # whole pool, uniformly)
    context: int = 0

    @property
    def tokens(self) -> int:
        """Query tokens of one call."""
        return self.batch * self.qo_len

    @property
    def name(self) -> str:
        if self.prefill:
            name = f"T{self.tokens}_H{self.heads}_K{self.topk}"
            return name + (f"_C{self.context}" if self.context else "")
        name = f"B{self.batch}_H{self.heads}_K{self.topk}"
        return name + (f"_Q{self.qo_len}" if self.qo_len > 1 else "")


def packed_bytes(case: SparseCase) -> int:
    """Bytes of the packed cache one call reads: 656 per index-list entry per query token."""
    return case.tokens * case.topk * TOKEN_BYTES


def sparse_flops(case: SparseCase) -> int:
    """``2 · T · H · topk · (576 + 512)``: Q·Kᵀ over 576 values and P·V over 512."""
    return 2 * case.tokens * case.heads * case.topk * (NOPE_DIM + ROPE_DIM + NOPE_DIM)


DECODE_GOAL = (
    ">= 2.5 TB/s of packed bytes (<= 69 us), >= 2x vllm-triton-sparse, >= 3x gather-dequant"
)
SPARSE_CASES: list[SparseCase] = [
    SparseCase(128, 16, 2048, goal=DECODE_GOAL),  # DeepSeek-V3.2 decode at TP8
    SparseCase(128, 128, 2048, goal="DP attention decode"),
    SparseCase(128, 128, 2048, qo_len=2, goal=">= 450 TFLOP/s, >= 1.1x flashmla-sparse-fp8"),
    SparseCase(1, 32, 2048, goal="<= 10 us a layer in a CUDA graph of 78 layers"),
    SparseCase(1, 128, 2048, qo_len=4096, prefill=True, goal=">= 450 TFLOP/s"),
    SparseCase(1, 16, 2048, qo_len=4096, prefill=True),
]
LAYERS_CASE = SPARSE_CASES[3]  # the one-stream case, also timed as 78 layers in one graph


_NAME = re.compile(r"(?:B(\d+)_H(\d+)_K(\d+)(?:_Q(\d+))?|T(\d+)_H(\d+)_K(\d+)(?:_C(\d+))?)")


def case_from_name(name: str) -> SparseCase:
    """The case a name describes (``B128_H64_K2048``, ``B64_H128_K2048_Q2``,
    ``T4096_H64_K2048``, ``T4096_H128_K2048_C32768``), on the bench's pool: for timing shapes
    the bench does not list."""
    m = _NAME.fullmatch(name)
    if m is None:
        raise ValueError(
            f"expected a sparse case name B<batch>_H<heads>_K<topk>[_Q<tokens>] or "
            f"T<tokens>_H<heads>_K<topk>[_C<context>], got {name!r}"
        )
    b, h, k, q, t, th, tk, c = (int(g) if g else 0 for g in m.groups())
    if t:
        case = SparseCase(1, th, tk, qo_len=t, prefill=True, context=c)
    else:
        case = SparseCase(b, h, k, q or 1)
    if case.name != name or min(case.batch, case.heads, case.topk, case.qo_len) < 1:
        raise ValueError(f"expected a sparse case name in its canonical form, got {name!r}")
    if case.context and not case.tokens <= case.context <= case.pool_slots:
        raise ValueError(
            f"expected a context of at least the chunk's {case.tokens} tokens and at most the "
            f"pool's {case.pool_slots} slots, got {case.context}"
        )
    return case


def quick_cases() -> list[SparseCase]:
    """A short run: one memory-bound and one compute-bound decode case."""
    return [SparseCase(32, 16, 2048), SparseCase(32, 128, 2048)]
