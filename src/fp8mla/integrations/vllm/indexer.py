"""The lightning indexer of DeepSeek Sparse Attention in vLLM on fp8mla's kernels.

vLLM computes a DSA layer's top-k in ``SparseAttnIndexer``, a ``CustomOp`` whose CUDA path
calls DeepGEMM (``fp8_paged_mqa_logits`` / ``fp8_mqa_logits``, SM90 and SM100 only) and
refuses to start without it. vLLM lets a plugin replace a ``CustomOp`` class
(``CustomOp.register_oot``): :class:`FP8MLASparseAttnIndexer` takes its place and, when
``--attention-backend FP8MLA_SPARSE`` is selected, computes the same result with fp8mla:

- the new keys go into the layer's 132-byte key cache (:func:`fp8mla.pack_index_keys`,
  ``"pow2"`` scales: the bytes of vLLM's ``indexer_k_quant_and_cache`` with ``ue8m0``);
- prefill tokens: one row each, over its request's pages up to its causal end
  (:func:`fp8mla.dsa.paged_topk`, vLLM's prefill chunks bound the rows and lengths);
- decode rows: :func:`fp8mla.dsa.paged_topk` over vLLM's decode block table and lengths
  (DeepGEMM's ``fp8_paged_mqa_logits`` semantics);
- the request-relative positions (ascending, ``-1`` padding) land in the model's
  ``topk_indices_buffer``, where the sparse MLA backend reads them.

The work runs in one opaque custom op (``vllm::fp8mla_sparse_attn_indexer``) so
``torch.compile`` does not trace into the per-step metadata; its decode path reads only
device tensors and host bounds fixed at capture, so a full CUDA graph of a uniform decode
batch captures it. Other configurations keep vLLM's own class unchanged.

Where it applies (:func:`check_indexer_route`): vLLM's generic DeepSeek model
(``model_executor/models/deepseek_v2.py``, ``DeepseekV3ForCausalLM``) calls the indexer op;
vLLM's CUDA DeepSeek-V3.2/GLM-5 model (``vllm.models.deepseek_v32``) calls the function
behind it directly, so there the top-k stays vLLM's (DeepGEMM).
"""

# no ``from __future__ import annotations``: torch infers the op's schema from its
# annotations, read through vLLM's decorator, so they must be objects, not strings
import inspect
from typing import Any

import torch
from vllm.compilation.breakable_cudagraph import (
    eager_break_during_capture,
    is_breakable_cudagraph_enabled,
)
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
from vllm.platforms import current_platform
from vllm.utils.torch_utils import (
    LayerNameType,
    _encode_layer_name,
    _resolve_layer_name,
    direct_register_custom_op,
)

from fp8mla.dsa.index_cache import HEAD_DIM, pack_index_keys
from fp8mla.dsa.indexer import paged_topk
from fp8mla.integrations.common import kernel_backend

OP_NAME = "fp8mla_sparse_attn_indexer"
OOT_NAME = "SparseAttnIndexer"  # the class vLLM instantiates, replaced by name
NAME = "FP8MLA_SPARSE"  # the attention backend that selects this indexer
_PREFIX = "fp8mla (vllm): "
_SCALE_FORMATS = {"ue8m0": "pow2", None: "arbitrary"}  # vLLM's scale_fmt -> fp8mla's
# the constructor arguments vLLM's class keeps as attributes of the same names
_OP_FIELDS = ("k_cache", "quant_block_size", "scale_fmt", "topk_tokens", "head_dim",
              "max_model_len", "max_total_seq_len", "topk_indices_buffer",
              "skip_k_cache_insert", "use_fp4_cache")  # fmt: skip


def backend_selected(vllm_config: Any) -> bool:
    """Whether ``--attention-backend FP8MLA_SPARSE`` (or a per-kind override) is set."""
    attention = getattr(vllm_config, "attention_config", None)
    chosen = [getattr(attention, "backend", None)]
    chosen += list((getattr(attention, "backend_per_kind", None) or {}).values())
    return any(getattr(b, "name", b) == NAME for b in chosen)


