"""Whether the installed Triton's Gluon can share a tile between the two CTAs of a cluster, as
FlashMLA's sparse FP8 decode does with distributed shared memory ("crossover": each CTA of a
pair converts half of every KV tile and both read all of it). Builds for ``sm_90`` on the CPU,
no GPU needed, with ``num_ctas=2``: a ``[128, 64]`` fp16 tile whose rows the register layout
splits between the two CTAs (``cga_layout=[[1, 0]]``), made whole in both CTAs

* ``store``: by a ``local_store`` into a shared layout both CTAs hold in full;
* ``convert``: by a ``convert_layout`` to a register layout both hold in full, then stored.

For each it prints whether the build succeeds (else the compiler's first error) and which
cluster instructions its PTX holds. Triton 3.6: neither builds. Triton 3.9: ``convert``
builds, reading the peer's half with ``ld.shared::cluster`` between cluster barriers;
``store`` builds with no access to the peer's shared memory at all. See
docs/design/sparse-pingpong16.md::

    python benchmarks/probe_cluster_exchange.py
"""

from __future__ import annotations

import os
import re
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon._runtime import GluonASTSource  # noqa: E402

SPLIT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[1, 0]]))
WHOLE = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[0, 0]]))
WHOLE_SMEM = gl.constexpr(
    gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2, cga_layout=[[0, 0]])
)


@gluon.jit
def share_tile(x, y, CONVERT: gl.constexpr):
    r = gl.arange(0, 128, layout=gl.SliceLayout(1, SPLIT))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, SPLIT))
    tile = gl.load(x + r[:, None] * 64 + c[None, :])
    if CONVERT:
        tile = gl.convert_layout(tile, WHOLE)
    smem = gl.allocate_shared_memory(gl.float16, [128, 64], WHOLE_SMEM)
    smem.store(tile)
    whole = smem.load(WHOLE)
    r2 = gl.arange(0, 128, layout=gl.SliceLayout(1, WHOLE))
    c2 = gl.arange(0, 64, layout=gl.SliceLayout(0, WHOLE))
    gl.store(y + r2[:, None] * 64 + c2[None, :], whole)


CLUSTER_OPS = (
    r"\b((?:ld|st)\.shared::cluster[\w.]*|st\.async[\w.:]*|mapa[\w.:]*|barrier\.cluster[\w.]*)"
)


def build(convert: bool) -> str:
    src = GluonASTSource(
        fn=share_tile,
        signature={"x": "*fp16", "y": "*fp16", "CONVERT": "constexpr"},
        constexprs={"CONVERT": convert},
        attrs={},
    )
    with tempfile.TemporaryFile(mode="w+") as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)  # MLIR reports its errors on the process's stderr
        try:
            kernel = triton.compile(
                src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_ctas=2)
            )
            failure = None
        except Exception as e:  # the compiler's own refusal is the result
            failure = e
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        if failure is not None:
            log.seek(0)
            errors = [line for line in log.read().splitlines() if "error:" in line]
            reason = errors[0].split("error:", 1)[1] if errors else repr(failure)
            return "fails: " + reason.strip()[:200]
    ops = sorted(set(re.findall(CLUSTER_OPS, kernel.asm["ptx"])))
    return "builds; cluster instructions: " + (", ".join(ops) or "none")


def main() -> int:
    print(f"Triton {triton.__version__}, sm_90, num_ctas=2")
    for name, convert in (("store", False), ("convert", True)):
        print(f"{name}: {build(convert)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
