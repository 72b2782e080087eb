"""``fp8mla gap``: bytes a decode step moves, its floor per output token, and the gap to a
measured TPOT (with the share a full-pool KV cast would explain). See ``docs/gap.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

from fp8mla.gap import GPUS, PRESETS, estimate

_EXAMPLE = (
    "example: fp8mla gap --model glm-5 --tp 2 --gpu h200 --measured-tpot 93.6 --pool-slots 495552"
)


def _fail(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit status 2 (argparse's convention)."""
    print(f"fp8mla gap: error: {message}", file=sys.stderr)
    sys.exit(2)


def register(subparsers: Any) -> None:
    """Add the ``gap`` parser to the ``fp8mla`` dispatcher."""
    p = subparsers.add_parser(
        "gap",
        help="floor time per output token from bytes moved; gap to a measured TPOT",
        description=(
            "Bytes one decode step moves per GPU (weights, active experts, KV), the floor time\n"
            "per output token at the GPU's datasheet bandwidth (or --bandwidth), and with\n"
            "--measured-tpot the gap and the share a full-pool KV cast would explain.\n"
            "See docs/gap.md."
        ),
        epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.error = _fail  # type: ignore[method-assign]  # one-line errors, exit 2
    p.add_argument(
        "--model",
        required=True,
        help=f"preset ({', '.join(PRESETS)}) or path to a Hugging Face config.json",
    )
    p.add_argument(
        "--weights", choices=("bf16", "fp8", "nvfp4"), default="fp8", help="(default fp8)"
    )
    p.add_argument(
        "--kv-dtype",
        choices=("bf16", "fp8_e4m3", "fp8_e5m2"),
        default="fp8_e4m3",
        help="KV pool dtype (default fp8_e4m3)",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument("--batch", type=int, default=1, help="requests decoded per step (default 1)")
    p.add_argument(
        "--context", type=int, default=4096, help="tokens in each request's KV (default 4096)"
    )
    p.add_argument("--gpu", help=f"GPU preset: {', '.join(GPUS)}")
    p.add_argument(
        "--bandwidth",
        type=float,
        metavar="TBPS",
        help="memory bandwidth in TB/s (overrides the GPU's datasheet value)",
    )
    p.add_argument("--measured-tpot", type=float, metavar="MS", help="measured ms per token")
    p.add_argument("--pool-slots", type=int, help="slots in each layer's KV pool (for the cast)")
    p.add_argument(
        "--dense-attention",
        action="store_true",
        help="treat a DSA model (GLM-5) as plain MLA reading the whole context",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``fp8mla gap`` on parsed arguments; 0 on success, 2 on bad input."""
    try:
        report = estimate(
            args.model,
            args.gpu,
            bandwidth_tbps=args.bandwidth,
            weights=args.weights,
            kv_dtype=args.kv_dtype,
            tp=args.tp,
            batch=args.batch,
            context=args.context,
            measured_tpot_ms=args.measured_tpot,
            pool_slots=args.pool_slots,
            dense_attention=args.dense_attention,
        )
    except ValueError as exc:
        print(f"fp8mla gap: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format_text())
    return 0
