"""The launcher's direct path: a kernel compiled by Triton's first launch is called again only
with arguments of the same specialization (16-byte aligned pointers, strides divisible by 16),
in parameter order, constexpr defaults included; anything else takes Triton's own path."""

from __future__ import annotations

import pytest
import torch

from fp8mla.attention import kernel_launcher as KL
from fp8mla.attention import launch as L
from fp8mla.attention.variants import REGISTRY
from fp8mla.attention.workspace import Partials
from fp8mla.testing import make_batch

from attention_utils import SM_SCALE, assert_matches_reference


class _Param:
    def __init__(self, name, default=None):
        self.name = name
        self.default = default
        self.has_default = default is not None


class _Compiled:
    packed_metadata = "meta"
    function = "fn"

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


class _Kernel:
    """Stands in for a JITFunction: records Triton-path launches, returns a compiled kernel."""

    arg_names = ["a_ptr", "n", "BLOCK"]
    params = [_Param("a_ptr"), _Param("n"), _Param("BLOCK", 64)]

    def __init__(self):
        self.compiled = _Compiled()
        self.triton_launches = []

    def __getitem__(self, grid):
        def launch(**kw):
            self.triton_launches.append((grid, kw))
            return self.compiled

        return launch


def test_first_launch_compiles_then_direct_calls(monkeypatch):
    monkeypatch.setattr(KL, "current_stream", lambda device: 7)
    monkeypatch.setattr(KL.KernelLauncher, "_direct_ok", staticmethod(lambda: True))
    k = _Kernel()
    launcher = KL.KernelLauncher(k, (2, 3, 4), {"num_warps": 4})
    launcher.launch({"a_ptr": "A", "n": 5}, key=("aligned",))
    assert len(k.triton_launches) == 1 and k.triton_launches[0][1]["num_warps"] == 4
    launcher.launch({"a_ptr": "B", "n": 6}, key=("aligned",))
    assert len(k.triton_launches) == 1
    (call,) = k.compiled.calls
    assert call == (2, 3, 4, 7, "fn", "meta", None, None, None, "B", 6, 64)
    # another specialization, or none: Triton's path
    launcher.launch({"a_ptr": "C", "n": 7}, key=("other",))
    launcher.launch({"a_ptr": "D", "n": 8}, key=None)
    assert len(k.triton_launches) == 3 and len(k.compiled.calls) == 1


def test_profiler_hooks_take_tritons_path(monkeypatch):
    monkeypatch.setattr(KL.KernelLauncher, "_direct_ok", staticmethod(lambda: False))
    k = _Kernel()
    launcher = KL.KernelLauncher(k, (1, 1, 1), {})
    for _ in range(3):
        launcher.launch({"a_ptr": "A", "n": 1}, key=("aligned",))
    assert len(k.triton_launches) == 3 and not k.compiled.calls


@pytest.mark.parametrize("gap", [-(2**40) + 48, -4096, -3, 0, 5, 2**33 + 7])
def test_nan_offset_lands_in_the_nan_row_and_keeps_divisibility(gap):
    """From an FP8 cache ``gap`` bytes from the NaN-row buffer, the offset reaches a whole
    576-byte row inside the buffer and is a multiple of 16 (Triton's divisibility)."""
    nan = 1 << 44
    off = L._nan_offset(nan + gap, 1, nan)
    assert off % 16 == 0
    row = nan + gap + off
    assert nan <= row and row + 576 <= nan + L.NAN_ROW_ELEMENTS


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.float16,
                                   torch.bfloat16])  # fmt: skip
def test_nan_row_is_nan_in_the_cache_dtype(dtype):
    """The row a bad page entry's token reads is NaN in the dtype the kernel reads it as."""
    row = L.nan_row(torch.device("cpu"), dtype.itemsize)
    assert row.numel() == L.NAN_ROW_ELEMENTS * dtype.itemsize
    assert torch.isnan(row.view(dtype).float()).all()


