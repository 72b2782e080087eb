"""What ``plan()`` learns about a batch, and the checks ``run()`` makes against it.

``build_plan_state`` reads the index arrays on the host once (validation, lengths for split
planning) and places device copies where the kernels read them: the caller's own tensors,
or, under CUDA graphs, the fixed buffers given at construction, padded so that surplus
requests of the captured grid have no work.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fp8mla._checks import check_index, check_last_dim_contiguous, check_tensor
from fp8mla.formats import SCALE_GROUP, is_fp8
from fp8mla.ops.mla_attention import Scales
from fp8mla.ops.planner import LaunchPlan


@dataclass
class PlanState:
    batch: int  # grid batch (the buffer capacity under CUDA graphs)
    num_requests: int
    total_tokens: int
    max_qo_len: int
    max_kv_len: int
    max_page: int  # largest page id referenced (-1 when none)
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
    launch: LaunchPlan | None = None
    _mid: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    # -- workspace --
    def bind_workspace(self, workspace: torch.Tensor) -> None:
        """Carve the split-KV partials out of the workspace: ``mid_o [S, rows_cap, 512]`` and
        ``mid_lse [S, rows_cap]`` fp32, with a capacity that depends only on the workspace size
        and the split count (so CUDA-graph replays see the same addresses and strides)."""
        assert self.launch is not None
        splits = self.launch.num_splits
        if splits == 1:
            self._mid = None
            return
        if not workspace.is_contiguous():
            raise ValueError("expected a contiguous float_workspace_buffer, got a strided one")
        nbytes = workspace.numel() * workspace.element_size()
        flat = workspace.view(-1).view(torch.uint8)[: nbytes - nbytes % 4].view(torch.float32)
        d = self.head_dim_ckv
        rows_cap = flat.numel() // (splits * (d + 1))
        rows = self.total_tokens * self.num_heads
        if rows > rows_cap:
            raise ValueError(
                f"expected a float_workspace_buffer of at least {splits * (d + 1) * rows * 4} "
                f"bytes for {rows} query rows and {splits} splits, got {nbytes}"
            )
        mid_o = flat[: splits * rows_cap * d].view(splits, rows_cap, d)
        mid_lse = flat[splits * rows_cap * d : splits * rows_cap * (d + 1)].view(splits, rows_cap)
        self._mid = (mid_o, mid_lse)

    def partials(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self._mid if self._mid is not None else (None, None)

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
        check_tensor(
            "q_nope", q_nope, shape=(t, h, self.head_dim_ckv), dtypes=(self.q_dtype,), device=dev
        )
        check_tensor(
            "q_pe", q_pe, shape=(t, h, self.head_dim_kpe), dtypes=(self.q_dtype,), device=dev
        )
        check_tensor("ckv_cache", ckv, ndim=3, dtypes=(self.kv_dtype,), device=dev)
        pages = ckv.shape[0]
        check_tensor("ckv_cache", ckv, shape=(None, self.page_size, self.head_dim_ckv))
        check_tensor(
            "kpe_cache",
            kpe,
            shape=(pages, self.page_size, self.head_dim_kpe),
            dtypes=(self.kv_dtype,),
            device=dev,
        )
        for name, x in (("q_nope", q_nope), ("q_pe", q_pe), ("ckv_cache", ckv), ("kpe_cache", kpe)):
            check_last_dim_contiguous(name, x)
        if self.max_page >= pages:
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
            return torch.empty(shape, dtype=self.q_dtype, device=self.device)
        check_tensor("out", out, shape=shape, dtypes=(self.q_dtype,), device=self.device)
        check_last_dim_contiguous("out", out)
        return out

    def run_reference(self, q_nope, q_pe, ckv, kpe, out, lse, scales: Scales) -> None:
        """The PyTorch path (CPU fallback): float32 reference, written into ``out``/``lse``."""
        from fp8mla.reference import mla_reference

        o, s = mla_reference(
            q_nope,
            q_pe,
            ckv,
            kpe,
            self.qo_indptr[: self.num_requests + 1],
            self.kv_indptr[: self.num_requests + 1],
            self.kv_indices,
            self.kv_len[: self.num_requests],
            sm_scale=self.sm_scale,
            causal=self.causal,
            ckv_scale=scales.ckv,
            kpe_scale=scales.kpe,
            ckv_scale_arr=scales.ckv_arr,
            dtype=torch.float32,
        )
        out.copy_(o)
        if lse is not None:
            lse.copy_(s)


def _scale(
    name: str, value: float | torch.Tensor | None, device: torch.device
) -> float | torch.Tensor:
    """A per-tensor scale: Python number → float; CPU tensor → float (no device sync);
    1-element fp32 tensor on the run device → read by the kernel."""
    if value is None:
        return 1.0
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"expected {name} with one element, got shape {list(value.shape)}")
        if value.device.type == "cpu" and device.type != "cpu":
            value = float(value.item())
        elif value.device != device:
            raise ValueError(f"expected {name} on {device} or the CPU, got {value.device}")
        elif device.type != "cpu":
            if value.dtype != torch.float32:
                raise ValueError(f"expected {name} of dtype float32, got {value.dtype}")
            return value
        else:
            value = float(value.item())
    if not isinstance(value, (int, float)):
        raise ValueError(f"expected {name} as a float or a tensor, got {type(value).__name__}")
    if not (0.0 < float(value) < float("inf")):
        raise ValueError(f"expected {name} finite and > 0, got {value}")
    return float(value)


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
    kl = kv_len_arr.tolist()
    if qo[0] != 0 or kvp[0] != 0:
        raise ValueError(f"expected qo_indptr[0] == kv_indptr[0] == 0, got {qo[0]} and {kvp[0]}")
    nnz = kvp[-1]
    if nnz > kv_indices.numel():
        raise ValueError(
            f"expected kv_indices of length >= kv_indptr[-1] = {nnz}, got {kv_indices.numel()}"
        )
    max_qo = max_kv = 0
    for b in range(batch):
        n, pages, length = qo[b + 1] - qo[b], kvp[b + 1] - kvp[b], kl[b]
        if n < 0 or pages < 0:
            raise ValueError(
                f"expected non-decreasing qo_indptr and kv_indptr, got a decrease at request {b}"
            )
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
        dev_qo[: batch + 1].copy_(qo_indptr, non_blocking=True)
        dev_qo[batch + 1 :].fill_(qo[-1])
        dev_kvp[: batch + 1].copy_(kv_indptr, non_blocking=True)
        dev_kvp[batch + 1 :].fill_(nnz)
        dev_len[:batch].copy_(kv_len_arr, non_blocking=True)
        dev_len[batch:].fill_(0)
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
    )
