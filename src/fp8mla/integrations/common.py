"""Engine-agnostic pieces of the engine integrations: start-up checks and index helpers.

The checks return a one-line reason naming the engine option to change, so each engine
can refuse a bad configuration at start-up in its own way (SGLang raises from a
server-args pass, vLLM from its backend selector), instead of failing at the first
request with a kernel traceback.
"""

from __future__ import annotations

import os

import torch

from fp8mla.formats import (
    HEAD_DIM_CKV,
    HEAD_DIM_KPE,
    KV_DTYPES,
    MAX_PAGE_SIZE,
    Q_DTYPES,
    dtype_name,
)
from fp8mla.runtime import BACKENDS

#: Environment variable choosing where the engine backends run fp8mla's attention:
#: ``auto`` (Triton kernels on CUDA, the PyTorch path on CPU tensors), ``triton`` or ``torch``.
BACKEND_ENV = "FP8MLA_KERNEL_BACKEND"

MAX_HEADS = 128

#: Environment variable letting an engine hand fp8mla FP8 (e4m3) queries with its per-tensor
#: query scale (vLLM: ``supports_quant_query_input``): ``0`` (default: the model's 16-bit
#: queries, read exactly) or ``1``.
FP8_QUERIES_ENV = "FP8MLA_FP8_QUERIES"


class IntegrationConfigError(ValueError):
    """A configuration fp8mla cannot serve; the message is one line naming the option."""


def kernel_backend() -> str:
    """The wrapper backend the engine integrations use (``FP8MLA_KERNEL_BACKEND``)."""
    value = os.environ.get(BACKEND_ENV, "auto").strip().lower() or "auto"
    if value not in BACKENDS:
        raise IntegrationConfigError(
            f"fp8mla: {BACKEND_ENV}={value!r} is not one of {', '.join(BACKENDS)}"
        )
    return value


def fp8_queries_enabled() -> bool:
    """Whether the engine integrations take FP8 queries (``FP8MLA_FP8_QUERIES``)."""
    value = os.environ.get(FP8_QUERIES_ENV, "0").strip() or "0"
    if value not in ("0", "1"):
        raise IntegrationConfigError(f"fp8mla: {FP8_QUERIES_ENV}={value!r} is not 0 or 1")
    return value == "1"


def check_mla_config(
    *,
    engine: str,
    q_dtype: torch.dtype | None = None,
    kv_dtype: torch.dtype | None = None,
    page_size: int | None = None,
    kv_lora_rank: int | None = None,
    qk_rope_head_dim: int | None = None,
    num_heads: int | None = None,
    options: dict[str, str] | None = None,
) -> str | None:
    """Why fp8mla cannot serve this configuration, or ``None`` when it can.

    ``options`` maps each checked quantity (``"q_dtype"``, ``"kv_dtype"``, ``"page_size"``,
    ``"heads"``, ``"dims"``) to the engine's spelling of the option that sets it, so the
    reason names what the user typed (e.g. ``--kv-cache-dtype``).
    """
    opt = {
        "q_dtype": "--dtype",
        "kv_dtype": "--kv-cache-dtype",
        "page_size": "--page-size",
        "heads": "--tensor-parallel-size",
        "dims": "--model",
        **(options or {}),
    }
    prefix = f"fp8mla ({engine}): "
    if q_dtype is not None and q_dtype not in Q_DTYPES:
        return (
            f"{prefix}{opt['q_dtype']} {dtype_name(q_dtype)} is not supported; "
            f"use bfloat16 or float16"
        )
    if kv_dtype is not None and kv_dtype not in KV_DTYPES:
        return (
            f"{prefix}{opt['kv_dtype']} {dtype_name(kv_dtype)} is not supported; "
            f"use fp8_e4m3, fp8_e5m2 or the model dtype (auto)"
        )
    if page_size is not None and not 1 <= int(page_size) <= MAX_PAGE_SIZE:
        return f"{prefix}{opt['page_size']} {page_size} is not supported; use 1 to {MAX_PAGE_SIZE}"
    if (kv_lora_rank, qk_rope_head_dim) != (None, None) and (
        kv_lora_rank != HEAD_DIM_CKV or qk_rope_head_dim != HEAD_DIM_KPE
    ):
        return (
            f"{prefix}{opt['dims']}: kv_lora_rank={kv_lora_rank}, "
            f"qk_rope_head_dim={qk_rope_head_dim} is not supported; fp8mla serves MLA with "
            f"kv_lora_rank={HEAD_DIM_CKV}, qk_rope_head_dim={HEAD_DIM_KPE} "
            f"(DeepSeek-V2/V3, Kimi-K2, GLM-5)"
        )
    if num_heads is not None and not 1 <= int(num_heads) <= MAX_HEADS:
        return (
            f"{prefix}{opt['heads']}: {num_heads} attention heads per rank is not supported; "
            f"fp8mla serves 1 to {MAX_HEADS}"
        )
    return None


def pages_from_tokens(
    token_ids: torch.Tensor,
    token_indptr: torch.Tensor,
    kv_lens: torch.Tensor,
    page_size: int,
    num_pages: int,
) -> torch.Tensor:
    """Page ids from a CSR stream of token slot ids, on the device and without a sync.

    Request ``b`` owns tokens ``token_ids[token_indptr[b] : token_indptr[b] + kv_lens[b]]``
    laid out page by page (a paged allocator keeps a page's tokens together, at slots
    ``page * page_size + offset``); its ``j``-th page is ``token_ids[token_indptr[b] +
    j * page_size] // page_size``. ``num_pages`` (the total, a host int the caller already
    knows) sizes the output so nothing is read back from the device.

    Returns:
        int32 ``[num_pages]``, request-major (the wrapper's CSR ``kv_indices``).
    """
    dev = token_ids.device
    if num_pages == 0:
        return torch.empty(0, dtype=torch.int32, device=dev)
    kv_lens = kv_lens.to(torch.int64)
    pages = (kv_lens + page_size - 1) // page_size
    page_start = torch.cumsum(pages, 0) - pages
    req = torch.repeat_interleave(
        torch.arange(pages.numel(), device=dev), pages, output_size=num_pages
    )
    j = torch.arange(num_pages, device=dev) - page_start[req]
    first_token = token_indptr.to(torch.int64)[req] + j * page_size
    return torch.div(token_ids[first_token], page_size, rounding_mode="floor").to(torch.int32)