def test_specialization_checks():
    base = torch.empty(64, dtype=torch.uint8)
    assert KL.aligned16(base[0:16], base[32:48]) == (base.data_ptr() % 16 == 0)
    assert not KL.aligned16(base[0:16], base[1:17]) or base.data_ptr() % 16 != 0
    assert KL.all16((16, 576, 512 * 16))
    assert not KL.all16((16, 8))
    assert not KL.all16((0, 16))  # 0 is not divisible in Triton's sense
    assert not KL.all16((1,))


class _Recorder:
    """Stands in for a compiled kernel and its JITFunction: Triton-path launches record their
    arguments by name, direct launches by position."""

    packed_metadata = "meta"
    function = "fn"

    def __init__(self):
        self.by_name = []
        self.positional = []

    def __getitem__(self, grid):
        def launch(**kw):
            self.by_name.append(kw)
            return self

        return launch

    def run(self, *args):
        self.positional.append(list(args[9:]))


def _same(direct, named) -> bool:
    """A direct launch passes tensors as their addresses (ints); Triton's path passes the
    tensors (byte views of FP8 caches)."""
    if isinstance(named, torch.Tensor):
        return type(direct) is int and direct == named.data_ptr()
    return direct == named and type(direct) is type(named)


@pytest.mark.parametrize("variant, splits", [(v, s) for v in sorted(REGISTRY) for s in (1, 4)])
def test_direct_arguments_match_tritons_path(monkeypatch, variant, splits):
    """A direct launch passes, position by position, what Triton's path binds by name, for
    calls that change every run()-time input: pool, queries, output, LSE, scales' kinds."""

    from attention_utils import pool_dtype_for, sm90_launch, sm90_launch_inputs

    monkeypatch.setattr(KL, "current_stream", lambda device: 0)
    monkeypatch.setattr(KL.KernelLauncher, "_direct_ok", staticmethod(lambda: True))
    heads = 16
    launch = sm90_launch(variant, splits, heads)
    kernels = [launch.kernel] + ([launch.merge] if launch.merge else [])
    recorders = []
    for k in kernels:
        k.fn = _Recorder()
        recorders.append(k.fn)

    def make(pool_slots, lse, scale):
        return sm90_launch_inputs(heads, pool_slots, lse, scale, pool_dtype_for(variant))

    inputs = [make(16, False, 0.5), make(32, True, torch.full((1,), 2.0)), make(48, False, 0.25)]
    for x in inputs + inputs:  # the first of each specialization compiles, later ones go direct
        launch(*x)
    direct = [rec.positional for rec in recorders]
    for launcher, rec in zip(kernels, recorders):
        assert launcher.direct_launches == 4 and len(rec.by_name) == 2
        launcher._compiled.clear()
        rec.by_name.clear()
    # the four direct launches' calls again, through Triton's path alone
    monkeypatch.setattr(KL.KernelLauncher, "_direct_ok", staticmethod(lambda: False))
    for x in inputs[2:] + inputs:
        launch(*x)
    for x, named in zip(inputs[2:] + inputs, recorders[0].by_name):
        assert (
            _expected_call_args(x, split=splits > 1, q_copied=launch.q_fp16).items()
            <= {
                k: (v.data_ptr() if isinstance(v, torch.Tensor) else v) for k, v in named.items()
            }.items()
        )
    for launcher, rec, positional in zip(kernels, recorders, direct):
        assert len(positional) == len(rec.by_name) == 4
        for pos, named in zip(positional, rec.by_name):
            expect = [named.get(n, launcher.defaults.get(n)) for n in launcher.names]
            bad = [n for n, a, b in zip(launcher.names, pos, expect) if not _same(a, b)]
            if launch.q_fp16 and bad[:1] == ["q_nope_ptr"]:  # a fresh fp16 copy per call
                q = named["q_nope_ptr"]
                assert q.dtype == torch.float16 and q.is_contiguous()
                assert type(pos[launcher.names.index("q_nope_ptr")]) is int
                bad = bad[1:]
            assert not bad, f"{variant}: direct launch differs in {bad}"


