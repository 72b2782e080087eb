"""DeepSeek Sparse Attention layers through vLLM's own classes, for the FP8MLA_SPARSE tests.

:class:`DsaStep` builds what vLLM builds for a DeepSeek-V3.2-shaped model (a ``config.json``
only, no weights): per layer the generic model's lightning indexer
(``model_executor/models/deepseek_v2.Indexer``: its key cache layer and its
``SparseAttnIndexer`` op, which the plugin replaces) and an ``MLAAttention`` with
``use_sparse=True``, the indexer and the model's shared ``topk_indices_buffer``; two KV-cache
groups (the MLA layers and the indexer caches), their metadata builders from
``AttentionGroup`` and the step's metadata from ``build_attn_metadata``, the model runner's
own function. :meth:`DsaStep.indexer` runs a layer's indexer op under vLLM's forward
context, :meth:`DsaStep.attend` the layer's ``forward_mqa``: what the model does per layer
after vLLM has written the new token's latent (``concat_and_cache_mla``, whose
``fp8_ds_mla`` bytes :func:`fp8mla.pack_ds_mla` reproduces).

The float64 references read the same cache bytes: the indexer's logits
(``fp8mla.dsa.indexer_reference``) and the sparse attention over the chosen slots
(``fp8mla.dsa.reference.sparse_mla_reference``).

Test set-up only: vLLM builds part of this metadata with Triton kernels of its own (the
per-token request ids, the indexer's prefill row bounds). Where vLLM runs without Triton (a
CPU-only machine: ``vllm.triton_utils.HAS_TRITON`` is False and its kernels are
placeholders), :func:`cpu_standins` puts the same statements in PyTorch ops in their place;
with a GPU vLLM's own kernels run. The indexer's projections are vLLM linear layers, which
read the tensor-parallel group: :func:`init_model_parallel` sets up vLLM's single-process
state (gloo).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

import fp8mla
from fp8mla.dsa.indexer_reference import paged_mqa_logits_reference, to_slots_reference
from fp8mla.dsa.reference import sparse_mla_reference
from integrations.vllm_step import model_engine_config

HEADS = 16
INDEX_HEADS = 8
TOPK = 64
PAGE = 64
SCALE = 192**-0.5  # DeepSeek's 1/sqrt(qk_nope + qk_rope), no YaRN factor
_MODEL_DIR: Path | None = None


def _model_dir(layers: int, max_model_len: int, topk: int) -> Path:
    """A folder with a DeepSeek-V3.2-shaped ``config.json`` (MLA 512 + 64, an indexer)."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        _MODEL_DIR = Path(tempfile.mkdtemp(prefix="fp8mla-vllm-dsa-"))
    path = _MODEL_DIR / f"l{layers}_m{max_model_len}_k{topk}"
    path.mkdir(exist_ok=True)
    config = dict(
        architectures=["DeepseekV32ForCausalLM"], model_type="deepseek_v32", hidden_size=256,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, num_hidden_layers=layers,
        intermediate_size=512, moe_intermediate_size=64, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=512,
        q_lora_rank=64, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        vocab_size=1024, max_position_embeddings=max_model_len, torch_dtype="bfloat16",
        rope_theta=10000.0, index_topk=topk, index_n_heads=INDEX_HEADS, index_head_dim=128,
    )  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    return path


def dsa_config(
    *,
    kv_cache_dtype: str = "fp8_ds_mla",
    block_size: int = PAGE,
    layers: int = 2,
    max_model_len: int = 512,
    max_num_seqs: int = 8,
    topk: int = TOPK,
    backend: str = "FP8MLA_SPARSE",
    speculative_tokens: int = 0,
):
    """A ``VllmConfig`` of the DSA model with ``--attention-backend``, ``--kv-cache-dtype``,
    ``--block-size`` and, with ``speculative_tokens``, n-gram speculative decoding (whose
    verification rows are decode rows of ``1 + speculative_tokens`` tokens)."""
    return model_engine_config(
        _model_dir(layers, max_model_len, topk), backend=backend, kv_cache_dtype=kv_cache_dtype,
        block_size=block_size, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
        speculative_tokens=speculative_tokens,
    )  # fmt: skip


def make_indexer(config, prefix: str, topk_buffer: torch.Tensor):
    """The generic DeepSeek model's ``Indexer`` of one layer (its op is the plugin's)."""
    from vllm.model_executor.models.deepseek_v2 import Indexer

    hf = config.model_config.hf_config
    return Indexer(config, hf, hf.hidden_size, hf.q_lora_rank, None, config.cache_config,
                   topk_buffer, prefix=prefix)  # fmt: skip


