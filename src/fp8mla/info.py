"""What fp8mla runs on: versions, the device and how Triton executes kernels."""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass

import fp8mla
from fp8mla.runtime import interpreted


@dataclass
class Info:
    fp8mla: str
    python: str
    torch: str | None
    triton: str | None
    device: str
    compute_capability: str | None
    sm_count: int | None
    triton_mode: str  # "compiled", "interpreted" or "unavailable"
    fp8_native: bool | None  # the GPU has FP8 conversion instructions (SM89+)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def format_text(self) -> str:
        width = max(len(k) for k in asdict(self))
        return "\n".join(
            f"{k:<{width}}  {'-' if v is None else v}" for k, v in asdict(self).items()
        )


def collect() -> Info:
    try:
        import torch

        torch_version: str | None = torch.__version__
        has_cuda = torch.cuda.is_available()
    except ImportError:
        torch_version, has_cuda = None, False
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    device, cc, sms, native = "cpu", None, None, None
    if has_cuda:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        device = props.name
        cc = f"{props.major}.{props.minor}"
        sms = props.multi_processor_count
        native = (props.major, props.minor) >= (8, 9)
    if triton_version is None:
        mode = "unavailable"
    elif interpreted():
        mode = "interpreted"
    elif has_cuda:
        mode = "compiled"
    else:
        mode = "unavailable (no GPU; set TRITON_INTERPRET=1 to interpret on the CPU)"
    return Info(
        fp8mla=fp8mla.__version__,
        python=platform.python_version(),
        torch=torch_version,
        triton=triton_version,
        device=device,
        compute_capability=cc,
        sm_count=sms,
        triton_mode=mode,
        fp8_native=native,
    )
