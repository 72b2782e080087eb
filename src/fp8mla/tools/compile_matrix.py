"""Compile matrix: every kernel configuration fp8mla's planners can select, built for every
GPU target Triton supports, on a CPU.

    python -m fp8mla.tools.compile_matrix --write docs/compile_matrix.md

For each target of :data:`fp8mla.attention.targets.TARGETS` it builds the attention kernel in
each variant and tile the planner can pick (``fp8mla.attention.variants``, read from the one
registry) (per KV dtype, with the FP8 decoding the launcher uses there, writing
split partials and direct outputs), the split merge, the KV-write kernel for every storage
dtype and scale mode, and the FP8 → fp16 staging of long extend batches. A build fails on a compile error, on spills above its limit or on shared
memory over the target's per-block limit. ``tests/tools/test_compile_matrix.py`` runs it in CI.

Builds run in a pool of processes that die with the run (however it ends), print a progress
line every 20 builds (and at least once a minute) on stderr, and are cached: a build measured
before with the same kernel source (Triton's ``cache_key``: the kernel and the jit functions it
calls), options, target and toolchain (Triton, ptxas, the measuring code) is read back from
``~/.cache/fp8mla/compile_matrix`` (``--cache DIR``, ``--no-cache``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass

import torch

from fp8mla._files import check_output, replace_atomically
from fp8mla.attention.targets import TARGETS, Target
from fp8mla.tools.build_runs import (
    ProgressFn,
    cached_measure,
    default_cache_dir,
    die_with_parent,
    progress_lines,
)
from fp8mla.tools.kernel_builds import SCALE_ARR_STRIDES, TORCH_TO_TRITON, Build
from fp8mla.tools.matrix_report import markdown
from fp8mla.tools.spill_limits import SPILL_EXCEPTIONS, SPILL_LIMIT
from fp8mla.tools.support_builds import CVT_NAMES, KV_DTYPES, SHORT


@dataclass(frozen=True)
class Job:
    """One row of the matrix before it is built."""

    target: str
    kernel: str  # "attention", "merge", "kv_write", "kv_stage"
    variant: str
    build: Build
    spill_limit: int
    spill_reason: str = ""

    @property
    def id(self) -> str:
        return f"{self.target}-{self.kernel}-{self.variant.replace(' ', '-')}"


@dataclass
class Row:
    """One built kernel variant: what it uses and whether that passes."""

    target: str
    kernel: str
    variant: str
    regs: int
    spill_bytes: int
    smem_bytes: int
    limit_bytes: int
    ok: bool
    reason: str
    stack_bytes: int = 0
    spill_limit: int = SPILL_LIMIT
    id: str = ""


def _spill_limit(target: str, kernel: str, tile: str) -> tuple[int, str]:
    """The spill limit of ``tile`` (``"64x64 pingpong8"``) and why it is not the default."""
    for names, kern, tile_key, limit, why in SPILL_EXCEPTIONS:
        if " " in tile_key:  # one tile
            fits = tile_key == tile
        else:  # every tile of a variant, or of all
            fits = tile_key in ("", tile.split(" ")[-1])
        if target in names and kern == kernel and fits:
            return limit, why
    return SPILL_LIMIT, ""


def attention_jobs(target: Target) -> list[Job]:
    """The attention kernel in every config the planner picks for ``target``, per KV dtype,
    writing split partials or the output (and, for FP8, with per-token-group scales; a kernel
    compiled apart for row tiles, also in its row-tile build).
    Representative constexprs: page size 1 (an engine's pool), no causal mask (decode),
    per-tensor scales, 512 + 64 head dims, bf16 queries."""
    from fp8mla.attention.launch import fp8_conversion
    from fp8mla.attention.planner import selectable_configs
    from fp8mla.attention.variants import get_variant, tile_name

    jobs = []
    for kv in KV_DTYPES:
        for cfg in selectable_configs(target, kv):
            kind = get_variant(cfg.variant)
            cvt = fp8_conversion(kv, torch.device("cuda"), False, cfg.fp8_cvt, target)
            kv_ptr = "u8" if cvt else TORCH_TO_TRITON[str(kv).split(".")[-1]]
            dot = "tl.bfloat16" if kv == torch.bfloat16 else "tl.float16"
            tile = tile_name(cfg)
            limit, why = _spill_limit(target.name, "attention", tile)
            part = "fp16" if kind.half_partials else "fp32"  # the split partials' dtype
            outputs = [(part, True, False, "split"), ("bf16", False, False, "direct")]
            if kv.itemsize == 1:  # per-token-group scales (DeepSeek's fine-grained FP8)
                outputs.append((part, True, True, "split+group"))
            row_tiles = "ROW_TILES" in getattr(kind.load(), "arg_names", ())
            if row_tiles:  # its build for requests of more rows than one tile
                outputs.append((part, True, False, "split+rowtiles"))
            for out, write_lse, group, label in outputs:
                ptrs = dict(
                    q_nope_ptr="fp16" if cfg.q_fp16_copy and dot == "tl.float16" else "bf16",
                    q_pe_ptr="bf16",
                    ckv_ptr=kv_ptr,
                    kpe_ptr=kv_ptr,
                    scale_arr_ptr="fp32" if group else kv_ptr,
                    ckv_scale_ptr=kv_ptr,
                    kpe_scale_ptr=kv_ptr,
                    qo_indptr_ptr="i32",
                    kv_indptr_ptr="i32",
                    kv_indices_ptr="i32",
                    kv_len_ptr="i32",
                    o_ptr=out,
                    lse_ptr="fp32" if write_lse else out,
                )
                consts = dict(
                    PAGE_SIZE=1,
                    BLOCK_M=cfg.block_m,
                    BLOCK_N=cfg.block_n,
                    D_CKV=512,
                    D_KPE=64,
                    CAUSAL=False,
                    TOKEN_GROUP=group,
                    CKV_SCALE_PTR=False,
                    KPE_SCALE_PTR=False,
                    DOT_DTYPE=dot,
                    WRITE_LSE=write_lse,
                    FP8_CVT=cvt,
                )
                if kind.launches_dependents and target.dependent_launch:
                    consts["WAIT_PRIOR"] = True  # launched as a programmatic dependent
                if kind.half_partials and write_lse:  # split: fp16 partials, their factors
                    ptrs["mult_ptr"] = "fp32"
                    consts["HALF_PARTIALS"] = True
                if row_tiles:
                    consts["ROW_TILES"] = label.endswith("rowtiles")
                build = Build(
                    kind.kernel,
                    tuple(ptrs.items()),
                    tuple(consts.items()),
                    cfg.num_warps,
                    None if kind.gluon else cfg.num_stages,
                    cfg.max_registers(target.warp_size) if target.backend == "cuda" else None,
                    unaligned=SCALE_ARR_STRIDES if group else (),
                )
                variant = (
                    f"{SHORT[kv]} {tile} w{cfg.num_warps}s{cfg.num_stages} {label} {CVT_NAMES[cvt]}"
                )
                jobs.append(Job(target.name, "attention", variant, build, limit, why))
    return jobs


def support_jobs(target: Target) -> list[Job]:
    """The kernels around the attention (``fp8mla.tools.support_builds``): the split merge,
    the KV writer, the FP8 staging and the packed-cache writer, in that order."""
    from fp8mla.tools import support_builds as S

    jobs = []
    for kind, builds in (("merge", S.merge_builds), ("kv_write", S.kv_write_builds),
                         ("kv_stage", S.kv_stage_builds), ("ds_mla_pack", S.ds_mla_pack_builds)):  # fmt: skip
        jobs += [Job(target.name, kind, label, b, SPILL_LIMIT) for label, b in builds(target)]
    return jobs


def sparse_jobs(target: Target) -> list[Job]:
    """Sparse MLA (DeepSeek Sparse Attention): every build of ``fp8mla.dsa.sparse_builds``."""
    from fp8mla.dsa.sparse_builds import sparse_builds

    jobs = []
    for label, build, tile in sparse_builds(target):
        limit, why = _spill_limit(target.name, "sparse", tile)
        jobs.append(Job(target.name, "sparse", label, build, limit, why))
    return jobs


def indexer_jobs(target: Target) -> list[Job]:
    """The lightning indexer (DeepSeek Sparse Attention): every build of
    ``fp8mla.dsa.indexer_builds``."""
    from fp8mla.dsa.indexer_builds import indexer_builds

    jobs = []
    for label, build, tile in indexer_builds(target):
        limit, why = _spill_limit(target.name, "indexer", tile)
        jobs.append(Job(target.name, "indexer", label, build, limit, why))
    return jobs


def fp8_query_jobs(target: Target) -> list[Job]:
    """FP8 queries: the portable kernels' FP8-query builds and the fused query pass
    (``fp8mla.tools.fp8_query_builds``)."""
    from fp8mla.tools.fp8_query_builds import attention_builds, q_quant_builds

    jobs = []
    for label, build, tile in attention_builds(target):
        limit, why = max(_spill_limit(target.name, k, tile) for k in ("attention", "fp8q"))
        jobs.append(Job(target.name, "attention", label, build, limit, why))
    for label, build in q_quant_builds(target):
        jobs.append(Job(target.name, "q_quant", label, build, SPILL_LIMIT))
    return jobs


def all_jobs(targets: list[str] | None = None) -> list[Job]:
    """Every build of the matrix, in table order; pure host arithmetic (nothing compiles)."""
    names = targets or list(TARGETS)
    jobs = []
    for name in names:
        t = TARGETS[name]
        jobs += attention_jobs(t) + support_jobs(t) + sparse_jobs(t)
        jobs += indexer_jobs(t) + fp8_query_jobs(t)
    return jobs


def run_job(job: Job, cache_dir: str | None = None) -> Row:
    """Build one job and judge it; with ``cache_dir``, a build measured before with the same
    kernel source, options, target and toolchain is read back instead of rebuilt."""
    target = TARGETS[job.target]
    res = cached_measure(job.build, target, cache_dir)
    limit = target.smem_per_block
    if not res.ok:
        reason = f"compile error: {res.error}"
    elif res.spill_bytes > job.spill_limit:
        reason = f"spills {res.spill_bytes} B > {job.spill_limit} B"
    elif res.smem_bytes > limit:
        reason = f"shared memory {res.smem_bytes} B > {limit} B"
    else:
        reason = job.spill_reason if res.spill_bytes > SPILL_LIMIT else ""
    ok = res.ok and not reason.startswith(("spills", "shared"))
    if res.extra.get("wgmma_serialized"):  # reported, not failed: slower, not wrong
        reason = "; ".join(filter(None, [reason, "ptxas serializes its wgmma (C7515)"]))
    return Row(
        job.target,
        job.kernel,
        job.variant,
        res.regs,
        res.spill_bytes,
        res.smem_bytes,
        limit,
        ok,
        reason,
        res.stack_bytes,
        job.spill_limit,
        job.id,
    )


def build_matrix(
    targets: list[str] | None = None,
    workers: int | None = None,
    *,
    cache_dir: str | None = None,
    progress: ProgressFn | None = None,
) -> list[Row]:
    """Build every job in ``workers`` fresh processes (kernels must be imported there with
    ``TRITON_INTERPRET`` unset, which this function arranges), in table order.

    ``cache_dir``: reuse measurements of builds done before (see :func:`run_job`).
    ``progress``: called after each build. The processes exit with the caller, even when it is
    killed; an exception or ^C here cancels the builds not started."""
    jobs = all_jobs(targets)
    if not jobs:
        return []
    workers = max(1, min(len(jobs), workers or os.cpu_count() or 1))
    saved = os.environ.pop("TRITON_INTERPRET", None)
    rows: list[Row | None] = [None] * len(jobs)
    try:
        ctx = multiprocessing.get_context("spawn")
        pool = ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=die_with_parent, initargs=(os.getpid(),)
        )
        try:
            futures = {pool.submit(run_job, job, cache_dir): i for i, job in enumerate(jobs)}
            failed = 0
            for done, future in enumerate(as_completed(futures), start=1):
                row = rows[futures[future]] = future.result()
                failed += not row.ok
                if progress is not None:
                    progress(done, len(jobs), failed)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.kill()  # builds already running: no use finishing them
            raise
        pool.shutdown(wait=True)
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved
    return [r for r in rows if r is not None]


def available_targets() -> tuple[list[str], dict[str, str]]:
    """Targets this Triton installation can build, and why the others cannot."""
    import importlib.util

    missing: dict[str, str] = {}
    if importlib.util.find_spec("triton.backends.amd") is None:
        missing["hip"] = "this Triton has no AMD backend"
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        if not os.path.exists(get_ptxas(90).path):
            missing["cuda"] = "ptxas not found"
    except Exception as e:  # noqa: BLE001 -- any failure means no NVIDIA builds
        missing["cuda"] = f"no NVIDIA backend ({type(e).__name__})"
    ok = [n for n, t in TARGETS.items() if t.backend not in missing]
    return ok, missing


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fp8mla.tools.compile_matrix", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--write", metavar="MD", help="write the markdown table to this file")
    p.add_argument("--json", metavar="PATH", help="write the rows as JSON ('-': stdout)")
    p.add_argument("--targets", help="comma-separated target names (default: all)")
    p.add_argument("--workers", type=int, default=None, help="build processes (default: CPUs)")
    p.add_argument(
        "--cache",
        metavar="DIR",
        default=default_cache_dir(),
        help="reuse builds measured before, kept here (default: %(default)s)",
    )
    p.add_argument("--no-cache", action="store_true", help="build everything again")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument(
        "--fail-on",
        choices=("any", "compile"),
        default="any",
        help="exit 1 for any failed row (default), or only for builds the compiler rejects "
        "(another Triton's check: spills and shared memory are judged with the pinned one)",
    )
    args = p.parse_args(argv)
    parent = os.environ.get("FP8MLA_DIE_WITH_PARENT", "")
    if parent.isdigit():
        die_with_parent(int(parent))
    for flag, value in (("--write", args.write), ("--json", args.json)):
        problem = check_output(value) if value not in (None, "-") else None
        if problem:
            p.error(f"{flag} {value}: {problem}")
    available, missing = available_targets()
    wanted = args.targets.split(",") if args.targets else list(TARGETS)
    unknown = [t for t in wanted if t not in TARGETS]
    if unknown:
        p.error(f"expected targets from {', '.join(TARGETS)}, got {', '.join(unknown)}")
    for name in wanted:
        if name not in available:
            print(f"skipping {name}: {missing[TARGETS[name].backend]}", file=sys.stderr)
    names = [t for t in wanted if t in available]
    jobs = len(all_jobs(names)) if names else 0
    cache = None if args.no_cache else args.cache
    workers = max(1, min(jobs or 1, args.workers or os.cpu_count() or 1))
    if not args.quiet:
        where = f"builds cached in {cache}" if cache else "no cache"
        print(
            f"compile matrix: {jobs} builds for {len(names)} targets in {workers} processes "
            f"({where})",
            file=sys.stderr,
            flush=True,
        )
    rows = build_matrix(
        names, workers, cache_dir=cache, progress=None if args.quiet else progress_lines()
    )
    if args.json:
        text = json.dumps([asdict(r) for r in rows], indent=1)
        if args.json == "-":
            print(text)
        else:
            _write(args.json, text + "\n")
    md = markdown(rows)
    if args.write:
        _write(args.write, md)
    if not args.json and not args.write:
        print(md)
    failing = 0
    for r in rows:
        if r.ok:
            continue
        fails = args.fail_on == "any" or r.reason.startswith("compile error")
        failing += fails
        mark = "FAILED" if fails else "note (not failing with --fail-on compile)"
        print(f"{mark} {r.target} {r.kernel} {r.variant}: {r.reason}", file=sys.stderr)
    return 1 if failing else 0


def _write(path: str, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place."""
    with replace_atomically(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())
