"""GPU targets fp8mla plans for: backend, architecture, wavefront size, on-chip memory, FP8.

The presets cover every target the compile matrix (``fp8mla.tools.compile_matrix``) builds:
NVIDIA SM80 … SM120 and AMD CDNA2/3/4 and RDNA3, plus Triton's CPU interpreter, which the planner
treats as one more target with a table of its own. :func:`launch_target` maps a torch device to
one of them; nothing here touches CUDA at import time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch

KB = 1024


@dataclass(frozen=True)
class Target:
    """What the planner and the FP8 decoder need to know about one GPU architecture."""

    name: str  # "sm90", "gfx942"
    backend: Literal["cuda", "hip", "interpreter"]
    arch: int | str  # compute capability (90) or gfx name ("gfx942")
    warp_size: int  # 32, or 64 for CDNA wavefronts: num_warps counts these
    smem_per_block: int  # bytes of shared memory (LDS) one program may use
    smem_per_sm: int  # bytes per SM (CU/WGP), for programs resident at once
    native_fp8: bool  # OCP e4m3fn/e5m2 → f16 conversion instructions
    gpus: str = ""  # examples, for tables

    @property
    def is_hip(self) -> bool:
        return self.backend == "hip"

    @property
    def is_gpu(self) -> bool:
        return self.backend in ("cuda", "hip")

    @property
    def dependent_launch(self) -> bool:
        """Programmatic dependent launch (``griddepcontrol``, CUDA SM90 and later)."""
        return self.backend == "cuda" and isinstance(self.arch, int) and self.arch >= 90


def _cuda(cc: int, block_kb: int, sm_kb: int, gpus: str) -> Target:
    return Target(f"sm{cc}", "cuda", cc, 32, block_kb * KB, sm_kb * KB, cc >= 89, gpus)


def _hip(arch: str, wave: int, lds_kb: int, native_fp8: bool, gpus: str) -> Target:
    return Target(arch, "hip", arch, wave, lds_kb * KB, lds_kb * KB, native_fp8, gpus)


# Shared memory: CUDA programming guide, "technical specifications per compute capability"
# (opt-in maximum per block; 1 KB per block is reserved by the system, hence 163/99/227);
# AMD: LDS per workgroup (gfx950 has 160 KB per CU). native_fp8 means the OCP formats torch
# uses: gfx942's FP8 instructions decode only the FNUZ variants.
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _cuda(80, 163, 164, "A100, A800"),
        _cuda(86, 99, 100, "A10, A40, RTX A6000, RTX 3090"),
        _cuda(89, 99, 100, "L4, L40S, RTX 6000 Ada, RTX 4090"),
        _cuda(90, 227, 228, "H100, H200, H20"),
        _cuda(100, 227, 228, "B200, GB200"),
        _cuda(120, 99, 100, "RTX PRO 6000 Blackwell, RTX 5090"),
        _hip("gfx90a", 64, 64, False, "MI210, MI250X"),
        _hip("gfx942", 64, 64, False, "MI300X, MI325X"),
        _hip("gfx950", 64, 160, True, "MI350X, MI355X"),
        _hip("gfx1100", 32, 64, False, "RX 7900 XTX, Radeon PRO W7900"),
    )
}
# The architecture every launch configuration of the SM90/SM100 table was measured on.
MEASURED = TARGETS["sm90"]
# Triton's CPU interpreter (TRITON_INTERPRET=1): no shared-memory limit that matters, no FP8
# instructions, no Gluon.
INTERPRETER = Target("interpreter", "interpreter", "cpu", 32, 1 << 30, 1 << 30, False, "CPU")


def cuda_target(cc: int) -> Target:
    """Preset of compute capability ``cc`` (e.g. 89); an unlisted one borrows the preset of
    the nearest lower capability of its major version (SM87 → SM86, SM103 → SM100)."""
    exact = TARGETS.get(f"sm{cc}")
    if exact is not None:
        return exact
    known = sorted(t.arch for t in TARGETS.values() if t.backend == "cuda")
    same_major = [k for k in known if k // 10 == cc // 10 and k <= cc]
    lower = same_major or [k for k in known if k <= cc] or known[:1]
    base = TARGETS[f"sm{lower[-1]}"]
    return Target(
        f"sm{cc}", "cuda", cc, 32, base.smem_per_block, base.smem_per_sm, cc >= 89, base.gpus
    )


def hip_target(arch: str) -> Target:
    """Preset of gfx ``arch`` (``"gfx942:sramecc+:xnack-"`` works too); unlisted CDNA parts
    (gfx9*) get wave64 and 64 KB of LDS, other families wave32."""
    name = arch.split(":")[0]
    if name in TARGETS:
        return TARGETS[name]
    wave = 64 if name.startswith("gfx9") else 32
    return _hip(name, wave, 64, False, "")


def current_target(device: torch.device | str | None = None) -> Target:
    """The target of a CUDA/ROCm ``device`` (the current one when None), asked of torch
    when first called for that device (then cached), never at import."""
    dev = torch.device("cuda") if device is None else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"expected a CUDA/ROCm device, got {dev}")
    return _device_target(dev.index if dev.index is not None else torch.cuda.current_device())


def launch_target(device: torch.device, interpreted: bool) -> Target:
    """Where a launch on ``device`` runs: the interpreter (CPU tensors, or
    ``TRITON_INTERPRET=1``) or the device's architecture."""
    if interpreted or device.type != "cuda":
        return INTERPRETER
    return current_target(device)


@functools.lru_cache(maxsize=16)
def _device_target(index: int) -> Target:
    if torch.version.hip:
        props = torch.cuda.get_device_properties(index)
        return hip_target(getattr(props, "gcnArchName", "gfx942"))
    major, minor = torch.cuda.get_device_capability(index)
    return cuda_target(major * 10 + minor)
