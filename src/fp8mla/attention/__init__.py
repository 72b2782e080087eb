"""Paged MLA attention: the FlashInfer-compatible wrapper, its planner and kernel variants.

- ``wrapper``: :class:`BatchMLAPagedAttentionWrapper` (``plan()``/``run()``); ``functional``:
  :func:`mla_decode`, the one-call form.
- ``plan_state``: what a plan knows and the run-time checks; ``planner``: variant, tile and
  splits per target; ``variants``: the kernel registry; ``config``: a launch's tile and grid;
  ``launch``: arguments and launches; ``workspace``: where split partials live; ``targets``:
  GPU architectures and the interpreter; ``reference``: the float64 oracle.
"""

from __future__ import annotations

from fp8mla.attention.functional import mla_decode, shared_workspace
from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper

__all__ = ["BatchMLAPagedAttentionWrapper", "mla_decode", "shared_workspace"]
