"""Peak memory bandwidth of common accelerators, matched by the name a trace records.

Used only as an upper bound ("even at peak bandwidth, the attention of one layer could not read
more than X bytes"), so an unknown device gets a generous 8 TB/s.
"""

from __future__ import annotations

# (substring of the lower-cased device name, TB/s), most specific first.
_PEAK_TBPS: tuple[tuple[str, float], ...] = (
    ("gb200", 8.0),
    ("b200", 8.0),
    ("b300", 8.0),
    ("gh200", 4.0),
    ("h200", 4.8),
    ("h20", 4.0),
    ("h100 pcie", 2.0),
    ("h100", 3.35),
    ("h800", 3.35),
    ("a100-sxm4-80gb", 2.04),
    ("a100 80gb", 1.94),
    ("a100", 1.56),
    ("a800", 2.04),
    ("l40s", 0.864),
    ("l40", 0.864),
    ("l4", 0.3),
    ("a10", 0.6),
    ("v100", 0.9),
    ("rtx pro 6000", 1.79),
    ("4090", 1.0),
    ("mi355", 8.0),
    ("mi325", 6.0),
    ("mi300", 5.3),
    ("mi250", 3.2),
    ("mi210", 1.6),
)
UNKNOWN_TBPS = 8.0


def peak_bandwidth(device: str | None) -> tuple[float, str]:
    """(TB/s, where the number comes from) for a device name such as ``NVIDIA H200``."""
    if device:
        key = device.lower()
        for needle, tbps in _PEAK_TBPS:
            if needle in key:
                return tbps, f"the {device}'s {tbps:g} TB/s peak"
    return UNKNOWN_TBPS, f"a generous {UNKNOWN_TBPS:g} TB/s (device unknown)"
