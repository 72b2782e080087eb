"""The demo's printed report."""

from __future__ import annotations

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
            f"   fix       {f.get('suggestion', '')}",
        ]
    else:
        lines.append("   (no pool-proportional cast found)")
    lines += [
        "",
        "2. fix → verify: the same decode step three ways "
        f"({'CUDA graph' if cfg.cuda_graph and cfg.device.startswith('cuda') else 'eager'}"
        f", {cfg.steps} steps)",
        "",
    ]
    head = (
        f"   {'strategy':18} {'ms/step':>9} {'tokens/s':>10} {'bytes/step':>12} "
        f"{'speed-up':>9} {'rel. diff':>10}"
    )
    lines += [head, "   " + "-" * (len(head) - 3)]
    for r in result.rows:
        lines.append(
            f"   {r.name:18} {r.ms_per_step:9.2f} {r.tokens_per_s:10.1f} "
            f"{_gb(r.bytes_per_step):>12} {r.speedup:8.1f}× {r.rel_err:10.1e}"
        )
    lines += [
        "",
        "   bytes/step: weights plus the KV each strategy moves; rel. diff: ‖h − h_direct‖/‖h_direct‖ "
        "of the final hidden state (all three read the same FP8 bytes)",
        f"   trace: {result.trace_path}",
    ]
    return "\n".join(lines)
