"""The lightning indexer of DeepSeek Sparse Attention on every GPU Triton reaches: FP8 logits of
cached keys against each query token, then its top-k, as DeepGEMM's ``fp8_paged_mqa_logits`` /
``fp8_mqa_logits`` (SM90/SM100 only) and the engines' top-k kernels compute them.

- :func:`paged_mqa_logits`: decode and speculative rows over the paged key cache
  (``fp8mla.dsa.index_cache``): ``logits[t, s] = k_scale[s] · Σ_h w[t, h] · ReLU(q[t, h] ·
  k[s])``, -inf past each row's length (DeepGEMM's ``clean_logits=True``);
- :func:`mqa_logits`: prefill over contiguous keys, -inf outside ``[ks[t], ke[t])``;
- :func:`topk`: the top-k positions of each row of logits;
- :func:`paged_topk`: both at once for decode (for long contexts without writing the logits);
- :func:`to_slots`: request-relative positions to the cache slots ``sparse_mla`` reads.

The queries are e4m3 with their scales folded into the weights (as engines do:
DeepSeek-V3.2's ``w = weights_proj(x) · H^-0.5 · q_scale · 128^-0.5``). CPU tensors run the
float32 PyTorch statement (``fp8mla.dsa.indexer_reference``); ``backend="triton"`` runs the
kernels there under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch

from fp8mla._checks import check_tensor
from fp8mla.dsa import indexer_launch as L
from fp8mla.dsa import indexer_reference as R
from fp8mla.dsa.index_cache import HEAD_DIM, index_cache_view
from fp8mla.dsa.indexer_plan import MAX_TOPK, fused_serves
from fp8mla.runtime import resolve_backend

Q_DTYPES = (torch.float8_e4m3fn, torch.uint8)
MAX_ROW_HEADS = 256  # next_n × heads of one request: the query tile's width


def _unit_stride(name: str, t: torch.Tensor) -> None:
    if t.numel() and t.stride(-1) != 1:
        raise ValueError(f"expected {name} with unit stride in its last dim, got {t.stride()}")


def _int_arg(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < lo
        or (hi is not None and value > hi)
    ):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"expected {name} an int in {bound}, got {value!r}")
    return value


def _out(name: str, out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype,
         device: torch.device) -> torch.Tensor:  # fmt: skip
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check_tensor(name, out, shape=shape, dtypes=(dtype,), device=device)
    _unit_stride(name, out)
    return out


def _check_paged(q, weights, index_cache, block_table, context_lens, page_size):
    """The paged calls' inputs: ``(cache view, q as uint8, row lengths [B * next_n] int32)``."""
    check_tensor("q", q, ndim=4, dtypes=Q_DTYPES)
    dev = q.device
    batch, next_n, heads, dim = q.shape
    if dim != HEAD_DIM:
        raise ValueError(f"expected q of shape [B, next_n, H, {HEAD_DIM}], got {list(q.shape)}")
    if next_n * heads > MAX_ROW_HEADS or heads < 1 or next_n < 1:
        raise ValueError(f"expected 1 <= next_n × H <= {MAX_ROW_HEADS}, got next_n {next_n}, "
                         f"H {heads}")  # fmt: skip
    _unit_stride("q", q)
    check_tensor("weights", weights, dtypes=(torch.float32,), device=dev,
                 shape=(batch * next_n, heads))  # fmt: skip
    _unit_stride("weights", weights)
    view = index_cache_view(index_cache, page_size=page_size)
    if index_cache.device != dev:
        raise ValueError(f"expected index_cache on {dev}, got {index_cache.device}")
    check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), device=dev)
    if block_table.shape[0] != batch:
        raise ValueError(f"expected block_table of shape [{batch}, pages] (one row a request), "
                         f"got {list(block_table.shape)}")  # fmt: skip
    _unit_stride("block_table", block_table)
    check_tensor("context_lens", context_lens, dtypes=(torch.int32,), device=dev)
    if tuple(context_lens.shape) not in ((batch, next_n), (batch,)):
        raise ValueError(f"expected context_lens of shape [{batch}, {next_n}] or [{batch}], got "
                         f"{list(context_lens.shape)}")  # fmt: skip
    lens = R.row_lengths(context_lens, batch, next_n).contiguous()
    return view, q.view(torch.uint8), lens


