"""Time a decode step of attention through vLLM's MLA path: fp8mla's ``FP8MLA`` backend beside
vLLM's own ``TRITON_MLA``, eagerly and in a full CUDA graph, on the same FP8 caches.

The step is built from vLLM's own classes (``tests/integrations/vllm_step.py``): real
``MLAAttention`` layers with the backend, its metadata builder made by an ``AttentionGroup``,
and metadata from the model runner's ``build_attn_metadata`` over persistent buffers. Each of
``--layers`` layers reads its own cache (so the KV is not served from L2), through
``layer.impl.forward_mqa``, the call ``MLAAttention`` makes for decode rows. Per case and
implementation (µs per layer):

- ``vllm-fp8mla`` / ``vllm-triton-mla``, ``cuda-graph``: the layers' forward captured once
  from ``build_for_cudagraph_capture``'s metadata (as vLLM captures a FULL decode graph, with
  dummy lengths), replayed after the block table and lengths are rewritten in place and the
  step's metadata is built; the replay's time divided by the layers.
- the same, ``eager``: the step's metadata build and the layers' forward calls between two
  CUDA events (host cost included), divided by the layers.
- ``vllm-fp8mla-fp8q``: the same layers with ``FP8MLA_FP8_QUERIES=1``, fed the e4m3 queries
  vLLM would hand them (one scale, ``amax / 448``, as every layer's ``_q_scale``); its
  ``rel_err`` is against the bf16 queries, so it includes their e4m3 rounding.
- ``fp8mla``: fp8mla's wrapper called directly on the same caches and pages, planned from
  host lengths as ``fp8mla bench`` times it; ``fp8mla-graph-wrapper``: its CUDA-graph mode
  (``use_cuda_graph=True``, lengths on the device), the plan vLLM's graphs get.

``TRITON_MLA`` is the FP8-capable MLA backend of vLLM that runs on this machine. vLLM's
Hopper default for FP8 caches, ``FLASHMLA``, needs vLLM's compiled extensions, built against
the torch vLLM pins, which cannot load next to another torch; vLLM runs its CPU platform here
(``tests/integrations/engines_path.py``), so ``TRITON_MLA``'s split count is set from the
GPU's SM count as its CUDA platform would (``_sm_count``).

Records: ``fp8mla bench``'s format with section ``engines``, appended to ``<out>/<gpu>.jsonl``: case
``VLLM_DECODE_B<b>_H<h>_L<ctx>_P<page>_float8_e4m3fn``, ``rel_err`` of layer 0 against the
float64 reference, and on ``vllm-fp8mla``'s records ``vs_fp8mla`` /
``vs_fp8mla_graph_wrapper`` (its time over theirs, same timing mode).

    python benchmarks/bench_vllm_step.py --out OUT [--heads 16 128] [--batch 1 8 64]
        [--ctx 1024 4096] [--layers 8] [--block-size 64] [--run-id ID]

With ``FP8MLA_ENGINES_PATH`` set (a GPU machine's unpacked carry,
``benchmarks/run_engines_on_gpu.sh``), vLLM is found there with the tests' set-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

IMPLS = (("vllm-fp8mla", "FP8MLA"), ("vllm-triton-mla", "TRITON_MLA"))
# FP8MLA with FP8MLA_FP8_QUERIES=1: vLLM's e4m3 queries (per-tensor amax / 448 as _q_scale);
# its rel_err is against the bf16 queries, so it includes their e4m3 rounding
FP8Q_IMPL = "vllm-fp8mla-fp8q"
# vllm-fp8mla's time over these implementations', same case and timing mode
RATIOS = (("fp8mla", "vs_fp8mla"), ("fp8mla-graph-wrapper", "vs_fp8mla_graph_wrapper"))
# a failed measurement's record has these as None, and an ``error``
UNMEASURED = ("us_median", "us_p20", "us_p80", "gbps", "tflops", "floor_us", "x_floor")


def _events(fn: Callable[[], object], iters: int, warmup: int = 3) -> list[float]:
    """µs of ``fn`` between two CUDA events, ``iters`` times (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def _timing(times: list[float], layers: int):
    from fp8mla.bench.measure import Timing

    q = statistics.quantiles(times, n=5)
    return Timing(statistics.median(times) / layers, q[0] / layers, q[-1] / layers)


def _capture(fn: Callable[[], list[torch.Tensor]]):
    """``fn`` warmed up on a side stream, then captured: (graph, its outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # kernel compilation and first-call work outside the capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = fn()
    return graph, outs


def time_vllm(step, batch, q, ref, iters):
    """(graph timing, eager timing, rel_err) of the step's backend on ``batch``."""
    from fp8mla.testing import rel_err
    from integrations.vllm_step import StepBatch

    n, layers = len(batch.seq_lens), len(step.layers)
    dummy = StepBatch([1] * n, 1, batch.block_rows)  # vLLM captures with dummy lengths
    step.write_batch(dummy, n)
    captured = step.metadata(dummy, n, capture=True)
    graph, outs = _capture(lambda: step.forward(q, captured))
    step.write_batch(batch, n)
    step.metadata(batch, n, capture=False)  # built every step; the graph reads the buffers
    graph.replay()
    torch.cuda.synchronize()
    err = rel_err(outs[0][:n].float(), ref)
    t_graph = _timing(_events(graph.replay, iters), layers)
    del graph, outs
    t_eager = _timing(
        _events(lambda: step.forward(q, step.metadata(batch, n, capture=False)), iters), layers
    )
    return t_graph, t_eager, err


def time_direct(step, batch, q, ref, iters, graph_mode: bool):
    """fp8mla's wrapper on the step's caches: (graph timing, eager timing, rel_err)."""
    from fp8mla.attention.wrapper import BatchMLAPagedAttentionWrapper
    from fp8mla.testing import rel_err
    from integrations.vllm_step import SCALE

    n, pages, dev = len(batch.seq_lens), batch.block_rows.shape[1], step.device
    i32 = dict(dtype=torch.int32)
    qo = torch.arange(n + 1, **i32)
    kvp = torch.arange(0, (n + 1) * pages, pages, **i32)
    idx = batch.block_rows.reshape(-1).to(dev)
    lens = torch.tensor(batch.seq_lens, **i32)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    if graph_mode:
        bufs = [torch.empty(n + 1, **i32, device=dev), torch.empty(n + 1, **i32, device=dev)]
        bufs += [torch.empty_like(idx), lens.to(dev)]
        w = BatchMLAPagedAttentionWrapper(ws, True, *bufs)
        lens = bufs[3]  # on the device: the plan does not read them
    else:
        w = BatchMLAPagedAttentionWrapper(ws)
    w.plan(qo, kvp, idx, lens, step.heads, 512, 64, step.block_size, True, SCALE,
           q.dtype, torch.float8_e4m3fn)  # fmt: skip
    scale = step.layers[0]._k_scale
    views = [(v[..., :512], v[..., 512:]) for v in map(step.values, range(len(step.layers)))]
    outs = [torch.empty(n, step.heads, 512, dtype=q.dtype, device=dev) for _ in views]

    def run():
        for (ckv, kpe), out in zip(views, outs):
            w.run(q[..., :512], q[..., 512:], ckv, kpe, out=out, ckv_scale=scale, kpe_scale=scale)
        return outs

    run()
    torch.cuda.synchronize()
    err = rel_err(outs[0].float(), ref)
    t_eager = _timing(_events(run, iters), len(views))
    graph, _ = _capture(run)
    t_graph = _timing(_events(graph.replay, iters), len(views))
    return t_graph, t_eager, err


def fp8_queries(step, q):
    """``q`` as vLLM hands it to a layer that takes FP8 queries: e4m3 under one scale,
    ``amax / 448``, set as every layer's ``_q_scale``."""
    scale = q.float().abs().amax().clamp_min(1e-12) / 448
    for layer in step.layers:
        layer._q_scale.copy_(scale)
    return (q.float() / scale).to(torch.float8_e4m3fn)


def measure_case(steps, batch, q, ref, iters):
    """(implementation, (graph timing, eager timing, rel_err) or the exception it raised)."""
    fp8_step = steps["vllm-fp8mla"]
    runs = [
        (
            impl,
            time_vllm,
            (step, batch, fp8_queries(step, q) if impl == FP8Q_IMPL else q, ref, iters),
        )  # fmt: skip
        for impl, step in steps.items()
    ]
    runs += [
        ("fp8mla", time_direct, (fp8_step, batch, q, ref, iters, False)),
        ("fp8mla-graph-wrapper", time_direct, (fp8_step, batch, q, ref, iters, True)),
    ]
    results = []
    for impl, fn, fn_args in runs:
        try:
            results.append((impl, fn(*fn_args)))
        except Exception as exc:
            results.append((impl, exc))
        torch.cuda.empty_cache()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder of <gpu>.jsonl")
    ap.add_argument("--heads", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--ctx", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--run-id", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_vllm_step: needs a CUDA GPU (it times with CUDA events)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from integrations.engines_path import use_engines

    use_engines()
    from fp8mla.integrations import FP8_QUERIES_ENV
    from fp8mla.integrations.vllm import register

    register()
    import vllm

    from fp8mla.bench.cases import Case
    from fp8mla.bench.measure import Timing
    from fp8mla.bench.report import append_jsonl, results_path
    from fp8mla.bench.runner import BenchContext, Environment, record
    from integrations import vllm_step as vs

    device = torch.device("cuda")
    env = Environment.measure(device, args.run_id)
    ctx = BenchContext(env=env, device=device)
    path = results_path(args.out, env.gpu)
    block, layers = args.block_size, args.layers
    pages = -(-max(args.ctx) // block)
    max_model_len = (pages + 1) * block
    num_blocks = max(args.batch) * pages + 16
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    common = dict(section="engines", engine="vllm", engine_version=vllm.__version__, layers=layers)
    written = 0
    for heads in args.heads:
        steps = {}
        for impl, backend in IMPLS:
            config = vs.engine_config(
                backend=backend, block_size=block, heads=heads, layers=layers,
                max_model_len=max_model_len, max_num_seqs=max(args.batch),
            )  # fmt: skip
            caches = next(iter(steps.values())).caches if steps else None
            steps[impl] = vs.VllmStep(
                config, layers=layers, num_blocks=num_blocks, device=device, caches=caches
            )
        for layer in steps["vllm-triton-mla"].layers:
            layer.impl._sm_count = sms  # as on vLLM's CUDA platform
        try:  # FP8MLA taking vLLM's FP8 queries (the plugin reads the variable at start-up)
            os.environ[FP8_QUERIES_ENV] = "1"
            config = vs.engine_config(
                backend="FP8MLA", block_size=block, heads=heads, layers=layers,
                max_model_len=max_model_len, max_num_seqs=max(args.batch),
            )  # fmt: skip
            steps[FP8Q_IMPL] = vs.VllmStep(
                config, layers=layers, num_blocks=num_blocks, device=device,
                caches=steps["vllm-fp8mla"].caches,
            )  # fmt: skip
        except Exception as exc:  # recorded as a note; the other implementations still run
            print(f"{FP8Q_IMPL}: not measured ({type(exc).__name__}: {exc})", flush=True)
        finally:
            os.environ.pop(FP8_QUERIES_ENV, None)
        fp8_step = steps["vllm-fp8mla"]
        for b in args.batch:
            for c in args.ctx:
                gen = torch.Generator().manual_seed(b * 131 + c + heads)
                batch = vs.random_batch(fp8_step, [c] * b, 1, gen)
                q = vs.random_queries(fp8_step, b, gen)
                ref = fp8_step.reference(q, batch, 0)
                case = Case(b, heads, c, page_size=block)
                name = f"VLLM_DECODE_B{b}_H{heads}_L{c}_P{block}_float8_e4m3fn"
                times = {}
                for impl, result in measure_case(steps, batch, q, ref, args.iters):
                    if isinstance(result, Exception):  # record what fails and go on
                        row = record(ctx, case, impl, Timing(1.0, 1.0, 1.0), None, **common)
                        row.update({k: None for k in UNMEASURED})
                        row.update(case=name, error=f"{type(result).__name__}: {result}"[:400])
                        continue
                    t_graph, t_eager, err = result
                    times[impl] = (t_graph, t_eager)
                    for mode, t in (("cuda-graph", t_graph), ("eager", t_eager)):
                        row = record(ctx, case, impl, t, err, **common)
                        row.update(case=name, timing=f"{mode}, µs per layer of {layers}")
                for row in ctx.records[written:]:
                    mine = times.get("vllm-fp8mla")
                    if row["impl"] != "vllm-fp8mla" or mine is None or "error" in row:
                        continue
                    k = 0 if row["timing"].startswith("cuda-graph") else 1
                    for other, key in RATIOS:
                        if other in times:
                            row[key] = round(mine[k].us_median / times[other][k].us_median, 3)
                append_jsonl(path, ctx.records[written:])  # kept if a time limit stops the run
                for row in ctx.records[written:]:
                    keys = ("impl", "timing", "us_median", "rel_err", "vs_fp8mla", "error")
                    print(name, {k: row[k] for k in keys if k in row}, flush=True)
                written = len(ctx.records)
        del steps
        torch.cuda.empty_cache()
    print(f"appended {written} records of run {env.run} to {path}")


if __name__ == "__main__":
    main()