def _expected_call_args(x, split: bool, q_copied: bool) -> dict:
    """What the attention kernel must receive from one run(), derived from its inputs alone
    (tensors as data pointers); ``q_copied``: the tile reads a contiguous fp16 copy of
    ``q_nope`` made for the call."""
    qn, qp, ckv, kpe, out, lse, sc = x
    cs_ptr = isinstance(sc.ckv, torch.Tensor)
    want = dict(
        q_nope_ptr=qn.data_ptr(), q_pe_ptr=qp.data_ptr(), ckv_ptr=ckv.data_ptr(),
        kpe_ptr=kpe.data_ptr(), stride_qn_t=qn.stride(0), stride_qn_h=qn.stride(1),
        stride_qp_t=qp.stride(0), stride_qp_h=qp.stride(1), stride_ckv_p=ckv.stride(0),
        stride_ckv_s=ckv.stride(1), stride_kpe_p=kpe.stride(0), stride_kpe_s=kpe.stride(1),
        num_pages=ckv.shape[0], num_tokens=qn.shape[0], PAGE_SIZE=ckv.shape[1],
        CKV_SCALE_PTR=cs_ptr, KPE_SCALE_PTR=cs_ptr, TOKEN_GROUP=False,
        ckv_scale_val=1.0 if cs_ptr else sc.ckv, kpe_scale_val=1.0 if cs_ptr else sc.kpe,
    )  # fmt: skip
    if q_copied:
        del want["q_nope_ptr"]
        want.update(stride_qn_t=qn.shape[1] * 512, stride_qn_h=512)
    if cs_ptr:
        want.update(ckv_scale_ptr=sc.ckv.data_ptr(), kpe_scale_ptr=sc.kpe.data_ptr())
    if not split:
        want.update(o_ptr=out.data_ptr(), stride_o_t=out.stride(0), stride_o_h=out.stride(1),
                    WRITE_LSE=lse is not None)  # fmt: skip
        if lse is not None:
            want.update(lse_ptr=lse.data_ptr(), stride_lse_t=lse.stride(0))
    return want


@pytest.mark.parametrize("waits", [False, True])
def test_merge_launch_follows_the_plans_dependency(waits):
    """A plan whose merge waits on the attention grid compiles the merge with the wait and
    launches it with Triton's programmatic-dependency attribute; otherwise neither."""
    from fp8mla.attention.config import LaunchPlan
    from fp8mla.attention.planner import tile_for_variant
    from fp8mla.attention.targets import TARGETS

    heads, fp8 = 16, torch.float8_e4m3fn
    cfg = tile_for_variant("rows", heads, fp8, TARGETS["sm90"])
    plan = LaunchPlan(cfg, 1, 4, merge_waits=waits)
    i32 = dict(dtype=torch.int32)
    idx = (torch.tensor([0, 1], **i32), torch.tensor([0, 5], **i32), torch.arange(5, **i32),
           torch.tensor([5], **i32))  # fmt: skip
    launch = L.AttentionLaunch(
        plan, batch=1, heads=heads, head_dim_kpe=64, page_size=1, causal=False,
        sm_scale=0.1, indices=idx, partials=Partials(torch.zeros(4, heads, 512), torch.zeros(4, heads)),
        kv_dtype=fp8, device=torch.device("cpu"), target=TARGETS["sm90"], interpreted=False,
    )  # fmt: skip
    assert launch.merge.options.get("launch_pdl", False) == waits
    assert launch.merge_fixed["WAIT_PRIOR"] == waits


@pytest.mark.parametrize("variant", ["fewrows"])
def test_a_plan_of_two_row_tiles_for_a_one_tile_kernel_is_refused(variant):
    """A LaunchPlan made by hand with two row tiles of a kernel that takes one (the planner
    never makes one): a ValueError, not a launch that leaves the second tile's rows unwritten."""
    from fp8mla.attention.config import KernelConfig, LaunchPlan
    from fp8mla.attention.targets import TARGETS

    cfg = KernelConfig(16, 64, 4, 1, variant=variant, fp8_cvt="ptx")
    i32 = dict(dtype=torch.int32)
    idx = (torch.tensor([0, 1], **i32), torch.tensor([0, 5], **i32), torch.arange(5, **i32),
           torch.tensor([5], **i32))  # fmt: skip
    with pytest.raises(ValueError, match="one row tile per request"):
        L.AttentionLaunch(
            LaunchPlan(cfg, 2, 1), batch=1, heads=32, head_dim_kpe=64, page_size=1,
            causal=False, sm_scale=0.1, indices=idx, partials=None,
            kv_dtype=torch.float8_e4m3fn, device=torch.device("cpu"), target=TARGETS["sm90"],
            interpreted=False,
        )  # fmt: skip


