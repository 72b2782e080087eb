"""fp8mla driven by SGLang's own attention test kit (``sglang/test/kits/attention_unittest``).

A real ``ModelRunner`` subclass, ``ReqToTokenPool``, ``MLATokenToKVPool`` (FP8 or bf16),
``ForwardBatch`` and ``RadixAttention`` with MLA's real dims (kv_lora_rank 512, RoPE 64),
pages shuffled within each request. Every case runs fp8mla and SGLang's ``torch_native``
backend on the same pool: fp8mla must match ``torch_native`` within the kit's tolerance and
the kit's float reference (which never quantizes K) within ``torch_native``'s own error plus
that tolerance (the FP8 quantization noise of the engine's reference backend). Kernels:
``auto`` (the PyTorch path on a CPU, Triton on CUDA) and ``triton`` (interpreted on a CPU).
"""

from __future__ import annotations

import dataclasses
import unittest

import pytest

pytest.importorskip("sglang", reason="sglang not installed (run make test)")
torch = pytest.importorskip("torch")

from fp8mla.integrations import BACKEND_ENV, IntegrationConfigError  # noqa: E402
from fp8mla.integrations.sglang import register  # noqa: E402

register()

from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.test.kits.attention_unittest.attention_methods import (  # noqa: E402
    mla_attention as kit,
)
from sglang.test.kits.attention_unittest.runner_modes import (  # noqa: E402
    cuda_graph_decode_runner as kit_graph,
)
from sglang.test.kits.attention_unittest.runner_modes import (  # noqa: E402
    speculative_target_verify_runner as kit_verify,
)

DIMS = dict(kv_lora_rank=512, qk_rope_head_dim=64)
DTYPE = torch.bfloat16
KERNELS = ("auto", "triton")

# Our own cases at page size 64 (the kit's stop at 32) and at page size 1 across many tokens.
OWN_CASES = (
    kit.MLAAttentionCase(
        name="fp8mla_extend_page64_prefix_spans_pages",
        backend="fp8mla",
        forward_mode=ForwardMode.EXTEND,
        num_heads=16,
        page_size=64,
        prefix_lens=(70, 0, 127),
        extend_lens=(5, 64, 2),
    ),
    kit.MLAAttentionCase(
        name="fp8mla_decode_page64_edges",
        backend="fp8mla",
        forward_mode=ForwardMode.DECODE,
        num_heads=16,
        page_size=64,
        prefix_lens=(63, 64, 130, 1),
    ),
    kit.MLAAttentionCase(
        name="fp8mla_decode_page1_long",
        backend="fp8mla",
        forward_mode=ForwardMode.DECODE,
        num_heads=8,
        page_size=1,
        prefix_lens=(97, 200),
    ),
)
CASES = (*kit.make_mla_cases("fp8mla"), *OWN_CASES)


