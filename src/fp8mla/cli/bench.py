"""``fp8mla bench``: decode attention beside the baselines, on the current GPU."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fp8mla.cli._common import add_command, fail, path_arg


def register(subparsers: Any) -> None:
    """Add the ``bench`` parser to the ``fp8mla`` dispatcher."""
    p = add_command(
        subparsers,
        "bench",
        help="measure fp8mla's decode kernel beside full-pool cast, gather-then-cast, ...",
        description="Benchmark MLA decode on this GPU: fp8mla on the FP8 pool, on a bf16 pool,\n"
        "full-pool cast, gather-then-cast, the PyTorch reference and (when importable) SGLang,\n"
        "FlashInfer and FlashMLA, on the same inputs. Appends JSON lines to OUT/<gpu>.jsonl\n"
        "(e.g. nvidia-h200.jsonl), each with its date and the run's label (--run-id).",
    )
    p.add_argument(
        "--sections",
        default="goals,host,sweep,extend,seed",
        help="comma-separated subset of goals,host,sweep,extend,seed,sparse,indexer (default: all "
        "but sparse and indexer, the DeepSeek Sparse Attention sections)",
    )
    p.add_argument(
        "--impls", default=None, help="comma-separated implementations (default: all available)"
    )
    p.add_argument(
        "--out",
        type=lambda text: Path(path_arg(text)),
        default=Path("benchmarks/results"),
        help="results folder (default: benchmarks/results)",
    )
    p.add_argument(
        "--run-id",
        default=None,
        metavar="LABEL",
        help="the records' run label, e.g. nightly-h200 (default: the run's start time)",
    )
    p.add_argument(
        "--sglang-module",
        type=path_arg,
        default=None,
        metavar="PATH",
        help="SGLang's decode_attention.py from an unpacked wheel, when sglang is not installed",
    )
    p.add_argument(
        "--flashinfer",
        type=path_arg,
        default=None,
        metavar="DIR",
        help="folder holding the flashinfer package (an unpacked wheel), when it is not "
        "installed; also $FP8MLA_FLASHINFER. Without it FlashInfer's rows are skipped with a note",
    )
    p.add_argument(
        "--flashmla",
        default=None,
        metavar="DIR",
        help="folder holding FlashMLA's _flashmla_C.abi3.so and _flashmla_extension_C.abi3.so "
        "(from a vLLM wheel): flashmla-fp8 and flashmla-bf16kv in the goals, sweep and extend "
        "sections, flashmla-sparse-fp8 in the sparse one; also $FP8MLA_FLASHMLA",
    )
    p.add_argument(
        "--vllm-sparse-module",
        default=None,
        metavar="PATH",
        help="vLLM's Triton sparse MLA module file (v1/attention/ops/triton_sparse_mla_kernel.py "
        "or xpu_mla_sparse.py) for the sparse section; also $FP8MLA_VLLM_SPARSE",
    )
    p.add_argument(
        "--vllm-indexer-module",
        default=None,
        metavar="PATH",
        help="vLLM's Triton indexer logits file (v1/attention/ops/mqa_logits_triton.py) for the "
        "indexer section; also $FP8MLA_VLLM_INDEXER",
    )
    p.add_argument("--quick", action="store_true", help="a short sweep and an 8-layer seed")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plot")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``fp8mla bench``: 0 on success, 2 on bad input or without a GPU."""
    from fp8mla.bench import SECTIONS, BenchOptions
    from fp8mla.bench import run as run_bench

    sections = tuple(s for s in args.sections.split(",") if s)
    bad = [s for s in sections if s not in SECTIONS]
    if bad or not sections:
        fail(
            "bench", f"--sections: expected names from {', '.join(SECTIONS)}, got {args.sections!r}"
        )
    impls = tuple(args.impls.split(",")) if args.impls else None
    return run_bench(
        BenchOptions(
            sections=sections,
            impls=impls,
            out_dir=args.out,
            sglang_module=args.sglang_module,
            flashinfer=args.flashinfer,
            flashmla=args.flashmla,
            vllm_sparse_module=args.vllm_sparse_module,
            vllm_indexer_module=args.vllm_indexer_module,
            quick=args.quick,
            plot=not args.no_plot,
            run_id=args.run_id,
        )
    )
