"""vLLM (0.33.0 and 0.34.0: the engine matrix of ``make test``) loads fp8mla through
``vllm.general_plugins``; ``FP8MLAImpl.forward_mqa`` (an ``MLACommonImpl`` subclass) on vLLM's
paged cache against fp8mla's float64 reference."""

from __future__ import annotations

import importlib.metadata as md
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="vllm not installed (run make test)")
torch = pytest.importorskip("torch")

from fp8mla.integrations import BACKEND_ENV, IntegrationConfigError  # noqa: E402
from fp8mla.reference import mla_reference  # noqa: E402
from integrations.vllm_step import engine_config_cpu  # noqa: E402

SCALE = 576**-0.5


@pytest.fixture(scope="module")
def plugins_loaded():
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what the API server, engine core and workers do


def test_entry_point_declared():
    eps = md.entry_points(group="vllm.general_plugins")
    assert eps["fp8mla"].value == "fp8mla.integrations.vllm:register"


def test_flag_parses_and_selects_backend(plugins_loaded):
    from vllm.config.attention import AttentionConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from fp8mla.integrations.vllm.backend import FP8MLABackend

    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    args = parser.parse_args(["--model", "unused", "--attention-backend", "FP8MLA"])
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.attention_backend == "FP8MLA"
    backend = AttentionConfig(backend=engine_args.attention_backend).backend
    assert backend.get_class() is FP8MLABackend
    assert FP8MLABackend.get_name() == "FP8MLA" and FP8MLABackend.is_mla()


def _reasons(**kw):
    from vllm.platforms.interface import DeviceCapability

    from fp8mla.integrations.vllm.backend import FP8MLABackend

    base = dict(
        head_size=576, dtype=torch.bfloat16, kv_cache_dtype="fp8", block_size=64, use_mla=True,
        has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
        device_capability=DeviceCapability(9, 0), attn_type="decoder",
    )  # fmt: skip
    return FP8MLABackend.validate_configuration(**{**base, **kw})


def test_capabilities_let_vllm_refuse_with_a_reason(plugins_loaded):
    from vllm.platforms.interface import DeviceCapability

    assert _reasons() == []
    assert _reasons(kv_cache_dtype="fp8_e5m2", block_size=16, dtype=torch.float16) == []
    assert "dtype not supported" in _reasons(dtype=torch.float32)
    assert "kv_cache_dtype not supported" in _reasons(kv_cache_dtype="nvfp4")
    assert "block_size not supported" in _reasons(block_size=24)
    assert "compute capability not supported" in _reasons(device_capability=DeviceCapability(7, 5))
    assert any("head size 576" in r for r in _reasons(head_size=512))
    assert "sparse not supported" in _reasons(use_sparse=True)


def _impl(kv_cache_dtype="fp8", num_heads=16, kv_lora_rank=512):
    from vllm.config import set_current_vllm_config

    from fp8mla.integrations.vllm.backend import FP8MLAImpl

    with set_current_vllm_config(engine_config_cpu()):
        return FP8MLAImpl(
            num_heads, 576, SCALE, 1, None, None, kv_cache_dtype, None, "decoder", None,
            q_lora_rank=None, kv_lora_rank=kv_lora_rank, qk_nope_head_dim=128,
            qk_rope_head_dim=64, qk_head_dim=192, v_head_dim=128, kv_b_proj=None,
        )  # fmt: skip


CASES = [
    # kv cache dtype, block size, seq_lens, query len, causal
    ("fp8", 16, (5, 33, 17), 1, True),
    ("fp8", 64, (1, 64, 65, 130), 1, True),
    ("fp8_e5m2", 16, (40, 7), 1, True),
    ("fp8", 64, (70, 9), 3, True),  # speculative verification rows (causal block)
    ("fp8", 16, (20, 31), 2, False),  # non-causal draft block
    ("auto", 16, (12, 50), 1, True),  # bf16 cache
]


