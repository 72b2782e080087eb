"""One SGLang forward batch described the way ``BatchMLAPagedAttentionWrapper.plan()`` wants it.

Host arrays come from the lengths SGLang already keeps on the host (``seq_lens_cpu``,
``extend_seq_lens_cpu``, ``draft_token_num``), so planning reads nothing back from the GPU.
The KV read stream comes from SGLang's own ``KVIndexTranslator.pack_read_stream`` (token
slots, translated on pools that move pages); with a page size above 1 it is thinned to one
id per page, the pool then being read as ``[pages, page_size, 576]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mla.integrations.common import IntegrationConfigError, pages_from_tokens


@dataclass
class BatchPlan:
    """Arguments of one ``plan()`` call (host indptr/lengths, device page ids)."""

    qo_indptr: torch.Tensor  # int32 [B + 1], host
    kv_indptr: torch.Tensor  # int32 [B + 1], host, in pages
    kv_indices: torch.Tensor  # int32 [nnz pages], device
    kv_len: torch.Tensor  # int32 [B], host, in tokens
    causal: bool


def _host_lens(values, bs: int) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values[:bs].to(device="cpu", dtype=torch.int32)
    return torch.tensor(list(values)[:bs], dtype=torch.int32)


def _indptr(lens: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lens.numel() + 1, dtype=torch.int32)
    torch.cumsum(lens, 0, out=out[1:])
    return out


def query_and_kv_lens(forward_batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """``(qo_len host, kv_len host, kv_len device, causal)`` for the batch's forward mode."""
    mode = forward_batch.forward_mode
    bs = int(forward_batch.batch_size)
    seq_lens = forward_batch.seq_lens[:bs]
    seq_lens_cpu = forward_batch.seq_lens_cpu
    if seq_lens_cpu is None:  # every SGLang path that reaches here sets it; eager fallback
        seq_lens_cpu = seq_lens.cpu()
    kv_cpu = _host_lens(seq_lens_cpu, bs)
    if mode.is_decode_or_idle():
        return torch.ones(bs, dtype=torch.int32), kv_cpu, seq_lens, False
    if mode.is_target_verify():
        spec = forward_batch.spec_info
        topk = int(getattr(spec, "topk", 1) or 1)
        if topk > 1:
            raise IntegrationConfigError(
                "fp8mla (sglang): tree verification (--speculative-eagle-topk > 1) is not "
                "supported; use --speculative-eagle-topk 1"
            )
        n = int(spec.draft_token_num)
        return torch.full((bs,), n, dtype=torch.int32), kv_cpu + n, seq_lens + n, True
    if mode.is_extend():  # EXTEND, MIXED, SPLIT_PREFILL: new tokens over a cached prefix
        qo_cpu = _host_lens(forward_batch.extend_seq_lens_cpu, bs)
        return qo_cpu, kv_cpu, seq_lens, True
    raise IntegrationConfigError(f"fp8mla (sglang): forward mode {mode.name} is not supported")


def build_batch_plan(forward_batch, translator, page_size: int) -> BatchPlan:
    """Describe ``forward_batch`` for ``plan()``; all device work is sync-free."""
    qo_len, kv_len, kv_len_dev, causal = query_and_kv_lens(forward_batch)
    bs = kv_len.numel()
    device = forward_batch.seq_lens.device
    kv_len_dev = kv_len_dev.to(torch.int32)

    num_tokens = int(kv_len.sum())
    token_indptr = torch.zeros(bs + 1, dtype=torch.int32, device=device)
    torch.cumsum(kv_len_dev, 0, out=token_indptr[1:])
    tokens = torch.empty(num_tokens, dtype=torch.int32, device=device)
    if bs and num_tokens:
        is_physical = translator.pack_read_stream(
            forward_batch.kv_loc_plan,
            req_pool_indices=forward_batch.req_pool_indices[:bs],
            seq_lens=kv_len_dev,
            indptr=token_indptr,
            out=tokens,
        )
        # Same finishing step as SGLang's flashinfer_mla backend for ids left virtual.
        if not is_physical and translator.needs_read_translate:
            tokens.copy_(translator.translate_dcp_read_ids(tokens))

    if page_size == 1:
        kv_indptr, kv_indices = _indptr(kv_len), tokens
    else:
        pages = (kv_len + page_size - 1) // page_size
        kv_indptr = _indptr(pages)
        kv_indices = pages_from_tokens(
            tokens, token_indptr, kv_len_dev, page_size, int(kv_indptr[-1])
        )
    return BatchPlan(
        qo_indptr=_indptr(qo_len),
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        kv_len=kv_len,
        causal=causal,
    )
