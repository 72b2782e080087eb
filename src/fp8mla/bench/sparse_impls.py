"""The sparse MLA implementations measured side by side, each prepared outside the timed region.

Every factory returns a zero-argument callable computing ``out [T, H, 512]`` for the inputs'
queries and index lists, or raises :class:`~fp8mla.bench.impls.Unavailable`:

- ``fp8mla``: :class:`fp8mla.SparseMLAWrapper` on the packed cache;
- ``fp8mla-bf16``: the same kernel on the bf16 ``[slots, 576]`` twin of the cache;
- ``flashmla-sparse-fp8``: FlashMLA's sparse FP8 decode on the packed cache (page size 64,
  global slot ids), and for prefill cases its sparse prefill on a bf16 ``[slots, 1, 576]``
  cache dequantized from the packed one in the timed region, as vLLM does (64 and 128 heads);
- ``vllm-triton-sparse``: vLLM's Triton sparse MLA kernel on the bf16 twin (loaded from a file);
- ``gather-dequant``: the selected rows gathered and dequantized to bf16 with PyTorch ops, then
  attention in bf16 with PyTorch -- what an engine without a kernel does.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable
from pathlib import Path

import torch

from fp8mla.attention.functional import shared_workspace
from fp8mla.bench.impls import Unavailable
from fp8mla.bench.sparse_inputs import SparseInputs
from fp8mla.dsa.layout import GROUP, NOPE_DIM, ROPE_OFFSET, SCALE_OFFSET, TOKEN_BYTES
from fp8mla.dsa.sparse import SparseMLAWrapper

SM_SCALE = 192**-0.5 * 1.874  # DeepSeek-V3.2's softmax scale with its YaRN factor
WORKSPACE_BYTES = 256 << 20
VLLM_SPARSE_ENV = "FP8MLA_VLLM_SPARSE"  # vLLM's Triton sparse MLA module file
FLASHMLA_HEADS = (64, 128)
GATHER_ROWS = 1 << 20  # index-list entries the PyTorch baseline gathers at once

Runner = Callable[[], torch.Tensor]


def fp8mla_sparse(
    inp: SparseInputs, cache: torch.Tensor | None = None, kernel: str = "auto"
) -> Runner:
    """fp8mla on ``cache`` (the packed pool, or its bf16 twin), in ``kernel`` (``plan()``'s:
    the planner's choice, ``"portable"``, ``"fp8qk"`` or ``"pingpong8"``; an SM90 kernel on a
    GPU it does not serve is :class:`Unavailable`)."""
    case, cache = inp.case, inp.pool if cache is None else cache
    w = SparseMLAWrapper(shared_workspace(inp.q.device, WORKSPACE_BYTES))
    try:
        w.plan(case.tokens, case.heads, case.topk, case.page_size if cache.dim() == 3 else 1,
               torch.bfloat16, SM_SCALE, kv_data_type=cache.dtype, kernel=kernel)  # fmt: skip
    except ValueError as e:
        if kernel in ("auto", "portable"):
            raise
        raise Unavailable(str(e)) from None
    out = torch.empty(case.tokens, case.heads, NOPE_DIM, dtype=torch.bfloat16, device=inp.q.device)
    q_nope, q_pe, idx = inp.q_nope, inp.q_pe, inp.indices
    return lambda: w.run(q_nope, q_pe, cache, idx, out=out)


def dequantize_rows(rows: torch.Tensor) -> torch.Tensor:
    """Packed rows ``[N, 656]`` uint8 → bf16 ``[N, 576]`` with PyTorch ops (e4m3 × the group's
    float32 scale, rounded once to bf16; the bf16 RoPE part as stored)."""
    n = rows.shape[0]
    codes = rows[:, :NOPE_DIM].view(torch.float8_e4m3fn).float().view(n, -1, GROUP)
    scales = rows[:, SCALE_OFFSET:ROPE_OFFSET].contiguous().view(torch.float32)
    latent = (codes * scales[..., None]).view(n, NOPE_DIM).to(torch.bfloat16)
    rope = rows[:, ROPE_OFFSET:].contiguous().view(torch.bfloat16)
    return torch.cat([latent, rope], dim=1)


def gather_dequant(inp: SparseInputs) -> Runner:
    """Gather every listed row, dequantize it to bf16, then ``softmax(q·Kᵀ)·V`` in bf16 with
    PyTorch (scores in float32), in chunks of query tokens that bound the temporaries."""
    case = inp.case
    rows = inp.pool.view(-1, TOKEN_BYTES)
    out = torch.empty(case.tokens, case.heads, NOPE_DIM, dtype=torch.bfloat16, device=inp.q.device)
    step = max(1, GATHER_ROWS // case.topk)

    def run() -> torch.Tensor:
        for t0 in range(0, case.tokens, step):
            t1 = min(case.tokens, t0 + step)
            idx = inp.indices[t0:t1]
            valid = idx >= 0
            kv = dequantize_rows(rows.index_select(0, idx.clamp(min=0).reshape(-1).long()))
            kv = kv.view(t1 - t0, case.topk, -1)
            s = torch.bmm(inp.q[t0:t1], kv.transpose(1, 2)).float() * SM_SCALE
            s = s.masked_fill(~valid[:, None, :], float("-inf"))
            p = torch.softmax(s, dim=-1).to(torch.bfloat16)
            torch.bmm(p, kv[..., :NOPE_DIM], out=out[t0:t1])
        return out

    return run


# -- FlashMLA (vLLM 0.26.0's build; loaded by fp8mla.bench.flashmla) ---------------------
def flashmla_sparse(inp: SparseInputs, flashmla: types.SimpleNamespace) -> Runner:
    """FlashMLA's sparse FP8 decode (``[B, s_q, H, 576]`` queries, the ``[pages, 64, 1, 656]``
    cache, ``[B, s_q, topk]`` global slot ids), or for a prefill case its sparse prefill on a
    bf16 cache dequantized from the packed pool inside the timed call."""
    case = inp.case
    if case.heads not in FLASHMLA_HEADS:
        raise Unavailable(f"FlashMLA's sparse kernels take {FLASHMLA_HEADS} heads only")
    if case.prefill:
        rows = inp.pool.view(-1, TOKEN_BYTES)
        kv = torch.empty(rows.shape[0], 1, NOPE_DIM + 64, dtype=torch.bfloat16, device=rows.device)
        idx = inp.indices.view(case.tokens, 1, case.topk)

        def prefill() -> torch.Tensor:
            for r0 in range(0, rows.shape[0], GATHER_ROWS):
                kv[r0 : r0 + GATHER_ROWS, 0] = dequantize_rows(rows[r0 : r0 + GATHER_ROWS])
            return flashmla.sparse_prefill(inp.q, kv, idx, SM_SCALE, NOPE_DIM, None, None, None)[0]

        return prefill
    q = inp.q.view(case.batch, case.qo_len, case.heads, -1)
    kv = inp.pool.view(inp.pool.shape[0], inp.pool.shape[1], 1, TOKEN_BYTES)
    idx = inp.indices.view(case.batch, case.qo_len, case.topk)
    out = torch.empty(case.batch, case.qo_len, case.heads, NOPE_DIM, dtype=torch.bfloat16,
                      device=q.device)  # fmt: skip
    _, _, meta, splits = flashmla.sparse_decode(q, kv, idx, None, None, None, None, None, None,
                                                None, NOPE_DIM, SM_SCALE, out)  # fmt: skip

    def decode() -> torch.Tensor:
        flashmla.sparse_decode(q, kv, idx, None, None, meta, splits, None, None, None, NOPE_DIM,
                               SM_SCALE, out)  # fmt: skip
        return out.view(case.tokens, case.heads, NOPE_DIM)

    return decode


def flashmla_kernel_only(inp: SparseInputs, flashmla: types.SimpleNamespace) -> Runner:
    """FlashMLA's sparse prefill alone, on a bf16 cache dequantized beforehand (reported beside
    the timed call that includes the dequantization)."""
    rows = inp.pool.view(-1, TOKEN_BYTES)
    kv = torch.empty(rows.shape[0], 1, NOPE_DIM + 64, dtype=torch.bfloat16, device=rows.device)
    for r0 in range(0, rows.shape[0], GATHER_ROWS):
        kv[r0 : r0 + GATHER_ROWS, 0] = dequantize_rows(rows[r0 : r0 + GATHER_ROWS])
    idx = inp.indices.view(inp.case.tokens, 1, inp.case.topk)
    return lambda: flashmla.sparse_prefill(inp.q, kv, idx, SM_SCALE, NOPE_DIM, None, None, None)[0]


# -- vLLM's Triton sparse MLA kernel --------------------------------------------------------
def _vllm_stubs() -> None:
    """The two vLLM helpers the kernel file imports, when vLLM itself is not importable:
    ``vllm.triton_utils`` (triton, tl, LOG2E, LOGE2) and ``num_compute_units``."""
    try:
        importlib.import_module("vllm.triton_utils")
        importlib.import_module("vllm.utils.platform_utils")
        return
    except Exception:  # noqa: BLE001 - any failure: stand-ins for the two helpers
        pass
    import math

    import triton
    import triton.language as tl

    for name in ("vllm", "vllm.utils"):
        sys.modules[name] = types.ModuleType(name)
    utils = types.ModuleType("vllm.triton_utils")
    utils.triton, utils.tl = triton, tl  # type: ignore[attr-defined]
    utils.LOG2E, utils.LOGE2 = 1 / math.log(2), math.log(2)  # type: ignore[attr-defined]
    sys.modules["vllm.triton_utils"] = utils
    platform = types.ModuleType("vllm.utils.platform_utils")
    platform.num_compute_units = (  # type: ignore[attr-defined]
        lambda index=None: torch.cuda.get_device_properties(index or 0).multi_processor_count
    )
    sys.modules["vllm.utils.platform_utils"] = platform


def load_vllm_sparse(path: str | None = None) -> Callable[..., torch.Tensor]:
    """vLLM's Triton sparse MLA attention from its module file ``path`` (or
    ``$FP8MLA_VLLM_SPARSE``): ``v1/attention/ops/triton_sparse_mla_kernel.py``
    (``triton_sparse_mla_attention``, the TRITON_MLA_SPARSE backend's split-KV kernel) or, in
    releases without it such as 0.33.0, ``v1/attention/ops/xpu_mla_sparse.py``
    (``triton_bf16_mla_sparse_interface``, the plain Triton kernel that backend derives from).
    Returns ``f(q [T, H, 576], kv [slots, 1, 576], indices [T, 1, topk], sm_scale) -> out``."""
    path = path or os.environ.get(VLLM_SPARSE_ENV)
    if not path:
        raise Unavailable(
            f"no vLLM sparse module (--vllm-sparse-module PATH or ${VLLM_SPARSE_ENV})"
        )
    if not Path(path).is_file():
        raise Unavailable(f"no file {path}")
    _vllm_stubs()
    spec = importlib.util.spec_from_file_location("vllm_triton_sparse_mla", Path(path))
    if spec is None or spec.loader is None:
        raise Unavailable(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001
        raise Unavailable(f"{path} did not import ({type(exc).__name__}: {exc})") from exc
    if hasattr(module, "triton_sparse_mla_attention"):
        return lambda q, kv, idx, scale: module.triton_sparse_mla_attention(q, kv, idx, scale)
    if hasattr(module, "triton_bf16_mla_sparse_interface"):
        return lambda q, kv, idx, scale: module.triton_bf16_mla_sparse_interface(q, kv, idx, scale)[
            0
        ]
    raise Unavailable(f"{path} has no Triton sparse MLA entry point")


def vllm_triton_sparse(inp: SparseInputs, bf16_cache: torch.Tensor, fn: Callable) -> Runner:
    """vLLM's kernel on the bf16 twin of the cache (its backend takes bf16/fp16 caches only)."""
    case = inp.case
    kv = bf16_cache.view(-1, 1, bf16_cache.shape[-1])
    idx = inp.indices.view(case.tokens, 1, case.topk)
    return lambda: fn(inp.q, kv, idx, SM_SCALE)