def paged_mqa_logits(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    max_context_len: int,
    page_size: int | None = None,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Logits of every cached key against each query row, float32 ``[B * next_n,
    max_context_len]``: ``k_scale[s] · Σ_h weights[t, h] · ReLU(q[t, h] · k[s])``, -inf at
    positions past the row's length. DeepGEMM's ``fp8_paged_mqa_logits`` with
    ``clean_logits=True``.

    ``q [B, next_n, H, 128]`` e4m3 (float8_e4m3fn or its uint8 bytes; ``next_n × H`` up to
    256: V3.2 has 64 heads, GLM-5 32); ``weights [B * next_n, H]`` float32 with the query
    scales folded in; ``index_cache`` the key cache (``[pages, page_size, 1, 132]`` and the
    other shapes of ``fp8mla.dsa.index_cache``; ``page_size`` for a ``[pages, page_size *
    132]`` one); ``block_table [B, max_pages]`` int32 page ids of each request's positions;
    ``context_lens [B, next_n]`` int32, the length row ``(b, n)`` sees (speculative tokens of
    one request see one more each, so they stay causal) -- or DeepGEMM's 1-D ``[B]``: the last
    token's, earlier ones one fewer each. Lengths are clamped to ``[0, max_context_len]``; no
    key past a row's length is read (whatever bytes unused slots hold), page ids are clamped
    into the cache, and nothing is checked on the device (no host sync)."""
    view, q8, lens = _check_paged(q, weights, index_cache, block_table, context_lens, page_size)
    max_len = _int_arg("max_context_len", max_context_len, 0)
    rows = q.shape[0] * q.shape[1]
    out = _out("out", out, (rows, max_len), torch.float32, q.device)
    if resolve_backend(backend, q.device) == "torch":
        out.copy_(R.paged_mqa_logits_reference(q8, weights, index_cache, block_table, lens.view(
            q.shape[0], q.shape[1]), max_len, page_size=page_size, dtype=torch.float32))  # fmt: skip
    elif rows and max_len:
        L.paged_logits(q8, weights, view, block_table, lens, out, L.launch_for(q.device))
    return out


def mqa_logits(
    q: torch.Tensor,
    weights: torch.Tensor,
    keys: torch.Tensor,
    key_scales: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Prefill logits, float32 ``[S, SK]``: query token ``t`` against keys ``[ks[t], ke[t])``
    (-inf elsewhere), DeepGEMM's ``fp8_mqa_logits`` with ``clean_logits=True``.

    ``q [S, H, 128]`` e4m3 (or uint8), ``weights [S, H]`` float32, ``keys [SK, 128]`` e4m3 (or
    uint8), ``key_scales [SK]`` float32, ``ks``/``ke [S]`` int32 (clamped to ``[0, SK]``)."""
    check_tensor("q", q, ndim=3, dtypes=Q_DTYPES)
    dev = q.device
    rows, heads, dim = q.shape
    if dim != HEAD_DIM or heads < 1 or heads > MAX_ROW_HEADS:
        raise ValueError(f"expected q of shape [S, H <= {MAX_ROW_HEADS}, {HEAD_DIM}], got "
                         f"{list(q.shape)}")  # fmt: skip
    check_tensor("weights", weights, dtypes=(torch.float32,), device=dev, shape=(rows, heads))
    check_tensor("keys", keys, ndim=2, dtypes=Q_DTYPES, device=dev, shape=(None, HEAD_DIM))
    nk = keys.shape[0]
    if key_scales.dim() == 2 and key_scales.shape[1:] == (1,):
        key_scales = key_scales[:, 0]
    check_tensor("key_scales", key_scales, dtypes=(torch.float32,), device=dev, shape=(nk,))
    for name, t in (("ks", ks), ("ke", ke)):
        check_tensor(name, t, dtypes=(torch.int32,), device=dev, shape=(rows,))
    for name, t in (("q", q), ("weights", weights), ("keys", keys)):
        _unit_stride(name, t)
    out = _out("out", out, (rows, nk), torch.float32, dev)
    if resolve_backend(backend, dev) == "torch":
        out.copy_(R.mqa_logits_reference(q, weights, keys, key_scales, ks.clamp(0, nk),
                                         ke.clamp(0, nk), dtype=torch.float32))  # fmt: skip
    elif rows and nk:
        L.ragged_logits(q.view(torch.uint8), weights, keys.view(torch.uint8),
                        key_scales.contiguous(), ks.contiguous(), ke.contiguous(), out,
                        L.launch_for(dev))  # fmt: skip
    return out


def topk(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    k: int = 2048,
    *,
    starts: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """The ``k`` largest logits of each row, int32 ``[rows, k]``: their positions in ascending
    order, relative to ``starts`` (default 0), then -1 when the row has fewer than ``k``
    columns. Row ``r`` takes its columns ``[starts[r], lengths[r])`` (clamped to the row);
    among equal values the lower position wins (deterministic), NaN counts above +inf and -0
    equals +0.

    ``logits [rows, cols]`` float32 (unit column stride), ``lengths`` and ``starts [rows]``
    int32, ``k`` in ``[1, 8192]``."""
    check_tensor("logits", logits, ndim=2, dtypes=(torch.float32,))
    dev = logits.device
    rows = logits.shape[0]
    _unit_stride("logits", logits)
    k = _int_arg("k", k, 1, MAX_TOPK)
    check_tensor("lengths", lengths, dtypes=(torch.int32,), device=dev, shape=(rows,))
    if starts is not None:
        check_tensor("starts", starts, dtypes=(torch.int32,), device=dev, shape=(rows,))
    out = _out("out", out, (rows, k), torch.int32, dev)
    if resolve_backend(backend, dev) == "torch":
        out.copy_(R.topk_reference(logits, lengths, k, starts))
    elif rows:
        L.topk(logits, None if starts is None else starts.contiguous(), lengths.contiguous(),
               k, out, L.launch_for(dev))  # fmt: skip
    return out


def paged_topk(
    q: torch.Tensor,
    weights: torch.Tensor,
    index_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    max_context_len: int,
    k: int = 2048,
    page_size: int | None = None,
    fused: bool | str = "auto",
    return_slots: bool = False,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`paged_mqa_logits` then :func:`topk` of its rows in one call: int32 ``[B *
    next_n, k]`` positions (ascending, -1 padding; the lower position first among equal
    logits), and with ``return_slots`` also their cache slots (:func:`to_slots`, written by
    the same last kernel) for ``sparse_mla``.

    ``fused``: ``True`` computes the logits tile by tile and keeps only each program's running
    top-k candidates (the ``[rows, max_context_len]`` logits are never written: ``indexer_fused``
    kernel); ``False`` writes the logits and selects from them (the faster path); ``"auto"``
    takes the fused kernel only where the logits would take more than 1 GiB. Both give the
    same positions for the same logits."""
    view, q8, lens = _check_paged(q, weights, index_cache, block_table, context_lens, page_size)
    max_len = _int_arg("max_context_len", max_context_len, 0)
    k = _int_arg("k", k, 1, MAX_TOPK)
    if fused not in (True, False, "auto"):
        raise ValueError(f"expected fused True, False or 'auto', got {fused!r}")
    batch, next_n = q.shape[0], q.shape[1]
    rows, dev = batch * next_n, q.device
    out = torch.empty(rows, k, dtype=torch.int32, device=dev)
    slots = torch.empty(rows, k, dtype=torch.int32, device=dev) if return_slots else None
    if resolve_backend(backend, dev) == "torch" or rows == 0:
        logits = paged_mqa_logits(q, weights, index_cache, block_table, context_lens,
                                  max_context_len=max_len, page_size=page_size, backend="torch")  # fmt: skip
        out.copy_(R.topk_reference(logits, lens, k))
        if slots is not None:
            slots.copy_(R.to_slots_reference(out, block_table, view.page_size, None,
                                             view.num_pages))  # fmt: skip
        return (out, slots) if return_slots else out
    launch = L.launch_for(dev)
    s = None
    if slots is not None:
        s = L.Slots(slots, block_table, next_n, view.page_size, view.num_pages)
    if fused == "auto":
        fused = fused_serves(rows, max_len)
    if max_len == 0:
        out.fill_(-1)
        if slots is not None:
            slots.fill_(-1)
    elif fused:
        L.fused_topk(q8, weights, view, block_table, lens, max_len, k, out, launch, s)
    else:
        logits = torch.empty(rows, max_len, dtype=torch.float32, device=dev)
        L.paged_logits(q8, weights, view, block_table, lens, logits, launch)
        L.topk(logits, None, lens, k, out, launch, s)
    return (out, slots) if return_slots else out


def to_slots(
    positions: torch.Tensor,
    block_table: torch.Tensor,
    page_size: int,
    *,
    req_ids: torch.Tensor | None = None,
    num_pages: int | None = None,
    out: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Global cache slots of request-relative ``positions [T, k]`` int32: ``block_table[req,
    pos // page_size] * page_size + pos % page_size``, int32 ``[T, k]``, as ``sparse_mla``'s
    ``indices``. Token ``t`` belongs to request ``req_ids[t]`` (int32 ``[T]``, vLLM's
    ``req_id_per_token``) or, without ``req_ids``, to request ``t // (T / B)`` (``T`` a multiple
    of the block table's ``B`` rows: decode with ``next_n`` tokens a request). -1 stays -1; so
    does a position whose page lies past the table, whose page id is negative or, given
    ``num_pages``, not below it."""
    check_tensor("positions", positions, ndim=2, dtypes=(torch.int32,))
    dev = positions.device
    t, k = positions.shape
    check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), device=dev)
    _unit_stride("positions", positions)
    _unit_stride("block_table", block_table)
    page_size = _int_arg("page_size", page_size, 1)
    batch = block_table.shape[0]
    if req_ids is not None:
        check_tensor("req_ids", req_ids, dtypes=(torch.int32,), device=dev, shape=(t,))
    elif batch == 0 or t % batch:
        raise ValueError(f"expected positions of a multiple of {batch} rows (the block table's "
                         f"requests) or req_ids, got {t} rows")  # fmt: skip
    pages = (1 << 31) - 1 if num_pages is None else _int_arg("num_pages", num_pages, 0)
    out = _out("out", out, (t, k), torch.int32, dev)
    if resolve_backend(backend, dev) == "torch":
        out.copy_(R.to_slots_reference(positions, block_table, page_size, req_ids, num_pages))
    elif t and k:
        L.to_slots(positions, block_table, page_size, req_ids, pages, out)
    return out


__all__ = ["mqa_logits", "paged_mqa_logits", "paged_topk", "to_slots", "topk"]
