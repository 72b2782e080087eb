"""``FP8MLASparseBackend``: DeepSeek Sparse Attention (DSA) in vLLM on fp8mla's sparse kernel.

``--attention-backend FP8MLA_SPARSE --kv-cache-dtype fp8_ds_mla --block-size 64`` serves the
sparse MLA layers of DeepSeek-V3.2 and GLM-5 (models whose config has ``index_topk``) on
every GPU from compute capability 8.0. vLLM stores their cache as ``[blocks, 64, 656]``
uint8 (the packed ``fp8_ds_mla`` rows, written by ``concat_and_cache_mla``); ``auto`` keeps
a 16-bit ``[blocks, 64, 576]`` cache. ``forward_mqa`` reads either in place:

1. the layer's indexer has left each token's top-k as request-relative positions in the
   model's shared ``topk_indices_buffer`` (``-1`` for none);
2. :func:`fp8mla.dsa.to_slots` turns them into global slots through the block table and
   vLLM's per-token request ids (``req_id_per_token``), as vLLM's
   ``triton_convert_req_index_to_global_index`` does;
3. :class:`fp8mla.SparseMLAWrapper` attends every query token, prefill and decode alike,
   to its slots.

Every token takes this path: the impl declares no dense-MHA prefill, so vLLM routes prefill
tokens to ``forward_mqa`` too (FlashMLA's "mixed batch" mode), and no MLA prefill backend is
needed.

CUDA graphs (``AttentionCGSupport.UNIFORM_BATCH``): the sparse plan depends on the token
count, heads, top-k, page size, dtypes and scale only. ``build_for_cudagraph_capture`` plans
a CUDA-graph wrapper for each captured token count, outside the graph; the captured kernels
read the top-k buffer, the block table and the request ids, which vLLM and the indexer
rewrite in place before every replay. Eager steps plan once per step, at the first layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from vllm.model_executor.layers.attention.sparse_mla_attention import (
    SparseMLACommonImpl,
    SparseMLACommonMetadata,
    SparseMLACommonMetadataBuilder,
)
from vllm.v1.attention.backend import AttentionBackend, AttentionCGSupport, AttentionType

from fp8mla.dsa.indexer import to_slots
from fp8mla.dsa.layout import NOPE_DIM, ROPE_DIM
from fp8mla.dsa.sparse import SparseMLAWrapper
from fp8mla.dsa.sparse_plan import MAX_TOPK
from fp8mla.integrations.common import IntegrationConfigError, check_mla_config, kernel_backend
from fp8mla.integrations.vllm.indexer import check_indexer_route

NAME = "FP8MLA_SPARSE"
HEAD_SIZE = NOPE_DIM + ROPE_DIM
PAGE_SIZE = 64  # vLLM's fp8_ds_mla blocks and the indexer's key-cache pages
WORKSPACE_BYTES = 128 << 20
PACKED = "fp8_ds_mla"
KV_CACHE_DTYPES = (PACKED, "auto", "bfloat16", "float16")
_PREFIX = "fp8mla (vllm): "


def model_reason(vllm_config: Any) -> str | None:
    """Why the configured model is no DSA model fp8mla's sparse backend serves, or ``None``."""
    model = getattr(vllm_config, "model_config", None)
    if model is None:
        return None
    topk = getattr(model.hf_text_config, "index_topk", None)
    if topk is None:
        return (
            f"{_PREFIX}--attention-backend {NAME} serves DeepSeek Sparse Attention models: "
            f"expected index_topk in the model's config, got none"
        )
    if not isinstance(topk, int) or not 1 <= topk <= MAX_TOPK:
        return f"{_PREFIX}--model: expected index_topk in [1, {MAX_TOPK}], got {topk!r}"
    return None


