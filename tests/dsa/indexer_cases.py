"""Random inputs of the lightning indexer for the tests: a paged key cache written by
``pack_index_keys`` whose unused slots hold NaN bytes, requests scattered over its pages, e4m3
queries and float32 weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch

import fp8mla
from fp8mla.dsa.index_cache import KEY_BYTES


@dataclass
class PagedIndex:
    q: torch.Tensor  # [B, next_n, H, 128] float8_e4m3fn
    weights: torch.Tensor  # [B * next_n, H] float32
    cache: torch.Tensor  # [pages, page_size, 1, 132] uint8
    block_table: torch.Tensor  # [B, max_pages] int32
    lens: torch.Tensor  # [B, next_n] int32
    page_size: int

    @property
    def rows(self) -> int:
        return self.lens.numel()


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def queries(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """e4m3 queries of a few octaves (codes near the top of the range and subnormals too)."""
    g = gen(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape[:-1] + (1,), generator=g))
    return (x * 64).clamp(-448, 448).to(torch.float8_e4m3fn)


def paged_index(
    lens: list[list[int]],
    heads: int,
    *,
    page_size: int = 64,
    seed: int = 0,
    spare_pages: int = 3,
    device: str = "cpu",
) -> PagedIndex:
    """Requests of the given row lengths (``[B][next_n]``), each over its own shuffled pages;
    every slot no request reaches holds 0xFF bytes (NaN codes, NaN scales)."""
    g = gen(seed)
    batch, next_n = len(lens), len(lens[0])
    need = [max(1, -(-max(row) // page_size)) for row in lens]
    pages = sum(need) + spare_pages
    perm = torch.randperm(pages, generator=g)
    width = max(need) + 1
    table = torch.full((batch, width), -1, dtype=torch.int32)
    at = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[at : at + n].to(torch.int32)
        at += n
    cache = torch.full((pages, page_size, 1, KEY_BYTES), 0xFF, dtype=torch.uint8)
    for b, row in enumerate(lens):
        seen = max(row)
        if seen == 0:
            continue
        pos = torch.arange(seen)
        slots = table[b].long()[pos // page_size] * page_size + pos % page_size
        keys = torch.randn(seen, 128, generator=g) * torch.exp(torch.randn(seen, 1, generator=g))
        fp8mla.pack_index_keys(keys.to(torch.bfloat16), cache, slots, backend="torch")
    q = queries((batch, next_n, heads, 128), seed + 1)
    weights = torch.randn(batch * next_n, heads, generator=g)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    return PagedIndex(q.to(device), weights.to(device), cache.to(device), table.to(device),
                      lens_t.to(device), page_size)  # fmt: skip


def check_topk(got: torch.Tensor, logits: torch.Tensor, lengths: torch.Tensor, k: int,
               tol: float = 0.0, starts: torch.Tensor | None = None) -> None:  # fmt: skip
    """``got [rows, k]`` is a top-k of ``logits`` over ``[starts, lengths)``: ascending distinct
    positions, then -1; ``min(k, length)`` of them; every chosen value at least and every other
    at most the k-th value (``tol`` apart: a GPU's summation order may move values by an ulp).
    With ``tol == 0`` equal values must have gone to the lower positions."""
    got, logits = got.cpu(), logits.cpu().double()
    for r in range(got.shape[0]):
        lo = 0 if starts is None else int(starts[r])
        lo = max(0, min(lo, logits.shape[1]))
        hi = max(lo, min(int(lengths[r]), logits.shape[1]))
        n = min(k, hi - lo)
        row = got[r]
        assert torch.all(row[n:] == -1), f"row {r}: padding"
        chosen = row[:n].long()
        assert torch.all(chosen >= 0) and torch.all(chosen < hi - lo), f"row {r}: range"
        assert torch.all(chosen[1:] > chosen[:-1]), f"row {r}: not ascending"
        if n == 0 or n == hi - lo:
            continue
        vals = logits[r, lo:hi]
        mask = torch.zeros(hi - lo, dtype=torch.bool)
        mask[chosen] = True
        kth = vals[mask].min()
        scale = tol * max(1.0, float(vals.abs().max()))
        assert vals[~mask].max() <= kth + scale, f"row {r}: a larger value left out"
        if tol == 0:  # ties: lower positions first
            tied_out = (~mask) & (vals == kth)
            if tied_out.any():
                assert tied_out.nonzero().min() > chosen[vals[chosen] == kth].max(), f"row {r}"
