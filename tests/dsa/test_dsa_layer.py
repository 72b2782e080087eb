"""One DeepSeek Sparse Attention layer end to end through fp8mla's public calls, against the
same math in float64 written here: DeepSeek-V3.2's published layer (inference/model.py,
kernel.py) with random weights.

The layer: queries from a low-rank projection (``wq_a``, RMSNorm, ``wq_b``), the compressed KV
(``wkv_a``, RMSNorm; RoPE on its 64-dim part), and the lightning indexer -- its own queries
(``wq_b`` of the indexer heads) and one key (``wk``, LayerNorm), RoPE on their first 64 values,
the Hadamard rotation (``hadamard_transform(x, scale=128^-0.5)`` of bf16 values), FP8
act-quant in blocks of 128 with power-of-two scales (``act_quant(x, 128, "ue8m0")``), weights
``weights_proj(x) · H^-0.5 · q_scale · 128^-0.5``, scores ``Σ_h w · ReLU(q·k) · k_scale`` over
the positions a token sees (causal), top-k. Then absorbed MLA over the chosen positions: ``q_nope
· W_UK`` and ``q_pe`` against the packed FP8 cache, softmax, ``· W_UV``, ``wo``.

fp8mla does the writes (``pack_index_keys``, ``pack_ds_mla``), the indexer (``paged_topk``
with slots for decode rows -- two speculative tokens a request --, ``mqa_logits`` + ``topk`` +
``to_slots`` for a causal prefill chunk) and the attention (``sparse_mla``); the model's own
projections are the test's. The float64 side quantizes with its own statement of act_quant
(the index cache's bytes must equal it) and scores, selects and attends in float64.

Ties: the chosen set must equal the float64 top-k except at positions whose float64 score lies
within ``TIE`` × the row's largest |score| of the k-th score (the kernels cannot order those);
such a position may be in one set and not the other, and at most 1% of a row's picks may differ
so. The attention's reference then runs over fp8mla's set (a valid top-k), and the layer's
output must agree within 3e-3 (relative, ‖·‖₂).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

import fp8mla
from fp8mla import dsa
from fp8mla.dsa.index_cache import KEY_BYTES, index_cache_view
from fp8mla.dsa.layout import TOKEN_BYTES
from fp8mla.testing import rel_err

from conftest import HAS_CUDA, INTERPRETED

# a float32 sum of fp32 FP8 products (the interpreter) orders scores 1e-5 apart; a GPU's
# tensor cores add the products at their FP8 accumulation precision (logits within 5e-4 of
# the row's largest |score|: tests/dsa/test_indexer.py), so two scores 1e-3 apart may swap
TIE = 1e-3 if HAS_CUDA and not INTERPRETED else 1e-5
# the kernels: compiled on a GPU, interpreted on a CPU under TRITON_INTERPRET=1 (make test)
BACKEND = "triton" if HAS_CUDA or INTERPRETED else "auto"
SM_SCALE = 192**-0.5 * 1.874  # V3.2's qk_head_dim^-0.5 × its YaRN mscale²
NOPE, ROPE, V, KV_LORA, IDX_DIM = 128, 64, 128, 512, 128


@dataclass(frozen=True)
class Dims:
    dim: int
    q_lora: int
    heads: int
    index_heads: int
    topk: int
    contexts: tuple[int, ...]  # tokens of each request (decode: its last two are the new ones)
    prefill: tuple[int, int]  # request 0's positions [a, b) run as a causal prefill chunk


CPU_DIMS = Dims(dim=256, q_lora=96, heads=16, index_heads=8, topk=64, contexts=(200, 131),
                prefill=(100, 124))  # fmt: skip
GPU_DIMS = Dims(dim=7168, q_lora=1536, heads=128, index_heads=64, topk=2048,
                contexts=(8192, 6000), prefill=(7936, 8192))  # fmt: skip


# -- the model's math in float64 ----------------------------------------------------------
def hadamard(n: int, device) -> torch.Tensor:
    """Sylvester's Hadamard matrix in natural order (fast_hadamard_transform's), unscaled."""
    i = torch.arange(n, device=device)
    bits = (i[:, None] & i[None, :]).to(torch.int64)
    parity = torch.zeros_like(bits)
    while bool(bits.any()):
        parity ^= bits & 1
        bits >>= 1
    return 1.0 - 2.0 * parity.double()


def rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """DeepSeek's apply_rotary_emb: adjacent pairs rotated by ``pos · 10000^(-2i/d)``."""
    d = x.shape[-1]
    freqs = 10000.0 ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * freqs[None, :]
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [d // 2]
    cos, sin = ang.cos().view(shape), ang.sin().view(shape)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], eps=1e-6)


