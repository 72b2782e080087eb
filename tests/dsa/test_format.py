"""The packed ``fp8_ds_mla`` cache: pack_ds_mla against the engines' writers byte for byte,
round trips, slots, cache shapes, zero/NaN/inf rows and bad arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from ds_mla_engines import sglang_codes, vllm_concat_and_cache_ds_mla

import fp8mla
from fp8mla.dsa import format as fmt
from fp8mla.dsa.layout import TOKEN_BYTES, token_view

BACKENDS = ["torch", "triton"]
# the interpreter's NumPy arithmetic warns on inf / inf, the NaN an inf's group is meant to get
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
INF, NAN = float("inf"), float("nan")


def rows(n: int, seed: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """Latent rows whose 128-value groups span magnitudes 1e-4 … 1e4 (bf16 amax values with
    short mantissas make many quotients land exactly halfway between two e4m3 codes), and
    RoPE rows."""
    g = torch.Generator().manual_seed(seed)
    spread = torch.exp(torch.randn(n, 4, 1, generator=g) * 3)
    ckv = (torch.randn(n, 4, 128, generator=g) * spread).flatten(1).clamp(-6e4, 6e4)
    kpe = torch.randn(n, 64, generator=g) * 2
    return ckv.to(dtype), kpe.to(dtype)


def edge_rows() -> torch.Tensor:
    """bf16 rows of the cases engines disagree on or that stress the rounding."""
    x = rows(8, 7)[0].float().view(8, 4, 128)
    x[0] = 0.0  # all-zero token
    x[1, 0] = -0.0  # a group of -0.0
    x[1, 1, 5] = NAN  # one NaN
    x[1, 2, 9] = INF
    x[1, 3, 0] = -INF
    x[2, 0] = NAN  # all NaN
    x[2, 1] = torch.linspace(-1, 1, 128) * 1e-39  # bf16 subnormals
    x[2, 2] = torch.linspace(-1, 1, 128) * 3.3e38  # near bf16's largest
    x[2, 3, :4] = torch.tensor([784.0, 350.0, -50.75, 812.0])  # quotients on ties
    x[3, 0, 0] = 1e-30  # one tiny value among zeros
    return x.flatten(1).to(torch.bfloat16)


def bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint16)


def cache_bytes(cache: torch.Tensor) -> np.ndarray:
    return token_view(cache).data.cpu().numpy()


def vllm_bytes(ckv, kpe, slots, pages, page_size, fill=None) -> np.ndarray:
    want = np.zeros((pages, page_size, TOKEN_BYTES), np.uint8) if fill is None else fill.copy()
    vllm_concat_and_cache_ds_mla(bits(ckv), bits(kpe), want, slots.cpu().numpy().astype(np.int64))
    return want


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32], ids=str)
def test_bytes_equal_vllm_kernel(device, backend, slot_dtype):
    """Random rows and every edge case, -1 padding, pages of 64: vLLM's bytes exactly."""
    ckv, kpe = rows(120, 1)
    ckv = torch.cat([ckv, edge_rows()])
    kpe = torch.cat([kpe, rows(8, 2)[1]])
    g = torch.Generator().manual_seed(3)
    slots = torch.randperm(4 * 64, generator=g)[: ckv.shape[0]]
    slots[::17] = -1
    cache = torch.zeros(4, 64, TOKEN_BYTES, dtype=torch.uint8, device=device)
    fp8mla.pack_ds_mla(
        ckv.to(device), kpe.to(device), cache, slots.to(slot_dtype).to(device), backend=backend
    )
    np.testing.assert_array_equal(cache_bytes(cache), vllm_bytes(ckv, kpe, slots, 4, 64))


def _engines() -> Path | None:
    """The pinned engines folder holding SGLang's DSA writer: the suite's (``.venv/engines``
    or ``FP8MLA_ENGINES_PATH``), else the running environment's ``engines`` folder."""
    from integrations.engines_path import ENGINES, UNREACHABLE

    writer = Path("sglang/kernels/ops/quantization/dsa_quant_k_cache.py")
    for folder in (ENGINES, Path(sys.prefix) / "engines"):
        if (folder / writer).is_file() and not UNREACHABLE.is_file():
            return folder
    return None


