"""The sparse benchmark's pieces that run anywhere: case names, byte and FLOP counts, the pool
and its bf16 twin, the PyTorch gather-then-dequantize baseline against the reference, the
records and the goal report, and the baselines' loaders when their files are missing."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest
import torch

from fp8mla.bench import sparse_impls as S
from fp8mla.bench.flashmla import FLASHMLA_ENV, load_flashmla
from fp8mla.bench.impls import Unavailable
from fp8mla.bench.report import format_table
from fp8mla.bench.runner import Environment
from fp8mla.bench.sparse_cases import (
    SPARSE_CASES,
    SparseCase,
    case_from_name,
    packed_bytes,
    sparse_flops,
)
from fp8mla.bench.sparse_inputs import bf16_twin, causal_lists, packed_pool, sparse_inputs
from fp8mla.bench.sparse_report import goal_lines, main
from fp8mla.bench.sparse_runner import (
    ROTATIONS,
    SparseContext,
    check_rows,
    reference_rows,
    rotations,
    sparse_record,
)
from fp8mla.dsa.sparse_cache import sparse_cache
from fp8mla.testing import rel_err

from conftest import HAS_CUDA


def test_case_names_and_counts():
    assert [c.name for c in SPARSE_CASES] == [
        "B128_H16_K2048",
        "B128_H128_K2048",
        "B128_H128_K2048_Q2",
        "B1_H32_K2048",
        "T4096_H128_K2048",
        "T4096_H16_K2048",
    ]
    case = SparseCase(128, 16, 2048)
    assert packed_bytes(case) == 128 * 2048 * 656
    assert sparse_flops(case) == 2 * 128 * 16 * 2048 * 1088
    q2 = SparseCase(128, 128, 2048, qo_len=2)
    assert q2.tokens == 256 and sparse_flops(q2) == 2 * sparse_flops(SparseCase(128, 128, 2048))
    assert all(c.pool_slots == 1 << 20 and c.page_size == 64 for c in SPARSE_CASES)


def test_case_from_name_reads_every_form_back():
    for case in SPARSE_CASES:
        assert case_from_name(case.name) == dataclasses.replace(case, goal="")
    assert case_from_name("B128_H64_K2048") == SparseCase(128, 64, 2048)
    assert case_from_name("T4096_H64_K2048") == SparseCase(1, 64, 2048, qo_len=4096, prefill=True)
    assert case_from_name("T4096_H128_K2048_C32768") == SparseCase(
        1, 128, 2048, qo_len=4096, prefill=True, context=32768
    )
    for bad in ("B128_H64", "B128_H64_K2048_Q1", "B0_H16_K2048", "T4096_H64_K2048_Q2", "b1_h1_k1",
                "B128_H64_K2048_C4096", "T4096_H64_K2048_C0"):  # fmt: skip
        with pytest.raises(ValueError, match="sparse case name"):
            case_from_name(bad)
    for short_or_long in ("T4096_H64_K2048_C4095", f"T1_H64_K2048_C{(1 << 20) + 1}"):
        with pytest.raises(ValueError, match="expected a context of at least"):
            case_from_name(short_or_long)


def test_a_chunk_lists_distinct_tokens_of_its_own_causal_prefix():
    """Where topk covers every prefix, each token lists exactly its prefix: one more token than
    the token before it (itself), then -1. Where it does not, ``topk`` distinct slots, all of
    them the context's."""
    g = torch.Generator().manual_seed(3)
    tokens, context = 8, 12
    lists = causal_lists(tokens, 16, context, 512, g)
    assert lists.dtype == torch.int32 and lists.shape == (tokens, 16)
    before: set[int] = set()
    for t in range(tokens):
        prefix = context - tokens + t + 1
        valid = lists[t, :prefix]
        assert (valid >= 0).all() and (lists[t, prefix:] == -1).all()
        seen = set(valid.tolist())
        assert len(seen) == prefix and before < seen
        before = seen
    wide = causal_lists(40, 16, 100, 512, g)  # every prefix (61+) longer than topk
    assert (wide >= 0).all() and int(wide.max()) < 512
    assert all(torch.unique(row).numel() == 16 for row in wide)
    assert 16 < torch.unique(wide).numel() <= 100
    with pytest.raises(ValueError, match="expected a context of at least"):
        causal_lists(40, 16, 39, 512, g)


def test_a_case_with_context_builds_its_lists_from_the_prefix():
    case = SparseCase(1, 16, 8, qo_len=6, prefill=True, pool_slots=512, context=10)
    pool = packed_pool(512, 64, torch.device("cpu"))
    inp = sparse_inputs(case, pool, seed=1)
    assert inp.indices.shape == (6, 8)
    # the first token's prefix holds 5 tokens, the last's 10
    assert [int((row >= 0).sum()) for row in inp.indices] == [5, 6, 7, 8, 8, 8]
    listed = inp.indices[inp.indices >= 0]
    assert int(listed.max()) < 512 and torch.unique(listed).numel() <= 10
    assert not torch.equal(inp.indices, sparse_inputs(case, pool, seed=2).indices)


