"""Requests with more query rows than the few-row kernels hold, run as parts of whole tokens.

Speculative decode verifies 2–8 tokens a request: at 16–32 heads that is 33–128 query rows,
past the 32 rows of the few-row kernels (the FP8 × FP8 kernel at SM90), which then gave way to
the many-row kernel and doubled the time of a one-token decode. Here each request of ``n``
query tokens becomes ``ceil(n / t)`` parts of at most ``t`` tokens (``t × heads ≤ 32``),
each part a request of its own over the same pages. Under the bottom-right causal mask, a part
whose last token is ``k`` tokens before the request's last sees ``kv_len − k`` tokens: the
same rows as the request's, so the parts compute exactly the request's output rows, in place.
The parts of one request are adjacent in the grid, so they read the same KV close together in
time and the second reads it from the L2.

:func:`split_requests` builds the parts' index arrays on the device: their page-table entries are
copies of the request's (one gather), their lengths the request's less their trim.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mla.attention.plan_state import PlanState
from fp8mla.attention.planner import FEW_ROWS, row_split_tokens
from fp8mla.attention.targets import Target


@dataclass(frozen=True)
class RowSplit:
    """The parts of one plan: ``tokens`` query tokens a part (the last of a request may
    have fewer), ``batch`` parts in the grid (padded with empty parts under CUDA graphs) and
    their int32 device arrays, laid out as ``plan()``'s."""

    tokens: int
    batch: int
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_len: torch.Tensor

    @property
    def indices(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.qo_indptr, self.kv_indptr, self.kv_indices, self.kv_len


def parts_of(state: PlanState, tokens: int) -> int:
    """Parts of the longest request: what a CUDA-graph capture sizes its buffers by."""
    return max(1, -(-state.max_qo_len // tokens))


def split_requests(state: PlanState, tokens: int, into: RowSplit | None = None) -> RowSplit:
    """The parts of ``state``'s requests, ``tokens`` query tokens each. ``into``: the fixed
    buffers of a CUDA-graph wrapper's first split (filled and padded, as ``plan()`` fills its
    own: surplus parts have no tokens and no KV); ``ValueError`` when the batch outgrows them."""
    dev = state.device
    q_ptr, k_ptr, src, trim, starts, pages = [0], [0], [], [], [], []
    entry = 0
    for b, (n, p) in enumerate(zip(state.qo_lens, state.kv_pages)):
        for first in range(0, n, tokens):
            count = min(tokens, n - first)
            q_ptr.append(q_ptr[-1] + count)
            k_ptr.append(k_ptr[-1] + p)
            src.append(b)
            trim.append(n - first - count if state.causal else 0)
            starts.append(entry)
            pages.append(p)
        entry += p
    parts, entries = len(src), k_ptr[-1]
    i32 = dict(dtype=torch.int32, device=dev)
    if parts:
        # each part's entries: its request's, gathered from the plan's device page table
        start = torch.tensor(starts, dtype=torch.int64)
        shift = (start - torch.tensor(k_ptr[:-1], dtype=torch.int64)).to(dev)
        count = torch.tensor(pages, dtype=torch.int64).to(dev)
        pos = torch.arange(entries, device=dev) + torch.repeat_interleave(
            shift, count, output_size=entries
        )
        kv_indices = state.kv_indices[pos].to(torch.int32)
        lens = state.kv_len[torch.tensor(src, device=dev)] - torch.tensor(trim, **i32)
        kv_len = lens.clamp_(min=0).to(torch.int32)
    else:
        kv_indices = torch.zeros(0, **i32)
        kv_len = torch.zeros(0, **i32)
    qo_indptr = torch.tensor(q_ptr, dtype=torch.int32).to(dev)
    kv_indptr = torch.tensor(k_ptr, dtype=torch.int32).to(dev)
    if into is None:
        return RowSplit(tokens, parts, qo_indptr, kv_indptr, kv_indices, kv_len)
    cap = into.batch
    if parts > cap or entries > into.kv_indices.numel():
        raise ValueError(
            f"expected at most {cap} request parts and {into.kv_indices.numel()} part entries "
            f"under CUDA graphs (fixed by the first plan), got {parts} and {entries}; plan the "
            f"largest batch first"
        )
    into.qo_indptr[: parts + 1].copy_(qo_indptr)
    into.qo_indptr[parts + 1 :].fill_(q_ptr[-1])
    into.kv_indptr[: parts + 1].copy_(kv_indptr)
    into.kv_indptr[parts + 1 :].fill_(entries)
    into.kv_indices[:entries].copy_(kv_indices)
    into.kv_len[:parts].copy_(kv_len)
    into.kv_len[parts:].fill_(0)
    return into


def graph_buffers(state: PlanState, tokens: int, entries_cap: int) -> RowSplit:
    """Fixed buffers for a CUDA-graph wrapper's parts: ``state.batch`` (the capture's request
    capacity) × :func:`parts_of` parts, ``entries_cap`` × as many entries."""
    parts = parts_of(state, tokens)
    cap = state.batch * parts
    i32 = dict(dtype=torch.int32, device=state.device)
    return RowSplit(
        tokens,
        cap,
        torch.zeros(cap + 1, **i32),
        torch.zeros(cap + 1, **i32),
        torch.zeros(max(1, entries_cap * parts), **i32),
        torch.zeros(cap, **i32),
    )


def make_row_split(
    state: PlanState,
    split_rows: bool | None,
    target: Target,
    kv_dtype: torch.dtype,
    *,
    graph: bool,
) -> RowSplit | None:
    """The parts the batch runs as: forced (``split_rows=True``: ``ValueError`` above
    ``FEW_ROWS`` heads), forbidden (False), or the planner's choice (None); under CUDA graphs
    (``graph``) in fixed buffers that later plans refill."""
    if split_rows is False:
        return None
    if split_rows:
        if state.num_heads > FEW_ROWS:
            raise ValueError(
                f"expected at most {FEW_ROWS} heads with split_rows=True (a part holds whole "
                f"query tokens of at most {FEW_ROWS} rows), got {state.num_heads}"
            )
        tokens = FEW_ROWS // state.num_heads
    else:
        tokens = row_split_tokens(
            target, kv_dtype, state.num_heads, state.max_qo_len, state.head_dim_kpe
        )
        if tokens is None:
            return None
    if not graph:
        return split_requests(state, tokens)
    return split_requests(
        state, tokens, into=graph_buffers(state, tokens, state.kv_indices.numel())
    )
