"""SGLang's DeepSeek Sparse Attention (DSA) layer through fp8mla, driven by SGLang's own classes.

SGLang's attention kit (``sglang/test/kits/attention_unittest/attention_methods/
dsa_attention.py``) builds a real ``ModelRunner`` subclass, ``ReqToTokenPool``,
``DSATokenToKVPool`` (the 656-byte FP8 rows SGLang's own quantizer writes, or bf16 rows),
``ForwardBatch`` and ``RadixAttention`` with MLA's real dims (512 + 64), pages shuffled within
each request; the backend comes from ``ATTENTION_BACKENDS["fp8mla"]`` after
``load_plugins()``, the indexer is SGLang's ``Indexer`` with fp8mla's hooks applied, its key
cache written by SGLang's ``act_quant`` and ``set_index_k_scale_buffer``. Requests sit in reversed rows of
``req_to_token``, so a token's request row is never its batch index.

Every output is checked against float64 references computed here from the same cache bytes:
``fp8mla.dsa.reference.sparse_mla_reference`` over the slots of the chosen positions (mapped
here by plain indexing of ``req_to_token``) and ``fp8mla.dsa.indexer_reference`` for the
indexer's scores. Kernels: ``auto`` (the PyTorch path on a CPU, Triton on CUDA) and ``triton``
(interpreted on a CPU).
"""

from __future__ import annotations

import unittest
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang", reason="sglang not installed (run make test)")
torch = pytest.importorskip("torch")

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()  # what every SGLang process does: registers fp8mla and applies its hooks

from sglang.kernels.ops.quantization.act_quant_triton import act_quant  # noqa: E402
from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.model_executor.forward_context import (  # noqa: E402
    ForwardContext,
    forward_context,
)
from sglang.test.kits.attention_unittest.attention_methods import (  # noqa: E402
    dsa_attention as kit,
)
from sglang.test.kits.attention_unittest.runner_modes import (  # noqa: E402
    cuda_graph_decode_runner as kit_graph,
)

from fp8mla.dsa import indexer_reference as R  # noqa: E402
from fp8mla.dsa.reference import sparse_mla_reference  # noqa: E402
from fp8mla.integrations import BACKEND_ENV  # noqa: E402
from fp8mla.integrations.sglang.dsa_config import indexer_without_deepgemm  # noqa: E402
from fp8mla.integrations.sglang.dsa_indexer import FP8MLAIndexerMetadata  # noqa: E402
from fp8mla.testing import rel_err  # noqa: E402

