"""One SGLang forward batch of a DeepSeek Sparse Attention model, described for fp8mla's DSA calls.

Every query token gets a row: the request it belongs to and how many positions it sees
(causal: its own position + 1). Requests are described by their page tables at 64 tokens a
page (the indexer key cache's pages, ``real_page_table`` in SGLang's ``dsa`` backend:
``req_to_token[req, ::64] // 64``) and by their row of ``req_to_token``, which maps a
request-relative position to its KV slot (SGLang's ``page_table_1``).

Host lengths come from what SGLang keeps on the host (``seq_lens_cpu``,
``extend_seq_lens_cpu``); nothing is read back from the device. Decode under CUDA graphs uses
:class:`GraphBuffers`: the same description in static buffers rewritten before each replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mla.integrations.common import IntegrationConfigError

PAGE_SIZE = 64  # tokens per page of SGLang's DSA pools (its indexer key cache is paged so)


@dataclass(frozen=True)
class DSABatch:
    """The query tokens of one forward batch and the requests they belong to."""

    num_tokens: int  # query tokens with a row (host)
    token_len: torch.Tensor  # int32 [T]: positions token t sees (its own included)
    token_req: torch.Tensor | None  # int32 [T]: its request's row of block_table; None: row t
    req_rows: torch.Tensor  # int32 [T]: its request's row of req_to_token
    req: torch.Tensor  # int32 [B]: each request's row of req_to_token
    seq_lens: torch.Tensor  # int32 [B]: tokens of each request, the new ones included
    block_table: torch.Tensor  # int32 [B, pages]: page ids of each request's positions
    max_len: int  # block_table's width in positions (pages × 64)
    max_seq: int  # the longest request's tokens (host; max_len under CUDA graphs)

    @property
    def decode(self) -> bool:
        """One query token a request, token t of request t."""
        return self.token_req is None


def _host_ints(values, n: int) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values[:n].to(device="cpu", dtype=torch.int64)
    return torch.tensor(list(values)[:n], dtype=torch.int64)


def page_table(req_to_token: torch.Tensor, req: torch.Tensor, pages: int) -> torch.Tensor:
    """int32 ``[B, pages]``: the page id of each request's positions ``64 j`` (a paged
    allocator keeps a page's tokens at slots ``page * 64 + offset``)."""
    cols = torch.arange(pages, device=req_to_token.device) * PAGE_SIZE
    table = req_to_token[req.long()[:, None], cols[None, :]]
    return torch.div(table, PAGE_SIZE, rounding_mode="floor").to(torch.int32)


def _check_mode(forward_batch) -> bool:
    """True for decode (or idle), False for a batch of new tokens over cached prefixes."""
    mode = forward_batch.forward_mode
    if mode.is_decode_or_idle():
        return True
    if mode.is_extend_or_draft_extend_or_mixed():  # EXTEND, MIXED, SPLIT_PREFILL
        return False
    raise IntegrationConfigError(
        f"fp8mla (sglang): forward mode {mode.name} is not supported for DeepSeek Sparse "
        "Attention; fp8mla serves decode, extend and mixed batches"
    )


