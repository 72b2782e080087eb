"""Writing and reading the packed 656-byte FP8 MLA cache (``fp8_ds_mla``) of DeepSeek Sparse
Attention models: :func:`pack_ds_mla` quantizes new tokens into it, :func:`unpack_ds_mla`
reads tokens back as float32.

The writer states vLLM's ``concat_and_cache_ds_mla_kernel`` (csrc/libtorch_stable/
cache_kernels.cu) for bf16 rows: per 128 latent values ``scale = max(amax / 448, 2^-126)``,
``code = e4m3(x / scale)`` rounded to nearest even with saturation to ±448, RoPE copied as bf16.
SGLang's Triton writer (``quantize_k_cache_separate``) multiplies by ``1 / scale`` instead of
dividing, which moves a value that lies exactly halfway between two e4m3 codes by one code; it
stores a zero scale for an all-zero group and ±448 for a NaN or inf; everywhere else its bytes
agree when its arithmetic is IEEE (the interpreter). Compiled for a GPU, Triton lowers its
divisions to approximate ones (``div.full.f32``), so its scales there can differ by an ulp.
"""

from __future__ import annotations

import torch

from fp8mla._checks import check_tensor
from fp8mla.dsa.layout import (
    E4M3_MAX,
    GROUP,
    GROUPS,
    NAN_BF16,
    NAN_E4M3,
    NOPE_DIM,
    POW2_SCALE_FLOOR,
    ROPE_DIM,
    SCALE_FLOOR,
    SLOT_DTYPES,
    ScaleFormat,
    TokenView,
    check_slot_range,
    token_view,
    writer_backend,
)
from fp8mla.runtime import interpreted

ROW_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
PACK_TOKENS = 16  # tokens per program of the Triton writer
PACK_WARPS = 8


def pack_ds_mla(
    ckv: torch.Tensor,
    kpe: torch.Tensor,
    cache: torch.Tensor,
    slots: torch.Tensor,
    *,
    scale_format: ScaleFormat = "arbitrary",
    validate: bool = True,
    backend: str = "auto",
) -> None:
    """Quantize ``ckv [N, 512]`` and ``kpe [N, 64]`` (bf16, fp16 or fp32, one dtype) into the
    packed cache at ``slots [N]`` (int32/int64, on the cache's device), in place.

    ``cache``: uint8, int8 or float8_e4m3fn of shape ``[pages, page_size, 656]`` (vLLM),
    ``[pages, page_size, 1, 656]`` (FlashMLA) or ``[slots, 1, 656]`` (SGLang's pool); slot
    ``s`` is token ``s % page_size`` of page ``s // page_size``. Row ``i`` is written as::

        amax_j  = max |ckv[i, 128 j : 128 j + 128]| over its non-NaN values (±inf count)
        scale_j = max(amax_j / 448, 2^-126)                          ("arbitrary", engines)
                  2^ceil(log2(max(amax_j / 448, 1e-4)))               ("pow2", DeepSeek's
                                                                        reference quantizer)
        code    = e4m3(ckv / scale_j): division rounded to float32, then to nearest even e4m3,
                  finite overflow saturating to ±448
        bytes   = [512 codes | 4 float32 scales | 64 bf16 RoPE values (rounded to nearest
                  even from fp16/fp32)]

    Zero, NaN and inf (read back as ``code * scale``):

    - an all-zero group gets scale 2^-126 ("pow2": 2^-13) and codes 0 (0x80 for -0.0): it
      reads back as zeros;
    - a NaN value is stored as the NaN code 0x7F and reads back as NaN; it does not take part in
      its group's scale, so the group's other values keep their precision;
    - a ±inf value makes its group's scale inf: the inf is stored as NaN (inf / inf), the
      group's finite values as codes 0, and the whole group reads back as NaN (0 × inf);
    - RoPE values are stored as bf16 as they are (NaN, inf included; an fp16/fp32 NaN becomes
      0x7FC0).

    For bf16 rows the bytes equal vLLM's ``concat_and_cache_ds_mla`` on CUDA, edge cases
    included (vLLM takes 16-bit rows only, and reads fp16 ones' bits as integers for amax).
    SGLang's ``quantize_k_cache_separate`` + ``set_mla_kv_buffer`` agree except: a
    value exactly halfway between two codes may land one code away there (it multiplies by
    ``1 / scale``); an all-zero group has scale 0 there; a NaN or inf value saturates to ±448
    there.

    Slots: ``-1`` (padding) is skipped, as vLLM's writer does; SGLang pads with its reserved slot
    0, which is written like any slot. Slots must be distinct (which row lands in a repeated slot
    is unspecified). ``validate=True`` reads ``slots`` on the host (one device sync on CUDA) and
    raises ValueError for any slot outside ``[-1, num_slots)``; ``validate=False`` skips that
    check (CUDA-graph capture, an engine's per-layer write). Either way nothing is written
    outside the cache: out-of-range slots are skipped like -1.

    ``backend``: ``"auto"`` runs the Triton kernel on CUDA tensors and PyTorch ops on CPU
    tensors (byte-identical); ``"triton"`` on CPU tensors needs ``TRITON_INTERPRET=1``.
    """
    view = token_view(cache)
    device = cache.device
    check_tensor("ckv", ckv, ndim=2, dtypes=ROW_DTYPES, device=device)
    n = ckv.shape[0]
    check_tensor("ckv", ckv, shape=(n, NOPE_DIM))
    check_tensor("kpe", kpe, shape=(n, ROPE_DIM), dtypes=(ckv.dtype,), device=device)
    which = writer_backend("ckv", n, slots, view.num_slots, scale_format=scale_format,
                           backend=backend, device=device, validate=validate)  # fmt: skip
    if which is None:
        return
    pow2 = scale_format == "pow2"
    if which == "triton":
        _pack_triton(view, slots, ckv, kpe, pow2)
    else:
        _pack_torch(view, slots, ckv, kpe, pow2)