def _run(case, backend, *, fp8, device):
    case = dataclasses.replace(case, backend=backend)
    max_ctx = max(kit.DEFAULT_MAX_CONTEXT_LEN, -(-max(case.seq_lens) // 64) * 64 + 64)
    fx = kit.build_mla_attention_fixture(
        unittest.TestCase(),
        case,
        **DIMS,
        hidden_size=64,
        max_context_len=max_ctx,
        dtype=DTYPE,
        device=device,
        fp8_kv_cache=fp8,
    )
    out = kit.run_mla_fixture_eager(fx).float()
    return fx, out, kit.expected_mla_fixture_output(fx).float()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fp8", [True, False], ids=["fp8_pool", "bf16_pool"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kit_case_matches_reference_and_torch_native(case, fp8, kernel, monkeypatch, engine_device):
    monkeypatch.setenv(BACKEND_ENV, kernel)
    fx, ours, ref = _run(case, "fp8mla", fp8=fp8, device=engine_device)
    assert type(fx.backend).__name__ == "FP8MLAAttnBackend"
    pool = fx.runner.token_to_kv_pool
    assert pool.get_key_buffer(0).dtype == (torch.float8_e4m3fn if fp8 else DTYPE)
    _, native, _ = _run(case, "torch_native", fp8=fp8, device=engine_device)
    torch.testing.assert_close(ours, native, atol=kit.MLA_ATOL, rtol=kit.MLA_RTOL)
    if fp8:
        err, native_err = (ours - ref).abs().max().item(), (native - ref).abs().max().item()
        assert err <= native_err + kit.MLA_ATOL, (err, native_err)
    else:
        torch.testing.assert_close(ours, ref, atol=kit.MLA_ATOL, rtol=kit.MLA_RTOL)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("page_size, prefix_lens", [(16, (14, 15, 33)), (64, (63, 64, 1))])
def test_kit_cuda_graph_decode(page_size, prefix_lens, kernel, monkeypatch, engine_device):
    """The kit's capture/replay flow (padded replay batch) through fp8mla's graph hooks."""
    monkeypatch.setenv(BACKEND_ENV, kernel)
    case = kit.MLAAttentionCase(
        name=f"fp8mla_graph_decode_p{page_size}",
        backend="fp8mla",
        forward_mode=ForwardMode.DECODE,
        num_heads=16,
        page_size=page_size,
        prefix_lens=prefix_lens,
    )
    kit_graph.run_mla_cuda_graph_decode_case(
        unittest.TestCase(), case, **DIMS, max_context_len=192, dtype=DTYPE, device=engine_device
    )


def _verify_case(name: str, page_size: int, prefix_lens: tuple[int, ...]):
    """A target-verify case of 16 heads: 3 draft tokens per request over ``prefix_lens``."""
    return kit.MLAAttentionCase(
        name=name,
        backend="fp8mla",
        forward_mode=ForwardMode.TARGET_VERIFY,
        num_heads=16,
        page_size=page_size,
        prefix_lens=prefix_lens,
        extend_lens=(3,) * len(prefix_lens),
    )


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("page_size, prefix_lens", [(1, (5, 40)), (16, (5, 9)), (64, (30, 61))])
def test_kit_eagle_verify(page_size, prefix_lens, kernel, monkeypatch, engine_device):
    """Speculative target verification (EAGLE/MTP chain, topk 1), eager."""
    monkeypatch.setenv(BACKEND_ENV, kernel)
    case = _verify_case(f"fp8mla_verify_p{page_size}", page_size, prefix_lens)
    kit_verify.run_mla_eagle_verify_case(
        unittest.TestCase(), case, topk=1, **DIMS, max_context_len=128, dtype=DTYPE,
        device=engine_device,
    )  # fmt: skip


@pytest.mark.parametrize("page_size, prefix_lens", [(16, (5, 9)), (64, (30, 61))])
def test_kit_eagle_verify_cuda_graph(page_size, prefix_lens, monkeypatch, engine_device):
    """Target verify under the kit's graph flow. The kit's eager leg writes the prefix at
    unshuffled slots, so each request here fits in one page (where both layouts agree)."""
    monkeypatch.setenv(BACKEND_ENV, "triton")
    case = _verify_case(f"fp8mla_verify_graph_p{page_size}", page_size, prefix_lens)
    kit_verify.run_mla_eagle_verify_cuda_graph_case(
        unittest.TestCase(), case, topk=1, **DIMS, max_context_len=128, dtype=DTYPE,
        device=engine_device,
    )  # fmt: skip


def test_tree_verify_refused(engine_device):
    case = kit.MLAAttentionCase(
        name="fp8mla_verify_tree",
        backend="fp8mla",
        forward_mode=ForwardMode.TARGET_VERIFY,
        num_heads=4,
        page_size=1,
        prefix_lens=(5,),
        extend_lens=(3,),
    )
    with pytest.raises(IntegrationConfigError, match="--speculative-eagle-topk"):
        kit_verify.run_mla_eagle_verify_case(
            unittest.TestCase(), case, topk=2, **DIMS, dtype=DTYPE, device=engine_device
        )


def test_bad_head_dims_refused_at_backend_creation(engine_device):
    """The kit's default toy dims (kv_lora_rank 32, no RoPE) are not an MLA fp8mla serves."""
    case = kit.make_mla_cases("fp8mla")[0]
    with pytest.raises(IntegrationConfigError) as err:
        kit.build_mla_attention_fixture(unittest.TestCase(), case, device=engine_device)
    msg = str(err.value)
    assert "\n" not in msg and "--model-path" in msg and "kv_lora_rank=32" in msg