def test_a_replay_holds_enough_calls_to_hide_its_start():
    """Each replay reads ~1 GiB or holds ``ROTATIONS`` calls, never fewer than two (consecutive
    calls then read different rows): a replay's start, in which the GPU waits for the host,
    is divided over enough calls to be ~1% of each."""
    by_name = {c.name: rotations(c) for c in SPARSE_CASES}
    assert by_name == {"B128_H16_K2048": 7, "B128_H128_K2048": 7, "B128_H128_K2048_Q2": 4,
                       "B1_H32_K2048": ROTATIONS, "T4096_H128_K2048": 2, "T4096_H16_K2048": 2}  # fmt: skip
    for case in SPARSE_CASES:
        n = by_name[case.name]
        assert n == ROTATIONS or n * packed_bytes(case) >= 1 << 30 or n == 2
        assert n == 2 or (n - 1) * packed_bytes(case) < 1 << 30


def small_inputs(tokens=3, heads=16, topk=40, seed=0):
    case = SparseCase(tokens, heads, topk, pool_slots=512)
    pool = packed_pool(512, 64, torch.device("cpu"), seed=seed)
    return sparse_inputs(case, pool, seed=seed)


def test_pool_twin_holds_the_same_values():
    inp = small_inputs()
    twin = bf16_twin(inp.pool)
    slots = torch.arange(512)
    latent, rope = sparse_cache(inp.pool).dequantize(slots, torch.float64)
    assert torch.equal(twin[:, :512].double(), latent)  # power-of-two scales: exact in bf16
    assert torch.equal(twin[:, 512:].double(), rope)
    assert inp.indices.dtype == torch.int32 and inp.indices.shape == (3, 40)
    assert int(inp.indices.min()) >= 0 and int(inp.indices.max()) < 512


def test_gather_dequant_matches_the_reference():
    """Within bf16 arithmetic's error: its scores and probabilities are rounded to bf16."""
    inp = small_inputs(tokens=5)
    inp.indices[1, :7] = -1
    ref = reference_rows(inp, list(range(5)))
    out = S.gather_dequant(inp)()
    assert rel_err(out.float(), ref) < 1e-2


def test_dequantize_rows_is_the_layouts_arithmetic():
    inp = small_inputs()
    rows = inp.pool.view(-1, 656)[:10]
    got = S.dequantize_rows(rows)
    latent, rope = sparse_cache(inp.pool).dequantize(torch.arange(10), torch.float32)
    assert torch.equal(got[:, :512], latent.to(torch.bfloat16))
    assert torch.equal(got[:, 512:], rope.to(torch.bfloat16))


def test_fp8mla_runners_match_the_reference():
    """The kernel on a GPU, the PyTorch path on a CPU, on the packed pool and its twin."""
    inp = small_inputs()
    dev = "cuda" if HAS_CUDA else "cpu"
    inp = type(inp)(inp.case, inp.pool.to(dev), inp.q.to(dev), inp.indices.to(dev))
    ref = reference_rows(inp, list(range(3)))
    for cache in (None, bf16_twin(inp.pool)):
        assert rel_err(S.fp8mla_sparse(inp, cache)().float(), ref) < 3e-3


def environment() -> Environment:
    return Environment(
        "GPU", "2026-12-06", "2.11", "3.6", 4.0, 700.0, "run-a", "2026-12-06T00:00:00"
    )


def test_records_and_goal_report(tmp_path):
    ctx = SparseContext(env=environment(), device=torch.device("cpu"))
    case = SparseCase(128, 16, 2048)
    t = types.SimpleNamespace(us_median=60.0, us_p20=59.0, us_p80=61.0)
    row = sparse_record(ctx, case, "fp8mla", t, 1.6e-3, timing="do_bench")
    assert row["gbps"] == round(packed_bytes(case) / 60e-6 / 1e9, 1)
    assert row["tflops"] == round(sparse_flops(case) / 60e-6 / 1e12, 2)
    assert row["section"] == "sparse" and row["case"] == "B128_H16_K2048"
    assert row["x_floor"] == round(60.0 / row["floor_us"], 2)
    slow = types.SimpleNamespace(us_median=150.0, us_p20=149.0, us_p80=151.0)
    sparse_record(ctx, case, "vllm-triton-sparse", slow, 2e-3)
    lines = goal_lines(ctx.records)
    assert any("B128_H16_K2048 fp8mla packed TB/s: 2.87 TB/s" in x and "met" in x for x in lines)
    assert any("vs vllm-triton-sparse: 2.5x" in x and "met" in x for x in lines)
    assert any("vs gather-dequant: not measured" in x for x in lines)
    t = types.SimpleNamespace(us_median=10.022, us_p20=10.0, us_p80=10.05)
    sparse_record(ctx, SparseCase(1, 32, 2048), "fp8mla", t, None)["case"] = (
        "LAYERS78_B1_H32_K2048"  # as the layers section names its record
    )
    per_layer = next(x for x in goal_lines(ctx.records) if "us per layer" in x)
    assert "10.02 us (goal <= 10 us) -> MISSED" in per_layer  # not "10 us", beside MISSED
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ctx.records))
    assert main([str(path)]) == 0
    assert check_rows(SparseCase(1, 32, 2048)) == [0]
    assert check_rows(case) == [0, 1, 64, 127]
    pack = {
        "case": "PACK_N131072",
        "impl": "fp8mla-pack",
        "us_median": 60.0,
        "us_p20": 59.0,
        "us_p80": 61.0,
        "gbps": 2630.0,
        "rel_err": None,
    }  # a writer's record: no FLOPs
    table = format_table(ctx.records + [pack])
    assert "PACK_N131072" in table and "2630" in table and "B128_H16_K2048" in table


