"""``FP8MLADSABackend``: SGLang's DeepSeek Sparse Attention (DSA) layers on fp8mla, reading the
pool in place.

What it replaces: SGLang's ``dsa`` backend, whose sparse attention runs FlashMLA, FlashInfer,
FA3 or TileLang kernels (for an FP8 cache: SM90 and SM100, and on SM120 GLM models only) and
whose indexer needs DeepGEMM (SM90/SM100). This backend runs every DSA layer of a DeepSeek-V3.2
or GLM-5 model through fp8mla's portable kernels:

- the indexer's logits and top-k through ``fp8mla.dsa`` (:mod:`.dsa_indexer`, hooked into
  SGLang's ``Indexer``), over the pool's 132-byte key cache in place;
- sparse attention through :class:`fp8mla.SparseMLAWrapper` over the pool's rows in place:
  the packed 656-byte ``fp8_ds_mla`` rows of an FP8 pool (``[slots, 1, 656]``, written by
  SGLang's own quantizer in the layout of ``fp8mla.pack_ds_mla``) or the 576 values of a
  bf16/fp16 pool. No cast, no copy of the pool.

The indexer hands each layer request-relative positions (-1 padded); the backend maps them to
KV slots through ``req_to_token`` (``fp8mla.dsa.to_slots``), as SGLang's
``transform_index_page_table_*`` do, then attends. Prefill and decode both take this sparse
path (absorbed MLA), whatever the context length: positions past a request's length are
never chosen, so short requests attend to all their tokens.

CUDA graphs (decode): ``init_cuda_graph_state`` allocates static buffers
(:class:`.dsa_batch.GraphBuffers`); ``init_forward_metadata_out_graph`` rewrites them before
capture and every replay and keeps one graph-mode ``SparseMLAWrapper`` per captured batch size,
planned at capture from the first layer's shape.
"""

from __future__ import annotations

import torch
from sglang.srt.configs.model_config import get_dsa_index_kpool
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.runtime_context import get_parallel

from fp8mla.dsa.indexer import to_slots
from fp8mla.dsa.layout import NOPE_DIM, ROPE_DIM, TOKEN_BYTES
from fp8mla.dsa.sparse import SparseMLAWrapper
from fp8mla.formats import dtype_name
from fp8mla.integrations.common import IntegrationConfigError, check_mla_config, kernel_backend
from fp8mla.integrations.sglang.dsa_batch import PAGE_SIZE, DSABatch, GraphBuffers, describe_batch
from fp8mla.integrations.sglang.dsa_indexer import FP8MLAIndexerMetadata

WORKSPACE_BYTES = 128 << 20  # split-KV partials; shared by every wrapper of a backend
KV_DTYPES_16BIT = (torch.bfloat16, torch.float16)


class DSAForward:
    """One batch's metadata: its description, the indexer's view of it and the attention
    wrapper, planned at the first layer (the softmax scale is the layer's)."""

    def __init__(self, batch: DSABatch, indexer: FP8MLAIndexerMetadata,
                 wrapper: SparseMLAWrapper) -> None:  # fmt: skip
        self.batch = batch
        self.indexer = indexer
        self.wrapper = wrapper
        self.planned: tuple | None = None  # (tokens, heads, topk, q dtype, kv dtype, scale)


def _refuse(msg: str) -> None:
    raise IntegrationConfigError(f"fp8mla (sglang): {msg}")


