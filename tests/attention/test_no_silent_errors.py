"""No silent wrong answer: re-plans of a CUDA-graph wrapper, index arrays changed after plan(),
scales that are not finite, and the small validation cases. Each case either matches the
float64 reference or raises ``ValueError`` naming the limit; a bad page id is never read and
gives NaN, never a finite answer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fp8mla import BatchMLAPagedAttentionWrapper, mla_decode
from fp8mla.testing import make_batch

from attention_utils import SM_SCALE, assert_matches_reference, reference, workspace
from conftest import HAS_CUDA

GRAPH_CAP, GRAPH_PAGES, HEADS, PAGE = 8, 4096, 16, 16


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def graph_wrapper(device):
    i32 = dict(dtype=torch.int32, device=device)
    bufs = (
        torch.empty(GRAPH_CAP + 1, **i32),
        torch.empty(GRAPH_CAP + 1, **i32),
        torch.empty(GRAPH_PAGES, **i32),
        torch.empty(GRAPH_CAP, **i32),
    )
    w = BatchMLAPagedAttentionWrapper(workspace(device), True, *bufs, backend="triton")
    return w


def plan(w, b, causal, heads=HEADS):
    w.plan(*b.plan_args(), heads, 512, 64, b.page_size, causal, SM_SCALE, torch.bfloat16,
           b.ckv.dtype)  # fmt: skip


def batch_of(lens, qo, device, seed, heads=HEADS, pool_pages=GRAPH_PAGES):
    return make_batch(
        lens, heads, qo_lens=qo, page_size=PAGE, pool_pages=pool_pages, device=device,
        generator=gen(seed),
    )  # fmt: skip


def test_graph_replans_fit_the_first_launch_or_raise(device):
    """The sequence engines use on one wrapper: decode, speculative (more rows), a larger
    batch, a longer context, decode again. Steps that fit the first plan's launch match the
    reference; the others raise ValueError naming the limit (before, a speculative re-plan
    reused a 16-row launch for 64 rows and returned wrong numbers)."""
    w = graph_wrapper(device)
    first = batch_of([300] * 4, 1, device, 1)
    plan(w, first, causal=False)
    out, lse = w.run(first.q_nope, first.q_pe, first.ckv, first.kpe, return_lse=True,
                     **first.scale_kwargs())  # fmt: skip
    assert_matches_reference(first, out, lse)

    spec = batch_of([300] * 4, 4, device, 2)  # 4 tokens × 16 heads = 64 rows per request
    with pytest.raises(ValueError, match="causal False under CUDA graphs"):
        plan(w, spec, causal=True)
    with pytest.raises(ValueError, match="at most 16 query rows per request under CUDA graphs"):
        plan(w, spec, causal=False)
    bigger = batch_of([300] * 6, 1, device, 3)  # within the buffers, more query tokens
    with pytest.raises(ValueError, match="at most 4 query tokens under CUDA graphs"):
        plan(w, bigger, causal=False)
    with pytest.raises(ValueError, match="B <= 8"):
        plan(w, batch_of([30] * 9, 1, device, 4), causal=False)
    with pytest.raises(ValueError, match="num_heads 16 under CUDA graphs"):
        plan(w, batch_of([30] * 4, 1, device, 5, heads=8), causal=False, heads=8)

    for step, lens in enumerate([[2000, 5, 700, 3000], [17, 1, 0, 64], [300, 300]]):
        b = batch_of(lens, 1, device, 10 + step)  # longer context, shorter, fewer requests
        plan(w, b, causal=False)
        out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, return_lse=True, **b.scale_kwargs())
        assert_matches_reference(b, out, lse)


def test_graph_wrapper_for_speculative_rows(device):
    """One wrapper per captured shape: a verify wrapper planned for 4 tokens × 16 heads first
    serves later verify steps and a decode step within its rows."""
    w = graph_wrapper(device)
    for step, (lens, qo) in enumerate([([300] * 4, 4), ([900, 40, 5, 77], 4), ([50] * 4, 1)]):
        b = batch_of(lens, qo, device, 20 + step)
        plan(w, b, causal=True)
        out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, return_lse=True, **b.scale_kwargs())
        assert_matches_reference(b, out, lse, causal=True)


@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("where", ["page id", "entries"])
def test_bad_index_after_plan_gives_nan_for_its_request(device, backend, where):
    """Page ids rewritten in place after plan() (an engine's graph buffers): an id outside
    the cache, or a request whose entries were cut short, is never read; that request's rows
    are NaN and the others are right, on both backends."""
    b = make_batch([100, 200, 300], 16, page_size=1, device=device, generator=gen(30))
    w = BatchMLAPagedAttentionWrapper(workspace(device), backend=backend)
    w.plan(*b.plan_args(), 16, 512, 64, 1, False, SM_SCALE, torch.bfloat16, b.ckv.dtype)
    ref, _ = reference(b)
    if where == "page id":
        b.kv_indices[150] = b.ckv.shape[0] + 1000  # request 1's 51st token
    else:
        b.kv_len[1] = 250  # request 1 now needs entries it does not own (device copy only)
        w._plan.kv_len[1] = 250
    out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, return_lse=True, **b.scale_kwargs())
    assert out[1].isnan().all() and lse[1].isnan().all()
    assert torch.isfinite(out[[0, 2]]).all()
    assert (out[[0, 2]].double() - ref[[0, 2]].to(out.device)).abs().max() < 5e-2


def test_bad_page_id_in_causal_rows(device):
    """Causal speculative rows: a bad id at the last position, seen by the last query token
    only, still makes the request NaN (its tile reads the token's NaN row)."""
    b = make_batch([40], 4, qo_lens=3, page_size=1, device=device, generator=gen(31))
    w = BatchMLAPagedAttentionWrapper(workspace(device), backend="triton")
    w.plan(*b.plan_args(), 4, 512, 64, 1, True, SM_SCALE, torch.bfloat16, b.ckv.dtype)
    b.kv_indices[39] = -5
    out = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, **b.scale_kwargs())
    assert out.isnan().all()


@pytest.mark.parametrize("via", ["argument", "environment"])
def test_debug_check_names_request_and_id(device, via, monkeypatch):
    if via == "environment":
        monkeypatch.setenv("FP8MLA_DEBUG", "1")
    b = make_batch([10, 20], 16, page_size=1, device=device, generator=gen(32))
    w = BatchMLAPagedAttentionWrapper(workspace(device), backend="triton", debug=via == "argument")
    w.plan(*b.plan_args(), 16, 512, 64, 1, False, SM_SCALE, torch.bfloat16, b.ckv.dtype)
    w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, **b.scale_kwargs())  # valid: no error
    b.kv_indices[15] = 99_999
    with pytest.raises(ValueError, match="for request 1, got page id 99999"):
        w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, **b.scale_kwargs())
    w._plan.kv_len[0] = 11
    b.kv_indices[15] = 3
    with pytest.raises(ValueError, match="request 0 to own 11 page-table entries"):
        w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, **b.scale_kwargs())


