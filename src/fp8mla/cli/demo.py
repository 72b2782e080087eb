"""``fp8mla demo``: the full-pool-cast story end to end on this machine."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="profile → diagnose → fix → verify an MLA decode loop on this machine",
        description="Run an MLA decode loop with three ways of reading the FP8 KV pool "
        "(full-pool cast, gather-then-cast, fp8mla direct), let the doctor find the cast in a "
        "profile of the first, check that all three agree and time them. Defaults: GLM-5 TP2 "
        "on a GPU, a scaled-down shape on a CPU.",
    )
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--pool-slots", type=int)
    p.add_argument("--context", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--steps", type=int, help="timed decode steps per strategy")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument(
        "--cuda-graph",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time CUDA-graph replays (GPU default: on)",
    )
    p.add_argument("--save-trace", metavar="PATH", help="keep the profiler trace here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    import torch

    from fp8mla.demo import run_demo
    from fp8mla.demo.config import default_config, with_overrides

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    for name in ("layers", "heads", "hidden", "pool_slots", "context", "batch", "steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            print(
                f"fp8mla demo: expected --{name.replace('_', '-')} >= 1, got {value}",
                file=sys.stderr,
            )
            return 2
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
        print(
            f"fp8mla demo: expected batch × context <= --pool-slots ({cfg.pool_slots}), got "
            f"{cfg.active_tokens}",
            file=sys.stderr,
        )
        return 2
    try:
        run_demo(cfg, save_trace=args.save_trace, progress=not args.no_progress)
    except ValueError as exc:
        print(f"fp8mla demo: {exc}", file=sys.stderr)
        return 2
    return 0