class FP8MLASparseBackend(AttentionBackend):
    """vLLM attention backend ``FP8MLA_SPARSE``; capabilities are declared for vLLM's
    selector, which refuses an unsupported configuration at start-up with the reason."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16, torch.float16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = list(KV_CACHE_DTYPES)

    @staticmethod
    def get_name() -> str:
        return NAME

    @staticmethod
    def get_impl_cls() -> type[FP8MLASparseImpl]:
        return FP8MLASparseImpl

    @staticmethod
    def get_builder_cls() -> type[FP8MLASparseMetadataBuilder]:
        return FP8MLASparseMetadataBuilder

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [HEAD_SIZE]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None) -> list[int]:
        return [PAGE_SIZE]

    @classmethod
    def supports_block_size(cls, block_size: int | None) -> bool:
        return block_size is None or block_size == PAGE_SIZE

    @classmethod
    def is_mla(cls) -> bool:
        return True

    @classmethod
    def is_sparse(cls) -> bool:
        return True

    @classmethod
    def supports_compute_capability(cls, capability) -> bool:
        # Ampere and newer: the sparse kernel decodes e4m3 in registers (portable Triton).
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
        if kv_cache_dtype is not None and kv_cache_dtype not in KV_CACHE_DTYPES:
            return (
                f"{_PREFIX}{NAME} reads DeepSeek's packed FP8 cache: expected --kv-cache-dtype "
                f"{PACKED} (or auto for a 16-bit cache), got {kv_cache_dtype}"
            )
        if block_size is not None and block_size != PAGE_SIZE:
            return f"{_PREFIX}expected --block-size {PAGE_SIZE}, got {block_size}"
        if use_mla and head_size != HEAD_SIZE:
            return (
                f"{_PREFIX}expected MLA with kv_lora_rank {NOPE_DIM} + rope {ROPE_DIM} "
                f"(head size {HEAD_SIZE}), got head size {head_size}"
            )
        from vllm.config import get_current_vllm_config_or_none

        return model_reason(get_current_vllm_config_or_none())


@dataclass(kw_only=True)
class FP8MLASparseMetadata(SparseMLACommonMetadata):
    """vLLM's sparse MLA metadata plus the step's plan: ``(wrapper, plan key)``, set by the
    step's first layer (eager) or by the builder for a captured CUDA graph."""

    planned: Any = None


class FP8MLASparseMetadataBuilder(SparseMLACommonMetadataBuilder[FP8MLASparseMetadata]):
    metadata_cls = FP8MLASparseMetadata
    # Full CUDA graphs of uniform decode batches (decode and speculative verification rows):
    # build_for_cudagraph_capture plans a graph wrapper per captured token count.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # Every token runs the same kernel, so the split only marks uniform decode batches
        # (1 + speculative tokens per request) for vLLM's graph dispatch.
        self._init_reorder_batch_threshold(1, supports_spec_as_decode=True)
        self._layer_names = list(layer_names)
        self._graph_plans: dict[tuple, tuple[SparseMLAWrapper, tuple]] = {}
        self._graph_workspace: torch.Tensor | None = None

    def build_for_cudagraph_capture(self, common_attn_metadata):
        """The metadata vLLM captures a full CUDA graph with, carrying the graph wrapper
        planned for its token count."""
        metadata = super().build_for_cudagraph_capture(common_attn_metadata)
        metadata.planned = self._graph_plan(max(1, int(metadata.num_actual_tokens)))
        return metadata

    def _layer_plan_key(self) -> tuple:
        """The plan key (``FP8MLASparseImpl.plan_key``) every layer of this group compares at
        its first captured call."""
        ctx = self.vllm_config.compilation_config.static_forward_context
        keys = set()
        for name in self._layer_names:
            impl = getattr(ctx.get(name), "impl", None)
            if isinstance(impl, FP8MLASparseImpl):
                keys.add(impl.plan_key(self.model_config.dtype, self.kv_cache_spec.dtype))
        if len(keys) != 1:
            raise IntegrationConfigError(
                f"{_PREFIX}expected the sparse layers of one KV-cache group to share heads, "
                f"softmax scale, top-k and cache dtype for a CUDA graph, got {len(keys)} settings"
            )
        return keys.pop()

    def _graph_plan(self, num_tokens: int) -> tuple[SparseMLAWrapper, tuple]:
        key = self._layer_plan_key()
        backend = kernel_backend()
        hit = self._graph_plans.get((num_tokens, key, backend))
        if hit is not None:
            return hit
        if self._graph_workspace is None:
            self._graph_workspace = torch.empty(
                WORKSPACE_BYTES, dtype=torch.uint8, device=self.device
            )
        wrapper = SparseMLAWrapper(self._graph_workspace, use_cuda_graph=True, backend=backend)
        plan_sparse(wrapper, num_tokens, key)
        planned = (wrapper, key)
        self._graph_plans[(num_tokens, key, backend)] = planned
        return planned


def plan_sparse(wrapper: SparseMLAWrapper, num_tokens: int, key: tuple) -> None:
    """``wrapper.plan`` for ``num_tokens`` tokens of the layer settings ``key``."""
    heads, sm_scale, q_dtype, kv_dtype, topk = key
    wrapper.plan(num_tokens, heads, topk, PAGE_SIZE, q_dtype, sm_scale, kv_data_type=kv_dtype)


