"""One layer's attention by fp8mla's kernel against the float64 reference on the same FP8 bytes.

The decode loop compares the three strategies with each other; this is the check of the kernel
itself. On a GPU the Triton kernel runs compiled; on a CPU it runs under Triton's interpreter
when ``TRITON_INTERPRET=1`` was set before fp8mla was imported (``make demo`` sets it), else
only the PyTorch path can run and the check says so.
"""

from __future__ import annotations

import torch

from fp8mla.demo.decode_loop import D_CKV, D_KPE, DecodeModel
from fp8mla.demo.result import AttentionCheck

__all__ = ["check_attention"]


def check_attention(model: DecodeModel) -> AttentionCheck:
    """Layer 0's attention for random queries, fp8mla vs ``fp8mla.reference`` in float64."""
    from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper
    from fp8mla.reference import mla_reference
    from fp8mla.runtime import interpreted
    from fp8mla.testing import rel_err

    cfg, dev = model.cfg, model.device
    if dev.type == "cuda":
        backend, what = "triton", "fp8mla's Triton kernel"
    elif interpreted():
        backend, what = "triton", "fp8mla's Triton kernel, run by Triton's CPU interpreter"
    else:
        backend, what = "torch", "fp8mla's PyTorch path (TRITON_INTERPRET=1 was not set)"
    g = torch.Generator(device=dev).manual_seed(1)
    q = torch.randn(cfg.batch, cfg.heads, D_CKV + D_KPE, generator=g, device=dev)
    q = q.to(torch.bfloat16)
    cache = model.caches[0]
    wrapper = BatchMLAPagedAttentionWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device=dev), backend=backend
    )
    wrapper.plan(
        model.qo_indptr,
        model.kv_indptr,
        model.kv_indices,
        model.kv_len,
        cfg.heads,
        D_CKV,
        D_KPE,
        1,
        False,
        model.sm_scale,
        torch.bfloat16,
        cache.ckv.dtype,
    )
    out = wrapper.run(q[..., :D_CKV], q[..., D_CKV:], cache.ckv, cache.kpe, **cache.run_kwargs())
    ref, _ = mla_reference(
        q[..., :D_CKV],
        q[..., D_CKV:],
        cache.ckv,
        cache.kpe,
        model.qo_indptr,
        model.kv_indptr,
        model.kv_indices,
        model.kv_len,
        sm_scale=model.sm_scale,
        ckv_scale=cache.ckv_scale,
        kpe_scale=cache.kpe_scale,
    )
    return AttentionCheck(what, rel_err(out, ref), rel_err(ref.to(out.dtype), ref))
