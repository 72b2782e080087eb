"""The referenced rows of compacted index lists dequantized once into a 16-bit copy, and the lists
rewritten to the copy's rows (``kernels/portable/sparse_gather.py``), against a Python
statement: every kept entry names a copy row holding its cache row's values (e4m3 × its group's
float32 scale, the RoPE part as stored, rounded once to fp16), each distinct row
copied once, rows outside the cache -2, entries past a token's count untouched, the work
buffers left ready for the next call. Interpreted on a CPU, compiled on a GPU."""

from __future__ import annotations

import pytest
import torch

from fp8mla.dsa.layout import TOKEN_BYTES
from fp8mla.kernels.portable.sparse_gather import gather_rows, scan_blocks

from conftest import HAS_CUDA, INTERPRETED

DEVICE = "cuda" if HAS_CUDA and not INTERPRETED else "cpu"
pytestmark = pytest.mark.skipif(
    not (HAS_CUDA or INTERPRETED), reason="needs a GPU or the Triton interpreter"
)


def _packed(num_rows: int, seed: int) -> torch.Tensor:
    """``[num_rows, 656]`` packed rows of random values at arbitrary (not power-of-two) scales."""
    import fp8mla

    g = torch.Generator().manual_seed(seed)
    cache = torch.zeros(num_rows, 1, TOKEN_BYTES, dtype=torch.uint8)
    ckv = torch.randn(num_rows, 512, generator=g) * torch.rand(num_rows, 1, generator=g) * 5
    kpe = torch.randn(num_rows, 64, generator=g)
    fp8mla.pack_ds_mla(ckv.bfloat16(), kpe.bfloat16(), cache, torch.arange(num_rows),
                       validate=False)  # fmt: skip
    return cache.view(num_rows, TOKEN_BYTES).to(DEVICE)


def _dequantized(rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    import fp8mla

    ckv, kpe = fp8mla.unpack_ds_mla(rows.view(-1, 1, TOKEN_BYTES), torch.arange(rows.shape[0]))
    return torch.cat([ckv, kpe], dim=1).to(dtype)


@pytest.mark.parametrize(
    "tokens, topk, num_rows", [(3, 40, 50), (5, 1500, 300), (1, 1, 4), (2, 700, 9000)]
)  # 9,000 rows: three blocks of the numbering
def test_gather_matches_python(tokens, topk, num_rows):
    dtype = torch.float16
    g = torch.Generator().manual_seed(tokens * 31 + topk)
    rows = _packed(num_rows, tokens)
    lists = torch.randint(0, num_rows, (tokens, topk), generator=g, dtype=torch.int32)
    lists[0, ::5] = num_rows + 7  # outside the cache
    if topk > 2:
        lists[-1, 1] = -2  # what the paged compaction writes for a slot outside the cache
    counts = torch.randint(0, topk + 1, (tokens,), generator=g, dtype=torch.int32)
    counts[0] = topk
    before = lists.clone()
    kept = [before[t, : int(counts[t])].tolist() for t in range(tokens)]
    inside = {r for row in kept for r in row if 0 <= r < num_rows}

    lists, counts = lists.to(DEVICE), counts.to(DEVICE)
    claimed = torch.zeros(num_rows, dtype=torch.int8, device=DEVICE)
    sums = torch.zeros(scan_blocks(num_rows), dtype=torch.int32, device=DEVICE)
    copy_row = torch.zeros(num_rows, dtype=torch.int32, device=DEVICE)
    counter = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    capacity = min(num_rows, tokens * topk)
    source = torch.zeros(capacity, dtype=torch.int32, device=DEVICE)
    copy = torch.full((capacity, 576), float("nan"), dtype=dtype, device=DEVICE)
    for _ in range(2):  # the second call finds the buffers as the first left them
        lists.copy_(before.to(DEVICE))
        gather_rows(lists, counts, topk, rows, claimed, sums, counter, source, copy_row, copy)
        assert int(counter) == len(inside)
        assert (claimed == 0).all()
        out, values = lists.cpu(), copy.cpu()
        want = _dequantized(rows.cpu(), dtype)
        assert source[: len(inside)].tolist() == sorted(inside)  # in the cache's order
        for t in range(tokens):
            n = int(counts[t])
            assert torch.equal(out[t, n:], before[t, n:])  # past the count: untouched
            for k, r in enumerate(kept[t]):
                if 0 <= r < num_rows:
                    assert 0 <= int(out[t, k]) < len(inside)
                    assert torch.equal(values[int(out[t, k])], want[r])
                else:
                    assert int(out[t, k]) == -2


def test_an_empty_batch_launches_nothing():
    rows = _packed(4, 0)
    empty = torch.zeros(0, 8, dtype=torch.int32, device=DEVICE)
    counts = torch.zeros(0, dtype=torch.int32, device=DEVICE)
    claimed = torch.zeros(4, dtype=torch.int8, device=DEVICE)
    counter = torch.full((1,), 5, dtype=torch.int32, device=DEVICE)
    copy = torch.zeros(1, 576, dtype=torch.float16, device=DEVICE)
    gather_rows(empty, counts, 8, rows, claimed, counter, counter, counter, counter, copy)
    assert int(counter) == 5 and (claimed == 0).all()
