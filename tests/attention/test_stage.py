"""FP8 pages staged once in fp16 (``attention/stage.py``) for batches whose row tiles read each
KV token many times: the same function as the FP8 kernels, the planner's choice, its errors."""

from __future__ import annotations

import pytest
import torch

from fp8mla import BatchMLAPagedAttentionWrapper
from fp8mla.attention.planner import stage_fp8, stage_reuse
from fp8mla.attention.stage import split_workspace, staged_bytes
from fp8mla.attention.targets import INTERPRETER, TARGETS
from fp8mla.testing import make_batch, rel_err

from attention_utils import SM_SCALE, assert_matches_reference, out_tolerance, reference_rows

E4M3 = torch.float8_e4m3fn


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def planned(batch, *, stage_kv=True, nbytes=16 << 20, causal=True, **kw):
    dev = batch.q_nope.device
    w = BatchMLAPagedAttentionWrapper(
        torch.empty(nbytes, dtype=torch.uint8, device=dev), backend="triton"
    )
    w.plan(
        *batch.plan_args(), batch.num_heads, 512, batch.q_pe.shape[-1], batch.page_size,
        causal, SM_SCALE, batch.q_nope.dtype, batch.ckv.dtype, stage_kv=stage_kv, **kw,
    )  # fmt: skip
    return w


def run(w, batch, **kw):
    return w.run(batch.q_nope, batch.q_pe, batch.ckv, batch.kpe, return_lse=True,
                 **batch.scale_kwargs(), **kw)  # fmt: skip


@pytest.mark.parametrize(
    "page_size, kv_dtype, scale_mode",
    [(1, E4M3, "tensor"), (16, torch.float8_e5m2, "tensor"), (64, E4M3, "token_group"),
     (16, E4M3, "token_group")],
)  # fmt: skip
def test_staged_matches_the_reference(device, page_size, kv_dtype, scale_mode):
    # a chunk over a prefix, a decode request, an empty request, a one-token KV; unused slots
    # hold NaN codes (make_batch), which staging copies and the kernel never reads
    batch = make_batch(
        [75, 0, 1, 40], 8, qo_lens=[21, 1, 1, 40], page_size=page_size, kv_dtype=kv_dtype,
        scale_mode=scale_mode, device=device, generator=gen(page_size),
    )  # fmt: skip
    w = planned(batch)
    assert w._stage is not None
    out, lse = run(w, batch)
    assert_matches_reference(batch, out, lse, causal=True)
    # the same function as the FP8 kernel reading the pool
    direct, _ = run(planned(batch, stage_kv=False), batch)
    assert rel_err(out, direct.double()) <= out_tolerance(out.dtype)


def test_staged_with_split_partials_and_without_rope(device):
    # the partials take the workspace's front, the staged pages its end
    batch = make_batch([130, 9], 4, qo_lens=[3, 2], page_size=16, head_dim_kpe=0,
                       device=device, generator=gen(5))  # fmt: skip
    w = planned(batch, num_splits=3)
    assert w._stage is not None and w._launch.plan.num_splits == 3
    out, lse = run(w, batch)
    assert_matches_reference(batch, out, lse, causal=True)


def test_staging_refused_where_it_cannot_run(device):
    batch = make_batch([40], 4, qo_lens=[8], page_size=16, device=device, generator=gen(6))
    with pytest.raises(ValueError, match="at least .* bytes to stage"):
        planned(batch, nbytes=4096)
    bf16 = make_batch([40], 4, qo_lens=[8], kv_dtype=torch.bfloat16, device=device,
                      generator=gen(6))  # fmt: skip
    with pytest.raises(ValueError, match="FP8 cache with stage_kv=True"):
        planned(bf16)
    i32 = dict(dtype=torch.int32, device=device)
    bufs = (torch.zeros(2, **i32), torch.zeros(2, **i32), torch.zeros(8, **i32),
            torch.zeros(1, **i32))  # fmt: skip
    w = BatchMLAPagedAttentionWrapper(
        torch.empty(1 << 20, dtype=torch.uint8, device=device), True, *bufs, backend="triton"
    )
    with pytest.raises(ValueError, match="use_cuda_graph=False with stage_kv=True"):
        w.plan(*batch.plan_args(), 4, 512, 64, 16, True, SM_SCALE, torch.bfloat16, E4M3,
               stage_kv=True)  # fmt: skip


