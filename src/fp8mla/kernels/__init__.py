"""The kernels, by architecture (``@triton.jit`` / ``@gluon.jit`` code only; launchers live in
:mod:`fp8mla.attention.launch` and :mod:`fp8mla.cache.kv_write`, the choice among the attention
variants in :mod:`fp8mla.attention.variants`):

- ``portable/``: Triton kernels every target runs, and their building blocks;
- ``sm90/``: Gluon kernels for Hopper, and the building blocks more than one of them uses
  (``sm90/common.py``).

A module imports only public names of another (no name that starts with ``_``). Each kernel
has one name, used by its module, its function (``_mla_<name>_kernel``), its registry entry
and the planner's tables; ``docs/design/`` holds each family's design and measurements.
"""
