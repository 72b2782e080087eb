"""Triton kernels (``@triton.jit`` code only; launchers live in :mod:`fp8mla.ops`)."""
