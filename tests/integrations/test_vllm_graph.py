"""vLLM full CUDA graphs through fp8mla's backend, on vLLM's capture path (``vllm_step.py``).

vLLM captures a uniform decode batch once, with the metadata of the builder's
``build_for_cudagraph_capture``, then replays it every step after rewriting its persistent
block table and sequence lengths in place (and building that step's metadata, which the graph
never reads). On a CPU the "replay" is the captured forward run again from the capture-time
metadata with no plan in between, which is what a graph replays; on a GPU
(``test_cuda_graph_replays_match_reference``) it is a real ``torch.cuda.CUDAGraph``. Each
replay changes lengths and pages (longer and shorter than at capture, padded requests) and is
compared with fp8mla's float64 reference.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm not installed (run make test)")
torch = pytest.importorskip("torch")

from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper  # noqa: E402
from fp8mla.integrations import BACKEND_ENV  # noqa: E402
from integrations import vllm_step  # noqa: E402

# (kv cache dtype, block size); one vLLM configuration each (module-scoped)
CONFIGS = [("fp8", 16), ("auto", 64)]
# replays of one captured shape: seq lens of the real requests (the rest are padding)
REPLAYS = [(5, 40, 17), (70, 1, 33, 128), (200,)]


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: f"{c[0]}-b{c[1]}")
def step(request, engine_device):
    from fp8mla.integrations.vllm import register

    register()
    kv_dtype, block = request.param
    config = vllm_step.engine_config(
        backend="FP8MLA", kv_cache_dtype=kv_dtype, block_size=block, max_model_len=256,
        max_num_seqs=8, speculative_tokens=2,
    )  # fmt: skip
    return vllm_step.VllmStep(config, layers=2, num_blocks=96, device=engine_device)


@pytest.fixture
def plans(monkeypatch):
    """Counts ``BatchMLAPagedAttentionWrapper.plan`` calls."""
    calls = []
    plan = BatchMLAPagedAttentionWrapper.plan

    def counted(self, *args, **kwargs):
        calls.append(self)
        return plan(self, *args, **kwargs)

    monkeypatch.setattr(BatchMLAPagedAttentionWrapper, "plan", counted)
    return calls


def test_builder_declares_uniform_batch_graphs(step):
    from vllm.v1.attention.backend import AttentionCGSupport

    support = step.builder.get_cudagraph_support(step.config, step.group.kv_cache_spec)
    assert support == AttentionCGSupport.UNIFORM_BATCH
    assert type(step.builder).__name__ == "FP8MLAMetadataBuilder"


def _check(step, outs, q, batch, tol_ulps=2):
    n = len(batch.seq_lens) * batch.qlen
    for layer, out in enumerate(outs):
        ref = step.reference(q, batch, layer)
        err = (out[:n].double().cpu() - ref).abs().max().item()
        tol = tol_ulps * 2**-8 * max(1.0, ref.abs().max().item())  # bf16 ulps of the output
        assert err <= tol, (layer, err, tol)


@pytest.mark.parametrize("qlen", [1, 3], ids=["decode", "verify"])
def test_capture_once_replays_read_rewritten_tables(step, qlen, plans, monkeypatch):
    """One plan at capture; replays after vLLM rewrites tables and lengths plan nothing and
    match the reference (the PyTorch path on a CPU, the kernels on a GPU)."""
    _capture_and_replay(step, qlen, "auto", plans, monkeypatch)


@pytest.mark.parametrize("step", [CONFIGS[0]], indirect=True, ids=lambda c: f"{c[0]}-b{c[1]}")
def test_capture_once_replays_triton_kernels(step, plans, monkeypatch):
    """The same with the Triton kernels (interpreted on a CPU: one configuration)."""
    _capture_and_replay(step, 1, "triton", plans, monkeypatch)


def _capture_and_replay(step, qlen, kernel, plans, monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, kernel)
    padded = 4
    gen = torch.Generator().manual_seed(qlen)
    capture = vllm_step.random_batch(step, [qlen] * padded, qlen, gen)
    step.write_batch(capture, padded)
    meta = step.metadata(capture, padded, capture=True)
    assert len(plans) == 1  # the builder planned the captured shape, once for every layer
    decode = meta[step.names[0]].decode
    wrapper = decode.planned[0]
    assert wrapper._use_cuda_graph
    assert all(meta[name] is meta[step.names[0]] for name in step.names)
    q = vllm_step.random_queries(step, padded * qlen, gen)
    step.forward(q, meta)  # the captured forward
    for seq_lens in REPLAYS:
        seq_lens = tuple(max(s, qlen) for s in seq_lens)
        batch = vllm_step.random_batch(step, list(seq_lens), qlen, gen)
        step.write_batch(batch, padded)
        # the replay step's metadata (built by vLLM every step, unread by the graph) plans
        # nothing and points at the same persistent buffers
        now = step.metadata(batch, padded, capture=False)[step.names[0]].decode
        assert now.block_table.data_ptr() == decode.block_table.data_ptr()
        assert now.seq_lens.data_ptr() == decode.seq_lens.data_ptr()
        q.copy_(vllm_step.random_queries(step, padded * qlen, gen))
        _check(step, step.forward(q, meta), q, batch)
    assert len(plans) == 1


def test_graph_plan_once_per_shape(step, plans):
    gen = torch.Generator().manual_seed(5)
    first = {}
    for n, qlen in [(2, 1), (4, 1), (2, 2), (2, 1)]:
        batch = vllm_step.random_batch(step, [qlen] * n, qlen, gen)
        step.write_batch(batch, n)
        decode = step.metadata(batch, n, capture=True)[step.names[0]].decode
        wrapper = decode.planned[0]
        assert first.setdefault((n, qlen), wrapper) is wrapper
    assert len(plans) <= 3  # (2, 1) again reuses its plan
    workspaces = {w._workspace.data_ptr() for w in first.values()}
    assert len(workspaces) == 1  # one workspace for every captured shape


@pytest.mark.gpu
@pytest.mark.parametrize("qlen", [1, 2], ids=["decode", "verify"])
def test_cuda_graph_replays_match_reference(step, qlen, engine_device):
    """A real CUDA graph of both layers' forward, replayed with new lengths and tables."""
    assert engine_device == "cuda"
    padded = 4
    gen = torch.Generator().manual_seed(10 + qlen)
    capture = vllm_step.random_batch(step, [qlen] * padded, qlen, gen)
    step.write_batch(capture, padded)
    meta = step.metadata(capture, padded, capture=True)
    q = vllm_step.random_queries(step, padded * qlen, gen)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step.forward(q, meta)  # warm-up: kernel compilation outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step.forward(q, meta)
    for seq_lens in REPLAYS:
        batch = vllm_step.random_batch(step, [max(s, qlen) for s in seq_lens], qlen, gen)
        step.write_batch(batch, padded)
        step.metadata(batch, padded, capture=False)
        q.copy_(vllm_step.random_queries(step, padded * qlen, gen))
        graph.replay()
        torch.cuda.synchronize()
        _check(step, outs, q, batch)


