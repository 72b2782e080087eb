"""The Triton attention kernel against the float64 reference on fresh random data.

Runs compiled on a GPU and under TRITON_INTERPRET=1 on a CPU (small shapes there).
"""

from __future__ import annotations

import pytest
import torch

from fp8mla import mla_decode
from fp8mla.ops.planner import WGMMA_TILE, KernelConfig
from fp8mla.testing import make_batch

from attention_utils import SM_SCALE, assert_matches_reference, run_wrapper
from conftest import HAS_CUDA, IS_SM90

LENGTHS = [0, 1, 17, 33, 96, 97, 114, 514, 1024]
KV_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def orientation(kind: str, rows: int) -> KernelConfig:
    """The kernels (``rows``, ``swap``, ``vsplit``) with the smallest tile that holds ``rows``
    (≥ 16); ``wgmma`` has one tile."""
    if kind == "wgmma":
        return WGMMA_TILE
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    return KernelConfig(
        block_m=block_m,
        block_n=32,
        num_warps=4,
        num_stages=2,
        swap_ab=kind == "swap",
        value_split=kind == "vsplit",
    )


SM90_ONLY = pytest.mark.skipif(not IS_SM90, reason="the wgmma kernel runs on SM90 GPUs only")
KERNELS = pytest.mark.parametrize(
    "kernel", ["rows", "swap", "vsplit", pytest.param("wgmma", marks=SM90_ONLY)]
)


@KERNELS
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=str)
def test_lengths_page_sizes_dtypes(device, page_size, kv_dtype, kernel):
    if kernel == "wgmma" and kv_dtype.itemsize != 1:
        pytest.skip("the wgmma kernel reads FP8 KV")
    batch = make_batch(
        LENGTHS, 16, page_size=page_size, kv_dtype=kv_dtype, device=device, generator=gen(page_size)
    )
    out, lse = run_wrapper(batch, config=orientation(kernel, 16))
    assert_matches_reference(batch, out, lse)


@KERNELS
@pytest.mark.parametrize("heads", [1, 20, 128])
def test_head_counts(device, heads, kernel):
    batch = make_batch([1, 97, 300], heads, page_size=16, device=device, generator=gen(heads))
    out, lse = run_wrapper(batch, config=orientation(kernel, heads))
    assert_matches_reference(batch, out, lse)


