"""The lightning indexer's key cache of DeepSeek Sparse Attention models: 132 bytes a token
(128 ``float8_e4m3fn`` codes and one float32 scale), in pages laid out

    [page_size × 128 codes | page_size × 4-byte scales]

as DeepGEMM's ``fp8_paged_mqa_logits`` reads it and vLLM (``indexer_k_quant_and_cache``) and
SGLang (``index_k_with_scale_buffer``) write it. A key is ``code[d] × scale``; a token is its
slot id ``page * page_size + offset``. Engines hand the cache over as uint8 ``[pages,
page_size, 1, 132]`` (DeepGEMM, vLLM), ``[pages, page_size, 132]`` or ``[pages, page_size *
132]`` (SGLang): the middle shapes are a stride trick, the bytes of a page are the two blocks
above, not 132-byte rows.

:func:`pack_index_keys` quantizes new keys into such a cache in place, :func:`unpack_index_keys`
reads them back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mla._checks import check_tensor
from fp8mla.dsa.layout import SLOT_DTYPES, ScaleFormat, check_slot_range, writer_backend
from fp8mla.runtime import interpreted

HEAD_DIM = 128  # values per key (one scale each)
KEY_BYTES = HEAD_DIM + 4  # 132 bytes a token
PAGE_SIZE = 64  # tokens per page of DeepGEMM, vLLM and SGLang
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4  # |k| max floor before the division by 448 (vLLM's writer, DeepSeek's act_quant)
NAN_E4M3 = 0x7F
CACHE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)
KEY_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
PACK_TOKENS = 16  # tokens per program of the Triton writer
PACK_WARPS = 4


@dataclass(frozen=True)
class IndexCacheView:
    """An indexer key cache as bytes: ``data [pages, page_size * 132]`` uint8 (a view of the
    caller's tensor; ``data.stride(0)`` is the page stride in bytes)."""

    data: torch.Tensor
    page_size: int

    @property
    def num_pages(self) -> int:
        return self.data.shape[0]

    @property
    def num_slots(self) -> int:
        """Slot ids ``[0, num_slots)`` name a token of the cache."""
        return self.data.shape[0] * self.page_size

    @property
    def page_stride(self) -> int:
        return self.data.stride(0) if self.data.shape[0] > 1 else self.page_size * KEY_BYTES

    def codes(self) -> torch.Tensor:
        """``[pages, page_size, 128]`` uint8 view of the codes."""
        p, s = self.data.shape[0], self.page_size
        return self.data.as_strided((p, s, HEAD_DIM), (self.page_stride, HEAD_DIM, 1))

    def scales(self) -> torch.Tensor:
        """``[pages, page_size]`` float32 view of the scales."""
        return self.data[:, self.page_size * HEAD_DIM :].view(torch.float32)


def index_cache_view(cache: torch.Tensor, *, page_size: int | None = None) -> IndexCacheView:
    """``cache`` as a ``[pages, page_size * 132]`` byte view, no copy: ``[pages, page_size, 1,
    132]``, ``[pages, page_size, 132]`` or ``[pages, page_size * 132]`` (then ``page_size``,
    default 64, says how many tokens a page holds); uint8, int8 or float8_e4m3fn. A page's
    bytes must be contiguous and its address and stride multiples of 4 bytes (the scales are
    read as float32)."""
    if not isinstance(cache, torch.Tensor):
        raise ValueError(f"expected the index cache as a torch.Tensor, got {type(cache).__name__}")
    if cache.dtype not in CACHE_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in CACHE_DTYPES)
        raise ValueError(f"expected the index cache's dtype in ({names}), got {cache.dtype}")
    shape = list(cache.shape)
    if cache.dim() == 4 and shape[2] == 1 and shape[3] == KEY_BYTES:
        size, inner = shape[1], (cache.stride(1), cache.stride(3))
        ok = shape[1] <= 1 or inner == (KEY_BYTES, 1)
    elif cache.dim() == 3 and shape[2] == KEY_BYTES:
        size, inner = shape[1], (cache.stride(1), cache.stride(2))
        ok = shape[1] <= 1 or inner == (KEY_BYTES, 1)
    elif cache.dim() == 2:
        size = PAGE_SIZE if page_size is None else page_size
        if size < 1 or shape[1] != size * KEY_BYTES:
            raise ValueError(
                f"expected a [pages, page_size * {KEY_BYTES}] index cache with page_size {size}, "
                f"got shape {shape}"
            )
        ok = shape[1] <= 1 or cache.stride(1) == 1
    else:
        raise ValueError(
            f"expected an index cache of shape [pages, page_size, 1, {KEY_BYTES}], [pages, "
            f"page_size, {KEY_BYTES}] or [pages, page_size * {KEY_BYTES}], got {shape}"
        )
    if page_size is not None and cache.dim() != 2 and page_size != size:
        raise ValueError(f"expected page_size {size} (the cache's shape), got {page_size}")
    if not ok:
        raise ValueError("expected each page of the index cache to be contiguous, got strides "
                         f"{tuple(cache.stride())}")  # fmt: skip
    if size < 1:
        raise ValueError(f"expected a page size of at least 1, got {size}")
    data = cache.view(torch.uint8)
    data = data.as_strided((shape[0], size * KEY_BYTES), (data.stride(0), 1))
    if shape[0] and (data.data_ptr() % 4 or (shape[0] > 1 and data.stride(0) % 4)):
        raise ValueError(
            "expected the index cache's address and page stride to be multiples of 4 bytes, "
            f"got a page stride of {data.stride(0)} bytes"
        )
    if shape[0] > 1 and data.stride(0) < size * KEY_BYTES:
        raise ValueError(f"expected pages that do not overlap, got a page stride of "
                         f"{data.stride(0)} bytes for {size * KEY_BYTES}-byte pages")  # fmt: skip
    return IndexCacheView(data, size)


