"""``run_demo()``: profile → diagnose → fix → verify, on this machine."""

from __future__ import annotations

import os
import sys
import tempfile
import time

from fp8mla.demo.config import DemoConfig
from fp8mla.demo.result import ROW_NAMES, DemoResult, StrategyResult

__all__ = ["run_demo"]


def run_demo(
    cfg: DemoConfig, *, save_trace: str | None = None, progress: bool = True, report: bool = True
) -> DemoResult:
    """Run the demo; ``report`` prints the header and result table, ``progress`` the bar.

    ``save_trace``: keep the profiler trace of the full-pool-cast loop at this path (written
    to a temporary file beside it, then renamed; never over a FIFO or device). Without it the
    trace goes to a temporary folder that is removed once the doctor has read it."""
    import torch

    from fp8mla._progress import Progress
    from fp8mla.demo.accuracy import check_attention
    from fp8mla.demo.decode_loop import DecodeModel
    from fp8mla.demo.profile import time_steps
    from fp8mla.testing import rel_err

    dev = torch.device(cfg.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("expected a CUDA device for --device cuda, got none available")
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    say = (lambda msg: print(msg, flush=True)) if report else (lambda msg: None)
    say(
        f"fp8mla demo on {where}: {cfg.layers} layers, {cfg.heads} heads, hidden {cfg.hidden}, "
        f"pool {cfg.pool_slots:,} slots per layer (FP8 e4m3), batch {cfg.batch} × context "
        f"{cfg.context:,}"
    )
    if dev.type == "cpu":
        say(
            "  (CPU: a scaled-down shape, and the decode loop's attention runs on fp8mla's "
            "PyTorch path for all three strategies. On a GPU the default is GLM-5 at "
            "tensor-parallel 2: 78 layers, 32 heads, 495,552 slots.)"
        )
    torch.manual_seed(0)
    with Progress(4 + len(ROW_NAMES), "demo", quiet=not progress) as bar:
        model = DecodeModel(cfg)
        bar.update("pools filled")
        h0 = torch.randn(cfg.batch, cfg.hidden, device=dev).to(torch.bfloat16)

        # -- 1. the three strategies compute the same thing --
        outs = {name: model.step(h0.clone(), name).float() for name in ROW_NAMES}
        errs = {name: rel_err(outs[name], outs["fp8mla direct"]) for name in ROW_NAMES}
        bar.update("outputs compared")
        attention = check_attention(model)
        bar.update("kernel vs float64")

        # -- 2. profile what engines ship, and diagnose the trace --
        finding = _profile_and_diagnose(model, h0, cfg, save_trace)
        bar.update("profiled + diagnosed")

        # -- 3. time a decode step of each --
        timings = {}
        for name in ROW_NAMES:
            timings[name] = time_steps(model, h0, name, cfg.steps, cfg.cuda_graph)
            bar.update(name)
    base = timings["full-pool cast"]
    rows = [
        StrategyResult(
            name=name,
            ms_per_step=timings[name],
            tokens_per_s=cfg.batch / (timings[name] / 1e3),
            bytes_per_step=model.weight_bytes() + model.kv_bytes(name),
            speedup=base / timings[name],
            rel_err=errs[name],
        )
        for name in ROW_NAMES
    ]
    result = DemoResult(
        config=cfg, rows=rows, finding=finding, trace_path=save_trace, attention=attention
    )
    if report:
        from fp8mla.demo.report import format_report

        print(format_report(result))
    return result


def _profile_and_diagnose(model, h0, cfg: DemoConfig, save_trace: str | None) -> dict | None:
    """Profile the full-pool-cast loop and diagnose its trace. With ``save_trace`` the trace is
    written beside that path and renamed onto it once complete; otherwise it lives in a
    temporary folder removed before returning."""
    from fp8mla._files import replace_atomically
    from fp8mla.demo.profile import profile_steps

    if save_trace:
        with replace_atomically(save_trace) as tmp:
            profile_steps(model, h0, "full-pool cast", tmp)
        return _diagnose(save_trace, cfg)
    with tempfile.TemporaryDirectory(prefix="fp8mla-demo-") as folder:
        trace = os.path.join(folder, "full_pool_cast.trace.json.gz")
        profile_steps(model, h0, "full-pool cast", trace)
        return _diagnose(trace, cfg)


def _diagnose(trace: str, cfg: DemoConfig) -> dict | None:
    from fp8mla.doctor import diagnose

    t = time.monotonic()
    report = diagnose(trace, layers=cfg.layers, active_tokens=cfg.active_tokens)
    casts = [f for f in report.get("findings", []) if f.get("kind") == "pool_proportional_cast"]
    if not casts:
        print(
            "fp8mla demo: the doctor found no pool-proportional cast in the trace", file=sys.stderr
        )
        return None
    finding = dict(casts[0])
    finding["steps"] = report.get("steps")
    finding["doctor_seconds"] = round(time.monotonic() - t, 2)
    return finding