KERNELS = ("auto", "triton")
OUT_TOL = 3e-3  # relative (‖·‖₂) error of bf16 attention against float64 on the same bytes
TIE = 1e-5  # indexer scores this close (× the row's largest |score|) to the k-th are ties
INDEX_HEADS = 8
ROPE_SCALING = {"rope_type": "deepseek_yarn", "factor": 40,
                "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                "mscale": 1.0, "mscale_all_dim": 1.0}  # fmt: skip


def dsa_case(name, mode, prefix_lens, extend_lens=(), heads=16):
    return kit.DSAAttentionCase(
        name=name,
        backend="fp8mla",
        forward_mode=mode,
        num_heads=heads,
        num_kv_heads=1,
        page_size=kit.DSA_PAGE_SIZE,
        prefix_lens=prefix_lens,
        extend_lens=extend_lens,
    )


def build(case, *, fp8=True, topk=128, pattern="trailing", device="cpu"):
    """The kit's sparse fixture on fp8mla's backend; the requests moved to reversed rows of
    ``req_to_token`` (the pool's bytes do not move)."""
    max_ctx = -(-max(case.seq_lens) // 64) * 64 + 64
    fx = kit.build_dsa_sparse_attention_fixture(
        unittest.TestCase(), case, max_context_len=max_ctx, device=device, fp8_kv_cache=fp8,
        index_topk=topk, index_pattern=pattern,
    )  # fmt: skip
    assert type(fx.backend).__name__ == "FP8MLADSABackend"
    bs = case.batch_size
    table = fx.runner.req_to_token_pool.req_to_token
    table[:bs] = table[:bs].flip(0).clone()
    fx.forward_batch.req_pool_indices = torch.arange(bs, device=device).flip(0).to(torch.int32)
    return fx


def token_requests(case) -> list[int]:
    return [b for b, n in enumerate(case.input_lens) for _ in range(n)]


def slots_of(fx, positions: torch.Tensor) -> torch.Tensor:
    """Request-relative ``positions [T, k]`` to KV slots, the test's own way: each token's
    request row of ``req_to_token``, -1 kept."""
    fb = fx.forward_batch
    rows = fb.req_pool_indices.long()[token_requests(fx.case)]
    table = fx.runner.req_to_token_pool.req_to_token
    pos = positions[: len(rows)].long()
    slots = table[rows[:, None], pos.clamp_min(0)]
    return torch.where(pos >= 0, slots, -1).to(torch.int32)


def attend(fx, topk_indices: torch.Tensor):
    """One layer's attention through SGLang's ``RadixAttention`` (the backend writes the new
    tokens' K first): ``(out [T, H, 512], q_nope [T, H, 512], q_pe [T, H, 64])``."""
    m = fx.actual_module
    q_nope, q_rope = m.project_q(fx.input_hidden)
    k_nope, k_rope = m.project_k(fx.input_hidden)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=fx.backend)):
        fx.backend.init_forward_metadata(fx.forward_batch)
        out = m.attn(q_nope, k_nope, k_nope, fx.forward_batch, k_rope=k_rope, q_rope=q_rope,
                     topk_indices=topk_indices)  # fmt: skip
    h = fx.case.num_heads
    return out.view(-1, h, 512), q_nope.view(-1, h, 512), q_rope.view(-1, h, 64)


def check_attention(fx, out, q_nope, q_pe, positions) -> None:
    """``out`` against float64 attention over the pool's bytes at the slots of ``positions``."""
    pool = fx.runner.token_to_kv_pool.get_key_buffer(0)
    slots = slots_of(fx, positions)
    ref, lse = sparse_mla_reference(q_nope, q_pe, pool, slots, fx.actual_module.attn.scaling)
    live = torch.isfinite(lse[:, 0])
    assert (out[~live] == 0).all(), "a token with no position must attend to nothing"
    assert live.any()
    assert rel_err(out[live].float(), ref[live]) <= OUT_TOL


# -- attention over given positions: SGLang's kit cases ------------------------------------
CASES = (
    dsa_case("decode_strided_short_request", ForwardMode.DECODE, (70, 5, 130)),
    dsa_case("decode_page_edges", ForwardMode.DECODE, (63, 64, 200)),
    dsa_case("extend_over_prefixes", ForwardMode.EXTEND, (70, 0, 127), (5, 64, 2)),
    dsa_case("extend_no_prefix", ForwardMode.EXTEND, (0,), (17,), heads=4),
)
PATTERNS = {"decode_strided_short_request": "strided", "decode_page_edges": "head_tail"}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fp8", [True, False], ids=["fp8_pool", "bf16_pool"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_attention_matches_float64_on_the_pool(case, fp8, kernel, monkeypatch, engine_device):
    """Decode and prefill/extend batches, the kit's index rows (trailing, strided, head+tail;
    -1 padded where a request has fewer positions than top-k) against float64 on the pool's
    bytes, and the whole layer (``o_proj`` included) against the kit's own reference."""
    monkeypatch.setenv(BACKEND_ENV, kernel)
    fx = build(case, fp8=fp8, pattern=PATTERNS.get(case.name, "trailing"), device=engine_device)
    pool = fx.runner.token_to_kv_pool.get_key_buffer(0)
    assert pool.shape[1:] == ((1, 656) if fp8 else (1, 576))
    out, q_nope, q_pe = attend(fx, fx.topk_indices)
    assert out.dtype == torch.bfloat16
    check_attention(fx, out, q_nope, q_pe, fx.topk_indices)
    layer = fx.actual_module.o_proj(out.reshape(out.shape[0], -1))
    atol = kit.DSA_SPARSE_FP8_ATOL if fp8 else kit.DSA_SPARSE_ATOL
    torch.testing.assert_close(layer.float(), kit.expected_dsa_sparse_fixture_output(fx).float(),
                               atol=atol, rtol=atol)  # fmt: skip


