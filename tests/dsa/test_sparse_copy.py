"""Sparse MLA over an fp16 copy of the referenced rows (``kernel="copy16"``,
``fp8mla.dsa.sparse_copy``) against the float64 reference on the same cache bytes: -1 padding,
``topk_length``, tokens with nothing to attend to (out 0, LSE +inf), ids outside the cache
(only their token NaN), duplicates, fewer tokens than planned, the engines' cache shapes, and
which plans take the route. Interpreted on a CPU (the dense path's portable kernels over the
copy); the ``gpu`` tests run the SM90 planner's route at prefill sizes and CUDA-graph replays
with new lists."""

from __future__ import annotations

import math

import pytest
import torch
from sparse_cases import SM_SCALE, packed_cache, queries, random_indices

from fp8mla import SparseMLAWrapper
from fp8mla.attention.targets import TARGETS
from fp8mla.dsa.reference import sparse_mla_reference
from fp8mla.dsa.sparse_plan import copy16_route
from fp8mla.testing import rel_err

from conftest import HAS_CUDA, INTERPRETED, IS_SM90

DEVICE = "cuda" if HAS_CUDA else "cpu"
pytestmark = pytest.mark.skipif(
    not (HAS_CUDA or INTERPRETED), reason="needs a GPU or the Triton interpreter"
)


def planned(tokens, heads, topk, dtype=torch.bfloat16, page_size=64) -> SparseMLAWrapper:
    w = SparseMLAWrapper(torch.empty(16 << 20, dtype=torch.uint8, device=DEVICE), backend="triton")
    w.plan(tokens, heads, topk, page_size, dtype, SM_SCALE, kernel="copy16")
    assert w.launch_plan.kernel == "copy16"
    return w


def run(q_nope, q_pe, cache, idx, length=None, page_size=64):
    w = planned(q_nope.shape[0], q_nope.shape[1], idx.shape[-1], q_nope.dtype, page_size)
    return w.run(q_nope, q_pe, cache, idx, length, return_lse=True)


def check(out, lse, q_nope, q_pe, cache, idx, length=None):
    ref_o, ref_l = sparse_mla_reference(q_nope, q_pe, cache, idx, SM_SCALE, length)
    nan, empty = torch.isnan(ref_l), ref_l == math.inf
    live = ~nan & ~empty
    assert torch.equal(torch.isnan(lse).cpu(), nan.cpu())
    assert torch.isnan(out[nan]).all()
    assert (lse[empty] == math.inf).all() and (out[empty] == 0).all()
    if live.any():
        assert rel_err(out[live].float(), ref_o[live]) <= 3e-3
        assert rel_err(lse[live], ref_l[live]) <= 1e-3


@pytest.mark.parametrize(
    "heads, tokens, topk, page, shape, dtype",
    [(16, 3, 40, 64, "pages", torch.bfloat16), (64, 2, 33, 1, "pool", torch.bfloat16),
     (20, 4, 100, 64, "flashmla", torch.float16)],
)  # fmt: skip
def test_matches_reference(heads, tokens, topk, page, shape, dtype):
    cache = packed_cache(256, page, shape, seed=heads, device=DEVICE)
    q_nope, q_pe = queries(tokens, heads, dtype, seed=heads, device=DEVICE)
    idx = random_indices(tokens, topk, 256, seed=heads, pad=0.1, device=DEVICE)
    idx[0, :5] = idx[0, 5]  # duplicates count
    length = torch.full((tokens,), topk, dtype=torch.int32, device=DEVICE)
    length[-1] = topk // 2
    out, lse = run(q_nope, q_pe, cache, idx, length, page_size=page)
    assert out.dtype == dtype
    check(out, lse, q_nope, q_pe, cache, idx, length)


def test_empty_rows_bad_ids_and_fewer_tokens_than_planned():
    slots = 192
    cache = packed_cache(slots, 64, "flashmla", device=DEVICE)
    q_nope, q_pe = queries(5, 16, device=DEVICE)
    idx = random_indices(5, 48, slots, seed=3, device=DEVICE)
    idx[1, 5] = slots  # outside the cache: its token NaN
    idx[2] = -1  # nothing listed
    idx[3, 40] = -2
    length = torch.tensor([48, 48, 48, 48, 0], dtype=torch.int32, device=DEVICE)
    w = planned(7, 16, 48)  # more tokens than a call brings
    for _ in range(2):  # the second call finds the work buffers as the first left them
        out, lse = w.run(q_nope, q_pe, cache, idx, length, return_lse=True)
        check(out, lse, q_nope, q_pe, cache, idx, length)
        assert torch.isnan(out[1]).all() and torch.isnan(out[3]).all()
        assert (out[2] == 0).all() and (lse[4] == math.inf).all()
        assert torch.isfinite(out[0]).all()


