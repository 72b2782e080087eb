"""``FP8MLAAttnBackend``: SGLang's MLA attention on fp8mla's kernels, reading the pool in place.

What it replaces: SGLang's ``flashinfer_mla`` backend runs FlashInfer's
``BatchMLAPagedAttentionWrapper`` on ``get_key_buffer(layer_id).to(q.dtype)``, a bf16 copy of
the whole FP8 pool made for every layer of every step. This backend hands the FP8 view of
``MLATokenToKVPool`` (``[slots, 1, 576]``, or ``[pages, page_size, 576]`` for a paged pool)
to fp8mla's wrapper as two strided views, latent ``[..., :512]`` and RoPE ``[..., 512:]``:
no cast, no copy.

Forward modes: decode, extend/prefill over a cached prefix (absorbed MLA: the model passes
``q_nope`` already multiplied by ``W_UK``, and ``q_rope``), mixed chunked-prefill batches and
speculative target verification (chain drafts, ``topk == 1``; EAGLE/MTP). CUDA graphs for
decode and target verify through ``init_cuda_graph_state`` /
``init_forward_metadata_out_graph``: one graph-mode wrapper per captured batch size, planned
outside the graph from host lengths.

Scale: SGLang writes an MLA pool with a plain ``.to(fp8)`` (``set_mla_kv_buffer``), i.e. scale
1, and so does this backend when the model hands it new K (it writes through the same pool
method). The pool is read with that scale.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.mem_cache.memory_pool import KVWriteLoc
from sglang.srt.runtime_context import get_parallel

from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper
from fp8mla.formats import HEAD_DIM_CKV, HEAD_DIM_KPE, is_fp8
from fp8mla.integrations.common import IntegrationConfigError, check_mla_config, kernel_backend
from fp8mla.integrations.sglang.batch import build_batch_plan

WORKSPACE_BYTES = 128 << 20  # split-KV partials; shared by every wrapper of a backend
HEAD_DIM = HEAD_DIM_CKV + HEAD_DIM_KPE


class FP8MLAAttnBackend(AttentionBackend):
    """SGLang attention backend ``fp8mla`` (MLA models, FP8 or bf16/fp16 pools)."""

    # Metadata is planned from host lengths (``seq_lens_cpu``): no device->host copy.
    needs_cpu_seq_lens = True

    def __init__(self, model_runner) -> None:
        super().__init__()
        cfg = model_runner.model_config
        parallel = get_parallel()
        if getattr(parallel, "dcp_enabled", False):
            raise IntegrationConfigError(
                "fp8mla (sglang): decode context parallelism (--dcp-size > 1) is not supported"
            )
        self.num_heads = cfg.num_attention_heads // parallel.attn_tp_size
        self.page_size = int(model_runner.page_size or 1)
        self.q_dtype = model_runner.dtype
        self.kv_dtype = model_runner.kv_cache_dtype
        reason = check_mla_config(
            engine="sglang",
            q_dtype=self.q_dtype,
            kv_dtype=self.kv_dtype,
            page_size=self.page_size,
            kv_lora_rank=cfg.kv_lora_rank,
            qk_rope_head_dim=cfg.qk_rope_head_dim,
            num_heads=self.num_heads,
            options={"heads": "--tp-size", "dims": "--model-path"},
        )
        if reason:
            raise IntegrationConfigError(reason)
        self.data_type = self.q_dtype
        self.kv_cache_dtype = self.kv_dtype
        self.sm_scale = float(cfg.scaling)
        self.device = torch.device(model_runner.device)
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.kv_index_translator = model_runner.kv_index_translator
        # SGLang's MLA pool holds K quantized with a plain cast: dequantization scale 1.
        self.kv_scale: float | None = None
        self._backend = kernel_backend()
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        self.wrapper = self._new_wrapper()
        self.forward_metadata: BatchMLAPagedAttentionWrapper | None = None
        self._graph_wrappers: dict[tuple, BatchMLAPagedAttentionWrapper] = {}
        self._graph_bufs: tuple[torch.Tensor, ...] | None = None

    def _new_wrapper(self, graph_bufs: tuple[torch.Tensor, ...] | None = None):
        if graph_bufs is None:
            return BatchMLAPagedAttentionWrapper(self.workspace, backend=self._backend)
        qo, kvp, idx, kvl = graph_bufs
        return BatchMLAPagedAttentionWrapper(
            self.workspace,
            use_cuda_graph=True,
            qo_indptr=qo,
            kv_indptr=kvp,
            kv_indices=idx,
            kv_len_arr=kvl,
            backend=self._backend,
        )

    # ------------------------------------------------------------------ metadata
    def _plan(self, wrapper: BatchMLAPagedAttentionWrapper, forward_batch) -> None:
        p = build_batch_plan(forward_batch, self.kv_index_translator, self.page_size)
        wrapper.plan(
            p.qo_indptr,
            p.kv_indptr,
            p.kv_indices,
            p.kv_len,
            self.num_heads,
            HEAD_DIM_CKV,
            HEAD_DIM_KPE,
            self.page_size,
            p.causal,
            self.sm_scale,
            self.q_dtype,
            self.kv_dtype,
        )

    def init_forward_metadata(self, forward_batch) -> None:
        self._plan(self.wrapper, forward_batch)
        self.forward_metadata = self.wrapper

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Index buffers shared by the per-batch-size graph wrappers (one replays at a time)."""
        max_tokens_per_req = self.req_to_token.shape[1]
        max_pages = -(-max_tokens_per_req // self.page_size)
        i32 = dict(dtype=torch.int32, device=self.device)
        self._graph_bufs = (
            torch.zeros(max_bs + 1, **i32),
            torch.zeros(max_bs + 1, **i32),
            torch.zeros(max_bs * max_pages, **i32),
            torch.zeros(max_bs, **i32),
        )

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        mode = forward_batch.forward_mode
        if not (mode.is_decode_or_idle() or mode.is_target_verify()):
            raise IntegrationConfigError(
                f"fp8mla (sglang): CUDA graphs cover decode and target verify, got {mode.name}"
            )
        bs = int(forward_batch.batch_size)
        key = (mode.is_target_verify(), bs)
        wrapper = self._graph_wrappers.get(key)
        if wrapper is None:
            if not in_capture:
                raise IntegrationConfigError(
                    f"fp8mla (sglang): no CUDA graph captured for batch size {bs} ({mode.name})"
                )
            if self._graph_bufs is None:
                raise IntegrationConfigError(
                    "fp8mla (sglang): init_cuda_graph_state() must run before capture"
                )
            qo, kvp, idx, kvl = self._graph_bufs
            wrapper = self._new_wrapper((qo[: bs + 1], kvp[: bs + 1], idx, kvl[:bs]))
            self._graph_wrappers[key] = wrapper
        self._plan(wrapper, forward_batch)
        self.forward_metadata = wrapper

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    # ------------------------------------------------------------------ forward
    def _attend(self, q, q_rope, layer, forward_batch) -> torch.Tensor:
        wrapper = self.forward_metadata
        if wrapper is None:
            raise ValueError("expected init_forward_metadata() before forward, got no plan")
        if layer.logit_cap and layer.logit_cap > 0:
            raise IntegrationConfigError(
                "fp8mla (sglang): attention logit soft-capping is not supported"
            )
        h = layer.tp_q_head_num
        if q_rope is not None:
            q_nope = q.view(-1, h, layer.v_head_dim)
            q_pe = q_rope.view(-1, h, layer.head_dim - layer.v_head_dim)
        else:
            q_all = q.view(-1, h, layer.head_dim)
            q_nope, q_pe = q_all[..., : layer.v_head_dim], q_all[..., layer.v_head_dim :]
        kv = self.token_to_kv_pool.get_key_buffer(layer.layer_id)  # [slots, 1, 576], no copy
        if self.page_size > 1:
            pages = kv.shape[0] // self.page_size
            kv = kv[: pages * self.page_size].view(pages, self.page_size, kv.shape[-1])
        scale = self.kv_scale if is_fp8(kv.dtype) else None
        out = wrapper.run(
            q_nope,
            q_pe,
            kv[..., :HEAD_DIM_CKV],
            kv[..., HEAD_DIM_CKV:],
            ckv_scale=scale,
            kpe_scale=scale,
        )
        return out.view(-1, h * layer.v_head_dim)

    def _save_kv(self, k, v, k_rope, layer, forward_batch, save_kv_cache: bool) -> None:
        if k is None or not save_kv_cache:
            return
        loc = KVWriteLoc.for_batch(forward_batch)
        if k_rope is not None:
            self.token_to_kv_pool.set_mla_kv_buffer(layer, loc, k, k_rope)
        else:
            self.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)

    def forward_decode(
        self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None, **kw
    ):
        self._save_kv(k, v, k_rope, layer, forward_batch, save_kv_cache)
        return self._attend(q, q_rope, layer, forward_batch)

    def forward_extend(
        self, q, k, v, layer, forward_batch, save_kv_cache=True, q_rope=None, k_rope=None, **kw
    ):
        self._save_kv(k, v, k_rope, layer, forward_batch, save_kv_cache)
        return self._attend(q, q_rope, layer, forward_batch)
