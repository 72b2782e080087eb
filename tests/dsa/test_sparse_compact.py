"""The index-list compaction ahead of the SM90 sparse path (``kernels/portable/sparse_compact.py``)
against a Python statement of it: kept entries at the front in their order, their count,
``topk_length`` cuts, rows past the call counted 0, and -- for pages with a gap after them --
slots turned into rows and ids outside the cache into -2. Runs interpreted on a CPU and compiled
on a GPU; ``cache_rows`` (which layout takes which addressing) runs anywhere."""

from __future__ import annotations

import pytest
import torch

from fp8mla.dsa.layout import TOKEN_BYTES, token_view
from fp8mla.dsa.sparse_sm90 import COMPACT_MAX_BLOCK, cache_rows, compact_shape

from conftest import HAS_CUDA, INTERPRETED

DEVICE = "cuda" if HAS_CUDA and not INTERPRETED else "cpu"
needs_triton = pytest.mark.skipif(
    not (HAS_CUDA or INTERPRETED), reason="needs a GPU or the Triton interpreter"
)


def expected(indices, topk_length, num_tokens, paged, num_slots, page_size, rows_per_page):
    """Per row: the kept entries (slots turned into rows where ``paged``) and their count."""
    rows, counts = [], []
    for t in range(indices.shape[0]):
        if t >= num_tokens:
            rows.append([])
            counts.append(0)
            continue
        n = (
            indices.shape[1]
            if topk_length is None
            else max(0, min(int(topk_length[t]), indices.shape[1]))
        )
        kept = [int(i) for i in indices[t, :n] if int(i) != -1]
        if paged:
            kept = [(i // page_size) * rows_per_page + i % page_size if 0 <= i < num_slots else -2
                    for i in kept]  # fmt: skip
        rows.append(kept)
        counts.append(len(kept))
    return rows, counts


@pytest.mark.parametrize("topk", [1, 7, 300, 2048, 4096, 5000, 16384])
def test_compact_shape_one_step_up_to_4096(topk):
    block, warps = compact_shape(topk)
    assert block & (block - 1) == 0, "a power of two"
    assert block >= min(topk, COMPACT_MAX_BLOCK) and block <= max(topk * 2, 1)
    assert block == min(COMPACT_MAX_BLOCK, block)
    assert 1 <= warps <= 8 and (block < 512 or warps * 32 * 16 == block)


@needs_triton
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize(
    "topk, block", [(40, 64), (300, 128), (7, 8), (300, None), (5000, None)]
)  # None: the launch's own shape (compact_shape), one step or two of 4,096
def test_compaction_matches_python(paged, topk, block):
    from fp8mla.kernels.portable.sparse_compact import sparse_compact_kernel

    g = torch.Generator().manual_seed(topk + paged)
    tokens, num_tokens, page_size, rows_per_page, num_slots = 6, 5, 64, 65, 512
    warps = 4
    if block is None:
        block, warps = compact_shape(topk)
    indices = torch.randint(-1, num_slots, (tokens, topk), generator=g, dtype=torch.int32)
    indices[0, ::3] = -1
    indices[1, 2] = num_slots  # past the cache
    indices[2, 4] = -7  # below -1
    indices[3] = -1  # nothing to attend to
    topk_length = torch.tensor([topk, topk + 5, topk // 2, topk, 0, 1], dtype=torch.int32)
    out = torch.full((tokens, topk), 12345, dtype=torch.int32)
    count = torch.full((tokens,), -1, dtype=torch.int32)
    dev = [t.to(DEVICE) for t in (indices, topk_length, out, count)]
    sparse_compact_kernel[(tokens,)](
        dev[0], dev[1], dev[2], dev[3], num_tokens, topk, topk, num_slots, page_size,
        rows_per_page, HAS_TOPK_LENGTH=True, PAGED=paged, BLOCK=block, num_warps=warps,
    )  # fmt: skip
    got_out, got_count = dev[2].cpu(), dev[3].cpu()
    want_rows, want_counts = expected(indices, topk_length, num_tokens, paged, num_slots,
                                      page_size, rows_per_page)  # fmt: skip
    assert got_count.tolist() == want_counts
    for t, kept in enumerate(want_rows):
        assert got_out[t, : len(kept)].tolist() == kept, t
        assert (got_out[t, len(kept) :] == 12345).all(), "entries past the count were written"


def test_cache_rows_addressing():
    rows = torch.zeros(4 * 65, TOKEN_BYTES, dtype=torch.uint8)
    contiguous = cache_rows(token_view(rows[: 4 * 64].view(4, 64, TOKEN_BYTES)))
    assert not contiguous.paged and contiguous.ckv.shape == (256, 1, 512)
    pool = cache_rows(token_view(rows[:256].view(256, 1, TOKEN_BYTES)))
    assert not pool.paged and pool.scales.shape == (256, 1, 4)
    gap = cache_rows(token_view(rows.view(4, 65, TOKEN_BYTES)[:, :64]))
    assert gap.paged and (gap.page_size, gap.rows_per_page, gap.num_slots) == (64, 65, 256)
    assert gap.ckv.shape[0] == 3 * 65 + 64  # the last page's gap is not the cache's
    assert gap.kpe.data_ptr() == rows.data_ptr() + 528 and gap.kpe.stride(0) == TOKEN_BYTES
    odd = torch.zeros(4, 64 * TOKEN_BYTES + 16, dtype=torch.uint8)  # a stride of no whole row
    odd_view = odd[:, : 64 * TOKEN_BYTES].view(4, 64, TOKEN_BYTES)
    with pytest.raises(ValueError, match='plan kernel="portable"'):
        cache_rows(token_view(odd_view))
