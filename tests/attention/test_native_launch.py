"""Bound launches (``attention/native.py``): the parameter block a native launch hands the
driver holds, parameter by parameter, what Triton's own launcher would pass for the same
run(); kernels or builds it does not handle are left to Triton's path."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
import torch

from fp8mla.attention import kernel_launcher as KL
from fp8mla.attention import launch as L
from fp8mla.attention import native
from fp8mla.attention.variants import REGISTRY, get_variant

pytestmark = pytest.mark.skipif(native.module() is None, reason="no C compiler for the launcher")


@pytest.fixture(params=["cxx", "python"])
def fields(request):
    """run()'s C path reading tensors through the C++ accessor, or through their Python
    methods (where the accessor cannot be built); both must take and decline the same calls
    and fill the same parameters."""
    mod = native.module()
    accessor = native.fields_module()
    if request.param == "cxx" and accessor is None:
        pytest.skip("no C++ accessor on this machine")
    mod.set_fields(accessor.fields if request.param == "cxx" else None)
    yield request.param
    mod.set_fields(None if accessor is None else accessor.fields)


_UNPACK = {"p": "<Q", "L": "<q", "i": "<i", "I": "<I", "b": "<b", "B": "<B", "f": "<f"}


def _specialize(value, param, dns: set[str]) -> str:
    """The type Triton's specialization gives ``value`` for ``param`` (what it compiles)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    if param.is_constexpr:
        return "constexpr"
    ty = native_specialize_impl(BaseBackend, value, False, param.name not in dns, True)[0]
    return ty


def _jit(fn):
    """The JITFunction of a kernel (under the interpreter its wrapper has no parameters)."""
    if hasattr(fn, "params"):
        return fn
    from triton.runtime.jit import JITFunction

    return JITFunction(fn.fn, **fn.kwargs)


class _Compiled:
    """A kernel as Triton compiles it: handle, metadata, and the signature of the first
    call's arguments."""

    def __init__(self, fn, kw: dict, defaults: dict, pdl: bool):
        dns = set(getattr(fn, "do_not_specialize", ()) or ())
        dns = {fn.arg_names[d] if isinstance(d, int) else d for d in dns}
        args = {**defaults, **kw}
        self.src = SimpleNamespace(
            fn=fn, signature={p.name: _specialize(args[p.name], p, dns) for p in fn.params}
        )
        self.metadata = SimpleNamespace(num_warps=4, shared=1024, launch_pdl=pdl,
                                        global_scratch_size=0, profile_scratch_size=0,
                                        num_ctas=1)  # fmt: skip
        self.function = 0x1234
        self.packed_metadata = (4, 1, 1024)


class _Recorder:
    """Stands in for the JITFunction: Triton-path launches record their arguments by name and
    return a compiled kernel with the signature those arguments specialize to."""

    def __init__(self, fn, defaults, pdl):
        self.fn, self.defaults, self.pdl = fn, defaults, pdl
        self.by_name = []

    def __getitem__(self, grid):
        def launch(**kw):
            self.by_name.append(kw)
            return _Compiled(self.fn, kw, self.defaults, self.pdl)

        return launch


def _recorded_launch(monkeypatch, variant: str, splits: int, index_lists: bool = False):
    """An SM90 launch (``attention_utils.sm90_launch``, its merge a programmatic dependent)
    whose kernels record Triton-path launches, and whose bound launches record the parameter
    blocks they would hand the driver (in ``sent``) instead of launching."""
    from attention_utils import sm90_launch

    monkeypatch.setattr(KL, "current_stream", lambda device: 0)
    monkeypatch.setattr(KL.KernelLauncher, "_direct_ok", staticmethod(lambda: True))
    waits = get_variant(variant).launches_dependents  # as the planner launches it on SM90
    launch = sm90_launch(variant, splits, merge_waits=splits > 1, attention_waits=waits,
                         index_lists=index_lists)  # fmt: skip
    kernels = [launch.kernel] + ([launch.merge] if launch.merge else [])
    fns = [_jit(k.fn) for k in kernels]
    for k, fn in zip(kernels, fns):
        k.fn = _Recorder(fn, k.defaults, k.options.get("launch_pdl", False))
    sent: list[list[bytes]] = []

    def fake_launch(stream, a, avals, b, bvals):
        a.fill(avals)
        if b is not None:
            b.fill(bvals)
        sent.append([a.packed()] + ([b.packed()] if b is not None else []))
        return True

    monkeypatch.setattr(native, "launcher", lambda: fake_launch)
    return launch, kernels, fns, sent


