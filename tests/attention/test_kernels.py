"""Every kernel variant of the registry against the float64 reference on fresh random data.

Runs compiled on a GPU and under TRITON_INTERPRET=1 on a CPU (small shapes there); the Gluon
variants run on SM90 GPUs only.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fp8mla import mla_decode
from fp8mla.attention.config import KernelConfig
from fp8mla.attention.planner import (
    FEWROWS_TILE_16,
    FEWROWS_TILE_32,
    FP8QK_TILE_16,
    FP8QK_TILE_32,
    PINGPONG8_TILE,
    PINGPONG64_TILE,
    PINGPONG_TILE,
    WGMMA_TILE,
    selectable_configs,
)
from fp8mla.attention.targets import TARGETS
from fp8mla.attention.variants import REGISTRY
from fp8mla.testing import make_batch

from attention_utils import SM_SCALE, assert_matches_reference, pool_dtype_for, run_wrapper
from conftest import HAS_CUDA, IS_SM90

LENGTHS = [0, 1, 17, 33, 96, 97, 114, 514, 1024]
KV_DTYPES = [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def orientation(kind: str, rows: int) -> KernelConfig:
    """Variant ``kind`` in the smallest tile that holds ``rows`` (≥ 16); the Gluon variants
    in their own tiles (skipped where they cannot run)."""
    if REGISTRY[kind].gluon and not IS_SM90:
        pytest.skip(f"the {kind} kernel runs on SM90 GPUs only")
    if kind == "wgmma":
        return WGMMA_TILE
    if kind == "pingpong":
        return PINGPONG_TILE
    if kind == "pingpong64":
        return PINGPONG64_TILE
    if kind == "pingpong8":
        return PINGPONG8_TILE
    if kind == "fewrows":
        if rows > 32:
            pytest.skip("the fewrows kernel serves at most 32 rows per request")
        return FEWROWS_TILE_16 if rows <= 16 else FEWROWS_TILE_32
    if kind == "fp8qk":  # more rows: 32-row tiles
        return FP8QK_TILE_16 if rows <= 16 else FP8QK_TILE_32
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    return KernelConfig(block_m, 32, 4, 2, variant=kind)


def test_every_variant_is_tested():
    assert set(REGISTRY) == {
        "rows",
        "vsplit",
        "wgmma",
        "pingpong",
        "pingpong64",
        "pingpong8",
        "fewrows",
        "fp8qk",
    }


KERNELS = pytest.mark.parametrize("kernel", sorted(REGISTRY))


@KERNELS
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=str)
def test_lengths_page_sizes_dtypes(device, page_size, kv_dtype, kernel):
    why = REGISTRY[kernel].supports(TARGETS["sm90"], kv_dtype, 16, 64)
    if REGISTRY[kernel].gluon and why:
        pytest.skip(f"the {kernel} kernel {why}")
    batch = make_batch(
        LENGTHS, 16, page_size=page_size, kv_dtype=kv_dtype, device=device, generator=gen(page_size)
    )
    out, lse = run_wrapper(batch, config=orientation(kernel, 16))
    assert_matches_reference(batch, out, lse)


@KERNELS
@pytest.mark.parametrize("heads", [1, 20, 128])
def test_head_counts(device, heads, kernel):
    batch = make_batch(
        [1, 97, 300], heads, page_size=16, kv_dtype=pool_dtype_for(kernel), device=device,
        generator=gen(heads),
    )  # fmt: skip
    out, lse = run_wrapper(batch, config=orientation(kernel, heads))
    assert_matches_reference(batch, out, lse)


@KERNELS
@pytest.mark.parametrize("qo_len", [2, 4, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_multi_token_queries(device, qo_len, causal, kernel):
    batch = make_batch(
        [17, 114, 300], 16, qo_lens=qo_len, page_size=16, kv_dtype=pool_dtype_for(kernel),
        device=device, generator=gen(qo_len),
    )  # fmt: skip
    out, lse = run_wrapper(batch, causal=causal, config=orientation(kernel, 16 * qo_len))
    assert_matches_reference(batch, out, lse, causal=causal)


def _growing_scores(batch) -> None:
    """Scores that grow from tile to tile (request 0: by ~12 in log2 units every 64 tokens) or
    jump once mid-context (request 1: by ~9.5, the earlier tokens still weigh 2^-9.5 each)."""
    per_stored = 64 * batch.kpe_scale * SM_SCALE * 1.4426950408889634  # log2 score per unit
    batch.q_pe.fill_(12.0 / (32 * per_stored))  # 32 stored units: +12 in log2
    codes = batch.kpe.view(-1, 64)  # page size 1: row = page id
    for b, tile_step in ((0, True), (1, False)):
        lo = int(batch.kv_indptr[b])
        for t in range(int(batch.kv_len[b])):
            stored = 32.0 * min(t // 64, 14) if tile_step else (24.0 if t >= 512 else 0.0)
            value = torch.tensor([stored], dtype=torch.float32).to(batch.kpe.dtype)
            codes[int(batch.kv_indices[lo + t])] = value.to(codes.device)


@KERNELS
def test_scores_growing_along_the_context(device, kernel):
    """Growing and jumping scores (``_growing_scores``): every online-softmax rescale is
    taken and its factor is right."""
    batch = make_batch(
        [1024, 1024], 16, page_size=1, kv_dtype=pool_dtype_for(kernel), device=device,
        generator=gen(13),
    )  # fmt: skip
    _growing_scores(batch)
    out, lse = run_wrapper(batch, config=orientation(kernel, 16))
    assert_matches_reference(batch, out, lse)


@pytest.mark.skipif(not IS_SM90, reason="the FP8 × FP8 kernel runs on SM90 GPUs only")
@pytest.mark.parametrize(
    "block_m, heads, qo_len, scale_mode",
    [
        (16, 20, 1, "tensor"),  # a 16-row tile's score warpgroup computes 32 rows
        (16, 16, 3, "token_group"),
        (32, 24, 3, "tensor"),  # tiles that split a query token's heads
        (32, 48, 2, "token_group"),
        (32, 128, 1, "tensor"),
    ],
)
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
@pytest.mark.parametrize("num_splits", [None, 1], ids=["split", "unsplit"])
def test_fp8qk_row_tiles(block_m, heads, qo_len, scale_mode, kv_dtype, num_splits):
    """Requests of more query rows than one tile of the FP8 × FP8 kernel, one program per
    row tile: every row staged, scored (causal per row) and stored by its own tile only;
    kv_len 0 and the shortest a causal request allows (its first token sees one), NaN in
    unused slots."""
    lens = [0, qo_len, 97, 1000]
    batch = make_batch(lens, heads, qo_lens=qo_len, page_size=1, kv_dtype=kv_dtype,
                       scale_mode=scale_mode, device="cuda", generator=gen(heads))  # fmt: skip
    config = FP8QK_TILE_16 if block_m == 16 else FP8QK_TILE_32
    out, lse = run_wrapper(batch, causal=qo_len > 1, config=config, num_splits=num_splits)
    assert_matches_reference(batch, out, lse, causal=qo_len > 1)


@pytest.mark.skipif(not IS_SM90, reason="the few-row kernel runs on SM90 GPUs only")
@pytest.mark.parametrize("col_softmax", [0, 1])
@pytest.mark.parametrize("qo_len", [1, 2])
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.bfloat16], ids=str)
def test_fewrows_softmax_layouts(device, col_softmax, qo_len, kv_dtype):
    """Both layouts of the few-row kernel's online softmax (its default picks one by the
    row count) at 16 and 32 rows, on growing and jumping scores, causal."""
    batch = make_batch(
        [1024, 1024], 16, qo_lens=[qo_len] * 2, page_size=1, kv_dtype=kv_dtype, device=device,
        generator=gen(17),
    )  # fmt: skip
    _growing_scores(batch)
    config = orientation("fewrows", 16 * qo_len)
    out, lse = run_wrapper(
        batch, causal=True, config=config, kernel_options={"COL_SOFTMAX": col_softmax}
    )
    assert_matches_reference(batch, out, lse, causal=True)


def test_mixed_query_lengths_and_empty_requests(device):
    batch = make_batch(
        [40, 0, 200, 5], 8, qo_lens=[3, 1, 16, 5], page_size=16, device=device, generator=gen(7)
    )
    out, lse = run_wrapper(batch, causal=True)
    assert_matches_reference(batch, out, lse, causal=True)


@KERNELS
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_token_group_scales(device, kv_dtype, kernel):
    why = REGISTRY[kernel].supports(TARGETS["sm90"], kv_dtype, 16, 64)
    if REGISTRY[kernel].gluon and why:
        pytest.skip(f"the {kernel} kernel {why}")
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


@KERNELS
def test_token_group_scales_strided(device, kernel):
    """Token-group scales in a view whose slots are 5 floats apart (not whole 16-byte rows, as
    the SM90 copier reads them), NaN between them: the answer of the contiguous array."""
    why = REGISTRY[kernel].supports(TARGETS["sm90"], torch.float8_e4m3fn, 16, 64)
    if REGISTRY[kernel].gluon and why:
        pytest.skip(f"the {kernel} kernel {why}")
    batch = make_batch([70, 129], 16, page_size=16, kv_dtype=torch.float8_e4m3fn,
                       scale_mode="token_group", device=device, generator=gen(14))  # fmt: skip
    arr = batch.ckv_scale_arr
    wide = torch.full((*arr.shape[:2], 5), float("nan"), dtype=torch.float32, device=device)
    wide[..., :4] = arr
    strided = dataclasses.replace(batch, ckv_scale_arr=wide[..., :4])
    out, lse = run_wrapper(strided, config=orientation(kernel, 16))
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
    batch = make_batch(
        [33, 96], 16, page_size=16, head_dim_kpe=0, kv_dtype=pool_dtype_for(kernel), device=device,
        generator=gen(17),
    )  # fmt: skip
    if REGISTRY[kernel].gluon:
        with pytest.raises(ValueError, match="needs a 64-dim RoPE part"):
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
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.bfloat16], ids=str)
@pytest.mark.parametrize("qo_len", [1, 4])
def test_cuda_graph_replay_with_changing_lengths(qo_len, kv_dtype):
    """One capture, replayed after re-plans with new lengths (on SM90: 16 rows per request take
    the few-row kernels, 64 rows the FP8 × FP8 kernel's row tiles for FP8 and the ping-pong
    kernel for bf16)."""
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
        kv_dtype=kv_dtype,
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
            kv_dtype,
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
            kv_dtype=kv_dtype,
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


def _table_choices() -> list[tuple[KernelConfig, torch.dtype]]:
    """Every (config, KV dtype) that some target's table can choose, once each (e4m3 and bf16:
    e5m2 and fp16 take the same tiles)."""
    seen = {}
    for t in TARGETS.values():
        for kv in (torch.float8_e4m3fn, torch.bfloat16):
            for cfg in selectable_configs(t, kv):
                seen[(cfg, kv)] = None
    return list(seen)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "cfg, kv_dtype",
    _table_choices(),
    ids=lambda v: (
        f"{v.variant}-{v.block_m}x{v.block_n}w{v.num_warps}s{v.num_stages}"
        if isinstance(v, KernelConfig)
        else str(v).removeprefix("torch.")
    ),
)
def test_every_table_choice_runs_here(cfg, kv_dtype):
    """Tiles chosen for other GPUs (compiled only there in CI) run on this one against float64."""
    if REGISTRY[cfg.variant].gluon and not IS_SM90:
        pytest.skip(f"the {cfg.variant} kernel runs on SM90 GPUs only")
    heads = 16 if cfg.block_m <= 32 else 64
    batch = make_batch(
        [1, 97, 300], heads, page_size=16, kv_dtype=kv_dtype, device="cuda", generator=gen(23)
    )
    out, lse = run_wrapper(batch, config=cfg)
    assert_matches_reference(batch, out, lse)


@pytest.mark.skipif(not IS_SM90, reason="the few-row Gluon kernels run on SM90 GPUs only")
@pytest.mark.parametrize("kernel", ["fewrows", "fp8qk"])
@pytest.mark.parametrize("heads, qo_len", [(32, 1), (16, 2)])
def test_variant_named_in_plan_serves_every_row(kernel, heads, qo_len):
    """``plan(kernel_config="fewrows")`` for 32 query rows per request: every head of every
    request computed (it once planned two 16-row tiles of a kernel that takes one, and the
    second tile's heads were never written)."""
    batch = make_batch([4096, 1000, 17], heads, qo_lens=qo_len, page_size=1, device="cuda",
                       generator=gen(33))  # fmt: skip
    out, lse = run_wrapper(batch, causal=qo_len > 1, config=kernel)
    assert_matches_reference(batch, out, lse, causal=qo_len > 1)


@pytest.mark.skipif(not IS_SM90, reason="programmatic dependent launches of the SM90 kernels")
@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize("num_splits", [None, 1], ids=["split", "unsplit"])
@pytest.mark.parametrize("kernel", ["fewrows", "fp8qk", "pingpong8"])
def test_back_to_back_layers_through_one_plan(kernel, num_splits, graph):
    """Layers run back to back through one plan, each over its own pool and queries: each
    attention kernel is a programmatic dependent of the grid before it (the previous layer's
    merge or attention) and shares the plan's partials with it, so it must touch nothing
    before that grid has ended. Every layer's output against float64, eagerly and replayed
    from a CUDA graph (the FP8 ping-pong kernel at 128 heads, its 64-row programs)."""
    from fp8mla import BatchMLAPagedAttentionWrapper

    from attention_utils import workspace

    heads = 128 if kernel == "pingpong8" else 32
    base = make_batch([4096, 1000, 3001, 17], heads, page_size=1, device="cuda",
                      generator=gen(31))  # fmt: skip
    g = torch.Generator(device="cuda").manual_seed(32)
    layers = []
    for _ in range(6):
        raw = torch.randn(base.pool.shape, generator=g, device="cuda")
        pool = torch.where(base.pool.float().isnan(), float("nan"), raw).to(base.pool.dtype)
        rows = pool.view(-1, base.page_size, 576)
        layers.append(dataclasses.replace(
            base, pool=pool, ckv=rows[..., :512], kpe=rows[..., 512:],
            q_nope=torch.randn(base.q_nope.shape, generator=g, device="cuda").to(torch.bfloat16),
            q_pe=torch.randn(base.q_pe.shape, generator=g, device="cuda").to(torch.bfloat16),
        ))  # fmt: skip
    w = BatchMLAPagedAttentionWrapper(workspace("cuda"), backend="triton")
    w.plan(*base.plan_args(), heads, 512, 64, 1, False, SM_SCALE, torch.bfloat16, base.ckv.dtype,
           num_splits=num_splits, kernel_config=kernel)  # fmt: skip
    assert w._launch.plan.attention_waits
    outs = [torch.empty_like(b.q_nope) for b in layers]
    lses = [torch.empty(b.q_nope.shape[:2], device="cuda") for b in layers]

    def step():
        for b, o, s in zip(layers, outs, lses):
            w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, out=o, lse=s, **b.scale_kwargs())

    step()  # compiles
    if graph:
        for o in outs:
            o.zero_()
        cg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cg):
            step()
        cg.replay()
    else:
        step()
    torch.cuda.synchronize()
    for b, o, s in zip(layers, outs, lses):
        assert_matches_reference(b, o, s)


@pytest.mark.skipif(not IS_SM90, reason="the FP8 × FP8 kernel runs on SM90 GPUs only")
@pytest.mark.parametrize("kv_dtype", [torch.float8_e5m2, torch.float8_e4m3fn], ids=str)
def test_fp16_partials_hold_outputs_past_fp16s_range(kv_dtype):
    """The FP8 × FP8 kernel's split partials are fp16 without the V scale
    (``workspace.Partials``): outputs far past fp16's range, from a V scale 2^20 larger (the
    queries 2^20 smaller, so the scores stay as they were), merge as small ones do."""
    import dataclasses

    batch = make_batch([4096, 1000, 17], 32, page_size=16, kv_dtype=kv_dtype, device="cuda",
                       generator=gen(34))  # fmt: skip
    q_nope = (batch.q_nope.float() * 2.0**-20).to(batch.q_nope.dtype)  # exact
    batch = dataclasses.replace(batch, q_nope=q_nope, ckv_scale=batch.ckv_scale * 2.0**20)
    out, lse = run_wrapper(batch, config="fp8qk")
    assert out.float().abs().max() > 65504
    assert_matches_reference(batch, out, lse)
