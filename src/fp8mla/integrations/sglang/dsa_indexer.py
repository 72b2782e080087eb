"""The lightning indexer of SGLang's DSA models on fp8mla: logits and top-k of each query token
over the indexer key cache, through ``fp8mla.dsa`` instead of DeepGEMM (which runs on SM90 and
SM100 only) and SGLang's top-k kernels.

SGLang's ``Indexer`` projects and quantizes the queries, writes the new keys into the pool's
key cache and then calls ``_get_topk_paged`` (decode) or ``_get_topk_ragged`` (prefill); those
two are where DeepGEMM computes the logits. :func:`topk_paged` and :func:`topk_ragged` wrap
them (SGLang ``HookRegistry`` AROUND hooks): when the batch's indexer metadata is fp8mla's
(:class:`FP8MLAIndexerMetadata`, which only fp8mla's backend hands out) the top-k comes from
``fp8mla.dsa.paged_topk`` over the pool's key cache, read in place; otherwise SGLang's own
method runs.

The result is what the attention backend reads: int32 ``[tokens, index_topk]`` positions
relative to each token's request (ascending, -1 padded), the contract of SGLang's unfused
top-k (``SGLANG_DSA_FUSE_TOPK=0``); the backend maps them to KV slots per layer.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.dsa.dsa_indexer_metadata import BaseIndexerMetadata

from fp8mla import dsa
from fp8mla.integrations.sglang.dsa_batch import PAGE_SIZE, DSABatch

LOGITS_BUDGET_BYTES = 256 << 20  # float32 logits a prefill chunk may write (rows × positions)
Q_DTYPES = (torch.float8_e4m3fn, torch.uint8)


class FP8MLAIndexerMetadata(BaseIndexerMetadata):
    """What SGLang's ``Indexer`` reads from ``get_indexer_metadata`` under fp8mla's backend."""

    def __init__(self, batch: DSABatch, pool, req_to_token: torch.Tensor, backend: str) -> None:
        self.batch = batch
        self.pool = pool
        self.req_to_token = req_to_token
        self.backend = backend

    def get_seqlens_int32(self) -> torch.Tensor:
        return self.batch.seq_lens

    def get_page_table_64(self) -> torch.Tensor:
        return self.batch.block_table

    def get_page_table_1(self) -> torch.Tensor:
        return self.req_to_token[self.batch.req.long(), : self.batch.max_len]

    def get_seqlens_expanded(self) -> torch.Tensor:
        return self.batch.token_len

    def topk_transform(self, logits: torch.Tensor, topk: int, **kwargs) -> torch.Tensor:
        """The ``topk`` largest of each row of ``logits [rows, positions]`` (row ``t`` being
        query token ``t``, column ``s`` its request's position ``s``), as request-relative
        positions. SGLang's indexer calls this where it skips the logits (every row sees at
        most ``topk`` positions), on zero logits: every position a row sees."""
        given = sorted(name for name, value in kwargs.items() if value is not None)
        if given:
            raise ValueError(
                "expected logits over request-relative positions (fp8mla's indexer metadata), "
                f"got ragged-layout arguments {given}"
            )
        rows = logits.shape[0]
        if rows > self.batch.num_tokens:
            raise ValueError(f"expected at most {self.batch.num_tokens} rows (the batch's "
                             f"query tokens), got {rows}")  # fmt: skip
        if logits.shape[1] < self.batch.max_seq:
            raise ValueError(f"expected logits over the batch's {self.batch.max_seq} positions, "
                             f"got {logits.shape[1]}")  # fmt: skip
        return dsa.topk(logits.float().contiguous(), self.batch.token_len[:rows], topk,
                        backend=self.backend)  # fmt: skip


def select_topk(
    indexer, meta: FP8MLAIndexerMetadata, layer_id: int, q_fp8: torch.Tensor,
    weights: torch.Tensor, out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The indexer's top-k for every query token of the batch: int32 ``[len(q_fp8), topk]``
    request-relative positions, rows past the batch's tokens -1 (``out`` written in place
    when given).

    ``q_fp8 [T, H, 128]`` e4m3 (its scales folded into ``weights``), ``weights [T, H]`` or
    ``[T, H, 1]`` float32, SGLang's ``Indexer`` its ``index_topk`` and, for models with
    always-kept positions (``index_init_tokens`` / ``index_local_tokens``), the masking of
    its logits."""
    b = meta.batch
    k = int(indexer.index_topk)
    if q_fp8.dim() != 3 or q_fp8.dtype not in Q_DTYPES or q_fp8.shape[0] < b.num_tokens:
        raise ValueError(f"expected q_fp8 [>= {b.num_tokens}, H, 128] float8_e4m3fn, got "
                         f"{list(q_fp8.shape)} {q_fp8.dtype}")  # fmt: skip
    heads = q_fp8.shape[1]
    w = weights[: b.num_tokens].reshape(b.num_tokens, heads).to(torch.float32).contiguous()
    if out is None:
        out = torch.empty(q_fp8.shape[0], k, dtype=torch.int32, device=q_fp8.device)
    out[b.num_tokens :].fill_(-1)
    cache = meta.pool.get_index_k_with_scale_buffer(layer_id)  # [pages, 64 * 132] uint8
    masked = bool(getattr(indexer, "num_init_tokens", 0) or getattr(indexer, "num_local_tokens", 0))
    # decode: one launch over the batch (CUDA-graph static); prefill: chunks of tokens whose
    # logits fit the budget, each token a row with its request's page table
    step = b.num_tokens if b.decode else max(1, LOGITS_BUDGET_BYTES // (4 * max(b.max_len, 1)))
    for t0 in range(0, b.num_tokens, max(step, 1)):
        t1 = min(b.num_tokens, t0 + step)
        table = b.block_table if b.decode else b.block_table[b.token_req[t0:t1].long()]
        q = q_fp8[t0:t1].unsqueeze(1)  # [rows, next_n = 1, H, 128]
        lens = b.token_len[t0:t1]
        call = dict(max_context_len=b.max_len, page_size=PAGE_SIZE, backend=meta.backend)
        if masked:
            logits = dsa.paged_mqa_logits(q, w[t0:t1], cache, table, lens, **call)
            indexer._mask_init_and_local_tokens(logits, lens)
            dsa.topk(logits, lens, k, out=out[t0:t1], backend=meta.backend)
        else:
            out[t0:t1] = dsa.paged_topk(q, w[t0:t1], cache, table, lens, k=k, **call)
    return out


def topk_paged(original, indexer, forward_batch, layer_id, q_fp8, weights, metadata):
    """AROUND hook of ``Indexer._get_topk_paged`` (decode)."""
    if not isinstance(metadata, FP8MLAIndexerMetadata):
        return original(indexer, forward_batch, layer_id, q_fp8, weights, metadata)
    return select_topk(indexer, metadata, layer_id, q_fp8, weights)


def topk_ragged(original, indexer, enable_dual_stream, forward_batch, layer_id, q_fp8, weights,
                metadata, topk_result=None):  # fmt: skip
    """AROUND hook of ``Indexer._get_topk_ragged`` (prefill; ``topk_result`` is the graph
    split op's preallocated output, filled in place)."""
    if not isinstance(metadata, FP8MLAIndexerMetadata):
        return original(indexer, enable_dual_stream, forward_batch, layer_id, q_fp8, weights,
                        metadata, topk_result)  # fmt: skip
    if topk_result is None:
        return select_topk(indexer, metadata, layer_id, q_fp8, weights)
    rows = metadata.batch.num_tokens
    select_topk(indexer, metadata, layer_id, q_fp8[:rows], weights, out=topk_result[:rows])
    return topk_result


__all__ = ["FP8MLAIndexerMetadata", "select_topk", "topk_paged", "topk_ragged"]