def _decode(block: bytes, kinds: str) -> list:
    return [struct.unpack_from(_UNPACK[k], block, 8 * i)[0] for i, k in enumerate(kinds)]


def _expected(compiled: _Compiled, named: dict, defaults: dict) -> list:
    """Each compiled (non-constant) parameter's value as the driver should see it."""
    out = []
    for p in compiled.src.fn.params:
        if compiled.src.signature[p.name] == "constexpr":
            continue
        v = named[p.name] if p.name in named else defaults[p.name]
        if isinstance(v, torch.Tensor):
            v = v.data_ptr()
        elif isinstance(v, bool):
            v = int(v)
        elif isinstance(v, float):
            v = struct.unpack("<f", struct.pack("<f", v))[0]
        elif v is None:
            v = 0
        out.append(v)
    return out + [0, 0]  # no scratch memory


@pytest.mark.parametrize("variant, splits", [(v, s) for v in sorted(REGISTRY) for s in (1, 4)])
def test_native_parameter_block_matches_tritons_path(monkeypatch, variant, splits):
    _check_blocks(monkeypatch, variant, splits, False)


@pytest.mark.parametrize("variant, splits", [(v, s) for v in sorted(REGISTRY) for s in (1, 4)])
def test_native_parameter_block_with_token_group_scales(monkeypatch, variant, splits):
    """Token-group scales whose strides are no multiple of 16 (the packed sparse row's 164
    floats): their specialization is part of the key, so such calls are bound too, and pass
    what Triton's path passes."""
    _check_blocks(monkeypatch, variant, splits, False, group=True)


@pytest.mark.parametrize("splits", [1, 4])
def test_native_parameter_block_of_index_lists(monkeypatch, splits):
    """The sparse path's launch, whose page table and lengths each call gives
    (``index_lists``): the bound launch passes that call's two arrays where Triton's path
    does."""
    _check_blocks(monkeypatch, "fp8qk", splits, True)


def _check_blocks(monkeypatch, variant: str, splits: int, index_lists: bool,
                  group: bool = False) -> None:  # fmt: skip
    """Two calls bind the launch; three later calls' parameter blocks, parameter by
    parameter, against what Triton's path passes for the same calls (``group``: with
    token-group scales, four floats a token in rows of 164)."""
    from fp8mla.formats import Scales

    from attention_utils import pool_dtype_for, sm90_launch_inputs

    heads = 16
    launch, kernels, fns, sent = _recorded_launch(monkeypatch, variant, splits, index_lists)

    def make(pool_slots, lse, scale):
        x = sm90_launch_inputs(heads, pool_slots, lse, scale, pool_dtype_for(variant))
        if group:
            rows = torch.zeros(pool_slots, 2, 164)[..., 128:132]
            x = x[:6] + (Scales(ckv=scale, kpe=scale, ckv_arr=rows),)
        if not index_lists:
            return x, {}
        i32 = dict(dtype=torch.int32)  # the call's own lists and lengths
        return x, {"lists": (torch.arange(pool_slots, pool_slots + 9, **i32),
                             torch.tensor([5, pool_slots % 5], **i32))}  # fmt: skip

    for x, kw in [make(16, False, 0.5), make(32, True, torch.full((1,), 2.0))]:
        launch(*x, **kw)  # each specialization's first call: Triton's path, then bound
    assert launch.native_launches == 0
    later = [make(48, False, 0.25), make(64, True, torch.full((1,), 3.0)), make(80, False, 0.75)]
    for x, kw in later:
        launch(*x, **kw)
    assert launch.native_launches == len(later) == len(sent)
    # the same calls through Triton's path: what each parameter must be
    monkeypatch.setattr(KL.KernelLauncher, "_direct_ok", staticmethod(lambda: False))
    for k in kernels:
        k.fn.by_name.clear()
    for x, kw in later:
        launch(*x, **kw)
    for j, blocks in enumerate(sent):
        for k, fn, block in zip(kernels, fns, blocks):
            named = k.fn.by_name[j]
            compiled = _Compiled(fn, named, k.defaults, False)
            call = launch._call if k is launch.kernel else L.MERGE_CALL_ARGS
            kinds = native.param_kinds(compiled, k.names, call)
            assert kinds is not None
            got = _decode(block, kinds)
            want = _expected(compiled, named, k.defaults)
            if launch.q_fp16 and k is launch.kernel:  # a fresh fp16 copy of q per call
                got, want = got[1:], want[1:]
            assert got == want, f"{variant}: {fn.__name__} parameter block differs"
            if index_lists and k is launch.kernel:  # the call's lists, not the plan's
                lists = later[j][1]["lists"]
                assert named["kv_indices_ptr"] is lists[0]
                assert named["kv_len_ptr"] is lists[1]


