"""Every compile-matrix build of one source revision, with its resources and a hash of its
code, for comparing revisions on a CPU (no GPU): a change meant to keep the kernels as they are
(a move, a rename, comments) should leave every build's registers, spills, shared memory and
code hash unchanged.

    PYTHONPATH=<revision>/src python benchmarks/build_fingerprint.py OUT.json [--targets sm90,sm80]
    python benchmarks/build_fingerprint.py --compare BEFORE.json AFTER.json

The hash covers the kernel's PTX entry function (NVIDIA) or AMDGCN text (AMD) without debug
information, source locations and comments, with the kernel's own name replaced, so renames
and moved files do not change it. Builds are matched by their position in the matrix (the
job order is the registry's and the planner's, and a rename changes the job ids).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import multiprocessing
import os
import re
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor


def code_hash(text: str, name: str) -> str:
    """Hash of a build's code without names, locations, debug labels and sections."""
    if ".entry" in text:  # PTX: the entry function's body
        text = text[text.index(".entry") :]
        if "// -- End function" in text:
            text = text[: text.index("// -- End function")]
        text = re.sub(r"//.*$", "", text, flags=re.M)
    else:  # AMDGCN: up to the debug and metadata sections
        for stop in ("\t.section\t.debug", "\t.section\t.AMDGPU.csdata", ".amdgpu_metadata"):
            if stop in text:
                text = text[: text.index(stop)]
        text = re.sub(r";.*$", "", text, flags=re.M)
    text = re.sub(r"^\s*\.(loc|file)\b.*$", "", text, flags=re.M)
    # PTX's debug scope labels ($L__tmpN, marking where an inlined function begins and ends):
    # a helper function split out moves them without changing an instruction
    text = re.sub(r"^\$L__tmp\d+:\s*$", "", text, flags=re.M)
    text = re.sub(r"\$L__tmp\d+", "$L__tmp", text)
    text = text.replace(name, "KERNEL")
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r"\n\s*\n+", "\n", text)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def fingerprint(job) -> dict:
    """One job built: its resources and code hash."""
    from fp8mla.attention.targets import TARGETS
    from fp8mla.tools.kernel_builds import compile_build, measure

    target = TARGETS[job.target]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        res = measure(job.build, target)
        digest = ""
        if res.ok:
            with contextlib.redirect_stdout(io.StringIO()):
                kernel = compile_build(job.build, target)
            digest = code_hash(
                kernel.asm["amdgcn" if target.is_hip else "ptx"], kernel.metadata.name
            )
    return dict(id=job.id, ok=res.ok, regs=res.regs, spill=res.spill_bytes,
                stack=res.stack_bytes, smem=res.smem_bytes, error=res.error, hash=digest)  # fmt: skip


def compare(before: str, after: str) -> int:
    b, a = (json.load(open(p)) for p in (before, after))
    if len(a) != len(b):
        print(f"{len(b)} builds before, {len(a)} after: the matrices differ")
        return 1
    keys = ("ok", "regs", "spill", "stack", "smem", "hash")
    changed = [(x, y) for x, y in zip(b, a) if any(x[k] != y[k] for k in keys)]
    for x, y in changed:
        print(f"{x['id']} -> {y['id']}: " + ", ".join(
            f"{k} {x[k]} -> {y[k]}" for k in keys if x[k] != y[k]))  # fmt: skip
    print(f"{len(b)} builds, {len(changed)} changed")
    return 1 if changed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--targets", help="comma-separated target names (default: all)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        ap.error("expected OUT.json or --compare BEFORE AFTER")
    os.environ.pop("TRITON_INTERPRET", None)  # the kernels must import compilable
    from fp8mla.tools.compile_matrix import all_jobs

    jobs = all_jobs(args.targets.split(",") if args.targets else None)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=ctx) as pool:
        rows = list(pool.map(fingerprint, jobs, chunksize=4))
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=0)
    print(f"{len(rows)} builds, {sum(not r['ok'] for r in rows)} failed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
