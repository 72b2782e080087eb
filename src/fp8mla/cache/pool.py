"""The per-layer MLA KV pool: one buffer, engine and paged views, sequences and writes."""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Literal

import torch

from fp8mla._checks import check_tensor
from fp8mla.cache.allocator import PageAllocator, PoolExhaustedError
from fp8mla.cache.quantize import quantize, quantize_token_groups
from fp8mla.formats import HEAD_DIM_CKV, HEAD_DIM_KPE, KV_DTYPES, SCALE_GROUP, is_fp8
from fp8mla.runtime import resolve_backend

ScaleMode = Literal["tensor", "token_group"]


@dataclass
class _Sequence:
    pages: list[int] = field(default_factory=list)
    length: int = 0


MAX_PAGE_SIZE = 128  # the attention kernels' limit (fp8mla.attention.wrapper.MAX_PAGE_SIZE)
MAX_PAGES = 2**31 - 1  # page ids are int32 (kv_indices)


def _int_arg(name: str, value: object) -> int:
    """``value`` as an int: an integer (Python, NumPy, a 0-dim integer tensor), not a float or
    a bool, so that ``MLAKVCache(1e5)`` is refused here and not deep inside torch."""
    if isinstance(value, bool):
        raise ValueError(f"expected {name} an integer, got bool {value}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ValueError(
            f"expected {name} an integer, got {type(value).__name__} {value!r:.40}"
        ) from None