class FP8MLADSABackend(AttentionBackend):
    """SGLang attention backend ``fp8mla`` for DeepSeek Sparse Attention models."""

    # Metadata is built from host lengths (``seq_lens_cpu``): no device->host copy.
    needs_cpu_seq_lens = True
    # SGLang's DSA dispatch reads this: fp8mla never runs the dense MHA prefill
    use_mha = False

    def __init__(self, model_runner) -> None:
        super().__init__()
        cfg = model_runner.model_config
        hf = cfg.hf_config
        parallel = get_parallel()
        if torch.version.hip is not None:
            _refuse("DeepSeek Sparse Attention on ROCm is not supported (SGLang's ROCm indexer "
                    "cache has another layout); use --attention-backend dsa")  # fmt: skip
        if getattr(parallel, "dcp_enabled", False):
            _refuse("decode context parallelism (--dcp-size > 1) is not supported")
        if get_dsa_index_kpool(hf) != 1:
            _refuse(f"--model-path: index_kpool={get_dsa_index_kpool(hf)} (pooled indexer keys) "
                    "is not supported; fp8mla serves index_kpool=1")  # fmt: skip
        if getattr(hf, "learnable_sink", False):
            _refuse("--model-path: learnable attention sinks are not supported")
        self.page_size = int(model_runner.page_size or 1)
        if self.page_size != PAGE_SIZE:
            _refuse(f"--page-size {self.page_size} is not supported for DeepSeek Sparse "
                    f"Attention; use {PAGE_SIZE}")  # fmt: skip
        self.num_heads = cfg.num_attention_heads // parallel.attn_tp_size
        self.q_dtype = model_runner.dtype
        reason = check_mla_config(
            engine="sglang",
            q_dtype=self.q_dtype,
            kv_lora_rank=cfg.kv_lora_rank,
            qk_rope_head_dim=cfg.qk_rope_head_dim,
            num_heads=self.num_heads,
            options={"heads": "--tp-size", "dims": "--model-path"},
        )
        if reason:
            raise IntegrationConfigError(reason)
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.kv_dtype = self._check_pool(model_runner.kv_cache_dtype)
        # SGLang reads these two off the backend (model code, graph runners)
        self.data_type = self.q_dtype
        self.kv_cache_dtype = model_runner.kv_cache_dtype
        self.device = torch.device(model_runner.device)
        self.req_to_token_pool = model_runner.req_to_token_pool  # read by SGLang's model code
        self.req_to_token = self.req_to_token_pool.req_to_token
        self._backend = kernel_backend()
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.forward_metadata: DSAForward | None = None
        self._graph_buffers: GraphBuffers | None = None
        self._graph_wrappers: dict[int, SparseMLAWrapper] = {}

    def _check_pool(self, kv_cache_dtype: torch.dtype) -> torch.dtype:
        """The dtype of the pool's rows as fp8mla reads them; refuses other layouts."""
        pool = self.token_to_kv_pool
        if kv_cache_dtype == torch.float8_e4m3fn:
            packed = getattr(pool, "dsa_kv_cache_store_fp8", False)
            if not packed or pool.kv_cache_dim != TOKEN_BYTES:
                _refuse(f"expected the {TOKEN_BYTES}-byte fp8_ds_mla pool rows for "
                        f"--kv-cache-dtype fp8_e4m3, got {pool.kv_cache_dim}-byte rows "
                        "(calculate_mla_kv_cache_dim)")  # fmt: skip
        elif kv_cache_dtype not in KV_DTYPES_16BIT:
            _refuse(f"--kv-cache-dtype {dtype_name(kv_cache_dtype)} is not supported for "
                    "DeepSeek Sparse Attention; use fp8_e4m3 or bfloat16")  # fmt: skip
        elif pool.kv_cache_dim != NOPE_DIM + ROPE_DIM:
            _refuse(f"expected {NOPE_DIM + ROPE_DIM}-value pool rows, got {pool.kv_cache_dim}")
        return pool.get_key_buffer(pool.start_layer).dtype

    # ------------------------------------------------------------------ metadata
    def _forward_for(self, batch: DSABatch, wrapper: SparseMLAWrapper) -> DSAForward:
        indexer = FP8MLAIndexerMetadata(batch, self.token_to_kv_pool, self.req_to_token,
                                        self._backend)  # fmt: skip
        return DSAForward(batch, indexer, wrapper)

    def init_forward_metadata(self, forward_batch) -> None:
        batch = describe_batch(forward_batch, self.req_to_token)
        wrapper = SparseMLAWrapper(self.workspace, backend=self._backend)
        self.forward_metadata = self._forward_for(batch, wrapper)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Static buffers shared by the per-batch-size graph wrappers (one replays at a time)."""
        self._graph_buffers = GraphBuffers(max_bs, self.req_to_token)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        if self._graph_buffers is None:
            raise ValueError("expected init_cuda_graph_state() before a CUDA-graph batch, got "
                             "none")  # fmt: skip
        batch = self._graph_buffers.describe(forward_batch)
        bs = int(forward_batch.batch_size)
        wrapper = self._graph_wrappers.get(bs)
        if wrapper is None:
            if not in_capture:
                _refuse(f"no CUDA graph captured for batch size {bs}")
            wrapper = SparseMLAWrapper(self.workspace, use_cuda_graph=True, backend=self._backend)
            self._graph_wrappers[bs] = wrapper
        # a graph wrapper keeps its first plan: planning it again only checks the shape fits
        self.forward_metadata = self._forward_for(batch, wrapper)

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def get_indexer_metadata(self, layer_id: int, forward_batch) -> FP8MLAIndexerMetadata:
        if self.forward_metadata is None:
            raise ValueError("expected init_forward_metadata() before the indexer, got no batch")
        return self.forward_metadata.indexer

    # ------------------------------------------------------------------ forward
    def _planned(self, meta: DSAForward, tokens: int, heads: int, topk: int,
                 scale: float) -> SparseMLAWrapper:  # fmt: skip
        shape = (tokens, heads, topk, self.q_dtype, self.kv_dtype, float(scale))
        if meta.planned != shape:
            # page size 1: the pool is one page of [slots, 1, row] (SGLang's layout)
            meta.wrapper.plan(max(tokens, 1), heads, topk, 1, self.q_dtype, scale,
                              kv_data_type=self.kv_dtype)  # fmt: skip
            meta.planned = shape
        return meta.wrapper

    def _save_kv(self, k, k_rope, layer, forward_batch, save_kv_cache: bool) -> None:
        if k is None or not save_kv_cache:
            return
        if k_rope is None:
            raise ValueError("expected k_rope beside k (the absorbed MLA path), got None")
        # SGLang's own writer: quantizes to the 656-byte rows of an FP8 pool
        self.token_to_kv_pool.set_mla_kv_buffer(layer, forward_batch.out_cache_loc, k, k_rope)

    def _attend(self, q, q_rope, layer, topk_indices) -> torch.Tensor:
        meta = self.forward_metadata
        if meta is None:
            raise ValueError("expected init_forward_metadata() before forward, got no plan")
        if topk_indices is None:
            raise ValueError("expected topk_indices from the DSA indexer, got None")
        h = layer.tp_q_head_num
        if q_rope is not None:
            q_nope = q.view(-1, h, layer.v_head_dim)
            q_pe = q_rope.view(-1, h, layer.head_dim - layer.v_head_dim)
        else:
            q_all = q.view(-1, h, layer.head_dim)
            q_nope, q_pe = q_all[..., : layer.v_head_dim], q_all[..., layer.v_head_dim :]
        rows, b = q_nope.shape[0], meta.batch
        if topk_indices.dim() != 2 or topk_indices.shape[0] < b.num_tokens:
            raise ValueError(f"expected topk_indices [>= {b.num_tokens}, topk], got "
                             f"{list(topk_indices.shape)}")  # fmt: skip
        if rows < b.num_tokens:
            raise ValueError(f"expected a query row for each of the batch's {b.num_tokens} "
                             f"tokens, got {rows}")  # fmt: skip
        kv = self.token_to_kv_pool.get_key_buffer(layer.layer_id)  # [slots, 1, row]: no copy
        topk = topk_indices.shape[1]
        positions = topk_indices[: b.num_tokens].to(torch.int32)
        if rows == b.num_tokens:
            slots = to_slots(positions, self.req_to_token, 1, req_ids=b.req_rows,
                             num_pages=kv.shape[0], backend=self._backend)  # fmt: skip
        else:  # rows SGLang pads the batch with attend to nothing
            slots = torch.full((rows, topk), -1, dtype=torch.int32, device=q_nope.device)
            to_slots(positions, self.req_to_token, 1, req_ids=b.req_rows, num_pages=kv.shape[0],
                     out=slots[: b.num_tokens], backend=self._backend)  # fmt: skip
        wrapper = self._planned(meta, rows, h, topk, layer.scaling)
        out = wrapper.run(q_nope, q_pe, kv, slots)
        return out.view(-1, h * layer.v_head_dim)

    def _forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None,
                 k_rope=None, topk_indices=None, attn_sink=None, **kw):  # fmt: skip
        if attn_sink is not None:
            _refuse("learnable attention sinks are not supported")
        # e.g. cos_sin_cache: RoPE left to a fused kernel (SGLang's trtllm path); never ignored
        given = sorted(
            name for name, value in kw.items() if value is not None and value is not False
        )
        if given:
            raise ValueError(f"expected no arguments beyond q/k/v, q_rope, k_rope and "
                             f"topk_indices, got {given}")  # fmt: skip
        if layer.logit_cap and layer.logit_cap > 0:
            _refuse("attention logit soft-capping is not supported")
        self._save_kv(k, k_rope, layer, forward_batch, save_kv_cache)
        return self._attend(q, q_rope, layer, topk_indices)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache, **kw)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kw):
        return self._forward(q, k, v, layer, forward_batch, save_kv_cache, **kw)
