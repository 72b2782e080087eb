"""A decode loop shaped like an MLA model, with real fp8mla caches and kernels.

Per layer: RMSNorm, query projection (to absorbed ``q_nope``/``q_pe``), the new token's latent
KV written into the layer's FP8 pool, MLA decode attention over the pool, output projection,
and an MLP. Weights are random and shared by the layers (each layer still reads them, so the
step moves a model's worth of weight bytes without holding 78 copies).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper
from fp8mla.cache import MLAKVCache
from fp8mla.demo import strategies as S
from fp8mla.demo.config import DemoConfig

D_CKV, D_KPE = 512, 64


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class DecodeModel:
    """``step(h)``: one decode step of every layer for ``batch`` requests, reading each
    layer's pool with the chosen strategy."""

    def __init__(self, cfg: DemoConfig, seed: int = 0) -> None:
        self.cfg = cfg
        dev = torch.device(cfg.device)
        self.device = dev
        g = torch.Generator(device=dev).manual_seed(seed)
        bf = dict(dtype=torch.bfloat16, device=dev)

        def weight(rows: int, cols: int) -> torch.Tensor:
            return (torch.randn(rows, cols, generator=g, device=dev) / math.sqrt(rows)).to(**bf)

        h, heads = cfg.hidden, cfg.heads
        self.w_norm = torch.ones(h, **bf)
        self.w_q = weight(h, heads * (D_CKV + D_KPE))
        self.w_kv = weight(h, D_CKV + D_KPE)
        self.w_o = weight(heads * D_CKV, h)
        self.w_up = weight(h, cfg.mlp)
        self.w_down = weight(cfg.mlp, h)
        self.sm_scale = 1 / math.sqrt(256)  # GLM-5: qk_nope 192 + rope 64

        # -- one FP8 pool per layer, each holding the requests' context --
        self.caches: list[MLAKVCache] = []
        seqs: list[int] = []
        for _ in range(cfg.layers):
            cache = MLAKVCache(cfg.pool_slots, page_size=1, dtype=torch.float8_e4m3fn, device=dev)
            seqs = [cache.new_sequence() for _ in range(cfg.batch)]
            for seq in seqs:
                kv = torch.randn(cfg.context, D_CKV + D_KPE, generator=g, device=dev).to(**bf)
                cache.append(seq, kv[:, :D_CKV], kv[:, D_CKV:])
            self.caches.append(cache)
        first = self.caches[0]
        self.kv_indptr, self.kv_indices, self.kv_len = first.plan_arrays(seqs)
        self.slots = self.kv_indices.long()  # page size 1: page id = slot
        # Each step rewrites its token's KV at the last context slot, so steps are replayable.
        self.write_slots = self.slots.view(cfg.batch, cfg.context)[:, -1].contiguous()
        self.qo_indptr = torch.arange(cfg.batch + 1, dtype=torch.int32, device=dev)
        self.wrappers = self._plan_wrappers()
        self.out = torch.empty(cfg.batch, heads, D_CKV, **bf)

    def _plan_wrappers(self) -> dict[str, BatchMLAPagedAttentionWrapper]:
        cfg, dev = self.cfg, self.device
        ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
        n = cfg.active_tokens
        compact = (
            torch.arange(0, n + 1, cfg.context, dtype=torch.int32, device=dev),
            torch.arange(n, dtype=torch.int32, device=dev),
        )
        plans = {
            "full-pool cast": (self.kv_indptr, self.kv_indices, torch.bfloat16),
            "gather-then-cast": (*compact, torch.bfloat16),
            "fp8mla direct": (self.kv_indptr, self.kv_indices, torch.float8_e4m3fn),
        }
        wrappers = {}
        for name, (indptr, indices, kv_dtype) in plans.items():
            w = BatchMLAPagedAttentionWrapper(ws)
            w.plan(
                self.qo_indptr,
                indptr,
                indices,
                self.kv_len,
                cfg.heads,
                D_CKV,
                D_KPE,
                1,
                False,
                self.sm_scale,
                torch.bfloat16,
                kv_dtype,
            )
            wrappers[name] = w
        return wrappers

    def attention(
        self, strategy: str
    ) -> Callable[[MLAKVCache, torch.Tensor, torch.Tensor], torch.Tensor]:
        w = self.wrappers[strategy]
        if strategy == "full-pool cast":
            return lambda c, qn, qp: S.full_pool_cast(c, w, qn, qp, self.out)
        if strategy == "gather-then-cast":
            return lambda c, qn, qp: S.gather_then_cast(c, w, self.slots, qn, qp, self.out)
        if strategy == "fp8mla direct":
            return lambda c, qn, qp: S.fp8mla_direct(c, w, qn, qp, self.out)
        raise ValueError(f"expected a strategy in {S.STRATEGIES}, got {strategy!r}")

    def step(self, h: torch.Tensor, strategy: str) -> torch.Tensor:
        """One decode step: ``h [batch, hidden]`` → ``h`` after every layer."""
        cfg = self.cfg
        attend = self.attention(strategy)
        for cache in self.caches:
            x = rms_norm(h, self.w_norm)
            q = (x @ self.w_q).view(cfg.batch, cfg.heads, D_CKV + D_KPE)
            kv = x @ self.w_kv
            cache.write(self.write_slots, kv[:, :D_CKV], kv[:, D_CKV:], validate=False)
            o = attend(cache, q[..., :D_CKV], q[..., D_CKV:])
            h = h + o.reshape(cfg.batch, cfg.heads * D_CKV) @ self.w_o
            y = rms_norm(h, self.w_norm)
            h = h + torch.nn.functional.silu(y @ self.w_up) @ self.w_down
        return h

    def weight_bytes(self) -> int:
        ws = (self.w_q, self.w_kv, self.w_o, self.w_up, self.w_down)
        return sum(w.numel() * w.element_size() for w in ws) * self.cfg.layers

    def kv_bytes(self, strategy: str) -> int:
        """KV bytes one step moves through device memory (per the strategy)."""
        cfg = self.cfg
        row = D_CKV + D_KPE
        active = cfg.active_tokens * row
        if strategy == "full-pool cast":
            per_layer = cfg.pool_slots * row * 3 + active * 2  # read fp8, write bf16, attend
        elif strategy == "gather-then-cast":
            per_layer = active * (1 + 2 + 2)
        else:
            per_layer = active
        return per_layer * cfg.layers