def act_quant_pow2(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant of bf16 ``x [..., 128]`` with ue8m0 scales, in float64: ``s =
    2^ceil(log2(max(amax, 1e-4) / 448))``, codes ``e4m3(x / s)`` (exact division, round to
    nearest even). Returns ``(codes float8_e4m3fn, s float64 [...])``."""
    amax = x.double().abs().amax(-1).clamp_min(1e-4)
    s = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    codes = (x.double() / s[..., None]).float().to(torch.float8_e4m3fn)
    return codes, s


@dataclass
class Model:
    wq_a: torch.Tensor
    wq_b: torch.Tensor
    wkv_a: torch.Tensor
    wkv_b: torch.Tensor
    wo: torch.Tensor
    iq_b: torch.Tensor
    wk: torch.Tensor
    wproj: torch.Tensor


def random_model(d: Dims, g: torch.Generator, device) -> Model:
    def w(rows, cols):
        return (torch.randn(rows, cols, generator=g, dtype=torch.float64) / math.sqrt(cols)).to(
            device
        )

    return Model(
        wq_a=w(d.q_lora, d.dim), wq_b=w(d.heads * (NOPE + ROPE), d.q_lora),
        wkv_a=w(KV_LORA + ROPE, d.dim), wkv_b=w(d.heads * (NOPE + V), KV_LORA),
        wo=w(d.dim, d.heads * V), iq_b=w(d.index_heads * IDX_DIM, d.q_lora),
        wk=w(IDX_DIM, d.dim), wproj=w(d.index_heads, d.dim),
    )  # fmt: skip


@dataclass
class Tokens:
    """Every token's layer inputs, bf16 where DeepSeek's layer hands bf16 on."""

    q_abs: torch.Tensor  # [T, H, 512] q_nope · W_UK
    q_pe: torch.Tensor  # [T, H, 64]
    kv_c: torch.Tensor  # [T, 512]
    k_pe: torch.Tensor  # [T, 64]
    iq: torch.Tensor  # [T, Hi, 128] rotated indexer queries
    ik: torch.Tensor  # [T, 128] rotated indexer key
    wproj: torch.Tensor  # [T, Hi] weights_proj(x) · Hi^-0.5


def project(m: Model, d: Dims, x: torch.Tensor, pos: torch.Tensor) -> Tokens:
    bf = torch.bfloat16
    t = x.shape[0]
    qr = rms_norm(x @ m.wq_a.T)
    q = (qr @ m.wq_b.T).view(t, d.heads, NOPE + ROPE)
    q_pe = rope(q[..., NOPE:], pos)
    w_kv = m.wkv_b.view(d.heads, NOPE + V, KV_LORA)
    q_abs = torch.einsum("thd,hdc->thc", q[..., :NOPE], w_kv[:, :NOPE])
    kv = x @ m.wkv_a.T
    kv_c, k_pe = rms_norm(kv[:, :KV_LORA]), rope(kv[:, KV_LORA:], pos)
    h = hadamard(IDX_DIM, x.device) * IDX_DIM**-0.5
    iq = (qr @ m.iq_b.T).view(t, d.index_heads, IDX_DIM)
    iq = torch.cat([rope(iq[..., :ROPE], pos), iq[..., ROPE:]], -1).to(bf).double() @ h
    ik = layer_norm(x @ m.wk.T)
    ik = torch.cat([rope(ik[:, None, :ROPE], pos)[:, 0], ik[:, ROPE:]], -1).to(bf).double() @ h
    wproj = (x @ m.wproj.T) * d.index_heads**-0.5
    return Tokens(q_abs.to(bf), q_pe.to(bf), kv_c.to(bf), k_pe.to(bf), iq.to(bf), ik.to(bf),
                  wproj)  # fmt: skip


def check_selection(got: torch.Tensor, scores: torch.Tensor, k: int) -> int:
    """``got [k]`` (ascending, -1 padded) against the float64 top-k of ``scores`` (finite
    where seen): equal but for ties (module docstring); returns how many picks differ."""
    seen = torch.isfinite(scores).nonzero().flatten()
    chosen = got[got >= 0].long()
    assert chosen.numel() == min(k, seen.numel())
    assert torch.all(torch.isfinite(scores[chosen])), "a position the row does not see"
    order = torch.sort(scores[seen], descending=True, stable=True).indices[:k]
    ref = seen[order]
    if ref.numel() < seen.numel():
        kth = scores[ref[-1]]
        band = TIE * float(scores[seen].abs().max())
        differ = set(ref.tolist()) ^ set(chosen.tolist())
        for p in differ:
            assert abs(float(scores[p] - kth)) <= band, f"position {p} is no tie"
        assert len(differ) <= max(2, k // 50)
        return len(differ)
    assert set(ref.tolist()) == set(chosen.tolist())
    return 0


def attend(
    tok: Tokens, rows: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor
) -> torch.Tensor:
    """float64 absorbed attention of ``rows`` over their ``slots`` in the packed cache: the
    latent output ``[R, H, 512]``."""
    out = []
    for r, s in zip(rows.tolist(), slots):
        s = s[s >= 0]
        kv, pe = fp8mla.unpack_ds_mla(cache, s)
        scores = tok.q_abs[r].double() @ kv.double().T + tok.q_pe[r].double() @ pe.double().T
        p = torch.softmax(scores * SM_SCALE, dim=-1)
        out.append(p @ kv.double())
    return torch.stack(out)


def finish(m: Model, d: Dims, latent: torch.Tensor) -> torch.Tensor:
    """``· W_UV`` per head, then ``wo``: ``[R, dim]``."""
    w_uv = m.wkv_b.view(d.heads, NOPE + V, KV_LORA)[:, NOPE:]
    o = torch.einsum("rhc,hvc->rhv", latent.double(), w_uv)
    return o.flatten(1) @ m.wo.T


def run_layer(d: Dims, device: str, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    m = random_model(d, g, device)
    page = 64
    # -- the requests' tokens, their pages, both caches written by fp8mla --
    pages_of = [-(-n // page) for n in d.contexts]
    perm = torch.randperm(sum(pages_of) + 2, generator=g).to(torch.int32)
    table = torch.full((len(d.contexts), max(pages_of)), -1, dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages_of):
        table[b, :n] = perm[at : at + n]
        at += n
    table = table.to(device)
    num_pages = perm.numel()
    idx_cache = torch.full((num_pages, page, 1, KEY_BYTES), 0xFF, dtype=torch.uint8, device=device)
    mla_cache = torch.full((num_pages, page, TOKEN_BYTES), 0xFF, dtype=torch.uint8, device=device)
    toks, slots_of = [], []
    for b, n in enumerate(d.contexts):
        x = torch.randn(n, d.dim, generator=g, dtype=torch.float64).to(device)
        pos = torch.arange(n, device=device)
        tok = project(m, d, x, pos)
        slots = table[b].long()[pos // page] * page + pos % page
        fp8mla.pack_index_keys(tok.ik, idx_cache, slots, scale_format="pow2", backend=BACKEND)
        fp8mla.pack_ds_mla(tok.kv_c, tok.k_pe, mla_cache, slots, backend=BACKEND)
        toks.append(tok)
        slots_of.append(slots)
    # the index cache holds the test's act_quant of every key, byte for byte
    view = index_cache_view(idx_cache)
    for tok, slots in zip(toks, slots_of):
        codes, scale = act_quant_pow2(tok.ik)
        p, o = slots // page, slots % page
        assert torch.equal(view.codes()[p, o], codes.view(torch.uint8))
        assert torch.equal(view.scales()[p, o], scale.float())

    def indexer_q(tok: Tokens, rows: torch.Tensor):
        codes, q_scale = act_quant_pow2(tok.iq[rows])  # [R, Hi, 128], [R, Hi]
        w = tok.wproj[rows] * q_scale * IDX_DIM**-0.5
        return codes, w

    def float64_scores(tok: Tokens, rows: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        codes, w = indexer_q(tok, rows)
        kc, ks = act_quant_pow2(tok.ik)
        s = torch.einsum("rhd,sd->rhs", codes.double(), kc.double()).clamp_min(0)
        s = torch.einsum("rhs,rh->rs", s, w) * ks[None, :]
        cols = torch.arange(s.shape[1], device=s.device)
        return s.masked_fill(cols[None, :] >= seen[:, None], float("-inf"))

    outputs, refs, swaps = [], [], 0
    # -- decode: the last two tokens of each request, speculative (each sees itself) --
    decode_rows = [torch.tensor([n - 2, n - 1], device=device) for n in d.contexts]
    q8 = torch.stack([indexer_q(t, r)[0] for t, r in zip(toks, decode_rows)])
    w = torch.cat([indexer_q(t, r)[1] for t, r in zip(toks, decode_rows)]).float()
    lens = torch.stack([r + 1 for r in decode_rows]).to(torch.int32)
    pos, slots = dsa.paged_topk(q8, w, idx_cache, table, lens, k=d.topk, backend=BACKEND,
                                max_context_len=max(d.contexts), return_slots=True)  # fmt: skip
    q_abs = torch.cat([t.q_abs[r] for t, r in zip(toks, decode_rows)])
    q_pe = torch.cat([t.q_pe[r] for t, r in zip(toks, decode_rows)])
    out = fp8mla.sparse_mla(q_abs, q_pe, mla_cache, slots, SM_SCALE, backend=BACKEND)
    for b, (tok, rows) in enumerate(zip(toks, decode_rows)):
        scores = float64_scores(tok, rows, rows + 1)
        for i in range(2):
            swaps += check_selection(pos[2 * b + i].cpu(), scores[i].cpu(), d.topk)
        ref_slots = slots[2 * b : 2 * b + 2]
        assert torch.equal(ref_slots, dsa.to_slots(pos[2 * b : 2 * b + 2], table[b : b + 1],
                                                    page, backend=BACKEND))  # fmt: skip
        refs.append(finish(m, d, attend(tok, rows, ref_slots, mla_cache)))
        outputs.append(finish(m, d, out[2 * b : 2 * b + 2]))
    # -- prefill: a causal chunk of request 0 over its contiguous keys --
    tok, (a, b) = toks[0], d.prefill
    rows = torch.arange(a, b, device=device)
    codes, w = indexer_q(tok, rows)
    kc, ks = act_quant_pow2(tok.ik[:b])
    starts = torch.zeros(b - a, dtype=torch.int32, device=device)
    ends = (rows + 1).to(torch.int32)
    logits = dsa.mqa_logits(codes, w.float(), kc, ks.float(), starts, ends, backend=BACKEND)
    pos = dsa.topk(logits, ends, d.topk, starts=starts, backend=BACKEND)
    req = torch.zeros(b - a, dtype=torch.int32, device=device)
    slots = dsa.to_slots(pos, table, page, req_ids=req, backend=BACKEND)
    out = fp8mla.sparse_mla(
        tok.q_abs[rows], tok.q_pe[rows], mla_cache, slots, SM_SCALE, backend=BACKEND
    )
    scores = float64_scores(tok, rows, rows + 1)
    for i in range(b - a):
        swaps += check_selection(pos[i].cpu(), scores[i, :b].cpu(), d.topk)
    refs.append(finish(m, d, attend(tok, rows, slots, mla_cache)))
    outputs.append(finish(m, d, out))
    err = rel_err(torch.cat(outputs), torch.cat(refs))
    assert err <= 3e-3, f"layer output: {err:.2e} ({swaps} tied picks differ)"


def test_dsa_layer_reduced_width():
    run_layer(CPU_DIMS, "cuda" if HAS_CUDA else "cpu")


@pytest.mark.gpu
def test_dsa_layer_full_width():
    """128 heads, 64 indexer heads, top-2,048 of 8,192 tokens (V3.2's widths)."""
    run_layer(GPU_DIMS, "cuda")
