"""What ``plan()`` learns about a batch, and the checks ``run()`` makes against it.

:func:`build_plan_state` reads the index arrays that live on the host (validation, lengths for
split planning): pass ``qo_indptr``, ``kv_indptr`` and ``kv_len_arr`` as CPU tensors and
``plan()`` never waits for the device; ``kv_indices`` on the device is never read back (the
kernels bound every page id they use). Device copies are placed where the kernels read them:
the caller's own tensors, or, under CUDA graphs, the fixed buffers given at construction,
padded so that surplus requests of the captured grid have no work.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from fp8mla._checks import check_index, check_last_dim_contiguous, check_tensor, same_device
from fp8mla.formats import SCALE_GROUP, Scales, is_fp8


@dataclass
class PlanState:
    """The batch of one ``plan()``: sizes, attention parameters and device index arrays."""

    batch: int  # grid batch (the buffer capacity under CUDA graphs)
    num_requests: int
    total_tokens: int
    max_qo_len: int
    max_kv_len: int  # longest KV in tokens; the page-table bound when lengths stay on the device
    max_page: int | None  # largest page id referenced; None when kv_indices stayed on the device
    num_heads: int
    head_dim_ckv: int
    head_dim_kpe: int
    page_size: int
    causal: bool
    sm_scale: float
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    device: torch.device
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_len: torch.Tensor
    num_entries: int = 0  # page-table entries of the batch (kv_indptr[-1])
    # per request: query tokens and KV tokens (the page-table bound when lengths stay on the
    # device); for the planner's staging decision
    qo_lens: tuple[int, ...] = ()
    kv_tokens: tuple[int, ...] = ()
    out_dtype: torch.dtype | None = None  # None: the query dtype
    quantize_q: bool = False  # run() quantizes 16-bit queries to e4m3 (plan(quantize_q=True))

    @property
    def o_dtype(self) -> torch.dtype:
        return self.out_dtype or self.q_dtype

    # -- run-time checks (host-side metadata only: no device sync) --
    def check_run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv: torch.Tensor,
        kpe: torch.Tensor,
        ckv_scale: float | torch.Tensor | None,
        kpe_scale: float | torch.Tensor | None,
        ckv_scale_arr: torch.Tensor | None,
    ) -> Scales:
        t, h, dev = self.total_tokens, self.num_heads, self.device
        _fast_check("q_nope", q_nope, (t, h, self.head_dim_ckv), self.q_dtype, dev)
        _fast_check("q_pe", q_pe, (t, h, self.head_dim_kpe), self.q_dtype, dev)
        if not isinstance(ckv, torch.Tensor) or ckv.dim() != 3:
            check_tensor("ckv_cache", ckv, ndim=3)
        pages = ckv.shape[0]
        _fast_check(
            "ckv_cache", ckv, (pages, self.page_size, self.head_dim_ckv), self.kv_dtype, dev
        )
        _fast_check(
            "kpe_cache", kpe, (pages, self.page_size, self.head_dim_kpe), self.kv_dtype, dev
        )
        if self.max_page is not None and self.max_page >= pages:
            raise ValueError(
                f"expected page ids in [0, {pages}) for a cache of {pages} pages, got page id "
                f"{self.max_page} in kv_indices"
            )
        scales = Scales(
            ckv=_scale("ckv_scale", ckv_scale, dev), kpe=_scale("kpe_scale", kpe_scale, dev)
        )
        if ckv_scale_arr is not None:
            if not is_fp8(self.kv_dtype):
                raise ValueError(f"expected an FP8 cache with ckv_scale_arr, got {self.kv_dtype}")
            if ckv_scale is not None:
                raise ValueError("expected either ckv_scale or ckv_scale_arr, got both")
            groups = self.head_dim_ckv // SCALE_GROUP
            check_tensor(
                "ckv_scale_arr",
                ckv_scale_arr,
                shape=(pages, self.page_size, groups),
                dtypes=(torch.float32,),
                device=dev,
            )
            check_last_dim_contiguous("ckv_scale_arr", ckv_scale_arr)
            scales.ckv_arr = ckv_scale_arr
        return scales

    def check_or_alloc_out(self, out: torch.Tensor | None) -> torch.Tensor:
        shape = (self.total_tokens, self.num_heads, self.head_dim_ckv)
        if out is None:
            return torch.empty(shape, dtype=self.o_dtype, device=self.device)
        _fast_check("out", out, shape, self.o_dtype, self.device)
        return out

    def check_lse(self, lse: torch.Tensor) -> torch.Tensor:
        shape = (self.total_tokens, self.num_heads)
        _fast_check("lse", lse, shape, torch.float32, self.device)
        return lse

    def check_indices(self, num_pages: int) -> None:
        """Read the device index arrays back (a host sync: the opt-in debug check of
        ``run()``, skipped while a CUDA graph is being captured) and raise on the first page
        entry the kernels would refuse, naming the request and the id."""
        b = self.num_requests
        kvp = self.kv_indptr[: b + 1].tolist()
        lens = self.kv_len[:b].tolist()
        n_idx = self.kv_indices.numel()
        for r in range(b):
            start, stop, length = kvp[r], kvp[r + 1], lens[r]
            need = -(-length // self.page_size) if length > 0 else 0
            if need == 0:
                continue
            if start < 0 or start + need > min(stop, n_idx):
                raise ValueError(
                    f"expected request {r} to own {need} page-table entries "
                    f"(kv_len {length}, page_size {self.page_size}), got kv_indptr "
                    f"[{start}, {stop}) over {n_idx} entries"
                )
            ids = self.kv_indices[start : start + need]
            lo, hi = (int(v) for v in ids.aminmax())
            if lo < 0 or hi >= num_pages:
                bad = ids[(ids < 0) | (ids >= num_pages)][0].item()
                raise ValueError(
                    f"expected page ids in [0, {num_pages}) for request {r}, got page id {bad}"
                )


def _fast_check(
    name: str,
    t: object,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> None:
    """Shape, dtype, device and a unit last stride, with the common case in a few attribute
    reads (``run()`` makes these checks on every call); any mismatch gets the full message."""
    if (
        isinstance(t, torch.Tensor)
        and t.dtype is dtype
        and t.shape == shape
        and (t.device == device or same_device(t.device, device))
        and (t.stride(-1) == 1 or t.numel() == 0)
    ):
        return
    check_tensor(name, t, shape=shape, dtypes=(dtype,), device=device)
    check_last_dim_contiguous(name, t)  # type: ignore[arg-type]


def _scale(
    name: str, value: float | torch.Tensor | None, device: torch.device
) -> float | torch.Tensor:
    """A per-tensor scale: a real number (Python or NumPy) → float; CPU tensor → float (no
    device sync); 1-element fp32 tensor on the run device → read by the kernel. Scales must be
    finite and positive."""
    if type(value) is float and 0.0 < value < math.inf:  # the common case, first
        return value
    if value is None:
        return 1.0
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"expected {name} with one element, got shape {list(value.shape)}")
        if value.device.type == "cpu" and device.type != "cpu":
            value = float(value.item())
        elif value.device.type == "meta" or not same_device(value.device, device):
            raise ValueError(
                f"expected {name} on {device} (or as a CPU tensor or a float), got a tensor on "
                f"{value.device}"
            )
        elif device.type != "cpu":
            if value.dtype != torch.float32:
                raise ValueError(f"expected {name} of dtype float32, got {value.dtype}")
            return value
        else:
            value = float(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"expected {name} as a float or a tensor, got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"expected {name} finite and > 0, got {value}")
    return value


def _on_host(t: torch.Tensor) -> bool:
    """Whether reading ``t`` costs no wait for the device."""
    return t.device.type == "cpu"


def build_plan_state(
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    kv_len_arr: torch.Tensor,
    *,
    num_heads: int,
    head_dim_ckv: int,
    head_dim_kpe: int,
    page_size: int,
    causal: bool,
    sm_scale: float,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    device: torch.device,
    graph_buffers: tuple[torch.Tensor, ...] | None,
) -> PlanState:
    check_index("qo_indptr", qo_indptr)
    batch = qo_indptr.numel() - 1
    if batch < 0:
        raise ValueError("expected qo_indptr of length >= 1 (B + 1), got an empty tensor")
    check_index("kv_indptr", kv_indptr, length=batch + 1)
    check_index("kv_len_arr", kv_len_arr, length=batch)
    check_index("kv_indices", kv_indices)

    qo = qo_indptr.tolist()
    kvp = kv_indptr.tolist()
    kl = kv_len_arr.tolist() if _on_host(kv_len_arr) else None  # device lengths: not read
    if qo[0] != 0 or kvp[0] != 0:
        raise ValueError(f"expected qo_indptr[0] == kv_indptr[0] == 0, got {qo[0]} and {kvp[0]}")
    nnz = kvp[-1]
    if nnz > kv_indices.numel():
        raise ValueError(
            f"expected kv_indices of length >= kv_indptr[-1] = {nnz}, got {kv_indices.numel()}"
        )
    max_qo = max_kv = 0
    qo_lens, kv_tokens = [], []
    for b in range(batch):
        n, pages = qo[b + 1] - qo[b], kvp[b + 1] - kvp[b]
        if n < 0 or pages < 0:
            raise ValueError(
                f"expected non-decreasing qo_indptr and kv_indptr, got a decrease at request {b}"
            )
        qo_lens.append(n)
        if kl is None:  # the page table bounds the length
            max_qo, max_kv = max(max_qo, n), max(max_kv, pages * page_size)
            kv_tokens.append(pages * page_size)
            continue
        length = kl[b]
        if length < 0:
            raise ValueError(f"expected kv_len_arr >= 0, got {length} for request {b}")
        if -(-length // page_size) > pages:
            raise ValueError(
                f"expected at least {-(-length // page_size)} pages for request {b} "
                f"(kv_len {length}, page_size {page_size}), got {pages}"
            )
        if causal and length > 0 and n > length:
            raise ValueError(
                f"expected qo_len <= kv_len for causal request {b} (each query token's own KV "
                f"must be in the cache), got qo_len {n} > kv_len {length}"
            )
        max_qo, max_kv = max(max_qo, n), max(max_kv, length)
        kv_tokens.append(length)
    max_page: int | None = None
    if kv_indices.device.type == "cpu":  # free to read; device ids are bounded by the kernels
        max_page = -1
        if nnz:
            lo, hi = (int(v) for v in kv_indices[:nnz].aminmax())
            if lo < 0:
                raise ValueError(f"expected page ids >= 0 in kv_indices, got {lo}")
            max_page = hi

    if graph_buffers is None:
        to_dev = lambda x: x.to(device).contiguous()
        dev_qo, dev_kvp, dev_idx, dev_len = (
            to_dev(x) for x in (qo_indptr, kv_indptr, kv_indices, kv_len_arr)
        )
        grid_batch = batch
    else:
        dev_qo, dev_kvp, dev_idx, dev_len = graph_buffers
        cap = dev_qo.numel() - 1
        if (
            batch > cap
            or dev_kvp.numel() < cap + 1
            or dev_len.numel() < cap
            or nnz > dev_idx.numel()
        ):
            raise ValueError(
                f"expected a batch within the CUDA-graph buffers (B <= {cap}, "
                f"nnz pages <= {dev_idx.numel()}), got B = {batch}, nnz = {nnz}"
            )
        # Surplus requests of the captured grid: no query tokens, no KV.
        if dev_qo.data_ptr() != qo_indptr.data_ptr():
            dev_qo[: batch + 1].copy_(qo_indptr, non_blocking=True)
        dev_qo[batch + 1 :].fill_(qo[-1])
        if dev_kvp.data_ptr() != kv_indptr.data_ptr():
            dev_kvp[: batch + 1].copy_(kv_indptr, non_blocking=True)
        dev_kvp[batch + 1 :].fill_(nnz)
        if dev_len.data_ptr() != kv_len_arr.data_ptr():
            dev_len[:batch].copy_(kv_len_arr, non_blocking=True)
        dev_len[batch:].fill_(0)
        if dev_idx.data_ptr() != kv_indices.data_ptr():
            dev_idx[:nnz].copy_(kv_indices[:nnz], non_blocking=True)
        grid_batch = cap
    return PlanState(
        batch=grid_batch,
        num_requests=batch,
        total_tokens=qo[-1],
        max_qo_len=max_qo,
        max_kv_len=max_kv,
        max_page=max_page,
        num_heads=num_heads,
        head_dim_ckv=head_dim_ckv,
        head_dim_kpe=head_dim_kpe,
        page_size=page_size,
        causal=causal,
        sm_scale=sm_scale,
        q_dtype=q_dtype,
        kv_dtype=kv_dtype,
        device=device,
        qo_indptr=dev_qo,
        kv_indptr=dev_kvp,
        kv_indices=dev_idx,
        kv_len=dev_len,
        num_entries=nnz,
        qo_lens=tuple(qo_lens),
        kv_tokens=tuple(kv_tokens),
    )
