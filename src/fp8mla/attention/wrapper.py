"""``BatchMLAPagedAttentionWrapper``: FlashInfer's plan()/run() API over fp8mla's kernels.

An engine that calls ``flashinfer.mla.BatchMLAPagedAttentionWrapper`` switches by changing the
import; in addition the KV cache may be FP8 (e4m3/e5m2) and is read directly by the kernel, so
no cast of the pool is ever needed.

``plan()`` does the once-per-step work: validation, the backend and kernel variant, the grid,
the workspace layout and every launch argument the batch fixes. ``run()`` (once per layer)
checks its tensors and launches.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Literal, overload

import torch

from fp8mla._checks import check_index, check_tensor
from fp8mla.attention import native, query
from fp8mla.attention.config import KernelConfig, LaunchInfo, LaunchPlan
from fp8mla.attention.kernel_launcher import KernelLauncher, current_stream
from fp8mla.attention.launch import AttentionLaunch
from fp8mla.attention.plan_state import PlanState, build_plan_state
from fp8mla.attention.planner import device_sm_count, make_launch_plan
from fp8mla.attention.reference import run_reference
from fp8mla.attention.stage import STAGE_DTYPE, KVStage, make_stage
from fp8mla.attention.targets import launch_target
from fp8mla.attention.workspace import split_capacity, split_partials
from fp8mla.formats import HEAD_DIM_CKV, HEAD_DIM_KPE, KV_DTYPES, MAX_PAGE_SIZE, Scales
from fp8mla.runtime import interpreted, resolve_backend

MAX_HEADS = 128
MAX_NUM_SPLITS = 256


@dataclass(frozen=True)
class _GraphLaunch:
    """What a CUDA-graph wrapper's first plan fixed: a captured graph replays exactly this."""

    launch: LaunchPlan
    signature: tuple  # heads, dims, page size, causal, sm_scale, dtypes
    total_tokens: int


