"""One-call form of the paged MLA attention: plans and runs in one go."""

from __future__ import annotations

import torch

from fp8mla._checks import check_tensor
from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper

_WORKSPACE_BYTES = 128 << 20
_workspaces: dict[tuple[torch.device, int], torch.Tensor] = {}


def shared_workspace(device: torch.device, nbytes: int = _WORKSPACE_BYTES) -> torch.Tensor:
    """One ``nbytes`` scratch buffer per device, for wrappers that run one after another on
    one stream (as the layers of an engine share theirs): ``mla_decode`` and the benchmark."""
    key = (torch.device(device), nbytes)
    ws = _workspaces.get(key)
    if ws is None:
        ws = _workspaces[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return ws


def mla_decode(
    q_nope: torch.Tensor,
    q_pe: torch.Tensor,
    ckv_cache: torch.Tensor,
    kpe_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_len: torch.Tensor,
    *,
    sm_scale: float,
    qo_indptr: torch.Tensor | None = None,
    causal: bool = False,
    ckv_scale: float | torch.Tensor | None = None,
    kpe_scale: float | torch.Tensor | None = None,
    ckv_scale_arr: torch.Tensor | None = None,
    q_scale: float | torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    backend: str = "auto",
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Paged MLA attention in one call (plans internally; use the wrapper to plan once per
    step and run per layer).

    Args:
        q_nope: ``[tokens, H, 512]`` bf16/fp16, or ``float8_e4m3fn`` with ``q_scale``.
        q_pe: ``[tokens, H, 64]``.
        ckv_cache: ``[num_pages, page_size, 512]`` bf16/fp16/``float8_e4m3fn``/``float8_e5m2``.
        kpe_cache: ``[num_pages, page_size, 64]``, same dtype.
        kv_indptr: ``[B + 1]`` int32 offsets into ``kv_indices``.
        kv_indices: ``[nnz_pages]`` int32 page ids.
        kv_len: ``[B]`` int32 KV tokens per request.
        sm_scale: softmax scale (e.g. ``1 / sqrt(192)`` for DeepSeek-V3).
        qo_indptr: ``[B + 1]`` int32 query tokens per request; default one token each.
        causal: bottom-right aligned causal mask (multi-token queries).
        ckv_scale, kpe_scale, ckv_scale_arr: dequantization scales (see the wrapper's ``run``).
        q_scale: FP8 queries' scale (a float, a 1-element fp32 tensor or ``[tokens, H]``).
        out: optional ``[tokens, H, 512]`` output.
        return_lse: also return the base-2 ``lse [tokens, H]``.
        backend: ``"auto"``, ``"triton"`` or ``"torch"``.

    Returns:
        ``out [tokens, H, 512]`` in the query dtype, bf16 for FP8 queries (and ``lse`` if
        ``return_lse``).

    Example:
        >>> out = mla_decode(q_nope, q_pe, pool[..., :512], pool[..., 512:],
        ...                  kv_indptr, kv_indices, kv_len, sm_scale=1 / 16)
    """
    check_tensor("q_nope", q_nope, ndim=3)
    check_tensor("q_pe", q_pe, ndim=3)
    check_tensor("ckv_cache", ckv_cache, ndim=3)
    device = q_nope.device
    if qo_indptr is None:
        batch = kv_len.numel()
        qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=kv_len.device)
    wrapper = BatchMLAPagedAttentionWrapper(shared_workspace(device), backend=backend)
    wrapper.plan(
        qo_indptr,
        kv_indptr,
        kv_indices,
        kv_len,
        num_heads=q_nope.shape[1],
        head_dim_ckv=q_nope.shape[-1],
        head_dim_kpe=q_pe.shape[-1],
        page_size=ckv_cache.shape[1],
        causal=causal,
        sm_scale=sm_scale,
        q_data_type=q_nope.dtype,
        kv_data_type=ckv_cache.dtype,
    )
    return wrapper.run(
        q_nope,
        q_pe,
        ckv_cache,
        kpe_cache,
        out=out,
        return_lse=return_lse,
        ckv_scale=ckv_scale,
        kpe_scale=kpe_scale,
        ckv_scale_arr=ckv_scale_arr,
        **({} if q_scale is None else {"q_scale": q_scale}),
    )