@pytest.mark.parametrize("kernel", KERNELS)
def test_minus_one_holes_and_empty_rows(kernel, monkeypatch, engine_device):
    """-1 anywhere in a row lists nothing; a row of -1 only attends to nothing (output 0)."""
    monkeypatch.setenv(BACKEND_ENV, kernel)
    case = dsa_case("decode_holes", ForwardMode.DECODE, (90, 40, 7), heads=8)
    fx = build(case, topk=64, device=engine_device)
    g = torch.Generator().manual_seed(3)
    rows = []
    for n in case.seq_lens:
        pos = torch.randperm(n, generator=g)[:64]
        row = torch.full((64,), -1, dtype=torch.int32)
        row[: pos.numel()] = pos.to(torch.int32)
        rows.append(row[torch.randperm(64, generator=g)])  # -1 scattered through the row
    idx = torch.stack(rows)
    idx[1] = -1  # request 1 attends to nothing
    idx = idx.to(engine_device)
    out, q_nope, q_pe = attend(fx, idx)
    assert (out[1] == 0).all()
    check_attention(fx, out, q_nope, q_pe, idx)


# -- the indexer: SGLang's Indexer with fp8mla's hooks --------------------------------------
def make_indexer(topk: int, *, init_tokens: int = 0, local_tokens: int = 0) -> Indexer:
    if torch.cuda.is_available():  # the Indexer reads its SM count on CUDA only
        indexer_without_deepgemm()  # as fp8mla's start-up hook does where DeepGEMM is absent
    config = SimpleNamespace(index_init_tokens=init_tokens, index_local_tokens=local_tokens)
    return Indexer(hidden_size=64, index_n_heads=INDEX_HEADS, index_head_dim=128,
                   rope_head_dim=64, index_topk=topk, q_lora_rank=32,
                   max_position_embeddings=4096, rope_theta=10000.0, layer_id=0,
                   scale_fmt="ue8m0", block_size=128, rope_scaling=ROPE_SCALING,
                   config=config)  # fmt: skip


def write_index_keys(fx, seed: int) -> None:
    """Every token's indexer key (prefix and new ones) through SGLang's writer: ``act_quant``
    (ue8m0 scales) and the pool's ``set_index_k_scale_buffer`` into its 132-byte key cache
    (``Indexer._store_index_k_cache`` off CUDA; on CUDA it takes a fused JIT kernel of SGLang
    with the same bytes)."""
    g = torch.Generator().manual_seed(seed)
    table = fx.runner.req_to_token_pool.req_to_token
    rows = fx.forward_batch.req_pool_indices.long()
    locs = torch.cat([table[rows[b], :n] for b, n in enumerate(fx.case.seq_lens)])
    key = torch.randn(locs.numel(), 128, generator=g).to(table.device, torch.bfloat16)
    k_fp8, k_scale = act_quant(key, 128, "ue8m0")
    fx.runner.token_to_kv_pool.set_index_k_scale_buffer(
        layer_id=0, loc=locs, index_k=k_fp8, index_k_scale=k_scale
    )


