"""``fp8mla gap``: bytes a decode step moves, its floor per output token, and the gap to a
measured TPOT (with the share a full-pool KV cast would explain). See ``docs/gap.md``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fp8mla.cli._common import (
    BANDWIDTH_TBPS,
    BATCH,
    POOL_SLOTS,
    TP,
    TPOT_MS,
    Range,
    add_command,
    fail,
    path_arg,
)

GAP_CONTEXT = Range(0, 1 << 22)  # tokens of KV per request; 0: weights alone

# The library names its arguments; the command line names its flags.
_FLAGS = {
    "tp": "--tp",
    "batch": "--batch",
    "context": "--context",
    "weights": "--weights",
    "kv_dtype": "--kv-dtype",
    "bandwidth_tbps": "--bandwidth",
    "measured_tpot_ms": "--measured-tpot",
    "pool_slots": "--pool-slots",
}

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
        type=path_arg,
        help=f"preset ({', '.join(PRESETS)}), or a Hugging Face config.json or the folder "
        "holding it",
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
    p.add_argument(
        "--tp", type=TP, metavar="N", default=1, help=f"tensor-parallel size ({TP}; default 1)"
    )
    p.add_argument(
        "--batch",
        type=BATCH,
        metavar="N",
        default=1,
        help=f"requests decoded per step ({BATCH}; default 1)",
    )
    p.add_argument(
        "--context",
        type=GAP_CONTEXT,
        metavar="N",
        default=4096,
        help=f"tokens in each request's KV ({GAP_CONTEXT}; default 4096)",
    )
    p.add_argument("--gpu", help=f"GPU preset: {', '.join(GPUS)}")
    p.add_argument(
        "--bandwidth",
        type=BANDWIDTH_TBPS,
        metavar="TBPS",
        help=f"memory bandwidth in TB/s ({BANDWIDTH_TBPS}; overrides the GPU's datasheet value)",
    )
    p.add_argument(
        "--measured-tpot",
        type=TPOT_MS,
        metavar="MS",
        help=f"measured ms per output token ({TPOT_MS})",
    )
    p.add_argument(
        "--pool-slots",
        type=POOL_SLOTS,
        metavar="N",
        help=f"slots in each layer's KV pool, for the cast ({POOL_SLOTS})",
    )
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
        fail("gap", _flag_message(str(exc)))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format_text())
    return 0


def _flag_message(message: str) -> str:
    """The library's ``tp: expected …`` as ``--tp: expected …``; model and GPU errors name
    ``--model`` and ``--gpu``."""
    name, sep, rest = message.partition(": ")
    if sep and name in _FLAGS:
        return f"{_FLAGS[name]}: {rest}"
    if message.startswith("unknown GPU"):
        return f"--gpu: {message}; or give --bandwidth TBPS"
    if message.startswith("give a GPU preset"):
        return message
    return f"--model: {message}"