class MLAKVCache:
    """One layer's MLA KV cache, usable by the kernels without copies.

    Storage is one contiguous ``buffer [num_slots, 1, 576]`` (the engine layout: 512 latent
    then 64 RoPE values per token) with paged views ``ckv [num_pages, page_size, 512]`` and
    ``kpe [num_pages, page_size, 64]`` of the same memory. Slot ``s`` is token ``s % page_size``
    of page ``s // page_size``.

    Args:
        num_slots: pool capacity in tokens (a multiple of ``page_size``).
        page_size: tokens per page (1 … 128 for the kernels).
        dtype: storage dtype: bf16, fp16, ``float8_e4m3fn`` or ``float8_e5m2``.
        scale_mode: ``"tensor"`` (static fp32 ``ckv_scale``/``kpe_scale``) or ``"token_group"``
            (FP8 only: a scale per token per 128 latent channels from the amax of the values
            written, in ``scale_arr [num_pages, page_size, 4]``; ``kpe`` keeps ``kpe_scale``).
        backend: ``"triton"`` writes with the fused kernel, ``"torch"`` with PyTorch ops,
            ``"auto"`` picks Triton on CUDA.

    Example:
        >>> cache = MLAKVCache(4096, page_size=16, dtype=torch.float8_e4m3fn)
        >>> seq = cache.new_sequence()
        >>> cache.append(seq, torch.randn(40, 512), torch.randn(40, 64))
        >>> kv_indptr, kv_indices, kv_len = cache.plan_arrays([seq])
    """

    def __init__(
        self,
        num_slots: int,
        *,
        page_size: int = 1,
        dtype: torch.dtype = torch.float8_e4m3fn,
        scale_mode: ScaleMode = "tensor",
        ckv_scale: float = 1.0,
        kpe_scale: float = 1.0,
        device: torch.device | str | None = None,
        head_dim_ckv: int = HEAD_DIM_CKV,
        head_dim_kpe: int = HEAD_DIM_KPE,
        backend: str = "auto",
    ) -> None:
        num_slots = _int_arg("num_slots", num_slots)
        page_size = _int_arg("page_size", page_size)
        head_dim_ckv = _int_arg("head_dim_ckv", head_dim_ckv)
        head_dim_kpe = _int_arg("head_dim_kpe", head_dim_kpe)
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(
                f"expected page_size in [1, {MAX_PAGE_SIZE}] (the attention kernels' limit), "
                f"got {page_size}"
            )
        if num_slots // page_size > MAX_PAGES:
            raise ValueError(
                f"expected at most {MAX_PAGES:,} pages (int32 page ids), got "
                f"{num_slots:,} slots / page_size {page_size} = {num_slots // page_size:,}"
            )
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"expected dtype a torch.dtype, got {type(dtype).__name__}")
        if head_dim_ckv < 1 or head_dim_kpe < 0:
            raise ValueError(
                f"expected head_dim_ckv >= 1 and head_dim_kpe >= 0, got {head_dim_ckv} and "
                f"{head_dim_kpe}"
            )
        for name, value in (("ckv_scale", ckv_scale), ("kpe_scale", kpe_scale)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"expected {name} a number, got {type(value).__name__}")
        if not isinstance(backend, str):
            raise ValueError(f"expected backend a str, got {type(backend).__name__}")
        if page_size < 1 or num_slots < page_size or num_slots % page_size:
            raise ValueError(
                f"expected num_slots a positive multiple of page_size, got {num_slots} "
                f"and page_size {page_size}"
            )
        if dtype not in KV_DTYPES:
            raise ValueError(f"expected dtype in {KV_DTYPES}, got {dtype}")
        if scale_mode not in ("tensor", "token_group"):
            raise ValueError(f"expected scale_mode 'tensor' or 'token_group', got {scale_mode!r}")
        if scale_mode == "token_group" and not is_fp8(dtype):
            raise ValueError(f"expected an FP8 dtype for scale_mode='token_group', got {dtype}")
        if head_dim_ckv % SCALE_GROUP:
            raise ValueError(f"expected head_dim_ckv a multiple of 128, got {head_dim_ckv}")
        if not is_fp8(dtype) and (ckv_scale != 1.0 or kpe_scale != 1.0):
            raise ValueError(
                f"expected scales of 1.0 for {dtype} storage, got {ckv_scale}, {kpe_scale}"
            )
        for name, value in (("ckv_scale", ckv_scale), ("kpe_scale", kpe_scale)):
            if not (math.isfinite(float(value)) and float(value) > 0):
                raise ValueError(f"expected {name} finite and > 0, got {value}")
        self.num_slots = num_slots
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        self.dtype = dtype
        self.scale_mode: ScaleMode = scale_mode
        self.ckv_scale = float(ckv_scale)
        self.kpe_scale = float(kpe_scale)
        self.head_dim_ckv = head_dim_ckv
        self.head_dim_kpe = head_dim_kpe
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.backend = resolve_backend(backend, self.device)
        width = head_dim_ckv + head_dim_kpe
        self.buffer = torch.zeros(num_slots, 1, width, dtype=dtype, device=self.device)
        self.device = self.buffer.device  # "cuda" → "cuda:0": the device tensors report
        self.scale_arr: torch.Tensor | None = None
        if scale_mode == "token_group":
            groups = head_dim_ckv // SCALE_GROUP
            self.scale_arr = torch.ones(
                self.num_pages, page_size, groups, dtype=torch.float32, device=self.device
            )
        self.allocator = PageAllocator(self.num_pages)
        self._seqs: dict[int, _Sequence] = {}
        self._next_seq = 0

    # -- views of the one buffer --
    @property
    def engine_view(self) -> torch.Tensor:
        """``[num_slots, 1, 576]``: the layout an engine keeps per layer."""
        return self.buffer

    @property
    def ckv(self) -> torch.Tensor:
        """``[num_pages, page_size, 512]`` strided view (latent part)."""
        paged = self.buffer.view(self.num_pages, self.page_size, -1)
        return paged[..., : self.head_dim_ckv]

    @property
    def kpe(self) -> torch.Tensor:
        """``[num_pages, page_size, 64]`` strided view (RoPE part)."""
        paged = self.buffer.view(self.num_pages, self.page_size, -1)
        return paged[..., self.head_dim_ckv :]

    def run_kwargs(self) -> dict[str, object]:
        """The scale keywords for ``BatchMLAPagedAttentionWrapper.run`` on this cache."""
        if self.scale_mode == "token_group":
            return {"ckv_scale_arr": self.scale_arr, "kpe_scale": self.kpe_scale}
        return {"ckv_scale": self.ckv_scale, "kpe_scale": self.kpe_scale}

    # -- sequences --
    def new_sequence(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        self._seqs[seq] = _Sequence()
        return seq

    def seq_len(self, seq: int) -> int:
        return self._get(seq).length

    def seq_pages(self, seq: int) -> list[int]:
        return list(self._get(seq).pages)

    def free(self, seq: int) -> None:
        """Return the pages of a finished sequence to the pool."""
        state = self._get(seq)
        self.allocator.free(state.pages)
        del self._seqs[seq]

    def _get(self, seq: int) -> _Sequence:
        if seq not in self._seqs:
            raise KeyError(f"expected a live sequence id, got {seq}")
        return self._seqs[seq]

    def append(self, seq: int, ckv_new: torch.Tensor, kpe_new: torch.Tensor) -> torch.Tensor:
        """Write ``n`` new tokens (``ckv_new [n, 512]``, ``kpe_new [n, 64]``) after the end of
        ``seq``, allocating pages as needed. Raises :class:`PoolExhaustedError` before writing
        anything when the pool cannot hold them. Returns the slots written (int64 ``[n]``)."""
        state = self._get(seq)
        n = self._check_rows(ckv_new, kpe_new)
        need = -(-(state.length + n) // self.page_size) - len(state.pages)
        new_pages = self.allocator.alloc(max(need, 0))  # raises with state unchanged
        pages = state.pages + new_pages
        pos = torch.arange(state.length, state.length + n)
        page_ids = torch.tensor(pages, dtype=torch.int64)[pos // self.page_size]
        slots = (page_ids * self.page_size + pos % self.page_size).to(self.device)
        try:
            self._write(slots, ckv_new, kpe_new)
        except Exception:
            self.allocator.free(new_pages)
            raise
        state.pages = pages
        state.length += n
        return slots

    def write(
        self,
        slots: torch.Tensor,
        ckv_new: torch.Tensor,
        kpe_new: torch.Tensor,
        *,
        validate: bool = True,
    ) -> None:
        """Batched write through a slot mapping (what an engine's ``set_kv_buffer`` does):
        row ``i`` goes to slot ``slots[i]``. ``validate=False`` skips the range check, which
        reads the slots on the host (use it inside CUDA-graph capture)."""
        n = self._check_rows(ckv_new, kpe_new)
        check_tensor("slots", slots, ndim=1, dtypes=(torch.int32, torch.int64), device=self.device)
        if slots.numel() != n:
            raise ValueError(f"expected {n} slots (one per row), got {slots.numel()}")
        if validate and n:
            lo, hi = int(slots.min()), int(slots.max())
            if lo < 0 or hi >= self.num_slots:
                raise ValueError(f"expected slots in [0, {self.num_slots}), got range [{lo}, {hi}]")
        self._write(slots, ckv_new, kpe_new)

    def _check_rows(self, ckv_new: torch.Tensor, kpe_new: torch.Tensor) -> int:
        check_tensor("ckv_new", ckv_new, ndim=2, device=self.device)
        n = ckv_new.shape[0]
        check_tensor(
            "ckv_new",
            ckv_new,
            shape=(n, self.head_dim_ckv),
            dtypes=(torch.bfloat16, torch.float16, torch.float32),
        )
        check_tensor(
            "kpe_new",
            kpe_new,
            shape=(n, self.head_dim_kpe),
            device=self.device,
            dtypes=(torch.bfloat16, torch.float16, torch.float32),
        )
        return n

    def _write(self, slots: torch.Tensor, ckv_new: torch.Tensor, kpe_new: torch.Tensor) -> None:
        if self.backend == "triton":
            from fp8mla.cache.kv_write import kv_write_triton

            scale_arr = (
                self.scale_arr.view(self.num_slots, -1) if self.scale_arr is not None else None
            )
            kv_write_triton(
                self.buffer, scale_arr, slots, ckv_new, kpe_new, self.ckv_scale, self.kpe_scale
            )
            return
        rows = self.buffer.view(self.num_slots, -1)
        idx = slots.long()
        if self.scale_mode == "token_group":
            q, scales = quantize_token_groups(ckv_new, self.dtype)
            self.scale_arr.view(self.num_slots, -1)[idx] = scales
        else:
            q = quantize(ckv_new, self.dtype, self.ckv_scale)
        rows[idx, : self.head_dim_ckv] = q
        rows[idx, self.head_dim_ckv :] = quantize(kpe_new, self.dtype, self.kpe_scale)

    # -- plan arrays --
    def plan_arrays(self, seqs: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(kv_indptr [B+1], kv_indices [nnz_pages], kv_len [B])`` int32 on the cache's
        device, for ``BatchMLAPagedAttentionWrapper.plan``."""
        states = [self._get(s) for s in seqs]
        lens = [len(s.pages) for s in states]
        indptr = [0]
        for n in lens:
            indptr.append(indptr[-1] + n)
        indices = [p for s in states for p in s.pages]
        as_i32 = lambda v: torch.tensor(v, dtype=torch.int32, device=self.device)
        return as_i32(indptr), as_i32(indices), as_i32([s.length for s in states])


__all__ = ["MLAKVCache", "PoolExhaustedError"]