def _unserved(args: dict[str, Any]) -> str | None:
    """Why fp8mla's indexer cannot stand in for this ``SparseAttnIndexer``, or ``None``."""
    if args["head_dim"] != HEAD_DIM or args["quant_block_size"] != HEAD_DIM:
        return f"head_dim {args['head_dim']}, quant block {args['quant_block_size']}"
    if args["scale_fmt"] not in _SCALE_FORMATS:
        return f"scale_fmt {args['scale_fmt']!r}"
    if args.get("use_fp4_cache"):
        return "an MXFP4 key cache"
    if args.get("skip_k_cache_insert"):
        return "keys written outside the indexer"
    if args.get("compress_ratio", 1) != 1:
        return f"compressed keys (ratio {args['compress_ratio']})"
    if args.get("candidate_blocks") is not None:
        return "candidate-block selection"
    if current_platform.fp8_dtype() != torch.float8_e4m3fn:
        return f"FP8 queries in {current_platform.fp8_dtype()}"
    return None


class FP8MLASparseAttnIndexer(SparseAttnIndexer):
    """vLLM's ``SparseAttnIndexer`` with fp8mla's kernels under ``FP8MLA_SPARSE``.

    ``serves`` says whether this instance runs fp8mla's indexer; when it does not (another
    attention backend, or an indexer fp8mla does not cover: MXFP4 keys, compressed keys,
    candidate blocks, a cache written elsewhere), it is vLLM's class unchanged."""

    def __init__(self, *args, **kwargs) -> None:
        bound = inspect.signature(SparseAttnIndexer.__init__).bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        config = get_current_vllm_config()
        self.unserved = None if backend_selected(config) else "another attention backend"
        self.unserved = self.unserved or _unserved(a)
        if self.unserved is not None or not _parent_refuses():
            super().__init__(*args, **kwargs)
        else:
            # vLLM's class refuses CUDA without DeepGEMM, which fp8mla replaces; what the
            # models read from the op is set here.
            CustomOp.__init__(self)
            for name in _OP_FIELDS:
                setattr(self, name, a[name])
            self.dense_mha_metadata_layer_name = ""
        self.scale_format = _SCALE_FORMATS.get(a["scale_fmt"], "arbitrary")

    @property
    def serves(self) -> bool:
        return self.unserved is None

    def forward(self, hidden_states, q_quant, k, weights):
        if not self.serves:
            return super().forward(hidden_states, q_quant, k, weights)
        if isinstance(q_quant, tuple) or k is None:
            raise ValueError(
                f"expected e4m3 indexer queries and new keys, got "
                f"{type(q_quant).__name__} queries and keys {type(k).__name__}"
            )
        torch.ops.vllm.fp8mla_sparse_attn_indexer(
            q_quant,
            k,
            weights,
            self.k_cache.kv_cache,
            self.topk_indices_buffer,
            _encode_layer_name(self.k_cache.prefix),
            self.topk_tokens,
            self.max_model_len,
            self.scale_format,
        )
        return self.topk_indices_buffer


def register_indexer() -> bool:
    """Put :class:`FP8MLASparseAttnIndexer` in place of vLLM's ``SparseAttnIndexer``
    (``CustomOp.register_oot``); ``False`` when another plugin already replaced it."""
    from vllm.model_executor.custom_op import op_registry_oot

    held = op_registry_oot.get(OOT_NAME)
    if held is FP8MLASparseAttnIndexer:
        return True
    if held is not None:
        return False
    CustomOp.register_oot(FP8MLASparseAttnIndexer, name=OOT_NAME)
    # register_oot renames the class; keep vLLM's op name so its custom-op flags
    # (-cc.custom_ops) still reach the instances this class leaves to vLLM
    FP8MLASparseAttnIndexer.name = SparseAttnIndexer.name
    return True


