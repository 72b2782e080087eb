"""FP8 (e4m3) queries: ``plan(q_data_type=torch.float8_e4m3fn)`` with run()'s ``q_scale``
(a float, a device value or one per (token, head)), and ``plan(quantize_q=True)``. The
portable kernel's FP8-query builds (e4m3 × e4m3 dots with P in e4m3, hi + lo or once; the
codes decoded to the dot dtype), the converted route that feeds bf16 to the other kernels,
and the PyTorch backend, against float64 on the dequantized queries (``q_fp8 × q_scale``),
over the cases the 16-bit-query tests cover: scale modes, page sizes 1 and 64, speculative
causal rows, split KV, empty and one-token requests, NaN in unused slots, bad page ids."""

from __future__ import annotations

import pytest
import torch

from fp8mla import BatchMLAPagedAttentionWrapper, mla_decode
from fp8mla.attention.planner import make_launch_plan
from fp8mla.attention.query import (
    QF8_CVT,
    QF8_DOT,
    QueryPlan,
    quantize_rows,
    route_queries,
)
from fp8mla.attention.targets import INTERPRETER, TARGETS
from fp8mla.reference import mla_reference
from fp8mla.testing import make_batch, rel_err

from attention_utils import SM_SCALE, workspace

E4M3 = torch.float8_e4m3fn
# output error bars against float64 on the dequantized queries (bf16 output rounding alone
# is ~1.7e-3; P rounded to e4m3 once adds ~1e-2)
TOL = {"hi+lo": 4e-3, "once": 2e-2, "decoded": 4e-3}
# the converted route: the queries rounded to bf16 once more (2^-9 relative), 4.3e-3 measured
# on an H200 (r38)
CONVERTED_TOL = 6e-3
# e4m3 x e4m3 scores of the portable kernels on SM90: Hopper's FP8 wgmma adds the 512
# products of a score at reduced precision (the Gluon kernels add four 128-column parts in
# fp32 for that); LSE 3.2e-3 from float64 measured on an H200 at 80 heads (r38)
FP8_DOT_GPU_LSE_TOL = 4e-3
BUILDS = {"hi+lo": None, "once": {"P_PARTS": 1}, "decoded": {"Q_FP8": QF8_CVT}}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fp8_queries(batch, form: str, device):
    """The batch's queries quantized to e4m3 and their scale in ``form``: ``float``,
    ``tensor`` (a 0-d fp32 tensor on the device) or ``rows`` ([T, H]); with the float64
    values the kernels must see."""
    qn, qp = batch.q_nope.float(), batch.q_pe.float()
    if form == "rows":
        amax = torch.maximum(qn.abs().amax(-1), qp.abs().amax(-1))
        scale = (amax / 448).clamp_min(1e-12)
        s = scale[..., None]
    else:
        s = scale = torch.maximum(qn.abs().max(), qp.abs().max()) / 448
    cn, cp = (qn / s).to(E4M3), (qp / s).to(E4M3)
    values = (cn.double() * s.double(), cp.double() * s.double())
    if form == "float":
        scale = float(scale)
    else:
        scale = scale.to(device=device, dtype=torch.float32)
    return cn.to(device), cp.to(device), scale, values


def run_fp8(batch, qn, qp, q_scale, *, causal=False, config=None, options=None, splits=None,
            quantize=False, backend="triton", o_dtype=None, after_plan=None):  # fmt: skip
    w = BatchMLAPagedAttentionWrapper(workspace(qn.device), backend=backend)
    w.plan(*batch.plan_args(), batch.num_heads, 512, qp.shape[-1], batch.page_size, causal,
           SM_SCALE, qn.dtype, batch.ckv.dtype, num_splits=splits, kernel_config=config,
           kernel_options=options, quantize_q=quantize, o_data_type=o_dtype)  # fmt: skip
    if after_plan is not None:
        after_plan()
    kw = {} if quantize else {"q_scale": q_scale}
    out, lse = w.run(qn, qp, batch.ckv, batch.kpe, return_lse=True, **batch.scale_kwargs(), **kw)
    return w, out, lse


