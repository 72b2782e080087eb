"""``fp8mla doctor``: read a torch.profiler trace of a decode loop and say what to change.

The doctor streams a Chrome-trace JSON (``export_chrome_trace``, ``tensorboard_trace_handler``,
engine-written ``*.trace.json.gz``), links each kernel to the op and Python frame that launched
it, segments decode steps, and reports the costly patterns, chief among them a
**pool-proportional cast**: the whole FP8 KV pool converted to BF16 once per layer per step.

Pure standard library: importing it needs neither torch nor triton.

>>> from fp8mla.doctor import diagnose
>>> report = diagnose("trace.json.gz")
>>> report["findings"][0]["kind"]
'pool_proportional_cast'
"""

from __future__ import annotations

from fp8mla.doctor.analyze import SCHEMA_VERSION, diagnose
from fp8mla.doctor.errors import DamagedTrace, TraceError
from fp8mla.doctor.finding import Finding
from fp8mla.doctor.floor import FloorSpec
from fp8mla.doctor.report_html import render_html
from fp8mla.doctor.report_text import format_text

__all__ = [
    "SCHEMA_VERSION",
    "DamagedTrace",
    "Finding",
    "FloorSpec",
    "TraceError",
    "diagnose",
    "format_text",
    "render_html",
]
