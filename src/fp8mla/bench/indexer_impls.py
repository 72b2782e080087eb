"""The indexer implementations measured side by side, each prepared outside the timed region.

Every factory returns a zero-argument callable computing the case's top-k positions (or its
logits, for the ``-logits`` rows), or raises :class:`~fp8mla.bench.impls.Unavailable`:

- ``fp8mla``: :func:`fp8mla.dsa.paged_topk` as planned (``fused="auto"``);
- ``fp8mla-fused`` / ``fp8mla-two-pass``: the same call forced to one path;
- ``fp8mla-logits``: :func:`fp8mla.dsa.paged_mqa_logits` alone;
- ``vllm-triton``: vLLM's Triton fallback ``fp8_paged_mqa_logits_triton`` (its
  ``v1/attention/ops/mqa_logits_triton.py``, loaded from a file) then ``torch.topk`` -- what an
  engine without DeepGEMM runs; ``vllm-triton-logits``: its logits alone.

The DSA layer rows: ``fp8mla-dsa`` (``paged_topk`` with slots, then ``sparse_mla``) and
``fp8mla-dense`` (fp8mla's decode over the whole context).
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
from fp8mla.bench.indexer_inputs import IndexerInputs
from fp8mla.dsa.indexer import paged_mqa_logits, paged_topk
from fp8mla.dsa.sparse import SparseMLAWrapper

VLLM_INDEXER_ENV = "FP8MLA_VLLM_INDEXER"  # vLLM's mqa_logits_triton.py
SM_SCALE = 192**-0.5 * 1.874
WORKSPACE_BYTES = 256 << 20

Runner = Callable[[], torch.Tensor]


def fp8mla_topk(inp: IndexerInputs, fused: bool | str = "auto") -> Runner:
    c = inp.case
    args = (inp.q, inp.weights, inp.cache, inp.block_table, inp.lens)
    return lambda: paged_topk(*args, max_context_len=c.context, k=c.k, fused=fused)


def fp8mla_logits(inp: IndexerInputs) -> Runner:
    out = torch.empty(inp.case.rows, inp.case.context, dtype=torch.float32, device=inp.q.device)
    args = (inp.q, inp.weights, inp.cache, inp.block_table, inp.lens)
    return lambda: paged_mqa_logits(*args, max_context_len=inp.case.context, out=out)


# -- vLLM's Triton fallback ---------------------------------------------------------------
def vllm_stubs() -> None:
    """``vllm.triton_utils`` (triton, tl), the only vLLM module the file imports, when vLLM
    itself is not importable."""
    try:
        importlib.import_module("vllm.triton_utils")
        return
    except Exception:  # noqa: BLE001 - any failure: a stand-in
        pass
    import triton
    import triton.language as tl

    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    utils = types.ModuleType("vllm.triton_utils")
    utils.triton, utils.tl = triton, tl  # type: ignore[attr-defined]
    sys.modules["vllm.triton_utils"] = utils


def load_vllm_indexer(path: str | None = None) -> Callable[..., torch.Tensor]:
    """vLLM's ``fp8_paged_mqa_logits_triton(q, kv_cache, weights, context_lens, block_tables,
    max_model_len)`` from its module file ``path`` (or ``$FP8MLA_VLLM_INDEXER``):
    ``v1/attention/ops/mqa_logits_triton.py`` of vLLM's main branch (the pinned 0.33.0 wheel
    has no Triton fallback of DeepGEMM's logits)."""
    path = path or os.environ.get(VLLM_INDEXER_ENV)
    if not path:
        raise Unavailable(f"no vLLM indexer module (--vllm-indexer-module PATH or "
                          f"${VLLM_INDEXER_ENV})")  # fmt: skip
    if not Path(path).is_file():
        raise Unavailable(f"no file {path}")
    vllm_stubs()
    spec = importlib.util.spec_from_file_location("vllm_mqa_logits_triton", Path(path))
    if spec is None or spec.loader is None:
        raise Unavailable(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001
        raise Unavailable(f"{path} did not import ({type(exc).__name__}: {exc})") from exc
    fn = getattr(module, "fp8_paged_mqa_logits_triton", None)
    if fn is None:
        raise Unavailable(f"{path} has no fp8_paged_mqa_logits_triton")
    return fn


def vllm_logits(inp: IndexerInputs, fn: Callable[..., torch.Tensor]) -> Runner:
    """vLLM's kernel on the same cache: its 1-D context lengths (the last token's)."""
    lens = inp.context_lens_1d
    return lambda: fn(inp.q, inp.cache, inp.weights, lens, inp.block_table, inp.case.context)


def vllm_topk(inp: IndexerInputs, fn: Callable[..., torch.Tensor]) -> Runner:
    """vLLM's logits then ``torch.topk`` of each row."""
    logits = vllm_logits(inp, fn)
    k = inp.case.k
    return lambda: torch.topk(logits(), k, dim=-1).indices


# -- the DSA layer -------------------------------------------------------------------------
def fp8mla_dsa(inp: IndexerInputs, pool: torch.Tensor, q_mla: torch.Tensor) -> Runner:
    """Indexer (``paged_topk`` with slots) then sparse attention (``SparseMLAWrapper``) of the
    case's rows over the packed MLA cache ``pool`` (pages of the index cache's page size)."""
    c = inp.case
    w = SparseMLAWrapper(shared_workspace(inp.q.device, WORKSPACE_BYTES))
    w.plan(c.rows, q_mla.shape[1], c.k, c.page_size, torch.bfloat16, SM_SCALE)
    out = torch.empty(c.rows, q_mla.shape[1], 512, dtype=torch.bfloat16, device=inp.q.device)
    args = (inp.q, inp.weights, inp.cache, inp.block_table, inp.lens)
    q_nope, q_pe = q_mla[..., :512], q_mla[..., 512:]

    def run() -> torch.Tensor:
        _, slots = paged_topk(*args, max_context_len=c.context, k=c.k, return_slots=True)
        return w.run(q_nope, q_pe, pool, slots, out=out)

    return run