def test_which_plans_take_the_copy():
    sm90, sm120 = TARGETS["sm90"], TARGETS["sm120"]
    u8, bf16 = torch.uint8, torch.bfloat16
    assert copy16_route("auto", sm90, 4096, 128, 2048, u8)  # a prefill chunk at 128 heads
    assert copy16_route("auto", sm90, 1024, 128, 2048, u8)
    assert copy16_route("auto", sm90, 4096, 64, 2048, u8)  # 64 heads: from 4,096 tokens
    assert not copy16_route("auto", sm90, 2048, 64, 2048, u8)  # level with the FP8 kernel there
    assert not copy16_route("auto", sm90, 256, 128, 2048, u8)  # decode: rows rarely shared
    assert not copy16_route("auto", sm90, 4096, 16, 2048, u8)  # 16 heads: bound by the bytes
    assert not copy16_route("auto", sm120, 4096, 128, 2048, u8)  # measured on SM90 only
    assert not copy16_route("portable", sm90, 4096, 128, 2048, u8)
    assert copy16_route("copy16", sm120, 1, 16, 8, u8)
    with pytest.raises(ValueError, match="packed FP8 cache"):
        copy16_route("copy16", sm90, 4096, 128, 2048, bf16)


@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the planner takes the copy on SM90")
def test_gpu_prefill_route_and_graph_replays():
    pool = 1 << 18
    tokens, heads, topk = 1024, 128, 2048
    cache = packed_cache(pool, 64, device="cuda", seed=5)
    q_nope, q_pe = queries(tokens, heads, device="cuda", seed=5)
    idx = random_indices(tokens, topk, pool, seed=5, pad=0.05, device="cuda")
    idx[7, 100] = pool + 3  # token 7: NaN
    length = torch.full((tokens,), topk, dtype=torch.int32, device="cuda")
    length[9] = 0
    w = SparseMLAWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"),
                         use_cuda_graph=True)  # fmt: skip
    w.plan(tokens, heads, topk, 64, torch.bfloat16, SM_SCALE)
    assert w.launch_plan.kernel == "copy16"
    out = torch.empty(tokens, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(tokens, heads, dtype=torch.float32, device="cuda")
    rows = torch.tensor([0, 7, 9, 511, 1023], device="cuda")
    w.run(q_nope, q_pe, cache, idx, length, out=out, lse=lse)
    check(out[rows], lse[rows], q_nope[rows], q_pe[rows], cache, idx[rows], length[rows])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        w.run(q_nope, q_pe, cache, idx, length, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_nope, q_pe, cache, idx, length, out=out, lse=lse)
    for seed in (6, 7):
        idx.copy_(random_indices(tokens, topk, pool, seed=seed, pad=0.1, device="cuda"))
        length.copy_(torch.randint(0, topk + 1, (tokens,), device="cuda", dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        check(out[rows], lse[rows], q_nope[rows], q_pe[rows], cache, idx[rows], length[rows])


def test_wrappers_and_caches_share_one_copy():
    """Two plans and two cache sizes in turn on one device's copy buffers."""
    from fp8mla.dsa import sparse_copy

    big, small = (
        packed_cache(256, 64, device=DEVICE, seed=1),
        packed_cache(128, 1, "pool", device=DEVICE, seed=2),
    )
    q_nope, q_pe = queries(3, 16, device=DEVICE, seed=4)
    a, b = planned(3, 16, 40), planned(3, 16, 40, page_size=1)
    for w, cache, slots in ((a, big, 256), (b, small, 128), (a, big, 256)):
        idx = random_indices(3, 40, slots, seed=slots, pad=0.1, device=DEVICE)
        out, lse = w.run(q_nope, q_pe, cache, idx, return_lse=True)
        check(out, lse, q_nope, q_pe, cache, idx)
    bufs = sparse_copy.device_buffers(torch.device(DEVICE))
    assert bufs.claimed is not None and bufs.claimed.shape[0] >= 256
    assert (bufs.claimed == 0).all()  # ready for the next call


def test_grown_buffers_keep_their_predecessors():
    """A CUDA graph captured with a buffer replays into it: growing keeps the old one."""
    from fp8mla.dsa.sparse_copy import CopyBuffers

    bufs = CopyBuffers()
    bufs.fit(64, 16, torch.device("cpu"))
    first = bufs.copy
    bufs.fit(32, 8, torch.device("cpu"))  # fits: nothing new
    assert bufs.copy is first and not bufs.retired
    bufs.fit(128, 32, torch.device("cpu"))
    assert bufs.copy.shape[0] == 32 and bufs.claimed.shape[0] == 128
    assert any(t is first for t in bufs.retired)


def test_growth_counts_what_fit_allocates():
    from fp8mla.dsa.sparse_copy import CopyBuffers

    bufs = CopyBuffers()
    assert bufs.growth(64, 16) == 5 * 64 + 4 + (4 + 1152) * 16
    bufs.fit(64, 16, torch.device("cpu"))
    assert bufs.growth(64, 16) == 0 and bufs.growth(32, 8) == 0
    assert bufs.growth(128, 16) == 5 * 128 + 4  # the rows' claims, block sums, copy rows
    assert bufs.growth(64, 17) == (4 + 1152) * 17  # the copy and its sources alone


def test_a_copy_past_the_free_memory_runs_the_fallback(monkeypatch):
    """A call whose copy would have to grow past the free memory runs the plan's fallback
    (an automatic plan's FP8 kernel) with the call's arguments, and grows nothing; a plan
    without a fallback (``kernel="copy16"`` named) grows the copy regardless."""
    from fp8mla.dsa import sparse_copy

    fresh = sparse_copy.CopyBuffers()
    monkeypatch.setattr(sparse_copy, "device_buffers", lambda device: fresh)
    monkeypatch.setattr(sparse_copy, "copy_fits", lambda device, nbytes: False)
    cache = packed_cache(1024, 64, device=DEVICE, seed=3)
    q_nope, q_pe = queries(2, 16, device=DEVICE, seed=3)
    idx = random_indices(2, 24, 1024, seed=3, pad=0.1, device=DEVICE)
    w = planned(2, 16, 24)
    calls = []
    w._launch.fallback = lambda *args: calls.append(args)
    w.run(q_nope, q_pe, cache, idx, return_lse=True)
    assert len(calls) == 1 and calls[0][0] is q_nope and fresh.copy is None
    w._launch.fallback = None
    out, lse = w.run(q_nope, q_pe, cache, idx, return_lse=True)
    check(out, lse, q_nope, q_pe, cache, idx)
    assert fresh.copy is not None and len(calls) == 1


def test_the_copy_compacts_into_its_fallbacks_buffers():
    """An automatic plan's copy route and its FP8 fallback run one at a time: the copy compacts
    into the fallback's ``[T, topk]`` buffers rather than a second set, and its results hold."""
    from types import SimpleNamespace

    from fp8mla.dsa.sparse_copy import CopySparseLaunch

    tokens, heads, topk = 3, 16, 40
    compacted = torch.zeros(tokens, topk, dtype=torch.int32, device=DEVICE)
    counts = torch.zeros(tokens, dtype=torch.int32, device=DEVICE)
    fallback = SimpleNamespace(sparse=SimpleNamespace(compacted=compacted, counts=counts))
    w = planned(tokens, heads, topk)
    w._launch = CopySparseLaunch(tokens, heads, topk, SM_SCALE, w._workspace, w.device,
                                 DEVICE == "cpu", fallback)  # fmt: skip
    assert w._launch.compacted is compacted and w._launch.counts is counts
    cache = packed_cache(256, 64, device=DEVICE, seed=6)
    q_nope, q_pe = queries(tokens, heads, device=DEVICE, seed=6)
    idx = random_indices(tokens, topk, 256, seed=6, pad=0.1, device=DEVICE)
    out, lse = w.run(q_nope, q_pe, cache, idx, return_lse=True)
    check(out, lse, q_nope, q_pe, cache, idx)
    assert int(counts.sum()) > 0  # the fallback's buffers held this call's lists


@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the planner takes the copy on SM90")
def test_gpu_automatic_plan_falls_back_to_the_fp8_kernel(monkeypatch):
    """An automatic copy16 plan whose copy does not fit the free memory runs the FP8 x FP8
    kernel the table would have chosen, against float64."""
    from fp8mla.dsa import sparse_copy

    fresh = sparse_copy.CopyBuffers()
    monkeypatch.setattr(sparse_copy, "device_buffers", lambda device: fresh)
    monkeypatch.setattr(sparse_copy, "copy_fits", lambda device, nbytes: False)
    tokens, heads, topk, pool = 1024, 128, 2048, 1 << 16
    cache = packed_cache(pool, 64, device="cuda", seed=8)
    q_nope, q_pe = queries(tokens, heads, device="cuda", seed=8)
    idx = random_indices(tokens, topk, pool, seed=8, pad=0.05, device="cuda")
    w = SparseMLAWrapper(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(tokens, heads, topk, 64, torch.bfloat16, SM_SCALE)
    assert w.launch_plan.kernel == "copy16" and w._launch.fallback is not None
    # one set of compaction buffers for the copy and its fallback (33.5 MB at 4,096 tokens)
    assert w._launch.compacted.data_ptr() == w._launch.fallback.sparse.compacted.data_ptr()
    out, lse = w.run(q_nope, q_pe, cache, idx, return_lse=True)
    rows = torch.tensor([0, 1, 500, 1023], device="cuda")
    check(out[rows], lse[rows], q_nope[rows], q_pe[rows], cache, idx[rows])
    assert fresh.copy is None