def ref_of(batch, values, causal=False):
    return mla_reference(*values, batch.ckv, batch.kpe, *batch.plan_args(), sm_scale=SM_SCALE,
                         causal=causal, **batch.scale_kwargs())  # fmt: skip


def check(out, lse, ref, ref_lse, tol, lse_tol=2e-3):
    assert out.dtype == torch.bfloat16
    assert rel_err(out, ref) < tol, rel_err(out, ref)
    torch.testing.assert_close(lse.double(), ref_lse.to(lse.device), atol=lse_tol, rtol=0,
                               equal_nan=True)  # fmt: skip


@pytest.mark.parametrize("build", list(BUILDS))
@pytest.mark.parametrize(
    "form,scale_mode,page_size,kv_dtype",
    [
        ("float", "tensor", 1, E4M3),
        ("tensor", "token_group", 64, E4M3),
        ("rows", "tensor", 64, E4M3),
        ("rows", "tensor", 1, torch.float8_e5m2),
        ("float", "tensor", 1, torch.bfloat16),
    ],
)
def test_direct_builds_match_float64(device, build, form, scale_mode, page_size, kv_dtype):
    """The portable kernel reads the e4m3 queries (empty and one-token requests, NaN in the
    pool's unused slots, KV split in three)."""
    b = make_batch([0, 1, 70, 33], 16, page_size=page_size, kv_dtype=kv_dtype,
                   scale_mode=scale_mode, device=device, generator=gen(1))  # fmt: skip
    qn, qp, s, values = fp8_queries(b, form, device)
    w, out, lse = run_fp8(b, qn, qp, s, config="rows", options=BUILDS[build], splits=3)
    assert w.launch_info.variant == "rows" and w._queries.direct
    ref, ref_lse = ref_of(b, values)
    check(out, lse, ref, ref_lse, TOL[build] if kv_dtype == E4M3 else TOL["decoded"])


@pytest.mark.parametrize("build", ["hi+lo", "once"])
def test_p_in_e4m3_errors(device, build):
    """P rounded to e4m3 once costs ~1e-2 of the output; as hi + lo it is at the 16-bit
    build's error (the bf16 output's rounding)."""
    b = make_batch([200, 57], 16, page_size=1, device=device, generator=gen(2))
    qn, qp, s, values = fp8_queries(b, "float", device)
    _, out, _ = run_fp8(b, qn, qp, s, config="rows", options=BUILDS[build])
    err = rel_err(out, ref_of(b, values)[0])
    assert (err < 3e-3) if build == "hi+lo" else (3e-3 < err < 2e-2), err


@pytest.mark.parametrize("build", ["hi+lo", "decoded"])
def test_value_split_kernel(device, build):
    """The value-split kernel (the tables' choice above 64 rows off SM90): 80 heads."""
    b = make_batch([40, 0, 1], 80, page_size=64, device=device, generator=gen(9))
    qn, qp, s, values = fp8_queries(b, "rows", device)
    w, out, lse = run_fp8(b, qn, qp, s, config="vsplit", options=BUILDS[build], splits=2)
    assert w.launch_info.variant == "vsplit" and w._queries.direct
    fp8_dot_on_gpu = build == "hi+lo" and device == "cuda"
    check(out, lse, *ref_of(b, values), TOL[build],
          lse_tol=FP8_DOT_GPU_LSE_TOL if fp8_dot_on_gpu else 2e-3)  # fmt: skip


@pytest.mark.parametrize("build", ["hi+lo", "decoded"])
def test_speculative_causal_rows(device, build):
    """Up to 4 query tokens a request, bottom-right causal, 8 heads (32 rows)."""
    b = make_batch([9, 4, 80], 8, qo_lens=[4, 4, 3], page_size=64, device=device,
                   generator=gen(3))  # fmt: skip
    qn, qp, s, values = fp8_queries(b, "rows", device)
    _, out, lse = run_fp8(b, qn, qp, s, causal=True, config="rows", options=BUILDS[build],
                          splits=2)  # fmt: skip
    check(out, lse, *ref_of(b, values, causal=True), TOL[build])


