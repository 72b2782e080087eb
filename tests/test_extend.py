"""Extend and prefill chunks through the same plan()/run(): long causal query chunks over a
cached prefix, mixed with one-token decode requests."""

from __future__ import annotations

import pytest
import torch

from fp8mla.ops.planner import choose_config
from fp8mla.ops.targets import cuda_target
from fp8mla.testing import make_batch

from attention_utils import assert_matches_reference, run_wrapper


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
    wide = choose_config(4096 * 128, torch.float8_e4m3fn, False)  # the H200 table
    assert (wide.block_m, wide.wgmma) == (64, True)
    sm100 = choose_config(4096 * 128, torch.float8_e4m3fn, False, cuda_target(100))
    assert (sm100.block_m, sm100.value_split, sm100.wgmma) == (128, True, False)
    spec = choose_config(4 * 16, torch.float8_e4m3fn, False)  # 4 speculative tokens, 16 heads
    assert (spec.block_m, spec.wgmma) == (64, True)
    assert choose_config(16, torch.float8_e4m3fn, False).block_m == 16
    assert choose_config(4096 * 128, torch.bfloat16, False).value_split
    assert choose_config(64, torch.bfloat16, False).block_m == 64
    assert choose_config(40 * 4, torch.float8_e4m3fn, True).value_split  # the interpreter too


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
