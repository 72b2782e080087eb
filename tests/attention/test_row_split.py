"""Requests of more query rows than the few-row kernels hold, run as parts of whole query
tokens (``attention/row_split.py``): the parts' arrays, the same output as whole requests,
CUDA-graph re-plans into the first plan's buffers, the planner's choice and its errors."""

from __future__ import annotations

import pytest
import torch

from fp8mla import BatchMLAPagedAttentionWrapper
from fp8mla.attention.plan_state import build_plan_state
from fp8mla.attention.planner import row_split_tokens
from fp8mla.attention.row_split import split_requests
from fp8mla.attention.targets import INTERPRETER, TARGETS
from fp8mla.testing import make_batch

from attention_utils import SM_SCALE, assert_matches_reference

E4M3 = torch.float8_e4m3fn


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def plan_on(w, batch, causal=True, **kw):
    w.plan(
        *batch.plan_args(), batch.num_heads, 512, batch.q_pe.shape[-1], batch.page_size,
        causal, SM_SCALE, batch.q_nope.dtype, batch.ckv.dtype, **kw,
    )  # fmt: skip


def wrapper(device, *bufs):
    ws = torch.empty(16 << 20, dtype=torch.uint8, device=device)
    return BatchMLAPagedAttentionWrapper(ws, bool(bufs), *bufs, backend="triton")


def test_parts_arrays():
    # requests of 5, 0, 2 query tokens over 7, 0, 3 pages of 4 tokens; 2 tokens a part
    state = build_plan_state(
        i32([0, 5, 5, 7]), i32([0, 7, 7, 10]), i32(list(range(100, 110))), i32([26, 0, 9]),
        num_heads=16, head_dim_ckv=512, head_dim_kpe=64, page_size=4, causal=True,
        sm_scale=0.1, q_dtype=torch.bfloat16, kv_dtype=E4M3, device=torch.device("cpu"),
        graph_buffers=None,
    )  # fmt: skip
    s = split_requests(state, 2)
    assert s.batch == 4  # [2, 2, 1] tokens of request 0, [2] of request 2
    assert s.qo_indptr.tolist() == [0, 2, 4, 5, 7]
    assert s.kv_indptr.tolist() == [0, 7, 14, 21, 24]
    # a part whose last token is k before the request's last sees k fewer tokens
    assert s.kv_len.tolist() == [23, 25, 26, 9]
    assert s.kv_indices.tolist() == list(range(100, 107)) * 3 + [107, 108, 109]


@pytest.mark.parametrize("page_size, causal", [(1, True), (16, False), (64, True)])
def test_parts_match_the_reference(device, page_size, causal):
    # 4, 3, 1 and 0 query tokens of 16 heads (64, 48, 16 rows), kv_len 1 and 0 among them;
    # unused slots hold NaN codes
    batch = make_batch(
        [70, 33, 1, 0, 5], 16, qo_lens=[4, 3, 1, 0, 4], page_size=page_size, device=device,
        generator=gen(page_size),
    )  # fmt: skip
    w = wrapper(device)
    plan_on(w, batch, causal=causal, split_rows=True)
    assert w._launch.kernel.grid[1] == 2 + 2 + 1 + 2  # parts in the grid
    out, lse = w.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, return_lse=True,
                     **batch.scale_kwargs())  # fmt: skip
    assert_matches_reference(batch, out, lse, causal=causal)


def test_graph_replans_refill_the_first_plans_parts(device):
    # a CUDA-graph wrapper (on a CPU: the same buffers, no capture) planned for 4 tokens of
    # 32 heads, re-planned with fewer tokens and other lengths, then with too many
    cap = 3
    bufs = (torch.zeros(cap + 1, dtype=torch.int32, device=device),
            torch.zeros(cap + 1, dtype=torch.int32, device=device),
            torch.zeros(64, dtype=torch.int32, device=device),
            torch.zeros(cap, dtype=torch.int32, device=device))  # fmt: skip
    w = wrapper(device, *bufs)
    first = make_batch([40, 9, 30], 32, qo_lens=4, page_size=16, device=device, generator=gen(1))
    plan_on(w, first, split_rows=True)
    split = w._graph.split
    assert split.batch == cap * 4 and w._launch.kernel.grid[1] == cap * 4
    for seed, lens, qo in [(2, [5, 60], [2, 3]), (3, [17, 4, 33], [1, 4, 2])]:
        b = make_batch(lens, 32, qo_lens=qo, page_size=16, device=device, generator=gen(seed))
        plan_on(w, b)
        assert w._graph.split is split and w._launch.fixed["qo_indptr_ptr"] is split.qo_indptr
        out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, return_lse=True, **b.scale_kwargs())
        assert_matches_reference(b, out, lse, causal=True)
    more = make_batch([40], 32, qo_lens=5, page_size=16, device=device, generator=gen(4))
    with pytest.raises(ValueError, match="at most 128 query rows"):
        plan_on(w, more)


def test_split_rows_errors(device):
    batch = make_batch([40], 64, qo_lens=2, page_size=16, device=device, generator=gen(5))
    with pytest.raises(ValueError, match="at most 32 heads with split_rows=True"):
        plan_on(wrapper(device), batch, split_rows=True)


def test_planner_splits_speculative_rows_on_sm90():
    sm90 = TARGETS["sm90"]
    assert row_split_tokens(sm90, E4M3, 16, 4) == 2  # 64 rows: two parts of 2 tokens
    assert row_split_tokens(sm90, E4M3, 32, 2) == 1  # GLM-5 at TP2 with one draft token
    assert row_split_tokens(sm90, E4M3, 16, 2) is None  # 32 rows: one tile already
    assert row_split_tokens(sm90, E4M3, 128, 2) is None  # a token is past 32 rows
    assert row_split_tokens(sm90, E4M3, 16, 64) is None  # an extend chunk: many-row kernels
    assert row_split_tokens(sm90, torch.bfloat16, 16, 4) is None  # the ping-pong kernel wins
    assert row_split_tokens(sm90, E4M3, 16, 16) is None  # 8 parts: more than the table's 4
    assert row_split_tokens(INTERPRETER, E4M3, 16, 4) is None
    assert row_split_tokens(TARGETS["sm100"], E4M3, 16, 4) is None