@pytest.mark.parametrize("kernel", ["auto", "triton"])
@pytest.mark.parametrize("kv_dtype, block, seq_lens, qlen, causal", CASES)
def test_forward_mqa_matches_float64_reference(
    kv_dtype, block, seq_lens, qlen, causal, kernel, monkeypatch, plugins_loaded, engine_device
):
    from vllm.model_executor.layers.attention.mla_attention import MLACommonMetadata

    from fp8mla.integrations.vllm.backend import FP8MLADecodeMetadata

    monkeypatch.setenv(BACKEND_ENV, kernel)
    dev, heads = engine_device, 16
    impl = _impl(kv_dtype, heads)
    gen = torch.Generator().manual_seed(len(seq_lens) * 31 + block + qlen)
    n = len(seq_lens)
    max_blocks = -(-max(seq_lens) // block) + 1
    num_blocks = n * max_blocks + 3
    k_scale = 0.5 if kv_dtype != "auto" else 1.0
    raw = torch.randn(num_blocks, block, 576, generator=gen)
    if kv_dtype == "auto":
        cache = raw.to(torch.bfloat16)
        stored = cache
    else:  # what concat_and_cache_mla stores: k / k_scale in FP8, seen as vLLM's fp8 view
        fp8 = torch.float8_e5m2 if kv_dtype == "fp8_e5m2" else torch.float8_e4m3fn
        stored = (raw / k_scale).to(fp8)
        cache = stored.view(torch.uint8).view(torch.float8_e4m3fn)
    perm = torch.randperm(num_blocks, generator=gen)[: n * max_blocks].view(n, max_blocks)
    block_table = perm.to(torch.int32)
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    q = torch.randn(n * qlen, heads, 576, generator=gen).to(torch.bfloat16)
    qsl = torch.arange(0, (n + 1) * qlen, qlen, dtype=torch.int32)
    decode = FP8MLADecodeMetadata(
        block_table=block_table.to(dev), seq_lens=seq.to(dev), dcp_tot_seq_lens=None,
        query_start_loc_cpu=qsl, max_seq_len=max(seq_lens), causal=causal,
    )  # fmt: skip
    meta = MLACommonMetadata(
        num_reqs=n, max_query_len=qlen, max_seq_len=max(seq_lens), num_actual_tokens=n * qlen,
        query_start_loc=qsl.to(dev), slot_mapping=torch.zeros(n * qlen, dtype=torch.int64),
        num_decodes=n, num_decode_tokens=n * qlen, num_prefills=0, causal=causal, decode=decode,
    )  # fmt: skip
    layer = SimpleNamespace(_k_scale=torch.tensor([k_scale], device=dev))
    qd = q.to(dev)
    out, lse = impl.forward_mqa((qd[..., :512], qd[..., 512:]), cache.to(dev), meta, layer)
    assert lse is None and out.shape == (n * qlen, heads, 512) and out.dtype == torch.bfloat16
    # the same call with the concatenated query (vLLM's other calling form)
    out_cat, _ = impl.forward_mqa(qd, cache.to(dev), meta, layer)
    torch.testing.assert_close(out_cat, out, atol=0, rtol=0)

    kv_indptr = torch.arange(0, (n + 1) * max_blocks, max_blocks, dtype=torch.int32)
    ref, _ = mla_reference(
        q[..., :512], q[..., 512:], stored[..., :512], stored[..., 512:], qsl, kv_indptr,
        block_table.reshape(-1), seq, sm_scale=SCALE, causal=causal, ckv_scale=k_scale,
        kpe_scale=k_scale, dtype=torch.float64,
    )  # fmt: skip
    err = (out.double().cpu() - ref).abs().max().item()
    tol = 2 * 2**-8 * max(1.0, ref.abs().max().item())  # two bf16 ulps of the output
    assert err <= tol, (err, tol)


def test_fp8_queries_need_an_e4m3_cache(monkeypatch, plugins_loaded):
    """``FP8MLA_FP8_QUERIES``: 1 takes vLLM's e4m3 queries against an e4m3 cache only; 0 (the
    default) keeps the model's 16-bit queries; anything else is refused."""
    from fp8mla.integrations import FP8_QUERIES_ENV

    assert not _impl("fp8").supports_quant_query_input
    monkeypatch.setenv(FP8_QUERIES_ENV, "1")
    assert _impl("fp8").supports_quant_query_input
    for kv in ("fp8_e5m2", "auto"):
        with pytest.raises(IntegrationConfigError, match="FP8MLA_FP8_QUERIES=1.*--kv-cache-dtype"):
            _impl(kv)
    monkeypatch.setenv(FP8_QUERIES_ENV, "yes")
    with pytest.raises(IntegrationConfigError, match="is not 0 or 1"):
        _impl("fp8")


def test_impl_refuses_bad_configuration(plugins_loaded):
    with pytest.raises(IntegrationConfigError, match="--kv-cache-dtype"):
        _impl("nvfp4")
    with pytest.raises(IntegrationConfigError, match="kv_lora_rank=256"):
        _impl(kv_lora_rank=256)
