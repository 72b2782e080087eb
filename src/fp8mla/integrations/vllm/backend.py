"""``FP8MLABackend``: vLLM's MLA decode (``forward_mqa``) on fp8mla's kernels.

vLLM keeps MLA's KV cache as ``[num_blocks, block_size, 576]`` (latent 512 + RoPE 64), FP8
values stored as ``k / k_scale`` by ``concat_and_cache_mla``. ``forward_mqa`` hands that cache
to fp8mla's wrapper as two strided views and ``layer._k_scale`` (a 1-element device tensor,
read by the kernel) as the dequantization scale: no cast, no copy. Prefill keeps vLLM's own
MLA prefill path (``MLACommonImpl``'s MHA over the up-projected K/V).

Eager metadata: vLLM's dense block table becomes the wrapper's CSR page list on the device:
every decode request gets the same host-known number of pages,
``ceil(max_seq_len / block_size)`` (``max_seq_len`` is the host bound vLLM already keeps), so
``kv_indptr`` is built on the host and ``kv_indices`` is a slice of the block table; the
exact lengths stay on the device (``seq_lens``) and bound what the kernel reads. The plan runs
once per step, on the first layer's call.

Full CUDA graphs (``AttentionCGSupport.UNIFORM_BATCH``, as vLLM's FlashMLA and Triton MLA
builders declare): vLLM captures whole decode steps of uniform batches (every request the same
query length: decode, or speculative verification rows) and calls
``build_for_cudagraph_capture`` once per captured shape, outside the graph. The builder plans a
CUDA-graph wrapper there, once per shape, over vLLM's own persistent buffers: the block table
(``[num_reqs, max_blocks]`` int32, read as a CSR page list of ``max_blocks`` entries per
request) and ``seq_lens`` (int32) become the wrapper's ``kv_indices`` and ``kv_len_arr``
themselves, so the captured kernels read the tables and lengths vLLM rewrites in place before
each replay; ``qo_indptr`` and ``kv_indptr`` depend only on the shape. Nothing is planned or
read back between replays, and the plan does not depend on lengths. Padded requests of a
captured batch have length 0 (vLLM writes 0) and produce no work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.model_executor.layers.attention.mla_attention import (
    MLACommonBackend,
    MLACommonDecodeMetadata,
    MLACommonImpl,
    MLACommonMetadata,
    MLACommonMetadataBuilder,
    QueryLenSupport,
)
from vllm.v1.attention.backend import AttentionCGSupport, AttentionType, MultipleOf

from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper
from fp8mla.formats import HEAD_DIM_CKV, HEAD_DIM_KPE, MAX_PAGE_SIZE
from fp8mla.integrations.common import (
    FP8_QUERIES_ENV,
    IntegrationConfigError,
    check_mla_config,
    fp8_queries_enabled,
    kernel_backend,
)

NAME = "FP8MLA"
HEAD_SIZE = HEAD_DIM_CKV + HEAD_DIM_KPE
WORKSPACE_BYTES = 128 << 20
FP8_QUERY = torch.float8_e4m3fn  # the queries vLLM quantizes for backends that take them
_KV_DTYPES = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


@dataclass
class FP8MLADecodeMetadata(MLACommonDecodeMetadata):
    """vLLM's decode metadata plus what the wrapper's ``plan()`` needs from the host."""

    query_start_loc_cpu: torch.Tensor | None = None
    max_seq_len: int = 0
    causal: bool = True
    # (wrapper, plan key): set by the step's first layer (eager), or by the builder for a
    # captured CUDA graph
    planned: Any = None


def decode_plan_args(
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc_cpu: torch.Tensor,
    max_seq_len: int,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(qo_indptr host, kv_indptr host, kv_indices device, kv_len device)`` for ``plan()``.

    Every request is given ``ceil(max_seq_len / block_size)`` pages (a host-known bound),
    taken from its block-table row; its exact length ``seq_lens[b]`` (device) bounds the read.
    """
    n = seq_lens.numel()
    pages = max(1, -(-int(max_seq_len) // block_size))
    pages = min(pages, block_table.shape[1])
    kv_indptr = torch.arange(0, (n + 1) * pages, pages, dtype=torch.int32)
    kv_indices = block_table[:n, :pages].to(torch.int32).reshape(-1)
    qo_indptr = (query_start_loc_cpu[: n + 1] - query_start_loc_cpu[0]).to(torch.int32)
    return qo_indptr, kv_indptr, kv_indices, seq_lens.to(torch.int32)


class FP8MLAMetadataBuilder(MLACommonMetadataBuilder[MLACommonMetadata]):
    # Multi-token decode rows (speculative verification) are one causal block per request.
    query_len_support: ClassVar[QueryLenSupport] = QueryLenSupport.UNIFORM
    # Full CUDA graphs of uniform decode batches: build_for_cudagraph_capture plans a graph
    # wrapper per captured shape over vLLM's persistent block table and lengths.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._layer_names = list(layer_names)
        # graph wrappers by captured shape; one workspace for all (one replays at a time)
        self._graph_plans: dict[tuple, tuple[BatchMLAPagedAttentionWrapper, tuple]] = {}
        self._graph_workspace: torch.Tensor | None = None

    def _build_decode(
        self,
        block_table_tensor,
        seq_lens_device,
        max_seq_len,
        query_start_loc_cpu,
        query_start_loc_device,
        num_decode_tokens,
        max_query_len,
        dcp_tot_seq_lens_device,
    ) -> FP8MLADecodeMetadata:
        return FP8MLADecodeMetadata(
            block_table=block_table_tensor,
            seq_lens=seq_lens_device,
            dcp_tot_seq_lens=dcp_tot_seq_lens_device,
            query_start_loc_cpu=query_start_loc_cpu,
            max_seq_len=int(max_seq_len),
        )

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        metadata = super().build(common_prefix_len, common_attn_metadata, fast_build)
        if isinstance(metadata.decode, FP8MLADecodeMetadata):
            metadata.decode.causal = bool(metadata.causal)
        return metadata

    def build_for_cudagraph_capture(self, common_attn_metadata):
        """The metadata vLLM captures a full CUDA graph with (decode only, as for every MLA
        backend), carrying the graph wrapper planned for its shape."""
        metadata = super().build_for_cudagraph_capture(common_attn_metadata)
        if isinstance(metadata.decode, FP8MLADecodeMetadata):
            metadata.decode.planned = self._graph_plan(metadata.decode)
        return metadata

    def _layer_plan_key(self) -> tuple:
        """The plan key (see ``FP8MLAImpl.plan_key``) every fp8mla layer of this group will
        compare at its first captured call."""
        ctx = self.compilation_config.static_forward_context
        impls = [getattr(ctx.get(name), "impl", None) for name in self._layer_names]
        dtype = self.model_config.dtype
        keys = {
            impl.plan_key(impl.query_dtype(dtype), impl.kv_dtype(self.kv_cache_spec.dtype),
                          self.page_size)
            for impl in impls
            if isinstance(impl, FP8MLAImpl)
        }  # fmt: skip
        if len(keys) != 1:
            raise IntegrationConfigError(
                f"fp8mla (vllm): expected the layers of one KV-cache group to share heads, "
                f"softmax scale and KV dtype for a CUDA graph, got {len(keys)} settings"
            )
        return keys.pop()

    def _graph_plan(self, decode: FP8MLADecodeMetadata) -> tuple:
        """(graph wrapper, plan key) for the captured shape of ``decode``, planned once."""
        block_table, seq_lens = decode.block_table, decode.seq_lens
        n = seq_lens.numel()
        if (
            block_table.dtype != torch.int32
            or seq_lens.dtype != torch.int32
            or not block_table.is_contiguous()
            or not seq_lens.is_contiguous()
        ):
            raise IntegrationConfigError(
                f"fp8mla (vllm): expected contiguous int32 block table and seq_lens for a "
                f"CUDA graph (read in place at every replay), got {block_table.dtype} "
                f"{tuple(block_table.stride())} and {seq_lens.dtype}"
            )
        qsl = decode.query_start_loc_cpu[: n + 1].to(torch.int32)
        qsl = qsl - qsl[0]
        qlen = int(qsl[1]) if n else 1
        qo_indptr = torch.arange(0, (n + 1) * qlen, qlen, dtype=torch.int32)
        if not torch.equal(qsl, qo_indptr):
            raise IntegrationConfigError(
                f"fp8mla (vllm): expected a uniform decode batch for a CUDA graph, got query "
                f"start locations {qsl.tolist()}"
            )
        width = block_table.shape[1]
        plan_key = self._layer_plan_key()
        shape = (n, qlen, decode.causal, block_table.data_ptr(), width, seq_lens.data_ptr())
        backend = kernel_backend()
        hit = self._graph_plans.get((shape, plan_key, backend))
        if hit is not None:
            return hit
        heads, sm_scale, q_dtype, kv_dtype, page_size = plan_key
        o_dtype = self.model_config.dtype if q_dtype == FP8_QUERY else None
        if self._graph_workspace is None:
            self._graph_workspace = torch.empty(
                WORKSPACE_BYTES, dtype=torch.uint8, device=self.device
            )
        i32 = dict(dtype=torch.int32, device=self.device)
        kv_indices = block_table.view(-1)
        wrapper = BatchMLAPagedAttentionWrapper(
            self._graph_workspace,
            use_cuda_graph=True,
            qo_indptr=torch.empty(n + 1, **i32),
            kv_indptr=torch.empty(n + 1, **i32),
            kv_indices=kv_indices,
            kv_len_arr=seq_lens,
            backend=backend,
        )
        wrapper.plan(
            qo_indptr,
            torch.arange(0, (n + 1) * width, width, dtype=torch.int32),
            kv_indices,
            seq_lens,
            heads,
            HEAD_DIM_CKV,
            HEAD_DIM_KPE,
            page_size,
            decode.causal,
            sm_scale,
            q_dtype,
            kv_dtype,
            o_data_type=o_dtype,
        )
        planned = (wrapper, plan_key)
        self._graph_plans[(shape, plan_key, backend)] = planned
        return planned


def _model_dtype() -> torch.dtype:
    """The model's dtype from vLLM's current config (bf16 where none is set): what an FP8-query
    layer's output is written in."""
    from vllm.config import get_current_vllm_config

    dtype = getattr(get_current_vllm_config().model_config, "dtype", None)
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


class FP8MLABackend(MLACommonBackend):
    """vLLM attention backend ``FP8MLA``; capabilities are declared for vLLM's selector."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = [
        "auto",
        "float16",
        "bfloat16",
        "fp8",
        "fp8_e4m3",
        "fp8_e5m2",
    ]

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls() -> type[FP8MLAImpl]:
        return FP8MLAImpl

    @staticmethod
    def get_builder_cls() -> type[FP8MLAMetadataBuilder]:
        return FP8MLAMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [HEAD_SIZE]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int | MultipleOf]:
        return [MultipleOf(16)]

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        return block_size is None or (block_size % 16 == 0 and block_size <= MAX_PAGE_SIZE)

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        # Ampere and newer (FP8 is decoded in registers; the Gluon kernel needs SM90).
        return capability.major >= 8

    @classmethod
    def supports_combination(
        cls,
        head_size,
        dtype,
        kv_cache_dtype,
        block_size,
        use_mla,
        has_sink,
        use_sparse,
        use_mm_prefix,
        device_capability,
    ) -> str | None:
        if use_mla and head_size != HEAD_SIZE:
            return (
                f"fp8mla serves MLA with kv_lora_rank {HEAD_DIM_CKV} + rope {HEAD_DIM_KPE} "
                f"(head size {HEAD_SIZE}), got head size {head_size}"
            )
        if block_size is not None and not cls.supports_block_size(block_size):
            return f"fp8mla needs --block-size a multiple of 16 up to {MAX_PAGE_SIZE}"
        return None


class FP8MLAImpl(MLACommonImpl[MLACommonMetadata]):
    """``forward_mqa`` over vLLM's paged MLA cache, FP8 read in place with ``k_scale``."""

    can_return_lse_for_decode: bool = False

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes,
        sliding_window,
        kv_cache_dtype: str,
        logits_soft_cap,
        attn_type: str,
        kv_sharing_target_layer_name,
        **mla_args,
    ) -> None:
        super().__init__(
            num_heads,
            head_size,
            scale,
            num_kv_heads,
            alibi_slopes,
            sliding_window,
            kv_cache_dtype,
            logits_soft_cap,
            attn_type,
            kv_sharing_target_layer_name,
            **mla_args,
        )
        unsupported = {
            "alibi_slopes": alibi_slopes,
            "sliding_window": sliding_window,
            "logits_soft_cap": logits_soft_cap,
        }
        for name, value in unsupported.items():
            if value:
                raise IntegrationConfigError(f"fp8mla (vllm): {name} is not supported")
        if attn_type != AttentionType.DECODER:
            raise IntegrationConfigError(
                f"fp8mla (vllm): attention type {attn_type} is not supported (decoder only)"
            )
        if self.dcp_world_size > 1:
            raise IntegrationConfigError(
                "fp8mla (vllm): --decode-context-parallel-size > 1 is not supported"
            )
        reason = check_mla_config(
            engine="vllm",
            kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim,
            num_heads=num_heads,
            options={"dims": "--model"},
        )
        if reason:
            raise IntegrationConfigError(reason)
        if kv_cache_dtype not in FP8MLABackend.supported_kv_cache_dtypes:
            raise IntegrationConfigError(
                f"fp8mla (vllm): --kv-cache-dtype {kv_cache_dtype} is not supported; use "
                f"fp8, fp8_e4m3, fp8_e5m2 or auto"
            )
        self._fp8_dtype = _KV_DTYPES.get(kv_cache_dtype)
        # The model's 16-bit queries by default (read exactly); with FP8MLA_FP8_QUERIES=1 and
        # an e4m3 cache, vLLM quantizes them with the layer's per-tensor _q_scale first and
        # hands over e4m3 (as to its FLASHMLA backend)
        fp8_q = fp8_queries_enabled()
        if fp8_q and self._fp8_dtype != FP8_QUERY:
            raise IntegrationConfigError(
                f"fp8mla (vllm): {FP8_QUERIES_ENV}=1 takes e4m3 queries against an e4m3 cache; "
                f"use --kv-cache-dtype fp8 (or fp8_e4m3), got {kv_cache_dtype}"
            )
        self.supports_quant_query_input = fp8_q
        self._o_dtype = _model_dtype()
        self._backend = kernel_backend()
        self._wrappers: dict[torch.device, BatchMLAPagedAttentionWrapper] = {}

    def _wrapper(self, device: torch.device) -> BatchMLAPagedAttentionWrapper:
        w = self._wrappers.get(device)
        if w is None:
            ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            w = BatchMLAPagedAttentionWrapper(ws, backend=self._backend)
            self._wrappers[device] = w
        return w

    def kv_dtype(self, cache_dtype: torch.dtype) -> torch.dtype:
        """The dtype this layer reads a cache allocated as ``cache_dtype`` in."""
        return self._fp8_dtype if self._fp8_dtype is not None else cache_dtype

    def query_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype of the queries vLLM hands this layer (``supports_quant_query_input``)."""
        return FP8_QUERY if self.supports_quant_query_input else model_dtype

    def plan_key(self, q_dtype: torch.dtype, kv_dtype: torch.dtype, page_size: int) -> tuple:
        """What a plan fixes for this layer: heads, softmax scale, dtypes, page size."""
        return (self.num_heads, float(self.scale), q_dtype, kv_dtype, int(page_size))

    def _plan(self, decode: FP8MLADecodeMetadata, q_dtype, kv_cache: torch.Tensor):
        key = self.plan_key(q_dtype, kv_cache.dtype, kv_cache.shape[1])
        if decode.planned is not None and decode.planned[1] == key:
            return decode.planned[0]
        if kv_cache.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            got = "no plan" if decode.planned is None else f"a plan for {decode.planned[1]}"
            raise IntegrationConfigError(
                f"fp8mla (vllm): a CUDA graph captures metadata from "
                f"FP8MLAMetadataBuilder.build_for_cudagraph_capture planned for {key}, got {got}"
            )
        wrapper = self._wrapper(kv_cache.device)
        qo_indptr, kv_indptr, kv_indices, kv_len = decode_plan_args(
            decode.block_table,
            decode.seq_lens,
            decode.query_start_loc_cpu,
            decode.max_seq_len,
            kv_cache.shape[1],
        )
        wrapper.plan(
            qo_indptr,
            kv_indptr,
            kv_indices,
            kv_len,
            self.num_heads,
            HEAD_DIM_CKV,
            HEAD_DIM_KPE,
            kv_cache.shape[1],
            decode.causal,
            float(self.scale),
            q_dtype,
            kv_cache.dtype,
            o_data_type=self._o_dtype if q_dtype == FP8_QUERY else None,
        )
        decode.planned = (wrapper, key)
        return wrapper

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: MLACommonMetadata,
        layer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        decode = attn_metadata.decode
        if not isinstance(decode, FP8MLADecodeMetadata):
            raise ValueError(
                f"expected FP8MLADecodeMetadata from FP8MLAMetadataBuilder, got "
                f"{type(decode).__name__}"
            )
        if isinstance(q, tuple):
            q_nope, q_pe = q
        else:
            q_nope, q_pe = q[..., :HEAD_DIM_CKV], q[..., HEAD_DIM_CKV:]
        cache = kv_c_and_k_pe_cache
        scale = None
        if self._fp8_dtype is not None:
            cache = cache.view(torch.uint8).view(self._fp8_dtype)
            scale = layer._k_scale
        wrapper = self._plan(decode, q_nope.dtype, cache)
        # e4m3 queries: their values are q × the layer's per-tensor _q_scale (a device value)
        q_scale = layer._q_scale if q_nope.dtype == FP8_QUERY else None
        out = wrapper.run(
            q_nope,
            q_pe,
            cache[..., :HEAD_DIM_CKV],
            cache[..., HEAD_DIM_CKV:],
            ckv_scale=scale,
            kpe_scale=scale,
            q_scale=q_scale,
        )
        return out, None
