"""Device-side inputs of the sparse benchmark: a packed pool, its bf16 twin, queries, slots.

The pool's scales are powers of two, so the bf16 ``[slots, 576]`` cache that ``fp8mla-bf16``
and vLLM's Triton kernel read holds exactly the packed cache's values (e4m3 × 2^k is a bf16
value): every implementation computes on the same numbers, and their errors against the
float64 reference are comparable. The kernels' handling of arbitrary float32 scales is the
tests' business (``tests/dsa``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mla.bench.sparse_cases import SparseCase
from fp8mla.dsa.layout import GROUPS, NOPE_DIM, ROPE_DIM, ROPE_OFFSET, SCALE_OFFSET, TOKEN_BYTES
from fp8mla.dsa.sparse_cache import sparse_cache

CHUNK = 1 << 17  # pool rows generated or converted at once (bounds the temporaries)


def packed_pool(slots: int, page_size: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """``[slots // page_size, page_size, 656]`` uint8: latent values ~ N(0, 1) quantized to
    e4m3 with per-group power-of-two scales (2^-6 … 2^-4), bf16 RoPE ~ N(0, 1)."""
    g = torch.Generator(device=device).manual_seed(seed)
    rows = torch.empty(slots, TOKEN_BYTES, dtype=torch.uint8, device=device)
    for start in range(0, slots, CHUNK):
        n = min(CHUNK, slots - start)
        exp = torch.randint(-6, -3, (n, GROUPS), generator=g, device=device)
        scale = torch.pow(2.0, exp.float())
        x = torch.randn(n, GROUPS, NOPE_DIM // GROUPS, generator=g, device=device)
        codes = (x / scale[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn)
        rope = torch.randn(n, ROPE_DIM, generator=g, device=device).to(torch.bfloat16)
        block = rows[start : start + n]
        block[:, :NOPE_DIM] = codes.view(n, NOPE_DIM).view(torch.uint8)
        block[:, SCALE_OFFSET:ROPE_OFFSET] = scale.view(torch.uint8).view(n, -1)
        block[:, ROPE_OFFSET:] = rope.view(torch.uint8).view(n, -1)
    return rows.view(slots // page_size, page_size, TOKEN_BYTES)


def bf16_twin(pool: torch.Tensor) -> torch.Tensor:
    """The pool's values as a bf16 ``[slots, 576]`` cache (exact: power-of-two scales)."""
    view = sparse_cache(pool)
    out = torch.empty(view.num_slots, NOPE_DIM + ROPE_DIM, dtype=torch.bfloat16, device=pool.device)
    for start in range(0, view.num_slots, CHUNK):
        slots = torch.arange(start, min(view.num_slots, start + CHUNK), device=pool.device)
        latent, rope = view.dequantize(slots, torch.float32)
        out[slots, :NOPE_DIM] = latent.to(torch.bfloat16)
        out[slots, NOPE_DIM:] = rope.to(torch.bfloat16)
    return out


@dataclass
class SparseInputs:
    """One case's call: queries ``q [T, H, 576]`` bf16 (``q_nope``/``q_pe`` are views of it,
    as an engine's absorbed query is one tensor), ``indices [T, topk]`` int32 slot ids."""

    case: SparseCase
    pool: torch.Tensor  # [pages, page_size, 656] uint8
    q: torch.Tensor
    indices: torch.Tensor

    @property
    def q_nope(self) -> torch.Tensor:
        return self.q[..., :NOPE_DIM]

    @property
    def q_pe(self) -> torch.Tensor:
        return self.q[..., NOPE_DIM:]


def sparse_inputs(case: SparseCase, pool: torch.Tensor, seed: int = 0) -> SparseInputs:
    """Random queries and ``case.topk`` uniformly random slots of the pool per query token (a
    repeat within a token's list is as rare as in 2,048 draws from 2^20 slots, and counted),
    or with a ``case.context`` each token's :func:`causal_lists`."""
    device = pool.device
    g = torch.Generator(device=device).manual_seed(seed + 1)
    slots = pool.shape[0] * pool.shape[1]
    q = torch.randn(case.tokens, case.heads, NOPE_DIM + ROPE_DIM, generator=g, device=device)
    if case.context:
        indices = causal_lists(case.tokens, case.topk, case.context, slots, g)
    else:
        indices = torch.randint(
            0, slots, (case.tokens, case.topk), generator=g, device=device, dtype=torch.int32
        )
    return SparseInputs(case, pool, q.to(torch.bfloat16), indices)


def causal_lists(
    tokens: int, topk: int, context: int, slots: int, g: torch.Generator
) -> torch.Tensor:
    """``[tokens, topk]`` int32 lists of a prefill chunk that ends a request of ``context``
    tokens: the request's tokens sit on ``context`` distinct random slots of a pool of
    ``slots`` (its pages scattered), and each chunk token lists ``topk`` distinct tokens of its
    causal prefix (itself included) in random order, -1 after them where the prefix is shorter.
    The positions are uniform over the prefix: the distinct rows a call references are the
    context's, as with an indexer's choices, but without their locality."""
    if not tokens <= context <= slots:
        raise ValueError(
            f"expected a context of at least {tokens} tokens and at most {slots}, got {context}"
        )
    device = g.device
    where = torch.randperm(slots, generator=g, device=device)[:context].to(torch.int32)
    first = context - tokens  # tokens of the request before the chunk
    out = torch.full((tokens, topk), -1, dtype=torch.int32, device=device)
    positions = torch.arange(context, device=device)
    rows = max(1, (1 << 26) // context)  # chunk tokens a pass draws for (256 MB of keys)
    for s in range(0, tokens, rows):
        e = min(tokens, s + rows)
        seen = first + 1 + torch.arange(s, e, device=device)  # each token's prefix length
        keys = torch.rand(e - s, context, generator=g, device=device)
        keys.masked_fill_(positions[None, :] >= seen[:, None], -1.0)
        val, pos = keys.topk(min(topk, context), dim=1)
        out[s:e, : pos.shape[1]] = torch.where(val >= 0, where[pos], -1)
    return out