def unpack_ds_mla(cache: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens at ``slots [N]`` of a packed cache (any shape :func:`pack_ds_mla` takes) as
    ``(ckv float32 [N, 512], kpe float32 [N, 64])``: ``ckv = e4m3 code × its group's scale``
    (NaN codes read as NaN, an infinite scale makes its group NaN), ``kpe`` the bf16 values.

    Every slot must name a token: a slot outside ``[0, num_slots)``, -1 included, raises
    ValueError (``slots`` is read on the host: one device sync on CUDA)."""
    view = token_view(cache)
    check_tensor("slots", slots, ndim=1, dtypes=SLOT_DTYPES, device=cache.device)
    s = slots.long()
    check_slot_range(s, view.num_slots, skip=False)
    rows = view.data[s // view.page_size, s % view.page_size]  # [N, 656] uint8, a copy
    codes = rows[:, :NOPE_DIM].view(torch.float8_e4m3fn).float()
    scales = rows[:, NOPE_DIM : NOPE_DIM + 4 * GROUPS].contiguous().view(torch.float32)
    ckv = (codes.unflatten(1, (GROUPS, GROUP)) * scales[:, :, None]).flatten(1)
    kpe = rows[:, NOPE_DIM + 4 * GROUPS :].contiguous().view(torch.bfloat16).float()
    return ckv, kpe


def native_e4m3_encode(device: torch.device) -> bool:
    """Whether the Triton writer rounds to e4m3 with the GPU's own conversion: CUDA SM89 and
    later, whose ``cvt.rn.satfinite.e4m3x2.f32`` rounds to nearest even, saturates to ±448 and
    writes NaN as 0x7F, the integer encoder's result; elsewhere (SM80/86, AMD, the CPU
    interpreter) the integer encoder."""
    if interpreted() or device.type != "cuda" or torch.version.hip:
        return False
    from fp8mla.attention.targets import current_target

    target = current_target(device)
    return target.backend == "cuda" and int(target.arch) >= 89


def _pack_triton(
    view: TokenView, slots: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor, pow2: bool
) -> None:
    import triton

    from fp8mla.kernels.portable import ds_mla_pack as K

    ckv = ckv if ckv.stride(1) == 1 else ckv.contiguous()
    kpe = kpe if kpe.stride(1) == 1 else kpe.contiguous()
    if ckv.dtype == torch.bfloat16:  # read as bits: widening and the RoPE copy are exact
        ckv, kpe, kind = ckv.view(torch.uint16), kpe.view(torch.uint16), int(K.IN_BF16)
    else:
        kind = int(K.IN_FP16 if ckv.dtype == torch.float16 else K.IN_FP32)
    page_size, stride_page, stride_token = view.addressing()
    n = slots.numel()
    K.ds_mla_pack_kernel[(triton.cdiv(n, PACK_TOKENS),)](
        ckv,
        kpe,
        slots,
        view.data,
        n,
        view.num_slots,
        page_size,
        stride_page,
        stride_token,
        ckv.stride(0),
        kpe.stride(0),
        IN_KIND=kind,
        POW2=pow2,
        NATIVE_CVT=native_e4m3_encode(view.data.device),
        BLOCK_T=PACK_TOKENS,
        num_warps=PACK_WARPS,
    )


def _pack_torch(
    view: TokenView, slots: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor, pow2: bool
) -> None:
    """The kernel's arithmetic in PyTorch ops, byte for byte."""
    s = slots.long()
    keep = (s >= 0) & (s < view.num_slots)
    s = s[keep]
    x = ckv[keep].float().unflatten(1, (GROUPS, GROUP))
    amax = torch.where(x.isnan(), 0.0, x.abs()).amax(-1)
    scale = amax / torch.full_like(amax, E4M3_MAX)
    if pow2:
        bits = scale.clamp_min(POW2_SCALE_FLOOR).view(torch.int32)
        up = ((bits & 0x7FFFFF) != 0).to(torch.int32)
        scale = (((bits >> 23) + up) << 23).view(torch.float32)
    else:
        scale = scale.clamp_min(SCALE_FLOOR)
    q = x / scale[:, :, None]
    codes = q.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    codes = torch.where(q.isnan(), NAN_E4M3, codes).flatten(1)
    y = kpe[keep]
    if y.dtype == torch.bfloat16:
        rope = y.contiguous().view(torch.int16)
    else:
        rope = y.float().to(torch.bfloat16).view(torch.int16)
        rope = torch.where(y.isnan(), NAN_BF16, rope)
    packed = torch.cat([codes, scale.view(torch.uint8).flatten(1), rope.view(torch.uint8)], 1)
    view.data[s // view.page_size, s % view.page_size] = packed
