"""``--attention-backend fp8mla`` on DeepSeek Sparse Attention models in SGLang 0.5.23: the
hooks SGLang applies after ``load_plugins()``, the pool layout they give, and what is refused
at start-up (one line naming the option): in SGLang's resolution step
``handle_other_validations`` on a real ``ServerArgs``, and when the backend is built on the
kit's ``ModelRunner``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("sglang", reason="sglang not installed (run make test)")
torch = pytest.importorskip("torch")

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()  # registers fp8mla and applies its hooks, as every SGLang process does

from sglang.srt.arg_groups.overrides import resolved_view  # noqa: E402
from sglang.srt.arg_groups.resolution_hooks import run_hook  # noqa: E402
from sglang.srt.arg_groups.serving_hook import handle_other_validations  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS  # noqa: E402
from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer  # noqa: E402
from sglang.srt.mem_cache import kv_cache_configurator  # noqa: E402
from sglang.srt.model_executor.cuda_graph_config import (  # noqa: E402
    CudaGraphConfig,
    PhaseConfig,
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.test.kits.attention_unittest.attention_methods import (  # noqa: E402
    dsa_attention as kit,
)

from fp8mla.integrations import IntegrationConfigError  # noqa: E402
from fp8mla.integrations.sglang import dsa_config, register  # noqa: E402
from fp8mla.integrations.sglang.dsa_config import check_dsa_server_args  # noqa: E402

DSA_HF = SimpleNamespace(architectures=["DeepseekV32ForCausalLM"], index_topk=2048)
DENSE_HF = SimpleNamespace(architectures=["DeepseekV3ForCausalLM"])


def one_line(err: pytest.ExceptionInfo, option: str) -> None:
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("fp8mla (sglang): ") and option in msg, msg


# -- hooks ------------------------------------------------------------------------------
def test_hooks_are_applied():
    assert hasattr(kv_cache_configurator.calculate_mla_kv_cache_dim, "__wrapped__")
    assert hasattr(Indexer._get_topk_paged, "__wrapped__")
    assert hasattr(Indexer._get_topk_ragged, "__wrapped__")


def runner(backend: str, *, fp8: bool = True, dsa_decode_backend: str = "flashmla_kv",
           dims: bool = True, mode=ForwardMode.DECODE):  # fmt: skip
    """The kit's ``ModelRunner`` (its server args installed) for a DSA model."""
    case = kit.DSAAttentionCase(name="config", backend=backend, forward_mode=mode, num_heads=4,
                                num_kv_heads=1, page_size=64, prefix_lens=(10,))  # fmt: skip
    extra = dict(qk_nope_head_dim=512, qk_rope_head_dim=64, kv_lora_rank=512) if dims else {}
    model = kit.TinyDSAModelConfig(num_heads=4, num_kv_heads=1, head_dim=576, hidden_size=64,
                                   context_len=128, **extra)  # fmt: skip
    return kit.DSAMockModelRunner(case=case, model_config=model, dtype=torch.bfloat16,
                                  device="cpu", max_context_len=128, head_dim=576,
                                  dsa_decode_backend=dsa_decode_backend, fp8_kv_cache=fp8)  # fmt: skip


@pytest.mark.parametrize(
    "backend, decode_impl, dtype, want",
    [
        ("fp8mla", "trtllm", torch.float8_e4m3fn, 656),  # SGLang alone: raw 576-byte rows
        ("fp8mla", "flashmla_kv", torch.float8_e4m3fn, 656),
        ("dsa", "trtllm", torch.float8_e4m3fn, 576),  # not fp8mla's: SGLang's answer
        ("dsa", "flashmla_kv", torch.float8_e4m3fn, 656),
        ("fp8mla", "trtllm", torch.bfloat16, 576),
    ],
)
def test_pool_rows_are_656_bytes_under_fp8mla(backend, decode_impl, dtype, want):
    """``calculate_mla_kv_cache_dim`` keys the layout on the ``dsa_*`` kernel names
    (``trtllm`` is SM100's default); under fp8mla an FP8 DSA pool has 656-byte rows."""
    r = runner(backend, dsa_decode_backend=decode_impl)
    got = kv_cache_configurator.calculate_mla_kv_cache_dim(
        model_config=r.model_config, kv_cache_dtype=dtype
    )
    assert got == want


