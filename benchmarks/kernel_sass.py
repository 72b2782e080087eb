"""The compile matrix's builds whose id contains a pattern, built on a CPU with the installed
Triton: their registers, spills and shared memory, and with ``--loops`` the loops of their SASS
(each backward branch's span, so a warp-specialized kernel's producer and consumer loops come
out apart) with each loop's instruction count and commonest instructions, after the
partitions' register changes (``USETMAXREG``)::

    PYTHONPATH=src python benchmarks/kernel_sass.py sm90-sparse-packed-64x32-pingpong
    PYTHONPATH=.venv/triton-3.6:src python benchmarks/kernel_sass.py \\
        pingpong-w4s1-split+group --loops --sass /tmp/sass

A build id is the compile matrix's (``TARGET-KERNEL-VARIANT``, spaces as dashes); ``--targets``
limits the targets searched (default: sm90). Put another Triton first on ``PYTHONPATH`` to
build with it (the GPU machine's 3.6 is ``.venv/triton-3.6`` after ``make test``). The SASS
comes from the ``cuobjdump`` that Triton carries. Instruction counts are static: a loop's
length a thread and iteration, not what ran.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections import Counter

from ncu_stalls import Instruction, loops

# "/*0140*/  @!P0 BRA 0x130 ;" -> address, instruction (predicate included)
_LINE = re.compile(r"^\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;")


def instructions(sass: str) -> list[Instruction]:
    """The instructions of a ``cuobjdump -sass`` listing in address order, as
    ``ncu_stalls.py`` reads them from a profile's source page (no samples)."""
    out = []
    for line in sass.splitlines():
        m = _LINE.match(line)
        if m:
            out.append(Instruction(int(m.group(1), 16), m.group(2), 0, 0))
    return out


def partitions(code: list[Instruction]) -> list[Instruction]:
    """The register changes of a warp-specialized kernel's partitions (``USETMAXREG``)."""
    return [ins for ins in code if "USETMAXREG" in ins.source]


def report(sass: str, min_count: int, top: int) -> str:
    """The partitions' register changes and the innermost loops (``ncu_stalls.loops``) of
    ``min_count`` instructions or more, in address order, each loop with its ``top``
    commonest instructions (without modifiers)."""
    code = instructions(sass)
    rows = [(ins.address, f"{ins.address:#07x} {ins.source}") for ins in partitions(code)]
    for first, last in loops(code):
        part = code[first : last + 1]
        if len(part) < min_count:
            continue
        ops = Counter(ins.opcode.split(".")[0] for ins in part)
        common = ", ".join(f"{k} {v}" for k, v in ops.most_common(top))
        start, end = part[0].address, part[-1].address
        rows.append((start, f"loop {start:#07x}-{end:#07x}: {len(part)} instructions; {common}"))
    return "\n".join("  " + text for _, text in sorted(rows))


def cuobjdump() -> str:
    """Triton's own ``cuobjdump``, else one on ``PATH``."""
    import triton

    here = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return here if os.path.exists(here) else (shutil.which("cuobjdump") or "cuobjdump")


def sass_of(job) -> str:
    from fp8mla.attention.targets import TARGETS
    from fp8mla.tools.kernel_builds import compile_build

    kernel = compile_build(job.build, TARGETS[job.target])
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        return subprocess.run(
            [cuobjdump(), "-sass", f.name], capture_output=True, text=True, check=True
        ).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pattern", help="a substring of the build ids to take")
    ap.add_argument("--targets", default="sm90", help="comma-separated targets (default: sm90)")
    ap.add_argument("--loops", action="store_true", help="also each build's SASS loops")
    ap.add_argument("--sass", metavar="DIR", help="write each build's SASS to DIR/<id>.sass")
    ap.add_argument("--min-loop", type=int, default=60, help="shortest loop shown (default: 60)")
    ap.add_argument("--top", type=int, default=8, help="instructions named a loop (default: 8)")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)  # the kernels must import compilable
    import triton

    from fp8mla.tools.compile_matrix import all_jobs, run_job

    jobs = [j for j in all_jobs(args.targets.split(",")) if args.pattern in j.id]
    if not jobs:
        print(f"no build id contains {args.pattern!r}", file=sys.stderr)
        return 1
    print(f"Triton {triton.__version__}: {len(jobs)} builds")
    if args.sass:
        os.makedirs(args.sass, exist_ok=True)
    for job in jobs:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore")
            row = run_job(job)
        print(f"{job.id}: {row.regs} registers, {row.spill_bytes} B spilled, "
              f"{row.smem_bytes} B shared{'' if row.ok else ' -- ' + row.reason}")  # fmt: skip
        if not (args.loops or args.sass) or row.reason.startswith("compile error"):
            continue
        sass = sass_of(job)
        if args.sass:
            with open(os.path.join(args.sass, f"{job.id}.sass"), "w") as f:
                f.write(sass)
        if args.loops:
            print(report(sass, args.min_loop, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
