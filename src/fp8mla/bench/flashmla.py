"""FlashMLA (vLLM 0.26.0's build) as a baseline: its libraries' loader, shared by the dense and
sparse sections, and its two dense decode paths on the goal cases:

- ``flashmla-fp8``: ``fwd_kvcache_mla_fp8``, what vLLM's ``FLASHMLA`` backend runs for an FP8
  cache (``--kv-cache-dtype fp8``) on Hopper. It reads the same e4m3 bytes fp8mla reads
  (``descale_k`` = the pool's per-tensor scale), but takes **FP8 queries** too (per-tensor
  ``descale_q``) and rounds P to FP8 before P·V, so its error against float64 is an order of
  magnitude above the bf16-query kernels' (the bench prints it beside its time);
- ``flashmla-bf16kv``: ``dense_decode_fwd`` on a bf16 cache holding the same values, dequantized.

FlashMLA takes pages of 64 tokens only: both run on a copy of the case's tokens re-laid into
64-token pages (:func:`fp8mla.bench.inputs.page_copy`), built outside the timed region.

What the timed call holds, as vLLM 0.26 runs a decode step: the kernel call alone. The tile
scheduler's metadata is computed once per step (vLLM's metadata builder calls
``get_mla_decoding_metadata_dense_fp8``; for the bf16 cache the step's first layer gets it from
its ``dense_decode_fwd`` call and the others reuse it): here once, outside the timed region. The
query's concatenation and FP8 quantization, which vLLM runs in each layer before the call (one
fused elementwise kernel), are outside the timed region too, so FlashMLA's FP8 time leaves out a
cost vLLM pays. The query scale is the queries' amax / 448 (a calibrated per-tensor scale;
vLLM's default ``q_scale`` is 1.0 where the checkpoint gives none).
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import torch

from fp8mla.bench.impls import SM_SCALE, Runner, Unavailable
from fp8mla.bench.inputs import BenchInputs, page_copy
from fp8mla.formats import HEAD_DIM_CKV

FLASHMLA_ENV = "FP8MLA_FLASHMLA"  # a folder holding FlashMLA's two libraries
FLASHMLA_LIBRARIES = ("_flashmla_C.abi3.so", "_flashmla_extension_C.abi3.so")
FLASHMLA_PAGE = 64  # the only page size FlashMLA's kernels take
MAX_QUERY_TOKENS = 16  # query tokens a request the decode baselines run (decode, speculative)
E4M3_MAX = 448.0  # largest finite float8_e4m3fn
MIN_QUERY_SCALE = 1 / (E4M3_MAX * 512)  # vLLM's floor for a per-tensor scale from amax


def load_flashmla(path: str | None = None) -> types.SimpleNamespace:
    """FlashMLA's ops from the two libraries of a vLLM wheel in ``path`` (or
    ``$FP8MLA_FLASHMLA``): ``sparse_decode`` / ``sparse_prefill`` (``sparse_decode_fwd`` /
    ``sparse_prefill_fwd``) and ``dense_decode`` (``dense_decode_fwd``) from
    ``torch.ops._flashmla_C``; ``fp8_decode`` / ``fp8_metadata`` (``fwd_kvcache_mla_fp8`` /
    ``get_mla_decoding_metadata_dense_fp8``) from ``torch.ops._flashmla_extension_C``."""
    path = path or os.environ.get(FLASHMLA_ENV)
    if not path:
        raise Unavailable(f"no FlashMLA folder (--flashmla DIR or ${FLASHMLA_ENV})")
    folder = Path(path)
    missing = [name for name in FLASHMLA_LIBRARIES if not (folder / name).is_file()]
    if missing:
        raise Unavailable(f"no {', '.join(missing)} in {folder}")
    try:
        for name in FLASHMLA_LIBRARIES:
            torch.ops.load_library(str(folder / name))
        ops, ext = torch.ops._flashmla_C, torch.ops._flashmla_extension_C
        return types.SimpleNamespace(
            sparse_decode=ops.sparse_decode_fwd,
            sparse_prefill=ops.sparse_prefill_fwd,
            dense_decode=ops.dense_decode_fwd,
            fp8_decode=ext.fwd_kvcache_mla_fp8,
            fp8_metadata=ext.get_mla_decoding_metadata_dense_fp8,
        )
    except Exception as exc:  # noqa: BLE001 - a library that does not load means "unavailable"
        raise Unavailable(f"FlashMLA did not load ({str(exc).splitlines()[0][:100]})") from exc


def query_scale(q: torch.Tensor) -> torch.Tensor:
    """Per-tensor FP8 scale of ``q``: ``amax / 448`` (at least vLLM's floor), float32 ``[1]``."""
    amax = q.abs().amax().float().reshape(1)
    return (amax / E4M3_MAX).clamp(min=MIN_QUERY_SCALE)


def quantize_query(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """vLLM's static per-tensor FP8 quantization (``QuantFP8``):
    ``fp8(clamp(q · (1 / scale), ±448))`` in float32."""
    out = q.float() * scale.float().reciprocal()
    return out.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _decode_case(inp: BenchInputs) -> tuple[int, int, int]:
    case = inp.case
    if case.qo_len > MAX_QUERY_TOKENS:
        raise Unavailable(f"decode baseline: at most {MAX_QUERY_TOKENS} query tokens a request")
    return case.batch, case.qo_len, case.heads


def _refused(exc: Exception) -> Unavailable:
    return Unavailable(f"FlashMLA refused the case ({str(exc).splitlines()[0][:100]})")


def flashmla_fp8(inp: BenchInputs, ops: types.SimpleNamespace) -> Runner:
    """FlashMLA's FP8 decode: the pool's e4m3 bytes in 64-token pages, FP8 queries
    (``q [B, s_q, H, 576]``), metadata computed here, once."""
    b, s_q, h = _decode_case(inp)
    if inp.pool.dtype != torch.float8_e4m3fn:
        raise Unavailable("FlashMLA's FP8 path reads e4m3 caches only")
    pages = page_copy(inp, page_size=FLASHMLA_PAGE)
    q = torch.cat([inp.q_nope, inp.q_pe], dim=-1).view(b, s_q, h, -1)
    descale_q = query_scale(q)
    q_fp8 = quantize_query(q, descale_q)
    descale_k = torch.tensor([inp.scale], dtype=torch.float32, device=q.device)
    try:
        meta, splits = ops.fp8_metadata(pages.seqlens, s_q * h, 1)
        ops.fp8_decode(q_fp8, pages.cache, HEAD_DIM_CKV, pages.seqlens, pages.block_table,
                       SM_SCALE, True, meta, splits, descale_q, descale_k)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - FlashMLA refuses what it does not support
        raise _refused(exc) from exc

    def run() -> torch.Tensor:
        out = ops.fp8_decode(q_fp8, pages.cache, HEAD_DIM_CKV, pages.seqlens, pages.block_table,
                             SM_SCALE, True, meta, splits, descale_q, descale_k)[0]  # fmt: skip
        return out.reshape(b * s_q, h, HEAD_DIM_CKV)

    return run


def flashmla_bf16kv(inp: BenchInputs, ops: types.SimpleNamespace) -> Runner:
    """FlashMLA's bf16 decode on the pool's values dequantized to bf16 in 64-token pages, bf16
    queries; the tile metadata of the first call reused, as vLLM's later layers do."""
    b, s_q, h = _decode_case(inp)
    pages = page_copy(inp, torch.bfloat16, page_size=FLASHMLA_PAGE)
    q = torch.cat([inp.q_nope, inp.q_pe], dim=-1).view(b, s_q, h, -1)
    out = torch.empty(b, s_q, h, HEAD_DIM_CKV, dtype=torch.bfloat16, device=q.device)
    try:
        _, _, meta, splits = ops.dense_decode(q, pages.cache, HEAD_DIM_CKV, pages.seqlens,
                                              pages.block_table, SM_SCALE, True, None, None, out)  # fmt: skip
    except Exception as exc:  # noqa: BLE001
        raise _refused(exc) from exc

    def run() -> torch.Tensor:
        result = ops.dense_decode(q, pages.cache, HEAD_DIM_CKV, pages.seqlens, pages.block_table,
                                  SM_SCALE, True, meta, splits, out)[0]  # fmt: skip
        return result.reshape(b * s_q, h, HEAD_DIM_CKV)

    return run