class FP8MLASparseImpl(SparseMLACommonImpl[FP8MLASparseMetadata]):
    """``forward_mqa`` for every token of a DSA layer on fp8mla's sparse kernel."""

    # No dense-MHA prefill: vLLM sends prefill tokens to forward_mqa as well.
    supports_dense_mha_prefill = False
    can_return_lse_for_decode = False

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
        unsupported = {
            "alibi_slopes": alibi_slopes,
            "sliding_window": sliding_window,
            "logits_soft_cap": logits_soft_cap,
        }
        for name, value in unsupported.items():
            if value:
                raise IntegrationConfigError(f"{_PREFIX}expected no {name}, got {value!r}")
        if attn_type != AttentionType.DECODER:
            raise IntegrationConfigError(
                f"{_PREFIX}expected decoder attention, got attention type {attn_type}"
            )
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise IntegrationConfigError(
                f"{_PREFIX}{NAME} reads DeepSeek's packed FP8 cache: expected --kv-cache-dtype "
                f"{PACKED} (or auto for a 16-bit cache), got {kv_cache_dtype}"
            )
        from vllm.config import get_current_vllm_config

        if get_current_vllm_config().attention_config.hisparse_config is not None:
            raise IntegrationConfigError(
                f"{_PREFIX}{NAME} reads the device KV cache: expected no HiSparse host-backed "
                f"cache (--attention-config.hisparse_config, HiSparseConnector), got one"
            )
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
        if self.dcp_world_size > 1:
            raise IntegrationConfigError(
                f"{_PREFIX}expected --decode-context-parallel-size 1, got {self.dcp_world_size}"
            )
        if self.topk_indices_buffer is None:
            raise IntegrationConfigError(
                f"{_PREFIX}{NAME} serves DeepSeek Sparse Attention models: expected the "
                f"model's top-k indices buffer (index_topk in its config), got none"
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
        reason = check_indexer_route(mla_args.get("indexer"))
        if reason:
            raise IntegrationConfigError(reason)
        # bf16/fp16 queries against the cache (no FP8 query path)
        self.supports_quant_query_input = False
        self._backend = kernel_backend()

    def plan_key(self, q_dtype: torch.dtype, kv_dtype: torch.dtype) -> tuple:
        """What a plan fixes for this layer: heads, softmax scale, dtypes and top-k."""
        topk = int(self.topk_indices_buffer.shape[1])
        return (self.num_heads, float(self.scale), q_dtype, kv_dtype, topk)

    def _wrapper(self, metadata: FP8MLASparseMetadata, tokens: int, key: tuple, device):
        if metadata.planned is not None and metadata.planned[1] == key:
            return metadata.planned[0]
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            got = "no plan" if metadata.planned is None else f"a plan for {metadata.planned[1]}"
            raise IntegrationConfigError(
                f"{_PREFIX}expected a CUDA graph to capture metadata from "
                f"FP8MLASparseMetadataBuilder.build_for_cudagraph_capture planned for {key}, "
                f"got {got}"
            )
        from fp8mla.attention.functional import shared_workspace

        wrapper = SparseMLAWrapper(shared_workspace(device, WORKSPACE_BYTES), backend=self._backend)
        plan_sparse(wrapper, max(1, tokens), key)
        metadata.planned = (wrapper, key)
        return wrapper

    def forward_mqa(
        self,
        q: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        kv_c_and_k_pe_cache: torch.Tensor,
        attn_metadata: FP8MLASparseMetadata,
        layer,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not isinstance(attn_metadata, FP8MLASparseMetadata):
            raise ValueError(
                f"expected FP8MLASparseMetadata from FP8MLASparseMetadataBuilder, got "
                f"{type(attn_metadata).__name__}"
            )
        if isinstance(q, tuple):
            q_nope, q_pe = q
        else:
            q_nope, q_pe = q[..., :NOPE_DIM], q[..., NOPE_DIM:]
        tokens = q_nope.shape[0]
        cache = kv_c_and_k_pe_cache
        if cache.shape[1] != attn_metadata.block_size:
            raise ValueError(
                f"expected a cache of {attn_metadata.block_size}-token blocks, got shape "
                f"{list(cache.shape)}"
            )
        # request-relative positions the indexer chose (vLLM 0.34 may offset the rows)
        start = getattr(attn_metadata, "topk_start", 0)
        positions = self.topk_indices_buffer[start : start + tokens]
        slots = to_slots(
            positions,
            attn_metadata.block_table,
            attn_metadata.block_size,
            req_ids=attn_metadata.req_id_per_token[:tokens],
            num_pages=cache.shape[0],
            backend=self._backend,
        )
        key = self.plan_key(q_nope.dtype, cache.dtype)
        wrapper = self._wrapper(attn_metadata, tokens, key, cache.device)
        return wrapper.run(q_nope, q_pe, cache, slots), None