def describe_batch(forward_batch, req_to_token: torch.Tensor) -> DSABatch:
    """The batch's :class:`DSABatch`, its page table as wide as its longest request."""
    decode = _check_mode(forward_batch)
    bs = int(forward_batch.batch_size)
    seq_lens = forward_batch.seq_lens[:bs].to(torch.int32)
    device = seq_lens.device
    seq_cpu = forward_batch.seq_lens_cpu
    # every SGLang path that reaches here sets seq_lens_cpu (needs_cpu_seq_lens); eager fallback
    seq_cpu = _host_ints(seq_lens.cpu() if seq_cpu is None else seq_cpu, bs)
    req = forward_batch.req_pool_indices[:bs].to(torch.int32)
    if decode:
        num_tokens, token_len, token_req, req_rows = bs, seq_lens, None, req
    else:
        if forward_batch.extend_seq_lens_cpu is None:
            raise ValueError("expected extend_seq_lens_cpu on an extend batch, got None")
        ext = _host_ints(forward_batch.extend_seq_lens_cpu, bs)
        if bool((ext > seq_cpu).any()):
            raise ValueError(
                f"expected extend lengths within the sequence lengths, got {ext.tolist()} "
                f"over {seq_cpu.tolist()}"
            )
        num_tokens = int(ext.sum())
        rows = torch.repeat_interleave(torch.arange(bs), ext, output_size=num_tokens)
        first = torch.cumsum(ext, 0) - ext  # each request's first token
        # token j of request b (prefix p_b) sees p_b + j + 1 positions
        lens = (seq_cpu - ext)[rows] + torch.arange(num_tokens) - first[rows] + 1
        token_len = lens.to(device=device, dtype=torch.int32)
        token_req = rows.to(device=device, dtype=torch.int32)
        req_rows = req[token_req.long()]
    pages = -(-int(seq_cpu.max()) // PAGE_SIZE) if bs else 0
    return DSABatch(
        num_tokens=num_tokens,
        token_len=token_len,
        token_req=token_req,
        req_rows=req_rows,
        req=req,
        seq_lens=seq_lens,
        block_table=page_table(req_to_token, req, pages),
        max_len=pages * PAGE_SIZE,
        max_seq=int(seq_cpu.max()) if bs else 0,
    )


class GraphBuffers:
    """Static buffers of decode batches up to ``max_bs`` requests for CUDA graphs: a captured
    graph reads them in place, :meth:`describe` rewrites them before each replay. The page
    table spans every position ``req_to_token`` can hold, so one captured launch serves any
    context length."""

    def __init__(self, max_bs: int, req_to_token: torch.Tensor) -> None:
        device = req_to_token.device
        self.max_pages = -(-req_to_token.shape[1] // PAGE_SIZE)
        i32 = dict(dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(max_bs, **i32)
        self.req_rows = torch.zeros(max_bs, **i32)
        self.block_table = torch.zeros(max_bs, self.max_pages, **i32)
        self.req_to_token = req_to_token

    @property
    def max_bs(self) -> int:
        return self.seq_lens.shape[0]

    def describe(self, forward_batch) -> DSABatch:
        """The decode batch, written into the buffers; views of them, the same every call."""
        if not _check_mode(forward_batch):
            raise IntegrationConfigError(
                "fp8mla (sglang): CUDA graphs cover decode for DeepSeek Sparse Attention, got "
                f"{forward_batch.forward_mode.name}"
            )
        bs = int(forward_batch.batch_size)
        if bs > self.max_bs:
            raise ValueError(f"expected at most {self.max_bs} requests (init_cuda_graph_state), "
                             f"got {bs}")  # fmt: skip
        req = forward_batch.req_pool_indices[:bs]
        self.seq_lens[:bs].copy_(forward_batch.seq_lens[:bs])
        self.req_rows[:bs].copy_(req)
        seq_cpu = forward_batch.seq_lens_cpu
        if seq_cpu is not None and bs:
            # the columns the batch reads; the rest lie past every row's length, never read
            pages = min(self.max_pages, -(-int(_host_ints(seq_cpu, bs).max()) // PAGE_SIZE))
        else:  # capture: SGLang may leave the host mirror unset
            pages = self.max_pages
        self.block_table[:bs, :pages].copy_(page_table(self.req_to_token, req, pages))
        return DSABatch(
            num_tokens=bs,
            token_len=self.seq_lens[:bs],
            token_req=None,
            req_rows=self.req_rows[:bs],
            req=self.req_rows[:bs],
            seq_lens=self.seq_lens[:bs],
            block_table=self.block_table[:bs],
            max_len=self.max_pages * PAGE_SIZE,
            max_seq=self.max_pages * PAGE_SIZE,
        )
