"""Extend and prefill chunks through the same plan()/run(): long causal query chunks over a
cached prefix, mixed with one-token decode requests."""

from __future__ import annotations

import pytest
import torch

from fp8mla.attention.planner import choose_config
from fp8mla.attention.targets import INTERPRETER, cuda_target
from fp8mla.reference import mla_reference
from fp8mla.testing import make_batch, rel_err

from attention_utils import (
    SM_SCALE,
    assert_matches_reference,
    out_tolerance,
    reference_rows,
    run_wrapper,
)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("causal", [True, False])
def test_chunks_mixed_with_decode(device, causal):
    # prefill chunk of 40 over a 70-token prefix, a decode request, a 25-token chunk that is
    # the whole sequence (no prefix), an empty request
    batch = make_batch(
        [110, 300, 25, 0], 4, qo_lens=[40, 1, 25, 1], page_size=16, device=device, generator=gen(1)
    )
    out, lse = run_wrapper(batch, causal=causal)
    assert_matches_reference(batch, out, lse, causal=causal)


def test_chunk_of_fp8_e5m2_page_size_one(device):
    batch = make_batch(
        [90, 7],
        8,
        qo_lens=[33, 2],
        page_size=1,
        kv_dtype=torch.float8_e5m2,
        device=device,
        generator=gen(2),
    )
    out, lse = run_wrapper(batch, causal=True)
    assert_matches_reference(batch, out, lse, causal=True)


def test_long_chunks_take_the_wide_tiles():
    h200 = cuda_target(90)
    wide = choose_config(4096 * 128, torch.float8_e4m3fn, h200)
    assert (wide.block_m, wide.variant) == (64, "wgmma")
    sm100 = choose_config(4096 * 128, torch.float8_e4m3fn, cuda_target(100))
    assert (sm100.block_m, sm100.variant) == (128, "vsplit")
    spec = choose_config(4 * 16, torch.float8_e4m3fn, h200)  # 4 speculative tokens, 16 heads
    assert (spec.block_m, spec.variant) == (32, "fp8qk")
    spec2 = choose_config(2 * 16, torch.float8_e4m3fn, h200)  # 2 tokens × 16 heads: 32 rows
    assert (spec2.block_m, spec2.variant) == (32, "fp8qk")
    assert choose_config(16, torch.float8_e4m3fn, h200).block_m == 16
    long_16bit = choose_config(4096 * 128, torch.bfloat16, h200)  # 64-token tiles
    assert (long_16bit.block_n, long_16bit.variant) == (64, "pingpong64")
    # one row tile a request: 32-token tiles; two or more: 64-token tiles
    assert choose_config(64, torch.bfloat16, h200).variant == "pingpong"
    assert choose_config(65, torch.bfloat16, h200).variant == "pingpong64"
    assert choose_config(4096 * 128, torch.bfloat16, cuda_target(100)).variant == "vsplit"
    assert choose_config(64, torch.bfloat16, h200).block_m == 64
    assert choose_config(40 * 4, torch.float8_e4m3fn, INTERPRETER).variant == "vsplit"


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
def test_long_chunk_over_long_prefix_on_gpu(heads):
    batch = make_batch(
        [4096 + 1024, 5000, 1],
        heads,
        qo_lens=[1024, 1, 1],
        page_size=64,
        device="cuda",
        generator=gen(heads),
    )
    out, lse = run_wrapper(batch, causal=True)
    assert_matches_reference(batch, out, lse, causal=True)


def test_reference_rows_are_the_full_references_rows():
    batch = make_batch([110, 9], 2, qo_lens=[40, 3], page_size=16, generator=gen(3))
    full_out, full_lse = mla_reference(
        batch.q_nope,
        batch.q_pe,
        batch.ckv,
        batch.kpe,
        *batch.plan_args(),
        sm_scale=SM_SCALE,
        causal=True,
        **batch.scale_kwargs(),
    )
    for req, first, count in [(0, 0, 4), (0, 17, 5), (0, 36, 4), (1, 1, 2)]:
        q0 = int(batch.qo_indptr[req]) + first
        out, lse = reference_rows(batch, req, first, count)
        # float64; only the summation order differs (fewer masked keys)
        torch.testing.assert_close(out, full_out[q0 : q0 + count], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse, full_lse[q0 : q0 + count], rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.bfloat16])
def test_longest_chunk_over_longest_prefix_on_gpu(kv_dtype):
    # the limits: a 16,384-token chunk over a 131,072-token prefix, beside a decode
    # request; checked on the chunk's first, middle and last tokens and on the decode row
    chunk, prefix = 16384, 131072
    batch = make_batch(
        [prefix + chunk, 300],
        16,
        qo_lens=[chunk, 1],
        page_size=64,
        kv_dtype=kv_dtype,
        device="cuda",
        generator=gen(7),
    )
    out, lse = run_wrapper(batch, causal=True)
    assert torch.isfinite(out).all()
    for req, first, count in [(0, 0, 4), (0, chunk // 2 - 2, 4), (0, chunk - 4, 4), (1, 0, 1)]:
        q0 = int(batch.qo_indptr[req]) + first
        ref_out, ref_lse = reference_rows(batch, req, first, count)
        got = out[q0 : q0 + count]
        err = rel_err(got, ref_out)
        assert err <= out_tolerance(got.dtype), f"request {req} token {first}: {err:.2e}"
        assert (lse[q0 : q0 + count].double() - ref_lse).abs().max().item() < 2e-3
