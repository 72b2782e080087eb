"""``BatchMLAPagedAttentionWrapper``: FlashInfer's plan()/run() API over fp8mla's kernels.

An engine that calls ``flashinfer.mla.BatchMLAPagedAttentionWrapper`` switches by changing the
import; in addition the KV cache may be FP8 (e4m3/e5m2) and is read directly by the kernel, so
no cast of the pool is ever needed.
"""

from __future__ import annotations

from typing import Literal, overload

import torch

from fp8mla._checks import check_index, check_last_dim_contiguous, check_tensor
from fp8mla.formats import HEAD_DIM_CKV, HEAD_DIM_KPE, KV_DTYPES, Q_DTYPES
from fp8mla.ops.mla_attention import launch_mla_attention
from fp8mla.ops.planner import KernelConfig, LaunchPlan, device_sm_count, make_launch_plan
from fp8mla.ops.targets import current_target
from fp8mla.plan_state import PlanState, build_plan_state
from fp8mla.runtime import interpreted, resolve_backend

MAX_PAGE_SIZE = 128
MAX_HEADS = 128


class BatchMLAPagedAttentionWrapper:
    """Batched MLA attention over a paged KV cache (decode, speculative decode, extend).

    Call-compatible with FlashInfer's ``BatchMLAPagedAttentionWrapper``.

    Args:
        float_workspace_buffer: scratch memory (any dtype; 128 MB is plenty) on the device the
            attention runs on. Split-KV partial results live here; a small buffer limits the
            number of splits.
        use_cuda_graph: fix the index buffers (the four below, sized for the largest batch)
            so that ``plan()`` only fills them and ``run()`` can be captured and replayed.
        qo_indptr, kv_indptr, kv_indices, kv_len_arr: int32 buffers for CUDA-graph mode.
        backend: ``"triton"`` (the kernels; on CPU under ``TRITON_INTERPRET=1``), ``"torch"``
            (the float32 PyTorch reference: the CPU fallback), or ``"auto"`` (Triton on CUDA).

    Example:
        >>> w = BatchMLAPagedAttentionWrapper(torch.empty(128 << 20, dtype=torch.uint8,
        ...                                   device="cuda"))
        >>> w.plan(qo_indptr, kv_indptr, kv_indices, kv_len, 16, 512, 64, 1, False,
        ...        1 / 192 ** 0.5, torch.bfloat16, torch.float8_e4m3fn)
        >>> out = w.run(q_nope, q_pe, ckv_cache, kpe_cache)  # [tokens, 16, 512] bf16
    """

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        use_cuda_graph: bool = False,
        qo_indptr: torch.Tensor | None = None,
        kv_indptr: torch.Tensor | None = None,
        kv_indices: torch.Tensor | None = None,
        kv_len_arr: torch.Tensor | None = None,
        backend: str = "auto",
    ) -> None:
        check_tensor("float_workspace_buffer", float_workspace_buffer)
        self.device = float_workspace_buffer.device
        self._workspace = float_workspace_buffer
        self._backend = resolve_backend(backend, self.device)
        self._use_cuda_graph = use_cuda_graph
        self._graph_buffers: tuple[torch.Tensor, ...] | None = None
        if use_cuda_graph:
            bufs = (qo_indptr, kv_indptr, kv_indices, kv_len_arr)
            names = ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr")
            for name, buf in zip(names, bufs):
                if buf is None:
                    raise ValueError(f"expected a {name} buffer with use_cuda_graph=True, got None")
                check_index(name, buf)
                check_tensor(name, buf, device=self.device)
            self._graph_buffers = bufs  # type: ignore[assignment]
        self._plan: PlanState | None = None
        self._graph_launch: LaunchPlan | None = None

    # ------------------------------------------------------------------ plan
    def plan(
        self,
        qo_indptr: torch.Tensor,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        kv_len_arr: torch.Tensor,
        num_heads: int,
        head_dim_ckv: int,
        head_dim_kpe: int,
        page_size: int,
        causal: bool,
        sm_scale: float,
        q_data_type: torch.dtype,
        kv_data_type: torch.dtype,
        use_profiler: bool = False,
        *,
        num_splits: int | None = None,
        kernel_config: KernelConfig | None = None,
    ) -> None:
        """Describe the batch: B requests, request b owning query tokens
        ``qo_indptr[b]:qo_indptr[b+1]`` and KV pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``
        holding ``kv_len_arr[b]`` tokens. Index arrays are int32 (host or device). Reads them
        on the host once (validation, split planning); ``run()`` then does no host work.

        ``num_splits`` and ``kernel_config`` (keyword-only, fp8mla extensions) override the
        planner's KV split count per request and its tile shape, for tuning and tests."""
        del use_profiler  # accepted for compatibility; fp8mla has no in-kernel profiler
        if not 1 <= num_heads <= MAX_HEADS:
            raise ValueError(f"expected num_heads in [1, {MAX_HEADS}], got {num_heads}")
        if head_dim_ckv != HEAD_DIM_CKV:
            raise ValueError(f"expected head_dim_ckv {HEAD_DIM_CKV}, got {head_dim_ckv}")
        if head_dim_kpe not in (HEAD_DIM_KPE, 0):
            raise ValueError(f"expected head_dim_kpe {HEAD_DIM_KPE} or 0, got {head_dim_kpe}")
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"expected page_size in [1, {MAX_PAGE_SIZE}], got {page_size}")
        if q_data_type not in Q_DTYPES:
            raise ValueError(f"expected q_data_type bf16 or fp16, got {q_data_type}")
        if kv_data_type not in KV_DTYPES:
            raise ValueError(f"expected kv_data_type in {KV_DTYPES}, got {kv_data_type}")
        if not (float(sm_scale) > 0):
            raise ValueError(f"expected sm_scale > 0, got {sm_scale}")
        state = build_plan_state(
            qo_indptr,
            kv_indptr,
            kv_indices,
            kv_len_arr,
            num_heads=num_heads,
            head_dim_ckv=head_dim_ckv,
            head_dim_kpe=head_dim_kpe,
            page_size=page_size,
            causal=bool(causal),
            sm_scale=float(sm_scale),
            q_dtype=q_data_type,
            kv_dtype=kv_data_type,
            device=self.device,
            graph_buffers=self._graph_buffers,
        )
        if self._backend == "triton":
            if num_splits is not None and not 1 <= num_splits <= 256:
                raise ValueError(f"expected num_splits in [1, 256], got {num_splits}")
            state.launch = self._launch_plan(state, num_splits, kernel_config)
            state.bind_workspace(self._workspace)
        self._plan = state

    def _launch_plan(
        self, state: PlanState, num_splits: int | None, config: KernelConfig | None
    ) -> LaunchPlan:
        ws_rows = state.total_tokens * state.num_heads
        per_split = ws_rows * (state.head_dim_ckv + 1) * 4
        max_by_ws = self._workspace.numel() * self._workspace.element_size() // max(per_split, 1)
        fresh = make_launch_plan(
            batch=state.batch,
            num_heads=state.num_heads,
            max_qo_len=state.max_qo_len,
            max_kv_len=None if self._use_cuda_graph else state.max_kv_len,
            sms=device_sm_count(self.device),
            max_splits_by_workspace=max(1, int(max_by_ws)),
            interpreted=interpreted(),
            kv_dtype=state.kv_dtype,
            num_splits=num_splits,
            config=config,
            target=current_target(self.device) if self.device.type == "cuda" else None,
            head_dim_kpe=state.head_dim_kpe,
        )
        if not self._use_cuda_graph:
            return fresh
        # CUDA graphs replay the grid of the first plan: later plans must fit inside it.
        if self._graph_launch is None:
            self._graph_launch = fresh
        elif fresh.m_tiles > self._graph_launch.m_tiles:
            raise ValueError(
                f"expected at most {self._graph_launch.m_tiles * self._graph_launch.config.block_m}"
                f" query rows per request under CUDA graphs (fixed by the first plan), got "
                f"{state.max_qo_len * state.num_heads}"
            )
        return self._graph_launch

    # ------------------------------------------------------------------ run
    @overload
    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        out: torch.Tensor | None = ...,
        lse: torch.Tensor | None = ...,
        return_lse: Literal[False] = ...,
        *,
        ckv_scale: float | torch.Tensor | None = ...,
        kpe_scale: float | torch.Tensor | None = ...,
        ckv_scale_arr: torch.Tensor | None = ...,
    ) -> torch.Tensor: ...

    @overload
    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        out: torch.Tensor | None = ...,
        lse: torch.Tensor | None = ...,
        return_lse: Literal[True] = ...,
        *,
        ckv_scale: float | torch.Tensor | None = ...,
        kpe_scale: float | torch.Tensor | None = ...,
        ckv_scale_arr: torch.Tensor | None = ...,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def run(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        ckv_cache: torch.Tensor,
        kpe_cache: torch.Tensor,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        *,
        ckv_scale: float | torch.Tensor | None = None,
        kpe_scale: float | torch.Tensor | None = None,
        ckv_scale_arr: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention for the planned batch.

        Args:
            q_nope: ``[tokens, H, 512]`` bf16/fp16 (latent part of the queries).
            q_pe: ``[tokens, H, 64]`` (RoPE part; ``[tokens, H, 0]`` without one).
            ckv_cache: ``[num_pages, page_size, 512]`` in ``kv_data_type``; any page/token
                strides (e.g. ``pool[..., :512]`` of an engine's ``[slots, 1, 576]`` buffer).
            kpe_cache: ``[num_pages, page_size, 64]``, same dtype.
            out: optional ``[tokens, H, 512]`` output in the query dtype.
            lse: optional ``[tokens, H]`` fp32, base-2 log-sum-exp.
            return_lse: also return the LSE.
            ckv_scale, kpe_scale: per-tensor dequantization scales (floats or 1-element
                tensors; a CUDA tensor is read by the kernel, without host sync).
            ckv_scale_arr: ``[num_pages, page_size, 4]`` fp32 per-token, per-128-channel
                scales of the latent part (FP8 caches).

        Returns:
            ``out`` ``[tokens, H, 512]`` in the query dtype, and ``lse`` if ``return_lse``.
        """
        st = self._plan
        if st is None:
            raise ValueError("expected plan() to be called before run(), got no plan")
        scales = st.check_run(
            q_nope, q_pe, ckv_cache, kpe_cache, ckv_scale, kpe_scale, ckv_scale_arr
        )
        out = st.check_or_alloc_out(out)
        if lse is None and return_lse:
            lse = torch.empty(
                st.total_tokens, st.num_heads, dtype=torch.float32, device=self.device
            )
        elif lse is not None:
            check_tensor(
                "lse",
                lse,
                shape=(st.total_tokens, st.num_heads),
                dtypes=(torch.float32,),
                device=self.device,
            )
            check_last_dim_contiguous("lse", lse)
        if self._backend == "torch":
            st.run_reference(q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales)
        elif st.total_tokens and st.batch:
            mid_o, mid_lse = st.partials()
            launch_mla_attention(
                q_nope,
                q_pe,
                ckv_cache,
                kpe_cache,
                st.qo_indptr,
                st.kv_indptr,
                st.kv_indices,
                st.kv_len,
                out,
                lse,
                mid_o,
                mid_lse,
                plan=st.launch,
                batch=st.batch,
                causal=st.causal,
                sm_scale=st.sm_scale,
                scales=scales,
                interpreted=interpreted(),
            )
        return (out, lse) if return_lse else out


__all__ = ["BatchMLAPagedAttentionWrapper"]
