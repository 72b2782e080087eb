"""Every benchmark implementation computes the same attention (tiny case, any device)."""

from __future__ import annotations

import json

import pytest
import torch

from fp8mla.bench import impls as I
from fp8mla.bench.cases import GOAL_CASES, Case, sweep_cases
from fp8mla.bench.inputs import build_inputs
from fp8mla.bench.measure import flops, kv_bytes
from fp8mla.bench.report import append_jsonl, format_table, gpu_slug, results_path
from fp8mla.bench.runner import reference_subset
from fp8mla.testing import rel_err


@pytest.mark.parametrize("page_size", [1, 16])
def test_implementations_agree(device, page_size):
    case = Case(2, 16, 40, page_size=page_size, pool_slots=512)
    inp = build_inputs(case, torch.device(device), seed=3)
    ref, rows = reference_subset(inp, 2)
    bf16_pool = inp.pool.to(torch.bfloat16)
    runners = {
        "fp8mla": I.fp8mla_direct(inp),
        "fp8mla-bf16kv": I.fp8mla_bf16kv(inp, bf16_pool),
        "full-pool-cast": I.full_pool_cast(inp),
        "gather-then-cast": I.gather_then_cast(inp),
        "torch-reference": I.torch_reference(inp),
    }
    for name, run in runners.items():
        err = rel_err(run()[rows].float(), ref)
        assert err < 5e-3, f"{name}: {err:.2e}"


def test_sdpa_baseline_matches_on_extend_chunks(device):
    case = Case(2, 8, 48, qo_len=5, page_size=16, pool_slots=512)
    inp = build_inputs(case, torch.device(device), seed=4)
    ref, rows = reference_subset(inp, 2)
    for name, run in {"torch-sdpa": I.torch_sdpa(inp), "fp8mla": I.fp8mla_direct(inp)}.items():
        err = rel_err(run()[rows].float(), ref)
        assert err < 5e-3, f"{name}: {err:.2e}"
    with pytest.raises(I.Unavailable, match="extend"):
        I.torch_sdpa(build_inputs(Case(1, 8, 48, pool_slots=512), torch.device(device)))


def test_inputs_place_tokens_on_distinct_slots(device):
    case = Case(3, 4, 100, page_size=8, pool_slots=1024)
    inp = build_inputs(case, torch.device(device))
    assert inp.token_slots.numel() == 300
    assert inp.token_slots.unique().numel() == 300
    assert inp.kv_bytes() == kv_bytes(case) == 300 * 576


def test_case_names_and_counts():
    assert [c.name for c in GOAL_CASES] == [
        "B32_H32_L4096_float8_e4m3fn",
        "B64_H16_L4096_float8_e4m3fn",
        "B8_H32_L16384_float8_e4m3fn",
        "B1_H32_L4096_float8_e4m3fn",
        "B64_H128_L4096_float8_e4m3fn",
        "B64_H64_L4096_float8_e4m3fn",
        "B128_H128_L8192_float8_e4m3fn",
        "B64_H128_L4096_Q2_float8_e4m3fn",
    ]
    assert Case(1, 32, 4096, page_size=64).name == "B1_H32_L4096_P64_float8_e4m3fn"
    assert flops(Case(1, 1, 10)) == 2 * 10 * 1088
    sweep = sweep_cases()
    assert {c.heads for c in sweep} == {16, 32, 64, 128}
    assert {c.page_size for c in sweep} == {1, 64}
    assert min(c.context for c in sweep) == 512 and max(c.context for c in sweep) == 131072
    assert max(c.batch for c in sweep) == 256 and min(c.batch for c in sweep) == 1
    assert Case(1, 128, 36864, qo_len=4096).name == "E4096_P32768_H128_float8_e4m3fn"


def test_every_run_appends_to_the_gpus_results_file(tmp_path):
    assert gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert gpu_slug(" NVIDIA GeForce RTX 4090 ") == "nvidia-geforce-rtx-4090"
    path = results_path(tmp_path / "results", "NVIDIA H200")
    assert path == tmp_path / "results" / "nvidia-h200.jsonl"
    first = dict(case="B1_H16_L512_float8_e4m3fn", date="2026-12-02", run="r35c")
    append_jsonl(path, [first])
    append_jsonl(path, [dict(first, date="2026-12-03", run="2026-12-03T09:00:00")])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["date"], r["run"]) for r in rows] == [
        ("2026-12-02", "r35c"),
        ("2026-12-03", "2026-12-03T09:00:00"),
    ]


def test_bench_command_takes_a_run_label():
    from fp8mla.cli import build_parser

    args = build_parser().parse_args(["bench", "--run-id", "r36a", "--out", "x"])
    assert args.run_id == "r36a" and str(args.out) == "x"
    assert build_parser().parse_args(["bench"]).run_id is None


def test_flashinfer_folder_without_the_package_is_unavailable(tmp_path):
    with pytest.raises(I.Unavailable, match="no flashinfer package"):
        I.load_flashinfer(str(tmp_path))


def test_table_formats_records():
    row = dict(
        case="B1_H16_L512_float8_e4m3fn",
        impl="fp8mla",
        us_median=5.0,
        us_p20=4.9,
        us_p80=5.2,
        gbps=59.0,
        tflops=0.4,
        x_floor=3.1,
        rel_err=1.5e-3,
    )
    text = format_table([row])
    assert "B1_H16_L512_float8_e4m3fn" in text and "1.5e-03" in text
    host = dict(row, case="HOST_B1_H32_L4096_float8_e4m3fn", gbps=None, tflops=None, x_floor=None)
    assert "HOST_B1_H32_L4096" in format_table([host])


def test_fp8_query_impls(device):
    """FP8 queries (quantized outside the call per tensor, or per (token, head) inside it):
    the error against the bf16 queries' reference is the queries' own e4m3 rounding."""
    case = Case(2, 16, 40, pool_slots=512)
    inp = build_inputs(case, torch.device(device), seed=5)
    ref, rows = reference_subset(inp, 2)
    errs = {f: rel_err(I.fp8mla_fp8q(inp, fused=f)()[rows].float(), ref) for f in (False, True)}
    assert all(err < 6e-2 for err in errs.values()), errs  # measured 3-4e-2
    # the Gluon FP8-query build named: only where the planned kernel has one (not here)
    with pytest.raises(I.Unavailable, match="rows.*no FP8-query build"):
        I.fp8mla_fp8q(inp, on_request=True)