def test_bad_page_id_gives_nan_row(device):
    """An out-of-range page id: that request's rows are NaN, the others exact."""
    b = make_batch([40, 40], 16, page_size=1, device=device, generator=gen(4))
    qn, qp, s, values = fp8_queries(b, "float", device)
    good = int(b.kv_indices[45])

    def corrupt():  # after plan(), which checks host ids: request 1's sixth token
        b.kv_indices[45] = b.ckv.shape[0] + 7

    w, out, lse = run_fp8(b, qn, qp, s, after_plan=corrupt)
    assert w._plan.kv_indices.data_ptr() == b.kv_indices.data_ptr()  # the kernel reads it
    assert out[1].isnan().all() and lse[1].isnan().all()
    b.kv_indices[45] = good
    ref, _ = ref_of(b, values)
    assert rel_err(out[0], ref[0]) < TOL["hi+lo"]


CONVERTED = {"Q_FP8": 0}  # the route of kernels without an FP8-query build (SM90's Gluon)


@pytest.mark.parametrize("form", ["float", "tensor", "rows"])
def test_converted_route(device, form):
    """Kernels without an FP8-query build (the Gluon kernels on SM90; forced here) read bf16
    ``q × q_scale`` from the fused conversion: the query rounded to bf16 once more (2^-9
    relative, well below e4m3's 2^-4), which moves the LSE by up to ~1e-2."""
    b = make_batch([50, 3], 16, page_size=1, device=device, generator=gen(5))
    qn, qp, s, values = fp8_queries(b, form, device)
    w, out, lse = run_fp8(b, qn, qp, s, config="rows", options=CONVERTED, splits=2)
    assert not w._queries.direct
    check(out, lse, *ref_of(b, values), CONVERTED_TOL, lse_tol=1.5e-2)


@pytest.mark.parametrize("options", [None, CONVERTED])
def test_quantize_q(device, options):
    """quantize_q: 16-bit queries quantized per (token, head) in the call, then the direct
    build (codes and row scales) or the converted route (bf16 rounded through e4m3)."""
    b = make_batch([30, 64], 16, page_size=1, device=device, generator=gen(6))
    w, out, lse = run_fp8(b, b.q_nope, b.q_pe, None, config="rows", options=options,
                          quantize=True)  # fmt: skip
    assert w._queries.direct == (options is None)
    qn, qp, cn, cp, scale = quantize_rows(b.q_nope.cpu(), b.q_pe.cpu())
    if options is None:  # the fused pass wrote exactly PyTorch's codes and scales
        prep = w._qprep
        assert torch.equal(prep.q_nope.cpu(), cn.view(torch.uint8))
        assert torch.equal(prep.q_pe.cpu(), cp.view(torch.uint8))
        assert torch.equal(prep.row_scales.cpu(), scale)
    values = (qn.double().to(device), qp.double().to(device))
    if options is None:
        check(out, lse, *ref_of(b, values), TOL["hi+lo"])
    else:
        check(out, lse, *ref_of(b, values), CONVERTED_TOL, lse_tol=1.5e-2)


@pytest.mark.parametrize("options", [None, {"Q_FP8": QF8_CVT}, CONVERTED])
def test_no_rope_part(device, options):
    """head_dim_kpe 0 (keys are the 512 latent values alone), each route."""
    b = make_batch([40, 9], 16, head_dim_kpe=0, device=device, generator=gen(14))
    s = float(b.q_nope.float().abs().max()) / 448
    cn = (b.q_nope.float() / s).to(E4M3)
    cp = b.q_pe.to(E4M3)
    _, out, lse = run_fp8(b, cn, cp, s, options=options)
    values = (cn.double() * s, cp.double())
    check(out, lse, *ref_of(b, values), TOL["decoded"], lse_tol=1.5e-2)


def test_torch_backend_and_fp16_output(device):
    """The PyTorch backend computes on the dequantized queries; o_data_type=fp16 (on SM90 the
    planner then takes the portable kernels: the Gluon kernels write bf16)."""
    b = make_batch([20], 16, page_size=1, device=device, generator=gen(7))
    qn, qp, s, values = fp8_queries(b, "rows", device)
    ref, _ = ref_of(b, values)
    for backend in ("torch", "triton"):
        _, out, _ = run_fp8(b, qn, qp, s, backend=backend, o_dtype=torch.float16)
        assert out.dtype == torch.float16 and rel_err(out, ref) < 2e-3


