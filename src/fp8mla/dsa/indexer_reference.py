"""PyTorch statements of the lightning indexer's calls: the CPU path of ``fp8mla.dsa.indexer``
(float32) and the tests' oracle (float64). Every function reads the same bytes the kernels
read and means what their docstrings in ``fp8mla.dsa.indexer`` say.
"""

from __future__ import annotations

import torch

from fp8mla.dsa.index_cache import index_cache_view


def e4m3_values(codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """e4m3 codes (``float8_e4m3fn`` or uint8) as ``dtype`` values, exactly."""
    return codes.view(torch.float8_e4m3fn).to(torch.float32).to(dtype)


def weighted_relu_scores(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``[T, S]`` = ``Σ_h w[t, h] · ReLU(q[t, h] · k[s])`` for ``q [T, H, D]``, ``w [T, H]``,
    ``k [S, D]`` (one dtype), in blocks of query rows that bound the temporaries."""
    out = torch.empty(q.shape[0], k.shape[0], dtype=q.dtype, device=q.device)
    step = max(1, (1 << 24) // max(1, q.shape[1] * k.shape[0]))
    for t0 in range(0, q.shape[0], step):
        s = torch.einsum("thd,sd->ths", q[t0 : t0 + step], k).clamp_min_(0)
        out[t0 : t0 + step] = torch.einsum("ths,th->ts", s, w[t0 : t0 + step])
    return out


def row_lengths(context_lens: torch.Tensor, batch: int, next_n: int) -> torch.Tensor:
    """``[B * next_n]`` lengths: ``[B, next_n]`` as given, or DeepGEMM's 1-D ``[B]`` (the last
    token's length; earlier tokens see one fewer each)."""
    if context_lens.dim() == 2:
        return context_lens.reshape(-1)
    n = torch.arange(next_n, device=context_lens.device, dtype=context_lens.dtype)
    return (context_lens[:, None] - next_n + 1 + n[None, :]).reshape(-1)


def paged_mqa_logits_reference(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    max_context_len: int,
    *,
    page_size: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``[B * next_n, max_context_len]`` logits in ``dtype`` (returned as float32 for float32):
    positions past a row's length -inf, keys read through the block table."""
    view = index_cache_view(index_cache, page_size=page_size)
    batch, next_n, heads, _ = q.shape
    lens = row_lengths(context_lens, batch, next_n).clamp(0, max_context_len).tolist()
    out = torch.full((batch * next_n, max_context_len), float("-inf"), dtype=dtype,
                     device=q.device)  # fmt: skip
    codes, scales = view.codes(), view.scales()
    qv = e4m3_values(q, dtype)
    for b in range(batch):
        rows = range(b * next_n, (b + 1) * next_n)
        seen = max(lens[r] for r in rows)
        if seen == 0:
            continue
        pos = torch.arange(seen, device=q.device)
        page = block_table[b].long()[pos // view.page_size].clamp(0, view.num_pages - 1)
        off = pos % view.page_size
        k = e4m3_values(codes[page, off], dtype) * scales[page, off].to(dtype)[:, None]
        w = weights[b * next_n : (b + 1) * next_n].to(dtype)
        logits = weighted_relu_scores(qv[b], w, k)
        for i, r in enumerate(rows):
            out[r, : lens[r]] = logits[i, : lens[r]]
    return out


def mqa_logits_reference(
    q: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    key_scales: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    *,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``[S, SK]`` logits in ``dtype``, -inf outside ``[ks[t], ke[t])``."""
    k = e4m3_values(keys, dtype) * key_scales.reshape(-1).to(dtype)[:, None]
    logits = weighted_relu_scores(e4m3_values(q, dtype), weights.to(dtype), k)
    cols = torch.arange(keys.shape[0], device=q.device)
    inside = (cols[None, :] >= ks[:, None]) & (cols[None, :] < ke[:, None])
    return logits.masked_fill(~inside, float("-inf"))


def order_keys(x: torch.Tensor) -> torch.Tensor:
    """float32 values as int64 keys in their order (-0 as +0, NaN the largest)."""
    x = torch.where(x == 0, torch.zeros_like(x), x)
    b = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    key = torch.where(b >= 0x80000000, b ^ 0xFFFFFFFF, b | 0x80000000)
    return torch.where(x.isnan(), 0xFFFFFFFF, key)


def topk_reference(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[rows, k]`` int32: per row the positions (relative to ``starts``, default 0) of the
    ``k`` largest values among columns ``[starts, lengths)``, the lower position first among
    equal values (float32 order; a float64 input compares as float64), in ascending order,
    -1 after them."""
    rows, cols = logits.shape
    dev = logits.device
    lo = torch.zeros(rows, dtype=torch.int64, device=dev) if starts is None else starts.long()
    lo = lo.clamp(0, cols)
    hi = torch.maximum(lengths.long().clamp(0, cols), lo)
    out = torch.full((rows, k), -1, dtype=torch.int32, device=dev)
    col = torch.arange(cols, device=dev)
    if logits.dtype == torch.float64:
        key = logits.masked_fill(logits.isnan(), float("inf"))
        key = torch.where(key == 0, torch.zeros_like(key), key)
    else:
        key = order_keys(logits.float())
    for r in range(rows):
        a, b = int(lo[r]), int(hi[r])
        if b <= a:
            continue
        # stable descending sort: equal keys keep their order, the lower position first
        order = torch.sort(key[r, a:b], descending=True, stable=True).indices[:k]
        chosen = torch.sort(col[a:b][order]).values - a
        out[r, : chosen.numel()] = chosen.to(torch.int32)
    return out


def to_slots_reference(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    req_ids: torch.Tensor | None = None,
    num_pages: int | None = None,
) -> torch.Tensor:
    """``[T, k]`` int32 cache slots of request-relative ``positions`` (-1 stays -1, and so does
    a position whose page lies past the block table or outside ``[0, num_pages)``)."""
    t, _ = positions.shape
    batch, width = block_table.shape
    req = (torch.arange(t, device=positions.device) // max(1, t // max(batch, 1))
           if req_ids is None else req_ids.long())  # fmt: skip
    pos = positions.long()
    ok = (pos >= 0) & (req[:, None] >= 0) & (req[:, None] < batch)
    page_of = torch.where(ok, pos // page_size, 0)
    ok &= page_of < width
    page = block_table.long()[
        req.clamp(0, max(batch - 1, 0))[:, None], page_of.clamp(max=width - 1)
    ]
    ok &= page >= 0
    if num_pages is not None:
        ok &= page < num_pages
    slot = page * page_size + pos % page_size
    return torch.where(ok, slot, -1).to(torch.int32)
