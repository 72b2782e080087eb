"""The KV cache: quantizing writes, views of one buffer, the allocator and its errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fp8mla.cache import MLAKVCache, PageAllocator, PoolExhaustedError
from fp8mla.reference import dequantize

# Relative rounding of each format: half an ulp of the mantissa (3 bits e4m3, 2 bits e5m2).
HALF_ULP = {
    torch.float8_e4m3fn: 2.0**-4,
    torch.float8_e5m2: 2.0**-3,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
BACKENDS = ["torch", "triton"]


def read_back(cache: MLAKVCache, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    rows = cache.buffer.view(cache.num_slots, -1)[slots.long()]
    scale_arr = None
    if cache.scale_arr is not None:
        scale_arr = cache.scale_arr.view(cache.num_slots, -1)[slots.long()]
        ckv = dequantize(rows[:, :512], None, scale_arr)
    else:
        ckv = dequantize(rows[:, :512], cache.ckv_scale)
    return ckv, dequantize(rows[:, 512:], cache.kpe_scale)


def assert_within_rounding(got, want, dtype, scale_floor):
    """|got − want| ≤ half an ulp of |want| (plus the subnormal step at the scale used)."""
    bound = HALF_ULP[dtype] * want.abs() + scale_floor
    assert torch.all((got - want).abs() <= bound * 1.0001), (got - want).abs().max()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", FP8, ids=str)
@pytest.mark.parametrize("scale_mode", ["tensor", "token_group"])
def test_write_then_read_back(device, backend, dtype, scale_mode):
    g = torch.Generator().manual_seed(0)
    scales = {"ckv_scale": 0.05, "kpe_scale": 0.02} if scale_mode == "tensor" else {}
    cache = MLAKVCache(
        256,
        page_size=16,
        dtype=dtype,
        scale_mode=scale_mode,
        device=device,
        backend=backend,
        **scales,
    )
    seq = cache.new_sequence()
    ckv = (torch.randn(37, 512, generator=g) * 3).to(torch.bfloat16).to(device)
    kpe = torch.randn(37, 64, generator=g).to(torch.bfloat16).to(device)
    slots = cache.append(seq, ckv, kpe)
    got_ckv, got_kpe = read_back(cache, slots)
    want_ckv, want_kpe = ckv.double(), kpe.double()
    subnormal = {torch.float8_e4m3fn: 2.0**-9, torch.float8_e5m2: 2.0**-16}[dtype]
    ckv_floor = subnormal * (scales.get("ckv_scale", 0) or 1.0)
    if scale_mode == "token_group":
        group_scale = cache.scale_arr.view(cache.num_slots, -1)[slots.long()].double()
        ckv_floor = subnormal * group_scale.repeat_interleave(128, dim=1)
        # the group's largest value is stored at the format's maximum, exactly
        amax = want_ckv.view(37, 4, 128).abs().amax(-1)
        torch.testing.assert_close(
            group_scale,
            amax / {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}[dtype],
            rtol=1e-6,
            atol=0,
        )
    assert_within_rounding(
        got_ckv.cpu(),
        want_ckv.cpu(),
        dtype,
        ckv_floor.cpu() if isinstance(ckv_floor, torch.Tensor) else ckv_floor,
    )
    assert_within_rounding(got_kpe.cpu(), want_kpe.cpu(), dtype, subnormal * cache.kpe_scale)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_sixteen_bit_storage_is_a_plain_cast(device, dtype, backend):
    cache = MLAKVCache(64, page_size=1, dtype=dtype, device=device, backend=backend)
    seq = cache.new_sequence()
    ckv, kpe = torch.randn(5, 512, device=device), torch.randn(5, 64, device=device)
    slots = cache.append(seq, ckv, kpe)
    rows = cache.buffer.view(64, -1)[slots.long()]
    assert torch.equal(rows[:, :512], ckv.to(dtype)) and torch.equal(rows[:, 512:], kpe.to(dtype))


@pytest.mark.parametrize("dtype", FP8, ids=str)
@pytest.mark.parametrize("scale_mode", ["tensor", "token_group"])
def test_kernel_and_torch_writes_agree(device, dtype, scale_mode):
    """The fused write kernel stores the same bytes as the PyTorch path."""
    g = torch.Generator().manual_seed(1)
    ckv = torch.randn(50, 512, generator=g).to(torch.bfloat16).to(device)
    kpe = torch.randn(50, 64, generator=g).to(torch.bfloat16).to(device)
    slots = torch.randperm(200, generator=g)[:50].to(device)
    bufs = []
    for backend in BACKENDS:
        cache = MLAKVCache(
            200,
            dtype=dtype,
            scale_mode=scale_mode,
            ckv_scale=0.5 if scale_mode == "tensor" else 1.0,
            device=device,
            backend=backend,
        )
        cache.write(slots, ckv, kpe)
        bufs.append(cache)
    a, b = (c.buffer.view(torch.uint8).view(200, -1)[slots].int().cpu() for c in bufs)
    assert torch.equal(a, b)
    if scale_mode == "token_group":
        torch.testing.assert_close(bufs[0].scale_arr, bufs[1].scale_arr, rtol=0, atol=0)


def test_views_alias_one_buffer():
    cache = MLAKVCache(128, page_size=16, dtype=torch.float8_e5m2)
    ptr = cache.buffer.data_ptr()
    assert cache.engine_view.shape == (128, 1, 576)
    assert cache.ckv.shape == (8, 16, 512) and cache.kpe.shape == (8, 16, 64)
    assert cache.ckv.data_ptr() == ptr
    assert cache.kpe.data_ptr() == ptr + 512 * cache.buffer.element_size()
    seq = cache.new_sequence()
    cache.append(seq, torch.ones(20, 512), torch.full((20, 64), 2.0))
    page = cache.seq_pages(seq)[1]
    assert cache.ckv[page, 3].float().unique().tolist() == [1.0]
    assert cache.kpe[page, 3].float().unique().tolist() == [2.0]
    assert cache.engine_view[page * 16 + 3, 0, 0].float() == 1.0


def test_plan_arrays_follow_sequences():
    cache = MLAKVCache(64, page_size=4, dtype=torch.float8_e4m3fn)
    a, b = cache.new_sequence(), cache.new_sequence()
    cache.append(a, torch.randn(5, 512), torch.randn(5, 64))
    cache.append(b, torch.randn(3, 512), torch.randn(3, 64))
    cache.append(a, torch.randn(4, 512), torch.randn(4, 64))
    indptr, indices, lens = cache.plan_arrays([a, b])
    assert indptr.tolist() == [0, 3, 4] and lens.tolist() == [9, 3]
    assert indices.tolist() == cache.seq_pages(a) + cache.seq_pages(b)
    assert indptr.dtype == indices.dtype == lens.dtype == torch.int32


def test_exhaustion_changes_nothing():
    cache = MLAKVCache(32, page_size=8, dtype=torch.float8_e4m3fn)
    seq = cache.new_sequence()
    cache.append(seq, torch.randn(20, 512), torch.randn(20, 64))
    before = cache.buffer.clone()
    with pytest.raises(PoolExhaustedError, match="pool exhausted"):
        cache.append(seq, torch.randn(20, 512), torch.randn(20, 64))
    assert cache.seq_len(seq) == 20 and cache.allocator.num_free == 1
    assert torch.equal(cache.buffer.view(torch.uint8), before.view(torch.uint8))


def test_bad_writes_raise():
    cache = MLAKVCache(32, page_size=8, dtype=torch.float8_e4m3fn)
    seq = cache.new_sequence()
    with pytest.raises(ValueError, match=r"expected ckv_new of shape \[\*, 512\]|ckv_new of shape"):
        cache.append(seq, torch.randn(3, 256), torch.randn(3, 64))
    with pytest.raises(ValueError, match="kpe_new of shape"):
        cache.append(seq, torch.randn(3, 512), torch.randn(2, 64))
    with pytest.raises(ValueError, match="ckv_new of dtype"):
        cache.append(seq, torch.randn(3, 512).to(torch.float8_e4m3fn), torch.randn(3, 64))
    with pytest.raises(ValueError, match=r"slots in \[0, 32\)"):
        cache.write(torch.tensor([3, 32]), torch.randn(2, 512), torch.randn(2, 64))
    with pytest.raises(ValueError, match="slots of dtype"):
        cache.write(torch.tensor([3.0]), torch.randn(1, 512), torch.randn(1, 64))
    with pytest.raises(KeyError):
        cache.append(99, torch.randn(1, 512), torch.randn(1, 64))
    cache.free(seq)
    with pytest.raises(KeyError):
        cache.free(seq)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_slots": 30, "page_size": 8}, "multiple of page_size"),
        ({"num_slots": 32, "dtype": torch.int8}, "dtype"),
        ({"num_slots": 32, "dtype": torch.bfloat16, "scale_mode": "token_group"}, "FP8"),
        ({"num_slots": 32, "scale_mode": "row"}, "scale_mode"),
        ({"num_slots": 32, "dtype": torch.bfloat16, "ckv_scale": 2.0}, "scales of 1.0"),
        ({"num_slots": 32, "ckv_scale": float("inf")}, "ckv_scale finite and > 0"),
        ({"num_slots": 32, "kpe_scale": float("nan")}, "kpe_scale finite and > 0"),
        ({"num_slots": 32, "ckv_scale": 0.0}, "ckv_scale finite and > 0"),
    ],
)
def test_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MLAKVCache(**kwargs)


def test_double_free_raises():
    alloc = PageAllocator(4)
    pages = alloc.alloc(2)
    alloc.free(pages)
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free(pages[:1])
    with pytest.raises(ValueError, match="not allocated"):
        alloc.free([3, 3])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "free"]), st.integers(0, 6)), max_size=40))
def test_allocator_invariants(ops):
    alloc = PageAllocator(10)
    held: list[list[int]] = []
    for op, n in ops:
        if op == "alloc":
            free_before = alloc.num_free
            try:
                pages = alloc.alloc(n)
            except PoolExhaustedError:
                assert n > free_before and alloc.num_free == free_before
                continue
            assert len(set(pages)) == n
            assert not set(pages) & {p for h in held for p in h}, "page handed out twice"
            held.append(pages)
        elif held:
            alloc.free(held.pop(n % len(held)))
        owned = [p for h in held for p in h]
        assert alloc.num_used == len(owned) and alloc.num_free == 10 - len(owned)
        assert all(0 <= p < 10 for p in owned)


@pytest.mark.parametrize("dtype", FP8, ids=str)
@pytest.mark.parametrize("scale_mode", ["tensor", "token_group"])
def test_nan_and_inf_writes_follow_one_rule(device, dtype, scale_mode):
    """Both writers: NaN stays NaN (the format's NaN code, as PyTorch's cast writes it), ±inf
    and finite overflow saturate to the largest finite value, and with token-group scales a
    NaN or inf does not spoil its group: its neighbours keep their values and the scale stays
    finite."""
    g = torch.Generator().manual_seed(7)
    ckv = torch.randn(4, 512, generator=g)
    kpe = torch.randn(4, 64, generator=g)
    ckv[0, 3], ckv[1, 200], ckv[2, 7] = float("nan"), float("inf"), -float("inf")
    ckv[3, 9] = 1e30
    kpe[0, 1], kpe[1, 2] = float("nan"), float("inf")
    slots = torch.tensor([5, 1, 7, 2], device=device)
    caches = []
    for backend in BACKENDS:
        cache = MLAKVCache(8, dtype=dtype, scale_mode=scale_mode, device=device, backend=backend)
        cache.write(slots, ckv.to(device), kpe.to(device))
        caches.append(cache)
    a, b = (c.buffer.view(torch.uint8).view(8, -1)[slots].cpu() for c in caches)
    assert torch.equal(a, b)  # the same bytes from both writers
    vals = caches[0].buffer.view(8, -1)[slots].float().cpu()
    top = float(torch.finfo(dtype).max)
    assert vals[0, 3].isnan() and vals[0, 512 + 1].isnan()
    assert vals[0].isnan().sum() == 2  # the NaN's neighbours are untouched
    if scale_mode == "tensor":
        assert vals[1, 200] == top and vals[2, 7] == -top and vals[3, 9] == top
    assert vals[1, 512 + 2] == top
    if scale_mode == "token_group":
        scales = caches[0].scale_arr.view(8, -1)[slots].cpu()
        assert torch.isfinite(scales).all() and (scales > 0).all()
        assert torch.equal(scales, caches[1].scale_arr.view(8, -1)[slots].cpu())
