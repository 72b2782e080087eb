"""Sparse MLA attention through the SM90 Gluon kernels (``fp8mla.dsa.sparse_sm90``: the FP8 × FP8
kernel, and the FP8 and 16-bit ping-pong kernels where named) against float64 on the same packed bytes, on
an H200: one token to a prefill chunk, 16 to 128 heads,
-1 padding, ``topk_length``, tokens with nothing to attend to (out 0, LSE +inf), ids outside
the cache (that token's rows NaN, the others exact), duplicates, both vLLM's and SGLang's cache
shapes, and a CUDA graph replayed with new indices."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import IS_SM90

pytestmark = pytest.mark.skipif(not IS_SM90, reason="the FP8 x FP8 kernel runs on SM90 GPUs only")

SM_SCALE = 1 / math.sqrt(192)


def _cache(slots: int, page: int, seed: int, magnitude=3.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed cache of random tokens (vLLM's ``[pages, page, 656]``), unused bytes NaN; the
    latent values about ``magnitude`` (a float, or four: one for each 128-value group)."""
    import fp8mla

    g = torch.Generator(device="cuda").manual_seed(seed)
    cache = torch.full((slots // page, page, 656), 0x7F, dtype=torch.uint8, device="cuda")
    used = torch.randperm(slots, device="cuda", generator=g)[: slots // 2]
    group = torch.tensor(magnitude, device="cuda").view(-1, 1)
    ckv = (torch.randn(used.numel(), 4, 128, device="cuda", generator=g) * group).view(-1, 512)
    kpe = torch.randn(used.numel(), 64, device="cuda", generator=g)
    fp8mla.pack_ds_mla(ckv.bfloat16(), kpe.bfloat16(), cache, used, validate=False)
    return cache, used


def _reference(q_nope, q_pe, cache, indices, topk_length):
    """float64 attention of each token over its own listed slots (duplicates count)."""
    import fp8mla

    t_n, h_n, _ = q_nope.shape
    out = torch.zeros(t_n, h_n, 512, dtype=torch.float64)
    lse = torch.full((t_n, h_n), math.inf, dtype=torch.float64)
    slots = cache.shape[0] * cache.shape[1]
    for t in range(t_n):
        n = indices.shape[1] if topk_length is None else int(topk_length[t])
        row = indices[t, : max(0, min(n, indices.shape[1]))].long()
        row = row[row != -1]
        if ((row < 0) | (row >= slots)).any():
            out[t] = math.nan
            lse[t] = math.nan
            continue
        if row.numel() == 0:
            continue
        ckv, kpe = fp8mla.unpack_ds_mla(cache, row.cuda())
        k = torch.cat([ckv, kpe], dim=1).double().cpu()
        q = torch.cat([q_nope[t], q_pe[t]], dim=1).double().cpu()
        s = q @ k.T * SM_SCALE
        lse[t] = torch.logsumexp(s, dim=1)
        out[t] = torch.softmax(s, dim=1) @ ckv.double().cpu()
    return out, lse


def _run(q_nope, q_pe, cache, indices, topk_length, planned=None, lists=None, config="fp8qk"):
    """The SM90 path's output and LSE on kernel ``config``, planned for ``planned`` tokens
    (default: the call's), the index lists read in place where ``lists`` (None: as the plan
    decides)."""
    from fp8mla.dsa.layout import token_view
    from fp8mla.dsa.sparse_sm90 import fp8qk_sparse, run_fp8qk_sparse

    t_n, h_n, _ = q_nope.shape
    ws = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    s = fp8qk_sparse(planned or t_n, h_n, indices.shape[1], SM_SCALE, ws, torch.device("cuda"),
                     lists, config)  # fmt: skip
    out = torch.empty_like(q_nope)
    lse = torch.empty(t_n, h_n, dtype=torch.float32, device="cuda")
    view = token_view(cache)
    run_fp8qk_sparse(s, q_nope, q_pe, view, indices, topk_length, out, lse)
    return out, lse, s


def _rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    ok = torch.isfinite(b)
    return float((a[ok] - b[ok]).norm() / b[ok].norm().clamp_min(1e-30))


@pytest.mark.parametrize(
    "tokens, heads, topk, slots, page",
    [(1, 32, 2048, 1 << 16, 64), (4, 16, 64, 4096, 1), (3, 64, 300, 8192, 64),
     (2, 128, 2048, 1 << 16, 64), (64, 16, 517, 1 << 15, 64), (512, 128, 128, 1 << 14, 64)],
)  # fmt: skip
@pytest.mark.parametrize("config", ["fp8qk", "pingpong8", "pingpong"])
def test_matches_float64(tokens, heads, topk, slots, page, config):
    torch.manual_seed(tokens * 7 + heads)
    cache, used = _cache(slots, page, tokens)
    pick = torch.randint(0, used.numel(), (tokens, topk), device="cuda")
    indices = used[pick].to(torch.int32)
    indices[:, ::7] = -1  # padding anywhere in the list
    topk_length = torch.randint(0, topk + 3, (tokens,), dtype=torch.int32, device="cuda")
    topk_length[0] = topk
    q_nope = torch.randn(tokens, heads, 512, device="cuda", dtype=torch.bfloat16)
    q_pe = torch.randn(tokens, heads, 64, device="cuda", dtype=torch.bfloat16)
    out, lse, s = _run(q_nope, q_pe, cache, indices, topk_length, config=config)
    assert s.plan.config.variant == config
    ref, ref_lse = _reference(q_nope, q_pe, cache, indices.cpu(), topk_length.cpu())
    assert _rel(out, ref) <= 3e-3
    assert _rel(lse, ref_lse) <= 1e-4
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse.cpu()), empty)
    assert (out.cpu()[empty] == 0).all()


@pytest.mark.parametrize("magnitude", [1e-4, 1e-2, 1e3, None])
@pytest.mark.parametrize("config", ["fp8qk", "pingpong8", "pingpong"])
def test_group_scales_far_from_one(config, magnitude):
    """Caches whose latent values are all about ``magnitude`` (group scales from ~1e-6 to ~10;
    None: each token's four groups about 1e-4, 1e-2, 1 and 1e3) match float64 as closely as
    values near 1 do (pingpong8 on mixed groups excepted, below). The group scales are
    arbitrary fp32 (GLM's caches): rounded to fp16 as they are, those of values ~1e-4 are
    subnormals, and the answer is off by ~3e-2."""
    torch.manual_seed(5)
    tokens, heads, topk = 3, 64, 512
    mixed = magnitude is None
    cache, used = _cache(1 << 14, 64, 5, (1e-4, 1e-2, 1.0, 1e3) if mixed else magnitude)
    indices = used[torch.randint(0, used.numel(), (tokens, topk), device="cuda")].to(torch.int32)
    q_nope = torch.randn(tokens, heads, 512, device="cuda", dtype=torch.bfloat16)
    q_pe = torch.randn(tokens, heads, 64, device="cuda", dtype=torch.bfloat16)
    # scores of order 1 (not one token each): the query's parts over values ~1e3 scaled down
    if mixed:
        q_nope.view(tokens, heads, 4, 128)[:, :, 3] /= 1e3
    elif magnitude > 1:
        q_nope /= magnitude
    out, lse, _ = _run(q_nope, q_pe, cache, indices, None, config=config)
    ref, ref_lse = _reference(q_nope, q_pe, cache, indices.cpu(), None)
    # pingpong8 holds the query as e4m3 hi + lo under one power of two per row and part
    # (kernels/sm90/pingpong8.py): the mixed case's last query group, 1e3 below the rest,
    # keeps fewer of its bits there, and its scores carry the output (5.2e-3 on an H100)
    assert _rel(out, ref) <= (1e-2 if mixed and config == "pingpong8" else 3e-3)
    assert _rel(lse, ref_lse) <= 1e-4


@pytest.mark.parametrize("tokens, heads, topk", [(1, 32, 2048), (5, 128, 300), (64, 16, 517)])
def test_lists_in_place_and_compacted_agree_with_float64(tokens, heads, topk):
    """The index lists read as the caller gives them (-1 masked in the kernel) and compacted
    first (by the plan, or for lists further apart than topk) all match float64: -1 anywhere,
    a whole 64-entry tile of -1, a token with none, lengths past topk and below 0, a plan for
    more tokens than the call has."""
    from fp8mla.dsa.layout import token_view
    from fp8mla.dsa.sparse_sm90 import cache_rows, reads_lists

    torch.manual_seed(tokens + heads)
    cache, used = _cache(1 << 16, 64, tokens + 11)
    indices = used[torch.randint(0, used.numel(), (tokens, topk), device="cuda")].to(torch.int32)
    indices[:, 1::5] = -1
    indices[0, 64:128] = -1
    lengths = torch.randint(-2, topk + 40, (tokens,), dtype=torch.int32, device="cuda")
    lengths[0] = topk + 7
    if tokens > 2:
        indices[2] = -1
        lengths[1] = -3
    wide = torch.full((tokens, topk + 8), -5, dtype=torch.int32, device="cuda")
    wide[:, :topk] = indices
    apart = wide[:, :topk]  # entries past topk are never read (they would poison the row)
    q_nope = torch.randn(tokens, heads, 512, device="cuda", dtype=torch.bfloat16)
    q_pe = torch.randn(tokens, heads, 64, device="cuda", dtype=torch.bfloat16)
    rows = cache_rows(token_view(cache))
    assert reads_lists(rows, indices, topk) and reads_lists(rows, apart, topk) == (tokens == 1)
    refs = {id(lengths): _reference(q_nope, q_pe, cache, indices.cpu(), lengths.cpu()),
            id(None): _reference(q_nope, q_pe, cache, indices.cpu(), None)}  # fmt: skip
    empty = torch.isinf(refs[id(lengths)][1])
    for lists, in_place in ((indices, True), (apart, True), (indices, False)):
        for length in (lengths, None):
            want, want_lse = refs[id(length)]
            out, lse, _ = _run(q_nope, q_pe, cache, lists, length, tokens + 3, in_place)
            assert _rel(out, want) <= 3e-3
            assert _rel(lse, want_lse) <= 1e-4
            if length is not None:
                assert torch.equal(torch.isinf(lse.cpu()), empty)
                assert (out.cpu()[empty] == 0).all()


@pytest.mark.parametrize("config, heads", [("fp8qk", 32), ("pingpong8", 128), ("pingpong", 128)])
def test_bad_ids_poison_only_their_token(config, heads):
    cache, used = _cache(4096, 64, 3)
    indices = used[torch.randint(0, used.numel(), (4, 96), device="cuda")].to(torch.int32)
    indices[1, 5] = 4096  # past the cache
    indices[2, 9] = -5  # below -1
    indices[3, :] = -1  # nothing to attend to
    q_nope = torch.randn(4, heads, 512, device="cuda", dtype=torch.bfloat16)
    q_pe = torch.randn(4, heads, 64, device="cuda", dtype=torch.bfloat16)
    out, lse, _ = _run(q_nope, q_pe, cache, indices, None, config=config)
    assert out[1:3].isnan().all() and lse[1:3].isnan().all()
    assert (out[3] == 0).all() and torch.isinf(lse[3]).all() and (lse[3] > 0).all()
    ref, _ = _reference(q_nope[:1], q_pe[:1], cache, indices[:1].cpu(), None)
    assert _rel(out[:1], ref) <= 3e-3


def test_sglang_pool_shape_and_duplicates():
    cache, used = _cache(8192, 64, 5)
    pool = cache.view(-1, 1, 656)  # SGLang's [slots, 1, 656]
    indices = used[torch.randint(0, 16, (2, 64), device="cuda")].to(torch.int32)  # duplicates
    q_nope = torch.randn(2, 16, 512, device="cuda", dtype=torch.bfloat16)
    q_pe = torch.randn(2, 16, 64, device="cuda", dtype=torch.bfloat16)
    out, _, _ = _run(q_nope, q_pe, pool, indices, None)
    ref, _ = _reference(q_nope, q_pe, cache, indices.cpu(), None)
    assert _rel(out, ref) <= 3e-3


def test_pages_with_a_gap_read_the_same_rows():
    """Pages whose stride is 65 rows (a gap of NaN bytes after each): the compaction turns slots
    into rows; the result is the contiguous cache's, bit for bit, ids outside the cache NaN."""
    cache, used = _cache(8192, 64, 7)
    gapped = torch.full((128, 65, 656), 0x7F, dtype=torch.uint8, device="cuda")
    gapped[:, :64] = cache
    indices = used[torch.randint(0, used.numel(), (3, 200), device="cuda")].to(torch.int32)
    indices[2, 17] = 8192  # past the cache
    q_nope = torch.randn(3, 32, 512, device="cuda", dtype=torch.bfloat16)
    q_pe = torch.randn(3, 32, 64, device="cuda", dtype=torch.bfloat16)
    want, want_lse, _ = _run(q_nope, q_pe, cache, indices, None)
    got, got_lse, _ = _run(q_nope, q_pe, gapped[:, :64], indices, None)
    assert torch.equal(got[:2], want[:2]) and torch.equal(got_lse[:2], want_lse[:2])
    assert got[2].isnan().all() and got_lse[2].isnan().all()


@pytest.mark.parametrize("config, lists, h_n", [("fp8qk", True, 32), ("fp8qk", False, 32),
                                               ("pingpong8", False, 128),
                                               ("pingpong", False, 128)])  # fmt: skip
def test_cuda_graph_replays_new_indices(config, lists, h_n):
    from fp8mla.dsa.layout import token_view
    from fp8mla.dsa.sparse_sm90 import fp8qk_sparse, run_fp8qk_sparse

    cache, used = _cache(1 << 15, 64, 9)
    t_n, topk = 8, 512
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    s = fp8qk_sparse(t_n, h_n, topk, SM_SCALE, ws, torch.device("cuda"), lists, config)
    assert (s.lists is not None) == lists
    q_nope = torch.randn(t_n, h_n, 512, device="cuda", dtype=torch.bfloat16)
    q_pe = torch.randn(t_n, h_n, 64, device="cuda", dtype=torch.bfloat16)
    indices = torch.empty(t_n, topk, dtype=torch.int32, device="cuda")
    lengths = torch.empty(t_n, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q_nope)
    lse = torch.empty(t_n, h_n, device="cuda")
    view = token_view(cache)

    def fill(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        pick = torch.randint(0, used.numel(), (t_n, topk), device="cuda", generator=g)
        indices.copy_(used[pick].to(torch.int32))
        lengths.copy_(torch.randint(0, topk + 1, (t_n,), device="cuda", generator=g))

    fill(0)
    for _ in range(2):  # compile and warm up outside the capture
        run_fp8qk_sparse(s, q_nope, q_pe, view, indices, lengths, out, lse)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_fp8qk_sparse(s, q_nope, q_pe, view, indices, lengths, out, lse)
    for seed in (1, 2, 3):
        fill(seed)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, ref_lse = _reference(q_nope, q_pe, cache, indices.cpu(), lengths.cpu())
        assert _rel(out, ref) <= 3e-3
        assert _rel(lse, ref_lse) <= 1e-4


@pytest.mark.parametrize("kernel", ["pingpong8", "pingpong"])
@pytest.mark.parametrize("heads", [64, 128])
def test_the_wrapper_runs_a_pingpong_kernel_where_named(heads, kernel):
    """``SparseMLAWrapper.plan(kernel="pingpong8" or "pingpong")``: the plan names the kernel,
    the call matches float64 (the public route to the ping-pong kernels' sparse builds)."""
    import fp8mla

    cache, used = _cache(1 << 15, 64, 13)
    indices = used[torch.randint(0, used.numel(), (3, 700), device="cuda")].to(torch.int32)
    indices[:, ::5] = -1
    q_nope = torch.randn(3, heads, 512, device="cuda", dtype=torch.bfloat16)
    q_pe = torch.randn(3, heads, 64, device="cuda", dtype=torch.bfloat16)
    w = fp8mla.SparseMLAWrapper(torch.empty(128 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(3, heads, 700, 64, torch.bfloat16, SM_SCALE, kernel=kernel)
    assert w._plan.kernel == kernel
    out, lse = w.run(q_nope, q_pe, cache, indices, return_lse=True)
    ref, ref_lse = _reference(q_nope, q_pe, cache, indices.cpu(), None)
    assert _rel(out, ref) <= 3e-3
    assert _rel(lse, ref_lse) <= 1e-4
