"""Which kernel a sparse plan takes (``sparse_plan.sm90_kernel``): the SM90
FP8 × FP8 kernel for bf16 queries over the packed cache where the target's table says so, the
FP8 ping-pong kernel where a plan names it (or a table takes it from some head count on), the
16-bit ping-pong kernel from 64 heads and 128 tokens on (SM90's table) or where a plan names it,
the portable kernel elsewhere, and a ValueError naming the reason when a named SM90 kernel
cannot serve."""

from __future__ import annotations

import pytest
import torch

from fp8mla.attention.targets import TARGETS
from fp8mla.dsa.sparse_plan import SPARSE_TABLES, sm90_kernel

SM90 = TARGETS["sm90"]
BF16, FP16, U8 = torch.bfloat16, torch.float16, torch.uint8


@pytest.mark.parametrize(
    "heads, tokens, kernel",
    [(1, 1, "fp8qk"), (16, 4096, "fp8qk"), (32, 128, "fp8qk"), (63, 256, "fp8qk"),
     (64, 1, "fp8qk"), (64, 127, "fp8qk"), (64, 128, "pingpong"), (127, 64, "fp8qk"),
     (128, 63, "fp8qk"), (128, 64, "pingpong"), (128, 256, "pingpong")],
)  # fmt: skip
def test_auto_on_sm90_for_bf16_queries_over_the_packed_cache(heads, tokens, kernel):
    """The FP8 × FP8 kernel below 64 heads and for small batches, the 16-bit ping-pong kernel
    (64-row tiles, a row converted once a tile) from 64 heads and 128 tokens on, and from 128
    heads and 64 tokens."""
    assert sm90_kernel("auto", SM90, heads, BF16, U8, False, num_tokens=tokens) == kernel
    assert sm90_kernel("auto", SM90, heads, BF16, U8, False) == "fp8qk"  # one token


@pytest.mark.parametrize(
    "target, q, kv, interp",
    [(SM90, FP16, U8, False), (SM90, BF16, BF16, False), (SM90, BF16, U8, True),
     (TARGETS["sm100"], BF16, U8, False), (TARGETS["sm120"], BF16, U8, False),
     (TARGETS["gfx942"], BF16, U8, False)],
)  # fmt: skip
def test_auto_keeps_the_portable_kernel_elsewhere(target, q, kv, interp):
    assert sm90_kernel("auto", target, 32, q, kv, interpreted=interp) is None
    assert sm90_kernel("portable", target, 32, q, kv, interpreted=interp) is None


@pytest.mark.parametrize(
    "target, q, kv, why",
    [(SM90, FP16, U8, "bf16 queries"), (SM90, BF16, BF16, "packed FP8 cache"),
     (TARGETS["sm120"], BF16, U8, "SM90")],
)  # fmt: skip
@pytest.mark.parametrize("kernel", ["fp8qk", "pingpong8", "pingpong"])
def test_sm90_kernel_asked_where_it_cannot_serve_says_why(target, q, kv, why, kernel):
    with pytest.raises(ValueError, match=f'"{kernel}".*{why}'):
        sm90_kernel(kernel, target, 32, q, kv, interpreted=False)


@pytest.mark.parametrize("heads", [1, 16, 64, 128])
def test_pingpong8_only_where_named_on_the_sm90_table(heads):
    """The FP8 ping-pong kernel's sparse route is taken when a plan names it, never by the
    SM90 table (``pingpong8_from_heads`` None)."""
    assert SPARSE_TABLES["sm90"].pingpong8_from_heads is None
    assert sm90_kernel("auto", SM90, heads, BF16, U8, interpreted=False) != "pingpong8"
    assert sm90_kernel("pingpong8", SM90, heads, BF16, U8, interpreted=False) == "pingpong8"
    assert sm90_kernel("pingpong", SM90, heads, BF16, U8, interpreted=False) == "pingpong"
    assert sm90_kernel("portable", SM90, heads, BF16, U8, interpreted=False) is None


@pytest.mark.parametrize("heads, tiles64", [(32, False), (63, False), (64, True), (128, True)])
@pytest.mark.parametrize("kernel", ["pingpong8", "pingpong"])
def test_a_table_takes_a_pingpong_kernel_from_its_head_count_on(monkeypatch, heads, tiles64,
                                                                 kernel):  # fmt: skip
    import dataclasses

    first = {"pingpong8_from_heads": 64} if kernel == "pingpong8" else {"pingpong_from": ((64, 1),)}
    table = dataclasses.replace(SPARSE_TABLES["sm90"], **first)
    monkeypatch.setitem(SPARSE_TABLES, "sm90", table)
    want = kernel if tiles64 else "fp8qk"
    assert sm90_kernel("auto", SM90, heads, BF16, U8, interpreted=False) == want
    assert sm90_kernel("fp8qk", SM90, heads, BF16, U8, interpreted=False) == "fp8qk"


