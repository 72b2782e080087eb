"""The FlashMLA decode baselines' plumbing, on any device: the 64-token-page copy of a case's
tokens, the FP8 query quantization, the arguments the two ops receive (checked by stand-ins
that compute the attention those arguments describe with fp8mla's reference: they test our
inputs and calls, not FlashMLA), a missing FlashMLA folder, and the goal lines."""

from __future__ import annotations

import pytest
import torch

from fp8mla.attention.reference import mla_reference
from fp8mla.bench import flashmla as F
from fp8mla.bench import runner as R
from fp8mla.bench.cases import GOAL_CASES, Case
from fp8mla.bench.impls import Unavailable
from fp8mla.bench.inputs import build_inputs, page_copy
from fp8mla.bench.report import GOAL_CHECKS, goal_lines
from fp8mla.bench.runner import BenchContext, Environment, reference_subset
from fp8mla.testing import rel_err

E4M3 = torch.float8_e4m3fn


def environment() -> Environment:
    return Environment(
        "GPU", "2026-12-06", "2.11", "3.6", 4.0, 700.0, "run-a", "2026-12-06T00:00:00"
    )


@pytest.mark.parametrize("source_page", [1, 16])
@pytest.mark.parametrize("context", [1, 17, 100, 128])
def test_page_copy_holds_the_same_tokens(device, source_page, context):
    dev = torch.device(device)
    case = Case(3, 4, context, page_size=source_page, pool_slots=1024)
    inp = build_inputs(case, dev, seed=5)
    inp.scale = 0.375
    raw, deq = page_copy(inp), page_copy(inp, torch.bfloat16)
    pages = -(-context // 64)
    assert raw.cache.dtype == E4M3 and raw.cache.shape == (3 * pages, 64, 1, 576)
    assert deq.cache.dtype == torch.bfloat16 and deq.cache.shape == raw.cache.shape
    assert raw.block_table.dtype == torch.int32 and raw.block_table.shape == (3, pages)
    assert sorted(raw.block_table.flatten().tolist()) == list(range(3 * pages))
    assert raw.seqlens.dtype == torch.int32 and raw.seqlens.tolist() == [context] * 3
    # every request's token p, read through the page table, against the pool's slot
    pos = torch.arange(context, device=dev)
    for b in range(3):
        blocks = raw.block_table[b, pos // 64].long()
        slots = inp.token_slots[b * context : (b + 1) * context]
        source = inp.pool[slots, 0]
        got = raw.cache[blocks, pos % 64, 0]
        assert torch.equal(got.view(torch.uint8), source.view(torch.uint8))
        want = (source.double() * inp.scale).to(torch.bfloat16)
        assert torch.equal(deq.cache[blocks, pos % 64, 0], want)
    # the tail of each last page is padding
    filled = torch.zeros(3 * pages * 64, dtype=torch.bool, device=dev)
    for b in range(3):
        filled[(raw.block_table[b, pos // 64].long() * 64 + pos % 64)] = True
    assert not deq.cache.view(-1, 576)[~filled].any()


def test_query_quantization_is_vllms():
    """vLLM's static per-tensor FP8 quantization: ``x.float() * scale.reciprocal()``, clamped
    to e4m3's range; here with the scale amax / 448."""
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(4, 2, 8, 576, generator=g) * torch.logspace(-3, 1, 576)).to(torch.bfloat16)
    scale = F.query_scale(q)
    assert scale.dtype == torch.float32 and scale.shape == (1,)
    assert scale.item() == pytest.approx(q.abs().max().item() / 448)
    fp8 = F.quantize_query(q, scale)
    finfo = torch.finfo(E4M3)
    vllm = (q.to(torch.float32) * scale.to(torch.float32).reciprocal()).clamp(finfo.min, finfo.max)
    assert fp8.dtype == E4M3 and torch.equal(fp8.view(torch.uint8), vllm.to(E4M3).view(torch.uint8))
    assert fp8.float().abs().max().item() == 448  # the amax element lands on e4m3's largest
    back = fp8.float() * scale
    big = q.float().abs() > 2**-6 * 448 * scale  # normal e4m3 numbers: 3 mantissa bits
    assert ((back - q.float()).abs()[big] <= q.float().abs()[big] * 2**-4).all()
    # a scale below the queries' amax clamps instead of overflowing
    assert F.quantize_query(q, scale / 4).float().abs().max().item() == 448
    assert F.query_scale(torch.zeros(3)).item() == pytest.approx(1 / (448 * 512))


class FakeFlashMLA:
    """Stand-ins for ``dense_decode_fwd``, ``fwd_kvcache_mla_fp8`` and
    ``get_mla_decoding_metadata_dense_fp8`` with their schemas (vLLM 0.26's calls): they check
    the arguments' shapes and dtypes, that the step's metadata is reused, and compute the
    attention the arguments describe (page table, lengths, bottom-right causal rows, descales)
    with fp8mla's float32 reference."""

    def __init__(self):
        self.meta = torch.zeros(4, 8, dtype=torch.int32)
        self.splits = torch.zeros(3, dtype=torch.int32)
        self.calls = {"fp8_metadata": 0, "fp8_decode": 0, "dense_decode": 0}

    @staticmethod
    def check_pages(q, kcache, head_size_v, seqlens, block_table):
        b, s_q, h, d = q.shape
        assert d == 576 and head_size_v == 512 and kcache.dim() == 4
        assert kcache.shape[1:] == (64, 1, 576) and kcache.is_contiguous()
        assert block_table.dtype == torch.int32 and block_table.shape[0] == b
        assert seqlens.dtype == torch.int32 and seqlens.shape == (b,)
        assert int(seqlens.max()) <= block_table.shape[1] * 64
        assert int(block_table.max()) < kcache.shape[0]

    @staticmethod
    def attend(q, kcache, seqlens, block_table, softmax_scale, is_causal, k_scale=None):
        b, s_q, h, _ = q.shape
        pages = block_table.shape[1]
        rows = q.reshape(b * s_q, h, 576)
        out, _ = mla_reference(
            rows[..., :512],
            rows[..., 512:],
            kcache[:, :, 0, :512],
            kcache[:, :, 0, 512:],
            torch.arange(0, b * s_q + 1, s_q, dtype=torch.int32, device=q.device),
            torch.arange(0, b * pages + 1, pages, dtype=torch.int32, device=q.device),
            block_table.flatten(),
            seqlens,
            sm_scale=softmax_scale,
            causal=is_causal and s_q > 1,
            ckv_scale=k_scale,
            kpe_scale=k_scale,
            dtype=torch.float32,
        )
        return out.view(b, s_q, h, 512).to(torch.bfloat16)

    def fp8_metadata(self, seqlens, num_q_tokens_per_head_k, num_heads_k):
        self.calls["fp8_metadata"] += 1
        assert seqlens.dtype == torch.int32 and num_heads_k == 1
        self.q_tokens_per_head_k = num_q_tokens_per_head_k
        return [self.meta, self.splits]

    def fp8_decode(self, q, kcache, head_size_v, seqlens, block_table, softmax_scale, is_causal,
                   tile_md, num_splits, descale_q, descale_k):  # fmt: skip
        self.calls["fp8_decode"] += 1
        self.check_pages(q, kcache, head_size_v, seqlens, block_table)
        assert q.dtype == E4M3 and kcache.dtype == E4M3
        assert tile_md is self.meta and num_splits is self.splits
        assert self.q_tokens_per_head_k == q.shape[1] * q.shape[2]
        for d in (descale_q, descale_k):
            assert d.dtype == torch.float32 and d.shape == (1,)
        q = q.float() * descale_q
        out = self.attend(q, kcache, seqlens, block_table, softmax_scale, is_causal, descale_k)
        return [out, None]

    def dense_decode(self, q, kcache, head_size_v, seqlens, block_table, softmax_scale,
                     is_causal, tile_md, num_splits, out):  # fmt: skip
        self.calls["dense_decode"] += 1
        self.check_pages(q, kcache, head_size_v, seqlens, block_table)
        assert q.dtype == torch.bfloat16 and kcache.dtype == torch.bfloat16
        if tile_md is None:  # the step's first call computes the metadata
            assert num_splits is None
        else:
            assert tile_md is self.meta and num_splits is self.splits
        assert out.shape == (*q.shape[:3], 512) and out.dtype == torch.bfloat16
        out.copy_(self.attend(q, kcache, seqlens, block_table, softmax_scale, is_causal))
        return out, None, self.meta, self.splits


@pytest.mark.parametrize(
    "case",
    [
        Case(3, 16, 100, pool_slots=512),
        Case(2, 8, 130, page_size=16, qo_len=2, pool_slots=1024),
    ],
    ids=lambda c: c.name,
)
def test_flashmla_runners_pass_the_case(device, case):
    inp = build_inputs(case, torch.device(device), seed=7)
    ref, rows = reference_subset(inp, case.batch)
    fake = FakeFlashMLA()
    fp8 = F.flashmla_fp8(inp, fake)
    bf16 = F.flashmla_bf16kv(inp, fake)
    out_fp8, out_bf16 = fp8(), bf16()
    tokens = case.batch * case.qo_len
    assert out_fp8.shape == out_bf16.shape == (tokens, case.heads, 512)
    # FP8 queries cost accuracy; the bf16 path is as close as the other bf16-pool kernels
    assert rel_err(out_fp8[rows].float(), ref) < 6e-2
    assert rel_err(out_bf16[rows].float(), ref) < 5e-3
    assert fake.calls == {"fp8_metadata": 1, "fp8_decode": 2, "dense_decode": 2}


def test_flashmla_runners_refuse_extend_chunks_and_e5m2():
    fake, cpu = FakeFlashMLA(), torch.device("cpu")
    long = build_inputs(Case(1, 8, 48, qo_len=17, pool_slots=512), cpu)
    with pytest.raises(Unavailable, match="16 query tokens"):
        F.flashmla_fp8(long, fake)
    e5m2 = build_inputs(Case(1, 8, 48, kv_dtype=torch.float8_e5m2, pool_slots=512), cpu)
    with pytest.raises(Unavailable, match="e4m3"):
        F.flashmla_fp8(e5m2, fake)


def test_a_failing_op_is_unavailable():
    class Refusing(FakeFlashMLA):
        def fp8_metadata(self, *args):
            raise RuntimeError("Only head_size == 576 is supported\nstack...")

    inp = build_inputs(Case(1, 8, 48, pool_slots=512), torch.device("cpu"))
    with pytest.raises(Unavailable, match="FlashMLA refused the case .Only head_size"):
        F.flashmla_fp8(inp, Refusing())


@pytest.fixture
def stubbed_clocks(monkeypatch):
    """``bench_case`` anywhere: each timer calls its function once and reports 10 µs."""

    def once(fn, *args, **kwargs):
        fn()
        return R.Timing(10.0, 9.0, 11.0)

    monkeypatch.setattr(R, "time_cuda", once)
    monkeypatch.setattr(R, "time_graph", once)
    monkeypatch.setattr(R, "MAX_ROTATIONS", 2)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda *a, **k: None)
    monkeypatch.delenv(F.FLASHMLA_ENV, raising=False)


IMPLS = ("fp8mla", "fp8mla-bf16kv", "flashmla-fp8", "flashmla-bf16kv")


def test_missing_flashmla_folder_skips_its_rows_only(stubbed_clocks, device, tmp_path):
    dev = torch.device(device)
    case = Case(2, 16, 64, pool_slots=512, goal="test")
    for path, reason in ((None, "no FlashMLA folder"), (str(tmp_path), "_flashmla_C.abi3.so")):
        ctx = BenchContext(env=environment(), device=dev, impls=IMPLS, flashmla_path=path)
        with pytest.raises(Unavailable, match=reason):
            R.make_runner("flashmla-fp8", build_inputs(case, dev), ctx)
        notes: list[str] = []
        R.bench_case(ctx, case, notes)
        assert [r["impl"] for r in ctx.records] == ["fp8mla", "fp8mla-bf16kv"]
        assert len(notes) == 2
        for impl, note in zip(IMPLS[2:], notes, strict=True):
            assert note.startswith(f"{case.name} {impl}: skipped (") and reason in note


def test_flashmla_rows_carry_their_error(stubbed_clocks, device):
    case = Case(2, 16, 64, pool_slots=512, goal="test")
    ctx = BenchContext(env=environment(), device=torch.device(device), impls=IMPLS)
    ctx._flashmla = FakeFlashMLA()  # what load_flashmla returns: the ops by name
    notes: list[str] = []
    R.bench_case(ctx, case, notes)
    rows = {r["impl"]: r for r in ctx.records}
    assert set(rows) == set(IMPLS) and not notes
    assert rows["flashmla-fp8"]["timing"] == "cuda-graph x2"
    assert 1e-3 < rows["flashmla-fp8"]["rel_err"] < 6e-2  # FP8 queries
    assert rows["flashmla-bf16kv"]["rel_err"] < 5e-3


def test_goals_section_lists_flashmla_beside_flashinfer():
    impls = list(R.ALL_IMPLS)
    assert impls[-4:] == ["flashinfer-fp8", "flashinfer-bf16kv", "flashmla-fp8", "flashmla-bf16kv"]


def test_goal_cases_and_their_goal_lines():
    names = [c.name for c in GOAL_CASES]
    assert names[-3:] == [
        "B64_H64_L4096_float8_e4m3fn",
        "B128_H128_L8192_float8_e4m3fn",
        "B64_H128_L4096_Q2_float8_e4m3fn",
    ]
    assert {check.case for check in GOAL_CHECKS} == {c.name for c in GOAL_CASES}
    h64, h128 = "B64_H64_L4096_float8_e4m3fn", "B64_H128_L4096_float8_e4m3fn"

    def row(case, impl, us, err, **kw):
        return dict(case=case, impl=impl, us_median=us, rel_err=err, goal="g", **kw)

    records = [
        row(h64, "fp8mla", 90.0, 1.7e-3),
        row(h64, "flashmla-fp8", 100.0, 2.4e-2),
        row(h64, "flashinfer-bf16kv", 85.0, 2.0e-3),
        row(h64, "flashmla-fp8", 1.0, 2.4e-2) | {"goal": ""},  # a sweep record: no goal
        row(h128, "fp8mla", 140.0, 1.7e-3, tflops=500.5),
        row(h128, "flashmla-fp8", 160.0, 2.4e-2),
        row(h128, "fp8mla-fp8q", 135.0, 9.0e-3, tflops=540.0),
    ]
    lines = {line.split(":")[0]: line for line in goal_lines(records)}
    vs_flashmla = lines["B64_H64_L4096 fp8mla speedup over flashmla-fp8"]
    assert "1.11x (100.0 / 90.0 us)" in vs_flashmla and vs_flashmla.endswith("-> met")
    assert "rel_err fp8mla 1.7e-03, flashmla-fp8 2.4e-02" in vs_flashmla
    assert lines["B64_H64_L4096 fp8mla speedup over flashinfer-bf16kv"].endswith("-> MISSED")
    fp8q = "B64_H128_L4096 fp8mla-fp8q speedup over flashmla-fp8"
    assert lines[fp8q].endswith("(goal >= 1.25x; rel_err fp8mla-fp8q 9.0e-03, "
                                "flashmla-fp8 2.4e-02) -> MISSED")  # fmt: skip
    assert lines["B64_H128_L4096 fp8mla-fp8q time"].endswith("-> MISSED")
    assert lines["B64_H128_L4096 fp8mla time"].startswith("B64_H128_L4096 fp8mla time: 140.0 us")
    assert lines["B64_H128_L4096 fp8mla TFLOP/s"].endswith("-> met")
    assert (
        "not measured (goal <= 0.93x)" in lines["B64_H128_L4096 fp8mla time / flashinfer-bf16kv's"]
    )
    assert "not measured" in lines["B32_H32_L4096 fp8mla time"]


@pytest.mark.parametrize(
    "value, goal, side, spec, shown",
    [
        (10.022, 10, dict(higher=False), ".3g", "10.02"),  # ".3g" alone: "10", but MISSED
        (9.9996, 10, dict(higher=False), ".3g", "10"),  # met, and "10" meets it too
        (449.6, 450, dict(higher=True), ".0f", "449.6"),
        (1.0996, 1.1, dict(higher=True), ".2f", "1.0996"),
        (1.1, 1.1, dict(higher=True, strict=True), ".2f", "1.10"),  # not above: MISSED either way
        (1.1004, 1.1, dict(higher=True, strict=True), ".2f", "1.1004"),
        (296.3, 450, dict(higher=True), ".3g", "296"),
    ],
)
def test_a_goal_value_is_shown_on_its_own_side_of_the_goal(value, goal, side, spec, shown):
    from fp8mla.bench.report import beside_goal

    assert beside_goal(value, goal, spec=spec, **side) == shown


def test_a_goal_value_spec_must_be_fixed_or_general():
    from fp8mla.bench.report import beside_goal

    with pytest.raises(ValueError, match="'.3g' or '.1f'"):
        beside_goal(1.0, 2.0, higher=True, spec="e")


def test_goal_lines_show_the_digits_that_decide(tmp_path):
    h128 = "B64_H128_L4096_float8_e4m3fn"
    records = [dict(case=h128, impl="fp8mla", us_median=125.04, rel_err=1.7e-3, goal="g",
                    tflops=499.6)]  # fmt: skip
    lines = {line.split(":")[0]: line for line in goal_lines(records)}
    assert lines["B64_H128_L4096 fp8mla time"].startswith("B64_H128_L4096 fp8mla time: 125.04 us")
    assert lines["B64_H128_L4096 fp8mla time"].endswith("-> MISSED")
    assert "499.6 TFLOP/s (goal >= 500" in lines["B64_H128_L4096 fp8mla TFLOP/s"]


def test_report_command_reads_the_files_last_run(tmp_path, capsys):
    from fp8mla.bench.report import append_jsonl, main

    h64 = "B64_H64_L4096_float8_e4m3fn"
    path = tmp_path / "nvidia-h200.jsonl"
    old = dict(case=h64, impl="fp8mla", us_median=200.0, rel_err=1.7e-3, goal="g", run="a")
    append_jsonl(path, [old, dict(old, impl="flashmla-fp8", us_median=100.0, rel_err=2.4e-2)])
    append_jsonl(
        path, [dict(old, run="b", us_median=90.0), dict(old, run="b", impl="flashmla-fp8")]
    )
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "B64_H64_L4096 fp8mla speedup over flashmla-fp8: 2.22x (200.0 / 90.0 us)" in out
    assert main([]) == 2