def pack_index_keys(
    k: torch.Tensor,
    cache: torch.Tensor,
    slots: torch.Tensor,
    *,
    scale_format: ScaleFormat = "pow2",
    page_size: int | None = None,
    validate: bool = True,
    backend: str = "auto",
) -> None:
    """Quantize indexer keys ``k [N, 128]`` (bf16, fp16 or fp32) into the key cache at ``slots
    [N]`` (int32/int64, on the cache's device), in place. Token ``i`` is written as::

        amax  = max |k[i]| over its non-NaN values (±inf count)
        scale = max(amax, 1e-4) / 448                                     ("arbitrary")
                2^ceil(log2(max(amax, 1e-4) / 448))                       ("pow2", vLLM's
                                                                            ue8m0, DeepSeek's
                                                                            act_quant)
        code  = e4m3(k / scale): float32 division, then to nearest even e4m3, overflow
                saturating to ±448, NaN as 0x7F

    into its page's code block (128 bytes at ``offset * 128``) and scale block (4 bytes at
    ``page_size * 128 + offset * 4``). For bf16 and fp16 keys the bytes equal vLLM's
    ``indexer_k_quant_and_cache`` on CUDA (which takes 16-bit keys only). vLLM rounds the
    "pow2" scale with ``exp2f(ceilf(log2f(s)))``: for an fp32 key whose scale lies within a
    float32 rounding step above a power of two, ``log2f`` may land on the integer and keep the
    lower power (those codes then saturate); here the ceiling is read off the bits, as
    DeepSeek's ``act_quant``. 16-bit keys never produce such a scale (the scale of a 16-bit
    amax is a power of two or far from one).

    An all-zero key gets scale ``1e-4 / 448`` (``"pow2"``: 2^-22) and codes 0; a NaN value is
    stored as 0x7F (NaN) and leaves the scale to the rest; a ±inf value makes the scale inf, so
    the key reads back as NaN.

    Slots: -1 (padding) is skipped; slots must be distinct. ``validate=True`` reads ``slots`` on
    the host (one device sync on CUDA) and raises ValueError for one outside ``[-1, slots)``;
    ``validate=False`` does not, and the kernel skips such slots (nothing outside the cache is
    written). ``page_size``: for a ``[pages, page_size * 132]`` cache (default 64).
    ``backend``: ``"auto"`` (Triton on CUDA tensors, PyTorch ops on CPU tensors: the same
    bytes), ``"triton"`` (on CPU under ``TRITON_INTERPRET=1``) or ``"torch"``.
    """
    view = index_cache_view(cache, page_size=page_size)
    device = cache.device
    check_tensor("k", k, ndim=2, dtypes=KEY_DTYPES, device=device)
    n = k.shape[0]
    check_tensor("k", k, shape=(n, HEAD_DIM))
    which = writer_backend("k", n, slots, view.num_slots, scale_format=scale_format,
                           backend=backend, device=device, validate=validate)  # fmt: skip
    if which is None:
        return
    pow2 = scale_format == "pow2"
    if which == "triton":
        _pack_triton(view, k, slots, pow2)
    else:
        _pack_torch(view, k, slots, pow2)