@pytest.mark.parametrize("config", ["pingpong8", "pingpong"])
def test_pingpong_kernels_plan_compacted_lists_and_16bit_rope(config):
    """The ping-pong kernels have no in-place lists build: a plan asking for one is refused
    before anything is allocated, and their options are the 16-bit RoPE mode alone (the
    launch adds ``WAIT_PRIOR`` where it is the compaction's dependent)."""
    from fp8mla.dsa.sparse_sm90 import fp8qk_options, fp8qk_sparse, sparse_options

    with pytest.raises(ValueError, match="compacted lists"):
        fp8qk_sparse(1, 128, 2048, 0.1, torch.empty(0, dtype=U8), torch.device("cpu"),
                     lists=True, config=config)  # fmt: skip
    with pytest.raises(ValueError, match="fp8qk.*pingpong8.*pingpong"):
        fp8qk_sparse(1, 128, 2048, 0.1, torch.empty(0, dtype=U8), torch.device("cpu"),
                     config="rows")  # fmt: skip
    for waits in (False, True):
        assert sparse_options(config, waits) == {"ROPE_16BIT": True}
        for lists in (False, True):
            assert sparse_options("fp8qk", waits, lists) == fp8qk_options(waits, lists)


def test_the_wrapper_names_the_sm90_kernels_in_its_error():
    import fp8mla

    w = fp8mla.SparseMLAWrapper(torch.empty(1 << 20, dtype=U8))
    with pytest.raises(ValueError, match="fp8qk, pingpong8, pingpong or copy16"):
        w.plan(1, 16, 64, 64, BF16, 0.1, kernel="pingpong16")


@pytest.mark.parametrize(
    "pages, rows_per_page, lists_apart, tokens, reads",
    [(8, 64, 64, 4, True), (8, 64, 72, 4, False), (8, 64, 72, 1, True), (8, 65, 64, 4, False),
     (0, 64, 64, 0, True)],
)  # fmt: skip
def test_fp8qk_reads_the_lists_in_place_where_slots_are_rows(
    pages, rows_per_page, lists_apart, tokens, reads
):
    """The SM90 path reads the index lists as the caller gives them when a slot is a cache row
    and token ``t``'s list starts at entry ``t · topk``; pages with a gap after them (65 rows
    for 64 slots) or lists further apart go through the compaction."""
    from fp8mla.dsa.layout import token_view
    from fp8mla.dsa.sparse_sm90 import cache_rows, reads_lists

    topk = 64
    store = torch.zeros(max(pages, 1), rows_per_page, 656, dtype=U8)
    cache = store[:pages, :64]
    wide = torch.zeros(tokens, lists_apart, dtype=torch.int32)
    assert reads_lists(cache_rows(token_view(cache)), wide[:, :topk], topk) == reads


@pytest.mark.parametrize(
    "topk, splits, row_tiles, in_place",
    [(2048, 32, 4, True), (2048, 64, 2, True), (2048, 16, 4, False), (2048, 1, 4, False),
     (64, 1, 4, True), (1, 1, 2, True), (100, 2, 4, True), (130, 2, 4, False),
     (2048, 1, 1, True), (2048, 16, 1, True), (16384, 1, 1, True)],
)  # fmt: skip
def test_fp8qk_plans_the_lists_in_place_where_one_tile_or_one_row_tile(
    topk, splits, row_tiles, in_place
):
    """The in-place lists where a token's rows are one row tile (up to 32 heads), or where a
    split reads one 64-token tile (one token's decode over the GPU's splits); the compaction
    where several row tiles a token each read several tiles."""
    from fp8mla.dsa.sparse_sm90 import plans_lists

    assert plans_lists(topk, splits, row_tiles) == in_place


def _sparse_plan(tokens: int, heads: int, topk: int = 2048, sms: int = 132):
    from fp8mla.attention.planner import make_launch_plan

    return make_launch_plan(
        batch=tokens, num_heads=heads, max_qo_len=1, max_kv_len=topk, sms=sms,
        max_splits_by_workspace=64, target=TARGETS["sm90"], kv_dtype=torch.float8_e4m3fn,
        config="fp8qk", head_dim_kpe=64, q_dtype=torch.bfloat16,
    )  # fmt: skip


@pytest.mark.parametrize(
    "tokens, heads, in_grid",
    [(1, 32, 2), (2, 32, 1), (4, 32, 1), (8, 16, 1), (128, 16, 0), (1, 128, 0)],
)  # fmt: skip
def test_few_tokens_merge_their_splits_in_the_grid(tokens, heads, in_grid):
    """A split plan of one row tile a token whose programs fit the GPU at once merges in its
    grid, with a second, merging program a split where twice the programs fit twice over
    (one token); a batch with no splits (128 tokens) or several row tiles a token (128
    heads) keeps the merge launch."""
    from fp8mla.dsa.sparse_sm90 import merges_in_grid

    plan = _sparse_plan(tokens, heads)
    assert merges_in_grid(plan, tokens, 132) == in_grid
    programs = tokens * plan.m_tiles * plan.num_splits
    if in_grid:  # one program an SM: a grid larger than the GPU never waits on itself
        assert merges_in_grid(plan, tokens, programs - 1) == 0
        assert merges_in_grid(plan, tokens, programs) == 1
    if in_grid == 2:  # the merging programs only where this grid and the next fit doubled
        assert merges_in_grid(plan, tokens, 4 * programs - 1) == 1
        assert merges_in_grid(plan, tokens, 4 * programs) == 2


def test_the_merge_launch_stays_when_asked(monkeypatch):
    from fp8mla.dsa.sparse_sm90 import merges_in_grid

    monkeypatch.setenv("FP8MLA_MERGE_IN_GRID", "0")
    assert merges_in_grid(_sparse_plan(1, 32), 1, 132) == 0
