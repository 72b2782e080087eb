"""Building blocks of :mod:`fp8mla.doctor.synth`: kernel names, the trace spec, and the event
writer that keeps the CPU and GPU clocks and the correlation/External id counters."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ADD_KERNEL",
    "ARGMAX_KERNEL",
    "CAST_KERNEL",
    "GEMM_KERNEL",
    "NORM_KERNEL",
    "EventWriter",
    "SynthSpec",
]

CAST_KERNEL = (
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() "
    "const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>, 4, TrivialOffsetCalculator<1, "
    "unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>"
    ", at::native::memory::StoreWithCast<1> >(int, at::native::direct_copy_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() "
    "const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>, TrivialOffsetCalculator<1, "
    "unsigned int>, TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>"
    ", at::native::memory::StoreWithCast<1>)"
)
NORM_KERNEL = (
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<"
    "c10::BFloat16, float, true>(int, float, c10::BFloat16 const*, c10::BFloat16 "
    "const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)"
)
GEMM_KERNEL = "nvjet_sm90_tst_192x8_64x8_2x1_v_bz_NNT"
ADD_KERNEL = (
    "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<"
    "c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<"
    "c10::BFloat16>, std::array<char*, 3ul>)"
)
ARGMAX_KERNEL = (
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, "
    "at::native::ArgMaxOps<float>, unsigned int, long, 4, 4> >(at::native::"
    "ReduceOp<c10::BFloat16, at::native::ArgMaxOps<float>, unsigned int, long, 4, "
    "4>)"
)


@dataclass(frozen=True)
class SynthSpec:
    """What the synthetic decode loop looks like and how its trace was recorded."""

    steps: int = 3
    layers: int = 4
    pool_slots: int = 400_000
    width: int = 576
    active_tokens: int = 3000
    cast: str = "full"  # "full" | "gathered" | "none"
    markers: bool = True
    shapes: bool = True
    stacks: bool = True
    cuda_graph: bool = False
    nanoseconds: bool = False
    legacy: bool = False  # torch 1.x: capitalized categories, ext = correlation, "Call stack"
    cpu_only: bool = False
    device: str = "NVIDIA H200"
    python_noise: int = 0  # extra python_function events per layer (bulk for benchmarks)
    cast_tbps: float = 1.0  # achieved bandwidth of the cast kernel
    kv_dtype: str = "float8_e4m3fn"  # the pool's dtype: "float8_e4m3fn" | "float8_e5m2"
    layout: str = "mla"  # "mla": one [slots, 1, 576] latent pool; "mha": K and V pools
    kv_heads: int = 8  # MHA: KV heads of each pool row ([slots, kv_heads, head_dim])
    head_dim: int = 128  # MHA: values per head
    attention_us: float = 33.0  # device time of one layer's attention kernels

    @property
    def kv_type(self) -> str:
        """The pool dtype as an op's ``Input type`` spells it."""
        return {"float8_e4m3fn": "c10::Float8_e4m3fn", "float8_e5m2": "c10::Float8_e5m2"}[
            self.kv_dtype
        ]

    @property
    def row(self) -> list[int]:
        """One pool row's trailing dims: ``[1, width]`` (MLA) or ``[kv_heads, head_dim]``."""
        return [1, self.width] if self.layout == "mla" else [self.kv_heads, self.head_dim]

    @property
    def pools(self) -> int:
        """Pools cast per layer: one latent pool (MLA), or K and V (MHA)."""
        return 1 if self.layout == "mla" else 2


class EventWriter:
    """Emits events as JSON text, keeping the CPU and GPU clocks and the id counters."""

    def __init__(self, spec: SynthSpec) -> None:
        self.s = spec
        self.cpu = 1_000_000.0
        self.gpu = self.cpu
        self.corr = 1000
        self.ext = 1
        self.pyid = 1
        self.out: list[str] = []
        self.pid, self.tid = 4242, 4242
        self.cat = (
            {"op": "Operator", "rt": "Runtime", "k": "Kernel", "m": "Memcpy"}
            if spec.legacy
            else {"op": "cpu_op", "rt": "cuda_runtime", "k": "kernel", "m": "gpu_memcpy"}
        )

    def _t(self, us: float) -> Any:
        if self.s.nanoseconds:
            return int(us * 1000)
        return int(us) if self.s.legacy else round(us, 3)

    def event(
        self,
        cat: str,
        name: str,
        ts: float,
        dur: float,
        args: dict[str, Any],
        pid: Any = None,
        tid: Any = None,
    ) -> None:
        """Append one complete (``ph: X``) event."""
        self.out.append(
            json.dumps(
                {
                    "ph": "X",
                    "cat": cat,
                    "name": name,
                    "pid": self.pid if pid is None else pid,
                    "tid": self.tid if tid is None else tid,
                    "ts": self._t(ts),
                    "dur": self._t(dur),
                    "args": args,
                }
            )
        )

    def frame(self, name: str, ts: float, dur: float, parent: int | None) -> int:
        """A Python frame of known duration; returns its id."""
        pyid = self.pyid
        self.pyid += 1
        if self.s.stacks and not self.s.legacy:
            self.event(
                "python_function", name, ts, dur, {"Python parent id": parent, "Python id": pyid}
            )
        return pyid

    def open_frame(self, name: str, parent: int | None) -> tuple[int, str, float, int | None]:
        """A Python frame that ends later (:meth:`close_frame`); events need not be in order."""
        pyid = self.pyid
        self.pyid += 1
        return pyid, name, self.cpu, parent

    def close_frame(self, handle: tuple[int, str, float, int | None]) -> None:
        """Emit a frame opened with :meth:`open_frame`, ending now."""
        pyid, name, start, parent = handle
        if self.s.stacks and not self.s.legacy:
            self.event(
                "python_function",
                name,
                start,
                self.cpu - start,
                {"Python parent id": parent, "Python id": pyid},
            )

    def op(
        self,
        name: str,
        dur: float,
        dims: list[Any],
        types: list[Any],
        concrete: list[Any] | None = None,
        stack: str = "",
    ) -> int:
        """Emit a CPU op at the CPU clock; returns its External id."""
        ext = self.ext
        self.ext += 1
        args: dict[str, Any] = {"External id": ext}
        if self.s.shapes:
            args["Input dims" if self.s.legacy else "Input Dims"] = dims
            args["Input type"] = types
            if concrete is not None and not self.s.legacy:
                args["Concrete Inputs"] = concrete
        if self.s.legacy and self.s.stacks and stack:
            args["Call stack"] = stack
        self.event(self.cat["op"], name, self.cpu, dur, args)
        return ext

    def launch(
        self,
        kernel: str,
        dur: float,
        grid: list[int],
        ext: int | None,
        api: str = "cudaLaunchKernel",
    ) -> None:
        """Emit a runtime launch call and its kernel, queued on the GPU clock."""
        corr = self.corr
        self.corr += 1
        call_ts = self.cpu + 1.0
        kernel_ext = corr if self.s.legacy else ext
        rt_args: dict[str, Any] = {"correlation": corr}
        if kernel_ext is not None:
            rt_args["External id"] = kernel_ext
        self.event(self.cat["rt"], api, call_ts, 4.0, rt_args)
        start = max(self.gpu, call_ts + 5.0)
        k_args: dict[str, Any] = {
            "device": 0,
            "stream": 7,
            "correlation": corr,
            "grid": grid,
            "block": [128, 1, 1],
        }
        if kernel_ext is not None:
            k_args["External id"] = kernel_ext
        self.event(self.cat["k"], kernel, start, dur, k_args, pid=0, tid=7)
        self.gpu = start + dur
