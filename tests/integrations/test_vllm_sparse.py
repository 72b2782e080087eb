"""DeepSeek Sparse Attention in vLLM (0.33.0 and 0.34.0) through fp8mla: the ``FP8MLA_SPARSE``
backend and fp8mla's lightning indexer in place of vLLM's ``SparseAttnIndexer``, on vLLM's own
layers, builders and metadata (``vllm_dsa.py``), against float64 references on the same cache
bytes; the start-up refusals; full CUDA graphs of uniform decode batches.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm not installed (run make test)")
torch = pytest.importorskip("torch")

from fp8mla.dsa.index_cache import unpack_index_keys  # noqa: E402
from fp8mla.dsa.sparse import SparseMLAWrapper  # noqa: E402
from fp8mla.integrations import BACKEND_ENV, IntegrationConfigError  # noqa: E402
from integrations import vllm_dsa  # noqa: E402
from integrations.vllm_dsa import PAGE, Batch, DsaStep, check_selection, dsa_config  # noqa: E402


@pytest.fixture(scope="module")
def vllm_env():
    """fp8mla's plugin loaded, vLLM's single-process parallel state, and vLLM's metadata
    kernels (PyTorch statements where vLLM has no Triton: ``vllm_dsa.cpu_standins``)."""
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # what the API server, engine core and workers do
    owned = vllm_dsa.init_model_parallel(dsa_config())
    with pytest.MonkeyPatch.context() as mp:
        vllm_dsa.cpu_standins(mp)
        yield
    if owned:
        vllm_dsa.close_model_parallel()


@pytest.fixture(scope="module", params=["fp8_ds_mla", "auto"])
def step(request, vllm_env, engine_device):
    # one speculative token: decode rows of 2 tokens (verification) besides single ones
    config = dsa_config(kv_cache_dtype=request.param, max_model_len=512, speculative_tokens=1)
    return DsaStep(config, layers=2, num_blocks=40, device=engine_device)


def _batch(step: DsaStep, seq_lens, query_lens, seed: int) -> Batch:
    gen = torch.Generator().manual_seed(seed)
    pages = max(-(-s // PAGE) for s in seq_lens)
    num_blocks = step.mla_caches[0].shape[0]
    rows = torch.randperm(num_blocks, generator=gen)[: len(seq_lens) * pages]
    return Batch(list(seq_lens), list(query_lens), rows.view(len(seq_lens), pages).int())


def _check_layers(step: DsaStep, batch: Batch, metadata: dict, inputs) -> None:
    """Every layer: the indexer's picks against the float64 top-k, the new keys in the key
    cache, the attention against float64 over the picked positions (two bf16 ulps)."""
    new_slots = torch.tensor([step.slot(batch, b, p) for b, p in batch.token_positions()],
                             device=step.device)  # fmt: skip
    for layer, x in enumerate(inputs):
        positions = step.indexer(layer, metadata, x).clone()
        keys, scales = unpack_index_keys(step.idx_caches[layer], new_slots)
        assert torch.allclose(keys, x.k.float(), rtol=2**-3, atol=scales.max().item() * 2**-6)
        assert torch.equal(scales, torch.exp2(torch.log2(scales).round()))  # ue8m0 scales
        check_selection(positions, step.reference_logits(layer, batch, x), step.topk)
        out = step.attend(layer, metadata, x)
        ref = step.reference_attention(layer, batch, x, positions)
        assert out.shape == ref.shape and out.dtype == torch.bfloat16
        err = (out.double().cpu() - ref).abs().max().item()
        tol = 2 * 2**-8 * max(1.0, ref.abs().max().item())
        assert err <= tol, (layer, err, tol)


CASES = [
    # seq lens, new tokens per request; decode requests first (vLLM reorders the batch so)
    pytest.param((70, 5, 130, 64), (1, 1, 1, 1), id="decode"),
    pytest.param((200, 33, 9), (2, 2, 2), id="verify-next2"),
    pytest.param((60, 7, 90), (2, 1, 2), id="verify-uneven"),  # rows of 2 and 1 tokens
    pytest.param((150, 40, 97), (1, 40, 17), id="prefill-batch"),
    pytest.param((1, 3), (1, 3), id="short-prompts"),  # fewer tokens than top-k: -1 entries
]


@pytest.mark.parametrize("seq_lens, query_lens", CASES)
def test_dsa_step_matches_float64_reference(step, seq_lens, query_lens):
    batch = _batch(step, seq_lens, query_lens, seed=sum(seq_lens))
    step.write_batch(batch)
    metadata = step.metadata(batch)
    sparse = metadata[step.names[0]]
    assert type(sparse).__name__ == "FP8MLASparseMetadata"
    # vLLM sends every token, prefill too, to forward_mqa: no dense-MHA prefill backend
    assert step.layers[0].prefill_backend is None
    assert not step.layers[0]._use_sparse_mha(sparse)
    inputs = step.fill(batch, seed=len(seq_lens))
    _check_layers(step, batch, metadata, inputs)
    if max(seq_lens) < step.topk:
        assert (step.topk_buffer[: batch.tokens, max(seq_lens) :] == -1).all()


def test_triton_kernels_match_reference(vllm_env, engine_device, monkeypatch):
    """The same step with fp8mla's Triton kernels (interpreted on a CPU)."""
    monkeypatch.setenv(BACKEND_ENV, "triton")
    config = dsa_config(kv_cache_dtype="fp8_ds_mla", max_model_len=256)
    step = DsaStep(config, layers=1, num_blocks=12, device=engine_device)
    batch = _batch(step, (90, 20), (1, 5), seed=3)
    step.write_batch(batch)
    metadata = step.metadata(batch)
    _check_layers(step, batch, metadata, step.fill(batch, seed=4))