def test_mla_decode_takes_fp8_queries(device):
    b = make_batch([20, 3], 16, device=device, generator=gen(15))
    qn, qp, s, values = fp8_queries(b, "rows", device)
    out = mla_decode(qn, qp, b.ckv, b.kpe, b.kv_indptr, b.kv_indices, b.kv_len,
                     sm_scale=SM_SCALE, q_scale=s, **b.scale_kwargs())  # fmt: skip
    assert out.dtype == torch.bfloat16 and rel_err(out, ref_of(b, values)[0]) < TOL["hi+lo"]


def test_errors(device):
    b = make_batch([5], 16, device=device, generator=gen(8))
    qn, qp, s, _ = fp8_queries(b, "float", device)
    w = BatchMLAPagedAttentionWrapper(workspace(device), backend="triton")
    args = (*b.plan_args(), 16, 512, 64, 1, False, SM_SCALE)
    with pytest.raises(ValueError, match="quantize_q"):
        w.plan(*args, E4M3, b.ckv.dtype, quantize_q=True)
    with pytest.raises(ValueError, match="o_data_type"):
        w.plan(*args, torch.bfloat16, b.ckv.dtype, o_data_type=torch.float16)
    with pytest.raises(ValueError, match="q_data_type"):
        w.plan(*args, torch.float8_e5m2, b.ckv.dtype)
    w.plan(*args, E4M3, b.ckv.dtype)
    kv = dict(b.scale_kwargs())
    with pytest.raises(ValueError, match="q_scale"):
        w.run(qn, qp, b.ckv, b.kpe, q_scale=torch.ones(3, 16, device=device), **kv)
    with pytest.raises(ValueError, match="q_scale"):
        w.run(qn, qp, b.ckv, b.kpe, q_scale=-1.0, **kv)
    with pytest.raises(ValueError, match="q_nope"):
        w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, q_scale=s, **kv)
    with pytest.raises(ValueError, match="Q_FP8"):
        w.plan(*args, torch.bfloat16, b.ckv.dtype, kernel_options={"Q_FP8": 1})
    w.plan(*args, torch.bfloat16, b.ckv.dtype)
    with pytest.raises(ValueError, match="q_scale"):
        w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, q_scale=s, **kv)


@pytest.mark.parametrize(
    "target,config,forced,direct,mode",
    [
        ("sm90", None, None, True, QF8_DOT),  # pingpong8's FP8-query build (four stages)
        ("sm90", "rows", None, True, QF8_DOT),  # forced: the portable FP8 build
        ("sm90", "pingpong8", None, True, QF8_DOT),
        ("sm90", "pingpong8", QF8_DOT, True, QF8_DOT),
        ("sm90", "fp8qk", None, True, QF8_DOT),  # its FP8-query build is the planner's route
        ("sm90", "fp8qk", 0, False, 0),  # named off: converted
        ("sm90", "fp8qk", QF8_DOT, True, QF8_DOT),
        ("sm90", "fp8qk", QF8_CVT, True, QF8_DOT),  # a Gluon kernel has one FP8-query build
        ("sm90", "pingpong8", 0, False, 0),
        ("sm90", "wgmma", QF8_DOT, False, 0),  # no FP8-query build: converted
        ("sm89", None, None, True, QF8_DOT),
        ("sm100", None, None, True, QF8_DOT),  # the value-split kernel at 128 rows
        ("sm80", None, None, True, QF8_CVT),  # no FP8 tensor cores: codes decoded to fp16
        ("gfx942", None, None, True, QF8_CVT),
        ("interpreter", None, None, True, QF8_DOT),
    ],
)
def test_routing_rule(target, config, forced, direct, mode):
    """The registry's rule per target, for 1 × 128 heads decode over an e4m3 pool
    (``forced``: the build ``kernel_options={"Q_FP8": ...}`` names)."""
    t = INTERPRETER if target == "interpreter" else TARGETS[target]
    plan = make_launch_plan(batch=64, num_heads=128, max_qo_len=1, max_kv_len=4096, sms=132,
                            max_splits_by_workspace=64, target=t, config=config)  # fmt: skip
    q = route_queries(QueryPlan(E4M3, False, True, 0), plan.config, t, E4M3, torch.bfloat16,
                      forced)  # fmt: skip
    assert (q.direct, q.mode) == (direct, mode)