class BatchMLAPagedAttentionWrapper:
    """Batched MLA attention over a paged KV cache (decode, speculative decode, extend).

    Call-compatible with FlashInfer's ``BatchMLAPagedAttentionWrapper``.

    Args:
        float_workspace_buffer: scratch memory (any dtype; 128 MB is plenty) on the device the
            attention runs on. Split-KV partial results live here; a small buffer limits the
            number of splits.
        use_cuda_graph: fix the index buffers (the four below, sized for the largest batch)
            so that ``plan()`` only fills them and ``run()`` can be captured and replayed. The
            first plan fixes the launch a captured graph replays (kernel, query rows per
            request, KV splits, query tokens, heads, causal mask, softmax scale); a later
            plan that does not fit it raises ``ValueError`` naming the limit. Plan the largest
            batch first, and use one wrapper per captured shape (decode, verify).
        qo_indptr, kv_indptr, kv_indices, kv_len_arr: int32 buffers for CUDA-graph mode.
        backend: ``"triton"`` (the kernels; on CPU under ``TRITON_INTERPRET=1``), ``"torch"``
            (the float32 PyTorch reference: the CPU fallback), or ``"auto"`` (Triton on CUDA).
        debug: check at every ``run()`` that the page-table entries the kernels will read are
            in range (a host sync), raising ``ValueError`` naming the request and the page id.
            Also on with the environment variable ``FP8MLA_DEBUG=1``; not inside CUDA-graph
            capture, which cannot read back. Without it, an
            out-of-range id is never read and makes that request's output NaN.

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
        *,
        debug: bool = False,
    ) -> None:
        check_tensor("float_workspace_buffer", float_workspace_buffer)
        self.device = float_workspace_buffer.device
        self._workspace = float_workspace_buffer
        self._backend = resolve_backend(backend, self.device)
        self._debug = debug or os.environ.get("FP8MLA_DEBUG", "0") not in ("", "0")
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
        self._launch: AttentionLaunch | None = None
        self._stage: KVStage | None = None  # the plan's FP8 pages staged in fp16, if any
        self._queries: query.QueryPlan | None = None  # FP8 queries (or quantize_q): the route
        self._qprep: query.QueryPrep | None = None  # their fused pass before the attention
        # run()'s common case as one C call (attention/native.py), by kind (an LSE or not, +2
        # for device-tensor scales); bound after a run() of the plan, dropped by the next plan()
        self._fast: list[Any] = [None] * 4
        self._fast_run: Any = None
        self._device_index = self.device.index if self.device.index is not None else 0
        self._graph: _GraphLaunch | None = None

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
        kernel_config: KernelConfig | str | None = None,
        stage_kv: bool | None = None,
        kernel_options: dict[str, object] | None = None,
        o_data_type: torch.dtype | None = None,
        quantize_q: bool = False,
    ) -> None:
        """Describe the batch: B requests, request b owning query tokens
        ``qo_indptr[b]:qo_indptr[b+1]`` and KV pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``
        holding ``kv_len_arr[b]`` tokens. Index arrays are int32. ``qo_indptr`` and
        ``kv_indptr`` are read on the host (pass CPU tensors, as engines hold them, and
        ``plan()`` never waits for the device). ``kv_indices`` and ``kv_len_arr`` are read only
        when they are CPU tensors: on the device (vLLM keeps exact lengths there) the kernels
        bound every id and length they use -- a length past its request's pages makes that
        request's output NaN -- and the split count plans for the page table's bound
        (``pages × page_size`` tokens per request).

        ``num_splits`` and ``kernel_config`` (keyword-only, fp8mla extensions) override the
        planner's KV split count per request and its kernel: a :class:`KernelConfig`, or a
        variant name (``"rows"``, ``"vsplit"``, ``"wgmma"``, ``"pingpong"``, ``"pingpong64"``,
        ``"pingpong8"``, ``"fewrows"``, ``"fp8qk"``: see ``fp8mla.attention.variants``) run
        in its table tile; ``kernel_options`` sets compile-time options the chosen kernel
        declares with defaults (a Gluon kernel's ``STAGES``, ``QK_PARTS``, …; an unknown name
        is a ``ValueError``); all three for tuning and tests. :attr:`launch_info` says what a
        plan launches.

        ``stage_kv`` (keyword-only): an FP8 batch whose row tiles read each KV token many
        times (long extend chunks: a 4,096-token chunk at 128 heads is 8,192 tiles of 64
        rows) runs faster when ``run()`` first converts its pages once into fp16 in the float
        workspace and the 16-bit kernel reads those (``fp8mla.attention.stage``; the same
        function: FP8 values are exact in fp16). None lets the planner decide: where its
        target has measured the gain, without CUDA graphs, when the staged pages (entries ×
        page size × 1,152 bytes) fit the workspace. True forces it (``ValueError`` when the
        cache is not FP8, under CUDA graphs, or when the workspace is too small), False
        forbids it.

        FP8 queries (``fp8mla.attention.query``): ``q_data_type=torch.float8_e4m3fn``, and
        ``run()`` takes e4m3 queries and their ``q_scale``; ``quantize_q=True`` (16-bit
        ``q_data_type``): ``run()`` quantizes per (token, head), ``amax / 448``, in one fused
        kernel. ``o_data_type``: bf16 (the default for FP8 queries) or fp16; 16-bit queries
        take only their own dtype."""
        del use_profiler  # accepted for compatibility; fp8mla has no in-kernel profiler
        if not 1 <= num_heads <= MAX_HEADS:
            raise ValueError(f"expected num_heads in [1, {MAX_HEADS}], got {num_heads}")
        if head_dim_ckv != HEAD_DIM_CKV:
            raise ValueError(f"expected head_dim_ckv {HEAD_DIM_CKV}, got {head_dim_ckv}")
        if head_dim_kpe not in (HEAD_DIM_KPE, 0):
            raise ValueError(f"expected head_dim_kpe {HEAD_DIM_KPE} or 0, got {head_dim_kpe}")
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"expected page_size in [1, {MAX_PAGE_SIZE}], got {page_size}")
        fp8_q, o_dtype = query.check_query_types(q_data_type, quantize_q, o_data_type)
        if kv_data_type not in KV_DTYPES:
            raise ValueError(f"expected kv_data_type in {KV_DTYPES}, got {kv_data_type}")
        try:
            scale = float(sm_scale)
        except (TypeError, ValueError):
            raise ValueError(f"expected sm_scale as a float, got {sm_scale!r}") from None
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"expected sm_scale finite and > 0, got {sm_scale}")
        if num_splits is not None and not 1 <= num_splits <= MAX_NUM_SPLITS:
            raise ValueError(f"expected num_splits in [1, {MAX_NUM_SPLITS}], got {num_splits}")
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
            sm_scale=scale,
            q_dtype=q_data_type,
            kv_dtype=kv_data_type,
            device=self.device,
            graph_buffers=self._graph_buffers,
        )
        state.out_dtype, state.quantize_q = o_dtype, quantize_q
        # the PyTorch backend computes on the queries' values (reference_queries)
        queries = query.QueryPlan(q_data_type, quantize_q, True, 0) if fp8_q else None
        launch = stage = qprep = None
        if self._backend == "triton":
            stage = make_stage(
                state, stage_kv, self._workspace, graph=self._use_cuda_graph,
                device=self.device,
            )  # fmt: skip
            launch, queries = self._make_launch(
                state, num_splits, kernel_config, stage, kernel_options, queries
            )
            if queries is not None and queries.prepares:
                qprep = query.QueryPrep(
                    queries, tokens=state.total_tokens, heads=num_heads,
                    head_dim_kpe=head_dim_kpe, device=self.device, reuse=self._qprep,
                )  # fmt: skip
        self._plan, self._launch, self._stage = state, launch, stage
        self._queries, self._qprep = queries, qprep
        self._fast = [None] * 4  # the new plan's C path is bound by its first run()

    def _make_launch(
        self,
        state: PlanState,
        num_splits: int | None,
        config: KernelConfig | str | None,
        stage: KVStage | None = None,
        kernel_options: dict[str, object] | None = None,
        queries: query.QueryPlan | None = None,
    ) -> tuple[AttentionLaunch, query.QueryPlan | None]:
        interp = interpreted()
        target = launch_target(self.device, interp)
        workspace, kv_dtype, kv_indices = self._workspace, state.kv_dtype, state.kv_indices
        if stage is not None:  # the 16-bit kernel over the staged pages, partials in front
            workspace = stage.front
            kv_dtype, kv_indices = STAGE_DTYPE, stage.indices
        if self._use_cuda_graph and self._graph is not None:
            plan = self._graph_fit(state)
        else:
            plan = make_launch_plan(
                batch=state.batch,
                num_heads=state.num_heads,
                max_qo_len=state.max_qo_len,
                # CUDA-graph plans do not depend on lengths, which change between replays
                max_kv_len=None if self._use_cuda_graph else state.max_kv_len,
                sms=device_sm_count(self.device),
                max_splits_by_workspace=max(
                    1,
                    split_capacity(workspace, 1, state.head_dim_ckv)
                    // max(1, state.total_tokens * state.num_heads),
                ),
                target=target,
                kv_dtype=kv_dtype,
                num_splits=num_splits,
                config=config,
                head_dim_kpe=state.head_dim_kpe,
                # FP8 queries plan as the bf16 the conversion feeds (fp16 out: portable)
                q_dtype=state.q_dtype if queries is None else torch.bfloat16,
                portable=queries is not None and state.o_dtype != torch.bfloat16,
            )
            if self._use_cuda_graph:
                self._graph = _GraphLaunch(plan, _signature(state), state.total_tokens)
        forced = query.named_build(kernel_options, queries)  # for tuning and tests
        if queries is not None:  # the registry's rule: the kernel reads e4m3, or bf16 is made
            queries = query.route_queries(
                queries, plan.config, target, kv_dtype, state.o_dtype, forced
            )
        partials = None
        if plan.num_splits > 1:
            rows = state.total_tokens * state.num_heads
            partials = split_partials(
                workspace, plan.num_splits, rows, state.head_dim_ckv, plan.half_partials
            )
        return AttentionLaunch(
            plan,
            batch=state.batch,
            heads=state.num_heads,
            head_dim_kpe=state.head_dim_kpe,
            page_size=state.page_size,
            causal=state.causal,
            sm_scale=state.sm_scale,
            indices=(state.qo_indptr, state.kv_indptr, kv_indices, state.kv_len),
            partials=partials,
            kv_dtype=kv_dtype,
            device=self.device,
            target=target,
            interpreted=interp,
            kernel_options=kernel_options,
            q_fp8=queries.mode if queries is not None else 0,
        ), queries

    @property
    def launch_info(self) -> LaunchInfo | None:
        """What the current plan launches (None before a plan, or on the PyTorch backend):
        the kernel variant, its tile, the grid and the KV splits."""
        launch = self._launch
        if launch is None:
            return None
        return LaunchInfo(
            variant=launch.variant.name,
            config=launch.plan.config,
            grid=tuple(launch.kernel.grid),
            num_splits=launch.plan.num_splits,
            staged=self._stage is not None,
        )

    def _graph_fit(self, state: PlanState) -> LaunchPlan:
        """The first plan's launch, when ``state`` fits it; else ``ValueError`` naming the
        limit (a captured graph would replay the first launch and compute a wrong answer)."""
        g = self._graph
        assert g is not None
        sig = _signature(state)
        for name, (want, got) in zip(_SIGNATURE_NAMES, zip(g.signature, sig)):
            if want != got:
                raise ValueError(
                    f"expected {name} {want} under CUDA graphs (fixed by the first plan), got "
                    f"{got}; use one wrapper per captured shape"
                )
        rows = state.max_qo_len * state.num_heads
        if rows > g.launch.rows_per_request:
            raise ValueError(
                f"expected at most {g.launch.rows_per_request} query rows per request under "
                f"CUDA graphs (fixed by the first plan: {g.launch.config.variant} "
                f"{g.launch.config.block_m}-row tiles), got {rows} "
                f"({state.max_qo_len} tokens × {state.num_heads} heads); plan the largest "
                f"batch first or use one wrapper per captured shape"
            )
        if state.total_tokens > g.total_tokens:
            raise ValueError(
                f"expected at most {g.total_tokens} query tokens under CUDA graphs (fixed by "
                f"the first plan), got {state.total_tokens}"
            )
        return g.launch

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
        q_scale: float | torch.Tensor | None = ...,
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
        q_scale: float | torch.Tensor | None = ...,
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
        q_scale: float | torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attention for the planned batch.

        Args:
            q_nope: ``[tokens, H, 512]`` in ``q_data_type`` (latent part of the queries).
            q_pe: ``[tokens, H, 64]`` (RoPE part; ``[tokens, H, 0]`` without one).
            ckv_cache: ``[num_pages, page_size, 512]`` in ``kv_data_type``; any page/token
                strides (e.g. ``pool[..., :512]`` of an engine's ``[slots, 1, 576]`` buffer).
            kpe_cache: ``[num_pages, page_size, 64]``, same dtype.
            out: optional ``[tokens, H, 512]`` output in the query dtype.
            lse: optional ``[tokens, H]`` fp32, base-2 log-sum-exp.
            return_lse: also return the LSE.
            ckv_scale, kpe_scale: per-tensor dequantization scales (finite, > 0: floats or
                1-element tensors; a CUDA tensor is read by the kernel, without host sync;
                under a CUDA graph a float is fixed at capture, a device tensor is read at
                every replay).
            ckv_scale_arr: ``[num_pages, page_size, 4]`` fp32 per-token, per-128-channel
                scales of the latent part (FP8 caches). The kernels apply them to the tile
                before the tensor cores, in fp16: a dequantized value (FP8 value × its
                scale) must lie within fp16's range (|x| ≤ 65,504), or the rows that read it
                come out inf or NaN.
            q_scale: FP8 queries' scale (their values are ``q × q_scale``): a float, a
                0-d/1-element fp32 tensor on the device (read by the kernels, as vLLM's
                ``_q_scale``) or ``[tokens, H]`` fp32, one per (token, head); None is 1.0.

        Returns:
            ``out`` ``[tokens, H, 512]`` in ``o_data_type``, and ``lse`` if ``return_lse``.
            A request whose page-table entries fall outside the cache gets NaN (see ``debug``).
        """
        # the common case in one C call (checks, arguments, both launches), once bound
        fast = self._fast[(lse is not None) + 2 * (type(ckv_scale) is torch.Tensor)]
        if (
            fast
            and ckv_scale_arr is None
            and (lse is not None or not return_lse)
            and KernelLauncher._direct_ok()
        ):
            if out is None:
                out = self._plan.check_or_alloc_out(None)
            stream = current_stream(self._device_index)
            args = (q_nope, q_pe, ckv_cache, kpe_cache, out, lse, ckv_scale, kpe_scale)
            if self._fast_run(fast, stream, *args):
                self._launch.native_launches += 1
                return (out, lse) if return_lse else out
        st = self._plan
        if st is None:
            raise ValueError("expected plan() to be called before run(), got no plan")
        scales = st.check_run(
            q_nope, q_pe, ckv_cache, kpe_cache, ckv_scale, kpe_scale, ckv_scale_arr
        )
        qp = self._queries
        qs = query.check_q_scale(q_scale, st.total_tokens, st.num_heads, self.device, qp)
        out = st.check_or_alloc_out(out)
        if lse is not None:
            st.check_lse(lse)
        elif return_lse:
            lse = torch.empty(
                st.total_tokens, st.num_heads, dtype=torch.float32, device=self.device
            )
        if self._debug and not _capturing(self.device):  # a capture cannot read back
            st.check_indices(ckv_cache.shape[0])
        if self._launch is None:
            if qp is not None:
                q_nope, q_pe = query.reference_queries(q_nope, q_pe, qs, qp.quantize)
            run_reference(st, q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales)
        elif st.total_tokens and st.batch:
            if self._stage is not None:  # the FP8 pages in fp16, per-token scales applied
                ckv_cache, kpe_cache = self._stage(ckv_cache, kpe_cache, scales.ckv_arr)
                scales = Scales(scales.ckv, scales.kpe)
            if self._qprep is not None:  # FP8 codes and row scales, or bf16 queries
                q_nope, q_pe, qs = self._qprep(q_nope, q_pe, qs)
            self._launch(q_nope, q_pe, ckv_cache, kpe_cache, out, lse, scales, qs)
            tensors = isinstance(scales.ckv, torch.Tensor) and isinstance(scales.kpe, torch.Tensor)
            kind = (lse is not None) + 2 * tensors
            plain = scales.ckv_arr is None and self._stage is None and qp is None
            if self._fast[kind] is None and not self._debug and plain:
                self._bind_fast(lse is not None, tensors)
        return (out, lse) if return_lse else out

    def _bind_fast(self, write_lse: bool, scale_tensors: bool) -> None:
        """After a run() through the Python path: this plan's common case as one C call
        (``native.fast_call``), once its kernels are bound for it (retried after each such
        run() until then)."""
        st, launch = self._plan, self._launch
        fast = launch.fast_call(write_lse, scale_tensors, st.q_dtype, st.total_tokens, st.max_page)
        if fast is not None:
            self._fast_run = native.fast_runner()
            self._fast[write_lse + 2 * scale_tensors] = fast


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


_SIGNATURE_NAMES = ("num_heads", "head_dim_kpe", "page_size", "causal", "sm_scale", "q_data_type",
                    "kv_data_type", "o_data_type", "quantize_q")  # fmt: skip


def _signature(state: PlanState) -> tuple:
    return (state.num_heads, state.head_dim_kpe, state.page_size, state.causal, state.sm_scale,
            state.q_dtype, state.kv_dtype, state.o_dtype, state.quantize_q)  # fmt: skip


__all__ = ["BatchMLAPagedAttentionWrapper"]