# -- registration and start-up refusals --
def test_flag_selects_sparse_backend_and_indexer(vllm_env):
    from vllm.config import CUDAGraphMode
    from vllm.config.attention import AttentionConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from fp8mla.integrations.vllm.indexer import FP8MLASparseAttnIndexer
    from fp8mla.integrations.vllm.sparse_backend import FP8MLASparseBackend

    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    flags = [
        "--model", "unused", "--attention-backend", "FP8MLA_SPARSE", "--kv-cache-dtype",
        "fp8_ds_mla", "--block-size", "64", "--hf-overrides",
        '{"architectures": ["DeepseekV3ForCausalLM"]}', "-cc.cudagraph_mode=FULL_DECODE_ONLY",
    ]  # fmt: skip
    engine_args = EngineArgs.from_cli_args(parser.parse_args(flags))  # the documented flags
    assert engine_args.hf_overrides == {"architectures": ["DeepseekV3ForCausalLM"]}
    assert engine_args.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_DECODE_ONLY
    assert (engine_args.kv_cache_dtype, engine_args.block_size) == ("fp8_ds_mla", 64)
    backend = AttentionConfig(backend=engine_args.attention_backend).backend
    assert backend.get_class() is FP8MLASparseBackend
    assert FP8MLASparseBackend.is_mla() and FP8MLASparseBackend.is_sparse()
    assert op_registry_oot["SparseAttnIndexer"] is FP8MLASparseAttnIndexer


def _reasons(**kw):
    from vllm.platforms.interface import DeviceCapability

    from fp8mla.integrations.vllm.sparse_backend import FP8MLASparseBackend

    base = dict(
        head_size=576, dtype=torch.bfloat16, kv_cache_dtype="fp8_ds_mla", block_size=64,
        use_mla=True, has_sink=False, use_sparse=True, use_mm_prefix=False,
        use_per_head_quant_scales=False, device_capability=DeviceCapability(8, 0),
        attn_type="decoder",
    )  # fmt: skip
    return FP8MLASparseBackend.validate_configuration(**{**base, **kw})