def unpack_index_keys(
    cache: torch.Tensor, slots: torch.Tensor, *, page_size: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys at ``slots [N]`` as ``(k float32 [N, 128], scale float32 [N])`` with ``k = code ×
    scale`` (NaN codes read as NaN). Every slot must name a token: one outside ``[0,
    slots)`` raises ValueError (``slots`` is read on the host)."""
    view = index_cache_view(cache, page_size=page_size)
    check_tensor("slots", slots, ndim=1, dtypes=SLOT_DTYPES, device=cache.device)
    s = slots.long()
    check_slot_range(s, view.num_slots, skip=False)
    page, off = s // view.page_size, s % view.page_size
    codes = view.codes()[page, off].view(torch.float8_e4m3fn).float()
    scale = view.scales()[page, off]
    return codes * scale[:, None], scale


def native_e4m3_encode(device: torch.device) -> bool:
    """The GPU's saturating round-to-nearest-even e4m3 conversion (CUDA SM89+) gives the integer
    encoder's bytes; elsewhere (SM80/86, AMD, the interpreter) the integer encoder runs."""
    from fp8mla.dsa.format import native_e4m3_encode as native

    return native(device)


def _pack_triton(view: IndexCacheView, k: torch.Tensor, slots: torch.Tensor, pow2: bool) -> None:
    import triton

    from fp8mla.kernels.portable import indexer_pack as K

    k = k if k.stride(1) == 1 else k.contiguous()
    if k.dtype == torch.bfloat16:  # read as bits: widening is exact
        k, kind = k.view(torch.uint16), int(K.IN_BF16)
    else:
        kind = int(K.IN_FP16 if k.dtype == torch.float16 else K.IN_FP32)
    n = slots.numel()
    K.index_pack_kernel[(triton.cdiv(n, PACK_TOKENS),)](
        k,
        slots,
        view.data,
        n,
        view.num_slots,
        view.page_stride,
        k.stride(0),
        PAGE_SIZE=view.page_size,
        IN_KIND=kind,
        POW2=pow2,
        NATIVE_CVT=False if interpreted() else native_e4m3_encode(view.data.device),
        BLOCK_T=PACK_TOKENS,
        num_warps=PACK_WARPS,
    )


def _pack_torch(view: IndexCacheView, k: torch.Tensor, slots: torch.Tensor, pow2: bool) -> None:
    """The kernel's arithmetic in PyTorch ops, byte for byte."""
    s = slots.long()
    keep = (s >= 0) & (s < view.num_slots)
    s = s[keep]
    x = k[keep].float()
    amax = torch.where(x.isnan(), 0.0, x.abs()).amax(-1)
    scale = amax.clamp_min(AMAX_FLOOR) / torch.full_like(amax, E4M3_MAX)
    if pow2:
        bits = scale.view(torch.int32)
        up = ((bits & 0x7FFFFF) != 0).to(torch.int32)
        scale = (((bits >> 23) + up) << 23).view(torch.float32)
    q = x / scale[:, None]
    codes = q.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    codes = torch.where(q.isnan(), NAN_E4M3, codes)
    page, off = s // view.page_size, s % view.page_size
    view.codes()[page, off] = codes
    view.scales()[page, off] = scale