def test_bytes_equal_sglang_writer(tmp_path):
    """SGLang's quantize_k_cache_separate + set_mla_kv_buffer_triton, run in the interpreter,
    on finite rows (and zero groups): scales and RoPE bytes equal ours; codes equal ours except
    where SGLang's multiplication by 1 / scale rounds a quotient that lies exactly halfway
    between two codes (or next to it) differently from the division, and each such code is the
    one SGLang's arithmetic gives, one step from ours. An all-zero group has scale 0 in SGLang
    and 2^-126 here: both read back as zeros."""
    engines = _engines()
    if engines is None:
        pytest.skip("the pinned SGLang (tests/integrations/install_engines.py) is not installed")
    ckv, kpe = rows(96, 4)
    ckv[5, :128] = 0.0
    num_slots = 128
    loc = torch.randperm(num_slots - 1, generator=torch.Generator().manual_seed(5))[:96] + 1
    src, dst = tmp_path / "rows.npz", tmp_path / "sglang.npy"
    np.savez(src, ckv=bits(ckv), kpe=bits(kpe), loc=loc.numpy(), num_slots=num_slots)
    root = Path(__file__).resolve().parents[2]
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        FP8MLA_ENGINES_PATH=str(engines),
        PYTHONPATH=os.pathsep.join([str(root / "src"), str(root / "tests")]),
    )
    helper = Path(__file__).with_name("ds_mla_engines.py")
    done = subprocess.run(
        [sys.executable, str(helper), str(src), str(dst)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = np.load(dst)[loc.numpy(), 0]

    cache = torch.zeros(num_slots, 1, TOKEN_BYTES, dtype=torch.uint8)
    fp8mla.pack_ds_mla(ckv, kpe, cache, loc)
    ours = cache.numpy()[loc.numpy(), 0]
    zero = np.zeros((96, 4), bool)
    zero[5, 0] = True

    np.testing.assert_array_equal(theirs[:, 528:], ours[:, 528:])  # RoPE
    s_theirs = theirs[:, 512:528].copy().view(np.float32)
    s_ours = ours[:, 512:528].copy().view(np.float32)
    np.testing.assert_array_equal(s_theirs[~zero], s_ours[~zero])
    assert s_theirs[5, 0] == 0 and s_ours[5, 0] == 2.0**-126
    got_theirs, _ = fp8mla.unpack_ds_mla(torch.from_numpy(np.load(dst)), loc)
    assert torch.all(got_theirs[5, :128] == 0)

    c_theirs = theirs[:, :512].reshape(96, 4, 128)[~zero]
    c_ours = ours[:, :512].reshape(96, 4, 128)[~zero]
    c_stated = sglang_codes(bits(ckv))[0].reshape(96, 4, 128)[~zero]
    np.testing.assert_array_equal(c_theirs, c_stated)
    moved = c_theirs != c_ours
    assert moved.mean() < 2e-3, moved.mean()
    step = np.abs((c_theirs[moved] & 0x7F).astype(int) - (c_ours[moved] & 0x7F))
    assert np.all(step == 1) and np.all((c_theirs[moved] ^ c_ours[moved]) < 0x80)


def flashmla_reference(ckv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's reference quantizer (FlashMLA tests/quant.py, ``quantize_k_cache`` for
    V32_FP8Sparse): ``scale = 2^ceil(log2(max(amax / 448, 1e-4)))`` (``_cast_scale_inv_to_
    ue8m0``), ``codes = (x / scale).to(float8_e4m3fn)``."""
    x = ckv.float().unflatten(1, (4, 128))
    inv = x.abs().amax(-1) / 448.0
    scale = torch.pow(2, torch.clamp_min(inv, 1e-4).log2().ceil())
    codes = (x / scale[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes.flatten(1), scale


@pytest.mark.parametrize("backend", BACKENDS)
def test_pow2_equals_deepseek_reference(device, backend):
    ckv, kpe = rows(64, 6)
    ckv[0, :128] = 0.0  # the 1e-4 floor: 2^-13
    ckv[1, :128] = 7.0 * 2.0**3  # amax / 448 exactly a power of two stays
    slots = torch.arange(64)
    cache = torch.zeros(64, 1, TOKEN_BYTES, dtype=torch.uint8, device=device)
    fp8mla.pack_ds_mla(
        ckv.to(device),
        kpe.to(device),
        cache,
        slots.to(device),
        scale_format="pow2",
        backend=backend,
    )
    got = cache.cpu()[:, 0]
    codes, scale = flashmla_reference(ckv)
    assert torch.equal(got[:, :512], codes)
    assert torch.equal(got[:, 512:528].contiguous().view(torch.float32), scale)
    assert scale[0, 0] == 2.0**-13 and scale[1, 0] == 2.0**-3
    mantissa = scale.view(torch.int32) & 0x7FFFFF
    assert torch.all(mantissa == 0)  # powers of two


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale_format", ["arbitrary", "pow2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_round_trip(device, backend, scale_format, dtype):
    """unpack(pack(x)) is x to within half an e4m3 step of x / scale; RoPE is x rounded to
    bf16 (exactly x for bf16 rows)."""
    ckv, kpe = rows(40, 8, dtype)
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(9))[:40]
    cache = torch.zeros(1, 64, TOKEN_BYTES, dtype=torch.uint8, device=device)
    ckv, kpe, slots = ckv.to(device), kpe.to(device), slots.to(device)
    fp8mla.pack_ds_mla(ckv, kpe, cache, slots, scale_format=scale_format, backend=backend)
    got_ckv, got_kpe = fp8mla.unpack_ds_mla(cache, slots)
    assert got_ckv.dtype == got_kpe.dtype == torch.float32
    assert got_ckv.shape == (40, 512) and got_kpe.shape == (40, 64)
    scale = token_view(cache).data.flatten(0, 1)[slots.long(), 512:528]
    scale = scale.contiguous().view(torch.float32).repeat_interleave(128, 1)
    x = ckv.float()
    bound = 2.0**-4 * x.abs() + 2.0**-10 * scale  # half a step: normal, subnormal codes
    assert torch.all((got_ckv - x).abs() <= bound * (1 + 1e-6))  # and float32 roundings
    assert torch.equal(got_kpe, kpe.to(torch.bfloat16).float())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_fp16_fp32_rows_equal_their_bf16_statement(device, backend, dtype):
    """fp16/fp32 rows: the same arithmetic on their float32 values; RoPE rounded to nearest
    even bf16 (a NaN as 0x7FC0)."""
    ckv, kpe = rows(24, 10, dtype)
    kpe[3, 7] = NAN
    slots = torch.arange(24)
    cache = torch.zeros(24, 1, TOKEN_BYTES, dtype=torch.uint8, device=device)
    fp8mla.pack_ds_mla(ckv.to(device), kpe.to(device), cache, slots.to(device), backend=backend)
    ref = torch.zeros(24, 1, TOKEN_BYTES, dtype=torch.uint8)
    fp8mla.pack_ds_mla(ckv, kpe, ref, slots, backend="torch")
    assert torch.equal(cache.cpu(), ref)
    rope = ref[:, 0, 528:].contiguous().view(torch.int16)
    assert rope[3, 7] == 0x7FC0
    finite = ~kpe.isnan()
    assert torch.equal(rope[finite], kpe.to(torch.bfloat16).view(torch.int16)[finite])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale_format", ["arbitrary", "pow2"])
def test_zero_nan_inf(device, backend, scale_format):
    """Zero groups: codes 0 (0x80 for -0.0), scale 2^-126 (pow2: 2^-13), read back as zeros.
    A NaN: code 0x7F, read back NaN, the rest of its group as without it. An inf: scale inf,
    the group reads back NaN. An all-NaN group: codes 0x7F, the floor scale."""
    ckv = edge_rows()
    clean = ckv.clone()
    clean[1, 128 + 5] = 0.0  # the NaN's group, without the NaN
    kpe = rows(8, 11)[1]
    slots = torch.arange(8)
    cache = torch.zeros(8, 1, TOKEN_BYTES, dtype=torch.uint8, device=device)
    ref = torch.zeros_like(cache)
    for c, x in ((cache, ckv), (ref, clean)):
        fp8mla.pack_ds_mla(
            x.to(device),
            kpe.to(device),
            c,
            slots.to(device),
            scale_format=scale_format,
            backend=backend,
        )
    b = cache.cpu()[:, 0]
    codes = b[:, :512].view(8, 4, 128)
    scales = b[:, 512:528].contiguous().view(torch.float32)
    floor = 2.0**-13 if scale_format == "pow2" else 2.0**-126
    got, _ = fp8mla.unpack_ds_mla(cache, slots.to(device))
    got = got.cpu().view(8, 4, 128)

    assert torch.all(codes[0] == 0) and torch.all(scales[0] == floor)
    assert torch.all(codes[1, 0] == 0x80) and scales[1, 0] == floor
    assert torch.all(got[0] == 0) and torch.all(got[1, 0] == 0)
    assert codes[1, 1, 5] == 0x7F and got[1, 1, 5].isnan()
    keep = torch.arange(128) != 5
    assert torch.equal(codes[1, 1, keep], ref.cpu()[1, 0, 128:256][keep])
    assert scales[1, 1] == ref.cpu()[1, 0, 516:520].contiguous().view(torch.float32)[0]
    for g, pos in ((2, 9), (3, 0)):  # +inf, -inf
        assert scales[1, g] == INF and codes[1, g, pos] == 0x7F
        assert torch.all(got[1, g].isnan())
    assert torch.all(codes[2, 0] == 0x7F) and scales[2, 0] == floor


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("slot_dtype", [torch.int64, torch.int32], ids=str)
def test_padding_and_out_of_range_slots_write_nothing(device, backend, slot_dtype):
    ckv, kpe = rows(20, 12)
    slots = torch.arange(20) * 3
    slots[[2, 9]] = -1
    slots[[4, 15]] = torch.tensor([64, 10**6])  # outside a 64-slot cache: skipped unchecked
    g = torch.Generator().manual_seed(13)
    before = torch.randint(0, 256, (1, 64, TOKEN_BYTES), generator=g, dtype=torch.uint8)
    cache = before.to(device)
    fp8mla.pack_ds_mla(
        ckv.to(device),
        kpe.to(device),
        cache,
        slots.to(slot_dtype).to(device),
        validate=False,
        backend=backend,
    )
    want = vllm_bytes(ckv, kpe, torch.where(slots < 64, slots, -1), 1, 64, before.numpy())
    np.testing.assert_array_equal(cache_bytes(cache), want)
    with pytest.raises(ValueError, match=r"slots in \[-1, 64\)"):
        fp8mla.pack_ds_mla(
            ckv.to(device),
            kpe.to(device),
            cache,
            slots.to(slot_dtype).to(device),
            backend=backend,
        )


def _shapes(device):
    """(name, cache, bytes of the [pages, page_size, 656] it is, page size) for each shape."""
    g = torch.Generator().manual_seed(14)
    base = torch.randint(0, 256, (4, 65, TOKEN_BYTES), generator=g, dtype=torch.uint8)
    base = base.to(device)
    pairs = torch.randint(0, 256, (128, 2, TOKEN_BYTES), generator=g, dtype=torch.uint8)
    pairs = pairs.to(device)
    return [
        ("pages-64", base[:, :64].contiguous(), 64),
        ("pages-64-1", base[:, :64].contiguous().unsqueeze(2), 64),
        ("pool", base[:, :64].reshape(256, 1, TOKEN_BYTES).clone(), 64),
        ("pages-64-strided", base[:, :64], 64),  # pages 65 tokens apart
        ("pages-1", pairs[:, :1].contiguous(), 1),
        ("pages-1-strided", pairs[:, :1], 1),  # a gap after each one-token page
        ("int8", base[:, :64].contiguous().view(torch.int8), 64),
        ("float8", base[:, :64].contiguous().view(torch.float8_e4m3fn).unsqueeze(2), 64),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", range(8))
def test_cache_shapes(device, backend, shape):
    name, cache, page_size = _shapes(device)[shape]
    outside = None
    if name.endswith("strided"):
        owner = cache._base if cache._base is not None else cache
        outside = owner.clone()
    ckv, kpe = rows(48, 15)
    slots = torch.randperm(128, generator=torch.Generator().manual_seed(16))[:48]
    fill = cache_bytes(cache).reshape(-1, page_size, TOKEN_BYTES)
    pages = fill.shape[0]
    fp8mla.pack_ds_mla(ckv.to(device), kpe.to(device), cache, slots.to(device), backend=backend)
    want = vllm_bytes(ckv, kpe, slots, pages, page_size, fill)
    np.testing.assert_array_equal(cache_bytes(cache).reshape(want.shape), want)
    if outside is not None:  # bytes between the view's pages are untouched
        owner = cache._base
        gap = owner[:, 64:] if name == "pages-64-strided" else owner[:, 1:]
        gap_before = outside[:, 64:] if name == "pages-64-strided" else outside[:, 1:]
        assert torch.equal(gap, gap_before)


def test_no_rows_is_a_no_op(device):
    cache = torch.zeros(1, 64, TOKEN_BYTES, dtype=torch.uint8, device=device)
    empty = torch.empty(0, 512, dtype=torch.bfloat16, device=device)
    fp8mla.pack_ds_mla(
        empty, empty[:, :64], cache, torch.empty(0, dtype=torch.int64, device=device)
    )
    assert torch.all(cache == 0)


def _bad_calls():
    c = torch.zeros(2, 64, TOKEN_BYTES, dtype=torch.uint8)
    x, r = rows(4, 17)
    s = torch.arange(4)
    ok = dict(ckv=x, kpe=r, cache=c, slots=s)
    return [
        ("ckv", dict(ok, ckv=x[:, :256])),
        ("ckv", dict(ok, ckv=x.to(torch.float8_e4m3fn))),
        ("ckv", dict(ok, ckv=x.view(4, 4, 128))),
        ("kpe", dict(ok, kpe=r[:, :32])),
        ("kpe", dict(ok, kpe=r.float())),
        ("slots", dict(ok, slots=s.float())),
        ("slots", dict(ok, slots=s[:3])),
        ("slots", dict(ok, slots=s.view(2, 2))),
        ("slots", dict(ok, slots=torch.tensor([0, 1, 2, 128]))),
        ("slots", dict(ok, slots=torch.tensor([0, -2, 2, 3]))),
        ("cache", dict(ok, cache=torch.zeros(2, 64, 576, dtype=torch.uint8))),
        ("cache", dict(ok, cache=c.view(torch.int16))),
        ("scale_format", dict(ok, scale_format="ue8m0")),
        ("backend", dict(ok, backend="cuda")),
    ]


@pytest.mark.parametrize("case", range(14))
def test_bad_arguments_raise(case):
    name, kwargs = _bad_calls()[case]
    with pytest.raises(ValueError, match=rf"expected.*{name}") as err:
        fp8mla.pack_ds_mla(**kwargs)
    assert "got" in str(err.value)


def test_unpack_rejects_slots_without_a_token():
    cache = torch.zeros(2, 64, TOKEN_BYTES, dtype=torch.uint8)
    for bad in ([0, -1], [128]):
        with pytest.raises(ValueError, match=r"expected slots in \[0, 128\)"):
            fp8mla.unpack_ds_mla(cache, torch.tensor(bad))
    with pytest.raises(ValueError, match="expected slots of dtype"):
        fp8mla.unpack_ds_mla(cache, torch.tensor([0.0]))


@pytest.mark.gpu
@pytest.mark.parametrize("native", [True, False])
def test_gpu_bytes_equal_cpu_at_large_n(monkeypatch, native):
    """The compiled kernel (the GPU's e4m3 conversion, or the integer encoder) writes the CPU
    path's bytes on 64K tokens with every edge case, both scale formats."""
    monkeypatch.setattr(fmt, "native_e4m3_encode", lambda device: native)
    ckv, kpe = rows(65536 - 8, 18)
    ckv, kpe = torch.cat([ckv, edge_rows()]), torch.cat([kpe, rows(8, 19)[1]])
    slots = torch.randperm(1024 * 64, generator=torch.Generator().manual_seed(20))
    slots[::1000] = -1
    for scale_format in ("arbitrary", "pow2"):
        want = torch.zeros(1024, 64, TOKEN_BYTES, dtype=torch.uint8)
        fp8mla.pack_ds_mla(ckv, kpe, want, slots, scale_format=scale_format)
        got = torch.zeros_like(want, device="cuda")
        fp8mla.pack_ds_mla(
            ckv.cuda(),
            kpe.cuda(),
            got,
            slots.cuda(),
            scale_format=scale_format,
            validate=False,
        )
        assert torch.equal(got.cpu(), want)