def test_capabilities_let_vllm_refuse_with_a_reason(vllm_env):
    from vllm.config import set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability

    from integrations.vllm_step import engine_config

    with set_current_vllm_config(dsa_config()):
        assert _reasons() == []
        assert _reasons(kv_cache_dtype="auto", dtype=torch.float16) == []
        assert _reasons(device_capability=DeviceCapability(12, 0)) == []
        fp8 = _reasons(kv_cache_dtype="fp8")
        assert "expected --kv-cache-dtype fp8_ds_mla (or auto for a 16-bit cache), got fp8" in (
            " ".join(fp8)
        )
        assert any("expected --block-size 64, got 16" in r for r in _reasons(block_size=16))
        assert "compute capability not supported" in _reasons(
            device_capability=DeviceCapability(7, 5)
        )
        assert "non-sparse not supported" in _reasons(use_sparse=False)
        assert "dtype not supported" in _reasons(dtype=torch.float32)
    with set_current_vllm_config(engine_config(backend="FP8MLA")):  # DeepSeek-V3: no indexer
        assert any("expected index_topk in the model's config, got none" in r for r in _reasons())


@pytest.mark.parametrize("breakable", [False, True], ids=["compiled", "breakable"])
def test_start_up_refuses_compiled_piecewise_graphs(vllm_env, breakable, monkeypatch):
    """Piecewise CUDA graphs would replay the indexer's capture-time launches with another
    step's metadata: refused, unless vLLM's breakable graphs run the op eagerly."""
    from vllm.config import CUDAGraphMode, set_current_vllm_config

    config = dsa_config()
    config.compilation_config.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE
    if hasattr(config.compilation_config, "use_breakable_cudagraph"):  # vLLM 0.34
        config.compilation_config.use_breakable_cudagraph = breakable
    monkeypatch.setenv("VLLM_USE_BREAKABLE_CUDAGRAPH", "1" if breakable else "0")
    buffer = torch.empty(8, vllm_dsa.TOPK, dtype=torch.int32)
    with set_current_vllm_config(config):
        idx = vllm_dsa.make_indexer(config, f"model.layers.{5 + breakable}.self_attn.indexer",
                                    buffer)  # fmt: skip
        prefix = f"model.layers.{5 + breakable}.self_attn.attn"
        if breakable:
            layer = vllm_dsa.make_mla(config, prefix, idx, buffer)
            assert type(layer.impl).__name__ == "FP8MLASparseImpl"
            return
        with pytest.raises(IntegrationConfigError) as err:
            vllm_dsa.make_mla(config, prefix, idx, buffer)
    msg = str(err.value)
    assert "\n" not in msg
    assert (
        "expected -cc.cudagraph_mode=FULL_DECODE_ONLY, VLLM_USE_BREAKABLE_CUDAGRAPH=1 or "
        "--enforce-eager, got FULL_AND_PIECEWISE" in msg
    )


def test_start_up_refuses_cuda_model_without_deepgemm(vllm_env, monkeypatch):
    """vLLM's CUDA DeepSeek-V3.2 model computes the top-k itself (DeepGEMM): without DeepGEMM
    the layer is refused, naming the option that selects the generic model."""
    from torch import nn
    from vllm.config import set_current_vllm_config

    from fp8mla.integrations.vllm import indexer as fp8mla_indexer

    class DeepseekV32Indexer(nn.Module):  # the CUDA model's indexer: not vLLM's generic one
        def __init__(self, topk_indices_buffer):
            super().__init__()
            self.topk_indices_buffer = topk_indices_buffer

    monkeypatch.setattr(fp8mla_indexer, "_parent_refuses", lambda: True)
    config = dsa_config()
    buffer = torch.empty(8, vllm_dsa.TOPK, dtype=torch.int32)
    idx = DeepseekV32Indexer(buffer)
    with set_current_vllm_config(config), pytest.raises(IntegrationConfigError) as err:
        vllm_dsa.make_mla(config, "model.layers.8.self_attn.attn", idx, buffer)
    assert 'expected --hf-overrides \'{"architectures": ["DeepseekV3ForCausalLM"]}\'' in str(
        err.value
    )
    assert "got DeepseekV32Indexer without DeepGEMM" in str(err.value)


def _impl(config, kv_cache_dtype="fp8_ds_mla"):
    from vllm.config import set_current_vllm_config

    from fp8mla.integrations.vllm.sparse_backend import FP8MLASparseImpl

    buffer = torch.empty(8, vllm_dsa.TOPK, dtype=torch.int32)
    with set_current_vllm_config(config):
        return FP8MLASparseImpl(
            16, 576, vllm_dsa.SCALE, 1, None, None, kv_cache_dtype, None, "decoder", None,
            q_lora_rank=64, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
            qk_head_dim=192, v_head_dim=128, kv_b_proj=None, topk_indices_buffer=buffer,
        )  # fmt: skip


