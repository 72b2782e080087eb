"""Decode benchmark: fp8mla beside the baselines an engineer would otherwise use.

``run(options)`` measures the goal cases, a sweep and the 78-layer seed scenario on the
current CUDA device and appends one JSON object per (case, implementation) to the GPU's
results file, ``<out>/<gpu>.jsonl`` (``nvidia-h200.jsonl``), each with its ``date`` and the
run's label ``run`` (``--run-id``, by default the start time); the bandwidth plot of the run
goes beside it as ``<gpu>.png``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from fp8mla._progress import Progress

SECTIONS = ("goals", "host", "sweep", "extend", "seed", "sparse", "indexer")
DEFAULT_SECTIONS = ("goals", "host", "sweep", "extend", "seed")  # "sparse", "indexer": on request


@dataclass
class BenchOptions:
    sections: tuple[str, ...] = DEFAULT_SECTIONS
    impls: tuple[str, ...] | None = None
    out_dir: Path = Path("benchmarks/results")
    sglang_module: str | None = None
    flashinfer: str | None = None  # folder holding the flashinfer package ($FP8MLA_FLASHINFER)
    flashmla: str | None = None  # folder holding FlashMLA's libraries ($FP8MLA_FLASHMLA)
    vllm_sparse_module: str | None = None  # vLLM's Triton sparse MLA file ($FP8MLA_VLLM_SPARSE)
    vllm_indexer_module: str | None = None  # vLLM's mqa_logits_triton.py ($FP8MLA_VLLM_INDEXER)
    seed_batches: tuple[int, ...] = (1, 32)
    quick: bool = False
    plot: bool = True
    extra_notes: list[str] = field(default_factory=list)
    run_id: str | None = None  # the records' ``run`` label (None: the run's start time)


def run(opts: BenchOptions) -> int:
    import torch

    if not torch.cuda.is_available():
        print("fp8mla bench: needs a CUDA GPU (benchmarks are GPU-only)", file=sys.stderr)
        return 2
    from fp8mla.bench.cases import GOAL_CASES, extend_cases, sweep_cases
    from fp8mla.bench.report import (
        append_jsonl,
        format_table,
        gpu_slug,
        plot_bandwidth,
        results_path,
    )
    from fp8mla.bench.runner import ALL_IMPLS, BenchContext, Environment, bench_case, bench_host
    from fp8mla.bench.seed import bench_seed

    device = torch.device("cuda")
    print("fp8mla bench: measuring copy bandwidth and matmul rate ...", file=sys.stderr)
    env = Environment.measure(device, opts.run_id)
    print(
        f"  {env.gpu}: copy {env.copy_tbps:.2f} TB/s, bf16 matmul {env.matmul_tflops:.0f} "
        f"TFLOP/s; torch {env.torch}, triton {env.triton}",
        file=sys.stderr,
    )
    ctx = BenchContext(
        env=env,
        device=device,
        impls=opts.impls or ALL_IMPLS,
        sglang_path=opts.sglang_module,
        flashinfer_path=opts.flashinfer,
        flashmla_path=opts.flashmla,
    )
    cases = []
    if "goals" in opts.sections:
        cases += GOAL_CASES
    if "sweep" in opts.sections:
        cases += sweep_cases(quick=opts.quick)
    if "extend" in opts.sections:
        cases += extend_cases()
    notes: list[str] = list(opts.extra_notes)
    jsonl = results_path(opts.out_dir, env.gpu)
    seeds = opts.seed_batches if "seed" in opts.sections else ()
    sparse_cases = []
    if "sparse" in opts.sections:
        from fp8mla.bench.sparse_cases import SPARSE_CASES, quick_cases

        sparse_cases = quick_cases() if opts.quick else SPARSE_CASES
    indexer_cases = []
    if "indexer" in opts.sections:
        from fp8mla.bench.indexer_cases import INDEXER_CASES
        from fp8mla.bench.indexer_cases import quick_cases as quick_indexer

        indexer_cases = quick_indexer() if opts.quick else INDEXER_CASES
    steps = len(cases) + ("host" in opts.sections) + len(seeds)
    steps += len(sparse_cases) + 2 * bool(sparse_cases)  # the cases, layers, the writer
    steps += len(indexer_cases) + bool(indexer_cases)
    written = 0
    with Progress(steps, "bench") as bar:
        for case in cases:
            bench_case(ctx, case, notes)
            append_jsonl(jsonl, ctx.records[written:])  # results survive an interrupted run
            written = len(ctx.records)
            bar.update(case.name)
        if "host" in opts.sections:
            bench_host(ctx, notes)
            append_jsonl(jsonl, ctx.records[written:])
            written = len(ctx.records)
            bar.update("host cost")
        for batch in seeds:
            bench_seed(ctx, notes, layers=8 if opts.quick else 78, batch=batch)
            append_jsonl(jsonl, ctx.records[written:])
            written = len(ctx.records)
            bar.update(f"seed scenario, batch {batch}")
        if sparse_cases:
            from fp8mla.bench.sparse_runner import SPARSE_IMPLS, SparseContext, run_sparse

            sparse = SparseContext(
                env=env,
                device=device,
                impls=tuple(i for i in (opts.impls or SPARSE_IMPLS) if i in SPARSE_IMPLS),
                flashmla_path=opts.flashmla,
                vllm_path=opts.vllm_sparse_module,
                records=ctx.records,
            )

            def saved(name: str) -> None:
                nonlocal written
                append_jsonl(jsonl, ctx.records[written:])
                written = len(ctx.records)
                bar.update(f"sparse {name}")

            run_sparse(sparse, sparse_cases, notes, saved, layers=8 if opts.quick else 78)
        if indexer_cases:
            from fp8mla.bench.indexer_runner import INDEXER_IMPLS, IndexerContext, run_indexer

            indexer = IndexerContext(
                env=env,
                device=device,
                impls=tuple(i for i in (opts.impls or INDEXER_IMPLS) if i in INDEXER_IMPLS),
                vllm_path=opts.vllm_indexer_module,
                records=ctx.records,
            )

            def indexer_saved(name: str) -> None:
                nonlocal written
                append_jsonl(jsonl, ctx.records[written:])
                written = len(ctx.records)
                bar.update(f"indexer {name}")

            run_indexer(indexer, indexer_cases, notes, indexer_saved, layer=not opts.quick)
    print(format_table(ctx.records))
    for note in dict.fromkeys(notes):
        print("note:", note)
    if "goals" in opts.sections:
        from fp8mla.bench.report import goal_lines as dense_goal_lines

        print("\n".join(["goals:", *dense_goal_lines(ctx.records)]))
    if sparse_cases:
        from fp8mla.bench.sparse_report import goal_lines

        print("\n".join(["sparse goals:", *goal_lines(ctx.records)]))
    if indexer_cases:
        from fp8mla.bench.indexer_report import goal_lines as indexer_goal_lines

        print("\n".join(["indexer goals:", *indexer_goal_lines(ctx.records)]))
    print(f"appended {len(ctx.records)} records of run {env.run} to {jsonl}")
    png = opts.out_dir / f"{gpu_slug(env.gpu)}.png"
    if opts.plot and plot_bandwidth(ctx.records, png):
        print(f"plot: {png}")
    return 0