@pytest.mark.parametrize("sm_scale", [math.inf, -math.inf, math.nan, 0.0, -1.0])
def test_sm_scale_must_be_finite_and_positive(device, sm_scale):
    b = make_batch([10], 16, device=device, generator=gen(33))
    w = BatchMLAPagedAttentionWrapper(workspace(device), backend="triton")
    with pytest.raises(ValueError, match="sm_scale finite and > 0"):
        w.plan(*b.plan_args(), 16, 512, 64, 1, False, sm_scale, torch.bfloat16, b.ckv.dtype)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_scales_accept_numpy_and_refuse_non_finite(device, backend):
    b = make_batch([10, 30], 16, device=device, generator=gen(34))
    w = BatchMLAPagedAttentionWrapper(workspace(device), backend=backend)
    w.plan(*b.plan_args(), 16, 512, 64, 1, False, SM_SCALE, torch.bfloat16, b.ckv.dtype)
    args = (b.q_nope, b.q_pe, b.ckv, b.kpe)
    out = w.run(*args, ckv_scale=np.float32(b.ckv_scale), kpe_scale=np.float64(b.kpe_scale),
                return_lse=True)  # fmt: skip
    assert_matches_reference(b, *out)
    for bad in (math.inf, math.nan, -0.5, 0.0):
        with pytest.raises(ValueError, match="ckv_scale finite and > 0"):
            w.run(*args, ckv_scale=bad)
    with pytest.raises(ValueError, match="kpe_scale finite and > 0"):
        w.run(*args, kpe_scale=torch.tensor(math.inf))
    with pytest.raises(ValueError, match="as a float or a tensor, got str"):
        w.run(*args, ckv_scale="1.0")
    with pytest.raises(
        ValueError, match="on .* \\(or as a CPU tensor or a float\\), got a tensor on meta"
    ):
        w.run(*args, ckv_scale=torch.ones(1, device="meta"))


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_num_splits_range_is_the_same_on_both_backends(device, backend):
    b = make_batch([10], 16, device=device, generator=gen(35))
    w = BatchMLAPagedAttentionWrapper(workspace(device), backend=backend)
    for bad in (0, 300):
        with pytest.raises(ValueError, match="num_splits in \\[1, 256\\]"):
            w.plan(*b.plan_args(), 16, 512, 64, 1, False, SM_SCALE, torch.bfloat16,
                   b.ckv.dtype, num_splits=bad)  # fmt: skip


