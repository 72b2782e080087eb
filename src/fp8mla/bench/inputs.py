"""Device-side benchmark inputs: a random pool with random token placement."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mla.bench.cases import Case
from fp8mla.formats import HEAD_DIM_CKV, HEAD_DIM_KPE


@dataclass
class BenchInputs:
    case: Case
    pool: torch.Tensor  # [slots, 1, 576] kv dtype (engine layout)
    q_nope: torch.Tensor  # [B * qo_len, H, 512] bf16
    q_pe: torch.Tensor  # [B * qo_len, H, 64] bf16
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor  # page-level
    kv_indices: torch.Tensor  # page ids
    kv_len: torch.Tensor
    token_slots: torch.Tensor  # [B * context] int64 slot of every active token, in order
    scale: float = 1.0  # per-tensor scale of ckv and kpe ("unscaled" FP8, as engines store)

    @property
    def page_size(self) -> int:
        return self.case.page_size

    def paged(self, pool: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``ckv [pages, page_size, 512]`` and ``kpe [pages, page_size, 64]`` views."""
        pool = self.pool if pool is None else pool
        view = pool.view(-1, self.page_size, pool.shape[-1])
        return view[..., :HEAD_DIM_CKV], view[..., HEAD_DIM_CKV:]

    def kv_bytes(self) -> int:
        return self.token_slots.numel() * (HEAD_DIM_CKV + HEAD_DIM_KPE) * self.pool.element_size()


def random_pool(
    slots: int, dtype: torch.dtype, device: torch.device, generator: torch.Generator | None = None
) -> torch.Tensor:
    """``[slots, 1, 576]`` of N(0, 1) values stored in ``dtype`` (filled in chunks to bound
    the fp32 temporary)."""
    pool = torch.empty(slots, 1, HEAD_DIM_CKV + HEAD_DIM_KPE, dtype=dtype, device=device)
    chunk = 1 << 18
    for start in range(0, slots, chunk):
        n = min(chunk, slots - start)
        pool[start : start + n] = torch.randn(
            n, 1, pool.shape[-1], device=device, generator=generator
        ).to(dtype)
    return pool


def build_inputs(
    case: Case, device: torch.device, seed: int = 0, pool: torch.Tensor | None = None
) -> BenchInputs:
    """Requests of ``case.context`` tokens on random pages of a ``case.pool_slots`` pool."""
    g = torch.Generator(device=device).manual_seed(seed)
    slots = case.slots_needed()
    if pool is None:
        pool = random_pool(slots, case.kv_dtype, device, g)
    ps = case.page_size
    pages_per = -(-case.context // ps)
    num_pages = pool.shape[0] // ps
    page_ids = torch.randperm(num_pages, device=device, generator=g)[: pages_per * case.batch]
    pos = torch.arange(case.context, device=device)
    per_req = page_ids.view(case.batch, pages_per).long()
    token_slots = (per_req[:, pos // ps] * ps + pos % ps).reshape(-1)
    tokens = case.batch * case.qo_len
    i32 = dict(dtype=torch.int32, device=device)
    return BenchInputs(
        case=case,
        pool=pool,
        q_nope=torch.randn(tokens, case.heads, HEAD_DIM_CKV, device=device, generator=g).to(
            torch.bfloat16
        ),
        q_pe=torch.randn(tokens, case.heads, HEAD_DIM_KPE, device=device, generator=g).to(
            torch.bfloat16
        ),
        qo_indptr=torch.arange(0, tokens + 1, case.qo_len, **i32),
        kv_indptr=torch.arange(0, pages_per * case.batch + 1, pages_per, **i32),
        kv_indices=page_ids.to(torch.int32),
        kv_len=torch.full((case.batch,), case.context, **i32),
        token_slots=token_slots,
    )


@dataclass
class PageCopy:
    """A case's tokens re-laid into pages: what a kernel taking one page size reads."""

    cache: torch.Tensor  # [blocks, page_size, 1, 576]
    block_table: torch.Tensor  # [batch, pages a request] int32 block ids
    seqlens: torch.Tensor  # [batch] int32


COPY_TOKENS = 1 << 18  # tokens copied at once (bounds the float32 temporary of a dequantization)


def page_copy(
    inp: BenchInputs, dtype: torch.dtype | None = None, page_size: int = 64, seed: int = 0
) -> PageCopy:
    """Every request's tokens, in order, in pages of ``page_size`` at random block ids of a
    cache of exactly the blocks needed (the last page of a request padded with zeros): the
    pool's bytes as stored (``dtype`` None), or its values dequantized (× ``inp.scale``) to
    ``dtype``."""
    case, pool = inp.case, inp.pool
    dev = pool.device
    g = torch.Generator(device=dev).manual_seed(seed)
    pages_per = -(-case.context // page_size)
    blocks = torch.randperm(case.batch * pages_per, device=dev, generator=g)
    block_table = blocks.view(case.batch, pages_per)
    pos = torch.arange(case.context, device=dev)
    dest = (block_table[:, pos // page_size] * page_size + pos % page_size).reshape(-1)
    width = pool.shape[-1]
    cache = torch.zeros(blocks.numel(), page_size, 1, width, dtype=dtype or pool.dtype, device=dev)
    rows = pool.view(-1, width)
    flat = cache.view(-1, width)
    for start in range(0, dest.numel(), COPY_TOKENS):
        src = inp.token_slots[start : start + COPY_TOKENS]
        at = dest[start : start + COPY_TOKENS]
        if dtype is None:  # bytes as stored (index_copy_ takes no float8)
            flat.view(torch.uint8).index_copy_(0, at, rows.view(torch.uint8).index_select(0, src))
        else:
            vals = rows.view(torch.uint8).index_select(0, src).view(pool.dtype).float()
            flat.index_copy_(0, at, (vals * inp.scale).to(dtype))
    return PageCopy(
        cache=cache,
        block_table=block_table.to(torch.int32),
        seqlens=torch.full((case.batch,), case.context, dtype=torch.int32, device=dev),
    )
