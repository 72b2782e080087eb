"""GPU presets: datasheet HBM bandwidth, memory, and the measured rates we know of.

The floor uses the datasheet bandwidth unless ``--bandwidth`` is given. Datasheet numbers are peak
DRAM bandwidth; a device-to-device copy reaches less (4.27 TB/s of 4.8 on an H200, measured with
``triton.testing.do_bench``, see the project's TARGETS.md), so a floor at the datasheet rate is a
true lower bound and one at the measured copy rate a tighter, achievable one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """One GPU: bandwidths in TB/s (10^12 bytes/s), memory in GB (10^9 bytes)."""

    name: str
    datasheet_tbps: float
    memory_gb: float
    copy_tbps_measured: float | None = None  # device-to-device copy, read + write
    cast_tbps_measured: float | None = None  # torch ``pool.to(bfloat16)`` of an FP8 pool
    source: str = ""


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec("H100 SXM", 3.35, 80.0, source="NVIDIA H100 datasheet (SXM5, HBM3)"),
    "h200": GpuSpec(
        "H200",
        4.8,
        141.0,
        copy_tbps_measured=4.27,
        cast_tbps_measured=1.03,
        source="NVIDIA H200 datasheet (SXM, HBM3e); measured rates: fp8mla TARGETS.md",
    ),
    "b200": GpuSpec("B200", 8.0, 180.0, source="NVIDIA HGX B200 datasheet (per GPU, HBM3e)"),
    "rtx-pro-6000": GpuSpec(
        "RTX PRO 6000 Blackwell",
        1.79,
        96.0,
        source="NVIDIA RTX PRO 6000 Blackwell datasheet (1,792 GB/s GDDR7)",
    ),
}

_ALIASES: dict[str, str] = {
    "h100": "h100",
    "h100-sxm": "h100",
    "h100sxm": "h100",
    "h200": "h200",
    "b200": "b200",
    "rtx-pro-6000": "rtx-pro-6000",
    "rtxpro6000": "rtx-pro-6000",
    "rtx-pro-6000-blackwell": "rtx-pro-6000",
    "pro6000": "rtx-pro-6000",
}


def lookup_gpu(name: str) -> GpuSpec:
    """The preset for ``name`` (case and ``_``/space insensitive); ``ValueError`` if unknown."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    if key not in _ALIASES:
        raise ValueError(f"unknown GPU {name!r}: presets are {', '.join(GPUS)}")
    return GPUS[_ALIASES[key]]