def test_mla_decode_names_the_query_shape(device):
    b = make_batch([10], 16, device=device, generator=gen(36))
    with pytest.raises(ValueError, match="q_nope with 3 dims, got shape \\(1, 8192\\)"):
        mla_decode(b.q_nope.reshape(1, -1), b.q_pe, b.ckv, b.kpe, b.kv_indptr, b.kv_indices,
                   b.kv_len, sm_scale=SM_SCALE)  # fmt: skip


def test_plan_reads_kv_indices_only_on_the_host(device):
    """Engines pass host copies of qo_indptr, kv_indptr and kv_len; kv_indices on the device is
    never read back by plan() (no host sync): the kernels bound its ids at run time."""
    b = make_batch([10, 20], 4, page_size=1, device=device, generator=gen(37))
    host = lambda t: t.cpu()
    w = BatchMLAPagedAttentionWrapper(workspace(device), backend="triton")
    w.plan(host(b.qo_indptr), host(b.kv_indptr), b.kv_indices, host(b.kv_len), 4, 512, 64, 1,
           False, SM_SCALE, torch.bfloat16, b.ckv.dtype)  # fmt: skip
    on_device = b.kv_indices.device.type != "cpu"
    assert (w._plan.max_page is None) == on_device
    out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, return_lse=True, **b.scale_kwargs())
    assert_matches_reference(b, out, lse)


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA-graph capture needs a GPU")
@pytest.mark.parametrize("qo_len", [1, 2])
def test_graph_capture_replays_each_fitting_replan(qo_len):
    """Capture once, then re-plan and replay through decode, a longer context, fewer requests
    and shorter lengths (speculative rows on their own wrapper): every replay matches the
    reference; a plan that does not fit is refused before any replay."""
    w = graph_wrapper("cuda")
    first = batch_of([300] * 4, qo_len, "cuda", 40)
    plan(w, first, causal=qo_len > 1)
    q_nope, q_pe = first.q_nope.clone(), first.q_pe.clone()
    out = torch.empty_like(q_nope)
    lse = torch.empty(q_nope.shape[:2], device="cuda")
    kw = first.scale_kwargs()
    w.run(q_nope, q_pe, first.ckv, first.kpe, out=out, lse=lse, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_nope, q_pe, first.ckv, first.kpe, out=out, lse=lse, **kw)
    with pytest.raises(ValueError, match="under CUDA graphs"):
        plan(w, batch_of([300] * 4, qo_len * 4, "cuda", 41), causal=True)
    for step, lens in enumerate([[4000, 2, 900, 33], [64, 64, 64, 64], [7, 3000, 2, 250]]):
        b = batch_of(lens, qo_len, "cuda", 42 + step)
        first.pool.copy_(b.pool)
        b.pool, b.ckv, b.kpe = first.pool, first.ckv, first.kpe
        plan(w, b, causal=qo_len > 1)
        q_nope.copy_(b.q_nope)
        q_pe.copy_(b.q_pe)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        b.q_nope, b.q_pe = q_nope, q_pe
        assert_matches_reference(b, out, lse, causal=qo_len > 1)


def test_lengths_left_on_the_device_are_bounded_by_the_kernels(device, monkeypatch):
    """vLLM keeps exact lengths on the device: ``plan()`` then never reads them (no sync) and
    plans for the page table's bound; the answers match the reference, and a length past its
    request's pages makes that request NaN (not a read past its pages)."""
    from fp8mla.attention import plan_state

    b = batch_of([1, 37, 300], 1, device, 31)
    lens = b.kv_len
    monkeypatch.setattr(plan_state, "_on_host", lambda t: t is not lens)
    w = BatchMLAPagedAttentionWrapper(workspace(device), backend="triton")
    plan(w, b, causal=False)
    assert w._plan.max_kv_len == 304  # 19 pages of 16: the page table's bound, not 300
    out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, return_lse=True, **b.scale_kwargs())
    assert_matches_reference(b, out, lse)
    lens[1] = 37 + PAGE * 3  # three pages past what request 1 owns
    out = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, **b.scale_kwargs())
    assert torch.isnan(out[1]).all()
    assert torch.isfinite(out[[0, 2]]).all()