def test_kinds_and_ranges():
    mod = native.module()
    a = mod.Launch(0, (1, 1, 1), 128, 0, False, "pLiIbBfpp",
                   [5, -7, None, 3, -1, 255, 1.5, None, None], [2, -1, 0, 6])  # fmt: skip
    a.fill([42, "not a parameter", 2**40, 0.1])
    got = _decode(a.packed(), "pLiIbBfpp")
    assert got == [2**40, -7, 42, 3, -1, 255, struct.unpack("<f", struct.pack("<f", 0.1))[0], 0, 0]
    with pytest.raises(OverflowError):
        a.fill([2**31, 0, 0, 0.0])
    with pytest.raises(ValueError, match="expected 4 call values"):
        a.fill([1, 2])
    with pytest.raises(ValueError, match="call slots"):
        mod.Launch(0, (1, 1, 1), 32, 0, False, "i", [0], [3])


def test_value_specialized_parameter_is_not_bound():
    """A per-call parameter Triton compiled as a constant because of its value (an int equal
    to 1) would keep that value for every later call: such a kernel stays on Triton's path."""
    from fp8mla.kernels.portable.merge import mla_merge_kernel

    fn = _jit(mla_merge_kernel)
    kw = {p.name: (1 if p.name == "num_heads" else 16) for p in fn.params if not p.is_constexpr}
    kw.update(D=512, BLOCK_D=128, BLOCK_S=16, WRITE_LSE=False, WAIT_PRIOR=False, LAUNCH_NEXT=False)
    compiled = _Compiled(fn, kw, {}, False)
    assert compiled.src.signature["num_heads"] == "constexpr"
    assert native.param_kinds(compiled, fn.arg_names, ("num_heads",)) is None
    # fixed at plan(): its one value is the compiled constant
    assert native.param_kinds(compiled, fn.arg_names, ("num_tokens",)) is not None


def test_scratch_memory_is_not_bound():
    from fp8mla.kernels.portable.merge import mla_merge_kernel

    fn = _jit(mla_merge_kernel)
    kw = {p.name: 16 for p in fn.params if not p.is_constexpr}
    kw.update(D=512, BLOCK_D=128, BLOCK_S=16, WRITE_LSE=False, WAIT_PRIOR=False, LAUNCH_NEXT=False)
    compiled = _Compiled(fn, kw, {}, False)
    compiled.metadata.global_scratch_size = 256
    assert native.param_kinds(compiled, fn.arg_names) is None


def _fast_setup(monkeypatch, variant: str, splits: int, write_lse: bool, tensors: bool = False):
    """A plan's launch with recorded kernels, bound by two calls of the common case (scales
    as floats, or with ``tensors`` as one-element tensors); its C path; a maker of that
    case's inputs; the blocks the Python path sends for them."""
    from attention_utils import pool_dtype_for

    heads, tokens = 16, 2
    launch, _, _, sent = _recorded_launch(monkeypatch, variant, splits)

    def make(pages=16, row=576, scale=0.5):
        pool = torch.zeros(pages, 2, row, dtype=pool_dtype_for(variant))
        q = torch.zeros(tokens, heads, 576, dtype=torch.bfloat16)
        out = torch.empty(tokens, heads, 512, dtype=torch.bfloat16)
        lse = torch.empty(tokens, heads) if write_lse else None
        if tensors:
            scale = torch.full((1,), scale or 1.0)
        return [q[..., :512], q[..., 512:], pool[..., :512], pool[..., 512:576], out, lse,
                scale, scale]  # fmt: skip

    from fp8mla.formats import Scales

    def python_path(x):
        cs, ks = (x[6], x[7]) if tensors else (x[6] or 1.0, x[7] or 1.0)
        launch(*x[:6], Scales(ckv=cs, kpe=ks))

    for _ in range(2):
        python_path(make())
    spec = launch.fast_call(write_lse, tensors, torch.bfloat16, tokens, 8)
    return launch, spec, make, python_path, sent