def index_queries(tokens: int, seed: int, device):
    """e4m3 queries and their weights as SGLang's indexer hands them over: act_quant codes,
    ``weights_proj · H^-0.5 · q_scale · 128^-0.5`` as ``[T, H, 1]`` float32."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, INDEX_HEADS, 128, generator=g).to(device, torch.bfloat16)
    q_fp8, q_scale = act_quant(q, 128, "ue8m0")
    gate = torch.randn(tokens, INDEX_HEADS, generator=g).to(device)
    weights = gate[..., None] * INDEX_HEADS**-0.5 * q_scale * 128**-0.5
    return q_fp8, weights


def float64_scores(fx, q_fp8, weights) -> torch.Tensor:
    """``[T, max_len]`` float64 indexer scores of every token over its request's positions
    (-inf past its causal length), from the pool's key-cache bytes."""
    case, fb = fx.case, fx.forward_batch
    table = fx.runner.req_to_token_pool.req_to_token
    reqs = token_requests(case)
    if case.forward_mode.is_decode():  # the batch's lengths (a graph replay changes them)
        lens = fb.seq_lens_cpu.tolist()
    else:  # token j of a request with prefix p sees p + j + 1 positions
        lens = [p + j + 1 for p, n in zip(case.prefix_lens, case.input_lens) for j in range(n)]
    width = -(-max(lens) // 64) * 64
    cols = torch.arange(0, width, 64, device=table.device)
    pages = table[fb.req_pool_indices.long()[reqs][:, None], cols[None, :]] // 64
    cache = fx.runner.token_to_kv_pool.get_index_k_with_scale_buffer(0)
    return R.paged_mqa_logits_reference(
        q_fp8[: len(reqs), None], weights[: len(reqs), :, 0], cache, pages.to(torch.int32),
        torch.tensor(lens, dtype=torch.int32, device=table.device), width, page_size=64,
    )  # fmt: skip


def check_selection(got: torch.Tensor, scores: torch.Tensor, k: int, forced=()) -> None:
    """``got [T, k]`` (ascending, -1 padded) against the float64 top-k of each row of
    ``scores``: the same set but for ties within ``TIE`` × the row's largest |score| of the
    k-th score; ``forced`` positions (always kept) must be in every row that sees them."""
    for t in range(scores.shape[0]):
        row = scores[t].cpu()
        seen = torch.isfinite(row).nonzero().flatten()
        chosen = got[t][got[t] >= 0].cpu().long()
        assert chosen.numel() == min(k, seen.numel()), t
        assert torch.equal(chosen, chosen.sort().values), "positions must ascend"
        assert (got[t, chosen.numel() :] == -1).all(), "padding must be -1, at the end"
        assert torch.isfinite(row[chosen]).all(), "a position the token does not see"
        keep = [p for p in forced if p < seen.numel()]
        assert set(keep) <= set(chosen.tolist())
        free = seen[~torch.isin(seen, torch.tensor(keep, dtype=torch.long))]
        rest = [p for p in chosen.tolist() if p not in keep]
        want = free[torch.sort(row[free], descending=True, stable=True).indices[: len(rest)]]
        if len(rest) < free.numel():
            kth, band = row[want[-1]], TIE * float(row[seen].abs().max())
            for p in set(want.tolist()) ^ set(rest):
                assert abs(float(row[p] - kth)) <= band, f"token {t}: position {p} is no tie"
        else:
            assert set(want.tolist()) == set(rest)


INDEXER_CASES = (
    dsa_case("decode", ForwardMode.DECODE, (70, 5, 130)),
    dsa_case("extend", ForwardMode.EXTEND, (40, 0), (3, 20)),
)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", INDEXER_CASES, ids=lambda c: c.name)
def test_indexer_then_attention(case, kernel, monkeypatch, engine_device):
    """SGLang's ``Indexer._get_topk_paged`` (decode) / ``_get_topk_ragged`` (prefill), hooked:
    its top-k over the key cache SGLang wrote is the float64 top-k (ties aside), -1 past a
    token's causal length; the attention over those positions matches float64."""
    monkeypatch.setenv(BACKEND_ENV, kernel)
    topk = 32
    fx = build(case, topk=topk, device=engine_device)
    indexer = make_indexer(topk)
    write_index_keys(fx, seed=1)
    q_fp8, weights = index_queries(case.num_input_tokens, seed=2, device=engine_device)
    backend, fb = fx.backend, fx.forward_batch
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        backend.init_forward_metadata(fb)
        meta = backend.get_indexer_metadata(0, fb)
        assert isinstance(meta, FP8MLAIndexerMetadata)
        if case.forward_mode.is_decode():
            got = indexer._get_topk_paged(fb, 0, q_fp8, weights, meta)
        else:
            got = indexer._get_topk_ragged(False, fb, 0, q_fp8, weights, meta)
    assert got.shape == (case.num_input_tokens, topk) and got.dtype == torch.int32
    check_selection(got, float64_scores(fx, q_fp8, weights), topk)
    out, q_nope, q_pe = attend(fx, got)
    check_attention(fx, out, q_nope, q_pe, got)


def test_indexer_keeps_init_and_local_tokens(monkeypatch, engine_device):
    """Models with ``index_init_tokens`` / ``index_local_tokens`` always keep those positions
    (SGLang's ``_mask_init_and_local_tokens`` on fp8mla's logits)."""
    monkeypatch.setenv(BACKEND_ENV, "triton")
    case = dsa_case("decode_masked", ForwardMode.DECODE, (150, 3))
    fx = build(case, topk=16, device=engine_device)
    indexer = make_indexer(16, init_tokens=2, local_tokens=3)
    write_index_keys(fx, seed=4)
    q_fp8, weights = index_queries(2, seed=5, device=engine_device)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=fx.backend)):
        fx.backend.init_forward_metadata(fx.forward_batch)
        meta = fx.backend.get_indexer_metadata(0, fx.forward_batch)
        got = indexer._get_topk_paged(fx.forward_batch, 0, q_fp8, weights, meta)
    scores = float64_scores(fx, q_fp8, weights)
    n = case.seq_lens[0]
    check_selection(got[:1], scores[:1], 16, forced=(0, 1, n - 3, n - 2, n - 1))
    assert got[1].tolist() == [0, 1, 2, 3] + [-1] * 12  # 4 positions: every one


