"""Decode attention over an FP8 KV cache with fp8mla (runs on a GPU, or on the CPU fallback).

python examples/quickstart.py
"""

import torch

import fp8mla

device = "cuda" if torch.cuda.is_available() else "cpu"

# One layer's KV pool: 65,536 slots of 576 values (512 latent + 64 RoPE), stored as FP8.
cache = fp8mla.MLAKVCache(65_536, page_size=1, dtype=torch.float8_e4m3fn, device=device)
requests = [cache.new_sequence() for _ in range(4)]
for seq, n in zip(requests, [1000, 37, 4096, 513]):
    kv = torch.randn(n, 576, device=device, dtype=torch.bfloat16)
    cache.append(seq, kv[:, :512], kv[:, 512:])  # quantized on write
kv_indptr, kv_indices, kv_len = cache.plan_arrays(requests)

# FlashInfer's plan()/run() API: plan once per decode step, run once per layer.
wrapper = fp8mla.BatchMLAPagedAttentionWrapper(
    torch.empty(128 << 20, dtype=torch.uint8, device=device)
)
qo_indptr = torch.arange(len(requests) + 1, dtype=torch.int32, device=device)
heads = 16
wrapper.plan(
    qo_indptr,
    kv_indptr,
    kv_indices,
    kv_len,
    heads,
    512,
    64,
    cache.page_size,
    False,
    1 / 192**0.5,
    torch.bfloat16,
    torch.float8_e4m3fn,
)
q_nope = torch.randn(len(requests), heads, 512, device=device, dtype=torch.bfloat16)
q_pe = torch.randn(len(requests), heads, 64, device=device, dtype=torch.bfloat16)
out, lse = wrapper.run(q_nope, q_pe, cache.ckv, cache.kpe, return_lse=True, **cache.run_kwargs())
print(out.shape, out.dtype, lse.shape)  # torch.Size([4, 16, 512]) torch.bfloat16 (4, 16)

# The float64 reference on the same FP8 bytes.
ref, _ = fp8mla.reference.mla_reference(
    q_nope,
    q_pe,
    cache.ckv,
    cache.kpe,
    qo_indptr,
    kv_indptr,
    kv_indices,
    kv_len,
    sm_scale=1 / 192**0.5,
    ckv_scale=cache.ckv_scale,
    kpe_scale=cache.kpe_scale,
)
print("relative error vs float64:", fp8mla.testing.rel_err(out, ref))
