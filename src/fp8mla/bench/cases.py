"""Benchmark cases: the goal table and the sweep."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mla.formats import dtype_name

SEED_POOL_SLOTS = 495_552  # the engine pool of the seed trace (GLM-5 TP2 on one H200)


@dataclass(frozen=True)
class Case:
    """One decode shape: ``batch`` requests of ``context`` tokens, ``heads`` query heads,
    ``qo_len`` query tokens each, in a pool of ``pool_slots`` slots."""

    batch: int
    heads: int
    context: int
    page_size: int = 1
    kv_dtype: torch.dtype = torch.float8_e4m3fn
    qo_len: int = 1
    pool_slots: int = SEED_POOL_SLOTS
    goal: str = ""

    @property
    def name(self) -> str:
        prefix = f"B{self.batch}_H{self.heads}_L{self.context}"
        if self.qo_len > 1:
            prefix += f"_Q{self.qo_len}"
        if self.page_size != 1:
            prefix += f"_P{self.page_size}"
        return f"{prefix}_{dtype_name(self.kv_dtype)}"

    @property
    def tokens(self) -> int:
        return self.batch * self.context

    def slots_needed(self) -> int:
        pages = -(-self.context // self.page_size) * self.batch
        return max(self.pool_slots, pages * self.page_size)


E4M3 = torch.float8_e4m3fn

GOAL_CASES: list[Case] = [
    Case(64, 16, 4096, goal="<= 45 us, >= 3.4 TB/s"),
    Case(64, 128, 4096, goal=">= 400 TFLOP/s"),
    Case(1, 32, 4096, goal="<= 8 us"),
    Case(64, 16, 4096, kv_dtype=torch.bfloat16, goal="FP8 >= 1.7x faster than this"),
]


def sweep_cases(quick: bool = False) -> list[Case]:
    """Context 512…131072 × batch 1…256 × heads 16/32/64/128 × page size 1/64, capped at
    2^23 KV tokens per case so that every case fits beside the seed pool."""
    contexts = [512, 4096, 32768, 131072] if not quick else [4096]
    batches = [1, 8, 64, 256] if not quick else [8]
    cases = []
    for heads in (16, 32, 64, 128):
        for batch in batches:
            for context in contexts:
                if batch * context > (1 << 23):
                    continue
                if heads in (32, 64) and context not in (4096, 32768):
                    continue
                cases.append(Case(batch, heads, context))
                if heads == 16 and context == 4096:
                    cases.append(Case(batch, heads, context, page_size=64))
    return cases
