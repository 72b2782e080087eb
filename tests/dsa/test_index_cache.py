"""The indexer key cache (``fp8mla.pack_index_keys``): byte for byte against a NumPy statement
of vLLM's CUDA writer for both scale formats, the Triton kernel against the PyTorch path,
every cache shape the engines hand over, zero/NaN/inf keys, slots and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ds_mla_engines import bf16_to_f32, e4m3_satfinite

import fp8mla
from fp8mla.dsa.index_cache import KEY_BYTES, index_cache_view, unpack_index_keys

pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
BACKENDS = ["torch", "triton"]
INF, NAN = float("inf"), float("nan")


def vllm_indexer_k_quant_and_cache(k, cache, slots, use_ue8m0):
    """vLLM's ``indexer_k_quant_and_cache_kernel`` (csrc/cache_kernels.cu) for 16-bit keys
    ``k [n, 128]`` (bf16 bit patterns as uint16, or fp16 values) into ``cache`` (uint8 ``[pages,
    page_size * 132]``), in place, float32 step by step as the kernel does it:
    ``amax = fmaxf`` over ``fabsf`` (a NaN drops out, inf counts); ``scale = fmaxf(amax, 1e-4f)
    / 448.f`` (IEEE division); with ue8m0 ``exp2f(ceilf(log2f(scale)))``, here log2 correctly
    rounded to float32; each value ``cvt_satfinite(value / scale)``; the codes at ``page *
    page_size * 132 + offset * 128`` and the scale at ``page_size * 128 + offset * 4`` of the
    page. Slot -1 is skipped."""
    vals = bf16_to_f32(k) if k.dtype == np.uint16 else k.astype(np.float32)
    page_size = cache.shape[1] // KEY_BYTES
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        amax = np.fmax.reduce(np.abs(vals), axis=1)
        scale = (np.fmax(amax, np.float32(1e-4)) / np.float32(448.0)).astype(np.float32)
        if use_ue8m0:
            scale = np.exp2(np.ceil(np.log2(scale).astype(np.float32))).astype(np.float32)
        codes = e4m3_satfinite(vals / scale[:, None])
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        page, off = divmod(slot, page_size)
        cache[page, off * 128 : off * 128 + 128] = codes[i]
        at = page_size * 128 + off * 4
        cache[page, at : at + 4] = scale[i : i + 1].view(np.uint8)


def keys(n: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    """Keys whose magnitudes span 1e-5 … 1e4 across tokens (and some on e4m3 ties)."""
    g = torch.Generator().manual_seed(seed)
    spread = torch.exp(torch.randn(n, 1, generator=g) * 3)
    return (torch.randn(n, 128, generator=g) * spread).clamp(-6e4, 6e4).to(dtype)


def edge_keys(dtype=torch.bfloat16) -> torch.Tensor:
    x = keys(8, 9).float()
    x[0] = 0.0  # all zero: the 1e-4 floor
    x[1] = -0.0
    x[2, 5] = NAN  # one NaN
    x[3, 9] = INF  # an inf: the whole key reads back NaN
    x[4] = NAN
    x[5] = torch.linspace(-1, 1, 128) * 3e-5  # below the floor
    x[6, :4] = torch.tensor([784.0, 350.0, -50.75, 812.0])  # quotients on ties
    x[7, 0] = 1e-30
    return x.to(dtype)


def bits(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale_format", ["pow2", "arbitrary"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_bytes_equal_vllm_kernel(device, backend, scale_format, dtype):
    k = torch.cat([keys(150, 1, dtype), edge_keys(dtype)])
    g = torch.Generator().manual_seed(2)
    slots = torch.randperm(4 * 64, generator=g)[: k.shape[0]]
    slots[::13] = -1
    cache = torch.full((4, 64, 1, KEY_BYTES), 0xA5, dtype=torch.uint8)
    want = cache.view(4, -1).numpy().copy()
    vllm_indexer_k_quant_and_cache(bits(k), want, slots.numpy(), scale_format == "pow2")
    cache = cache.to(device)
    fp8mla.pack_index_keys(k.to(device), cache, slots.to(device), scale_format=scale_format,
                           backend=backend)  # fmt: skip
    np.testing.assert_array_equal(cache.view(4, -1).cpu().numpy(), want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("scale_format", ["pow2", "arbitrary"])
def test_fp32_keys_triton_equals_torch(device, backend, scale_format):
    """fp32 keys (vLLM takes 16-bit keys only): the kernel's bytes equal the PyTorch path's,
    pow2 scales are the exact ceiling (DeepSeek's act_quant), values read back within e4m3."""
    k = torch.cat([keys(70, 3, torch.float32), edge_keys(torch.float32)])
    k[10] = torch.full((128,), 448 * 2.0**-9 * (1 + 2.0**-23))  # scale one ulp above 2^-9
    slots = torch.arange(k.shape[0]) * 2
    ref = torch.zeros(3, 64, KEY_BYTES, dtype=torch.uint8)
    fp8mla.pack_index_keys(k, ref, slots, scale_format=scale_format, backend="torch")
    cache = torch.zeros(3, 64, KEY_BYTES, dtype=torch.uint8, device=device)
    fp8mla.pack_index_keys(k.to(device), cache, slots.to(device), scale_format=scale_format,
                           backend=backend)  # fmt: skip
    assert torch.equal(cache.cpu(), ref)
    vals, scale = unpack_index_keys(ref, slots)
    if scale_format == "pow2":
        assert scale[10] == 2.0**-8  # rounded up, so no code saturates
        assert torch.all(torch.log2(scale[scale.isfinite()]) % 1 == 0)
    finite = k.isfinite().all(1)
    err = (vals[finite] - k[finite]).abs() / k[finite].abs().amax(1, keepdim=True).clamp_min(1e-4)
    assert err.max() <= 2.0**-4


def test_edge_keys_read_back():
    k = edge_keys(torch.float32)
    cache = torch.zeros(1, 64, KEY_BYTES, dtype=torch.uint8)
    slots = torch.arange(8)
    fp8mla.pack_index_keys(k, cache, slots, scale_format="arbitrary")
    vals, scale = unpack_index_keys(cache, slots)
    assert torch.all(vals[0] == 0) and scale[0] == torch.tensor(1e-4) / 448
    assert torch.isnan(vals[2, 5]) and torch.isfinite(vals[2, :5]).all()
    assert scale[3] == INF and torch.isnan(vals[3]).all()
    assert torch.isnan(vals[4]).all()
    fp8mla.pack_index_keys(k, cache, slots)  # pow2
    assert unpack_index_keys(cache, slots)[1][0] == 2.0**-22


@pytest.mark.parametrize("shape", ["deepgemm", "vllm", "sglang", "padded"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_cache_shapes_hold_the_same_bytes(device, shape, backend):
    k = keys(40, 4)
    slots = torch.randperm(3 * 64, generator=torch.Generator().manual_seed(5))[:40]
    flat = torch.zeros(3, 64 * KEY_BYTES, dtype=torch.uint8)
    fp8mla.pack_index_keys(k, flat, slots, backend="torch")
    if shape == "deepgemm":
        cache = torch.zeros(3, 64, 1, KEY_BYTES, dtype=torch.uint8, device=device)
    elif shape == "vllm":
        cache = torch.zeros(3, 64, KEY_BYTES, dtype=torch.uint8, device=device)
    elif shape == "sglang":
        cache = torch.zeros(3, 64 * KEY_BYTES, dtype=torch.float8_e4m3fn, device=device)
    else:  # pages padded to 9,216 bytes
        cache = torch.zeros(3, 9216, dtype=torch.uint8, device=device)[:, : 64 * KEY_BYTES]
    fp8mla.pack_index_keys(k.to(device), cache, slots.to(device), backend=backend)
    got = index_cache_view(cache).data.cpu()
    assert torch.equal(got, flat)


@pytest.mark.parametrize("backend", BACKENDS)
def test_page_sizes_and_slot_dtypes(device, backend):
    k = keys(20, 6)
    for page_size, slot_dtype in ((16, torch.int32), (1, torch.int64), (64, torch.int32)):
        slots = torch.randperm(2 * page_size * 10, generator=torch.Generator().manual_seed(7))
        slots = slots[: 20 if page_size > 1 else 10]
        pages = 20 if page_size == 1 else 2 * 10
        cache = torch.zeros(pages, page_size * KEY_BYTES, dtype=torch.uint8, device=device)
        kk = k[: slots.numel()]
        fp8mla.pack_index_keys(kk.to(device), cache, slots.to(slot_dtype).to(device),
                               page_size=page_size, backend=backend)  # fmt: skip
        vals, _ = unpack_index_keys(cache.cpu(), slots, page_size=page_size)
        ref = torch.zeros(pages, page_size * KEY_BYTES, dtype=torch.uint8)
        fp8mla.pack_index_keys(kk, ref, slots, page_size=page_size, backend="torch")
        assert torch.equal(cache.cpu(), ref)
        assert torch.allclose(vals, kk.float(), rtol=2.0**-4, atol=1e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_slots_skipped_without_validation(device, backend):
    k = keys(4, 8)
    cache = torch.zeros(1, 64, KEY_BYTES, dtype=torch.uint8, device=device)
    slots = torch.tensor([3, 64, -7, 5], device=device)
    fp8mla.pack_index_keys(k.to(device), cache, slots, validate=False, backend=backend)
    data = index_cache_view(cache).data.cpu()
    written = data[0, : 64 * 128].view(64, 128).ne(0).any(1)
    assert written.nonzero().flatten().tolist() == [3, 5]


def test_bad_arguments():
    cache = torch.zeros(2, 64, KEY_BYTES, dtype=torch.uint8)
    k, slots = keys(3, 1), torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="slots in \\[-1, 128\\)"):
        fp8mla.pack_index_keys(k, cache, torch.tensor([0, 1, 128]))
    with pytest.raises(ValueError, match="scale_format"):
        fp8mla.pack_index_keys(k, cache, slots, scale_format="ue8m0")
    with pytest.raises(ValueError, match="k of shape \\[3, 128\\]"):
        fp8mla.pack_index_keys(keys(3, 1)[:, :64], cache, slots)
    with pytest.raises(ValueError, match="length 3"):
        fp8mla.pack_index_keys(k, cache, slots[:2])
    with pytest.raises(ValueError, match="index cache of shape"):
        fp8mla.pack_index_keys(k, torch.zeros(2, 64, 656, dtype=torch.uint8), slots)
    with pytest.raises(ValueError, match="dtype"):
        fp8mla.pack_index_keys(k, cache.float(), slots)
    with pytest.raises(ValueError, match="contiguous"):
        strided = torch.zeros(2, 64, 2 * KEY_BYTES, dtype=torch.uint8)[:, :, :KEY_BYTES]
        fp8mla.pack_index_keys(k, strided, slots)
    with pytest.raises(ValueError, match="slots in \\[0, 128\\)"):
        unpack_index_keys(cache, torch.tensor([-1]))