def _breakable_graphs(compilation_config) -> bool:
    """Whether vLLM captures breakable CUDA graphs (0.34 reads its config, 0.33 the env)."""
    if inspect.signature(is_breakable_cudagraph_enabled).parameters:
        return is_breakable_cudagraph_enabled(compilation_config)
    return is_breakable_cudagraph_enabled()


def _parent_refuses() -> bool:
    """vLLM's ``SparseAttnIndexer`` raises on CUDA without DeepGEMM."""
    from vllm.utils.deep_gemm import has_deep_gemm

    return current_platform.is_cuda() and not has_deep_gemm()


def check_indexer_route(indexer: Any) -> str | None:
    """Why a sparse layer whose indexer is ``indexer`` cannot run under ``FP8MLA_SPARSE``, or
    ``None``. ``None`` is a layer that reuses an earlier layer's top-k."""
    if indexer is None:
        return None
    from vllm.model_executor.models.deepseek_v2 import Indexer

    op = getattr(indexer, "indexer_op", None)
    config = get_current_vllm_config()
    if isinstance(indexer, Indexer) and isinstance(op, FP8MLASparseAttnIndexer) and op.serves:
        mode = config.compilation_config.cudagraph_mode
        if mode is not None and mode.has_piecewise_cudagraphs():
            if not _breakable_graphs(config.compilation_config):
                return (
                    f"{_PREFIX}fp8mla's indexer runs between piecewise CUDA graphs only as "
                    f"an eager break: expected -cc.cudagraph_mode=FULL_DECODE_ONLY, "
                    f"VLLM_USE_BREAKABLE_CUDAGRAPH=1 or --enforce-eager, got {mode.name}"
                )
        parallel = config.parallel_config
        if parallel.prefill_context_parallel_size > 1:
            return (
                f"{_PREFIX}expected --prefill-context-parallel-size 1, got "
                f"{parallel.prefill_context_parallel_size}"
            )
        kv = config.attention_config.resolve_indexer_kv_dtype("fp8")
        if kv != "fp8":
            return f"{_PREFIX}expected the indexer's FP8 key cache, got indexer_kv_dtype {kv}"
        return None
    # vLLM computes this layer's top-k itself: on CUDA with DeepGEMM
    if _parent_refuses():
        why = op.unserved if isinstance(op, FP8MLASparseAttnIndexer) else None
        return (
            f"{_PREFIX}fp8mla computes the lightning indexer in vLLM's generic DeepSeek model "
            f'only: expected --hf-overrides \'{{"architectures": ["DeepseekV3ForCausalLM"]}}\''
            f" (or DeepGEMM installed), got {type(indexer).__name__} without DeepGEMM"
            + (f" ({why})" if why and why != "another attention backend" else "")
        )
    return None


# -- the op --
def _prefill(meta, q8, weights, kv_cache, buffer, k: int, backend: str) -> None:
    """Top-k of the prefill tokens, chunk by chunk (vLLM's chunks bound rows x keys)."""
    for chunk in meta.prefill.chunks:
        a, b = chunk.token_start, chunk.token_end
        if b <= a:
            continue
        ks, ke = chunk.cu_seqlen_ks, chunk.cu_seqlen_ke
        # each token's request, from where its keys start in the chunk (vLLM's CPU path)
        req = torch.searchsorted(chunk.cu_seq_lens, ks, right=True) - 1
        table = chunk.block_table.index_select(0, req.clamp_min(0)).contiguous()
        lens = (ke - ks).to(torch.int32).unsqueeze(1)
        buffer[a:b, :k] = paged_topk(
            q8[a:b].unsqueeze(1),
            weights[a:b].contiguous(),
            kv_cache,
            table.to(torch.int32),
            lens,
            max_context_len=max(1, int(chunk.max_seqlen_k)),
            k=k,
            backend=backend,
        )


