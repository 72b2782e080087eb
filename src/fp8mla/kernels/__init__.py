"""Triton kernels (``@triton.jit`` code only; launchers live in :mod:`fp8mla.attention.launch` and :mod:`fp8mla.cache.kv_write`)."""