@pytest.mark.parametrize(
    "batch,heads,qo_len,variant,direct",
    [
        (32, 32, 1, "fp8qk", True),  # the FP8 × FP8 kernel reads the codes itself
        (64, 16, 1, "fp8qk", True),
        (64, 64, 1, "fp8qk", True),  # 32-row tiles
        (8, 16, 4, "fp8qk", True),  # speculative rows
        (1, 32, 1, "fewrows", False),  # no FP8-query build: converted
        (64, 128, 1, "pingpong8", True),  # its build at four stages
    ],
)
def test_sm90_planner_routes(batch, heads, qo_len, variant, direct):
    """FP8 queries on SM90 as the planner sends them, unasked: to the FP8 × FP8 kernel's own
    FP8-query build where the planner chooses that kernel, converted for the others."""
    t = TARGETS["sm90"]
    plan = make_launch_plan(batch=batch, num_heads=heads, max_qo_len=qo_len, max_kv_len=4096,
                            sms=132, max_splits_by_workspace=64, target=t)  # fmt: skip
    q = route_queries(QueryPlan(E4M3, False, True, 0), plan.config, t, E4M3, torch.bfloat16)
    assert plan.config.variant == variant
    assert (q.direct, q.mode) == (direct, QF8_DOT if direct else 0)


def test_fp16_output_plans_the_portable_kernels():
    """FP8 queries with ``o_data_type=fp16``: the Gluon kernels write bf16 only, so the SM90
    planner takes the portable kernels (row tiles, the value split above 64 rows)."""
    from fp8mla.attention.variants import get_variant

    for heads, variant in ((16, "rows"), (64, "rows"), (128, "vsplit")):
        plan = make_launch_plan(batch=64, num_heads=heads, max_qo_len=1, max_kv_len=4096,
                                sms=132, max_splits_by_workspace=64, target=TARGETS["sm90"],
                                portable=True)  # fmt: skip
        assert plan.config.variant == variant and not get_variant(variant).gluon


def test_flashinfer_lengths(device):
    """FlashInfer's test lengths (0 … 1,024), page size 64, the default route (on SM90 the
    FP8 × FP8 kernel's FP8-query build; a converted route's bf16 rounding of ``q × q_scale``
    would move the LSE by up to ~1e-2)."""
    b = make_batch([0, 1, 17, 33, 96, 97, 114, 514, 1024], 16, page_size=64, device=device,
                   generator=gen(12))  # fmt: skip
    qn, qp, s, values = fp8_queries(b, "tensor", device)
    w, out, lse = run_fp8(b, qn, qp, s)
    check(out, lse, *ref_of(b, values), TOL["hi+lo"], lse_tol=2e-3 if w._queries.direct else 1.5e-2)


def test_on_request_builds_carry_the_variants_options():
    """The compile matrix's FP8-query builds of pingpong8 are the ones its launches compile:
    the variant's own options for that build (four stages), and its FP8 value products."""
    from fp8mla.tools.fp8_query_builds import on_request_builds

    pp8 = [(label, dict(b.constexprs)) for label, b, tile in on_request_builds(TARGETS["sm90"])
           if tile.endswith("pingpong8")]  # fmt: skip
    assert pp8 and all(c["STAGES"] == 4 and c["Q_FP8"] == QF8_DOT for _, c in pp8)
    assert {label for label, c in pp8 if c.get("PV_FP8") == 1} == {
        "e4m3 64x64 pingpong8 w4 split+pv8 fp8q",
        "e5m2 64x64 pingpong8 w4 split+pv8 fp8q",
    }


