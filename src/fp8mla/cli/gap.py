"""``fp8mla gap``: bytes a decode step moves, its floor per output token, and the gap to a
measured TPOT (with the share a full-pool KV cast would explain). See ``docs/gap.md``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fp8mla.cli._common import add_command, fail

_EXAMPLE = (
    "example: fp8mla gap --model glm-5 --tp 2 --gpu h200 --measured-tpot 93.6 --pool-slots 495552"
)


def register(subparsers: Any) -> None:
    """Add the ``gap`` parser to the ``fp8mla`` dispatcher."""
    from fp8mla.gap.gpus import GPUS
    from fp8mla.gap.presets import PRESETS

    p = add_command(
        subparsers,
        "gap",
        help="floor time per output token from bytes moved; gap to a measured TPOT",
        description=(
            "Bytes one decode step moves per GPU (weights, active experts, KV), the floor time\n"
            "per output token at the GPU's datasheet bandwidth (or --bandwidth), and with\n"
            "--measured-tpot the gap and the share a full-pool KV cast would explain.\n"
            "See docs/gap.md."
        ),
        epilog=_EXAMPLE,
    )
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
    from fp8mla.gap import estimate

    if args.gpu is None and args.bandwidth is None:
        fail("gap", "give a GPU preset (--gpu) or a bandwidth (--bandwidth TBPS)")
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
        hint = "; or give --bandwidth TBPS" if str(exc).startswith("unknown GPU") else ""
        fail("gap", f"{exc}{hint}")
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format_text())
    return 0