def test_indexer_rows_past_the_batch_and_split_op_output(engine_device):
    """Query rows past the batch's tokens (SGLang pads) get -1; a preallocated ``topk_result``
    (SGLang's prefill graph split op) is filled in place."""
    case = dsa_case("extend_padded", ForwardMode.EXTEND, (30,), (4,), heads=4)
    fx = build(case, topk=8, device=engine_device)
    indexer = make_indexer(8)
    write_index_keys(fx, seed=6)
    q_fp8, weights = index_queries(7, seed=7, device=engine_device)  # 3 padding rows
    result = torch.full((7, 8), 123, dtype=torch.int32, device=engine_device)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=fx.backend)):
        fx.backend.init_forward_metadata(fx.forward_batch)
        meta = fx.backend.get_indexer_metadata(0, fx.forward_batch)
        padded = indexer._get_topk_ragged(False, fx.forward_batch, 0, q_fp8, weights, meta)
        filled = indexer._get_topk_ragged(False, fx.forward_batch, 0, q_fp8, weights, meta,
                                          result)  # fmt: skip
    assert filled is result and torch.equal(result[:4], padded[:4])
    assert (padded[4:] == -1).all() and (result[4:] == 123).all()
    check_selection(padded[:4], float64_scores(fx, q_fp8, weights), 8)