# -- on a GPU (the next device session): both routes, CUDA graphs -------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("config", [None, "rows"])  # SM90: converted (Gluon) / portable FP8
@pytest.mark.parametrize("form", ["float", "tensor", "rows"])
def test_gpu_routes_at_128_heads(config, form):
    b = make_batch([17, 300, 1024, 4096], 128, page_size=1, device="cuda", generator=gen(10))
    qn, qp, s, values = fp8_queries(b, form, "cuda")
    w, out, lse = run_fp8(b, qn, qp, s, config=config)
    check(out, lse, *ref_of(b, values), 1e-2, lse_tol=1.5e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["float", "tensor", "rows"])
@pytest.mark.parametrize(
    "scale_mode,page_size,qo_lens,splits,kv_dtype",
    [
        ("tensor", 1, 1, 1, E4M3),  # unsplit, the bf16 output
        ("tensor", 64, 1, 3, E4M3),  # split partials and their merge
        ("token_group", 64, 1, 2, E4M3),
        ("tensor", 64, 2, 2, E4M3),  # speculative rows, causal: two 64-row programs a token
        ("tensor", 1, 1, 2, torch.float8_e5m2),
    ],
)
def test_gpu_pingpong8_fp8_build(form, scale_mode, page_size, qo_lens, splits, kv_dtype):
    """pingpong8's FP8-query build, named (``Q_FP8`` 2): the e4m3 codes as the score operand
    of its FP8 wgmma and each row's scale, at 128 heads, against float64 (empty and one-token
    requests, NaN in unused slots)."""
    # (a causal request holds at least its own query tokens)
    b = make_batch([0, qo_lens, 300, 1024, 4096], 128, qo_lens=qo_lens, page_size=page_size,
                   kv_dtype=kv_dtype, scale_mode=scale_mode, device="cuda",
                   generator=gen(14))  # fmt: skip
    qn, qp, s, values = fp8_queries(b, form, "cuda")
    causal = qo_lens > 1
    w, out, lse = run_fp8(b, qn, qp, s, causal=causal, config="pingpong8", splits=splits,
                          options={"Q_FP8": QF8_DOT})  # fmt: skip
    assert w.launch_info.variant == "pingpong8" and w._queries.direct
    check(out, lse, *ref_of(b, values, causal=causal), 4e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["float", "tensor", "rows"])