def make_mla(config, prefix: str, indexer, topk_buffer: torch.Tensor, backend=None):
    """The sparse ``MLAAttention`` of one layer, as ``MultiHeadLatentAttentionWrapper``
    makes it (``kv_b_proj`` absorbs the up-projection into the queries before
    ``forward_mqa``: unused here)."""
    from torch import nn
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention

    backend = backend or config.attention_config.backend.get_class()
    return MLAAttention(
        num_heads=HEADS, scale=SCALE, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        q_lora_rank=64, kv_lora_rank=512, kv_b_proj=nn.Linear(1, 1, bias=False),
        cache_config=config.cache_config, prefix=prefix, attn_backend=backend, use_sparse=True,
        indexer=indexer, topk_indices_buffer=topk_buffer,
    )  # fmt: skip


@dataclass
class Batch:
    """Request ``b`` holds ``seq_lens[b]`` tokens, its last ``query_lens[b]`` new this step,
    on pages ``block_rows[b]`` (the same page ids in both caches' block tables)."""

    seq_lens: list[int]
    query_lens: list[int]
    block_rows: torch.Tensor  # [n, pages] int32 (host)

    @property
    def tokens(self) -> int:
        return sum(self.query_lens)

    def token_positions(self) -> list[tuple[int, int]]:
        """``(request, position)`` of each new token, in batch order."""
        return [(b, s - q + i) for b, (s, q) in enumerate(zip(self.seq_lens, self.query_lens))
                for i in range(q)]  # fmt: skip