@pytest.mark.parametrize("variant", ["fewrows", "fp8qk", "pingpong8"])
@pytest.mark.parametrize("splits", [1, 4])
def test_attention_waits_compiles_the_wait_and_launches_as_a_dependent(variant, splits):
    """A plan whose attention kernel waits on the grid before it compiles the kernel with the
    wait (before its first global read) and launches it with Triton's programmatic-dependency
    attribute; its split merge then lets the next grid launch from its start."""
    from attention_utils import sm90_launch

    launch = sm90_launch(variant, splits, merge_waits=splits > 1, attention_waits=True)
    assert launch.kernel.options["launch_pdl"] and launch.fixed["WAIT_PRIOR"]
    assert launch.merge is None or launch.merge_fixed["LAUNCH_NEXT"]
    plain = sm90_launch(variant, splits, merge_waits=splits > 1)
    assert "launch_pdl" not in plain.kernel.options and "WAIT_PRIOR" not in plain.fixed
    assert plain.merge is None or not plain.merge_fixed["LAUNCH_NEXT"]


def test_unaligned_output_takes_tritons_path_for_the_merge_too(monkeypatch):
    """A compiled kernel assumes 16-byte aligned pointers: an output view that is not aligned
    must not reach the merge kernel compiled for aligned ones."""
    from fp8mla.attention.config import LaunchPlan
    from fp8mla.attention.planner import tile_for_variant
    from fp8mla.attention.targets import TARGETS
    from fp8mla.formats import Scales

    monkeypatch.setattr(KL, "current_stream", lambda device: 0)
    monkeypatch.setattr(KL.KernelLauncher, "_direct_ok", staticmethod(lambda: True))
    heads, fp8 = 16, torch.float8_e4m3fn
    plan = LaunchPlan(tile_for_variant("rows", heads, fp8, TARGETS["sm90"]), 1, 4)
    i32 = dict(dtype=torch.int32)
    idx = (torch.tensor([0, 1], **i32), torch.tensor([0, 5], **i32), torch.arange(5, **i32),
           torch.tensor([5], **i32))  # fmt: skip
    partials = Partials(torch.zeros(4, heads, 512), torch.zeros(4, heads))
    launch = L.AttentionLaunch(
        plan, batch=1, heads=heads, head_dim_kpe=64, page_size=1, causal=False,
        sm_scale=0.1, indices=idx, partials=partials, kv_dtype=fp8,
        device=torch.device("cpu"), target=TARGETS["sm90"], interpreted=False,
    )  # fmt: skip
    launch.kernel.fn, launch.merge.fn = _Recorder(), _Recorder()
    pool = torch.zeros(8, 1, 576, dtype=torch.uint8).view(fp8)
    q = torch.zeros(1, heads, 576, dtype=torch.bfloat16)
    args = (q[..., :512], q[..., 512:], pool[..., :512], pool[..., 512:])
    aligned = torch.empty(1, heads, 512, dtype=torch.bfloat16)
    for _ in range(2):
        launch(*args, aligned, None, Scales())
    assert launch.merge.direct_launches == 1
    shifted = torch.empty(1 * heads * 512 + 1, dtype=torch.bfloat16)[1:].view(1, heads, 512)
    launch(*args, shifted, None, Scales())
    assert launch.merge.direct_launches == 1 and len(launch.merge.fn.by_name) == 2


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.gpu
@pytest.mark.parametrize("bound", [True, False], ids=["bound", "direct"])
@pytest.mark.parametrize("heads, qo_len", [(16, 1), (32, 1), (16, 2), (128, 1)])
def test_direct_launch_matches_tritons_path(monkeypatch, heads, qo_len, bound):
    """The second and later run() of a plan launch the compiled kernels with their arguments
    bound at plan() (``attention/native.py``), or call them directly where that is off: same
    result, and a changed pool, queries, output, LSE or scales are picked up."""
    from fp8mla import BatchMLAPagedAttentionWrapper
    from fp8mla.attention import native

    from attention_utils import workspace

    if bound and native.module() is None:
        pytest.skip("the launcher extension cannot be built here")
    if not bound:
        monkeypatch.setattr(native, "bind", lambda *a, **k: None)

    b = make_batch([5, 700, 64], heads, qo_lens=qo_len, page_size=1, device="cuda",
                   generator=_gen(24))  # fmt: skip
    w = BatchMLAPagedAttentionWrapper(workspace("cuda"), backend="triton")
    w.plan(*b.plan_args(), heads, 512, 64, 1, qo_len > 1, SM_SCALE, torch.bfloat16,
           b.ckv.dtype)  # fmt: skip
    for step in range(3):
        if step:
            fresh = make_batch([5, 700, 64], heads, qo_lens=qo_len, page_size=1, device="cuda",
                               fill_unused_nan=False, generator=_gen(25 + step))  # fmt: skip
            b.pool.copy_(fresh.pool)
            b.q_nope.copy_(fresh.q_nope)
            b.q_pe.copy_(fresh.q_pe)
        out, lse = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, return_lse=True, **b.scale_kwargs())
        assert_matches_reference(b, out, lse, causal=qo_len > 1)
    fast = w._launch.native_launches if bound else w._launch.kernel.direct_launches
    assert fast >= 2, "the bound or direct path never engaged"
    # new tensors on every call: a pool with a wider row (other strides), queries and an output
    # elsewhere or allocated by run(), no LSE / one returned / one passed in, the scales as
    # floats, device tensors or one of each (each kind twice: its second call takes the bound
    # or direct path, the C path for the kinds it takes)
    kinds = [("none", "tensor", True), ("alloc", "float", True), ("none", "float", False),
             ("given", "float", True), ("given", "tensor", False), ("none", "mixed", True)]  # fmt: skip
    for step, (lse_mode, scale_kind, out_given) in enumerate(kinds * 2):
        fresh = make_batch([5, 700, 64], heads, qo_lens=qo_len, page_size=1, device="cuda",
                           fill_unused_nan=False, generator=_gen(40 + step))  # fmt: skip
        wide = torch.zeros(b.pool.shape[0], 1, 576 + 16 * (step + 1), dtype=b.pool.dtype,
                           device="cuda")  # fmt: skip
        wide[..., :576] = fresh.pool
        b.pool, b.ckv = wide, wide[..., :512]
        b.kpe = wide[..., 512:576]
        b.q_nope, b.q_pe = fresh.q_nope.clone(), fresh.q_pe.clone()
        kw = b.scale_kwargs()
        if scale_kind != "float" and "ckv_scale" in kw:
            kw["ckv_scale"] = torch.tensor([kw["ckv_scale"]], device="cuda")
            if scale_kind == "tensor":
                kw["kpe_scale"] = torch.tensor([kw["kpe_scale"]], device="cuda")
        out = torch.full_like(b.q_nope, float("nan")) if out_given else None
        lse_in = torch.full((b.q_nope.shape[0], heads), float("nan"), device="cuda")
        lse_in = lse_in if lse_mode == "given" else None
        res = w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, out, lse_in,
                    return_lse=lse_mode != "none", **kw)  # fmt: skip
        out_, lse_ = res if lse_mode != "none" else (res, None)
        assert out is None or out_ is out
        assert lse_in is None or lse_ is lse_in
        assert_matches_reference(b, out_, lse_, causal=qo_len > 1)
    later = w._launch.native_launches if bound else w._launch.kernel.direct_launches
    assert later >= fast + 3, "new tensors never took the bound or direct path"
    # after the fast paths engaged, a bad call still gets the Python path's errors
    with pytest.raises(ValueError, match="q_nope"):
        w.run(b.q_nope[:, :1], b.q_pe, b.ckv, b.kpe, out_, **kw)
    with pytest.raises(ValueError, match="out"):
        w.run(b.q_nope, b.q_pe, b.ckv, b.kpe, out_.float(), **kw)