def test_planner_stages_only_where_rows_reuse_the_kv():
    sm90 = TARGETS["sm90"]
    # a 4,096-token chunk at 128 heads over 36,864 tokens: 8,192 tiles read every token
    chunk = stage_reuse([4096], [36864], 128, 64, 36864)
    assert chunk == 8192 and stage_fp8(sm90, E4M3, chunk)
    # decode at 128 heads (2 tiles), speculative 4 × 16 heads (1 tile): read directly
    assert stage_reuse([1] * 64, [4096] * 64, 128, 64, 64 * 4096) == 2
    assert not stage_fp8(sm90, E4M3, 2.0)
    assert not stage_fp8(sm90, torch.bfloat16, 1e6)  # nothing to convert
    assert not stage_fp8(INTERPRETER, E4M3, 1e6)  # not measured there
    assert not stage_fp8(TARGETS["sm100"], E4M3, 1e6)
    # a decode request beside a chunk costs its own tile over its own tokens
    assert stage_reuse([64, 1], [100, 50], 16, 64, 160) == (16 * 100 + 50) / 160
    assert stage_reuse([], [], 16, 64, 0) == 0.0


def test_split_workspace_places_the_pages_at_the_end():
    ws = torch.empty(10_000, dtype=torch.uint8)
    front, tail = split_workspace(ws, 4000)
    assert tail.numel() == 4000 and tail.data_ptr() % 256 == 0
    assert front.numel() + 4000 <= 10_000 and tail.data_ptr() >= front.data_ptr() + front.numel()
    assert staged_bytes(0, 16, 64) == 16 * 576 * 2  # at least one page
    assert staged_bytes(3, 1, 0) == 3 * 512 * 2


@pytest.mark.gpu
def test_planner_stages_a_long_chunk_on_gpu():
    # the planner's own choice on the GPU (staged where its table measured the gain): a
    # 1,024-token chunk at 32 heads (512 tiles) over 3,072 + 1,024 tokens, beside a decode
    batch = make_batch([4096, 700], 32, qo_lens=[1024, 1], page_size=64, device="cuda",
                       generator=gen(7))  # fmt: skip
    w = planned(batch, stage_kv=None, nbytes=64 << 20)
    from conftest import IS_SM90

    assert (w._stage is not None) == IS_SM90
    out, lse = run(w, batch)
    for req, first, count in [(0, 0, 4), (0, 510, 4), (0, 1020, 4), (1, 0, 1)]:
        q0 = int(batch.qo_indptr[req]) + first
        ref_out, ref_lse = reference_rows(batch, req, first, count)
        got = out[q0 : q0 + count]
        assert rel_err(got, ref_out) <= out_tolerance(got.dtype), (req, first)
        assert (lse[q0 : q0 + count].double() - ref_lse).abs().max().item() < 2e-3
    out2, _ = run(w, batch)  # run() again: the staged path stays off the C fast path
    assert torch.equal(out, out2) and w._fast == [None] * 4


@pytest.mark.gpu
def test_staged_page_id_beyond_the_cache_is_nan():
    # device page ids are not read at plan(): a bad one stages NaN, and only its request's
    # rows turn NaN
    batch = make_batch([50, 40], 8, qo_lens=[9, 4], page_size=16, device="cuda",
                       generator=gen(8))  # fmt: skip
    bad = batch.kv_indices.clone()
    bad[int(batch.kv_indptr[1])] = batch.ckv.shape[0] + 5
    w = BatchMLAPagedAttentionWrapper(torch.empty(16 << 20, dtype=torch.uint8, device="cuda"))
    w.plan(batch.qo_indptr, batch.kv_indptr, bad, batch.kv_len, 8, 512, 64, 16, True,
           SM_SCALE, torch.bfloat16, E4M3, stage_kv=True)  # fmt: skip
    out, _ = run(w, batch)
    assert out[9:].isnan().all() and torch.isfinite(out[:9]).all()
