"""Static scan for dtype casts of whole KV cache pools in serving-engine source.

Parses Python source with :mod:`ast` (never imports or runs it) and reports:

- ``whole_pool_cast`` (high): ``.to(dtype)``/``.float()``/``.half()``/``.bfloat16()``/
  ``.type(...)``/``torch.as_tensor(..., dtype=...)`` applied to a whole KV pool buffer, or to a
  basic-slice view of one (``k_buffer[:, :, :512].to(q.dtype)``): the per-layer, per-step copy
  of the entire preallocated cache.
- ``gathered_cast`` (low): the same casts applied to rows gathered first (``buf[loc].to(...)``,
  ``buf.index_select(...)``): cost proportional to the batch, fine.
- ``plan_kv_dtype_hint`` (medium): ``wrapper.plan(..., q_data_type, kv_data_type)`` given the
  same dtype twice, which makes the caller cast an FP8 cache before ``run()``.

Public API: :func:`scan_file`, :func:`scan_paths`, :func:`scan_source`, :class:`ScanFinding`,
:class:`ScanResult`, :class:`ScanError`.
"""

from __future__ import annotations

from fp8mla.scan.findings import (
    GATHERED_CAST,
    PLAN_KV_DTYPE_HINT,
    WHOLE_POOL_CAST,
    ScanFinding,
    ScanResult,
    SkippedFile,
)
from fp8mla.scan.scanner import scan_file, scan_paths, scan_source
from fp8mla.scan.source import UnparsableSource
from fp8mla.scan.walk import ScanError

__all__ = [
    "GATHERED_CAST",
    "PLAN_KV_DTYPE_HINT",
    "WHOLE_POOL_CAST",
    "ScanError",
    "ScanFinding",
    "ScanResult",
    "SkippedFile",
    "UnparsableSource",
    "scan_file",
    "scan_paths",
    "scan_source",
]