def test_short_prefill_topk_transform_selects_every_position(engine_device):
    """Where every token sees at most top-k positions SGLang's indexer skips the logits and
    asks the metadata for the top-k of zero logits: every position, in order, then -1."""
    case = dsa_case("extend_short", ForwardMode.EXTEND, (5, 0), (2, 3), heads=4)
    fx = build(case, topk=16, device=engine_device)
    fx.backend.init_forward_metadata(fx.forward_batch)
    meta = fx.backend.get_indexer_metadata(0, fx.forward_batch)
    assert meta.get_seqlens_expanded().tolist() == [6, 7, 1, 2, 3]
    got = meta.topk_transform(torch.zeros(5, 16, device=engine_device), 16)
    for t, n in enumerate([6, 7, 1, 2, 3]):
        assert got[t].tolist() == list(range(n)) + [-1] * (16 - n)
    with pytest.raises(ValueError, match="ragged-layout arguments"):
        meta.topk_transform(torch.zeros(5, 16, device=engine_device), 16,
                            ks=torch.zeros(5, dtype=torch.int32))  # fmt: skip
    with pytest.raises(ValueError, match="positions"):
        meta.topk_transform(torch.zeros(5, 4, device=engine_device), 4)


def test_metadata_page_tables(engine_device):
    """The indexer's page tables are SGLang's ``real_page_table`` and ``page_table_1``: the
    requests' rows of ``req_to_token`` at page granularity and token granularity."""
    case = dsa_case("extend_tables", ForwardMode.EXTEND, (70, 0), (3, 66), heads=4)
    fx = build(case, device=engine_device)
    fx.backend.init_forward_metadata(fx.forward_batch)
    meta = fx.backend.get_indexer_metadata(0, fx.forward_batch)
    table = fx.runner.req_to_token_pool.req_to_token
    rows = fx.forward_batch.req_pool_indices.long()
    assert torch.equal(meta.get_page_table_1(), table[rows, :128])
    assert torch.equal(meta.get_page_table_64(), (table[rows, :128:64] // 64).to(torch.int32))
    assert meta.get_seqlens_int32().tolist() == [73, 66]


# -- CUDA graphs (decode) -----------------------------------------------------------------
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("fp8", [True, False], ids=["fp8_pool", "bf16_pool"])
def test_kit_cuda_graph_decode(fp8, kernel, monkeypatch, engine_device):
    """SGLang kit's capture/replay flow: ``init_cuda_graph_state``, capture metadata and
    forward, then replay metadata for new requests and inputs, against the kit's reference."""
    monkeypatch.setenv(BACKEND_ENV, kernel)
    case = dsa_case("graph_decode", ForwardMode.DECODE, (70, 130, 64), heads=16)
    kit_graph.run_dsa_sparse_cuda_graph_decode_case(
        unittest.TestCase(), case, dtype=torch.bfloat16, device=engine_device, fp8_kv_cache=fp8
    )


def move_requests_back(fx, lens: list[int]) -> None:
    """The next batch of a decode graph: the requests back in rows ``0..B-1`` of
    ``req_to_token`` (so every row id changes) with ``lens`` tokens, the last one new."""
    fb, bs = fx.forward_batch, len(lens)
    table = fx.runner.req_to_token_pool.req_to_token
    table[:bs] = table[:bs].flip(0).clone()
    dev = fb.seq_lens.device
    fb.req_pool_indices = torch.arange(bs, dtype=torch.int32, device=dev)
    fb.seq_lens = torch.tensor(lens, dtype=torch.int32, device=dev)
    fb.seq_lens_cpu = torch.tensor(lens, dtype=torch.int32)
    fb.out_cache_loc = table[torch.arange(bs, device=dev), fb.seq_lens.long() - 1].long()


def test_graph_replay_reads_static_buffers(monkeypatch, engine_device):
    """Decode under graph mode: one wrapper per captured batch size, planned once at capture;
    the next batch (new request rows, a shorter request, new queries, K and index rows) is
    written into the same buffers (same addresses) and the output follows it, against float64
    on the pool."""
    monkeypatch.setenv(BACKEND_ENV, "triton")
    case = dsa_case("graph_static", ForwardMode.DECODE, (70, 130), heads=8)
    fx = build(case, topk=64, pattern="strided", device=engine_device)
    backend, fb, m = fx.backend, fx.forward_batch, fx.actual_module
    backend.init_cuda_graph_state(max_bs=4, max_num_tokens=4)
    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    captured = backend.forward_metadata
    q_nope, q_rope = m.project_q(fx.input_hidden)
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        m.attn(q_nope, None, None, fb, q_rope=q_rope, save_kv_cache=False,
               topk_indices=fx.topk_indices)  # fmt: skip
        plan = captured.wrapper.launch_plan
        assert plan is not None
        move_requests_back(fx, [71, 121])
        backend.init_forward_metadata_out_graph(fb)
        replay = backend.forward_metadata
        assert replay.wrapper is captured.wrapper
        for name in ("block_table", "token_len", "req_rows"):
            assert (
                getattr(replay.batch, name).data_ptr() == getattr(captured.batch, name).data_ptr()
            )
        assert replay.batch.token_len.tolist() == [71, 121]
        assert replay.batch.req_rows.tolist() == [0, 1]
        g = torch.Generator().manual_seed(9)
        idx = torch.stack([torch.randperm(n, generator=g)[:64] for n in (71, 121)])
        idx = idx.to(torch.int32).to(engine_device)
        q_nope = torch.randn(q_nope.shape, generator=g).to(q_nope)
        k_nope, k_rope = m.project_k(torch.randn_like(fx.input_hidden))
        out = m.attn(q_nope, k_nope, k_nope, fb, k_rope=k_rope, q_rope=q_rope, topk_indices=idx)
    assert captured.wrapper.launch_plan is plan  # planning again only checked the fit
    check_attention(fx, out.view(2, 8, 512), q_nope.view(2, 8, 512), q_rope.view(2, 8, 64), idx)


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay_on_gpu(monkeypatch):
    """A real ``torch.cuda.CUDAGraph``: the indexer (hooked) and the attention captured once,
    replayed after the buffers, the key cache and the inputs are rewritten in place; the
    replay and the same batch run eagerly both match float64."""
    case = dsa_case("gpu_graph", ForwardMode.DECODE, (300, 1000, 64, 2048), heads=16)
    fx = build(case, topk=256, device="cuda")
    indexer = make_indexer(256)
    backend, fb = fx.backend, fx.forward_batch
    m = fx.actual_module
    write_index_keys(fx, seed=11)
    q_fp8, weights = index_queries(4, seed=12, device="cuda")
    q_nope, q_rope = m.project_q(fx.input_hidden)
    backend.init_cuda_graph_state(max_bs=4, max_num_tokens=4)

    def step():
        meta = backend.get_indexer_metadata(0, fb)
        pos = indexer._get_topk_paged(fb, 0, q_fp8, weights, meta)
        return pos, m.attn(q_nope, None, None, fb, q_rope=q_rope, save_kv_cache=False,
                           topk_indices=pos)  # fmt: skip

    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=backend)):
        backend.init_forward_metadata_out_graph(fb, in_capture=True)
        step()  # warm-up: compiles and plans outside the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            pos_g, out_g = step()
        # the next batch: requests in other rows, shorter, new keys, queries and index queries
        move_requests_back(fx, [280, 1001, 65, 1500])
        write_index_keys(fx, seed=13)
        new_q, new_w = index_queries(4, seed=14, device="cuda")
        q_fp8.copy_(new_q)
        weights.copy_(new_w)
        q_nope.copy_(torch.randn_like(q_nope))
        backend.init_forward_metadata_out_graph(fb)
        graph.replay()
        torch.cuda.synchronize()
        backend.init_forward_metadata(fb)
        pos_e, out_e = step()  # the same batch eagerly
    scores = float64_scores(fx, q_fp8, weights)
    for pos, out in ((pos_g, out_g), (pos_e, out_e)):
        check_selection(pos, scores, 256)
        check_attention(fx, out.view(4, 16, 512), q_nope.view(4, 16, 512),
                        q_rope.view(4, 16, 64), pos)  # fmt: skip
