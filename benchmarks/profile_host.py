"""Where the host time of eager ``run()`` goes (GPU), on the HOST case of ``fp8mla bench``
(1 × 32 × 4096 FP8 decode): the whole call, then each layer under it down to the bare
launches, beside the machine's own launch floors (an empty Triton kernel, a tiny torch op),
and a cProfile of the whole call. Every row is host time per call over back-to-back calls,
read before synchronizing.

    python benchmarks/profile_host.py [--calls 200] [--cprofile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections.abc import Callable

import torch
import triton

from fp8mla.attention import native
from fp8mla.bench import impls as I
from fp8mla.bench.cases import HOST_CASE
from fp8mla.bench.inputs import build_inputs
from fp8mla.bench.measure import time_host


@triton.jit
def _empty(x_ptr):
    pass


@triton.jit
def _empty45(
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9,
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9,
    e0, e1, e2, e3, e4,
):  # fmt: skip
    pass


def per_call(fn: Callable[[], object], calls: int) -> float:
    """Median over 5 rounds of host µs per call of ``calls`` back-to-back calls."""
    return time_host(fn, calls).us_median


def _direct(launcher, kernel, ordered: list) -> Callable[[], None]:
    """A bare call of a compiled kernel with its arguments already in order."""
    g0, g1, g2 = launcher.grid
    stream = torch.cuda.current_stream().cuda_stream
    fn, meta, run = kernel.function, kernel.packed_metadata, kernel.run
    return lambda: run(g0, g1, g2, stream, fn, meta, None, None, None, *ordered)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--cprofile", action="store_true")
    args = ap.parse_args()
    dev = torch.device("cuda")
    inp = build_inputs(HOST_CASE, dev)
    run = I.fp8mla_direct(inp)
    run()
    torch.cuda.synchronize()
    w = run.__closure__  # the wrapper inside the bench runner
    wrapper = next(c.cell_contents for c in w if hasattr(c.cell_contents, "_plan"))
    launch = wrapper._launch
    ckv, kpe = inp.paged()
    out = torch.empty_like(inp.q_nope)
    s = inp.scale
    st = wrapper._plan
    rows: list[tuple[str, float]] = []

    def add(name: str, fn: Callable[[], object]) -> None:
        rows.append((name, per_call(fn, args.calls)))
        print(f"{name:<52} {rows[-1][1]:8.1f} us", flush=True)

    add("wrapper.run() (bench HOST case)", run)
    stream = torch.cuda.current_stream().cuda_stream
    fast = wrapper._fast[0]
    if fast:
        add("  fast_run (checks, fills, both launches, in C)", lambda: wrapper._fast_run(
            fast, stream, inp.q_nope, inp.q_pe, ckv, kpe, out, None, s, s))  # fmt: skip
        mod, accessor = native.module(), native.fields_module()
        for label, cap in (
            ("C++ accessor", accessor and accessor.fields),
            ("Python methods", None),
        ):
            if label == "C++ accessor" and cap is None:
                print("  no C++ accessor (csrc/tensor_fields.cpp could not be built)")
                continue
            mod.set_fields(cap)
            add(f"  fast_check (checks and fills), tensors by {label}", lambda: mod.fast_check(
                fast, stream, inp.q_nope, inp.q_pe, ckv, kpe, out, None, s, s))  # fmt: skip
        mod.set_fields(accessor and accessor.fields)
    else:
        print("  no C path for this call (attention/native.py unavailable or not bindable)")
    wrapper._fast = [False] * 4  # the Python path from here on
    add("wrapper.run(), Python path, bound launches", run)
    add("  check_run (validation, scales)", lambda: st.check_run(
        inp.q_nope, inp.q_pe, ckv, kpe, s, s, None))  # fmt: skip
    scales = st.check_run(inp.q_nope, inp.q_pe, ckv, kpe, s, s, None)
    add("  AttentionLaunch.__call__ (args + 2 launches)", lambda: launch(
        inp.q_nope, inp.q_pe, ckv, kpe, out, None, scales))  # fmt: skip
    # the bound launch (attention/native.py): its arguments, then the bare call
    sent: list[tuple] = []
    bound = launch._native
    for both, entry in bound.items():
        if entry is not None:
            real = entry[2]
            bound[both] = (*entry[:2], lambda *a, _r=real: sent.append(a) or _r(*a))
    launch(inp.q_nope, inp.q_pe, ckv, kpe, out, None, scales)
    for both, entry in bound.items():
        if entry is not None:
            bound[both] = (*entry[:2], native.launcher())
    if sent:
        add("    native launch (both kernels, bound)", lambda a=sent[0]: native.launcher()(*a))
    else:
        print("    no bound launch (attention/native.py unavailable or not bindable)")
    launch._native = {}  # Triton's launcher from here on (nothing is bound again below)
    launch._bind_native = lambda both: None
    add("wrapper.run(), Triton's launcher", run)
    add("  AttentionLaunch.__call__, Triton's launcher", lambda: launch(
        inp.q_nope, inp.q_pe, ckv, kpe, out, None, scales))  # fmt: skip
    # capture the positional arguments the launch binds, to time the bare compiled kernels
    seen: dict[str, tuple] = {}
    for name, kl in (("attention", launch.kernel), ("merge", launch.merge)):
        if kl is None:
            continue

        def spy(ordered, key, _n=name, _o=kl.launch_direct):
            seen[_n] = (ordered, key)
            return _o(ordered, key)

        kl.launch_direct = spy
    launch(inp.q_nope, inp.q_pe, ckv, kpe, out, None, scales)
    for name, kl in (("attention", launch.kernel), ("merge", launch.merge)):
        if kl is None:
            continue
        del kl.launch_direct
        if name not in seen:
            print(f"    {name}: no direct launch (Triton's path every call)")
            continue
        ordered, key = seen[name]
        add(f"    {name}: KernelLauncher.launch_direct", lambda kl=kl, o=ordered, k=key:
            kl.launch_direct(o, k))  # fmt: skip
        k = kl._compiled[key]
        md = k.metadata
        print(f"      {name}: {len(kl.names)} args, global_scratch "
              f"{getattr(md, 'global_scratch_size', '?')} B, profile_scratch "
              f"{getattr(md, 'profile_scratch_size', '?')} B, grid {kl.grid}")  # fmt: skip
        add(f"    {name}: compiled kernel .run() alone", _direct(kl, k, ordered))
    x = torch.zeros(16, device=dev)
    add("floor: torch x.add_(1)", lambda: x.add_(1))
    add("floor: torch.empty(32*512 bf16)", lambda: torch.empty(32, 512, dtype=torch.bfloat16,
                                                                device=dev))  # fmt: skip
    _empty[(1,)](x)
    add("floor: empty Triton kernel, 1 arg, Triton path", lambda: _empty[(1,)](x))
    k1 = _empty[(1,)](x)
    add("floor: empty Triton kernel, 1 arg, .run()", lambda: k1.run(
        1, 1, 1, stream, k1.function, k1.packed_metadata, None, None, None, x))  # fmt: skip
    b1 = native.bind(k1, (1, 1, 1), ["x_ptr"], {}, ("x_ptr",))
    if b1 is not None:
        go = native.launcher()
        add("floor: empty Triton kernel, 1 arg, native launch", lambda: go(
            stream, b1, [x.data_ptr()], None, None))  # fmt: skip
    a45 = [x] * 10 + [7] * 35
    k45 = _empty45[(1,)](*a45)
    add("floor: empty Triton kernel, 10 ptr + 35 int, .run()", lambda: k45.run(
        1, 1, 1, stream, k45.function, k45.packed_metadata, None, None, None, *a45))  # fmt: skip
    launch._native = bound
    del launch._bind_native
    wrapper._fast = [fast, None, None, None]
    if args.cprofile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            run()
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(16)
    print("\nhost us per call")
    for name, us in rows:
        print(f"{name:<52} {us:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
