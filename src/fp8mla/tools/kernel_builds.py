"""Ahead-of-time builds of fp8mla's kernels for any GPU target, on a machine without one.

``triton.compile`` lowers a kernel for a ``GPUTarget`` entirely on the CPU (LLVM, then ptxas for
NVIDIA or the bundled LLD for AMD). This module builds one kernel variant and reads back what
decides whether it launches and how fast it can be: registers, spills and shared memory.

It must run in a process where ``TRITON_INTERPRET`` was unset when the kernel modules were
imported: under the interpreter ``@triton.jit`` yields functions that cannot be compiled.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

from fp8mla.attention.targets import Target

# Pointer element types the kernels' arguments take, by name, for each build (Triton names).
TORCH_TO_TRITON = {
    "float8_e4m3fn": "fp8e4nv",
    "float8_e5m2": "fp8e5",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float32": "fp32",
    "int32": "i32",
    "uint8": "u8",
    "uint16": "u16",
}
# the strides of a token-group scale array: 4 floats a slot ([pages, page_size, 4]), or 164 a
# row of the packed sparse cache, so not multiples of 16 at run time (Build.unaligned)
SCALE_ARR_STRIDES = ("stride_sa_p", "stride_sa_s")
FLOAT_ARGS = ("sm_scale_log2", "ckv_scale_val", "kpe_scale_val", "ckv_scale", "kpe_scale",
              "q_scale_val", "scale_val")  # fmt: skip


@dataclass(frozen=True)
class Build:
    """One kernel variant to compile: the function's module path, argument types, constexprs
    and launch options."""

    kernel: str  # "module:function", e.g. "fp8mla.kernels.portable.merge:mla_merge_kernel"
    pointers: tuple[tuple[str, str], ...]  # (argument, Triton element type)
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int
    num_stages: int | None = None  # None: Triton's default, as a launch that passes none
    maxnreg: int | None = None  # register cap per thread (CUDA), as KernelConfig.max_registers
    # arguments declared with a default of None that this build's launch passes (as i32, or
    # fp32 for FLOAT_ARGS): e.g. a Gluon kernel's FP8-query scale arguments
    passed: tuple[str, ...] = ()
    # stride arguments whose run-time values are not multiples of 16, so Triton does not
    # specialize them (e.g. the packed sparse cache's scales, 164 floats a row): compiled
    # without the divisibility the launchers' other strides have
    unaligned: tuple[str, ...] = ()

    def function(self):
        import importlib

        module, name = self.kernel.split(":")
        return getattr(importlib.import_module(module), name)


@dataclass
class Resources:
    """What one build uses, per thread/lane (registers, spills) and per program (smem)."""

    ok: bool
    regs: int = 0  # NVIDIA registers, AMD VGPRs (arch + accumulation)
    spill_bytes: int = 0  # NVIDIA spill stores, AMD 4 × spilled VGPRs
    stack_bytes: int = 0  # NVIDIA stack frame, AMD scratch per lane
    smem_bytes: int = 0
    error: str = ""
    extra: dict = field(default_factory=dict)


def _constexpr_value(value):
    import triton.language as tl

    if isinstance(value, str) and value.startswith("tl."):
        return getattr(tl, value[3:])
    return value


def compile_build(build: Build, target: Target):
    """``triton.compile`` of ``build`` for ``target``; returns the CompiledKernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = build.function()
    if not isinstance(fn, triton.runtime.JITFunction):
        raise RuntimeError(f"{build.kernel} is interpreted: import it with TRITON_INTERPRET unset")
    ptrs = dict(build.pointers)
    consts = {k: _constexpr_value(v) for k, v in build.constexprs}
    for p in fn.params:  # constexprs left to their defaults, as a launch leaves them (and
        # optional pointers left None: Triton makes a None argument a constexpr)
        unset = p.name not in consts and p.name not in ptrs and p.has_default
        unset = unset and p.name not in build.passed
        if unset and (p.is_constexpr or p.default is None):
            consts[p.name] = p.default
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name in ptrs:
            sig[name] = "*" + ptrs[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in FLOAT_ARGS:
            sig[name] = "fp32"
        elif name.startswith("nan_row"):  # offsets between allocations: 64-bit, 16 | them
            sig[name] = "i64"
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "i32"
            # the launchers' strides are multiples of 16, but those the build names
            if name.startswith("stride") and name not in build.unaligned:
                attrs[(i,)] = [["tt.divisibility", 16]]
    if getattr(fn, "is_gluon", lambda: False)():  # Gluon kernels have their own front end
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    gpu = GPUTarget(target.backend, target.arch, target.warp_size)
    options = dict(num_warps=build.num_warps)
    if build.num_stages is not None:
        options["num_stages"] = build.num_stages
    if build.maxnreg is not None and target.backend == "cuda":
        options["maxnreg"] = build.maxnreg
    return triton.compile(src, target=gpu, options=options)


def _ptxas_report(ptx: str, cc: int) -> dict[str, int]:
    """Registers, spill stores and stack frame from ``ptxas -v`` on the kernel's PTX."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        log = subprocess.run(
            [
                get_ptxas(cc).path,
                "-v",
                "--regAllocOptLevel=2",
                f"--gpu-name={sm_arch_from_capability(cc)}",
                src,
                "-o",
                src + ".o",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr

    def num(pattern: str) -> int:
        m = re.search(pattern, log)
        return int(m.group(1)) if m else 0

    return dict(
        regs=num(r"Used (\d+) registers"),
        spill=num(r"(\d+) bytes spill stores"),
        stack=num(r"(\d+) bytes stack frame"),
        # ptxas C7515: it waits after every wgmma instead of pipelining them (slow, not wrong)
        wgmma_serialized=int("wgmma.mma_async instructions are serialized" in log),
    )


def _amdgcn_report(asm: str) -> dict[str, int]:
    """VGPRs, spills and scratch from the kernel descriptor metadata in the AMDGCN text."""

    def num(key: str) -> int:
        m = re.search(rf"^\s*\.{key}:\s+(\d+)", asm, re.M)
        return int(m.group(1)) if m else 0

    return dict(
        regs=num("vgpr_count"),
        spill=4 * num("vgpr_spill_count"),
        stack=num("private_segment_fixed_size"),
        sgpr=num("sgpr_count"),
        lds_static=num("group_segment_fixed_size"),
    )


def _first_error(e: Exception) -> str:
    """The informative line of a compiler exception: ptxas's first ``error :`` line, else
    the last line (Triton front-end errors end with the Python exception)."""
    text = str(e).strip()
    m = re.search(r"^ptxas[^\n]*error\s*:\s*(.+)", text, re.M)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = m.group(1) if m else (lines[-1] if lines else type(e).__name__)
    return line[:200]


def measure(build: Build, target: Target) -> Resources:
    """Compile ``build`` for ``target`` and read its resource use; a compile error is
    reported in ``Resources.error``, not raised."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # Triton prints all PTX on ptxas errors
            k = compile_build(build, target)
        if target.is_hip:
            rep = _amdgcn_report(k.asm["amdgcn"])
            smem = k.metadata.shared + rep.pop("lds_static")
        else:
            rep = _ptxas_report(k.asm["ptx"], int(target.arch))
            smem = k.metadata.shared
    except Exception as e:  # noqa: BLE001 -- any compiler failure is a result here
        return Resources(ok=False, error=_first_error(e))
    regs, spill, stack = rep.pop("regs"), rep.pop("spill"), rep.pop("stack")
    return Resources(True, regs, spill, stack, smem, extra=rep)