@KERNELS
@pytest.mark.parametrize("qo_len", [2, 4, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_multi_token_queries(device, qo_len, causal, kernel):
    batch = make_batch(
        [17, 114, 300], 16, qo_lens=qo_len, page_size=16, device=device, generator=gen(qo_len)
    )
    out, lse = run_wrapper(batch, causal=causal, config=orientation(kernel, 16 * qo_len))
    assert_matches_reference(batch, out, lse, causal=causal)


def test_mixed_query_lengths_and_empty_requests(device):
    batch = make_batch(
        [40, 0, 200, 5], 8, qo_lens=[3, 1, 16, 5], page_size=16, device=device, generator=gen(7)
    )
    out, lse = run_wrapper(batch, causal=True)
    assert_matches_reference(batch, out, lse, causal=True)


@KERNELS
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_token_group_scales(device, kv_dtype, kernel):
    batch = make_batch(
        [33, 514],
        16,
        page_size=16,
        kv_dtype=kv_dtype,
        scale_mode="token_group",
        device=device,
        generator=gen(11),
    )
    out, lse = run_wrapper(batch, config=orientation(kernel, 16))
    assert_matches_reference(batch, out, lse)


def test_scales_as_device_scalars(device):
    batch = make_batch([97, 200], 16, page_size=16, device=device, generator=gen(12))
    ckv_scale = torch.tensor(batch.ckv_scale, dtype=torch.float32, device=device)
    kpe_scale = torch.tensor(batch.kpe_scale, dtype=torch.float32, device=device)
    out, lse = mla_decode(
        batch.q_nope,
        batch.q_pe,
        batch.ckv,
        batch.kpe,
        batch.kv_indptr,
        batch.kv_indices,
        batch.kv_len,
        sm_scale=SM_SCALE,
        ckv_scale=ckv_scale,
        kpe_scale=kpe_scale,
        return_lse=True,
        backend="triton",
    )
    assert_matches_reference(batch, out, lse)


@pytest.mark.parametrize("num_splits", [1, 3, 7])
def test_split_counts_agree(device, num_splits):
    batch = make_batch([1, 250, 700], 16, page_size=1, device=device, generator=gen(13))
    out, lse = run_wrapper(batch, num_splits=num_splits)
    assert_matches_reference(batch, out, lse)


def test_engine_layout_views_without_copy(device):
    """An engine's ``[num_slots, 1, 576]`` pool split into ``[..., :512]`` / ``[..., 512:]``."""
    batch = make_batch(
        [64, 129], 16, page_size=1, pool_pages=1000, device=device, generator=gen(14)
    )
    ckv, kpe = batch.pool[..., :512], batch.pool[..., 512:]
    assert ckv.data_ptr() == batch.pool.data_ptr() and not ckv.is_contiguous()
    out, lse = run_wrapper(batch, ckv=ckv, kpe=kpe)
    assert_matches_reference(batch, out, lse)


def test_large_batch(device):
    lens = torch.randint(0, 80, (157,), generator=gen(15)).tolist()
    batch = make_batch(lens, 4, page_size=16, device=device, generator=gen(15))
    out, lse = run_wrapper(batch)
    assert_matches_reference(batch, out, lse)


def test_fp16_queries(device):
    batch = make_batch(
        [33, 96], 16, page_size=16, q_dtype=torch.float16, device=device, generator=gen(16)
    )
    out, lse = run_wrapper(batch)
    assert_matches_reference(batch, out, lse)


@KERNELS
def test_no_rope_part(device, kernel):
    batch = make_batch([33, 96], 16, page_size=16, head_dim_kpe=0, device=device, generator=gen(17))
    if kernel == "wgmma":
        with pytest.raises(ValueError, match="head_dim_kpe 64 for the wgmma kernel"):
            run_wrapper(batch, config=orientation(kernel, 16))
        return
    out, lse = run_wrapper(batch, config=orientation(kernel, 16))
    assert_matches_reference(batch, out, lse)


def test_given_out_and_lse_are_filled(device):
    batch = make_batch([17, 300], 16, page_size=16, device=device, generator=gen(18))
    out = torch.full_like(batch.q_nope, float("nan"))
    lse = torch.full(batch.q_nope.shape[:2], float("nan"), device=device)
    got_out, got_lse = run_wrapper(batch, out=out, lse=lse)
    assert got_out is out and got_lse is lse
    assert_matches_reference(batch, out, lse)


def test_torch_backend_matches(device):
    batch = make_batch([0, 17, 97], 16, qo_lens=2, page_size=16, device=device, generator=gen(19))
    out, lse = run_wrapper(batch, backend="torch", causal=True)
    assert_matches_reference(batch, out, lse, causal=True)


@pytest.mark.gpu
@pytest.mark.parametrize("context", [4096, 32768, 131072])
def test_long_contexts_on_gpu(context):
    lens = [context, context // 3 + 7, 1]
    batch = make_batch(lens, 32, page_size=1, device="cuda", generator=gen(context))
    out, lse = run_wrapper(batch)
    assert_matches_reference(batch, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=str)
@pytest.mark.parametrize("page_size", [1, 64])
def test_batch_157_on_gpu(kv_dtype, page_size):
    lens = torch.randint(0, 1025, (157,), generator=gen(20)).tolist()
    batch = make_batch(
        lens, 128, page_size=page_size, kv_dtype=kv_dtype, device="cuda", generator=gen(20)
    )
    out, lse = run_wrapper(batch)
    assert_matches_reference(batch, out, lse)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("qo_len", [1, 4])
def test_cuda_graph_replay_with_changing_lengths(qo_len):
    from fp8mla import BatchMLAPagedAttentionWrapper

    batch_size, heads, page_size, max_pages = 8, 16, 16, 4096
    bufs = (
        torch.empty(batch_size + 1, dtype=torch.int32, device="cuda"),
        torch.empty(batch_size + 1, dtype=torch.int32, device="cuda"),
        torch.empty(max_pages, dtype=torch.int32, device="cuda"),
        torch.empty(batch_size, dtype=torch.int32, device="cuda"),
    )
    w = BatchMLAPagedAttentionWrapper(
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda"), True, *bufs, backend="triton"
    )
    first = make_batch(
        [300] * batch_size,
        heads,
        qo_lens=qo_len,
        page_size=page_size,
        pool_pages=max_pages,
        device="cuda",
        generator=gen(21),
    )

    def plan(b):
        w.plan(
            *b.plan_args(),
            heads,
            512,
            64,
            page_size,
            True,
            SM_SCALE,
            torch.bfloat16,
            torch.float8_e4m3fn,
        )

    plan(first)
    q_nope, q_pe = first.q_nope.clone(), first.q_pe.clone()
    out = torch.empty_like(q_nope)
    lse = torch.empty(q_nope.shape[:2], device="cuda")
    kw = first.scale_kwargs()
    w.run(q_nope, q_pe, first.ckv, first.kpe, out=out, lse=lse, **kw)  # warm-up / compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q_nope, q_pe, first.ckv, first.kpe, out=out, lse=lse, **kw)
    for step, lens in enumerate([[300] * batch_size, [5, 900, 17, 4, 2000, 64, 256, 4000]]):
        b = make_batch(
            lens,
            heads,
            qo_lens=qo_len,
            page_size=page_size,
            pool_pages=max_pages,
            device="cuda",
            generator=gen(22 + step),
        )
        first.pool.copy_(b.pool)  # fresh pool contents in the captured buffers
        b.pool, b.ckv, b.kpe = first.pool, first.ckv, first.kpe
        plan(b)
        q_nope.copy_(b.q_nope)
        q_pe.copy_(b.q_pe)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        b.q_nope, b.q_pe = q_nope, q_pe
        assert_matches_reference(b, out, lse, causal=True)