@pytest.mark.parametrize("write_lse, tensors", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("variant, splits", [(v, s) for v in sorted(REGISTRY) for s in (1, 4)])
def test_fast_path_fills_what_the_python_path_sends(
    monkeypatch, fields, variant, splits, write_lse, tensors
):
    """run()'s C path, on calls it takes, leaves the same parameter blocks as the Python
    path's bound launch for the same tensors and scales."""
    launch, spec, make, python_path, sent = _fast_setup(
        monkeypatch, variant, splits, write_lse, tensors
    )
    if launch.q_fp16:
        assert spec is None  # the queries are copied per call: Python's path
        return
    assert spec is not None
    check = native.module().fast_check
    for x in (make(pages=24, scale=0.25), make(pages=40, row=592, scale=None)):
        assert check(spec, 0, *x)
        blocks = [b.packed() for b in _launches(launch, write_lse, tensors)]
        python_path(x)
        assert sent[-1] == blocks, f"{variant}: the C path's parameters differ"


def _launches(launch, write_lse, tensors):
    key = (tensors, tensors, False, write_lse, False)
    a, b, _ = launch._native[key, (write_lse,) if launch.merge else None]
    return [a] + ([b] if b is not None else [])


def test_fast_path_declines_what_it_does_not_take(monkeypatch, fields):
    """Anything but the planned common case is left to the Python path (which checks it)."""
    launch, spec, make, python_path, sent = _fast_setup(monkeypatch, "fewrows", 4, False)
    check = native.module().fast_check
    assert check(spec, 0, *make())

    def variant(i, value):
        x = make()
        x[i] = value(x[i])
        return x

    declined = [
        variant(0, lambda t: t.to(torch.float16)),  # dtype
        variant(0, lambda t: t[:1]),  # tokens
        variant(1, lambda t: t[..., :32]),  # RoPE width
        variant(2, lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)),  # last stride
        variant(2, lambda t: t[:4]),  # pages: page id 8 out of range
        variant(2, lambda t: t.reshape(-1)[1:].reshape(1, -1)),  # dimensions
        variant(3, lambda t: t[:15]),  # pages differ between the two caches
        variant(4, lambda t: torch.empty(t.shape, dtype=torch.float32)),  # output dtype
        variant(4, lambda t: torch.nn.Parameter(t, requires_grad=False)),  # a subclass
        variant(6, lambda s: -1.0),  # scale <= 0
        variant(6, lambda s: float("inf")),
        variant(6, lambda s: 2),  # an int: the Python path converts it
        variant(7, lambda s: torch.tensor([0.5])),  # a tensor scale
        variant(5, lambda s: torch.empty(2, 16)),  # an LSE this spec was not made for
        variant(0, lambda t: torch.empty(2 * 16 * 512 + 1, dtype=torch.bfloat16)[1:].view(
            2, 16, 512)),  # an address that is not 16-byte aligned
        variant(1, lambda t: torch.empty(2, 16, 72, dtype=torch.bfloat16)[..., :64]),  # stride
        variant(0, lambda t: "not a tensor"),
        variant(4, lambda t: torch.empty(2, 16, 512, 1, dtype=torch.bfloat16)),  # 4 dims
        variant(4, lambda t: torch.empty(2, 16, 520, dtype=torch.bfloat16)[..., :512]),  # stride
    ]  # fmt: skip
    for i, x in enumerate(declined):
        assert check(spec, 0, *x) is False, f"case {i} was taken"
    # scales read from device tensors: one-element fp32 tensors, both
    _, spec, make, _, _ = _fast_setup(monkeypatch, "fewrows", 4, False, tensors=True)
    assert check(spec, 0, *make())
    declined = [
        variant(6, lambda s: 0.5),  # a float beside a tensor
        variant(6, lambda s: torch.full((2,), 0.5)),  # two elements
        variant(6, lambda s: torch.full((1,), 0.5, dtype=torch.float16)),  # not fp32
        variant(7, lambda s: torch.full((1, 1), 0.5)),  # two dimensions
        variant(7, lambda s: torch.full((2,), 0.5)[1:]),  # not 16-byte aligned
        variant(7, lambda s: torch.tensor(0.5, dtype=torch.float64)),  # not fp32
    ]
    for i, x in enumerate(declined):
        assert check(spec, 0, *x) is False, f"tensor-scale case {i} was taken"


def test_accessor_reads_what_the_python_methods_read():
    """The C++ accessor's dtype codes tell the kernels' dtypes apart, and a tensor it cannot
    read is not a tensor to it."""
    if native.fields_module() is None:
        pytest.skip("no C++ accessor on this machine")
    dtypes = [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2]
    codes = [native.dtype_code(d) for d in dtypes]
    assert len(set(codes)) == len(codes) and min(codes) >= 0
    assert native.fields_module().dtype_code("not a tensor") == -1