def test_impl_refusals_name_the_option(vllm_env):
    from vllm.config.attention import HiSparseConfig

    with pytest.raises(IntegrationConfigError) as err:
        _impl(dsa_config(), kv_cache_dtype="fp8")
    assert "expected --kv-cache-dtype fp8_ds_mla (or auto for a 16-bit cache), got fp8" in str(
        err.value
    )
    config = dsa_config()
    config.attention_config.hisparse_config = HiSparseConfig()
    with pytest.raises(IntegrationConfigError, match="expected no HiSparse host-backed cache"):
        _impl(config)
    assert type(_impl(dsa_config())).__name__ == "FP8MLASparseImpl"  # the same, accepted


def test_indexer_stays_vllms_under_other_backends(vllm_env):
    """With another attention backend the replacement class is vLLM's indexer unchanged."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    config = dsa_config(backend="FLASHMLA_SPARSE")
    buffer = torch.empty(8, vllm_dsa.TOPK, dtype=torch.int32)
    with set_current_vllm_config(config):
        idx = vllm_dsa.make_indexer(config, "model.layers.9.self_attn.indexer", buffer)
    op = idx.indexer_op
    assert isinstance(op, SparseAttnIndexer) and not op.serves
    assert op.unserved == "another attention backend"
    assert op.topk_backend == config.kernel_config.sparse_indexer_topk_backend  # vLLM's init ran


# -- full CUDA graphs of uniform decode batches --
REPLAYS = [(5, 40, 17), (300, 1, 64, 129), (500,)]


@pytest.fixture
def plans(monkeypatch):
    """Counts ``SparseMLAWrapper.plan`` calls."""
    calls = []
    plan = SparseMLAWrapper.plan

    def counted(self, *args, **kwargs):
        calls.append(self)
        return plan(self, *args, **kwargs)

    monkeypatch.setattr(SparseMLAWrapper, "plan", counted)
    return calls


def _capture_batch(step: DsaStep, qlen: int, padded: int, seed: int) -> Batch:
    return _batch(step, [step.max_model_len] * padded, [qlen] * padded, seed)


def _replay_batch(step: DsaStep, seq_lens, qlen: int, seed: int) -> Batch:
    return _batch(step, [max(s, qlen) for s in seq_lens], [qlen] * len(seq_lens), seed)


def test_builder_declares_uniform_batch_graphs(step):
    from vllm.v1.attention.backend import AttentionCGSupport

    support = step.builder.get_cudagraph_support(step.config, step.groups[0].kv_cache_spec)
    assert support == AttentionCGSupport.UNIFORM_BATCH


@pytest.mark.parametrize("qlen", [1, 2], ids=["decode", "next2"])
def test_capture_once_replays_read_rewritten_buffers(step, qlen, plans):
    """One plan at capture; "replays" (the captured calls run again on the capture-time
    metadata after vLLM rewrites its buffers and the indexer its top-k) plan nothing and match
    the references. Requests the replay does not fill are padding (length 0, no tokens)."""
    padded = 4
    capture = _capture_batch(step, qlen, padded, seed=qlen)
    step.write_batch(capture, padded)
    meta = step.metadata(capture, padded, capture=True)
    sparse = meta[step.names[0]]
    wrapper, _ = sparse.planned
    assert wrapper._use_cuda_graph and len(plans) == 1
    assert all(meta[name] is sparse for name in step.names)
    for i, seq_lens in enumerate(REPLAYS):
        batch = _replay_batch(step, seq_lens, qlen, seed=10 * qlen + i)
        step.write_batch(batch, padded)
        step_meta = step.metadata(batch, padded)  # built every step, unread by a graph
        now = step_meta[step.names[0]]
        assert now.block_table.data_ptr() == sparse.block_table.data_ptr()
        assert now.req_id_per_token.data_ptr() == sparse.req_id_per_token.data_ptr()
        # the graph's calls use the capture batch's token count: pad the inputs as vLLM does
        inputs = step.fill(batch, seed=i)
        for x in inputs:
            for name in ("q_nope", "q_pe", "q8", "k", "weights"):
                t = getattr(x, name)
                pad = t.new_zeros(padded * qlen - t.shape[0], *t.shape[1:])
                setattr(x, name, torch.cat([t, pad]))
        real = batch.tokens
        for layer, x in enumerate(inputs):
            # the step's own metadata, eagerly: padded requests make its decode rows uneven
            eager = step.indexer(layer, step_meta, x)[:real].clone()
            positions = step.indexer(layer, meta, x)[:real].clone()
            assert torch.equal(positions, eager)
            x_real = vllm_dsa.LayerInputs(*(getattr(x, n)[:real] for n in
                                           ("q_nope", "q_pe", "q8", "k", "weights")))  # fmt: skip
            check_selection(positions, step.reference_logits(layer, batch, x_real), step.topk)
            out = step.attend(layer, meta, x)[:real]
            ref = step.reference_attention(layer, batch, x_real, positions)
            err = (out.double().cpu() - ref).abs().max().item()
            assert err <= 2 * 2**-8 * max(1.0, ref.abs().max().item()), (layer, err)
    assert len(plans) == 1


@pytest.mark.gpu
def test_cuda_graph_replays_match_reference(vllm_env, engine_device):
    """A real CUDA graph of both layers' indexer and attention, replayed with new lengths,
    pages and keys."""
    assert engine_device == "cuda"
    step = DsaStep(dsa_config(), layers=2, num_blocks=40, device="cuda")
    padded, qlen = 4, 1
    capture = _capture_batch(step, qlen, padded, seed=1)
    step.write_batch(capture, padded)
    meta = step.metadata(capture, padded, capture=True)
    inputs = step.fill(capture, seed=2)

    def forward():
        return [(step.indexer(i, meta, x), step.attend(i, meta, x)) for i, x in
                enumerate(inputs)]  # fmt: skip

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward()  # warm-up: kernel compilation outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = forward()
    for i, seq_lens in enumerate(REPLAYS):
        batch = _replay_batch(step, list(seq_lens) + [qlen] * (padded - len(seq_lens)), qlen,
                              seed=20 + i)  # fmt: skip
        step.write_batch(batch, padded)
        step.metadata(batch, padded)  # vLLM builds every step: its buffers, read by the graph
        fresh = step.fill(batch, seed=30 + i)
        for x, y in zip(inputs, fresh):
            for name in ("q_nope", "q_pe", "q8", "k", "weights"):
                getattr(x, name).copy_(getattr(y, name))
        graph.replay()
        torch.cuda.synchronize()
        for layer, (positions, out) in enumerate(outs):
            check_selection(positions.clone(), step.reference_logits(layer, batch, inputs[layer]),
                            step.topk)  # fmt: skip
            ref = step.reference_attention(layer, batch, inputs[layer], positions.clone())
            err = (out.double().cpu() - ref).abs().max().item()
            assert err <= 2 * 2**-8 * max(1.0, ref.abs().max().item()), (layer, err)


def test_indexer_is_one_opaque_op_under_torch_compile(step):
    """vLLM compiles the model with ``fullgraph=True``: the indexer must trace as one custom
    op (its per-step metadata stays out of the graph) and compute what the eager call does."""
    from vllm.forward_context import set_forward_context

    batch = _batch(step, (80, 20), (1, 12), seed=11)
    step.write_batch(batch)
    metadata = step.metadata(batch)
    x = step.fill(batch, seed=12)[0]
    eager = step.indexer(0, metadata, x).clone()
    op = step.indexers[0].indexer_op
    hidden = torch.zeros(batch.tokens, 256, dtype=torch.bfloat16, device=step.device)
    step.topk_buffer.fill_(7)
    compiled = torch.compile(op, backend="eager", fullgraph=True, dynamic=False)
    with set_forward_context(metadata, step.config, slot_mapping=step.slot_mappings(batch.tokens)):
        out = compiled(hidden, x.q8, x.k, x.weights)
    assert torch.equal(out[: batch.tokens], eager)