def test_baselines_without_their_files_are_unavailable(tmp_path, monkeypatch):
    monkeypatch.delenv(FLASHMLA_ENV, raising=False)
    monkeypatch.delenv(S.VLLM_SPARSE_ENV, raising=False)
    with pytest.raises(Unavailable, match="no FlashMLA folder"):
        load_flashmla(None)
    with pytest.raises(Unavailable, match="_flashmla_C.abi3.so"):
        load_flashmla(str(tmp_path))
    with pytest.raises(Unavailable, match="no vLLM sparse module"):
        S.load_vllm_sparse(None)
    with pytest.raises(Unavailable, match="no file"):
        S.load_vllm_sparse(str(tmp_path / "missing.py"))
    inp = small_inputs()
    with pytest.raises(Unavailable, match="64, 128"):
        S.flashmla_sparse(inp, types.SimpleNamespace())


def test_vllm_module_loads_with_stand_ins(tmp_path):
    """A file shaped like vLLM 0.33.0's ``xpu_mla_sparse.py`` (its imports, its entry point)
    loads through the stand-ins for ``vllm.triton_utils``."""
    module = tmp_path / "fake_sparse.py"
    module.write_text(
        "import torch\n"
        "from vllm.triton_utils import LOG2E, LOGE2, tl, triton\n"
        "def triton_bf16_mla_sparse_interface(q, kv, indices, sm_scale, d_v=512):\n"
        "    return torch.zeros(q.shape[0], q.shape[1], d_v), None, None\n"
    )
    fn = S.load_vllm_sparse(str(module))
    inp = small_inputs()
    out = S.vllm_triton_sparse(inp, bf16_twin(inp.pool), fn)()
    assert out.shape == (3, 16, 512)


def test_run_sparse_records_every_implementation_or_a_note(monkeypatch):
    """The section's flow on small cases with the clocks stubbed: a record per implementation
    that runs, a note for each that cannot, the layers scenario, the goal lines."""
    from fp8mla.bench import sparse_runner as R

    def once(fn, *args, **kwargs):
        fn()
        return R.Timing(10.0, 9.0, 11.0)

    monkeypatch.setattr(R, "time_cuda", once)
    monkeypatch.setattr(R, "time_graph", once)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    monkeypatch.setattr(R, "LAYERS_CASE", SparseCase(1, 16, 32, pool_slots=512))
    monkeypatch.delenv(FLASHMLA_ENV, raising=False)
    monkeypatch.delenv(S.VLLM_SPARSE_ENV, raising=False)
    ctx = SparseContext(env=environment(), device=torch.device("cpu"))
    notes: list[str] = []
    cases = [SparseCase(2, 16, 32, pool_slots=512), SparseCase(1, 64, 16, pool_slots=512)]
    saved: list[tuple[str, int]] = []  # (step, records so far): what the bench saves after each
    R.run_sparse(ctx, cases, notes, lambda name: saved.append((name, len(ctx.records))), layers=2)
    assert [name for name, _ in saved] == ["B2_H16_K32", "B1_H64_K16", "2 layers", "packed writer"]
    assert saved[-1][1] == len(ctx.records), "the writer's record came after the last save"
    impls = {(r["case"], r["impl"]) for r in ctx.records}
    for case in ("B2_H16_K32", "B1_H64_K16"):
        assert {(case, i) for i in ("fp8mla", "fp8mla-bf16", "gather-dequant")} <= impls
    assert ("LAYERS2_B1_H16_K32", "fp8mla") in impls
    assert any("flashmla-sparse-fp8: skipped" in n for n in notes)
    assert any("vllm-triton-sparse: skipped" in n for n in notes)
    assert all(r["rel_err"] is None or r["rel_err"] < 1e-2 for r in ctx.records)