def test_fp8_queries_capture_and_replay(monkeypatch, plans, engine_device):
    """``FP8MLA_FP8_QUERIES=1`` with an e4m3 cache: every layer declares vLLM's
    ``supports_quant_query_input``, the captured plan takes e4m3 queries and writes the model's
    dtype, and replays after new queries, tables and a new ``_q_scale`` (read on the device)
    match float64 on ``q × _q_scale``, with one plan."""
    from fp8mla.integrations import FP8_QUERIES_ENV
    from fp8mla.integrations.vllm import register

    monkeypatch.setenv(FP8_QUERIES_ENV, "1")
    register()
    config = vllm_step.engine_config(
        backend="FP8MLA", kv_cache_dtype="fp8", block_size=16, max_model_len=256, max_num_seqs=8
    )
    st = vllm_step.VllmStep(config, layers=2, num_blocks=96, device=engine_device)
    assert all(layer.impl.supports_quant_query_input for layer in st.layers)
    padded, gen, e4m3 = 4, torch.Generator().manual_seed(21), torch.float8_e4m3fn
    capture = vllm_step.random_batch(st, [1] * padded, 1, gen)
    st.write_batch(capture, padded)
    meta = st.metadata(capture, padded, capture=True)
    assert meta[st.names[0]].decode.planned[1][2] == e4m3 and len(plans) == 1

    def quantized(scale):  # what vLLM's _decode_concat_quant_fp8_op hands the layer
        for layer in st.layers:
            layer._q_scale.fill_(scale)
        q = vllm_step.random_queries(st, padded, gen).float()
        return (q / scale).clamp(-448, 448).to(e4m3)

    q8 = quantized(0.01)
    st.forward(q8, meta)  # the captured forward
    for seq_lens, scale in zip(REPLAYS, (0.01, 0.02, 0.005)):
        batch = vllm_step.random_batch(st, list(seq_lens), 1, gen)
        st.write_batch(batch, padded)
        q8.copy_(quantized(scale))
        outs = st.forward(q8, meta)
        assert outs[0].dtype == config.model_config.dtype
        _check(st, outs, q8.float() * scale, batch)
    assert len(plans) == 1
