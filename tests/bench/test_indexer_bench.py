"""The indexer benchmark's pieces that run anywhere: case names and counts, the inputs, the
runners and their accuracy check on the CPU path, the records and the goal report, and the vLLM
loader when its file is missing."""

from __future__ import annotations

import json
import types

import pytest
import torch

from fp8mla.bench import indexer_impls as X
from fp8mla.bench.impls import Unavailable
from fp8mla.bench.indexer_cases import (
    INDEXER_CASES,
    LAYER_CASE,
    IndexerCase,
    key_bytes,
    logits_bytes,
    logits_flops,
)
from fp8mla.bench.indexer_inputs import index_cache, indexer_inputs
from fp8mla.bench.indexer_report import goal_lines, main
from fp8mla.bench.indexer_runner import IndexerContext, check, indexer_record, make_runner
from fp8mla.bench.measure import Timing


def test_case_names_and_counts():
    assert [c.name for c in INDEXER_CASES] == ["B64_next1_H64_ctx32768", "B1_next1_H32_ctx131072"]
    assert LAYER_CASE.name == "B1_next1_H32_ctx131072"
    case = IndexerCase(2, 2, 32, 1000)
    assert case.rows == 4 and key_bytes(case) == 2 * 1000 * 132
    assert logits_bytes(case) == 4 * 1000 * 4 and logits_flops(case) == 2 * 4 * 32 * 128 * 1000


def small(next_n: int = 1):
    case = IndexerCase(2, next_n, 8, 300, k=16)
    cache = index_cache(12, 64, torch.device("cpu"))
    return indexer_inputs(case, cache, seed=3)


def test_inputs_and_runners_on_the_cpu_path():
    inp = small(next_n=2)
    assert inp.lens.tolist() == [[299, 300], [299, 300]]
    assert inp.context_lens_1d.tolist() == [300, 300]
    ctx = IndexerContext(env=None, device=torch.device("cpu"))
    logits = make_runner("fp8mla-logits", inp, ctx)()
    assert check(inp, logits, logits=True)["rel_err"] < 1e-5
    for name in ("fp8mla", "fp8mla-fused", "fp8mla-two-pass"):
        pos = make_runner(name, inp, ctx)()
        assert check(inp, pos, logits=False)["topk_overlap"] == 1.0


def test_vllm_loader_without_its_file(tmp_path, monkeypatch):
    monkeypatch.delenv(X.VLLM_INDEXER_ENV, raising=False)
    with pytest.raises(Unavailable, match="no vLLM indexer module"):
        X.load_vllm_indexer(None)
    with pytest.raises(Unavailable, match="no file"):
        X.load_vllm_indexer(str(tmp_path / "missing.py"))
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    with pytest.raises(Unavailable, match="no fp8_paged_mqa_logits_triton"):
        X.load_vllm_indexer(str(empty))


def env():
    return types.SimpleNamespace(gpu="GPU", date="2026-12-05", torch="t", triton="3", run="r1",
                                 copy_tbps=4.0)  # fmt: skip


def test_records_and_goal_report(tmp_path, capsys):
    ctx = IndexerContext(env=env(), device=torch.device("cpu"))
    case = INDEXER_CASES[1]
    for impl, us in (("fp8mla", 20.0), ("vllm-triton", 50.0), ("fp8mla-fused", 30.0)):
        indexer_record(ctx, case, impl, Timing(us, us, us), timing="cuda-graph x8")
    indexer_record(ctx, case, "fp8mla", Timing(10.0, 10.0, 10.0), timing="do_bench")
    row = ctx.records[0]
    assert row["section"] == "indexer" and row["gbps"] == round(key_bytes(case) / 20e-6 / 1e9, 1)
    layer = f"DSA_{LAYER_CASE.name}"
    for impl, us in (("fp8mla-dsa", 10.0), ("fp8mla-dense", 40.0)):
        r = indexer_record(ctx, LAYER_CASE, impl, Timing(us, us, us), timing="cuda-graph x8")
        r["case"] = layer
    lines = goal_lines(ctx.records)
    assert any("B1_next1_H32_ctx131072" in x and "2.5x (cuda-graph" in x and "met" in x
               for x in lines)  # fmt: skip
    assert any("B64_next1" in x and "not measured" in x for x in lines)
    assert any("DSA layer" in x and "4x" in x and "MISSED" in x for x in lines)
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ctx.records) + "\n")
    assert main([str(path)]) == 0
    assert "DSA layer" in capsys.readouterr().out
    assert main([]) == 2