class DsaStep:
    """``layers`` DSA layers of one vLLM configuration: their caches, both metadata builders
    and the model runner's persistent buffers, on ``device``."""

    def __init__(self, config, *, layers: int, num_blocks: int, device):
        from vllm.config import set_current_vllm_config
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.worker.utils import AttentionGroup

        self.config, self.device = config, torch.device(device)
        self.max_model_len = config.model_config.max_model_len
        self.max_num_seqs = config.scheduler_config.max_num_seqs
        tokens = config.scheduler_config.max_num_batched_tokens
        self.topk = config.model_config.hf_config.index_topk
        # the model's shared top-k buffer (DeepseekV2Model allocates it)
        self.topk_buffer = torch.empty(tokens, self.topk, dtype=torch.int32, device=self.device)
        self.names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
        with set_current_vllm_config(config):
            self.indexers = [
                make_indexer(config, f"model.layers.{i}.self_attn.indexer", self.topk_buffer)
                for i in range(layers)
            ]
            self.layers = [
                make_mla(config, name, idx, self.topk_buffer)
                for name, idx in zip(self.names, self.indexers)
            ]
            self.idx_names = [idx.k_cache.prefix for idx in self.indexers]
            mla_spec = self.layers[0].get_kv_cache_spec(config)
            idx_spec = self.indexers[0].k_cache.get_kv_cache_spec(config)
            self.groups = [
                AttentionGroup(self.layers[0].attn_backend, self.names, mla_spec, 0),
                AttentionGroup(
                    self.indexers[0].k_cache.get_attn_backend(), self.idx_names, idx_spec, 1
                ),
            ]
            for g in self.groups:
                g.create_metadata_builders(config, self.device)
        self.builder = self.groups[0].get_metadata_builder(0)
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(self.names, mla_spec),
                             KVCacheGroupSpec(self.idx_names, idx_spec)],
        )  # fmt: skip
        self.packed = config.cache_config.cache_dtype == "fp8_ds_mla"
        width = 656 if self.packed else 576
        self.mla_caches, self.idx_caches = [], []
        for layer, idx in zip(self.layers, self.indexers):
            if self.packed:  # unwritten bytes: e4m3 NaN codes and NaN scales
                cache = torch.full((num_blocks, PAGE, width), 0xFF, dtype=torch.uint8)
            else:
                cache = torch.full((num_blocks, PAGE, width), float("nan"), dtype=torch.bfloat16)
            self.mla_caches.append(cache.to(self.device))
            idx_cache = torch.full((num_blocks, 1, PAGE, 132), 0xFF, dtype=torch.uint8)
            idx.k_cache.bind_kv_cache(idx_cache.to(self.device))  # as the model runner binds
            self.idx_caches.append(idx.k_cache.kv_cache)
            layer.kv_cache = self.mla_caches[-1]
        # the model runner's persistent buffers (one block table per KV-cache group)
        i32 = dict(dtype=torch.int32, device=self.device)
        self.max_blocks = -(-self.max_model_len // PAGE)
        self.block_tables = [torch.zeros(self.max_num_seqs, self.max_blocks, **i32)
                             for _ in range(2)]  # fmt: skip
        self.seq_lens = torch.zeros(self.max_num_seqs, **i32)
        self.query_start_loc = torch.zeros(self.max_num_seqs + 1, **i32)
        self.slot_mapping = torch.zeros(2, tokens, dtype=torch.int64, device=self.device)

    # -- what the model runner does before a step --
    def write_batch(self, batch: Batch, padded_reqs: int | None = None) -> None:
        """Rewrite the persistent buffers in place for ``batch`` (padded with requests of
        length 0 and no tokens, as vLLM pads a full-graph replay)."""
        n = len(batch.seq_lens)
        padded = padded_reqs or n
        rows = torch.zeros(padded, self.max_blocks, dtype=torch.int32)
        rows[:n, : batch.block_rows.shape[1]] = batch.block_rows
        for table in self.block_tables:
            table[:padded].copy_(rows)
        lens = torch.zeros(self.max_num_seqs, dtype=torch.int32)
        lens[:n] = torch.tensor(batch.seq_lens, dtype=torch.int32)
        self.seq_lens.copy_(lens)
        qsl = torch.full((self.max_num_seqs + 1,), batch.tokens, dtype=torch.int32)
        qsl[1 : n + 1] = torch.tensor(batch.query_lens, dtype=torch.int32).cumsum(0)
        qsl[0] = 0
        self.query_start_loc.copy_(qsl)
        slots = torch.tensor([self.slot(batch, b, p) for b, p in batch.token_positions()])
        self.slot_mapping.fill_(-1)  # padding tokens write nothing (vLLM's PAD_SLOT_ID)
        self.slot_mapping[:, : batch.tokens].copy_(slots)

    def slot(self, batch: Batch, b: int, pos: int) -> int:
        return int(batch.block_rows[b, pos // PAGE]) * PAGE + pos % PAGE

    def metadata(self, batch: Batch, padded_reqs: int | None = None, *, capture=False):
        """The step's metadata by layer name (both groups), from ``build_attn_metadata``."""
        from vllm.v1.worker.gpu.attn_utils import build_attn_metadata

        n = padded_reqs or len(batch.seq_lens)
        real = len(batch.seq_lens)
        qsl_cpu = torch.full((n + 1,), batch.tokens, dtype=torch.int32)
        qsl_cpu[0] = 0
        qsl_cpu[1 : real + 1] = torch.tensor(batch.query_lens, dtype=torch.int32).cumsum(0)
        seq_cpu = torch.zeros(n, dtype=torch.int32)
        seq_cpu[:real] = torch.tensor(batch.seq_lens, dtype=torch.int32)
        prefilling = torch.zeros(n, dtype=torch.bool)
        prefilling[:real] = torch.tensor([q > 1 for q in batch.query_lens])
        return build_attn_metadata(
            attn_groups=[[g] for g in self.groups], num_reqs=n, num_tokens=batch.tokens,
            query_start_loc_gpu=self.query_start_loc[: n + 1], query_start_loc_cpu=qsl_cpu,
            max_query_len=max(batch.query_lens), seq_lens=self.seq_lens,
            max_seq_len=self.max_model_len if capture else max(batch.seq_lens),
            block_tables=[t[:n] for t in self.block_tables],
            slot_mappings=self.slot_mapping[:, : batch.tokens],
            kv_cache_config=self.kv_cache_config, seq_lens_cpu_upper_bound=seq_cpu,
            is_prefilling=prefilling, for_cudagraph_capture=capture,
        )  # fmt: skip

    # -- the step's data --
    def fill(self, batch: Batch, *, seed: int) -> list[LayerInputs]:
        """Random tokens of ``batch`` in every layer's caches -- all latents (vLLM writes the
        new tokens' before attention), the keys of the context tokens only (the indexer op
        writes the new ones) -- and each layer's inputs for the step."""
        gen = torch.Generator().manual_seed(seed)
        dev, t = self.device, batch.tokens
        slots, new = [], []
        for b, (s, q) in enumerate(zip(batch.seq_lens, batch.query_lens)):
            pos = torch.arange(s)
            slots.append(batch.block_rows[b].long()[pos // PAGE] * PAGE + pos % PAGE)
            new.append(pos >= s - q)
        slots, new = torch.cat(slots).to(dev), torch.cat(new).to(dev)
        inputs = []
        for mla, idx in zip(self.mla_caches, self.idx_caches):
            latent = torch.randn(slots.numel(), 576, generator=gen).to(torch.bfloat16).to(dev)
            if self.packed:
                fp8mla.pack_ds_mla(latent[:, :512], latent[:, 512:], mla, slots)
            else:
                mla.view(-1, 576)[slots] = latent.to(mla.dtype)
            keys = torch.randn(slots.numel(), 128, generator=gen).to(torch.bfloat16).to(dev)
            fp8mla.pack_index_keys(keys[~new], idx, slots[~new])
            q = torch.randn(t, HEADS, 576, generator=gen).to(torch.bfloat16).to(dev)
            q8 = torch.randn(t, INDEX_HEADS, 128, generator=gen).to(torch.float8_e4m3fn)
            inputs.append(LayerInputs(
                q_nope=q[..., :512], q_pe=q[..., 512:], q8=q8.to(dev), k=keys[new],
                weights=torch.rand(t, INDEX_HEADS, generator=gen).to(dev),
            ))  # fmt: skip
        return inputs

    def slot_mappings(self, tokens: int) -> dict[str, torch.Tensor]:
        """The forward context's slot mapping of every layer (each group's row)."""
        out = {name: self.slot_mapping[0, :tokens] for name in self.names}
        out.update({name: self.slot_mapping[1, :tokens] for name in self.idx_names})
        return out

    def indexer(self, layer: int, metadata: dict, x: LayerInputs) -> torch.Tensor:
        """The layer's indexer op under vLLM's forward context (as ``Indexer.forward`` calls
        it): the new keys into the key cache, each token's top-k into the shared buffer."""
        from vllm.forward_context import set_forward_context

        t = x.q8.shape[0]
        hidden = torch.zeros(t, 256, dtype=torch.bfloat16, device=self.device)
        with set_forward_context(metadata, self.config, slot_mapping=self.slot_mappings(t)):
            self.indexers[layer].indexer_op(hidden, x.q8, x.k, x.weights)
        return self.topk_buffer[:t]

    def attend(self, layer: int, metadata: dict, x: LayerInputs) -> torch.Tensor:
        """The layer's ``forward_mqa`` (what ``MLAAttention`` calls for every token here)."""
        impl = self.layers[layer].impl
        out, lse = impl.forward_mqa((x.q_nope, x.q_pe), self.mla_caches[layer],
                                    metadata[self.names[layer]], self.layers[layer])  # fmt: skip
        assert lse is None
        return out

    # -- float64 references on the same bytes --
    def token_tables(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Each new token's block-table row ``[T, pages]`` and causal length ``[T]``."""
        rows = [(b, p) for b, p in batch.token_positions()]
        table = batch.block_rows[[b for b, _ in rows]].to(self.device)
        lens = torch.tensor([p + 1 for _, p in rows], dtype=torch.int32, device=self.device)
        return table, lens

    def reference_logits(self, layer: int, batch: Batch, x: LayerInputs) -> torch.Tensor:
        """float64 indexer logits ``[T, max seq len]`` over the layer's key cache."""
        table, lens = self.token_tables(batch)
        t = x.q8.shape[0]
        return paged_mqa_logits_reference(
            x.q8.view(t, 1, INDEX_HEADS, 128), x.weights, self.idx_caches[layer], table,
            lens[:, None], max(batch.seq_lens), dtype=torch.float64,
        )  # fmt: skip

    def reference_attention(self, layer: int, batch: Batch, x: LayerInputs,
                            positions: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """float64 sparse attention of the new tokens over ``positions`` (request-relative),
        read through the test's block tables."""
        table, _ = self.token_tables(batch)
        slots = to_slots_reference(positions, table, PAGE,
                                   torch.arange(table.shape[0], device=self.device))  # fmt: skip
        out, _ = sparse_mla_reference(x.q_nope, x.q_pe, self.mla_caches[layer], slots, SCALE,
                                      dtype=torch.float64)  # fmt: skip
        return out.cpu()


@dataclass
class LayerInputs:
    """One layer's inputs of a step: the absorbed MLA query, the indexer's e4m3 queries (their
    scales folded into ``weights``) and the new tokens' keys."""

    q_nope: torch.Tensor  # [T, H, 512] bf16
    q_pe: torch.Tensor  # [T, H, 64] bf16
    q8: torch.Tensor  # [T, index heads, 128] e4m3
    k: torch.Tensor  # [T, 128] bf16
    weights: torch.Tensor  # [T, index heads] float32


TIE = 1e-5  # float32 logits cannot order positions whose float64 logits lie this close


def check_selection(got: torch.Tensor, logits: torch.Tensor, k: int) -> None:
    """Each row of ``got [T, k]`` (ascending positions, -1 padded) is the float64 top-k of
    ``logits [T, S]`` (-inf where the token sees nothing): the same set but for positions
    within ``TIE`` × the row's largest |logit| of the k-th logit."""
    for row, scores in zip(got.cpu(), logits.cpu()):
        seen = torch.isfinite(scores).nonzero().flatten()
        chosen = row[row >= 0].long()
        assert chosen.numel() == min(k, seen.numel()), (chosen.numel(), seen.numel())
        assert torch.equal(row[: chosen.numel()], torch.sort(row[row >= 0]).values)
        assert (row[chosen.numel() :] == -1).all(), "-1 padding after the chosen positions"
        assert torch.isfinite(scores[chosen]).all(), "a position the token does not see"
        ref = seen[torch.sort(scores[seen], descending=True, stable=True).indices[:k]]
        band = TIE * float(scores[seen].abs().max()) if seen.numel() else 0.0
        kth = scores[ref[-1]] if ref.numel() else 0.0
        for p in set(ref.tolist()) ^ set(chosen.tolist()):
            assert abs(float(scores[p] - kth)) <= band, f"position {p} is no tie"


# -- vLLM's metadata kernels on a CPU-only machine (module docstring) --
def _token_to_req(query_start_loc, out, num_mapped_tokens, num_tokens):
    """vLLM's ``compute_token_to_req_indices``: the request of each token, 0 past the mapped
    tokens."""
    reqs = query_start_loc.shape[0] - 1
    t = torch.arange(num_tokens, device=out.device, dtype=query_start_loc.dtype)
    req = torch.searchsorted(query_start_loc[1:].contiguous(), t, right=True)
    out[:num_tokens] = torch.where(t < num_mapped_tokens, req.clamp(max=reqs - 1), 0)
    return out[:num_tokens]


def _prefill_chunk_bounds(query_start_loc, uncompressed_seq_lens, cu_seq_lens, row_start_cu,
                          token_to_seq, ks, ke, query_slice_start, query_slice_stop, dcp_rank,
                          dcp_world, dcp_interleave, *, num_reqs, COMPRESS_RATIO,
                          positions=None):  # fmt: skip
    """vLLM's ``BuildPrefillChunkMetadataKernel``: each query token's key range ``[ks, ke)``
    in the chunk's gathered keys (its request's start, plus its causal length) and each key's
    request (no DCP, no ShardQ positions)."""
    assert dcp_world == 1 and positions is None
    qsl, lens = query_start_loc.tolist(), uncompressed_seq_lens.tolist()
    for b in range(num_reqs):
        q0, q1 = qsl[b], qsl[b + 1]
        row, start = int(row_start_cu[b]), lens[b] - (q1 - q0)
        for i in range(q1 - q0):
            if query_slice_start <= q0 + i < query_slice_stop:
                ks[q0 + i - query_slice_start] = row
                ke[q0 + i - query_slice_start] = row + (start + 1 + i) // COMPRESS_RATIO
        token_to_seq[int(cu_seq_lens[b]) : int(cu_seq_lens[b + 1])] = b


def cpu_standins(monkeypatch) -> bool:
    """Put the PyTorch statements of vLLM's metadata kernels in place where vLLM has no
    Triton; returns whether it did."""
    import vllm.triton_utils
    import vllm.v1.attention.backends.mla.indexer as indexer_backend
    import vllm.v1.attention.ops.metadata as metadata_ops

    if vllm.triton_utils.HAS_TRITON:
        return False
    monkeypatch.setattr(metadata_ops, "compute_token_to_req_indices", _token_to_req)
    monkeypatch.setattr(indexer_backend, "_BUILD_PREFILL_CHUNK_METADATA_KERNEL",
                        _prefill_chunk_bounds)  # fmt: skip
    return True


def init_model_parallel(config) -> bool:
    """vLLM's single-process distributed state (gloo), which its linear layers read;
    returns whether it set it up (``False``: it already was)."""
    import socket

    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    if model_parallel_is_initialized():
        return False
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")  # fmt: skip
        ensure_model_parallel_initialized(1, 1)
    return True


def close_model_parallel() -> None:
    from vllm.distributed import destroy_distributed_environment, destroy_model_parallel

    destroy_model_parallel()
    destroy_distributed_environment()
