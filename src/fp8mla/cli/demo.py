"""``fp8mla demo``: the full-pool-cast story end to end on this machine."""

from __future__ import annotations

import argparse
from typing import Any

from fp8mla.cli._common import (
    BATCH,
    CONTEXT,
    HEADS,
    HIDDEN,
    LAYERS,
    POOL_SLOTS,
    STEPS,
    add_command,
    check_writable,
    fail,
    path_arg,
)

_DESCRIPTION = """\
Run an MLA decode loop in three ways of reading the FP8 KV pool (full-pool cast,
gather-then-cast, fp8mla direct), let the doctor find the cast in a profile of the first,
check that all three compute the same hidden state, and time a decode step of each.

Defaults: GLM-5 at tensor-parallel 2 on a GPU (78 layers, 32 heads, hidden 6144, a
495,552-slot pool, 4,096 tokens of context); a scaled-down shape on a CPU (8 layers, 16 heads,
hidden 1024, 100,000 slots, 2 requests x 1,024 tokens), which finishes in about a minute."""


def register(subparsers: Any) -> None:
    """Add the ``demo`` parser to the ``fp8mla`` dispatcher."""
    p = add_command(
        subparsers,
        "demo",
        help="profile → diagnose → fix → verify an MLA decode loop on this machine",
        description=_DESCRIPTION,
    )
    shape = p.add_argument_group("shape (default: GLM-5 TP2 on a GPU, scaled down on a CPU)")
    shape.add_argument("--layers", type=LAYERS, metavar="N", help=f"decoder layers ({LAYERS})")
    shape.add_argument(
        "--heads",
        type=HEADS,
        metavar="N",
        help=f"query heads per GPU ({HEADS}: the kernel's limit)",
    )
    shape.add_argument("--hidden", type=HIDDEN, metavar="N", help=f"hidden size ({HIDDEN})")
    shape.add_argument(
        "--pool-slots",
        type=POOL_SLOTS,
        metavar="N",
        help=f"slots in each layer's FP8 KV pool, what a full-pool cast converts ({POOL_SLOTS}; "
        "the pools must fit in memory)",
    )
    shape.add_argument(
        "--context",
        type=CONTEXT,
        metavar="N",
        help=f"tokens of context per request ({CONTEXT}; batch × context <= --pool-slots)",
    )
    shape.add_argument(
        "--batch", type=BATCH, metavar="N", help=f"requests decoded per step ({BATCH})"
    )
    run_ = p.add_argument_group("run")
    run_.add_argument(
        "--steps", type=STEPS, metavar="N", help=f"timed decode steps per strategy ({STEPS})"
    )
    run_.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default=None,
        help="where to run (default: cuda if available, else cpu)",
    )
    run_.add_argument(
        "--cuda-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time CUDA-graph replays of the step (GPU only; default on)",
    )
    run_.add_argument(
        "--save-trace",
        metavar="PATH",
        type=path_arg,
        help="keep the profiler trace of the full-pool-cast loop here (a regular file, replaced "
        "once complete; default: a temporary folder, removed at the end)",
    )
    run_.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``fp8mla demo``: 0 on success, 2 on bad input."""
    problem = check_writable(args.save_trace) if args.save_trace else None
    if problem:
        fail("demo", f"--save-trace {args.save_trace}: {problem}")

    import torch

    from fp8mla.demo import run_demo
    from fp8mla.demo.config import available_memory, default_config, with_overrides

    if args.device == "cuda" and not torch.cuda.is_available():
        fail("demo", "--device cuda: no CUDA device is available")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = with_overrides(
        default_config(device),
        layers=args.layers,
        heads=args.heads,
        hidden=args.hidden,
        pool_slots=args.pool_slots,
        context=args.context,
        batch=args.batch,
        steps=args.steps,
        cuda_graph=args.cuda_graph,
        device=device,
    )
    if cfg.active_tokens > cfg.pool_slots:
        fail(
            "demo",
            f"--pool-slots: expected batch × context <= --pool-slots ({cfg.pool_slots:,}), got "
            f"{cfg.batch} × {cfg.context:,} = {cfg.active_tokens:,}",
        )
    need, free = cfg.memory_bytes(), available_memory(device)
    if free is not None and need > free:
        fail(
            "demo",
            f"--pool-slots, --layers: expected the demo to fit in the {free / 1e9:,.1f} GB "
            f"free on {device}, got {need / 1e9:,.1f} GB ({cfg.layers} FP8 pools of "
            f"{cfg.pool_slots:,} slots × 576 B, a bf16 copy of one, the weights)",
        )
    try:
        run_demo(cfg, save_trace=args.save_trace, progress=not args.no_progress)
    except ValueError as exc:
        fail("demo", str(exc))
    except OSError as exc:  # the trace could not be written (a full disk, a folder removed)
        where = f"--save-trace {args.save_trace}" if args.save_trace else "the profiler trace"
        fail("demo", f"{where}: cannot write: {exc.strerror or exc}")
    return 0
