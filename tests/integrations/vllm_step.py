"""One MLA decode step through vLLM's own classes, shared by the vLLM tests and the bench.

vLLM's model runner keeps persistent device buffers -- the block table (``[max_num_seqs,
max_blocks]`` int32), the sequence lengths and the query start locations -- and rewrites them
in place before every step; a full CUDA graph, captured once per batch shape with the metadata
of ``build_for_cudagraph_capture``, reads them at every replay. :class:`VllmStep` builds that
arrangement from vLLM's real classes: a ``ModelConfig`` of a DeepSeek-V3-shaped model (a
``config.json`` only, no weights), ``MLAAttention`` layers with the chosen backend (registered
in the compilation config's forward context as the model's would be), the backend's metadata
builder made by an ``AttentionGroup``, and the metadata made by ``build_attn_metadata``, the
model runner's own function (capture: ``for_cudagraph_capture=True``; a step: the padded batch
of a FULL-graph replay). Each layer's decode attention is ``layer.impl.forward_mqa`` on the
layer's paged cache, which is what ``MLAAttention`` calls for decode rows.

Test set-up only: vLLM 0.34's CPU platform refuses a configuration on x86 when Triton has no
CPU backend (``vllm.triton_utils.HAS_TRITON``); the tests use that platform for configuration
objects only (attention runs on fp8mla's kernels, or vLLM's Triton kernels on a GPU), so
:func:`engine_config` lifts that one check while the configuration is made.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from fp8mla.reference import mla_reference

HEADS = 16
SCALE = 192**-0.5  # DeepSeek's 1/sqrt(qk_nope + qk_rope), no YaRN factor
_MODEL_DIR: Path | None = None


def _model_dir(heads: int, layers: int, max_model_len: int) -> Path:
    """A folder with a DeepSeek-V3-shaped ``config.json`` (MLA dims 512 + 64)."""
    global _MODEL_DIR
    if _MODEL_DIR is None:
        _MODEL_DIR = Path(tempfile.mkdtemp(prefix="fp8mla-vllm-model-"))
    path = _MODEL_DIR / f"h{heads}_l{layers}_m{max_model_len}"
    path.mkdir(exist_ok=True)
    config = dict(
        architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", hidden_size=256,
        num_attention_heads=heads, num_key_value_heads=heads, num_hidden_layers=layers,
        intermediate_size=512, moe_intermediate_size=64, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=512,
        q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        vocab_size=1024, max_position_embeddings=max_model_len, torch_dtype="bfloat16",
        rope_theta=10000.0,
    )  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    return path


@contextlib.contextmanager
def _cpu_platform_config():
    """vLLM's configuration checks as the tests need them (see the module docstring), and
    ``PYTHONPATH`` for the model registry's inspection subprocess (the engines' folder is on
    ``sys.path`` only)."""
    import vllm.triton_utils as triton_utils
    from vllm.platforms import current_platform

    saved_flag, saved_path = triton_utils.HAS_TRITON, os.environ.get("PYTHONPATH")
    if current_platform.is_cpu():
        triton_utils.HAS_TRITON = True
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = saved_flag
        if saved_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved_path


def engine_config(
    *,
    backend: str,
    kv_cache_dtype: str = "fp8",
    block_size: int = 16,
    heads: int = HEADS,
    layers: int = 2,
    max_model_len: int = 512,
    max_num_seqs: int = 16,
    speculative_tokens: int = 0,
):
    """A ``VllmConfig`` of a DeepSeek-V3-shaped bf16 model with ``--attention-backend
    backend``, ``--kv-cache-dtype``, ``--block-size`` and, with ``speculative_tokens``, n-gram
    speculative decoding (whose verification rows are uniform multi-token decode rows)."""
    return model_engine_config(
        _model_dir(heads, layers, max_model_len), backend=backend,
        kv_cache_dtype=kv_cache_dtype, block_size=block_size, max_model_len=max_model_len,
        max_num_seqs=max_num_seqs, speculative_tokens=speculative_tokens,
    )  # fmt: skip


def model_engine_config(
    model_dir: Path,
    *,
    backend: str,
    kv_cache_dtype: str,
    block_size: int,
    max_model_len: int,
    max_num_seqs: int,
    speculative_tokens: int = 0,
):
    """A ``VllmConfig`` of the bf16 model whose ``config.json`` is in ``model_dir`` (no
    weights), with the engine options of :func:`engine_config`."""
    from vllm.config import (
        AttentionConfig,
        CacheConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        SpeculativeConfig,
        VllmConfig,
    )

    with _cpu_platform_config():
        model = ModelConfig(
            model=str(model_dir),
            skip_tokenizer_init=True,
            dtype="bfloat16",
            max_model_len=max_model_len,
        )
        parallel = ParallelConfig()
        speculative = None
        if speculative_tokens:
            speculative = SpeculativeConfig(
                method="ngram", num_speculative_tokens=speculative_tokens,
                prompt_lookup_max=2, target_model_config=model, target_parallel_config=parallel,
            )  # fmt: skip
        config = VllmConfig(
            model_config=model,
            parallel_config=parallel,
            speculative_config=speculative,
            cache_config=CacheConfig(cache_dtype=kv_cache_dtype, block_size=block_size),
            scheduler_config=SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max(2048, max_model_len),
                max_model_len=max_model_len,
                is_encoder_decoder=False,
            ),
            attention_config=AttentionConfig(backend=backend),
        )
    # vLLM's CPU platform sets 16-token blocks for an MLA model on a CPU without AMX tiles (its
    # own CPU MLA kernel's constraint), whichever size was asked; the CPU here stands in for a
    # GPU running fp8mla's backend, so the block size is the one asked for on every CPU
    config.cache_config.block_size = block_size
    return config


def engine_config_cpu(**kw):
    """:func:`engine_config` for tests that only need the configuration checks lifted."""
    with _cpu_platform_config():
        from vllm.config import VllmConfig

        return VllmConfig(**kw)


@dataclass
class StepBatch:
    """A decode batch: request ``b`` has ``seq_lens[b]`` tokens (its last ``qlen`` are the
    queries) on pages ``block_rows[b]``."""

    seq_lens: list[int]
    qlen: int
    block_rows: torch.Tensor  # [n, max_blocks] int32 (host)


class VllmStep:
    """``layers`` MLA layers of one KV-cache group, their caches, the backend's metadata
    builder and the model runner's persistent buffers, on ``device``."""

    def __init__(
        self,
        config,
        *,
        layers: int,
        num_blocks: int,
        device,
        k_scale: float = 0.5,
        caches: list[torch.Tensor] | None = None,
    ):
        from torch import nn
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.layers.attention.mla_attention import MLAAttention
        from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.worker.utils import AttentionGroup

        self.config, self.device = config, torch.device(device)
        cache = config.cache_config
        self.block_size = cache.block_size
        self.max_model_len = config.model_config.max_model_len
        self.max_num_seqs = config.scheduler_config.max_num_seqs
        heads = config.model_config.get_num_attention_heads(config.parallel_config)
        self.heads = heads
        self.names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
        # the configured backend, passed to the layers: the CPU platform's own selector
        # refuses FP8 MLA caches (it serves its CPU backend only)
        backend = config.attention_config.backend.get_class()
        with set_current_vllm_config(config):
            # kv_b_proj is used only to absorb the up-projection into the queries (prefill
            # and weight loading); decode attention never calls it
            self.layers = [
                MLAAttention(
                    num_heads=heads,
                    scale=SCALE,
                    qk_nope_head_dim=128,
                    qk_rope_head_dim=64,
                    v_head_dim=128,
                    q_lora_rank=None,
                    kv_lora_rank=512,
                    kv_b_proj=nn.Linear(1, 1, bias=False),
                    cache_config=cache,
                    prefix=name,
                    attn_backend=backend,
                )
                for name in self.names
            ]
            spec = self.layers[0].get_kv_cache_spec(config)
            self.backend = backend
            self.group = AttentionGroup(backend, self.names, spec, 0)
            self.group.create_metadata_builders(config, self.device)
        self.builder = self.group.get_metadata_builder(0)
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(self.names, spec)],
        )
        self.spec = spec
        self.fp8 = config.cache_config.cache_dtype.startswith("fp8")
        self.k_scale = k_scale if self.fp8 else 1.0
        scale = torch.tensor([self.k_scale], dtype=torch.float32, device=self.device)
        for layer in self.layers:
            layer._k_scale = layer._v_scale = scale
            layer._k_scale_float = layer._v_scale_float = self.k_scale
        # the model runner's persistent buffers (vLLM's InputBuffers and BlockTables)
        i32 = dict(dtype=torch.int32, device=self.device)
        self.max_blocks = -(-self.max_model_len // self.block_size)
        self.block_table = torch.zeros(self.max_num_seqs, self.max_blocks, **i32)
        self.seq_lens = torch.zeros(self.max_num_seqs, **i32)
        self.query_start_loc = torch.zeros(self.max_num_seqs + 1, **i32)
        self.slot_mapping = torch.zeros(
            1, config.scheduler_config.max_num_batched_tokens, dtype=torch.int64,
            device=self.device,
        )  # fmt: skip
        # each layer's paged cache as MLAAttention binds it ([blocks, block_size, 576] in the
        # spec's dtype), values as concat_and_cache_mla stores them (k / k_scale); or the
        # caches of another step of the same configuration
        self.caches = caches if caches is not None else self._random_caches(layers, num_blocks)

    def _random_caches(self, layers: int, num_blocks: int) -> list[torch.Tensor]:
        gen = torch.Generator(self.device).manual_seed(layers * 7 + num_blocks)
        caches = []
        for _ in range(layers):
            shape = (num_blocks, self.block_size, 576)
            raw = torch.randn(shape, generator=gen, device=self.device)
            if self.fp8:
                values = (raw / self.k_scale).to(torch.float8_e4m3fn)
                caches.append(values.view(torch.uint8).view(self.spec.dtype))
            else:
                caches.append(raw.to(self.config.model_config.dtype))
            del raw
        return caches

    def values(self, layer: int) -> torch.Tensor:
        """``layer``'s cache in the dtype it holds values in (FP8 e4m3, or 16-bit)."""
        cache = self.caches[layer]
        return cache.view(torch.uint8).view(torch.float8_e4m3fn) if self.fp8 else cache

    # -- what the model runner does before a step --
    def write_batch(self, batch: StepBatch, padded_reqs: int) -> None:
        """Rewrite the persistent buffers in place for ``batch``, padded to ``padded_reqs``
        requests of length 0 and no query tokens (as vLLM pads a FULL-graph replay)."""
        n, q = len(batch.seq_lens), batch.qlen
        rows = torch.zeros(padded_reqs, self.max_blocks, dtype=torch.int32)
        rows[:n, : batch.block_rows.shape[1]] = batch.block_rows
        self.block_table[:padded_reqs].copy_(rows)
        lens = torch.zeros(self.max_num_seqs, dtype=torch.int32)
        lens[:n] = torch.tensor(batch.seq_lens, dtype=torch.int32)
        self.seq_lens.copy_(lens)
        qsl = torch.full((self.max_num_seqs + 1,), n * q, dtype=torch.int32)
        qsl[: n + 1] = torch.arange(0, (n + 1) * q, q, dtype=torch.int32)
        self.query_start_loc.copy_(qsl)

    def metadata(self, batch: StepBatch, padded_reqs: int, *, capture: bool):
        """The step's attention metadata by layer name, from vLLM's ``build_attn_metadata``:
        the metadata a FULL graph is captured with (``capture``), or a replay step's."""
        from vllm.v1.worker.gpu.attn_utils import build_attn_metadata

        n, q = padded_reqs, batch.qlen
        qsl_cpu = torch.arange(0, (n + 1) * q, q, dtype=torch.int32)
        real = len(batch.seq_lens)
        qsl_cpu[real + 1 :] = real * q  # padded requests: no query tokens
        seq_cpu = torch.zeros(n, dtype=torch.int32)
        seq_cpu[:real] = torch.tensor(batch.seq_lens, dtype=torch.int32)
        return build_attn_metadata(
            attn_groups=[[self.group]],
            num_reqs=n,
            num_tokens=n * q,
            query_start_loc_gpu=self.query_start_loc[: n + 1],
            query_start_loc_cpu=qsl_cpu,
            max_query_len=q,
            seq_lens=self.seq_lens,
            max_seq_len=self.max_model_len if capture else max(batch.seq_lens),
            block_tables=[self.block_table[:n]],
            slot_mappings=self.slot_mapping[:, : n * q],
            kv_cache_config=self.kv_cache_config,
            seq_lens_cpu_upper_bound=seq_cpu,
            is_prefilling=torch.zeros(n, dtype=torch.bool),
            for_cudagraph_capture=capture,
        )

    # -- the step --
    def forward(self, q: torch.Tensor, metadata: dict) -> list[torch.Tensor]:
        """Every layer's decode attention: ``[tokens, H, 512]`` outputs."""
        outs = []
        for i, (name, layer) in enumerate(zip(self.names, self.layers)):
            # the cache as MLAAttention.forward_impl hands it over (FP8 caches in the
            # platform's FP8 dtype, e4m3)
            out, _ = layer.impl.forward_mqa(q, self.values(i), metadata[name], layer)
            outs.append(out)
        return outs

    def reference(self, q: torch.Tensor, batch: StepBatch, layer: int = 0) -> torch.Tensor:
        """float64 output of ``layer`` for the batch's real requests (on the host)."""
        n, qlen = len(batch.seq_lens), batch.qlen
        pages = batch.block_rows.shape[1]
        values = self.values(layer)
        i32 = dict(dtype=torch.int32, device=self.device)
        ref, _ = mla_reference(
            q[: n * qlen, :, :512], q[: n * qlen, :, 512:], values[..., :512], values[..., 512:],
            torch.arange(0, (n + 1) * qlen, qlen, **i32),
            torch.arange(0, (n + 1) * pages, pages, **i32),
            batch.block_rows.reshape(-1).to(self.device),
            torch.tensor(batch.seq_lens, **i32),
            sm_scale=SCALE, causal=True, ckv_scale=self.k_scale, kpe_scale=self.k_scale,
            dtype=torch.float64,
        )  # fmt: skip
        return ref.cpu()


def random_batch(
    step: VllmStep, seq_lens: list[int], qlen: int, generator: torch.Generator
) -> StepBatch:
    """Requests of ``seq_lens`` tokens on distinct random pages of the step's caches."""
    pages = max(-(-s // step.block_size) for s in seq_lens)
    num_blocks = step.caches[0].shape[0]
    ids = torch.randperm(num_blocks, generator=generator)[: len(seq_lens) * pages]
    return StepBatch(list(seq_lens), qlen, ids.view(len(seq_lens), pages).to(torch.int32))


def random_queries(step: VllmStep, tokens: int, generator: torch.Generator) -> torch.Tensor:
    q = torch.randn(tokens, step.heads, 576, generator=generator)
    return q.to(step.config.model_config.dtype).to(step.device)