def _decode(meta, q8, weights, kv_cache, buffer, k: int, max_len: int, backend: str) -> None:
    """Top-k of the decode rows (a request's ``next_n`` tokens each see one more key)."""
    dm = meta.decode
    tokens = meta.num_decode_tokens
    rows = dm.decode_lens.shape[0]
    if tokens == 0 or rows == 0:
        return
    if not dm.requires_padding and tokens % rows == 0:
        next_n = tokens // rows
        q = q8[:tokens].view(rows, next_n, *q8.shape[1:])
        table, lens = dm.block_table[:rows], dm.seq_lens[:rows]
    else:
        # requests of unequal token counts: one row per token, its own causal length
        n = meta.num_decodes
        per_req = dm.per_req_decode_lens[:n].to(torch.int64)
        req = torch.repeat_interleave(
            torch.arange(n, device=q8.device), per_req, output_size=tokens
        )
        first = torch.cumsum(per_req, 0) - per_req
        t = torch.arange(tokens, device=q8.device)
        seq = meta.seq_lens[:n].to(torch.int64)
        lens = (seq[req] - per_req[req] + 1 + t - first[req]).to(torch.int32).unsqueeze(1)
        table = dm.block_table.index_select(0, req).contiguous()
        q = q8[:tokens].unsqueeze(1)
    buffer[:tokens, :k] = paged_topk(
        q.contiguous(),
        weights[:tokens].contiguous(),
        kv_cache,
        table.to(torch.int32),
        lens.to(torch.int32).contiguous(),
        max_context_len=max_len,
        k=k,
        backend=backend,
    )


@eager_break_during_capture
def fp8mla_sparse_attn_indexer(
    q_fp8: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    kv_cache: torch.Tensor,
    topk_indices_buffer: torch.Tensor,
    k_cache_prefix: LayerNameType,
    topk_tokens: int,
    max_model_len: int,
    scale_format: str,
) -> None:
    """Write ``k`` into the key cache and each token's top-k positions into the buffer.

    A full CUDA graph (uniform decode) captures this call; a breakable graph's piecewise
    capture runs it eagerly at every replay, on that step's metadata."""
    metadata = get_forward_context().attn_metadata
    if not isinstance(metadata, dict):  # profiling run: no batch
        return
    meta = metadata[_resolve_layer_name(k_cache_prefix)]
    backend = kernel_backend()
    slots = meta.slot_mapping
    tokens = slots.shape[0]
    pack_index_keys(
        k[:tokens], kv_cache, slots, scale_format=scale_format, validate=False, backend=backend
    )
    topk_indices_buffer[: q_fp8.shape[0]] = -1
    if meta.num_prefills > 0:
        _prefill(meta, q_fp8, weights, kv_cache, topk_indices_buffer, topk_tokens, backend)
    if meta.num_decodes > 0:
        # a captured graph replays longer contexts than it saw: bound by the model's length
        capturing = q_fp8.is_cuda and torch.cuda.is_current_stream_capturing()
        bound = max_model_len if capturing else min(max_model_len, int(meta.max_seq_len))
        _decode(
            meta, q_fp8, weights, kv_cache, topk_indices_buffer, topk_tokens, max(1, bound), backend
        )


def _fake(
    q_fp8,
    k,
    weights,
    kv_cache,
    topk_indices_buffer,
    k_cache_prefix,
    topk_tokens,
    max_model_len,
    scale_format,
) -> None:
    return None


# one kernel for every device: the op's tensors may live on any device fp8mla serves
direct_register_custom_op(
    op_name=OP_NAME,
    op_func=fp8mla_sparse_attn_indexer,
    mutates_args=["kv_cache", "topk_indices_buffer"],
    fake_impl=_fake,
    dispatch_key="CompositeExplicitAutograd",
)

__all__ = [
    "FP8MLASparseAttnIndexer",
    "backend_selected",
    "check_indexer_route",
    "register_indexer",
]