@pytest.mark.parametrize(
    "heads,scale_mode,page_size,qo_lens,splits,kv_dtype",
    [
        (16, "tensor", 1, 1, 1, E4M3),  # 16-row tiles, unsplit: the bf16 output
        (32, "tensor", 64, 1, 3, E4M3),  # fp16 split partials and their merge
        (32, "token_group", 64, 1, 2, E4M3),
        (16, "tensor", 64, 4, 2, E4M3),  # 64 rows a request in 32-row tiles, causal
        (64, "tensor", 1, 1, 2, torch.float8_e5m2),  # 64 heads: row tiles
    ],
)
def test_gpu_fp8qk_fp8_build(form, heads, scale_mode, page_size, qo_lens, splits, kv_dtype):
    """fp8qk's FP8-query build, named (``Q_FP8`` 2): the codes in the hi rows of its score
    operand, zero lo rows, each row's scale, against float64 (empty and one-token requests,
    NaN in unused slots)."""
    b = make_batch([0, qo_lens, 300, 1024, 4096], heads, qo_lens=qo_lens, page_size=page_size,
                   kv_dtype=kv_dtype, scale_mode=scale_mode, device="cuda",
                   generator=gen(15))  # fmt: skip
    qn, qp, s, values = fp8_queries(b, form, "cuda")
    causal = qo_lens > 1
    w, out, lse = run_fp8(b, qn, qp, s, causal=causal, config="fp8qk", splits=splits,
                          options={"Q_FP8": QF8_DOT})  # fmt: skip
    assert w.launch_info.variant == "fp8qk" and w._queries.direct
    check(out, lse, *ref_of(b, values, causal=causal), 4e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("options", [None, CONVERTED, {"Q_FP8": QF8_CVT}])
@pytest.mark.parametrize("quantize", [False, True], ids=["fp8", "quantize_q"])
def test_cuda_graph_replay(options, quantize):
    """A captured run() replayed after new queries and a new device q_scale are written in
    place: the scale is read on the device at every replay."""
    dev, cap = "cuda", 8
    bufs = [torch.empty(n, dtype=torch.int32, device=dev) for n in (cap + 1, cap + 1, 4096, cap)]
    w = BatchMLAPagedAttentionWrapper(workspace(dev), True, *bufs, backend="triton")
    b = make_batch([300] * cap, 16, page_size=16, pool_pages=4096, device=dev, generator=gen(11))
    q_dtype = torch.bfloat16 if quantize else E4M3
    w.plan(*b.plan_args(), 16, 512, 64, 16, False, SM_SCALE, q_dtype, b.ckv.dtype,
           kernel_options=options, quantize_q=quantize)  # fmt: skip
    qn, qp, s, _ = fp8_queries(b, "tensor", dev)
    if quantize:
        qn, qp = b.q_nope.clone(), b.q_pe.clone()
    kw = dict(b.scale_kwargs(), **({} if quantize else {"q_scale": s}))
    out = torch.empty(qn.shape, dtype=torch.bfloat16, device=dev)
    w.run(qn, qp, b.ckv, b.kpe, out=out, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(qn, qp, b.ckv, b.kpe, out=out, **kw)
    # new queries (and scale) for b's pool and page table
    fresh = make_batch([300] * cap, 16, page_size=16, pool_pages=4096, device=dev,
                       generator=gen(13))  # fmt: skip
    if quantize:
        qn.copy_(fresh.q_nope)
        qp.copy_(fresh.q_pe)
        values = tuple(v.double() for v in quantize_rows(fresh.q_nope, fresh.q_pe)[:2])
    else:
        n2, p2, s2, values = fp8_queries(fresh, "tensor", dev)
        qn.copy_(n2)
        qp.copy_(p2)
        s.copy_(s2)
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, ref_of(b, values)[0]) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("queries", ["bf16", "e4m3"])
@pytest.mark.parametrize(
    "page_size,qo_lens,splits,kv_dtype",
    [
        (1, 1, 1, E4M3),  # unsplit, the bf16 output
        (64, 1, 3, E4M3),  # split partials and their merge
        (64, 2, 2, E4M3),  # speculative rows, causal
        (1, 1, 2, torch.float8_e5m2),
    ],
)
def test_gpu_pingpong8_fp8_values(queries, page_size, qo_lens, splits, kv_dtype):
    """pingpong8's FP8 value products, named (``PV_FP8``): ``P`` rounded once to e4m3 against
    the stage's bytes as they are, bf16 or e4m3 queries, at 128 heads, against float64 (empty
    and one-token requests, NaN in unused slots)."""
    b = make_batch([0, qo_lens, 300, 1024, 4096], 128, qo_lens=qo_lens, page_size=page_size,
                   kv_dtype=kv_dtype, scale_mode="tensor", device="cuda",
                   generator=gen(16))  # fmt: skip
    causal = qo_lens > 1
    opts = {"PV_FP8": 1}
    if queries == "e4m3":
        qn, qp, s, values = fp8_queries(b, "tensor", "cuda")
        opts["Q_FP8"] = QF8_DOT
        w, out, lse = run_fp8(b, qn, qp, s, causal=causal, config="pingpong8", splits=splits,
                              options=opts)  # fmt: skip
    else:
        values = (b.q_nope.double(), b.q_pe.double())
        w = BatchMLAPagedAttentionWrapper(workspace(b.q_nope.device), backend="triton")
        w.plan(*b.plan_args(), b.num_heads, 512, 64, b.page_size, causal, SM_SCALE,
               b.q_nope.dtype, b.ckv.dtype, num_splits=splits, kernel_config="pingpong8",
               kernel_options=opts)  # fmt: skip
        out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, return_lse=True, **b.scale_kwargs())
    assert w.launch_info.variant == "pingpong8"
    check(out, lse, *ref_of(b, values, causal=causal), TOL["once"])
