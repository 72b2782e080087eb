"""The demo's printed report."""

from __future__ import annotations

import textwrap

from fp8mla.demo.result import DemoResult


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def format_report(result: DemoResult) -> str:
    cfg = result.config
    lines = ["", "1. profile → diagnose: fp8mla doctor on the full-pool-cast trace"]
    f = result.finding
    if f:
        steps = f.get("steps") or {}
        lines += [
            f"   finding   {f['kind']} ({f['severity']})",
            f"   kernel    {f.get('kernel', '?')}",
            f"   calls     {f['calls_per_step']:g} per step ({cfg.layers} layers) over "
            f"{steps.get('count', '?')} steps ({steps.get('method', '?')})",
            f"   elements  {f['elements_per_call']:,} per call "
            f"({cfg.pool_slots:,} slots × 576), {f.get('src_dtype')} → {f.get('dst_dtype')}",
            f"   share     {f['share_of_step']:.0%} of the step "
            f"({f['time_per_step_ms']:.2f} ms per step)",
            f"   source    {f.get('source') or 'unknown'}",
            *textwrap.wrap(
                f.get("suggestion", ""),
                100,
                initial_indent="   fix       ",
                subsequent_indent=" " * 13,
            ),
        ]
    else:
        lines.append("   (no pool-proportional cast found)")
    cpu = not cfg.device.startswith("cuda")
    lines += [
        "",
        "2. fix → verify: the same decode step three ways "
        f"({'CUDA graph' if cfg.cuda_graph and not cpu else 'eager'}, {cfg.steps} steps)",
        "",
    ]
    head = (
        f"   {'strategy':18} {'ms/step':>9} {'tokens/s':>10} {'bytes/step':>12} "
        f"{'speed-up':>9} {'rel. diff':>10}"
    )
    lines += [head, "   " + "-" * (len(head) - 3)]
    for r in result.rows:
        diff = "0 (same)" if r.rel_err == 0 else f"{r.rel_err:.1e}"
        lines.append(
            f"   {r.name:18} {r.ms_per_step:9.2f} {r.tokens_per_s:10.1f} "
            f"{_gb(r.bytes_per_step):>12} {r.speedup:8.1f}× {diff:>10}"
        )
    lines += [""]
    lines += _wrapped(
        "bytes/step: the weights plus the KV each strategy moves through memory. rel. diff: "
        f"each strategy's hidden state after all {cfg.layers} layers against fp8mla direct's, "
        "‖h − h_direct‖ / ‖h_direct‖. All three attend to the same FP8 values (converting FP8 "
        "to bfloat16 is exact), so the difference shows only where their attention code rounds "
        "differently."
    )
    if cpu:
        lines += _wrapped(
            "On this CPU all three run the same attention code, fp8mla's PyTorch path, so their "
            "hidden states are identical (rel. diff 0): the cast changes no value, which is all "
            "this column can show here. The times are what each strategy's casts and copies cost "
            "in host memory; they say nothing about GPU kernel speed (run fp8mla demo on a GPU, "
            "or fp8mla bench)."
        )
    check = result.attention
    if check is not None:
        lines += ["", "3. the kernel itself: one layer's attention against float64", ""]
        lines += _wrapped(
            f"{check.what}, on layer 0's FP8 pool for random queries, against "
            f"fp8mla.reference.mla_reference computed in float64 on the same FP8 bytes: "
            f"relative error {check.rel_err:.1e}. For scale: rounding the float64 result itself "
            f"to bfloat16 gives {check.rounding:.1e}."
        )
    kept = result.trace_path or "not kept (--save-trace PATH keeps it)"
    lines += ["", f"   trace: {kept}"]
    return "\n".join(lines)


def _wrapped(text: str) -> list[str]:
    return textwrap.wrap(text, 100, initial_indent="   ", subsequent_indent="   ")