def test_register_is_idempotent(monkeypatch):
    """``register()`` runs again in processes that load plugins twice: one validation each."""
    calls = []
    monkeypatch.setattr(dsa_config, "check_dsa_server_args", lambda v: calls.append(v) or {})
    register()
    sa = ServerArgs(model_path="unused", attention_backend="fp8mla", page_size=64)
    sa._model_config = SimpleNamespace(hf_config=DSA_HF)
    run_hook(handle_other_validations, sa)
    assert len(calls) == 1


# -- start-up refusals: the server-args pass --------------------------------------------
def view(**kw):
    base = dict(
        attention_backend="fp8mla", prefill_attention_backend=None,
        decode_attention_backend=None, kv_cache_dtype="fp8_e4m3", dtype="auto", page_size=64,
        dcp_size=1, speculative_algorithm=None, enable_hisparse=False,
        enable_prefill_cp=False, enable_two_batch_overlap=False,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize(
    "ok",
    [{}, dict(kv_cache_dtype="bfloat16"), dict(kv_cache_dtype="auto", page_size=None),
     dict(attention_backend="dsa", kv_cache_dtype="fp4_e2m1")],  # not fp8mla's business
)  # fmt: skip
def test_server_args_accepted(ok):
    assert check_dsa_server_args(view(**ok)) == {}


@pytest.mark.parametrize(
    "bad, option",
    [
        (dict(kv_cache_dtype="fp8_e5m2"), "--kv-cache-dtype"),
        (dict(dtype="float32"), "--dtype"),
        (dict(page_size=32), "--page-size"),
        (dict(dcp_size=2), "--dcp-size"),
        (dict(speculative_algorithm="EAGLE"), "--speculative-algorithm"),
        (dict(enable_hisparse=True), "--enable-hisparse"),
        (dict(enable_prefill_cp=True), "--enable-prefill-cp"),
        (dict(enable_two_batch_overlap=True), "--enable-two-batch-overlap"),
        (dict(attention_backend="dsa", decode_attention_backend="fp8mla"),
         "--prefill-attention-backend dsa"),
        (dict(prefill_attention_backend="triton"), "--attention-backend fp8mla"),
        (dict(cuda_graph_backend_prefill="full"), "--cuda-graph-backend-prefill full"),
    ],
)  # fmt: skip
def test_server_args_refused_in_one_line(bad, option):
    with pytest.raises(IntegrationConfigError) as err:
        check_dsa_server_args(view(**bad))
    one_line(err, option)


def test_prefill_cuda_graphs_turned_off():
    """SGLang's default prefill graphs (breakable on CUDA) become eager prefill at the
    resolution step; decode graphs stay as they were."""
    graphs = CudaGraphConfig(prefill=PhaseConfig(backend="breakable"))
    sa = ServerArgs(model_path="unused", attention_backend="fp8mla", page_size=64,
                    cuda_graph_config=graphs)  # fmt: skip
    sa._model_config = SimpleNamespace(hf_config=DSA_HF)
    run_hook(handle_other_validations, sa)
    resolved = resolved_view(sa).cuda_graph_config
    assert resolved.prefill.backend == "disabled" and resolved.decode == graphs.decode


@pytest.mark.parametrize(
    "hf, args, option",
    [
        (DSA_HF, dict(page_size=32), "--page-size"),
        (DSA_HF, dict(speculative_algorithm="EAGLE"), "--speculative-algorithm"),
        (DSA_HF, dict(kv_cache_dtype="fp8_e5m2"), "--kv-cache-dtype"),
        (DENSE_HF, dict(page_size=256), "--page-size"),  # the dense pass runs there too
    ],
)
def test_resolution_step_refuses_at_startup(hf, args, option):
    """SGLang's resolution step ``handle_other_validations`` (fp8mla wraps it) on a real
    ``ServerArgs``: the DSA pass on a DSA model, the dense one otherwise."""
    sa = ServerArgs(model_path="unused", attention_backend="fp8mla", **args)
    sa._model_config = SimpleNamespace(hf_config=hf)  # SGLang's memo of the model's config
    with pytest.raises(IntegrationConfigError) as err:
        run_hook(handle_other_validations, sa)
    one_line(err, option)


def test_resolution_step_accepts_and_frees_the_indexer_from_deepgemm(monkeypatch):
    """An accepted DSA launch; without DeepGEMM installed SGLang's own switch is set, so its
    ``Indexer`` reads the SM count off the device instead of importing DeepGEMM."""
    monkeypatch.setattr(dsa_config.importlib.util, "find_spec", lambda name: None)
    monkeypatch.delenv(envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.name, raising=False)
    sa = ServerArgs(model_path="unused", attention_backend="fp8mla", kv_cache_dtype="fp8_e4m3",
                    page_size=64)  # fmt: skip
    sa._model_config = SimpleNamespace(hf_config=DSA_HF)
    run_hook(handle_other_validations, sa)
    assert envs.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH.get() is True
    other = ServerArgs(model_path="unused", attention_backend="triton", page_size=32)
    other._model_config = SimpleNamespace(hf_config=DSA_HF)
    run_hook(handle_other_validations, other)  # not fp8mla: nothing checked


# -- start-up refusals: building the backend --------------------------------------------
def test_backend_for_a_dsa_model():
    backend = ATTENTION_BACKENDS["fp8mla"](runner("fp8mla"))
    assert type(backend).__name__ == "FP8MLADSABackend" and backend.use_mha is False


@pytest.mark.parametrize(
    "change, option",
    [
        (lambda r: setattr(r.model_config.hf_config, "learnable_sink", True), "sinks"),
        (lambda r: setattr(r.model_config.hf_config, "index_kpool", 2), "index_kpool=2"),
        (lambda r: setattr(r, "kv_cache_dtype", torch.float8_e4m3fn), "656-byte"),
        (lambda r: setattr(r, "dtype", torch.float32), "--dtype"),
    ],
    ids=["learnable_sink", "index_kpool", "fp8_rows_of_576_bytes", "float32"],
)
def test_backend_refuses_in_one_line(change, option):
    r = runner("fp8mla", fp8=False)  # a bf16 pool; the last two cases change what it claims
    change(r)
    with pytest.raises(IntegrationConfigError) as err:
        ATTENTION_BACKENDS["fp8mla"](r)
    one_line(err, option)


def test_backend_refuses_toy_dims():
    with pytest.raises(IntegrationConfigError) as err:
        ATTENTION_BACKENDS["fp8mla"](runner("fp8mla", fp8=False, dims=False))
    one_line(err, "--model-path")


def test_unsupported_batches_are_refused():
    backend = ATTENTION_BACKENDS["fp8mla"](runner("fp8mla"))
    verify = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, batch_size=1)
    with pytest.raises(IntegrationConfigError, match="TARGET_VERIFY"):
        backend.init_forward_metadata(verify)
    with pytest.raises(ValueError, match="init_cuda_graph_state"):
        backend.init_forward_metadata_out_graph(verify, in_capture=True)
    backend.init_cuda_graph_state(max_bs=2, max_num_tokens=2)
    with pytest.raises(IntegrationConfigError, match="TARGET_VERIFY"):
        backend.init_forward_metadata_out_graph(verify, in_capture=True)
    extend = SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=1)
    with pytest.raises(IntegrationConfigError, match="CUDA graphs cover decode"):
        backend.init_forward_metadata_out_graph(extend, in_capture=True)
    decode = SimpleNamespace(
        forward_mode=ForwardMode.DECODE, batch_size=1, seq_lens=torch.tensor([5]),
        seq_lens_cpu=torch.tensor([5]), req_pool_indices=torch.tensor([0]),
    )  # fmt: skip
    with pytest.raises(IntegrationConfigError, match="no CUDA graph captured for batch size 1"):
        backend.init_forward_metadata_out_graph(decode)
    with pytest.raises(ValueError, match="at most 2 requests"):
        big = SimpleNamespace(**{**vars(decode), "batch_size": 3})
        backend.init_forward_metadata_out_graph(big, in_capture=True)


def test_forward_without_indices_or_with_sinks_is_refused():
    r = runner("fp8mla")
    backend = ATTENTION_BACKENDS["fp8mla"](r)
    case = kit.DSAAttentionCase(name="x", backend="fp8mla", forward_mode=ForwardMode.DECODE,
                                num_heads=4, num_kv_heads=1, page_size=64, prefix_lens=(10,))  # fmt: skip
    fb = kit._make_forward_batch(case, r, max_context_len=128, device="cpu")
    backend.init_forward_metadata(fb)
    layer = SimpleNamespace(tp_q_head_num=4, v_head_dim=512, head_dim=576, layer_id=0,
                            scaling=0.1, logit_cap=0.0)  # fmt: skip
    q = torch.zeros(1, 4 * 512, dtype=torch.bfloat16)
    q_rope = torch.zeros(1, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="topk_indices"):
        backend.forward_decode(q, None, None, layer, fb, q_rope=q_rope)
    with pytest.raises(IntegrationConfigError, match="sinks"):
        backend.forward_decode(q, None, None, layer, fb, q_rope=q_rope, attn_sink=torch.zeros(4))
    assert backend.forward_metadata.planned is None  # nothing ran
